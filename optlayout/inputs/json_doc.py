"""JSON documents: strict JSON (no NaN or Infinity, no number that overflows, no duplicate key) nested at most
`MAX_DEPTH` deep; every refusal is one line naming the document."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_DEPTH, MAX_INT_DIGITS


def parse_json(text: str, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON text; `where` ("plan p.json", "runs r.jsonl line 3") starts every error."""
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object(where),
            parse_constant=refuse_constant(where),
            parse_float=_float(where),
            parse_int=_int(where),
        )
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {max_depth} levels") from None
    check_depth(value, where, max_depth)
    return value


def check_depth(value: Any, where: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse lists and objects nested deeper than `max_depth` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise InputError(f"{where}: nested deeper than {max_depth} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))


def refuse_constant(where: str) -> Callable[[str], NoReturn]:
    """A `parse_constant` hook: NaN, Infinity and -Infinity are not JSON numbers."""

    def refuse(token: str) -> NoReturn:
        raise InputError(f"{where}: {token} is not a number JSON allows (give a finite value)")

    return refuse


def _float(where: str) -> Callable[[str], float]:
    def parse(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise InputError(f"{where}: the number {token[:40]} overflows a finite float")
        return value

    return parse


def _int(where: str) -> Callable[[str], int]:
    def parse(token: str) -> int:
        if len(token.lstrip("-")) > MAX_INT_DIGITS:
            raise InputError(f"{where}: an integer of {len(token)} digits is no count of anything")
        return int(token)

    return parse


def _object(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise InputError(f"{where}: duplicate key {key!r} (which one is meant?)")
                seen.add(key)
        return out

    return build
