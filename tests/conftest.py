"""Shared test helpers."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

# CI explores the same examples every run (a red CI is then reproducible); local runs keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def require(module: str, why: str = "pip install '.[launchers]'") -> ModuleType:
    """Import a module a test needs; skip with the reason when it is missing, but fail under CI=true (CI installs
    every extra, so a missing module there is a broken install, never a silent skip)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"{module} is not importable ({exc}); {why}"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {message}", pytrace=False)
        pytest.skip(message)


def torchtitan_022_dir() -> str:
    """The directory `OPTLAYOUT_TORCHTITAN_022` names, where torchtitan 0.2.2 sits beside the extra's 0.3.0; skip
    saying how to install it when it is missing, but fail under CI=true (as `require`)."""
    target = os.environ.get("OPTLAYOUT_TORCHTITAN_022")
    if not target or not os.path.isdir(os.path.join(target, "torchtitan")):
        message = "OPTLAYOUT_TORCHTITAN_022 must name a `pip install --no-deps --target DIR torchtitan==0.2.2`"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {message}", pytrace=False)
        pytest.skip(message)
    return target


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point (`python -m optlayout.cli`) as a user would."""
    return subprocess.run([sys.executable, "-m", "optlayout.cli", *args], capture_output=True, text=True, cwd=ROOT)


def run_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """`optlayout ARGS` in-process, as the console script runs it: (exit status, stdout, stderr)."""
    from optlayout.cli import main

    monkeypatch.setattr(sys, "argv", ["optlayout", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli():
    return run_cli
