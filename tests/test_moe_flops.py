"""MoE FLOPs per token (Megatron's count) against the vendors' published TFLOP/s, and by hand.

`fixtures/runs/megatron_bridge_moe.jsonl` holds every Megatron-Bridge record of calibration_runs_moe.jsonl
(Qwen3-30B-A3B, GPT-OSS 120B) with `measured.model_tflops_per_gpu` added: the "Model TFLOP / sec / GPU" that
Megatron-Bridge prints beside the tokens/s (docs/performance-summary.md and performance-summary-archive.md
@067f987d). Its FLOP counter is training/utils/flop_utils.py of the same repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optlayout.cost import flops
from optlayout.errors import OptlayoutError
from optlayout.presets import model_preset
from optlayout.runs.records import RunRecord, read_runs
from optlayout.specs import ModelSpec, Recompute

RUNS = Path(__file__).parent / "fixtures" / "runs"
BRIDGE = read_runs(RUNS / "megatron_bridge_moe.jsonl")


def release(record: RunRecord) -> tuple[int, ...]:
    """The container release from the record id (`mb-26.04.01-...` -> (26, 4, 1))."""
    return tuple(int(x) for x in record.id.split("-")[1].split("."))


def implied_tflops(record: RunRecord, model: ModelSpec | None = None) -> float:
    """The record's measured tokens/s/GPU times our FLOPs per token, in TFLOP/s."""
    per_token = flops.model_flops_per_token(model or record.model, record.job.seq_len)
    return record.measured.tokens_per_s_per_gpu * per_token / 1e12


def published_tflops(record: RunRecord) -> float:
    return record.measured.model_dump()["model_tflops_per_gpu"]


# Two Qwen3 rows whose own tokens/s and TFLOP/s disagree by more than the rest (their tokens/s are multiples of
# 256, rounded in the table): the miss is reported, not bent.
QWEN_GAPS = {
    "mb-26.06.01-pretrain-gb200-qwen330ba3b-mxfp8-8g-main": 0.0057,
    "mb-26.04.01-pretrain-b200-qwen330ba3b-mxfp8-8g-main": 0.0086,
}
QWEN = [r for r in BRIDGE if r.model.name == "Qwen3-30B-A3B"]
GPT_OSS_NOW = [r for r in BRIDGE if r.model.name == "GPT-OSS 120B" and release(r) >= (26, 6)]
GPT_OSS_BEFORE = [r for r in BRIDGE if r.model.name == "GPT-OSS 120B" and release(r) < (26, 6)]


def test_the_fixture_is_every_megatron_bridge_record() -> None:
    assert (len(QWEN), len(GPT_OSS_NOW), len(GPT_OSS_BEFORE)) == (31, 6, 20)
    assert all(r.model.moe is not None and r.job.moe_routing == "balanced" for r in BRIDGE)


@pytest.mark.parametrize("record", QWEN + GPT_OSS_NOW, ids=lambda r: r.id)
def test_flops_reproduce_megatron_bridge_tflops(record: RunRecord) -> None:
    ratio = implied_tflops(record) / published_tflops(record) - 1
    if record.id in QWEN_GAPS:
        assert ratio == pytest.approx(QWEN_GAPS[record.id], abs=5e-4)
    else:
        assert abs(ratio) < 0.005, ratio


@pytest.mark.parametrize("record", GPT_OSS_BEFORE, ids=lambda r: r.id)
def test_older_releases_counted_gpt_oss_differently(record: RunRecord) -> None:
    """Up to 26.04.01 the published GPT-OSS TFLOP/s imply 27.1-27.2 GFLOP/token at 4096 tokens, 17% under the
    current count. Rebuilt here, that older count reproduces them: flop_utils.py before commit baa0259b gave 3
    expert matrices only to SiLU gates (GPT-OSS gates with a clamped quick-GELU: 2 counted), and every layer is
    counted as full attention (no window applied)."""
    model = record.model
    full_attention = ModelSpec(**(model.model_dump() | {"attention": {"sinks": True}}))
    one_matrix_of_k_experts = 6.0 * model.hidden * model.moe.expert_ffn * model.moe.top_k * model.moe_layer_count
    older_per_token = flops.model_flops_per_token(full_attention, record.job.seq_len) - one_matrix_of_k_experts
    older = record.measured.tokens_per_s_per_gpu * older_per_token / 1e12
    assert abs(older / published_tflops(record) - 1) < 0.005
    assert implied_tflops(record) / published_tflops(record) - 1 > 0.10  # the current count does not (11-17%)


def test_grok1_matches_dgxc_model_flops() -> None:
    # dgxc-benchmarking grok1/README.md @b8f2b1a2 (moe.md 5.1): 4.27E+15 model FLOPs per sample of 8192 tokens, GBS=1
    grok = next(r for r in read_runs(RUNS / "moe_runs.jsonl") if r.model.layers == 64)
    assert flops.model_flops_per_token(grok.model, 8192) == pytest.approx(4.27e15 / 8192, rel=0.005)


def test_mla_and_mtp_match_the_reference_derivation() -> None:
    # moe.md 5.1/5.2 (Megatron's formula in its Appendix A script): GFLOP per token at 4096 tokens
    v3 = model_preset("deepseek-v3")
    no_mtp = ModelSpec(**(v3.model_dump() | {"mtp_layers": 0}))
    assert flops.model_flops_per_token(v3, 4096) / 1e9 == pytest.approx(260.0, abs=0.05)
    assert flops.model_flops_per_token(no_mtp, 4096) / 1e9 == pytest.approx(249.8, abs=0.05)
    assert flops.model_flops_per_token(model_preset("kimi-k2"), 4096) / 1e9 == pytest.approx(204.5, abs=0.05)
    assert flops.model_flops_per_token(model_preset("qwen3-235b-a22b"), 4096) / 1e9 == pytest.approx(148.0, abs=0.05)
    # one MLA layer: 1.12 GFLOP/token of projections (6 x 187.1M) and 0.50 of core attention at s = 4096
    per_layer_core = flops.attention_flops_per_token(no_mtp, 4096) / no_mtp.layers
    assert per_layer_core / 1e9 == pytest.approx(0.50, abs=0.005)
    assert 6 * v3.attention_matmul_param_count / 1e9 == pytest.approx(1.12, abs=0.005)


def test_sliding_window_context_by_hand() -> None:
    # causal window of 128 keys over 4096 tokens: the first 127 queries see 1..127 keys, the rest 128
    exact = (sum(range(1, 129)) + (4096 - 128) * 128) / 4096
    assert flops.sliding_window_context(128, 4096) == pytest.approx(exact)
    assert flops.sliding_window_context(8192, 4096) == 2048  # a window past the sequence: plain causal
    gpt = model_preset("gpt-oss-120b")
    assert sum(gpt.sliding_window_flags) == 18
    widths = gpt.q_width + gpt.value_width
    expected = 6 * 18 * 4096 / 2 * widths + 6 * 18 * exact * widths
    assert flops.attention_flops_per_token(gpt, 4096) == pytest.approx(expected)
    with pytest.raises(OptlayoutError, match="causal"):
        flops.attention_flops_per_token(gpt, 4096, causal=False)


def test_moe_flops_count_top_k_and_shared_experts_not_the_router() -> None:
    moe = {"experts": 4, "top_k": 2, "expert_ffn": 3, "shared_experts": 1, "shared_expert_ffn": 5}
    m = ModelSpec(layers=2, hidden=8, ffn=16, heads=2, kv_heads=1, vocab=10, moe=moe)
    per_layer = 8 * 8 * 2 + 8 * 4 * 2 + 2 * 3 * 8 * 3 + 3 * 8 * 5  # attention, 2 of 4 experts, the shared one
    attention = 2 * 6 * 64 / 2 * (8 + 8)  # 2 layers x 3 passes x 2 FLOPs x causal context 32 x (score + value)
    assert flops.model_flops_per_token(m, 64) == 6 * (2 * per_layer + 10 * 8) + attention
    recompute = flops.hardware_flops_per_token(m, 64, Recompute.full)
    assert recompute == flops.model_flops_per_token(m, 64) + 2 * 2 * per_layer + attention / 3


def test_mfu_of_a_published_moe_run() -> None:
    # Megatron-Bridge 26.06, Qwen3-30B-A3B on 16 H100 FP8: 8826 tokens/s/GPU and 203 TFLOP/s/GPU
    per_token = flops.model_flops_per_token(model_preset("qwen3-30b-a3b"), 4096)
    assert 8826 * per_token / 1e12 == pytest.approx(203, abs=0.5)
    assert flops.mfu(8826, per_token, 1978.9e12) == pytest.approx(0.1026, abs=5e-5)
