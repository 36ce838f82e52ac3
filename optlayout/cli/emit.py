"""`optlayout emit`: launcher flags or configs for a layout (Megatron, Megatron-Bridge, torchtitan, DeepSpeed,
Accelerate, mesh, ranks). The text is exactly what the launcher reads; the notes that go with it (launch
command, launcher version, substitutions) go to stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pydantic
import typer

from optlayout.emit import CURRENT_TORCHTITAN, DEFAULT_ORDER, FORMATS, TORCHTITAN_VERSIONS, emit, emit_notes
from optlayout.errors import OptlayoutError, describe_validation_error
from optlayout.layout_text import parse_layout
from optlayout.plan import Plan
from optlayout.presets import model_from_hf_config, model_preset
from optlayout.specs import JobSpec, ModelSpec


def load_model(preset: str | None, config: Path | None) -> ModelSpec:
    """The model from a preset name or a Hugging Face config.json (exactly one of them)."""
    if (preset is None) == (config is None):
        raise OptlayoutError("model: give exactly one of --model PRESET or --model-config config.json")
    return model_preset(preset) if preset is not None else model_from_hf_config(config)


def make_job(seq_len: int, global_batch: int | None, precision: str, grad_bytes: float = 2.0) -> JobSpec:
    """A JobSpec from the command-line numbers, with pydantic errors turned into one line."""
    try:
        return JobSpec(seq_len=seq_len, global_batch=global_batch, precision=precision, grad_bytes_per_param=grad_bytes)
    except pydantic.ValidationError as exc:
        raise OptlayoutError(describe_validation_error(exc, "job")) from None


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
        model: Annotated[str | None, typer.Option("--model", help="model preset, e.g. llama3-70b")] = None,
        model_config: Annotated[Path | None, typer.Option("--model-config", help="Hugging Face config.json")] = None,
        global_batch: Annotated[int | None, typer.Option("--global-batch", help="sequences per step (checked)")] = None,
        precision: Annotated[str, typer.Option("--precision", help="bf16, fp16 or fp8")] = "bf16",
        grad_bytes: Annotated[
            float, typer.Option("--grad-bytes", help="gradient bytes per parameter the plan counted: 2 or 4 (fp32)")
        ] = 2.0,
        gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs (ranks) per node")] = 8,
        overrides: Annotated[bool, typer.Option("--overrides", help="torchtitan 0.2.2: --section.key flags")] = False,
        torchtitan_version: Annotated[
            str, typer.Option("--torchtitan-version", help=f"one of {', '.join(TORCHTITAN_VERSIONS)}")
        ] = CURRENT_TORCHTITAN,
        order: Annotated[str, typer.Option("--order", help="Megatron rank order (megatron, ranks)")] = DEFAULT_ORDER,
        hostnames: Annotated[
            str | None,
            typer.Option("--hostnames", help="comma-separated node names (ranks; accelerate's main process)"),
        ] = None,
        output: Annotated[Path | None, typer.Option("--output", "-o", help="write here, not stdout")] = None,
    ) -> None:
        """Print launcher flags or a config file for one layout."""
        hosts = [h.strip() for h in hostnames.split(",") if h.strip()] if hostnames else None
        if plan is not None:
            if layout is not None or model is not None or model_config is not None or seq_len is not None:
                raise OptlayoutError("plan: --plan carries the model, job and layout; drop --layout/--model/--seq-len")
            saved = Plan.load(plan)
            chosen = saved.layout_at(rank)
            spec, job, lay, per_node = saved.model, saved.job, chosen.layout, saved.gpus_per_server
        else:
            if layout is None or seq_len is None:
                raise OptlayoutError("emit: give --plan plan.json, or --layout with --seq-len and --model")
            spec, job = load_model(model, model_config), make_job(seq_len, global_batch, precision, grad_bytes)
            lay, per_node = parse_layout(layout), gpus_per_node
        options = {"overrides": overrides, "order": order, "hostnames": hosts, "torchtitan_version": torchtitan_version}
        text = emit(fmt, spec, job, lay, per_node, **options)
        for note in emit_notes(fmt, spec, job, lay, per_node, **options):
            typer.echo(f"# {note}", err=True)
        if output is None:
            typer.echo(text, nl=False)
        else:
            output.write_text(text)
            typer.echo(f"wrote {output}", err=True)
