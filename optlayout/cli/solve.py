"""`optlayout solve` (also goodput-aware, and re-planning with --from-plan) and `optlayout explain`."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer
from rich.table import Table

from optlayout.cli import command_started_s, common, outputs
from optlayout.conditions.goodput import FailureSpec, StorageSpec, failure_spec, storage_spec
from optlayout.conditions.reliability import DEFAULT_D2H_BPS, DEFAULT_RESTART_S
from optlayout.cost import pricing_notes
from optlayout.errors import InputError
from optlayout.layout import SEARCHED_AXES
from optlayout.timings import PhaseClock, timings_json, timings_line

if TYPE_CHECKING:  # the planning and topology packages load on use, keeping the light commands fast
    from optlayout.layout.megatron_core import Version
    from optlayout.planning import Plan, PlannedLayout
    from optlayout.topology import LoadedCluster

_FIELDS = ", ".join(a.key for a in SEARCHED_AXES)
PinOpt = Annotated[
    list[str] | None, typer.Option("--pin", help=f"fix a field ({_FIELDS}): --pin tp=8 --pin sharding=fsdp")
]
MaxOpt = Annotated[
    list[str] | None,
    typer.Option("--max", help=f"upper bound ({', '.join(a.key for a in SEARCHED_AXES if a.numeric)}): --max pp=16; "
                 "for mb, vp and cp it is the search limit (default mb 16, vp 8, cp 64), which it may raise"),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude", help=f"forbid a value ({_FIELDS}); repeat it for several: --exclude recompute=full --exclude tp=1"
    ),
]


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_command)
    app.command("explain")(explain_command)


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        for key, value in common.parse_pairs(item, what).items():
            if key in out and out[key] != value:
                raise InputError(f"{what}: {key} given twice ({out[key]} and {value})")
            out[key] = value
    return out


def _excludes(items: list[str] | None) -> dict[str, list[object]]:
    """Each field's forbidden values: `--exclude recompute=full --exclude recompute=selective` forbids both."""
    from optlayout.solver.space import normalize_key

    out: dict[str, list[object]] = {}
    for item in items or []:
        pairs = common.parse_pairs(item, "exclude")
        for key, value in pairs.items():
            if value == "true" and len(pairs) > 1 and f"{key}=" not in item:  # a bare word after a pair
                try:
                    normalize_key(key, "exclude")
                except InputError:
                    field, first = next(iter(pairs.items()))
                    raise InputError(
                        f"exclude: {key!r} in {item!r} is not a layout field; to forbid several values of one field, "
                        f"repeat the option: --exclude {field}={first} --exclude {field}={key}"
                    ) from None
            if value not in out.setdefault(key, []):
                out[key].append(value)
    return out


def _max_ints(items: list[str] | None) -> dict[str, int]:
    out = {}
    for key, value in _pairs(items, "max").items():
        try:
            out[key] = int(value)
        except ValueError:
            raise InputError(f"max: {key}={value!r} must be an integer") from None
    return out


TimingsOpt = Annotated[
    bool, typer.Option("--timings", help="add the time of every phase to --json and --report (they vary run to run)")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="print the time of every phase on stderr")]

GB = 1e9
HOUR = 3600.0
MINUTE = 60.0

ObjectiveOpt = Annotated[
    str | None,
    typer.Option("--objective", help="mfu (default): highest throughput; goodput: throughput x effective time"),
]
MtbfOpt = Annotated[float | None, typer.Option("--mtbf-hours", help="the job's mean time between failures, hours")]
FailuresOpt = Annotated[int | None, typer.Option("--failures", help="failures observed over --days (MTBF = days/N)")]
DaysOpt = Annotated[float | None, typer.Option("--days", help="observation period of --failures, days")]
GpuRateOpt = Annotated[
    float | None,
    typer.Option("--gpu-failure-rate-per-hour", help="failures per GPU-hour; MTBF = 1 / (rate x the layout's GPUs)"),
]
StorageOpt = Annotated[
    float | None, typer.Option("--storage-gbytes-per-s", help="aggregate checkpoint write bandwidth, GB/s")
]
PerNodeOpt = Annotated[
    float | None, typer.Option("--per-node-gbytes-per-s", help="write bandwidth of one node, GB/s (caps x nodes)")
]
AsyncOpt = Annotated[
    bool,
    typer.Option("--async-checkpoint", help="only the copy to host memory blocks; the write runs in the background"),
]
D2hOpt = Annotated[float, typer.Option("--d2h-gbytes-per-s", help="device-to-host copy per GPU (async), GB/s")]
RestartOpt = Annotated[
    float, typer.Option("--restart-minutes", help="failure to training again: detect, reschedule, reload")
]
StragglerOpt = Annotated[
    float | None,
    typer.Option("--straggler-slowdown", help="the slowest rank's slowdown, 0.02 = 2%: throughput / (1 + s)"),
]
FromPlanOpt = Annotated[Path | None, typer.Option("--from-plan", help="re-plan a saved plan (--save) on --gpus N GPUs")]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="with --from-plan: the new GPU count")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", help="tokens per sequence")]
RobustOpt = Annotated[
    bool | None,
    typer.Option("--robust/--no-robust", help="rank by the conservative estimate: the low end of each layout's 80% "
                 "interval from the calibration's held-out errors (unsupported regimes widen it); with --from-plan, "
                 "default: as the plan was ranked", show_default=False),
]  # fmt: skip


def _positive(flag: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise InputError(f"{flag} must be a finite number > 0, got {value:g}")


def goodput_inputs(
    mtbf_hours: float | None,
    failures: int | None,
    days: float | None,
    gpu_rate_per_hour: float | None,
    storage_gbytes_per_s: float | None,
    per_node_gbytes_per_s: float | None,
    asynchronous: bool,
    d2h_gbytes_per_s: float,
    restart_minutes: float,
) -> tuple[FailureSpec | None, StorageSpec | None]:
    """(FailureSpec, StorageSpec) from the flags, or (None, None) when none of them is given."""
    for flag, value in (("--mtbf-hours", mtbf_hours), ("--failures", failures), ("--days", days),
                        ("--gpu-failure-rate-per-hour", gpu_rate_per_hour),
                        ("--storage-gbytes-per-s", storage_gbytes_per_s),
                        ("--per-node-gbytes-per-s", per_node_gbytes_per_s),
                        ("--d2h-gbytes-per-s", d2h_gbytes_per_s)):  # fmt: skip
        _positive(flag, value)
    if not math.isfinite(restart_minutes) or restart_minutes < 0:
        raise InputError(f"--restart-minutes must be a finite number >= 0, got {restart_minutes:g}")
    given = (
        ("--mtbf-hours", mtbf_hours is not None),
        ("--failures/--days", failures is not None or days is not None),
        ("--gpu-failure-rate-per-hour", gpu_rate_per_hour is not None),
    )
    sources = [name for name, present in given if present]
    if len(sources) > 1:
        raise InputError(f"give one MTBF source, got {' and '.join(sources)}")
    if storage_gbytes_per_s is None and (per_node_gbytes_per_s is not None or asynchronous):
        raise InputError("--per-node-gbytes-per-s and --async-checkpoint need --storage-gbytes-per-s")
    if not sources and storage_gbytes_per_s is None:
        return None, None
    if not sources:
        raise InputError("--storage-gbytes-per-s needs an MTBF: --mtbf-hours, --failures/--days or "
                             "--gpu-failure-rate-per-hour")  # fmt: skip
    if storage_gbytes_per_s is None:
        raise InputError("an MTBF needs --storage-gbytes-per-s (the checkpoint write bandwidth)")
    if failures is not None or days is not None:
        if failures is None or days is None:
            raise InputError("--failures and --days go together: failures observed over that many days")
        mtbf_hours = days * 24.0 / failures
    restart_s = restart_minutes * MINUTE
    if gpu_rate_per_hour is not None:
        failure = failure_spec(gpu_failure_rate_per_s=gpu_rate_per_hour / HOUR, restart_s=restart_s)
    else:
        assert mtbf_hours is not None
        failure = failure_spec(mtbf_s=mtbf_hours * HOUR, restart_s=restart_s)
    storage = storage_spec(
        write_Bps=storage_gbytes_per_s * GB,
        per_node_write_Bps=None if per_node_gbytes_per_s is None else per_node_gbytes_per_s * GB,
        asynchronous=asynchronous,
        d2h_Bps=d2h_gbytes_per_s * GB,
    )
    return failure, storage


class _Search(TypedDict):
    """The search flags solve and re-plan share."""

    top: int
    pins: dict[str, str]
    maxima: dict[str, int]
    exclude: dict[str, list[object]]
    time_limit_s: float
    failure: FailureSpec | None
    storage: StorageSpec | None
    allow_idle_gpus: bool
    allow_tp_beyond_domain: bool
    max_bubble_fraction: float | None
    megatron_core: Version | None


def solve_command(
    seq_len: SeqLenOpt = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    topology: common.TopologyOpt = None,
    cluster: common.ClusterOpt = None,
    global_batch: common.GlobalBatchOpt = None,
    global_batch_tokens: common.GlobalBatchTokensOpt = None,
    min_global_batch: common.MinBatchOpt = None,
    max_global_batch: common.MaxBatchOpt = None,
    precision: common.PrecisionOpt = "bf16",
    fp8_recipe: common.Fp8RecipeOpt = None,
    attention_kernel: common.AttentionKernelOpt = None,
    dropout: common.DropoutOpt = False,
    moe_dispatcher: common.MoeDispatcherOpt = None,
    moe_ep_overlap: common.MoeEpOverlapOpt = False,
    moe_routing: common.MoeRoutingOpt = None,
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    grad_bytes: common.GradBytesOpt = common.GRAD_BYTES,
    headroom: common.HeadroomOpt = 0.05,
    top: Annotated[int, typer.Option("--top", help="how many layouts")] = 5,
    pin: PinOpt = None,
    max_: MaxOpt = None,
    exclude: ExcludeOpt = None,
    allow_idle: Annotated[bool, typer.Option("--allow-idle", help="leave GPUs idle if that is faster")] = False,
    allow_tp_beyond_domain: Annotated[bool, typer.Option("--allow-tp-beyond-domain")] = False,
    max_bubble: Annotated[float | None, typer.Option("--max-bubble", help="bubble fraction limit")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, s")] = 10.0,
    megatron_core: common.MegatronCoreOpt = None,
    calibration: common.CalibrationOpt = None,
    objective: ObjectiveOpt = None,
    mtbf_hours: MtbfOpt = None,
    failures: FailuresOpt = None,
    days: DaysOpt = None,
    gpu_failure_rate_per_hour: GpuRateOpt = None,
    storage_gbytes_per_s: StorageOpt = None,
    per_node_gbytes_per_s: PerNodeOpt = None,
    async_checkpoint: AsyncOpt = False,
    d2h_gbytes_per_s: D2hOpt = DEFAULT_D2H_BPS / GB,
    restart_minutes: RestartOpt = DEFAULT_RESTART_S / MINUTE,
    straggler_slowdown: StragglerOpt = None,
    robust: RobustOpt = None,
    from_plan: FromPlanOpt = None,
    gpus: GpusOpt = None,
    save: Annotated[Path | None, typer.Option("--save", help="write the plan as JSON")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="write a self-contained HTML report")] = None,
    as_json: common.JsonOpt = False,
    timings: TimingsOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """The layouts with the highest predicted MFU (or goodput), proven optimal within the cost model;
    with --from-plan, the best layout of a saved plan on another GPU count and what changes."""
    started_s = command_started_s()
    clock = PhaseClock()
    from optlayout.planning import solve
    from optlayout.topology import load_cluster

    failure, storage = goodput_inputs(
        mtbf_hours, failures, days, gpu_failure_rate_per_hour, storage_gbytes_per_s, per_node_gbytes_per_s,
        async_checkpoint, d2h_gbytes_per_s, restart_minutes,
    )  # fmt: skip
    search = _Search(top=top, pins=_pairs(pin, "pin"), maxima=_max_ints(max_), exclude=_excludes(exclude),
                     time_limit_s=time_limit, failure=failure, storage=storage, allow_idle_gpus=allow_idle,
                     allow_tp_beyond_domain=allow_tp_beyond_domain, max_bubble_fraction=max_bubble,
                     megatron_core=common.megatron_core_arg(megatron_core))  # fmt: skip
    if (topology is not None) and (cluster is not None):
        raise InputError("cluster: give exactly one of --topology FILE and --cluster gpu=...,gpus=...")
    inputs = (topology, model_config, model, calibration, from_plan)
    outputs.check_outputs((("--save", save), ("--report", report)), inputs)
    source = topology if topology is not None else cluster
    loaded = None
    if from_plan is not None:
        job_flags = [f for f, v in (("--seq-len", seq_len), ("--model", model), ("--model-config", model_config),
                                    ("--global-batch", global_batch), ("--global-batch-tokens", global_batch_tokens),
                                    ("--min-global-batch", min_global_batch), ("--max-global-batch", max_global_batch),
                                    ("--attention-kernel", attention_kernel), ("--fp8-recipe", fp8_recipe),
                                    ("--moe-dispatcher", moe_dispatcher), ("--moe-routing", moe_routing))
                     if v is not None] + common.switched_job_flags(dropout, grad_bytes, moe_ep_overlap)  # fmt: skip
        if job_flags:
            raise InputError(f"--from-plan keeps the plan's model and job: drop {', '.join(job_flags)}")
        if gpus is None and source is None:
            raise InputError("--from-plan needs --gpus N (or the new --cluster/--topology)")
        plan, loaded = _replan(from_plan, gpus, source, calibration, objective, straggler_slowdown, robust, search,
                               clock, started_s)  # fmt: skip
    else:
        if gpus is not None:
            raise InputError("--gpus goes with --from-plan; for a new solve give the cluster's gpus= count")
        if seq_len is None:
            raise InputError("--seq-len is required (or re-plan a saved plan with --from-plan)")
        if source is None:
            raise InputError("cluster: give exactly one of --topology FILE and --cluster gpu=...,gpus=...")
        shape = common.model_arg(model, model_config)
        job = common.job_arg(seq_len, global_batch, global_batch_tokens, min_global_batch, max_global_batch,
                             precision, optimizer_bytes, headroom, attention_kernel, dropout, grad_bytes,
                             fp8_recipe, moe_dispatcher, moe_ep_overlap, moe_routing)  # fmt: skip
        with clock.phase("topology"):
            loaded = load_cluster(source)
        fitted = common.calibration_arg(calibration)
        params = common.params_of(fitted, loaded.topology.gpu.name, precision)
        uncertainty = common.uncertainty_arg(fitted, calibration, bool(robust))
        _parsed(clock, started_s)
        plan = solve(shape, loaded, job, params=params, objective=objective or "mfu",
                     straggler_slowdown=straggler_slowdown or 0.0, uncertainty=uncertainty, robust=bool(robust),
                     **search)  # fmt: skip
        moe = common.moe_assumed(shape, moe_dispatcher, moe_ep_overlap, moe_routing)
        plan = plan.model_copy(update={"assumed": plan.assumed | moe}) if moe else plan
    clock.merge(plan.phases_s)
    _output(plan, save, report, loaded, as_json, inputs, clock, timings, verbose)


def _parsed(clock: PhaseClock, started_s: float) -> None:
    """Book everything since the command began that no other phase took as parsing (imports included)."""
    clock.add("parse", time.perf_counter() - started_s - sum(clock.seconds.values()))


def _replan(
    from_plan: Path,
    gpus: int | None,
    source: Path | str | None,
    calibration: str | None,
    objective: str | None,
    straggler_slowdown: float | None,
    robust: bool | None,
    search: _Search,
    clock: PhaseClock,
    started_s: float,
) -> tuple[Plan, LoadedCluster | None]:
    """Re-plan a saved plan (and the new cluster, loaded once, when given), ranked robust as the plan was unless
    --robust/--no-robust says otherwise."""
    from optlayout.planning import Plan, replan
    from optlayout.topology import load_cluster

    old = Plan.load(from_plan)
    with clock.phase("topology"):
        loaded = load_cluster(source) if source is not None else None
    gpu_name = loaded.topology.gpu.name if loaded is not None else _plan_gpu(old)
    fitted = common.calibration_arg(calibration)
    params = common.params_of(fitted, gpu_name, old.job.precision)
    ranked_robust = old.robust if robust is None else robust
    if ranked_robust and robust is None and fitted is None:
        raise InputError("--from-plan: the plan was ranked with --robust, which needs a calibration's held-out errors; "
                         "drop --calibration none, or pass --no-robust")  # fmt: skip
    uncertainty = common.uncertainty_arg(fitted, calibration, ranked_robust)
    _parsed(clock, started_s)
    plan = replan(old, gpus, cluster=loaded, params=params, objective=objective,
                  straggler_slowdown=straggler_slowdown, uncertainty=uncertainty, robust=ranked_robust,
                  **search)  # fmt: skip
    return plan, loaded


def _output(
    plan: Plan,
    save: Path | None,
    report: Path | None,
    loaded: LoadedCluster | None,
    as_json: bool,
    inputs: tuple[object, ...],
    clock: PhaseClock,
    timings: bool,
    verbose: bool,
) -> None:
    """Save, report and print the plan (with its timings when asked); with no layout, the diagnosis goes to
    stderr (one line) and the exit status is 1."""
    paths = [p for p in inputs if isinstance(p, str | Path)]
    with clock.phase("output"):
        if save is not None:
            outputs.write_output(save, plan.to_json() + "\n", "--save", paths)
        if report is not None:
            from optlayout.report import plan_report_html

            topo = loaded.topology if loaded is not None and plan.layouts else None
            shown = plan.model_copy(update={"phases_s": clock.phases_s()})
            topo = topo if topo is not None and topo.num_gpus == plan.gpus else None
            outputs.write_output(report, plan_report_html(shown, topo, timings=timings), "--report", paths)
        payload = plan_json(plan) if as_json else None
    if payload is not None:
        if timings:
            payload["timings"] = timings_json(clock.phases_s())
        common.print_json(payload)
    elif plan.layouts:
        with clock.phase("output"):
            print_plan(plan)
    if verbose:
        common.err_console.print(timings_line(clock.phases_s()), soft_wrap=True)
    if plan.status in ("infeasible", "unknown"):
        typer.echo(f"{plan.status}: {plan.diagnosis}", err=True)
        raise typer.Exit(1)


def _plan_gpu(plan: Plan) -> str:
    if plan.cluster is not None:
        return plan.cluster.gpu
    if plan.topology_doc is not None:
        return str(plan.topology_doc.get("gpu", ""))
    return ""


def plan_json(plan: Plan) -> dict[str, Any]:
    """The `--json` schema: status, layouts [{layout, prediction}], and the plan's context; the same input
    gives the same JSON (`--timings` adds a `timings` object, the one part that changes run to run).

    Added without changing the keys above: `objective`, `robust`, `megatron_core`; per layout `goodput` (with
    failure and storage inputs), `straggler` (with a slowdown) and `support` (with a calibration's held-out errors:
    the 80% interval of tokens/s/GPU and the unsupported regimes); `replanned_from` and `changes` after --from-plan."""
    out = {
        "schema_version": plan.schema_version,
        "status": plan.status,
        "candidates": plan.candidates,
        "model": plan.model.name,
        "topology": plan.topology_name,
        "gpus": plan.gpus,
        "objective": plan.objective,
        "robust": plan.robust,
        "diagnosis": plan.diagnosis,
        "search_limits": plan.search_limits,
        "allow_idle_gpus": plan.allow_idle_gpus,
        "megatron_core": plan.megatron_core,
        "assumed": plan.assumed,
        "layouts": [_layout_json(p) for p in plan.layouts],
    }
    out |= common.note_fields(plan.job, plan.notes)
    if plan.replan is not None:
        out["replanned_from"] = {
            "gpus": plan.replan.from_gpus,
            "layout": None if plan.replan.from_layout is None else plan.replan.from_layout.model_dump(mode="json"),
            "reshard_checkpoint": plan.replan.reshard,
        }
        out["changes"] = [c.model_dump(mode="json") for c in plan.replan.changes]
    return out


def _layout_json(p: PlannedLayout) -> dict[str, Any]:
    row = {"rank": p.rank, "layout": p.layout.model_dump(mode="json"), "gpus_used": p.layout.gpus,
           "prediction": p.prediction.model_dump()}  # fmt: skip
    if p.goodput is not None:
        row["goodput"] = p.goodput.model_dump(mode="json")
    if p.straggler is not None:
        row["straggler"] = p.straggler.model_dump()
    if p.support is not None:
        row["support"] = p.support.model_dump()
    return row


def _limits_text(limits: dict[str, int]) -> str:
    from optlayout.solver.space import describe_limits

    return describe_limits(limits)


def _within(plan: Plan) -> str:
    """The search limits the status holds within, for people."""
    within = f" within {_limits_text(plan.search_limits)} (--max raises them)" if plan.search_limits else ""
    return within + (f", with what Megatron-Core {plan.megatron_core} runs" if plan.megatron_core else "")


def print_plan(plan: Plan) -> None:
    from optlayout.solver.explain import why_it_lost

    con = common.console
    if not plan.layouts:
        con.print(f"[red]{plan.status}[/red]: {plan.diagnosis}", soft_wrap=True)
        return
    common.print_assumed(plan.assumed)
    common.print_notes(plan.notes)
    con.print(
        f"{plan.model.name} on {plan.gpus} GPUs ({plan.topology_name}), seq {plan.job.seq_len}"
        + (f", {plan.job.numerics}" if plan.job.fp8_recipe else "")
        + ": "
        f"[bold]{plan.status}[/bold]{_within(plan)} over {plan.candidates} candidates (CP-SAT "
        f"{plan.cpsat_time_s:.3f} s)"
        + (" (objective: goodput)" if plan.objective == "goodput" else "")
        + (" (robust: ranked by the 80% interval's low end)" if plan.robust else "")
    )
    has_goodput = any(p.goodput is not None for p in plan.layouts)
    table = Table()
    has_support = any(p.support is not None for p in plan.layouts)
    cols = ["#", "layout", "MFU", "tok/s/GPU", "step s", "mem GB", "bubble"]
    if has_support:
        cols += ["80% range"]
    if has_goodput:
        cols += ["ckpt s", "eff. time", "goodput tok/s/GPU"]
    for col in cols:
        if col == "layout":
            table.add_column(col, overflow="fold", ratio=1)
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for p in plan.layouts:
        lay, pred = p.layout, p.prediction
        flagged = p.support is not None and bool(p.support.unsupported)
        row = [
            f"{p.rank}*" if flagged else str(p.rank), lay.short(), f"{pred.mfu:.1%}",
            f"{pred.tokens_per_s_per_gpu:,.0f}", f"{pred.step_time_s:.2f}", f"{pred.memory_per_gpu_bytes / 1e9:.1f}",
            f"{pred.bubble_fraction:.1%}",
        ]  # fmt: skip
        if has_support:
            sup = p.support
            row += ["" if sup is None else f"{sup.tokens_per_s_per_gpu_low:,.0f}-{sup.tokens_per_s_per_gpu_high:,.0f}"]
        if has_goodput:
            g = p.goodput
            row += ["", "", ""] if g is None else [
                f"{g.checkpoint_s:.3g}", f"{g.effective_time_fraction:.2%}", f"{g.goodput_tokens_per_s_per_gpu:,.0f}",
            ]  # fmt: skip
        table.add_row(*row)
    con.print(table)
    idle = [p for p in plan.layouts if p.layout.gpus < plan.gpus]
    if idle:
        con.print("  idle GPUs (--allow-idle): " + "; ".join(
            f"#{p.rank} uses {p.layout.gpus} of {plan.gpus} ({plan.gpus - p.layout.gpus} idle)" for p in idle),
            soft_wrap=True)  # fmt: skip
    for p in plan.layouts:
        if p.support is not None and p.support.unsupported:
            con.print(f"  #{p.rank}*: no calibration run covers {'; '.join(p.support.unsupported)}", soft_wrap=True)
    best = plan.layouts[0]
    for p in plan.layouts[1:]:
        faster = p.prediction.tokens_per_s_per_gpu >= best.prediction.tokens_per_s_per_gpu
        if plan.objective == "goodput" and faster and p.goodput is not None and best.goodput is not None:
            con.print(
                f"  #{p.rank}: as fast or faster but pauses {p.goodput.checkpoint_s:.3g} s per checkpoint against "
                f"{best.goodput.checkpoint_s:.3g} s: effective time {p.goodput.effective_time_fraction:.2%} vs "
                f"{best.goodput.effective_time_fraction:.2%}"
            )
        else:
            con.print(f"  #{p.rank}: " + why_it_lost(p.layout, p.prediction, best.layout, best.prediction, plan.job))
    if best.goodput is not None:
        g = best.goodput
        how = (
            f"async: {g.staged_bytes_per_gpu / 1e9:.3g} GB/GPU copied to host, {g.write_s:.3g} s background write"
            if g.asynchronous
            else "synchronous write"
        )
        con.print(
            f"checkpoint: {g.checkpoint_bytes / 1e9:,.0f} GB of weights + optimizer state ({how}); MTBF "
            f"{_hours(g.mtbf_s)}, checkpoint every {(g.interval_s or 0) / MINUTE:.3g} min ({g.method}), effective "
            f"time {g.effective_time_fraction:.2%}, goodput {g.goodput_tokens_per_s_per_gpu:,.0f} tok/s/GPU"
        )
    if best.straggler is not None:
        s = best.straggler
        con.print(
            f"stragglers: slowest rank {s.slowdown:.1%} slower -> step {s.step_time_s:.3g} s, "
            f"{s.tokens_per_s_per_gpu:,.0f} tok/s/GPU, MFU {s.mfu:.1%} (all layouts / {1 + s.slowdown:.4g})"
        )
    if plan.replan is not None:
        con.print(replan_line(plan), soft_wrap=True)


def _hours(seconds: float) -> str:
    hours = seconds / HOUR
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"


def replan_line(plan: Plan) -> str:
    """One line: where the re-plan came from, which dimensions change, whether the checkpoint reshards."""
    assert plan.replan is not None
    r = plan.replan
    head = f"re-planned from {r.from_gpus} to {plan.gpus} GPUs"
    if r.from_layout is None:
        return head + " (the saved plan had no layout to compare with)"
    if not r.changes:
        return head + f": same layout ({r.from_layout.short()}); the checkpoint loads as it is"
    changed = ", ".join(c.text() for c in r.changes)
    reshard = [c.dim for c in r.changes if c.reshards_checkpoint]
    tail = (
        f"the checkpoint must be resharded on load ({', '.join(reshard)})"
        if reshard
        else "the checkpoint loads as it is (no sharded dimension changes)"
    )
    return f"{head}: changes {changed}; {tail}"


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
    fp8_recipe: common.Fp8RecipeOpt = None,
    attention_kernel: common.AttentionKernelOpt = None,
    dropout: common.DropoutOpt = False,
    moe_dispatcher: common.MoeDispatcherOpt = None,
    moe_ep_overlap: common.MoeEpOverlapOpt = False,
    moe_routing: common.MoeRoutingOpt = None,
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    grad_bytes: common.GradBytesOpt = common.GRAD_BYTES,
    headroom: common.HeadroomOpt = 0.05,
    calibration: common.CalibrationOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Where your own layout ranks among all legal layouts, and which terms cost it against the best."""
    from optlayout.layout import parse_layout
    from optlayout.planning import explain_layout

    job = common.job_arg(seq_len, global_batch, global_batch_tokens, precision=precision,
                         optimizer_bytes=optimizer_bytes, headroom=headroom,
                         attention_kernel=attention_kernel, dropout=dropout, grad_bytes=grad_bytes,
                         fp8_recipe=fp8_recipe, moe_dispatcher=moe_dispatcher, moe_ep_overlap=moe_ep_overlap,
                         moe_routing=moe_routing)  # fmt: skip
    shape, topo, params = common.inputs_arg(model, model_config, topology, cluster, job, calibration)
    assumed = common.assumed_arg(cluster) | common.moe_assumed(shape, moe_dispatcher, moe_ep_overlap, moe_routing)
    report = explain_layout(shape, topo, job, parse_layout(layout), params) | {"assumed": assumed}
    notes = pricing_notes(job, topo.gpu)
    report |= common.note_fields(job, notes)
    if as_json:
        common.print_json(report)
        return
    common.print_assumed(report["assumed"])
    common.print_notes(notes)
    con = common.console
    rank = report["rank"]
    con.print(
        f"your layout {report['layout']}"
        + (f" ({job.numerics})" if job.fp8_recipe else "")
        + ": "
        + (f"rank {rank} of {report['feasible']} feasible layouts ({_limits_text(report['search_limits'])})"
           if rank else "[red]does not fit memory[/red]")
        + (f" (its twin {report['twin_ahead']} ranks in its stead)" if rank and report["twin_ahead"] else "")
        + f", MFU {report['mfu']:.1%} vs best {report['best_mfu']:.1%} ({report['best_layout']})"
    )
    table = Table(title="time per token per GPU, us (largest loss first)")
    for col in ("term", "yours", "best", "delta"):
        table.add_column(col, justify="right")
    for row in report["terms"]:
        table.add_row(row["term"], f"{row['yours_us']:.3f}", f"{row['best_us']:.3f}", f"{row['delta_us']:+.3f}")
    con.print(table)
