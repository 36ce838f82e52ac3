"""Numbers at the edge: pydantic field types that take no string, bool or non-finite value, and the explicit
conversions of numbers written as text (the cluster shorthand, CSV cells, log lines, XML attributes)."""

from __future__ import annotations

import math
import re
from typing import Annotated

from annotated_types import Ge
from pydantic import AllowInfNan, Strict

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_INT_DIGITS

Count = Annotated[int, Strict(), Ge(1)]
"""A positive integer: a bool, a float or a string such as "4096" is refused, never converted."""
NonNegativeCount = Annotated[int, Strict(), Ge(0)]
Real = Annotated[float, Strict(), AllowInfNan(False)]
"""A finite number (an integer is taken as a float); NaN, infinity, a bool or a string is refused."""

_INT = re.compile(rf"[+-]?[0-9]{{1,{MAX_INT_DIGITS}}}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def int_from_text(text: str, what: str) -> int:
    """An integer written in ASCII digits (at most `MAX_INT_DIGITS` of them); anything else is refused naming `what`."""
    value = text.strip().replace(",", "").replace("_", "")
    if not _INT.fullmatch(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise InputError(f"{what}: expected an integer, got {shown!r}")
    return int(value)


def number_from_text(text: str, what: str) -> float:
    """A finite number written in decimal (`1e3`, `12.5`, `4,096`); NaN, infinity and overflow are refused."""
    value = text.strip().replace(",", "").replace("_", "")
    if len(value) > 400 or not _FLOAT.fullmatch(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise InputError(f"{what}: expected a finite number, got {shown!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InputError(f"{what}: {value[:40]!r} overflows a finite number")
    return number
