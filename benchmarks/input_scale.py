"""Scale of what the validation boundary reads: wall time and peak memory (/usr/bin/time -v) of

- `topology show` on a 16,384-GPU topology in the explicit form (every GPU, NIC, NVSwitch, leaf, spine and link
  written out: 35,336 nodes and 53,248 links, made here), read with libyaml's loader and the pure-Python one;
- `compare --no-rank` on 20,000 run records (the published runs of ../shared/data repeated under new ids);
- `topology show` on the largest shorthand cluster accepted (2^20 GPUs).

    python benchmarks/input_scale.py            # print the table
    python benchmarks/input_scale.py --write    # and record it in RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import publish

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT.parent / "shared" / "data" / "calibration_runs.jsonl"


def explicit_topology(servers: int = 2048, gpus: int = 8, per_leaf: int = 32, spines: int = 8) -> str:
    """A rail-optimized cluster in the explicit form, the same graph the generator form would build."""
    nodes, edges = [], []
    pods = -(-servers // per_leaf)
    nodes += [f"  - {{id: leaf{p}-rail{r}, kind: leaf}}" for p in range(pods) for r in range(gpus)]
    nodes += [f"  - {{id: spine{j}, kind: spine}}" for j in range(spines)]
    for s in range(servers):
        name = f"s{s}"
        nodes.append(f"  - {{id: {name}/nvswitch, kind: nvswitch, server: {name}}}")
        for g in range(gpus):
            nodes.append(f"  - {{id: {name}/gpu{g}, kind: gpu, server: {name}}}")
            nodes.append(f"  - {{id: {name}/nic{g}, kind: nic, server: {name}, gbps: 400}}")
            edges.append(f"  - {{a: {name}/gpu{g}, b: {name}/nvswitch, gbytes_per_s: 450, latency_us: 0.5}}")
            edges.append(f"  - {{a: {name}/gpu{g}, b: {name}/nic{g}, gbps: 400, latency_us: 1}}")
            edges.append(f"  - {{a: {name}/nic{g}, b: leaf{s // per_leaf}-rail{g}, gbps: 400}}")
    uplink = per_leaf * 400 / spines
    edges += [f"  - {{a: leaf{p}-rail{r}, b: spine{j}, gbps: {uplink:g}}}"
              for p in range(pods) for r in range(gpus) for j in range(spines)]  # fmt: skip
    head = f"name: explicit-{servers * gpus}\ngpu: h100-sxm\n"
    return head + "nodes:\n" + "\n".join(nodes) + "\nedges:\n" + "\n".join(edges) + "\n"


def runs_file(path: Path, count: int) -> None:
    """`count` records: the published runs, repeated with fresh ids."""
    records = [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]
    with path.open("w") as out:
        for i in range(count):
            record = dict(records[i % len(records)])
            record["id"] = f"{record['id']}-{i}"
            out.write(json.dumps(record) + "\n")


def measure(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit status) of `optlayout ARGS` under /usr/bin/time -v."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "optlayout.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    assert wall and rss, proc.stderr[-2000:]
    seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return seconds, int(rss.group(1)) / 1024, proc.returncode


def pure_python_env(tmp: Path) -> dict[str, str]:
    """An environment in which `yaml.CSafeLoader` is missing, so optlayout falls back to the Python loader."""
    shim = tmp / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import yaml\ndel yaml.CSafeLoader\n")
    return dict(os.environ, PYTHONPATH=str(shim))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--runs", type=int, default=20_000)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        topo = tmp / "explicit-16384.yaml"
        topo.write_text(explicit_topology())
        size_mb = topo.stat().st_size / 1e6
        for label, env in (("libyaml (CSafeLoader)", None), ("pure-Python SafeLoader", pure_python_env(tmp))):
            wall, rss, code = measure(["topology", "show", str(topo), "--json"], env)
            rows.append((f"topology show, 16,384-GPU explicit file ({size_mb:.1f} MB), {label}", wall, rss, code))
        runs = tmp / "runs.jsonl"
        runs_file(runs, args.runs)
        wall, rss, code = measure(["compare", str(runs), "--no-rank", "--json"])
        label = f"compare --no-rank, {args.runs:,} run records ({runs.stat().st_size / 1e6:.1f} MB)"
        rows.append((label, wall, rss, code))
        wall, rss, code = measure(["topology", "show", "--cluster", "gpu=h100-sxm,gpus=1048576", "--json"])
        rows.append(("topology show, 2^20-GPU shorthand (the largest accepted)", wall, rss, code))
    lines = [
        f"Wall time and peak resident memory of the whole command (Python start included), {platform.machine()} "
        f"Python {platform.python_version()}, the 2-core VM shared with other work. "
        "Command: `python benchmarks/input_scale.py`.",
        "",
        "| input | exit | wall s | peak RSS MB |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {label} | {code} | {wall:.1f} | {rss:,.0f} |" for label, wall, rss, code in rows]
    publish("input_scale", "Input scale (issue 17)", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
