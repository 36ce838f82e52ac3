"""Compare measured runs with the cost model: error, rank of the measured layout, the solver's own pick.

One MFU definition throughout (ours, `optlayout.cost.flops`): measured and predicted MFU both come from
tokens/s/GPU, so sources that count FLOPs differently are compared on throughput, never on their MFU.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optlayout.cost import CostParams
from optlayout.runs.predict import RunPrediction, predict_run, run_job
from optlayout.runs.records import RunRecord
from optlayout.solver.oracle import rank_every_layout
from optlayout.solver.tables import Candidate, layout_identity
from optlayout.specs import Layout
from optlayout.topology import topology_from_cluster

ParamsFor = Callable[[str, str], CostParams]


def group_label(record: RunRecord) -> str:
    c, j = record.cluster, record.job
    return f"{record.model.name} | {c.gpu} x {c.gpus} | seq {j.seq_len} | batch {j.global_batch} | {j.precision}"


def _ranking(record: RunRecord, params: CostParams) -> list[Candidate]:
    """Every feasible layout for the run's model, cluster and job, best first (the oracle walk)."""
    return rank_every_layout(record.model, run_job(record), topology_from_cluster(record.cluster), params)


@dataclass(frozen=True)
class GroupRanking:
    """What compare keeps of one group's full ranking: positions, the best layout and the throughputs."""

    count: int
    position: dict[tuple, int]
    best: tuple[Layout, float] | None
    descending_tps: list[float]

    @classmethod
    def of(cls, ranking: list[Candidate]) -> GroupRanking:
        position: dict[tuple, int] = {}
        for k, c in enumerate(ranking):
            position.setdefault(layout_identity(c.layout), k + 1)
        best = (ranking[0].layout, ranking[0].evaluation.tokens_per_s_per_gpu) if ranking else None
        return cls(len(ranking), position, best, [c.evaluation.tokens_per_s_per_gpu for c in ranking])

    def rank_of(self, layout: Layout, tokens_per_s_per_gpu: float) -> int | None:
        """The layout's position; one outside the searched space or over memory ranks by its throughput."""
        found = self.position.get(layout_identity(layout))
        if found is not None or not self.count:
            return found
        return 1 + sum(tps > tokens_per_s_per_gpu for tps in self.descending_tps)


def compare_runs(
    records: list[RunRecord],
    params_for: ParamsFor,
    rank_layouts: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The `optlayout compare --json` result: per-run rows and a summary."""
    rows: list[dict[str, Any]] = []
    preds: list[RunPrediction] = []
    rankings: dict[tuple, GroupRanking] = {}
    for i, rec in enumerate(records):
        params = params_for(rec.cluster.gpu, rec.job.precision)
        pred = predict_run(rec, params)
        preds.append(pred)
        mfu_per_token_s = pred.prediction.mfu / pred.prediction.tokens_per_s_per_gpu  # same FLOPs, same peak
        measured = rec.measured.tokens_per_s_per_gpu
        row: dict[str, Any] = {
            "id": rec.id,
            "source": rec.source,
            "group": group_label(rec),
            "measured_tokens_per_s_per_gpu": measured,
            "predicted_tokens_per_s_per_gpu": pred.prediction.tokens_per_s_per_gpu,
            "ape": pred.ape,
            "measured_mfu": measured * mfu_per_token_s,
            "predicted_mfu": pred.prediction.mfu,
            "filled_fields": pred.filled_fields,
            "assumed": pred.assumed,
            "layout": pred.layout.model_dump(mode="json"),
            "predicted_fits_memory": pred.prediction.fits,
            "memory_model_miss": pred.memory_model_miss,
            "measured_layout_rank": None,
            "legal_layouts": None,
            "solver_pick": None,
            "solver_predicted_gain": None,
        }
        if rank_layouts:
            key = (rec.group_key, params)
            if key not in rankings:
                rankings[key] = GroupRanking.of(_ranking(rec, params))
            ranking = rankings[key]
            row["legal_layouts"] = ranking.count
            row["measured_layout_rank"] = ranking.rank_of(pred.layout, pred.prediction.tokens_per_s_per_gpu)
            if ranking.best is not None:
                best_layout, best_tps = ranking.best
                row["solver_pick"] = best_layout.model_dump(mode="json")
                row["solver_predicted_gain"] = best_tps / pred.prediction.tokens_per_s_per_gpu - 1
        rows.append(row)
        if progress:
            progress(i + 1, len(records))
    return {"runs": rows, "summary": summarize(preds, rows)}


def pairwise_order(preds: list[RunPrediction]) -> tuple[float | None, int]:
    """Fraction of run pairs within a group (same model, cluster, job; different layout) whose measured
    order the prediction reproduces; pairs with equal measured throughput are skipped."""
    groups: dict[tuple, list[RunPrediction]] = defaultdict(list)
    for p in preds:
        groups[p.record.group_key].append(p)
    agree = total = 0
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            dm = a.record.measured.tokens_per_s_per_gpu - b.record.measured.tokens_per_s_per_gpu
            if dm == 0 or layout_identity(a.layout) == layout_identity(b.layout):
                continue
            dp = a.prediction.tokens_per_s_per_gpu - b.prediction.tokens_per_s_per_gpu
            total += 1
            agree += (dm > 0) == (dp > 0)
    return (agree / total if total else None), total


def summarize(preds: list[RunPrediction], rows: list[dict[str, Any]]) -> dict[str, Any]:
    apes = [p.ape for p in preds]
    accuracy, pairs = pairwise_order(preds)
    per_source: dict[str, list[float]] = defaultdict(list)
    for p in preds:
        per_source[p.record.source].append(p.ape)
    worst = sorted(rows, key=lambda r: -r["ape"])[:5]
    return {
        "n": len(preds),
        "mape": statistics.mean(apes),
        "median_ape": statistics.median(apes),
        "pairwise_order_accuracy": accuracy,
        "pairs": pairs,
        "per_source": {
            s: {"n": len(v), "mape": statistics.mean(v), "median_ape": statistics.median(v)}
            for s, v in sorted(per_source.items())
        },
        "worst": [r["id"] for r in worst],
        "memory_model_misses": [p.record.id for p in preds if p.memory_model_miss],
    }
