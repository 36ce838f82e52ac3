"""Memory per GPU: training state, activations (Korthikanti et al. 2022), buffers and a runtime reserve.

Activation bytes follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4, term by term, generalized to GQA (separate query and key/value widths; naive attention
keeps K and V repeated to every query head, as its matmuls save them), SwiGLU and
squared-ReLU MLPs, IO-aware attention (no s^2 terms), dropout on or off, and context parallelism (the
sequence split over `cp`). With dropout, naive attention, MHA and a 4h GeLU MLP it reduces to the paper's
sbh(34 + 5as/h) per layer; with TP it becomes sbh(10 + 24/t + 5as/(ht)); with TP and sequence
parallelism sbh(34 + 5as/h)/t; selective recomputation drops the 5as^2b attention term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optlayout.cost.params import CostParams
from optlayout.layout.stages import rank_chunk_sizes, stage_split
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

ACT_BYTES = 2  # 16-bit activations


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

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.activations_bytes + self.buffers_bytes + self.reserve_bytes


def kv_width_per_rank(model: ModelSpec, tp: int) -> float:
    """Key (or value) width one TP rank holds: kv_heads / tp heads, or one replicated head when tp > kv_heads
    (Megatron replicates query groups so that each rank has one)."""
    return max(model.kv_width / tp, float(model.head_size))


def layer_param_count_per_rank(model: ModelSpec, tp: int) -> float:
    """Parameters of one transformer layer on one TP rank, with replicated K/V heads when tp > kv_heads."""
    kv_bias = 2 if model.bias else 0
    kv = (2 * model.hidden + kv_bias) * model.kv_width
    kv_rank = (2 * model.hidden + kv_bias) * kv_width_per_rank(model, tp)
    return (model.layer_param_count - kv) / tp + kv_rank


def stage_param_count(model: ModelSpec, layout: Layout, stage: int, layers_on_stage: int) -> float:
    """Parameters held by one GPU of a stage (TP-sharded; vocab-parallel embedding and output layer)."""
    total = layers_on_stage * layer_param_count_per_rank(model, layout.tp) * layout.tp
    last = layout.pp - 1
    if stage == 0:
        total += model.embedding_param_count
    if stage == last:
        total += model.output_param_count
        if model.tied_embeddings and layout.pp > 1:
            total += model.vocab * model.hidden  # the last stage keeps its own copy of the tied matrix
    return total / layout.tp


def param_count_per_stage(model: ModelSpec, layout: Layout) -> tuple[float, ...]:
    """Parameters one GPU of each pipeline stage holds."""
    return tuple(stage_param_count(model, layout, i, n) for i, n in enumerate(stage_split(layout, model.layers)))


def state_bytes_per_gpu(
    param_count_on_gpu: float, job: JobSpec, sharding: Sharding, shard_group: int
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one GPU; ZeRO/FSDP shard over the data-parallel group."""
    d = max(shard_group, 1)
    weights = param_count_on_gpu * job.weight_bytes_per_param / (d if sharding == Sharding.fsdp else 1)
    grads = param_count_on_gpu * job.grad_bytes_per_param / (d if sharding in (Sharding.zero2, Sharding.fsdp) else 1)
    optim = param_count_on_gpu * job.optimizer_bytes_per_param / (d if sharding != Sharding.none else 1)
    return weights, grads, optim


def activation_bytes_per_layer(model: ModelSpec, job: JobSpec, layout: Layout) -> float:
    """Bytes one transformer layer keeps for backward, per micro-batch, on one GPU."""
    s, b, t = job.seq_len, layout.micro_batch, layout.tp
    tokens = s * b / layout.cp  # tokens of this micro-batch on this CP rank
    h, dq, f = model.hidden, model.q_width, model.ffn
    dropout = 1 if job.dropout else 0
    if layout.recompute == Recompute.full:
        # only the layer input is kept (sequence-sharded with SP, as Megatron's distribute-saved-activations)
        return ACT_BYTES * tokens * h / (t if layout.sequence_parallel else 1)
    # Kept whole on every TP rank unless sequence parallel: 2 norm inputs, QKV and MLP inputs, dropout masks.
    replicated = ACT_BYTES * tokens * h * 4 + tokens * h * 2 * dropout
    # Split over TP: Q, K, V; attention internals; output-projection input; MLP internals.
    kv_kept = kv_width_per_rank(model, t) * t  # kv heads fewer than tp are replicated, one per rank
    if job.attention_kernel == "naive" and layout.recompute != Recompute.selective:
        # GQA: the unfused core repeat_interleaves K and V to every query head before its matmuls, which save the
        # repeated copies (Megatron's DotProductAttention, HF eager attention); selective recompute keeps the
        # core's unrepeated inputs. A no-op for MHA.
        kv_kept = dq
    qkv = ACT_BYTES * tokens * (dq + 2 * kv_kept)
    if job.attention_kernel == "naive":
        # softmax output (2 B), and with dropout its mask (1 B) and output (2 B), per score
        attn_internal = model.heads * tokens * s * (ACT_BYTES + 3 * dropout)
    else:
        attn_internal = 4.0 * model.heads * tokens  # fp32 log-sum-exp per query and head (IO-aware kernel)
    if layout.recompute == Recompute.selective:
        attn_internal = 0.0  # recomputed from Q, K, V
    proj_in = ACT_BYTES * tokens * dq
    mlp_values = {"swiglu": 3, "gelu": 2, "relu2": 2}[model.mlp]  # fused SwiGLU keeps gate, up and product
    mlp = ACT_BYTES * tokens * f * mlp_values
    split = qkv + attn_internal + proj_in + mlp
    return (replicated / (t if layout.sequence_parallel else 1)) + split / t


def inflight_layers(layout: Layout, counts: list[int], stage: int) -> tuple[float, int]:
    """(layer activations a stage holds at peak, in layers x micro-batches; micro-batches in its first chunk).

    Megatron's 1F1B warm-up: stage i holds min(p - i, m) micro-batches of all its layers. The interleaved
    schedule holds w = (p - i - 1) * 2 + (v - 1) * p + 1 chunk forwards (at most m * v), taken in groups of p
    micro-batches per chunk, chunk 0, 1, ..., v - 1, then again: the layers they hold follow the rank's chunk
    sizes (`chunk_layer_counts`); with equal chunks this is Korthikanti et al.'s L(1 + (p-1)/(pv)).
    """
    p, v, m = layout.pp, layout.vp, layout.grad_accum
    if v == 1:
        held = min(p - stage, m)
        return float(held * counts[stage]), held
    w = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
    cycles, rest = divmod(w, p * v)
    first_chunk = cycles * p + min(rest, p)
    n = counts[stage]
    if n % v == 0:  # equal chunks
        return w * n / v, first_chunk
    chunks = rank_chunk_sizes(n, v, first=stage == 0)
    partial, last = divmod(rest, p)
    layers = p * (cycles * n + sum(chunks[:partial])) + (last * chunks[partial] if last else 0)
    return float(layers), first_chunk


def _candidate_fullest_stages(counts: list[int]) -> list[int]:
    """Stages that can be the fullest: the first, the last, and the first middle stage holding the most layers
    (in-flight micro-batches fall with the stage index, so a later middle stage with as many layers holds less)."""
    if len(counts) <= 2:
        return list(range(len(counts)))
    middle = max(range(1, len(counts) - 1), key=lambda i: (counts[i], -i))
    return [0, middle, len(counts) - 1]


def stage_shape(
    model: ModelSpec, layout: Layout, memo: dict[tuple[object, ...], Any] | None = None
) -> tuple[list[int], tuple[float, ...]]:
    """(layers on each stage, parameters one GPU of each stage holds): what the stage split gives, reused
    through `memo` (owned by the caller for one model) by every layout of the same tp, pp and split."""
    key = ("stage_shape", layout.tp, layout.pp, layout.first_stage_layers, layout.last_stage_layers)
    shape = memo.get(key) if memo is not None else None
    if shape is None:
        shape = (stage_split(layout, model.layers), param_count_per_stage(model, layout))
        if memo is not None:
            memo[key] = shape
    return shape


def memory_per_gpu(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> MemoryBreakdown:
    """Memory on the fullest pipeline stage, per GPU (`memo`: see `stage_shape`)."""
    counts, per_stage = stage_shape(model, layout, memo)
    per_layer = activation_bytes_per_layer(model, job, layout)
    shard_group = layout.dp * layout.cp
    tokens = job.seq_len * layout.micro_batch / layout.cp
    sp_div = layout.tp if layout.sequence_parallel else 1
    # full recomputation re-runs one layer at a time in the backward: its whole activations live at the peak
    recomputing = 0.0
    if layout.recompute == Recompute.full:
        recomputing = activation_bytes_per_layer(model, job, layout.model_copy(update={"recompute": Recompute.none}))
    best: MemoryBreakdown | None = None
    for stage in _candidate_fullest_stages(counts):
        layers = counts[stage]
        p_gpu = per_stage[stage]
        weights, grads, optim = state_bytes_per_gpu(p_gpu, job, layout.sharding, shard_group)
        held_layers, first_chunk = inflight_layers(layout, counts, stage)
        acts = per_layer * held_layers + recomputing
        if stage == 0:  # embedding output, held by the micro-batches in flight in the first model chunk
            acts += first_chunk * ACT_BYTES * tokens * model.hidden / sp_div
        if stage == layout.pp - 1:
            # logits of one micro-batch kept for the loss's backward, vocab-parallel
            acts += params.logits_bytes_per_element * tokens * model.vocab / layout.tp
        buffers = 0.0
        if layout.sharding == Sharding.fsdp and shard_group > 1:
            # unsharded weights of the prefetched layers and their gradients before reduce-scatter
            unsharded = params.fsdp_prefetch_layers * layer_param_count_per_rank(model, layout.tp)
            buffers = unsharded * (job.weight_bytes_per_param + job.grad_bytes_per_param)
        row = MemoryBreakdown(
            stage=stage,
            layers_on_stage=layers,
            param_count_on_gpu=p_gpu,
            param_count_per_stage=per_stage,
            weights_bytes=weights,
            gradients_bytes=grads,
            optimizer_bytes=optim,
            activations_bytes=acts,
            buffers_bytes=buffers,
            reserve_bytes=params.runtime_reserve_bytes,
        )
        if best is None or row.total_bytes > best.total_bytes:
            best = row
    assert best is not None
    return best


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
        total, on_gpu = param_count, param_count / (layout.tp * layout.pp)
    elif with_activations:
        breakdown = memory_per_gpu(model, job, layout, params)
        total, on_gpu = model.param_count, breakdown.param_count_on_gpu
    else:
        total, on_gpu = model.param_count, max(param_count_per_stage(model, layout))
    weights, grads, optim = state_bytes_per_gpu(on_gpu, job, layout.sharding, layout.dp * layout.cp)
    return MemoryEstimate(total, on_gpu, weights, grads, optim, breakdown)
