"""Plans covering every axis (tp, pp with uneven stages, vp, cp, dp, each sharding, each recompute, sp, fp8),
shared by the launcher-validation and the memory-agreement tests. Each plan lists the launchers expected to
refuse it, with the rule they name."""

from __future__ import annotations

from dataclasses import dataclass, field

from optlayout.layout import parse_layout
from optlayout.presets import model_preset
from optlayout.specs import JobSpec, Layout, ModelSpec


@dataclass(frozen=True)
class Plan:
    name: str
    model: str
    layout: str
    seq_len: int = 8192
    precision: str = "bf16"
    fp8_recipe: str | None = None
    grad_bytes: float = 2.0
    refused: dict[str, str] = field(default_factory=dict)  # launcher format -> part of its refusal

    @property
    def spec(self) -> ModelSpec:
        return model_preset(self.model)

    @property
    def job(self) -> JobSpec:
        return JobSpec(seq_len=self.seq_len, precision=self.precision, fp8_recipe=self.fp8_recipe,
                       grad_bytes_per_param=self.grad_bytes)  # fmt: skip

    @property
    def lay(self) -> Layout:
        return parse_layout(self.layout)

    @property
    def hostnames(self) -> list[str]:
        return [f"node{i}" for i in range(max(1, self.lay.gpus // 8))]


_NO_PP = "no pipeline parallelism in Accelerate"
_DS_PP_TP = "needs Megatron-DeepSpeed's model-parallel unit"

PLANS = (
    Plan(
        "70b-tp8-pp4-vp5-zero1-selective-sp",
        "llama3.1-70b",
        "tp=8,pp=4,vp=5,dp=2,mb=1,ga=16,sharding=zero1,recompute=selective,sp",
        refused={"accelerate": _NO_PP, "deepspeed": _DS_PP_TP},
    ),
    Plan(
        "405b-tp8-pp16-vp8-uneven-zero1-full-sp",
        "llama3.1-405b",
        "tp=8,pp=16,vp=8,dp=8,ga=16,first=7,last=7,sharding=zero1,recompute=full,sp",
        refused={"accelerate": _NO_PP, "deepspeed": _DS_PP_TP},
    ),
    Plan(
        "70b-tp8-pp4-uneven-fsdp-full-sp",
        "llama3.1-70b",
        "tp=8,pp=4,dp=2,ga=8,first=18,last=18,sharding=fsdp,recompute=full,sp",
        refused={"accelerate": _NO_PP, "deepspeed": "zero_optimization.stage < 2 with pipeline parallelism"},
    ),
    Plan(
        "8b-128k-tp8-cp4-fsdp-selective-sp",
        "llama3.1-8b",
        "tp=8,cp=4,dp=2,mb=1,ga=4,sharding=fsdp,recompute=selective,sp",
        seq_len=131072,
        grad_bytes=4.0,
        refused={
            "deepspeed": "context parallelism (cp=4) has no DeepSpeed equivalent",
            "accelerate": "sequence parallelism (sp) with tp=8 has no equivalent: the model's own transformers",
        },
    ),
    Plan(  # context parallelism without TP, for Accelerate (whose TP, transformers' tp_plan, has no SP)
        "8b-128k-cp8-fsdp-selective",
        "llama3.1-8b",
        "tp=1,cp=8,dp=2,mb=1,ga=4,sharding=fsdp,recompute=selective",
        seq_len=131072,
        grad_bytes=4.0,
        refused={"deepspeed": "context parallelism (cp=8) has no DeepSpeed equivalent"},
    ),
    Plan(  # TP and CP without sequence parallelism
        "8b-32k-tp2-cp2-zero1-nosp",
        "llama3.1-8b",
        "tp=2,cp=2,dp=2,mb=1,ga=4,sharding=zero1",
        seq_len=32768,
        grad_bytes=4.0,
        refused={"deepspeed": "context parallelism (cp=2) has no DeepSpeed equivalent"},
    ),
    Plan("8b-ddp", "llama3.1-8b", "dp=8,mb=2,ga=4,sharding=none", refused={"megatron-bridge": "names its mixed"}),
    Plan(
        "8b-tp2-zero2-fp32-grads",
        "llama3.1-8b",
        "tp=2,dp=4,mb=1,ga=8,sharding=zero2",
        grad_bytes=4.0,
    ),
    Plan(
        "70b-tp8-dp8-none-full",
        "llama3.1-70b",
        "tp=8,dp=8,mb=1,ga=4,sharding=none,recompute=full",
        refused={
            "torchtitan@0.2.2": "v0.2.2 rule DDP with no other parallelism broken",
            "accelerate": "tp/cp > 1 needs dp_shard_size > 1",
        },
    ),
    Plan(
        "70b-fp8-tp8-pp2-zero1-selective-sp",
        "llama3.1-70b",
        "tp=8,pp=2,dp=4,ga=8,sharding=zero1,recompute=selective,sp",
        precision="fp8",
        refused={"accelerate": _NO_PP, "deepspeed": _DS_PP_TP},
    ),
    Plan(  # the FP8 recipes: rowwise is torchao's only, blockwise Transformer Engine's only, mxfp8 both
        "8b-fp8-rowwise-fsdp",
        "llama3.1-8b",
        "tp=1,pp=1,dp=8,ga=4,sharding=fsdp",
        precision="fp8",
        fp8_recipe="rowwise",
        refused={
            "megatron": "fp8_recipe rowwise has no Megatron --fp8-recipe",
            "megatron-bridge": "names its mixed precision 'bf16_mixed'",
            "deepspeed": "precision fp8 (rowwise) has no DeepSpeed config key",
            "accelerate": "precision fp8 (rowwise) needs an fp8_config",
        },
    ),
    Plan(
        "70b-fp8-blockwise-tp4-pp2",
        "llama3.1-70b",
        "tp=4,pp=2,dp=8,ga=8,sharding=zero1,recompute=full",
        precision="fp8",
        fp8_recipe="blockwise",
        refused={
            "torchtitan@0.2.2": "no 1x128/128x128 blockwise recipe",
            "torchtitan@0.3.0": "no 1x128/128x128 blockwise recipe",
            "accelerate": _NO_PP,
            "deepspeed": _DS_PP_TP,
        },
    ),
    Plan(
        "70b-fp8-mxfp8-fsdp",
        "llama3.1-70b",
        "tp=1,pp=1,dp=32,ga=4,sharding=fsdp,recompute=full",
        precision="fp8",
        fp8_recipe="mxfp8",
        refused={
            "deepspeed": "precision fp8 (mxfp8) has no DeepSpeed config key",
            "accelerate": "precision fp8 (mxfp8) needs an fp8_config",
        },
    ),
    Plan(
        "70b-tp4-pp2-zero1-nosp",
        "llama3.1-70b",
        "tp=4,pp=2,dp=8,ga=8,sharding=zero1",
        refused={"accelerate": _NO_PP, "deepspeed": _DS_PP_TP},
    ),
    Plan(
        "8b-pp4-zero1",
        "llama3.1-8b",
        "pp=4,dp=2,mb=1,ga=8,sharding=zero1,recompute=full",
        refused={"accelerate": _NO_PP, "megatron-bridge": "names its mixed"},
    ),
)

PLANS += (
    Plan(
        "70b-tp8-pp4-vp5-zero1-full-rl3-sp",
        "llama3.1-70b",
        "tp=8,pp=4,vp=5,dp=2,mb=1,ga=16,sharding=zero1,recompute=full,rl=3,sp",
        refused={
            "accelerate": _NO_PP,
            "deepspeed": _DS_PP_TP,
            "torchtitan@0.3.0": "checkpoints every block or none",
            "torchtitan@0.2.2": "no 'every k-th layer'",
        },
    ),
    Plan(
        "8b-tp2-fsdp-full-rl16-sp",
        "llama3.1-8b",
        "tp=2,dp=4,mb=1,ga=8,sharding=fsdp,recompute=full,rl=16,sp",
        grad_bytes=4.0,
        refused={
            "accelerate": "recomputes every layer or none",
            "torchtitan@0.3.0": "checkpoints every block or none",
            "deepspeed": "sequence parallelism (sp) with tp=2 has no equivalent: AutoTP",
        },
    ),
)

_NO_MODULES = "with no module list"
PLANS += (
    Plan(  # Megatron-Core's --recompute-modules: the norms' outputs and the dense MLPs re-run, besides the core
        "70b-tp8-zero1-selective-modules-sp",
        "llama3.1-70b",
        "tp=8,dp=8,mb=1,ga=4,sharding=zero1,recompute=selective:core_attn+layernorm+mlp,sp",
        refused={
            "torchtitan@0.3.0": _NO_MODULES,
            "torchtitan@0.2.2": _NO_MODULES,
            "deepspeed": _NO_MODULES,
            "accelerate": _NO_MODULES,
        },
    ),
)

LAUNCHERS = ("megatron", "megatron-bridge", "torchtitan@0.3.0", "torchtitan@0.2.2", "deepspeed", "accelerate")


def emit_for(plan: Plan, launcher: str) -> str:
    """The emitted text of `launcher` (`torchtitan@VERSION` picks the torchtitan version)."""
    from optlayout.emit import emit

    fmt, _, version = launcher.partition("@")
    options = {"torchtitan_version": version} if version else {}
    return emit(fmt, plan.spec, plan.job, plan.lay, 8, hostnames=plan.hostnames, **options)


@dataclass(frozen=True)
class MoePlan:
    """A mixture-of-experts plan for the Megatron flags (the other launchers refuse MoE); the batch is the layout's."""

    model: str
    layout: str
    seq_len: int = 4096

    @property
    def job(self) -> JobSpec:
        lay = parse_layout(self.layout)
        return JobSpec(seq_len=self.seq_len, global_batch=lay.micro_batch * lay.grad_accum * lay.dp)


MOE_PLANS = [
    MoePlan("qwen3-30b-a3b", "dp=16,ep=16,ga=64"),  # Megatron-Bridge's H100 recipe (26.04)
    MoePlan("deepseek-v3", "pp=16,vp=2,dp=16,ep=16,ga=16,first=3,last=2"),  # uneven into vp: a layout string
    MoePlan("deepseek-v3", "tp=2,pp=8,dp=16,ep=32,ga=16,first=7,last=6,sp"),  # MTP on the last stage by default
    MoePlan("mixtral-8x7b", "tp=2,dp=8,ep=4,etp=2,ga=8,sp"),  # expert TP folded inside attention TP x DP
    MoePlan("llama4-maverick", "tp=8,dp=2,ep=16,ga=8,sp"),  # top-1, shared expert, every other layer MoE
    MoePlan("grok-1", "tp=4,pp=2,dp=2,ep=2,etp=4,ga=8,sp"),  # dgxc-benchmarking's Grok-1 degrees, smaller
    MoePlan("gpt-oss-120b", "pp=4,vp=3,dp=16,ep=8,ga=80"),  # Megatron-Bridge's H100 recipe: windows, sinks, biases
    # and its recomputation (perf_recipes/gpt_oss/h100/gpt_oss.py: recompute_modules ["layernorm", "moe_act"])
    MoePlan("gpt-oss-120b", "pp=4,vp=3,dp=16,ep=8,ga=80,recompute=selective:layernorm+moe_act"),
]
