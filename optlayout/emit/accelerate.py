"""Hugging Face Accelerate config YAML (`accelerate launch --config_file`) for FSDP2 with an N-D
`parallelism_config` (no pipeline parallelism), checked against Accelerate 1.15.

Keys follow `commands/config/config_args.py` (`ClusterConfig`) and
`examples/torch_native_parallelism/configs/tp_hsdp.yaml`. `ParallelismConfig` orders its mesh
`dp_replicate, dp_shard, cp, tp`, rejects TP/CP over pure replication (dp_shard == 1 with dp_replicate > 1) and
FSDP with nothing to shard over (dp_shard == cp == 1), so FSDP is used when dp_shard or cp exceeds one, and
FSDP2 shards over dp_shard x cp. A multi-node config names the main process (`main_process_ip`, the first
host) and its port, else `accelerate launch` hands torchrun `None:29500`; `machine_rank` is set per node on
the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from optlayout.emit._checks import (
    dp_split,
    fsdp2_fits_plan,
    global_batch,
    no_recompute_modules,
    no_sequence_parallel,
    node_count,
)
from optlayout.errors import UnsupportedError
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

ACCELERATE_VERSION = "1.15.0"
MAIN_PROCESS_PORT = 29500
_WHO = "accelerate"


def accelerate_config(
    model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8, hostnames: Sequence[str] | None = None
) -> dict[str, Any]:
    """The config as a dict (yaml.safe_dump-ready); `hostnames` names the nodes, the first runs the main process."""
    global_batch(job, layout, _WHO)
    no_recompute_modules(layout, _WHO, "fsdp_activation_checkpointing wraps whole layers, with no module list")
    nodes, _ = node_count(layout, gpus_per_node, _WHO)
    if layout.pp > 1:
        raise UnsupportedError(f"{_WHO}: no pipeline parallelism in Accelerate's ParallelismConfig (pp={layout.pp})")
    replicate, shard = dp_split(layout)
    if (layout.tp > 1 or layout.cp > 1) and replicate > 1 and shard == 1:
        raise UnsupportedError(
            f"{_WHO} rule tp/cp > 1 needs dp_shard_size > 1 when dp_replicate_size > 1 broken: "
            f"tp={layout.tp}, cp={layout.cp} over {replicate} unsharded replicas (use sharding=zero1, zero2 or fsdp)"
        )
    if job.precision == "fp8":
        raise UnsupportedError(f"{_WHO}: precision {job.numerics} needs an fp8_config of your own (Transformer "
                               "Engine or MS-AMP recipe kwargs)")  # fmt: skip
    if layout.recompute_layers is not None:
        raise UnsupportedError(f"{_WHO}: recompute_layers={layout.recompute_layers}: fsdp_activation_checkpointing "
                               "recomputes every layer or none; leave recompute_layers out")  # fmt: skip
    no_sequence_parallel(
        layout,
        _WHO,
        "the model's own transformers tp_plan (Llama's: colwise and rowwise linear layers only, "
        "models/llama/configuration_llama.py base_model_tp_plan) keeps the norms' activations whole on every TP "
        "rank and its all-reduces block",
    )
    fsdp = shard > 1 or layout.cp > 1
    fsdp2_fits_plan(job, layout, shard * layout.cp, layout.sharding in (Sharding.zero1, Sharding.zero2), _WHO)
    hosts = list(hostnames or [])
    if nodes > 1 and len(hosts) != nodes:
        raise UnsupportedError(
            f"{_WHO}: a {nodes}-node config needs main_process_ip: give the {nodes} node hostnames "
            f"(got {len(hosts)}); the first runs the main process"
        )
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
    if nodes > 1:
        config |= {"main_process_ip": hosts[0], "main_process_port": MAIN_PROCESS_PORT}
    if fsdp:
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.sharding is Sharding.fsdp or layout.sharding is Sharding.none,
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


def accelerate_notes(
    model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8, hostnames: Sequence[str] | None = None
) -> list[str]:
    """The plan, the launch command and what the YAML substitutes."""
    config = accelerate_config(model, job, layout, gpus_per_node, hostnames)
    notes = [
        f"optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.precision}; Accelerate "
        f"{ACCELERATE_VERSION}",
        f"on node i of {config['num_machines']}: accelerate launch --config_file accelerate.yaml --machine_rank i "
        f"train.py (per-device batch {layout.micro_batch}, gradient_accumulation_steps {layout.grad_accum})",
    ]
    if config["distributed_type"] == "FSDP":
        notes.append(
            "memory: FSDP2 keeps fp32 weights, gradients and Adam moments sharded over dp_shard x cp; no offloading"
        )
    if layout.sharding in (Sharding.zero1, Sharding.zero2):
        notes.append("FSDP2 has no ZeRO-1/2: no resharding after forward stands in (no more memory)")
    if layout.recompute is Recompute.selective:
        notes.append("fsdp_activation_checkpointing recomputes whole layers: full recompute stands in (less memory)")
    notes.append(f"dropout is the model's own (the plan assumes {'0.1' if job.dropout else 'none'})")
    return notes


def accelerate_yaml(
    model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8, hostnames: Sequence[str] | None = None
) -> str:
    """The config as YAML, with the notes as comment lines."""
    config = accelerate_config(model, job, layout, gpus_per_node, hostnames)
    notes = accelerate_notes(model, job, layout, gpus_per_node, hostnames)
    return "".join(f"# {line}\n" for line in notes) + yaml.safe_dump(config, sort_keys=False)
