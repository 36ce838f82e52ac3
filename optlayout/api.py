"""The library entry points launch tooling calls: `solve`, `estimate_layout`, `explain_layout`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optlayout.cost import DEFAULT_PARAMS, CostParams, Prediction, check_layout, usable_memory_bytes
from optlayout.errors import OptlayoutError
from optlayout.plan import Plan, PlannedLayout
from optlayout.presets import model_from_hf_config, model_preset
from optlayout.solver.cpsat import Limits, solve_top_k
from optlayout.solver.diagnose import diagnose_empty_space, diagnose_no_fit
from optlayout.solver.space import SpaceOptions, coerce_value, enumerate_layouts, normalize_key
from optlayout.solver.tables import CostTable, top_k_skyline
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec
from optlayout.topology import Topology, resolve_cluster


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
    """Normalize user pins (`{"tp": 8, "sharding": "fsdp"}`), maxima and exclusions."""
    pinned = {normalize_key(k): coerce_value(normalize_key(k), v) for k, v in (pins or {}).items()}
    maxed = {normalize_key(k): int(v) for k, v in (maxima or {}).items()}
    excluded = {
        normalize_key(k): frozenset(coerce_value(normalize_key(k), v) for v in vs) for k, vs in (exclude or {}).items()
    }
    return SpaceOptions(pins=pinned, maxima=maxed, exclude=excluded, **switches)


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
    **switches: Any,
) -> Plan:
    """The `top` layouts with the highest predicted throughput, proven optimal within the cost model.

    `cluster` is a topology file, a shorthand string (`gpu=h100-sxm,gpus=64`), a ClusterSpec or a Topology.
    Switches: allow_tp_beyond_domain, allow_idle_gpus, max_micro_batch, max_vp, max_cp, max_bubble_fraction.
    """
    if top < 1:
        raise OptlayoutError(f"top: must be at least 1 (got {top})")
    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    options = space_options(pins, maxima, exclude, **switches)
    table = CostTable(spec, job, topo.gpu, topo, params)
    gpus, domain = topo.num_gpus, topo.domain_size
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    limits = Limits(capacity, job.min_global_batch, job.max_global_batch, options.max_bubble_fraction)
    t0 = time.perf_counter()
    evaluated, legal = table.evaluated_candidates(enumerate_layouts(spec, job, gpus, domain, options), capacity)
    candidates = top_k_skyline(evaluated, top)
    table_s = time.perf_counter() - t0
    result = solve_top_k(candidates, limits, top_k=top, time_limit_s=time_limit_s)
    diagnosis = None
    if not result.ranked:
        if legal:  # evaluate everything once to say how far the closest layout is
            every = [table.candidate(lay) for lay in enumerate_layouts(spec, job, gpus, domain, options)]
            diagnosis = diagnose_no_fit(every, capacity, gpus)
        else:
            diagnosis = diagnose_empty_space(spec, job, gpus, domain, options)
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
        cluster=cluster if isinstance(cluster, ClusterSpec) else None,
        layouts=[
            PlannedLayout(rank=i + 1, layout=c.layout, prediction=c.prediction) for i, c in enumerate(result.ranked)
        ],
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
    from optlayout.solver.oracle import oracle_ranking

    spec = resolve_model(model)
    topo = resolve_cluster(cluster)
    check_layout(spec, job, layout, topo.num_gpus)
    table = CostTable(spec, job, topo.gpu, topo, params)
    mine = table.candidate(layout)
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    limits = Limits(capacity, job.min_global_batch, job.max_global_batch)
    ranking = oracle_ranking(spec, job, topo.num_gpus, topo.domain_size, table, SpaceOptions(), limits)
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
