"""The one-line layout text (`tp=8,pp=4,dp=2,mb=1,ga=16,sharding=zero1,recompute=selective,sp`) both ways."""

from __future__ import annotations

from typing import Any

import pydantic

from optlayout.errors import OptlayoutError, describe_validation_error
from optlayout.specs import Layout, Recompute, Sharding

# Accepted spelling -> Layout field.
_KEYS: dict[str, str] = {
    "tp": "tp",
    "pp": "pp",
    "vp": "vp",
    "cp": "cp",
    "dp": "dp",
    "mb": "micro_batch",
    "micro_batch": "micro_batch",
    "ga": "grad_accum",
    "grad_accum": "grad_accum",
    "sharding": "sharding",
    "recompute": "recompute",
    "sp": "sequence_parallel",
    "sequence_parallel": "sequence_parallel",
    "first": "first_stage_layers",
    "first_stage_layers": "first_stage_layers",
    "last": "last_stage_layers",
    "last_stage_layers": "last_stage_layers",
}
_INT_FIELDS = {"tp", "pp", "vp", "cp", "dp", "micro_batch", "grad_accum", "first_stage_layers", "last_stage_layers"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_layout(text: str) -> Layout:
    """Parse the form written by `Layout.short()` (plus `first=`/`last=`); errors are one line naming the key."""
    fields: dict[str, Any] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise OptlayoutError(f"layout: expected key=value pairs such as 'tp=8,pp=4,dp=2', got {text!r}")
    for part in parts:
        key, sep, raw = (s.strip() for s in part.partition("="))
        name = _KEYS.get(key.lower())
        if name is None:
            raise OptlayoutError(f"layout: unknown key {key!r} (known: {', '.join(_KEYS)})")
        if name in fields:
            raise OptlayoutError(f"layout: key {key!r} given twice")
        if not sep and name != "sequence_parallel":
            raise OptlayoutError(f"layout: key {key!r} needs a value ({key}=...)")
        fields[name] = _value(key, name, raw if sep else "true")
    try:
        return Layout(**fields)
    except pydantic.ValidationError as exc:
        raise OptlayoutError(describe_validation_error(exc, "layout")) from None


def format_layout(layout: Layout) -> str:
    """`Layout.short()`, which `parse_layout` reads back: `parse_layout(format_layout(x)) == x`."""
    return layout.short()


def _value(key: str, name: str, raw: str) -> Any:
    if name in _INT_FIELDS:
        try:
            value = int(raw)
        except ValueError:
            raise OptlayoutError(f"layout: {key} must be a positive integer (got {raw!r})") from None
        if value < 1:
            raise OptlayoutError(f"layout: {key} must be a positive integer (got {raw!r})")
        return value
    if name == "sharding":
        return _choice(key, raw, Sharding)
    if name == "recompute":
        return _choice(key, raw, Recompute)
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise OptlayoutError(f"layout: {key} must be true or false (got {raw!r})")


def _choice(key: str, raw: str, enum: type[Sharding] | type[Recompute]) -> Any:
    try:
        return enum(raw.lower())
    except ValueError:
        valid = ", ".join(m.value for m in enum)
        raise OptlayoutError(f"layout: {key} must be one of {valid} (got {raw!r})") from None
