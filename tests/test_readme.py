"""The README's promises: its launcher script runs as written, and its quick-start commands exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_launcher_script_runs(tmp_path) -> None:
    script = next(b for b in _python_blocks() if "launch_plan.py" in b)
    path = tmp_path / "launch_plan.py"
    path.write_text(script)
    topo = ROOT / "topologies" / "worked-example-256x80gb.yaml"
    env = os.environ | {"PYTHONPATH": str(ROOT)}  # the checkout under test, installed or not
    out = subprocess.run([sys.executable, str(path), str(topo)], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "torchrun --nnodes 32 --nproc-per-node 8" in out.stdout
    args = (tmp_path / "megatron_args.txt").read_text()
    assert "--tensor-model-parallel-size" in args and "--use-distributed-optimizer" in args
    assert (tmp_path / "plan.json").exists()


def test_readme_main_command_is_the_solve_on_a_shipped_topology(cli) -> None:
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if x.startswith("pip install . && "))
    args = line.removeprefix("pip install . && optlayout ").split()
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "optimal" in out.stdout
