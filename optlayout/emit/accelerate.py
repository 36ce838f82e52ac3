"""Hugging Face Accelerate config YAML for FSDP2 with an N-D `parallelism_config` (no pipeline parallelism).

Keys follow `examples/torch_native_parallelism/configs/tp_hsdp.yaml`; `ParallelismConfig` orders its mesh
`dp_replicate, dp_shard, cp, tp` and rejects TP/CP over pure replication (dp_shard == 1 with dp_replicate > 1).
"""

from __future__ import annotations

from typing import Any

import yaml

from optlayout.emit._checks import dp_split, global_batch, node_count
from optlayout.errors import UnsupportedError
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding


def accelerate_config(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> dict[str, Any]:
    """The config as a dict (yaml.safe_dump-ready)."""
    who = "accelerate"
    global_batch(job, layout, who)
    nodes, _ = node_count(layout, gpus_per_node, who)
    if layout.pp > 1:
        raise UnsupportedError(f"{who}: no pipeline parallelism in Accelerate's ParallelismConfig (pp={layout.pp})")
    replicate, shard = dp_split(layout)
    if (layout.tp > 1 or layout.cp > 1) and replicate > 1 and shard == 1:
        raise UnsupportedError(
            f"{who} rule tp/cp > 1 needs dp_shard_size > 1 when dp_replicate_size > 1 broken: "
            f"tp={layout.tp}, cp={layout.cp} over {replicate} unsharded replicas (use sharding=zero2 or fsdp)"
        )
    fsdp = shard > 1
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if fsdp else "MULTI_GPU",
        "mixed_precision": job.precision,
        "num_machines": nodes,
        "num_processes": layout.gpus,
        "machine_rank": 0,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,
    }
    if fsdp:
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.sharding is Sharding.fsdp,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": layout.recompute is not Recompute.none,
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": False,
        }
    config["parallelism_config"] = {
        "parallelism_config_dp_replicate_size": replicate,
        "parallelism_config_dp_shard_size": shard,
        "parallelism_config_tp_size": layout.tp,
        "parallelism_config_cp_size": layout.cp,
    }
    return config


def accelerate_yaml(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The config as YAML for `accelerate launch --config_file`, with comment lines on what was mapped."""
    config = accelerate_config(model, job, layout, gpus_per_node)
    notes = [
        f"# optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.precision}",
        f"# per-device batch {layout.micro_batch}, gradient_accumulation_steps {layout.grad_accum}; "
        "set machine_rank per node (e.g. $SLURM_NODEID)",
    ]
    if layout.sharding is Sharding.zero1:
        notes.append("# FSDP2 has no ZeRO-1: no resharding after forward (ZeRO-2-like) stands in")
    if layout.recompute is Recompute.selective:
        notes.append("# fsdp_activation_checkpointing recomputes whole layers (no selective mode in Accelerate)")
    return "\n".join(notes) + "\n" + yaml.safe_dump(config, sort_keys=False)
