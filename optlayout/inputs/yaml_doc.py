"""YAML documents: one document, read by libyaml when PyYAML has it (CSafeLoader, else the pure-Python SafeLoader),
with no duplicate key (a repeated key is an error naming it, not "the last one wins"), no alias expanding the
document past `MAX_YAML_NODES` nodes (an alias bomb), no recursive alias, nesting at most `MAX_DEPTH` deep and no
integer literal longer than `MAX_INT_DIGITS`."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from optlayout.errors import SHOWN, InputError
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
                    raise _Refused(f"duplicate key {SHOWN.repr(key)} (first given at line {seen[key]})", key_node)
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


def _check_tree(root: Node, where: str) -> None:
    """Depth and size of the document with its aliases expanded, walked level by level: a node an alias names
    counts each time it appears, so an alias bomb is refused once the count passes `MAX_YAML_NODES`, before the
    next level is made (a recursive alias never ends: it is refused for its depth)."""
    level: list[Node] = [root]
    depth = total = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels (line {level[0].start_mark.line + 1})")
        total += len(level)
        sequences = [n.value for n in level if n.__class__ is SequenceNode]
        mappings = [n.value for n in level if n.__class__ is MappingNode]
        below = sum(map(len, sequences)) + 2 * sum(map(len, mappings))
        if total + below > MAX_YAML_NODES:
            line = level[0].start_mark.line + 1
            raise InputError(f"{where}: aliases expand the document past {MAX_YAML_NODES:,} nodes (line {line})")
        level = [c for items in sequences for c in items] + [n for pairs in mappings for pair in pairs for n in pair]
