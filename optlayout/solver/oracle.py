"""The exhaustive oracle, for tests and benchmarks: every legal layout, every accumulation, the same cost model.

No CP-SAT, no reductions: evaluate all, drop what does not fit or breaks a limit, sort by the same order, keep
each twin class's best (`best_twins`).
"""

from __future__ import annotations

import dataclasses

from optlayout.cost import DEFAULT_PARAMS, CostParams
from optlayout.solver.candidates import (
    Candidate,
    CostTable,
    Limits,
    best_twins,
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
    """All feasible layouts, best first, each distinct layout once (at its best accumulation) under the twin
    rule (of layouts differing only in recomputation, the best)."""
    walk_all = dataclasses.replace(options, all_grad_accum=True)
    feasible = []
    for layout in enumerate_layouts(model, job, gpus, domain_size, walk_all):
        cand = table.candidate(table.fewest_recomputed(layout, limits.memory_capacity_bytes))
        if passes_limits(cand, limits):
            feasible.append(cand)
    scale = throughput_scale(feasible)
    return best_twins(sorted(feasible, key=lambda c: rank_key(c, scale)))


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
