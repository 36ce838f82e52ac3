"""Megatron-LM `pretrain_gpt.py` arguments for a plan, refusing plans that break Megatron's own checks.

Targets Megatron-LM main (checked at d98e8a64, 2026-08-22, with `parse_args` + `validate_args`) and
megatron-core 0.16. The model flags are complete (RoPE base, Llama 3.1 RoPE scaling, norm epsilon,
dropout); the memory-relevant flags realize the memory model's assumptions: dropout off (Megatron's
default is 0.1) unless the job counts dropout masks, gradient buffers in 16 bits (`--grad-reduce-in-bf16`;
Megatron keeps fp32 main gradients by default with `--bf16`) unless the job counts 4-byte gradients.
Rules and flags follow Megatron-LM `megatron/training/arguments.py` (validate_args),
`megatron/core/transformer/transformer_config.py` (__post_init__) and `pipeline_parallel/schedules.py`.
There is no `--virtual-pipeline-model-parallel-size` flag: VP is given as layers per virtual stage, or as
virtual stages per rank when the first/last stages are uneven (arguments.py requires the latter then), or,
when an uneven stage does not divide into vp chunks, as `--pipeline-model-parallel-layout`.
"""

from __future__ import annotations

import shlex
from typing import Literal

from optlayout.cost.moe import overlap_allowed
from optlayout.cost.step import tp_overlap_applies
from optlayout.emit._checks import global_batch, gradient_dtype, node_count, stage_layers
from optlayout.emit.ranks import DEFAULT_ORDER, ORDERS
from optlayout.errors import OptlayoutError, UnsupportedError
from optlayout.layout.megatron_core import (
    FLAG_SINCE,
    FSDP_CONNECTIONS_SINCE,
    FSDP_SHARDINGS,
    MTP_WITH_CP_SINCE,
    Version,
    cp_offered,
    flag_problems,
    for_release,
    split_flags,
    version_text,
)
from optlayout.layout.stages import chunk_layer_counts, vp_fits
from optlayout.layout.text import format_layout, recompute_text
from optlayout.model import MoeSpec
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

FsdpImpl = Literal["megatron", "torch"]
# what `ModelSpec.beyond_dense` lists that this emits
MEGATRON_MODEL_FEATURES = frozenset({"moe", "mla", "mtp", "window"})
_SHARDING_STRATEGY = {Sharding.zero2: "optim_grads", Sharding.fsdp: "optim_grads_params"}


def megatron_problems(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
    megatron_core: Version | None = None,
) -> list[str]:
    """Every Megatron rule the plan breaks, one line each naming the rule; empty when Megatron accepts it. With
    `megatron_core`, also every emitted flag that release lacks (`layout.megatron_core.flag_problems`)."""
    problems: list[str] = []
    checks = (
        lambda: global_batch(job, layout, "megatron"),
        lambda: node_count(layout, gpus_per_node, "megatron"),
        lambda: gradient_dtype(job, "megatron", reduced_state=True),
        lambda: _state_flags(job, layout),
    )
    for check in checks:
        try:
            check()
        except OptlayoutError as exc:
            problems.append(str(exc))
    if order not in ORDERS:
        problems.append(f"megatron: order must be one of {', '.join(ORDERS)} (got {order!r})")
    if fsdp_impl not in ("megatron", "torch"):
        problems.append(f"megatron: fsdp_impl must be 'megatron' or 'torch' (got {fsdp_impl!r})")
    tp, cp = layout.tp, layout.cp
    _rule(
        problems,
        model.heads % tp == 0,
        "num_attention_heads % tensor_model_parallel_size == 0",
        f"{model.heads} heads, tp={tp}",
    )
    _rule(
        problems,
        model.kv_heads % tp == 0 or tp % model.kv_heads == 0,
        "num_query_groups must be a multiple or divisor of tensor_model_parallel_size",
        f"{model.kv_heads} query groups, tp={tp}",
    )
    if cp > 1:
        _rule(
            problems,
            job.seq_len % (2 * cp) == 0,
            "seq_length % (2 * context_parallel_size) == 0",
            f"seq_len {job.seq_len}, cp={cp}",
        )
    if model.position_embeddings:
        _rule(
            problems,
            model.position_embeddings >= job.seq_len,
            "max_position_embeddings >= seq_length",
            f"{model.position_embeddings} learned positions, seq_len {job.seq_len}",
        )
    _rule(problems, not model.alibi, "position encoding in learned_absolute, rope, yarn, mrope, none", "ALiBi")
    scaling = model.rope_scaling
    if scaling is not None and not model.position_embeddings:
        _rule(
            problems,
            (scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position) == (1, 4, 8192),
            "--use-rope-scaling fixes low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192",
            f"the model's {scaling.low_freq_factor:g}, {scaling.high_freq_factor:g}, {scaling.original_max_position}",
        )
    _pipeline_problems(model, layout, problems)
    _sharding_problems(model, job, layout, order, fsdp_impl, problems)
    _moe_problems(model, job, layout, problems)
    if megatron_core is not None and not cp_offered(megatron_core, model, layout.cp):
        problems.append(f"megatron-core {version_text(megatron_core)} rule Multi-Token Prediction (MTP) is not "
                        f"supported with Context Parallelism broken (before {version_text(MTP_WITH_CP_SINCE)}): "
                        f"cp={layout.cp}")  # fmt: skip
    if megatron_core is not None and not problems:
        problems += flag_problems(for_release(_flags(model, job, layout, order, fsdp_impl), megatron_core),
                                  megatron_core)  # fmt: skip
    return problems


def max_connections(layout: Layout, megatron_core: Version | None = None) -> str | None:
    """The CUDA_DEVICE_MAX_CONNECTIONS the flags need: unset (None) under FSDP from `FSDP_CONNECTIONS_SINCE`, else 1."""
    fsdp = layout.sharding in FSDP_SHARDINGS
    return None if fsdp and (megatron_core is None or megatron_core >= FSDP_CONNECTIONS_SINCE) else "1"


def megatron_fsdp_impl(fsdp_impl: FsdpImpl, megatron_core: Version | None) -> FsdpImpl:
    """The FSDP the emitter writes for a release: torch FSDP2 where Megatron FSDP (`--use-megatron-fsdp`) is
    younger than it."""
    if megatron_core is not None and megatron_core < FLAG_SINCE["--use-megatron-fsdp"]:
        return "torch"
    return fsdp_impl


def _moe_problems(model: ModelSpec, job: JobSpec, layout: Layout, problems: list[str]) -> None:
    """Megatron's rules tying experts, MLA and MTP to the layout (moe.md 1.3, each with its source line)."""
    moe, ep, etp = model.moe, layout.ep, layout.etp
    if moe is None:
        _rule(problems, ep == etp == 1, "expert parallelism needs --num-experts (arguments.py L1654)", f"ep={ep}")
        return
    _rule(problems, moe.experts % ep == 0, "num_experts % expert_model_parallel_size == 0 (arguments.py L1654-1658)",
          f"{moe.experts} experts, ep={ep}")  # fmt: skip
    _rule(problems, moe.expert_ffn % etp == 0, "moe_ffn_hidden_size % expert_tensor_parallel_size == 0",
          f"expert width {moe.expert_ffn}, etp={etp}")  # fmt: skip
    _rule(problems, layout.tp == 1 or layout.sequence_parallel,
          "MoE with tensor_model_parallel_size > 1 needs --sequence-parallel (moe_layer.py L636-640)",
          f"tp={layout.tp} without sp")  # fmt: skip
    _rule(problems, not model.bias or etp == 1, "Bias in Moe is only supported when ETP==1 (transformer_config.py)",
          f"etp={etp} with expert biases")  # fmt: skip
    if job.moe_dispatcher == "flex":
        _rule(problems, etp * ep > 1, "the flex token dispatcher needs expert_tensor_parallel_size x "
              "expert_model_parallel_size > 1 (token_dispatcher.py)", f"etp={etp}, ep={ep}")  # fmt: skip
    if job.moe_ep_overlap:
        rule = ("--overlap-moe-expert-parallel-comm needs ep > 1, vp > 1 when pp > 1, no full recomputation, no moe "
                "recompute module, at most one MTP layer (transformer_config.py L3002-3046)")  # fmt: skip
        _rule(problems, overlap_allowed(job, layout) and model.mtp_layers <= 1, rule, format_layout(layout))


def _rule(problems: list[str], ok: bool, name: str, detail: str) -> None:
    if not ok:
        problems.append(f"megatron rule {name} broken: {detail}")


def _pipeline_problems(model: ModelSpec, layout: Layout, problems: list[str]) -> None:
    pp, vp = layout.pp, layout.vp
    try:
        counts = stage_layers(model, layout, "megatron")
    except OptlayoutError as exc:
        problems.append(str(exc))
        return
    middle = counts[1:-1]
    _rule(
        problems,
        len(set(middle)) <= 1,
        "layers on the middle pipeline stages must be equal (num_layers_in_first/last_pipeline_stage)",
        f"the split {counts} needs first=/last= in the layout",
    )
    if vp == 1:
        return
    if len(set(counts)) == 1:
        _rule(
            problems,
            counts[0] % vp == 0,
            "(num_layers / pipeline_model_parallel_size) % num_layers_per_virtual_pipeline_stage == 0",
            f"{counts[0]} layers per pipeline rank cannot form {vp} equal virtual stages",
        )
    else:  # --pipeline-model-parallel-layout takes any split; optlayout's chunking needs this much
        _rule(
            problems,
            vp_fits(counts, vp),
            "optlayout's virtual split: the fullest pipeline stage forms vp equal virtual stages",
            f"{max(counts)} layers, vp={vp}",
        )
    _rule(
        problems,
        layout.grad_accum % pp == 0,
        "num_microbatches % pipeline_model_parallel_size == 0 for the interleaved schedule "
        "(pp <= microbatch_group_size_per_vp_stage = pp <= num_microbatches, no partial last group)",
        f"{layout.grad_accum} micro-batches per step, pp={pp}",
    )


def pipeline_layout_string(counts: list[int], vp: int, mtp_layers: int = 0) -> str:
    """Megatron's `--pipeline-model-parallel-layout`: the virtual stages in model order separated by `|`,
    `E` the embedding, `t` a transformer layer, `m` a multi-token-prediction module (in the last stage, where the
    cost model places them), `L` the loss; e.g. Llama 3 405B on pp 16 with vp 8 is `E|t|t|...|t|L` (128 stages,
    126 layers)."""
    stages = ["t" * n for n in chunk_layer_counts(counts, vp)]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * mtp_layers + "L"
    return "|".join(stages)


def _sharding_problems(
    model: ModelSpec, job: JobSpec, layout: Layout, order: str, fsdp_impl: str, problems: list[str]
) -> None:
    if layout.sharding not in FSDP_SHARDINGS:
        return
    if fsdp_impl == "torch":
        _rule(problems, layout.pp == 1, "--use-torch-fsdp2 needs pipeline_model_parallel_size == 1", f"pp={layout.pp}")
        _rule(problems, job.precision != "fp16", "--use-torch-fsdp2 is not supported with fp16", "precision fp16")
        _rule(problems, layout.ep == 1, "--use-torch-fsdp2 is not supported with expert parallelism (arguments.py "
              "@core_v0.10.0 to @core_v0.16.0)", f"ep={layout.ep}")  # fmt: skip
        _rule(
            problems,
            not model.tied_embeddings,
            "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights",
            "the model ties its embeddings",
        )
    else:
        _rule(
            problems, order == DEFAULT_ORDER, "Megatron-FSDP does not support --use-tp-pp-dp-mapping", f"order {order}"
        )


def megatron_args(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
    megatron_core: Version | None = None,
) -> list[str]:
    """The argument list (flags and values as separate tokens); raises naming every broken Megatron rule (and,
    with `megatron_core`, every flag that release lacks)."""
    problems = megatron_problems(model, job, layout, gpus_per_node, order=order, fsdp_impl=fsdp_impl,
                                 megatron_core=megatron_core)  # fmt: skip
    if problems:
        raise UnsupportedError("; ".join(problems))
    return for_release(_flags(model, job, layout, order, fsdp_impl), megatron_core)


def _flags(model: ModelSpec, job: JobSpec, layout: Layout, order: str, fsdp_impl: str) -> list[tuple[str, ...]]:
    tp, pp, vp = layout.tp, layout.pp, layout.vp
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(tp)),
        ("--pipeline-model-parallel-size", str(pp)),
    ]
    counts = stage_layers(model, layout, "megatron")
    values = {
        "--pipeline-model-parallel-layout": lambda: pipeline_layout_string(counts, vp, model.mtp_layers),
        "--num-layers-per-virtual-pipeline-stage": lambda: str(counts[0] // vp),
        "--num-virtual-stages-per-pipeline-rank": lambda: str(vp),
        "--decoder-first-pipeline-num-layers": lambda: str(counts[0]),
        "--decoder-last-pipeline-num-layers": lambda: str(counts[-1]),
    }
    flags += [(flag, values[flag]()) for flag in split_flags(counts, vp)]
    flags.append(("--context-parallel-size", str(layout.cp)))
    if tp > 1 and layout.sequence_parallel:
        flags.append(("--sequence-parallel",))
    if tp_overlap_applies(layout):  # the TP collectives under the GEMMs, as the plan prices them
        flags.append(("--tp-comm-overlap",))
    if order != DEFAULT_ORDER:
        flags.append(("--use-tp-pp-dp-mapping",))
    flags += _sharding_flags(layout, fsdp_impl)
    if layout.recompute is Recompute.selective:  # the modules: nargs "+" (argument_utils.py); default core_attn
        flags.append(("--recompute-granularity", "selective"))
        if layout.recompute_modules is not None:
            flags.append(("--recompute-modules", *(m.value for m in layout.recompute_modules)))
    elif layout.recompute is Recompute.full:  # block: the first N layers of each model chunk; uniform 1: all
        method, layers = ("uniform", 1) if layout.recompute_layers is None else ("block", layout.recompute_layers)
        flags += [
            ("--recompute-granularity", "full"),
            ("--recompute-method", method),
            ("--recompute-num-layers", str(layers)),
        ]
    flags += [
        ("--micro-batch-size", str(layout.micro_batch)),
        ("--global-batch-size", str(layout.global_batch)),
        ("--seq-length", str(job.seq_len)),
        ("--max-position-embeddings", str(model.position_embeddings or job.seq_len)),
    ]
    flags += _job_flags(model, job, layout)
    flags += _state_flags(job, layout)
    return flags


def _job_flags(model: ModelSpec, job: JobSpec, layout: Layout) -> list[tuple[str, ...]]:
    """The model, MoE, dropout, precision and gradient flags: all but the expert degrees' values are the layout's
    to take or leave, so a release runs them for every layout or none (`release_problems`)."""
    flags = _model_flags(model) + _moe_flags(model, job, layout)
    dropout = "0.1" if job.dropout else "0.0"  # Megatron's default is 0.1; the memory model counts masks only if on
    flags += [("--attention-dropout", dropout), ("--hidden-dropout", dropout)]
    precision: dict[str, list[tuple[str, ...]]] = {"bf16": [("--bf16",)], "fp16": [("--fp16",)]}
    if job.precision == "fp8":
        fp8_format, recipe = fp8_format_and_recipe(job, "megatron")
        precision["fp8"] = [("--bf16",), ("--fp8-format", fp8_format)] + ([("--fp8-recipe", recipe)] if recipe else [])
    return flags + precision[job.precision] + _gradient_flags(job)


def release_problems(model: ModelSpec, job: JobSpec, megatron_core: Version) -> list[str]:
    """What of the model and job `megatron_core` cannot run whatever the layout (`_job_flags`' flags it lacks), one
    line each; empty where the emitter refuses the job for another reason, which `emit` names."""
    try:
        flags = _job_flags(model, job, Layout(tp=1, pp=1, dp=1))
    except OptlayoutError:
        return []
    return flag_problems(for_release(flags, megatron_core), megatron_core)


def moe_layer_freq(flags: tuple[bool, ...]) -> str:
    """Megatron's `--moe-layer-freq` for a layer pattern: `1` when every layer is MoE, else `layer_pattern`."""
    return "1" if all(flags) else layer_pattern(flags)


def layer_pattern(flags: tuple[bool, ...]) -> str:
    """A per-layer 0/1 pattern as the Python list expression arguments.py's `moe_freq_type` evaluates (for
    `--moe-layer-freq` and `--window-attn-skip-freq`), in runs (DeepSeek-V3's MoE layers: `([0]*3+[1]*58)`; Llama 4
    Maverick's: `([0,1]*24)`; GPT-OSS's windowed layers: `([1,0]*18)`)."""
    runs: list[tuple[int, int]] = []
    for flag in map(int, flags):
        if runs and runs[-1][0] == flag:
            runs[-1] = (flag, runs[-1][1] + 1)
        else:
            runs.append((flag, 1))
    if len(runs) > 2 and len({n for _, n in runs}) == 1 and len(runs) % 2 == 0:
        period = [runs[0][0]] * runs[0][1] + [runs[1][0]] * runs[1][1]
        return f"({period}*{len(runs) // 2})".replace(" ", "")
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def _moe_flags(model: ModelSpec, job: JobSpec, layout: Layout) -> list[tuple[str, ...]]:
    """Experts and their degrees, multi-latent attention and multi-token prediction (moe.md 1.2): the grouped
    GEMM and the token dispatcher the cost model prices; forced load balance when the job is a balanced benchmark."""
    flags: list[tuple[str, ...]] = []
    moe = model.moe
    if moe is not None:
        flags += [
            ("--num-experts", str(moe.experts)),
            ("--moe-router-topk", str(moe.top_k)),
            ("--moe-ffn-hidden-size", str(moe.expert_ffn)),
            ("--moe-layer-freq", moe_layer_freq(model.moe_layer_flags)),
            ("--expert-model-parallel-size", str(layout.ep)),
            ("--expert-tensor-parallel-size", str(layout.etp)),
            ("--moe-grouped-gemm",),
            ("--moe-token-dispatcher-type", job.moe_dispatcher),
        ]
        if moe.shared_experts:
            flags.append(("--moe-shared-expert-intermediate-size", str(moe.shared_experts * moe.shared_width)))
        flags += _router_flags(moe)
        if job.moe_routing == "balanced":
            flags.append(("--moe-router-force-load-balancing",))
        if job.moe_ep_overlap:
            flags.append(("--overlap-moe-expert-parallel-comm",))
    att = model.attention
    if att.kind == "mla":
        flags.append(("--multi-latent-attention",))
        if att.q_lora_rank is not None:
            flags.append(("--q-lora-rank", str(att.q_lora_rank)))
        flags += [
            ("--kv-lora-rank", str(att.kv_lora_rank)),
            ("--qk-head-dim", str(att.qk_head_dim)),
            ("--qk-pos-emb-head-dim", str(att.qk_rope_head_dim)),
            ("--v-head-dim", str(att.v_head_dim)),
        ]
    if model.mtp_layers:
        flags.append(("--mtp-num-layers", str(model.mtp_layers)))
    return flags


def _router_flags(moe: MoeSpec) -> list[tuple[str, ...]]:
    """The router as the model has it (moe.md 1.2; DeepSeek-R1.sh and Kimi-K2-Instruct.sh): score function,
    the sigmoid router's expert bias, group-limited top-k, the output scaling; fp32 routing from 32 experts
    (megatron-core warns below it), softmax before top-k where top-1 needs it (transformer_config.py)."""
    flags: list[tuple[str, ...]] = []
    if moe.router_score == "sigmoid":
        flags.append(("--moe-router-score-function", "sigmoid"))
        if moe.router_bias:  # the aux-loss-free balancing bias: only with sigmoid scores (transformer_config.py)
            flags.append(("--moe-router-enable-expert-bias",))
    elif moe.top_k == 1:
        flags.append(("--moe-router-pre-softmax",))
    if moe.router_groups is not None:
        flags += [("--moe-router-num-groups", str(moe.router_groups)),
                  ("--moe-router-group-topk", str(moe.router_group_top_k))]  # fmt: skip
    if moe.router_scaling is not None:
        flags.append(("--moe-router-topk-scaling-factor", f"{moe.router_scaling:g}"))
    if moe.experts >= 32:
        flags.append(("--moe-router-dtype", "fp32"))
    return flags


def _gradient_flags(job: JobSpec) -> list[tuple[str, ...]]:
    """Gradient buffers of the planned width: with --bf16 Megatron accumulates and reduces in fp32 unless
    --grad-reduce-in-bf16; with --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32 (arguments.py)."""
    dtype = gradient_dtype(job, "megatron", reduced_state=True)
    if job.precision == "fp16":
        return [("--accumulate-allreduce-grads-in-fp32",)] if dtype == "fp32" else []
    return [] if dtype == "fp32" else [("--grad-reduce-in-bf16",)]


def _state_flags(job: JobSpec, layout: Layout) -> list[tuple[str, ...]]:
    """FP8 primary weights and a reduced-precision optimizer state as planned (arguments.py at d98e8a64):
    --fp8-param-gather (lines 2016, 1095-1097: with the distributed optimizer or FSDP only), with MXFP8 also
    --reuse-grad-buf-for-mxfp8-param-ag (line 3080: the bf16 weight all-gather through the gradient buffer that
    `JobSpec.param_gather_bytes_per_param` counts); --use-precision-aware-optimizer with --main-params-dtype
    (fp32 or fp16), --exp-avg-dtype and --exp-avg-sq-dtype (lines 3673-3684; Adam only, core/optimizer/
    optimizer_config.py lines 433-436; with the distributed optimizer only, core/optimizer/__init__.py line 1057)."""
    flags: list[tuple[str, ...]] = []
    if job.fp8_param_gather:
        if layout.sharding == Sharding.none:
            raise UnsupportedError("megatron: --fp8-param-gather needs the distributed optimizer or FSDP "
                                   "(sharding zero1, zero2 or fsdp), the plan has sharding none")  # fmt: skip
        flags.append(("--fp8-param-gather",))
        if job.fp8_recipe == "mxfp8":
            flags.append(("--reuse-grad-buf-for-mxfp8-param-ag",))
    reduced = job.reduced_optimizer_state
    if not reduced:
        return flags
    if job.main_params_dtype == "bf16":
        raise UnsupportedError("megatron: main_params_dtype bf16: --main-params-dtype takes fp32 or fp16 "
                               "(arguments.py line 3673 at d98e8a64)")  # fmt: skip
    if layout.sharding == Sharding.none:
        raise UnsupportedError("megatron: --use-precision-aware-optimizer needs the distributed optimizer (sharding "
                               "zero1, zero2 or fsdp), the plan has sharding none")  # fmt: skip
    flags.append(("--use-precision-aware-optimizer",))
    names = {"main_params_dtype": "--main-params-dtype", "exp_avg_dtype": "--exp-avg-dtype",
             "exp_avg_sq_dtype": "--exp-avg-sq-dtype"}  # fmt: skip
    return flags + [(flag, getattr(job, name)) for name, flag in names.items()]


def _sharding_flags(layout: Layout, fsdp_impl: str) -> list[tuple[str, ...]]:
    overlap: list[tuple[str, ...]] = [("--overlap-grad-reduce",)] if layout.dp > 1 else []
    if layout.sharding is Sharding.none:
        return overlap
    if layout.sharding is Sharding.zero1:
        return [("--use-distributed-optimizer",), *overlap, *([("--overlap-param-gather",)] if overlap else [])]
    if fsdp_impl == "torch":
        reshard = [("--torch-fsdp2-no-reshard-after-forward",)] if layout.sharding is Sharding.zero2 else []
        return [
            ("--use-torch-fsdp2",),
            *reshard,
            ("--no-gradient-accumulation-fusion",),
            ("--ckpt-format", "torch_dist"),
        ]
    return [
        ("--use-megatron-fsdp",),
        ("--data-parallel-sharding-strategy", _SHARDING_STRATEGY[layout.sharding]),
        ("--use-distributed-optimizer",),
        ("--no-gradient-accumulation-fusion",),
        ("--ckpt-format", "fsdp_dtensor"),
        *overlap,
        *([("--overlap-param-gather",)] if overlap else []),
    ]


def _model_flags(model: ModelSpec) -> list[tuple[str, ...]]:
    flags: list[tuple[str, ...]] = [
        ("--num-layers", str(model.layers)),
        ("--hidden-size", str(model.hidden)),
        ("--ffn-hidden-size", str(model.ffn)),
        ("--num-attention-heads", str(model.heads)),
    ]
    gqa = model.attention.kind == "gqa"  # MLA and --group-query-attention exclude each other (arguments.py)
    if gqa and model.head_dim is not None and model.head_dim * model.heads != model.hidden:
        flags.append(("--kv-channels", str(model.head_dim)))
    if gqa and model.kv_heads != model.heads:
        flags += [("--group-query-attention",), ("--num-query-groups", str(model.kv_heads))]
    if model.attention.qk_norm:
        flags.append(("--qk-layernorm",))  # a norm of the --normalization type over each head's query and key
    flags += _window_flags(model)
    flags += {"swiglu": [("--swiglu",)], "relu2": [("--squared-relu",)], "gelu": []}[model.mlp]
    if model.norm_kind == "rmsnorm":  # Megatron's default is LayerNorm
        flags.append(("--normalization", "RMSNorm"))
    if not model.bias:
        flags.append(("--disable-bias-linear",))
    flags.append(("--norm-epsilon", f"{model.norm_eps:g}"))
    if not model.position_embeddings:
        flags += [("--position-embedding-type", "rope"), ("--rotary-base", f"{model.rope_theta:.0f}")]
        if model.rope_scaling is not None:
            flags += [("--use-rope-scaling",), ("--rope-scaling-factor", f"{model.rope_scaling.factor:g}")]
    if not model.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    return flags


def _window_flags(model: ModelSpec) -> list[tuple[str, ...]]:
    """Sliding windows and sinks as Megatron's GPT-OSS example writes them (examples/post_training/modelopt/conf/
    openai/gpt-oss-120b.sh): `--window-size` is (keys before the query, after it), so a window of W keys including
    the query is `W-1,0` (TE's window_size); `--window-attn-skip-freq` flags the windowed layers (1) in layer order
    (transformer/utils.py `is_layer_window_attention`); `--softmax-type learnable` adds a learned sink per head."""
    att, flags = model.attention, list[tuple[str, ...]]()
    if att.sliding_window is not None:
        flags.append(("--window-size", f"{att.sliding_window - 1},0"))
        windowed = model.sliding_window_flags
        if not all(windowed):
            flags.append(("--window-attn-skip-freq", layer_pattern(windowed)))
    if att.sinks:
        flags.append(("--softmax-type", "learnable"))
    return flags


def megatron_text(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
    megatron_core: Version | None = None,
) -> str:
    """The flags, one per line, nothing else: `pretrain_gpt.py $(cat flags.txt)` reads them back. A command
    substitution is split at white space and never unquoted, so no comment, `\\` continuation or quote may
    appear, and no token holds white space or a glob character (checked). The launch command and environment
    are `megatron_notes`."""
    args, _ = _file_and_command_args(megatron_args(model, job, layout, gpus_per_node, order=order, fsdp_impl=fsdp_impl,
                                                   megatron_core=megatron_core))  # fmt: skip
    unsafe = [t for t in args if not t or any(c.isspace() or c in _GLOB_OR_QUOTE for c in t)]
    if unsafe:
        raise UnsupportedError(f"megatron: {unsafe[0]!r} cannot pass through $(cat file) unquoted")
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--"):
            groups.append([token])
        else:
            groups[-1].append(token)
    return "\n".join(" ".join(g) for g in groups) + "\n"


_GLOB_OR_QUOTE = "*?[]'\"\\$`"


def _file_and_command_args(args: list[str]) -> tuple[list[str], list[str]]:
    """The flags for the file, and those the launch command passes quoted: a `--moe-layer-freq` or
    `--window-attn-skip-freq` list expression (`([0]*3+[1]*58)`) holds glob characters, which `$(cat file)` would
    expand."""
    kept, quoted = list(args), []
    for flag in ("--moe-layer-freq", "--window-attn-skip-freq"):
        if flag in kept:
            i = kept.index(flag)
            if any(c in _GLOB_OR_QUOTE for c in kept[i + 1]):
                quoted += kept[i : i + 2]
                del kept[i : i + 2]
    return kept, quoted


def megatron_notes(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
    megatron_core: Version | None = None,
) -> list[str]:
    """What goes around the flags: the plan, the launch command, the environment and what the flags assume."""
    _, quoted = _file_and_command_args(megatron_args(model, job, layout, gpus_per_node, order=order,
                                                     fsdp_impl=fsdp_impl, megatron_core=megatron_core))  # fmt: skip
    target = ("Megatron-LM main (checked at d98e8a64) / megatron-core 0.16" if megatron_core is None else
              f"megatron-core {version_text(megatron_core)} (flags checked against its arguments.py)")  # fmt: skip
    nodes, per_node = node_count(layout, gpus_per_node, "megatron")
    env = (
        "unset CUDA_DEVICE_MAX_CONNECTIONS (FSDP needs more than one)"
        if max_connections(layout, megatron_core) is None
        else "export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron requires it with tp>1 or cp>1 before Blackwell"
        + ("; before 0.12.0 with FSDP2 too)" if layout.sharding in FSDP_SHARDINGS else ")")
    )
    grads = gradient_dtype(job, "megatron", reduced_state=True)
    return [
        f"optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.numerics}; {target}",
        f"world {layout.gpus} = {nodes} node(s) x {per_node} GPUs; rank order {order}",
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend static --node-rank $SLURM_NODEID "
        "--master-addr $MASTER_ADDR --master-port 6000 pretrain_gpt.py $(cat megatron_flags.txt) "
        f"{shlex.join(quoted) + ' ' if quoted else ''}<data, tokenizer, optimizer and checkpoint flags>",
        f"env: {env}",
        f"memory as planned: {grads} gradient buffers, dropout {'0.1' if job.dropout else 'off'}, "
        f"recompute {recompute_text(layout)}, no offloading",
        *_state_notes(job),
    ]


def _state_notes(job: JobSpec) -> list[str]:
    """What Megatron keeps of a reduced-precision optimizer state beyond the flags: with fp32 master weights and
    16-bit weights, TE's FusedAdam stores only the 16 bits the weights lack (OptimizerConfig.store_param_remainders,
    default true, no command-line flag: core/optimizer/optimizer_config.py line 192 at d98e8a64)."""
    if not job.reduced_optimizer_state or job.main_params_dtype != "fp32" or job.precision == "fp16":
        return []
    return ["optimizer state: fp32 master weights kept as 16-bit remainders beside the bf16 weights "
            "(store_param_remainders): 2 bytes per parameter fewer than planned"]  # fmt: skip


MEGATRON_FP8_RECIPES = ("tensorwise", "mxfp8", "blockwise")
"""The recipes Megatron-LM's --fp8-recipe names as optlayout does (megatron/core/enums.py Fp8Recipe: delayed,
tensorwise (per-tensor current scaling), mxfp8, blockwise, custom; checked at d98e8a64)."""


def fp8_format_and_recipe(job: JobSpec, who: str) -> tuple[str, str | None]:
    """Megatron's --fp8-format and --fp8-recipe for an fp8 job (recipe None: not stated, Megatron's default
    delayed per-tensor scaling): E4M3 throughout for mxfp8 (Megatron-Bridge's bf16_with_mxfp8_mixed), hybrid (E5M2
    gradients) otherwise (its current-scaling and subchannel presets)."""
    recipe = job.fp8_recipe
    if recipe is not None and recipe not in MEGATRON_FP8_RECIPES:
        raise UnsupportedError(f"{who}: fp8_recipe {recipe} has no Megatron --fp8-recipe (it takes "
                               f"{', '.join(MEGATRON_FP8_RECIPES)}); {recipe} is torchao's: "
                               "emit torchtitan")  # fmt: skip
    return ("e4m3" if recipe == "mxfp8" else "hybrid"), recipe
