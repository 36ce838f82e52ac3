"""Frozen dataclasses built by the hundred thousand in the cost model's inner loops, with a cheaper constructor.

A frozen dataclass's generated `__init__` stores each field through `object.__setattr__` (its own `__setattr__`
refuses): about 0.3 us a field. `fast_init` replaces it by one that writes the same values into the instance's
`__dict__` in field order, what `object.__setattr__` does for a class without slots or data descriptors of those
names: the same instance (equality, hash, repr, the refusal to assign) at a fraction of the cost.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """`cls` (a frozen dataclass without slots, `__post_init__`, init-less fields or default factories) with an
    `__init__` of the same signature that fills `__dict__` directly."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: fast_init takes a frozen dataclass")
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__slots__") or hasattr(cls, "__post_init__") or any(f.name.startswith("__") for f in fields):
        raise TypeError(f"{cls.__name__}: fast_init takes no slots, no __post_init__ and no dunder field")
    defaults: dict[str, object] = {}
    params = []
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: fast_init takes plain positional fields")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    # the instance and its dict under names no field has (dunder names: dataclasses' own convention)
    body = "".join(f"    __fast_dict__[{f.name!r}] = {f.name}\n" for f in fields)
    source = f"def __init__(__fast_self__, {', '.join(params)}):\n    __fast_dict__ = __fast_self__.__dict__\n{body}"
    namespace: dict[str, object] = {}
    exec(source, dict(defaults), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    setattr(cls, "__init__", init)  # noqa: B010  (a class attribute mypy would refuse to assign)
    return cls
