"""The legality rules of a layout, in one home: the space enumerates what they allow, `layout_problems`
checks a given layout (estimate, explain, saved plans, launchers' pre-checks), the diagnosis names them.

Memory is not a rule here: it needs the cost model (a constraint of the solver).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from optlayout.errors import InputError
from optlayout.layout.stages import stage_split, vp_fits

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
    if pp == 1 and (values.get("first_stage_layers") or values.get("last_stage_layers")):
        problems.append("first_stage_layers/last_stage_layers need pp > 1")
    return problems


def tp_fits_heads(model: ModelSpec, tp: int) -> bool:
    """TP splits the query heads evenly; key/value heads divide tp or are replicated to it."""
    return model.heads % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def cp_fits_sequence(seq_len: int, cp: int) -> bool:
    """Load-balanced CP cuts the sequence into 2 x cp equal chunks."""
    return cp == 1 or seq_len % (2 * cp) == 0


def pp_fits_layers(layers: int, pp: int) -> bool:
    """Every pipeline stage holds at least one layer."""
    return pp <= layers


def layout_problems(model: ModelSpec, job: JobSpec, layout: Layout, gpus: int) -> list[str]:
    """Rules a layout must satisfy to run at all, independent of memory; empty when legal."""
    from optlayout.layout.model import GRID_AXES

    problems = []
    if layout.gpus != gpus:
        product = "*".join(a.key for a in GRID_AXES)
        problems.append(f"{product} = {layout.gpus} but the cluster has {gpus} GPUs")
    if model.heads % layout.tp:
        problems.append(f"heads ({model.heads}) not divisible by tp ({layout.tp})")
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        problems.append(f"kv_heads ({model.kv_heads}) and tp ({layout.tp}): neither divides the other")
    if not pp_fits_layers(model.layers, layout.pp):
        problems.append(f"pp ({layout.pp}) exceeds the layer count ({model.layers})")
    if not cp_fits_sequence(job.seq_len, layout.cp):
        problems.append(f"seq_len ({job.seq_len}) not divisible by 2*cp ({2 * layout.cp}) for load-balanced CP")
    try:
        counts = stage_split(layout, model.layers)
    except ValueError as exc:
        problems.append(str(exc))
        counts = []
    if layout.vp > 1 and counts and not vp_fits(counts, layout.vp):
        problems.append(f"layers per stage {sorted(set(counts))} cannot be split into vp ({layout.vp}) chunks")
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
