"""Memory per GPU: training state, activations (Korthikanti et al. 2022), buffers and a runtime reserve.

Activation bytes follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4, term by term, generalized to GQA (separate query and key/value widths; naive attention
keeps K and V repeated to every query head, as its matmuls save them), SwiGLU and
squared-ReLU MLPs, IO-aware attention (no s^2 terms), dropout on or off, and context parallelism (the
sequence split over `cp`). With dropout, naive attention, MHA and a 4h GeLU MLP it reduces to the paper's
sbh(34 + 5as/h) per layer; with TP it becomes sbh(10 + 24/t + 5as/(ht)); with TP and sequence
parallelism sbh(34 + 5as/h)/t; selective recomputation drops the 5as^2b attention term. FP8 jobs keep their
linear layers' inputs quantized (`gemm_input_bytes`: the norms' outputs, the output projection's and FC2's inputs).
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from optlayout.cost.attention import (
    ACT_BYTES,
    DENSE_LAYER,
    LayerKind,
    attention_activation_bytes,
    gemm_input_bytes,
    kv_width_per_rank,
    mtp_kind,
)
from optlayout.cost.moe import (
    dense_moe_params_per_rank,
    expert_params_per_gpu,
    mlp_saved_bytes_per_width,
    moe_activation_bytes,
)
from optlayout.cost.params import DEFAULT_PARAMS, CostParams
from optlayout.frozen import fast_init
from optlayout.layout.recompute import RecomputeModule
from optlayout.layout.stages import (
    ChunkKinds,
    rank_chunk_kinds,
    rank_chunk_recomputed,
    rank_chunk_sizes,
    rank_kinds,
    warmup_chunks,
)
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

# what the in-flight activations per stage depend on: the whole layout but its sharding
_all_but_sharding = operator.attrgetter(*(name for name in Layout.model_fields if name != "sharding"))

__all__ = ["ACT_BYTES", "MemoryBreakdown", "kv_width_per_rank", "memory_per_gpu"]


@fast_init
@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the fullest pipeline stage."""

    stage: int
    layers_on_stage: int
    param_count_on_gpu: float
    param_count_per_stage: tuple[float, ...]  # parameters one GPU of each stage holds (checkpoints need them all)
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    reserve_bytes: float
    expert_param_count_on_gpu: float = 0.0  # the routed experts among param_count_on_gpu
    expert_param_count_per_stage: tuple[float, ...] = ()  # the routed experts among param_count_per_stage

    @property
    def most_params(self) -> tuple[float, float]:
        """(parameters, routed experts among them) of the stage whose GPU holds the most: what the data-parallel
        reduction and the optimizer step of the slowest stage move."""
        i = self.param_count_per_stage.index(max(self.param_count_per_stage))  # the first of the most
        return self.param_count_per_stage[i], (self.expert_param_count_per_stage or (0.0,) * (i + 1))[i]

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.activations_bytes + self.buffers_bytes + self.reserve_bytes


def layer_param_count_per_rank(model: ModelSpec, tp: int, kind: LayerKind = DENSE_LAYER) -> float:
    """Parameters of one transformer layer of `kind` on one TP rank that are not routed experts: attention (K/V
    replicated when tp > kv_heads; MLA's down projections and latent norms duplicated), norms, and the dense FFN,
    or an MoE layer's shared experts (TP-split) and router (replicated)."""
    if model.attention.kind == "mla":
        att = model.attention
        duplicated = model.hidden * ((att.q_lora_rank or 0) + (att.kv_lora_rank or 0) + (att.qk_rope_head_dim or 0))
        duplicated += (att.q_lora_rank or 0) + (att.kv_lora_rank or 0)  # the latent norms
        attention = (model.attention_param_count - duplicated) / tp + duplicated
    else:
        kv_bias = 2 if model.bias else 0
        kv = (2 * model.hidden + kv_bias) * model.kv_width
        kv_rank = (2 * model.hidden + kv_bias) * kv_width_per_rank(model, tp)
        attention = (model.attention_param_count - kv) / tp + kv_rank
    if not kind.moe:
        return attention + (model.mlp_param_count + model.norm_param_count_per_layer) / tp
    return attention + model.norm_param_count_per_layer / tp + dense_moe_params_per_rank(model, tp)


@fast_init
@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a pipeline stage holds: the total, and the routed experts among them."""

    total: float
    experts: float


def stage_params(model: ModelSpec, layout: Layout, stage: int, held: tuple[tuple[LayerKind, int], ...]) -> StageParams:
    """Parameters held by one GPU of a stage holding `held` layers of each kind: the layers TP-sharded, their
    routed experts over etp x ep; the vocab-parallel embedding on the first stage, the output layer on the last,
    and there the multi-token-prediction modules with their own copy of the (shared) embedding when pp > 1."""
    tp = layout.tp
    dense = 0.0
    for kind, n in held:
        dense += n * layer_param_count_per_rank(model, tp, kind)
    moe_layers = sum(n for kind, n in held if kind.moe)
    last = layout.pp - 1
    if stage == 0:
        dense += model.embedding_param_count / tp
    if stage == last:
        dense += model.output_param_count / tp
        if model.tied_embeddings and layout.pp > 1:
            dense += model.vocab * model.hidden / tp  # the last stage keeps its own copy of the tied matrix
        if model.mtp_layers:
            block = mtp_kind(model)
            norms = 3 * model.hidden * (2 if model.bias else 1)
            per_module = layer_param_count_per_rank(model, tp, block) + (2 * model.hidden * model.hidden + norms) / tp
            dense += model.mtp_layers * per_module
            if layout.pp > 1 and not model.tied_embeddings:
                dense += model.vocab * model.hidden / tp  # MTP embeds the shifted tokens with the shared embedding
            moe_layers += model.mtp_layers * block.moe
    experts = expert_params_per_gpu(model, layout, moe_layers)
    return StageParams(dense + experts, experts)


def _params_key(layout: Layout) -> tuple[object, ...]:
    """What a stage's parameters depend on: tp, the stage split and the expert split."""
    return (layout.tp, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers, layout.ep,
            layout.etp)  # fmt: skip


def most_stage_params(model: ModelSpec, layout: Layout, memo: dict[tuple[object, ...], Any]) -> StageParams:
    """The stage holding the most parameters (the step time's optimizer step and DP traffic), through `memo`."""
    mkey = ("most_params", *_params_key(layout))
    most: StageParams | None = memo.get(mkey)
    if most is None:
        most = memo[mkey] = max(stage_params_per_stage(model, layout, memo), key=lambda p: p.total)
    return most


def stage_params_per_stage(
    model: ModelSpec, layout: Layout, memo: dict[tuple[object, ...], Any] | None = None
) -> tuple[StageParams, ...]:
    """The parameters one GPU of each pipeline stage holds, reused through `memo` (owned by the caller for one
    model) by every layout of the same tp, stage split and expert split."""
    pkey = ("params", *_params_key(layout))
    per_stage: tuple[StageParams, ...] | None = memo.get(pkey) if memo is not None else None
    if per_stage is None:
        held = rank_kinds(model.layer_kinds, layout)
        per_stage = tuple(stage_params(model, layout, i, kinds) for i, kinds in enumerate(held))
        if memo is not None:
            memo[pkey] = per_stage
    return per_stage


def param_count_per_stage(model: ModelSpec, layout: Layout) -> tuple[float, ...]:
    """Parameters one GPU of each pipeline stage holds."""
    return tuple(p.total for p in stage_params_per_stage(model, layout))


def state_bytes_per_gpu(
    param_count_on_gpu: float, job: JobSpec, sharding: Sharding, shard_group: int
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one GPU; ZeRO/FSDP shard over the data-parallel group."""
    d = max(shard_group, 1)
    weights = param_count_on_gpu * job.resident_weight_bytes_per_param / (d if sharding == Sharding.fsdp else 1)
    grads = param_count_on_gpu * job.grad_bytes_per_param / (d if sharding in (Sharding.zero2, Sharding.fsdp) else 1)
    optim = param_count_on_gpu * job.optimizer_bytes_per_param / (d if sharding != Sharding.none else 1)
    return weights, grads, optim


def stage_state_bytes(params: StageParams, job: JobSpec, layout: Layout) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one GPU of a stage: the dense parameters sharded over dp x cp, the
    routed experts over expert-DP (Megatron: 6 + 12/DP and 6 + 12/EDP bytes per parameter with ZeRO-1)."""
    dense = state_bytes_per_gpu(params.total - params.experts, job, layout.sharding, layout.dp * layout.cp)
    if not params.experts:
        return dense
    experts = state_bytes_per_gpu(params.experts, job, layout.sharding, layout.edp)
    return dense[0] + experts[0], dense[1] + experts[1], dense[2] + experts[2]


def activation_bytes_per_layer(
    model: ModelSpec, job: JobSpec, layout: Layout, kind: LayerKind = DENSE_LAYER, params: CostParams | None = None
) -> float:
    """Bytes one transformer layer of `kind` keeps for backward, per micro-batch, on one GPU (`params` for an MoE
    layer's routing imbalance)."""
    s, b, t = job.seq_len, layout.micro_batch, layout.tp
    tokens = s * b / layout.cp  # tokens of this micro-batch on this CP rank
    h, f = model.hidden, model.ffn
    dropout = 1 if job.dropout else 0
    if layout.recompute == Recompute.full:
        # only the layer input is kept (sequence-sharded with SP, as Megatron's distribute-saved-activations)
        return ACT_BYTES * tokens * h / (t if layout.sequence_parallel else 1)
    modules = layout.selective_modules
    # Kept whole on every TP rank unless sequence parallel: 2 norm inputs, QKV and MLP inputs (the norms' outputs,
    # which `layernorm` recomputation drops; in FP8 Megatron then saves the linear's 16-bit input instead of its
    # FP8 copy and recomputes it, set_save_original_input, megatron/core/transformer/transformer_layer.py), dropout
    # masks. The norms' outputs are their linear layers' inputs, saved at `gemm_input_bytes` (FP8 jobs: quantized,
    # by Transformer Engine's LayerNormLinear), but for MLA's (its two down projections each save their own copy)
    # and an MoE layer's (its router, a 16-bit linear, saves it).
    gemm_input = gemm_input_bytes(job)
    norm_outputs = 0.0
    if RecomputeModule.layernorm not in modules:
        norm_outputs = (ACT_BYTES if model.attention.kind == "mla" else gemm_input) + (
            ACT_BYTES if kind.moe else gemm_input)  # fmt: skip
    replicated = tokens * h * (2 * ACT_BYTES + norm_outputs) + tokens * h * 2 * dropout
    # Split over TP: Q, K, V; attention internals; output-projection input; MLP internals.
    naive, selective = job.attention_kernel == "naive", RecomputeModule.core_attn in modules
    attention = attention_activation_bytes(model, tokens, s, t, naive, selective, job.dropout,
                                           RecomputeModule.mla_up_proj in modules, gemm_input)  # fmt: skip
    if kind.moe:
        ffn, per_gpu = moe_activation_bytes(model, job, layout, params or DEFAULT_PARAMS)
    elif RecomputeModule.mlp in modules:  # the dense MLP re-run from its input: none of its internals kept
        ffn, per_gpu = 0.0, 0.0
    else:
        ffn, per_gpu = tokens * f * mlp_saved_bytes_per_width(model, job), 0.0  # SwiGLU: gate, up, product
    split = attention.split + ffn
    return (replicated / (t if layout.sequence_parallel else 1)) + split / t + attention.unsplit + per_gpu


def inflight_bytes(layout: Layout, chunk_bytes: list[float], stage: int) -> tuple[float, int]:
    """(activation bytes a stage holds at peak, micro-batches in its first chunk), given the bytes one micro-batch
    leaves in each of its virtual chunks (in the order the rank runs them).

    Megatron's 1F1B warm-up: stage i holds min(p - i, m) micro-batches of all its chunks. The interleaved
    schedule holds w = (p - i - 1) * 2 + (v - 1) * p + 1 chunk forwards (at most m * v), taken in groups of p
    micro-batches per chunk, chunk 0, 1, ..., v - 1, then again; with equal chunks this is Korthikanti et al.'s
    L(1 + (p-1)/(pv)) layers.
    """
    p, v, m = layout.pp, layout.vp, layout.grad_accum
    if v == 1:
        micro_batches = min(warmup_chunks(p, 1, stage), m)
        return micro_batches * chunk_bytes[0], micro_batches
    w = min(warmup_chunks(p, v, stage), m * v)
    cycles, rest = divmod(w, p * v)
    first_chunk = cycles * p + min(rest, p)
    partial, last = divmod(rest, p)
    held = p * (cycles * sum(chunk_bytes) + sum(chunk_bytes[:partial]))
    return held + (last * chunk_bytes[partial] if last else 0.0), first_chunk


def inflight_layers(layout: Layout, counts: list[int], stage: int) -> tuple[float, int]:
    """(layer activations a stage holds at peak, in layers x micro-batches; micro-batches in its first chunk): the
    `inflight_bytes` of one unit per layer, the rank's chunks as `rank_chunk_sizes` splits its layers."""
    chunks = rank_chunk_sizes(counts[stage], layout.vp, first=stage == 0) if layout.vp > 1 else [counts[stage]]
    return inflight_bytes(layout, [float(n) for n in chunks], stage)


def _candidate_fullest_stages(signatures: Sequence[Hashable]) -> list[int]:
    """Stages that can be the fullest: the first, the last, and among the middle stages the first of each distinct
    content (in-flight micro-batches fall with the stage index, so a later stage holding the same holds less)."""
    if len(signatures) <= 2:
        return list(range(len(signatures)))
    firsts: dict[Hashable, int] = {}
    for i in range(1, len(signatures) - 1):
        firsts.setdefault(signatures[i], i)
    return [0, *sorted(firsts.values()), len(signatures) - 1]


def memory_per_gpu(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> MemoryBreakdown:
    """Memory on the fullest pipeline stage, per GPU. `memo` (owned by the caller for one model, job and params)
    keeps the stage parameters, the per-layer activations and the in-flight activations per stage that layouts
    differing in sharding (or, for the first two, accumulation) share."""
    _, stage, (weights, grads, optim), acts, buffers = _fullest_stage(model, job, layout, params, memo)
    per_stage = stage_params_per_stage(model, layout, memo)
    tkey = ("param_counts", layout.tp, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers,
            layout.ep, layout.etp)  # fmt: skip
    counts: tuple[tuple[float, ...], tuple[float, ...]] | None = memo.get(tkey) if memo is not None else None
    if counts is None:
        counts = tuple(p.total for p in per_stage), tuple(p.experts for p in per_stage)
        if memo is not None:
            memo[tkey] = counts
    return MemoryBreakdown(
        stage=stage,
        layers_on_stage=_split_stages(model, layout, memo)[0][stage],
        param_count_on_gpu=per_stage[stage].total,
        param_count_per_stage=counts[0],
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optim,
        activations_bytes=acts,
        buffers_bytes=buffers,
        reserve_bytes=params.runtime_reserve_bytes,
        expert_param_count_on_gpu=per_stage[stage].experts,
        expert_param_count_per_stage=counts[1],
    )


def memory_total_bytes(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """`memory_per_gpu(...).total_bytes`, the same sum in the same order, without building the breakdown (what a
    count of the layouts that fit needs)."""
    return _fullest_stage(model, job, layout, params, memo)[0]


def _fullest_stage(
    model: ModelSpec, job: JobSpec, layout: Layout, params: CostParams, memo: dict[tuple[object, ...], Any] | None
) -> tuple[float, int, tuple[float, float, float], float, float]:
    """(total bytes, stage, its (weights, gradients, optimizer) bytes, its activation bytes, buffer bytes) of the
    fullest stage, by the same sum `MemoryBreakdown.total_bytes` takes."""
    stage_acts = _stage_activations(model, job, layout, params, memo)
    buffers = 0.0
    if layout.sharding == Sharding.fsdp and layout.dp * layout.cp > 1:
        bkey = ("fsdp_buffers", layout.tp, layout.ep, layout.etp)
        found: float | None = memo.get(bkey) if memo is not None else None
        if found is None:
            # unsharded weights of the prefetched layers and their gradients before reduce-scatter
            moe_layer = expert_params_per_gpu(model, layout, 1) if model.moe is not None else 0.0
            widest = max(layer_param_count_per_rank(model, layout.tp, k) + (moe_layer if k.moe else 0.0)
                         for k in _kinds(model, memo))  # fmt: skip
            found = params.fsdp_prefetch_layers * widest * (job.weight_bytes_per_param + job.grad_bytes_per_param)
            if memo is not None:
                memo[bkey] = found
        buffers = found
    by_stage = _states_by_stage(layout, memo)
    reserve = params.runtime_reserve_bytes
    best: tuple[float, int, tuple[float, float, float], float, float] | None = None
    for stage, acts in stage_acts:
        state = by_stage.get(stage)
        if state is None:
            state = by_stage[stage] = stage_state_bytes(stage_params_per_stage(model, layout, memo)[stage], job, layout)
        total = state[0] + state[1] + state[2] + acts + buffers + reserve
        if best is None or total > best[0]:
            best = (total, stage, state, acts, buffers)
    assert best is not None
    return best


def _kinds(model: ModelSpec, memo: dict[tuple[object, ...], Any] | None) -> frozenset[LayerKind]:
    """The model's distinct layer kinds, through the memo (owned by the caller for one model)."""
    found: frozenset[LayerKind] | None = memo.get(("kinds",)) if memo is not None else None
    if found is None:
        found = frozenset(model.layer_kinds)
        if memo is not None:
            memo[("kinds",)] = found
    return found


ChunkSplit = tuple[ChunkKinds[LayerKind], ChunkKinds[LayerKind]]  # (layers at the layout's bytes, kept whole)


def _split_stages(
    model: ModelSpec, layout: Layout, memo: dict[tuple[object, ...], Any] | None
) -> tuple[list[int], list[tuple[int, tuple[ChunkSplit, ...]]]]:
    """(layers per stage, [(stage, its chunks' layer kinds)] for the stages that can be the fullest) of the layout's
    stage split, through the memo. Each chunk's kinds come in two parts: the layers that hold the layout's
    activations, and those that full recomputation of only `recompute_layers` per chunk keeps whole (empty
    otherwise).

    Those stages are the first, the last, and among the middle stages the first of each distinct content (chunks
    of the same layer kinds hold the same bytes and the same parameters; in-flight micro-batches fall with the
    stage index, so a later stage holding the same holds no more)."""
    partial = layout.recompute_layers if layout.recompute == Recompute.full else None
    key = ("split_stages", layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers, partial)
    found: tuple[list[int], list[tuple[int, tuple[ChunkSplit, ...]]]] | None = None
    if memo is not None:
        found = memo.get(key)
    if found is None:
        ranks: tuple[tuple[ChunkSplit, ...], ...]
        if partial is None:
            ranks = tuple(
                tuple((chunk, ()) for chunk in chunks) for chunks in rank_chunk_kinds(model.layer_kinds, layout)
            )
        else:
            ranks = rank_chunk_recomputed(model.layer_kinds, layout)
        counts = [sum(n for held, kept in chunks for _, n in (*held, *kept)) for chunks in ranks]
        found = counts, [(stage, ranks[stage]) for stage in _candidate_fullest_stages(ranks)]
        if memo is not None:
            memo[key] = found
    return found


def _chunk_bytes(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
    chunks: tuple[ChunkSplit, ...],
    per_kind: dict[LayerKind, float],
) -> list[float]:
    """The activation bytes one micro-batch leaves in each of a rank's chunks (`_split_stages`): the layers at the
    layout's per-layer bytes (`per_kind`, the layout's `_per_kind_activation_bytes`), and those kept whole at the
    bytes of no recomputation."""
    out: list[float] = []
    whole: dict[LayerKind, float] | None = None
    for held, kept in chunks:
        if len(held) == 1:  # `_kinds_bytes` of one kind, inline
            ((kind, n),) = held
            held_bytes: float = n * per_kind[kind]
        else:
            held_bytes = _kinds_bytes(held, per_kind)
        if kept:
            if whole is None:
                whole = _per_kind_activation_bytes(model, job, layout, params, memo, Recompute.none)
            held_bytes += _kinds_bytes(kept, whole)
        out.append(held_bytes)  # with none kept whole: the held bytes + 0, the same figure
    return out


def _kinds_bytes(layers: ChunkKinds[LayerKind], per_kind: dict[LayerKind, float]) -> float:
    """`sum(n * per_kind[k] for k, n in layers)`, the same figure, without a generator for none or one kind."""
    if not layers:
        return 0
    if len(layers) == 1:
        ((kind, n),) = layers
        return n * per_kind[kind]
    return sum(n * per_kind[k] for k, n in layers)


def _stage_activations(
    model: ModelSpec, job: JobSpec, layout: Layout, params: CostParams, memo: dict[tuple[object, ...], Any] | None
) -> list[tuple[int, float]]:
    """[(stage, activation bytes at its peak)] for the stages that can be the fullest: all but the sharding of the
    layout decide them, so they go through the memo under a key without it."""
    key = ("stage_acts", *_all_but_sharding(layout))
    found: list[tuple[int, float]] | None = memo.get(key) if memo is not None else None
    if found is not None:
        return found
    per_kind = _per_kind_activation_bytes(model, job, layout, params, memo)
    tokens = job.seq_len * layout.micro_batch / layout.cp
    sp_div = layout.tp if layout.sequence_parallel else 1
    last = layout.pp - 1
    # full recomputation re-runs one layer at a time in the backward: its whole activations live at the peak
    recomputing = 0.0
    if layout.recompute == Recompute.full:
        whole = _per_kind_activation_bytes(model, job, layout, params, memo, Recompute.none)
        recomputing = max(whole[k] for k in _kinds(model, memo))
    stage_acts: list[tuple[int, float]] = []
    for stage, chunks in _split_stages(model, layout, memo)[1]:
        chunk_bytes = _chunk_bytes(model, job, layout, params, memo, chunks, per_kind)
        if model.mtp_layers and stage == last:  # the MTP modules run after the last layer, in its last chunk
            chunk_bytes[-1] += model.mtp_layers * per_kind[mtp_kind(model)]
        acts, first_chunk = inflight_bytes(layout, chunk_bytes, stage)
        acts += recomputing
        if stage == 0:  # embedding output, held by the micro-batches in flight in the first model chunk
            acts += first_chunk * ACT_BYTES * tokens * model.hidden / sp_div
        if stage == last:
            # logits of one micro-batch kept for the loss's backward, vocab-parallel (and one per MTP module)
            acts += (1 + model.mtp_layers) * params.logits_bytes_per_element * tokens * model.vocab / layout.tp
        stage_acts.append((stage, acts))
    if memo is not None:
        memo[key] = stage_acts
    return stage_acts


def _per_kind_activation_bytes(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
    recompute: Recompute | None = None,
) -> dict[LayerKind, float]:
    """`activation_bytes_per_layer` of every layer kind of the model (the MTP block's too), through the memo; with
    `recompute`, of the layout recomputing so instead."""
    recompute = layout.recompute if recompute is None else recompute
    modules = layout.recompute_modules if recompute == layout.recompute else None
    akey = ("act", layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, layout.ep, layout.etp,
            recompute, modules)  # fmt: skip
    per_kind: dict[LayerKind, float] | None = memo.get(akey) if memo is not None else None
    if per_kind is None:
        if recompute != layout.recompute:
            layout = layout.model_copy(update={"recompute": recompute, "recompute_modules": None})
        kinds = {*model.layer_kinds, mtp_kind(model)}
        per_kind = {k: activation_bytes_per_layer(model, job, layout, k, params) for k in kinds}
        if memo is not None:
            memo[akey] = per_kind
    return per_kind


def memory_floor_bytes(
    model: ModelSpec, job: JobSpec, layout: Layout, params: CostParams, memo: dict[tuple[object, ...], Any] | None
) -> float:
    """A lower bound on `memory_per_gpu`'s total, far cheaper: the first stage's training state and the activations
    its in-flight micro-batches leave in its layers, plus the runtime reserve (no buffers, no embedding output).
    The activations go through the memo under a key without the sharding (the state: `first_stage_state_bytes`)."""
    akey = ("floor_acts", *_all_but_sharding(layout))
    acts: float | None = memo.get(akey) if memo is not None else None
    if acts is None:
        per_kind = _per_kind_activation_bytes(model, job, layout, params, memo)
        first_stage = _split_stages(model, layout, memo)[1][0]
        assert first_stage[0] == 0
        chunk_bytes = _chunk_bytes(model, job, layout, params, memo, first_stage[1], per_kind)
        if layout.pp == 1 and model.mtp_layers:
            chunk_bytes[-1] += model.mtp_layers * per_kind[mtp_kind(model)]
        acts, _ = inflight_bytes(layout, chunk_bytes, 0)
        if memo is not None:
            memo[akey] = acts
    return first_stage_state_bytes(model, job, layout, memo) + acts + params.runtime_reserve_bytes


def first_stage_state_bytes(
    model: ModelSpec, job: JobSpec, layout: Layout, memo: dict[tuple[object, ...], Any] | None = None
) -> float:
    """The training state (weights, gradients, optimizer) one GPU of the first stage holds (through the memo)."""
    by_stage = _states_by_stage(layout, memo)
    state = by_stage.get(0)
    if state is None:
        state = by_stage[0] = stage_state_bytes(stage_params_per_stage(model, layout, memo)[0], job, layout)
    return sum(state)


def _states_by_stage(
    layout: Layout, memo: dict[tuple[object, ...], Any] | None
) -> dict[int, tuple[float, float, float]]:
    """The memo's (weights, gradients, optimizer) bytes of each stage found so far, by stage, for the layout's
    degrees, stage split and sharding (the recomputed layer count moves which stages are candidates, not their
    state); an empty dict without a memo."""
    key = ("stage_states", layout.tp, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers,
           layout.ep, layout.etp, layout.dp, layout.cp, layout.sharding)  # fmt: skip
    if memo is None:
        return {}
    found: dict[int, tuple[float, float, float]] | None = memo.get(key)
    if found is None:
        found = memo[key] = {}
    return found


def usable_memory_bytes(capacity_bytes: float, job: JobSpec) -> float:
    """GPU memory a layout may fill: capacity less the job's headroom fraction."""
    return capacity_bytes * (1.0 - job.memory_headroom)


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per GPU of a layout from a bare parameter count (split evenly over tp x pp: no shape, no
    activations) or from a model shape (the fullest stage's state; with the job's activations, buffers and
    reserve when `breakdown` is set)."""

    param_count: float
    param_count_on_gpu: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    breakdown: MemoryBreakdown | None = None

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def activations_bytes(self) -> float | None:
        return self.breakdown.activations_bytes if self.breakdown is not None else None

    @property
    def total_bytes(self) -> float:
        if self.breakdown is None:
            return self.state_bytes
        b = self.breakdown
        return self.state_bytes + b.activations_bytes + b.reserve_bytes + b.buffers_bytes


def memory_estimate(
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    *,
    model: ModelSpec | None = None,
    param_count: float | None = None,
    with_activations: bool = True,
) -> MemoryEstimate:
    """Memory per GPU from exactly one of `model` (with its activations when `with_activations`) and a
    bare `param_count`; the state shards over dp x cp as the layout's sharding says."""
    breakdown = None
    if model is None:
        if param_count is None:
            raise ValueError("give a model or a parameter count")
        on_gpu = param_count / (layout.tp * layout.pp)
        weights, grads, optim = state_bytes_per_gpu(on_gpu, job, layout.sharding, layout.dp * layout.cp)
        return MemoryEstimate(param_count, on_gpu, weights, grads, optim)
    if with_activations:
        breakdown = memory_per_gpu(model, job, layout, params)
        b = breakdown
        return MemoryEstimate(model.param_count, b.param_count_on_gpu, b.weights_bytes, b.gradients_bytes,
                              b.optimizer_bytes, breakdown)  # fmt: skip
    fullest = max(stage_params_per_stage(model, layout), key=lambda p: sum(stage_state_bytes(p, job, layout)))
    return MemoryEstimate(model.param_count, fullest.total, *stage_state_bytes(fullest, job, layout))
