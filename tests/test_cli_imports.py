"""What each command loads: a command imports only the libraries it uses (structural, not timed), and the
lazy command list of `optlayout --help` says what each command's own docstring says."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from optlayout.cli import COMMANDS, load_command
from tests.conftest import ROOT

HEAVY = ("scipy", "ortools", "networkx", "numpy", "matplotlib", "torch")
NO_SOLVER = ("scipy", "ortools", "matplotlib", "torch")

_PROBE = """
import contextlib, io, json, sys
sys.argv = ["optlayout", *json.loads(sys.argv[1])]
from optlayout.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}))
"""


def loaded_by(*args: str) -> tuple[int, set[str]]:
    """(exit status, top-level modules loaded) of `optlayout ARGS` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    return result["code"], set(result["modules"])


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        (("--help",), (*HEAVY, "yaml", "pydantic")),
        (("mfu", "--params", "7e9", "--tokens-per-s", "10000", "--gpu", "h100-sxm"), HEAVY),
        (("memory", "--params", "70e9", "--gpus", "256", "--tp", "8", "--pp", "4", "--sharding", "none"), HEAVY),
        (("checkpoint", "--mtbf-hours", "3.1", "--checkpoint-minutes", "5"), HEAVY),
        (("emit", "--format", "megatron", "--model", "llama3-70b", "--seq-len", "8192",
          "--layout", "tp=8,pp=4,vp=5,dp=2,mb=1,ga=16,sharding=zero1,recompute=selective,sp"), HEAVY),
        (("estimate", "--model", "llama3.1-70b", "--cluster", "gpu=h100-sxm,gpus=64", "--seq-len", "4096",
          "--global-batch", "512", "--layout", "tp=8,pp=2,dp=4,mb=1,ga=128"), NO_SOLVER),
        (("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=8", "--seq-len", "4096",
          "--global-batch", "64", "--top", "1"), ("scipy", "matplotlib", "torch")),
    ],
)  # fmt: skip
def test_a_command_imports_only_what_it_uses(args: tuple[str, ...], absent: tuple[str, ...]) -> None:
    code, modules = loaded_by(*args)
    assert code == 0
    assert not modules & set(absent), f"optlayout {args[0]} loaded {sorted(modules & set(absent))}"


SOLVE_8B = ("solve", "--model", "llama3.1-8b", "--seq-len", "4096", "--global-batch", "64", "--top", "1")


def test_a_solve_loads_the_solver_and_the_graph_only_where_it_needs_one() -> None:
    """The other side of the laziness: a solve loads OR-Tools; networkx only for a cluster read as a graph (an
    explicit-form file, a PCIe server), not for one whose tables come from its template (the shorthand, a
    generator-form NVSwitch file: `topology.regular`)."""
    for where, graph in (
        (("--cluster", "gpu=h100-sxm,gpus=8"), False),
        (("--topology", str(ROOT / "topologies" / "dgx-h100.yaml")), False),
        (("--topology", str(ROOT / "topologies" / "example-explicit.yaml")), True),
        (("--topology", str(ROOT / "topologies" / "pcie-a100-8x.yaml")), True),
    ):
        code, modules = loaded_by(*SOLVE_8B, *where)
        assert code == 0 and "ortools" in modules
        assert ("networkx" in modules) == graph, where


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_help_list_says_what_each_command_says(name: str) -> None:
    command = load_command(name)
    assert command.name == name
    assert (command.short_help or command.help) == COMMANDS[name][1]


def test_every_registered_command_is_listed() -> None:
    """A command a module registers but `COMMANDS` forgets would be unreachable."""
    import importlib

    import typer

    for module in sorted({m for m, _ in COMMANDS.values()}):
        app = typer.Typer()
        app.callback()(lambda: None)
        importlib.import_module(f"optlayout.cli.{module}").register(app)
        registered = typer.main.get_group(app).commands
        assert {n for n in registered} == {n for n, (m, _) in COMMANDS.items() if m == module}
