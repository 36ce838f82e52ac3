"""Prediction error of tokens/s/GPU on the published runs, per source, GPU and precision.

Reproduce:  python benchmarks/accuracy.py [RUNS.jsonl] [--calibration calibration.yaml] [--write]
`--write` replaces the accuracy section of benchmarks/RESULTS.md with the tables printed.
Runs whose layout has unpublished fields are filled by the solver with the published fields pinned
(`optlayout.runs.predict`); the table counts how many runs needed filling.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from _results import publish

from optlayout.cost import DEFAULT_PARAMS
from optlayout.runs.predict import RunPrediction, predict_run
from optlayout.runs.records import read_runs

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE.parent.parent / "shared" / "data" / "calibration_runs.jsonl"


def _short_source(source: str) -> str:
    for key, label in (("dgxc", "NVIDIA dgxc-benchmarking"), ("Megatron-Bridge", "Megatron-Bridge tables"),
                       ("NeMo", "NeMo performance tables"), ("llm-foundry", "MosaicML llm-foundry")):  # fmt: skip
        if key in source:
            return label
    return source[:40]


def _table(title: str, groups: dict[str, list[RunPrediction]]) -> list[str]:
    lines = [f"| {title} | runs | filled | MAPE | median APE | mean signed error |", "|---|---:|---:|---:|---:|---:|"]
    for key in sorted(groups):
        preds = groups[key]
        apes = [p.ape for p in preds]
        signed = [p.prediction.tokens_per_s_per_gpu / p.record.measured.tokens_per_s_per_gpu - 1 for p in preds]
        filled = sum(bool(p.filled_fields) for p in preds)
        lines.append(
            f"| {key} | {len(preds)} | {filled} | {statistics.mean(apes):.1%} | {statistics.median(apes):.1%} "
            f"| {statistics.mean(signed):+.1%} |"
        )
    return lines


def _cross_validation(records: list) -> list[str]:
    """Calibrated error, out of sample first: fit on the other sources (or GPUs), predict the held-out one."""
    from optlayout.runs.calibrate import calibrate

    t0 = time.perf_counter()
    rep = calibrate(records, fitted_on="benchmark").report
    keys = ("cross_validated_by_source", "cross_validated_by_gpu", "in_sample", "uncalibrated")
    out = [
        f"Calibrated (`optlayout calibrate`, five constants per GPU/precision, {time.perf_counter() - t0:.0f} s): "
        "MAPE of tokens/s/GPU and, in brackets, the median signed error (predicted / measured - 1; positive: "
        "optimistic), cross-validated leaving one source out and leaving one GPU out (its runs then get the "
        "constants fitted on the other GPUs), against in-sample and uncalibrated.",
        "",
        "| runs | leave source out | leave GPU out | in-sample | uncalibrated |",
        "|---|---:|---:|---:|---:|",
        "| all | " + " | ".join(f"{rep[k]['mape']:.1%} ({rep[k]['median_signed_error']:+.1%})" for k in keys) + " |",
    ]
    for name, field in (("per_source", rep["sources"]), ("per_gpu_precision", rep["in_sample"]["per_gpu_precision"])):
        for key in sorted(field):
            cells = (f"{rep[k][name][key]:.1%} ({rep[k][name + '_median_signed_error'][key]:+.1%})" for k in keys)
            out.append(f"| {key} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=str(DEFAULT_RUNS))
    parser.add_argument("--calibration", default=None)
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    records = read_runs(args.runs)
    calibration = None
    if args.calibration:
        from optlayout.runs.calibrate import load_calibration

        calibration = load_calibration(args.calibration)
    t0 = time.perf_counter()
    preds: list[RunPrediction] = []
    for rec in records:
        params = calibration.params_for(rec.cluster.gpu, rec.job.precision) if calibration else DEFAULT_PARAMS
        preds.append(predict_run(rec, params))
    elapsed = time.perf_counter() - t0

    by_source: dict[str, list[RunPrediction]] = defaultdict(list)
    by_hw: dict[str, list[RunPrediction]] = defaultdict(list)
    for p in preds:
        by_source[_short_source(p.record.source)].append(p)
        by_hw[f"{p.record.cluster.gpu} {p.record.job.precision}"].append(p)
    overall = {"all runs": preds}
    worst = sorted(preds, key=lambda p: -p.ape)[:8]
    label = "calibrated: " + args.calibration if args.calibration else "uncalibrated (default CostParams)"
    lines = [
        f"Cost model {label}, {len(preds)} runs of `{Path(args.runs).name}`, "
        f"{elapsed:.1f} s on {platform.machine()} {platform.python_version()} ({platform.node() or 'this machine'}).",
        "Command: `python benchmarks/accuracy.py"
        + (f" --calibration {args.calibration}" if args.calibration else "")
        + "`.",
        "",
        *_table("overall", overall),
        "",
        *_table("source", by_source),
        "",
        *_table("GPU, precision", by_hw),
        "",
        "Worst runs:",
        "",
        "| run | measured tok/s/GPU | predicted | APE | layout used | filled |",
        "|---|---:|---:|---:|---|---|",
    ]
    for p in worst:
        lines.append(
            f"| {p.record.id} | {p.record.measured.tokens_per_s_per_gpu:,.0f} | "
            f"{p.prediction.tokens_per_s_per_gpu:,.0f} | {p.ape:.0%} | {p.layout.short()} | "
            f"{', '.join(f'{k}={v}' for k, v in p.filled_fields.items())} |"
        )
    if not args.calibration:  # out of sample first
        lines = [*_cross_validation(records), "", *lines]
    text = "\n".join(lines)
    publish("accuracy", "Prediction accuracy on the published runs", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
