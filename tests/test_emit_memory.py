"""The memory-relevant settings each launcher is given agree with what the memory model counted, per launcher.

For every plan and launcher, the emitted text is read back the way the launcher reads it, and what it makes
the launcher keep is derived here from the launchers' documented behaviour: gradient buffer width, weights,
gradients and optimizer state sharded or not, dropout, recomputation, offloading. Megatron and Megatron-Bridge
must match the memory model term for term; DeepSpeed likewise; FSDP2 launchers (torchtitan, Accelerate) keep
fp32 weights, gradients and Adam moments sharded (16 B/param over the shard group), plus the gathered 16-bit
weights when they are not resharded after forward, which must not exceed the state the plan counted; their
recomputation may stand in with one that keeps less.
"""

from __future__ import annotations

import ast
import json
import tomllib

import pytest
import yaml

from optlayout.cost.memory import state_bytes_per_gpu
from optlayout.specs import Recompute, Sharding
from tests.launcher_plans import PLANS, Plan, emit_for

IDS = [p.name for p in PLANS]
RECOMPUTE_KEPT = {"none": 2, "selective": 1, "full": 0}  # more kept activations -> higher rank


def _emit(plan: Plan, launcher: str) -> str | None:
    if launcher in plan.refused:
        return None
    return emit_for(plan, launcher)


def _planned(plan: Plan) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter the memory model counts on a GPU."""
    lay = plan.lay
    return state_bytes_per_gpu(1.0, plan.job, lay.sharding, lay.dp * lay.cp)


def _megatron_kept(flags: dict[str, list[str]], plan: Plan) -> tuple[float, float, float]:
    """Megatron: 16-bit weights (sharded by Megatron-FSDP optim_grads_params), gradient buffers in fp32 unless
    --grad-reduce-in-bf16 (bf16) / in fp16 unless --accumulate-allreduce-grads-in-fp32 (fp16), sharded by
    optim_grads and optim_grads_params; fp32 master weights and Adam moments (12 B) sharded by the distributed
    optimizer."""
    d = plan.lay.dp * plan.lay.cp
    strategy = flags.get("--data-parallel-sharding-strategy", ["no_shard"])[0] if "--use-megatron-fsdp" in flags else ""
    if "--fp16" in flags:
        grad = 4.0 if "--accumulate-allreduce-grads-in-fp32" in flags else 2.0
    else:
        grad = 2.0 if "--grad-reduce-in-bf16" in flags else 4.0
    weights = 2.0 / (d if strategy == "optim_grads_params" else 1)
    grads = grad / (d if strategy in ("optim_grads", "optim_grads_params") else 1)
    optim = 12.0 / (d if "--use-distributed-optimizer" in flags else 1)
    return weights, grads, optim


def _flags(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        flag, *values = line.split()
        out[flag] = values
    return out


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_megatron_keeps_what_the_memory_model_counts(plan):
    text = _emit(plan, "megatron")
    if text is None:
        return
    flags = _flags(text)
    assert _megatron_kept(flags, plan) == pytest.approx(_planned(plan))
    dropout = 0.1 if plan.job.dropout else 0.0
    assert float(flags["--attention-dropout"][0]) == float(flags["--hidden-dropout"][0]) == dropout
    granularity = flags.get("--recompute-granularity", ["none"])[0]
    assert granularity == plan.lay.recompute.value
    modules = [m.value for m in plan.lay.recompute_modules] if plan.lay.recompute_modules else None
    assert flags.get("--recompute-modules") == modules  # absent: Megatron's default, core_attn
    if plan.lay.recompute is Recompute.full and plan.lay.recompute_layers is None:  # every layer, only its input kept
        assert flags["--recompute-method"] == ["uniform"] and flags["--recompute-num-layers"] == ["1"]
    elif plan.lay.recompute is Recompute.full:  # the first N layers of each model chunk, the rest keep everything
        assert flags["--recompute-method"] == ["block"]
        assert flags["--recompute-num-layers"] == [str(plan.lay.recompute_layers)]
    assert not any("offload" in f or "cpu" in f for f in flags)


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_megatron_bridge_keeps_what_the_memory_model_counts(plan):
    text = _emit(plan, "megatron-bridge")
    if text is None:
        return
    values = dict(line.split("=", 1) for line in text.splitlines())
    # Bridge copies mixed_precision.grad_reduce_in_fp32 onto ddp; recipes that name bf16_mixed keep fp32
    fp32 = values.get("mixed_precision.grad_reduce_in_fp32", "true") == "true"
    strategy = values["ddp.data_parallel_sharding_strategy"] if values["ddp.use_megatron_fsdp"] == "true" else ""
    flags = {"--data-parallel-sharding-strategy": [strategy]} if strategy else {}
    flags |= {"--use-megatron-fsdp": []} if strategy else {}
    flags |= {} if fp32 else {"--grad-reduce-in-bf16": []}
    flags |= {"--use-distributed-optimizer": []} if values["ddp.use_distributed_optimizer"] == "true" else {}
    assert _megatron_kept(flags, plan) == pytest.approx(_planned(plan))
    assert values["model.attention_dropout"] == values["model.hidden_dropout"] == "0.0"
    assert values["model.recompute_granularity"] == {"none": "null"}.get(
        plan.lay.recompute.value, plan.lay.recompute.value
    )
    if plan.lay.recompute is Recompute.selective:  # Megatron's default set when the plan names none
        modules = plan.lay.recompute_modules or ("core_attn",)
        assert values["model.recompute_modules"] == "[" + ",".join(modules) + "]"


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_deepspeed_keeps_what_the_memory_model_counts(plan):
    text = _emit(plan, "deepspeed")
    if text is None:
        return
    doc = json.loads(text)
    d, stage = plan.lay.dp * plan.lay.cp, doc["zero_optimization"]["stage"]
    grad = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0}[doc["data_types"]["grad_accum_dtype"]]
    kept = (2.0 / (d if stage == 3 else 1), grad / (d if stage >= 2 else 1), 12.0 / (d if stage >= 1 else 1))
    assert kept == pytest.approx(_planned(plan))
    assert "offload_optimizer" not in doc["zero_optimization"] and "offload_param" not in doc["zero_optimization"]


def _fsdp2_kept(shard: int, keep_gathered: bool) -> float:
    return 16.0 / shard + (2.0 if keep_gathered else 0.0)


@pytest.mark.parametrize("version", ["0.2.2", "0.3.0"])
@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_torchtitan_keeps_no_more_than_the_memory_model_counts(plan, version):
    text = _emit(plan, f"torchtitan@{version}")
    if text is None:
        return
    if version == "0.2.2":
        doc = tomllib.loads(text)
        par, train, ac = doc["parallelism"], doc["training"], doc["activation_checkpoint"]["mode"]
        if doc["activation_checkpoint"].get("selective_ac_option", "op").isdigit():  # layer-level: whole blocks, the
            ac = "full"  # plan's N a chunk (test_launchers counts the blocks torchtitan wraps)
    else:  # read the keyword arguments and assignments of the generated recipe
        tree = ast.parse(text)
        call = next(
            n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ParallelismConfig"
        )
        par = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        train = {
            n.targets[0].attr: ast.literal_eval(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).startswith("config.training.")
        }
        ac = {"None": "none", "SelectiveAC.Config()": "selective", "FullAC.Config()": "full"}[
            next(
                ast.unparse(n.value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "config.activation_checkpoint"
            )
        ]
    shard = par["data_parallel_shard_degree"] * par["context_parallel_degree"]  # FSDP2 over dp_shard x cp
    kept = _fsdp2_kept(shard, par["fsdp_reshard_after_forward"] == "never")
    assert kept <= sum(_planned(plan)) + 1e-9
    if plan.lay.sharding is Sharding.fsdp and plan.grad_bytes == 2:
        assert kept == pytest.approx(sum(_planned(plan)))  # 4 + 4 + 8 over d = 2 + 2 + 12 over d
    assert RECOMPUTE_KEPT[ac] <= RECOMPUTE_KEPT[plan.lay.recompute.value]
    assert train["enable_cpu_offload"] is False


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_accelerate_keeps_no_more_than_the_memory_model_counts(plan):
    text = _emit(plan, "accelerate")
    if text is None:
        return
    doc = yaml.safe_load(text)
    pc = doc["parallelism_config"]
    fsdp = doc.get("fsdp_config")
    if fsdp:
        shard = pc["parallelism_config_dp_shard_size"] * pc["parallelism_config_cp_size"]
        kept = _fsdp2_kept(shard, not fsdp["fsdp_reshard_after_forward"])
        assert fsdp["fsdp_offload_params"] is False
        recompute = "full" if fsdp["fsdp_activation_checkpointing"] else "none"
        assert RECOMPUTE_KEPT[recompute] <= RECOMPUTE_KEPT[plan.lay.recompute.value]
    else:  # DDP: fp32 weights and gradients, Adam moments, all replicated
        kept = 16.0
    assert kept <= sum(_planned(plan)) + 1e-9
