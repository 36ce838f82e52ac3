"""The CP-SAT model: one Boolean per candidate layout, constraints over them, the cost tables as coefficients.

It holds no physics: memory, throughput and bubble come from the cost tables. Constraints are named
(`exactly_one_layout`, `memory_fits`, `global_batch_min`, `global_batch_max`, `bubble_limit`, `no_good_*`);
the objective maximizes cluster throughput in scaled integers with the simplicity order as a tie-break
folded in, so the optimum is unique and deterministic. Top-K re-solves with a no-good on each layout found
(CP-SAT Primer, section "Top-k").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from optlayout.solver.candidates import (
    MIB,
    Candidate,
    Limits,
    layout_identity,
    memory_mib,
    passes_limits,
    scaled_throughput,
    simplicity_key,
    throughput_scale,
)


@dataclass
class SolveResult:
    status: str  # optimal | feasible | infeasible
    ranked: list[Candidate]
    solve_time_s: float
    build_time_s: float
    model_size: int


def solve_top_k(
    candidates: list[Candidate],
    limits: Limits,
    top_k: int = 1,
    time_limit_s: float = 10.0,
    workers: int = 1,
) -> SolveResult:
    """Pick the `top_k` best candidates by the exact order of `tables.rank_key`, proven by CP-SAT."""
    t0 = time.perf_counter()
    if not candidates:
        return SolveResult("infeasible", [], 0.0, 0.0, 0)
    scale = throughput_scale([c for c in candidates if passes_limits(c, limits)] or candidates)
    order = sorted(range(len(candidates)), key=lambda i: simplicity_key(candidates[i].layout))
    tie_rank = {i: len(candidates) - 1 - pos for pos, i in enumerate(order)}  # simpler -> larger bonus
    weight = len(candidates)

    model = cp_model.CpModel()
    x = [model.new_bool_var(f"layout_{i}") for i in range(len(candidates))]
    model.add_exactly_one(x).with_name("exactly_one_layout")
    capacity_mib = int(limits.memory_capacity_bytes // MIB)
    mem_mib = [memory_mib(c.evaluation.memory_per_gpu_bytes) for c in candidates]
    model.add(sum(m * xi for m, xi in zip(mem_mib, x, strict=True)) <= capacity_mib).with_name("memory_fits")
    batches = [c.layout.global_batch for c in candidates]
    gb = sum(b * xi for b, xi in zip(batches, x, strict=True))
    if limits.min_global_batch is not None:
        model.add(gb >= limits.min_global_batch).with_name("global_batch_min")
    if limits.max_global_batch is not None:
        model.add(gb <= limits.max_global_batch).with_name("global_batch_max")
    if limits.max_bubble_fraction is not None:
        bubble_ppm = [round(c.evaluation.bubble_fraction * 1e6) for c in candidates]
        limit_ppm = round(limits.max_bubble_fraction * 1e6)
        model.add(sum(b * xi for b, xi in zip(bubble_ppm, x, strict=True)) <= limit_ppm).with_name("bubble_limit")
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault(layout_identity(c.layout), []).append(i)
    coeffs = [scaled_throughput(c, scale) * weight + tie_rank[i] for i, c in enumerate(candidates)]
    model.maximize(sum(c * xi for c, xi in zip(coeffs, x, strict=True)))
    build_s = time.perf_counter() - t0

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = time_limit_s
    ranked: list[Candidate] = []
    status_name = "optimal"
    t1 = time.perf_counter()
    for _ in range(top_k):
        status = solver.solve(model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if not ranked:
                status_name = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
            break
        if status == cp_model.FEASIBLE:
            status_name = "feasible"
        chosen = next(i for i, xi in enumerate(x) if solver.boolean_value(xi))
        ranked.append(candidates[chosen])
        # no-good: this layout, with any accumulation, is taken
        for j in groups[layout_identity(candidates[chosen].layout)]:
            model.add(x[j] == 0).with_name(f"no_good_{len(ranked)}_{j}")
    return SolveResult(status_name, ranked, time.perf_counter() - t1, build_s, len(candidates))
