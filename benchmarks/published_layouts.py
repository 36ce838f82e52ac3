"""Where published layouts rank in the cost model, and what the solver prefers instead (and why).

Reproduce:  python benchmarks/published_layouts.py [--calibration none|FILE] [--write]
Published degrees are pinned; fields the publication does not give (micro-batch, sharding, recompute,
sequence parallelism, vp) are the solver's best completion, as `compare` fills run records. The rank is
among all feasible layouts (the oracle's walk), 1 = the solver's pick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _results import publish

from optlayout.planning import solve
from optlayout.presets import model_preset
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.solver.candidates import layout_identity
from optlayout.solver.explain import why_it_lost
from optlayout.solver.oracle import rank_every_layout
from optlayout.specs import JobSpec
from optlayout.topology import resolve_cluster

HERE = Path(__file__).resolve().parent
M16 = 16 * 1024 * 1024

# (label, model, cluster, job, published degrees, published figure)
CASES = [
    ("Llama 3 405B, 8K, 16,384 H100", "llama3.1-405b", "gpu=h100-sxm,gpus=16384",
     JobSpec(seq_len=8192, global_batch_tokens=M16), {"tp": 8, "pp": 16, "cp": 1, "dp": 128},
     "41% MFU, 400 TFLOP/s/GPU (Dubey et al. 2024, Table 4)"),
    ("Llama 3 405B, 8K, 8,192 H100", "llama3.1-405b", "gpu=h100-sxm,gpus=8192",
     JobSpec(seq_len=8192, global_batch_tokens=M16), {"tp": 8, "pp": 16, "cp": 1, "dp": 64},
     "43% MFU, 430 TFLOP/s/GPU"),
    ("Llama 3 405B, 131K, 16,384 H100", "llama3.1-405b", "gpu=h100-sxm,gpus=16384",
     JobSpec(seq_len=131072, global_batch_tokens=M16), {"tp": 8, "pp": 16, "cp": 16, "dp": 8},
     "38% MFU, 380 TFLOP/s/GPU"),
    ("Worked example: 70B on 256 x 80 GB (seq 4096, 512 seqs)", "llama3.1-70b",
     str(HERE.parent / "topologies" / "worked-example-256x80gb.yaml"),
     JobSpec(seq_len=4096, global_batch=512), {"tp": 8, "pp": 4, "cp": 1, "dp": 8, "sharding": "zero1"},
     "DESIGN.md: TP8 PP4 DP8 ZeRO-1"),
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=None, help="calibration YAML, or 'none' (default: shipped)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    path = args.calibration or shipped_calibration_path()
    calibration = None if args.calibration == "none" else load_calibration(path)
    label = "raw defaults" if calibration is None else (args.calibration or "the shipped calibration")
    lines = [
        f"Cost model: {label}. Command: `python benchmarks/published_layouts.py"
        + (f" --calibration {args.calibration}" if args.calibration else "") + "`.",
        "",
        "| case | published | published layout (completed) | predicted MFU | rank | solver's pick | pick MFU "
        "| why the published one loses |",
        "|---|---|---|---:|---:|---|---:|---|",
    ]  # fmt: skip
    for name, model, cluster, job, pins, figure in CASES:
        topo = resolve_cluster(cluster)
        params = calibration.params_for(topo.gpu.name, job.precision) if calibration else None
        kw = {"params": params} if params else {}
        mine = solve(model, topo, job, pins=pins, max_vp=8, **kw)
        best = solve(model, topo, job, **kw)
        if not mine.layouts or not best.layouts:
            lines.append(f"| {name} | {figure} | infeasible: {mine.diagnosis} | | | | | |")
            continue
        ranking = rank_every_layout(model_preset(model), job, topo, **kw)
        ident = layout_identity(mine.best.layout)
        rank = next((i + 1 for i, c in enumerate(ranking) if layout_identity(c.layout) == ident), None)
        why = why_it_lost(mine.best.layout, mine.best.prediction, best.best.layout, best.best.prediction, job)
        lines.append(
            f"| {name} | {figure} | {mine.best.layout.short()} | {mine.best.prediction.mfu:.1%} "
            f"| {rank} of {len(ranking):,} | {best.best.layout.short()} | {best.best.prediction.mfu:.1%} | {why} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    publish("published", "Where published layouts rank", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
