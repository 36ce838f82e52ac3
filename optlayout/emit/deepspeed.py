"""DeepSpeed config JSON for `deepspeed.initialize(model=..., config=...)`, checked against DeepSpeed 0.19.8.

DeepSpeed asserts `train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size`
(`runtime/config.py`, `_batch_assertion`), where world_size is the data-parallel size only when an mpu says so:
`mpu.get_data_parallel_world_size()` (Megatron-DeepSpeed, or a PipelineModule's grid), else every rank. So
`train_batch_size` is written only when DeepSpeed's world size is the plan's dp (tp == 1: DeepSpeed alone, or a
PipelineModule of pp stages); with tp > 1 it is left out and DeepSpeed derives it from the other two, which
holds whatever the world size it counts (AutoTP counts the TP ranks too, which share one batch).

What the JSON expresses: ZeRO stage (zero1/zero2/fsdp = 1/2/3), TP through AutoTP
(`tensor_parallel.autotp_size`, DeepSpeed >= 0.16.4), the precision and the gradient accumulation dtype the
memory model counted (`data_types.grad_accum_dtype`). What it cannot: pipeline stages (a `deepspeed.pipe.
PipelineModule(layers, num_stages=pp)` built in code), context parallelism (no DeepSpeed equivalent;
DeepSpeed-Ulysses `sequence_parallel_size` splits attention heads by all-to-all, a different scheme, and is
refused by name), Megatron-style sequence parallelism beside TP (AutoTP has none; refused), recomputation (the
model's own `gradient_checkpointing_enable()` or `deepspeed.checkpointing.checkpoint`; only full-layer recompute
exists) and dropout (the model's config).
"""

from __future__ import annotations

import json
from typing import Any

from optlayout.emit._checks import (
    global_batch,
    gradient_dtype,
    no_recompute_modules,
    no_sequence_parallel,
    node_count,
    stage_layers,
)
from optlayout.errors import UnsupportedError
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

ZERO_STAGE = {Sharding.none: 0, Sharding.zero1: 1, Sharding.zero2: 2, Sharding.fsdp: 3}
DEEPSPEED_VERSION = "0.19.8"
_WHO = "deepspeed"


def deepspeed_config(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> dict[str, Any]:
    """The config as a dict (json.dumps-ready)."""
    if model.moe is not None:
        raise UnsupportedError(
            f"{_WHO}: {model.name}: DeepSpeed-MoE's expert parallelism lives in the model code "
            "(deepspeed.moe.layer.MoE(ep_size=...), its expert and expert-DP groups from deepspeed.utils.groups), "
            "not in the JSON config this emits; emit megatron, megatron-bridge or torchtitan for an MoE plan"
        )
    batch = global_batch(job, layout, _WHO)
    no_recompute_modules(layout, _WHO, "DeepSpeed's activation checkpointing wraps whole layers, with no module list")
    node_count(layout, gpus_per_node, _WHO)
    stage = ZERO_STAGE[layout.sharding]
    if layout.cp > 1:
        raise UnsupportedError(
            f"{_WHO}: context parallelism (cp={layout.cp}) has no DeepSpeed equivalent (DeepSpeed-Ulysses "
            "sequence_parallel_size splits attention heads by all-to-all, not the sequence over a ring); use cp=1"
        )
    if layout.pp > 1 and stage >= 2:
        raise UnsupportedError(
            f"{_WHO} rule zero_optimization.stage < 2 with pipeline parallelism broken: stage {stage} "
            f"({layout.sharding.value}) with pp={layout.pp} (ZeRO-2 and ZeRO-3 are incompatible with PipelineEngine)"
        )
    if layout.pp > 1 and layout.tp > 1:
        raise UnsupportedError(
            f"{_WHO}: tp={layout.tp} with pp={layout.pp} needs Megatron-DeepSpeed's model-parallel unit (mpu); "
            "DeepSpeed's own AutoTP (tensor_parallel.autotp_size) shards a model outside a PipelineModule"
        )
    if layout.pp > 1:
        stage_layers(model, layout, _WHO)
        if layout.vp > 1 or layout.first_stage_layers is not None or layout.last_stage_layers is not None:
            raise UnsupportedError(
                f"{_WHO}: a PipelineModule has no virtual stages and balances layers itself (partition_method); "
                "plan vp=1 without first=/last="
            )
    if job.precision == "fp8":
        raise UnsupportedError(f"{_WHO}: precision {job.numerics} has no DeepSpeed config key (use bf16 plus "
                               "Transformer Engine)")  # fmt: skip
    grads = gradient_dtype(job, _WHO)
    if stage == 0 and grads == "fp32":
        raise UnsupportedError(
            f"{_WHO}: ZeRO stage 0 accumulates gradients in the model's {job.precision} (fp32 accumulation needs "
            "ZeRO); plan sharding=zero1 or 16-bit gradients"
        )
    no_sequence_parallel(layout, _WHO, "AutoTP keeps the norms' and dropouts' activations whole on every TP rank "
                         "and its all-reduces block")  # fmt: skip
    config: dict[str, Any] = {}
    if layout.tp == 1:
        config["train_batch_size"] = batch
    config |= {
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "zero_optimization": {"stage": stage},
    }
    if stage:
        config["zero_optimization"] |= {"overlap_comm": True, "contiguous_gradients": True}
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    config[job.precision] = {"enabled": True}
    config["data_types"] = {"grad_accum_dtype": grads}
    if layout.recompute is not Recompute.none:
        config["activation_checkpointing"] = {
            "partition_activations": layout.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return config


def deepspeed_json(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The config as indented JSON (JSON has no comments: `deepspeed_notes` says what goes with it)."""
    return json.dumps(deepspeed_config(model, job, layout, gpus_per_node), indent=2) + "\n"


def deepspeed_notes(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> list[str]:
    """What the user's code must do for this JSON to run the plan."""
    config = deepspeed_config(model, job, layout, gpus_per_node)
    nodes, per_node = node_count(layout, gpus_per_node, _WHO)
    notes = [
        f"optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.precision}; DeepSpeed "
        f"{DEEPSPEED_VERSION}",
        f"world {layout.gpus} = {nodes} node(s) x {per_node} GPUs: deepspeed --num_nodes {nodes} --num_gpus {per_node} "
        "--hostfile hostfile train.py --deepspeed_config ds_config.json, with "
        "deepspeed.initialize(model=model, config='ds_config.json') in train.py",
        f"the global batch is {layout.global_batch} sequences = micro {layout.micro_batch} x accumulation "
        f"{layout.grad_accum} x dp {layout.dp}; pass no mpu (DeepSpeed builds the data-parallel group)",
    ]
    if layout.tp > 1:
        notes.append(
            f"tp={layout.tp}: AutoTP shards the model's linear layers; train_batch_size is left for DeepSpeed to "
            f"derive (it counts all {layout.gpus} ranks, tp times the sequences per step)"
        )
    if layout.pp > 1:
        notes.append(
            f"pp={layout.pp}: build the model as deepspeed.pipe.PipelineModule(layers, num_stages={layout.pp}, "
            "partition_method='uniform'); the engine takes the data-parallel size from its grid"
        )
    if layout.recompute is not Recompute.none and layout.recompute_layers is not None:
        notes.append(
            f"recompute: wrap the first {layout.recompute_layers} layers of each pipeline stage in "
            "deepspeed.checkpointing.checkpoint and run the rest unwrapped (Megatron's block method, as planned); "
            "activation_checkpointing configures that"
        )
    elif layout.recompute is not Recompute.none:
        selective = layout.recompute is Recompute.selective
        notes.append(
            "recompute: call model.gradient_checkpointing_enable() (Hugging Face) or wrap each layer in "
            "deepspeed.checkpointing.checkpoint; activation_checkpointing configures that"
            + ("; full-layer recompute stands in for selective (less memory)" if selective else "")
        )
    notes.append(
        f"memory as planned: {config['data_types']['grad_accum_dtype']} gradients, ZeRO stage "
        f"{config['zero_optimization']['stage']}, no offloading; dropout is the model's own (the plan assumes "
        f"{'0.1' if job.dropout else 'none'})"
    )
    return notes
