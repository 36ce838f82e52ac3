"""Checks and derived numbers every emitter shares: the batch identity, the node count, the stage split."""

from __future__ import annotations

from optlayout.errors import InputError, UnsupportedError
from optlayout.layout.model import GRID_AXES
from optlayout.layout.rules import pp_fits_layers
from optlayout.layout.stages import stage_split
from optlayout.specs import JobSpec, Layout, ModelSpec, Sharding


def global_batch(job: JobSpec, layout: Layout, who: str) -> int:
    """Sequences per step: the job's when given (it must equal mb*ga*dp), else the layout's."""
    wanted = job.sequences_per_step
    if wanted is None:
        return layout.global_batch
    per_step = layout.micro_batch * layout.dp
    if wanted % per_step:
        raise InputError(
            f"{who} rule global_batch % (micro_batch * dp) == 0 broken: global batch {wanted} is not a multiple of "
            f"micro_batch {layout.micro_batch} x dp {layout.dp} = {per_step}"
        )
    if wanted != layout.global_batch:
        raise InputError(
            f"{who} rule global_batch == micro_batch * grad_accum * dp broken: the job asks for {wanted} sequences, "
            f"the layout gives {layout.micro_batch} x {layout.grad_accum} x {layout.dp} = {layout.global_batch} "
            f"(grad_accum should be {wanted // per_step})"
        )
    return wanted


def node_count(layout: Layout, gpus_per_node: int, who: str) -> tuple[int, int]:
    """(nodes, processes per node) of the world; a world larger than one node must fill whole nodes."""
    if gpus_per_node < 1:
        raise InputError(f"{who}: gpus_per_node must be at least 1 (got {gpus_per_node})")
    world = layout.gpus
    if world <= gpus_per_node:
        return 1, world
    if world % gpus_per_node:
        product = "*".join(a.key for a in GRID_AXES)
        raise UnsupportedError(
            f"{who}: world size {product} = {world} is not a multiple of gpus_per_node ({gpus_per_node})"
        )
    return world // gpus_per_node, gpus_per_node


def stage_layers(model: ModelSpec, layout: Layout, who: str) -> list[int]:
    """Transformer layers on each pipeline rank, the same split the cost model assumes."""
    if not pp_fits_layers(model.layers, layout.pp):
        raise InputError(f"{who}: pp ({layout.pp}) exceeds the model's {model.layers} layers")
    try:
        return stage_split(layout, model.layers)
    except ValueError as exc:
        raise InputError(f"{who}: {exc}") from None


def dp_split(layout: Layout) -> tuple[int, int]:
    """(dp_replicate, dp_shard): the DP degree shards state for zero1/zero2/fsdp and replicates it otherwise."""
    if layout.sharding is Sharding.none:
        return layout.dp, 1
    return 1, layout.dp
