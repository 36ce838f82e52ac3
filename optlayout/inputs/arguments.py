"""The library's entry points check their arguments against their annotations before any work: strictly (a
string is no count, a bool no number, None no JobSpec) with finite floats; a wrong argument is an `InputError`
naming it, never an AttributeError or TypeError from deep inside."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pydantic

from optlayout.errors import SHOWN, InputError

F = TypeVar("F", bound=Callable[..., Any])
_CONFIG = pydantic.ConfigDict(strict=True, arbitrary_types_allowed=True, allow_inf_nan=False)


def checked_arguments(fn: F) -> F:
    """Wrap a library entry point so that its arguments are validated first (pydantic's `validate_call`)."""
    names = list(inspect.signature(fn).parameters)
    validated = pydantic.validate_call(config=_CONFIG)(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return validated(*args, **kwargs)
        except pydantic.ValidationError as exc:
            if exc.title != fn.__name__:  # raised inside the function: not about its arguments
                raise
            raise InputError(_describe(exc, names, fn.__qualname__)) from None

    return cast(F, call)


def _describe(exc: pydantic.ValidationError, names: list[str], where: str) -> str:
    """One line: the first argument that is wrong, what it should be, what it was."""
    errors = exc.errors()
    first = errors[0]["loc"][0] if errors[0]["loc"] else "(arguments)"
    name = names[first] if isinstance(first, int) and first < len(names) else str(first)
    mine = [e for e in errors if e["loc"] and e["loc"][0] == first]
    value = mine[0].get("input")
    shown = f"{SHOWN.repr(value)} ({type(value).__name__})"
    if len(mine) > 1:  # a union: none of its types took the value
        return f"{where}: {name}: not one of the types it takes, got {shown}"
    inner = ".".join(str(p) for p in mine[0]["loc"][1:])
    return f"{where}: {name}{'.' + inner if inner else ''}: {mine[0]['msg']}, got {shown}"
