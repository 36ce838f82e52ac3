"""Stragglers: a synchronous step moves at its slowest rank.

A straggler slowdown s makes every step (1 + s) times longer and divides throughput and MFU by 1 + s. It is
a run condition, not a calibratable constant of the cost model, and it scales every layout alike, so it
changes the predicted figures, never the order of layouts: it is applied to the reported predictions. The
expected slowdown of many jittery ranks is the expected maximum of their step times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel

from optlayout.cost import Prediction
from optlayout.errors import InputError


def check_straggler(slowdown: float) -> float:
    """A straggler slowdown is a fraction >= 0 (0.02 = the slowest rank is 2% slower)."""
    value = float(slowdown)
    if not math.isfinite(value) or value < 0:
        raise InputError(f"straggler slowdown must be a finite fraction >= 0 (0.02 = 2% slower), got {value:g}")
    return value


class StragglerPrediction(BaseModel):
    """The prediction with the slowest rank s slower: step x (1 + s), throughput and MFU / (1 + s)."""

    slowdown: float
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float


def with_straggler(prediction: Prediction, slowdown: float) -> StragglerPrediction:
    factor = 1.0 + check_straggler(slowdown)
    step = straggler_step_time_s(prediction.step_time_s, factor)
    return StragglerPrediction(
        slowdown=slowdown,
        step_time_s=step,
        tokens_per_s_per_gpu=prediction.tokens_per_s_per_gpu / factor,
        mfu=prediction.mfu / factor,
    )


def straggler_step_time_s(step_time_s: float, slowdown: float | Sequence[float]) -> float:
    """A synchronous step moves at its slowest rank: step time x the largest slowdown (>= 1). `slowdown` is
    that factor, or the per-rank factors (their maximum is taken)."""
    worst = max(slowdown) if isinstance(slowdown, Sequence) else slowdown
    if not math.isfinite(worst) or worst < 1.0:
        raise InputError(f"slowdown must be >= 1 (1 = no straggler), got {worst:g}")
    return _positive("step_time_s", step_time_s) * worst


def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normals]: integral of 1 - Phi^n over x > 0 minus Phi^n over x < 0
    (0 for n = 1, 1/sqrt(pi) for n = 2, about 3.9 for n = 16,384)."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InputError(f"n must be a whole number >= 1, got {n!r}")
    n = int(n)
    if n == 1:
        return 0.0
    from scipy import integrate, special  # scipy loads only for this integral

    def log_cdf_n(x: float) -> float:
        return n * float(special.log_ndtr(x))

    top = 1.0 + math.sqrt(2.0 * math.log(n))  # where the maximum concentrates
    pos, _ = integrate.quad(lambda x: -math.expm1(log_cdf_n(x)), 0.0, top + 40.0, points=[top], limit=200)
    neg, _ = integrate.quad(lambda x: math.exp(log_cdf_n(x)), -40.0, 0.0, limit=200)
    return float(pos - neg)


def expected_max_slowdown(ranks: int, sigma: float) -> float:
    """Expected slowdown of a synchronous step when each rank's time is independently 1 + sigma * Z, Z
    standard normal (run-to-run jitter): 1 + sigma * E[max of `ranks` normals]. Meant for small sigma."""
    return 1.0 + _positive("sigma", sigma, allow_zero=True) * expected_max_standard_normal(ranks)


def expected_max_slowdown_bernoulli(ranks: int, p_slow: float, slowdown: float) -> float:
    """Expected step slowdown when each rank is independently slow by `slowdown` with probability `p_slow`
    per step: 1 + (slowdown - 1) (1 - (1 - p)^ranks). Rare stragglers become certain at scale."""
    if isinstance(ranks, bool) or int(ranks) != ranks or ranks < 1:
        raise InputError(f"ranks must be a whole number >= 1, got {ranks!r}")
    if not 0.0 <= p_slow <= 1.0:
        raise InputError(f"p_slow must be in [0, 1], got {p_slow:g}")
    straggler_step_time_s(1.0, slowdown)  # validates slowdown >= 1
    p_any_slow = 1.0 if p_slow == 1.0 else -math.expm1(ranks * math.log1p(-p_slow))
    return 1.0 + (slowdown - 1.0) * p_any_slow


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{name} must be finite and {bound}, got {value:g}")
    return value
