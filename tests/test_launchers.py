"""Every emitted format, for plans covering every axis, read by the launcher's own config classes and validators.

Needs the `launchers` extra (torchtitan 0.3.0, DeepSpeed 0.19.8, Accelerate 1.15, megatron-core 0.16.1, Hydra)
and, for torchtitan 0.2.2, `OPTLAYOUT_TORCHTITAN_022` naming a directory it was installed into with
`pip install --no-deps --target DIR torchtitan==0.2.2` (one environment cannot hold two torchtitans); `.ci/run`
installs both. Locally a missing one skips with the reason; under CI=true it fails. Everything runs on CPU:
where a launcher asks the hardware (torchtitan's float8 converter) the test answers as an H100 would, and
DeepSpeed's world size is given as torchrun would set it (`deepspeed.comm.get_world_size`), with the
data-parallel unit a PipelineModule hands it when the plan pipelines.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import yaml

from optlayout.emit.torchtitan import FLOAT8_DEFAULT_RECIPE
from optlayout.errors import OptlayoutError
from optlayout.layout.stages import chunk_layer_counts, stage_layer_counts
from tests.conftest import FIXTURES, require, torchtitan_022_dir
from tests.launcher_plans import LAUNCHERS, PLANS, Plan, emit_for

IDS = [p.name for p in PLANS]


def _emitted(plan: Plan, launcher: str) -> str | None:
    """The text, or None after checking that the refusal is the one the plan expects (a one-line rule)."""
    expected = plan.refused.get(launcher)
    if expected is None:
        return emit_for(plan, launcher)
    with pytest.raises(OptlayoutError) as info:
        emit_for(plan, launcher)
    assert expected in str(info.value) and "\n" not in str(info.value)
    return None


def _counts(plan: Plan) -> list[int]:
    lay = plan.lay
    return stage_layer_counts(plan.spec.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)


def test_every_launcher_emits_most_plans():
    # the refusals above are the exception: each launcher runs at least three of the plans
    for launcher in LAUNCHERS:
        assert sum(launcher not in p.refused for p in PLANS) >= 3, launcher


# ---------------------------------------------------------------- Megatron: megatron-core's config classes

# Flags Megatron-LM's arguments.py writes by hand (no megatron-core field of that name); `benchmarks/
# megatron_lm_args.py` feeds them to Megatron-LM's own parse_args + validate_args.
MEGATRON_HANDWRITTEN = {
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--micro-batch-size",
    "--global-batch-size", "--seq-length", "--max-position-embeddings", "--group-query-attention", "--swiglu",
    "--disable-bias-linear", "--norm-epsilon", "--position-embedding-type", "--rotary-base", "--use-rope-scaling",
    "--rope-scaling-factor", "--untie-embeddings-and-output-weights", "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32", "--use-distributed-optimizer", "--overlap-grad-reduce",
    "--overlap-param-gather", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--no-gradient-accumulation-fusion", "--ckpt-format", "--fp8-format", "--use-tp-pp-dp-mapping",
}  # fmt: skip


def _megatron_configs(plan: Plan, args: list[str]):
    """megatron-core's ModelParallelConfig/TransformerConfig and DistributedDataParallelConfig as the flags set them
    (the fields Megatron-LM's argument_utils derives the flags from; hand-written ones mapped as arguments.py does)."""
    torch = require("torch")
    tc = require("megatron.core.transformer.transformer_config")
    ddp_mod = require("megatron.core.distributed.distributed_data_parallel_config")
    flags: dict[str, list[str]] = {}
    for token in args:
        if token.startswith("--"):
            key = token
            flags[key] = []
        else:
            flags[key].append(token)
    fields = set(tc.TransformerConfig.__dataclass_fields__) | set(
        ddp_mod.DistributedDataParallelConfig.__dataclass_fields__
    )
    for flag in flags:
        assert flag in MEGATRON_HANDWRITTEN or flag[2:].replace("-", "_") in fields, flag
    one = {k: v[0] for k, v in flags.items() if v}
    lay, model = plan.lay, plan.spec
    counts = _counts(plan)
    vp = None
    if "--num-layers-per-virtual-pipeline-stage" in one:
        vp = counts[0] // int(one["--num-layers-per-virtual-pipeline-stage"])
    elif "--num-virtual-stages-per-pipeline-rank" in one:
        vp = int(one["--num-virtual-stages-per-pipeline-rank"])
    bf16 = "--bf16" in flags
    kw = {
        "num_layers": int(one["--num-layers"]),
        "hidden_size": int(one["--hidden-size"]),
        "ffn_hidden_size": int(one["--ffn-hidden-size"]),
        "num_attention_heads": int(one["--num-attention-heads"]),
        "num_query_groups": int(one.get("--num-query-groups", one["--num-attention-heads"])),
        "tensor_model_parallel_size": int(one["--tensor-model-parallel-size"]),
        "pipeline_model_parallel_size": int(one["--pipeline-model-parallel-size"]),
        "virtual_pipeline_model_parallel_size": vp if vp and vp > 1 else None,
        "context_parallel_size": int(one["--context-parallel-size"]),
        "sequence_parallel": "--sequence-parallel" in flags,
        "num_layers_in_first_pipeline_stage": int(one["--decoder-first-pipeline-num-layers"])
        if "--decoder-first-pipeline-num-layers" in one
        else None,
        "num_layers_in_last_pipeline_stage": int(one["--decoder-last-pipeline-num-layers"])
        if "--decoder-last-pipeline-num-layers" in one
        else None,
        "pipeline_model_parallel_layout": one.get("--pipeline-model-parallel-layout"),
        "recompute_granularity": one.get("--recompute-granularity"),
        "recompute_method": one.get("--recompute-method"),
        "recompute_modules": flags.get("--recompute-modules"),  # nargs "+"; absent: the default, core_attn
        "recompute_num_layers": int(one["--recompute-num-layers"]) if "--recompute-num-layers" in one else None,
        "attention_dropout": float(one["--attention-dropout"]),
        "hidden_dropout": float(one["--hidden-dropout"]),
        "layernorm_epsilon": float(one["--norm-epsilon"]),
        "normalization": one.get("--normalization", "LayerNorm"),
        "gated_linear_unit": "--swiglu" in flags,
        "add_bias_linear": "--disable-bias-linear" not in flags,
        "bf16": bf16,
        "fp16": "--fp16" in flags,
        "params_dtype": torch.bfloat16 if bf16 else torch.float16,
        "pipeline_dtype": torch.bfloat16 if bf16 else torch.float16,
        "fp8": one.get("--fp8-format"),
    }
    if "--fp8-recipe" in one:
        kw["fp8_recipe"] = one["--fp8-recipe"]
    assert (kw["num_layers"], kw["hidden_size"], kw["ffn_hidden_size"]) == (model.layers, model.hidden, model.ffn)
    config = tc.TransformerConfig(**kw)  # __post_init__: megatron-core's own consistency rules
    ddp = ddp_mod.DistributedDataParallelConfig(
        grad_reduce_in_fp32="--grad-reduce-in-bf16" not in flags,
        overlap_grad_reduce="--overlap-grad-reduce" in flags,
        overlap_param_gather="--overlap-param-gather" in flags,
        use_distributed_optimizer="--use-distributed-optimizer" in flags,
        use_megatron_fsdp="--use-megatron-fsdp" in flags,
        data_parallel_sharding_strategy=one.get("--data-parallel-sharding-strategy", "no_shard"),
    )
    assert (
        config.tensor_model_parallel_size
        * config.pipeline_model_parallel_size
        * config.context_parallel_size
        * (lay.dp)
        == lay.gpus
    )
    return config, ddp, one


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_megatron_flags_build_megatron_core_configs(plan):
    text = _emitted(plan, "megatron")
    if text is None:
        return
    config, ddp, one = _megatron_configs(plan, text.split())
    lay = plan.lay
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert (config.virtual_pipeline_model_parallel_size or 1) == lay.vp or "--pipeline-model-parallel-layout" in one
    assert config.sequence_parallel == lay.sequence_parallel
    assert int(one["--global-batch-size"]) % (int(one["--micro-batch-size"]) * lay.dp) == 0  # num_microbatches
    assert int(one["--global-batch-size"]) // (int(one["--micro-batch-size"]) * lay.dp) == lay.grad_accum
    assert ddp.use_distributed_optimizer == (lay.sharding.value != "none")
    assert ddp.grad_reduce_in_fp32 == (plan.grad_bytes == 4)
    assert config.attention_dropout == config.hidden_dropout == 0.0
    if plan.precision == "fp8":  # the recipe planned, or megatron-core's default (per-tensor delayed scaling)
        assert (config.fp8, config.fp8_recipe) == ("e4m3" if plan.fp8_recipe == "mxfp8" else "hybrid",
                                                   plan.fp8_recipe or "delayed")  # fmt: skip
    if lay.recompute.value == "selective":  # Megatron-Core's default set when the plan names none
        assert config.recompute_modules == [str(m) for m in lay.recompute_modules or ("core_attn",)]
    if lay.recompute.value == "full":  # every layer (uniform, 1 a unit), or the first N of each chunk (block)
        block = ("uniform", 1) if lay.recompute_layers is None else ("block", lay.recompute_layers)
        assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == ("full", *block)
    if config.pipeline_model_parallel_layout is not None:  # megatron-core parsed the layout: stages as planned
        grid = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual chunk] -> layer types
        per_stage = [sum(t.name == "decoder" for t in grid[s % lay.pp][s // lay.pp]) for s in range(lay.pp * lay.vp)]
        assert per_stage == chunk_layer_counts(_counts(plan), lay.vp)


# ---------------------------------------------------------------- Megatron-Bridge 0.3.1


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_megatron_bridge_overrides_parse_and_build(plan):
    text = _emitted(plan, "megatron-bridge")
    if text is None:
        return
    hydra = require("hydra.core.override_parser.overrides_parser")
    torch = require("torch")
    tc = require("megatron.core.transformer.transformer_config")
    ddp_mod = require("megatron.core.distributed.distributed_data_parallel_config")
    opt = require("megatron.core.optimizer.optimizer_config")
    ds = require("megatron.core.datasets.gpt_dataset")
    bridge = json.loads((FIXTURES / "launchers" / "megatron_bridge_0.3.1_fields.json").read_text())
    fields = {
        "model": set(tc.TransformerConfig.__dataclass_fields__) | set(bridge["model"]["fields"]),
        "ddp": set(ddp_mod.DistributedDataParallelConfig.__dataclass_fields__),
        "optimizer": set(opt.OptimizerConfig.__dataclass_fields__),
        "dataset": set(ds.GPTDatasetConfig.__dataclass_fields__),
        "train": set(bridge["train"]["fields"]),
        "mixed_precision": set(bridge["mixed_precision"]["fields"]),
        "comm_overlap": set(bridge["comm_overlap"]["fields"]),
    }
    assert set(fields) <= set(bridge["ConfigContainer"]["fields"])
    parsed = hydra.OverridesParser.create().parse_overrides(overrides=text.splitlines())  # Bridge's parser
    values: dict[str, dict] = {}
    for override in parsed:
        section, _, key = override.key_or_group.partition(".")
        assert key in fields[section], override.key_or_group
        values.setdefault(section, {})[key] = override.value()
    model, lay = plan.spec, plan.lay
    shape = {
        "num_layers": model.layers, "hidden_size": model.hidden, "ffn_hidden_size": model.ffn,
        "num_attention_heads": model.heads, "num_query_groups": model.kv_heads, "gated_linear_unit": True,
        "add_bias_linear": False, "normalization": "RMSNorm", "bf16": True, "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
    }  # fmt: skip
    core = {k: v for k, v in values["model"].items() if k in tc.TransformerConfig.__dataclass_fields__}
    config = tc.TransformerConfig(**shape | core)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert (config.virtual_pipeline_model_parallel_size or 1) == lay.vp
    ddp_mod.DistributedDataParallelConfig(**values["ddp"])
    assert values["ddp"]["use_distributed_optimizer"] == values["optimizer"]["use_distributed_optimizer"]
    assert values["train"]["global_batch_size"] == lay.global_batch
    assert values["train"]["global_batch_size"] % (values["train"]["micro_batch_size"] * lay.dp) == 0
    assert values["model"]["seq_length"] == values["dataset"]["sequence_length"] == plan.seq_len
    if lay.recompute.value == "full":
        block = ("uniform", 1) if lay.recompute_layers is None else ("block", lay.recompute_layers)
        assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == ("full", *block)


# ---------------------------------------------------------------- torchtitan 0.3.0


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_torchtitan_030_config_manager_and_parallel_dims(plan, tmp_path, monkeypatch):
    text = _emitted(plan, "torchtitan@0.3.0")
    if text is None:
        return
    require("triton", "torchtitan 0.3.0's recipes import it; pip install '.[launchers]'")
    manager = require("torchtitan.config.manager")
    dims = require("torchtitan.distributed.parallel_dims")
    float8 = require("torchtitan.components.quantization.float8")
    mx = require("torchtitan.components.quantization.mx")
    torch = require("torch")
    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)  # answer as an H100 (SM90) would
    monkeypatch.setattr(mx, "has_cuda_capability", lambda *a: True)  # and as a B200 (SM100) for MXFP8
    name = "optlayout_job_" + plan.name.replace("-", "_")
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = manager.ConfigManager().parse_args(["--module", name, "--config", "optlayout_job"])
    cfg.__post_init__()  # Trainer.Config's checks on the final values
    lay, par = plan.lay, cfg.parallelism
    pdims = dims.ParallelDims.from_config(par, lay.gpus)  # dp_replicate * dp_shard * cp * tp * pp == world
    assert (pdims.tp, pdims.pp, pdims.cp, pdims.dp_replicate * pdims.dp_shard) == (lay.tp, lay.pp, lay.cp, lay.dp)
    batch = pdims.dp_replicate * pdims.dp_shard
    local = cfg.training.local_batch_size
    assert cfg.training.global_batch_size % (local * batch) == 0  # the Trainer's assertion
    if lay.pp > 1:
        assert local // par.pipeline_parallel_microbatch_size == lay.grad_accum
    else:
        assert cfg.training.global_batch_size // (local * batch) == lay.grad_accum
    model_cfg = cfg.model_spec.model
    model_cfg.update_from_config(config=cfg)
    with torch.device("meta"):
        model = model_cfg.build()
    assert sum(p.numel() for p in model.parameters()) == plan.spec.param_count  # the flavor is the plan's model
    if plan.fp8_recipe == "mxfp8":  # every Linear, the head too, as torchtitan's llama3_8b_mxfp8
        assert {type(m).__name__ for m in model.layers.modules()} >= {"MXFP8Linear"}
        assert type(model.lm_head).__name__ == "MXFP8Linear"
    elif plan.precision == "fp8":  # the recipe planned, or the one the emitted notes name (FLOAT8_DEFAULT_RECIPE)
        from torchao.float8 import Float8LinearConfig

        swapped = next(m for m in model.layers.modules() if type(m).__name__ == "Float8Linear")
        assert swapped.config == Float8LinearConfig.from_recipe_name(plan.fp8_recipe or "rowwise")
        assert type(model.lm_head).__name__ == "Linear"  # filter_fqns keeps the output layer in bf16
        if plan.fp8_recipe is None:
            assert "recipe_name" not in text and float8.Float8LinearConverter.Config().recipe_name == "rowwise"
            assert f"torchao's {FLOAT8_DEFAULT_RECIPE['0.3.0']} recipe" in text
    if lay.pp > 1:
        _check_stages(plan, par, pdims, model_cfg, model)


def _check_stages(plan, par, pdims, model_cfg, model):
    """The stages torchtitan builds (its own split for layers_per_stage, or the listed modules) are the plan's."""
    pp_mod = require("torchtitan.distributed.pipeline_parallel")
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    parts = par.module_fqns_per_model_part
    if parts is None:
        stages, layers, first, last = pp_mod._get_pipeline_metadata(pdims, par, model_cfg)
        parts = pp_mod._generate_llm_fqn_per_model_part(stages, layers, first, last)
    for part in parts:
        for fqn in part:
            model.get_submodule(fqn)
    per_stage = [sum(name.startswith("layers.") for name in part) for part in parts]
    assert per_stage == chunk_layer_counts(_counts(plan), plan.lay.vp)
    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    assert (len(parts) // plan.lay.pp == 1) == single


@pytest.mark.parametrize("plan", [p for p in PLANS if p.lay.pp == 1], ids=[p.name for p in PLANS if p.lay.pp == 1])
def test_torchtitan_030_parallelizes_the_plans_degrees(plan, tmp_path, monkeypatch):
    """torchtitan's own parallelize_llama applies the emitted degrees (TP, CP, FSDP over dp_shard x cp, HSDP with a
    shard group of one for sharding=none) under PyTorch's fake process group, to its debug model on the meta device
    (the plan's model would not change the mesh). Run with the DTensor backend: the default spmd_types backend
    fails inside fully_shard in this CPU harness with torch 2.13 for every layout, FSDP+TP included."""
    text = _emitted(plan, "torchtitan@0.3.0")
    if text is None:
        return
    require("triton", "torchtitan 0.3.0's recipes import it; pip install '.[launchers]'")
    manager = require("torchtitan.config.manager")
    dims = require("torchtitan.distributed.parallel_dims")
    dist_utils = require("torchtitan.distributed.utils")
    registry = require("torchtitan.models.llama3.config_registry")
    float8 = require("torchtitan.components.quantization.float8")
    torch = require("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)
    monkeypatch.setattr(require("torchtitan.components.quantization.mx"), "has_cuda_capability", lambda *a: True)
    monkeypatch.setattr(dims, "device_type", "cpu")
    name = "optlayout_mesh_" + plan.name.replace("-", "_")
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    emitted = manager.ConfigManager().parse_args(["--module", name, "--config", "optlayout_job"])
    debug = registry.llama3_debugmodel()
    debug.parallelism = emitted.parallelism
    debug.parallelism.spmd_backend = "full_dtensor"
    debug.activation_checkpoint = emitted.activation_checkpoint
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.lay.gpus)
    try:
        pdims = dims.ParallelDims.from_config(debug.parallelism, plan.lay.gpus)
        pdims.build_mesh()
        dist_utils.set_spmd_backend(debug.parallelism.spmd_backend)
        model_cfg = debug.model_spec.model
        model_cfg.update_from_config(config=debug)
        with torch.device("meta"):
            model = model_cfg.build()
        model = debug.model_spec.parallelize_fn(
            model, parallel_dims=pdims, training=debug.training, parallelism=debug.parallelism,
            compile_config=debug.compile, ac_config=debug.activation_checkpoint, dump_folder=str(tmp_path),
        )  # fmt: skip
        weight = next(p for n, p in model.named_parameters() if n.endswith("attention.wo.weight"))  # AC wraps names
        mesh = weight.device_mesh
        sizes = dict(zip(mesh.mesh_dim_names, mesh.shape, strict=True))
        lay = plan.lay
        assert sizes.get("tp", 1) == lay.tp
        replicate = sizes.get("dp_replicate", 1)
        shard = math.prod(v for k, v in sizes.items() if k.startswith(("dp_shard", "fsdp")))
        assert replicate * shard == lay.dp * lay.cp  # FSDP2 over dp_shard x cp, replicas over dp_replicate
        assert shard == (lay.cp if lay.sharding.value == "none" else lay.dp * lay.cp)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- torchtitan 0.2.2 (its own install)

_TT022 = textwrap.dedent(
    """
    import json, sys
    import torch
    import torchtitan
    import torchtitan.components.quantization.float8 as float8
    import torchtitan.components.quantization.mx as mx
    float8.has_cuda_capability = lambda *a: True  # answer as an H100 would
    mx.has_cuda_capability = lambda *a: True  # and as a B200 for MXFP8
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.protocols.train_spec import get_train_spec
    import torchtitan.distributed.activation_checkpoint as ac
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    out = {"version": torchtitan.__file__}
    for path, world in json.loads(sys.argv[1]):
        cfg = ConfigManager().parse_args(["--job.config_file", path])
        p = cfg.parallelism
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                            ep=1, etp=1, world_size=world)
        spec = get_train_spec(cfg.model.name)
        args = spec.model_args[cfg.model.flavor]
        args.update_from_config(cfg)
        with torch.device("meta"):
            model = spec.model_cls(args)
        # v0.2.2's MX converter imports a torchao name (MXFP8Dim1CastKernelChoice) that the extra's torchao (0.3.0's)
        # no longer has: an mxfp8 config is read by ConfigManager, its converter not built
        if "quantize.linear.mx" not in cfg.model.converters:
            build_model_converters(cfg, dims)
        parts = p.module_fqns_per_model_part or []
        for part in parts:
            for fqn in part:
                model.get_submodule(fqn)
        # torchtitan's own apply_ac on each rank's model parts (virtual stage s on rank s % pp), counting the
        # blocks it wraps in a checkpoint; the layer-frequency counter runs over a rank's parts
        blocks = [[n for n in part if n.startswith("layers.")] for part in parts]
        blocks = blocks or [[f"layers.{k}" for k in model.layers]]
        wrapped = [0] * len(blocks)
        for rank in range(p.pipeline_parallel_degree):
            ac._layer_sac_count = 0
            for s in range(rank, len(blocks), p.pipeline_parallel_degree):
                holder = torch.nn.Module()
                holder.layers = torch.nn.ModuleDict({n.split(".")[1]: model.get_submodule(n) for n in blocks[s]})
                if cfg.activation_checkpoint.mode != "none":
                    ac.apply_ac(holder, cfg.activation_checkpoint)
                wrapped[s] = sum(isinstance(b, CheckpointWrapper) for b in holder.layers.values())
        ddp_beside_others = dims.dp_replicate_enabled and not dims.fsdp_enabled and world != dims.dp_replicate
        out[path] = {
            "params": sum(x.numel() for x in model.parameters()),
            "dims": [dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp],
            "local": cfg.training.local_batch_size, "global": cfg.training.global_batch_size,
            "pp_mb": p.pipeline_parallel_microbatch_size, "ac": cfg.activation_checkpoint.mode,
            "layers_per_part": [sum(n.startswith("layers.") for n in part) for part in parts],
            "ddp_beside_others": ddp_beside_others, "converters": cfg.model.converters, "wrapped": wrapped,
            "float8_recipe": cfg.quantize.linear.float8.recipe_name, "mx_recipe": cfg.quantize.linear.mx.recipe_name,
            "mx_filter": cfg.quantize.linear.mx.filter_fqns,
        }
    print(json.dumps(out))
    """
)


def test_torchtitan_022_config_manager_parallel_dims_and_model(tmp_path):
    target = torchtitan_022_dir()
    require("torchtitan", "the launchers extra brings torchtitan's dependencies")
    jobs, plans = [], {}
    for plan in PLANS:
        text = _emitted(plan, "torchtitan@0.2.2")
        if text is not None:
            path = tmp_path / f"{plan.name}.toml"
            path.write_text(text)
            jobs.append((str(path), plan.lay.gpus))
            plans[str(path)] = plan
    env = os.environ | {"PYTHONPATH": target}
    run = subprocess.run([sys.executable, "-c", _TT022, json.dumps(jobs)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result.pop("version").startswith(target)  # torchtitan 0.2.2 ran, not the extra's 0.3.0
    for path, got in result.items():
        plan, lay = plans[path], plans[path].lay
        assert got["params"] == plan.spec.param_count
        replicate, shard, cp, tp, pp = got["dims"]
        assert (replicate * shard, cp, tp, pp) == (lay.dp, lay.cp, lay.tp, lay.pp)
        assert not got["ddp_beside_others"]  # the rule v0.2.2's parallelize_llama raises on
        partial = lay.recompute_layers is not None
        assert got["ac"] == ("selective" if partial else lay.recompute.value)
        chunks = chunk_layer_counts(_counts(plan), lay.vp)
        rerun = [min(lay.recompute_layers, c) if partial else c if lay.recompute.value != "none" else 0 for c in chunks]
        # the blocks torchtitan checkpoints: every one, none, or the plan's N a chunk (per part where it lists them)
        assert got["wrapped"] == rerun if got["layers_per_part"] else sum(got["wrapped"]) == sum(rerun)
        mxfp8 = plan.fp8_recipe == "mxfp8"
        converter = "quantize.linear.mx" if mxfp8 else "quantize.linear.float8"
        assert got["converters"] == ([converter] if plan.precision == "fp8" else [])
        # the recipe planned, or torchao's per-tensor default, as the emitted notes say (FLOAT8_DEFAULT_RECIPE)
        assert got["float8_recipe"] == (None if mxfp8 else plan.fp8_recipe)
        assert (got["mx_recipe"], got["mx_filter"]) == ("mxfp8_cublas", ["output"])  # MXFP8 by cuBLAS, head in bf16
        if lay.pp > 1:
            assert got["local"] // got["pp_mb"] == lay.grad_accum
        if got["layers_per_part"]:
            assert got["layers_per_part"] == chunk_layer_counts(_counts(plan), lay.vp)


# ---------------------------------------------------------------- DeepSpeed 0.19.8


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_deepspeed_config_passes_deepspeeds_checks(plan, monkeypatch):
    text = _emitted(plan, "deepspeed")
    if text is None:
        return
    comm = require("deepspeed.comm")
    config_mod = require("deepspeed.runtime.config")
    lay = plan.lay
    monkeypatch.setattr(comm, "get_world_size", lambda group=None: lay.gpus)  # as torchrun's WORLD_SIZE
    monkeypatch.setattr(comm, "get_rank", lambda group=None: 0)
    # a PipelineModule hands the engine its grid as mpu (data-parallel size dp); otherwise no mpu
    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: lay.dp) if lay.pp > 1 else None
    cfg = config_mod.DeepSpeedConfig(json.loads(text), mpu=mpu)  # _batch_assertion, _do_error_check
    assert cfg.world_size == (lay.dp if lay.pp > 1 else lay.gpus)
    assert cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * lay.dp == lay.global_batch
    assert cfg.zero_optimization_stage == {"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3}[lay.sharding.value]
    assert cfg.tensor_parallel_config.autotp_size == (lay.tp if lay.tp > 1 else 0)
    assert cfg.grad_accum_dtype == ("fp32" if plan.grad_bytes == 4 else "bf16")
    assert not cfg.zero_config.offload_optimizer and not cfg.zero_config.offload_param


# ---------------------------------------------------------------- Accelerate 1.15


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_accelerate_launch_and_parallelism_config(plan, tmp_path, monkeypatch):
    text = _emitted(plan, "accelerate")
    if text is None:
        return
    launch = require("accelerate.commands.launch")
    launch_utils = require("accelerate.utils.launch")
    parallelism = require("accelerate.parallelism_config")
    config_args = require("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    cluster = config_args.ClusterConfig.from_yaml_file(str(path))  # Accelerate's own config class
    lay = plan.lay
    assert cluster.num_processes == lay.gpus
    args = launch.launch_command_parser().parse_args(["--config_file", str(path), "--machine_rank", "0", "train.py"])
    launch._validate_launch_command(args)
    env = launch_utils.prepare_multi_gpu_env(args)  # what torchrun is handed
    if cluster.num_machines > 1:
        master = getattr(args, "rdzv_endpoint", None) or f"{args.master_addr}:{args.master_port}"
        assert master == f"{plan.hostnames[0]}:29500"  # not None:29500
        assert args.nnodes == str(cluster.num_machines)
    for key, value in env.items():
        if key.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.setenv(key, value)
    pc = parallelism.ParallelismConfig()  # sizes from the environment, as Accelerator() reads them
    fsdp = env.get("ACCELERATE_USE_FSDP") == "true"
    fake = SimpleNamespace(
        multi_device=True, num_processes=lay.gpus, is_fsdp2=fsdp, is_main_process=True, distributed_type=None
    )
    pc._validate_accelerator(fake)  # total_size == num_processes, FSDP has a dimension to shard over
    assert (pc.dp_replicate_size * pc.dp_shard_size, pc.tp_size, pc.cp_size) == (lay.dp, lay.tp, lay.cp)
    assert env.get("FSDP_OFFLOAD_PARAMS", "false") == "false"
    if fsdp:
        assert env["FSDP_VERSION"] == "2"
        assert yaml.safe_load(text)["fsdp_config"]["fsdp_activation_checkpointing"] == (lay.recompute.value != "none")
