"""Shared test helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI explores the same examples every run (a red CI is then reproducible); local runs keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


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
