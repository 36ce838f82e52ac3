"""Predict a measured run: fill the layout fields it did not publish with the solver, then the cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic

from optlayout.cost import DEFAULT_PARAMS, CostParams, Prediction
from optlayout.errors import InputError, describe_validation_error
from optlayout.layout import layout_problems
from optlayout.runs.records import RunRecord
from optlayout.solver.candidates import Limits, rank_key, throughput_scale
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions
from optlayout.specs import JobSpec, Layout, Recompute, Sharding
from optlayout.topology import Topology, cluster_assumptions, topology_from_cluster


@dataclass(frozen=True)
class RunPrediction:
    """A run's layout as predicted (published fields kept, the rest filled) and the prediction for it."""

    record: RunRecord
    layout: Layout
    filled_fields: dict[str, object]
    prediction: Prediction
    assumed: dict[str, dict[str, Any]]  # job and cluster fields the record did not state: {"value": ..., "why": ...}

    @property
    def memory_model_miss(self) -> bool:
        """The run ran, yet the memory model puts every completion of its layout over the GPU's memory."""
        return not self.prediction.fits

    @property
    def ape(self) -> float:
        """Absolute percentage error of tokens/s/GPU."""
        measured = self.record.measured.tokens_per_s_per_gpu
        return abs(self.prediction.tokens_per_s_per_gpu - measured) / measured


def run_job(record: RunRecord) -> JobSpec:
    return record.job_spec()


def assumed_fields(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Job and cluster fields the record leaves unstated, with the value assumed and why."""
    job: dict[str, tuple[object, str | None]] = {
           "attention_kernel": record.attention_kernel(), "moe_dispatcher": record.moe_dispatcher(),
           "moe_ep_overlap": record.moe_ep_overlap(),
           "dropout": record.dropout(), "fp8_param_gather": record.fp8_param_gather()}  # fmt: skip
    dtypes, why = record.optimizer_state()
    job |= {name: (dtype, why) for name, dtype in dtypes.items()}
    cluster = {f"cluster.{k}": v for k, v in cluster_assumptions(record.cluster).items()}
    assumed = cluster | {name: {"value": value, "why": why} for name, (value, why) in job.items() if why is not None}
    for name, part in record.recipe_fills().items():
        why = f"not stated: the published recipe of this release sets it ({part.source})"
        assumed[f"layout.{name}"] = {"value": part.text(), "why": why}
    return assumed


def _pins(record: RunRecord) -> dict[str, Any]:
    known = record.layout.known()
    pins: dict[str, Any] = {k: v for k, v in known.items() if k not in ("sharding", "recompute")}
    if "sharding" in known:
        pins["sharding"] = Sharding(known["sharding"])
    if "recompute" in known:
        pins["recompute"] = Recompute(known["recompute"])
    for part in record.recipe_fills().values():  # the published recipe's recomputation and sharding (a fill rule)
        pins |= part.pins()
    return pins


def record_problem(record: RunRecord, params: CostParams = DEFAULT_PARAMS, topology: Topology | None = None) -> Problem:
    """The search problem a run is predicted in: its published fields (and recipe fills) pinned."""
    pins = _pins(record)
    options = SpaceOptions(pins=pins, max_micro_batch=max(16, int(pins.get("micro_batch", 1))), max_vp=32,
                           max_cp=max(64, int(pins.get("cp", 1))), allow_tp_beyond_domain=True)  # fmt: skip
    return Problem(record.model, run_job(record), topology or topology_from_cluster(record.cluster), params, options)


def check_record(record: RunRecord, problem: Problem | None = None) -> None:
    """Refuse a record no legal layout matches (the check `compare` makes; `runs from-log` makes it before
    writing a record)."""
    problem = problem or record_problem(record)
    if next(iter(problem.layouts()), None) is None:
        problems = _explain_illegal(record, problem.job)
        raise InputError(f"run {record.id}: no legal layout matches the published fields ({problems})")


def predict_run(
    record: RunRecord, params: CostParams = DEFAULT_PARAMS, topology: Topology | None = None
) -> RunPrediction:
    """Fill unpublished layout fields with the solver's best choice consistent with the published ones (an
    unpublished recomputation or sharding: the published recipe's where `RunRecord.recipe_fills` knows it; else
    the fastest that fits, with full recomputation of the fewest layers that fit; a published `full` without its
    layer count recomputes every layer).

    The published run did run, so if no completion fits the memory model, the fastest completion is used
    anyway, in the solver's order without the memory constraint (the prediction then says `fits: false`,
    `memory_model_miss`: a miss of the memory model, reported as such).
    """
    from optlayout.solver.cpsat import solve_top_k  # OR-Tools loads when a run is predicted, not for a calibration file

    problem = record_problem(record, params, topology)
    check_record(record, problem)
    pins = problem.options.pins
    layouts = list(problem.layouts())
    if "recompute" not in pins:  # unpublished: the least recomputation that fits, down to the layers of full
        layouts = [problem.table.fewest_recomputed(lay, problem.capacity_bytes) for lay in layouts]
    candidates = [problem.table.candidate(lay) for lay in layouts]
    ranked = solve_top_k(candidates, Limits(problem.capacity_bytes)).ranked
    if ranked:
        best = ranked[0]
    else:
        scale = throughput_scale(candidates)
        best = min(candidates, key=lambda c: rank_key(c, scale))
    unknown = [k for k in record.unknown_layout_fields() if k != "recompute_layers" or best.layout.recompute == "full"]
    filled = {k: _plain(getattr(best.layout, k)) for k in unknown}  # a layer count only beside full recomputation
    return RunPrediction(record, best.layout, filled, best.prediction, assumed_fields(record))


def _plain(value: object) -> object:
    return value.value if isinstance(value, Sharding | Recompute) else value


def _explain_illegal(record: RunRecord, job: JobSpec) -> str:
    """The rules the published fields break, checked on the layout they state (an unpublished degree 1, an
    unpublished dp whatever fills the cluster, the job's batch split over it); else the search's own bounds."""
    known = record.layout.known()
    tp, pp, cp = known.get("tp", 1), known.get("pp", 1), known.get("cp", 1)
    dp = known.get("dp", max(1, record.cluster.gpus // (tp * pp * cp)))
    micro_batch = known.get("micro_batch", 1)
    stated = {k: known[k] for k in ("vp", "ep", "etp", "sharding", "recompute", "recompute_layers",
                                    "recompute_modules") if k in known}  # fmt: skip
    try:
        lay = Layout(
            tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=micro_batch,
            sequence_parallel=known.get("sequence_parallel", tp > 1),
            grad_accum=max(1, record.job.global_batch // (micro_batch * dp)), **stated,
        )  # fmt: skip
    except pydantic.ValidationError as exc:
        return describe_validation_error(exc, "layout")
    return "; ".join(layout_problems(record.model, job, lay, record.cluster.gpus)) or "outside the searched space"
