"""Recipe agreement: the bounded walk ranks a published layout exactly where `compare`'s exhaustive oracle does."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlayout.cost import DEFAULT_PARAMS
from optlayout.runs.agreement import recipe_agreement
from optlayout.runs.compare import compare_runs
from optlayout.runs.records import read_runs

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
