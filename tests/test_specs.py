"""Specs and presets: parameter counts derived from shapes against published figures; validation names fields."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from optlayout.errors import OptlayoutError
from optlayout.presets import (
    gpu_names,
    gpu_preset,
    model_from_hf_config,
    model_names,
    model_preset,
    published_param_count,
)
from optlayout.specs import JobSpec, Layout, ModelSpec

EXACT_PUBLISHED = [
    n for n in model_names()
    if published_param_count(n)[0] is not None and not published_param_count(n)[1] and model_preset(n).moe is None
]  # fmt: skip  # mixture-of-experts presets: test_moe_model.py, with what each published count covers


@pytest.mark.parametrize("name", EXACT_PUBLISHED)
def test_preset_param_counts_within_half_percent_of_published(name: str) -> None:
    # Presets whose label is rounded (Megatron 1.7B/3.6B, MPT-7B) are checked by formula below instead.
    assert model_preset(name).param_count == pytest.approx(published_param_count(name)[0], rel=0.005)


def test_llama31_counts_match_meta() -> None:
    # Meta's published sizes: 8.03B, 70.6B, 405.9B (llama-models sku_list.py)
    assert model_preset("llama3.1-8b").param_count / 1e9 == pytest.approx(8.03, abs=0.005)
    assert model_preset("llama3.1-70b").param_count / 1e9 == pytest.approx(70.6, rel=0.002)
    assert model_preset("llama3.1-405b").param_count / 1e9 == pytest.approx(405.9, rel=0.002)


@pytest.mark.parametrize("name", [n for n in model_names() if n.startswith("megatron-gpt")])
def test_megatron_series_follow_narayanan_formula(name: str) -> None:
    # Narayanan et al. 2021 eq.: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), V = 51200, s = 2048
    m = model_preset(name)
    n_layers, h = m.layers, m.hidden
    formula = 12 * n_layers * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * n_layers * h))
    assert m.param_count == pytest.approx(formula, rel=1e-4)


def test_gpu_presets_have_sources_and_dense_peaks() -> None:
    assert set(gpu_names()) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "gb200", "gb300", "mi300x"}
    h100 = gpu_preset("h100-sxm")
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.peak_flops["fp8"] == pytest.approx(2 * 989.4e12, rel=1e-3)
    assert h100.memory_bytes == 80 * 2**30
    for name in gpu_names():
        assert gpu_preset(name).source


def test_unknown_gpu_lists_valid_names() -> None:
    with pytest.raises(OptlayoutError, match="h100-sxm"):
        gpu_preset("h1000")


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(OptlayoutError, match=r"llama3\.1-70b"):
        model_preset("llama-9")


def test_heads_not_divisible_by_kv_heads_names_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="kv_heads"):
        ModelSpec(layers=2, hidden=64, ffn=256, heads=6, kv_heads=4, vocab=100)


def test_zero_or_negative_sizes_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="layers"):
        ModelSpec(layers=0, hidden=64, ffn=256, heads=4, kv_heads=4, vocab=100)
    with pytest.raises(pydantic.ValidationError, match="seq_len"):
        JobSpec(seq_len=-1, global_batch=8)


def test_layout_rules() -> None:
    with pytest.raises(pydantic.ValidationError, match="sequence_parallel"):
        Layout(tp=1, sequence_parallel=True)
    lay = Layout(tp=8, pp=4, dp=8, micro_batch=2, grad_accum=16)
    assert lay.gpus == 256 and lay.global_batch == 256


def test_hf_config_v4_and_v5_spellings(tmp_path) -> None:
    v4 = {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "rope_theta": 500000.0,
    }  # fmt: skip
    v5 = {k: v for k, v in v4.items() if k not in ("torch_dtype", "rope_theta")}
    v5 |= {"dtype": "bfloat16", "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3"}}
    nested = {"model_type": "llava", "text_config": v5}
    for cfg in (v4, v5, nested):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(cfg))
        m = model_from_hf_config(path)
        assert m.param_count == model_preset("llama3.1-8b").param_count


def test_hf_config_errors_name_the_field(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(OptlayoutError, match="missing field 'num_attention_heads'"):
        model_from_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(OptlayoutError, match="not valid JSON"):
        model_from_hf_config(path)


def test_added_gpu_presets_carry_datasheet_figures() -> None:
    # V100 has FP16 tensor cores only (125 TFLOP/s); an MI250X preset is one GCD, half the package's 383 TFLOP/s.
    v100 = gpu_preset("v100-sxm2-32gb")
    assert v100.peak_flops == {"fp16": 125e12} and v100.memory_bytes == 32 * 2**30
    with pytest.raises(OptlayoutError, match="v100-sxm2-32gb has no dense bf16 peak"):
        v100.peak_flops_for("bf16")
    assert gpu_preset("mi250x").peak_flops["bf16"] == pytest.approx(383e12 / 2)
    assert gpu_preset("h800").peak_flops == gpu_preset("h100-sxm").peak_flops  # same die, fewer NVLinks
    assert gpu_preset("h800").scale_up_bandwidth_Bps == 200e9 < gpu_preset("h100-sxm").scale_up_bandwidth_Bps
    assert gpu_preset("h20").peak_flops["bf16"] == pytest.approx(148e12)
    assert gpu_preset("l40s").peak_flops["fp8"] == pytest.approx(733e12)


def test_unknown_gpu_says_how_to_describe_one(tmp_path, monkeypatch) -> None:
    with pytest.raises(OptlayoutError) as info:
        gpu_preset("rtx6000")
    message = str(info.value)
    assert "OPTLAYOUT_GPU_FILE" in message and "memory_gib" in message and "\n" not in message
    spec = tmp_path / "gpus.yaml"
    spec.write_text(
        "rtx6000:\n  arch: ada\n  memory_gib: 48\n  peak_tflops: {bf16: 364.25}\n  hbm_tbytes_per_s: 0.96\n"
        "  scale_up_gbytes_per_s: 32\n  source: my datasheet\n"
    )
    monkeypatch.setenv("OPTLAYOUT_GPU_FILE", str(spec))
    assert gpu_preset("rtx6000").peak_flops["bf16"] == pytest.approx(364.25e12)
    spec.write_text("rtx6000:\n  arch: ada\n")
    with pytest.raises(OptlayoutError, match="'rtx6000' lacks memory_gib"):
        gpu_preset("rtx6000")


def test_a_gpu_file_entry_named_as_a_shipped_preset_replaces_it_and_says_so(cli, tmp_path, monkeypatch) -> None:
    row = "  arch: hopper\n  memory_gib: 8\n  peak_tflops: {bf16: 10}\n  hbm_tbytes_per_s: 1\n"
    row += "  scale_up_gbytes_per_s: 10\n  source: my datasheet\n"
    spec = tmp_path / "gpus.yaml"
    spec.write_text(f"H100-SXM:\n{row}z100:\n{row}")
    monkeypatch.setenv("OPTLAYOUT_GPU_FILE", str(spec))
    assert gpu_preset("h100-sxm").memory_bytes == 8 * 2**30  # the file's figures, as documented
    out = cli("mfu", "--params", "7e9", "--tokens-per-s", "100", "--gpu", "h100-sxm")
    assert out.returncode == 0 and "of 10.0" in out.stdout, out.stderr
    note = " ".join(out.stderr.split())
    assert note.startswith("note: OPTLAYOUT_GPU_FILE") and "replaces the shipped GPU preset 'h100-sxm'" in note
    assert out.stderr.count("note:") == 1
    spec.write_text(f"z100:\n{row}")
    quiet = cli("mfu", "--params", "7e9", "--tokens-per-s", "100", "--gpu", "z100")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_hf_config_rope_and_norm_fields() -> None:
    cfg = {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    }  # fmt: skip
    m = model_from_hf_config(cfg)
    assert m.rope_theta == 500000 and m.rope_scaling == model_preset("llama3.1-8b").rope_scaling
    v5 = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": 500000.0, **cfg["rope_scaling"]}
    assert model_from_hf_config(v5).rope_scaling == m.rope_scaling
    with pytest.raises(OptlayoutError, match="rope_scaling type 'yarn' is not supported"):
        model_from_hf_config({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_the_norm_is_given_or_follows_the_biases_and_megatron_gets_it() -> None:
    from optlayout.emit.megatron import megatron_args
    from optlayout.layout import parse_layout

    job, layout = JobSpec(seq_len=4096, global_batch=8), parse_layout("tp=1,pp=1,dp=8,ga=1")
    nemotron, llama, gpt3 = model_preset("nemotron4-15b"), model_preset("llama3.1-8b"), model_preset("gpt3-175b")
    assert (nemotron.norm_kind, llama.norm_kind, gpt3.norm_kind) == ("layernorm", "rmsnorm", "layernorm")
    flags = {m.name: megatron_args(m, job, layout) for m in (nemotron, llama)}
    assert "RMSNorm" not in flags[nemotron.name] and "--disable-bias-linear" in flags[nemotron.name]  # LayerNorm
    assert flags[llama.name][flags[llama.name].index("--normalization") + 1] == "RMSNorm"
    gpt_oss = model_preset("gpt-oss-120b")  # biases on its linear layers, RMSNorm without a bias
    assert gpt_oss.norm_kind == "rmsnorm" and gpt_oss.norm_param_count == 2880
    assert gpt3.norm_param_count == 2 * 12288  # LayerNorm with a bias
    assert model_from_hf_config(Path(__file__).parent / "fixtures" / "hf" / "llama3.1-8b.json").norm == "rmsnorm"
