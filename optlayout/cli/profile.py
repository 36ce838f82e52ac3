"""`optlayout profile`: where a training step's time goes, from torch.profiler Chrome traces."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer
from rich.console import JustifyMethod
from rich.table import Table

from optlayout.cli.common import console, print_json
from optlayout.trace import ProfileReport, analyze


def register(app: typer.Typer) -> None:
    """Add the `profile` command to the app."""
    app.command("profile")(profile)


def profile(
    traces: list[Path] = typer.Argument(  # noqa: B008
        ..., metavar="TRACE", help="torch.profiler Chrome traces (.json or .json.gz), one per rank."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    top: int = typer.Option(10, "--top", help="How many operations to list."),
) -> None:
    """Top ops by self time, time by category, NCCL overlap, per-rank step times and a verdict."""
    report = analyze(traces, top=top)
    if json_out:
        print_json(report.to_json())
    else:
        _print(report)


def _print(report: ProfileReport) -> None:
    ops = Table(title=f"Top {len(report.top_ops)} operations by self time")
    for col, justify in (("operation", "left"), ("category", "left"), ("self ms", "right"), ("share", "right")):
        ops.add_column(col, justify=cast(JustifyMethod, justify))
    for o in report.top_ops:
        ops.add_row(o.name, o.category, f"{o.self_time_us / 1e3:.2f}", f"{o.share:.1%}")
    console.print(ops)

    cats = Table(title="Time by category")
    for col, justify in (("category", "left"), ("ms", "right"), ("share", "right")):
        cats.add_column(col, justify=cast(JustifyMethod, justify))
    for key, t in report.categories.items():
        cats.add_row(key, f"{t / 1e3:.2f}", f"{report.category_share(key):.1%}")
    console.print(cats)

    ov = report.overlap
    if ov.fraction is not None:
        console.print(
            f"Collective kernels: {ov.comm_time_us / 1e3:.2f} ms, hidden under compute {ov.hidden_us / 1e3:.2f} ms "
            f"({ov.fraction:.1%}), exposed {ov.exposed_us / 1e3:.2f} ms"
        )

    ranks = Table(title="Step time per rank")
    for col, justify in (("rank", "right"), ("step ms", "right"), ("vs median", "right"), ("from", "left")):
        ranks.add_column(col, justify=cast(JustifyMethod, justify))
    ranks.add_column("file", overflow="fold")
    for r in report.ranks:
        mark = " (slowest)" if r.slowest else ""
        source = f"{r.steps} x ProfilerStep" if r.steps else r.step_source
        ranks.add_row(str(r.rank), f"{r.step_time_us / 1e3:.2f}", f"{r.slowdown_vs_median:+.1%}{mark}", source, r.file)
    console.print(ranks)
    for line in report.verdict:
        console.print(f"- {line}", highlight=False)
