"""`optlayout checkpoint`: how often to checkpoint, what each failure costs, and the effective training time."""

from __future__ import annotations

import math
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from optlayout.cli.common import console, print_json
from optlayout.conditions import reliability as rel
from optlayout.errors import InputError

MIN = rel.SECONDS_PER_MINUTE
HOUR = rel.SECONDS_PER_HOUR
GB = 1e9

_MTBF_SOURCES = "--mtbf-hours, --failures/--days, or --gpu-failure-rate-per-hour/--gpu-mtbf-hours with --gpus"
_COST_SOURCES = "--checkpoint-minutes, or --state-bytes with --storage-gbytes-per-s"


def _positive(flag: str, value: float | None) -> float | None:
    """Check a flag's value is finite and > 0 (None passes: the flag was not given)."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise InputError(f"{flag} must be a finite number > 0, got {value:g}")
    return value


def _sig(x: float, digits: int = 6) -> float:
    """Round to `digits` significant digits for stable, readable JSON."""
    return float(f"{x:.{digits}g}")


def resolve_mtbf(
    mtbf_hours: float | None,
    failures: int | None,
    days: float | None,
    gpu_rate_per_hour: float | None,
    gpu_mtbf_hours: float | None,
    gpus: int | None,
) -> tuple[float, str]:
    """MTBF in seconds from exactly one of the three sources, and a line saying where it came from."""
    for flag, value in (
        ("--mtbf-hours", mtbf_hours),
        ("--failures", failures),
        ("--days", days),
        ("--gpu-failure-rate-per-hour", gpu_rate_per_hour),
        ("--gpu-mtbf-hours", gpu_mtbf_hours),
        ("--gpus", gpus),
    ):
        _positive(flag, value)
    given = [
        name
        for name, present in (
            ("--mtbf-hours", mtbf_hours is not None),
            ("--failures/--days", failures is not None or days is not None),
            ("--gpu-failure-rate-per-hour", gpu_rate_per_hour is not None),
            ("--gpu-mtbf-hours", gpu_mtbf_hours is not None),
        )
        if present
    ]
    if not given:
        raise InputError(f"no MTBF given: use one of {_MTBF_SOURCES}")
    if len(given) > 1:
        raise InputError(f"give one MTBF source, got {' and '.join(given)}")
    if mtbf_hours is not None:
        return mtbf_hours * HOUR, f"{mtbf_hours:g} h given"
    if failures is not None or days is not None:
        if failures is None or days is None:
            raise InputError("--failures and --days go together: failures observed over that many days")
        return rel.mtbf_from_failures_s(failures, days * rel.SECONDS_PER_DAY), f"{failures} failures / {days:g} days"
    if gpus is None:
        raise InputError("a per-GPU failure rate or MTBF needs --gpus (the job's GPU count)")
    if gpu_rate_per_hour is not None:
        mtbf_s = rel.cluster_mtbf_s(gpus, gpu_failure_rate_per_s=gpu_rate_per_hour / HOUR)
        return mtbf_s, f"{gpu_rate_per_hour:g} failures per GPU-hour x {gpus} GPUs"
    assert gpu_mtbf_hours is not None  # the only source left
    mtbf_s = rel.cluster_mtbf_s(gpus, gpu_mtbf_s=gpu_mtbf_hours * HOUR)
    return mtbf_s, f"per-GPU MTBF {gpu_mtbf_hours:g} h / {gpus} GPUs"


def resolve_cost(
    checkpoint_minutes: float | None,
    state_bytes: float | None,
    storage_GBps: float | None,
    per_node_GBps: float | None,
    nodes: int | None,
    asynchronous: bool,
    gpus: int | None,
    d2h_GBps: float,
) -> tuple[rel.CheckpointCost, str]:
    """Checkpoint cost given directly or derived from the state size and storage bandwidth."""
    for flag, value in (
        ("--checkpoint-minutes", checkpoint_minutes),
        ("--state-bytes", state_bytes),
        ("--storage-gbytes-per-s", storage_GBps),
        ("--per-node-gbytes-per-s", per_node_GBps),
        ("--nodes", nodes),
        ("--d2h-gbytes-per-s", d2h_GBps),
    ):
        _positive(flag, value)
    derived = [
        f for f, v in (("--state-bytes", state_bytes), ("--storage-gbytes-per-s", storage_GBps)) if v is not None
    ]
    extras = [f for f, v in (("--per-node-gbytes-per-s", per_node_GBps), ("--nodes", nodes)) if v is not None]
    if checkpoint_minutes is not None:
        if derived or extras or asynchronous:
            raise InputError(
                f"give one checkpoint cost: --checkpoint-minutes or {', '.join(derived + extras) or '--async'}"
            )
        c = checkpoint_minutes * MIN
        return rel.CheckpointCost(blocking_s=c, write_s=c, asynchronous=False), f"{checkpoint_minutes:g} min given"
    if not derived:
        raise InputError(f"no checkpoint cost given: use {_COST_SOURCES}")
    if state_bytes is None or storage_GBps is None:
        raise InputError("--state-bytes and --storage-gbytes-per-s go together")
    if len(extras) == 1:
        raise InputError("--per-node-gbytes-per-s and --nodes go together")
    if asynchronous and gpus is None:
        raise InputError("--async needs --gpus: each GPU copies its shard of the state to host memory")
    cost = rel.checkpoint_cost(
        state_bytes,
        storage_GBps * GB,
        per_node_Bps=None if per_node_GBps is None else per_node_GBps * GB,
        nodes=nodes,
        asynchronous=asynchronous,
        ranks=gpus,
        d2h_Bps=d2h_GBps * GB,
    )
    bw = rel.storage_bandwidth_Bps(storage_GBps * GB, None if per_node_GBps is None else per_node_GBps * GB, nodes)
    how = f"{state_bytes:.3g} B at {bw / GB:g} GB/s"
    if asynchronous and gpus is not None:
        how += f"; async: blocking copy {state_bytes / gpus / GB:.3g} GB/GPU at {d2h_GBps:g} GB/s"
    return cost, how


def _row(plan: rel.CheckpointPlan) -> dict[str, Any]:
    return {
        "checkpoint_minutes": _sig(plan.checkpoint_s / MIN),
        "interval_minutes": _sig(plan.interval_s / MIN),
        "lost_minutes_per_failure": _sig(plan.lost_per_failure_s / MIN),
        "effective_time_fraction": _sig(plan.effective_time_fraction),
        "model_holds": plan.model_holds,
    }


def _warning(plan: rel.CheckpointPlan) -> str | None:
    """Why the first-order figures are not to be read as an answer, or None when the model holds."""
    if plan.model_holds:
        return None
    why = (f"the interval {_dur(plan.interval_s / MIN)} is not shorter than the MTBF {_dur(plan.mtbf_s / MIN)}"
           if plan.interval_s >= plan.mtbf_s else "the checkpoint, restart and rework exceed the MTBF")  # fmt: skip
    return (f"Young's first-order model does not hold here ({why}; its effective time is clipped at "
            f"{plan.effective_time_fraction:.1%}): use --method daly, the renewal model")  # fmt: skip


def checkpoint_report(
    mtbf_s: float,
    cost: rel.CheckpointCost,
    restart_s: float,
    method: str,
    mtbf_source: str = "",
    cost_source: str = "",
) -> dict[str, Any]:
    """The command's JSON payload (minutes and hours at this edge; the library works in seconds)."""
    lag, how = cost.durability_lag_s, cast(rel.Method, method)
    plan = rel.plan_checkpointing(mtbf_s, cost.blocking_s, restart_s, how, lag)
    table = rel.checkpoint_cost_table(mtbf_s, rel.table_costs_s(cost.blocking_s), restart_s, how, lag)
    model = (
        "first-order (Young 1974): lost per failure = interval/2 + restart; fraction = 1 - C/interval - lost/MTBF"
        if method == "young"
        else "renewal, Poisson failures (Daly 2006): fraction = interval / (M e^{R/M} (e^{(interval+C)/M} - 1))"
    )
    if cost.asynchronous:
        model += "; async: the background write adds its duration to the loss per failure"
    return {
        "method": method,
        "model": model,
        "mtbf_hours": _sig(mtbf_s / HOUR),
        "mtbf_source": mtbf_source,
        "checkpoint_minutes": _sig(cost.blocking_s / MIN),
        "checkpoint_source": cost_source,
        "write_minutes": _sig(cost.write_s / MIN),
        "asynchronous": cost.asynchronous,
        "restart_minutes": _sig(restart_s / MIN),
        "interval_minutes": _sig(plan.interval_s / MIN),
        "interval_raised_to_write": plan.interval_raised_to_lag,
        "lost_minutes_per_failure": _sig(plan.lost_per_failure_s / MIN),
        "effective_time_fraction": _sig(plan.effective_time_fraction),
        "model_holds": plan.model_holds,
        "warning": _warning(plan),
        "failures_per_day": _sig(rel.SECONDS_PER_DAY / mtbf_s),
        "table": [{**_row(p), "current": math.isclose(p.checkpoint_s, cost.blocking_s, rel_tol=1e-12)} for p in table],
    }


def _dur(minutes: float) -> str:
    """A duration for people: seconds under a minute, else minutes."""
    return f"{minutes * 60:.3g} s" if minutes < 1 else f"{minutes:.3g} min"


def _print_rich(report: dict[str, Any]) -> None:
    summary = Table(title=f"checkpoint plan ({report['method']})", show_header=False)
    summary.add_column("quantity", style="bold")
    summary.add_column("value", justify="right")
    summary.add_column("note")
    summary.add_row("MTBF", f"{report['mtbf_hours']:.3g} h", report["mtbf_source"])
    summary.add_row("failures per day", f"{report['failures_per_day']:.3g}", "")
    ckpt_note = report["checkpoint_source"]
    if report["asynchronous"]:
        ckpt_note += f"; background write {_dur(report['write_minutes'])}"
    summary.add_row("checkpoint (blocking)", _dur(report["checkpoint_minutes"]), ckpt_note)
    summary.add_row("restart", _dur(report["restart_minutes"]), "")
    interval_note = "raised to the background write time" if report["interval_raised_to_write"] else ""
    summary.add_row("checkpoint every", _dur(report["interval_minutes"]), interval_note)
    summary.add_row("lost per failure", _dur(report["lost_minutes_per_failure"]), "")
    summary.add_row("effective training time", f"{report['effective_time_fraction']:.1%}", "")
    console.print(summary)
    if report["warning"]:
        console.print(f"warning: {report['warning']}", style="yellow")
    table = Table(title="what a faster checkpoint buys")
    for col in ("checkpoint", "interval", "lost per failure", "effective time"):
        table.add_column(col, justify="right")
    for row in report["table"]:
        style = "bold" if row["current"] else None
        table.add_row(
            _dur(row["checkpoint_minutes"]),
            _dur(row["interval_minutes"]),
            _dur(row["lost_minutes_per_failure"]),
            f"{row['effective_time_fraction']:.1%}" + ("" if row["model_holds"] else " (model does not hold)"),
            style=style,
        )
    console.print(table)
    console.print(f"model: {report['model']}", style="dim")


def checkpoint(
    mtbf_hours: Annotated[float | None, typer.Option(help="Job MTBF in hours.")] = None,
    failures: Annotated[int | None, typer.Option(help="Failures observed over --days (e.g. 419).")] = None,
    days: Annotated[float | None, typer.Option(help="Observation period for --failures, in days (e.g. 54).")] = None,
    gpu_failure_rate_per_hour: Annotated[
        float | None, typer.Option(help="Failures per GPU-hour; job MTBF = 1 / (rate x --gpus).")
    ] = None,
    gpu_mtbf_hours: Annotated[
        float | None, typer.Option(help="MTBF of one GPU in hours; job MTBF = it / --gpus.")
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs in the job (per-GPU rate, and --async shards).")] = None,
    checkpoint_minutes: Annotated[float | None, typer.Option(help="Time one checkpoint blocks training.")] = None,
    state_bytes: Annotated[
        float | None, typer.Option(help="Training state to save, bytes (e.g. 6.48e12 = 405B x 16 B).")
    ] = None,
    storage_gbytes_per_s: Annotated[float | None, typer.Option(help="Aggregate storage write bandwidth, GB/s.")] = None,
    per_node_gbytes_per_s: Annotated[float | None, typer.Option(help="Write bandwidth of one node, GB/s.")] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes writing (with --per-node-gbytes-per-s).")] = None,
    asynchronous: Annotated[
        bool, typer.Option("--async", help="Only the device-to-host copy blocks; the write runs in the background.")
    ] = False,
    d2h_gbytes_per_s: Annotated[
        float, typer.Option(help="Device-to-host copy bandwidth per GPU for --async, GB/s.")
    ] = rel.DEFAULT_D2H_BPS / GB,
    restart_minutes: Annotated[
        float, typer.Option(help="Time from a failure to training again: detect, reschedule, reload.")
    ] = rel.DEFAULT_RESTART_S / MIN,
    method: Annotated[str, typer.Option(help="young (first-order) or daly (higher-order, renewal model).")] = "young",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Optimal checkpoint interval (Young or Daly), time lost per failure and effective training time."""
    if method not in rel.METHODS:
        raise InputError(f"--method must be one of {', '.join(rel.METHODS)}, got {method!r}")
    if not math.isfinite(restart_minutes) or restart_minutes < 0:
        raise InputError(f"--restart-minutes must be a finite number >= 0, got {restart_minutes:g}")
    mtbf_s, mtbf_source = resolve_mtbf(mtbf_hours, failures, days, gpu_failure_rate_per_hour, gpu_mtbf_hours, gpus)
    cost, cost_source = resolve_cost(
        checkpoint_minutes,
        state_bytes,
        storage_gbytes_per_s,
        per_node_gbytes_per_s,
        nodes,
        asynchronous,
        gpus,
        d2h_gbytes_per_s,
    )
    report = checkpoint_report(mtbf_s, cost, restart_minutes * MIN, method, mtbf_source, cost_source)
    if json_out:
        print_json(report)
    else:
        _print_rich(report)


def register(app: typer.Typer) -> None:
    """Add `optlayout checkpoint` to the app."""
    app.command("checkpoint")(checkpoint)
