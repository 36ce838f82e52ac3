"""DeepSpeed config JSON: batch identity, ZeRO stage, precision and activation checkpointing.

DeepSpeed asserts `train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size`
where world_size is the data-parallel size (`mpu.get_data_parallel_world_size()` when Megatron-DeepSpeed passes
an mpu); TP, PP and CP degrees belong to that framework, not to this file.
"""

from __future__ import annotations

import json
from typing import Any

from optlayout.emit._checks import global_batch, node_count
from optlayout.errors import UnsupportedError
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

ZERO_STAGE = {Sharding.none: 0, Sharding.zero1: 1, Sharding.zero2: 2, Sharding.fsdp: 3}


def deepspeed_config(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> dict[str, Any]:
    """The config as a dict (json.dumps-ready)."""
    who = "deepspeed"
    batch = global_batch(job, layout, who)
    node_count(layout, gpus_per_node, who)
    stage = ZERO_STAGE[layout.sharding]
    if layout.pp > 1 and stage >= 2:
        raise UnsupportedError(
            f"{who} rule zero_optimization.stage < 2 with pipeline parallelism broken: stage {stage} "
            f"({layout.sharding.value}) with pp={layout.pp} (ZeRO-2 and ZeRO-3 are incompatible with PipelineEngine)"
        )
    if job.precision == "fp8":
        raise UnsupportedError(f"{who}: precision fp8 has no DeepSpeed config key (use bf16 plus Transformer Engine)")
    config: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "zero_optimization": {"stage": stage},
    }
    if stage:
        config["zero_optimization"] |= {"overlap_comm": True, "contiguous_gradients": True}
    config[job.precision] = {"enabled": True}
    if layout.recompute is not Recompute.none:
        config["activation_checkpointing"] = {
            "partition_activations": layout.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return config


def deepspeed_json(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The config as indented JSON."""
    return json.dumps(deepspeed_config(model, job, layout, gpus_per_node), indent=2) + "\n"
