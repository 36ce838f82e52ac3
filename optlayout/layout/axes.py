"""The axes of a layout, declared once: each `Layout` field carries an `Axis` that says how it is written,
searched and placed; every consumer (text form, pins, the space, rank order, run records, reports, CLI
help) iterates over `AXES` rather than naming fields.

Adding an axis is one annotated field on `Layout` (`optlayout/layout/model.py`), plus the places that have
physics or rules for it (cost model terms, legality rules, launcher flags).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Le

if TYPE_CHECKING:
    from optlayout.layout.model import Layout

Shown = Literal["always", "not_default"]
Checkpoint = Literal["reshards", "reshards_if_sharded", "keeps"]
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

MEGATRON_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
"""Megatron-Core's rank orders (`parallel_state.py`, `RankGenerator`; the second with
`--use-tp-pp-dp-mapping`), first token fastest. Megatron builds two generators over the same GPUs and the same
order string: the dense (attention) grid with `ep` of size 1, and the expert grid with `tp` = expert-TP,
`ep` = EP, `dp` = expert-DP and `cp` of size 1 (moe.md section 1.4)."""


@dataclass(frozen=True)
class Axis:
    """What a Layout field is, beyond its type and default (which pydantic holds).

    key: the short text key (`tp`, `mb`, `sp`); the field name is accepted too, with `aliases`.
    grid: a dimension of the (dense) rank grid: its degree multiplies the GPUs and it has a place in
      `MEGATRON_ORDERS`.
    expert_token: the token it takes in Megatron's expert rank grid (`tp` for expert-TP, `ep`, `pp`); the
      expert grid's `dp` (expert-DP) is what the GPUs leave. Empty: not in the expert grid.
    splits_model: a model-parallel degree (counts as machinery in the solver's simplicity order).
    searched: the space enumerates it and `--pin/--max/--exclude` apply; False for what the stage split
      derives (`first`/`last`).
    shown: the text form writes it always, or only when it is not the default (a flag as its bare key).
    checkpoint: whether changing it moves saved state between ranks (re-planning): always, only when the
      state is sharded over the data-parallel group, or never.
    """

    key: str
    help: str
    aliases: tuple[str, ...] = ()
    label: str = ""  # column header in reports; the key when empty
    grid: bool = False
    expert_token: str = ""
    splits_model: bool = False
    searched: bool = True
    shown: Shown = "always"
    checkpoint: Checkpoint = "keeps"
    # filled from the pydantic field by `declared_axes`
    name: str = ""
    kind: type = int
    default: object = None
    choices: tuple[str, ...] = field(default=())
    maximum: int | None = None  # the field's upper bound, checked by `parse` (pins, text, --max)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every accepted spelling, the short key first."""
        return tuple(dict.fromkeys((self.key, self.name, *self.aliases)))

    @property
    def numeric(self) -> bool:
        return self.kind is int

    def parse(self, raw: object) -> object:
        """A value of this axis from text (or a Python value); ValueError with the reason otherwise."""
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError("must be true or false")
        if self.kind is tuple:  # a module set (`recompute_modules`)
            from optlayout.layout.recompute import parse_modules

            return parse_modules(raw)
        if issubclass(self.kind, StrEnum):
            try:
                return self.kind(str(raw).strip().lower())
            except ValueError:
                raise ValueError(f"must be one of {', '.join(self.choices)}") from None
        text = str(raw).strip()
        if isinstance(raw, bool) or not text.isascii() or not text.isdigit() or len(text) > 20:
            raise ValueError("must be a positive integer")
        value = int(text)
        if value < 1:
            raise ValueError("must be a positive integer")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be at most {self.maximum:,}")
        return value

    def text(self, value: object) -> str | None:
        """How the text form writes `value` (None: left out)."""
        if self.shown == "not_default" and value == self.default:
            return None
        if self.kind is bool:
            return self.key if value else None
        if self.kind is tuple:
            from optlayout.layout.recompute import format_modules

            return f"{self.key}={format_modules(value)}"  # type: ignore[arg-type]
        return f"{self.key}={getattr(value, 'value', value)}"


def declared_axes(layout_type: type[Layout]) -> tuple[Axis, ...]:
    """The `Axis` of every field of `layout_type`, completed with the field's name, type and default."""
    out = []
    for name, info in layout_type.model_fields.items():
        axis = next((m for m in info.metadata if isinstance(m, Axis)), None)
        if axis is None:
            raise TypeError(f"Layout.{name} has no Axis declaration")
        kind = _base_type(info.annotation)
        choices = tuple(m.value for m in kind) if isinstance(kind, type) and issubclass(kind, StrEnum) else ()
        label = axis.label or axis.key
        maximum = _maximum([*info.metadata, *_annotated_metadata(info.annotation)])
        out.append(replace(axis, name=name, kind=kind, default=info.default, choices=choices, label=label,
                           maximum=maximum))  # fmt: skip
    grid_tokens = set(MEGATRON_ORDERS[0].split("-"))
    for axis in out:
        if axis.grid and axis.key not in grid_tokens:
            raise TypeError(f"Layout.{axis.name} is a grid axis but has no place in Megatron's rank order")
        if axis.expert_token and axis.expert_token not in grid_tokens - {"cp", "dp"}:
            raise TypeError(f"Layout.{axis.name}: expert token {axis.expert_token!r} has no place in the expert grid")
    return tuple(out)


def _annotated_metadata(annotation: object) -> list[Any]:
    """Constraints inside an annotation such as `Annotated[int, Le(8)] | None`."""
    if get_origin(annotation) is Annotated:
        return [*get_args(annotation)[1:], *_annotated_metadata(get_args(annotation)[0])]
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _annotated_metadata(a)]
    return []


def _maximum(metadata: list[Any]) -> int | None:
    for item in metadata:
        if isinstance(item, Le) and isinstance(item.le, int):
            return item.le
        inner = getattr(item, "metadata", None)  # a FieldInfo inside Annotated
        if isinstance(inner, list) and (found := _maximum(inner)) is not None:
            return found
    return None


def _base_type(annotation: object) -> type:
    """The value type of a field annotation such as `int | None`."""
    if get_origin(annotation) is Annotated:
        return _base_type(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return _base_type(next(a for a in get_args(annotation) if a is not type(None)))
    if get_origin(annotation) is tuple:
        return tuple
    if isinstance(annotation, type):
        return annotation
    raise TypeError(f"unsupported axis type {annotation!r}")
