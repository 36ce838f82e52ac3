"""Errors a caller can catch: one line that names the field or constraint.

`OptlayoutError` is the base; the CLI prints any of them as one line and exits with status 2.
"""

from __future__ import annotations

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


def describe_validation_error(exc: pydantic.ValidationError, what: str = "") -> str:
    """Turn a pydantic error into one line per problem, each naming the field and the value."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) or value is None else f" (got {value!r})"
        parts.append(f"{loc}: {msg}{shown}")
    prefix = f"{what}: " if what else ""
    return prefix + "; ".join(parts)
