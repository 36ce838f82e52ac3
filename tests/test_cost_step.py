"""Step-time physics: the GEMM's unhidden output store and the attention kernel's generation, checked by hand
and against the published MosaicML runs that differ only in the GPU."""

from __future__ import annotations

import json

import pytest

from optlayout.cost import DEFAULT_PARAMS, group_links
from optlayout.cost.step import gemm_s, layer_times
from optlayout.errors import InputError
from optlayout.presets import gpu_preset, model_preset
from optlayout.runs.predict import predict_run
from optlayout.runs.records import RunRecord
from optlayout.specs import JobSpec, Layout
from optlayout.topology import parse_cluster_shorthand, topology_from_cluster

A100 = gpu_preset("a100-80gb")
H100 = gpu_preset("h100-sxm")


def test_gemm_time_by_hand_narrow_gemm_pays_for_its_output_store() -> None:
    """MPT-125m's QKV GEMM on an A100-80GB: 65,536 tokens x 768 -> 2,304, bf16.

    Main loop: 2 x 65,536 x 2,304 x 768 = 231.9 GFLOP at 0.78 x 312 TFLOP/s = 0.953 ms; operands
    2 x (65,536 x 768 + 768 x 2,304) B = 104.2 MB at 0.8 x 2,039 GB/s = 0.064 ms, hidden under it.
    Output store: 2 x 65,536 x 2,304 B = 302.0 MB = 0.185 ms. Plus 4 us launch: 1.142 ms."""
    t = gemm_s(65_536, 2_304, 768, 312e12 * 0.78, A100, DEFAULT_PARAMS)
    assert t == pytest.approx(0.953e-3 + 0.185e-3 + 4e-6, rel=2e-3)


def test_output_store_share_shrinks_with_the_hidden_size() -> None:
    """The store adds less to wider GEMMs, in inverse proportion to k: ~19% at hidden 768, ~2% at hidden 8,192
    on an A100 (store / main loop = peak x efficiency / (k x bandwidth x efficiency) = 243.4 / (1.631 x k))."""
    rate = 312e12 * DEFAULT_PARAMS.gemm_efficiency
    overhead = DEFAULT_PARAMS.kernel_overhead_s
    for k, share in ((768, 243.4 / 1.631 / 768), (8_192, 243.4 / 1.631 / 8_192)):
        t = gemm_s(65_536, 3 * k, k, rate, A100, DEFAULT_PARAMS) - overhead
        main = 2.0 * 65_536 * 3 * k * k / rate
        assert (t - main) / main == pytest.approx(share, rel=1e-3)


def _attention_s(gpu, kernel: str) -> float:
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=8, attention_kernel=kernel)
    layout = Layout(dp=8, grad_accum=1)
    topo = topology_from_cluster(parse_cluster_shorthand(f"gpu={gpu.name},gpus=8"))
    return layer_times(model, job, layout, gpu, group_links(topo, layout), DEFAULT_PARAMS).attention_fwd_s


def test_flash2_is_slower_on_hopper_by_the_fa3_papers_ratio_and_native_on_ampere() -> None:
    overhead = DEFAULT_PARAMS.kernel_overhead_s
    ratio = (_attention_s(H100, "flash") - overhead) / (_attention_s(H100, "flash2") - overhead)
    assert ratio == pytest.approx(1 / 1.75, rel=0.01)  # FA3 is 1.5-2.0x FA2 on H100 (Shah et al. 2024)
    assert _attention_s(A100, "flash2") == _attention_s(A100, "flash")


def test_triton_flash_attention_runs_at_the_fa2_papers_ratio_of_flash_attention_2_on_every_gpu() -> None:
    """FlashAttention-2 is 1.3-2.5x faster than FlashAttention in Triton (Dao 2023, sec. 4.1): 1/1.8 of FA2's speed,
    on the A100 as on the H100 (where both run Ampere code, FA2 at 1/1.75 of the native kernel)."""
    overhead = DEFAULT_PARAMS.kernel_overhead_s
    for gpu in (A100, H100):
        ratio = (_attention_s(gpu, "flash2") - overhead) / (_attention_s(gpu, "triton") - overhead)
        assert ratio == pytest.approx(1 / 1.8, rel=0.01)
    native = (_attention_s(H100, "flash") - overhead) / (_attention_s(H100, "triton") - overhead)
    assert native == pytest.approx(1 / 1.75 / 1.8, rel=0.01)


def _mpt760m_32k(gpu: str, measured: float) -> RunRecord:
    """MPT-760m at 32K tokens on 8 GPUs, FSDP, micro-batch 1 (llm-foundry benchmarking README)."""
    return RunRecord.model_validate({
        "id": f"mpt760m-32k-{gpu}", "source": "mosaicml/llm-foundry scripts/train/benchmarking/README.md",
        "model": {"name": "MPT-760m", "layers": 24, "hidden": 1536, "ffn": 6144, "heads": 12, "kv_heads": 12,
                  "vocab": 50368, "mlp": "gelu", "tied_embeddings": True},
        "cluster": {"gpu": gpu, "gpus": 8, "gpus_per_node": 8, "nvlink_domain": 8, "inter_node_gbps_per_gpu": 200},
        "job": {"seq_len": 32768, "global_batch": 16, "precision": "bf16"},
        "layout": {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "micro_batch": 1, "sharding": "fsdp", "recompute": "none"},
        "measured": {"tokens_per_s_per_gpu": measured},
    })  # fmt: skip


def test_llm_foundry_h100_over_a100_speedup_is_explained_by_its_ampere_era_kernel() -> None:
    """The same attention-bound run (71% of the forward is attention) measured 16,291 tok/s/GPU on H100 and
    8,802 on A100-80GB: 1.85x, not the 3.2x of the BF16 peaks. Uncalibrated, with the kernel inferred from the
    source (FlashAttention in Triton, Ampere code on both), the model predicts 2.0x (within 10%); a native Hopper
    kernel would give 3.0x."""
    h100, a100 = _mpt760m_32k("h100-sxm", 16_291.0), _mpt760m_32k("a100-80gb", 8_802.0)
    assert h100.attention_kernel()[0] == "triton"
    measured = 16_291.0 / 8_802.0
    predicted = predict_run(h100).prediction.tokens_per_s_per_gpu / predict_run(a100).prediction.tokens_per_s_per_gpu
    assert predicted / measured - 1 == pytest.approx(0.0, abs=0.10)
    native = [RunRecord.model_validate(r.model_dump() | {"job": r.job.model_dump() | {"attention_kernel": "flash"}})
              for r in (h100, a100)]  # fmt: skip
    tps = [predict_run(r).prediction.tokens_per_s_per_gpu for r in native]
    assert tps[0] / tps[1] / measured - 1 > 0.4


ESTIMATE = ("estimate", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=8", "--seq-len", "8192",
            "--global-batch", "64", "--layout", "tp=1,pp=1,dp=8,mb=1,ga=8",
            "--calibration", "none", "--json")  # fmt: skip


def test_cli_attention_kernel_reaches_the_cost_model(capsys, monkeypatch) -> None:
    from tests.conftest import run_main

    times = {}
    for kernel in ("flash", "flash2", "triton"):
        code, out, _ = run_main(capsys, monkeypatch, *ESTIMATE, "--attention-kernel", kernel)
        assert code == 0
        times[kernel] = json.loads(out)["prediction"]["time"]["compute_s"]
    assert times["triton"] > times["flash2"] > times["flash"]
    code, _, err = run_main(capsys, monkeypatch, *ESTIMATE, "--attention-kernel", "fa9")
    assert code == 2 and err.count("\n") == 1 and "attention_kernel" in err and "Traceback" not in err


def test_library_with_calibrated_params_matches_the_cli_default(capsys, monkeypatch) -> None:
    from optlayout import calibrated_params, estimate_layout
    from optlayout.layout import parse_layout
    from tests.conftest import run_main

    args = [a for a in ESTIMATE if a not in ("--calibration", "none")]
    code, out, _ = run_main(capsys, monkeypatch, *args)
    assert code == 0
    cli_tps = json.loads(out)["prediction"]["tokens_per_s_per_gpu"]
    job = JobSpec(seq_len=8192, global_batch=64)
    params = calibrated_params("h100-sxm", "bf16")
    lib = estimate_layout("llama3.1-8b", "gpu=h100-sxm,gpus=8", job, parse_layout("tp=1,pp=1,dp=8,mb=1,ga=8"), params)
    assert lib.tokens_per_s_per_gpu == pytest.approx(cli_tps, rel=1e-12)
    assert params != DEFAULT_PARAMS  # the shipped profile moves the constants


# --- attention at short key lengths, ring attention step by step ---------------------------------------------


def test_attention_overhead_constant_reproduces_its_source() -> None:
    """L0 = 235 keys: FlashAttention-3 on an H100 (head dim 128, non-causal, 16K tokens per batch; Tritonbench,
    pytorch/benchmark PR #2391) measured 430, 517, 566, 590, 614, 621 TFLOP/s at 512 ... 16K keys; L / (L + L0)
    times the long-sequence 630 TFLOP/s reproduces each within 1.5%."""
    l0 = DEFAULT_PARAMS.attention_overhead_keys
    for keys, measured in zip((512, 1024, 2048, 4096, 8192, 16384), (430.3, 517.1, 565.5, 590.2, 614.2, 620.7),
                              strict=True):  # fmt: skip
        assert 630 * keys / (keys + l0) == pytest.approx(measured, rel=0.015)


def test_attention_length_factor_by_hand() -> None:
    """Causal, one call over 8,192 keys: every query tile pays L0 = 235 keys and its half-used diagonal tile of
    128: 1 + (128 + 2 x 235) / 8,192 = 1.073. Ring attention over cp 4 at 8K, load-balanced: step 0 causal over the
    rank's 2,048 keys, 3 steps of 2,048 queries against 1,024 keys (the last rank's case): 1/4 x [(1 + 598 / 2,048)
    + 3 x (1 + 235 / 1,024)] = 1.245. Non-causal, cp 2: two steps over 4,096 keys each: 1 + 235 / 4,096."""
    from optlayout.cost.step import attention_length_factor

    assert attention_length_factor(8192, 1, True, DEFAULT_PARAMS) == pytest.approx(1 + 598 / 8192)
    assert attention_length_factor(8192, 4, True, DEFAULT_PARAMS) == pytest.approx(
        ((1 + 598 / 2048) + 3 * (1 + 235 / 1024)) / 4
    )
    assert attention_length_factor(8192, 2, False, DEFAULT_PARAMS) == pytest.approx(1 + 235 / 4096)


def test_ring_attention_exposes_each_step_that_its_exchange_outlasts() -> None:
    """cp 4: 4 ms of attention forward is 4 steps of 1 ms; 6 ms of K/V exchange is 3 steps of 2 ms. Forward: each
    exchange outlasts its step by 1 ms, 3 ms exposed; backward (K/V and their gradients, 4 ms a step, against
    2.5 ms of attention): 4.5 ms. Summed over the layer instead (6 - 4 and 12 - 10) it would be 4 ms."""
    from optlayout.cost.step import LayerTimes, stage_times

    lt = LayerTimes(gemm_fwd_s=0.0, attention_fwd_s=4e-3, attention_bwd_s=2.5 * 4e-3, elementwise_fwd_s=0.0,
                    tp_comm_fwd_s=0.0, cp_comm_fwd_s=6e-3)  # fmt: skip
    model = model_preset("llama3.1-8b")
    st = stage_times(model, JobSpec(seq_len=8192, global_batch=8), Layout(cp=4, dp=2), H100, DEFAULT_PARAMS,
                     ((lt, 1),), False)  # fmt: skip
    assert st.cp_exposed_s == pytest.approx(7.5e-3)


def test_ring_attention_merges_each_steps_output_and_sums_each_steps_gradients() -> None:
    """Llama 3.1 8B at 8K on cp 2: forward, each of the 2 steps merges its partial output (4,096 tokens x 4,096
    query width) into the output, 10 B an element (Transformer Engine's out correction): 2 x 4,096 x 4,096 x 10 B =
    335.5 MB at 0.8 x 3.35 TB/s = 0.125 ms. Backward, no correction: each step's dq is summed into dq (6 B an
    element) and its dk, dv (2 x 1,024 key/value width) packed (4 B) and summed into those received (6 B):
    2 x 4,096 x (4,096 x 6 + 2,048 x 10) B = 369.1 MB = 0.138 ms, not twice the forward's 0.125 ms. The other
    elementwise work is that of half the sequence without CP."""
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=8)
    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=8"))
    ring = Layout(cp=2, dp=4)
    with_cp = layer_times(model, job, ring, H100, group_links(topo, ring), DEFAULT_PARAMS)
    half = JobSpec(seq_len=4096, global_batch=8)
    plain = Layout(dp=8)
    without = layer_times(model, half, plain, H100, group_links(topo, plain), DEFAULT_PARAMS)
    hbm = 0.8 * 3.35e12
    assert with_cp.elementwise_fwd_s == pytest.approx(without.elementwise_fwd_s, rel=1e-12)
    assert with_cp.cp_merge_fwd_s == pytest.approx(2 * 4096 * 4096 * 10 / hbm, rel=1e-9)
    assert with_cp.cp_merge_bwd_s == pytest.approx(2 * 4096 * (4096 * 6 + 2048 * 10) / hbm, rel=1e-9)
    assert without.cp_merge_fwd_s == without.cp_merge_bwd_s == 0.0


def test_the_stage_runs_the_merge_forward_and_the_gradient_sums_backward_once() -> None:
    """By hand, one layer of 1 ms elementwise work, a 0.5 ms output merge and 0.3 ms of gradient sums: forward
    1.5 ms; backward 2 x 1 ms (the elementwise backward) + 0.3 ms; full recomputation adds the 1.5 ms forward."""
    from optlayout.cost.step import LayerTimes, stage_times
    from optlayout.specs import Recompute

    lt = LayerTimes(gemm_fwd_s=0.0, attention_fwd_s=0.0, attention_bwd_s=0.0, elementwise_fwd_s=1e-3,
                    tp_comm_fwd_s=0.0, cp_comm_fwd_s=0.0, cp_merge_fwd_s=0.5e-3, cp_merge_bwd_s=0.3e-3)  # fmt: skip
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=8)
    st = stage_times(model, job, Layout(cp=2, dp=4), H100, DEFAULT_PARAMS, ((lt, 1),), False)
    assert (st.compute_fwd_s, st.compute_bwd_s) == pytest.approx((1.5e-3, 2.3e-3), rel=1e-12)
    full = stage_times(model, job, Layout(cp=2, dp=4, recompute=Recompute.full), H100, DEFAULT_PARAMS, ((lt, 1),),
                       False)  # fmt: skip
    assert full.compute_bwd_s == pytest.approx(3.8e-3, rel=1e-12)


# --- NCCL latency of data-parallel collectives -----------------------------------------------------------------


def test_nccl_latency_by_hand_rings_grow_with_ranks_and_all_reduce_takes_the_tree_at_scale() -> None:
    """NCCL's tuning model (src/graph/tuning.cc, Simple protocol): base 8.4 us, ring steps 3.4 us on NVLink and
    14 us on the network, tree steps 4.0 us on NVLink and 14 us on the network.

    64 ranks over 8 servers: an all-gather rings 63 steps, 7 of them between servers: 8.4 + 56 x 3.4 + 7 x 14 =
    296.8 us. An all-reduce rings twice, 126 steps with 14 between servers: 8.4 + 112 x 3.4 + 14 x 14 = 585.2 us;
    its tree goes up and down a chain of 7 NVLink steps and log2(8) = 3 network levels: 8.4 + 2 x (7 x 4 + 3 x
    14) = 148.4 us, faster, so NCCL takes it. Inside one server (8 ranks) the ring wins: 8.4 + 14 x 3.4 = 56 us
    against 8.4 + 2 x 7 x 4 = 64.4 us. A 1-byte buffer leaves the latency alone."""
    from optlayout.cost.comm import Link, all_gather_s, all_reduce_s

    wide, one_server = Link(64, 1e30, 0.0, domains=8), Link(8, 1e30, 0.0, domains=1)
    assert all_gather_s(1.0, wide, 1.0, DEFAULT_PARAMS) == pytest.approx(296.8e-6, rel=1e-9)
    assert all_reduce_s(1.0, wide, 1.0, DEFAULT_PARAMS) == pytest.approx(148.4e-6, rel=1e-9)
    assert all_reduce_s(1.0, one_server, 1.0, DEFAULT_PARAMS) == pytest.approx(56e-6, rel=1e-9)


def test_a_calibration_of_an_earlier_release_still_applies_its_fitted_attention_efficiency(tmp_path) -> None:
    """Earlier releases fitted the attention kernel's efficiency; their files still load and apply it (inside its
    range), while a value outside the range is refused naming the field."""
    from optlayout.runs.calibrate import load_calibration

    text = "schema_version: 1\nfitted_on: earlier\nfitted: [gemm_efficiency, attention_efficiency]\n"
    path = tmp_path / "old.yaml"
    path.write_text(text + "default: {gemm_efficiency: 0.7, attention_efficiency: 0.3}\n")
    params = load_calibration(path).params_for("h100-sxm", "bf16")
    assert (params.gemm_efficiency, params.attention_efficiency) == (0.7, 0.3)
    path.write_text(text + "default: {gemm_efficiency: 0.7, attention_efficiency: 0.95}\n")
    with pytest.raises(InputError, match=r"default\.attention_efficiency: 0\.95 is outside"):
        load_calibration(path)


def test_tp_overlap_hides_collectives_only_with_sequence_parallelism() -> None:
    """Megatron asserts --tp-comm-overlap needs --sequence-parallel (megatron/training/arguments.py): with SP the
    calibrated share of the TP collectives hides (exposed: (1 - 0.6) x the forward's collectives, twice for
    forward and backward, per layer); without SP, the same bytes (an all-reduce instead of all-gather plus
    reduce-scatter) all block. And the Megatron emitters turn the overlap on exactly where it is priced."""
    from optlayout.cost import evaluate
    from optlayout.emit import bridge_overrides, megatron_args

    model = model_preset("llama3.1-70b")
    job = JobSpec(seq_len=8192, global_batch=16)
    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=8"))
    params = DEFAULT_PARAMS.model_copy(update={"tp_comm_overlap": 0.6})
    exposed = {}
    for sp in (True, False):
        layout = Layout(tp=8, dp=1, grad_accum=16, sequence_parallel=sp)
        links = group_links(topo, layout)
        per_layer = layer_times(model, job, layout, H100, links, params).tp_comm_fwd_s
        times = evaluate(model, job, layout, H100, topo, params).times
        exposed[sp] = times.tp_comm_s / (16 * model.layers * 2 * per_layer)
        flags = megatron_args(model, job, layout)
        assert ("--tp-comm-overlap" in flags) is sp
        assert f"comm_overlap.tp_comm_overlap={'true' if sp else 'false'}" in bridge_overrides(model, job, layout)
    assert exposed[True] == pytest.approx(0.4, rel=1e-9)
    assert exposed[False] == pytest.approx(1.0, rel=1e-9)


def test_fp8_casts_the_sequence_shard_that_sequence_parallelism_gathers() -> None:
    """Llama 3.1 8B at 8K, tp 4, FP8 against BF16: the FP8 elementwise work is the casts (3 B an element, read bf16,
    write fp8) of each GEMM's input on one rank. With sequence parallelism Transformer Engine quantizes the local
    shard before gathering, so QKV's and FC1's inputs (hidden 4,096) cast 4,096 / 4 elements a token, the output
    projection's and FC2's (1,024 and 3,584, split by TP) theirs: 8,192 x 6,656 x 3 B = 163.6 MB at 0.8 x
    3.35 TB/s = 61.0 us. Without it every rank casts the whole gathered input: 8,192 x 12,800 x 3 B = 117.4 us."""
    model = model_preset("llama3.1-8b")
    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=8"))
    hbm = 0.8 * 3.35e12
    for sp, widths in ((True, 1024 + 1024 + 1024 + 3584), (False, 4096 + 1024 + 4096 + 3584)):
        lay = Layout(tp=4, dp=2, sequence_parallel=sp)
        links = group_links(topo, lay)
        times = {
            p: layer_times(model, JobSpec(seq_len=8192, global_batch=8, precision=p), lay, H100, links,
                           DEFAULT_PARAMS).elementwise_fwd_s
            for p in ("bf16", "fp8")
        }  # fmt: skip
        assert times["fp8"] - times["bf16"] == pytest.approx(8192 * widths * 3 / hbm, rel=1e-9)
