"""torchtitan job configs that run as emitted: v0.2.2 TOML (or `--section.key value` overrides) and a 0.3.0 recipe.

torchtitan builds only the models it registers, so the plan's model must be one of its Llama 3.1 flavors
(`8B`, `70B`, `405B`, matched by shape, RoPE base and Llama 3.1 RoPE scaling) or, for mixture-of-experts, of its
Qwen3 MoE flavors (`30B-A3B`, `235B-A22B`, matched by shape); the config names it and carries everything else a
run needs: the training batch, the parallelism (expert degrees included), activation checkpointing and
float8. Keys follow `torchtitan/config/job_config.py` at v0.2.2 and, for 0.3.0 (the current release,
whose configs are Python functions returning `Trainer.Config`, chosen with `--module/--config`),
`torchtitan/config/configs.py` and `torchtitan/models/llama3/config_registry.py`.

Batch semantics: `global_batch_size = local_batch_size * dp * accumulation`; with PP the local batch is cut
into `local_batch_size / pipeline_parallel_microbatch_size` pipeline micro-batches, so micro-batches come from
the pipeline (local = mb * ga); without PP each forward takes the whole local batch (local = mb) and the
accumulation comes from the global batch.

Sharding: FSDP2 shards over `data_parallel_shard_degree x context_parallel_degree`. zero1/zero2 become FSDP
without resharding after forward (torchtitan has no ZeRO-1), which keeps no more state than the plan counted
(`fsdp2_fits_plan`). sharding=none is plain replication: 0.3.0 runs it as HSDP with a shard group of one;
v0.2.2 runs it with DDP, which torchtitan refuses beside TP or PP (`DDP has not supported > 1D parallelism`,
`models/llama3/infra/parallelize.py`), so such a plan is refused for v0.2.2 rather than silently sharded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from optlayout.cost.attention import ACT_BYTES, gemm_input_bytes
from optlayout.cost.step import tp_overlap_applies
from optlayout.emit._checks import (
    dp_split,
    expert_fsdp_degree,
    fsdp2_fits_plan,
    global_batch,
    no_dropout,
    no_recompute_modules,
    node_count,
    qwen3_moe_flavor,
    stage_layers,
)
from optlayout.errors import UnsupportedError
from optlayout.layout.stages import chunk_layer_counts, recomputed_in_chunk, vp_fits
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, RopeScaling, Sharding

Config = dict[str, dict[str, Any]]
TORCHTITAN_VERSIONS = ("0.2.2", "0.3.0")
CURRENT_TORCHTITAN = "0.3.0"
_WHO = "torchtitan"
_RESHARD = {Sharding.none: "default", Sharding.zero1: "never", Sharding.zero2: "never", Sharding.fsdp: "always"}
_AC_MODE = {Recompute.none: "none", Recompute.selective: "selective", Recompute.full: "full"}
_OUTPUT = {"0.2.2": "output", "0.3.0": "lm_head"}  # the output projection's module name
# torchtitan's llama3 flavors (models/llama3/__init__.py at v0.2.2 and 0.3.0): Llama 3.1 shapes, vocabulary
# 128256, RoPE base 500000 with Llama 3.1 scaling (factor 8, low 1, high 4, original 8192), no biases.
LLAMA3_FLAVORS: dict[str, tuple[int, int, int, int, int]] = {  # layers, hidden, ffn, heads, kv_heads
    "8B": (32, 4096, 14336, 32, 8),
    "70B": (80, 8192, 28672, 64, 8),
    "405B": (126, 16384, 53248, 128, 8),
}
_RECIPES = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}


@dataclass(frozen=True)
class TorchtitanModel:
    """A model torchtitan registers: its package (`--model.name`), flavor, Hugging Face repository (tokenizer) and
    the 0.3.0 recipe (`config_registry` function) the Python config starts from."""

    name: str
    flavor: str
    hf_repo: str
    recipe: str

    @property
    def hf_assets(self) -> str:
        """Where torchtitan's presets expect the tokenizer (`scripts/download_hf_assets.py --assets tokenizer`)."""
        return f"./assets/hf/{self.hf_repo.split('/')[1]}"


def torchtitan_model(model: ModelSpec) -> TorchtitanModel:
    """The torchtitan model and flavor that is this model (a Llama 3.1 flavor, or a Qwen3 MoE one), or a one-line
    refusal naming what differs."""
    if model.moe is None:
        flavor = llama3_flavor(model)
        return TorchtitanModel("llama3", flavor, f"meta-llama/Llama-3.1-{flavor}", _RECIPES[flavor])
    qwen3 = qwen3_moe_flavor(model, _WHO, "torchtitan builds only the models it registers")
    # torchtitan 0.3.0 has a recipe for 30B-A3B only; 235B-A22B starts from it with its own model spec
    return TorchtitanModel("qwen3", qwen3, f"Qwen/Qwen3-{qwen3}", "qwen3_30b_a3b")


def llama3_flavor(model: ModelSpec) -> str:
    """The torchtitan llama3 flavor that is this model, or a one-line refusal naming what differs."""
    shape = (model.layers, model.hidden, model.ffn, model.heads, model.kv_heads)
    flavor = next((name for name, dims in LLAMA3_FLAVORS.items() if dims == shape), None)
    if flavor is None:
        raise UnsupportedError(
            f"{_WHO}: {model.name} is none of torchtitan's llama3 flavors (8B, 70B, 405B by layers, hidden, ffn, "
            "heads, kv_heads); torchtitan builds only the models it registers"
        )
    problems = []
    if model.vocab != 128256:
        problems.append(f"vocab {model.vocab} (flavor 128256)")
    if model.mlp != "swiglu" or model.bias or model.tied_embeddings or model.position_embeddings or model.alibi:
        problems.append("not a SwiGLU, bias-free, untied, rotary model")
    if model.rope_theta != 500000 or model.rope_scaling != RopeScaling():
        problems.append("RoPE other than base 500000 with Llama 3.1 scaling (factor 8, low 1, high 4, original 8192)")
    if model.norm_eps != 1e-5:
        problems.append(f"norm epsilon {model.norm_eps:g} (flavor 1e-5)")
    if model.head_dim not in (None, model.hidden // model.heads):
        problems.append(f"head_dim {model.head_dim}")
    if problems:
        raise UnsupportedError(f"{_WHO}: {model.name} has the {flavor} flavor's shape but {'; '.join(problems)}")
    return flavor


def _check_version(version: str) -> str:
    if version not in TORCHTITAN_VERSIONS:
        raise UnsupportedError(f"{_WHO}: version must be one of {', '.join(TORCHTITAN_VERSIONS)} (got {version!r})")
    return version


def torchtitan_config(
    model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8, version: str = CURRENT_TORCHTITAN
) -> Config:
    """Section -> key -> value of a complete torchtitan job config (v0.2.2 key names; `torchtitan_python`
    writes the same values as 0.3.0 code)."""
    version = _check_version(version)
    global_batch(job, layout, _WHO)
    no_recompute_modules(
        layout,
        _WHO,
        "torchtitan's selective activation checkpointing is per operator (selective_ac_option=op) or per layer, "
        "with no module list",
    )
    node_count(layout, gpus_per_node, _WHO)
    tt = torchtitan_model(model)
    if job.precision == "fp16":
        raise UnsupportedError(f"{_WHO}: precision fp16 is not supported (training.mixed_precision_param is bfloat16)")
    if job.fp8_param_gather:
        raise UnsupportedError(f"{_WHO}: fp8_param_gather (FP8 primary weights) is not emitted for torchtitan "
                               "(its float8 FSDP all-gather, enable_fsdp_float8_all_gather, unchecked)")  # fmt: skip
    if job.precision == "fp8" and model.moe is not None:
        raise UnsupportedError(
            f"{_WHO}: precision fp8 with experts: the float8 linear converter leaves the routed experts' grouped "
            "GEMMs in bf16, which the plan counted in fp8; plan bf16"
        )
    no_dropout(job, _WHO, f"torchtitan's {tt.name} has no dropout")
    replicate, shard = dp_split(layout)
    ddp = version == "0.2.2" and layout.sharding is Sharding.none and replicate > 1 and layout.cp == 1
    if ddp and (layout.tp > 1 or layout.pp > 1):
        raise UnsupportedError(
            f"{_WHO} v0.2.2 rule DDP with no other parallelism broken: sharding=none over dp={replicate} is DDP, "
            f"which torchtitan refuses beside tp={layout.tp}, pp={layout.pp} ('DDP has not supported > 1D "
            "parallelism'); plan sharding=zero1 or fsdp, or target torchtitan 0.3.0"
        )
    fsdp2_fits_plan(job, layout, shard * layout.cp, layout.sharding in (Sharding.zero1, Sharding.zero2), _WHO)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": _RESHARD[layout.sharding],
        "tensor_parallel_degree": layout.tp,
        "context_parallel_degree": layout.cp,
        "pipeline_parallel_degree": layout.pp,
    }
    if model.moe is not None:
        parallelism |= _experts(job, layout, version)
    elif layout.ep * layout.etp > 1:
        raise UnsupportedError(f"{_WHO}: ep={layout.ep}, etp={layout.etp} need a mixture-of-experts model")
    if version == "0.3.0":
        parallelism["enable_sequence_parallel"] = layout.sequence_parallel or layout.tp == 1
    if layout.pp > 1:
        parallelism |= _pipeline(model, layout, version)
    training: dict[str, Any] = {
        "local_batch_size": layout.micro_batch * (layout.grad_accum if layout.pp > 1 else 1),
        "global_batch_size": layout.global_batch,
        "seq_len": job.seq_len,
        "mixed_precision_param": "bfloat16",
        "enable_cpu_offload": False,
    }
    if version == "0.3.0" and (layout.pp > 1 or layout.ep > 1):
        # Trainer.Config: "CUDA graphs do not support pipeline parallelism", nor the standard expert-parallel
        # dispatcher ("CUDA graphs support only expert parallel token dispatcher configurations without CPU
        # synchronization")
        training["disable_cuda_graphs"] = True
    ac: dict[str, Any] = {"mode": _AC_MODE[layout.recompute]}
    if layout.recompute is Recompute.selective:
        ac["selective_ac_option"] = "op"
    if layout.recompute is Recompute.full and layout.recompute_layers is not None:
        ac = {"mode": "selective", "selective_ac_option": str(_layer_ac_frequency(model, layout, version))}
    model_section: dict[str, Any] = {"name": tt.name, "flavor": tt.flavor, "hf_assets_path": tt.hf_assets}
    config: Config = {"model": model_section, "training": training, "parallelism": parallelism}
    config["activation_checkpoint"] = ac
    # float8 runs compiled, as torchtitan's own 405B preset; where the plan prices TP overlap, async TP
    # (torch.compile's micro-pipelined TP) hides the TP collectives under the GEMMs: CompileConfig /
    # maybe_enable_async_tp require compile with "model" in components
    async_tp = tp_overlap_applies(layout)
    config["compile"] = {"enable": job.precision == "fp8" or async_tp}
    if async_tp and version == "0.2.2":
        parallelism["enable_async_tensor_parallel"] = True
    elif async_tp:
        config["compile"]["enable_async_tensor_parallel"] = True
    if job.precision == "fp8":
        converter, section = fp8_converter(job, layout, version)
        model_section["converters"] = [converter]
        config[converter] = section
    return config


def fp8_converter(job: JobSpec, layout: Layout, version: str) -> tuple[str, dict[str, Any]]:
    """The model converter for the job's FP8 recipe and its config section: torchao's float8 converter (v0.2.2
    `recipe_name` tensorwise | rowwise, 0.3.0 rowwise only; the output layer kept in bf16) or its MX converter for
    mxfp8 (v0.2.2 `quantize.linear.mx`, recipe mxfp8_cublas, skipping the output layer; 0.3.0 every Linear, as
    torchtitan's llama3_8b_mxfp8). Not stated: the float8 converter's default (FLOAT8_DEFAULT_RECIPE)."""
    recipe = job.fp8_recipe
    if recipe == "blockwise":
        raise UnsupportedError(f"{_WHO}: fp8_recipe blockwise: torchao's converters offer tensorwise/rowwise "
                               "(float8) and mxfp8 (mx), no 1x128/128x128 blockwise recipe")  # fmt: skip
    if recipe == "mxfp8":
        if version == "0.2.2" and layout.tp > 1:  # MXLinearConverter: "TP not yet supported with torch.compile"
            raise UnsupportedError(f"{_WHO} v0.2.2: fp8_recipe mxfp8 with tp={layout.tp}: its MX converter "
                                   "refuses TP under torch.compile, which fp8 runs enable; "
                                   "target torchtitan 0.3.0")  # fmt: skip
        if version == "0.2.2":
            return "quantize.linear.mx", {"recipe_name": "mxfp8_cublas", "filter_fqns": [_OUTPUT[version]]}
        return "quantize.linear.mx", {}
    if recipe == "tensorwise" and version == "0.3.0":
        raise UnsupportedError(f"{_WHO} 0.3.0: fp8_recipe tensorwise: its Float8LinearConverter offers rowwise "
                               "and rowwise_with_gw_hp only; plan --fp8-recipe rowwise, "
                               "or target torchtitan 0.2.2")  # fmt: skip
    section: dict[str, Any] = {"filter_fqns": [_OUTPUT[version]]}
    return "quantize.linear.float8", section | ({"recipe_name": recipe} if recipe else {})


def _layer_ac_frequency(model: ModelSpec, layout: Layout, version: str) -> int:
    """torchtitan v0.2.2's layer-level selective AC (`selective_ac_option` = k) checkpoints every k-th block a rank
    wraps (`_apply_layer_sac`: its counter runs on over the rank's model parts): the k that divides every chunk
    into the plan's recomputed layers (where in the chunk they sit changes neither memory nor time)."""
    rule = f"{_WHO}: recompute_layers={layout.recompute_layers}"
    if version != "0.2.2":
        raise UnsupportedError(
            f"{rule}: torchtitan {version} checkpoints every block or none (FullAC, SelectiveAC); target torchtitan "
            "0.2.2 (selective_ac_option) or leave recompute_layers out"
        )
    chunks = set(chunk_layer_counts(stage_layers(model, layout, _WHO), layout.vp))
    n = layout.recompute_layers
    assert n is not None  # the caller emits a layer count only when one is set
    for k in range(1, max(chunks) + 1):
        if all(c % k == 0 and c // k == recomputed_in_chunk(c, n) for c in chunks):
            return k
    raise UnsupportedError(
        f"{rule}: no 'every k-th layer' (selective_ac_option) checkpoints {n} of each chunk of {sorted(chunks)} layers"
    )


def _experts(job: JobSpec, layout: Layout, version: str) -> dict[str, Any]:
    """The expert degrees, after torchtitan's rules for them (moe.md 2.3).

    torchtitan places the sparse mesh `[pp, dp_replicate, efsdp, ep(, etp)]` over the dense region
    `dp_shard x cp x tp` (EP borrows from FSDP and TP, `efsdp = dp_shard*cp*tp/(ep*etp)`), which is Megatron's
    expert grid (etp fastest, then ep, then expert-DP) whenever it is expressible; with ep=1 the experts are
    tensor-parallel over tp, as the other weights.
    """
    ep, etp, tp = layout.ep, layout.etp, layout.tp
    runs = tp if ep == 1 else etp  # the expert TP torchtitan applies
    if ep == 1 and etp != tp:
        raise UnsupportedError(
            f"{_WHO} {version} rule etp == tp when ep == 1 broken: without expert parallelism torchtitan shards the "
            f"experts over tp={tp} like the other weights, the plan over etp={etp}"
        )
    if version == "0.3.0" and ep > 1 and etp > 1:
        raise UnsupportedError(
            f"{_WHO} 0.3.0 has no expert tensor parallelism (expert_tensor_parallel_degree was removed after v0.2.2, "
            f"PR #3167): etp={etp} with ep={ep}; plan etp=1 or target torchtitan 0.2.2"
        )
    if ep > 1 and etp not in (1, tp):
        raise UnsupportedError(f"{_WHO} v0.2.2 rule ETP=TP or ETP=1 broken: etp={etp}, tp={tp}")
    keep = layout.sharding in (Sharding.zero1, Sharding.zero2)
    fsdp2_fits_plan(job, layout, expert_fsdp_degree(layout, runs, _WHO), keep, _WHO, experts=True)
    out: dict[str, Any] = {"expert_parallel_degree": ep}
    if version == "0.2.2":
        out["expert_tensor_parallel_degree"] = runs
    return out


def _pipeline(model: ModelSpec, layout: Layout, version: str) -> dict[str, Any]:
    pp, vp = layout.pp, layout.vp
    counts = stage_layers(model, layout, _WHO)
    if not vp_fits(counts, vp):
        raise UnsupportedError(f"{_WHO}: the fullest pipeline rank of {counts} cannot form {vp} equal chunks")
    n_micro = layout.grad_accum
    if vp > 1:
        rounds = max(1, n_micro // pp)
        if n_micro % rounds:
            raise UnsupportedError(
                f"{_WHO} rule Interleaved1F1B n_microbatches % max(1, n_microbatches // pp) == 0 broken: "
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
        parts = module_fqns(counts, vp, _OUTPUT[version])
        empty = [i for i, names in enumerate(parts) if not names]
        if empty:
            raise UnsupportedError(
                f"{_WHO}: virtual stages {empty} would hold no module (pipeline ranks {counts} over vp={vp} "
                "chunks); choose a smaller vp"
            )
        out["module_fqns_per_model_part"] = parts
    return out


def module_fqns(counts: list[int], vp: int = 1, output: str = "output") -> list[list[str]]:
    """Module names per pipeline stage (`tok_embeddings`, `layers.N`, `norm`, and the output projection,
    `output` at v0.2.2 and `lm_head` at 0.3.0).

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
            names += ["norm", output]
        stages.append(names)
    return stages


FLOAT8_DEFAULT_RECIPE = {"0.2.2": "tensorwise (dynamic per-tensor scales)", "0.3.0": "rowwise"}
"""The float8 converter's recipe when none is named: v0.2.2 `recipe_name = None` (torchao's default
Float8LinearConfig, per-tensor), 0.3.0 `recipe_name = "rowwise"` (it offers rowwise and rowwise_with_gw_hp only)."""


def torchtitan_notes(
    model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8, version: str = CURRENT_TORCHTITAN
) -> list[str]:
    """The plan, the launch command and what the config substitutes, as comment lines (without `# `)."""
    torchtitan_config(model, job, layout, gpus_per_node, version)  # its refusals first
    tt = torchtitan_model(model)
    nodes, per_node = node_count(layout, gpus_per_node, _WHO)
    run = (
        "--job.config_file job.toml"
        if version == "0.2.2"
        else "--module optlayout_job --config optlayout_job  (with this file as optlayout_job.py on PYTHONPATH)"
    )
    notes = [
        f"optlayout: {model.name} (torchtitan {tt.name} {tt.flavor}), {format_layout(layout)}, "
        f"seq {job.seq_len}, {job.numerics}; torchtitan {version}",
        f"world {layout.gpus} = {nodes} node(s) x {per_node} GPUs; on each node: torchrun --nnodes {nodes} "
        f"--nproc-per-node {per_node} --rdzv-backend static --node-rank $SLURM_NODEID --master-addr $MASTER_ADDR "
        f"--master-port 29500 -m torchtitan.train {run}",
        f"tokenizer from {tt.hf_assets} (python scripts/download_hf_assets.py --repo_id {tt.hf_repo} --assets "
        "tokenizer); data: torchtitan's c4 loader",
        "memory: FSDP2 keeps fp32 weights, gradients and Adam moments sharded over dp_shard x cp (16 B/param), no "
        "dropout, no offloading",
    ]
    if model.moe is not None:
        etp = layout.tp if layout.ep == 1 else layout.etp
        efsdp = expert_fsdp_degree(layout, etp, _WHO)
        notes += [
            f"experts: ep={layout.ep} x etp={etp} borrowed from dp_shard x cp x tp, FSDP2 over efsdp={efsdp} (the "
            f"plan's expert-DP is {layout.edp}); the token all-to-all is torchtitan's standard dispatcher",
            f"the {tt.flavor} flavor brings its own RoPE base (1e6) and norm epsilon (1e-6); this model's: "
            f"{model.rope_theta:g}, {model.norm_eps:g}",
        ]
    if layout.sharding in (Sharding.zero1, Sharding.zero2):
        notes.append("torchtitan has no ZeRO-1/2: FSDP without resharding after forward stands in (no more memory)")
    if layout.sharding is Sharding.none and layout.dp > 1:
        notes.append(
            "sharding=none: replicated over dp_replicate"
            + (" (HSDP with a shard group of one)" if version == "0.3.0" else " (DDP)")
            + (f"; FSDP still shards over cp={layout.cp}" if layout.cp > 1 else "")
        )
    if layout.recompute is Recompute.selective:
        notes.append(
            "recompute=selective: torchtitan's op-level SAC saves matmul and attention outputs and recomputes the "
            "rest, keeping no more than the plan's selective recompute"
        )
    if layout.recompute is Recompute.full and layout.recompute_layers is not None:
        k = _layer_ac_frequency(model, layout, version)
        notes.append(
            f"recompute_layers={layout.recompute_layers}: layer-level selective AC checkpoints every {k}-th block of "
            "each model chunk, as many as Megatron's block method (the same memory and recompute)"
        )
    if job.precision == "fp8" and job.fp8_recipe is None:
        recipe = FLOAT8_DEFAULT_RECIPE[version]
        notes.append(f"fp8: torchtitan {version}'s float8 converter runs torchao's {recipe} recipe, its default; "
                     "the plan prices FP8 casts alike for every recipe")  # fmt: skip
    elif job.precision == "fp8":
        converter = fp8_converter(job, layout, version)[0]
        notes.append(f"fp8: torchao's {job.fp8_recipe} recipe ({converter}); the plan prices FP8 casts alike for "
                     "every recipe")  # fmt: skip
    if job.precision == "fp8" and gemm_input_bytes(job) < ACT_BYTES:
        notes.append(f"fp8: torchao's linear layers save their 16-bit inputs for backward, where the plan counts "
                     f"Transformer Engine's {gemm_input_bytes(job):g}-byte FP8 copies: more activation memory than "
                     "planned")  # fmt: skip
    if tp_overlap_applies(layout):
        notes.append(
            "TP: async tensor parallelism (torch.compile's micro-pipelined TP) hides part of the TP collectives "
            "under the GEMMs, as the plan prices TP with SP; the model is compiled for it"
        )
    if layout.tp > 1 and not layout.sequence_parallel and version == "0.2.2":
        notes.append("torchtitan v0.2.2's TP always shards norms along the sequence (SP): less memory than planned")
    return notes


def _header(lines: list[str]) -> list[str]:
    return [f"# {line}" for line in lines]


def torchtitan_toml(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """A complete torchtitan v0.2.2 job config (`--job.config_file`): model flavor, training batch, parallelism,
    activation checkpointing and float8; torchtitan's defaults for the rest (optimizer, data, checkpoints)."""
    config = torchtitan_config(model, job, layout, gpus_per_node, "0.2.2")
    lines = _header(torchtitan_notes(model, job, layout, gpus_per_node, "0.2.2"))
    lines += ["", "[job]", f"description = {toml_value(f'optlayout {format_layout(layout)}')}"]
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def torchtitan_overrides(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> list[str]:
    """The v0.2.2 config as `--section.key value` tokens for `torchtitan.train` (tyro); an uneven stage split
    needs a nested list only the TOML carries."""
    config = torchtitan_config(model, job, layout, gpus_per_node, "0.2.2")
    if "module_fqns_per_model_part" in config["parallelism"]:
        raise UnsupportedError(
            f"{_WHO}: an uneven stage split needs parallelism.module_fqns_per_model_part, a nested list only "
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


def torchtitan_python(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """A torchtitan 0.3.0 config module: `optlayout_job()` starts from torchtitan's own recipe for the flavor
    (`llama3_70b()`, `qwen3_30b_a3b()`: optimizer, data, checkpoints) and sets the model, batch, parallelism and
    recompute."""
    config = torchtitan_config(model, job, layout, gpus_per_node, "0.3.0")
    tt = torchtitan_model(model)
    converter: str | None = config["model"]["converters"][0] if job.precision == "fp8" else None
    converter_class = {"quantize.linear.float8": "Float8LinearConverter", "quantize.linear.mx": "MXFP8LinearConverter"}
    converters = "None"
    if converter is not None:
        fields = "".join(f"{k}={json.dumps(v)}, " for k, v in config[converter].items())
        converters = f"[{converter_class[converter]}.Config({fields}model_compile_enabled=True)]"
    ac = {
        "none": "None",
        "selective": "SelectiveAC.Config()",
        "full": "FullAC.Config()",
    }[config["activation_checkpoint"]["mode"]]
    notes = torchtitan_notes(model, job, layout, gpus_per_node, "0.3.0")
    lines = ['"""' + notes[0], "", *notes[1:], '"""', ""]
    if converter:
        lines.append(f"from torchtitan.components.quantization import {converter_class[converter]}")
    lines += [
        "from torchtitan.config import CompileConfig, ParallelismConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        f"from torchtitan.models.{tt.name} import model_registry",
        f"from torchtitan.models.{tt.name}.config_registry import {tt.recipe}",
        "from torchtitan.trainer import Trainer",
        "",
        "",
        "def optlayout_job() -> Trainer.Config:",
        f"    config = {tt.recipe}()",
        f'    config.model_spec = model_registry("{tt.flavor}", converters={converters})',
        f'    config.hf_assets_path = "{config["model"]["hf_assets_path"]}"',
    ]
    lines += [f"    config.training.{k} = {v!r}" for k, v in config["training"].items()]
    lines.append("    config.parallelism = ParallelismConfig(")
    lines += [f"        {k}={v!r}," for k, v in config["parallelism"].items()]
    lines += [
        "    )",
        f"    config.activation_checkpoint = {ac}",
        f"    config.compile = CompileConfig({', '.join(f'{k}={v!r}' for k, v in config['compile'].items())})",
        "    return config",
    ]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A TOML literal for str, int, float, bool or (nested) lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnsupportedError(f"{_WHO}: cannot write {value} to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise UnsupportedError(f"{_WHO}: cannot write {type(value).__name__} to TOML")
