"""How sure a prediction is: an interval from the calibration's held-out errors, and the regimes no run covers.

`calibrate` records, for every run, the log error log(predicted / measured) of tokens/s/GPU under constants
fitted without the run's source (leave one source out) and without its GPU (leave one GPU out), with the run's
`Regimes`. From these rows (`HeldOut`) it stores an `Uncertainty` in the calibration file:

- quantiles (`LEVELS`, numpy's linear rule) of the leave-one-source-out log errors, overall and for each
  regime flag (`REGIMES`) with at least `MIN_REGIME_RUNS` runs; the leave-one-GPU-out errors' quantiles stand
  for a GPU and precision no run measured;
- the support: the values of each categorical feature and the range of each numeric one over the runs;
- the `moe` regime from the mixture-of-experts runs alone (`with_moe`): their log errors under the MoE constants
  fitted without the run's model (leave one model out), or under the sourced ones where those are kept; MoE rows
  enter no other distribution and not the support, which stay the dense runs'.

A prediction's interval (`interval`) takes, of the overall distribution and those of its regime flags (and of an
unmeasured GPU), the most optimistic high quantile and the most pessimistic low one. A feature outside the
support or a flag with fewer than `MIN_REGIME_RUNS` runs is listed as unsupported and widens the interval to the
widest quantiles stored. The low end is the conservative estimate `solve --robust` ranks by
(`LayoutUncertainty`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
from pydantic import BaseModel, Field

from optlayout.layout.model import Layout, Sharding
from optlayout.specs import JobSpec, ModelSpec

LEVELS = (0.1, 0.5, 0.9)  # low, median, high quantile: the interval is the 10th-90th percentile (80%)
MIN_REGIME_RUNS = 5  # fewer held-out runs than this in a regime: its quantiles are not trusted
SHORT_CP_CHUNK_TOKENS = 4096
THIN_STAGE_LAYERS = 2
LARGE_FSDP_SHARDS = 64
LONG_SEQUENCE_TOKENS = 32768
REGIMES = {
    "cp_short_chunks": f"context parallelism with chunks of <= {SHORT_CP_CHUNK_TOKENS} tokens",
    "thin_stages": f"pipeline model chunks of <= {THIN_STAGE_LAYERS} layers",
    "interleaved": "interleaved pipeline (vp > 1)",
    "fsdp_large_dp": f"weights sharded (FSDP/ZeRO-3) over >= {LARGE_FSDP_SHARDS} ranks",
    "long_sequence": f"sequences of >= {LONG_SEQUENCE_TOKENS} tokens",
    "fp8": "FP8 precision",
    "moe": "a mixture-of-experts model",
}
NUMERIC = {  # the numeric features of the support, each where it applies
    "seq_len": "sequence length",
    "tp": "tp",
    "pp": "pp",
    "vp": "vp",
    "cp": "cp",
    "dp": "dp",
    "cp_chunk_tokens": "tokens per cp chunk",
    "layers_per_chunk": "layers per pipeline model chunk",
    "fsdp_shards": "FSDP shard group (dp x cp)",
}


class Regimes(BaseModel):
    """What a prediction is made for: its regime flags, categorical features and numeric features."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    flags: list[str] = Field(default_factory=list, description="the REGIMES that hold")
    categories: dict[str, str] = Field(default_factory=dict, description="gpu (gpu/precision), fp8_recipe")
    numbers: dict[str, float] = Field(default_factory=dict, description="NUMERIC features that apply")


def describe(model: ModelSpec, job: JobSpec, layout: Layout, gpu_key: str, fp8_recipe: str | None = None) -> Regimes:
    """The regimes of a layout of a model and job on a GPU/precision (`calibration_key`)."""
    chunk_layers = model.layers / (layout.pp * layout.vp)
    shards = layout.dp * layout.cp
    numbers: dict[str, float] = {"seq_len": job.seq_len, "tp": layout.tp, "pp": layout.pp, "vp": layout.vp,
                                 "cp": layout.cp, "dp": layout.dp}  # fmt: skip
    if layout.cp > 1:
        numbers["cp_chunk_tokens"] = job.seq_len / layout.cp
    if layout.pp > 1:
        numbers["layers_per_chunk"] = chunk_layers
    if layout.sharding == Sharding.fsdp:
        numbers["fsdp_shards"] = shards
    holds = {
        "cp_short_chunks": layout.cp > 1 and job.seq_len / layout.cp <= SHORT_CP_CHUNK_TOKENS,
        "thin_stages": layout.pp > 1 and chunk_layers <= THIN_STAGE_LAYERS,
        "interleaved": layout.vp > 1,
        "fsdp_large_dp": layout.sharding == Sharding.fsdp and shards >= LARGE_FSDP_SHARDS,
        "long_sequence": job.seq_len >= LONG_SEQUENCE_TOKENS,
        "fp8": job.precision == "fp8",
        "moe": model.moe is not None,
    }
    categories = {"gpu": gpu_key}
    if job.precision == "fp8":
        categories["fp8_recipe"] = fp8_recipe or "unstated"
    return Regimes(flags=[name for name, on in holds.items() if on], categories=categories, numbers=numbers)


class HeldOut(BaseModel):
    """One calibration run's out-of-sample log errors, log(predicted / measured), and its regimes."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    id: str
    source: str
    model: str | None = Field(None, description="the model's name: MoE rows, held out by model")
    log_error: float = Field(description="constants fitted without the run's source (MoE rows: its model)")
    log_error_gpu_out: float | None = Field(None, description="constants fitted without the run's GPU")
    regimes: Regimes


class Quantiles(BaseModel):
    """The `LEVELS` quantiles of held-out log errors (positive: the model was optimistic)."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    runs: int
    low: float
    median: float
    high: float


def quantiles(log_errors: Sequence[float]) -> Quantiles:
    import numpy as np  # only a calibration computes quantiles; reading one does not need numpy

    low, median, high = (float(q) for q in np.quantile(np.asarray(log_errors, dtype=float), LEVELS))
    return Quantiles(runs=len(log_errors), low=round(low, 6), median=round(median, 6), high=round(high, 6))


class Support(BaseModel):
    """What the calibration runs cover: the values of each categorical feature, the range of each numeric one."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    categories: dict[str, list[str]] = Field(default_factory=dict)
    ranges: dict[str, list[float]] = Field(default_factory=dict, description="[min, max] over the runs")

    @classmethod
    def of(cls, regimes: Iterable[Regimes]) -> Support:
        categories: dict[str, set[str]] = {}
        numbers: dict[str, list[float]] = {}
        for r in regimes:
            for name, value in r.categories.items():
                categories.setdefault(name, set()).add(value)
            for name, number in r.numbers.items():
                numbers.setdefault(name, []).append(number)
        return cls(categories={k: sorted(v) for k, v in sorted(categories.items())},
                   ranges={k: [min(v), max(v)] for k, v in sorted(numbers.items())})  # fmt: skip

    def outside(self, r: Regimes) -> list[str]:
        """The features of `r` no calibration run has, one phrase each."""
        out = []
        for name, value in r.categories.items():
            if value not in self.categories.get(name, []):
                out.append(f"{name} {value} (not measured)")
        for name, number in r.numbers.items():
            span = self.ranges.get(name)
            if span is None:
                out.append(f"{NUMERIC[name]} {number:g} (not measured)")
            elif not span[0] <= number <= span[1]:
                out.append(f"{NUMERIC[name]} {number:g} (measured {span[0]:g}-{span[1]:g})")
        return out


class Uncertainty(BaseModel):
    """The held-out error distributions and support a calibration file carries."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    levels: list[float] = Field(default_factory=lambda: list(LEVELS), description="the quantiles' levels: LEVELS")
    overall: Quantiles
    unmeasured_gpu: Quantiles | None = Field(None, description="leave-one-GPU-out errors: a GPU no run measured")
    regime_runs: dict[str, int] = Field(default_factory=dict, description="held-out runs in each regime")
    regimes: dict[str, Quantiles] = Field(default_factory=dict, description="regimes with >= MIN_REGIME_RUNS runs")
    support: Support = Field(default_factory=Support)
    coverage: dict[str, Any] = Field(
        default_factory=dict, description="the interval's coverage, source held out (under 'moe': model held out)"
    )

    @pydantic.field_validator("levels")
    @classmethod
    def _levels_read(cls, levels: list[float]) -> list[float]:
        if levels != list(LEVELS):  # the interval rule reads low/median/high as these levels
            raise ValueError(f"must be {list(LEVELS)} (the levels this optlayout reads), got {levels}")
        return levels

    def widest(self, moe: bool = True) -> tuple[float, float]:
        """The lowest low and highest high quantile stored (the `moe` regime's only if `moe`: for MoE predictions)."""
        regimes = [q for name, q in self.regimes.items() if moe or name != "moe"]
        stored = [self.overall, *regimes, *([self.unmeasured_gpu] if self.unmeasured_gpu else [])]
        return min(q.low for q in stored), max(q.high for q in stored)


def build_uncertainty(rows: Sequence[HeldOut]) -> Uncertainty:
    """The distributions and support of a set of held-out rows (no coverage)."""
    if not rows:
        raise ValueError("uncertainty: no held-out runs")
    by_regime: dict[str, list[float]] = {}
    for row in rows:
        for flag in row.regimes.flags:
            by_regime.setdefault(flag, []).append(row.log_error)
    gpu_out = [row.log_error_gpu_out for row in rows if row.log_error_gpu_out is not None]
    return Uncertainty(
        overall=quantiles([row.log_error for row in rows]),
        unmeasured_gpu=quantiles(gpu_out) if gpu_out else None,
        regime_runs={k: len(v) for k, v in sorted(by_regime.items())},
        regimes={k: quantiles(v) for k, v in sorted(by_regime.items()) if len(v) >= MIN_REGIME_RUNS},
        support=Support.of(row.regimes for row in rows),
    )


@dataclass(frozen=True)
class Bounds:
    """A prediction's log-error interval [low, high] and the regimes the calibration does not support."""

    low: float
    high: float
    unsupported: list[str]

    def tokens_per_s(self, predicted: float) -> tuple[float, float]:
        """The interval of tokens/s: measured = predicted / exp(log error)."""
        return predicted * math.exp(-self.high), predicted * math.exp(-self.low)


def bounds(u: Uncertainty, r: Regimes) -> Bounds:
    """The interval rule (module docstring)."""
    dists = [u.overall]
    unsupported = u.support.outside(r)
    gpu_unmeasured = r.categories.get("gpu") not in u.support.categories.get("gpu", [])
    if gpu_unmeasured and u.unmeasured_gpu is not None:
        dists.append(u.unmeasured_gpu)  # its own out-of-sample distribution; no penalty for it
        penalised = len(unsupported) > 1
    else:
        penalised = bool(unsupported)
    for flag in r.flags:
        q = u.regimes.get(flag)
        if q is not None:
            dists.append(q)
        else:
            runs = u.regime_runs.get(flag, 0)
            unsupported.append(f"{flag} ({runs} run{'s' if runs != 1 else ''})")
            penalised = True
    low, high = min(q.low for q in dists), max(q.high for q in dists)
    if penalised:
        wide_low, wide_high = u.widest(moe="moe" in r.flags)
        low, high = min(low, wide_low), max(high, wide_high)
    return Bounds(low, high, unsupported)


def coverage(rows: Sequence[HeldOut]) -> dict[str, Any]:
    """How often the interval covers a run's measured throughput with the run's source held out: the distributions
    and support come from the other sources' rows. Also the share the overall quantiles alone cover."""

    def held_out(others: list[HeldOut]) -> Uncertainty | None:
        return build_uncertainty(others) if others else None

    return _held_out_coverage(rows, lambda row: row.source, held_out, lambda u: u.overall, "overall", "per_source")


def _held_out_coverage(
    rows: Sequence[HeldOut],
    group_of: Callable[[HeldOut], str],
    held_out: Callable[[list[HeldOut]], Uncertainty | None],
    alone: Callable[[Uncertainty], Quantiles | None],
    alone_name: str,
    per_name: str,
) -> dict[str, Any]:
    """The interval's coverage of `rows` with each group (`group_of`) left out of the distributions (`held_out`
    of the other groups' rows; None: the group is not counted), overall and per group (`per_name`), and the share
    one distribution (`alone`) covers alone (`covered_by_{alone_name}_quantiles_only`)."""
    covered: dict[str, list[bool]] = {}
    plain: list[bool] = []
    for group in sorted({group_of(row) for row in rows}):
        u = held_out([row for row in rows if group_of(row) != group])
        if u is None:
            continue
        q = alone(u)
        for row in rows:
            if group_of(row) == group:
                b = bounds(u, row.regimes)
                covered.setdefault(group, []).append(b.low <= row.log_error <= b.high)
                plain.append(q is not None and q.low <= row.log_error <= q.high)
    every = [hit for hits in covered.values() for hit in hits]
    if not every:
        return {}
    return {
        "nominal": round(LEVELS[2] - LEVELS[0], 6),
        "runs": len(every),
        "covered": round(sum(every) / len(every), 4),
        f"covered_by_{alone_name}_quantiles_only": round(sum(plain) / len(plain), 4),
        per_name: {g: round(sum(v) / len(v), 4) for g, v in covered.items()},
    }


def with_moe(u: Uncertainty, rows: Sequence[HeldOut]) -> Uncertainty:
    """`u` (the dense runs' distributions) with the `moe` regime from the mixture-of-experts runs' held-out rows,
    and under `coverage['moe']` the interval's coverage of those runs with each model held out (`moe_coverage`)."""
    return _moe_regime(u, rows).model_copy(update={"coverage": u.coverage | {"moe": moe_coverage(u, rows)}})


def _moe_regime(u: Uncertainty, rows: Sequence[HeldOut]) -> Uncertainty:
    regimes = {k: q for k, q in u.regimes.items() if k != "moe"}
    if len(rows) >= MIN_REGIME_RUNS:
        regimes["moe"] = quantiles([row.log_error for row in rows])
    regime_runs = u.regime_runs | {"moe": len(rows)}
    return u.model_copy(update={"regimes": dict(sorted(regimes.items())),
                                "regime_runs": dict(sorted(regime_runs.items()))})  # fmt: skip


def moe_coverage(u: Uncertainty, rows: Sequence[HeldOut]) -> dict[str, Any]:
    """How often the interval covers an MoE run's measured throughput with the run's model held out: the `moe`
    regime from the other models' rows (fewer than `MIN_REGIME_RUNS`: unsupported, the interval widest), the dense
    distributions and support as in `u`. Also the share the `moe` quantiles alone cover."""
    return _held_out_coverage(rows, lambda row: row.model or "", lambda others: _moe_regime(u, others),
                              lambda held: held.regimes.get("moe"), "moe", "per_model")  # fmt: skip


class PredictionSupport(BaseModel):
    """What `solve` and `estimate` show with a prediction: the 10th-90th percentile interval of tokens/s/GPU
    from the held-out errors, and the regimes no calibration run covers."""

    tokens_per_s_per_gpu_low: float
    tokens_per_s_per_gpu_high: float
    unsupported: list[str]


def interval(u: Uncertainty, predicted_tps: float, r: Regimes) -> PredictionSupport:
    b = bounds(u, r)
    low, high = b.tokens_per_s(predicted_tps)
    return PredictionSupport(tokens_per_s_per_gpu_low=low, tokens_per_s_per_gpu_high=high, unsupported=b.unsupported)


@dataclass(frozen=True)
class LayoutUncertainty:
    """An `Uncertainty` applied to the layouts of one model and job on one GPU/precision (`calibration_key`).

    `factor` is the robust objective's per-layout factor: the interval's low end over the prediction,
    exp(-high log-error quantile). `max_factor` bounds it over every layout (the overall quantile is always among
    those taken), so a throughput bound times it bounds the conservative throughput: the exact search stays exact."""

    uncertainty: Uncertainty
    model: ModelSpec
    job: JobSpec
    gpu_key: str
    _factors: dict[tuple[object, ...], float] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def on(cls, uncertainty: Uncertainty, model: ModelSpec, job: JobSpec, gpu: str) -> LayoutUncertainty:
        """For the job on a GPU preset, keyed as the calibration keys its constants."""
        from optlayout.runs.calibrate import calibration_key  # calibrate imports this module

        return cls(uncertainty, model, job, calibration_key(gpu, job.precision))

    def regimes(self, layout: Layout) -> Regimes:
        return describe(self.model, self.job, layout, self.gpu_key, self.job.fp8_recipe)

    def factor(self, layout: Layout) -> float:
        key = (layout.tp, layout.pp, layout.vp, layout.cp, layout.dp, layout.sharding)  # all `describe` reads
        factor = self._factors.get(key)
        if factor is None:
            factor = self._factors[key] = math.exp(-bounds(self.uncertainty, self.regimes(layout)).high)
        return factor

    @property
    def max_factor(self) -> float:
        return math.exp(-self.uncertainty.overall.high)

    def support(self, layout: Layout, predicted_tps: float) -> PredictionSupport:
        return interval(self.uncertainty, predicted_tps, self.regimes(layout))
