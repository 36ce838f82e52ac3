"""`fast_init`: the same instances as a frozen dataclass's own constructor builds."""

from __future__ import annotations

import dataclasses
import math

import pytest

from optlayout.cost.step import LayerTimes, TimeBreakdown
from optlayout.frozen import fast_init


def _pair() -> tuple[type, type]:
    """The same frozen dataclass twice: with its generated constructor, and with `fast_init`'s."""

    def make() -> type:
        @dataclasses.dataclass(frozen=True)
        class Rec:
            a: float
            b: int
            c: tuple[int, ...] = ()
            d: float | None = None

        return Rec

    return make(), fast_init(make())


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1.5, 2), {}), ((1.5, 2, (3,)), {}), ((0.0,), {"b": 7, "d": -math.inf}), ((), {"a": 1, "b": 2})],
)
def test_same_instance_as_the_dataclass_constructor(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    plain, fast = _pair()
    want, got = plain(*args, **kwargs), fast(*args, **kwargs)
    assert vars(got) == vars(want) and list(vars(got)) == list(vars(want))  # the same values, in field order
    assert repr(got).replace(fast.__qualname__, "") == repr(want).replace(plain.__qualname__, "")
    assert hash(got) == hash(dataclasses.astuple(got)) == hash(dataclasses.astuple(want)) == hash(want)
    assert got == fast(*args, **kwargs) and got != fast(-1.0, -1)


def test_still_frozen_and_the_same_signature_errors() -> None:
    _, fast = _pair()
    rec = fast(1.0, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.a = 3.0
    with pytest.raises(TypeError):
        fast(1.0)  # b has no default
    with pytest.raises(TypeError):
        fast(1.0, 2, e=3)


def test_refuses_what_it_cannot_build_alike() -> None:
    @dataclasses.dataclass
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Mutable, Factory, Post):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_the_cost_models_records() -> None:
    times = TimeBreakdown(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    assert times.step_time_s == 45.0 and dataclasses.astuple(times) == tuple(float(i) for i in range(1, 10))
    layer = LayerTimes(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert (layer.ep_comm_fwd_s, layer.ep_comm_bwd_s, layer.modules) == (0.0, 0.0, ())
