"""Errors a caller can catch: one line that names the field or constraint.

`OptlayoutError` is the base; the CLI prints any of them as one line and exits with status 2.
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pydantic


class OptlayoutError(ValueError):
    """Anything optlayout refuses; the message is shown to the user as it is."""


class InputError(OptlayoutError):
    """Bad input: a malformed file, an unknown name, a value out of range, an illegal layout."""


class InfeasibleError(OptlayoutError):
    """A well-formed request that no layout satisfies (nothing fits, no GPU count works)."""


class UnsupportedError(OptlayoutError):
    """Valid input that a launcher, a GPU or optlayout itself does not support."""


SHOWN = reprlib.Repr()  # values in messages: at most 40 characters, lists of 4, two levels
SHOWN.maxlevel, SHOWN.maxlist, SHOWN.maxtuple = 2, 4, 4
SHOWN.maxstring = SHOWN.maxother = SHOWN.maxlong = 40
MAX_PROBLEMS_SHOWN = 3


def describe_validation_error(exc: pydantic.ValidationError, what: str = "") -> str:
    """Turn a pydantic error into one line: each problem names the field and the value (shortened, so that
    a huge or alias-expanded input never floods the message); past three problems, how many more."""
    parts = []
    errors = exc.errors()
    for err in errors[:MAX_PROBLEMS_SHOWN]:
        loc = ".".join(SHOWN.repr(p) if not isinstance(p, str | int) else str(p)[:40] for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) or value is None else f" (got {SHOWN.repr(value)})"
        parts.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")  # a rule across fields names its own
    if len(errors) > MAX_PROBLEMS_SHOWN:
        parts.append(f"and {len(errors) - MAX_PROBLEMS_SHOWN} more")
    prefix = f"{what}: " if what else ""
    return prefix + "; ".join(parts)
