"""FP8 jobs' saved activations, by hand: Transformer Engine keeps its linear layers' inputs quantized (1 byte plus the
recipe's scales), every other saved tensor at 16 bits, and the attention core its own 16-bit output."""

from __future__ import annotations

import pytest

from optlayout.cost.attention import gemm_input_bytes
from optlayout.cost.memory import activation_bytes_per_layer
from optlayout.layout import parse_layout
from optlayout.specs import JobSpec, Layout, ModelSpec

# Llama 3 70B's shape (GQA, SwiGLU): h 8192, ffn 28672, 64 query heads of 128, 8 key/value heads.
H, F, HEADS, KV = 8192, 28672, 64, 1024
LLAMA70 = ModelSpec(layers=80, hidden=H, ffn=F, heads=HEADS, kv_heads=8, vocab=128256, mlp="swiglu")
S = 8192
BF16 = JobSpec(seq_len=S)


def fp8(recipe: str | None) -> JobSpec:
    return JobSpec.model_validate({"seq_len": S, "precision": "fp8", "fp8_recipe": recipe})


def per_token(job: JobSpec, layout: str = "tp=1") -> float:
    return activation_bytes_per_layer(LLAMA70, job, parse_layout(layout)) / S


@pytest.mark.parametrize(
    ("recipe", "expected"), [(None, 1.0), ("tensorwise", 1.0), ("blockwise", 1 + 4 / 128), ("mxfp8", 1 + 1 / 32)]
)
def test_gemm_input_bytes_by_recipe(recipe: str | None, expected: float) -> None:
    # per-tensor: one fp32 scale per tensor; blockwise: an fp32 scale per 128 elements; MXFP8: one byte per 32
    assert gemm_input_bytes(fp8(recipe)) == expected


def test_gemm_input_bytes_16_bit() -> None:
    assert gemm_input_bytes(BF16) == 2.0
    assert gemm_input_bytes(fp8("rowwise")) == 2.0  # torchao keeps the high-precision input


def test_bf16_layer_by_hand() -> None:
    # 2 norm inputs + 2 norm outputs (4 x 2h), Q K V (2 x (8192 + 2 x 1024)), fp32 LSE per head (4 x 64),
    # O (2 x 8192), SwiGLU gate, up, product (3 x 2 x 28672)
    assert per_token(BF16) == 4 * 2 * H + 2 * (H + 2 * KV) + 4 * HEADS + 2 * H + 3 * 2 * F == 274_688


def test_mxfp8_layer_by_hand() -> None:
    # the norms' outputs (QKV and FC1 inputs) and FC2's input at 1 + 1/32 bytes; O kept at 2 by the core and its
    # 1 + 1/32 copy by the output projection; norm inputs, Q K V, LSE and the gate and up at 16 bits
    q = 1 + 1 / 32
    expected = 2 * 2 * H + 2 * q * H + 2 * (H + 2 * KV) + 4 * HEADS + (2 + q) * H + (2 * 2 + q) * F
    assert per_token(fp8("mxfp8")) == pytest.approx(expected)
    assert per_token(fp8("mxfp8")) == pytest.approx(239_488)
    # per-tensor scaling: no scale bytes, the same tensors at 1 byte
    assert per_token(fp8(None)) == pytest.approx(4 * H + 2 * H + 2 * (H + 2 * KV) + 4 * HEADS + 3 * H + 5 * F)


def test_fp8_selective_core_attention_keeps_only_the_fp8_copy_of_o() -> None:
    # core recomputed: no LSE, no 16-bit O; the projection's 1-byte copy stays (per-tensor, no scales)
    bf16 = per_token(BF16, "tp=1,recompute=selective:core_attn")
    fp8_sel = per_token(fp8("tensorwise"), "tp=1,recompute=selective:core_attn")
    assert bf16 == 274_688 - 4 * HEADS
    assert fp8_sel == 4 * H + 2 * H + 2 * (H + 2 * KV) + 1 * H + 5 * F


def test_fp8_layernorm_recompute_drops_the_norm_outputs() -> None:
    # Megatron recomputes the norms and saves the linear's 16-bit input for the recompute (no FP8 copy kept)
    full = per_token(fp8("tensorwise"))
    dropped = per_token(fp8("tensorwise"), "tp=1,recompute=selective:layernorm")
    assert full - dropped == 2 * 1 * H


@pytest.mark.parametrize("t", [2, 8])
def test_fp8_sequence_parallel_divides_the_saved_shards(t: int) -> None:
    # SP keeps the local shard of each norm output (FP8) and input (16-bit): 4h + 2h per token over t; the
    # TP-split rest (Q K V, LSE, O and its copy, the MLP) over t as without SP
    got = per_token(fp8("tensorwise"), f"tp={t},sp")
    assert got == pytest.approx((4 * H + 2 * H) / t + (2 * (H + 2 * KV) + 4 * HEADS + 3 * H + 5 * F) / t)
    without_sp = per_token(fp8("tensorwise"), f"tp={t}")
    assert without_sp - got == pytest.approx((4 * H + 2 * H) * (1 - 1 / t))


def test_fp8_full_recompute_keeps_the_16_bit_layer_input() -> None:
    layout = Layout(recompute="full")
    assert activation_bytes_per_layer(LLAMA70, fp8("mxfp8"), layout) == 2 * S * H


def test_torchtitan_plan_says_torchao_saves_16_bit_inputs() -> None:
    # the plan counts 1-byte FP8 inputs; torchao's Float8Linear keeps the 16-bit ones: the emitted notes say so
    from optlayout.emit.torchtitan import torchtitan_notes
    from optlayout.presets import model_preset

    llama8 = model_preset("llama3.1-8b")
    layout = parse_layout("tp=1,dp=8,mb=1,ga=1,sharding=fsdp")
    warned = "save their 16-bit inputs for backward"
    mx = JobSpec(seq_len=S, global_batch=8, precision="fp8", fp8_recipe="mxfp8")
    assert any(warned in n and "1.03125-byte" in n for n in torchtitan_notes(llama8, mx, layout))
    rowwise = JobSpec(seq_len=S, global_batch=8, precision="fp8", fp8_recipe="rowwise")
    assert not any(warned in n for n in torchtitan_notes(llama8, rowwise, layout))


@pytest.mark.parametrize(("mlp", "bf16", "mx"), [("swiglu", 6.0, 4 + 33 / 32), ("gelu", 4.0, 2 + 33 / 32)])
def test_mlp_saved_bytes_per_width(mlp: str, bf16: float, mx: float) -> None:
    # SwiGLU: gate and up (16-bit) + the product (FC2's input); GeLU: its input (16-bit) + its output (FC2's input)
    from optlayout.cost.moe import mlp_saved_bytes_per_width

    model = LLAMA70.model_copy(update={"mlp": mlp})
    assert mlp_saved_bytes_per_width(model, BF16) == bf16
    assert mlp_saved_bytes_per_width(model, fp8("mxfp8")) == mx
