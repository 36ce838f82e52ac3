"""Selective recomputation's module sets (Megatron-Core `--recompute-granularity selective --recompute-modules`):
the layout's text form and rules, what each module frees from the saved activations and what its recomputation
costs, by hand for one shape per module; the space, run records and launchers."""

from __future__ import annotations

import pytest

from optlayout.cost import DEFAULT_PARAMS, group_links
from optlayout.cost.memory import activation_bytes_per_layer
from optlayout.cost.step import gemm_s, layer_times, stage_times
from optlayout.errors import OptlayoutError
from optlayout.layout import layout_problems, parse_layout
from optlayout.model import MoeSpec
from optlayout.presets import gpu_preset, model_preset
from optlayout.specs import JobSpec, Layout, ModelSpec
from optlayout.topology import parse_cluster_shorthand, topology_from_cluster

DENSE = ModelSpec(layers=8, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000, mlp="gelu")
MOE = ModelSpec(layers=4, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000, mlp="swiglu",
                moe=MoeSpec(experts=8, top_k=2, expert_ffn=512, shared_experts=1))  # fmt: skip
JOB = JobSpec(seq_len=1024, global_batch=8, moe_routing="balanced")
H100 = gpu_preset("h100-sxm")
TOKENS, H = 1024, 1024  # one sequence per micro-batch, no TP or CP
HBM = H100.hbm_bandwidth_Bps * DEFAULT_PARAMS.hbm_efficiency
LAUNCH = DEFAULT_PARAMS.kernel_overhead_s


def _layout(text: str, **extra: object) -> Layout:
    return parse_layout(text).model_copy(update=extra)


def _acts(model: ModelSpec, rc: str, layout: str = "tp=1", moe: bool = False) -> float:
    kind = next(k for k in model.layer_kinds if k.moe == moe)
    return activation_bytes_per_layer(model, JOB, parse_layout(f"{layout},recompute={rc}"), kind, DEFAULT_PARAMS)


def _backward(model: ModelSpec, rc: str, moe: bool = False) -> tuple[float, float, float]:
    """(backward compute, exposed TP, exposed EP) seconds of one layer, one micro-batch, on one GPU."""
    layout = parse_layout(f"tp=1,recompute={rc}")
    kind = next(k for k in model.layer_kinds if k.moe == moe)
    links = group_links(topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=1")), layout)
    lt = layer_times(model, JOB, layout, H100, links, DEFAULT_PARAMS, kind)
    st = stage_times(model, JOB, layout, H100, DEFAULT_PARAMS, ((lt, 1),), last=False, overlapped=False)
    return st.compute_bwd_s, st.tp_exposed_s, st.ep_exposed_s


# --- the layout ---------------------------------------------------------------------------------------------------


def test_text_form_round_trips_and_plain_selective_keeps_its_meaning() -> None:
    lay = parse_layout("tp=2,sp,recompute=selective:moe_act+layernorm")
    assert [m.value for m in lay.recompute_modules or ()] == ["layernorm", "moe_act"]  # sorted
    assert lay.short().endswith("recompute=selective:layernorm+moe_act,sp")
    assert parse_layout(lay.short()) == lay
    assert parse_layout("recompute=selective:layernorm") == parse_layout("rm=layernorm,recompute=selective")
    # Megatron's default set is plain selective: the same layout, the same text as before
    assert parse_layout("recompute=selective:core_attn") == parse_layout("recompute=selective")
    assert parse_layout("recompute=selective").short().endswith("recompute=selective")
    assert Layout(recompute="selective", recompute_modules=["core_attn"]).recompute_modules is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recompute=full,rm=mlp", "recompute_modules needs recompute=selective"),
        ("recompute=selective:attn", "unknown module 'attn'"),
        ("recompute=selective:mlp,rm=mlp", "recompute modules given twice"),
    ],
)
def test_bad_module_text_is_one_line_naming_the_rule(text: str, message: str) -> None:
    with pytest.raises(OptlayoutError, match=message):
        parse_layout(text)


def test_model_rules_are_megatrons() -> None:
    job = JobSpec(seq_len=1024, global_batch=1)
    moe_on_dense = layout_problems(DENSE, job, parse_layout("ga=1,recompute=selective:moe_act+mlp"), 1)
    assert moe_on_dense == ["recompute_modules moe_act needs a mixture-of-experts model"]
    mla = layout_problems(DENSE, job, parse_layout("ga=1,recompute=selective:mla_up_proj"), 1)
    assert mla == ["recompute_modules mla_up_proj needs multi-latent attention (Megatron: only with MLA)"]
    no_shared = MOE.model_copy(update={"moe": MOE.moe.model_copy(update={"shared_experts": 0})})  # type: ignore[union-attr]
    assert layout_problems(no_shared, job, parse_layout("ga=1,recompute=selective:shared_experts"), 1) == [
        "recompute_modules shared_experts: the model has no shared experts"
    ]
    assert layout_problems(MOE, job, parse_layout("ga=1,recompute=selective:core_attn+moe_act+layernorm"), 1) == []


# --- memory: what each module frees, per layer, by hand ------------------------------------------------------------


def test_layernorm_frees_the_two_norm_outputs() -> None:
    # the input norm's output (QKV's input) and the pre-MLP norm's output (the MLP's input): 2 x 2 B x s x h
    freed = _acts(DENSE, "none") - _acts(DENSE, "selective:layernorm")
    assert freed == 2 * 2 * TOKENS * H
    # sequence parallel shards them over TP
    sp = _acts(DENSE, "none", "tp=2,sp") - _acts(DENSE, "selective:layernorm", "tp=2,sp")
    assert sp == 2 * 2 * TOKENS * H / 2


def test_mlp_frees_the_dense_mlps_internals_and_core_attn_the_cores() -> None:
    # GeLU MLP: fc1's output and the activation's output, 2 x 2 B x s x 4h (the MLP's input is the norm's output)
    assert _acts(DENSE, "none") - _acts(DENSE, "selective:mlp") == 2 * 2 * TOKENS * 4096
    # flash attention's saved internals: an fp32 log-sum-exp per query and head
    assert _acts(DENSE, "none") - _acts(DENSE, "selective") == 4 * 16 * TOKENS
    both = _acts(DENSE, "none") - _acts(DENSE, "selective:core_attn+mlp+layernorm")
    assert both == 2 * 2 * TOKENS * 4096 + 4 * 16 * TOKENS + 2 * 2 * TOKENS * H
    # on an MoE layer `mlp` re-runs nothing (Megatron: a no-op on MoE layers)
    assert _acts(MOE, "selective:mlp+core_attn", moe=True) == _acts(MOE, "selective", moe=True)


def test_moe_modules_free_what_they_rerun() -> None:
    rows = TOKENS * 2  # top-2, balanced routing, ep = etp = 1
    # moe_act: the routed activation's output (fc2's input), 2 B x rows x expert width
    assert _acts(MOE, "none", moe=True) - _acts(MOE, "selective:moe_act", moe=True) == 2 * rows * 512
    # shared_experts: one shared SwiGLU expert of width 512: gate, up and product, 3 x 2 B x s x 512
    assert _acts(MOE, "none", moe=True) - _acts(MOE, "selective:shared_experts", moe=True) == 3 * 2 * TOKENS * 512
    # moe: the whole block but its input; the router's outputs (2 B probabilities + 8 B routing map per expert),
    # the permuted tokens, the experts' internals and the combine output
    router = TOKENS * 8 * (2 + 8)
    routed = rows * (2 * H + 2 * 512 + 2 * 512 * 2)
    combine = 2 * rows * H
    freed = _acts(MOE, "none", moe=True) - _acts(MOE, "selective:moe", moe=True)
    assert freed == 3 * 2 * TOKENS * 512 + router + routed + combine


def test_mla_up_proj_frees_the_up_projections_outputs() -> None:
    # DeepSeek-V3's MLA: 128 heads, query/key width 128 + 64 (RoPE) per head, value 128: Q and K of 128 x 192,
    # V of 128 x 128, 2 B each per token; the latents stay
    v3 = model_preset("deepseek-v3")
    freed = _acts(v3, "none", moe=True) - _acts(v3, "selective:mla_up_proj", moe=True)
    assert freed == 2 * TOKENS * (2 * 128 * 192 + 128 * 128)


# --- step time: what each module's recomputation repeats, by hand --------------------------------------------------


def test_layernorm_recompute_rereads_and_rewrites_two_norms() -> None:
    bwd, tp, _ = _backward(DENSE, "selective:layernorm")
    base, base_tp, _ = _backward(DENSE, "none")
    assert bwd - base == pytest.approx(2 * (2 + 2) * TOKENS * H / HBM + 2 * LAUNCH, rel=1e-12)
    assert tp == base_tp


def test_mlp_recompute_repeats_its_gemms_activation_and_collective() -> None:
    bwd, _, _ = _backward(DENSE, "selective:mlp")
    base, _, _ = _backward(DENSE, "none")
    rate = H100.peak_flops_for("bf16") * DEFAULT_PARAMS.gemm_peak_fraction("bf16")
    gemms = gemm_s(TOKENS, 4096, H, rate, H100, DEFAULT_PARAMS) + gemm_s(TOKENS, H, 4096, rate, H100, DEFAULT_PARAMS)
    activation = TOKENS * 4096 * DEFAULT_PARAMS.elementwise_bytes_per_token_ffn / HBM + LAUNCH
    assert bwd - base == pytest.approx(gemms + activation, rel=1e-12)
    # at least the MLP's forward FLOPs (2 x s x 2 x h x 4h) at the GPU's bf16 peak
    assert bwd - base > 2 * TOKENS * 2 * H * 4096 / H100.peak_flops_for("bf16")


def test_selective_default_repeats_the_attention_core_as_before() -> None:
    layout = parse_layout("tp=1,recompute=selective")
    links = group_links(topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=1")), layout)
    lt = layer_times(DENSE, JOB, layout, H100, links, DEFAULT_PARAMS)
    bwd, _, _ = _backward(DENSE, "selective")
    assert bwd - _backward(DENSE, "none")[0] == pytest.approx(lt.attention_fwd_s, rel=1e-12)


def test_moe_act_recompute_repeats_the_activation_alone() -> None:
    rows, width = TOKENS * 2, 512
    bwd = _backward(MOE, "selective:moe_act", moe=True)[0] - _backward(MOE, "none", moe=True)[0]
    assert bwd == pytest.approx(DEFAULT_PARAMS.elementwise_bytes_per_token_ffn * rows * width / HBM + LAUNCH, rel=1e-12)


def test_moe_recompute_repeats_the_block_and_its_token_exchange() -> None:
    layout = parse_layout("tp=1,recompute=selective:moe")
    links = group_links(topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=1")), layout)
    lt = layer_times(MOE, JOB, layout, H100, links, DEFAULT_PARAMS, next(k for k in MOE.layer_kinds if k.moe))
    moe_fwd = next(m for m in lt.modules if m.module == "moe")
    shared = next(m for m in lt.modules if m.module == "shared_experts")
    # the block's forward holds the shared experts' and more (router, routed GEMMs, permutation)
    assert moe_fwd.compute_s > shared.compute_s > 0
    bwd = _backward(MOE, "selective:moe", moe=True)[0] - _backward(MOE, "none", moe=True)[0]
    assert bwd == pytest.approx(moe_fwd.compute_s, rel=1e-12)
    # less than recomputing the whole layer
    full = _backward(MOE, "full", moe=True)[0] - _backward(MOE, "none", moe=True)[0]
    assert bwd < full


def test_every_module_set_trades_memory_for_time_against_full() -> None:
    """Each module set keeps more than full recomputation and less than none, and costs less time than full."""
    for rc in ("selective:layernorm", "selective:mlp", "selective:core_attn+layernorm+mlp"):
        assert _acts(DENSE, "full") < _acts(DENSE, rc) < _acts(DENSE, "none")
        assert _backward(DENSE, "none")[0] < _backward(DENSE, rc)[0] < _backward(DENSE, "full")[0]
    for rc in ("selective:moe_act", "selective:layernorm+moe_act", "selective:moe", "selective:shared_experts"):
        assert _acts(MOE, "full", moe=True) < _acts(MOE, rc, moe=True) < _acts(MOE, "none", moe=True)
        none, mine, full = (_backward(MOE, r, moe=True)[0] for r in ("none", rc, "full"))
        assert none < mine < full


# --- the space: a pinned module set, searched exactly ------------------------------------------------------------


def test_a_pinned_module_set_is_searched_and_equals_the_oracle() -> None:
    from optlayout.cost import usable_memory_bytes
    from optlayout.planning import solve
    from optlayout.solver.candidates import CostTable
    from optlayout.solver.cpsat import Limits
    from optlayout.solver.oracle import oracle_ranking
    from optlayout.solver.space import space_options

    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=8"))
    job = JobSpec(seq_len=2048, global_batch=16)
    pins = {"recompute_modules": "layernorm+mlp"}
    plan = solve(DENSE, topo, job, top=3, pins=pins, max_micro_batch=4, max_vp=2, max_cp=2)
    options = space_options(pins, max_micro_batch=4, max_vp=2, max_cp=2)
    table = CostTable(DENSE, job, topo.gpu, topo)
    truth = oracle_ranking(DENSE, job, 8, topo.domain_size, table, options, Limits(usable_memory_bytes(
        topo.gpu.memory_bytes, job)))  # fmt: skip
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:3]] and truth
    assert all(p.layout.short().count("recompute=selective:layernorm+mlp") == 1 for p in plan.layouts)
    default = solve(DENSE, topo, job, pins={"recompute_modules": "core_attn"}, max_micro_batch=4, max_vp=2, max_cp=2)
    assert default.layouts[0].layout.recompute == "selective" and default.layouts[0].layout.recompute_modules is None
    with pytest.raises(OptlayoutError, match="pin: recompute_modules moe_act needs a mixture-of-experts model"):
        solve(DENSE, topo, job, pins={"recompute_modules": "moe_act"})
    with pytest.raises(OptlayoutError, match="recompute_modules needs recompute=selective"):
        solve(DENSE, topo, job, pins={"recompute_modules": "mlp", "recompute": "full"})


# --- run records ----------------------------------------------------------------------------------------------------


def _bridge_records() -> dict[str, object]:
    from pathlib import Path

    from optlayout.runs.records import read_runs

    path = Path(__file__).parent / "fixtures" / "runs" / "megatron_bridge_moe.jsonl"  # copied from shared/data
    return {r.id: r for r in read_runs(path)}


def test_a_record_states_its_modules_and_a_bad_one_names_the_field(tmp_path) -> None:
    import json

    from optlayout.runs.records import read_runs

    raw = json.loads(next(iter(_bridge_records().values())).model_dump_json())  # type: ignore[attr-defined]
    raw["layout"] |= {"recompute": "selective", "recompute_modules": ["moe_act", "layernorm"]}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(raw) + "\n")
    record = read_runs(path)[0]
    assert [str(m) for m in record.layout.known()["recompute_modules"]] == ["layernorm", "moe_act"]
    assert "recompute_modules" not in record.unknown_layout_fields()
    raw["layout"]["recompute_modules"] = ["attn"]
    path.write_text(json.dumps(raw) + "\n")
    with pytest.raises(OptlayoutError, match=r"runs.jsonl line 1: layout.recompute_modules: .*unknown module 'attn'"):
        read_runs(path)
    raw["layout"] |= {"recompute": "full", "recompute_modules": ["mlp"]}
    path.write_text(json.dumps(raw) + "\n")
    with pytest.raises(OptlayoutError, match="recompute_modules needs recompute: selective"):
        read_runs(path)


def test_bridge_gpt_oss_bf16_recipes_fill_their_recompute_modules() -> None:
    # Megatron-Bridge's GPT-OSS 120B recipes: layernorm + moe_act on GB200, B200 and H100 in BF16; none on GB300,
    # none stated by the FP8-MX and Qwen3 recipes (runs.records.RECIPE_FILL names the lines)
    records = _bridge_records()
    filled = {i for i, r in records.items() if "recompute" in r.recipe_fills()}  # type: ignore[attr-defined]
    assert filled == {i for i in records if "gptoss120b-bf16" in i and "-gb300-" not in i}
    assert len(filled) == 15
    h100 = records["mb-26.04-pretrain-h100-gptoss120b-bf16-64g-main"]
    assert "recompute" not in h100.unknown_layout_fields()  # type: ignore[attr-defined]
    from optlayout.runs.predict import predict_run

    predicted = predict_run(h100)  # type: ignore[arg-type]
    assert predicted.layout.short().endswith("recompute=selective:layernorm+moe_act")
    assert "layernorm" in predicted.assumed["layout.recompute"]["why"] and "recompute" not in predicted.filled_fields
