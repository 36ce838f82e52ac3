"""Megatron-Bridge recipe overrides: the Hydra `key=value` lines NeMo users append to a recipe run.

Targets megatron-bridge 0.3.1 (the release on PyPI, on megatron-core 0.16): `torchrun ... scripts/training/
run_recipe.py --recipe llama31_70b_pretrain_config $(cat overrides.txt)`, applied by `process_config_with_overrides`
to the recipe's `ConfigContainer` in struct mode (an unknown key is an error). The sections are the
container's: `model` (the GPT provider, a megatron-core `TransformerConfig`), `train`, `dataset`, `ddp`,
`optimizer`, `mixed_precision`, `comm_overlap`. NVIDIA publishes its recipes this way, starting from a recipe
per model, so the plan's model must be one that has a recipe (`BRIDGE_RECIPES`): the Llama 3 / 3.1 ones, and for
mixture-of-experts the Qwen3 MoE ones (`recipes/qwen/qwen3_moe.py`), which read the shape from the Hugging Face
config; the overrides then set the expert degrees, the token dispatcher the plan priced (the recipes switch to
DeepEP's flex dispatcher on GPUs that have it), forced load balance for a balanced benchmark, and the pipeline
split the plan counted (the 235B recipe counts the embedding and loss as layers in it).

The memory-relevant keys realize the memory model's assumptions: dropout off, gradient buffers of the planned
width (`mixed_precision.grad_reduce_in_fp32`, which Bridge copies onto `ddp` at setup; recipes that name
their mixed precision by string keep `bf16_mixed`'s fp32 gradients, so a 16-bit-gradient plan is refused
for them), recompute as planned, no offloading, and TP communication overlap off as the cost model assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from optlayout.cost.step import tp_overlap_applies
from optlayout.emit._checks import global_batch, gradient_dtype, node_count, qwen3_moe_flavor, stage_layers
from optlayout.emit.megatron import fp8_format_and_recipe, megatron_problems, pipeline_layout_string
from optlayout.errors import UnsupportedError
from optlayout.layout.recompute import DEFAULT_MODULES
from optlayout.layout.text import format_layout, recompute_text
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, RopeScaling, Sharding

BRIDGE_VERSION = "0.3.1"
_WHO = "megatron-bridge"
_STRATEGY = {Sharding.zero2: "optim_grads", Sharding.fsdp: "optim_grads_params"}


@dataclass(frozen=True)
class BridgeRecipe:
    """A pretraining recipe of `megatron/bridge/recipes/llama/llama3.py` and what it sets that matters here."""

    name: str
    shape: tuple[int, ...]  # layers, hidden, ffn, heads, kv_heads; () for an MoE recipe (matched by Qwen3 flavor)
    llama31: bool  # Llama 3.1 RoPE scaling
    mixed_precision_object: bool  # `cfg.mixed_precision = bf16_mixed()` rather than the string "bf16_mixed"
    comm_overlap: bool  # sets a CommOverlapConfig (TP overlap tuned for one layout)
    pipeline_split_counts_embedding: bool = False  # account_for_embedding/loss_in_pipeline_split


BRIDGE_RECIPES = (
    BridgeRecipe("llama3_8b_pretrain_config", (32, 4096, 14336, 32, 8), False, False, False),
    BridgeRecipe("llama3_70b_pretrain_config", (80, 8192, 28672, 64, 8), False, True, True),
    BridgeRecipe("llama31_8b_pretrain_config", (32, 4096, 14336, 32, 8), True, False, False),
    BridgeRecipe("llama31_70b_pretrain_config", (80, 8192, 28672, 64, 8), True, True, True),
    BridgeRecipe("llama31_405b_pretrain_config", (126, 16384, 53248, 128, 8), True, True, True),
)
BRIDGE_MOE_RECIPES = {  # Qwen3 MoE flavor -> recipe (mixed precision "bf16_mixed" from _pretrain_common, no overlap)
    "30B-A3B": BridgeRecipe("qwen3_30b_a3b_pretrain_config", (), False, False, False),
    "235B-A22B": BridgeRecipe("qwen3_235b_a22b_pretrain_config", (), False, False, False, True),
}


def bridge_recipe(model: ModelSpec) -> BridgeRecipe:
    """The recipe whose model is this one (Llama 3 / 3.1 shapes, vocabulary 128256, RoPE base 500000; Qwen3 MoE)."""
    if model.moe is not None:
        names = ", ".join(r.name for r in BRIDGE_MOE_RECIPES.values())
        return BRIDGE_MOE_RECIPES[qwen3_moe_flavor(model, _WHO, f"the MoE pretraining recipes handled are {names}")]
    shape = (model.layers, model.hidden, model.ffn, model.heads, model.kv_heads)
    llama = model.vocab == 128256 and model.rope_theta == 500000 and model.mlp == "swiglu" and not model.bias
    scaling = None if model.rope_scaling is None else model.rope_scaling == RopeScaling()
    for recipe in BRIDGE_RECIPES:
        if llama and recipe.shape == shape and scaling in (None, True) and recipe.llama31 == bool(scaling):
            return recipe
    raise UnsupportedError(
        f"{_WHO}: no megatron-bridge {BRIDGE_VERSION} pretraining recipe builds {model.name} (recipes: "
        f"{', '.join(r.name for r in BRIDGE_RECIPES)})"
    )


def bridge_overrides(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> list[str]:
    """The `section.key=value` overrides, in section order; Megatron's own rules are checked first."""
    problems = megatron_problems(model, job, layout, gpus_per_node)
    if problems:
        raise UnsupportedError("; ".join(p.replace("megatron", _WHO, 1) for p in problems))
    recipe = bridge_recipe(model)
    global_batch(job, layout, _WHO)
    node_count(layout, gpus_per_node, _WHO)
    grads = gradient_dtype(job, _WHO)
    if grads != "fp32" and not recipe.mixed_precision_object:
        raise UnsupportedError(
            f"{_WHO}: {recipe.name} names its mixed precision 'bf16_mixed' (fp32 gradient reduction), which an "
            "override cannot change: plan with 4-byte gradients"
        )
    tp, pp, vp = layout.tp, layout.pp, layout.vp
    out = [
        f"model.tensor_model_parallel_size={tp}",
        f"model.pipeline_model_parallel_size={pp}",
        f"model.virtual_pipeline_model_parallel_size={vp if vp > 1 else 'null'}",
        f"model.context_parallel_size={layout.cp}",
        f"model.sequence_parallel={_bool(layout.sequence_parallel)}",
    ]
    if model.moe is not None:
        out += [
            f"model.expert_model_parallel_size={layout.ep}",
            f"model.expert_tensor_parallel_size={layout.etp}",
            f"model.moe_token_dispatcher_type={job.moe_dispatcher}",
            f"model.moe_router_force_load_balancing={_bool(job.moe_routing == 'balanced')}",
            f"model.overlap_moe_expert_parallel_comm={_bool(job.moe_ep_overlap)}",
        ]
    if recipe.pipeline_split_counts_embedding:  # the plan's split counts transformer layers only
        out += ["model.account_for_embedding_in_pipeline_split=false", "model.account_for_loss_in_pipeline_split=false"]
    counts = stage_layers(model, layout, _WHO)
    if len(set(counts)) > 1:
        if vp > 1 and any(n % vp for n in counts):
            out.append(f"model.pipeline_model_parallel_layout='{pipeline_layout_string(counts, vp)}'")
        else:
            out += [
                f"model.num_layers_in_first_pipeline_stage={counts[0]}",
                f"model.num_layers_in_last_pipeline_stage={counts[-1]}",
            ]
    out += _recompute(layout)
    dropout = "0.1" if job.dropout else "0.0"
    out += [
        f"model.attention_dropout={dropout}",
        f"model.hidden_dropout={dropout}",
        f"model.seq_length={job.seq_len}",
        f"dataset.sequence_length={job.seq_len}",
        f"train.micro_batch_size={layout.micro_batch}",
        f"train.global_batch_size={layout.global_batch}",
    ]
    distributed = layout.sharding is not Sharding.none
    fsdp = layout.sharding in _STRATEGY
    out += [
        f"ddp.use_distributed_optimizer={_bool(distributed)}",
        f"optimizer.use_distributed_optimizer={_bool(distributed)}",
        f"ddp.use_megatron_fsdp={_bool(fsdp)}",
        f"ddp.data_parallel_sharding_strategy={_STRATEGY.get(layout.sharding, 'no_shard')}",
        f"ddp.overlap_grad_reduce={_bool(layout.dp > 1)}",
        f"ddp.overlap_param_gather={_bool(layout.dp > 1 and distributed)}",
    ]
    if recipe.mixed_precision_object:
        out.append(f"mixed_precision.grad_reduce_in_fp32={_bool(grads == 'fp32')}")
        if job.precision == "fp8":
            fp8_format, fp8_recipe = fp8_format_and_recipe(job, _WHO)  # not stated: Bridge's default, tensorwise
            out.append(f"mixed_precision.fp8={fp8_format}")
            if fp8_recipe is not None:
                out.append(f"mixed_precision.fp8_recipe={fp8_recipe}")
            # FP8 primary weights as planned (the plan's own setting, not the base recipe's bf16_mixed); MXFP8 gathers
            # through the gradient buffer, which Bridge requires with them (training/mixed_precision.py @v0.4.0 92-96)
            out.append(f"mixed_precision.fp8_param_gather={_bool(job.fp8_param_gather)}")
            if job.fp8_recipe == "mxfp8":
                out.append(f"mixed_precision.reuse_grad_buf_for_mxfp8_param_ag={_bool(job.fp8_param_gather)}")
    elif job.precision != "bf16":
        raise UnsupportedError(f"{_WHO}: {recipe.name} names its mixed precision 'bf16_mixed'; precision must be bf16")
    # The TP overlap as the plan prices it (cost.step.tp_overlap_applies: TP with SP). Bridge keeps it only with
    # tp >= 2 and SP (training/comm_overlap.py @v0.3.1, _get_model_comm_overlap_cfgs); the recipe's userbuffers
    # settings are per GEMM, the buffers' shape comes from the model (setup: tp_comm_overlap_cfg as a dict)
    if recipe.comm_overlap:
        out.append(f"comm_overlap.tp_comm_overlap={_bool(tp_overlap_applies(layout))}")
    return out


def _recompute(layout: Layout) -> list[str]:
    if layout.recompute is Recompute.selective:
        return [
            "model.recompute_granularity=selective",
            "model.recompute_method=null",
            f"model.recompute_modules=[{','.join(m.value for m in layout.recompute_modules or DEFAULT_MODULES)}]",
        ]
    if layout.recompute is Recompute.full:
        method, layers = ("uniform", 1) if layout.recompute_layers is None else ("block", layout.recompute_layers)
        return ["model.recompute_granularity=full", f"model.recompute_method={method}",
                f"model.recompute_num_layers={layers}"]  # fmt: skip
    return ["model.recompute_granularity=null", "model.recompute_method=null", "model.recompute_num_layers=null"]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def bridge_text(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """One override per line: `run_recipe.py --recipe NAME $(cat overrides.txt)` passes them unchanged (Hydra,
    not the shell, reads the quotes of a pipeline layout string)."""
    return "\n".join(bridge_overrides(model, job, layout, gpus_per_node)) + "\n"


def bridge_notes(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> list[str]:
    """The recipe to start from and the launch command."""
    overrides = bridge_overrides(model, job, layout, gpus_per_node)
    recipe = bridge_recipe(model)
    nodes, per_node = node_count(layout, gpus_per_node, _WHO)
    grads = next((o.split("=")[1] for o in overrides if o.startswith("mixed_precision.grad_reduce_in_fp32")), "true")
    notes = [
        f"optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.numerics}; megatron-bridge "
        f"{BRIDGE_VERSION}",
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend static --node-rank $SLURM_NODEID "
        f"--master-addr $MASTER_ADDR scripts/training/run_recipe.py --recipe {recipe.name} $(cat overrides.txt)",
        "the recipe reads the model from its Hugging Face config (AutoBridge.from_hf_pretrained) and trains on mock "
        "data with a NullTokenizer until you set dataset.blend and the tokenizer",
        f"memory as planned: {'fp32' if grads == 'true' else '16-bit'} gradient buffers, dropout "
        f"{'0.1' if job.dropout else 'off'}, recompute {recompute_text(layout)}, no offloading",
    ]
    if tp_overlap_applies(layout) and not recipe.comm_overlap:
        notes.append(
            f"{recipe.name} sets no CommOverlapConfig, which an override cannot add: its TP collectives block, where "
            "the plan hides part of them under the GEMMs (TP overlap with SP); set cfg.comm_overlap = "
            "CommOverlapConfig(tp_comm_overlap=True) in the recipe to run as planned"
        )
    return notes
