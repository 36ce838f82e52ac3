"""Cost tables: every legal layout with its prediction from the one cost model, and an exact total order.

The order is what both the CP-SAT model and the oracle optimize: cluster throughput first (tokens/s
over all GPUs, so idle GPUs count against a layout), then the simpler layout, then a fixed field order,
so the same input always gives the same answer. Under the goodput objective the throughput is multiplied
by each layout's effective time fraction (`optlayout.conditions.goodput`) inside the candidate, before any order is
taken, so every order below (rank key, CP-SAT coefficients, skyline, oracle) ranks by goodput alike. The robust
objective multiplies it the same way by each layout's conservative factor
(`optlayout.runs.uncertainty.LayoutUncertainty`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from optlayout.cost import (
    DEFAULT_PARAMS,
    CostParams,
    Evaluation,
    GroupLinks,
    MemoryBreakdown,
    Prediction,
    TimeBreakdown,
    evaluate,
    group_links,
)
from optlayout.cost.comm import LinkSource
from optlayout.cost.memory import (
    first_stage_state_bytes,
    memory_floor_bytes,
    memory_per_gpu,
    memory_total_bytes,
    most_stage_params,
    stage_params_per_stage,
    stage_state_bytes,
)
from optlayout.cost.step import (
    dp_comm_floor_s,
    optimizer_s,
    sharding_free_s,
    step_floor_s,
    step_time,
    whole_model_floor_s,
    whole_model_s,
)
from optlayout.frozen import fast_init
from optlayout.inputs.limits import MAX_CPSAT_COEFFICIENT, MIB
from optlayout.layout.model import AXES, EXPERT_GRID_AXES, GRID_AXES, LAYOUT_DEFAULTS, Layout, Recompute, Sharding
from optlayout.layout.stages import chunk_layer_counts, stage_split
from optlayout.solver.space import FAMILY_AXES, LayoutGroup, NodeKey, SpaceNodes, node_key
from optlayout.specs import GpuSpec, JobSpec, ModelSpec
from optlayout.timings import PhaseClock

if TYPE_CHECKING:
    from optlayout.conditions.goodput import GoodputModel, LayoutCheckpointing
    from optlayout.runs.uncertainty import LayoutUncertainty

_SHARDING_ORDER = {s: i for i, s in enumerate(Sharding)}
_SHARDED_FIRST = {s: (s == Sharding.none, i) for i, s in enumerate(Sharding)}
_RECOMPUTE_ORDER = {r: i for i, r in enumerate(Recompute)}


@fast_init
@dataclass(frozen=True)
class Candidate:
    """A legal layout and what the cost model says of it (the full Prediction is built on demand).

    With the goodput objective, `checkpointing` holds the layout's checkpoint cost and effective time
    fraction, and the throughput every order uses is the goodput (throughput x that fraction)."""

    layout: Layout
    evaluation: Evaluation
    context: tuple[ModelSpec, JobSpec, GpuSpec]
    checkpointing: LayoutCheckpointing | None = None
    robust_factor: float = 1.0  # the robust objective's: the interval's low end over the prediction

    @cached_property
    def prediction(self) -> Prediction:
        return self.evaluation.prediction(*self.context)

    @cached_property
    def cluster_tokens_per_s(self) -> float:
        """What the solver maximizes: tokens/s over all GPUs, x the effective time fraction under goodput, x the
        conservative factor under the robust objective."""
        tokens = self.evaluation.tokens_per_s_per_gpu * self.layout.gpus * self.robust_factor
        return tokens if self.checkpointing is None else tokens * self.checkpointing.effective_time_fraction


_IDENTITY = tuple(a.name for a in AXES if a.name != "grad_accum")
_MODEL_SPLITS = tuple(a.name for a in AXES if a.splits_model)
_all_but_micro_batch = operator.attrgetter(*(a.name for a in AXES if a.name != "micro_batch"))


def layout_identity(layout: Layout) -> tuple[object, ...]:
    """What makes two layouts distinct in a top-K: every axis but the accumulation, which within batch
    bounds is chosen for each layout (a layout with one micro-batch fewer is not a different layout)."""
    return tuple(getattr(layout, f) for f in _IDENTITY)


_TWIN = tuple(name for name in _IDENTITY if name not in ("recompute", "recompute_layers"))


def twin_key(layout: Layout) -> tuple[object, ...]:
    """What twins share: a layout's identity (`layout_identity`) but its recomputation (`recompute` and
    `recompute_layers`), i.e. the same degrees, micro-batch, sharding, sequence parallelism and stage split.

    The twin rule: of the feasible layouts of the searched space (they fit memory and pass the limits) sharing a
    twin key, only the best by `rank_key` (ties to less recomputation, `simplicity_key`) is ranked; the others are
    never listed. Of layouts identical but for recomputation a user runs the fastest that fits, so its slower
    twins would only crowd a top K. The rule compares the twins' own predictions and needs no argument that more
    recomputation is slower. Only twins of the space count: a pinned recomputation leaves only the pinned ones.
    The robust factor is the same across twins (it reads degrees and sharding only), so the rule is too."""
    return tuple(getattr(layout, f) for f in _TWIN)


def twin_in_stead(layout: Layout, tokens_per_s: float, ranked_twin: tuple[Layout, float] | None) -> Layout | None:
    """The layout's twin ranked in its stead (the twin rule): `ranked_twin`, the layout its twin class ranks and its
    throughput (in `tokens_per_s`'s units), when that is another layout at no lower throughput; else None (the layout
    is ranked itself, its class is not, or it is over memory and its ranked twin is slower)."""
    if ranked_twin is None:
        return None
    twin, twin_tps = ranked_twin
    return twin if layout_identity(twin) != layout_identity(layout) and twin_tps >= tokens_per_s else None


def ranked_twin(ranking: Iterable[Candidate], layout: Layout) -> tuple[Layout, float] | None:
    """The layout of `ranking` in `layout`'s twin class (`twin_key`) and its cluster tokens/s; None if none is."""
    mine = twin_key(layout)
    return next(((c.layout, c.cluster_tokens_per_s) for c in ranking if twin_key(c.layout) == mine), None)


def cluster_tokens_per_s(layout: Layout, seq_len: int, step_s: float) -> float:
    """The cluster's tokens/s of `layout` at a step of `step_s` seconds."""
    return layout.global_batch * seq_len / step_s


def best_twins(ranked: Iterable[Candidate]) -> list[Candidate]:
    """The feasible candidates `ranked` (best first by `rank_key`) under the twin rule (`twin_key`): each twin
    class's first, at its best accumulation; what every ranking of the space lists."""
    kept: dict[tuple[object, ...], Candidate] = {}
    for cand in ranked:
        kept.setdefault(twin_key(cand.layout), cand)
    return list(kept.values())


_placed = operator.attrgetter(*dict.fromkeys(a.name for a in (*GRID_AXES, *EXPERT_GRID_AXES)))


def grid_key(layout: Layout) -> tuple[int, ...]:
    """What a layout's group links depend on: the degrees of the rank grids (dense and expert), and whether it
    interleaves (the last stage then also sends to the first, a pipeline boundary of its own)."""
    return (*_placed(layout), layout.vp > 1)


def state_key(layout: Layout, sharding: Sharding | None = None) -> tuple[object, ...]:
    """What the training state per GPU depends on: the stage split, tp, the shard group dp x cp, sharding (the
    layout's, or `sharding`), and the expert split (etp x ep) with its shard group edp."""
    return (layout.tp, layout.pp, layout.dp * layout.cp, layout.sharding if sharding is None else sharding,
            layout.first_stage_layers, layout.last_stage_layers, layout.ep, layout.etp)  # fmt: skip


def simplicity_key(layout: Layout) -> tuple[object, ...]:
    """Fewer parallel dimensions and less machinery first; then a fixed field order, over every field of a layout
    (a total order: the tie-break of exact throughput ties)."""
    used = sum(getattr(layout, name) > 1 for name in _MODEL_SPLITS)
    return (
        used,
        _SHARDING_ORDER[layout.sharding],
        _RECOMPUTE_ORDER[layout.recompute],
        layout.recompute_layers or math.inf,  # fewer recomputed layers first (none set: all of them)
        layout.sequence_parallel,
        layout.tp,
        layout.pp,
        layout.vp,
        layout.cp,
        -layout.micro_batch,
        layout.grad_accum,
        layout.dp,
        layout.ep,  # the rest only makes the order total: exact ties must not go by the order a walk takes
        layout.etp,
        layout.first_stage_layers or 0,
        layout.last_stage_layers or 0,
    )


def rank_key(candidate: Candidate, throughput_scale: float) -> tuple[object, ...]:
    """Sort key: best first. Throughput is compared at the same integer resolution the CP-SAT model uses."""
    return (-scaled_throughput(candidate, throughput_scale), simplicity_key(candidate.layout))


def memory_mib(memory_bytes: float) -> int:
    """Memory in whole MiB, rounded up: the unit of the `memory_fits` constraint (past the model's integer range,
    one more than the largest capacity: it never fits, as it would not at its exact size)."""
    if not memory_bytes < MAX_CPSAT_COEFFICIENT * MIB:
        return MAX_CPSAT_COEFFICIENT + 1
    return int(-(-memory_bytes // MIB))


def capacity_mib(capacity_bytes: float) -> int:
    """Usable memory in whole MiB, the bound of `memory_fits`; no limit (infinity) is the largest integer."""
    if not capacity_bytes < MAX_CPSAT_COEFFICIENT * MIB:
        return MAX_CPSAT_COEFFICIENT
    return int(capacity_bytes // MIB)


THROUGHPUT_RESOLUTION = 1_000_000  # objective units per best-candidate throughput: 1e-6 relative resolution


def scaled_throughput(candidate: Candidate, throughput_scale: float) -> int:
    """Cluster tokens/s as an integer, `THROUGHPUT_RESOLUTION` for the fastest candidate."""
    return round(candidate.cluster_tokens_per_s * throughput_scale)


def throughput_scale(candidates: list[Candidate]) -> float:
    best = max((c.cluster_tokens_per_s for c in candidates), default=1.0)
    return THROUGHPUT_RESOLUTION / best if best > 0 else 1.0


class CostTable:
    """Evaluates layouts with the cost model, sharing group links and per-layer times across layouts."""

    def __init__(
        self,
        model: ModelSpec,
        job: JobSpec,
        gpu: GpuSpec,
        topology: LinkSource,
        params: CostParams = DEFAULT_PARAMS,
        goodput: GoodputModel | None = None,
        robust: LayoutUncertainty | None = None,
    ) -> None:
        self.model, self.job, self.gpu, self.topology, self.params = model, job.on_gpu(gpu), gpu, topology, params
        self.goodput = goodput  # set: candidates carry their checkpointing and rank by goodput
        self.robust = robust  # set: candidates rank by their conservative throughput
        # the bounds below bound the cost model's throughput; the ranked one is at most this many times it
        self.bound_factor = robust.max_factor if robust is not None else 1.0
        self._links: dict[tuple[int, ...], GroupLinks] = {}
        self._link_memo: dict[tuple[object, ...], object] = {}  # `group_links`' links read, across grids
        self._memo: dict[tuple[object, ...], object] = {}
        self.cost_s = 0.0  # seconds spent in the cost model so far

    def links(self, layout: Layout) -> GroupLinks:
        """The links of the layout's groups, read once per rank grid."""
        key = grid_key(layout)
        links = self._links.get(key)
        if links is None:
            links = self._links[key] = group_links(self.topology, layout, self._link_memo)
        return links

    def candidate(self, layout: Layout, times: TimeBreakdown | None = None) -> Candidate:
        """The layout evaluated; `times`: its `times(layout)`, when already found (not computed again)."""
        started = time.perf_counter()
        links = self.links(layout)
        ev = evaluate(self.model, self.job, layout, self.gpu, self.topology, self.params, links, self._memo, times)
        ckpt = self.goodput.estimate(layout) if self.goodput is not None else None
        factor = self.factor(layout)
        self.cost_s += time.perf_counter() - started
        return Candidate(layout, ev, (self.model, self.job, self.gpu), ckpt, factor)

    def memory(self, layout: Layout) -> MemoryBreakdown:
        """The memory per GPU of `layout` alone, the same `evaluate` finds (a diagnosis needs no step time)."""
        started = time.perf_counter()
        memory = memory_per_gpu(self.model, self.job, layout, self.params, self._memo)
        self.cost_s += time.perf_counter() - started
        return memory

    def memory_bytes(self, layout: Layout) -> float:
        """`memory(layout).total_bytes`, without the breakdown (a count of the layouts that fit needs no more)."""
        started = time.perf_counter()
        total = memory_total_bytes(self.model, self.job, layout, self.params, self._memo)
        self.cost_s += time.perf_counter() - started
        return total

    def times(self, layout: Layout) -> TimeBreakdown:
        """The step time of `layout` alone, the same `evaluate` finds (a bound needs no memory)."""
        started = time.perf_counter()
        most = most_stage_params(self.model, layout, self._memo)
        times = step_time(self.model, self.job, layout, self.gpu, self.links(layout), self.params, most.total,
                          self._memo, most.experts)  # fmt: skip
        self.cost_s += time.perf_counter() - started
        return times

    def predict(self, layout: Layout) -> Prediction:
        return self.candidate(layout).prediction

    def fewest_recomputed(self, layout: Layout, capacity_bytes: float) -> Layout:
        """The layout the search evaluates for a layout of its space: with recompute=full and no layer count, the
        fewest recomputed layers per model chunk whose memory fits `capacity_bytes` (every layer when no fewer fit);
        any other layout as it is.

        Memory falls as the count grows (a recomputed layer keeps only its input, less than all it keeps
        otherwise), so bisection finds it. And a step is never faster for recomputing more: each more layer adds
        its forward to the backward, and what that longer backward hides of the pipeline sends and the gradient
        reduction is at most what it adds (tests/test_partial_recompute.py checks it on the cost model). So of a
        layout's layer counts that fit, the fewest is the fastest and the search holds that one alone."""
        if layout.recompute != Recompute.full or layout.recompute_layers is not None:
            return layout
        lkey = ("largest_chunk", layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers)
        largest = self._memo.get(lkey)
        if not isinstance(largest, int):
            largest = self._memo[lkey] = max(chunk_layer_counts(stage_split(layout, self.model.layers), layout.vp))
        cap = capacity_mib(capacity_bytes)

        def fits(n: int) -> bool:
            return memory_mib(self.memory_bytes(_with_recomputed_layers(layout, n))) <= cap

        if largest <= 1 or not fits(largest - 1):
            return layout
        lo, hi = 1, largest - 1  # the fewest that fits lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return _with_recomputed_layers(layout, lo)

    def state_fits(self, layout: Layout, capacity_bytes: float, sharding: Sharding | None = None) -> bool:
        """Whether the training state and reserve alone fit (with `sharding`: of the layout at that sharding): a
        bound that holds for every micro-batch, recomputation and schedule of the same degrees and sharding
        (activations only add)."""
        key = ("state_bytes", *state_key(layout, sharding), layout.vp)  # what the stages' parameters depend on, too
        state = self._memo.get(key)
        if not isinstance(state, float):
            per_stage = stage_params_per_stage(self.model, layout, self._memo)
            shard = layout if sharding in (None, layout.sharding) else _with_field(layout, "sharding", sharding)
            state = self._memo[key] = float(max(sum(stage_state_bytes(p, self.job, shard))
                                                for p in dict.fromkeys(per_stage)))  # stages alike hold alike
        return state + self.params.runtime_reserve_bytes <= capacity_bytes

    def throughput_bound(self, group: LayoutGroup, capacity_bytes: float | None = None) -> float:
        """An upper bound on the cluster tokens/s of every layout of the group (with `capacity_bytes`, of every
        layout whose training state fits it: `state_fits`): the best over its shardings (those whose state fits) of
        the throughput at the cheapest variant's compute, exposed TP/CP/EP time, bubble, pipeline send/receive and
        overhead, each of which recomputation and the lack of sequence parallelism only raise (an exposed
        all-to-all that EP overlap hides under a longer recomputed compute still leaves compute + exposed no
        shorter; sharding changes none of them), plus the sharding's own optimizer step and its exposed
        data-parallel time at the most compute any variant runs (`dp_comm_floor_s` at `heaviest_variant`); goodput
        only lowers the throughput. 0 when no sharding's state fits."""
        started = time.perf_counter()
        cheapest = group.cheapest_variant()
        links = self.links(cheapest)  # every layout of the group has the same rank grids
        shared_s = sharding_free_s(self.model, self.job, cheapest, self.gpu, links, self.params, self._memo)
        most = most_stage_params(self.model, cheapest, self._memo)
        least_s = math.inf
        for sharding in group.shardings:
            if capacity_bytes is not None and not self.state_fits(cheapest, capacity_bytes, sharding):
                continue
            heaviest = group.heaviest_variant(sharding)
            dp_s = dp_comm_floor_s(self.model, self.job, heaviest, self.gpu, links, self.params, most.total,
                                   self._memo, most.experts)  # fmt: skip
            least_s = min(least_s, dp_s + optimizer_s(heaviest, self.gpu, links, self.params, most.total,
                                                      most.experts))  # fmt: skip
        self.cost_s += time.perf_counter() - started
        return cluster_tokens_per_s(cheapest, self.job.seq_len, shared_s + least_s) if least_s < math.inf else 0.0

    def group_floors(self, group: LayoutGroup) -> Iterator[tuple[tuple[Recompute, bool], float]]:
        """Each (recomputation, sequence parallelism) variant of the group and its first-stage memory floor
        (`memory_floor_bytes`) at its most sharded sharding, the least-memory variants (full recomputation, sequence
        parallel) first: a variant's is at most the floor of each of its layouts (each sharding divides more of the
        floor's training state, and its activations are the same)."""
        most = _most_sharded(group)
        for r, sp in reversed(list(group.variants())):
            yield (r, sp), memory_floor_bytes(self.model, self.job, group.layout(most, r, sp), self.params, self._memo)

    def overflowing_variants(self, group: LayoutGroup, cap_mib: int) -> set[tuple[Recompute, bool]]:
        """The (recomputation, sequence parallelism) variants of the group every layout of which overflows `cap_mib`
        at its first stage alone: those whose floor at the most sharded sharding does (`group_floors`); every
        variant when the first stage's training state and the reserve alone do at that sharding (every floor is at
        least that)."""
        variants = list(group.variants())
        most = _most_sharded(group)
        state = first_stage_state_bytes(self.model, self.job, group.layout(most, *variants[0]), self._memo)
        if memory_mib(state + self.params.runtime_reserve_bytes) > cap_mib:
            return set(variants)
        return {variant for variant, floor in self.group_floors(group) if memory_mib(floor) > cap_mib}

    def least_memory(self, groups: Iterable[LayoutGroup]) -> Layout | None:
        """The first layout of the groups' layouts (in their order) of the least memory per GPU, as
        `min(layouts, key=self.memory_bytes)` finds it, without the memory of a layout whose first-stage floor is
        over the least found (nor of any layout of a group whose `group_floors` all are); None for no groups."""
        best, best_bytes = None, math.inf
        for group in groups:
            if all(floor > best_bytes for _, floor in self.group_floors(group)):
                continue
            for lay in group.layouts():
                if memory_floor_bytes(self.model, self.job, lay, self.params, self._memo) > best_bytes:
                    continue
                total = self.memory_bytes(lay)
                if total < best_bytes:
                    best, best_bytes = lay, total
        return best

    def group_factor(self, group: LayoutGroup) -> float:
        """The largest robust factor of the group's layouts: it depends on their degrees and sharding only."""
        if self.robust is None:
            return 1.0
        recompute, sp = next(group.variants())
        return max(self.robust.factor(group.layout(s, recompute, sp)) for s in group.shardings)

    def evaluated_candidates(
        self,
        groups: Iterable[LayoutGroup] | SpaceNodes,
        limits: Limits,
        k: int | None = None,
        clock: PhaseClock | None = None,
    ) -> tuple[list[Candidate], int]:
        """Evaluate the layouts, skipping those proven unable to be in the top k without evaluating them:
        (1) the state alone overflows (it depends on tp, pp, dp x cp and sharding only); (2) a smaller
        micro-batch of the same layout already overflowed (activations grow with the micro-batch: per layer
        linearly, and the in-flight count mb x min(warm-up, ga x v) with ga = batch / (mb x dp) never falls);
        (3) with `k`, branch and bound: groups (layouts sharing all but sharding, recomputation and sequence
        parallelism) are taken best `throughput_bound` first, and the walk stops once a group's bound falls
        below the k-th best feasible layout found (with a margin for the objective's integer rounding); the
        groups sharing tp, cp, micro-batch, ep and etp are bounded together first (`node_bound`, at least every
        member's bound), and a node's groups are bounded one by one only when the node comes first (`best_first`:
        each bound only once a looser one over it leads, the same order). Inside a
        group a recomputing variant is first bounded by its own step floor (`step_floor_s`), and once one layout
        of a (recomputation, sequence parallelism) variant is evaluated, its `variant_bound` holds for the
        variant's other shardings, which are skipped when it falls below that k-th best. A layout whose first
        stage alone overflows memory (`memory_floor_bytes`), or whose memory does, gets no step time, and a group
        whose every layout's first stage does (`overflowing_variants`) is skipped whole, a variant likewise. Under the
        robust objective each bound is scaled by the largest factor it covers (`bound_factor`, `group_factor`).
        (4) The twin rule (`twin_key`): the k-th best counts twin classes, each at its best; and a recomputing
        layout is skipped once a feasible twin of less recomputation (the same sharding and sequence parallelism)
        ranks above its step floor (`recomputing_floor_tps` x its robust factor, the same as the twin's), or once it
        fits memory, above its throughput at one recomputed layer (`recomputing_tps`): that twin, or a better one,
        is ranked in its stead.
        Returns the evaluated candidates (all fit memory; some may miss the batch or bubble limits) and the number
        of legal layouts. `groups` may come in nodes (`SpaceNodes`, with `k`: their groups are built only for the
        nodes the walk reaches). `clock` gets the time spent walking the space (enumeration), in the cost model
        (cost_tables) and the rest (reductions)."""
        started = time.perf_counter()
        cost_before_s = self.cost_s
        ordered: Iterable[tuple[float, LayoutGroup]]
        if isinstance(groups, SpaceNodes):
            if k is None:
                raise ValueError("a space in nodes is walked best bound first: give k")
            seen = groups.layout_count
            ordered = self.best_first(groups, limits.memory_capacity_bytes)
        else:
            in_order = list(groups)
            seen = sum(len(g) for g in in_order)
            if k is not None:
                ordered = self.best_first(in_order, limits.memory_capacity_bytes)
            else:
                ordered = ((math.inf, g) for g in in_order)
        enumerating_s = time.perf_counter() - started
        # two objective units: the integer objective resolves 1e-6 of the best, which is at most the first bound
        first_bound, ordered = peek(ordered)
        margin = 2.0 * (first_bound if k is not None else 0.0) / THROUGHPUT_RESOLUTION
        kth = _KthBest(k)
        overflow_mb: dict[tuple[object, ...], int] = {}
        out: list[Candidate] = []
        capacity_bytes = limits.memory_capacity_bytes
        cap_mib = capacity_mib(capacity_bytes)  # the same clamp passes_limits and the CP-SAT model use
        for bound, group in ordered:
            # fixed for the group: it only rises, so an older one is safe; in the bounds' units (`bound_factor`)
            threshold = kth.value() / self.bound_factor - margin
            if bound < threshold:
                break  # every remaining group is bounded below the k-th best: none can enter the top k
            if self.robust is not None:  # the group's own largest factor bounds its layouts tighter
                threshold = (kth.value() - margin * self.bound_factor) / self.group_factor(group)
                if bound < threshold:
                    continue
            variants, overflowing = list(group.variants()), self.overflowing_variants(group, cap_mib)
            if len(overflowing) == len(variants):
                continue  # no layout of the group fits its first stage alone: none would be evaluated
            state_by_sharding: dict[Sharding, bool] = {}  # the state is the same for every variant
            unrecomputed: dict[bool, float] = {}  # per sequence parallelism: the evaluated recompute=none bound
            twin_best: dict[tuple[Sharding, bool], float] = {}  # per sharding and SP: the best feasible twin so far
            for recompute, sp in variants:  # recompute=none first, then selective, then full
                if (recompute, sp) in overflowing:
                    continue  # no layout of the variant fits its first stage alone: none would be evaluated
                floor_tps = math.inf  # an upper bound on the variant's cluster tokens/s, before the robust factor
                twinned = any(twin_sp == sp for _, twin_sp in twin_best)
                if recompute != Recompute.none and (threshold > -math.inf or twinned):
                    # a recomputing variant is bounded by the same variant without recomputation (each term only
                    # rises), then by its own step floor
                    if unrecomputed.get(sp, math.inf) < threshold:
                        continue
                    floor_tps = self.recomputing_floor_tps(group.layout(group.shardings[0], recompute, sp))
                    if floor_tps < threshold:
                        continue
                for sharding in sorted(group.shardings, key=_SHARDED_FIRST.__getitem__):  # the tighter bound first
                    ok = state_by_sharding.get(sharding)
                    if ok is False:
                        continue
                    listed = time.perf_counter()
                    lay = group.layout(sharding, recompute, sp)
                    enumerating_s += time.perf_counter() - listed
                    twin_tps = twin_best.get((sharding, sp), -math.inf)
                    if self.outranked_by_twin(lay, twin_tps, floor_tps):
                        continue  # the twin rule: a feasible twin with less recomputation already ranks ahead of it
                    if ok is None:
                        ok = state_by_sharding[sharding] = self.state_fits(lay, capacity_bytes)
                        if not ok:
                            continue
                    # the accumulation is in the key: with batch bounds a smaller one can hold fewer chunks in flight
                    mkey = _all_but_micro_batch(lay)
                    if lay.micro_batch >= overflow_mb.get(mkey, 1 << 30):
                        continue
                    floor_mib = memory_mib(memory_floor_bytes(self.model, self.job, lay, self.params, self._memo))
                    if floor_mib > cap_mib or memory_mib(self.memory_bytes(lay)) > cap_mib:
                        overflow_mb[mkey] = min(lay.micro_batch, overflow_mb.get(mkey, 1 << 30))
                        continue  # it cannot fit (its first stage alone, or the fullest): no step time
                    if self.outranked_by_twin(lay, twin_tps):
                        continue  # the same, from its step time: no layer count to bisect
                    cand = self.candidate(self.fewest_recomputed(lay, capacity_bytes))  # it fits: so does this
                    if passes_limits(cand, limits):
                        kth.add(twin_key(lay), cand.cluster_tokens_per_s)
                        twin_best[sharding, sp] = max(twin_tps, cand.cluster_tokens_per_s)
                    out.append(cand)
                    variant_tps = variant_bound(lay, cand.evaluation.times, self.job.seq_len)
                    if variant_tps < threshold and lay.recompute == Recompute.full and lay.recompute_layers is None:
                        # another sharding may fit fewer recomputed layers: bound it with the fewest, one
                        fewest = least_recomputed(lay)
                        variant_tps = variant_bound(fewest, self.times(fewest), self.job.seq_len)
                    if recompute == Recompute.none:
                        unrecomputed[sp] = min(variant_tps, unrecomputed.get(sp, math.inf))
                    if variant_tps < threshold:
                        break  # the variant's other shardings are bounded below the k-th best too
        if clock is not None:
            cost_s = self.cost_s - cost_before_s
            clock.add("enumeration", enumerating_s)
            clock.add("cost_tables", cost_s)
            clock.add("reductions", time.perf_counter() - started - enumerating_s - cost_s)
        return out, seen

    def recomputing_floor_tps(self, layout: Layout) -> float:
        """An upper bound on the cluster tokens/s of the recomputing layout's every sharding, before the robust
        factor and goodput (which only lower it), from its step floor (`step_floor_s`, which sharding does not
        change); with full recomputation of no set layer count, at one layer, the least the search may take."""
        layout = least_recomputed(layout)
        started_s = time.perf_counter()
        floor_s = step_floor_s(self.model, self.job, layout, self.gpu, self.links(layout), self.params, self._memo)
        self.cost_s += time.perf_counter() - started_s
        return cluster_tokens_per_s(layout, self.job.seq_len, floor_s)

    def recomputing_tps(self, layout: Layout) -> float:
        """An upper bound on the cluster tokens/s of the recomputing layout as the search takes it, before the
        robust factor and goodput: its own; with full recomputation of no set layer count, at one layer (more never
        run faster, `fewest_recomputed`)."""
        layout = least_recomputed(layout)
        return cluster_tokens_per_s(layout, self.job.seq_len, self.times(layout).step_time_s)

    def recomputing_bound(self, layout: Layout, bound_tps: float | None = None) -> float:
        """An upper bound on the cluster tokens/s of the recomputing layout as ranked, whatever its layer count:
        `bound_tps` (an upper bound before the robust factor; default its `recomputing_tps`) x its robust factor
        (goodput only lowers it), raised by a hair for rounding."""
        tps = self.recomputing_tps(layout) if bound_tps is None else bound_tps
        return tps * self.factor(layout) * (1 + 1e-9)

    def outranked_by_twin(self, layout: Layout, twin_tps: float, bound_tps: float | None = None) -> bool:
        """Whether a feasible twin (`twin_key`) ranked at `twin_tps` (cluster tokens/s as ranked; -inf: none)
        surely ranks ahead of the recomputing layout: its `recomputing_bound` (from `bound_tps` when given; the
        robust factor is the twins' own) falls below. The twin rule then drops it unevaluated."""
        return twin_tps > -math.inf and self.recomputing_bound(layout, bound_tps) < twin_tps

    def factor(self, layout: Layout) -> float:
        """The layout's robust factor (1 unless the robust objective ranks)."""
        return self.robust.factor(layout) if self.robust is not None else 1.0

    def node_bound(self, first: LayoutGroup, most_dp_pp: int) -> float:
        """An upper bound on the cluster tokens/s of every layout of groups sharing tp, cp, micro-batch, ep and etp
        (`first` the first of them, `most_dp_pp` their largest dp x pp): a step is at least its micro-batches times
        the slowest stage, at least the average stage, which is the whole model's per-micro-batch time over pp
        (`whole_model_s`, EP overlap wherever asked): tokens/s <= micro-batch x sequence x dp x pp / that time."""
        cheapest = first.cheapest_variant()
        whole = whole_model_s(self.model, self.job, cheapest, self.gpu, self.links(cheapest), self.params, self._memo)
        return cheapest.micro_batch * self.job.seq_len * most_dp_pp / whole

    def family_bound(self, first: LayoutGroup, most_dp_pp: int) -> float:
        """An upper bound on the cluster tokens/s of every layout of groups sharing tp, cp and micro-batch, whatever
        their ep and etp (`first` the first of them, `most_dp_pp` their largest dp x pp): at least the `node_bound`
        of each of their nodes, the whole model's time there being at least `whole_model_floor_s` (the cheapest
        variant recomputes nothing, and its sequence parallelism follows from tp); raised by a hair for rounding."""
        cheapest = first.cheapest_variant()
        floor_s = whole_model_floor_s(self.model, self.job, cheapest, self.gpu, self.links(cheapest), self.params,
                                      self._memo)  # fmt: skip
        return cheapest.micro_batch * self.job.seq_len * most_dp_pp / floor_s * (1 + 1e-9)

    def pipeline_bound(self, group: LayoutGroup, node_tps: float, most_dp_pp: int) -> float:
        """An upper bound on the cluster tokens/s of every layout of the group, from its node's `node_bound`
        `node_tps` (at the node's largest dp x pp, `most_dp_pp`): that bound at the group's own dp x pp, times the
        share of its pipeline's m + (p - 1) / v slots of the slowest stage that run its m micro-batches (a step is at
        least those slots: `step_time`'s compute, exposed TP/CP/EP time and bubble), raised by a hair for rounding.
        It is at least `throughput_bound`, whose floor holds those slots and more, with the node's premise."""
        d = group.degrees
        m, p, v, dp = int(d["grad_accum"] or 1), int(d["pp"] or 1), int(d["vp"] or 1), int(d["dp"] or 1)
        return node_tps * dp * p / most_dp_pp * m / (m + (p - 1) / v) * (1 + 1e-9)

    def best_first(
        self, groups: Iterable[LayoutGroup] | SpaceNodes, capacity_bytes: float | None = None
    ) -> Iterator[tuple[float, LayoutGroup]]:
        """Groups in decreasing `throughput_bound`, each bound computed only once it can lead: the nodes sharing
        tp, cp and micro-batch (`FAMILY_AXES`; of an MoE model, nodes of several expert degrees) are bounded together
        first (`family_bound`), a node (`node_bound`) only once its family's bound leads, a node's groups by
        `pipeline_bound` only once the node's does (for a space in nodes, built only then), and a group by its own
        bound only once that leads. Each bound is at least what it stands for (a group's: the least of its own and
        its node's), and an entry keeps the index of what it stands for (a family its first node's), so the groups
        come in the order bounding every node and group first gives. `capacity_bytes`: see `throughput_bound`."""
        nodes: list[Any]
        members: Callable[[Any], list[LayoutGroup]]
        most: Callable[[int], int]  # the largest dp x pp of the groups of the node of that index
        if isinstance(groups, SpaceNodes):
            space = groups
            nodes, members, most = space.nodes, space.groups, space.most_dp_pp.__getitem__
            keys = [space.key(node) for node in nodes]

            def first(node: Any) -> LayoutGroup:
                return space.groups(node[:1])[0]
        else:
            by_key: dict[NodeKey, list[LayoutGroup]] = {}
            for g in groups:
                by_key.setdefault(node_key(g), []).append(g)
            nodes, members, keys = list(by_key.values()), list, list(by_key)

            def most(i: int) -> int:
                return max(int(g.degrees["dp"] or 1) * int(g.degrees["pp"] or 1) for g in nodes[i])

            def first(node: Any) -> LayoutGroup:
                return node[0]  # type: ignore[no-any-return]

        def node_entry(i: int) -> tuple[float, int, int, Any]:
            return -self.node_bound(first(nodes[i]), most(i)), i, _NODE, nodes[i]

        families: dict[NodeKey, list[int]] = {}
        for i, key in enumerate(keys):
            families.setdefault(key[: len(FAMILY_AXES)], []).append(i)
        # (-bound, index, what, entry): a group's index follows every node's
        heap: list[tuple[float, int, int, Any]] = []
        for family in families.values():
            if len(family) == 1:
                heap.append(node_entry(family[0]))
            else:
                bound = self.family_bound(first(nodes[family[0]]), max(most(i) for i in family))
                heap.append((-bound, family[0], _FAMILY, family))
        heapq.heapify(heap)
        count = len(nodes)
        while heap:
            priority, index, what, entry = heapq.heappop(heap)
            if what == _FAMILY:
                for i in entry:
                    heapq.heappush(heap, node_entry(i))
            elif what == _NODE:
                node_tps, node_most = -priority, most(index)
                for g in members(entry):
                    count += 1
                    bound = min(self.pipeline_bound(g, node_tps, node_most), node_tps)
                    heapq.heappush(heap, (-bound, count, _PIPELINE, (g, node_tps)))
            elif what == _PIPELINE:
                g, node_tps = entry
                heapq.heappush(heap, (-min(self.throughput_bound(g, capacity_bytes), node_tps), index, _GROUP, g))
            else:
                yield -priority, entry


_FAMILY, _NODE, _PIPELINE, _GROUP = range(4)  # what an entry of `CostTable.best_first`'s heap is: a family of
# nodes, a node, a group by its `pipeline_bound`, a group by its own bound


def _most_sharded(group: LayoutGroup) -> Sharding:
    """The group's sharding that divides the most training state (the last of `Sharding`'s order it allows)."""
    return max(group.shardings, key=_SHARDING_ORDER.__getitem__)


def _with_field(layout: Layout, name: str, value: object) -> Layout:
    """The layout with one field changed (the space's legality rules hold for the changes the walk makes: a
    sharding of the group, a recomputed layer count)."""
    values = layout.__dict__.copy()
    values[name] = value
    return Layout.unchecked_fields(values, set(LAYOUT_DEFAULTS))  # `Layout.unchecked(**values)`: every field set


def _with_recomputed_layers(layout: Layout, n: int) -> Layout:
    """The layout with full recomputation of `n` layers per model chunk."""
    return _with_field(layout, "recompute_layers", n)


def least_recomputed(layout: Layout) -> Layout:
    """The layout with the least recomputation the search may take for it: with full recomputation of no set layer
    count, one layer per model chunk; any other as it is."""
    if layout.recompute == Recompute.full and layout.recompute_layers is None:
        return _with_recomputed_layers(layout, 1)
    return layout


def peek(items: Iterable[tuple[float, LayoutGroup]]) -> tuple[float, Iterator[tuple[float, LayoutGroup]]]:
    """The first item's bound (0 when empty), and the items again."""
    it = iter(items)
    first = next(it, None)
    if first is None:
        return 0.0, iter(())
    return first[0], itertools.chain([first], it)


def variant_bound(lay: Layout, t: TimeBreakdown, seq_len: int) -> float:
    """An upper bound on the cluster tokens/s of every sharding of the layout's degrees, recomputation and
    sequence parallelism, from its step time `t`: the step of each is at least the layout's compute, exposed
    TP/CP/EP time, bubble, pipeline send/receive and fixed overhead (sharding changes none of them), plus its
    optimizer step when the layout is sharded (any sharding divides it alike, and no sharding takes less)."""
    floor_s = t.compute_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + t.bubble_s + t.pp_comm_s + t.overhead_s
    if lay.sharding != Sharding.none or lay.dp * lay.cp == 1:
        floor_s += t.optimizer_s
    return cluster_tokens_per_s(lay, seq_len, floor_s)


class _KthBest:
    """The k-th best cluster tokens/s over twin classes (`twin_key`; each at its best twin) found so far;
    -inf until k are found, or when there is no k (every layout is wanted)."""

    def __init__(self, k: int | None) -> None:
        self.k = k
        self.best: dict[tuple[object, ...], float] = {}
        self._value: float | None = -math.inf

    def add(self, identity: tuple[object, ...], tokens_per_s: float) -> None:
        if tokens_per_s > self.best.get(identity, -math.inf):
            self.best[identity] = tokens_per_s
            # a value at or below the k-th best leaves the top k as it was (its layout was not in it either)
            if self._value is not None and (tokens_per_s > self._value or len(self.best) <= (self.k or 0)):
                self._value = None

    def value(self) -> float:
        if self._value is None:
            top = heapq.nlargest(self.k, self.best.values()) if self.k is not None else []
            self._value = top[-1] if self.k is not None and len(top) >= self.k else -math.inf
        return self._value


@dataclass(frozen=True)
class Limits:
    """Constraints applied in the model (bounds beyond those of the enumerated space)."""

    memory_capacity_bytes: float
    min_global_batch: int | None = None
    max_global_batch: int | None = None
    max_bubble_fraction: float | None = None


def passes_limits(candidate: Candidate, limits: Limits) -> bool:
    """The model's constraints checked on one candidate, in the model's own integer units."""
    if memory_mib(candidate.evaluation.memory_per_gpu_bytes) > capacity_mib(limits.memory_capacity_bytes):
        return False
    gb = candidate.layout.global_batch
    if limits.min_global_batch is not None and gb < limits.min_global_batch:
        return False
    if limits.max_global_batch is not None and gb > limits.max_global_batch:
        return False
    bubble = limits.max_bubble_fraction
    return bubble is None or round(candidate.evaluation.bubble_fraction * 1e6) <= round(bubble * 1e6)


def top_k_skyline(candidates: list[Candidate], k: int, scale: float | None = None) -> list[Candidate]:
    """The candidates that can be in the top k: drop those that candidates of at least `k` twin classes
    (`twin_key`), or one twin of their own, beat on rank while needing no more memory, with the same global batch
    and no larger bubble. Whatever the memory capacity, batch bounds or bubble limit, such a candidate, whenever
    it is feasible itself, has a feasible better twin (the twin rule drops it) or k twin classes whose best
    feasible member beats it, so it is never in the top k: the reduction is exact for the top-k CP-SAT model
    (which keeps the memory and batch constraints). The argument holds for any rank the model and the oracle
    share, so also for goodput, which is folded into `cluster_tokens_per_s` before ranking."""
    scale = throughput_scale(candidates) if scale is None else scale
    kept: list[Candidate] = []
    by_batch: dict[int, list[tuple[int, float, tuple[object, ...]]]] = {}
    for cand in sorted(candidates, key=lambda c: rank_key(c, scale)):
        better = by_batch.setdefault(cand.layout.global_batch, [])
        mem = memory_mib(cand.evaluation.memory_per_gpu_bytes)
        bubble = cand.evaluation.bubble_fraction
        mine = twin_key(cand.layout)
        dominators: set[tuple[object, ...]] = set()
        for m, b, twins in better:
            if m <= mem and b <= bubble:
                dominators.add(twins)
                if len(dominators) >= k or twins == mine:
                    break
        if len(dominators) < k and mine not in dominators:
            kept.append(cand)
            # Only kept candidates need remembering: one dropped was beaten by kept ones of k twin classes, or a
            # kept twin, that also beat everything it beats (memory and bubble order are transitive).
            better.append((mem, bubble, mine))
    return kept
