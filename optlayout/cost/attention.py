"""The attention block of one layer on one TP rank, by kind: grouped-query or multi-latent (MLA), full causal or
sliding-window context. Shapes for the step time (GEMMs, core widths, context) and the bytes kept for backward.

Multi-latent attention as Megatron-Core's `MLASelfAttention` runs it: the down projections (`linear_q_down_proj`,
`linear_kv_down_proj`, with the rotary key) and their latent norms are duplicated on every TP rank and see the
whole (sequence-gathered) micro-batch; the up projections split the heads over TP, as does the output projection.
Its core attention has score width heads x (qk_head_dim + qk_rope_head_dim) and value width heads x v_head_dim
(192 and 128 per head for DeepSeek-V3). A sliding-window layer attends to its mean causal window
(`sliding_window_context`), as Megatron-Bridge's FLOP counter does.
"""

from __future__ import annotations

from dataclasses import dataclass

from optlayout.cost.flops import sliding_window_context
from optlayout.frozen import fast_init
from optlayout.model.layers import DENSE_LAYER, LayerKind
from optlayout.specs import JobSpec, ModelSpec

ACT_BYTES = 2  # 16-bit activations
__all__ = ["DENSE_LAYER", "LayerKind"]

# Scale bytes per element of an FP8 tensor Transformer Engine keeps, by recipe (None: the launchers' default,
# per-tensor): one fp32 scale per tensor (delayed or current scaling), an fp32 scale per 1x128 block (blockwise:
# tensor/float8_blockwise_tensor.py @v2.12 get_scale_shape, lines 121-165, and the float32 scale_inv, 226-243), an
# E8M0 byte per 32 elements (MXFP8: tensor/mxfp8_tensor.py @v2.12 lines 124-145, row- or column-wise alike).
FP8_SCALE_BYTES_PER_ELEMENT: dict[str | None, float] = {None: 0.0, "tensorwise": 0.0, "blockwise": 4 / 128,
                                                        "mxfp8": 1 / 32}  # fmt: skip


def gemm_input_bytes(job: JobSpec) -> float:
    """Bytes per element of a linear layer's input kept for its weight-gradient GEMM. 16-bit, or in an FP8 job
    Transformer Engine's quantized copy: Linear and LayerNormLinear save their FP8 input, one direction only (the
    column-wise copy the weight-gradient GEMM reads; per-tensor FP8 under sequence parallelism keeps the row-wise
    one and re-gathers it), the local shard under sequence parallelism (module/linear.py @v2.12 lines 228-237 and
    383-404, layernorm_linear.py @v2.12 lines 200-206 and 417-427; GroupedLinear alike): 1 byte plus the recipe's
    scales. torchao's rowwise recipe (torchtitan; Transformer Engine has none) saves the high-precision input and
    re-casts it (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args: save_for_backward(input_hp, ...))."""
    if job.precision != "fp8" or job.fp8_recipe == "rowwise":
        return float(ACT_BYTES)
    return 1.0 + FP8_SCALE_BYTES_PER_ELEMENT[job.fp8_recipe]


def mtp_kind(model: ModelSpec) -> LayerKind:
    """A multi-token-prediction module's block: the last layer's kind, with full attention (Megatron)."""
    return LayerKind(model.mtp_block_is_moe, False)


def kv_width_per_rank(model: ModelSpec, tp: int) -> float:
    """Key (or value) width one TP rank holds: kv_heads / tp heads, or one replicated head when tp > kv_heads
    (Megatron replicates query groups so that each rank has one)."""
    return max(model.kv_width / tp, float(model.head_size))


def attention_gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """(n, k) of each GEMM of the attention block on one TP rank; m is the micro-batch's tokens on the CP rank."""
    h = model.hidden
    if model.attention.kind != "mla":
        dq = model.q_width
        return [(dq / tp + 2 * kv_width_per_rank(model, tp), h), (h, dq / tp)]
    att, n = model.attention, model.heads
    score, value = n * model.head_size, model.value_width
    kv_rank, rope = float(att.kv_lora_rank or 0), float(att.qk_rope_head_dim or 0)
    q_rank = float(att.q_lora_rank or 0)
    query = [(q_rank, h), (score / tp, q_rank)] if q_rank else [(score / tp, h)]
    nope = n * float(att.qk_head_dim or 0)
    return [*query, (kv_rank + rope, h), ((nope + value) / tp, kv_rank), (h, value / tp)]


def core_widths(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(score width, value width) of the attention core on one TP rank (GQA: both the query width)."""
    return model.q_width / tp, model.value_width / tp


def context(model: ModelSpec, seq_len: int, causal: bool, kind: LayerKind) -> float:
    """Keys a query attends to on average: half the sequence (causal), the whole, or the mean causal window."""
    window = model.attention.sliding_window
    if kind.windowed and window is not None and window < seq_len:
        return sliding_window_context(window, seq_len)
    return seq_len * (0.5 if causal else 1.0)


# Exponentials per attention score: the forward's P = exp(S - m) (online softmax), the backward's recomputed
# P = exp(S - LSE) (FlashAttention-2, Dao 2023, Algorithms 1 and 2); the backward's other softmax work has none.
EXPS_PER_SCORE_FWD = 1
EXPS_PER_SCORE_BWD = 1


def io_aware_core_s(
    flops: float,
    scores: float,
    peak_flops_per_s: float,
    exp_per_s: float | None,
    efficiency: float,
    backward_ratio: float,
    fixed_s: float,
) -> tuple[float, float]:
    """(forward, backward) seconds of the IO-aware attention core: `flops` tensor-core FLOPs of its forward
    (QK^T and PV; the backward `backward_ratio` times as many) at `peak_flops_per_s`, and `scores` attention scores,
    exponentiated once each way on the special function units at `exp_per_s` (None: no bound), plus the calls'
    fixed cost `fixed_s` (`backward_ratio` times it backward). The two units overlap (FlashAttention-3's pingpong
    and intra-warpgroup pipelining run one tile's softmax under another's GEMMs, Shah et al. 2024 sec. 3.2;
    FlashAttention-4 on Blackwell likewise), so the kernel runs at `efficiency` of the slower one. At 4 x head_dim
    FLOPs per score the forward's exponentials match its tensor cores at head dim 64 on Hopper, 128 on Blackwell,
    64 on Blackwell Ultra (gpus.yaml); the backward's 2.5x the tensor work stays the slower down to 2/5 of those."""
    tensor_s = flops / (peak_flops_per_s * efficiency) + fixed_s
    if not exp_per_s:
        return tensor_s, backward_ratio * tensor_s
    exp_s = scores / (exp_per_s * efficiency)
    forward = max(tensor_s, EXPS_PER_SCORE_FWD * exp_s + fixed_s)
    backward = max(backward_ratio * tensor_s, EXPS_PER_SCORE_BWD * exp_s + backward_ratio * fixed_s)
    return forward, backward


def attention_norm_elementwise_bytes(model: ModelSpec, tp: int) -> float:
    """Bytes per token of the attention block's own norms on one TP rank (read and write, 2 B each, as the hidden
    norms are priced): MLA's two latent norms (whole on every rank), or the per-head query and key norms."""
    att = model.attention
    if att.kind == "mla":
        return 4.0 * ((att.q_lora_rank or 0) + (att.kv_lora_rank or 0))
    return 4.0 * (model.q_width / tp + kv_width_per_rank(model, tp)) if att.qk_norm else 0.0


@fast_init
@dataclass(frozen=True)
class AttentionActivations:
    """Bytes the attention block keeps for backward per micro-batch on one GPU, by how they split."""

    split: float  # divided over TP: Q, K, V, the core's internals, the output projection's input
    unsplit: float  # whole on every TP rank: MLA's latents (its down projections are duplicated)


def attention_activation_bytes(
    model: ModelSpec,
    tokens: float,
    seq_len: int,
    tp: int,
    naive: bool,
    selective: bool,
    dropout: bool,
    up_proj: bool = False,
    gemm_input: float = ACT_BYTES,
) -> AttentionActivations:
    """Attention's saved tensors (Korthikanti et al. 2022 generalized to GQA; MLA's up-projection outputs and
    latents; the inputs of Qwen3's query/key norms); `selective` drops the core's internals (recomputed from Q, K,
    V); `up_proj` (MLA, Megatron's `mla_up_proj`) drops the up projections' Q, K, V (recomputed from the latents
    before the core's backward). `gemm_input`: bytes per element of a linear layer's saved input
    (`gemm_input_bytes`): the output projection's, and MLA's up projections' (the normed latents).

    The output projection's input is the core's output O. In 16 bits the projection saves O itself, which the
    IO-aware core also keeps for its backward: one tensor. In FP8 the projection saves its own quantized copy, and
    O stays 16-bit with the core (Transformer Engine's fused attention saves (q, k, v, out), attention/
    dot_product_attention/backends.py @v2.12 lines 1360 and 1382-1391, with FP8 attention off, as in Megatron-
    Bridge's FP8 configs) unless the core is recomputed or naive (its matmuls keep their inputs, not O)."""
    drop = 1 if dropout else 0
    o_kept = ACT_BYTES if gemm_input != ACT_BYTES and not naive and not selective else 0.0
    if model.attention.kind == "mla":
        att, n = model.attention, model.heads
        qk, v = n * model.head_size, model.value_width
        qkv = 0.0 if up_proj else ACT_BYTES * tokens * (2 * qk + v)  # Q, K (rotary key broadcast to the heads), V
        proj_in = (gemm_input + o_kept) * tokens * v
        q_rank, kv_rank, rope = att.q_lora_rank or 0, att.kv_lora_rank or 0, att.qk_rope_head_dim or 0
        # the down projections' outputs (their norms' inputs) and the normed latents (the up projections' inputs)
        latents = tokens * (ACT_BYTES * (q_rank + kv_rank + rope) + gemm_input * (q_rank + kv_rank))
    else:
        dq = model.q_width
        kv_kept = kv_width_per_rank(model, tp) * tp  # kv heads fewer than tp are replicated, one per rank
        if naive and not selective:
            # GQA: the unfused core repeat_interleaves K and V to every query head before its matmuls, which save
            # the repeated copies (Megatron's DotProductAttention, HF eager attention); selective recompute keeps
            # the core's unrepeated inputs. A no-op for MHA.
            kv_kept = dq
        qkv = ACT_BYTES * tokens * (dq + 2 * kv_kept)
        if model.attention.qk_norm:
            qkv += ACT_BYTES * tokens * (dq + kv_kept)  # the query and key norms keep their inputs too
        proj_in = (gemm_input + o_kept) * tokens * dq
        latents = 0.0
    # naive: the softmax output (2 B), and with dropout its mask (1 B) and output (2 B), per score; IO-aware:
    # an fp32 log-sum-exp per query and head
    internal = model.heads * tokens * seq_len * (ACT_BYTES + 3 * drop) if naive else 4.0 * model.heads * tokens
    if selective:
        internal = 0.0  # recomputed from Q, K, V
    return AttentionActivations(qkv + internal + proj_in, latents)
