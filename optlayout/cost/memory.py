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

from optlayout.cost.params import CostParams
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute, Sharding

ACT_BYTES = 2  # 16-bit activations


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the fullest pipeline stage."""

    stage: int
    layers_on_stage: int
    params_on_gpu: float
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


def stage_layer_counts(layers: int, pp: int, first: int | None = None, last: int | None = None) -> list[int]:
    """Transformer layers on each pipeline stage.

    Given first/last counts, the rest split evenly. Otherwise an even split when `pp` divides `layers`;
    else, if `layers + 2` divides, the embedding and the output layer each count as one layer (Llama 3:
    126 layers on 16 stages = 7, 8 x 14, 7); else the remainder goes to the middle stages.
    """
    if pp == 1:
        return [layers]
    if first is not None or last is not None:
        f = first if first is not None else None
        la = last if last is not None else None
        fixed = (f or 0) + (la or 0)
        free_stages = pp - (f is not None) - (la is not None)
        rest = layers - fixed
        if rest < 0 or (free_stages and rest % free_stages) or (not free_stages and rest):
            raise ValueError(f"{layers} layers cannot be split over {pp} stages with first={first}, last={last}")
        mid = rest // free_stages if free_stages else 0
        if free_stages and mid < 1:
            raise ValueError(f"{layers} layers leave no layer for the middle stages with first={first}, last={last}")
        return [f if f is not None else mid] + [mid] * (pp - 2) + [la if la is not None else mid]
    if layers % pp == 0:
        return [layers // pp] * pp
    if (layers + 2) % pp == 0 and (layers + 2) // pp >= 2:
        per = (layers + 2) // pp
        return [per - 1] + [per] * (pp - 2) + [per - 1]
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    for i in range(extra):
        counts[1 + i % (pp - 2) if pp > 2 else i] += 1
    return counts


def split_layers(layers: int, pp: int) -> tuple[int | None, int | None] | None:
    """A Megatron-expressible split of `layers` over `pp` stages: (first, last) layer counts, None for even.

    Even when `pp` divides `layers`; else the smallest middle stage m >= layers / pp that leaves the first
    and last stages between them no more than 2m layers, split as evenly as it goes with the spare layer on the
    first stage (the last also runs the output layer and the loss), as `--decoder-first/last-pipeline-num-
    layers` express: 126 layers on 16 stages = 7, 8 x 14, 7; 61 on 4 = 15, 16, 16, 14. None when no split
    exists (returned as the bare None, distinct from `(None, None)`).
    """
    if pp == 1 or layers % pp == 0:
        return (None, None)
    for middle in range(-(-layers // pp), layers):
        rest = layers - middle * (pp - 2)
        if rest < 2:
            return None
        if rest <= 2 * middle:
            return rest - rest // 2, rest // 2
    return None


def vp_fits(counts: list[int] | set[int], vp: int) -> bool:
    """Whether `vp` virtual chunks per stage are legal: the fullest stages split into `vp` equal chunks, so
    they pace the interleaved schedule; lighter first/last stages get lighter chunks (`chunk_layer_counts`,
    emitted as Megatron's `--pipeline-model-parallel-layout` or torchtitan's module lists)."""
    fullest = max(counts)
    return fullest % vp == 0 and fullest >= vp


def chunk_layer_counts(counts: list[int], vp: int) -> list[int]:
    """Layers of each virtual stage in model order (stage s runs on pp rank s % pp as its chunk s // pp).

    Each rank's layers spread as evenly as its `vp` chunks allow; the first rank's lighter chunks come first
    (next to the embedding), the others' last (the last rank's next to the loss), as Llama 3 405B's
    pipeline does: 126 layers, pp 16, vp 8 leave the first chunk the embedding and the last the loss.
    """
    pp = len(counts)
    per_rank = [rank_chunk_sizes(n, vp, first=r == 0) for r, n in enumerate(counts)]
    return [per_rank[s % pp][s // pp] for s in range(pp * vp)]


def rank_chunk_sizes(layers: int, vp: int, first: bool) -> list[int]:
    """One rank's `layers` over its `vp` chunks, as even as possible; lighter chunks first on the first rank."""
    small, extra = divmod(layers, vp)
    sizes = [small] * (vp - extra) + [small + 1] * extra
    return sizes if first else sizes[::-1]


def kv_width_per_rank(model: ModelSpec, tp: int) -> float:
    """Key (or value) width one TP rank holds: kv_heads / tp heads, or one replicated head when tp > kv_heads
    (Megatron replicates query groups so that each rank has one)."""
    return max(model.kv_width / tp, float(model.head_size))


def layer_params_per_rank(model: ModelSpec, tp: int) -> float:
    """Parameters of one transformer layer on one TP rank, with replicated K/V heads when tp > kv_heads."""
    kv_bias = 2 if model.bias else 0
    kv = (2 * model.hidden + kv_bias) * model.kv_width
    kv_rank = (2 * model.hidden + kv_bias) * kv_width_per_rank(model, tp)
    return (model.layer_params - kv) / tp + kv_rank


def stage_params(model: ModelSpec, layout: Layout, stage: int, layers_on_stage: int) -> float:
    """Parameters held by one GPU of a stage (TP-sharded; vocab-parallel embedding and output layer)."""
    total = layers_on_stage * layer_params_per_rank(model, layout.tp) * layout.tp
    last = layout.pp - 1
    if stage == 0:
        total += model.embedding_params
    if stage == last:
        total += model.output_params
        if model.tied_embeddings and layout.pp > 1:
            total += model.vocab * model.hidden  # the last stage keeps its own copy of the tied matrix
    return total / layout.tp


def state_bytes_per_gpu(
    params_on_gpu: float, job: JobSpec, sharding: Sharding, shard_group: int
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one GPU; ZeRO/FSDP shard over the data-parallel group."""
    d = max(shard_group, 1)
    weights = params_on_gpu * job.weight_bytes_per_param / (d if sharding == Sharding.fsdp else 1)
    grads = params_on_gpu * job.grad_bytes_per_param / (d if sharding in (Sharding.zero2, Sharding.fsdp) else 1)
    optim = params_on_gpu * job.optimizer_bytes_per_param / (d if sharding != Sharding.none else 1)
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


def memory_per_gpu(model: ModelSpec, job: JobSpec, layout: Layout, params: CostParams) -> MemoryBreakdown:
    """Memory on the fullest pipeline stage, per GPU."""
    counts = stage_layer_counts(model.layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers)
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
        p_gpu = stage_params(model, layout, stage, layers)
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
            unsharded = params.fsdp_prefetch_layers * layer_params_per_rank(model, layout.tp)
            buffers = unsharded * (job.weight_bytes_per_param + job.grad_bytes_per_param)
        row = MemoryBreakdown(
            stage=stage,
            layers_on_stage=layers,
            params_on_gpu=p_gpu,
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
