"""The MoE terms of the cost model against figures derived by hand or published: ModelZoo's activation estimate,
Megatron's expert memory accounting, the all-to-all volumes of moe.md 5.3, tokens per local expert, MLA's widths
and projection sizes, the sliding-window context, MTP on the last stage."""

from __future__ import annotations

import pytest

from optlayout.cost import DEFAULT_PARAMS, evaluate, group_links
from optlayout.cost.attention import LayerKind, attention_gemm_shapes, context, core_widths
from optlayout.cost.memory import activation_bytes_per_layer, memory_per_gpu, stage_params_per_stage
from optlayout.cost.moe import distinct_ranks, moe_activation_bytes, routed_times
from optlayout.cost.step import gemm_s as gemm_s_of
from optlayout.cost.step import layer_times
from optlayout.layout import parse_layout
from optlayout.presets import gpu_preset, model_preset
from optlayout.specs import ClusterSpec, JobSpec
from optlayout.topology import topology_from_cluster

H100 = gpu_preset("h100-sxm")
BALANCED = JobSpec(seq_len=4096, global_batch=256, moe_routing="balanced")
MOE = LayerKind(moe=True)


def _links(layout_text: str, gpus: int, gpu: str = "h100-sxm"):
    topo = topology_from_cluster(ClusterSpec(gpu=gpu, gpus=gpus))
    layout = parse_layout(layout_text)
    return layout, group_links(topo, layout)


def test_moe_activations_are_modelzoos_1_4_gb_for_deepseek_v3() -> None:
    """moe.md 5.7 (Megatron-MoE-ModelZoo deepseek_mem_estimate.py): DeepSeek-V3, s 4096, b 1, TP1, ETP1, BF16:
    router probs 2.1 + routing map 8.4 + shared 33.6 + 16.8 + permuted tokens 469.8 + expert fc1 268.4 + activation
    134.2 + combine output 469.8 MB = 1.40 GB per MoE layer per micro-batch, not divided by EP."""
    model = model_preset("deepseek-v3")
    for ep in (8, 64):
        layout = parse_layout(f"dp=64,ep={ep}")
        shared, routed = moe_activation_bytes(model, BALANCED, layout, DEFAULT_PARAMS)
        assert shared == pytest.approx((33.55 + 16.78) * 1e6, rel=1e-3)
        assert shared + routed == pytest.approx(1.403e9, rel=1e-3)


def test_routed_activations_grow_with_etp_times_top_k_tokens_and_real_routing() -> None:
    model = model_preset("grok-1")
    job = JobSpec(seq_len=4096, global_batch=64, moe_routing="balanced")
    _, one = moe_activation_bytes(model, job, parse_layout("tp=4,dp=8,ep=8,etp=1,sp"), DEFAULT_PARAMS)
    _, four = moe_activation_bytes(model, job, parse_layout("tp=4,dp=8,ep=8,etp=4,sp"), DEFAULT_PARAMS)
    t_loc, k, h, f = 4096 / 4, 2, 6144, 32768
    # etp 4 gathers 4x the rows; each expert's FFN internals shrink by 4: + 3 x 2 B x rows x h more permuted tokens
    assert four - one == pytest.approx(2 * t_loc * k * 3 * h, rel=1e-9)
    assert one == pytest.approx(t_loc * 8 * 10 + 2 * t_loc * k * (h + 3 * f) + 2 * t_loc * k * h, rel=1e-9)
    _, real = moe_activation_bytes(model, job.model_copy(update={"moe_routing": None}),
                                   parse_layout("tp=4,dp=8,ep=8,etp=1,sp"), DEFAULT_PARAMS)  # fmt: skip
    routed = 2 * t_loc * k * (h + 3 * f)
    assert real - one == pytest.approx((DEFAULT_PARAMS.real_routing_imbalance - 1) * routed, rel=1e-9)


def test_expert_state_shards_over_etp_ep_and_expert_dp() -> None:
    """Megatron's accounting (theoretical_memory_usage.py, moe.md 5.7): routed experts / (ETP x EP) per GPU, their
    optimizer over EDP; dense parts over TP and DP. Qwen3-30B-A3B, 16 GPUs, ep 8 (edp 2), ZeRO-1."""
    model = model_preset("qwen3-30b-a3b")
    layout = parse_layout("dp=16,ep=8,ga=16,sharding=zero1")
    (stage,) = stage_params_per_stage(model, layout)
    experts = 48 * 128 * 3 * 2048 * 768 / 8
    assert stage.experts == pytest.approx(experts)
    assert stage.total == pytest.approx(model.param_count - 48 * 128 * 3 * 2048 * 768 + experts)
    mem = memory_per_gpu(model, BALANCED.model_copy(update={"global_batch": 256}), layout, DEFAULT_PARAMS)
    dense = stage.total - experts
    assert mem.optimizer_bytes == pytest.approx(12 * dense / 16 + 12 * experts / 2)
    assert mem.weights_bytes + mem.gradients_bytes == pytest.approx(4 * stage.total)


def test_all_to_all_volumes_and_tokens_per_expert() -> None:
    """Qwen3-30B-A3B, EP8 on one DGX H100, micro-batch 1 of 4096 tokens: each rank dispatches 4096 x 8 copies of
    2048 x 2 B = 134.2 MB, combines as much; the link moves 450 GB/s x 8/7 of buffer at the all-to-all
    efficiency. Forward: dispatch + combine; backward: the same two. Tokens per local expert 4096 x 8 x 8 / 128
    = 2048 (moe.md 5.5)."""
    model = model_preset("qwen3-30b-a3b")
    layout, links = _links("dp=8,ep=8", 8)
    t = routed_times(model, BALANCED, layout, H100, links, DEFAULT_PARAMS)
    buffer = 4096 * 8 * 2048 * 2
    one = buffer / (450e9 * 8 / 7 * DEFAULT_PARAMS.all_to_all_efficiency) + links.ep.latency_s
    assert t.comm_fwd_s == pytest.approx(2 * one) and t.comm_bwd_s == pytest.approx(2 * one)
    assert 4096 * 8 * layout.ep / 128 == 2048
    flex = routed_times(model, BALANCED.model_copy(update={"moe_dispatcher": "flex", "precision": "fp8"}), layout,
                     H100, links, DEFAULT_PARAMS)  # fmt: skip
    r = distinct_ranks(128, 8, 8)
    dispatch = buffer / 8 * r / 2  # each token once per destination rank, in FP8
    assert flex.comm_fwd_s == pytest.approx((dispatch + buffer / 8 * r) / (buffer / (one - links.ep.latency_s))
                                            + 2 * links.ep.latency_s)  # fmt: skip


def test_flex_dispatch_across_nodes_sends_a_token_once_per_node() -> None:
    """DeepEP/HybridEP across nodes (DeepEP internode.cu: one RDMA copy per destination node, NVLink forwarding
    there): Qwen3-30B-A3B at ep 16 on two 8-GPU H100 nodes, 4,096 tokens per GPU, FP8 dispatch. A token crosses
    InfiniBand unless its 8 experts all sit on its own node's 64, probability C(64, 8) / C(128, 8); the bytes that
    cross go at the GPU's 400 Gb/s rail, by hand (the all-to-all efficiency aside), for the dispatch (1 B) and the
    combine (2 B)."""
    import math

    model = model_preset("qwen3-30b-a3b")
    layout, links = _links("dp=16,ep=16", 16)
    assert links.ep.domains == 2
    job = BALANCED.model_copy(update={"moe_dispatcher": "flex", "precision": "fp8"})
    remote = 1 - math.comb(64, 8) / math.comb(128, 8)
    crossing = 4096 * remote * 2048  # elements per GPU and direction over the network
    rail = 400e9 / 8 * DEFAULT_PARAMS.all_to_all_efficiency
    t = routed_times(model, job, layout, H100, links, DEFAULT_PARAMS)
    assert t.comm_fwd_s == pytest.approx((1 + 2) * crossing / rail + 2 * links.ep.latency_s, rel=1e-9)
    assert t.comm_bwd_s == pytest.approx(2 * 2 * crossing / rail + 2 * links.ep.latency_s, rel=1e-9)
    alltoall = routed_times(model, BALANCED, layout, H100, links, DEFAULT_PARAMS)  # 8 copies, half of them remote
    assert alltoall.comm_bwd_s - 2 * links.ep.latency_s == pytest.approx(2 * 2 * 4096 * 4 * 2048 / rail, rel=1e-9)


def test_distinct_destination_ranks_match_the_reference() -> None:
    """moe.md 5.3: DeepSeek-V3 E 256, k 8: EP8 5.29, EP64 7.68; Qwen3 E 128, k 8: EP8 5.34; GPT-OSS k 4: EP16 3.68."""
    assert distinct_ranks(256, 8, 8) == pytest.approx(5.29, abs=0.01)
    assert distinct_ranks(256, 64, 8) == pytest.approx(7.68, abs=0.01)
    assert distinct_ranks(128, 8, 8) == pytest.approx(5.34, abs=0.01)
    assert distinct_ranks(128, 16, 4) == pytest.approx(3.68, abs=0.01)
    assert distinct_ranks(128, 1, 8) == 1.0


def test_grouped_gemm_flops_are_the_active_experts() -> None:
    """With tile-aligned rows, the grouped GEMMs' main loop does exactly k x 3 x h x f x 2 FLOPs per local token."""
    model = model_preset("deepseek-v3")
    layout, links = _links("dp=64,ep=64", 64)
    params = DEFAULT_PARAMS.model_copy(update={"kernel_overhead_s": 0.0, "hbm_efficiency": 1e6})  # FLOP-bound only
    rate = H100.peak_flops_for("bf16") * params.gemm_efficiency
    # the MoE layer's GEMMs less its (tile-padded) attention projections: the router, routed and shared experts
    attention_s = sum(gemm_s_of(4096, n, k, rate, H100, params) for n, k in attention_gemm_shapes(model, 1))
    gemm_s = layer_times(model, BALANCED, layout, H100, links, params, MOE).gemm_fwd_s - attention_s
    routed = 2 * 4096 * 8 * 3 * 7168 * 2048 * params.grouped_gemm_efficiency_ratio**-1
    shared = 2 * 4096 * 3 * 7168 * 2048
    router = 2 * 4096 * 256 * 7168
    assert gemm_s == pytest.approx((routed + shared + router) / rate, rel=1e-7)  # bytes at ~infinite HBM


def test_grouped_gemm_launches_one_gemm_per_local_expert() -> None:
    """Transformer Engine's GroupedLinear runs one cuBLAS GEMM per local expert (nvte_multi_tensor_gemm ->
    multi_stream_cublas_gemm): Qwen3-30B-A3B's 128 experts at ep 8 (16 local) and ep 2 (64 local), 4,096 tokens
    and k 8 per GPU, 2,048 and 512 rows per expert (tile-aligned), FLOP-bound: the same FLOPs, and the routed
    up and down projections' launches 2 x 16 and 2 x 64 x 4 us, by hand."""
    model = model_preset("qwen3-30b-a3b")
    params = DEFAULT_PARAMS.model_copy(update={"hbm_efficiency": 1e6})  # FLOP-bound only
    rate = H100.peak_flops_for("bf16") * params.gemm_efficiency * params.grouped_gemm_efficiency_ratio
    flops = 2 * 4096 * 8 * 3 * 2048 * 768  # k copies of each token through the three expert matrices
    router = gemm_s_of(4096, 128, 2048, H100.peak_flops_for("bf16") * params.gemm_efficiency, H100, params)
    for ep in (8, 2):
        layout, links = _links(f"dp=8,ep={ep}", 8)
        gemms = routed_times(model, BALANCED, layout, H100, links, params).gemm_s - router
        assert gemms == pytest.approx(flops / rate + 2 * (128 // ep) * params.kernel_overhead_s, rel=1e-6)


def test_mla_widths_and_projections() -> None:
    """DeepSeek-V3 MLA: score width 128 x (128 + 64) = 24,576 and value width 128 x 128 = 16,384 per layer;
    projections 187.1 M parameters per layer (moe.md 4.2), split over TP but for the duplicated down projections."""
    model = model_preset("deepseek-v3")
    assert core_widths(model, 1) == (24576, 16384) and core_widths(model, 8) == (3072, 2048)
    shapes = attention_gemm_shapes(model, 1)
    assert sum(n * k for n, k in shapes) == model.attention_matmul_param_count
    assert model.attention_matmul_param_count / 1e6 == pytest.approx(187.1, abs=0.05)
    down = 7168 * (1536 + 512 + 64)
    assert sum(n * k for n, k in attention_gemm_shapes(model, 8)) == pytest.approx(down + (187.1e6 - down) / 8,
                                                                                   rel=3e-4)  # fmt: skip


def test_sliding_window_context_and_attention_time() -> None:
    """GPT-OSS's window 128 at sequence 4096: a query sees 128 - 128 x 127 / 8192 = 126.0 keys against 2048."""
    model = model_preset("gpt-oss-120b")
    assert context(model, 4096, True, LayerKind(True, True)) == pytest.approx(126.02, abs=0.01)
    assert context(model, 4096, True, LayerKind(True, False)) == 2048
    layout, links = _links("dp=8,ep=8", 8)
    full = layer_times(model, BALANCED, layout, H100, links, DEFAULT_PARAMS, LayerKind(True, False))
    windowed = layer_times(model, BALANCED, layout, H100, links, DEFAULT_PARAMS, LayerKind(True, True))
    overhead = DEFAULT_PARAMS.kernel_overhead_s
    ratio = (windowed.attention_fwd_s - overhead) / (full.attention_fwd_s - overhead)
    assert ratio == pytest.approx(126.02 / 2048, rel=1e-3)


def test_mtp_sits_on_the_last_stage() -> None:
    """DeepSeek-V3's MTP module (a MoE block, the 2h x h projection, the shared head): its parameters and its
    extra pass through the output head are on the last pipeline stage only."""
    model = model_preset("deepseek-v3")
    plain = model.model_copy(update={"mtp_layers": 0})
    layout = parse_layout("pp=16,dp=16,ep=16,ga=16")
    with_mtp, without = stage_params_per_stage(model, layout), stage_params_per_stage(plain, layout)
    assert with_mtp[:-1] == without[:-1]
    routed = 256 * model.expert_param_count
    extra = with_mtp[-1].total - without[-1].total  # its dense part, its experts over ep 16, an embedding copy
    assert extra == pytest.approx(model.mtp_param_count - routed + routed / 16 + model.vocab * model.hidden)
    assert with_mtp[-1].experts - without[-1].experts == pytest.approx(routed / 16)


def test_moe_layout_costs_end_to_end_and_ep_overlap_only_hides() -> None:
    model = model_preset("qwen3-30b-a3b")
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16))
    layout = parse_layout("dp=16,ep=16,ga=16")
    plain = evaluate(model, BALANCED, layout, H100, topo)
    assert plain.times.ep_comm_s > 0 and plain.memory.expert_param_count_on_gpu > 0
    overlapped = evaluate(model, BALANCED.model_copy(update={"moe_ep_overlap": True}), layout, H100, topo)
    assert overlapped.times.ep_comm_s < plain.times.ep_comm_s
    assert overlapped.times.compute_s == plain.times.compute_s
    real = evaluate(model, BALANCED.model_copy(update={"moe_routing": None}), layout, H100, topo)
    assert real.tokens_per_s_per_gpu < plain.tokens_per_s_per_gpu  # the busiest rank sets the pace


def test_dense_layer_of_an_moe_model_is_a_dense_layer() -> None:
    """DeepSeek-V3's first three layers are dense (width 18,432): costed and stored as a dense layer."""
    model = model_preset("deepseek-v3")
    layout = parse_layout("dp=8,ep=8")
    dense_act = activation_bytes_per_layer(model, BALANCED, layout, LayerKind())
    moe_act = activation_bytes_per_layer(model, BALANCED, layout, MOE)
    assert moe_act > dense_act > 0


def test_a_non_causal_job_on_sliding_window_layers_is_refused_up_front() -> None:
    """GPT-OSS's windowed layers attend causally: a non-causal job is refused before any layout is costed."""
    from optlayout.errors import InputError
    from optlayout.layout.rules import check_layout
    from optlayout.solver.problem import Problem
    from optlayout.specs import JobSpec, Layout
    from optlayout.topology import load_cluster

    model = model_preset("gpt-oss-20b")
    job = JobSpec(seq_len=4096, global_batch=64, causal=False)
    topo = load_cluster("gpu=h100-sxm,gpus=8,gpus_per_node=8").topology
    with pytest.raises(InputError, match="causal: the model's sliding-window layers attend causally"):
        Problem(model, job, topo)
    with pytest.raises(InputError, match="causal: the model's sliding-window layers"):
        check_layout(model, job, Layout(dp=8, ep=8, grad_accum=8), 8)
    Problem(model, JobSpec(seq_len=4096, global_batch=64), topo)  # causal: accepted


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_ep_overlap_leaves_the_exchange_the_sms_its_kernels_hold(dispatcher) -> None:
    """With EP overlap a layer takes max(compute + s x exchange, exchange): the compute under the exchange runs on
    the SMs its kernels leave, s = 20 of the H100's 132 for the flex dispatcher (DeepEP's default), none priced for
    the alltoall dispatcher. Qwen3-30B-A3B (48 MoE layers) on one stage: the step's exposed exchange is the
    accumulation x 48 x max(s X, X - C), X and C one layer's exchange and compute per micro-batch."""
    model = model_preset("qwen3-30b-a3b")
    job = BALANCED.model_copy(update={"moe_ep_overlap": True, "moe_dispatcher": dispatcher})
    layout, links = _links("dp=16,ep=16,ga=16", 16)
    lt = layer_times(model, job, layout, H100, links, DEFAULT_PARAMS, MOE)
    exchange = lt.ep_comm_fwd_s + lt.ep_comm_bwd_s
    compute = 3 * lt.gemm_fwd_s + lt.attention_fwd_s + lt.attention_bwd_s
    compute += (1 + DEFAULT_PARAMS.backward_elementwise_ratio) * lt.elementwise_fwd_s
    share = 20 / 132 if dispatcher == "flex" else 0.0
    expected = 16 * 48 * max(share * exchange, exchange - compute)
    times = evaluate(model, job, layout, H100, topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16))).times
    assert times.ep_comm_s == pytest.approx(expected, rel=1e-9)
    if dispatcher == "flex":
        assert times.ep_comm_s > 0  # the exchange hides under the compute, yet holds SMs from it


def test_gpu_file_may_give_the_sm_count(tmp_path, monkeypatch) -> None:
    """A GPU described by hand may state its SMs (the flex dispatcher's held share needs them); none: no share; a
    count that is no positive integer is refused naming the field."""
    from optlayout.cost.moe import held_sm_share
    from optlayout.errors import InputError

    spec = tmp_path / "gpus.yaml"
    row = "  arch: hopper\n  memory_gib: 80\n  peak_tflops: {bf16: 989.4}\n  hbm_tbytes_per_s: 3.35\n"
    row += "  scale_up_gbytes_per_s: 450\n  source: my datasheet\n"
    spec.write_text(f"x100:\n{row}  sm_count: 100\ny100:\n{row}z100:\n{row}  sm_count: -4\n")
    monkeypatch.setenv("OPTLAYOUT_GPU_FILE", str(spec))
    flex = BALANCED.model_copy(update={"moe_dispatcher": "flex"})
    assert held_sm_share(flex, gpu_preset("x100"), DEFAULT_PARAMS) == pytest.approx(0.2)
    assert held_sm_share(flex, gpu_preset("y100"), DEFAULT_PARAMS) == 0.0
    assert held_sm_share(BALANCED, gpu_preset("x100"), DEFAULT_PARAMS) == 0.0  # alltoall: none priced
    with pytest.raises(InputError, match="sm_count"):
        gpu_preset("z100")
