"""The attention kernel's softmax exponentials on the special function units (MUFU.EX2), by hand.

Figures: BF16 dense tensor FLOPs per SM per clock 4,096 (H100) and 8,192 (B200), MUFU.EX2 16 per SM per clock on
both (FlashAttention-4, Zadouri et al. 2026), doubled on Blackwell Ultra ("Inside NVIDIA Blackwell Ultra", 2025);
FlashAttention-3 (Shah et al. 2024): 3.9 TFLOPS of special functions on an H100 SXM5. One exponential per score
in the forward and one in the backward; 4 x head_dim tensor FLOPs per score in the forward (QK^T, PV), 2.5 times
as many in the backward."""

from __future__ import annotations

import pytest

from optlayout.cost import DEFAULT_PARAMS, group_links
from optlayout.cost.attention import io_aware_core_s
from optlayout.cost.step import attention_length_factor, layer_times
from optlayout.presets import gpu_preset, model_preset
from optlayout.specs import JobSpec, Layout, ModelSpec
from optlayout.topology import parse_cluster_shorthand, topology_from_cluster

# MUFU.EX2 per SM per clock / dense BF16 tensor FLOPs per SM per clock
EXP_PER_FLOP = {"h100-sxm": 16 / 4096, "b200": 16 / 8192, "gb200": 16 / 8192, "gb300": 32 / 8192}


@pytest.mark.parametrize("name", sorted(EXP_PER_FLOP))
def test_preset_exponential_rates_are_the_bf16_peak_times_the_per_sm_ratio(name: str) -> None:
    gpu = gpu_preset(name)
    assert gpu.sfu_exp_per_s == pytest.approx(gpu.peak_flops["bf16"] * EXP_PER_FLOP[name], rel=1e-3)


def test_preset_exponential_rates_match_the_published_ones() -> None:
    """FA3's 3.9 T/s for the H100 and NVIDIA's MUFU.EX2 measurement on a GB200 (4,943 G/s) at the tensor peak's
    clock; NVIDIA's 10.7 T/s for Blackwell Ultra at a higher clock (its own GB300 measurement: 10,024 G/s)."""
    assert gpu_preset("h100-sxm").sfu_exp_per_s == pytest.approx(3.9e12, rel=0.01)
    assert gpu_preset("gb200").sfu_exp_per_s == pytest.approx(4.943e12, rel=0.015)
    assert gpu_preset("gb300").sfu_exp_per_s == pytest.approx(10.024e12, rel=0.03)
    assert gpu_preset("a100-80gb").sfu_exp_per_s is None  # no sourced per-SM rate: no bound


def test_core_time_is_the_slower_unit_at_the_kernel_efficiency() -> None:
    """1e12 scores at head dim 32 on an H100: tensor 128e12 / 989.4e12 = 0.1294 s, exponentials 1e12 / 3.865e12 =
    0.2587 s (forward bound); backward tensor 2.5 x 0.1294 = 0.3234 s > 0.2587 s. At efficiency 0.5: 0.5175 s and
    0.6469 s."""
    fwd, bwd = io_aware_core_s(128e12, 1e12, 989.4e12, 3.865e12, 0.5, 2.5, 0.0)
    assert fwd == pytest.approx(0.2587 / 0.5, rel=1e-3)
    assert bwd == pytest.approx(2.5 * 0.1294 / 0.5, rel=1e-3)
    without = io_aware_core_s(128e12, 1e12, 989.4e12, None, 0.5, 2.5, 0.0)
    assert without == pytest.approx((0.1294 / 0.5, 0.3234 / 0.5), rel=1e-3)
    # a fixed cost of 0.1 s adds 0.1 s forward and 0.25 s backward
    fixed = io_aware_core_s(128e12, 1e12, 989.4e12, 3.865e12, 0.5, 2.5, 0.1)
    assert fixed == pytest.approx((fwd + 0.1, bwd + 0.25), rel=1e-9)


def _with_head_dim(head_dim: int) -> ModelSpec:
    """Llama 3.1 8B's layer with `head_dim` (32 heads, 8 KV heads)."""
    return ModelSpec.model_validate({**model_preset("llama3.1-8b").model_dump(), "head_dim": head_dim})


def _attention(name: str, head_dim: int, exp: bool) -> tuple[float, float]:
    gpu = gpu_preset(name)
    if not exp:
        gpu = gpu.model_copy(update={"sfu_exp_per_s": None})
    job, layout = JobSpec(seq_len=8192, global_batch=8), Layout(dp=8, grad_accum=1)
    topo = topology_from_cluster(parse_cluster_shorthand(f"gpu={name},gpus=8"))
    lt = layer_times(_with_head_dim(head_dim), job, layout, gpu, group_links(topo, layout), DEFAULT_PARAMS)
    return lt.attention_fwd_s, lt.attention_bwd_s


@pytest.mark.parametrize(
    ("name", "head_dim", "exp_over_tensor"),
    [
        # exponential time / tensor time per score, forward: 1 / (4 d x EXP_PER_FLOP)
        ("h100-sxm", 32, 2.0),  # binds: twice the tensor time
        ("h100-sxm", 64, 1.0),  # balanced
        ("h100-sxm", 128, 0.5),
        ("b200", 64, 2.0),  # binds: Blackwell's tensor cores doubled, its MUFU did not
        ("b200", 128, 1.0),
        ("gb300", 64, 1.0),  # Blackwell Ultra's doubled MUFU rate restores Hopper's balance
        ("gb300", 128, 0.5),
    ],
)
def test_exponentials_bind_below_the_balance_head_dim(name: str, head_dim: int, exp_over_tensor: float) -> None:
    """8,192 causal tokens, micro-batch 1, TP 1: 32 x 8,192 x 4,096 scores (times the tile factor), 4 x head_dim
    tensor FLOPs each; the forward takes the slower unit; the backward's 2.5x tensor FLOPs stay the slower."""
    assert 1 / (4 * head_dim * EXP_PER_FLOP[name]) == pytest.approx(exp_over_tensor)
    gpu, params = gpu_preset(name), DEFAULT_PARAMS
    scores = 32 * 8192 * 4096 * attention_length_factor(8192, 1, True, params)
    tensor_s = 4 * head_dim * scores / gpu.peak_flops["bf16"] / params.attention_efficiency
    exp_s = scores / gpu.sfu_exp_per_s / params.attention_efficiency
    assert exp_s / tensor_s == pytest.approx(exp_over_tensor, rel=2e-3)
    overhead = params.kernel_overhead_s
    fwd, bwd = _attention(name, head_dim, exp=True)
    assert fwd - overhead == pytest.approx(max(tensor_s, exp_s), rel=1e-9)
    assert bwd - 2.5 * overhead == pytest.approx(2.5 * tensor_s, rel=1e-9)  # 2.5 x tensor >= 2 x tensor
    fwd_without, bwd_without = _attention(name, head_dim, exp=False)
    assert (fwd - overhead) / (fwd_without - overhead) == pytest.approx(max(1.0, exp_over_tensor), rel=2e-3)
    assert bwd == bwd_without


def test_gpu_file_may_give_the_exponential_rate(tmp_path, monkeypatch) -> None:
    spec = tmp_path / "gpus.yaml"
    row = "  arch: hopper\n  memory_gib: 80\n  peak_tflops: {bf16: 989.4}\n  hbm_tbytes_per_s: 3.35\n"
    row += "  scale_up_gbytes_per_s: 450\n  source: my datasheet\n"
    spec.write_text(f"x100:\n{row}  sfu_texp_per_s: 2.0\ny100:\n{row}")
    monkeypatch.setenv("OPTLAYOUT_GPU_FILE", str(spec))
    assert gpu_preset("x100").sfu_exp_per_s == pytest.approx(2.0e12)
    assert gpu_preset("y100").sfu_exp_per_s is None
