"""One given layout: `estimate_layout` (the cost model's prediction), `estimate_run` (with run conditions)
and `explain_layout` (where it ranks and the terms it loses on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from optlayout.conditions.goodput import FailureSpec, GoodputModel, LayoutCheckpointing, StorageSpec
from optlayout.conditions.stragglers import StragglerPrediction, check_straggler, with_straggler
from optlayout.cost import DEFAULT_PARAMS, CostParams, Prediction
from optlayout.errors import InfeasibleError
from optlayout.inputs.arguments import checked_arguments
from optlayout.layout import Layout, check_layout
from optlayout.planning.inputs import ModelInput, resolve_model
from optlayout.planning.search import ClusterInput, check_run_conditions, failure_input, storage_input
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions, search_limits, space_options
from optlayout.specs import JobSpec
from optlayout.topology import resolve_cluster


@checked_arguments
def estimate_layout(
    model: ModelInput,
    cluster: ClusterInput,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """Full prediction for one given layout (checked for legality first)."""
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    check_layout(spec, job, layout, topo.num_gpus)
    return Problem(spec, job, topo, params).table.predict(layout)


@checked_arguments
def explain_layout(
    model: ModelInput,
    cluster: ClusterInput,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
) -> dict[str, Any]:
    """Where `layout` ranks among all feasible layouts, and the cost terms it loses on against the best."""
    from optlayout.solver.candidates import ranked_twin, twin_in_stead
    from optlayout.solver.explain import term_deltas
    from optlayout.solver.oracle import rank_problem

    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    check_layout(spec, job, layout, topo.num_gpus)
    # ranked among the space searched with its limits raised to the layout's own (mb, vp, cp), so it is never
    # outside what it is ranked against
    options = space_options(maxima={a: max(v, getattr(layout, a)) for a, v in search_limits(SpaceOptions()).items()})
    problem = Problem(spec, job, topo, params, options)
    mine = problem.table.candidate(layout)
    ranking = rank_problem(problem)
    if not ranking:
        raise InfeasibleError("explain: no legal layout fits; run `optlayout solve` for the diagnosis")
    best = ranking[0]
    position = next((i + 1 for i, c in enumerate(ranking) if c.layout == layout), None)
    if position is None and mine.prediction.fits:
        # a legal layout whose twin ranks ahead (the twin rule, `twin_key`), or one the space does not enumerate:
        # rank by throughput
        position = 1 + sum(c.cluster_tokens_per_s > mine.cluster_tokens_per_s for c in ranking)
    # its twin ranked in its stead at no lower throughput (as compare's `twin_ahead`); not the layout itself, ranked
    # at its best accumulation, nor a slower twin ranked because the layout is over memory
    twin = twin_in_stead(layout, mine.cluster_tokens_per_s, ranked_twin(ranking, layout))
    deltas = term_deltas(layout, mine.prediction, best.layout, best.prediction, job)
    return {
        "layout": layout.short(),
        "rank": position,
        "twin_ahead": twin.short() if twin is not None else None,  # its twin, ranked in its stead (twin rule)
        "feasible": len(ranking),
        "search_limits": search_limits(options),
        "fits": mine.prediction.fits,
        "mfu": mine.prediction.mfu,
        "best_layout": best.layout.short(),
        "best_mfu": best.prediction.mfu,
        "prediction": mine.prediction.model_dump(),
        "terms": [
            {
                "term": d.term,
                "yours_us": d.layout_us_per_token,
                "best_us": d.best_us_per_token,
                "delta_us": d.delta_us_per_token,
            }
            for d in deltas
        ],
    }


class RunEstimate(BaseModel):
    """One layout under run conditions: the cost model's prediction, a straggler slowdown, checkpointing."""

    layout: Layout
    prediction: Prediction
    straggler: StragglerPrediction | None = None
    goodput: LayoutCheckpointing | None = None


@checked_arguments
def estimate_run(
    model: ModelInput,
    cluster: ClusterInput,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
    *,
    straggler_slowdown: float = 0.0,
    failure: FailureSpec | Mapping[str, Any] | None = None,
    storage: StorageSpec | Mapping[str, Any] | None = None,
) -> RunEstimate:
    """`estimate_layout` plus the run conditions: the straggler-adjusted figures when `straggler_slowdown` > 0,
    and the checkpoint cost and goodput when `failure` and `storage` are given (see `optlayout.conditions`)."""
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    fail, store = failure_input(failure), storage_input(storage)
    check_run_conditions(fail, store)
    slowdown = check_straggler(straggler_slowdown)
    check_layout(spec, job, layout, topo.num_gpus)
    candidate = Problem(spec, job, topo, params).table.candidate(layout)
    pred = candidate.prediction
    straggler = with_straggler(pred, slowdown) if slowdown > 0 else None
    ckpt = None
    if fail is not None and store is not None:
        tps = straggler.tokens_per_s_per_gpu if straggler is not None else pred.tokens_per_s_per_gpu
        model_ = GoodputModel(spec, job, fail, store, topo.gpus_per_server)
        ckpt = model_.estimate(layout).with_throughput(tps)
        if ckpt.problem is not None:
            raise InfeasibleError(f"goodput: {ckpt.problem}")
    return RunEstimate(layout=layout, prediction=pred, straggler=straggler, goodput=ckpt)
