"""Checks and derived numbers every emitter shares: the batch identity, the node count, the stage split."""

from __future__ import annotations

from optlayout.cost.memory import state_bytes_per_gpu
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


def expert_fsdp_degree(layout: Layout, etp: int, who: str) -> int:
    """efsdp of torchtitan's sparse mesh `[pp, dp_replicate, efsdp, ep, etp]`: the ranks of the dense region
    dp_shard x cp x tp left after ep x etp (EP borrows from that region, never from dp_replicate), or a refusal
    naming the rule when ep x etp does not divide it."""
    shard = dp_split(layout)[1]
    region = shard * layout.cp * layout.tp
    if region % (layout.ep * etp):
        raise UnsupportedError(
            f"{who} rule (dp_shard * cp * tp) % (ep * etp) == 0 broken: EP borrows only from dp_shard x cp x tp = "
            f"{shard} x {layout.cp} x {layout.tp} = {region}, not from dp_replicate (sharding=none), for "
            f"ep={layout.ep}, etp={etp}"
        )
    return region // (layout.ep * etp)


# The Qwen3 MoE models torchtitan (models/qwen3/__init__.py at v0.2.2 and 0.3.0) and Megatron-Bridge 0.3.1
# (recipes/qwen/qwen3_moe.py, from the Hugging Face configs) build: every layer MoE, no shared expert, untied,
# per-head query/key norms; each brings its own RoPE base and norm epsilon (the layout depends on neither).
QWEN3_MOE_FLAVORS: dict[str, tuple[int, int, int, int, int, int, int, int, int]] = {
    # layers, hidden, heads, kv_heads, head_dim, vocab, experts, top_k, expert_ffn
    "30B-A3B": (48, 2048, 32, 4, 128, 151936, 128, 8, 768),
    "235B-A22B": (94, 4096, 64, 4, 128, 151936, 128, 8, 1536),
}


def qwen3_moe_flavor(model: ModelSpec, who: str, why: str) -> str:
    """The Qwen3 MoE flavor (`30B-A3B`, `235B-A22B`) that is this model, or a one-line refusal naming what differs
    (and `why` only these)."""
    moe = model.moe
    shape = None if moe is None else (model.layers, model.hidden, model.heads, model.kv_heads,
                                      model.head_dim or model.hidden // model.heads, model.vocab, moe.experts,
                                      moe.top_k, moe.expert_ffn)  # fmt: skip
    flavor = next((name for name, dims in QWEN3_MOE_FLAVORS.items() if dims == shape), None)
    if moe is None or flavor is None:
        raise UnsupportedError(
            f"{who}: {model.name} is none of the Qwen3 MoE models (30B-A3B, 235B-A22B by layers, hidden, heads, "
            f"kv_heads, head_dim, vocab, experts, top_k, expert_ffn); {why}"
        )
    problems = []
    if moe.shared_experts or not all(model.moe_layer_flags):
        problems.append("shared experts or dense layers (the flavor has neither)")
    if model.mlp != "swiglu" or model.bias or model.tied_embeddings or model.position_embeddings or model.alibi:
        problems.append("not a SwiGLU, bias-free, untied, rotary model")
    if model.attention.kind != "gqa" or model.attention.sliding_window is not None or model.mtp_layers:
        problems.append("attention other than full GQA, or MTP layers")
    if not model.attention.qk_norm:
        problems.append("no query/key norms (attention.qk_norm; the flavor has them)")
    if problems:
        raise UnsupportedError(f"{who}: {model.name} has Qwen3-{flavor}'s shape but {'; '.join(problems)}")
    return flavor


def gradient_dtype(job: JobSpec, who: str, reduced_state: bool = False) -> str:
    """The gradient buffers the plan counted: `bf16`/`fp16` for 2 bytes per parameter, `fp32` for 4.

    The emitters write the flag that makes the launcher keep exactly these (Megatron `--grad-reduce-in-bf16`,
    DeepSpeed `data_types.grad_accum_dtype`, Megatron-Bridge `grad_reduce_in_fp32`) or refuse the plan; likewise
    the optimizer state: fp32 (mixed-precision Adam's 12 bytes) unless the emitter writes a `reduced_state`.
    """
    if job.optimizer != "adam":
        raise UnsupportedError(f"{who}: optimizer {job.optimizer}: the emitted configs are Adam's only "
                               "(mixed-precision Adam)")  # fmt: skip
    if job.weight_bytes_per_param != 2 or not job.optimizer_bytes_match_dtypes:
        raise UnsupportedError(
            f"{who}: the plan counted {job.weight_bytes_per_param:g} B/param of weights and "
            f"{job.optimizer_bytes_per_param:g} of optimizer state; the launchers keep 16-bit weights and the "
            "bytes of the optimizer-state dtypes (mixed-precision Adam: 12, fp32 master, momentum and variance)"
        )
    if job.reduced_optimizer_state and not reduced_state:
        dtypes = ", ".join(f"{name} {dtype}" for name, dtype in job.reduced_optimizer_state.items())
        raise UnsupportedError(f"{who}: the plan keeps {dtypes}; this launcher's optimizer state is fp32 here "
                               "(Megatron-LM's --use-precision-aware-optimizer expresses it)")  # fmt: skip
    if job.grad_bytes_per_param == 2:
        return "fp16" if job.precision == "fp16" else "bf16"
    if job.grad_bytes_per_param == 4:
        return "fp32"
    raise UnsupportedError(
        f"{who}: grad_bytes_per_param {job.grad_bytes_per_param:g} is neither 2 (16-bit gradients) nor 4 (fp32); "
        "no launcher keeps other gradient buffers"
    )


def planned_state_bytes(job: JobSpec, layout: Layout, group: int | None = None) -> float:
    """Training-state bytes per parameter the memory model counts on a GPU, sharded as planned over `group`:
    dp x cp by default (dense parameters), the expert-DP `layout.edp` for routed experts."""
    return sum(state_bytes_per_gpu(1.0, job, layout.sharding, layout.dp * layout.cp if group is None else group))


def fsdp2_state_bytes(shard: int, keep_gathered: bool) -> float:
    """Bytes per parameter FSDP2 keeps with fp32 sharded parameters (torchtitan, Accelerate mixed precision):
    fp32 weights, fp32 gradients (the sharded parameters' dtype) and Adam's two moments, all sharded over
    `shard` ranks (16/shard), plus the 2-byte gathered weights when they are kept after forward."""
    return 16 / shard + (2 if keep_gathered else 0)


def fsdp2_fits_plan(
    job: JobSpec, layout: Layout, shard: int, keep_gathered: bool, who: str, experts: bool = False
) -> None:
    """Refuse a plan whose state FSDP2 would hold in more bytes than the memory model counted (with `experts`,
    for the routed experts, which the plan shards over expert-DP)."""
    gradient_dtype(job, who)
    kept = fsdp2_state_bytes(shard, keep_gathered)
    planned = planned_state_bytes(job, layout, layout.edp if experts else None)
    if kept > planned + 1e-9:
        raise UnsupportedError(
            f"{who}: FSDP2 keeps {kept:.2f} B/param of {'expert ' if experts else ''}state here (fp32 weights, "
            "gradients and Adam moments over "
            f"{shard} ranks{', plus gathered 16-bit weights' if keep_gathered else ''}), the plan counted "
            f"{planned:.2f} for {layout.sharding.value} with {job.grad_bytes_per_param:g}-byte gradients: plan with "
            "sharding=zero1 or fsdp, or with 4-byte gradients"
        )


def no_dropout(job: JobSpec, who: str, why: str) -> None:
    if job.dropout:
        raise UnsupportedError(f"{who}: the plan counted dropout masks, but {why}")


def no_sequence_parallel(layout: Layout, who: str, why: str) -> None:
    """Refuse sequence parallelism beside TP where the launcher's TP has none: the plan counts the norms' and
    dropouts' activations sharded over TP and part of the TP collectives hidden (cost.step.tp_exposed_share)."""
    if layout.tp > 1 and layout.sequence_parallel:
        raise UnsupportedError(
            f"{who}: sequence parallelism (sp) with tp={layout.tp} has no equivalent: {why}, where the plan shards "
            "them and hides part of the TP collectives; plan without sp"
        )


def no_recompute_modules(layout: Layout, who: str, why: str) -> None:
    """Refuse a selective module set (Megatron's --recompute-modules) a launcher cannot express."""
    if layout.recompute_modules is not None:
        modules = "+".join(m.value for m in layout.recompute_modules)
        raise UnsupportedError(f"{who}: recompute=selective:{modules}: {why}; plan with recompute=selective "
                               "(the attention core) or recompute=full")  # fmt: skip
