"""The twin rule: of layouts identical but for their recomputation, only the best feasible one is ranked, alike in
the solver (its walk, skyline and CP-SAT top K), the oracle, compare and recipe agreement."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlayout.cost import DEFAULT_PARAMS, usable_memory_bytes
from optlayout.planning import solve
from optlayout.presets import model_preset
from optlayout.runs.agreement import recipe_agreement
from optlayout.runs.compare import compare_runs
from optlayout.runs.records import read_runs
from optlayout.runs.uncertainty import LayoutUncertainty
from optlayout.solver.candidates import (
    CostTable,
    Limits,
    layout_identity,
    passes_limits,
    rank_key,
    throughput_scale,
    top_k_skyline,
    twin_key,
)
from optlayout.solver.oracle import oracle_ranking
from optlayout.solver.space import SpaceOptions, enumerate_layouts, space_options
from optlayout.specs import ClusterSpec, JobSpec, Recompute
from optlayout.topology import topology_from_cluster
from tests.test_solver import ROBUST

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
# Llama 3.1 8B on one 8-GPU H100 server: recompute=none fits at its fastest layouts, and each has a full-recompute
# twin of one layer just behind it
MODEL = model_preset("llama3.1-8b")
JOB = JobSpec(seq_len=4096, global_batch=32)
TOPO = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=8))
LIMITS = Limits(usable_memory_bytes(TOPO.gpu.memory_bytes, JOB))


def _feasible(table: CostTable, options: SpaceOptions) -> list:
    """Every feasible layout of the space at every accumulation, as the cost model rates it (no rule applied)."""
    walk = SpaceOptions(**{**options.__dict__, "all_grad_accum": True})
    cands = [table.candidate(table.fewest_recomputed(lay, LIMITS.memory_capacity_bytes))
             for lay in enumerate_layouts(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, walk)]  # fmt: skip
    return [c for c in cands if passes_limits(c, LIMITS)]


def _per_layout(feasible: list) -> list:
    """The ranking before the twin rule: each distinct layout at its best accumulation, best first."""
    scale = throughput_scale(feasible)
    best: dict = {}
    for c in sorted(feasible, key=lambda c: rank_key(c, scale)):
        best.setdefault(layout_identity(c.layout), c)
    return list(best.values())


def test_the_twin_rule_takes_the_slower_twins_out_of_the_top_k() -> None:
    k = 8
    table = CostTable(MODEL, JOB, TOPO.gpu, TOPO)
    feasible = _feasible(table, SpaceOptions())
    before = _per_layout(feasible)[:k]
    crowded = [c for c in before if any(twin_key(o.layout) == twin_key(c.layout) and o is not c for o in before)]
    assert crowded, "the case must have twins in its top k without the rule"
    truth = oracle_ranking(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, table, SpaceOptions(), LIMITS)
    top = truth[:k]
    assert len({twin_key(c.layout) for c in top}) == k  # one layout per twin class
    for c in top:  # each is the fastest feasible of its twins, by the cost model's own figures
        twins = [o for o in feasible if twin_key(o.layout) == twin_key(c.layout)]
        assert c.cluster_tokens_per_s == max(o.cluster_tokens_per_s for o in twins)
    for c in crowded:  # a dropped twin: a faster twin is ranked, it is not
        if layout_identity(c.layout) not in {layout_identity(t.layout) for t in truth}:
            ranked = next(t for t in truth if twin_key(t.layout) == twin_key(c.layout))
            assert ranked.cluster_tokens_per_s > c.cluster_tokens_per_s
            assert ranked.layout.recompute == Recompute.none and c.layout.recompute != Recompute.none
    # each twin class of the crowded top k is ranked by its first (best) member there, in the same order; the
    # places its slower twins held go to layouts ranked below
    firsts: dict = {}
    for c in before:
        firsts.setdefault(twin_key(c.layout), c.layout)
    assert len(firsts) < k
    assert [c.layout for c in top[: len(firsts)]] == list(firsts.values())
    plan = solve(MODEL, TOPO, JOB, top=k)
    assert [p.layout for p in plan.layouts] == [c.layout for c in top]


@pytest.mark.parametrize("robust", [False, True])
def test_solver_equals_the_oracle_where_twins_abound(robust) -> None:
    """Top 12 on a space where most fast layouts have recomputing twins that fit, under the cost model's
    throughput and under the robust objective (the factor is the same across twins)."""
    ranked_by = LayoutUncertainty.on(ROBUST, MODEL, JOB, "h100-sxm") if robust else None
    table = CostTable(MODEL, JOB, TOPO.gpu, TOPO, robust=ranked_by)
    truth = oracle_ranking(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, table, SpaceOptions(), LIMITS)
    feasible = _feasible(table, SpaceOptions())
    assert sum(c.layout.recompute != Recompute.none for c in _per_layout(feasible)[:24]) >= 4
    plan = solve(MODEL, TOPO, JOB, top=12, uncertainty=ROBUST if robust else None, robust=robust)
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:12]]
    if robust:
        for c in feasible:  # the robust factor reads degrees and sharding only: the same for every twin
            none = c.layout.model_copy(update={"recompute": Recompute.none, "recompute_layers": None})
            assert ranked_by.factor(c.layout) == ranked_by.factor(none)


def test_the_skyline_keeps_the_top_k_under_the_twin_rule() -> None:
    table = CostTable(MODEL, JOB, TOPO.gpu, TOPO)
    feasible = _feasible(table, SpaceOptions())
    truth = oracle_ranking(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, table, SpaceOptions(), LIMITS)
    for k in (1, 3, 8):
        kept = {c.layout for c in top_k_skyline(feasible, k)}
        assert {c.layout for c in truth[:k]} <= kept
        assert len(kept) < len(feasible)


def test_a_pinned_recomputation_keeps_its_layouts() -> None:
    """Only twins of the searched space count: with recompute pinned to full, full-recompute layouts are ranked,
    though their recompute=none twins (outside the space) fit and are faster."""
    options = space_options({"recompute": "full"}, None, None)
    plan = solve(MODEL, TOPO, JOB, top=5, pins={"recompute": "full"})
    table = CostTable(MODEL, JOB, TOPO.gpu, TOPO)
    truth = oracle_ranking(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, table, options, LIMITS)
    assert len(plan.layouts) == 5
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:5]]
    assert all(p.layout.recompute == Recompute.full for p in plan.layouts)
    unpinned = solve(MODEL, TOPO, JOB, top=5)
    none_twins = {twin_key(p.layout) for p in unpinned.layouts if p.layout.recompute == Recompute.none}
    assert none_twins & {twin_key(p.layout) for p in plan.layouts}  # a pick the unpinned space ranks un-recomputed


def test_compare_and_recipe_agreement_rank_a_layout_whose_twin_is_faster_by_its_throughput() -> None:
    """A published layout with recomputation where its un-recomputed twin fits and is faster is not itself
    ranked: it ranks by its throughput among the ranked layouts, and compare and recipe agreement name the twin."""
    record = read_runs(FIXTURES / "runs.jsonl")[0]
    plain = compare_runs([record], lambda _g, _p: DEFAULT_PARAMS)["runs"][0]
    assert plain["twin_ahead"] is None
    found = None
    for recompute in (Recompute.selective, Recompute.full):
        twin = record.model_copy(update={"layout": record.layout.model_copy(update={"recompute": recompute})})
        row = compare_runs([twin], lambda _g, _p: DEFAULT_PARAMS)["runs"][0]
        if row["twin_ahead"] is not None:
            found = twin, row
            break
    assert found is not None, "the fixture run's recomputing twin must be outranked by a twin"
    twin, row = found
    assert row["predicted_tokens_per_s_per_gpu"] < plain["predicted_tokens_per_s_per_gpu"]
    assert row["measured_layout_rank"] > plain["measured_layout_rank"]
    agreement = recipe_agreement(twin, DEFAULT_PARAMS)
    assert agreement.rank == row["measured_layout_rank"]
    assert agreement.twin_ahead is not None and agreement.twin_ahead.model_dump(mode="json") == row["twin_ahead"]
    assert twin_key(agreement.twin_ahead) == twin_key(agreement.published.layout)


def test_explain_ranks_a_recomputing_twin_by_its_throughput_and_names_the_twin() -> None:
    from optlayout.planning import explain_layout

    best = solve(MODEL, TOPO, JOB, top=1).layouts[0].layout
    assert best.recompute == Recompute.none
    twin = best.model_copy(update={"recompute": Recompute.full, "recompute_layers": 1})
    report = explain_layout(MODEL, TOPO, JOB, twin)
    assert report["twin_ahead"] == best.short()
    table = CostTable(MODEL, JOB, TOPO.gpu, TOPO)
    truth = oracle_ranking(MODEL, JOB, TOPO.num_gpus, TOPO.domain_size, table, SpaceOptions(), LIMITS)
    mine = table.candidate(twin).cluster_tokens_per_s
    assert report["rank"] == 1 + sum(c.cluster_tokens_per_s > mine for c in truth) > 1
    assert explain_layout(MODEL, TOPO, JOB, best)["twin_ahead"] is None


def test_explain_names_no_twin_ahead_of_a_layout_over_memory() -> None:
    """The twin rule compares feasible twins: a layout over memory whose recomputing twin fits (and is slower) has
    no twin ranked in its stead, as compare's `GroupRanking.twin_ahead` says of it too."""
    from optlayout.planning import explain_layout
    from optlayout.runs.compare import GroupRanking

    job = JobSpec(seq_len=8192, global_batch=32)
    topo = topology_from_cluster(ClusterSpec(gpu="a100-40gb", gpus=8))
    limits = Limits(usable_memory_bytes(topo.gpu.memory_bytes, job))
    table = CostTable(MODEL, job, topo.gpu, topo)
    truth = oracle_ranking(MODEL, job, topo.num_gpus, topo.domain_size, table, SpaceOptions(), limits)
    twin = next(c for c in truth[:10] if c.layout.recompute == Recompute.full)
    over = twin.layout.model_copy(update={"recompute": Recompute.none, "recompute_layers": None})
    mine = table.candidate(over)
    assert not passes_limits(mine, limits)  # over memory: not feasible, so no twin rule applies
    assert mine.cluster_tokens_per_s > twin.cluster_tokens_per_s  # its fitting twin is slower
    report = explain_layout(MODEL, topo, job, over)
    assert not report["fits"] and report["rank"] is None
    assert GroupRanking.of(truth).twin_ahead(over, mine.evaluation.tokens_per_s_per_gpu) is None
    assert report["twin_ahead"] is None
