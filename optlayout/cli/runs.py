"""`optlayout compare`, `optlayout calibrate` and `optlayout runs from-log`: measured runs against the cost model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from optlayout.cli import common, outputs
from optlayout.cost import DEFAULT_PARAMS, CostParams
from optlayout.errors import InputError

if TYPE_CHECKING:
    from optlayout.runs.records import RunRecord


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
    app.command("calibrate")(calibrate_command)
    runs_app = typer.Typer(
        name="runs", help="Measured-run records: make them from training logs.", no_args_is_help=True
    )
    runs_app.command("from-log")(from_log_command)
    app.add_typer(runs_app, name="runs")


def _read(*runs: Path) -> list[RunRecord]:
    from optlayout.runs.records import read_runs

    return read_runs(*runs)


def compare_command(
    runs: Annotated[Path, typer.Argument(help="run records: .jsonl or .csv")],
    calibration: common.CalibrationOpt = None,
    no_rank: Annotated[bool, typer.Option("--no-rank", help="skip ranking each measured layout (faster)")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="predicted vs measured PNG (needs matplotlib)")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="self-contained HTML report")] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", help="processes (default: the CPUs available; 1: no others)")
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Per run: measured vs predicted throughput and MFU, the rank of the measured layout, the solver's pick."""
    from optlayout.runs.compare import compare_runs

    inputs = (runs, calibration)
    outputs.check_outputs((("--plot", plot), ("--report", report)), inputs)
    records = _read(runs)
    fitted = common.calibration_arg(calibration)

    def params_for(gpu: str, precision: str) -> CostParams:
        return fitted.params_for(gpu, precision) if fitted else DEFAULT_PARAMS

    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs: at least 1 process (got {jobs})")
    # refreshed on each finished group, never by a thread of its own (the worker processes fork)
    with Progress(console=common.err_console, disable=not common.err_console.is_terminal, transient=True,
                  auto_refresh=False) as bar:  # fmt: skip
        task = bar.add_task("predicting runs", total=len(records))
        result = compare_runs(
            records, params_for, rank_layouts=not no_rank, workers=jobs,
            progress=lambda i, n: bar.update(task, completed=i, refresh=True),
        )  # fmt: skip
    if plot is not None:
        from optlayout.runs.plot import plot_compare

        existed = plot.exists()
        plot_compare(result, plot)
        outputs.announce(plot, existed)
    if report is not None:
        from optlayout.report import compare_report_html

        outputs.write_output(report, compare_report_html(result), "--report", inputs)
    if as_json:
        common.print_json(result)
        return
    table = Table(title=f"{len(result['runs'])} runs: measured vs predicted tokens/s/GPU")
    for col in ("run", "measured", "predicted", "APE", "rank", "solver gain", "filled"):
        table.add_column(col, justify="right" if col not in ("run", "filled") else "left")
    for row in result["runs"]:
        rank, release = row["measured_layout_rank"], row["ranked_in_megatron_core"]
        gain = row["solver_predicted_gain"]
        rank_text = ""
        if rank is not None:
            rank_text = f"{rank}/{row['legal_layouts']}" + (" (twin ahead)" if row["twin_ahead"] else "")
            rank_text += f" (in mcore {release})" if release else ""
        table.add_row(
            row["id"],
            f"{row['measured_tokens_per_s_per_gpu']:,.0f}",
            f"{row['predicted_tokens_per_s_per_gpu']:,.0f}" + (" (over memory)" if row["memory_model_miss"] else ""),
            f"{row['ape']:.1%}",
            rank_text,
            "" if gain is None else f"{gain:+.1%}",
            ", ".join(f"{k}={v}" for k, v in row["filled_fields"].items()),
        )
    common.console.print(table)
    assumptions = Counter(
        f"{field}={a['value']} ({a['why']})" for row in result["runs"] for field, a in row["assumed"].items()
    )
    for text, n in sorted(assumptions.items()):
        common.console.print(f"assumed for {n} run{'s' if n > 1 else ''}: {text}")
    for text, n in sorted(Counter(note for row in result["runs"] for note in row["notes"]).items()):
        common.console.print(f"note for {n} run{'s' if n > 1 else ''}: {text}")
    s = result["summary"]
    if s["memory_model_misses"]:
        n = len(s["memory_model_misses"])
        common.console.print(
            f"memory-model miss for {n} run{'s' if n > 1 else ''} (predicted over memory, yet it ran; predicted "
            f"anyway): {', '.join(s['memory_model_misses'])}"
        )
    order = s["pairwise_order_accuracy"]
    common.console.print(
        f"n={s['n']}  MAPE {s['mape']:.1%}  median APE {s['median_ape']:.1%}  pairwise order "
        + ("n/a (no group has two layouts)" if order is None else f"{order:.0%} of {s['pairs']} pairs")
    )


def calibrate_command(
    runs: Annotated[
        list[Path], typer.Argument(help="run records: .jsonl or .csv, one file or more (dense and MoE runs)")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="calibration YAML to write")],
    heldout: Annotated[
        Path | None, typer.Option("--heldout", help="also write each run's held-out log errors and regimes (JSONL)")
    ] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Fit the calibratable constants per GPU and precision; report cross-validated error by source."""
    from optlayout.runs.calibrate import calibrate

    outputs.check_outputs((("--output", output), ("--heldout", heldout)), runs)
    records = _read(*runs)  # a file or run id given twice is refused, across the files too
    named = " + ".join(path.name for path in runs)
    if len(records) < 2:
        raise InputError(f"runs: calibration needs at least 2 runs, {named} has {len(records)}")
    show = not as_json and common.err_console.is_terminal
    with Progress(console=common.err_console, disable=not show, transient=True) as bar:
        task = bar.add_task("calibrating", total=None)
        fitted = calibrate(records, fitted_on=f"{named} ({len(records)} runs)",
                            progress=lambda msg: bar.update(task, description=msg))  # fmt: skip
    outputs.write_output(output, fitted.to_yaml(), "--output", runs)
    for warning in fitted.report.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if heldout is not None:
        rows = "".join(row.model_dump_json() + "\n" for row in fitted._heldout)
        outputs.write_output(heldout, rows, "--heldout", [*runs, output])
    if as_json:
        common.print_json(fitted.model_dump())
        return
    rep = fitted.report
    table = Table(title=f"calibration on {rep['runs']} runs -> {output}")
    table.add_column("MAPE")
    for col in ("leave source out", "leave GPU out", "in-sample", "uncalibrated"):
        table.add_column(col, justify="right")
    keys = ("cross_validated_by_source", "cross_validated_by_gpu", "in_sample", "uncalibrated")
    table.add_row("all", *(f"{rep[k]['mape']:.1%}" for k in keys))
    table.add_row("median signed error", *(f"{rep[k]['median_signed_error']:+.1%}" for k in keys))
    for source in rep["sources"]:
        table.add_row(source[:50], *(f"{rep[k]['per_source'][source]:.1%}" for k in keys))
    common.console.print(table)
    cov = fitted.uncertainty.coverage if fitted.uncertainty is not None else {}
    if cov.get("runs"):
        common.console.print(f"{cov['nominal']:.0%} prediction intervals cover {cov['covered']:.0%} of {cov['runs']} "
                             "runs with their source held out")  # fmt: skip
    if "moe" in rep:
        moe = rep["moe"]
        common.console.print(
            f"{moe['runs']} MoE runs: MAPE {moe['uncalibrated']['mape']:.1%} with the sourced MoE constants, "
            f"{moe['cross_validated_by_model']['mape']:.1%} fitted leaving one model out; kept: {moe['kept']}"
        )
    if cov.get("moe"):
        m = cov["moe"]
        common.console.print(f"{m['nominal']:.0%} prediction intervals cover {m['covered']:.0%} of {m['runs']} "
                             "MoE runs with their model held out")  # fmt: skip


def from_log_command(
    log: Annotated[Path, typer.Argument(help="training log (stdout of rank 0 / the last rank)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="runs .jsonl to append the record to")],
    log_format: Annotated[str, typer.Option("--format", help="megatron | torchtitan")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset the run used (logs do not name it)")] = None,
    cluster: common.ClusterOpt = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="only if the log does not state it")] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="only if the log does not state it")
    ] = None,
    layout: Annotated[
        str | None, typer.Option("--layout", help="only if the log does not state it, e.g. tp=2,pp=1,cp=1,dp=4,mb=1")
    ] = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    precision: Annotated[str | None, typer.Option("--precision", help="only if the log does not state it")] = None,
    run_id: Annotated[str | None, typer.Option("--id", help="run id (default: the log's file name)")] = None,
    source: Annotated[str | None, typer.Option("--source", help="where the numbers come from")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="logged lines skipped at the start")] = 2,
    as_json: common.JsonOpt = False,
) -> None:
    """Append a run record measured from a Megatron-LM or torchtitan log (median after warm-up).

    The sequence length, global batch, world size, layout, model shape and precision are read from the log
    (Megatron-LM's argument dump; torchtitan's trainer-init, mesh and model lines and config echo); give only
    what it does not state (the GPU, always), and what was read is printed.
    """
    from optlayout.presets import gpu_preset
    from optlayout.runs.logs import LOG_FORMATS, append_run, record_from_log
    from optlayout.topology import parse_cluster_shorthand

    outputs.check_output(output, "--output", [log, model_config])
    fmt = log_format.strip().lower()
    if fmt not in LOG_FORMATS:
        raise InputError(f"format: expected one of {', '.join(LOG_FORMATS)} (got {log_format!r})")
    if (gpu is None) == (cluster is None):
        raise InputError("cluster: give --gpu NAME (the world size comes from the log) or --cluster gpu=...,gpus=...")
    spec = parse_cluster_shorthand(cluster) if cluster is not None else None
    gpu_preset(spec.gpu if spec is not None else gpu)  # type: ignore[arg-type]
    shape = common.model_arg(model, model_config) if (model or model_config) else None
    record, said = record_from_log(
        log, fmt, model=shape, cluster=spec, gpu=gpu, seq_len=seq_len, global_batch=global_batch, layout=layout,
        precision=precision, run_id=run_id, source=source, warmup=warmup,
    )  # fmt: skip
    append_run(record, output)
    if as_json:
        common.print_json(record.model_dump(mode="json") | {"read": said})
        return
    for line in said:
        typer.echo(line, err=True)
    m = record.measured
    common.console.print(
        f"{record.id}: {m.tokens_per_s_per_gpu:,.1f} tokens/s/GPU ({m.derived_from}) -> appended to {output}"
    )
