"""Phase timings: every phase of a solve is timed, the total is their sum, and none of it leaks into the
answer (the JSON, the saved plan and the report are the same run to run unless timings are asked for)."""

from __future__ import annotations

import json

import pytest

from optlayout.planning import solve
from optlayout.specs import JobSpec
from optlayout.timings import PHASES, PhaseClock, timings_json
from tests.conftest import run_main

ARGS = ("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
        "--global-batch", "64", "--top", "2")  # fmt: skip


def test_a_library_solve_times_its_phases() -> None:
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64), top=2)
    assert set(plan.phases_s) == set(PHASES)
    assert all(s >= 0 for s in plan.phases_s.values())
    assert plan.phases_s["cost_tables"] > 0 and plan.phases_s["cpsat"] > 0
    assert plan.total_time_s == pytest.approx(sum(plan.phases_s.values()))
    assert plan.cpsat_time_s == plan.phases_s["cpsat"]
    assert "phases_s" not in json.loads(plan.to_json())  # a saved plan is the answer only
    from optlayout.report import plan_report_html

    assert "s in all" not in plan_report_html(plan) and "s in all" in plan_report_html(plan, timings=True)


def test_the_json_is_the_same_run_to_run_without_timings(capsys, monkeypatch, tmp_path) -> None:
    outs, saved = [], []
    for i in range(2):
        path = tmp_path / f"plan{i}.json"
        code, out, _ = run_main(capsys, monkeypatch, *ARGS, "--json", "--save", str(path))
        assert code == 0
        outs.append(out)
        saved.append(path.read_text())
    assert outs[0] == outs[1] and saved[0] == saved[1]
    assert "time" not in json.loads(outs[0]) and "timings" not in json.loads(outs[0])


def test_timings_and_verbose_report_every_phase(capsys, monkeypatch) -> None:
    code, out, err = run_main(capsys, monkeypatch, *ARGS, "--json", "--timings", "--verbose")
    assert code == 0
    timings = json.loads(out)["timings"]
    assert list(timings["phases_s"]) == list(PHASES)
    assert all(s >= 0 for s in timings["phases_s"].values())
    assert timings["total_time_s"] == pytest.approx(sum(timings["phases_s"].values()), abs=1e-3)
    assert timings["total_time_s"] >= timings["cpsat_time_s"] > 0
    assert err.startswith("time: ") and "cost tables" in err and "cpsat" in err


def test_phase_clock_accumulates_and_refuses_unknown_phases() -> None:
    clock = PhaseClock()
    clock.add("cpsat", 0.25)
    clock.merge({"cpsat": 0.5, "parse": 1.0})
    assert clock.phases_s()["cpsat"] == 0.75 and clock.phases_s()["output"] == 0.0
    assert timings_json(clock.phases_s())["total_time_s"] == 1.75
    with pytest.raises(ValueError, match="unknown phase"):
        clock.add("thinking", 1.0)
