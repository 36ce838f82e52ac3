"""YAML documents: one document, read by libyaml when PyYAML has it (CSafeLoader, else the pure-Python SafeLoader),
with no duplicate key (a repeated key is an error naming it, not "the last one wins"), no alias expanding the
document past `MAX_YAML_NODES` nodes (an alias bomb), no recursive alias, nesting at most `MAX_DEPTH` deep and no
integer literal longer than `MAX_INT_DIGITS`."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_DEPTH, MAX_INT_DIGITS, MAX_YAML_NODES

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _Base is not yaml.SafeLoader
_MERGE = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    """A refusal found while constructing: a message and where it is."""

    def __init__(self, message: str, node: Node) -> None:
        super().__init__(message)
        self.message, self.line = message, node.start_mark.line + 1


class SafeLoader(_Base):  # type: ignore[misc, valid-type]  # CSafeLoader is a C extension class
    """The safe loader with duplicate keys refused and integer literals bounded."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}  # key -> line it was first given on
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:  # `<<: *base` merges, and the keys given beside it override: no duplicate
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise _Refused(f"duplicate key {key!r} (first given at line {seen[key]})", key_node)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: the base class says so
                continue
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = str(node.value).lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(f"an integer of {len(digits)} digits is no count of anything", node)
        value: int = super().construct_yaml_int(node)
        return value


SafeLoader.add_constructor("tag:yaml.org,2002:int", SafeLoader.construct_yaml_int)


def parse_yaml(text: str, where: str) -> Any:
    """The value of a one-document YAML text; `where` ("topology t.yaml") starts every error."""
    loader = SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node, where)
        return loader.construct_document(node)
    except _Refused as exc:
        raise InputError(f"{where}: line {exc.line}: {exc.message}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        return f"YAML cannot hold the character {chr(exc.character)!r} (offset {exc.position}): {exc.reason}"
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    said = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    return f"YAML syntax error{at}: {', '.join(str(s) for s in said if s) or 'invalid YAML'}"


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_tree(root: Node, where: str) -> None:
    """Depth and size of the document with its aliases expanded, walked without recursion (a node an alias names
    is one object, visited once)."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (depth, expanded size)
    on_path = {id(root)}
    stack = [(root, iter(_children(root)))]
    while stack:
        node, pending = stack[-1]
        child = next(pending, None)
        if child is not None:
            if id(child) in on_path:
                raise InputError(f"{where}: a recursive alias at line {child.start_mark.line + 1}")
            if id(child) not in done:
                on_path.add(id(child))
                stack.append((child, iter(_children(child))))
            continue
        stack.pop()
        on_path.discard(id(node))
        kids = [done[id(c)] for c in _children(node)]
        depth = 1 + max((d for d, _ in kids), default=0)
        size = 1 + sum(s for _, s in kids)
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels (line {node.start_mark.line + 1})")
        if size > MAX_YAML_NODES:
            raise InputError(
                f"{where}: aliases expand the document past {MAX_YAML_NODES:,} nodes (line {node.start_mark.line + 1})"
            )
        done[id(node)] = (depth, size)
