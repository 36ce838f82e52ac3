"""Recipe agreement: the bounded walk ranks a published layout exactly where `compare`'s exhaustive oracle does."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest

from optlayout.cost import DEFAULT_PARAMS
from optlayout.presets import model_preset
from optlayout.runs.agreement import recipe_agreement
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.runs.compare import (
    _STATE_CHAIN,
    GroupRanking,
    _fitting_choices,
    _fitting_twins,
    _fitting_twins_by_micro_batch,
    compare_runs,
    holds_no_less,
    micro_batch_family,
    ranking_problem,
)
from optlayout.runs.predict import predict_run, run_job
from optlayout.runs.records import read_runs
from optlayout.runs.uncertainty import LayoutUncertainty
from optlayout.solver.candidates import CostTable, layout_identity, memory_mib
from optlayout.solver.oracle import rank_problem
from optlayout.solver.space import SpaceOptions, enumerate_groups
from optlayout.specs import ClusterSpec, JobSpec, Recompute
from optlayout.topology import topology_from_cluster

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
# every fixture run, and one over memory (ranked by its throughput, as `compare` ranks it)
RUNS = read_runs(FIXTURES / "runs.jsonl") + read_runs(FIXTURES / "over_memory.jsonl")[:1]


@pytest.mark.parametrize("record", RUNS, ids=[r.id for r in RUNS])
def test_rank_and_gain_equal_the_oracle(record) -> None:
    row = compare_runs([record], lambda _g, _p: DEFAULT_PARAMS)["runs"][0]
    agreement = recipe_agreement(record, DEFAULT_PARAMS)
    assert agreement.rank == row["measured_layout_rank"]
    assert agreement.claimed_gain == pytest.approx(row["solver_predicted_gain"], rel=1e-12, abs=1e-12)
    assert agreement.best.layout.model_dump(mode="json") == row["solver_pick"]


def test_a_capped_walk_says_beyond_and_keeps_the_pick() -> None:
    record = next(r for r in RUNS if r.id == "dgxc-v24.11.1-nemotron415b-bf16-16g-35a9aec")
    exact = recipe_agreement(record, DEFAULT_PARAMS)
    assert exact.rank > 20 and not exact.beyond
    capped = recipe_agreement(record, DEFAULT_PARAMS, max_rank=20)
    assert capped.beyond and capped.rank == 21
    assert capped.best.layout == exact.best.layout and capped.claimed_gain == exact.claimed_gain
    assert recipe_agreement(record, DEFAULT_PARAMS, max_rank=exact.rank).rank == exact.rank  # not beyond


@pytest.mark.parametrize("record", RUNS, ids=[r.id for r in RUNS])
def test_the_layouts_ahead_are_the_oracles(record) -> None:
    """The gains of the layouts ranked ahead of the published one are those of the exhaustive oracle's ranking above
    its rank, best first; the near ties count the ones within a gain (here 1% and 2%, counted from that ranking)."""
    ranking = GroupRanking.of(rank_problem(ranking_problem(record, DEFAULT_PARAMS)))
    published = predict_run(record, DEFAULT_PARAMS).prediction.tokens_per_s_per_gpu
    agreement = recipe_agreement(record, DEFAULT_PARAMS)
    expected = [tps / published - 1 for tps in ranking.descending_tps[: agreement.rank - 1]]
    assert len(agreement.ahead_gains) == agreement.rank - 1
    assert list(agreement.ahead_gains) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    for within in (0.01, 0.02):
        assert agreement.ahead_within(within) == sum(g <= within for g in expected)
    if agreement.rank > 1:
        assert agreement.ahead_gains[0] == pytest.approx(agreement.claimed_gain, rel=1e-12)


@pytest.mark.parametrize("record", RUNS[:6], ids=[r.id for r in RUNS[:6]])
def test_the_bounded_ranking_keeps_what_the_exhaustive_one_says_at_or_above_its_floor(record) -> None:
    problem = ranking_problem(record, DEFAULT_PARAMS)
    full = GroupRanking.of(rank_problem(problem))
    predicted = predict_run(record, DEFAULT_PARAMS)
    run_floor = predicted.prediction.tokens_per_s_per_gpu * predicted.layout.gpus
    gpus = problem.topology.num_gpus
    floors = [-math.inf, run_floor, run_floor * 1.5, (full.best[1] if full.best else 0.0) * gpus * 2.0]
    for floor in floors:
        bounded = GroupRanking.bounded(ranking_problem(record, DEFAULT_PARAMS), floor)
        assert (bounded.count, bounded.best) == (full.count, full.best)
        assert bounded.descending_tps == [tps for tps in full.descending_tps if tps * gpus >= floor]
        assert bounded.position == {
            ident: k for ident, k in full.position.items() if full.descending_tps[k - 1] * gpus >= floor
        }
        if floor <= run_floor:  # what compare asks: the run's own rank, with the floor at its prediction
            tps = predicted.prediction.tokens_per_s_per_gpu
            assert bounded.rank_of(predicted.layout, tps) == full.rank_of(predicted.layout, tps)


@pytest.mark.parametrize("record", RUNS[:4], ids=[r.id for r in RUNS[:4]])
def test_the_robust_rank_equals_the_oracles_under_the_robust_objective(record) -> None:
    """Ranked by the conservative throughput (`solve --robust`), the bounded walk still finds the oracle's rank and
    pick: the walk's bounds are scaled by the table's `bound_factor`."""
    uncertainty = load_calibration(shipped_calibration_path()).uncertainty
    job = run_job(record)
    robust = LayoutUncertainty.on(uncertainty, record.model, job, record.cluster.gpu)
    ranking = rank_problem(dataclasses.replace(ranking_problem(record, DEFAULT_PARAMS), robust=robust))
    published = predict_run(record, DEFAULT_PARAMS)
    target = published.prediction.tokens_per_s_per_gpu * published.layout.gpus * robust.factor(published.layout)
    identities = [layout_identity(c.layout) for c in ranking]
    mine = layout_identity(published.layout)
    rank = (
        identities.index(mine) + 1 if mine in identities else 1 + sum(c.cluster_tokens_per_s > target for c in ranking)
    )
    agreement = recipe_agreement(record, DEFAULT_PARAMS, robust=uncertainty)
    assert agreement.rank == rank
    assert agreement.best.layout == ranking[0].layout


@pytest.mark.parametrize(
    ("model", "gpus", "job"),
    [
        ("llama3.1-8b", 16, JobSpec(seq_len=4096, global_batch=64)),
        ("llama3.1-8b", 8, JobSpec(seq_len=2048, global_batch=32, attention_kernel="naive", dropout=True)),
        ("qwen3-30b-a3b", 16, JobSpec(seq_len=4096, global_batch=64, precision="fp8")),
    ],
)
def test_the_counts_memory_order_holds_for_every_layout(model, gpus, job) -> None:
    """What the count's bisection takes for granted, checked on whole spaces: memory never rises along the sharding
    chain none, ZeRO-1, ZeRO-2, nor from a variant to one `holds_no_less` puts below it."""
    spec = model_preset(model)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=gpus))
    table = CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS)
    pairs = 0
    for group in enumerate_groups(spec, job, gpus, topo.domain_size, SpaceOptions(all_grad_accum=True)):
        mib = {(s, *v): memory_mib(table.memory_bytes(group.layout(s, *v))) for s in group.shardings
               for v in group.variants()}  # fmt: skip
        for (s, *v), m in mib.items():
            chain = [c for c in _STATE_CHAIN if c in group.shardings]
            if s in chain:
                assert all(mib[(c, *v)] <= m for c in chain[chain.index(s) :])
            for w in group.variants():
                if w != tuple(v) and holds_no_less(tuple(v), w):
                    pairs += 1
                    assert mib[(s, *w)] <= m, (group.layout(s, *v).short(), w)
    assert pairs > 1000


@pytest.mark.parametrize("capacity_gib", [12, 16, 24])
def test_the_counts_probes_find_every_fitting_layout(capacity_gib) -> None:
    """`_fitting_choices` (the walk's) and `_fitting_twins` (the count's) give what testing every layout of the space
    against the capacity gives, with the guesses shared across the groups as the count shares them."""
    spec = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=4096, global_batch=64)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16))
    table = CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS)
    cap_mib = capacity_gib * 1024

    def fits(group, choice) -> bool:
        return memory_mib(table.memory_bytes(group.layout(*choice))) <= cap_mib

    choice_guesses: dict[tuple[object, ...], int] = {}
    twin_guesses: dict[tuple[object, ...], int] = {}
    seen = set()
    for group in enumerate_groups(spec, job, 16, topo.domain_size, SpaceOptions(all_grad_accum=True)):
        every = [(s, *v) for v in group.variants() for s in group.shardings if fits(group, (s, *v))]
        assert sorted(_fitting_choices(group, fits, choice_guesses)) == sorted(every)
        assert _fitting_twins(group, fits, twin_guesses) == {(s, sp) for s, _, sp in every}
        seen.add(bool(every))
    assert seen == {True, False}  # the capacity leaves some groups with no fitting layout, and some with one


FAMILY_SPACES = [
    ("llama3.1-8b", 16, JobSpec(seq_len=4096, global_batch=64)),
    ("llama3.1-8b", 8, JobSpec(seq_len=2048, global_batch=32, attention_kernel="naive", dropout=True)),
    ("llama3.1-70b", 16, JobSpec(seq_len=4096, min_global_batch=16, max_global_batch=32)),
    ("qwen3-30b-a3b", 16, JobSpec(seq_len=4096, global_batch=64, precision="fp8")),
]


def _families(spec, job, gpus, topo):
    groups = list(enumerate_groups(spec, job, gpus, topo.domain_size, SpaceOptions(all_grad_accum=True)))
    families: dict[tuple[object, ...], list] = {}
    for group in groups:
        key = micro_batch_family(group)
        if key is not None:
            families.setdefault(key, []).append(group)
    return groups, families


@pytest.mark.parametrize(("model", "gpus", "job"), FAMILY_SPACES)
def test_memory_never_falls_as_a_familys_micro_batch_grows(model, gpus, job) -> None:
    """What the count's inference over micro-batches takes for granted (`micro_batch_family`), checked on whole
    spaces, in bytes (not only in MiB): within a family, every layout holds no less at a larger micro-batch."""
    spec = model_preset(model)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=gpus))
    table = CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS)
    groups, families = _families(spec, job, gpus, topo)
    assert len(families) < len(groups)  # families of several micro-batches
    pairs = 0
    for members in families.values():
        members.sort(key=lambda g: g.degrees["micro_batch"])
        for small, large in itertools.pairwise(members):
            assert small.degrees["micro_batch"] <= large.degrees["micro_batch"]
            for s in small.shardings:
                for v in small.variants():
                    pairs += 1
                    assert table.memory_bytes(small.layout(s, *v)) <= table.memory_bytes(large.layout(s, *v))
    assert pairs > 500


@pytest.mark.parametrize(("model", "gpus", "job"), FAMILY_SPACES)
def test_the_count_inferred_over_micro_batches_is_every_layout_tested(model, gpus, job) -> None:
    """`_fitting_twins_by_micro_batch` (what the count takes) gives each group what testing its every layout against
    the capacity gives, though it probes fewer groups."""
    spec = model_preset(model)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=gpus))
    table = CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS)
    groups, _ = _families(spec, job, gpus, topo)
    mib: dict[tuple[int, tuple[object, ...]], int] = {}  # by group and choice, found once for every capacity
    partial = 0
    for capacity_gib in (16, 24, 40, 80):
        cap_mib = capacity_gib * 1024
        probed: set[int] = set()

        def fits(group, choice) -> bool:
            probed.add(id(group))  # noqa: B023
            key = (id(group), choice)
            if key not in mib:
                mib[key] = memory_mib(table.memory_bytes(group.layout(*choice)))
            return mib[key] <= cap_mib  # noqa: B023

        inferred = _fitting_twins_by_micro_batch(groups, fits, {})
        assert len(probed) < len(groups)
        for group, twins in zip(groups, inferred, strict=True):
            every = {(s, sp) for s in group.shardings for r, sp in group.variants() if fits(group, (s, r, sp))}
            assert twins == every, (capacity_gib, group.degrees)
            partial += 0 < len(every) < len(group.shardings) * len(group.sequence_parallel)
    assert partial  # the capacity splits some groups


@pytest.mark.parametrize(
    ("model", "gpus", "job"),
    [
        ("llama3.1-8b", 16, JobSpec(seq_len=4096, global_batch=64)),
        ("qwen3-30b-a3b", 16, JobSpec(seq_len=4096, global_batch=64, precision="fp8")),
    ],
)
def test_the_walks_step_floor_skip_never_skips_what_the_step_time_keeps(model, gpus, job) -> None:
    """The bounded walk first bounds a recomputing layout by its variant's step floor (`recomputing_floor_tps`, from
    whichever sharding it meets first) and only then by its own step time: the floor is the same for every sharding
    and never below the step time's bound, so the looser test skips only layouts the exact one skips."""
    spec = model_preset(model)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=gpus))
    table = CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS)
    checked = 0
    for group in enumerate_groups(spec, job, gpus, topo.domain_size, SpaceOptions(all_grad_accum=True)):
        for recompute, sp in group.variants():
            if recompute == Recompute.none:
                continue
            layouts = [group.layout(s, recompute, sp) for s in group.shardings]
            floors = {table.recomputing_floor_tps(lay) for lay in layouts}
            assert len(floors) == 1
            for lay in layouts:
                checked += 1
                assert table.recomputing_bound(lay, *floors) >= table.recomputing_bound(lay)
    assert checked > 1000


def test_an_evaluation_handed_its_step_time_is_the_evaluation() -> None:
    """The bounded walk hands `CostTable.candidate` the step time it bounded a layout with: the candidate is the
    one found without it, figure for figure (full recomputation at its fewest layers among them)."""
    spec = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=4096, global_batch=64)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16))
    table, alone = (CostTable(spec, job, topo.gpu, topo, DEFAULT_PARAMS) for _ in range(2))
    capacity = 40 * 2**30
    checked = 0
    for group in enumerate_groups(spec, job, 16, topo.domain_size, SpaceOptions(max_micro_batch=2, max_vp=2)):
        for lay in group.layouts():
            lay = table.fewest_recomputed(lay, capacity)
            handed = table.candidate(lay, table.times(lay))
            assert handed.evaluation == alone.candidate(lay).evaluation
            checked += 1
    assert checked > 500
