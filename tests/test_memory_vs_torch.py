"""The activation-memory formula against what real PyTorch blocks save for backward (CPU, bf16).

The blocks and the measurement live in benchmarks/memory_vs_torch.py (saved_tensors_hooks, unique storages,
parameters and buffers excluded). "fused" blocks use autograd Functions that save exactly what Megatron's fused GPU
kernels save (RMSNorm: input + fp32 rstd; SwiGLU: gate and up; dropout: bool mask), so they test the formula's
assumptions directly; "eager" blocks are checked against the formula plus the hand-derived differences of
`eager_equivalent`.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_vs_torch.py"
_spec = importlib.util.spec_from_file_location("memory_vs_torch", _PATH)
assert _spec is not None and _spec.loader is not None
mvt = importlib.util.module_from_spec(_spec)
sys.modules["memory_vs_torch"] = mvt  # dataclasses resolve their module by name
_spec.loader.exec_module(mvt)

Case = mvt.Case

GPT = Case("gpt", b=2, s=128, h=128, heads=4, kv_heads=4, ffn=512, attn="naive", kernels="fused")
LLAMA_GQA = Case("llama", b=2, s=64, h=128, heads=4, kv_heads=2, ffn=352, attn="sdpa", kernels="fused", rotary=True)


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


def test_gpt_block_naive_dropout_is_korthikanti_eq1() -> None:
    # fused kernels, tp=1: the formula is sbh(34 + 5as/h); torch adds only LayerNorm's mean/rstd (8 B/token)
    c = GPT
    s, b, h, a = c.s, c.b, c.h, c.heads
    paper = s * b * h * (34 + 5 * a * s / h)
    assert mvt.formula_bytes(c) == pytest.approx(paper)
    measured = mvt.measure(c)
    assert measured == pytest.approx(paper, rel=0.05)
    assert measured == mvt.eager_equivalent(c)[0]


def test_gpt_block_selective_drops_the_attention_term() -> None:
    c = replace(GPT, recompute="selective")
    measured = mvt.measure(c)
    assert measured == pytest.approx(34 * c.s * c.b * c.h, rel=0.05)
    assert measured == mvt.eager_equivalent(c)[0]


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_full_recompute_keeps_only_the_block_input(kind: str) -> None:
    c = replace(GPT if kind == "gpt" else LLAMA_GQA, recompute="full", kernels="eager")
    assert mvt.measure(c) == 2 * c.s * c.b * c.h == mvt.formula_bytes(c)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_llama_block_flash_gqa_within_5pct(recompute: str) -> None:
    c = replace(LLAMA_GQA, recompute=recompute)
    assert mvt.sdpa_path(c) == "flash"  # the CPU flash kernel: Q, K, V, O and a fp32 log-sum-exp, no s x s tensor
    measured = mvt.measure(c)
    assert measured == pytest.approx(mvt.formula_bytes(c), rel=0.05)
    assert measured == mvt.eager_equivalent(c, "flash")[0]


def test_llama_block_naive_gqa_keeps_repeated_kv() -> None:
    # the unfused core's matmuls save K and V repeated to every query head
    c = replace(LLAMA_GQA, attn="naive")
    measured = mvt.measure(c)
    assert measured == pytest.approx(mvt.formula_bytes(c), rel=0.05)
    assert measured == mvt.eager_equivalent(c)[0]


@pytest.mark.parametrize(
    "case",
    [
        replace(GPT, kernels="eager"),  # bf16 F.dropout masks on the CPU
        replace(GPT, kernels="eager", attn="sdpa"),  # SDPA with dropout: the CPU math path, fp32
        replace(LLAMA_GQA, kernels="eager"),  # F.rms_norm in fp32, unfused SwiGLU
    ],
    ids=["gpt-eager-dropout", "gpt-sdpa-math", "llama-eager"],
)
def test_eager_differences_are_fully_accounted(case) -> None:
    sdpa = mvt.sdpa_path(case) if case.attn == "sdpa" else None
    expected, diffs = mvt.eager_equivalent(case, sdpa)
    measured = mvt.measure(case)
    assert measured == expected
    assert abs(measured / mvt.formula_bytes(case) - 1) > 0.05  # these differences are real, not rounding
    assert all(what in mvt.LEGEND for what, _ in diffs)


def test_fused_stand_ins_have_the_right_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    ours = (mvt.FusedRMSNormFn.apply(x, w, 1e-5), mvt.FusedSwiGLUFn.apply(x, u))
    ref = (torch.nn.functional.rms_norm(x, (16,), w, 1e-5), torch.nn.functional.silu(x) * u)
    for a, b, inputs in zip(ours, ref, ((x, w), (x, u)), strict=True):
        g = torch.randn_like(a)
        torch.testing.assert_close(a, b)
        for ga, gb in zip(torch.autograd.grad(a, inputs, g), torch.autograd.grad(b, inputs, g), strict=True):
            torch.testing.assert_close(ga, gb)
