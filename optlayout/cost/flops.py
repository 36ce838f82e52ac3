"""FLOPs per token, MFU and HFU.

Our one MFU definition: model FLOPs per token = 6 x (parameters that take part in a matrix multiply,
i.e. all but the input-embedding lookup and norms) + the attention score and value products
(12 x layers x seq x query width, halved for causal masking), times tokens/s, over the dense peak of
the job's matrix precision. Recomputation is not counted in MFU; it is in HFU.
"""

from __future__ import annotations

from optlayout.specs import ModelSpec, Recompute


def attention_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs per token of QK^T and AV over all layers: 3 passes x 2 matmuls x 2 FLOPs x s x d_q."""
    full = 12.0 * model.layers * seq_len * model.q_width
    return full / 2 if causal else full


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs per trained token: 6N (matmul parameters) plus the attention term."""
    return 6.0 * model.matmul_param_count + attention_flops_per_token(model, seq_len, causal)


def hardware_flops_per_token(model: ModelSpec, seq_len: int, recompute: Recompute, causal: bool = True) -> float:
    """FLOPs actually executed per token, counting the forward passes that recomputation repeats."""
    base = model_flops_per_token(model, seq_len, causal)
    attn_fwd = attention_flops_per_token(model, seq_len, causal) / 3
    if recompute == Recompute.full:
        layers_fwd = 2.0 * model.layers * (model.attention_param_count + model.mlp_param_count)
        return base + layers_fwd + attn_fwd
    if recompute == Recompute.selective:
        return base + attn_fwd
    return base


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s per GPU over the GPU's dense peak."""
    return tokens_per_s_per_gpu * flops_per_token / peak_flops
