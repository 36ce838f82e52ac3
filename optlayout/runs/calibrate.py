"""Fit the cost model's calibratable constants to measured runs, per GPU type and precision.

Robust least squares (scipy, soft-L1 loss) on log(predicted / measured) tokens/s/GPU. Unpublished layout
fields are filled once by the solver under the starting constants and then held fixed, so a fit moves
only the constants, never the layouts. The error is reported under cross-validation grouped by source
(fit on the other sources, predict the held-out one), as well as in-sample.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pydantic
import yaml

from optlayout.cost import DEFAULT_PARAMS, CostParams, evaluate, group_links
from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.readers import CALIBRATION
from optlayout.runs.uncertainty import HeldOut, Uncertainty, build_uncertainty, coverage, describe, with_moe

if TYPE_CHECKING:  # fitting needs them; reading a calibration file does not (a solve loads only that)
    from optlayout.runs.predict import RunPrediction
    from optlayout.runs.records import RunRecord
    from optlayout.topology import Topology

CALIBRATION_SCHEMA_VERSION = 2  # 2 added `uncertainty`; version-1 files load without it
READABLE_SCHEMA_VERSIONS = (1, 2)
# The constants fitted, with physical bounds: efficiencies are fractions of a datasheet figure. The attention kernel's
# efficiency is not fitted: it keeps its source (the FlashAttention papers, CostParams), since the runs inform it only
# through the kernel each stack ran (FlashAttention-2 or Triton's at their sourced ratios), and a fit spent it on the
# kernel mismatches instead (fitted on the 427 runs with MosaicML's Triton kernel priced, leaving one source out:
# 12.6% fitted, 8.0% sourced; benchmarks/RESULTS.md, session 10).
FITTED: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.3, 0.95),
    "collective_efficiency": (0.3, 1.0),
    "tp_comm_overlap": (0.0, 0.95),
    "dp_comm_overlap": (0.0, 1.0),
}
# Fitted by earlier releases and still read from their files (with the same physical range): such a file applies them.
FORMERLY_FITTED: dict[str, tuple[float, float]] = {"attention_efficiency": (0.1, 0.9)}
LOSS_SCALE = 0.1  # the robust loss's scale: log errors beyond about 10% count linearly, not squared
MIN_RUNS_PER_KEY = 8  # fewer runs than this for a GPU/precision: use the global fit
# Fitted on mixture-of-experts runs only, one set for every GPU, on top of the dense constants (which MoE runs never
# refit): the grouped expert GEMMs' rate against a dense GEMM's and the expert all-to-all's link efficiency.
MOE_FITTED: dict[str, tuple[float, float]] = {
    "grouped_gemm_efficiency_ratio": (0.3, 1.0),
    "all_to_all_efficiency": (0.2, 1.0),
}


def calibration_key(gpu: str, precision: str) -> str:
    """The constants' key: the GPU and its number format, fp16 and bf16 sharing one (`bf16`): the same tensor-core
    rate and kernels, so fp16 runs refine, and fp16 jobs use, what bf16 runs fitted (loss scaling aside)."""
    return f"{gpu}/{'bf16' if precision == 'fp16' else precision}"


class Calibration(pydantic.BaseModel):
    """Fitted constants: a global set and per GPU/precision sets, with how they were obtained."""

    model_config = pydantic.ConfigDict(strict=True, allow_inf_nan=False)

    schema_version: int = CALIBRATION_SCHEMA_VERSION
    fitted_on: str
    fitted: list[str]
    default: dict[str, float]
    entries: dict[str, dict[str, float]] = pydantic.Field(default_factory=dict)
    moe: dict[str, float] = pydantic.Field(default_factory=dict, description="MOE_FITTED constants, every GPU")
    report: dict[str, Any] = pydantic.Field(default_factory=dict)
    uncertainty: Uncertainty | None = pydantic.Field(
        None, description="held-out error quantiles and support (optlayout.runs.uncertainty); None: an older file"
    )
    _heldout: list[HeldOut] = pydantic.PrivateAttr(default_factory=list)  # the rows `uncertainty` came from

    def params_for(self, gpu: str, precision: str) -> CostParams:
        values = self.entries.get(calibration_key(gpu, precision), self.default)
        return DEFAULT_PARAMS.model_copy(update=values | self.moe)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(), sort_keys=False, width=110)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration YAML file; errors name the field."""
    path = Path(path)
    raw = CALIBRATION.yaml(path)
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if type(version) is not int or version not in READABLE_SCHEMA_VERSIONS:
        versions = " or ".join(f"version-{v}" for v in READABLE_SCHEMA_VERSIONS)
        raise InputError(f"calibration: {path} is not a {versions} calibration file")
    try:
        calibration = Calibration.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "calibration")) from None
    for key in calibration.entries:
        _check_entry_key(key)
    for key, values in {"default": calibration.default, "moe": calibration.moe, **calibration.entries}.items():
        fittable = MOE_FITTED if key == "moe" else FITTED | FORMERLY_FITTED
        for name, value in values.items():  # only fitted constants, each inside the range a fit may reach
            if name not in fittable:
                raise InputError(f"calibration {key}.{name}: not a calibrated constant ({', '.join(fittable)})")
            lo, hi = fittable[name]
            if not lo <= value <= hi:
                raise InputError(f"calibration {key}.{name}: {value:g} is outside its physical range [{lo}, {hi}]")
        try:
            CostParams(**(DEFAULT_PARAMS.model_dump() | values))
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, f"calibration {key}")) from None
    return calibration


def _check_entry_key(key: str) -> None:
    """An entry is looked up by `calibration_key`: a key no job can produce (a typo, an unknown GPU) is refused
    rather than silently never used."""
    from optlayout.presets import GPU_FILE_ENV, gpu_names

    gpu, _, precision = key.partition("/")
    if gpu not in gpu_names():
        raise InputError(f"calibration entries.{key}: {gpu!r} is not a GPU preset, so no job would use these "
                         f"constants (valid: {', '.join(gpu_names())}; a GPU of {GPU_FILE_ENV} needs it "
                         "set)")  # fmt: skip
    if precision not in ("bf16", "fp8"):
        raise InputError(f"calibration entries.{key}: the precision after '/' must be bf16 or fp8 (fp16 jobs use "
                         f"bf16's), not {precision!r}, so no job would use these constants")  # fmt: skip


def shipped_calibration_path() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "default_calibration.yaml"


@checked_arguments
def calibrated_params(gpu: str, precision: str = "bf16", calibration: str | Path | None = None) -> CostParams:
    """The cost constants the CLI uses by default: the shipped calibration's (or the file `calibration`'s) for a
    GPU and precision.

    The library's `solve()`/`estimate_layout()` take the raw `DEFAULT_PARAMS` unless given `params=`; pass
    `params=calibrated_params(...)` for the CLI's figures."""
    path = calibration if calibration is not None else shipped_calibration_path()
    return load_calibration(path).params_for(gpu, precision)


@dataclass
class _Case:
    """One run with its layout fixed: what a fit re-evaluates."""

    prediction: RunPrediction
    topology: Topology

    def predicted_tps(self, params: CostParams) -> float:
        from optlayout.runs.predict import run_job

        rec, lay = self.prediction.record, self.prediction.layout
        job = run_job(rec)
        links = group_links(self.topology, lay)
        ev = evaluate(rec.model, job, lay, self.topology.gpu, self.topology, params, links)
        return ev.tokens_per_s_per_gpu


def prepare(records: Sequence[RunRecord], params_for: Callable[[str, str], CostParams]) -> list[_Case]:
    """Fill each run's layout once (solver, known fields pinned) and keep its topology."""
    from optlayout.runs.predict import predict_run
    from optlayout.topology import topology_from_cluster

    topologies: dict[str, Topology] = {}
    cases = []
    for rec in records:
        key = rec.cluster.model_dump_json()
        topo = topologies.get(key) or topologies.setdefault(key, topology_from_cluster(rec.cluster))
        cases.append(_Case(predict_run(rec, params_for(rec.cluster.gpu, rec.job.precision), topo), topo))
    return cases


def _with(base: CostParams, names: Sequence[str], x: np.ndarray) -> CostParams:
    return base.model_copy(update=dict(zip(names, (float(v) for v in x), strict=True)))


START_GRID_LEVELS = (0.25, 0.75)
"""Where `fit` looks for starting points: these fractions of each fitted constant's range, every combination."""
STARTS_FROM_GRID = 2  # the grid points of lowest loss a fit also starts from, besides its base


def fit(cases: Sequence[_Case], base: CostParams = DEFAULT_PARAMS, names: Sequence[str] = tuple(FITTED)) -> CostParams:
    """Robust least squares on log errors over the given runs, started from `base` and from the best points of a
    grid over the constants' ranges (`START_GRID_LEVELS`); the lowest loss wins. The step time's max() and clamped
    overlaps leave the loss several minima, so one start alone ends in the one nearest `base` (which for a
    GPU's fit is the global fit: its constants then moved with runs of other GPUs)."""
    if not cases:
        return base
    names = identifiable(cases, base, names)
    if not names:
        return base
    measured = np.array([c.prediction.record.measured.tokens_per_s_per_gpu for c in cases])
    lo = np.array([FITTED[n][0] for n in names])
    hi = np.array([FITTED[n][1] for n in names])

    def residuals(x: np.ndarray) -> np.ndarray:
        params = _with(base, names, x)
        predicted = np.array([c.predicted_tps(params) for c in cases])
        errors: np.ndarray = np.log(predicted / measured)
        return errors

    def loss(x: np.ndarray) -> float:  # least_squares' soft_l1 cost at f_scale LOSS_SCALE
        z = (residuals(x) / LOSS_SCALE) ** 2
        return float(LOSS_SCALE**2 * np.sum(np.sqrt(1 + z) - 1))

    from scipy.optimize import least_squares  # scipy loads only to fit

    grid = [lo + (hi - lo) * np.array(levels) for levels in itertools.product(START_GRID_LEVELS, repeat=len(names))]
    starts = [np.clip(np.array([getattr(base, n) for n in names]), lo, hi)]
    starts += sorted(grid, key=loss)[:STARTS_FROM_GRID]
    fits = [least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE, diff_step=1e-3)
            for x0 in starts]  # fmt: skip
    best = min(fits, key=lambda result: float(result.cost))
    return _with(base, names, best.x)


def identifiable(cases: Sequence[_Case], base: CostParams, names: Sequence[str]) -> list[str]:
    """The constants these runs can inform: moving one across its range must move some prediction by more
    than 0.1% (TP overlap is not identifiable from runs without TP, say); the others keep `base`'s value."""
    reference = np.array([c.predicted_tps(base) for c in cases])
    keep = []
    for name in names:
        lo, hi = FITTED[name]
        for probe in (lo, hi):
            moved = np.array([c.predicted_tps(base.model_copy(update={name: probe})) for c in cases])
            if np.max(np.abs(moved / reference - 1)) > 1e-3:
                keep.append(name)
                break
    return keep


def _error(case: _Case, params: CostParams) -> float:
    """Signed relative error of tokens/s/GPU: predicted / measured - 1 (positive: optimistic)."""
    return case.predicted_tps(params) / case.prediction.record.measured.tokens_per_s_per_gpu - 1


def _fit_calibration(cases: Sequence[_Case]) -> tuple[CostParams, dict[str, CostParams]]:
    """A global fit and, for each GPU/precision with enough runs, its own fit started from the global."""
    global_params = fit(cases)
    by_key: dict[str, list[_Case]] = defaultdict(list)
    for c in cases:
        rec = c.prediction.record
        by_key[calibration_key(rec.cluster.gpu, rec.job.precision)].append(c)
    per_key = {k: fit(v, global_params) for k, v in sorted(by_key.items()) if len(v) >= MIN_RUNS_PER_KEY}
    return global_params, per_key


def _params(global_params: CostParams, per_key: dict[str, CostParams], case: _Case) -> CostParams:
    rec = case.prediction.record
    return per_key.get(calibration_key(rec.cluster.gpu, rec.job.precision), global_params)


def _cross_validate(
    cases: Sequence[_Case], fold_of: Callable[[_Case], str], say: Callable[[str], None], what: str
) -> dict[int, float]:
    """Signed error of every run predicted by constants fitted on the runs of the other folds."""
    out: dict[int, float] = {}
    for fold in sorted({fold_of(c) for c in cases}):
        say(f"cross-validation: holding out {what} {fold[:60]}")
        g, per_key = _fit_calibration([c for c in cases if fold_of(c) != fold])
        for c in cases:
            if fold_of(c) == fold:
                out[id(c)] = _error(c, _params(g, per_key, c))
    return out


_DENSE_FROM = "; dense constants from "  # how a MoE-only calibration's `fitted_on` names its dense constants' fit


def calibrate(
    records: Sequence[RunRecord],
    fitted_on: str,
    progress: Callable[[str], None] | None = None,
    shared: Calibration | None = None,
) -> Calibration:
    """Fit a calibration on all runs and report its cross-validated error: the dense constants on the dense runs
    (leaving one source out, and leaving one GPU out: a held-out GPU gets the constants fitted on the other GPUs),
    then the MoE-only constants (`MOE_FITTED`) on the mixture-of-experts runs, on top of those dense constants
    (leave one model out). Without dense runs the dense constants are `shared`'s (default: the shipped
    calibration), never refit from MoE runs."""
    say = progress or (lambda _msg: None)
    dense = [r for r in records if r.model.moe is None]
    moe = [r for r in records if r.model.moe is not None]
    names = list(FITTED)
    if dense:
        calibration = _calibrate_dense(dense, fitted_on, say)
    else:  # the dense constants, their report and held-out distributions: the shared calibration's
        base = shared or load_calibration(shipped_calibration_path())
        dense_from = base.fitted_on.split(_DENSE_FROM)[-1]  # the dense fit itself, where `base` is MoE-only too
        calibration = Calibration(fitted_on=f"{fitted_on}{_DENSE_FROM}{dense_from}", fitted=names,
                                  default=base.default, entries=base.entries,
                                  report={k: v for k, v in base.report.items() if k != "moe"},
                                  uncertainty=base.uncertainty)  # fmt: skip
    if moe:
        values, report, rows = calibrate_moe(moe, calibration, say)
        u = calibration.uncertainty
        heldout = calibration._heldout
        calibration = calibration.model_copy(update={
            "moe": values if report["kept"] == "fitted" else {}, "report": calibration.report | {"moe": report},
            "uncertainty": with_moe(u, rows) if u is not None else None})  # fmt: skip
        calibration._heldout = [*heldout, *rows]
    return calibration


def _calibrate_dense(records: Sequence[RunRecord], fitted_on: str, say: Callable[[str], None]) -> Calibration:
    """The dense constants per GPU/precision, cross-validated leaving one source out."""
    say(f"filling layouts of {len(records)} runs")
    cases = prepare(records, lambda _g, _p: DEFAULT_PARAMS)
    sources = sorted({c.prediction.record.source for c in cases})
    uncal = {id(c): _error(c, DEFAULT_PARAMS) for c in cases}
    cv = _cross_validate(cases, lambda c: c.prediction.record.source, say, "source")
    cv_gpu = _cross_validate(cases, lambda c: c.prediction.record.cluster.gpu, say, "GPU")
    say("fitting on all runs")
    g, per_key = _fit_calibration(cases)
    insample = {id(c): _error(c, _params(g, per_key, c)) for c in cases}

    def table(errors: dict[int, float]) -> dict[str, Any]:
        by_source: dict[str, list[float]] = defaultdict(list)
        by_key: dict[str, list[float]] = defaultdict(list)
        for c in cases:
            rec = c.prediction.record
            by_source[rec.source].append(errors[id(c)])
            by_key[calibration_key(rec.cluster.gpu, rec.job.precision)].append(errors[id(c)])

        def mape(signed: list[float]) -> float:
            return round(statistics.mean(map(abs, signed)), 4)

        def median(signed: list[float]) -> float:
            return round(statistics.median(signed), 4)

        signed = list(errors.values())
        return {
            "mape": statistics.mean(map(abs, signed)),
            "median_ape": statistics.median(map(abs, signed)),
            "median_signed_error": statistics.median(signed),
            "per_source": {s: mape(v) for s, v in sorted(by_source.items())},
            "per_gpu_precision": {k: mape(v) for k, v in sorted(by_key.items())},
            "per_source_median_signed_error": {s: median(v) for s, v in sorted(by_source.items())},
            "per_gpu_precision_median_signed_error": {k: median(v) for k, v in sorted(by_key.items())},
        }

    rows = heldout_rows(cases, cv, cv_gpu)
    names = identifiable(cases, DEFAULT_PARAMS, list(FITTED))  # the others keep their sourced values
    warnings = [f"{len(cases)} run(s) for {len(names)} constants ({', '.join(names)}): the fit is underdetermined; "
                "runs of other layouts pin them"] if len(cases) < len(names) else []  # fmt: skip
    calibration = Calibration(
        fitted_on=fitted_on,
        fitted=names,
        default={n: round(getattr(g, n), 6) for n in names},
        entries={k: {n: round(getattr(p, n), 6) for n in names} for k, p in per_key.items()},
        report={
            "runs": len(cases),
            "sources": sources,
            "uncalibrated": table(uncal),
            "cross_validated_by_source": table(cv),
            "cross_validated_by_gpu": table(cv_gpu),
            "in_sample": table(insample),
        } | ({"warnings": warnings} if warnings else {}),
        uncertainty=build_uncertainty(rows).model_copy(update={"coverage": coverage(rows)}),
    )
    calibration._heldout = rows
    return calibration


def heldout_rows(
    cases: Sequence[_Case], held_out: dict[int, float], by_gpu: dict[int, float] | None = None
) -> list[HeldOut]:
    """Each run's held-out log errors (`held_out`: dense runs with their source left out, MoE runs with their model;
    `by_gpu`: with its GPU left out) and its regimes."""
    rows = []
    for c in cases:
        rec = c.prediction.record
        key = calibration_key(rec.cluster.gpu, rec.job.precision)
        regimes = describe(rec.model, rec.job_spec(), c.prediction.layout, key, rec.job.fp8_recipe)
        gpu_out = None if by_gpu is None else round(math.log1p(by_gpu[id(c)]), 6)
        rows.append(HeldOut(id=rec.id, source=rec.source, model=rec.model.name if rec.model.moe else None,
                            log_error=round(math.log1p(held_out[id(c)]), 6), log_error_gpu_out=gpu_out,
                            regimes=regimes))  # fmt: skip
    return rows


def calibrate_moe(
    records: Sequence[RunRecord], dense: Calibration, say: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, Any], list[HeldOut]]:
    """The MoE-only constants, one set for every GPU, fitted on the MoE runs with each run's dense constants held
    at `dense`'s; the error under cross-validation leaving one model out (fit on the other models).

    `report['kept']` says which constants a calibration keeps: `fitted` if, leaving one model out, they predict the
    held-out models better (MAPE) than the sourced defaults, else `sourced`. The held-out rows are each run's log
    error under what is kept: the constants fitted without its model, or the sourced ones (fitted on no MoE run)."""
    say(f"filling layouts of {len(records)} mixture-of-experts runs")
    cases = prepare(records, dense.params_for)
    models = sorted({c.prediction.record.model.name for c in cases})

    def base(case: _Case) -> CostParams:
        rec = case.prediction.record
        return dense.params_for(rec.cluster.gpu, rec.job.precision)

    def fitted(train: Sequence[_Case]) -> dict[str, float]:
        return _fit_moe(train, base) if train else {}

    def errors(values: dict[str, float], which: Sequence[_Case]) -> dict[int, float]:
        return {id(c): _error(c, base(c).model_copy(update=values)) for c in which}

    signed_uncal = errors({}, cases)
    signed_cv: dict[int, float] = {}
    for model in models:
        say(f"cross-validation: holding out {model}")
        held = [c for c in cases if c.prediction.record.model.name == model]
        signed_cv |= errors(fitted([c for c in cases if c.prediction.record.model.name != model]), held)
    say("fitting the MoE constants on all MoE runs")
    values = fitted(cases)
    uncal, cv = ({k: abs(v) for k, v in e.items()} for e in (signed_uncal, signed_cv))
    insample = {k: abs(v) for k, v in errors(values, cases).items()}
    kept = "fitted" if statistics.mean(cv.values()) < statistics.mean(uncal.values()) else "sourced"
    heldout = signed_cv if kept == "fitted" else signed_uncal

    def table(errors: dict[int, float]) -> dict[str, Any]:
        by_model: dict[str, list[float]] = defaultdict(list)
        for c in cases:
            by_model[c.prediction.record.model.name].append(errors[id(c)])
        vals = list(errors.values())
        return {"mape": statistics.mean(vals), "median_ape": statistics.median(vals),
                "per_model": {m: round(statistics.mean(v), 4) for m, v in sorted(by_model.items())}}  # fmt: skip

    report = {"runs": len(cases), "models": models, "fitted": list(MOE_FITTED), "kept": kept,
              "uncalibrated": table(uncal), "cross_validated_by_model": table(cv),
              "in_sample": table(insample)}  # fmt: skip
    rows = heldout_rows(cases, heldout)
    return {n: round(v, 6) for n, v in values.items()}, report, rows


def _fit_moe(cases: Sequence[_Case], base: Callable[[_Case], CostParams]) -> dict[str, float]:
    """Robust least squares of the `MOE_FITTED` constants on log errors, each run on its own dense constants."""
    names = list(MOE_FITTED)
    measured = np.array([c.prediction.record.measured.tokens_per_s_per_gpu for c in cases])
    lo = np.array([MOE_FITTED[n][0] for n in names])
    hi = np.array([MOE_FITTED[n][1] for n in names])
    x0 = np.clip(np.array([getattr(DEFAULT_PARAMS, n) for n in names]), lo, hi)

    def residuals(x: np.ndarray) -> np.ndarray:
        update = dict(zip(names, (float(v) for v in x), strict=True))
        predicted = np.array([c.predicted_tps(base(c).model_copy(update=update)) for c in cases])
        errors: np.ndarray = np.log(predicted / measured)
        return errors

    from scipy.optimize import least_squares  # scipy loads only to fit

    result = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE, diff_step=1e-3)
    return dict(zip(names, (float(v) for v in result.x), strict=True))
