"""`optlayout mfu`, `optlayout memory`, `optlayout estimate`: the figures an engineer checks by hand."""

from __future__ import annotations

import math
from typing import Annotated

import pydantic
import typer
from rich.table import Table

from optlayout.cli import common
from optlayout.cost import DEFAULT_PARAMS, Prediction, flops, pricing_notes, usable_memory_bytes
from optlayout.cost.memory import memory_estimate
from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.limits import MAX_GPU_MEMORY_BYTES, MAX_GPUS
from optlayout.layout import Layout, Sharding, check_layout, parse_layout
from optlayout.presets import gpu_preset

MAX_PARAMS = 1e16  # parameters of a model given by count (--params): ten thousand times the largest published
MAX_TOKENS_PER_S = 1e12  # tokens/s per GPU; an H100 reaches about 5e5 on a 125M-parameter model


def register(app: typer.Typer) -> None:
    app.command("mfu")(mfu_command)
    app.command("memory")(memory_command)
    app.command("estimate")(estimate_command)


def mfu_command(
    tokens_per_s: Annotated[float, typer.Option("--tokens-per-s", help="measured tokens/s per GPU")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset")] = "h100-sxm",
    param_count: Annotated[
        float | None, typer.Option("--params", "--param-count", help="parameter count N (MFU = 6N x tokens/s)")
    ] = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="adds the attention term (with a model)")] = None,
    precision: common.PrecisionOpt = "bf16",
    non_causal: Annotated[bool, typer.Option("--non-causal", help="count full (unmasked) attention")] = False,
    as_json: common.JsonOpt = False,
) -> None:
    """Model FLOPs utilization from measured tokens/s per GPU."""
    if not (math.isfinite(tokens_per_s) and 0 < tokens_per_s <= MAX_TOKENS_PER_S):
        raise InputError(f"tokens-per-s: must be a finite number in (0, {MAX_TOKENS_PER_S:g}] (got {tokens_per_s})")
    spec = gpu_preset(gpu)
    if param_count is not None:
        if model or model_config:
            raise InputError("params: give --params or a model, not both")
        if not (math.isfinite(param_count) and 0 < param_count <= MAX_PARAMS):
            raise InputError(f"params: must be a finite number in (0, {MAX_PARAMS:g}] (got {param_count})")
        per_token = 6.0 * param_count
        basis = "6N"
    else:
        shape = common.model_arg(model, model_config)
        if seq_len is None:
            per_token, basis = 6.0 * shape.matmul_param_count, "6N (matmul parameters)"
        else:
            per_token = flops.model_flops_per_token(shape, seq_len, causal=not non_causal)
            basis = "6N + attention" + ("" if non_causal else " (causal)")
    peak = spec.peak_flops_for(precision)
    value = flops.mfu(tokens_per_s, per_token, peak)
    if value > 1.0:
        achieved_tflops = tokens_per_s * per_token / 1e12
        raise InputError(f"tokens-per-s: {tokens_per_s:,.0f} tokens/s per GPU would be {achieved_tflops:,.1f} TFLOP/s"
                         f" ({basis}), over the {spec.name}'s {precision} peak of {peak / 1e12:g}: MFU cannot "
                         "exceed 100% (give tokens/s per GPU, not the cluster's)")  # fmt: skip
    out = {
        "mfu": round(value, 4),
        "model_flops_per_token": per_token,
        "achieved_tflops_per_gpu": round(tokens_per_s * per_token / 1e12, 2),
        "peak_tflops": peak / 1e12,
        "gpu": spec.name,
        "precision": precision,
        "basis": basis,
    }
    if as_json:
        common.print_json(out)
    else:
        common.console.print(
            f"MFU {value:.1%}: {out['achieved_tflops_per_gpu']} TFLOP/s of {out['peak_tflops']} ({basis}, {spec.name})"
        )


def memory_command(
    tp: Annotated[int, typer.Option("--tp")] = 1,
    pp: Annotated[int, typer.Option("--pp")] = 1,
    cp: Annotated[int, typer.Option("--cp")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="expert parallelism (MoE models)")] = 1,
    etp: Annotated[int, typer.Option("--etp", help="expert tensor parallelism (MoE models)")] = 1,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in the job (gives dp)")] = None,
    dp: Annotated[int | None, typer.Option("--dp")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node")] = 8,
    sharding: Annotated[str, typer.Option("--sharding", help="none | zero1 | zero2 | fsdp")] = "none",
    param_count: Annotated[
        float | None, typer.Option("--params", "--param-count", help="parameter count (even split over tp x pp)")
    ] = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset (capacity)")] = None,
    gpu_memory_gb: Annotated[float | None, typer.Option("--gpu-memory-gb", help="GPU memory, GB")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="with --model: add activations")] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="with --seq-len (default 1)")] = None,
    recompute: Annotated[str | None, typer.Option("--recompute", help="with --seq-len (default none)")] = None,
    sequence_parallel: Annotated[bool, typer.Option("--sp", help="sequence parallel, with --seq-len")] = False,
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    grad_bytes: common.GradBytesOpt = common.GRAD_BYTES,
    dropout: common.DropoutOpt = False,
    moe_routing: common.MoeRoutingOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Memory per GPU: training state (always), activations when a model shape and sequence are given."""
    activation_flags = [flag for flag, given in (("--micro-batch", micro_batch is not None),
                        ("--sp", sequence_parallel), ("--recompute", recompute is not None), ("--dropout", dropout),
                        ("--moe-routing", moe_routing is not None)) if given]  # fmt: skip
    if activation_flags and seq_len is None:  # they change only the activations, which need --seq-len
        named = ", ".join(activation_flags)
        verb = "change" if len(activation_flags) > 1 else "changes"
        raise InputError(f"{activation_flags[0].lstrip('-')}: {named} {verb} only the activations, which need a "
                         f"model shape and a sequence; give --model with --seq-len, or drop {named}")  # fmt: skip
    micro_batch = 1 if micro_batch is None else micro_batch
    recompute = "none" if recompute is None else recompute
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("etp", etp), ("micro-batch", micro_batch)):
        if value < 1:
            raise InputError(f"{name}: must be at least 1 (got {value})")
    if gpus is not None and dp is not None:
        raise InputError("dp: give --gpus or --dp, not both")
    if gpu is not None and gpu_memory_gb is not None:
        raise InputError("gpu-memory-gb: give --gpu or --gpu-memory-gb, not both (each sets the GPU's memory)")
    assumed: dict[str, dict[str, object]] = {}
    if gpus is None and dp is None:
        assumed["dp"] = {"value": 1, "why": "neither --gpus nor --dp given"}
    if gpus is not None:
        if not 1 <= gpus <= MAX_GPUS:
            raise InputError(f"gpus: must be 1 to {MAX_GPUS:,} (got {gpus})")
        if gpus % (tp * pp * cp):
            raise InputError(f"gpus: {gpus} is not a multiple of tp*pp*cp = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp)
    dp = dp or 1
    try:
        shard = Sharding(sharding)
    except ValueError:
        raise InputError(f"sharding: {sharding!r} is not one of none, zero1, zero2, fsdp") from None
    job = common.job_arg(seq_len or 1, None, None, optimizer_bytes=optimizer_bytes, dropout=dropout,
                         grad_bytes=grad_bytes, moe_routing=moe_routing)  # fmt: skip
    capacity = None
    if gpu_memory_gb is not None:
        if not (math.isfinite(gpu_memory_gb) and 0 < gpu_memory_gb <= MAX_GPU_MEMORY_BYTES / 1e9):
            raise InputError(f"gpu-memory-gb: must be a finite number > 0 (got {gpu_memory_gb})")
        capacity = gpu_memory_gb * 1e9
    elif gpu is not None:
        capacity = gpu_preset(gpu).memory_bytes
    try:
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, micro_batch=micro_batch, grad_accum=max(pp, 1),
                        sharding=shard, recompute=recompute, sequence_parallel=sequence_parallel)  # fmt: skip
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "layout")) from None
    if param_count is not None:
        if model or model_config:
            raise InputError("params: give --params or a model, not both")
        if seq_len is not None:
            raise InputError("seq-len: activations need a model shape; give --model with --seq-len")
        if ep * etp > 1:
            raise InputError("ep: the expert axes need a mixture-of-experts model shape; give --model, not --params")
        if not (math.isfinite(param_count) and 0 < param_count <= MAX_PARAMS):
            raise InputError(f"params: must be a finite number in (0, {MAX_PARAMS:g}] (got {param_count})")
        est = memory_estimate(job, layout, DEFAULT_PARAMS, param_count=param_count)
    else:
        shape = common.model_arg(model, model_config)
        check_layout(shape, job.model_copy(update={"seq_len": seq_len or 2 * cp}), layout, layout.gpus)
        est = memory_estimate(job, layout, DEFAULT_PARAMS, model=shape, with_activations=seq_len is not None)
        if seq_len is not None:  # the routing sets the routed activations (the dispatcher and overlap: no memory)
            routing = common.moe_assumed(shape, None, False, moe_routing).get("moe_routing")
            if routing is not None:
                assumed["moe_routing"] = routing
    out: dict[str, object] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep, "etp": etp, "gpus": layout.gpus,
                              "sharding": shard.value}  # fmt: skip
    if est.breakdown is not None:
        out |= {"fullest_stage": est.breakdown.stage, "reserve_bytes": est.breakdown.reserve_bytes,
                "buffers_bytes": est.breakdown.buffers_bytes}  # fmt: skip
    state_total = est.param_count * job.state_bytes_per_param
    out |= {
        "params": est.param_count,
        "state_total_bytes": state_total,
        "state_total_gb": common.gb(state_total),
        "weights_per_gpu_bytes": est.weights_bytes,
        "gradients_per_gpu_bytes": est.gradients_bytes,
        "optimizer_per_gpu_bytes": est.optimizer_bytes,
        "state_per_gpu_bytes": est.state_bytes,
        "state_per_gpu_gb": common.gb(est.state_bytes),
        "activations_per_gpu_bytes": est.activations_bytes,
        "total_per_gpu_gb": common.gb(est.total_bytes),
    }
    if capacity is not None:
        usable = usable_memory_bytes(capacity, job)
        out |= {"capacity_gb": common.gb(capacity), "usable_gb": common.gb(usable), "fits": est.total_bytes <= usable}
    out["assumed"] = assumed
    if as_json:
        common.print_json(out)
        return
    experts = f" ep={ep} etp={etp}" if ep * etp > 1 else ""
    table = Table(title=f"memory per GPU (tp={tp} pp={pp} cp={cp} dp={dp}{experts}, {shard.value})")
    table.add_column("term")
    table.add_column("GB", justify="right")
    rows: list[tuple[str, float | None]] = [
        ("weights", est.weights_bytes), ("gradients", est.gradients_bytes), ("optimizer", est.optimizer_bytes),
        ("state", est.state_bytes), ("activations", est.activations_bytes), ("total", est.total_bytes),
    ]  # fmt: skip
    for label, term_bytes in rows:
        if term_bytes is not None:
            table.add_row(label, f"{term_bytes / 1e9:.2f}")
    common.console.print(table)
    if capacity is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        common.console.print(
            f"usable {out['usable_gb']} of {capacity / 1e9:.1f} GB ({job.memory_headroom:.0%} headroom): {verdict}"
        )
    common.print_assumed(assumed)


def estimate_command(
    layout: Annotated[str, typer.Option("--layout", help="tp=8,pp=4,dp=8,mb=1,ga=16,sharding=zero1,...")],
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
    straggler_slowdown: Annotated[
        float, typer.Option("--straggler-slowdown", help="slowest rank's slowdown, e.g. 0.02")
    ] = 0.0,
    as_json: common.JsonOpt = False,
) -> None:
    """A full prediction for one given layout: memory, step time and where the time goes."""
    from optlayout.planning import estimate_run

    job = common.job_arg(seq_len, global_batch, global_batch_tokens, precision=precision,
                         optimizer_bytes=optimizer_bytes, headroom=headroom,
                         attention_kernel=attention_kernel, dropout=dropout, grad_bytes=grad_bytes,
                         fp8_recipe=fp8_recipe, moe_dispatcher=moe_dispatcher, moe_ep_overlap=moe_ep_overlap,
                         moe_routing=moe_routing)  # fmt: skip
    shape, topo, params = common.inputs_arg(model, model_config, topology, cluster, job, calibration)
    lay = parse_layout(layout)
    run = estimate_run(shape, topo, job, lay, params, straggler_slowdown=straggler_slowdown)
    assumed = common.assumed_arg(cluster) | common.moe_assumed(shape, moe_dispatcher, moe_ep_overlap, moe_routing)
    support = common.support_arg(calibration, shape, job, lay, topo.gpu.name, run.prediction.tokens_per_s_per_gpu)
    notes = pricing_notes(job, topo.gpu)
    if as_json:
        report = {"layout": lay, "prediction": run.prediction, "straggler": run.straggler, "assumed": assumed}
        report |= common.note_fields(job, notes) | ({"support": support} if support is not None else {})
        common.print_json(report)
        return
    common.print_assumed(assumed)
    common.print_notes(notes)
    print_prediction(lay.short(), run.prediction)
    if support is not None:
        common.console.print(
            f"  80% interval {support.tokens_per_s_per_gpu_low:,.0f}-{support.tokens_per_s_per_gpu_high:,.0f} "
            "tokens/s/GPU (calibration's held-out errors)"
            + (f"; no calibration run covers {'; '.join(support.unsupported)}" if support.unsupported else ""),
            soft_wrap=True,
        )
    if run.straggler is not None:
        s = run.straggler
        common.console.print(
            f"  with a {straggler_slowdown:.1%} straggler: {s.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {s.mfu:.1%}"
        )


def print_prediction(title: str, pred: Prediction) -> None:
    """A rich view of one prediction."""
    common.console.print(
        f"[bold]{title}[/bold]\n  MFU {pred.mfu:.1%}  {pred.tokens_per_s_per_gpu:,.0f} tokens/s/GPU  "
        f"step {pred.step_time_s:.3f} s  bubble {pred.bubble_fraction:.1%}\n"
        f"  memory {pred.memory_per_gpu_bytes / 1e9:.1f} of {pred.memory_capacity_bytes / 1e9:.1f} GB usable"
        f"{'' if pred.fits else '  [red]DOES NOT FIT[/red]'}"
    )
    table = Table(show_header=True)
    table.add_column("time")
    table.add_column("s", justify="right")
    table.add_column("memory")
    table.add_column("GB", justify="right")
    rows = list(pred.time.items())
    mems = list(pred.memory.items())
    for i in range(max(len(rows), len(mems))):
        t = rows[i] if i < len(rows) else ("", None)
        m = mems[i] if i < len(mems) else ("", None)
        table.add_row(
            t[0].removesuffix("_s"), "" if t[1] is None else f"{t[1]:.4f}",
            m[0].removesuffix("_bytes"), "" if m[1] is None else f"{m[1] / 1e9:.2f}",
        )  # fmt: skip
    common.console.print(table)
