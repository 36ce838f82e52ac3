"""Out-of-sample check: predict published measured runs that are not in ../shared/data (the calibration set)
with the shipped calibration, against a naive constant-MFU baseline. Nothing is fitted to these runs.

Reproduce:  python benchmarks/out_of_sample.py [RUNS.jsonl] [--write]
RUNS.jsonl defaults to benchmarks/data/external_runs.jsonl (built by benchmarks/data/build_external_runs.py).
Predictions take the path of `optlayout compare --no-rank` (`compare_runs` with the shipped calibration): layout
fields a record leaves unpublished are filled by the solver with the published ones pinned. The baseline predicts
every run at one MFU, the median MFU of the calibration set's runs (calibration_runs.jsonl and
calibration_runs_moe.jsonl), each MFU computed the tool's one way (`optlayout.cost.flops`) from the measured
tokens/s/GPU. `--write` replaces the out-of-sample section of benchmarks/RESULTS.md with the text printed.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _results import publish

from optlayout.cost.flops import mfu, model_flops_per_token
from optlayout.presets import gpu_preset
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.runs.compare import compare_runs
from optlayout.runs.records import RunRecord, read_runs

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE / "data" / "external_runs.jsonl"
CALIBRATION_RUNS = tuple(HERE.parent.parent / "shared" / "data" / name
                         for name in ("calibration_runs.jsonl", "calibration_runs_moe.jsonl"))  # fmt: skip


def measured_mfu(rec: RunRecord) -> float:
    """The run's MFU from its measured tokens/s/GPU: the tool's FLOPs per token over the GPU's dense peak."""
    flops = model_flops_per_token(rec.model, rec.job.seq_len, rec.job_spec().causal)
    peak: float = gpu_preset(rec.cluster.gpu).peak_flops_for(rec.job.precision)
    return mfu(rec.measured.tokens_per_s_per_gpu, flops, peak)


def baseline_tokens_per_s(rec: RunRecord, constant_mfu: float) -> float:
    """Tokens/s/GPU at `constant_mfu` (the inverse of `measured_mfu`)."""
    flops = model_flops_per_token(rec.model, rec.job.seq_len, rec.job_spec().causal)
    peak: float = gpu_preset(rec.cluster.gpu).peak_flops_for(rec.job.precision)
    return constant_mfu * peak / flops


def source_label(source: str) -> str:
    """The document a record's source names, without its table."""
    if source.startswith("NVIDIA-NeMo/Megatron-Bridge"):
        return source.split(" docs/")[0] + " docs/performance-summary*.md"
    return source.split(" Table")[0].split(" Results")[0].split(" Llama3 ")[0]


def _signed(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def _table(title: str, groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [f"| {title} | runs | MAPE | median signed error | baseline MAPE | baseline median signed error |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key in sorted(groups):
        rows = groups[key]
        meas = [r["measured"] for r in rows]
        model = [_signed(r["predicted"], m) for r, m in zip(rows, meas, strict=True)]
        base = [_signed(r["baseline"], m) for r, m in zip(rows, meas, strict=True)]
        lines.append(f"| {key} | {len(rows)} | {statistics.mean(map(abs, model)):.1%} "
                     f"| {statistics.median(model):+.1%} | {statistics.mean(map(abs, base)):.1%} "
                     f"| {statistics.median(base):+.1%} |")  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=str(DEFAULT_RUNS))
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    t0 = time.perf_counter()
    records = read_runs(args.runs)
    calibration_records = [rec for path in CALIBRATION_RUNS for rec in read_runs(path)]
    constant_mfu = statistics.median(measured_mfu(rec) for rec in calibration_records)
    fitted = load_calibration(shipped_calibration_path())
    result = compare_runs(records, fitted.params_for, rank_layouts=False, workers=1)
    elapsed = time.perf_counter() - t0

    rows: list[dict[str, Any]] = []
    for rec, row in zip(records, result["runs"], strict=True):
        assert row["id"] == rec.id and math.isclose(row["measured_mfu"], measured_mfu(rec), rel_tol=1e-9)
        rows.append({"rec": rec, "row": row, "measured": rec.measured.tokens_per_s_per_gpu,
                     "predicted": row["predicted_tokens_per_s_per_gpu"],
                     "baseline": baseline_tokens_per_s(rec, constant_mfu)})  # fmt: skip
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        rec = r["rec"]
        recipe = f" {rec.job.fp8_recipe}" if rec.job.fp8_recipe else ""
        by["overall"]["all runs"].append(r)
        by["overall"]["dense" if rec.model.moe is None else "mixture of experts"].append(r)
        by["source"][source_label(rec.source)].append(r)
        by["model"][rec.model.name].append(r)
        by["gpu"][f"{rec.cluster.gpu} {rec.job.precision}{recipe}"].append(r)
        by["model_gpu"][f"{rec.model.name}, {rec.cluster.gpu} {rec.job.precision}{recipe}, {rec.framework}"].append(r)

    misses = [r["rec"].id for r in rows if r["row"]["memory_model_miss"]]
    sources = sorted({source_label(r["rec"].source) for r in rows})
    lines = [
        f"{len(rows)} published runs of `{Path(args.runs).name}` that are not in ../shared/data (out-of-sample checks "
        "only: no constant is fitted to them), predicted with the shipped calibration "
        f"(`optlayout/data/default_calibration.yaml`) the way `optlayout compare --no-rank` does, {elapsed:.0f} s on "
        f"{platform.machine()} {platform.python_version()} ({platform.node() or 'this machine'}). "
        "Command: `python benchmarks/out_of_sample.py`.",
        "",
        f"Sources: {'; '.join(f'`{s}`' for s in sources)}. The rows left out (models, GPUs or precisions the tool "
        "cannot express, and the models of the calibration set) are listed by `benchmarks/data/"
        "build_external_runs.py`.",
        "",
        f"Baseline: every run at one MFU, {constant_mfu:.1%}, the median MFU of the {len(calibration_records)} "
        "calibration runs (dense and MoE, ../shared/data), MFU computed the tool's one way (6 x matmul parameters "
        "per token plus attention, over the GPU's dense peak at the run's precision). Signed error: predicted / "
        "measured - 1 (positive: optimistic).",
        "",
        *_table("runs", by["overall"]),
        "",
        *_table("source", by["source"]),
        "",
        *_table("model", by["model"]),
        "",
        *_table("GPU, precision", by["gpu"]),
        "",
        *_table("model, GPU, precision, framework", by["model_gpu"]),
        "",
        f"Memory-model misses (the run ran, no completion of its layout fits the memory model): {len(misses)}"
        + (f" ({', '.join(misses)})" if misses else "") + ".",
        "",
        "Worst runs:",
        "",
        "| run | measured tok/s/GPU | predicted | signed error | baseline | layout used | filled |",
        "|---|---:|---:|---:|---:|---|---|",
    ]  # fmt: skip
    for r in sorted(rows, key=lambda r: -abs(_signed(r["predicted"], r["measured"])))[:12]:
        lay = r["row"]["layout"]
        short = " ".join(f"{k}{lay[k]}" for k in ("tp", "pp", "vp", "cp", "dp", "ep") if lay.get(k, 1) != 1)
        short += f" mb{lay['micro_batch']} {lay['sharding']} {lay['recompute']}"
        filled = ", ".join(f"{k}={v}" for k, v in r["row"]["filled_fields"].items())
        signed = _signed(r["predicted"], r["measured"])
        lines.append(f"| {r['rec'].id} | {r['measured']:,.0f} | {r['predicted']:,.0f} | {signed:+.0%} "
                     f"| {r['baseline']:,.0f} | {short} | {filled} |")  # fmt: skip
    publish("out-of-sample", "Out-of-sample check on published runs outside the calibration set", "\n".join(lines),
            args.write)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
