"""The prediction intervals' distributions and their out-of-sample coverage, from a calibration file.

Reproduce:  optlayout calibrate ../shared/data/calibration_runs.jsonl ../shared/data/calibration_runs_moe.jsonl \
                -o optlayout/data/default_calibration.yaml --heldout heldout.jsonl
                (about 10 min on 2 shared cores: the fits and their held-out errors; the MoE runs alone, on the
                shipped dense constants: `optlayout calibrate ../shared/data/calibration_runs_moe.jsonl -o ...`, 10 s)
            python benchmarks/uncertainty.py [--calibration FILE] [--write]

The figures are the file's `uncertainty` section (`optlayout/runs/uncertainty.py`); this script only lays them
out, so the RESULTS.md section always matches the shipped calibration.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _results import publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optlayout.runs.calibrate import load_calibration, shipped_calibration_path  # noqa: E402
from optlayout.runs.uncertainty import REGIMES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    parser.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    path = Path(args.calibration) if args.calibration else shipped_calibration_path()
    calibration = load_calibration(path)
    u = calibration.uncertainty
    if u is None:
        raise SystemExit(f"{path}: no uncertainty section (refit with optlayout calibrate)")
    shown = "optlayout/data/default_calibration.yaml" if args.calibration is None else str(path)
    lines = [
        f"Held-out errors of `{shown}` ({calibration.fitted_on}). Command: `optlayout calibrate "
        "../shared/data/calibration_runs.jsonl ../shared/data/calibration_runs_moe.jsonl -o "
        "optlayout/data/default_calibration.yaml --heldout heldout.jsonl` (about 10 min on 2 shared cores), then "
        "`python benchmarks/uncertainty.py --write`; the figures are the file's `uncertainty` section.",
        "",
        "Log error = log(predicted / measured) tokens/s/GPU, each dense run predicted by constants fitted without its "
        "source (leave one source out), each mixture-of-experts run (the `moe` row) by the MoE constants the file "
        "keeps, fitted without its model or sourced; 10th / 50th / 90th percentiles, the 80% interval of a "
        "prediction is [predicted x exp(-p90), predicted x exp(-p10)]:",
        "",
        "| distribution | runs | p10 | median | p90 |",
        "|---|---:|---:|---:|---:|",
        f"| all runs | {u.overall.runs} | {u.overall.low:+.3f} | {u.overall.median:+.3f} | {u.overall.high:+.3f} |",
    ]
    if u.unmeasured_gpu is not None:
        q = u.unmeasured_gpu
        lines.append(f"| a GPU/precision no run measured (leave one GPU out) | {q.runs} | {q.low:+.3f} | "
                     f"{q.median:+.3f} | {q.high:+.3f} |")  # fmt: skip
    for name, q in sorted(u.regimes.items()):
        lines.append(f"| {name}: {REGIMES[name]} | {q.runs} | {q.low:+.3f} | {q.median:+.3f} | {q.high:+.3f} |")
    cov = u.coverage
    if cov:
        lines += [
            "",
            "Coverage, out of sample: for each source, the distributions and the support are rebuilt from the other "
            "sources' rows and the interval rule (`optlayout.runs.uncertainty.bounds`) is applied to the held-out "
            "source's runs.",
            "",
            f"| held-out source | covered by the {cov['nominal']:.0%} interval |",
            "|---|---:|",
            *(f"| {source} | {share:.1%} |" for source, share in sorted(cov["per_source"].items())),
            f"| **all {cov['runs']} runs** | **{cov['covered']:.1%}** (overall quantiles alone: "
            f"{cov['covered_by_overall_quantiles_only']:.1%}) |",
        ]
    moe = cov.get("moe")
    if moe:
        lines += [
            "",
            "Mixture-of-experts runs, out of sample: for each model, the `moe` distribution is rebuilt from the other "
            "models' runs (the dense distributions and support as they are) and the same rule applied to the held-out "
            "model's runs.",
            "",
            f"| held-out model | covered by the {moe['nominal']:.0%} interval |",
            "|---|---:|",
            *(f"| {model} | {share:.1%} |" for model, share in sorted(moe["per_model"].items())),
            f"| **all {moe['runs']} MoE runs** | **{moe['covered']:.1%}** (`moe` quantiles alone: "
            f"{moe['covered_by_moe_quantiles_only']:.1%}) |",
        ]
    publish("uncertainty", "Prediction intervals: coverage out of sample", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
