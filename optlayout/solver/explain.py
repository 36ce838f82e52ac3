"""Why one layout loses to another: the cost terms that differ, in time per token, largest first."""

from __future__ import annotations

from dataclasses import dataclass

from optlayout.cost import Prediction
from optlayout.layout.model import SEARCHED_AXES, Layout, Recompute
from optlayout.specs import JobSpec

_TERM_NAMES = {
    "compute_s": "compute",
    "tp_comm_s": "exposed TP communication",
    "cp_comm_s": "exposed CP communication",
    "ep_comm_s": "exposed EP communication",
    "pp_comm_s": "pipeline send/receive",
    "bubble_s": "pipeline bubble",
    "dp_comm_s": "exposed DP communication",
    "optimizer_s": "optimizer step",
    "overhead_s": "step overhead",
}


@dataclass(frozen=True)
class TermDelta:
    term: str
    layout_us_per_token: float
    best_us_per_token: float

    @property
    def delta_us_per_token(self) -> float:
        return self.layout_us_per_token - self.best_us_per_token


def _per_token_us(pred: Prediction, layout: Layout, job: JobSpec) -> dict[str, float]:
    # seconds of each term per token processed by one GPU (time x GPUs / tokens per step)
    tokens_per_gpu = layout.global_batch * job.seq_len / layout.gpus
    return {k: v / tokens_per_gpu * 1e6 for k, v in pred.time.items()}


def term_deltas(
    layout: Layout, pred: Prediction, best_layout: Layout, best_pred: Prediction, job: JobSpec
) -> list[TermDelta]:
    """Every time term of `layout` against the best, largest loss first."""
    mine = _per_token_us(pred, layout, job)
    best = _per_token_us(best_pred, best_layout, job)
    rows = [TermDelta(_TERM_NAMES[k], mine[k], best[k]) for k in mine]
    return sorted(rows, key=lambda r: -r.delta_us_per_token)


def why_it_lost(layout: Layout, pred: Prediction, best_layout: Layout, best_pred: Prediction, job: JobSpec) -> str:
    """One line: the two terms that cost the layout most against the best, and what differs in the layout."""
    losses = [d for d in term_deltas(layout, pred, best_layout, best_pred, job) if d.delta_us_per_token > 0]
    changed = [
        f"{a.name}={_shown(layout, a.name)}"
        for a in SEARCHED_AXES
        if a.name != "grad_accum" and getattr(layout, a.name) != getattr(best_layout, a.name)
        and (a.name != "recompute_layers" or layout.recompute == Recompute.full)  # a count only full recomputation has
    ]  # fmt: skip
    gap = 1 - pred.tokens_per_s_per_gpu / best_pred.tokens_per_s_per_gpu if best_pred.tokens_per_s_per_gpu else 0
    terms = ", ".join(f"{d.term} +{d.delta_us_per_token:.2f} us/token" for d in losses[:2]) or "ties on every term"
    return f"{gap:.1%} slower ({', '.join(changed) or 'same degrees'}): {terms}"


def _shown(layout: Layout, name: str) -> object:
    value = getattr(layout, name)
    if value is None and name == "recompute_layers":
        return "all"
    return getattr(value, "value", value)
