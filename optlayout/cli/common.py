"""Shared CLI plumbing: JSON output, rich tables on a terminal, and parsing of `key=value` lists."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import pydantic
import typer
from rich.console import Console

from optlayout.cost import DEFAULT_PARAMS, CostParams
from optlayout.errors import InputError, OptlayoutError, describe_validation_error
from optlayout.layout.megatron_core import Version, parse_megatron_core
from optlayout.specs import (
    AttentionKernel,
    Fp8Recipe,
    JobSpec,
    ModelSpec,
    MoeDispatcher,
    MoeRouting,
    Precision,
)

if TYPE_CHECKING:  # loaded on use, keeping the light commands fast
    from optlayout.layout.model import Layout
    from optlayout.runs.calibrate import Calibration
    from optlayout.runs.uncertainty import PredictionSupport, Uncertainty
    from optlayout.topology import Topology

console = Console()
err_console = Console(stderr=True)


def print_json(payload: Any) -> None:
    """Deterministic, strict JSON on stdout (sorted keys are not forced: schemas keep their own order). This is
    the one place JSON results are written: a NaN or an infinity never gets out (JavaScript's JSON.parse and
    most readers reject them); the field holding one is named instead."""
    try:
        text = json.dumps(payload, indent=2, default=_default, allow_nan=False)
    except ValueError:
        raise OptlayoutError(f"result: {_non_finite(json.loads(json.dumps(payload, default=_default)))} is not a "
                             "finite number; nothing printed (please report the input)") from None  # fmt: skip
    sys.stdout.write(text + "\n")


def _non_finite(value: Any, path: str = "") -> str:
    """The path of the first NaN or infinity in a JSON-like value."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path or '(root)'} = {value}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return ""


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "value"):
        return obj.value
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def parse_pairs(text: str, what: str) -> dict[str, str]:
    """`a=1,b=x` -> {'a': '1', 'b': 'x'}; a bare word `sp` becomes {'sp': 'true'}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
        else:
            out[part] = "true"
    if not out:
        raise InputError(f"{what}: expected key=value pairs, got {text!r}")
    return out


# Options shared by the commands that take a model, a cluster and a job.
ModelOpt = Annotated[str | None, typer.Option("--model", help="model preset, e.g. llama3.1-70b")]
ModelConfigOpt = Annotated[Path | None, typer.Option("--model-config", help="Hugging Face config.json")]
TopologyOpt = Annotated[Path | None, typer.Option("--topology", help="topology YAML file")]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="shorthand cluster: gpu=h100-sxm,gpus=64,gpus_per_node=8,...")
]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="tokens per sequence")]
GlobalBatchOpt = Annotated[int | None, typer.Option("--global-batch", help="sequences per optimizer step")]
GlobalBatchTokensOpt = Annotated[int | None, typer.Option("--global-batch-tokens", help="tokens per step")]
MinBatchOpt = Annotated[int | None, typer.Option("--min-global-batch", help="lower bound, sequences")]
MaxBatchOpt = Annotated[int | None, typer.Option("--max-global-batch", help="upper bound, sequences")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="bf16 | fp16 | fp8")]
Fp8RecipeOpt = Annotated[
    str | None,
    typer.Option(
        "--fp8-recipe",
        help="with --precision fp8: tensorwise | rowwise | blockwise | mxfp8 (default: the launcher's own); "
        "priced alike",
    ),
]
DropoutOpt = Annotated[
    bool, typer.Option("--dropout", help="dropout layers active: their masks are kept for backward (default: off)")
]
AttentionKernelOpt = Annotated[
    str | None,
    typer.Option(
        "--attention-kernel",
        help="flash: the GPU's own fused kernel (cuDNN/FlashAttention-3 on Hopper+); flash2: FlashAttention-2 "
        "(e.g. PyTorch SDPA's flash backend); triton: FlashAttention in pre-MLIR Triton (llm-foundry's attn_impl "
        "triton); naive: softmax materialized. Default: flash",
    ),
]
OptimizerBytesOpt = Annotated[float, typer.Option("--optimizer-bytes", help="optimizer bytes per parameter")]
MoeDispatcherOpt = Annotated[
    str | None,
    typer.Option(
        "--moe-dispatcher",
        help="MoE models: alltoall (Megatron's all-to-all, the default) | flex (DeepEP/HybridEP: a token moves once "
        "per destination rank, FP8 dispatch in FP8 jobs)",
    ),
]
MoeEpOverlapOpt = Annotated[
    bool,
    typer.Option(
        "--moe-ep-overlap",
        help="MoE models: hide the expert all-to-all under another micro-batch's compute where Megatron allows it "
        "(--overlap-moe-expert-parallel-comm; default: off)",
    ),
]
MoeRoutingOpt = Annotated[
    str | None,
    typer.Option(
        "--moe-routing",
        help="MoE models: balanced (force-balanced routing, as benchmarks run it); default: real routing, the "
        "busiest rank's tokens at 1.2x the mean",
    ),
]


def switched_job_flags(dropout: bool, grad_bytes: float, moe_ep_overlap: bool = False) -> list[str]:
    """The job switches given other than their defaults (a saved plan carries its own: `--plan`, `--from-plan`)."""
    switches = (("--dropout", dropout), ("--grad-bytes", grad_bytes != GRAD_BYTES),
                ("--moe-ep-overlap", moe_ep_overlap))
    return [flag for flag, on in switches if on]


GRAD_BYTES = float(JobSpec.model_fields["grad_bytes_per_param"].default)  # 16-bit gradient buffers
MOE_DISPATCHER: MoeDispatcher = JobSpec.model_fields["moe_dispatcher"].default  # Megatron's all-to-all
MegatronCoreOpt = Annotated[
    str | None,
    typer.Option(
        "--megatron-core",
        help="only what this Megatron-Core release runs: 0.12.0, or a NeMo container as nemo:24.09 (default: current)",
    ),
]


def megatron_core_arg(text: str | None) -> Version | None:
    return None if text is None else parse_megatron_core(text)


GradBytesOpt = Annotated[
    float, typer.Option("--grad-bytes", help="gradient bytes per parameter: 2 (bf16, default) or 4 (fp32 main grads)")
]
HeadroomOpt = Annotated[float, typer.Option("--headroom", help="fraction of GPU memory kept free")]
CalibrationOpt = Annotated[
    str | None,
    typer.Option("--calibration", help="calibration YAML; default: the shipped calibration; 'none': raw defaults"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def model_arg(model: str | None, model_config: Path | None) -> ModelSpec:
    """Exactly one of --model (a preset or a config.json path) and --model-config."""
    from optlayout.planning.inputs import resolve_model
    from optlayout.presets import model_from_hf_config

    if model is not None and model_config is None:
        return resolve_model(model)
    if model_config is not None and model is None:
        return model_from_hf_config(model_config)
    raise InputError("model: give exactly one of --model NAME and --model-config config.json")


def cluster_arg(topology: Path | None, cluster: str | None) -> Topology:
    """Exactly one of --topology and --cluster, resolved to a Topology."""
    from optlayout.topology import resolve_cluster

    if topology is not None and cluster is None:
        return resolve_cluster(topology)
    if cluster is not None and topology is None:
        return resolve_cluster(cluster)
    raise InputError("cluster: give exactly one of --topology FILE and --cluster gpu=...,gpus=...")


def assumed_arg(cluster: str | None) -> dict[str, dict[str, Any]]:
    """What a --cluster shorthand assumed for the fields it was not given (see `cluster_assumptions`)."""
    from optlayout.topology import cluster_assumptions, parse_cluster_shorthand

    return cluster_assumptions(parse_cluster_shorthand(cluster)) if cluster is not None else {}


def moe_assumed(
    model: ModelSpec, dispatcher: str | None, ep_overlap: bool, routing: str | None
) -> dict[str, dict[str, Any]]:
    """What an MoE job took for the MoE choices its flags left out (none for a dense model)."""
    if model.moe is None:
        return {}
    left = (
        ("moe_dispatcher", dispatcher is None, MOE_DISPATCHER,
         "not given: Megatron's all-to-all token dispatcher; --moe-dispatcher flex for DeepEP/HybridEP"),
        ("moe_ep_overlap", not ep_overlap, False, "not given: off, Megatron's default; --moe-ep-overlap"),
        ("moe_routing", routing is None, "real",
         "not given: trained routing, the busiest rank's tokens 1.2x the mean; --moe-routing balanced for a "
         "force-balanced benchmark"),
    )  # fmt: skip
    return {name: {"value": value, "why": why} for name, unset, value, why in left if unset}


def print_assumed(assumed: dict[str, dict[str, Any]]) -> None:
    """One line per value assumed (by the cluster shorthand; by `memory`, dp = 1): name=value (why)."""
    for name, a in assumed.items():
        console.print(f"assumed {name}={a['value']} ({a['why']})", soft_wrap=True, highlight=False)


def note_fields(job: JobSpec, notes: list[str]) -> dict[str, Any]:
    """The JSON keys a job's `pricing_notes` (`notes`) add: its FP8 recipe (null: not stated) for an fp8 job, and the
    notes wherever the job is fp8 or one applies."""
    fp8 = {"fp8_recipe": job.fp8_recipe} if job.precision == "fp8" else {}
    return fp8 | ({"notes": notes} if fp8 or notes else {})


def print_notes(notes: list[str]) -> None:
    """One line per pricing note."""
    for note in notes:
        console.print(f"note: {note}", soft_wrap=True, highlight=False)


def job_arg(
    seq_len: int,
    global_batch: int | None,
    global_batch_tokens: int | None,
    min_global_batch: int | None = None,
    max_global_batch: int | None = None,
    precision: str = "bf16",
    optimizer_bytes: float = 12.0,
    headroom: float = 0.05,
    attention_kernel: str | None = None,
    dropout: bool = False,
    grad_bytes: float = GRAD_BYTES,
    fp8_recipe: str | None = None,
    moe_dispatcher: str | None = None,
    moe_ep_overlap: bool = False,
    moe_routing: str | None = None,
) -> JobSpec:
    """The job from the command's flags; `--grad-bytes` only as a launcher keeps gradient buffers (2 or 4)."""
    if grad_bytes not in (2, 4):
        raise InputError(f"grad-bytes: must be 2 (16-bit gradients) or 4 (fp32 main grads), the gradient buffers "
                         f"launchers keep (got {grad_bytes:g})")  # fmt: skip
    try:
        return JobSpec(
            seq_len=seq_len,
            global_batch=global_batch,
            global_batch_tokens=global_batch_tokens,
            min_global_batch=min_global_batch,
            max_global_batch=max_global_batch,
            precision=cast(Precision, precision),  # pydantic checks the literal
            optimizer_bytes_per_param=optimizer_bytes,
            memory_headroom=headroom,
            attention_kernel=cast(AttentionKernel, attention_kernel or "flash"),
            dropout=dropout,
            grad_bytes_per_param=grad_bytes,
            fp8_recipe=cast(Fp8Recipe | None, fp8_recipe),
            moe_dispatcher=cast(MoeDispatcher, moe_dispatcher or MOE_DISPATCHER),
            moe_ep_overlap=moe_ep_overlap,
            moe_routing=cast(MoeRouting | None, moe_routing),
        )
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "job")) from None


def inputs_arg(
    model: str | None,
    model_config: Path | None,
    topology: Path | None,
    cluster: str | None,
    job: JobSpec,
    calibration: str | None,
) -> tuple[ModelSpec, Topology, CostParams]:
    """The model, the cluster's Topology and the cost parameters for the GPU and the job's precision."""
    shape = model_arg(model, model_config)
    topo = cluster_arg(topology, cluster)
    return shape, topo, params_arg(calibration, topo.gpu.name, job.precision)


def calibration_arg(calibration: str | None) -> Calibration | None:
    """The calibration: the shipped one by default, a file, or None for `--calibration none`."""
    from optlayout.runs.calibrate import load_calibration, shipped_calibration_path

    if calibration is not None and calibration.lower() == "none":
        return None
    return load_calibration(calibration if calibration is not None else shipped_calibration_path())


def uncertainty_arg(fitted: Calibration | None, calibration: str | None, robust: bool) -> Uncertainty | None:
    """The calibration's held-out error model (`Calibration.uncertainty`). Without one, `--robust` is an error and
    a plain solve says on stderr what is missing."""
    if fitted is None:
        if robust:
            raise InputError("--robust: needs a calibration's held-out errors; drop --calibration none")
        return None
    if fitted.uncertainty is None:
        name = calibration or "the shipped calibration"
        missing = (f"calibration {name} has no held-out errors (schema_version {fitted.schema_version}); re-run "
                   "`optlayout calibrate` to add them")  # fmt: skip
        if robust:
            raise InputError(f"--robust: {missing}")
        err_console.print(f"note: {missing}; no prediction intervals", soft_wrap=True)
    return fitted.uncertainty


def support_arg(
    calibration: str | None, model: ModelSpec, job: JobSpec, layout: Layout, gpu: str, predicted_tps: float
) -> PredictionSupport | None:
    """One layout's interval and unsupported regimes under `--calibration` (None without held-out errors)."""
    from optlayout.runs.uncertainty import LayoutUncertainty

    u = uncertainty_arg(calibration_arg(calibration), calibration, robust=False)
    return LayoutUncertainty.on(u, model, job, gpu).support(layout, predicted_tps) if u is not None else None


def params_arg(calibration: str | None, gpu: str, precision: str) -> CostParams:
    """The cost parameters for a GPU and precision under `--calibration`."""
    return params_of(calibration_arg(calibration), gpu, precision)


def params_of(fitted: Calibration | None, gpu: str, precision: str) -> CostParams:
    """A loaded calibration's constants for a GPU and precision; the raw defaults for `--calibration none`."""
    return fitted.params_for(gpu, precision) if fitted is not None else DEFAULT_PARAMS


def gb(value_bytes: float) -> float:
    """Bytes to decimal GB, rounded for display."""
    return round(value_bytes / 1e9, 3)
