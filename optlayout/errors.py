"""User-facing errors: one line that names the field or constraint, exit status 2 in the CLI."""

from __future__ import annotations

import pydantic


class OptlayoutError(ValueError):
    """Bad input or an impossible request; the message is shown to the user as it is."""


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
