"""`optlayout mfu`, `optlayout memory`, `optlayout estimate`: the figures an engineer checks by hand."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.table import Table

from optlayout.cli import common
from optlayout.cost import check_layout, flops, usable_memory_bytes
from optlayout.cost.memory import state_bytes_per_gpu
from optlayout.errors import OptlayoutError
from optlayout.layout_text import parse_layout
from optlayout.presets import gpu_preset
from optlayout.specs import Sharding


def register(app: typer.Typer) -> None:
    app.command("mfu")(mfu_command)
    app.command("memory")(memory_command)
    app.command("estimate")(estimate_command)


def mfu_command(
    tokens_per_s: Annotated[float, typer.Option("--tokens-per-s", help="measured tokens/s per GPU")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset")] = "h100-sxm",
    params: Annotated[float | None, typer.Option("--params", help="parameter count N (MFU = 6N x tokens/s)")] = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="adds the attention term (with a model)")] = None,
    precision: common.PrecisionOpt = "bf16",
    non_causal: Annotated[bool, typer.Option("--non-causal", help="count full (unmasked) attention")] = False,
    as_json: common.JsonOpt = False,
) -> None:
    """Model FLOPs utilization from measured tokens/s per GPU."""
    if not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise OptlayoutError(f"tokens-per-s: must be a positive number (got {tokens_per_s})")
    spec = gpu_preset(gpu)
    if params is not None:
        if model or model_config:
            raise OptlayoutError("params: give --params or a model, not both")
        if not (math.isfinite(params) and params > 0):
            raise OptlayoutError(f"params: must be a positive number (got {params})")
        per_token = 6.0 * params
        basis = "6N"
    else:
        shape = common.model_arg(model, model_config)
        if seq_len is None:
            per_token, basis = 6.0 * shape.matmul_params, "6N (matmul parameters)"
        else:
            per_token = flops.model_flops_per_token(shape, seq_len, causal=not non_causal)
            basis = "6N + attention" + ("" if non_causal else " (causal)")
    peak = spec.peak_flops_for(precision)
    value = flops.mfu(tokens_per_s, per_token, peak)
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
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in the job (gives dp)")] = None,
    dp: Annotated[int | None, typer.Option("--dp")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node")] = 8,
    sharding: Annotated[str, typer.Option("--sharding", help="none | zero1 | zero2 | fsdp")] = "none",
    params: Annotated[float | None, typer.Option("--params", help="parameter count (even split over tp x pp)")] = None,
    model: common.ModelOpt = None,
    model_config: common.ModelConfigOpt = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset (capacity)")] = None,
    gpu_memory_gb: Annotated[float | None, typer.Option("--gpu-memory-gb", help="GPU memory, GB")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="with --model: add activations")] = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch")] = 1,
    recompute: Annotated[str, typer.Option("--recompute")] = "none",
    sequence_parallel: Annotated[bool, typer.Option("--sp", help="sequence parallel")] = False,
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    as_json: common.JsonOpt = False,
) -> None:
    """Memory per GPU: training state (always), activations when a model shape and sequence are given."""
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("micro-batch", micro_batch)):
        if value < 1:
            raise OptlayoutError(f"{name}: must be at least 1 (got {value})")
    if gpus is not None and dp is not None:
        raise OptlayoutError("dp: give --gpus or --dp, not both")
    if gpus is not None:
        if gpus < 1 or gpus % (tp * pp * cp):
            raise OptlayoutError(f"gpus: {gpus} is not a multiple of tp*pp*cp = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp)
    dp = dp or 1
    try:
        shard = Sharding(sharding)
    except ValueError:
        raise OptlayoutError(f"sharding: {sharding!r} is not one of none, zero1, zero2, fsdp") from None
    job = common.job_arg(seq_len or 1, None, None, optimizer_bytes=optimizer_bytes)
    capacity = None
    if gpu_memory_gb is not None:
        if gpu_memory_gb <= 0:
            raise OptlayoutError(f"gpu-memory-gb: must be positive (got {gpu_memory_gb})")
        capacity = gpu_memory_gb * 1e9
    elif gpu is not None:
        capacity = gpu_preset(gpu).memory_bytes
    out: dict[str, object] = {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": dp,
        "gpus": tp * pp * cp * dp,
        "sharding": shard.value,
    }
    if params is not None:
        if model or model_config:
            raise OptlayoutError("params: give --params or a model, not both")
        if seq_len is not None:
            raise OptlayoutError("seq-len: activations need a model shape; give --model with --seq-len")
        if params <= 0:
            raise OptlayoutError(f"params: must be positive (got {params})")
        total_params, per_gpu_params = params, params / (tp * pp)
        activations = None
    else:
        from optlayout.cost import DEFAULT_PARAMS
        from optlayout.cost.memory import memory_per_gpu
        from optlayout.specs import Layout

        shape = common.model_arg(model, model_config)
        total_params = shape.params
        layout = Layout(
            tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=micro_batch, grad_accum=max(pp, 1), sharding=shard,
            recompute=recompute, sequence_parallel=sequence_parallel,
        )  # fmt: skip
        check_layout(shape, job.model_copy(update={"seq_len": seq_len or 2 * cp}), layout, layout.gpus)
        if seq_len is not None:
            breakdown = memory_per_gpu(shape, job, layout, DEFAULT_PARAMS)
            per_gpu_params = breakdown.params_on_gpu
            activations = breakdown.activations_bytes
            out["fullest_stage"] = breakdown.stage
            out["reserve_bytes"] = breakdown.reserve_bytes
            out["buffers_bytes"] = breakdown.buffers_bytes
        else:
            per_gpu_params, activations = total_params / (tp * pp), None
    weights, grads, optim = state_bytes_per_gpu(per_gpu_params, job, shard, dp * cp)
    state = weights + grads + optim
    out |= {
        "params": total_params,
        "state_total_bytes": total_params * job.state_bytes_per_param,
        "state_total_gb": common.gb(total_params * job.state_bytes_per_param),
        "weights_per_gpu_bytes": weights,
        "gradients_per_gpu_bytes": grads,
        "optimizer_per_gpu_bytes": optim,
        "state_per_gpu_bytes": state,
        "state_per_gpu_gb": common.gb(state),
        "activations_per_gpu_bytes": activations,
    }
    total = state + (activations or 0) + float(out.get("reserve_bytes", 0)) + float(out.get("buffers_bytes", 0))
    out["total_per_gpu_gb"] = common.gb(total)
    if capacity is not None:
        out["capacity_gb"] = common.gb(capacity)
        out["usable_gb"] = common.gb(usable_memory_bytes(capacity, job))  # less the default 5% headroom
        out["fits"] = total <= usable_memory_bytes(capacity, job)
    if as_json:
        common.print_json(out)
        return
    table = Table(title=f"memory per GPU (tp={tp} pp={pp} cp={cp} dp={dp}, {shard.value})")
    table.add_column("term")
    table.add_column("GB", justify="right")
    for label, value in (("weights", weights), ("gradients", grads), ("optimizer", optim), ("state", state)):
        table.add_row(label, f"{value / 1e9:.2f}")
    if activations is not None:
        table.add_row("activations", f"{activations / 1e9:.2f}")
    table.add_row("total", f"{total / 1e9:.2f}")
    common.console.print(table)
    if capacity is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        common.console.print(f"usable {out['usable_gb']} of {capacity / 1e9:.1f} GB (5% headroom): {verdict}")


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
    attention_kernel: common.AttentionKernelOpt = None,
    optimizer_bytes: common.OptimizerBytesOpt = 12.0,
    headroom: common.HeadroomOpt = 0.05,
    calibration: common.CalibrationOpt = None,
    straggler_slowdown: Annotated[
        float, typer.Option("--straggler-slowdown", help="slowest rank's slowdown, e.g. 0.02")
    ] = 0.0,
    as_json: common.JsonOpt = False,
) -> None:
    """A full prediction for one given layout: memory, step time and where the time goes."""
    from optlayout.api import estimate_run

    job = common.job_arg(seq_len, global_batch, global_batch_tokens, precision=precision,
                         optimizer_bytes=optimizer_bytes, headroom=headroom,
                         attention_kernel=attention_kernel)  # fmt: skip
    shape, topo, params = common.inputs_arg(model, model_config, topology, cluster, job, calibration)
    lay = parse_layout(layout)
    run = estimate_run(shape, topo, job, lay, params, straggler_slowdown=straggler_slowdown)
    if as_json:
        common.print_json({"layout": lay, "prediction": run.prediction, "straggler": run.straggler})
        return
    print_prediction(lay.short(), run.prediction)
    if run.straggler is not None:
        s = run.straggler
        common.console.print(
            f"  with a {straggler_slowdown:.1%} straggler: {s.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {s.mfu:.1%}"
        )


def print_prediction(title: str, pred: object) -> None:
    """A rich view of one prediction."""
    from optlayout.cost import Prediction

    assert isinstance(pred, Prediction)
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
