"""Compare measured runs with the cost model: error, rank of the measured layout, the solver's own pick.

One MFU definition throughout (ours, `optlayout.cost.flops`): measured and predicted MFU both come from
tokens/s/GPU, so sources that count FLOPs differently are compared on throughput, never on their MFU.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from optlayout.cost import CostParams
from optlayout.errors import OptlayoutError
from optlayout.layout.megatron_core import version_text
from optlayout.layout.stages import warmup_chunks
from optlayout.runs.predict import RunPrediction, predict_run, run_job
from optlayout.runs.records import RunRecord
from optlayout.solver.candidates import (
    THROUGHPUT_RESOLUTION,
    Candidate,
    best_twins,
    capacity_mib,
    cluster_tokens_per_s,
    layout_identity,
    least_recomputed,
    memory_mib,
    passes_limits,
    peek,
    rank_key,
    throughput_scale,
    twin_in_stead,
    twin_key,
    variant_bound,
)
from optlayout.solver.oracle import rank_problem
from optlayout.solver.problem import Problem
from optlayout.solver.space import LayoutGroup, SpaceOptions, enumerate_groups
from optlayout.specs import Layout, Recompute, Sharding
from optlayout.topology import topology_from_cluster

ParamsFor = Callable[[str, str], CostParams]


def group_label(record: RunRecord) -> str:
    c, j = record.cluster, record.job
    return f"{record.model.name} | {c.gpu} x {c.gpus} | seq {j.seq_len} | batch {j.global_batch} | {j.precision}"


def ranking_problem(record: RunRecord, params: CostParams) -> Problem:
    """The space a run's layout is ranked in: its model, cluster and job, the default search options kept to what
    the run's Megatron-Core release runs (`RunRecord.megatron_core`, as `solve --megatron-core`) where the record
    names one: a layout its stack could not run is no alternative the authors passed over."""
    options = SpaceOptions(megatron_core=record.megatron_core())
    return Problem(record.model, run_job(record), topology_from_cluster(record.cluster), params, options)


# sharding variants whose memory never rises along the tuple (the state is divided over more of its parts; the
# activations do not depend on sharding): FSDP's prefetch buffers take it out of the chain
_STATE_CHAIN = (Sharding.none, Sharding.zero1, Sharding.zero2)


@dataclass(frozen=True)
class GroupRanking:
    """What compare keeps of one group's full ranking (under the twin rule, `twin_key`): positions, the best
    layout, the throughputs, and the layout ranked for each twin class."""

    count: int
    position: dict[tuple[object, ...], int]
    best: tuple[Layout, float] | None
    descending_tps: list[float]
    twins: dict[tuple[object, ...], tuple[Layout, float]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, ranking: list[Candidate]) -> GroupRanking:
        position: dict[tuple[object, ...], int] = {}
        twins: dict[tuple[object, ...], tuple[Layout, float]] = {}
        for k, c in enumerate(ranking):
            position.setdefault(layout_identity(c.layout), k + 1)
            twins.setdefault(twin_key(c.layout), (c.layout, c.evaluation.tokens_per_s_per_gpu))
        best = (ranking[0].layout, ranking[0].evaluation.tokens_per_s_per_gpu) if ranking else None
        return cls(len(ranking), position, best, [c.evaluation.tokens_per_s_per_gpu for c in ranking], twins)

    @classmethod
    def bounded(cls, problem: Problem, floor_tokens_per_s: float) -> GroupRanking:
        """What `of(rank_problem(problem))` keeps for every layout at or above `floor_tokens_per_s` (cluster
        tokens/s), without the step time of the layouts that cannot reach it nor the best.

        The count is of every feasible twin class: per group, which (sharding, sequence parallelism) have a layout that
        fits (`_fitting_twins`), the exact memory only where the state alone fits and, along the sharding chain none,
        ZeRO-1, ZeRO-2 (memory never rises along it) and between variants `holds_no_less` orders, only to find where the
        first variant starts to fit, and for most groups not probed at all but inferred from the groups of smaller and
        larger micro-batches (`_fitting_twins_by_micro_batch`); the walk finds the fitting layouts of the groups it
        reaches (`_fitting_choices`). The groups with a feasible layout are taken best bound first
        (`CostTable.best_first`: a node's bound, then its groups' `throughput_bound`) and evaluated until a bound falls
        below both the floor and the best feasible layout found (less two objective units, the rank key's rounding). So
        the best, the count, and the position and throughput of every layout at or above the floor are exact; the
        positions below it are left out, and so are the throughputs of layouts below the floor. A layout is not
        evaluated once its `CostTable.recomputing_bound` (from its variant's step floor, then from its own step time,
        and with full recomputation again at the fewest layers that fit, `CostTable.fewest_recomputed`; its evaluation
        reuses the last) falls below both the floor and the best found, as a group's does, nor the rest of a variant
        once the `variant_bound` of one of its layouts (sharded first) does; under the twin rule a recomputing layout is
        not evaluated either once a feasible twin of less recomputation surely ranks ahead of it
        (`CostTable.outranked_by_twin`)."""
        table, limits = problem.table, problem.limits
        if limits.max_bubble_fraction is not None:  # a bubble limit needs the step time of every layout
            return cls.of(rank_problem(problem))
        topo = problem.topology
        walk_all = dataclasses.replace(problem.options, all_grad_accum=True)
        cap_bytes, cap_mib = limits.memory_capacity_bytes, capacity_mib(limits.memory_capacity_bytes)
        state_ok: dict[tuple[object, ...], bool] = {}

        # by the group's index in the space and the choice: the walk probes its groups again
        probed: dict[tuple[int, Choice], bool] = {}
        index: dict[int, int] = {}  # by id of the group: set before its first probe, and the walk keeps its own alive

        def fits(group: LayoutGroup, choice: Choice) -> bool:
            found = probed.get((index[id(group)], choice))
            if found is None:
                lay = group.layout(*choice)
                key = (lay.tp, lay.pp, lay.dp * lay.cp, lay.sharding, lay.ep, lay.etp)
                ok = state_ok.get(key)
                if ok is None:
                    ok = state_ok[key] = table.state_fits(lay, cap_bytes)
                found = probed[index[id(group)], choice] = ok and memory_mib(table.memory_bytes(lay)) <= cap_mib
            return found

        # distinct layouts under the twin rule, as twin_key tells them apart: by all but the accumulation (a degree
        # of the group) and recomputation
        feasible: set[tuple[object, ...]] = set()
        fitting_groups: list[LayoutGroup] = []
        guesses: dict[tuple[object, ...], int] = {}
        groups: list[LayoutGroup] = []
        for i, group in enumerate(enumerate_groups(problem.model, problem.job, topo.num_gpus, topo.domain_size,
                                                   walk_all)):  # fmt: skip
            if _batch_ok(group, limits.min_global_batch, limits.max_global_batch):
                index[id(group)] = i
                groups.append(group)
        # the count needs only which (sharding, sequence parallelism) have a fitting layout (`_fitting_twins`, most
        # groups' inferred from their neighbours in micro-batch: `_fitting_twins_by_micro_batch`); the walk below
        # finds the fitting choices of the groups it reaches
        for group, classes in zip(groups, _fitting_twins_by_micro_batch(groups, fits, guesses), strict=True):
            if classes:
                degrees = tuple(v for k, v in group.degrees.items() if k != "grad_accum")
                feasible.update((degrees, sharding, sp) for sharding, sp in classes)
                fitting_groups.append(group)
        # best bound first, a node's groups bounded only once the node leads (`CostTable.best_first`)
        first_bound, ordered = peek(table.best_first(fitting_groups, cap_bytes))
        margin = 2.0 * first_bound / THROUGHPUT_RESOLUTION  # the first bound is at least the best
        best = -math.inf
        evaluated: list[tuple[int, Candidate]] = []
        for bound, group in ordered:
            if bound < min(floor_tokens_per_s, best) - margin:
                break
            i, fitting = index[id(group)], _fitting_choices(group, fits, guesses)
            twin_best: dict[tuple[Sharding, bool], float] = {}  # the best feasible twin so far, less recomputed
            floors: dict[Variant, float] = {}  # per variant: its step floor's bound, the same for every sharding
            below_floor: set[Variant] = set()  # variants whose every sharding is surely below the floor and the best
            # recompute=none first (the twins' skips need it), in a variant the sharded layouts first (tighter bounds)
            for sharding, recompute, sp in sorted(
                fitting, key=lambda c: (_RECOMPUTES.index(c[1]), c[0] == Sharding.none)
            ):
                if (recompute, sp) in below_floor:
                    continue
                lay = group.layout(sharding, recompute, sp)
                twin_tps = twin_best.get((sharding, sp), -math.inf)
                # a layout surely below both the floor and the best so far (the stop rule's, of one layout), or a
                # recomputing one outranked by its twin (`CostTable.outranked_by_twin`), is not evaluated: first by
                # the looser bound of its variant's step floor (`recomputing_floor_tps`), then by its own step time
                # at its least recomputation (`recomputing_tps`), which its evaluation takes when it is the layout's
                below = max(twin_tps, min(floor_tokens_per_s, best) - margin)
                floor_tps = floors.get((recompute, sp))
                if floor_tps is None:
                    floor_tps = floors[recompute, sp] = table.recomputing_floor_tps(lay)
                if table.recomputing_bound(lay, floor_tps) < below:
                    continue
                least = least_recomputed(lay)
                times = table.times(least)
                if (
                    table.recomputing_bound(lay, cluster_tokens_per_s(least, problem.job.seq_len, times.step_time_s))
                    < below
                ):
                    continue
                # full recomputation of more layers than the least (the fewest that fit) is bounded again, by its own
                # step time, which its evaluation then reuses
                searched = table.fewest_recomputed(lay, cap_bytes)
                if searched.recompute_layers != least.recompute_layers:
                    times = table.times(searched)
                    searched_tps = cluster_tokens_per_s(searched, problem.job.seq_len, times.step_time_s)
                    if table.recomputing_bound(searched, searched_tps) < below:
                        continue
                cand = table.candidate(searched, times)
                if passes_limits(cand, limits):
                    evaluated.append((i, cand))
                    best = max(best, cand.cluster_tokens_per_s)
                    twin_best[sharding, sp] = max(twin_tps, cand.cluster_tokens_per_s)
                # the variant's other shardings rank no higher than its `variant_bound` (full recomputation's layer
                # count may differ between shardings: those are bounded one by one, above)
                if (
                    recompute != Recompute.full
                    and variant_bound(lay, cand.evaluation.times, problem.job.seq_len) * table.bound_factor
                    < min(floor_tokens_per_s, best) - margin
                ):
                    below_floor.add((recompute, sp))
        scale = throughput_scale([cand for _, cand in evaluated])
        # ties in the rank key go by the order of the space, as in the exhaustive ranking
        ranked = best_twins(cand for _, cand in sorted(evaluated, key=lambda ic: (rank_key(ic[1], scale), ic[0])))
        full = cls.of(ranked)
        kept = {
            ident: k for ident, k in full.position.items() if ranked[k - 1].cluster_tokens_per_s >= floor_tokens_per_s
        }
        above = [c for c in ranked if c.cluster_tokens_per_s >= floor_tokens_per_s]
        twins = {twin_key(c.layout): (c.layout, c.evaluation.tokens_per_s_per_gpu) for c in above}
        return cls(len(feasible), kept, full.best, [c.evaluation.tokens_per_s_per_gpu for c in above], twins)

    def rank_of(self, layout: Layout, tokens_per_s_per_gpu: float) -> int | None:
        """The layout's position; one outside the searched space, over memory or whose twin is ranked in its stead
        (`twin_ahead`) ranks by its throughput."""
        found = self.position.get(layout_identity(layout))
        if found is not None or not self.count:
            return found
        return 1 + sum(tps > tokens_per_s_per_gpu for tps in self.descending_tps)

    def twin_ahead(self, layout: Layout, tokens_per_s_per_gpu: float) -> Layout | None:
        """The layout's twin (`twin_key`) ranked in its stead at no lower throughput, when the layout itself is not
        ranked: the same layout but its recomputation, which the twin rule ranks instead."""
        return twin_in_stead(layout, tokens_per_s_per_gpu, self.twins.get(twin_key(layout)))


def _batch_ok(group: LayoutGroup, lo: int | None, hi: int | None) -> bool:
    """The group's global batch (the same for all its layouts) within the model's batch limits."""
    d = group.degrees
    batch = int(d["micro_batch"] or 1) * int(d["dp"] or 1) * int(d["grad_accum"] or 1)
    return (lo is None or batch >= lo) and (hi is None or batch <= hi)


Variant = tuple[Recompute, bool]  # (recomputation, sequence parallelism)
_RECOMPUTES = list(Recompute)
Choice = tuple[Sharding, Recompute, bool]  # what a layout of a group adds to its degrees


def holds_no_less(a: Variant, b: Variant) -> bool:
    """Whether variant `a` of a layout needs at least variant `b`'s memory, at every sharding and degrees: selective
    recomputation only drops the attention core's saved tensors (`attention_activation_bytes`), sequence
    parallelism only divides the replicated activations, the embedding output and full recomputation's kept
    inputs over tp, and the state does not depend on either; full recomputation keeps less per layer but re-runs a
    whole one, so it is compared only with itself."""
    (ra, sa), (rb, sb) = a, b
    return (ra == rb or (ra, rb) == (Recompute.none, Recompute.selective)) and (sb or not sa)


@functools.lru_cache(maxsize=64)
def _probe_plan(variants: tuple[Variant, ...]) -> tuple[tuple[Variant, tuple[int, ...], tuple[int, ...]], ...]:
    """The order the count probes a group's variants in: per recomputation class (full or not) its first variant
    (the most memory), its last (the least), then the others; with each, the earlier probes it holds no less than
    and those holding no less than it."""

    def position(v: Variant) -> tuple[bool, int]:
        kin = [w for w in variants if (w[0] == Recompute.full) == (v[0] == Recompute.full)]
        return v[0] == Recompute.full, 0 if v == kin[0] else 1 if v == kin[-1] else 2

    probes = sorted(variants, key=position)
    return tuple(
        (v, tuple(j for j, w in enumerate(probes[:i]) if holds_no_less(v, w)),
         tuple(j for j, w in enumerate(probes[:i]) if holds_no_less(w, v)))
        for i, v in enumerate(probes)
    )  # fmt: skip


def _first_fitting(
    fits: Callable[[LayoutGroup, Choice], bool],
    group: LayoutGroup,
    chain: tuple[Sharding, ...],
    variant: Variant,
    lo: int,
    hi: int,
    guess: int | None,
) -> int:
    """The index in [lo, hi) of the first sharding of `chain` where the group's `variant` fits, else `hi` (it fits
    from there on along the chain): by bisection, from `guess` where one is given (a right guess at either end
    takes one probe)."""
    if guess is not None and lo < hi:
        probe = min(max(guess, lo), hi - 1)
        if fits(group, (chain[probe], *variant)):
            hi = probe
        else:
            lo = probe + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(group, (chain[mid], *variant)):
            hi = mid
        else:
            lo = mid + 1
    return lo


@functools.lru_cache(maxsize=64)
def _chains(shardings: tuple[Sharding, ...]) -> tuple[tuple[Sharding, ...], ...]:
    """A group's shardings as chains along which memory never rises: `_STATE_CHAIN`, and FSDP alone."""
    return tuple(s for s in _STATE_CHAIN if s in shardings), *((s,) for s in shardings if s not in _STATE_CHAIN)


def _fitting_choices(
    group: LayoutGroup, fits: Callable[[LayoutGroup, Choice], bool], guesses: dict[tuple[object, ...], int]
) -> list[Choice]:
    """The (sharding, recomputation, sequence parallelism) of the group's layouts that fit. Along each of `_chains`
    a variant fits from its first fitting sharding on, found by bisection between the first fitting shardings of
    the variants probed before it that hold no less than it (it fits wherever they fit) and no more (it cannot fit
    before them), in `_probe_plan`'s order. `guesses` (shared by the groups of one space) keeps the last first
    fitting index of each probe, which is tried first: neighbouring groups mostly agree."""
    variants = tuple(group.variants())
    plan = _probe_plan(variants)
    chains = _chains(group.shardings)
    firsts: list[dict[Variant, int]] = []
    for c, chain in enumerate(chains):
        found: list[int] = []
        for p, (v, below, above) in enumerate(plan):
            lo = max([found[j] for j in below], default=0)  # it fits wherever v fits
            hi = min([found[j] for j in above], default=len(chain))
            key = (variants, c, len(chain), p)
            found.append(_first_fitting(fits, group, chain, v, lo, hi, guesses.get(key)))
            guesses[key] = found[-1]
        firsts.append({v: f for (v, _, _), f in zip(plan, found, strict=True)})
    return [(s, *v) for v in variants for chain, first in zip(chains, firsts, strict=True) for s in chain[first[v] :]]


@functools.lru_cache(maxsize=64)
def _twin_probes(
    recomputes: tuple[Recompute, ...], sequence_parallel: tuple[bool, ...]
) -> tuple[tuple[bool, tuple[Recompute, ...]], ...]:
    """What `_fitting_twins` probes: per sequence parallelism (without it first) the recomputations whose variant no
    other of the same sequence parallelism holds no more than (`holds_no_less`), full recomputation first (it mostly
    holds the least, and where it fits from the chain's start the others need no probe)."""
    variants = tuple(itertools.product(recomputes, sequence_parallel))
    kept = [v for v in variants if not any(w != v and w[1] == v[1] and holds_no_less(v, w) for w in variants)]
    first_full = sorted(kept, key=lambda v: v[0] != Recompute.full)
    return tuple((sp, tuple(r for r, s in first_full if s == sp)) for sp in sorted({sp for _, sp in kept}))


Twins = frozenset[tuple[Sharding, bool]]  # a group's (sharding, sequence parallelism) with a fitting layout


def _fitting_twins(
    group: LayoutGroup,
    fits: Callable[[LayoutGroup, Choice], bool],
    guesses: dict[tuple[object, ...], int],
    within: tuple[Twins, Twins] | None = None,
) -> Twins:
    """The (sharding, sequence parallelism) of the group with a fitting layout, those of `_fitting_choices`, from
    fewer probes: per chain (`_chains`) and sequence parallelism the first sharding where any recomputation fits,
    searched only below the first found so far; only the variants no other of the same sequence parallelism holds
    no more than (`holds_no_less`: where one fits, the other does; selective recomputation in place of none); and
    with sequence parallelism below the first without (the same recomputation with it holds no more). `within`:
    a superset and a subset of the answer (those of the same `micro_batch_family`'s groups of a smaller and a larger
    micro-batch, which hold no more and no less), which bound each first sharding from below and above."""
    twins: set[tuple[Sharding, bool]] = set()
    for c, chain in enumerate(_chains(group.shardings)):
        first = len(chain)
        for sp, recomputes in _twin_probes(group.recomputes, group.sequence_parallel):
            lo = 0
            if within is not None:  # none fits before the superset's first; some recomputation at the subset's
                superset, subset = within
                lo = next((k for k, s in enumerate(chain) if (s, sp) in superset), len(chain))
                first = min(first, next((k for k, s in enumerate(chain) if (s, sp) in subset), len(chain)))
            for recompute in recomputes:
                if lo >= first:
                    break
                key = ("twins", c, len(chain), recompute, sp)
                found = _first_fitting(fits, group, chain, (recompute, sp), lo, first, guesses.get(key))
                guesses[key] = found
                first = min(first, found)
            twins.update((s, sp) for s in chain[first:])
    return frozenset(twins)


def micro_batch_family(group: LayoutGroup) -> tuple[object, ...] | None:
    """What the group's layouts share with those of the groups of its space whose memory differs from theirs only
    through the micro-batch, and never falls as it grows; None where the accumulation moves memory too.

    Memory reads the micro-batch only through the tokens of one micro-batch (`seq_len * micro_batch / cp`), each
    activation term a product or sum of it with non-negative constants (and rounding to nearest is monotone, so in
    floating point too); the accumulation only through the micro-batches in flight, which stop growing once the
    first stage's warm-up is filled (`layout.stages.warmup_chunks`, `inflight_bytes`). Among groups of one family
    with that warm-up filled, a layout that fits at a micro-batch fits at every smaller one."""
    d = group.degrees
    pp, vp, grad_accum = int(d["pp"] or 1), int(d["vp"] or 1), int(d["grad_accum"] or 1)
    if grad_accum * vp < warmup_chunks(pp, vp):
        return None
    # the degrees decide the shardings and sequence parallelism a group allows; its space, the rest
    return tuple((k, v) for k, v in d.items() if k not in ("micro_batch", "grad_accum"))


def _fitting_twins_by_micro_batch(
    groups: list[LayoutGroup], fits: Callable[[LayoutGroup, Choice], bool], guesses: dict[tuple[object, ...], int]
) -> list[Twins]:
    """`_fitting_twins` of each group, from fewer probes: within a `micro_batch_family` the fitting (sharding,
    sequence parallelism) never grow with the micro-batch, so where the largest micro-batch's are all the group's,
    or where two micro-batches' agree, so do those between them; the others are found by bisection over the
    micro-batches, each bounded by its neighbours' (`_fitting_twins`' `within`)."""
    found: dict[int, Twins] = {}
    families: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        key = micro_batch_family(group)
        if key is None:
            found[i] = _fitting_twins(group, fits, guesses)
        else:
            families[key].append(i)

    for members in families.values():
        members.sort(key=lambda i: int(groups[i].degrees["micro_batch"] or 1))
        largest = groups[members[-1]]
        subset = found[members[-1]] = _fitting_twins(largest, fits, guesses)
        if len(members) == 1:
            continue
        everything = frozenset(itertools.product(largest.shardings, largest.sequence_parallel))
        found[members[0]] = subset if subset == everything else _fitting_twins(
            groups[members[0]], fits, guesses, (everything, subset))  # fmt: skip
        _between(members, 0, len(members) - 1, groups, fits, guesses, found)
    return [found[i] for i in range(len(groups))]


def _between(
    members: list[int],
    lo: int,
    hi: int,
    groups: list[LayoutGroup],
    fits: Callable[[LayoutGroup, Choice], bool],
    guesses: dict[tuple[object, ...], int],
    found: dict[int, Twins],
) -> None:
    """The twins of members[lo + 1 : hi] into `found`, those of members[lo] and members[hi] found
    (`_fitting_twins_by_micro_batch`'s bisection). A module function, not a closure that calls itself: such a
    closure holds itself through its own cell, a reference cycle that keeps the groups, `fits` and the cost table's
    memo behind it alive after the count until the cyclic garbage collector finds them."""
    if hi - lo < 2:
        return
    superset, subset = found[members[lo]], found[members[hi]]  # the smaller micro-batch's, the larger's
    if superset == subset:
        found.update((members[k], subset) for k in range(lo + 1, hi))
        return
    mid = (lo + hi) // 2
    found[members[mid]] = _fitting_twins(groups[members[mid]], fits, guesses, (superset, subset))
    _between(members, lo, mid, groups, fits, guesses, found)
    _between(members, mid, hi, groups, fits, guesses, found)


def compare_runs(
    records: list[RunRecord],
    params_for: ParamsFor,
    rank_layouts: bool = True,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The `optlayout compare --json` result: per-run rows and a summary.

    Runs sharing a model, cluster, job, Megatron-Core release and constants are one unit of work (their ranking is
    computed once); with `workers` > 1 (default: the CPUs this process may use) the units run in that many
    processes. The rows keep the records' order, every figure is the same whatever the number of workers, and a run that
    cannot be predicted raises the error of the first such run in the file."""
    params = [params_for(rec.cluster.gpu, rec.job.precision) for rec in records]
    members: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, rec in enumerate(records):
        members[(rec.group_key, rec.megatron_core(), params[i]) if rank_layouts else (i,)].append(i)  # one space
    units = [Unit(tuple(idx), [records[i] for i in idx], params[idx[0]], rank_layouts) for idx in members.values()]
    by_record: dict[int, tuple[dict[str, Any], RunPrediction]] = {}
    first_error: tuple[int, OptlayoutError] | None = None
    for result in _run_units(units, workers if workers is not None else available_cpus()):
        by_record.update(zip(result.indices, result.rows, strict=False))
        if result.error is not None and (first_error is None or result.error[0] < first_error[0]):
            first_error = result.error
        if progress:
            progress(len(by_record), len(records))
    if first_error is not None:
        raise first_error[1]
    rows = [by_record[i][0] for i in range(len(records))]
    preds = [by_record[i][1] for i in range(len(records))]
    return {"runs": rows, "summary": summarize(preds, rows)}


def available_cpus() -> int:
    """CPUs this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


@dataclass(frozen=True)
class Unit:
    """Runs (by index in the file) sharing a model, cluster, job and constants: one ranking for them all."""

    indices: tuple[int, ...]
    records: list[RunRecord]
    params: CostParams
    rank_layouts: bool


@dataclass(frozen=True)
class UnitResult:
    """The rows of a unit's runs, up to its first run that cannot be predicted (its index and error)."""

    indices: tuple[int, ...]
    rows: list[tuple[dict[str, Any], RunPrediction]]
    error: tuple[int, OptlayoutError] | None = None


def compare_unit(unit: Unit) -> UnitResult:
    """The unit's rows: its runs predicted in order, then one ranking for them all, bounded at the slowest
    prediction (an error of the ranking comes first, as the ranking is of every run of the unit)."""
    preds: list[RunPrediction] = []
    predict_error: OptlayoutError | None = None
    try:
        for rec in unit.records:
            preds.append(predict_run(rec, unit.params))
    except OptlayoutError as exc:
        predict_error = exc
    ranking = None
    if unit.rank_layouts:
        floor = min((p.prediction.tokens_per_s_per_gpu * p.layout.gpus for p in preds), default=-math.inf)
        try:
            ranking = GroupRanking.bounded(ranking_problem(unit.records[0], unit.params), floor)
        except OptlayoutError as exc:
            return UnitResult(unit.indices, [], (unit.indices[0], exc))
    rows = [_row(rec, pred, ranking) for rec, pred in zip(unit.records, preds, strict=False)]
    if predict_error is not None:
        return UnitResult(unit.indices, rows, (unit.indices[len(rows)], predict_error))
    return UnitResult(unit.indices, rows)


def _run_units(units: list[Unit], workers: int) -> Iterator[UnitResult]:
    """Each unit's result as it finishes: in this process, or in `workers` processes. After an error, units
    whose runs all come later in the file are not started (they cannot hold an earlier error)."""
    workers = min(workers, len(units))
    if workers <= 1:
        first_error: int | None = None
        for unit in units:  # in order of their first run
            if first_error is not None and unit.indices[0] > first_error:
                break
            result = compare_unit(unit)
            if result.error is not None:
                first_error = result.error[0] if first_error is None else min(first_error, result.error[0])
            yield result
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from optlayout.solver import cpsat  # noqa: F401  (loaded once, before the workers fork)

    # fork (where there is one) hands the workers the modules already loaded; the workers start at the first
    # submit, before the caller's progress bar starts a thread
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        futures = {pool.submit(compare_unit, unit): unit for unit in units}
        for future in as_completed(futures):
            if future.cancelled():
                continue
            result = future.result()
            if result.error is not None:
                for other, unit in futures.items():
                    if unit.indices[0] > result.error[0]:
                        other.cancel()
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _row(rec: RunRecord, pred: RunPrediction, ranking: GroupRanking | None) -> tuple[dict[str, Any], RunPrediction]:
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
        "notes": rec.notes(),
        "layout": pred.layout.model_dump(mode="json"),
        "predicted_fits_memory": pred.prediction.fits,
        "memory_model_miss": pred.memory_model_miss,
        "measured_layout_rank": None,
        "ranked_in_megatron_core": None,
        "twin_ahead": None,
        "legal_layouts": None,
        "solver_pick": None,
        "solver_predicted_gain": None,
    }
    if ranking is not None:
        row["legal_layouts"] = ranking.count
        release = rec.megatron_core()
        row["ranked_in_megatron_core"] = version_text(release) if release is not None else None
        row["measured_layout_rank"] = ranking.rank_of(pred.layout, pred.prediction.tokens_per_s_per_gpu)
        twin = ranking.twin_ahead(pred.layout, pred.prediction.tokens_per_s_per_gpu)
        row["twin_ahead"] = twin.model_dump(mode="json") if twin is not None else None
        if ranking.best is not None:
            best_layout, best_tps = ranking.best
            row["solver_pick"] = best_layout.model_dump(mode="json")
            row["solver_predicted_gain"] = best_tps / pred.prediction.tokens_per_s_per_gpu - 1
    return row, pred


def pairwise_order(preds: list[RunPrediction]) -> tuple[float | None, int]:
    """Fraction of run pairs within a group (same model, cluster, job; different layout) whose measured
    order the prediction reproduces; pairs with equal measured throughput are skipped, and so are pairs whose FP8
    recipes differ (the recipe is part of the job, but the step time prices every recipe alike, so the group key
    that shares a ranking across runs leaves it out; the memory differs by the saved FP8 inputs' scale bytes)."""
    groups: dict[tuple[object, ...], list[RunPrediction]] = defaultdict(list)
    for p in preds:
        groups[p.record.group_key].append(p)
    agree = total = 0
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            dm = a.record.measured.tokens_per_s_per_gpu - b.record.measured.tokens_per_s_per_gpu
            if dm == 0 or a.record.job.fp8_recipe != b.record.job.fp8_recipe:
                continue
            if layout_identity(a.layout) == layout_identity(b.layout):
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
