"""The CP-SAT model: one Boolean per candidate layout, constraints over them, the cost tables as coefficients.

It holds no physics: memory, throughput and bubble come from the cost tables. Constraints are named
(`exactly_one_layout`, `memory_fits`, `global_batch_min`, `global_batch_max`, `bubble_limit`, `no_good_*`);
the objective maximizes cluster throughput in scaled integers with the simplicity order as a tie-break
folded in, so the optimum is unique and deterministic. Top-K re-solves with a no-good on each layout found
(CP-SAT Primer, section "Top-k"), and on its twins (`twin_key`): the first found of a twin class is its
best feasible one, the only one the twin rule ranks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_CPSAT_COEFFICIENT, MAX_CPSAT_SUM
from optlayout.solver.candidates import (
    Candidate,
    Limits,
    capacity_mib,
    memory_mib,
    passes_limits,
    scaled_throughput,
    simplicity_key,
    throughput_scale,
    twin_key,
)


@dataclass
class SolveResult:
    status: str  # optimal | feasible | infeasible | unknown (the time limit ran out before a layout was found)
    ranked: list[Candidate]
    solve_time_s: float
    build_time_s: float
    model_size: int


def _check_range(values: list[int]) -> None:
    """The coefficients of one constraint or of the objective fit CP-SAT's integers, and so does their sum."""
    if max(map(abs, values), default=0) > MAX_CPSAT_COEFFICIENT + 1 or sum(map(abs, values)) > MAX_CPSAT_SUM:
        raise InputError("model: the CP-SAT model's coefficients pass its integer range (too many layouts or too "
                         "large a batch)")  # fmt: skip


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
    for c in candidates:  # the cost model's figures are finite for every accepted input; say so if one is not
        if not math.isfinite(c.cluster_tokens_per_s) or not c.cluster_tokens_per_s >= 0:
            raise InputError(f"model: the cost model gives no finite throughput for {c.layout.short()}: the model, "
                             "sequence or cluster is out of the range it models")  # fmt: skip
    scale = throughput_scale([c for c in candidates if passes_limits(c, limits)] or candidates)
    order = sorted(range(len(candidates)), key=lambda i: simplicity_key(candidates[i].layout))
    tie_rank = {i: len(candidates) - 1 - pos for pos, i in enumerate(order)}  # simpler -> larger bonus
    weight = len(candidates)
    capacity = capacity_mib(limits.memory_capacity_bytes)
    # memory past the capacity counts as capacity + 1 MiB: it does not fit either way, and stays a small integer
    mem_mib = [min(memory_mib(c.evaluation.memory_per_gpu_bytes), capacity + 1) for c in candidates]
    batches = [c.layout.global_batch for c in candidates]
    coeffs = [scaled_throughput(c, scale) * weight + tie_rank[i] for i, c in enumerate(candidates)]
    for values in (mem_mib, batches, coeffs):
        _check_range(values)

    model = cp_model.CpModel()
    x = [model.new_bool_var(f"layout_{i}") for i in range(len(candidates))]
    model.add_exactly_one(x).with_name("exactly_one_layout")
    model.add(sum(m * xi for m, xi in zip(mem_mib, x, strict=True)) <= capacity).with_name("memory_fits")
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
        groups.setdefault(twin_key(c.layout), []).append(i)
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
        # no-good: this layout, with any accumulation and any recomputation (its twins), is taken
        for j in groups[twin_key(candidates[chosen].layout)]:
            model.add(x[j] == 0).with_name(f"no_good_{len(ranked)}_{j}")
    return SolveResult(status_name, ranked, time.perf_counter() - t1, build_s, len(candidates))
