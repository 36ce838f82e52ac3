"""Failures, checkpoints and goodput: how often to checkpoint and what fraction of wall time trains.

Pure functions, SI units inside (seconds, bytes, bytes/s); conversions to hours and minutes happen in the CLI.

Two models, each paired with the interval that optimizes it, so `method` picks a consistent pair:

* ``"young"``: first-order model (Young 1974). A failure strikes uniformly inside the compute interval tau,
  so it loses tau/2 of work plus the restart R; failures during the checkpoint write itself are neglected
  (counting them adds C/2 per failure, a constant C/(2M) of waste that does not move the optimum). Waste is
  C/tau + (tau/2 + R)/M, whose exact minimum is Young's tau = sqrt(2 C M); there the effective fraction
  is 1 - sqrt(2C/M) - R/M.
* ``"daly"``: renewal model for Poisson failures (Daly 2006): each segment is tau of work plus a write of C,
  a failure anywhere (in the work, in the write in progress, or in the restart) loses the segment, and
  the expected wall time per segment is M e^{R/M} (e^{(tau+C)/M} - 1). Daly's higher-order interval is a
  perturbation estimate of this model's optimum (R drops out of the optimum: it scales the wall time).

Asynchronous checkpoints block training only for the copy to host memory (C = blocking part); the write to
storage then runs in the background for ``durability_lag_s``. A failure inside that window finds the new
checkpoint not yet durable and rolls back one more interval: probability lag/tau, cost tau, so the
expected extra loss per failure is the lag itself. Both models add it to the restart term (first-order
exact; the optimum interval is unchanged), and the interval may not be shorter than the lag.

Sources:
- J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974.
- J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
  Generation Computer Systems 22(3), 2006 (doi:10.1016/j.future.2004.11.016), eq. 37; the same formula is
  implemented in LLNL SCR `scripts/python/scr_ckpt_interval.py`. Its worked examples (R = 10 min,
  C = 5 min): M = 24 h -> 117 min, M = 6 h -> 57 min, M = 15 min -> 9.1 min (checked in the tests).
- Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot on up to
  16,384 H100s, "higher than 90% effective training time"; storage sustains 2 TB/s (section 3.3.1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from optlayout.errors import InputError

Method = Literal["young", "daly"]
METHODS: tuple[str, ...] = ("young", "daly")

SECONDS_PER_MINUTE = 60.0
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

DEFAULT_RESTART_S = 10 * SECONDS_PER_MINUTE
"""Restart time when none is given: detect the failure, reschedule, reload the checkpoint (order of 10 min)."""

DEFAULT_D2H_BPS = 25e9
"""Device-to-host copy bandwidth per GPU for asynchronous checkpoints: about half of PCIe Gen5 x16's
64 GB/s per direction, since two GPUs often share a PCIe switch and host-memory copies are seldom at peak."""

DEFAULT_TABLE_FACTORS: tuple[float, ...] = (2.0, 1.0, 0.5, 0.2, 0.1, 0.01)
"""Checkpoint costs of the what-if table, as multiples of the current cost (1.0 is the current one)."""


def _check(name: str, value: float, *, allow_zero: bool = False) -> float:
    """Return `value` as a float if it is finite and positive (or zero where allowed), else raise."""
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{name} must be finite and {bound}, got {value:g}")
    return value


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


# --- MTBF ---------------------------------------------------------------------------------------------


def mtbf_from_failures_s(failures: float, period_s: float) -> float:
    """Mean time between failures observed as `failures` in `period_s`: 419 in 54 days -> 3.09 h."""
    return _check("period_s", period_s) / _check("failures", failures)


def cluster_mtbf_s(gpus: int, *, gpu_failure_rate_per_s: float | None = None, gpu_mtbf_s: float | None = None) -> float:
    """Job MTBF from a per-GPU failure rate (or per-GPU MTBF): independent failures add up, so the job's
    MTBF is the per-GPU MTBF / gpus and halves when the GPU count doubles. Give exactly one of the two."""
    count = _check("gpus", gpus)
    if (gpu_failure_rate_per_s is None) == (gpu_mtbf_s is None):
        raise InputError("give exactly one of gpu_failure_rate_per_s and gpu_mtbf_s")
    if gpu_failure_rate_per_s is not None:
        return 1.0 / _check("gpu_failure_rate_per_s", gpu_failure_rate_per_s) / count
    assert gpu_mtbf_s is not None  # exactly one was given
    return _check("gpu_mtbf_s", gpu_mtbf_s) / count


# --- checkpoint cost ----------------------------------------------------------------------------------


def storage_bandwidth_Bps(storage_Bps: float, per_node_Bps: float | None = None, nodes: int | None = None) -> float:
    """Write bandwidth a checkpoint sees: the storage system's aggregate, capped by what the nodes can push
    (per-node write bandwidth x nodes) when those are given."""
    storage_Bps = _check("storage_Bps", storage_Bps)
    if (per_node_Bps is None) != (nodes is None):
        raise InputError("per-node write bandwidth and node count go together: give both or neither")
    if per_node_Bps is None or nodes is None:
        return storage_Bps
    return min(storage_Bps, _check("per_node_Bps", per_node_Bps) * _check("nodes", nodes))


def checkpoint_write_s(
    state_bytes: float,
    storage_Bps: float,
    per_node_Bps: float | None = None,
    nodes: int | None = None,
    *,
    largest_node_bytes: float | None = None,
) -> float:
    """Time to write the whole training state once, every rank writing its own shard in parallel: the state
    over the aggregate bandwidth, or the most any node writes over the per-node bandwidth, whichever is
    longer (metadata and serialization are neglected). The node's bytes are `largest_node_bytes`, or the
    state split evenly over `nodes`; with the even split this is state / `storage_bandwidth_Bps`."""
    write_s = _check("state_bytes", state_bytes) / _check("storage_Bps", storage_Bps)
    if per_node_Bps is None and nodes is None and largest_node_bytes is None:
        return write_s
    if largest_node_bytes is None:
        if per_node_Bps is None or nodes is None:
            raise InputError("per-node write bandwidth and node count go together: give both or neither")
        largest_node_bytes = state_bytes / _check("nodes", nodes)
    if per_node_Bps is None:
        raise InputError("the bytes the largest node writes need its per-node write bandwidth")
    return max(write_s, largest_node_bytes / _check("per_node_Bps", per_node_Bps))


def checkpoint_blocking_s(state_bytes: float, ranks: int, d2h_Bps: float = DEFAULT_D2H_BPS) -> float:
    """Training pause of an asynchronous checkpoint: each rank copies its 1/ranks shard of the state to host
    memory at `d2h_Bps` (all ranks at once); the write to storage then proceeds in the background."""
    shard_bytes = _check("state_bytes", state_bytes) / _check("ranks", ranks)
    return shard_bytes / _check("d2h_Bps", d2h_Bps)


@dataclass(frozen=True)
class CheckpointCost:
    """What a checkpoint costs: `blocking_s` pauses training; `durability_lag_s` is the background write
    after it (0 for a synchronous checkpoint, whose write is the blocking part)."""

    blocking_s: float
    write_s: float
    asynchronous: bool

    @property
    def durability_lag_s(self) -> float:
        return self.write_s if self.asynchronous else 0.0


def checkpoint_cost(
    state_bytes: float,
    storage_Bps: float,
    *,
    per_node_Bps: float | None = None,
    nodes: int | None = None,
    asynchronous: bool = False,
    ranks: int | None = None,
    d2h_Bps: float = DEFAULT_D2H_BPS,
) -> CheckpointCost:
    """Checkpoint cost derived from the state size and storage: synchronous -> the full write blocks;
    asynchronous -> only the device-to-host copy blocks (needs `ranks`, the GPUs sharing the copy)."""
    write_s = checkpoint_write_s(state_bytes, storage_Bps, per_node_Bps, nodes)
    if not asynchronous:
        return CheckpointCost(blocking_s=write_s, write_s=write_s, asynchronous=False)
    if ranks is None:
        raise InputError("an asynchronous checkpoint needs the number of GPUs (ranks) that share the copy")
    return CheckpointCost(checkpoint_blocking_s(state_bytes, ranks, d2h_Bps), write_s, asynchronous=True)


# --- optimal interval ---------------------------------------------------------------------------------


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal compute time between checkpoints: sqrt(2 C M)."""
    return math.sqrt(2.0 * _check("checkpoint_s", checkpoint_s) * _check("mtbf_s", mtbf_s))


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37): for C < 2M,
    sqrt(2 C M) [1 + (1/3) sqrt(C/(2M)) + (1/9) C/(2M)] - C; otherwise M."""
    c, m = _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def optimal_interval_s(checkpoint_s: float, mtbf_s: float, method: Method = "young") -> float:
    """The optimal interval of `method` ('young' or 'daly')."""
    _check_method(method)
    return young_interval_s(checkpoint_s, mtbf_s) if method == "young" else daly_interval_s(checkpoint_s, mtbf_s)


# --- loss and effective time --------------------------------------------------------------------------


def lost_per_failure_s(
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    method: Method = "young",
    durability_lag_s: float = 0.0,
) -> float:
    """Expected wall time one failure costs.

    young: tau/2 + R + lag (first-order). daly (renewal): everything outside the successful attempts per
    failure, M - (tau + C) / (e^{(R+lag)/M} (e^{(tau+C)/M} - 1)), which is (tau + C)/2 + R + lag to first
    order: it also loses the write in progress and failures during restart.
    """
    _check_method(method)
    tau, c, m = _check("interval_s", interval_s), _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s)
    r = _check("restart_s", restart_s, allow_zero=True) + _check("durability_lag_s", durability_lag_s, allow_zero=True)
    if method == "young":
        return tau / 2.0 + r
    seg = tau + c
    return m - seg / (math.exp(r / m) * math.expm1(seg / m))


def effective_fraction_first_order(
    interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float, durability_lag_s: float = 0.0
) -> float:
    """Young's model: 1 - C/tau - (tau/2 + R + lag)/M, clipped to [0, 1]."""
    tau, c, m = _check("interval_s", interval_s), _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s)
    lost = lost_per_failure_s(tau, c, restart_s, m, "young", durability_lag_s)
    return min(1.0, max(0.0, 1.0 - c / tau - lost / m))


def effective_fraction_renewal(
    interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float, durability_lag_s: float = 0.0
) -> float:
    """Daly's renewal model: useful work tau over expected wall time M e^{(R+lag)/M} (e^{(tau+C)/M} - 1)."""
    tau, c, m = _check("interval_s", interval_s), _check("checkpoint_s", checkpoint_s), _check("mtbf_s", mtbf_s)
    r = _check("restart_s", restart_s, allow_zero=True) + _check("durability_lag_s", durability_lag_s, allow_zero=True)
    # In log space so that huge (tau + C)/M or R/M underflow to 0 instead of overflowing.
    seg = (tau + c) / m
    log_wall = math.log(m) + r / m + (seg + math.log(-math.expm1(-seg)))
    return min(1.0, math.exp(math.log(tau) - log_wall))


def effective_time_fraction(
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    method: Method = "young",
    durability_lag_s: float = 0.0,
) -> float:
    """Fraction of wall time that trains, under the model of `method` (see the module docstring)."""
    _check_method(method)
    fn = effective_fraction_first_order if method == "young" else effective_fraction_renewal
    return fn(interval_s, checkpoint_s, restart_s, mtbf_s, durability_lag_s)


@dataclass(frozen=True)
class CheckpointPlan:
    """The optimal checkpoint interval of one method and what it yields (all in seconds)."""

    method: str
    mtbf_s: float
    checkpoint_s: float
    restart_s: float
    durability_lag_s: float
    interval_s: float
    interval_raised_to_lag: bool
    lost_per_failure_s: float
    effective_time_fraction: float

    @property
    def model_holds(self) -> bool:
        """Whether the method's model describes this plan: Young's first order assumes at most one failure per
        interval (an interval shorter than the MTBF) and leaves a positive fraction unclipped; Daly's renewal
        model holds for any interval."""
        if self.method != "young":
            return True
        lost = self.lost_per_failure_s
        return self.interval_s < self.mtbf_s and 1.0 - self.checkpoint_s / self.interval_s - lost / self.mtbf_s > 0


def plan_checkpointing(
    mtbf_s: float,
    checkpoint_s: float,
    restart_s: float = DEFAULT_RESTART_S,
    method: Method = "young",
    durability_lag_s: float = 0.0,
) -> CheckpointPlan:
    """Optimal interval, loss per failure and effective fraction for one checkpoint cost.

    Raises InputError when the checkpoint (or its background write) takes as long as the MTBF: then the
    job fails about once per checkpoint and no interval makes progress reliably.
    """
    _check_method(method)
    m, c = _check("mtbf_s", mtbf_s), _check("checkpoint_s", checkpoint_s)
    r = _check("restart_s", restart_s, allow_zero=True)
    lag = _check("durability_lag_s", durability_lag_s, allow_zero=True)
    if c >= m:
        raise InputError(
            f"MTBF {m / SECONDS_PER_MINUTE:.3g} min is not longer than the checkpoint cost "
            f"{c / SECONDS_PER_MINUTE:.3g} min: no useful checkpoint interval exists"
        )
    if lag >= m:
        raise InputError(
            f"MTBF {m / SECONDS_PER_MINUTE:.3g} min is not longer than the background checkpoint write "
            f"{lag / SECONDS_PER_MINUTE:.3g} min: checkpoints would rarely become durable"
        )
    tau = optimal_interval_s(c, m, method)
    raised = tau < lag
    tau = max(tau, lag)
    return CheckpointPlan(
        method=method,
        mtbf_s=m,
        checkpoint_s=c,
        restart_s=r,
        durability_lag_s=lag,
        interval_s=tau,
        interval_raised_to_lag=raised,
        lost_per_failure_s=lost_per_failure_s(tau, c, r, m, method, lag),
        effective_time_fraction=effective_time_fraction(tau, c, r, m, method, lag),
    )


def goodput_fraction(
    mtbf_s: float,
    checkpoint_s: float,
    restart_s: float = DEFAULT_RESTART_S,
    method: Method = "young",
    durability_lag_s: float = 0.0,
) -> float:
    """Effective training-time fraction at the optimal interval: what the solver multiplies throughput by.

    young: 1 - sqrt(2C/M) - (R + lag)/M (clipped at 0). Raises InputError if C >= M.
    """
    return plan_checkpointing(mtbf_s, checkpoint_s, restart_s, method, durability_lag_s).effective_time_fraction


def checkpoint_cost_table(
    mtbf_s: float,
    checkpoint_costs_s: Iterable[float],
    restart_s: float = DEFAULT_RESTART_S,
    method: Method = "young",
    durability_lag_s: float = 0.0,
) -> list[CheckpointPlan]:
    """One plan per checkpoint cost, in the order given, skipping costs not shorter than the MTBF: shows
    what a faster checkpoint buys."""
    return [
        plan_checkpointing(mtbf_s, c, restart_s, method, durability_lag_s)
        for c in checkpoint_costs_s
        if _check("checkpoint_s", c) < mtbf_s
    ]


def table_costs_s(checkpoint_s: float, factors: Sequence[float] = DEFAULT_TABLE_FACTORS) -> list[float]:
    """The what-if checkpoint costs: `checkpoint_s` times each factor."""
    return [checkpoint_s * f for f in factors]
