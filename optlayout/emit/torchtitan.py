"""torchtitan v0.2.x job config: TOML sections and the equivalent `--section.key value` overrides.

Keys follow `torchtitan/config/job_config.py` at v0.2.2 (HEAD replaced TOML by Python recipes). Batch
semantics: `global_batch_size = local_batch_size * dp * accumulation`; with PP the local batch is cut into
`local_batch_size / pipeline_parallel_microbatch_size` pipeline micro-batches, so micro-batches come from the
pipeline (local = mb * ga); without PP each forward takes the whole local batch, so local = mb and the
accumulation comes from the global batch.
"""

from __future__ import annotations

import json
import math
from typing import Any

from optlayout.emit._checks import dp_split, global_batch, node_count, stage_layers
from optlayout.errors import UnsupportedError
from optlayout.layout.stages import chunk_layer_counts, vp_fits
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

Config = dict[str, dict[str, Any]]
_RESHARD = {Sharding.none: "default", Sharding.zero1: "never", Sharding.zero2: "never", Sharding.fsdp: "always"}
_AC_MODE = {Recompute.none: "none", Recompute.selective: "selective", Recompute.full: "full"}


def torchtitan_config(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> Config:
    """Section -> key -> value for the layout-dependent part of a torchtitan job config."""
    who = "torchtitan"
    global_batch(job, layout, who)
    node_count(layout, gpus_per_node, who)
    if job.precision == "fp16":
        raise UnsupportedError(f"{who}: precision fp16 is not supported (training.mixed_precision_param is bfloat16)")
    replicate, shard = dp_split(layout)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": _RESHARD[layout.sharding],
        "tensor_parallel_degree": layout.tp,
        "context_parallel_degree": layout.cp,
        "pipeline_parallel_degree": layout.pp,
    }
    if layout.pp > 1:
        parallelism |= _pipeline(model, layout)
    training = {
        "local_batch_size": layout.micro_batch * (layout.grad_accum if layout.pp > 1 else 1),
        "global_batch_size": layout.global_batch,
        "seq_len": job.seq_len,
        "mixed_precision_param": "bfloat16",
    }
    ac: dict[str, Any] = {"mode": _AC_MODE[layout.recompute]}
    if layout.recompute is Recompute.selective:
        ac["selective_ac_option"] = "op"
    config: Config = {"parallelism": parallelism, "training": training, "activation_checkpoint": ac}
    if job.precision == "fp8":
        config["model"] = {"converters": ["quantize.linear.float8"]}
        config["quantize.linear.float8"] = {"filter_fqns": ["output"]}
    return config


def _pipeline(model: ModelSpec, layout: Layout) -> dict[str, Any]:
    pp, vp, who = layout.pp, layout.vp, "torchtitan"
    counts = stage_layers(model, layout, who)
    if not vp_fits(counts, vp):
        raise UnsupportedError(f"{who}: the fullest pipeline rank of {counts} cannot form {vp} equal chunks")
    n_micro = layout.grad_accum
    if vp > 1:
        rounds = max(1, n_micro // pp)
        if n_micro % rounds:
            raise UnsupportedError(
                f"{who} rule Interleaved1F1B n_microbatches % max(1, n_microbatches // pp) == 0 broken: "
                f"{n_micro} micro-batches, pp={pp}"
            )
    out: dict[str, Any] = {
        "pipeline_parallel_schedule": "Interleaved1F1B" if vp > 1 else "1F1B",
        "pipeline_parallel_microbatch_size": layout.micro_batch,
    }
    if len(set(counts)) == 1:
        out |= {
            "pipeline_parallel_layers_per_stage": counts[0] // vp,
            "pipeline_parallel_first_stage_less_layers": 0,
            "pipeline_parallel_last_stage_less_layers": 0,
        }
    else:
        parts = module_fqns(counts, vp)
        empty = [i for i, names in enumerate(parts) if not names]
        if empty:
            raise UnsupportedError(
                f"{who}: virtual stages {empty} would hold no module (pipeline ranks {counts} over vp={vp} "
                "chunks); choose a smaller vp"
            )
        out["module_fqns_per_model_part"] = parts
    return out


def module_fqns(counts: list[int], vp: int = 1) -> list[list[str]]:
    """Module names per pipeline stage (llama-style `tok_embeddings`, `layers.N`, `norm`, `output`).

    Stage s runs on pp rank s % pp as its chunk s // pp, as torchtitan's looped schedules place them; each
    rank's layers spread over its vp chunks as `chunk_layer_counts` does.
    """
    sizes = chunk_layer_counts(counts, vp)
    stages, first = [], 0
    for s, n in enumerate(sizes):
        names = [f"layers.{i}" for i in range(first, first + n)]
        first += n
        if s == 0:
            names.insert(0, "tok_embeddings")
        if s == len(sizes) - 1:
            names += ["norm", "output"]
        stages.append(names)
    return stages


def torchtitan_toml(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The config as TOML, to merge into the model's train config (e.g. `llama3_70b.toml`)."""
    config = torchtitan_config(model, job, layout, gpus_per_node)
    nodes, per_node = node_count(layout, gpus_per_node, "torchtitan")
    lines = [
        f"# optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.precision}",
        f"# torchtitan v0.2.x; world {layout.gpus} = {nodes} node(s) x {per_node} GPUs",
        f"# on each node: torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend static "
        "--node-rank $SLURM_NODEID --master-addr $MASTER_ADDR --master-port 29500 "
        "-m torchtitan.train --job.config_file this.toml",
    ]
    if layout.sharding is Sharding.zero1:
        lines.append("# torchtitan has no ZeRO-1: FSDP without resharding after forward (ZeRO-2-like) stands in")
    if layout.tp > 1 and not layout.sequence_parallel:
        lines.append("# note: torchtitan's TP always shards norms and dropout along the sequence (SP)")
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def torchtitan_overrides(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> list[str]:
    """The same settings as `--section.key value` tokens for `torchtitan.train` (tyro)."""
    config = torchtitan_config(model, job, layout, gpus_per_node)
    if "module_fqns_per_model_part" in config["parallelism"]:
        raise UnsupportedError(
            "torchtitan: an uneven stage split needs parallelism.module_fqns_per_model_part, a nested list only "
            "the TOML form carries; emit TOML instead of overrides"
        )
    tokens = []
    for section, values in config.items():
        for key, value in values.items():
            shown = (
                ",".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else value
            )
            tokens += [f"--{section}.{key}", str(shown)]
    return tokens


def toml_value(value: Any) -> str:
    """A TOML literal for str, int, float, bool or (nested) lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnsupportedError(f"torchtitan: cannot write {value} to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise UnsupportedError(f"torchtitan: cannot write {type(value).__name__} to TOML")
