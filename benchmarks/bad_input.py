"""Bad-input corpus: hand-made cases for every class of issue 17 plus seeded mutants of the shipped files, run over
every command; counts tracebacks, NaN/Infinity outputs, hangs, memory blow-ups and messages that are not one line.

Each case runs `optlayout ARGS` through the console entry point in a forked child (imports done once, in the parent)
with a time limit and a 3 GiB address-space limit. The corpus and the runner are `tests/hostile.py`.

    python benchmarks/bad_input.py                 # 5,000+ inputs, print the table
    python benchmarks/bad_input.py --write         # and record it in RESULTS.md
    python benchmarks/bad_input.py --only hand     # the hand-made cases only, with every failure listed
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hostile
from _results import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=4200, help="seeded mutants (default 4200)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case before it counts as a hang")
    parser.add_argument("--only", choices=("hand", "mutants"), default=None)
    parser.add_argument("--show", type=int, default=8, help="failures listed per verdict")
    parser.add_argument("--write", action="store_true", help="record the table in RESULTS.md")
    args = parser.parse_args()

    hostile.preload()
    cases = [] if args.only == "mutants" else hostile.hand_made_cases()
    hand = len(cases)
    if args.only != "hand":
        cases += hostile.mutant_cases(args.mutants, args.seed)
    t0 = time.perf_counter()

    def progress(i: int, case: hostile.Case, outcome: hostile.Outcome) -> None:
        if outcome.failed:
            tail = (outcome.stderr.strip().splitlines() or [""])[-1][:160]
            print(f"[{i + 1}/{len(cases)}] {outcome.verdict}: {case.name[:100]} :: {tail}", file=sys.stderr)
        elif (i + 1) % 250 == 0:
            print(f"[{i + 1}/{len(cases)}] {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    tally = hostile.run_all(cases, args.timeout, progress)
    wall = time.perf_counter() - t0
    publish("bad_input", "Bad input (issue 17)", _table(tally, hand, args, wall), args.write)


def _table(tally: hostile.Tally, hand: int, args: argparse.Namespace, wall: float) -> str:
    verdicts = hostile.VERDICTS
    lines = [
        f"{tally.cases} inputs ({hand} hand-made, {tally.cases - hand} seeded mutants, seed {args.seed}), "
        f"{wall / 60:.1f} min on {platform.machine()} Python {platform.python_version()} (2-core VM), "
        f"{args.timeout:g} s per case, 3 GiB address space.",
        f"Command: `python benchmarks/bad_input.py --mutants {args.mutants} --seed {args.seed}`.",
        "",
        "| kind | " + " | ".join(verdicts) + " |",
        "|---|" + "---:|" * len(verdicts),
    ]
    for kind, row in sorted(tally.counts.items()):
        lines.append(f"| {kind} | " + " | ".join(str(row[v]) for v in verdicts) + " |")
    lines.append("| **all** | " + " | ".join(f"**{tally.total(v)}**" for v in verdicts) + " |")
    failures = [(v, name, tail) for v, items in tally.examples.items() for name, tail in items[: args.show]]
    if failures:
        lines += ["", "Failures (first of each verdict):", ""]
        lines += [f"- {v}: {name} :: `{tail}`" for v, name, tail in failures]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
