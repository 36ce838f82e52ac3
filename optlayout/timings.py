"""Where a command's time goes: wall-clock seconds by phase, kept apart from the answer.

A solve runs `PHASES` in order: parse (the command line, the model, the job and the calibration, and
loading the libraries the command needs: OR-Tools, networkx), topology (reading the cluster into its graph
and link tables), enumeration (walking the legal space), cost_tables (the cost model on the layouts
evaluated), reductions (the exact reductions around them: state and micro-batch bounds, branch and bound,
the top-K skyline), cpsat (building and solving the CP-SAT model, all top-K re-solves) and output (the
predictions of the layouts found, saving, reporting, rendering). Timings are not part of the answer: the
same input gives the same answer, but never the same timings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

PHASES = ("parse", "topology", "enumeration", "cost_tables", "reductions", "cpsat", "output")


class PhaseClock:
    """Accumulates wall-clock seconds per phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r} (known: {', '.join(PHASES)})")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def merge(self, other: Mapping[str, float]) -> None:
        for phase, seconds in other.items():
            self.add(phase, seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def phases_s(self) -> dict[str, float]:
        """Seconds by phase, in `PHASES` order, every phase present."""
        return {p: self.seconds.get(p, 0.0) for p in PHASES}


def timings_json(phases_s: Mapping[str, float]) -> dict[str, object]:
    """The `timings` object of the JSON output: the total, the CP-SAT part and every phase (4 decimals)."""
    return {
        "total_time_s": round(sum(phases_s.values()), 4),
        "cpsat_time_s": round(phases_s.get("cpsat", 0.0), 4),
        "phases_s": {p: round(phases_s.get(p, 0.0), 4) for p in PHASES},
    }


def timings_line(phases_s: Mapping[str, float]) -> str:
    """One line for `--verbose`: the total, then each phase."""
    parts = ", ".join(f"{p.replace('_', ' ')} {phases_s.get(p, 0.0):.3f}" for p in PHASES)
    return f"time: {sum(phases_s.values()):.3f} s in all ({parts} s)"
