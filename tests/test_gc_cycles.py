"""What the cyclic garbage collector is left to do: `compare`'s count leaves no reference cycle holding its cost
table (so each group's memo is freed by reference count as its ranking returns, not by a later collection), and
the command process (`optlayout.cli.run`) freezes its objects as it ends (shutdown then runs no full collection
over them)."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

from optlayout.cost import DEFAULT_PARAMS
from optlayout.runs.compare import GroupRanking, ranking_problem
from optlayout.runs.records import read_runs
from tests.conftest import ROOT

RUNS = read_runs(Path(__file__).parent / "fixtures" / "runs" / "runs.jsonl")


def test_the_bounded_ranking_frees_its_cost_table_by_reference_count() -> None:
    # a record whose count bisects over micro-batches (the recursion that once held itself in a closure's cell)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for record in RUNS[:4]:
            problem = ranking_problem(record, DEFAULT_PARAMS)
            table = weakref.ref(problem.table)
            ranking = GroupRanking.bounded(problem, 0.0)
            assert ranking.count > 0
            del problem, ranking
            assert table() is None, f"{record.id}: the cost table outlives its ranking (a reference cycle holds it)"
    finally:
        if enabled:
            gc.enable()


_PROBE = """
import contextlib, gc, io, sys
sys.argv = ["optlayout", "checkpoint", "--mtbf-hours", "3.1", "--checkpoint-minutes", "5"]
from optlayout.cli import main, run
counts = [gc.get_freeze_count()]
for entry in (main, run):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            entry()
        except SystemExit:
            pass
    counts.append(gc.get_freeze_count())
print(*counts)
"""


def test_the_command_process_ends_with_its_objects_frozen_and_an_in_process_caller_does_not() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=ROOT, check=True)
    before, after_main, after_run = map(int, out.stdout.split()[-3:])
    assert before == after_main == 0  # `main` in process: the caller's collector as it was
    assert after_run > 1000  # the entry point: the imports' objects at least
