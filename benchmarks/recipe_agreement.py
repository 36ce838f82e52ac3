"""Recipe agreement: where NVIDIA's published, tuned layouts rank in the solver's space, and the gain it claims.

Reproduce:  python benchmarks/recipe_agreement.py [RUNS.jsonl] [--calibration none|PROFILE] [--robust] [--write]
Runs: every record of a NVIDIA recipe source (dgxc-benchmarking, the NeMo performance tables, Megatron-Bridge)
that publishes its degrees (tp, pp, cp, dp, micro-batch); unpublished fields (sharding, recomputation, vp,
sequence parallelism) are completed as `compare` completes them. The rank is among the feasible layouts of the
solver's default space for the run's model, cluster and job, found with the solver's bound
(`optlayout.runs.agreement`, equal to the exhaustive oracle's rank, `tests/test_agreement.py`), walked to
exactly up to rank 100 (lower ranks read "> 100"; the pick and the claimed gain are exact). Cost
constants: the shipped calibration unless `--calibration` says otherwise. `--robust` ranks as `solve --robust`
does: by each layout's conservative throughput (the low end of its 80% interval from the calibration's held-out
errors); the claimed gain stays the pick's predicted throughput over the published layout's.
A diagnostic table ranks the same runs again in the space without ZeRO-2, and without ZeRO-2 and FSDP (`WITHOUT`),
and each in what its own Megatron-Core release runs (`RunRecord.megatron_core`): where the claimed gains come from.
`--write` replaces the recipes section (with `--robust`, the recipes-robust section) of benchmarks/RESULTS.md.
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
from optlayout.cost.flops import mfu, model_flops_per_token
from optlayout.layout.megatron_core import Version
from optlayout.presets import gpu_preset
from optlayout.runs.agreement import Agreement, RankSpace, recipe_agreement
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.runs.records import RunRecord, read_runs
from optlayout.solver.explain import why_it_lost
from optlayout.solver.space import SpaceOptions
from optlayout.specs import Sharding
from optlayout.topology import Topology, topology_from_cluster

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE.parent.parent / "shared" / "data" / "calibration_runs.jsonl"
RECIPE_SOURCES = {"dgxc-benchmarking": "dgxc", "NVIDIA/NeMo": "NeMo tables", "Megatron-Bridge": "Megatron-Bridge"}
DEGREES = ("tp", "pp", "cp", "dp", "micro_batch")
TOP = 10
MAX_RANK = 100  # ranks are walked to exactly up to here; lower ones read "> 100"
WITHOUT = (frozenset(), frozenset({Sharding.zero2}), frozenset({Sharding.zero2, Sharding.fsdp}))
"""The shardings left out of the space in the diagnostic table: none (the solver's space), then those beyond
ZeRO-1."""


def recipe_source(record: RunRecord) -> str | None:
    """The recipe source a record comes from, or None when it is not a NVIDIA recipe."""
    return next((label for key, label in RECIPE_SOURCES.items() if key in record.source), None)


def is_recipe(record: RunRecord) -> bool:
    return recipe_source(record) is not None and all(getattr(record.layout, k) is not None for k in DEGREES)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _rank_text(rank: float) -> str:
    return f"> {MAX_RANK}" if rank > MAX_RANK else f"{rank:.0f}"


def _without(excluded: frozenset[Sharding]) -> str:
    return "without " + " and ".join(sorted(s.value for s in excluded)) if excluded else "the solver's space"


def _table(title: str, groups: dict[str, list[Agreement]]) -> list[str]:
    lines = [
        f"| {title} | runs | in top {TOP} | pick (rank 1) | median rank | median claimed gain | 90th pct gain | MAPE |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, rows in groups.items():
        gains = sorted(a.claimed_gain for a in rows if a.claimed_gain is not None)
        top = sum(a.rank <= TOP for a in rows)
        p90 = gains[min(len(gains) - 1, int(0.9 * len(gains)))] if gains else float("nan")
        lines.append(
            f"| {key} | {len(rows)} | {top} ({top / len(rows):.0%}) | {sum(a.rank == 1 for a in rows)} "
            f"| {_rank_text(statistics.median_low([a.rank for a in rows]))} | {_median(gains):+.1%} | {p90:+.1%} "
            f"| {statistics.mean(a.published.ape for a in rows):.1%} |"
        )
    return lines


def _crowding(groups: dict[str, list[Agreement]]) -> list[str]:
    """Near ties: per group, the layouts ranked ahead of the published one within 1% and 2% of its predicted
    throughput, and the runs out of the top 10 that only layouts within 1% keep out."""
    lines = [
        f"| runs | runs | out of top {TOP} | median ahead within 1% | median ahead within 2% "
        "| out only by layouts within 1% |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, rows in groups.items():
        out = [a for a in rows if a.rank > TOP]
        near = sum(not a.beyond and a.rank - a.ahead_within(0.01) <= TOP for a in out)
        lines.append(
            f"| {key} | {len(rows)} | {len(out)} | {statistics.median_low([a.ahead_within(0.01) for a in rows])} "
            f"| {statistics.median_low([a.ahead_within(0.02) for a in rows])} | {near} |"
        )
    return lines


def measured_mfu(record: RunRecord) -> float:
    """The run's measured MFU, by optlayout's one definition."""
    gpu = gpu_preset(record.cluster.gpu)
    flops = model_flops_per_token(record.model, record.job.seq_len)
    return mfu(record.measured.tokens_per_s_per_gpu, flops, gpu.peak_flops_for(record.job.precision))


def _ceilings(rows: list[Agreement], every: list[RunRecord]) -> list[str]:
    """The solver's picks against the best MFU any run of the file measured on that GPU and precision."""
    best: dict[str, float] = defaultdict(float)
    for rec in every:
        key = f"{rec.cluster.gpu} {rec.job.precision}"
        best[key] = max(best[key], measured_mfu(rec))
    picks: dict[str, list[Agreement]] = defaultdict(list)
    for a in rows:
        if a.best is not None:
            picks[f"{a.published.record.cluster.gpu} {a.published.record.job.precision}"].append(a)
    lines = [
        "| GPU, precision | best measured MFU (any run) | highest predicted MFU of a pick | picks above best + 5 pts |",
        "|---|---:|---:|---:|",
    ]
    for key in sorted(picks):
        top = max(a.best.prediction.mfu for a in picks[key])
        over = sum(a.best.prediction.mfu > best[key] + 0.05 for a in picks[key])
        lines.append(f"| {key} | {best[key]:.1%} | {top:.1%} | {over} of {len(picks[key])} |")
    return lines


def _claims(rows: list[Agreement], n: int = 12) -> list[str]:
    lines = [
        "| run | published (completed) | rank | solver's pick | claimed gain | measured APE "
        "| why the published loses |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for a in sorted(rows, key=lambda a: -(a.claimed_gain or 0))[:n]:
        pub, best = a.published, a.best
        if best is None:
            continue
        job = best.context[1]
        why = why_it_lost(pub.layout, pub.prediction, best.layout, best.prediction, job)
        lines.append(
            f"| {pub.record.id} | {pub.layout.short()} | {_rank_text(a.rank)} of {a.legal_layouts:,} "
            f"| {best.layout.short()} | {a.claimed_gain:+.1%} | {pub.ape:.1%} | {why} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=str(DEFAULT_RUNS))
    parser.add_argument("--calibration", default=None, help="'none': raw defaults; default: the shipped calibration")
    parser.add_argument("--robust", action="store_true", help="rank by the conservative estimate (solve --robust)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    every = read_runs(args.runs)
    records = [r for r in every if is_recipe(r)]
    uncertainty = None
    if args.calibration == "none":
        label, params_for = "uncalibrated (default CostParams)", lambda _g, _p: DEFAULT_PARAMS
    else:
        path = args.calibration or shipped_calibration_path()
        label = "the shipped calibration" if args.calibration is None else f"calibration {args.calibration}"
        calibration = load_calibration(path)
        params_for, uncertainty = calibration.params_for, calibration.uncertainty
    if args.robust and uncertainty is None:
        parser.error("--robust needs a calibration with held-out errors (uncertainty)")
    robust = uncertainty if args.robust else None
    t0 = time.perf_counter()
    topologies: dict[str, Topology] = {}
    spaces: dict[tuple, RankSpace] = {}

    def rank(rec: RunRecord, excluded: frozenset[Sharding], release: Version | None = None) -> Agreement:
        params = params_for(rec.cluster.gpu, rec.job.precision)
        key = rec.cluster.model_dump_json()
        topo = topologies.get(key) or topologies.setdefault(key, topology_from_cluster(rec.cluster))
        options = SpaceOptions(exclude={"sharding": excluded} if excluded else {}, megatron_core=release)
        space = spaces.get((rec.group_key, params, excluded, release)) or spaces.setdefault(
            (rec.group_key, params, excluded, release), RankSpace(rec, params, topo, options, robust)
        )
        return recipe_agreement(rec, params, topo, max_rank=MAX_RANK, space=space)

    rows = [rank(rec, frozenset()) for rec in records]  # the solver's space: every table but the diagnostic one
    elapsed = time.perf_counter() - t0
    ranked = {_without(frozenset()): rows}
    ranked |= {_without(excluded): [rank(rec, excluded) for rec in records] for excluded in WITHOUT[1:]}
    ranked["each run in its release's space"] = [rank(rec, frozenset(), rec.megatron_core()) for rec in records]

    by_source: dict[str, list[Agreement]] = defaultdict(list)
    by_stack: dict[str, list[Agreement]] = defaultdict(list)
    by_gpu: dict[str, list[Agreement]] = defaultdict(list)
    for a in rows:
        rec = a.published.record
        by_source[str(recipe_source(rec))].append(a)
        by_stack[str(getattr(rec, "framework", None) or "not stated")].append(a)
        by_gpu[f"{rec.cluster.gpu} {rec.job.precision}"].append(a)
    diagnostic: dict[str, list[Agreement]] = {}
    for space_name, agreements in ranked.items():
        diagnostic[f"{space_name}: all"] = agreements
        for source in sorted(by_source):
            picked = [a for a in agreements if recipe_source(a.published.record) == source]
            diagnostic[f"{space_name}: {source}"] = picked
    command = (
        "python benchmarks/recipe_agreement.py"
        + (f" --calibration {args.calibration}" if args.calibration else "")
        + (" --robust" if args.robust else "")
    )
    ranked = " ranked by the conservative estimate (`solve --robust`)" if args.robust else ""
    lines = [
        f"Cost model: {label}{ranked}. {len(rows)} NVIDIA recipe runs of `{Path(args.runs).name}` (dgxc-benchmarking, "
        "NeMo tables, Megatron-Bridge; degrees published), ranked with the solver's bound in "
        f"{elapsed:.0f} s on {platform.machine()} {platform.python_version()} ({platform.node() or 'this machine'}).",
        f"Command: `{command}`. Rank 1 = the solver's pick; claimed gain = the pick's predicted throughput over "
        "the published layout's; MAPE of the published layouts' predictions on the same runs.",
        "",
        *_table("runs", {"all NVIDIA recipe runs": rows}),
        "",
        f"The twin rule (README, 'The twin rule'): {sum(a.twin_ahead is not None for a in rows)} of {len(rows)} "
        "published layouts are not ranked themselves because a twin (the same layout but its recomputation) is "
        "ranked in their stead at no lower throughput; they rank by their throughput among the ranked layouts.",
        "",
        *_table("source", dict(sorted(by_source.items()))),
        "",
        *_table("framework", dict(sorted(by_stack.items()))),
        "",
        *_table("GPU, precision", dict(sorted(by_gpu.items()))),
        "",
        "Near ties: layouts ranked ahead of the published one within 1% and 2% of its predicted throughput (all of "
        f"them where the rank is at most {MAX_RANK}, those the walk evaluated beyond); 'out only by layouts within "
        f"1%': runs out of the top {TOP} that would be in it were those layouts counted as ties.",
        "",
        *_crowding({"all NVIDIA recipe runs": rows, **dict(sorted(by_source.items())), **dict(sorted(by_gpu.items()))}),
        "",
        "Predicted MFU of the picks against the best measured MFU (a pick more than 5 points above it is a claim "
        "no run supports):",
        "",
        *_ceilings(rows, every),
        "",
        "Largest claimed gains:",
        "",
        *_claims(rows),
        "",
        "Where the claimed gains come from (a diagnostic, not the target): the same runs ranked in the solver's space "
        "without the shardings beyond ZeRO-1. Megatron-Core gained FSDP as `--use-torch-fsdp2` in 0.10.0 (February "
        "2025) and ZeRO-2 as `--data-parallel-sharding-strategy optim_grads` in 0.12.0 (May 2025; "
        "megatron/training/arguments.py at those tags), after the Megatron-Core of NeMo 24.07 (0.8) and 24.09 (0.9); "
        "the JAX stacks (MaxText, Paxml) run FSDP natively. The published layout is ranked among the layouts that "
        "remain, its own sharding whatever it is. The last rows rank each run in what its own release runs, as "
        "`solve --megatron-core` does (a NeMo run in its container's Megatron-Core, "
        "`RunRecord.megatron_core`: no FSDP before 0.10.0, no ZeRO-2 before 0.13.0, no uneven stages with virtual "
        "stages before 0.11.0, ...; the other stacks in the solver's space).",
        "",
        *_table("space, source", diagnostic),
    ]
    section, title = (
        ("recipes-robust", "Recipe agreement under --robust")
        if args.robust
        else ("recipes", "Recipe agreement: NVIDIA's tuned layouts in the solver's space")
    )
    publish(section, title, "\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
