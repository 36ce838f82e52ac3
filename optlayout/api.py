"""The library entry points launch tooling calls: `solve`, `replan`, `estimate_layout`, `estimate_run`,
`explain_layout`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from optlayout.cost import DEFAULT_PARAMS, CostParams, Prediction, check_layout, usable_memory_bytes
from optlayout.errors import OptlayoutError
from optlayout.goodput import (
    OBJECTIVES,
    FailureSpec,
    GoodputModel,
    LayoutCheckpointing,
    StorageSpec,
    StragglerPrediction,
    check_straggler,
    failure_spec,
    storage_spec,
    with_straggler,
)
from optlayout.plan import Plan, PlannedLayout
from optlayout.presets import model_from_hf_config, model_preset
from optlayout.solver.cpsat import Limits, passes_limits, solve_top_k
from optlayout.solver.diagnose import diagnose_empty_space, diagnose_no_fit
from optlayout.solver.space import (
    SpaceOptions,
    coerce_value,
    enumerate_groups,
    enumerate_layouts,
    normalize_key,
)
from optlayout.solver.tables import CostTable, throughput_scale, top_k_skyline
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec
from optlayout.topology import Topology, parse_cluster_shorthand, resolve_cluster


def resolve_model(model: str | Path | ModelSpec | Mapping[str, Any]) -> ModelSpec:
    """A preset name, a path to a Hugging Face config.json, a dict of shape fields, or a ModelSpec."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec(**model)
    text = str(model)
    if text.endswith(".json") or Path(text).is_file():
        return model_from_hf_config(text)
    return model_preset(text)


def space_options(
    pins: Mapping[str, object] | None = None,
    maxima: Mapping[str, int] | None = None,
    exclude: Mapping[str, list[object]] | None = None,
    **switches: Any,
) -> SpaceOptions:
    """Normalize user pins (`{"tp": 8, "sharding": "fsdp"}`), maxima and exclusions, and refuse the ones that
    contradict a layout rule, so that a request fails naming the rule rather than with an empty space."""
    pinned = {normalize_key(k): coerce_value(normalize_key(k), v) for k, v in (pins or {}).items()}
    maxed: dict[str, int] = {}
    for key, value in (maxima or {}).items():
        name = normalize_key(key)
        if name in ("sharding", "recompute", "sequence_parallel"):
            raise OptlayoutError(f"max: {name} is not a number; use --pin or --exclude")
        maxed[name] = int(coerce_value(name, value))  # type: ignore[arg-type]
    excluded = {
        normalize_key(k): frozenset(coerce_value(normalize_key(k), v) for v in vs) for k, vs in (exclude or {}).items()
    }
    if pinned.get("sequence_parallel") is True and pinned.get("tp") == 1:
        raise OptlayoutError("pin: sequence_parallel needs tp > 1")
    if pinned.get("vp", 1) > 1 and pinned.get("pp") == 1:  # type: ignore[operator]
        raise OptlayoutError("pin: vp > 1 needs pp > 1")
    bubble = switches.get("max_bubble_fraction")
    if bubble is not None and not 0 <= bubble <= 1:
        raise OptlayoutError(f"max-bubble: a fraction in [0, 1] (got {bubble})")
    # a pinned value above a search limit raises the limit rather than emptying the space
    for pin, limit in (("micro_batch", "max_micro_batch"), ("vp", "max_vp"), ("cp", "max_cp")):
        if pin in pinned:
            default = SpaceOptions.__dataclass_fields__[limit].default
            switches[limit] = max(int(switches.get(limit, default)), int(pinned[pin]))  # type: ignore[arg-type]
    return SpaceOptions(pins=pinned, maxima=maxed, exclude=excluded, **switches)


def _failure(value: FailureSpec | Mapping[str, Any] | None) -> FailureSpec | None:
    return failure_spec(**value) if isinstance(value, Mapping) else value


def _storage(value: StorageSpec | Mapping[str, Any] | None) -> StorageSpec | None:
    return storage_spec(**value) if isinstance(value, Mapping) else value


def cluster_source(cluster: str | Path | ClusterSpec | Topology) -> tuple[ClusterSpec | None, dict[str, Any] | None]:
    """How the cluster can be rebuilt on another GPU count: its shorthand (a ClusterSpec) or its generator-form
    topology document; (None, None) for an explicit topology file or a Topology object."""
    if isinstance(cluster, ClusterSpec):
        return cluster, None
    if isinstance(cluster, str) and "=" in cluster and not Path(cluster).is_file():
        return parse_cluster_shorthand(cluster), None
    if isinstance(cluster, (str, Path)):
        try:
            doc = yaml.safe_load(Path(cluster).read_text())
        except (OSError, yaml.YAMLError):
            return None, None  # resolve_cluster reports the problem
        if isinstance(doc, dict) and "servers" in doc and "nodes" not in doc:
            return None, doc
    return None, None


def solve(
    model: str | Path | ModelSpec | Mapping[str, Any],
    cluster: str | Path | ClusterSpec | Topology,
    job: JobSpec,
    *,
    top: int = 1,
    pins: Mapping[str, object] | None = None,
    maxima: Mapping[str, int] | None = None,
    exclude: Mapping[str, list[object]] | None = None,
    params: CostParams = DEFAULT_PARAMS,
    time_limit_s: float = 10.0,
    objective: str = "mfu",
    failure: FailureSpec | Mapping[str, Any] | None = None,
    storage: StorageSpec | Mapping[str, Any] | None = None,
    straggler_slowdown: float = 0.0,
    **switches: Any,
) -> Plan:
    """The `top` layouts with the highest predicted throughput (objective "mfu") or goodput (objective
    "goodput": throughput x the effective time fraction left by checkpoints and failures), proven optimal
    within the cost model.

    `cluster` is a topology file, a shorthand string (`gpu=h100-sxm,gpus=64`), a ClusterSpec or a Topology.
    `failure` and `storage` (FailureSpec/StorageSpec or dicts of their fields) are required by the goodput
    objective; given with "mfu" they only add each layout's goodput to the plan. `straggler_slowdown` s
    (0.02 = the slowest rank 2% slower) divides every layout's throughput by 1 + s in the reported
    `straggler` figures; it never changes the order.
    Switches: allow_tp_beyond_domain, allow_idle_gpus, max_micro_batch, max_vp, max_cp, max_bubble_fraction.
    """
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    shorthand, doc = cluster_source(cluster)
    plan = _solve_on(spec, topo, job, top, pins, maxima, exclude, params, time_limit_s, objective,
                     _failure(failure), _storage(storage), straggler_slowdown, switches)  # fmt: skip
    return plan.model_copy(update={"cluster": shorthand, "topology_doc": doc})


def _solve_on(
    spec: ModelSpec,
    topo: Topology,
    job: JobSpec,
    top: int,
    pins: Mapping[str, object] | None,
    maxima: Mapping[str, int] | None,
    exclude: Mapping[str, list[object]] | None,
    params: CostParams,
    time_limit_s: float,
    objective: str,
    failure: FailureSpec | None,
    storage: StorageSpec | None,
    straggler_slowdown: float,
    switches: Mapping[str, Any],
) -> Plan:
    if not time_limit_s > 0:
        raise OptlayoutError(f"time-limit: must be positive seconds (got {time_limit_s})")
    if top < 1:
        raise OptlayoutError(f"top: must be at least 1 (got {top})")
    if objective not in OBJECTIVES:
        raise OptlayoutError(f"objective: must be one of {', '.join(OBJECTIVES)} (got {objective!r})")
    if objective == "goodput" and (failure is None or storage is None):
        need = (("failure (an MTBF)", failure), ("storage (a write bandwidth)", storage))
        missing = " and ".join(name for name, value in need if value is None)
        raise OptlayoutError(f"objective goodput: needs {missing} to price checkpoints and failures")
    if (failure is None) != (storage is None):
        raise OptlayoutError("goodput: failure and storage go together (an MTBF and a storage bandwidth)")
    straggler_slowdown = check_straggler(straggler_slowdown)
    options = space_options(pins, maxima, exclude, **switches)
    gm = None
    if failure is not None and storage is not None:
        gm = GoodputModel(spec, job, failure, storage, topo.gpus_per_server)
    ranked_table = CostTable(spec, job, topo.gpu, topo, params, gm if objective == "goodput" else None)
    gpus, domain = topo.num_gpus, topo.domain_size
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    limits = Limits(capacity, job.min_global_batch, job.max_global_batch, options.max_bubble_fraction)
    t0 = time.perf_counter()
    groups = enumerate_groups(spec, job, gpus, domain, options)
    evaluated, legal = ranked_table.evaluated_candidates(groups, limits, k=top)
    # the objective's scale: the best feasible throughput, the same the CP-SAT model derives from its booleans
    scale = throughput_scale([c for c in evaluated if passes_limits(c, limits)] or evaluated)
    candidates = top_k_skyline(evaluated, top, scale)
    table_s = time.perf_counter() - t0
    result = solve_top_k(candidates, limits, top_k=top, time_limit_s=time_limit_s)
    diagnosis = None
    if result.status == "unknown":
        diagnosis = f"time limit: CP-SAT found no layout within {time_limit_s} s; raise --time-limit"
    elif not result.ranked:
        if legal:  # evaluate everything once to say how far the closest layout is
            every = [ranked_table.candidate(lay) for lay in enumerate_layouts(spec, job, gpus, domain, options)]
            diagnosis = diagnose_no_fit(every, capacity, gpus)
        else:
            diagnosis = diagnose_empty_space(spec, job, gpus, domain, options)
    planned = []
    for i, c in enumerate(result.ranked):
        straggler = with_straggler(c.prediction, straggler_slowdown) if straggler_slowdown > 0 else None
        ckpt = None
        if gm is not None:
            tps = straggler.tokens_per_s_per_gpu if straggler is not None else c.prediction.tokens_per_s_per_gpu
            ckpt = gm.estimate(c.layout).with_throughput(tps)
            if i == 0 and ckpt.problem is not None:
                raise OptlayoutError(
                    f"goodput: {ckpt.problem} ({ckpt.checkpoint_bytes / 1e9:.3g} GB of weights and optimizer state "
                    f"per checkpoint, {ckpt.write_s / 60:.3g} min to write at the given storage bandwidth)"
                )
        planned.append(PlannedLayout(rank=i + 1, layout=c.layout, prediction=c.prediction, goodput=ckpt,
                                     straggler=straggler))  # fmt: skip
    return Plan(
        status=result.status,
        solve_time_s=result.solve_time_s,
        build_time_s=result.build_time_s,
        table_time_s=table_s,
        legal_layouts=legal,
        evaluated_layouts=len(evaluated),
        candidates=result.model_size,
        model=spec,
        job=job,
        topology_name=topo.name,
        gpus=gpus,
        gpus_per_server=topo.gpus_per_server,
        objective=objective,
        failure=failure,
        storage=storage,
        straggler_slowdown=straggler_slowdown,
        layouts=planned,
        diagnosis=diagnosis,
    )


def estimate_layout(
    model: str | Path | ModelSpec | Mapping[str, Any],
    cluster: str | Path | ClusterSpec | Topology,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """Full prediction for one given layout (checked for legality first)."""
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    check_layout(spec, job, layout, topo.num_gpus)
    return CostTable(spec, job, topo.gpu, topo, params).predict(layout)


def explain_layout(
    model: str | Path | ModelSpec | Mapping[str, Any],
    cluster: str | Path | ClusterSpec | Topology,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
) -> dict[str, Any]:
    """Where `layout` ranks among all feasible layouts, and the cost terms it loses on against the best."""
    from optlayout.solver.explain import term_deltas
    from optlayout.solver.oracle import rank_every_layout

    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    check_layout(spec, job, layout, topo.num_gpus)
    mine = CostTable(spec, job, topo.gpu, topo, params).candidate(layout)
    ranking = rank_every_layout(spec, job, topo, params)
    if not ranking:
        raise OptlayoutError("explain: no legal layout fits; run `optlayout solve` for the diagnosis")
    best = ranking[0]
    position = next((i + 1 for i, c in enumerate(ranking) if c.layout == layout), None)
    if position is None and mine.prediction.fits:
        # a legal layout outside the searched space (e.g. micro-batch above the search's maximum): rank by throughput
        position = 1 + sum(c.cluster_tokens_per_s > mine.cluster_tokens_per_s for c in ranking)
    deltas = term_deltas(layout, mine.prediction, best.layout, best.prediction, job)
    return {
        "layout": layout.short(),
        "rank": position,
        "feasible": len(ranking),
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


def estimate_run(
    model: str | Path | ModelSpec | Mapping[str, Any],
    cluster: str | Path | ClusterSpec | Topology,
    job: JobSpec,
    layout: Layout,
    params: CostParams = DEFAULT_PARAMS,
    *,
    straggler_slowdown: float = 0.0,
    failure: FailureSpec | Mapping[str, Any] | None = None,
    storage: StorageSpec | Mapping[str, Any] | None = None,
) -> RunEstimate:
    """`estimate_layout` plus the run conditions: the straggler-adjusted figures when `straggler_slowdown` > 0,
    and the checkpoint cost and goodput when `failure` and `storage` are given (see `optlayout.goodput`)."""
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    fail, store = _failure(failure), _storage(storage)
    if (fail is None) != (store is None):
        raise OptlayoutError("goodput: failure and storage go together (an MTBF and a storage bandwidth)")
    slowdown = check_straggler(straggler_slowdown)
    pred = estimate_layout(spec, topo, job, layout, params)
    straggler = with_straggler(pred, slowdown) if slowdown > 0 else None
    ckpt = None
    if fail is not None and store is not None:
        tps = straggler.tokens_per_s_per_gpu if straggler is not None else pred.tokens_per_s_per_gpu
        ckpt = GoodputModel(spec, job, fail, store, topo.gpus_per_server).estimate(layout).with_throughput(tps)
        if ckpt.problem is not None:
            raise OptlayoutError(f"goodput: {ckpt.problem}")
    return RunEstimate(layout=layout, prediction=pred, straggler=straggler, goodput=ckpt)


# --- re-planning --------------------------------------------------------------------------------------
