"""The one-line layout text (`tp=8,pp=4,dp=2,mb=1,ga=16,sharding=zero1,recompute=selective,sp`) both ways.

Selective recomputation's modules ride on its value: `recompute=selective:core_attn+moe_act` (`rm=...` is
accepted too); plain `recompute=selective` is Megatron's default set, the attention core."""

from __future__ import annotations

from typing import Any, Protocol

import pydantic

from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.layout.axes import Axis
from optlayout.layout.model import AXES, Layout, Recompute
from optlayout.layout.recompute import RecomputeModule, format_modules

KEYS: dict[str, Axis] = {key: axis for axis in AXES for key in axis.keys}
"""Every accepted spelling -> its axis."""


@checked_arguments
def parse_layout(text: str) -> Layout:
    """Parse the form written by `format_layout`; errors are one line naming the key."""
    fields: dict[str, Any] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InputError(f"layout: expected key=value pairs such as 'tp=8,pp=4,dp=2', got {text!r}")
    for part in parts:
        key, sep, raw = (s.strip() for s in part.partition("="))
        axis = KEYS.get(key.lower())
        if axis is None:
            raise InputError(f"layout: unknown key {key!r} (known: {', '.join(KEYS)})")
        if axis.name in fields and axis.name != "recompute_modules":
            raise InputError(f"layout: key {key!r} given twice")
        if not sep and axis.kind is not bool:
            raise InputError(f"layout: key {key!r} needs a value ({key}=...)")
        if axis.name == "recompute" and ":" in raw:  # recompute=selective:core_attn+moe_act
            raw, _, modules = raw.partition(":")
            if "recompute_modules" in fields:
                raise InputError(f"layout: recompute modules given twice ({part!r})")
            try:
                fields["recompute_modules"] = KEYS["rm"].parse(modules)
            except ValueError as exc:
                raise InputError(f"layout: recompute modules {exc} (got {modules!r})") from None
        elif axis.name == "recompute_modules" and axis.name in fields:
            raise InputError(f"layout: recompute modules given twice ({part!r})")
        try:
            fields[axis.name] = axis.parse(raw if sep else "true")
        except ValueError as exc:
            raise InputError(f"layout: {key} {exc} (got {raw!r})") from None
    try:
        return Layout(**fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "layout")) from None


def format_layout(layout: Layout) -> str:
    """The compact form, which `parse_layout` reads back: `parse_layout(format_layout(x)) == x`."""
    parts = []
    for axis in AXES:
        if axis.name == "recompute":  # the modules ride on its value: recompute=selective:core_attn+mlp
            parts.append(f"{axis.key}={recompute_text(layout)}")
        elif axis.name != "recompute_modules" and (text := axis.text(getattr(layout, axis.name))) is not None:
            parts.append(text)
    return ",".join(parts)


class HasRecompute(Protocol):
    """A recomputation choice: a layout's, or a published recipe's (`runs.records.RecipeRecompute`)."""

    @property
    def recompute(self) -> Recompute: ...

    @property
    def recompute_modules(self) -> tuple[RecomputeModule, ...] | None: ...


def recompute_text(layout: HasRecompute) -> str:
    """The recomputation as the layout text writes it: `none`, `full`, `selective` (Megatron's default module set)
    or `selective:layernorm+moe_act`."""
    modules = layout.recompute_modules
    return layout.recompute.value + (f":{format_modules(modules)}" if modules else "")


def axis_key(part: str) -> str:
    """The field an item of layout text (`mb=2`, `sp`) names; the item's own key when it names none."""
    key = part.partition("=")[0].strip().lower()
    axis = KEYS.get(key)
    return axis.name if axis is not None else key
