"""`optlayout emit`: launcher flags or configs for a layout (Megatron, Megatron-Bridge, torchtitan, DeepSpeed,
Accelerate, mesh, ranks). The text is exactly what the launcher reads; the notes that go with it (launch
command, launcher version, substitutions) go to stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from optlayout.cli import common, outputs
from optlayout.emit import CURRENT_TORCHTITAN, DEFAULT_ORDER, FORMATS, TORCHTITAN_VERSIONS, emit, emit_notes
from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_GPUS_PER_SERVER
from optlayout.layout import parse_layout


def register(app: typer.Typer) -> None:
    """Add the `emit` command to the app."""

    @app.command("emit")
    def emit_command(
        fmt: Annotated[str, typer.Option("--format", "-f", help=f"one of: {', '.join(FORMATS)}")],
        layout: Annotated[
            str | None, typer.Option("--layout", help='e.g. "tp=8,pp=4,dp=2,mb=1,ga=16,sharding=zero1,sp"')
        ] = None,
        seq_len: Annotated[int | None, typer.Option("--seq-len", help="sequence length in tokens")] = None,
        plan: Annotated[Path | None, typer.Option("--plan", help="a plan saved by `solve --save`")] = None,
        rank: Annotated[int, typer.Option("--rank", help="which layout of the plan (1 = best)")] = 1,
        model: common.ModelOpt = None,
        model_config: common.ModelConfigOpt = None,
        global_batch: Annotated[int | None, typer.Option("--global-batch", help="sequences per step (checked)")] = None,
        precision: Annotated[str | None, typer.Option("--precision", help="bf16 (default), fp16 or fp8")] = None,
        fp8_recipe: common.Fp8RecipeOpt = None,
        dropout: common.DropoutOpt = False,
        grad_bytes: common.GradBytesOpt = common.GRAD_BYTES,
        moe_dispatcher: common.MoeDispatcherOpt = None,
        moe_ep_overlap: common.MoeEpOverlapOpt = False,
        moe_routing: common.MoeRoutingOpt = None,
        gpus_per_node: Annotated[
            int | None, typer.Option("--gpus-per-node", help="GPUs (ranks) per node (default 8)")
        ] = None,
        overrides: Annotated[bool, typer.Option("--overrides", help="torchtitan 0.2.2: --section.key flags")] = False,
        torchtitan_version: Annotated[
            str, typer.Option("--torchtitan-version", help=f"one of {', '.join(TORCHTITAN_VERSIONS)}")
        ] = CURRENT_TORCHTITAN,
        order: Annotated[str, typer.Option("--order", help="Megatron rank order (megatron, ranks)")] = DEFAULT_ORDER,
        megatron_core: common.MegatronCoreOpt = None,
        hostnames: Annotated[
            str | None,
            typer.Option("--hostnames", help="comma-separated node names (ranks; accelerate's main process)"),
        ] = None,
        output: Annotated[Path | None, typer.Option("--output", "-o", help="write here, not stdout")] = None,
    ) -> None:
        """Print launcher flags or a config file for one layout."""
        hosts = [h.strip() for h in hostnames.split(",") if h.strip()] if hostnames else None
        release = common.megatron_core_arg(megatron_core)
        if output is not None:
            outputs.check_output(output, "--output", [plan, model_config])
        if gpus_per_node is not None and not 1 <= gpus_per_node <= MAX_GPUS_PER_SERVER:
            raise InputError(f"gpus-per-node: must be 1 to {MAX_GPUS_PER_SERVER:,} (got {gpus_per_node})")
        if plan is not None:
            given = {"--layout": layout, "--model": model, "--model-config": model_config, "--seq-len": seq_len,
                     "--global-batch": global_batch, "--precision": precision, "--fp8-recipe": fp8_recipe,
                     "--gpus-per-node": gpus_per_node, "--moe-dispatcher": moe_dispatcher,
                     "--moe-routing": moe_routing}  # fmt: skip
            dropped = [flag for flag, v in given.items() if v is not None]
            dropped += common.switched_job_flags(dropout, grad_bytes, moe_ep_overlap)
            if dropped:
                raise InputError(f"plan: --plan carries the model, job, layout and node size; drop "
                                 f"{', '.join(dropped)}")  # fmt: skip
            from optlayout.planning.plan import Plan

            saved = Plan.load(plan)
            if saved.megatron_core is not None:  # the plan's release unless another is asked for
                release = release or common.megatron_core_arg(saved.megatron_core)
            chosen = saved.layout_at(rank)
            spec, job, lay, per_node = saved.model, saved.job, chosen.layout, saved.gpus_per_server
            if lay.gpus < saved.gpus:
                typer.echo(f"# layout {rank} uses {lay.gpus} of the plan's {saved.gpus} GPUs (solved with "
                           f"--allow-idle): launch it on {lay.gpus} GPUs", err=True)  # fmt: skip
        else:
            if layout is None or seq_len is None:
                raise InputError("emit: give --plan plan.json, or --layout with --seq-len and --model")
            spec = common.model_arg(model, model_config)
            job = common.job_arg(seq_len, global_batch, None, precision=precision or "bf16", dropout=dropout,
                                 grad_bytes=grad_bytes, fp8_recipe=fp8_recipe, moe_dispatcher=moe_dispatcher,
                                 moe_ep_overlap=moe_ep_overlap, moe_routing=moe_routing)  # fmt: skip
            lay, per_node = parse_layout(layout), gpus_per_node or 8
        text = emit(fmt, spec, job, lay, per_node, overrides=overrides, order=order, hostnames=hosts,
                    torchtitan_version=torchtitan_version, megatron_core=release)  # fmt: skip
        for note in emit_notes(fmt, spec, job, lay, per_node, overrides=overrides, order=order, hostnames=hosts,
                               torchtitan_version=torchtitan_version, megatron_core=release):  # fmt: skip
            typer.echo(f"# {note}", err=True)
        if output is None:
            typer.echo(text, nl=False)
        else:
            outputs.write_output(output, text, "--output", [plan, model_config])
