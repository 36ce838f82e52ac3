"""The legality rules of a layout, in one home: the space enumerates what they allow, `layout_problems`
checks a given layout (estimate, explain, saved plans, launchers' pre-checks), the diagnosis names them.

Memory is not a rule here: it needs the cost model (a constraint of the solver).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from optlayout.errors import InputError
from optlayout.layout.recompute import module_problems
from optlayout.layout.stages import chunk_layer_counts, stage_split, vp_fits

if TYPE_CHECKING:
    from optlayout.layout.model import Layout
    from optlayout.specs import JobSpec, ModelSpec


def field_conflicts(values: Mapping[str, object]) -> list[str]:
    """Rules between the fields of one layout, on whichever of them `values` holds (a layout, or pins)."""
    problems = []
    tp, pp, vp = values.get("tp"), values.get("pp"), values.get("vp")
    if values.get("sequence_parallel") is True and tp == 1:
        problems.append("sequence_parallel needs tp > 1")
    if isinstance(vp, int) and vp > 1 and pp == 1:
        problems.append("vp > 1 needs pp > 1")
    if values.get("recompute_layers") is not None and values.get("recompute", "full") != "full":
        problems.append("recompute_layers needs recompute=full")
    if values.get("recompute_modules") is not None and values.get("recompute", "selective") != "selective":
        problems.append("recompute_modules needs recompute=selective")
    if pp == 1 and (values.get("first_stage_layers") or values.get("last_stage_layers")):
        problems.append("first_stage_layers/last_stage_layers need pp > 1")
    cp, dp, ep, etp = values.get("cp"), values.get("dp"), values.get("ep"), values.get("etp")
    if (
        isinstance(tp, int)
        and isinstance(cp, int)
        and isinstance(dp, int)
        and isinstance(ep, int)
        and isinstance(etp, int)
    ):
        tp_ = tp
        if (tp_ * cp * dp) % (etp * ep):
            problems.append(
                f"etp*ep = {etp * ep} must divide tp*cp*dp = {tp_ * cp * dp} (Megatron's expert grid etp x ep x edp "
                "x pp covers the GPUs of tp x cp x dp x pp: etp*ep*pp divides the GPUs)"
            )
    return problems


def tp_fits_heads(model: ModelSpec, tp: int) -> bool:
    """TP splits the query heads evenly; key/value heads divide tp or are replicated to it."""
    return model.heads % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def cp_fits_sequence(seq_len: int, cp: int) -> bool:
    """Load-balanced CP cuts the sequence into 2 x cp equal chunks."""
    return cp == 1 or seq_len % (2 * cp) == 0


def sp_fits_sequence(seq_len: int, cp: int, tp: int) -> bool:
    """Sequence parallelism splits each CP rank's seq_len / cp tokens evenly over the tp ranks (Megatron's
    scatter_to_sequence_parallel_region asserts the split is even)."""
    return (seq_len // cp) % tp == 0


def pp_fits_layers(layers: int, pp: int) -> bool:
    """Every pipeline stage holds at least one layer."""
    return pp <= layers


def expert_problems(model: ModelSpec, layout: Layout) -> list[str]:
    """Megatron-Core's rules tying expert parallelism to the model (moe.md section 1.3)."""
    problems = expert_degree_problems(model, layout.ep, layout.etp)
    if model.moe is not None and layout.tp > 1 and not layout.sequence_parallel:
        problems.append(f"tp ({layout.tp}) > 1 on an MoE model needs sequence_parallel (Megatron's MoELayer)")
    return problems


def expert_degree_problems(model: ModelSpec, ep: int, etp: int) -> list[str]:
    """The rules on the expert degrees alone: experts divisible by ep, the expert width by etp, etp 1 when the
    experts carry biases, no expert parallelism on a dense model."""
    moe = model.moe
    if moe is None:
        return [] if ep == etp == 1 else ["ep/etp > 1 need a mixture-of-experts model"]
    problems = []
    if moe.experts % ep:
        problems.append(f"experts ({moe.experts}) not divisible by ep ({ep})")
    if moe.expert_ffn % etp:
        problems.append(f"expert_ffn ({moe.expert_ffn}) not divisible by etp ({etp})")
    if etp > 1 and model.bias:
        problems.append(f"etp ({etp}) must be 1: the experts carry biases (Megatron: linear biases in MoE)")
    return problems


def job_problems(model: ModelSpec, job: JobSpec) -> list[str]:
    """Rules the job must satisfy for the model, whatever the layout."""
    if not job.causal and any(model.sliding_window_flags):
        return ["causal: the model's sliding-window layers attend causally; a non-causal job cannot use them"]
    default_dispatcher = type(job).model_fields["moe_dispatcher"].default
    moe_fields = [name for name, given in (("moe_dispatcher", job.moe_dispatcher != default_dispatcher),
                                           ("moe_ep_overlap", job.moe_ep_overlap),
                                           ("moe_routing", job.moe_routing is not None)) if given]  # fmt: skip
    if model.moe is None and moe_fields:
        return [f"{', '.join(moe_fields)}: for mixture-of-experts models; {model.name} has no routed experts"]
    return []


def layout_problems(model: ModelSpec, job: JobSpec, layout: Layout, gpus: int) -> list[str]:
    """Rules a layout must satisfy to run at all, independent of memory; empty when legal. Multi-token-prediction
    modules sit on the last pipeline stage (Megatron's default placement; never the first rank when pp > 1)."""
    from optlayout.layout.model import GRID_AXES

    problems = job_problems(model, job)
    if layout.gpus != gpus:
        product = "*".join(a.key for a in GRID_AXES)
        problems.append(f"{product} = {layout.gpus} but the cluster has {gpus} GPUs")
    problems += expert_problems(model, layout)
    if layout.recompute_modules is not None:
        problems += module_problems(model, layout.recompute_modules)
    if model.heads % layout.tp:
        problems.append(f"heads ({model.heads}) not divisible by tp ({layout.tp})")
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        problems.append(f"kv_heads ({model.kv_heads}) and tp ({layout.tp}): neither divides the other")
    if not pp_fits_layers(model.layers, layout.pp):
        problems.append(f"pp ({layout.pp}) exceeds the layer count ({model.layers})")
    if not cp_fits_sequence(job.seq_len, layout.cp):
        problems.append(f"seq_len ({job.seq_len}) not divisible by 2*cp ({2 * layout.cp}) for load-balanced CP")
    elif layout.sequence_parallel and not sp_fits_sequence(job.seq_len, layout.cp, layout.tp):
        problems.append(f"sequence_parallel: the {job.seq_len // layout.cp} tokens per CP rank do not split evenly "
                        f"over tp ({layout.tp})")  # fmt: skip
    try:
        counts = stage_split(layout, model.layers)
    except ValueError as exc:
        problems.append(str(exc))
        counts = []
    if layout.vp > 1 and counts and not vp_fits(counts, layout.vp):
        problems.append(f"layers per stage {sorted(set(counts))} cannot be split into vp ({layout.vp}) chunks")
    largest_chunk = max(chunk_layer_counts(counts, layout.vp)) if counts else 0
    if layout.recompute_layers is not None and counts and layout.recompute_layers > largest_chunk:
        problems.append(
            f"recompute_layers ({layout.recompute_layers}) exceeds the layers of the largest model chunk "
            f"({largest_chunk}); leave it out to recompute them all"
        )
    if layout.vp > 1 and layout.grad_accum % layout.pp:
        problems.append(f"interleaved schedule needs micro-batches ({layout.grad_accum}) divisible by pp ({layout.pp})")
    if layout.pp > 1 and layout.grad_accum < layout.pp:
        problems.append(f"1F1B needs at least pp ({layout.pp}) micro-batches per step, got {layout.grad_accum}")
    steps = job.sequences_per_step
    if steps is not None and layout.global_batch != steps:
        problems.append(
            f"global batch micro_batch*grad_accum*dp = {layout.global_batch} differs from the job's {steps} sequences"
        )
    return problems


def check_layout(model: ModelSpec, job: JobSpec, layout: Layout, gpus: int) -> None:
    """Raise a one-line InputError naming the broken rules."""
    problems = layout_problems(model, job, layout, gpus)
    if problems:
        raise InputError("layout: " + "; ".join(problems))
