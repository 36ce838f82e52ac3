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
from typing import TYPE_CHECKING, Literal, Union, get_args, get_origin

if TYPE_CHECKING:
    from optlayout.layout.model import Layout

Shown = Literal["always", "not_default"]
Checkpoint = Literal["reshards", "reshards_if_sharded", "keeps"]
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

MEGATRON_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
"""Megatron-Core's rank orders (`parallel_state.py`, `RankGenerator`; the second with
`--use-tp-pp-dp-mapping`), first token fastest. A token that is not (yet) a Layout axis has size 1: `ep`
until expert parallelism is modelled."""


@dataclass(frozen=True)
class Axis:
    """What a Layout field is, beyond its type and default (which pydantic holds).

    key: the short text key (`tp`, `mb`, `sp`); the field name is accepted too, with `aliases`.
    grid: a dimension of the rank grid: its degree multiplies the GPUs and it has a place in
      `MEGATRON_ORDERS`.
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
    splits_model: bool = False
    searched: bool = True
    shown: Shown = "always"
    checkpoint: Checkpoint = "keeps"
    # filled from the pydantic field by `declared_axes`
    name: str = ""
    kind: type = int
    default: object = None
    choices: tuple[str, ...] = field(default=())

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
        if issubclass(self.kind, StrEnum):
            try:
                return self.kind(str(raw).strip().lower())
            except ValueError:
                raise ValueError(f"must be one of {', '.join(self.choices)}") from None
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError("must be a positive integer") from None
        if value < 1:
            raise ValueError("must be a positive integer")
        return value

    def text(self, value: object) -> str | None:
        """How the text form writes `value` (None: left out)."""
        if self.shown == "not_default" and value == self.default:
            return None
        if self.kind is bool:
            return self.key if value else None
        return f"{self.key}={getattr(value, 'value', value)}"


def declared_axes(layout_type: type[Layout]) -> tuple[Axis, ...]:
    """The `Axis` of every field of `layout_type`, completed with the field's name, type and default."""
    out = []
    for name, info in layout_type.model_fields.items():
        axis = next((m for m in info.metadata if isinstance(m, Axis)), None)
        if axis is None:
            raise TypeError(f"Layout.{name} has no Axis declaration")
        kind = _base_type(info.annotation)
        choices = tuple(m.value for m in kind) if issubclass(kind, StrEnum) else ()
        label = axis.label or axis.key
        out.append(replace(axis, name=name, kind=kind, default=info.default, choices=choices, label=label))
    grid_tokens = set(MEGATRON_ORDERS[0].split("-"))
    for axis in out:
        if axis.grid and axis.key not in grid_tokens:
            raise TypeError(f"Layout.{axis.name} is a grid axis but has no place in Megatron's rank order")
    return tuple(out)


def _base_type(annotation: object) -> type:
    """The value type of a field annotation such as `int | None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        return _base_type(next(a for a in get_args(annotation) if a is not type(None)))
    if isinstance(annotation, type):
        return annotation
    raise TypeError(f"unsupported axis type {annotation!r}")
