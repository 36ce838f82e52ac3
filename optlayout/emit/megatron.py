"""Megatron-LM `pretrain_gpt.py` arguments for a plan, refusing plans that break Megatron's own checks.

Rules and flags follow Megatron-LM `megatron/training/arguments.py` (validate_args),
`megatron/core/transformer/transformer_config.py` (__post_init__) and `pipeline_parallel/schedules.py`.
There is no `--virtual-pipeline-model-parallel-size` flag: VP is given as layers per virtual stage, or as
virtual stages per rank when the first/last stages are uneven (arguments.py requires the latter then), or,
when an uneven stage does not divide into vp chunks, as `--pipeline-model-parallel-layout`.
"""

from __future__ import annotations

import shlex
from typing import Literal

from optlayout.emit._checks import global_batch, node_count, stage_layers
from optlayout.emit.ranks import DEFAULT_ORDER, ORDERS
from optlayout.errors import OptlayoutError, UnsupportedError
from optlayout.layout.stages import chunk_layer_counts, vp_fits
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

FsdpImpl = Literal["megatron", "torch"]
_SHARDING_STRATEGY = {Sharding.zero2: "optim_grads", Sharding.fsdp: "optim_grads_params"}


def megatron_problems(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
) -> list[str]:
    """Every Megatron rule the plan breaks, one line each naming the rule; empty when Megatron accepts it."""
    problems: list[str] = []
    for check in (lambda: global_batch(job, layout, "megatron"), lambda: node_count(layout, gpus_per_node, "megatron")):
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
    _pipeline_problems(model, layout, problems)
    _sharding_problems(model, job, layout, order, fsdp_impl, problems)
    return problems


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


def pipeline_layout_string(counts: list[int], vp: int) -> str:
    """Megatron's `--pipeline-model-parallel-layout`: the virtual stages in model order separated by `|`,
    `E` the embedding, `t` a transformer layer, `L` the loss; e.g. Llama 3 405B on pp 16 with vp 8 is
    `E|t|t|...|t|L` (128 stages, 126 layers)."""
    stages = ["t" * n for n in chunk_layer_counts(counts, vp)]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return "|".join(stages)


def _sharding_problems(
    model: ModelSpec, job: JobSpec, layout: Layout, order: str, fsdp_impl: str, problems: list[str]
) -> None:
    if layout.sharding not in (Sharding.zero2, Sharding.fsdp):
        return
    if fsdp_impl == "torch":
        _rule(problems, layout.pp == 1, "--use-torch-fsdp2 needs pipeline_model_parallel_size == 1", f"pp={layout.pp}")
        _rule(problems, job.precision != "fp16", "--use-torch-fsdp2 is not supported with fp16", "precision fp16")
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
) -> list[str]:
    """The argument list (flags and values as separate tokens); raises naming every broken Megatron rule."""
    problems = megatron_problems(model, job, layout, gpus_per_node, order=order, fsdp_impl=fsdp_impl)
    if problems:
        raise UnsupportedError("; ".join(problems))
    return [token for flag in _flags(model, job, layout, order, fsdp_impl) for token in flag]


def _flags(model: ModelSpec, job: JobSpec, layout: Layout, order: str, fsdp_impl: str) -> list[tuple[str, ...]]:
    tp, pp, vp = layout.tp, layout.pp, layout.vp
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(tp)),
        ("--pipeline-model-parallel-size", str(pp)),
    ]
    counts = stage_layers(model, layout, "megatron")
    uneven = len(set(counts)) > 1
    if uneven and vp > 1 and any(n % vp for n in counts):
        flags.append(("--pipeline-model-parallel-layout", pipeline_layout_string(counts, vp)))
    else:
        if vp > 1:
            flags.append(
                ("--num-virtual-stages-per-pipeline-rank", str(vp))
                if uneven
                else ("--num-layers-per-virtual-pipeline-stage", str(counts[0] // vp))
            )
        if uneven:
            flags += [("--decoder-first-pipeline-num-layers", str(counts[0]))]
            flags += [("--decoder-last-pipeline-num-layers", str(counts[-1]))]
    flags.append(("--context-parallel-size", str(layout.cp)))
    if tp > 1 and layout.sequence_parallel:
        flags.append(("--sequence-parallel",))
    if order != DEFAULT_ORDER:
        flags.append(("--use-tp-pp-dp-mapping",))
    flags += _sharding_flags(layout, fsdp_impl)
    if layout.recompute is Recompute.selective:
        flags.append(("--recompute-granularity", "selective"))
    elif layout.recompute is Recompute.full:
        flags += [
            ("--recompute-granularity", "full"),
            ("--recompute-method", "uniform"),
            ("--recompute-num-layers", "1"),
        ]
    flags += [
        ("--micro-batch-size", str(layout.micro_batch)),
        ("--global-batch-size", str(layout.global_batch)),
        ("--seq-length", str(job.seq_len)),
        ("--max-position-embeddings", str(model.position_embeddings or job.seq_len)),
    ]
    flags += _model_flags(model)
    precision: dict[str, list[tuple[str, ...]]] = {
        "bf16": [("--bf16",)], "fp16": [("--fp16",)], "fp8": [("--bf16",), ("--fp8-format", "hybrid")]
    }  # fmt: skip
    flags += precision[job.precision]
    return flags


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
    if model.head_dim is not None and model.head_dim * model.heads != model.hidden:
        flags.append(("--kv-channels", str(model.head_dim)))
    if model.kv_heads != model.heads:
        flags += [("--group-query-attention",), ("--num-query-groups", str(model.kv_heads))]
    flags += {"swiglu": [("--swiglu",)], "relu2": [("--squared-relu",)], "gelu": []}[model.mlp]
    if not model.bias:
        flags += [("--normalization", "RMSNorm"), ("--disable-bias-linear",)]
    if not model.position_embeddings:
        flags.append(("--position-embedding-type", "rope"))
    if not model.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    return flags


def megatron_text(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
) -> str:
    """Pasteable flags, one per line with `\\` continuations, after comment lines on launch and environment."""
    args = megatron_args(model, job, layout, gpus_per_node, order=order, fsdp_impl=fsdp_impl)
    nodes, per_node = node_count(layout, gpus_per_node, "megatron")
    fsdp = layout.sharding in (Sharding.zero2, Sharding.fsdp)
    env = (
        "unset CUDA_DEVICE_MAX_CONNECTIONS (FSDP needs more than one)"
        if fsdp
        else "export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron requires it with tp>1 or cp>1 before Blackwell)"
    )
    lines = [
        f"# optlayout: {model.name}, {format_layout(layout)}, seq {job.seq_len}, {job.precision}",
        f"# world {layout.gpus} = {nodes} node(s) x {per_node} GPUs; rank order {order}",
        f"# torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend static --node-rank $SLURM_NODEID "
        "--master-addr $MASTER_ADDR --master-port 6000 pretrain_gpt.py \\",
        f"# env: {env}",
        "# add data, tokenizer, optimizer and checkpoint flags of your own",
    ]
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--"):
            groups.append([token])
        else:
            groups[-1].append(token)
    body = [shlex.join(g) for g in groups]
    return "\n".join(lines + [line + " \\" for line in body[:-1]] + body[-1:]) + "\n"
