"""Measured runs in the run-record format of `shared/data/README.md` (JSON Lines, or CSV with dotted columns)."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from optlayout.cost.moe import unpriced_sm_share_note
from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.json_doc import parse_json
from optlayout.inputs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN
from optlayout.inputs.numbers import number_from_text
from optlayout.inputs.readers import RUNS
from optlayout.layout.megatron_core import NEMO_CONTAINERS, Version
from optlayout.layout.model import Recompute, Sharding
from optlayout.layout.recompute import RecomputeModule, parse_modules
from optlayout.layout.text import KEYS, recompute_text
from optlayout.presets import gpu_preset
from optlayout.specs import (
    STATE_DTYPE_FIELDS,
    AttentionKernel,
    ClusterSpec,
    Fp8Recipe,
    JobSpec,
    MainParamsDtype,
    ModelSpec,
    MoeDispatcher,
    MoeRouting,
    Optimizer,
    Precision,
    StateDtype,
    fp8_pricing_note,
    gather_needs_fp8,
    recipe_needs_fp8,
)

LAYOUT_FIELDS = (
    "tp",
    "pp",
    "cp",
    "dp",
    "vp",
    "ep",
    "etp",
    "micro_batch",
    "sharding",
    "recompute",
    "recompute_layers",
    "recompute_modules",
    "sequence_parallel",
)
EXPERT_FIELDS = ("ep", "etp")  # a dense model has none: absent or null, they are 1, not unknown


class RunJob(BaseModel):
    # every job field changes a prediction: an unknown one (a misspelt moe_dispatcher) is refused, never ignored
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    global_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH)
    precision: Precision = "bf16"
    fp8_recipe: Fp8Recipe | None = Field(None, description="tensorwise | rowwise | blockwise | mxfp8; fp8 only")
    attention_kernel: AttentionKernel | None = Field(
        None, description="flash | flash2 | triton | naive; null = not stated"
    )
    moe_routing: MoeRouting | None = Field(None, description="balanced (forced uniform, dropless); null = real routing")
    moe_dispatcher: MoeDispatcher | None = Field(None, description="alltoall | flex; null = not stated")
    moe_ep_overlap: bool | None = Field(
        None, description="Megatron --overlap-moe-expert-parallel-comm; null = not stated (off, Megatron's default)"
    )
    optimizer: Optimizer = "adam"
    dropout: bool | None = Field(None, description="dropout layers active; null = not stated (assumed off)")
    fp8_param_gather: bool | None = Field(None, description="FP8 primary weights; null = not stated (the recipe's)")
    main_params_dtype: MainParamsDtype | None = Field(None, description="optimizer master weights; null = recipe/fp32")
    exp_avg_dtype: StateDtype | None = Field(None, description="Adam's first moment; null = the recipe's or fp32")
    exp_avg_sq_dtype: StateDtype | None = Field(None, description="Adam's second moment; null = the recipe's or fp32")

    _recipe_needs_fp8 = pydantic.field_validator("fp8_recipe")(recipe_needs_fp8)

    @model_validator(mode="after")
    def _gather_needs_fp8(self) -> RunJob:
        gather_needs_fp8(self.fp8_param_gather, self.precision)
        return self



# Frameworks that run an Ampere-era attention kernel on the GPUs listed (None: every GPU): the kernel and why,
# recognised in a record's `source` when `job.attention_kernel` is not stated.
FRAMEWORK_ATTENTION: dict[str, tuple[AttentionKernel, str, frozenset[str] | None]] = {
    "llm-foundry": (
        "triton",
        "llm-foundry's MPT benchmarks ran attn_impl triton (scripts/train/yamls/pretrain/mpt-*.yaml and "
        "benchmarking/submit_benchmarks.py's default @b2a43a1)",
        None,
    ),
    "torchtitan": (
        "flash2",
        "torchtitan's SDPA takes PyTorch's FlashAttention-2 backend before Blackwell (torchtitan PR #1196)",
        frozenset({"ampere", "hopper"}),
    ),
}


# The token dispatcher of Megatron-Bridge's MoE performance recipes (perf_recipes/{qwen,gpt_oss}/<system>/ @067f987d):
# HybridEP through the flex dispatcher on the NVL72 and B300 systems, the all-to-all dispatcher elsewhere, but for the
# (model, GPU) and releases listed: Qwen3-30B-A3B on H100 with DeepEP in v0.3.0 (NeMo 26.02:
# scripts/performance/configs/qwen/qwen3_workload_base_configs.py @v0.3.0 lines 421-429, applied by
# apply_flex_dispatcher_backend) and HybridEP from v0.3.1 on, and on B200 from v0.4.0 (NeMo 26.04) on: the recipe
# sets moe_token_dispatcher_type = "flex" on every system (qwen3_llm_pretrain.py @v0.3.1 line 315, @v0.4.0, @v0.5.0).
BRIDGE_FLEX_GPUS = frozenset({"gb200", "gb300", "b300"})
BRIDGE_FLEX_RELEASES: dict[tuple[str, str], frozenset[str]] = {
    ("Qwen3-30B-A3B", "h100-sxm"): frozenset({"mb-26.02", "mb-26.02.01", "mb-26.04", "mb-26.04.01", "mb-26.06",
                                              "mb-26.06.01", "mb-26.08"}),
    ("Qwen3-30B-A3B", "b200"): frozenset({"mb-26.04", "mb-26.04.01", "mb-26.06", "mb-26.06.01", "mb-26.08"}),
}  # fmt: skip


NEMO_RECORD_MEGATRON_CORE: tuple[tuple[str, str, Version], ...] = (
    ("nemo2403-", "", (0, 7, 0)),
    ("nemo2407-", "", NEMO_CONTAINERS["24.07"]),
    ("dgxc-v24.11.1-", "GPT-3", NEMO_CONTAINERS["24.05"]),
    ("dgxc-v24.11.1-", "", NEMO_CONTAINERS["24.09"]),
    ("dgxc-v25.02-", "", (0, 10, 0)),
)
"""The Megatron-Core of the NeMo records (id prefix, model name prefix, release), first match wins: the NeMo tables'
24.03 (at most 24.05's 0.7.0) and 24.07; dgxc-benchmarking's containers (`*/setup.sh` @v24.11.1: nemo_megatron,
GPT-3, `nemo:24.05`; llama3.1 and nemotron `nemo:24.09`; @v25.02 `nemo:24.12`, whose Megatron-Core NeMo's component
table does not give: at most 0.10.0, as a December 2024 container predates core_v0.11.0 of 2025-03-14)."""


@dataclass(frozen=True)
class RecipeRecompute:
    """The activation recomputation a published recipe sets, in the layout's fields: with `full`, the layers
    recomputed per model chunk (`recompute_layers`, Megatron's block method; None: every layer), with `selective`,
    the modules (None: Megatron's default, core_attn). `source`: the recipe file, its tag and lines."""

    recompute: Recompute
    source: str
    recompute_layers: int | None = None
    recompute_modules: tuple[RecomputeModule, ...] | None = None

    def text(self) -> str:
        """`none`, `selective:layernorm+moe_act`, `full,rl=5` (the layout text's form)."""
        layers = KEYS["rl"].text(self.recompute_layers) if self.recompute_layers is not None else None
        return ",".join(t for t in (recompute_text(self), layers) if t)

    def pins(self) -> dict[str, object]:
        """The layout fields the recipe fixes, as solver pins."""
        fields = {"recompute": self.recompute, "recompute_layers": self.recompute_layers,
                  "recompute_modules": self.recompute_modules}  # fmt: skip
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class RecipeSharding:
    """The training-state sharding a published recipe sets (its optimizer and FSDP flags); `source` as above."""

    sharding: Sharding
    source: str

    def text(self) -> str:
        return self.sharding.value

    def pins(self) -> dict[str, object]:
        return {"sharding": self.sharding}


@dataclass(frozen=True)
class RecipeState:
    """The optimizer-state dtypes a published recipe sets (master weights, Adam's moments); `source` as above."""

    main_params_dtype: MainParamsDtype
    exp_avg_dtype: StateDtype
    exp_avg_sq_dtype: StateDtype
    source: str

    def dtypes(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in STATE_DTYPE_FIELDS}


@dataclass(frozen=True)
class RecipeDegrees:
    """The per-GPU degrees a published recipe runs (vp None: no virtual pipeline); `source` as above. A record
    publishing another value of one of them ran another layout: nothing is filled from the recipe."""

    tp: int
    pp: int
    cp: int
    vp: int | None
    micro_batch: int
    source: str

    def mismatch(self, layout: RunLayout) -> str | None:
        """The first published degree that is not the recipe's, as a reason; None when all published agree."""
        for name in ("tp", "pp", "cp", "vp", "micro_batch"):
            published, recipe = getattr(layout, name), getattr(self, name)
            if published is None:
                continue
            ran = None if name == "vp" and published == 1 else published  # one chunk per rank: no virtual pipeline
            if ran != recipe:
                return f"the record's {name} {published} is not the recipe's {recipe if recipe is not None else 'none'}"
        return None


@dataclass(frozen=True)
class RecipeFill:
    """What a published recipe sets of the layout fields its runs' records may leave unpublished (and of the
    optimizer state, where it is not fp32); `degrees`, where stated, what the fill is checked against. A field left
    None is not filled: the solver fills it (a state-only fill, where the recipe's degrees are not the run's)."""

    recompute: RecipeRecompute | None
    sharding: RecipeSharding | None
    state: RecipeState | None = None
    degrees: RecipeDegrees | None = None


# A record's release, named by its id: `mb-<NeMo container>-...` (Megatron-Bridge performance summary),
# `dgxc-<dgxc-benchmarking tag>-...`, `nemo<yymm>-...` (NeMo's performance summary of that container).
_RELEASE_ID = re.compile(r"^(mb-\d{2}\.\d{2}(?:\.\d{2})?|dgxc-v\d{2}\.\d{2}(?:\.\d+)?|nemo\d{4})-")

RecipeKey = tuple[str, str, str, Precision, Fp8Recipe | None]
"""(release, model name, GPU, precision, FP8 recipe): what identifies a published recipe."""


def _recipes(
    fill: RecipeFill, releases: tuple[str, ...], models: tuple[str, ...], gpus: tuple[str, ...],
    precisions: tuple[tuple[Precision, Fp8Recipe | None], ...],
) -> dict[RecipeKey, RecipeFill]:  # fmt: skip
    return {(r, m, g, p, f): fill for r in releases for m in models for g in gpus for p, f in precisions}


_BRIDGE_NONE_25_09 = RecipeRecompute(
    Recompute.none,
    "Megatron-Bridge scripts/performance/configs/llama3/llama3_{8b,70b}_llm_pretrain.yaml @v0.1.0rc3 perf_matrix "
    "(8B h100 52-77, b200 78-96, gb200 97-115; 70B h100 56-77, gb200 117-152): no recompute_num_layers",
)
_BRIDGE_NONE_25_11 = RecipeRecompute(
    Recompute.none,
    "Megatron-Bridge scripts/performance/configs/llama3/workload_base_configs.py @v0.2.0 (70B GB300 FP8-CS 43-48, "
    "GB200 FP8-CS 73-78, GB200 FP8-MX 81-86, H100 FP8-CS 140-145; 8B GB200 182-189, B200 207-215): no recompute",
)
_BRIDGE_NONE_26 = RecipeRecompute(
    Recompute.none,
    "Megatron-Bridge scripts/performance/configs/llama/llama3_workload_base_configs.py @v0.3.0, v0.3.1, v0.4.0, "
    "v0.4.2 (the V2, GBS 256 presets, lines 211-254 and 339-344, the same at each tag): no recompute",
)
_DGXC_NONE = RecipeRecompute(
    Recompute.none,
    "dgxc-benchmarking llama3.1/llama3.1_{8b,70b}.yaml 112-115, llama3.1_405b.yaml 118-121, "
    "nemo_megatron/gpt3_175b_hydra.yaml 85-88, nemotron/nemotron4-15b-synth.yaml 134-137 (@v24.11.1; 136-139 "
    "@v25.02): activations_checkpoint_granularity null",
)
_DGXC_SELECTIVE = RecipeRecompute(
    Recompute.selective,
    "dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml @v24.11.1 and @v25.02 lines 138-141: "
    "activations_checkpoint_granularity selective, method null (Megatron's selective: the attention core)",
)
_GPT_OSS_SELECTIVE = RecipeRecompute(
    Recompute.selective,
    "Megatron-Bridge scripts/performance/configs/gpt_oss/workload_base_configs.py @v0.2.0 lines 41-61, "
    "gpt_oss_workload_base_configs.py @v0.3.0 to @v0.4.2 lines 54-82: recompute_modules=[layernorm, moe_act]",
    recompute_modules=(RecomputeModule.layernorm, RecomputeModule.moe_act),
)
# Megatron-Core's distributed optimizer shards the optimizer state over the data-parallel group and keeps whole
# gradients (ZeRO-1); so does Apex's DistributedFusedAdam (NeMo's distributed_fused_adam) with
# contiguous_grad_buffer, whose persistent buffer holds every gradient (apex/contrib/optimizers/
# distributed_fused_adam.py, the argument's docstring).
_DGXC_ZERO1 = RecipeSharding(
    Sharding.zero1,
    "dgxc-benchmarking @v24.11.1 and @v25.02 (fsdp false where set; optim distributed_fused_adam with "
    "contiguous_grad_buffer true): llama3.1/llama3.1_8b.yaml 140-150, llama3.1_70b.yaml 144-154, llama3.1_405b.yaml "
    "147-157, nemo_megatron/gpt3_175b_hydra.yaml 81 and 138-143, nemotron/nemotron4-340b-synth.yaml 146 and 182-189, "
    "nemotron/nemotron4-15b-synth.yaml 142 and 176-181 (@v25.02 144 and 178-183: mcore_distributed_optim)",
)
_BRIDGE_ZERO1_25_09 = RecipeSharding(
    Sharding.zero1,
    "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3_8b.py @v0.1.0rc3 lines 187-188, llama3_70b.py lines "
    "184-185: ddp use_distributed_optimizer=True, use_megatron_fsdp from the perf_matrix row, false "
    "(scripts/performance/configs/llama3/llama3_8b_llm_pretrain.yaml lines 92, 111; llama3_70b_llm_pretrain.yaml 68)",
)
_BRIDGE_ZERO1_25_11 = RecipeSharding(
    Sharding.zero1,
    "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py @v0.2.0 lines 559-560, recipes/gpt_oss/gpt_oss.py "
    "lines 290-291: ddp use_distributed_optimizer=True, use_megatron_fsdp from the workload preset, which sets none",
)
_BRIDGE_ZERO1_26_02 = RecipeSharding(
    Sharding.zero1,
    "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py @v0.3.0 lines 560-561, recipes/gpt_oss/gpt_oss.py "
    "lines 293-294: ddp use_distributed_optimizer=True, use_megatron_fsdp from the workload preset, which sets none",
)
_BRIDGE_ZERO1_26 = RecipeSharding(
    Sharding.zero1,
    "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py @v0.3.1, v0.4.0, v0.4.2 lines 730-731 "
    "(llama3_70b_pretrain_config), recipes/gpt_oss/gpt_oss.py @v0.3.1 lines 241-242, @v0.4.0 and v0.4.2 253-254: "
    "ddp.use_distributed_optimizer = True, ddp.use_megatron_fsdp = False",
)
# Apex's DistributedFusedAdam (NeMo's distributed_fused_adam) keeps its parameter shard and both moments in `dtype`
# (store_params defaults true; apex/contrib/optimizers/distributed_fused_adam.py @6424da3b lines 308-309, 452-482,
# 564) and reduces gradients in grad_sync_dtype, bf16 here: the 2-byte gradients the memory model keeps.
_DGXC_340B_BF16_STATE = RecipeState(
    "bf16", "bf16", "bf16",
    "dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml @v24.11.1 and @v25.02 lines 183-186: optim "
    "distributed_fused_adam, grad_sync_dtype bf16, dtype bf16 (master weights and both moments in bf16)",
)  # fmt: skip
# NeMo 24.07's table publishes Nemotron-4 340B at PP 8, VP 12, the release's launcher config at PP 12, VP 8: only its
# optimizer state, which no parallel degree changes, is filled from that config. Of the 11 launcher configs of the
# table's models it is the only one keeping a state other than fp32 (the others set no `dtype`: fp32).
_NEMO2407_340B_BF16_STATE = RecipeState(
    "bf16", "bf16", "bf16",
    "NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml @24.07 lines 158-162: optim "
    "distributed_fused_adam, grad_sync_dtype bf16, dtype bf16 (master weights and both moments in bf16)",
)  # fmt: skip
_BRIDGE_70B_26 = "Megatron-Bridge scripts/performance/configs/llama/llama3_workload_base_configs.py @v0.3.0 to v0.4.2"
_BRIDGE_70B_DEGREES_26 = {  # the V2 presets on the WorkloadBaseConfig defaults (TP, PP 1, CP 1, no VP, MBS 1)
    "h100-sxm": RecipeDegrees(4, 8, 1, 5, 1, f"{_BRIDGE_70B_26} lines 339-344 (H100_FP8_CS_V2)"),
    "gb200": RecipeDegrees(2, 4, 1, 5, 1, f"{_BRIDGE_70B_26} lines 249-254 (GB200_FP8_MX_V2)"),
    "gb300": RecipeDegrees(1, 4, 1, 5, 1, f"{_BRIDGE_70B_26} lines 219-223 (GB300_FP8_MX_V2)"),
}
_DGXC_NEMOTRON = "dgxc-benchmarking nemotron/configure.sh @v24.11.1 lines {a} (@v25.02 {b}, CP 1 but for 340B BF16)"
_DGXC_15B_DEGREES = RecipeDegrees(4, 1, 1, None, 4, _DGXC_NEMOTRON.format(a="53-60", b="58-66") + ": 15B")
_DGXC_340B_DEGREES = RecipeDegrees(8, 8, 1, 12, 1, _DGXC_NEMOTRON.format(a="63-70", b="68-80") + ": 340B")
_FP8_CS: tuple[tuple[Precision, Fp8Recipe | None], ...] = (("fp8", "tensorwise"),)
_FP8_MX: tuple[tuple[Precision, Fp8Recipe | None], ...] = (("fp8", "mxfp8"),)
_FP8_CS_MX: tuple[tuple[Precision, Fp8Recipe | None], ...] = (("fp8", "tensorwise"), ("fp8", "mxfp8"))
_BOTH: tuple[tuple[Precision, Fp8Recipe | None], ...] = (("bf16", None), ("fp8", None))
_BRIDGE_26 = ("mb-26.02.01", "mb-26.04", "mb-26.04.01")

# The recomputation and sharding (and a reduced optimizer state) of NVIDIA's published recipes, for the records that
# leave them unpublished: filled only where the published per-GPU layout (TP, PP, CP, VP, MBS, FSDP) is the recipe's of
# that release (the global batch may differ: it changes the accumulation only) and the recipe uses nothing else the
# layout cannot express that changes memory or time (`RECIPE_LEFT_ALONE`). Megatron-Bridge containers ship: 25.09
# v0.1.0rc3, 25.11 v0.2.0, 26.02 v0.3.0, 26.04 v0.4.0 (docs/releases/software-versions.md @v0.6.0), 26.02.01 v0.3.1
# (docs/releases/known-issues.md), 26.04.01 v0.4.2 (the first performance summary listing it); their perf scripts set
# full block recomputation only from `recompute_num_layers` (utils/helpers.py @v0.2.0 lines 166-179; utils/overrides.py
# @v0.4.2 lines 136-150) and the base Llama 3 recipe sets none (recipes/llama/llama3.py @v0.4.2 lines 99-101); no preset
# of a filled setup sets `cpu_offloading_num_layers` (the perf scripts' only activation offload, utils/helpers.py
# @v0.2.0 lines 170-173, utils/overrides.py @v0.4.2 lines 140-143) and the GPT-OSS presets set none. dgxc's MaxText and
# Paxml (JAX rematerialisation policies, save_dot_except_mlp / save_qkv_proj / SAVE_DOT_ONLY, name the matmul outputs
# kept, not recomputed modules: no Megatron module set says the same) and the NeMo 24.07 and 24.03 performance tables'
# layouts (they name the container only, and NeMo-Framework-Launcher's 24.07 training configs differ from their degrees)
# are left to the solver too. dgxc @v25.02's gpt3_175b_hydra.yaml line 57 says VP 6 where its README_175b.md (lines 54,
# 61, 155) and the published table say VP 12; its recomputation and optimizer lines are those of @v24.11.1, so the fill
# stands. Where an entry states the recipe's degrees (`RecipeDegrees`: the Bridge 26.x Llama 3 70B presets, dgxc's
# Nemotron-4), a record publishing others is not filled and says why (`RunRecord.recipe_mismatch`); the other entries
# state none yet and are not checked. FP8 primary weights are not a recipe fill: every FP8 run of these sources keeps
# them (`FP8_PARAM_GATHER_RECIPES`). Nemotron-4 340B keeps its optimizer state in bf16 (`_DGXC_340B_BF16_STATE`), in
# NeMo 24.07 too (`_NEMO2407_340B_BF16_STATE`, the only fill of that table).
RECIPE_FILL: dict[RecipeKey, RecipeFill] = {
    **_recipes(RecipeFill(_BRIDGE_NONE_25_09, _BRIDGE_ZERO1_25_09), ("mb-25.09",), ("Llama 3 8B",), ("gb200", "b200"),
               (("fp8", None), ("fp8", "blockwise"))),
    **_recipes(RecipeFill(_BRIDGE_NONE_25_09, _BRIDGE_ZERO1_25_09), ("mb-25.09",), ("Llama 3 8B", "Llama 3 70B"),
               ("h100-sxm",), (("fp8", None),)),
    **_recipes(RecipeFill(_BRIDGE_NONE_25_11, _BRIDGE_ZERO1_25_11), ("mb-25.11",), ("Llama 3 8B",), ("gb200", "b200"),
               _FP8_CS_MX),
    **_recipes(RecipeFill(_BRIDGE_NONE_25_11, _BRIDGE_ZERO1_25_11), ("mb-25.11",), ("Llama 3 70B",), ("h100-sxm",),
               _FP8_CS),
    **{key: fill for gpu, releases, sharding, precisions in (
        ("h100-sxm", ("mb-26.02",), _BRIDGE_ZERO1_26_02, _FP8_CS),
        ("gb200", ("mb-26.02",), _BRIDGE_ZERO1_26_02, _FP8_MX),
        ("gb300", ("mb-26.02",), _BRIDGE_ZERO1_26_02, _FP8_MX),
        ("h100-sxm", _BRIDGE_26, _BRIDGE_ZERO1_26, _FP8_CS),
        ("gb200", _BRIDGE_26, _BRIDGE_ZERO1_26, _FP8_MX),
        ("gb300", ("mb-26.04", "mb-26.04.01"), _BRIDGE_ZERO1_26, _FP8_MX))
       for key, fill in _recipes(RecipeFill(_BRIDGE_NONE_26, sharding, degrees=_BRIDGE_70B_DEGREES_26[gpu]), releases,
                                 ("Llama 3 70B",), (gpu,), precisions).items()},
    **_recipes(RecipeFill(_DGXC_NONE, _DGXC_ZERO1), ("dgxc-v24.11.1", "dgxc-v25.02"),
               ("Llama 3.1 8B", "Llama 3.1 70B", "Llama 3.1 405B", "GPT-3 175B (NeMo Megatron)"), ("h100-sxm",), _BOTH),
    **_recipes(RecipeFill(_DGXC_NONE, _DGXC_ZERO1, degrees=_DGXC_15B_DEGREES), ("dgxc-v24.11.1", "dgxc-v25.02"),
               ("Nemotron-4 15B",), ("h100-sxm",), _BOTH),
    **_recipes(RecipeFill(_DGXC_SELECTIVE, _DGXC_ZERO1, _DGXC_340B_BF16_STATE, _DGXC_340B_DEGREES),
               ("dgxc-v24.11.1", "dgxc-v25.02"), ("Nemotron-4 340B",), ("h100-sxm",), (("fp8", None),)),
    ("nemo2407", "Nemotron-4 340B", "h100-sxm", "fp8", "tensorwise"): RecipeFill(None, None, _NEMO2407_340B_BF16_STATE),
    **_recipes(RecipeFill(_DGXC_SELECTIVE, _DGXC_ZERO1, _DGXC_340B_BF16_STATE, _DGXC_340B_DEGREES),
               ("dgxc-v24.11.1",), ("Nemotron-4 340B",), ("h100-sxm",), (("bf16", None),)),
    **_recipes(RecipeFill(_DGXC_SELECTIVE, _DGXC_ZERO1, _DGXC_340B_BF16_STATE, RecipeDegrees(
        8, 8, 2, 12, 1, _DGXC_NEMOTRON.format(a="63-70", b="68-80") + ": 340B BF16, CP 2")), ("dgxc-v25.02",),
        ("Nemotron-4 340B",), ("h100-sxm",), (("bf16", None),)),
    # GPT-OSS 120B BF16: none on GB300; the FP8-MX recipes are left to the solver: on GB200 they end with no module
    # (perf_recipes/gpt_oss/gb200/gpt_oss.py @067f987d lines 240-241, @v0.5.0 line 220), on GB300 none is set
    **_recipes(RecipeFill(_GPT_OSS_SELECTIVE, _BRIDGE_ZERO1_25_11), ("mb-25.11",), ("GPT-OSS 120B",),
               ("gb200", "b200", "h100-sxm"), (("bf16", None),)),
    **_recipes(RecipeFill(_GPT_OSS_SELECTIVE, _BRIDGE_ZERO1_26_02), ("mb-26.02",), ("GPT-OSS 120B",),
               ("gb200", "b200", "h100-sxm"), (("bf16", None),)),
    **_recipes(RecipeFill(_GPT_OSS_SELECTIVE, _BRIDGE_ZERO1_26), _BRIDGE_26, ("GPT-OSS 120B",),
               ("gb200", "b200", "h100-sxm"), (("bf16", None),)),
}  # fmt: skip

# Frameworks whose FP8 runs of a release keep FP8 primary weights: (release prefix, framework, FP8 recipes, why).
FP8_PARAM_GATHER_RECIPES: tuple[tuple[str, str, tuple[Fp8Recipe | None, ...], str], ...] = (
    ("mb-", "megatron-bridge", (None, "tensorwise", "mxfp8"),
     "Megatron-Bridge's delayed, current-scaling and MXFP8 precision configs set fp8_param_gather (MXFP8 also "
     "reuse_grad_buf_for_mxfp8_param_ag; src/megatron/bridge/training/mixed_precision.py @v0.1.0rc3 lines 183-334, "
     "@v0.4.2 223-374; its subchannel, blockwise, configs do not), which the perf scripts keep"),
    ("dgxc-", "nemo", (None,),
     "dgxc-benchmarking's NeMo FP8 runs set model.fp8_params (llama3.1/configure.sh @v24.11.1 line 116, @v25.02 124; "
     "nemotron/configure.sh 104, 115; nemo_megatron/gpt3_175b_hydra.yaml line 221)"),
)  # fmt: skip

_OFFLOADS = (
    "its recipe offloads {n} layers' activations to the CPU (cpu_offloading_num_layers, Megatron-Bridge {where}), "
    "which the layout cannot express: filled with none, the run does not fit the memory model"
)
_OFFLOAD_26 = "scripts/performance/configs/llama/llama3_workload_base_configs.py @v0.3.0 to v0.4.2 lines {lines}"
# Published NVIDIA recipes left to the solver, and why.
RECIPE_LEFT_ALONE: dict[RecipeKey, str] = {
    ("mb-25.09", "Llama 3 70B", "gb200", "fp8", None): _OFFLOADS.format(
        n=40, where="scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml @v0.1.0rc3 lines 140-146"),
    **{("mb-25.11", "Llama 3 70B", gpu, "fp8", "tensorwise"): _OFFLOADS.format(
        n=n, where=f"scripts/performance/configs/llama3/workload_base_configs.py @v0.2.0 lines {lines}")
       for gpu, n, lines in (("gb300", 20, "43-48"), ("gb200", 40, "73-78"))},
    **{(release, "Llama 3 70B", gpu, "fp8", "tensorwise"): _OFFLOADS.format(n=n, where=_OFFLOAD_26.format(lines=lines))
       for release in ("mb-26.02", *_BRIDGE_26)
       for gpu, n, lines in (("gb300", 20, "211-216"), ("gb200", 40, "241-246"))},
    ("mb-25.09", "Llama 3 70B", "gb200", "fp8", "blockwise"): (
        "the record's micro_batch 2 is not the recipe's (fp8_mx row: MBS 1, llama3_70b_llm_pretrain.yaml @v0.1.0rc3 "
        "lines 147-152) nor its own published GA 16 at GBS 128 and DP 8 (MBS 1): a data question"),
    ("mb-25.11", "Llama 3 8B", "h100-sxm", "fp8", "tensorwise"): (
        "the recipe runs DDP with 5 layers recomputed (workload_base_configs.py @v0.2.0 lines 229-233), the run FSDP"),
    ("mb-25.11", "Llama 3 8B", "gb300", "fp8", "tensorwise"): (
        "the recipe's MBS is 4 (workload_base_configs.py @v0.2.0 lines 158-163), the run's 2"),
    ("mb-26.02.01", "Llama 3 70B", "gb300", "fp8", "mxfp8"): (
        "the recipe runs MBS 1 with VP 5 (llama3_workload_base_configs.py @v0.3.1 lines 219-223), the run MBS 2 "
        "without VP"),
}  # fmt: skip


class RunLayout(BaseModel):
    """A layout as published: any field may be null (not published). `ep`/`etp` are the expert parallel and expert
    tensor parallel degrees of a mixture-of-experts model. `recompute_layers`: with `recompute: full`, the layers
    recomputed in each model chunk (Megatron's `--recompute-method block --recompute-num-layers N`; per virtual
    stage); null with `full` means every layer (the uniform method, whole-model checkpointing). `recompute_modules`:
    with `recompute: selective`, the modules recomputed (Megatron's `--recompute-modules`, e.g. `["layernorm",
    "moe_act"]`); null with `selective` means Megatron's default, `core_attn`. Both unknown only while `recompute`
    is: then they are filled by the published recipe (`RunRecord.recipe_fills`) or else with the least
    recomputation that fits."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tp: int | None = Field(None, ge=1, le=MAX_GPUS)
    pp: int | None = Field(None, ge=1, le=MAX_GPUS)
    cp: int | None = Field(None, ge=1, le=MAX_GPUS)
    dp: int | None = Field(None, ge=1, le=MAX_GPUS)
    vp: int | None = Field(None, ge=1, le=MAX_LAYERS)
    micro_batch: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH)
    sharding: Annotated[Sharding, Strict(False)] | None = None  # the text "zero1" (strict is for the counts)
    recompute: Annotated[Recompute, Strict(False)] | None = None
    recompute_layers: int | None = Field(None, ge=1, le=MAX_LAYERS)
    recompute_modules: tuple[RecomputeModule, ...] | None = None  # a list of names in the record
    sequence_parallel: bool | None = None
    ep: int | None = Field(None, ge=1, le=MAX_GPUS)
    etp: int | None = Field(None, ge=1, le=MAX_GPUS)

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _modules(cls, value: object) -> object:
        """The names parsed once, sorted and without repeats (a one-line error names an unknown module)."""
        return parse_modules(value) if isinstance(value, list | tuple) else value

    @model_validator(mode="after")
    def _modules_with_selective(self) -> RunLayout:
        if self.recompute_modules is not None and self.recompute not in (None, Recompute.selective):
            raise ValueError("recompute_modules needs recompute: selective")
        return self

    def known(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in LAYOUT_FIELDS if getattr(self, k) is not None}

    def unknown(self, experts: bool = False) -> list[str]:
        """The unpublished fields; the expert degrees only for a model with `experts` (dense: ep = etp = 1). The
        modules never: the search does not choose them (an unpublished selective recomputation is the default set)."""
        return [k for k in LAYOUT_FIELDS if getattr(self, k) is None and (experts or k not in EXPERT_FIELDS)
                and k != "recompute_modules" and (k != "recompute_layers" or self.recompute is None)]  # fmt: skip


class Measured(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    tokens_per_s_per_gpu: float = Field(gt=0)
    derived_from: str = "tokens_per_s"


class RunRecord(BaseModel):
    """One measured training run."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    id: str
    source: str = ""
    model: ModelSpec
    cluster: ClusterSpec
    job: RunJob
    layout: RunLayout
    measured: Measured
    hardware_note: str | None = None
    framework: str | None = Field(
        None, max_length=64, description="the training stack where known (megatron-lm, nemo, llm-foundry, ...)"
    )

    def attention_kernel(self) -> tuple[AttentionKernel, str | None]:
        """The attention kernel the run used, and why it was assumed (None when the record states it)."""
        if self.job.attention_kernel is not None:
            return self.job.attention_kernel, None
        for name, (kernel, why, archs) in FRAMEWORK_ATTENTION.items():
            named = name == self.framework or name in self.source.lower()
            if named and (archs is None or gpu_preset(self.cluster.gpu).arch in archs):
                return kernel, f"from the source: {why}"
        return "flash", "not stated: the GPU's native fused kernel"

    def moe_dispatcher(self) -> tuple[MoeDispatcher, str | None]:
        """The MoE token dispatcher the run used, and why it was assumed (None when stated or not an MoE run)."""
        if self.job.moe_dispatcher is not None or self.model.moe is None:
            return self.job.moe_dispatcher or "alltoall", None
        if self.framework == "megatron-bridge" and self.cluster.gpu in BRIDGE_FLEX_GPUS:
            return "flex", "Megatron-Bridge's MoE perf recipes run HybridEP (flex dispatcher) on this system"
        if self.framework == "megatron-bridge" and self.release() in BRIDGE_FLEX_RELEASES.get(
                (self.model.name, self.cluster.gpu), frozenset()):  # fmt: skip
            return "flex", "Megatron-Bridge's perf recipe of this release runs DeepEP/HybridEP (flex dispatcher)"
        return "alltoall", "not stated: Megatron's all-to-all token dispatcher"

    def dropout(self) -> tuple[bool, str | None]:
        """Whether the run's dropout layers were active, and why that was assumed (None when stated)."""
        if self.job.dropout is not None:
            return self.job.dropout, None
        return False, "not stated: dropout off, as in the pretraining recipes of the published sources"

    def moe_ep_overlap(self) -> tuple[bool, str | None]:
        """Whether the run hid the expert all-to-all under other micro-batches' compute, and why that was assumed
        (None when stated or without expert parallelism)."""
        if self.job.moe_ep_overlap is not None or self.model.moe is None:
            return bool(self.job.moe_ep_overlap), None
        return False, "not stated: off, Megatron's default (--overlap-moe-expert-parallel-comm)"

    def notes(self) -> list[str]:
        """What a prediction of this run does not model of what the record states, one line each."""
        sm = unpriced_sm_share_note(self.moe_dispatcher()[0], self.moe_ep_overlap()[0], gpu_preset(self.cluster.gpu))
        return [note for note in (fp8_pricing_note(self.job.fp8_recipe), sm, self.recipe_mismatch()) if note]

    def megatron_core(self) -> Version | None:
        """The Megatron-Core release the run's NeMo container held (`NEMO_RECORD_MEGATRON_CORE`); None for other
        stacks and for Megatron-Bridge (whose containers hold the Megatron-Core its recipes need)."""
        if self.framework != "nemo":
            return None
        for prefix, model, version in NEMO_RECORD_MEGATRON_CORE:
            if self.id.startswith(prefix) and self.model.name.startswith(model):
                return version
        return None

    def release(self) -> str | None:
        """The release the record's id names (`mb-25.09`, `dgxc-v24.11.1`, `nemo2407`); None where it names none."""
        found = _RELEASE_ID.match(self.id)
        return found.group(1) if found else None

    def recipe(self) -> RecipeFill | None:
        """The published recipe of the run's release and setup (`RECIPE_FILL`), where one is filled from: none
        where the record's published degrees are not the recipe's (`recipe_mismatch`)."""
        fill = self._recipe_entry()
        return None if fill is None or self.recipe_mismatch() else fill

    def recipe_mismatch(self) -> str | None:
        """Why the recipe of the run's setup is not filled from although `RECIPE_FILL` names it: a published degree
        that is not the recipe's; None where it is filled or none is named."""
        fill = self._recipe_entry()
        if fill is None or fill.degrees is None:
            return None
        why = fill.degrees.mismatch(self.layout)
        return f"{why} ({fill.degrees.source}): nothing filled from the recipe" if why else None

    def _recipe_entry(self) -> RecipeFill | None:
        release = self.release()
        if release is None:
            return None
        return RECIPE_FILL.get((release, self.model.name, self.cluster.gpu, self.job.precision, self.job.fp8_recipe))

    def fp8_param_gather(self) -> tuple[bool, str | None]:
        """Whether the run kept FP8 primary weights, and why that was assumed (None when stated or not FP8)."""
        if self.job.fp8_param_gather is not None or self.job.precision != "fp8":
            return bool(self.job.fp8_param_gather), None
        release = self.release() or ""
        for prefix, framework, recipes, why in FP8_PARAM_GATHER_RECIPES:
            if release.startswith(prefix) and self.framework == framework and self.job.fp8_recipe in recipes:
                return True, f"not stated: {why}"
        return False, "not stated: off (no recipe of this source is known to keep FP8 primary weights)"

    def optimizer_state(self) -> tuple[dict[str, str], str | None]:
        """The optimizer-state dtypes the run kept where not fp32 (`JobSpec.main_params_dtype`, ...), and why they
        were assumed (None when the record states them all or none is filled): the record's own, the recipe's for
        those it leaves unstated."""
        stated = {name: getattr(self.job, name) for name in STATE_DTYPE_FIELDS if getattr(self.job, name) is not None}
        fill = self.recipe()
        state = None if fill is None else fill.state
        if state is None:
            return stated, None
        filled = {k: v for k, v in state.dtypes().items() if k not in stated}
        if not filled:
            return stated, None
        why = f"not stated: the published recipe of this release sets {', '.join(filled)} ({state.source})"
        return filled | stated, why

    def recipe_fills(self) -> dict[str, RecipeRecompute | RecipeSharding]:
        """The layout fields (`recompute`, `sharding`) the run's published recipe sets where the record leaves them
        unpublished (`RECIPE_FILL`); empty where the record states them, no recipe says, or its published degrees
        are not the recipe's."""
        fill = self.recipe()
        if fill is None:
            return {}
        lay = self.layout
        parts: dict[str, RecipeRecompute | RecipeSharding] = {}
        unpublished = lay.recompute is None and lay.recompute_layers is None and lay.recompute_modules is None
        if fill.recompute is not None and unpublished:  # any of the three published: the record's recomputation
            parts["recompute"] = fill.recompute
        if fill.sharding is not None and lay.sharding is None:
            parts["sharding"] = fill.sharding
        return parts

    def unknown_layout_fields(self) -> list[str]:
        """The layout fields the record leaves unpublished and no recipe rule fills (the solver fills them)."""
        filled = set(self.recipe_fills())
        if "recompute" in filled:
            filled.add("recompute_layers")
        return [k for k in self.layout.unknown(experts=self.model.moe is not None) if k not in filled]

    def job_spec(self) -> JobSpec:
        """The record's job as a JobSpec (the attention kernel as `attention_kernel()` decides)."""
        job = self.job
        fields: dict[str, Any] = dict(
            seq_len=job.seq_len, global_batch=job.global_batch, precision=job.precision, fp8_recipe=job.fp8_recipe,
            attention_kernel=self.attention_kernel()[0], moe_routing=job.moe_routing,
            moe_dispatcher=self.moe_dispatcher()[0], moe_ep_overlap=self.moe_ep_overlap()[0], optimizer=job.optimizer,
            dropout=self.dropout()[0], fp8_param_gather=self.fp8_param_gather()[0])  # fmt: skip
        return JobSpec(**(fields | self.optimizer_state()[0]))

    @property
    def group_key(self) -> tuple[object, ...]:
        """Runs sharing model, cluster and job, differing only in layout, are ranked against each other (the job
        as predicted: its FP8 recipe, FP8 primary weights and optimizer state too)."""
        state = tuple(sorted(self.optimizer_state()[0].items()))
        return (self.model.name, self.cluster.gpu, self.cluster.gpus, self.job.seq_len, self.job.global_batch,
                self.job.precision, self.job.fp8_recipe, self.fp8_param_gather()[0], state,
                self.attention_kernel()[0], self.dropout()[0], self.moe_ep_overlap()[0])  # fmt: skip


def _record(raw: Any, where: str) -> RunRecord:
    if not isinstance(raw, dict):
        raise InputError(f"runs: {where} is {_kind(raw)}, not a run-record object")
    model = raw.get("model")
    if isinstance(model, dict):  # the record format writes null for "not stated"
        raw = raw | {"model": {k: v for k, v in model.items() if v is not None}}
    try:
        record = RunRecord.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, f"runs: {where}")) from None
    try:
        gpu_preset(record.cluster.gpu)  # named here, where the file, line and run are known
    except InputError as exc:
        raise InputError(f"runs: {where} (run {record.id!r}): {exc}") from None
    return record


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _undot(row: Mapping[str | None, str | list[str] | None], where: str) -> dict[str, Any]:
    """CSV columns `model.hidden`, `layout.tp`, ... -> nested dict; empty cells are null; numbers are converted
    explicitly (a non-finite number stays text, and its field refuses it)."""
    out: dict[str, Any] = {}
    for key, text in row.items():
        if key is None or isinstance(text, list):
            raise InputError(f"runs: {where} has more cells than the header has columns")
        value: Any = None if text is None or text.strip() == "" or text.strip().lower() == "null" else text.strip()
        if isinstance(value, str):
            value = value.lower() == "true" if value.lower() in ("true", "false") else _number(value)
        node = out
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                parent = ".".join(parts[: depth + 1])
                raise InputError(f"runs: {where}: column {key!r} conflicts with column {parent!r}")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise InputError(f"runs: {where}: column {key!r} conflicts with the columns under it ({key}.*)")
        node[parts[-1]] = value
    return out


def _number(text: str) -> int | float | str:
    if text.lstrip("+-").isdigit() and text.isascii() and len(text) <= 40:
        return int(text)
    try:
        return number_from_text(text, "cell")
    except InputError:
        return text


@checked_arguments
def read_runs(*paths: str | Path) -> list[RunRecord]:
    """Read run records from `.jsonl`/`.json` or `.csv` files, in order; errors name the line and field, and a file
    or a run id given twice (within a file or across them) is refused (one measurement would count twice)."""
    seen: set[Path] = set()
    for path in map(Path, paths):
        if path.resolve() in seen:
            raise InputError(f"runs: {path} is given twice; give each file once")
        seen.add(path.resolve())
    located = [item for path in paths for item in read_located_runs(path)]
    refuse_repeated_ids(located)
    return [rec for _where, rec in located]


def read_located_runs(path: str | Path) -> list[tuple[str, RunRecord]]:
    """The file's run records, each with where it stands ("runs.jsonl line 3"); ids not checked."""
    path = Path(path)
    text = RUNS.text(path)
    if path.suffix.lower() == ".csv":
        records = [(where, _record(_undot(row, where), where)) for where, row in _csv_rows(text, path.name)]
    elif text.lstrip().startswith("["):
        items = parse_json(text, f"runs {path.name}")
        records = [(f"{path.name} item {i}", _record(item, f"{path.name} item {i}")) for i, item in enumerate(items)]
    else:
        records = [
            (f"{path.name} line {i}", _record(parse_json(line, f"runs {path.name} line {i}"), f"{path.name} line {i}"))
            for i, line in enumerate(text.split("\n"), start=1)
            if line.strip()
        ]
    if not records:
        raise InputError(f"runs: {path.name} holds no run records")
    return records


def refuse_repeated_ids(located: list[tuple[str, RunRecord]]) -> None:
    """Refuse a run id that two records share, naming both places."""
    first: dict[str, str] = {}
    for where, rec in located:
        if rec.id in first:
            raise InputError(f"runs: run id {rec.id!r} is given twice ({first[rec.id]} and {where}); "
                             "give each run its own id")  # fmt: skip
        first[rec.id] = where


def _csv_rows(text: str, name: str) -> Iterator[tuple[str, dict[str | None, Any]]]:
    reader = csv.DictReader(text.splitlines())
    try:
        for row in reader:
            yield f"{name} line {reader.line_num}", row
    except csv.Error as exc:
        raise InputError(f"runs: {name} line {reader.line_num}: not valid CSV ({exc})") from None
