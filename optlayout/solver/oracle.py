"""The exhaustive oracle, for tests and benchmarks: every legal layout, every accumulation, the same cost model.

No CP-SAT, no reductions: evaluate all, drop what does not fit or breaks a limit, sort by the same order.
"""

from __future__ import annotations

import dataclasses

from optlayout.cost import DEFAULT_PARAMS, CostParams
from optlayout.solver.candidates import (
    Candidate,
    CostTable,
    Limits,
    layout_identity,
    passes_limits,
    rank_key,
    throughput_scale,
)
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions, enumerate_layouts
from optlayout.specs import JobSpec, ModelSpec
from optlayout.topology import Topology


def oracle_ranking(
    model: ModelSpec,
    job: JobSpec,
    gpus: int,
    domain_size: int,
    table: CostTable,
    options: SpaceOptions,
    limits: Limits,
) -> list[Candidate]:
    """All feasible layouts, best first, each distinct layout once (at its best accumulation)."""
    walk_all = dataclasses.replace(options, all_grad_accum=True)
    feasible = []
    for layout in enumerate_layouts(model, job, gpus, domain_size, walk_all):
        cand = table.candidate(table.fewest_recomputed(layout, limits.memory_capacity_bytes))
        if passes_limits(cand, limits):
            feasible.append(cand)
    scale = throughput_scale(feasible)
    best_per_layout: dict[tuple[object, ...], Candidate] = {}
    for cand in sorted(feasible, key=lambda c: rank_key(c, scale)):
        best_per_layout.setdefault(layout_identity(cand.layout), cand)  # each layout at its best accumulation
    return list(best_per_layout.values())


def rank_every_layout(
    model: ModelSpec,
    job: JobSpec,
    topology: Topology,
    params: CostParams = DEFAULT_PARAMS,
    options: SpaceOptions | None = None,
) -> list[Candidate]:
    """Every feasible layout of a model, cluster and job under the job's memory and batch limits, best first."""
    return rank_problem(Problem(model, job, topology, params, options or SpaceOptions()))


def rank_problem(problem: Problem) -> list[Candidate]:
    """Every feasible layout of a problem under its limits, best first."""
    topo = problem.topology
    return oracle_ranking(problem.model, problem.job, topo.num_gpus, topo.domain_size, problem.table, problem.options,
                          problem.limits)  # fmt: skip
