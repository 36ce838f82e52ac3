"""Memory model against the hand figures of DESIGN.md and Korthikanti et al. 2022's formulas."""

from __future__ import annotations

import json

import pytest

from optlayout.cost import DEFAULT_PARAMS
from optlayout.cost.memory import activation_bytes_per_layer, inflight_layers, memory_per_gpu
from optlayout.layout.stages import chunk_layer_counts, split_layers, stage_layer_counts, vp_fits, warmup_chunks
from optlayout.specs import JobSpec, Layout, ModelSpec

# A GPT-style block as in the paper: MHA, 4h GeLU MLP, dropout, softmax materialized.
S, B, H, A = 2048, 4, 6144, 48
GPT = ModelSpec(layers=8, hidden=H, ffn=4 * H, heads=A, kv_heads=A, vocab=51200, mlp="gelu")
PAPER_JOB = JobSpec(seq_len=S, global_batch=B, dropout=True, attention_kernel="naive")


def act(tp: int = 1, sp: bool = False, recompute: str = "none") -> float:
    layout = Layout(tp=tp, micro_batch=B, sequence_parallel=sp, recompute=recompute)
    return activation_bytes_per_layer(GPT, PAPER_JOB, layout)


def test_korthikanti_no_parallelism() -> None:
    # Eq. (1): sbh(34 + 5as/h)
    assert act() == pytest.approx(S * B * H * (34 + 5 * A * S / H))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tensor_parallel(t: int) -> None:
    # Eq. (2): sbh(10 + 24/t + 5as/(ht))
    assert act(tp=t) == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)))


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_sequence_parallel(t: int) -> None:
    # Eq. (4): sbh/t (34 + 5as/h)
    assert act(tp=t, sp=True) == pytest.approx(S * B * H / t * (34 + 5 * A * S / H))


def test_korthikanti_selective_recompute() -> None:
    # Eq. (6): 34 sbh/t with TP + SP + selective recomputation
    assert act(tp=8, sp=True, recompute="selective") == pytest.approx(34 * S * B * H / 8)


def test_full_recompute_keeps_layer_input() -> None:
    # Table 2: full recomputation keeps 2sbh per layer
    assert act(recompute="full") == pytest.approx(2 * S * B * H)


def test_design_worked_example_state() -> None:
    # 70B x 16 B = 1120 GB; TP8 x PP4 -> 35 GB/GPU; ZeRO-1 over dp 8 -> 8.75 + 3.28 = 12.03 GB
    from optlayout.cost.memory import state_bytes_per_gpu
    from optlayout.specs import Sharding

    job = JobSpec(seq_len=4096, global_batch=8)
    per_gpu = 70e9 / 32
    assert sum(state_bytes_per_gpu(per_gpu, job, Sharding.none, 8)) == pytest.approx(35e9)
    assert sum(state_bytes_per_gpu(per_gpu, job, Sharding.zero1, 8)) == pytest.approx(12.03e9, rel=1e-3)
    assert sum(state_bytes_per_gpu(per_gpu, job, Sharding.fsdp, 8)) == pytest.approx(35e9 / 8)


def test_llama3_405b_stage_split() -> None:
    # Llama 3: 126 layers on 16 stages, first and last one layer short (embedding / output count as layers)
    assert split_layers(126, 16) == (7, 7)
    # an odd remainder goes to the first stage (the last also runs the output layer and the loss)
    assert split_layers(61, 4) == (15, 14) and stage_layer_counts(61, 4, 15, 14) == [15, 16, 16, 14]
    assert split_layers(61, 2) == (31, 30) and split_layers(80, 4) == (None, None)
    assert stage_layer_counts(126, 16, 7, 7) == [7] + [8] * 14 + [7]
    assert stage_layer_counts(80, 4) == [20] * 4


def test_pipeline_inflight_microbatches_1f1b_and_interleaved() -> None:
    # 1F1B: the first stage holds p micro-batches of its L/p layers = L layers' worth (Korthikanti 4.2.3);
    # interleaved: L (1 + (p-1)/(p v)).
    model = ModelSpec(layers=32, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000, mlp="gelu")
    job = JobSpec(seq_len=1024, global_batch=64)
    per_layer = activation_bytes_per_layer(model, job, Layout(pp=4, dp=1, grad_accum=64))
    p, v = 4, 2
    for vp, expect_layers in ((1, 32), (v, 32 * (1 + (p - 1) / (p * v)))):
        mem = memory_per_gpu(model, job, Layout(pp=p, vp=vp, grad_accum=64), DEFAULT_PARAMS)
        assert mem.stage == 0
        # only the first model chunk's micro-batches hold the embedding output: the interleaved warm-up
        # ((p-1) x 2 + (v-1) x p + 1 = 11 chunk forwards) runs chunk 0 for micro-batches 0-3, chunk 1 for 0-3,
        # then chunk 0 for 4-6 (groups of p): 7 of the 11
        first_chunk = p if vp == 1 else 7
        embedding_out = 2 * 1024 * 1024 * first_chunk  # 2 B x 1024 tokens x hidden 1024 per micro-batch
        assert mem.activations_bytes - embedding_out == pytest.approx(per_layer * expect_layers)


def test_uneven_interleaved_stages_hold_their_own_chunk_sizes() -> None:
    """Llama 3 405B's split on pp 16 with vp 8: the first rank's chunks are [0, 1 x 7] (the embedding alone
    first), the last rank's [1 x 7, 0] (the loss alone last), the middle ranks' [1 x 8]."""
    counts = [7] + [8] * 14 + [7]
    layout = Layout(pp=16, vp=8, grad_accum=16)
    assert chunk_layer_counts(counts, 8)[:16] == [0] + [1] * 15  # chunk 0 of every rank, in rank order
    assert chunk_layer_counts(counts, 8)[-16:] == [1] * 15 + [0]  # chunk 7 of every rank
    # first rank, ga 16: w = min(143, 16 x 8) = 128 = one full pass: 16 micro-batches x (0 + 7 x 1) layers
    assert inflight_layers(layout, counts, 0) == (16 * 7, 16)
    # last rank: w = min(0 + 112 + 1, 128) = 113: chunks 0-6 for 16 micro-batches (7 x 16 layers), then chunk 7
    # (empty, the loss) for one micro-batch
    assert inflight_layers(layout, counts, 15) == (7 * 16, 16)
    # a middle rank with equal chunks is Korthikanti's count: w forwards of one layer each
    assert inflight_layers(layout, counts, 1) == (min(14 * 2 + 112 + 1, 128), 16)
    # ranks with fewer layers than chunks, and first/last stages heavier than the middle
    assert chunk_layer_counts([1, 4, 4, 1], 4) == [0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 0]
    assert vp_fits([9, 8, 8, 9], 3) and not vp_fits([7, 8, 8, 7], 3)


def test_calibration_layouts_state_is_what_was_run(shared_runs) -> None:
    # Every published layout in the calibration set multiplies to its GPU count.
    for run in shared_runs:
        lay = run["layout"]
        assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == run["cluster"]["gpus"], run["id"]


@pytest.fixture
def shared_runs():
    # id, GPU count and degrees of the 427 published dense runs (copied from shared/data/calibration_runs.jsonl)
    from tests.conftest import FIXTURES

    path = FIXTURES / "runs" / "calibration_layouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_kv_heads_replicated_when_tp_exceeds_them() -> None:
    # Llama 3.1 8B: 8 kv heads of 128; at tp 16 each rank keeps one whole kv head (replicated), so its K and V
    # projections are 2 x 4096 x 128, not 2 x 4096 x 1024 / 16.
    from optlayout.cost.memory import layer_param_count_per_rank
    from optlayout.presets import model_preset

    m = model_preset("llama3.1-8b")
    kv = 2 * 4096 * 1024
    assert layer_param_count_per_rank(m, 8) == pytest.approx(m.layer_param_count / 8)  # 8 | 8 kv heads: plain split
    assert layer_param_count_per_rank(m, 16) == pytest.approx((m.layer_param_count - kv) / 16 + 2 * 4096 * 128)


def test_full_recompute_peak_holds_one_layer_being_recomputed() -> None:
    # Stage activations under full recompute: every layer's input (2sbh each) plus one layer's full set.
    model = ModelSpec(layers=8, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000, mlp="gelu")
    job = JobSpec(seq_len=1024, global_batch=8)
    full = Layout(micro_batch=1, grad_accum=8, recompute="full")
    mem = memory_per_gpu(model, job, full, DEFAULT_PARAMS)
    one_layer = activation_bytes_per_layer(model, job, Layout(micro_batch=1, grad_accum=8))
    inputs = 8 * 2 * 1024 * 1024
    embedding_out, logits = 2 * 1024 * 1024, 4 * 1024 * 32000
    assert mem.activations_bytes == pytest.approx(inputs + one_layer + embedding_out + logits)


@pytest.mark.parametrize(("model", "gpus"), [("llama3.1-8b", 16), ("qwen3-30b-a3b", 16)])
def test_memory_through_a_shared_memo_is_the_memory_of_each_layout_alone(model, gpus) -> None:
    """Every layout of a space (FSDP's prefetch buffers, interleaved chunks, partial recomputation among them): the
    breakdown through one memo shared by the whole space, and the total alone, are those computed without a memo."""
    from optlayout.cost.memory import memory_total_bytes
    from optlayout.presets import model_preset
    from optlayout.solver.space import SpaceOptions, enumerate_layouts
    from optlayout.specs import Recompute

    spec, job = model_preset(model), JobSpec(seq_len=4096, global_batch=64)
    memo: dict[tuple[object, ...], object] = {}
    kinds = set()
    for lay in enumerate_layouts(spec, job, gpus, 8, SpaceOptions(max_micro_batch=2, max_vp=2)):
        if lay.recompute == Recompute.full and lay.vp == 1 and lay.pp > 1:
            lay = lay.model_copy(update={"recompute_layers": 1})
        alone = memory_per_gpu(spec, job, lay, DEFAULT_PARAMS)
        assert memory_per_gpu(spec, job, lay, DEFAULT_PARAMS, memo) == alone
        assert memory_total_bytes(spec, job, lay, DEFAULT_PARAMS, memo) == alone.total_bytes
        kinds.add((lay.sharding, lay.recompute, lay.vp > 1, alone.buffers_bytes > 0))
    assert len(kinds) >= 12


def test_the_warm_up_is_megatrons_1f1b_and_interleaved_count() -> None:
    # 1F1B: stage i of p holds p - i micro-batches; interleaved: (p - i - 1) * 2 warm-up micro-batches plus (v - 1)
    # groups of p for the other chunks, and the one in flight (Korthikanti et al. 2022's L(1 + (p-1)/(pv)) layers)
    assert [warmup_chunks(4, 1, i) for i in range(4)] == [4, 3, 2, 1]
    assert [warmup_chunks(4, 2, i) for i in range(4)] == [11, 9, 7, 5]
    assert warmup_chunks(8, 5) == 14 + 32 + 1


def test_per_tensor_fp8_weights_keep_no_transpose_on_blackwell() -> None:
    """Transformer Engine's per-tensor FP8 weights are data + transpose (2 B) on Hopper and data alone (1 B) where
    FP8 GEMMs take any layout (quantizer.cpp @v2.10, is_non_tn_fp8_gemm_supported); MXFP8 keeps both directions.
    Megatron-Bridge's 26.04 Llama 3.1 405B recipe on 256 GB200 (FP8 current scaling, fp8_param_gather, TP 4 PP 16
    VP 4 DP 4, ZeRO-1, no recomputation: llama31_workload_base_configs.py @v0.4.0 lines 262-272) ran, and fits
    only with the 1-byte weights."""
    from optlayout.cost import evaluate
    from optlayout.layout import parse_layout
    from optlayout.presets import gpu_preset, model_preset
    from optlayout.specs import ClusterSpec
    from optlayout.topology import topology_from_cluster

    model = model_preset("llama3.1-405b")
    job = JobSpec(seq_len=8192, global_batch=1536, precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    layout = parse_layout("tp=4,pp=16,vp=4,dp=4,mb=1,ga=384,sharding=zero1,recompute=none,sp")
    gb200, h100 = gpu_preset("gb200"), gpu_preset("h100-sxm")
    on_gb200 = memory_per_gpu(model, job.on_gpu(gb200), layout, DEFAULT_PARAMS)
    on_h100 = memory_per_gpu(model, job.on_gpu(h100), layout, DEFAULT_PARAMS)
    assert on_gb200.weights_bytes == on_gb200.param_count_on_gpu * 1.0
    assert on_h100.weights_bytes == on_h100.param_count_on_gpu * 2.0 == memory_per_gpu(model, job, layout,
                                                                                         DEFAULT_PARAMS).weights_bytes
    assert on_gb200.total_bytes == on_h100.total_bytes - on_gb200.param_count_on_gpu  # nothing else moves
    mx = job.model_copy(update={"fp8_recipe": "mxfp8"})
    assert memory_per_gpu(model, mx.on_gpu(gb200), layout, DEFAULT_PARAMS).weights_bytes == on_h100.weights_bytes
    bf16 = JobSpec(seq_len=8192, global_batch=1536)
    assert bf16.on_gpu(gb200) is bf16  # nothing to resolve without FP8 primary weights
    topo = topology_from_cluster(ClusterSpec(gpu="gb200", gpus=256, gpus_per_node=4, nvlink_domain=72))
    run = evaluate(model, job, layout, gb200, topo)  # evaluate prices the job on its GPU
    assert run.memory.weights_bytes == on_gb200.weights_bytes
    assert run.memory_per_gpu_bytes <= run.memory_capacity_bytes
    assert on_h100.total_bytes > run.memory_capacity_bytes  # with 2-byte weights the recipe that ran would not fit
