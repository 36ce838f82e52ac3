"""Solver speed: Llama 3 405B on 16,384 H100s, GPU counts from 8 to 131,072, and the exhaustive oracle.

Reproduce:  python benchmarks/solve_speed.py [--write]
`--write` replaces the speed section of benchmarks/RESULTS.md. Times are medians of 3 runs in one process
(topology graphs are built once per cluster and cached, as in a launcher that solves repeatedly; their
build time is listed apart). "CP-SAT" is the model build plus solve; "total" adds enumerating the space
and evaluating the cost model.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _results import publish

from optlayout.planning import solve
from optlayout.presets import model_preset
from optlayout.solver.oracle import rank_every_layout
from optlayout.specs import JobSpec
from optlayout.topology import Topology, resolve_cluster

HERE = Path(__file__).resolve().parent
TOKENS = 16 * 1024 * 1024


def timed(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def solve_row(model: str, gpus: int, job: JobSpec, top: int) -> dict:
    t0 = time.perf_counter()
    topo = resolve_cluster(f"gpu=h100-sxm,gpus={gpus},gpus_per_node=8")
    build = time.perf_counter() - t0
    total, plan = timed(lambda: solve(model, topo, job, top=top))
    return {"plan": plan, "total": total, "graph": build, "topo": topo}


def oracle_row(model: str, topo: Topology, job: JobSpec) -> tuple[float, list]:
    spec = model_preset(model)
    return timed(lambda: rank_every_layout(spec, job, topo), repeats=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}. "
        "Command: `python benchmarks/solve_speed.py`.",
        "",
        "| case | GPUs | top | status | legal layouts | evaluated | CP-SAT booleans | CP-SAT build+solve s "
        "| total s | graph build s | oracle s | same optimum | oracle / solver |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    fixed = JobSpec(seq_len=8192, global_batch_tokens=TOKENS)
    bounded = JobSpec(seq_len=8192, min_global_batch=1024, max_global_batch=4096)
    cases = [("405B, 16M tokens", "llama3.1-405b", 16384, fixed, 1, True),
             ("405B, 16M tokens", "llama3.1-405b", 16384, fixed, 10, False),
             ("405B, batch 1024-4096 seqs", "llama3.1-405b", 16384, bounded, 1, True)]  # fmt: skip
    for gpus in (8, 64, 512, 4096, 32768, 131072):
        cases.append(("405B, 16M tokens", "llama3.1-405b", gpus, fixed, 1, gpus <= 4096))
    cases.append(("70B, 4K x 512", "llama3.1-70b", 256, JobSpec(seq_len=4096, global_batch=512), 1, True))
    for label, model, gpus, job, top, with_oracle in cases:
        row = solve_row(model, gpus, job, top)
        plan = row["plan"]
        cpsat = plan.cpsat_time_s
        oracle_s = same = ratio = ""
        if with_oracle:
            o_time, ranking = oracle_row(model, row["topo"], job)
            oracle_s = f"{o_time:.2f}"
            best = ranking[0].layout if ranking else None
            same = "yes" if (best == (plan.layouts[0].layout if plan.layouts else None)) else "NO"
            ratio = f"{o_time / row['total']:.1f}x"
        lines.append(
            f"| {label} | {gpus:,} | {top} | {plan.status} | {plan.legal_layouts:,} | {plan.evaluated_layouts:,} "
            f"| {plan.candidates:,} | {cpsat:.3f} | {row['total']:.2f} | {row['graph']:.2f} | {oracle_s} | {same} "
            f"| {ratio} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    publish("speed", "Solver speed", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
