"""The README's promises: its launcher script runs as written, and its quick-start commands exist."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests.conftest import ROOT, require


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
    # torchrun's own parser: a static rendezvous over 32 nodes needs rank 0's address (its default is each node's own)
    run = require("torch.distributed.run", "pip install '.[torch]'")
    line = next(x for x in out.stdout.splitlines() if x.startswith("torchrun "))
    tokens = shlex.split(line.replace("$SLURM_NODEID", "3").replace("$MASTER_ADDR", "node0"))[1:]
    parsed = run.get_args_parser().parse_args(tokens)
    assert (parsed.nnodes, parsed.rdzv_backend, parsed.node_rank) == ("32", "static", 3)
    assert parsed.master_addr == "node0" and parsed.training_script == "pretrain_gpt.py"
    args = (tmp_path / "megatron_args.txt").read_text()
    assert "--tensor-model-parallel-size" in args and "--use-distributed-optimizer" in args
    assert (tmp_path / "plan.json").exists()


def test_readme_main_command_is_the_solve_on_a_shipped_topology(cli) -> None:
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if x.startswith("pip install . && "))
    args = line.removeprefix("pip install . && optlayout ").split()
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "optimal" in out.stdout


def test_readme_says_what_the_megatron_emitter_writes_for_gpt_oss() -> None:
    """Each flag the README names for GPT-OSS's sliding windows and sinks is in the emitted flags or the launch
    line (before, the README said they were not emitted, while the emitter wrote them)."""
    from optlayout.emit import emit, emit_notes
    from optlayout.layout import parse_layout
    from optlayout.presets import model_preset
    from optlayout.specs import JobSpec

    text = " ".join((ROOT / "README.md").read_text().split())
    assert "sliding-window attention (GPT-OSS) is not emitted" not in text
    claim = re.search(r"GPT-OSS's sliding windows and sinks are emitted [^(]*\((.*?)\)\.", text)
    assert claim is not None
    named = re.findall(r"`(--[a-z-]+)(?: ([^`]+))?`", claim.group(1))
    assert [flag for flag, _ in named] == ["--window-size", "--window-attn-skip-freq", "--softmax-type"]
    args = (model_preset("gpt-oss-20b"), JobSpec(seq_len=8192, global_batch=8),
            parse_layout("tp=1,pp=1,dp=8,ep=8,mb=1,ga=1,sharding=zero1"))  # fmt: skip
    written = " ".join([emit("megatron", *args), *emit_notes("megatron", *args)]).split()
    for flag, value in named:
        assert flag in written, flag
        if value:
            assert written[written.index(flag) + 1] == value, (flag, value)
