"""`optlayout solve` and `optlayout explain`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from optlayout.cli import common
from optlayout.errors import OptlayoutError

PinOpt = Annotated[list[str] | None, typer.Option("--pin", help="fix a field: --pin tp=8 --pin sharding=fsdp")]
MaxOpt = Annotated[list[str] | None, typer.Option("--max", help="upper bound: --max pp=16")]
ExcludeOpt = Annotated[list[str] | None, typer.Option("--exclude", help="forbid a value: --exclude recompute=full")]


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_command)
    app.command("explain")(explain_command)


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        out |= common.parse_pairs(item, what)
    return out


def _excludes(items: list[str] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in _pairs(items, "exclude").items():
        out.setdefault(key, []).append(value)
    return out


def _max_ints(items: list[str] | None) -> dict[str, int]:
    out = {}
    for key, value in _pairs(items, "max").items():
        try:
            out[key] = int(value)
        except ValueError:
            raise OptlayoutError(f"max: {key}={value!r} must be an integer") from None
    return out


def solve_command(
    seq_len: common.SeqLenOpt,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    topology: common.TopologyOpt = None,
    cluster: common.ClusterOpt = None,
    global_batch: common.GlobalBatchOpt = None,
    global_batch_tokens: common.GlobalBatchTokensOpt = None,
    min_global_batch: common.MinBatchOpt = None,
    max_global_batch: common.MaxBatchOpt = None,
    precision: common.PrecisionOpt = "bf16",
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    headroom: common.HeadroomOpt = 0.05,
    top: Annotated[int, typer.Option("--top", help="how many layouts")] = 5,
    pin: PinOpt = None,
    max_: MaxOpt = None,
    exclude: ExcludeOpt = None,
    allow_idle: Annotated[bool, typer.Option("--allow-idle", help="leave GPUs idle if that is faster")] = False,
    allow_tp_beyond_domain: Annotated[bool, typer.Option("--allow-tp-beyond-domain")] = False,
    max_bubble: Annotated[float | None, typer.Option("--max-bubble", help="bubble fraction limit")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, s")] = 10.0,
    calibration: common.CalibrationOpt = None,
    save: Annotated[Path | None, typer.Option("--save", help="write the plan as JSON")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """The layouts with the highest predicted MFU, proven optimal within the cost model."""
    from optlayout.api import solve

    shape = common.model_arg(model, model_config)
    topo = common.cluster_arg(topology, cluster)
    job = common.job_arg(seq_len, global_batch, global_batch_tokens, min_global_batch, max_global_batch,
                         precision, optimizer_bytes, headroom)  # fmt: skip
    plan = solve(
        shape, topo, job, top=top, pins=_pairs(pin, "pin"), maxima=_max_ints(max_), exclude=_excludes(exclude),
        params=common.params_arg(calibration, topo.gpu.name, precision), time_limit_s=time_limit,
        allow_idle_gpus=allow_idle, allow_tp_beyond_domain=allow_tp_beyond_domain, max_bubble_fraction=max_bubble,
    )  # fmt: skip
    if save is not None:
        plan.save(save)
    if as_json:
        common.print_json(plan_json(plan))
    else:
        print_plan(plan)
    if plan.status == "infeasible":
        if as_json:
            common.err_console.print(f"infeasible: {plan.diagnosis}")
        raise typer.Exit(1)


def plan_json(plan: object) -> dict:
    """The `--json` schema: status, solve_time_s, layouts [{layout, prediction}], and the plan's context."""
    from optlayout.plan import Plan

    assert isinstance(plan, Plan)
    return {
        "schema_version": plan.schema_version,
        "status": plan.status,
        "solve_time_s": round(plan.solve_time_s, 4),
        "build_time_s": round(plan.build_time_s, 4),
        "candidates": plan.candidates,
        "model": plan.model.name,
        "topology": plan.topology_name,
        "gpus": plan.gpus,
        "diagnosis": plan.diagnosis,
        "layouts": [
            {"rank": p.rank, "layout": p.layout.model_dump(mode="json"), "prediction": p.prediction.model_dump()}
            for p in plan.layouts
        ],
    }


def print_plan(plan: object) -> None:
    from optlayout.plan import Plan
    from optlayout.solver.explain import why_it_lost

    assert isinstance(plan, Plan)
    con = common.console
    if not plan.layouts:
        con.print(f"[red]infeasible[/red]: {plan.diagnosis}")
        return
    con.print(
        f"{plan.model.name} on {plan.gpus} GPUs ({plan.topology_name}), seq {plan.job.seq_len}: "
        f"[bold]{plan.status}[/bold] in {plan.solve_time_s:.3f} s over {plan.candidates} candidates"
    )
    table = Table()
    for col in ("#", "tp", "pp", "vp", "cp", "dp", "mb", "ga", "sharding", "recompute", "sp", "MFU", "tok/s/GPU",
                "step s", "mem GB", "bubble"):  # fmt: skip
        table.add_column(col, justify="right")
    for p in plan.layouts:
        lay, pred = p.layout, p.prediction
        table.add_row(
            str(p.rank), str(lay.tp), str(lay.pp), str(lay.vp), str(lay.cp), str(lay.dp), str(lay.micro_batch),
            str(lay.grad_accum), lay.sharding.value, lay.recompute.value, "y" if lay.sequence_parallel else "",
            f"{pred.mfu:.1%}", f"{pred.tokens_per_s_per_gpu:,.0f}", f"{pred.step_time_s:.2f}",
            f"{pred.memory_per_gpu_bytes / 1e9:.1f}", f"{pred.bubble_fraction:.1%}",
        )  # fmt: skip
    con.print(table)
    best = plan.layouts[0]
    for p in plan.layouts[1:]:
        con.print(f"  #{p.rank}: " + why_it_lost(p.layout, p.prediction, best.layout, best.prediction, plan.job))


def explain_command(
    layout: Annotated[str, typer.Option("--layout", help="your layout: tp=8,pp=4,dp=8,mb=1,...")],
    seq_len: common.SeqLenOpt,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    topology: common.TopologyOpt = None,
    cluster: common.ClusterOpt = None,
    global_batch: common.GlobalBatchOpt = None,
    global_batch_tokens: common.GlobalBatchTokensOpt = None,
    precision: common.PrecisionOpt = "bf16",
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    headroom: common.HeadroomOpt = 0.05,
    calibration: common.CalibrationOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Where your own layout ranks among all legal layouts, and which terms cost it against the best."""
    from optlayout.api import explain_layout
    from optlayout.layout_text import parse_layout

    shape = common.model_arg(model, model_config)
    topo = common.cluster_arg(topology, cluster)
    job = common.job_arg(seq_len, global_batch, global_batch_tokens, precision=precision,
                         optimizer_bytes=optimizer_bytes, headroom=headroom)  # fmt: skip
    report = explain_layout(shape, topo, job, parse_layout(layout), common.params_arg(calibration, topo.gpu.name,
                                                                                        precision))  # fmt: skip
    if as_json:
        common.print_json(report)
        return
    con = common.console
    rank = report["rank"]
    con.print(
        f"your layout {report['layout']}: "
        + (f"rank {rank} of {report['feasible']} feasible layouts" if rank else "[red]does not fit memory[/red]")
        + f", MFU {report['mfu']:.1%} vs best {report['best_mfu']:.1%} ({report['best_layout']})"
    )
    table = Table(title="time per token per GPU, us (largest loss first)")
    for col in ("term", "yours", "best", "delta"):
        table.add_column(col, justify="right")
    for row in report["terms"]:
        table.add_row(row["term"], f"{row['yours_us']:.3f}", f"{row['best_us']:.3f}", f"{row['delta_us']:+.3f}")
    con.print(table)
