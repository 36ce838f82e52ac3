"""Recipe agreement: where a published, tuned layout ranks in the solver's space, and the gain the solver claims.

A claimed gain over a measured, tuned recipe is a prediction nobody has verified; large ones point at physics
the cost model lacks. The rank is the one `compare` reports (from the exhaustive oracle), found with the
solver's bound instead of evaluating every layout: groups of layouts are walked best `throughput_bound` first
and the walk stops once no remaining group can beat the published layout (or the best found). The ranking keeps
the twin rule (`twin_key`): a published layout whose twin (the same layout but its recomputation) ranks ahead is
not itself ranked, and counts as its throughput places it among the ranked ones (`twin_ahead` names that twin).
With an `Uncertainty`, layouts rank as `solve --robust` ranks them: by their conservative throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optlayout.cost import CostParams
from optlayout.layout.model import Layout, Recompute
from optlayout.runs.predict import RunPrediction, predict_run, run_job
from optlayout.runs.records import RunRecord
from optlayout.runs.uncertainty import LayoutUncertainty, Uncertainty
from optlayout.solver.candidates import (
    THROUGHPUT_RESOLUTION,
    Candidate,
    best_twins,
    layout_identity,
    passes_limits,
    rank_key,
    ranked_twin,
    throughput_scale,
    twin_in_stead,
    twin_key,
)
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions
from optlayout.topology import Topology, topology_from_cluster


@dataclass(frozen=True)
class Agreement:
    """A published layout (completed as `compare` completes it) against the solver's space."""

    published: RunPrediction
    rank: int  # 1 = the solver's pick; as `compare`'s measured_layout_rank (beyond `max_rank`: max_rank + 1)
    legal_layouts: int  # legal layouts of the solver's space (feasible or not)
    best: Candidate | None  # the solver's pick; None when no layout of the space fits
    max_rank: int | None = None  # the walk stopped once this many layouts beat the published one
    twin_ahead: Layout | None = None  # the published layout's twin ranked in its stead (the twin rule)
    # each layout ranked ahead of the published one, best first: its predicted throughput over the published
    # layout's, minus 1 (every one when not `beyond`; beyond, those the walk evaluated)
    ahead_gains: tuple[float, ...] = ()

    @property
    def beyond(self) -> bool:
        """The published layout ranks below `max_rank` (its exact rank was not walked to)."""
        return self.max_rank is not None and self.rank > self.max_rank

    @property
    def claimed_gain(self) -> float | None:
        """The pick's predicted throughput over the published layout's, minus 1."""
        if self.best is None:
            return None
        return self.best.evaluation.tokens_per_s_per_gpu / self.published.prediction.tokens_per_s_per_gpu - 1

    def ahead_within(self, gain: float) -> int:
        """How many layouts rank ahead of the published one by at most `gain` (0.01: within 1%): near ties."""
        return sum(g <= gain for g in self.ahead_gains)


class RankSpace:
    """The solver's space for one model, cluster, job and cost constants: its layout groups, best bound first,
    and every candidate evaluated so far (runs of one group share it)."""

    def __init__(
        self,
        record: RunRecord,
        params: CostParams,
        topology: Topology,
        options: SpaceOptions,
        robust: Uncertainty | None = None,
    ) -> None:
        job = run_job(record)
        ranked_by = LayoutUncertainty.on(robust, record.model, job, record.cluster.gpu) if robust is not None else None
        problem = Problem(record.model, job, topology, params, options, robust=ranked_by)
        self.table, self.capacity, self.limits = problem.table, problem.capacity_bytes, problem.limits
        groups = list(problem.groups())
        self.legal_layouts = sum(map(len, groups))
        bounds = ((self.table.throughput_bound(g, self.capacity), g) for g in groups)
        self.ordered = sorted(bounds, key=lambda bg: -bg[0])
        self._feasible: dict[Layout, Candidate | None] = {}

    def ranked_tokens_per_s(self, prediction: RunPrediction) -> float:
        """The published layout's cluster tokens/s in the order's terms (conservative under robust)."""
        robust = self.table.robust
        factor = robust.factor(prediction.layout) if robust is not None else 1.0
        return prediction.prediction.tokens_per_s_per_gpu * prediction.layout.gpus * factor

    def feasible(self, layout: Layout) -> Candidate | None:
        """The layout's candidate when it fits and passes the job's limits."""
        if layout not in self._feasible:
            cand = None
            if self.table.state_fits(layout, self.capacity):
                cand = self.table.candidate(self.table.fewest_recomputed(layout, self.capacity))
                cand = cand if passes_limits(cand, self.limits) else None
            self._feasible[layout] = cand
        return self._feasible[layout]


def recipe_agreement(
    record: RunRecord,
    params: CostParams,
    topology: Topology | None = None,
    options: SpaceOptions | None = None,
    max_rank: int | None = None,
    space: RankSpace | None = None,
    robust: Uncertainty | None = None,
) -> Agreement:
    """Rank the record's published layout among the feasible layouts of the solver's space (default options,
    the job's memory and batch limits), best first, each distinct layout once. With `max_rank`, stop once that
    many distinct layouts beat it (the rank is then reported as max_rank + 1, `beyond`). `space` (for this
    record's model, cluster, job and params) is reused across runs of one group. With `robust`, layouts rank by
    their conservative throughput (`solve --robust`)."""
    topo = topology or topology_from_cluster(record.cluster)
    published = predict_run(record, params, topo)
    space = space or RankSpace(record, params, topo, options or SpaceOptions(), robust)
    target = space.ranked_tokens_per_s(published)
    # the solver's order compares throughput in objective units (1e-6 of the best): within two of the target a
    # layout may rank either side of it; beyond, it surely ranks below (under `floor`) or ahead. The bounds bound
    # the cost model's throughput; the ranked one is at most `bound_factor` times it
    factor = space.table.bound_factor
    margin = 2.0 * factor * (space.ordered[0][0] if space.ordered else 0.0) / THROUGHPUT_RESOLUTION
    floor = target - margin
    mine = layout_identity(published.layout)
    best_tps = 0.0
    feasible: list[Candidate] = []
    ahead: set[tuple[object, ...]] = set()  # twin classes surely ranked before the published one
    for bound, group in space.ordered:
        enough = max_rank is not None and len(ahead) >= max_rank
        if (bound * factor < floor or enough) and bound * factor <= best_tps:
            break
        twin_best: dict[tuple[object, ...], float] = {}  # per twin class: the best feasible twin so far
        for lay in group.layouts():  # per sharding, recompute=none first
            twin_tps = twin_best.get(twin_key(lay), -math.inf)
            if lay.recompute != Recompute.none and space.table.outranked_by_twin(lay, twin_tps):
                continue  # never ranked: its twin (or a better one) is, and counts ahead in its stead
            cand = space.feasible(lay)
            if cand is None:
                continue
            twin_best[twin_key(lay)] = max(twin_tps, cand.cluster_tokens_per_s)
            feasible.append(cand)
            best_tps = max(best_tps, cand.cluster_tokens_per_s)
            # a faster twin of the published layout is ranked in its stead: its class is ahead too
            if cand.cluster_tokens_per_s > target + margin and layout_identity(lay) != mine:
                ahead.add(twin_key(lay))
    if not feasible:
        return Agreement(published, 1, space.legal_layouts, None, max_rank)
    scale = throughput_scale(feasible)
    ranking = best_twins(sorted(feasible, key=lambda c: rank_key(c, scale)))
    identities = [layout_identity(c.layout) for c in ranking]
    twin_ahead = twin_in_stead(published.layout, target, ranked_twin(ranking, published.layout))
    if max_rank is not None and len(ahead) >= max_rank:
        rank = max_rank + 1
        before = [c for c in ranking if c.cluster_tokens_per_s > target]
    elif mine in identities:
        rank = identities.index(mine) + 1
        before = ranking[: rank - 1]
    else:  # outside the space, over memory or a twin ranks ahead: by its throughput
        before = [c for c in ranking if c.cluster_tokens_per_s > target]
        rank = 1 + len(before)
    tps = published.prediction.tokens_per_s_per_gpu
    gains = tuple(c.evaluation.tokens_per_s_per_gpu / tps - 1 for c in before)
    return Agreement(published, rank, space.legal_layouts, ranking[0], max_rank, twin_ahead, gains)
