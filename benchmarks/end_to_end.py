"""End to end: what the user waits for, each command timed as a whole process against the floor.

Reproduce:  python benchmarks/end_to_end.py [--repeats 3] [--runs ../shared/data/calibration_runs.jsonl] [--write]
`--write` replaces the end-to-end and import sections of benchmarks/RESULTS.md.

The floor is a Python process that only imports the solver's dependencies (OR-Tools' cp_model, pydantic,
networkx). Every command runs as `python -m optlayout.cli ...`, a fresh process, interleaved with the floor
(floor, command, floor, command, ...) so both see the same machine; the ratio is of the medians, in wall time
and in CPU time (user + system of the child: steadier on a shared machine). All ratios come from one run.
`compare` (the 427 published runs, with ranking) runs once (`--runs` naming no file skips it). The import
section lists, per command, the libraries it loads and their import time (`python -X importtime`).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_RUNS = ROOT.parent / "shared" / "data" / "calibration_runs.jsonl"
FLOOR = [sys.executable, "-c", "import ortools.sat.python.cp_model, pydantic, networkx"]
CLI = [sys.executable, "-m", "optlayout.cli"]
JOB_405B = ["--model", "llama3.1-405b", "--seq-len", "8192", "--global-batch-tokens", str(16 * 1024 * 1024)]
JOB_DSV3 = ["--model", "deepseek-v3", "--seq-len", "4096", "--global-batch", "8192"]
SIZES = [2**k for k in range(3, 18)]  # 8 .. 131,072 GPUs
HEAVY = ("ortools", "networkx", "numpy", "scipy", "pydantic", "yaml", "typer", "rich", "matplotlib", "torch")


def cluster(gpus: int) -> list[str]:
    return ["--cluster", f"gpu=h100-sxm,gpus={gpus},gpus_per_node=8"]


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit status) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):  # 1: an infeasible solve, an answer too
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return wall, cpu, proc.returncode


def against_floor(cmd: list[str], repeats: int) -> dict[str, float]:
    """Medians of the command and the floor, run alternately."""
    runs: dict[str, list[float]] = {"wall": [], "cpu": [], "floor_wall": [], "floor_cpu": []}
    status = 0
    for _ in range(repeats):
        wall, cpu, _ = timed(FLOOR)
        runs["floor_wall"].append(wall)
        runs["floor_cpu"].append(cpu)
        wall, cpu, status = timed(cmd)
        runs["wall"].append(wall)
        runs["cpu"].append(cpu)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["status"] = status
    return out


def row(label: str, target: float, m: dict[str, float]) -> str:
    wall_ratio, cpu_ratio = m["wall"] / m["floor_wall"], m["cpu"] / m["floor_cpu"]
    verdict = "met" if wall_ratio <= target else "MISSED"
    exit_note = " (infeasible: exit 1)" if m["status"] == 1 else ""
    return (
        f"| {label}{exit_note} | {m['wall']:.2f} | {m['floor_wall']:.2f} | {wall_ratio:.2f}x | {m['cpu']:.2f} "
        f"| {m['floor_cpu']:.2f} | {cpu_ratio:.2f}x | <= {target:g}x | {verdict} |"
    )


def imports_of(args: list[str]) -> tuple[float, dict[str, float]]:
    """(total import s, import s of each heavy library loaded) of `optlayout ARGS` (`python -X importtime`).

    Python prints one line per module, after its children (indented one more level), so a package's own line
    covers its `__init__` only; a submodule imported later (`rich.console`, `ortools.sat.python.cp_model`) gets
    its own line. A library's time is the sum of the cumulative times of its outermost lines: those not nested
    in another line of the same library.
    """
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "optlayout.cli", *args], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)  # fmt: skip
    entries: list[tuple[int, str, int]] = []  # (depth, top-level package, cumulative us), in Python's order
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not cumulative.strip().isdigit():
            continue  # the header line
        depth = (len(name) - len(name.lstrip())) // 2
        entries.append((depth, name.strip().split(".")[0], int(cumulative)))
    total_us, heavy_us = 0, dict.fromkeys(HEAVY, 0)
    ancestors: list[tuple[int, str]] = []  # reversed, the order is parent first
    for depth, package, cumulative in reversed(entries):
        while ancestors and ancestors[-1][0] >= depth:
            ancestors.pop()
        if depth == 0:
            total_us += cumulative
        if package in heavy_us and all(outer != package for _, outer in ancestors):
            heavy_us[package] += cumulative
        ancestors.append((depth, package))
    return total_us / 1e6, {name: us / 1e6 for name, us in heavy_us.items() if us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="run records for the compare case")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    # The floor's libraries load from the bytecode their install wrote; optlayout's own modules get theirs here
    # (an editable checkout under PYTHONDONTWRITEBYTECODE=1 would compile them from source in every run).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "optlayout")], check=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"Machine: {platform.machine()}, {cpus} CPUs (load average {load:.1f} at the start), Python "
        f"{platform.python_version()}. Command: `python benchmarks/end_to_end.py --repeats {args.repeats}`. "
        "Medians of interleaved runs; the floor imports OR-Tools' cp_model, pydantic and networkx only; "
        "optlayout's bytecode compiled first, as an installed package has it.",
        "",
        "| command | wall s | floor wall s | wall ratio | CPU s | floor CPU s | CPU ratio | target | |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    cases: list[tuple[str, list[str], float]] = [
        ("`optlayout --help`", ["--help"], 0.8),
        ("solve 405B, 16,384 H100, top 10", ["solve", *JOB_405B, *cluster(16384), "--top", "10"], 2.0),
    ]
    cases += [(f"solve 405B, {g:,} GPUs, top 10", ["solve", *JOB_405B, *cluster(g), "--top", "10"], 2.0) for g in SIZES]
    cases.append(("solve DeepSeek-V3, 2,048 H100, top 10", ["solve", *JOB_DSV3, *cluster(2048), "--top", "10"], 2.0))
    for label, cmd_args, target in cases:
        lines.append(row(label, target, against_floor([*CLI, *cmd_args], args.repeats)))
        print(lines[-1], flush=True)
    if args.runs.exists():
        wall, cpu, _ = timed([*CLI, "compare", str(args.runs), "--json"])
        n = sum(1 for line in args.runs.read_text().splitlines() if line.strip())
        verdict = "met" if wall < 60 else "MISSED"
        lines += ["", f"`optlayout compare` with ranking over the {n} runs of `{args.runs.name}` on {cpus} CPUs: "
                  f"{wall:.1f} s wall, {cpu:.1f} s CPU (target: under 60 s wall: {verdict})."]  # fmt: skip
        print(lines[-1], flush=True)
    publish("end_to_end", "End to end against the floor", "\n".join(lines), args.write)

    imports = [
        "Command: `python -X importtime -m optlayout.cli ARGS` (import time as Python reports it, one run; "
        "the heavy libraries each command loads, with their cumulative import time).",
        "",
        "| command | import s | libraries loaded (import s) |",
        "|---|---:|---|",
    ]
    for label, cmd_args in (
        ("`--help`", ["--help"]),
        ("`mfu`", ["mfu", "--params", "7e9", "--tokens-per-s", "10000", "--gpu", "h100-sxm"]),
        ("`memory`", ["memory", "--params", "70e9", "--gpus", "256", "--tp", "8", "--pp", "4"]),
        ("`checkpoint`", ["checkpoint", "--mtbf-hours", "3.1", "--checkpoint-minutes", "5"]),
        ("`estimate` (70B, 64 GPUs)", ["estimate", "--model", "llama3.1-70b", *cluster(64), "--seq-len", "4096",
                                        "--global-batch", "512", "--layout", "tp=8,pp=2,dp=4,mb=1,ga=128"]),
        ("`solve` (405B, 16,384 GPUs)", ["solve", *JOB_405B, *cluster(16384), "--top", "10"]),
    ):  # fmt: skip
        total, heavy = imports_of(cmd_args)
        loaded = ", ".join(f"{name} {s:.2f}" for name, s in sorted(heavy.items(), key=lambda kv: -kv[1])) or "none"
        imports.append(f"| {label} | {total:.2f} | {loaded} |")
        print(imports[-1], flush=True)
    publish("imports", "What each command imports", "\n".join(imports), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
