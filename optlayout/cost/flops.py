"""FLOPs per token, MFU and HFU.

Our one MFU definition: model FLOPs per token = 6 x (parameters that take part in a matrix multiply per token:
all but the input-embedding lookup and norms; of a mixture-of-experts layer the top_k routed and the shared
experts, not the router; multi-token-prediction modules with their pass through the output head) + the
attention score and value products (6 x context x (score width + value width) per layer, the causal context
being half the sequence), times tokens/s, over the dense peak of the job's matrix precision. This is
Megatron's count (megatron/training/training.py num_floating_point_operations; Megatron-Bridge's
training/utils/flop_utils.py with its sliding-window context), up to norms and biases (< 0.05%).
Recomputation is not counted in MFU; it is in HFU.
"""

from __future__ import annotations

from optlayout.errors import InputError
from optlayout.specs import ModelSpec, Recompute


def sliding_window_context(window: int, seq_len: int) -> float:
    """Mean keys a query sees under a causal window of `window` keys (itself included): W - W(W-1)/(2s) when the
    window is shorter than the sequence, else the causal s/2 (Megatron-Bridge flop_utils.py)."""
    return window - window * (window - 1) / (2 * seq_len) if window < seq_len else seq_len / 2


def attention_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs per token of QK^T and AV over all attention layers (MTP modules' full attention included):
    3 passes x 2 FLOPs x context x (score width + value width); GQA's widths are both the query width."""
    widths = model.q_width + model.value_width
    windowed = sum(model.sliding_window_flags)
    full = 6.0 * (model.layers - windowed + model.mtp_layers) * seq_len * widths
    full = full / 2 if causal else full
    if not windowed:
        return full
    if not causal:
        raise InputError("causal: sliding-window attention is causal; non-causal FLOPs with a window are undefined")
    window: int = model.attention.sliding_window  # type: ignore[assignment]  # set: some layer is windowed
    return full + 6.0 * windowed * sliding_window_context(window, seq_len) * widths


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs per trained token: 6N (matmul parameters a token uses) plus the attention term."""
    return 6.0 * model.matmul_param_count + attention_flops_per_token(model, seq_len, causal)


def hardware_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: Recompute, causal: bool = True, recomputed_share: float = 1.0
) -> float:
    """FLOPs actually executed per token, counting the forward passes that recomputation repeats (full: of the
    `recomputed_share` of the layers it re-runs)."""
    base = model_flops_per_token(model, seq_len, causal)
    attn_fwd = attention_flops_per_token(model, seq_len, causal) / 3
    if recompute == Recompute.full:
        layers_fwd = 2.0 * (model.matmul_param_count - model.output_matmul_param_count)
        return base + recomputed_share * (layers_fwd + attn_fwd)
    if recompute == Recompute.selective:
        return base + attn_fwd
    return base


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s per GPU over the GPU's dense peak."""
    return tokens_per_s_per_gpu * flops_per_token / peak_flops
