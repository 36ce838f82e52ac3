"""Goodput-aware solving and stragglers: checkpoint bytes from the memory accounting, the objective inside the
solver's exact machinery, where it changes the pick (and where it does not), and bad input."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optlayout.conditions import reliability as rel
from optlayout.conditions.goodput import GoodputModel, checkpoint_state, failure_spec, storage_spec
from optlayout.conditions.stragglers import with_straggler
from optlayout.cost import CostParams, usable_memory_bytes
from optlayout.errors import OptlayoutError
from optlayout.planning import estimate_run, solve
from optlayout.presets import model_preset
from optlayout.solver.candidates import CostTable
from optlayout.solver.cpsat import Limits
from optlayout.solver.oracle import oracle_ranking
from optlayout.solver.space import SpaceOptions, enumerate_layouts
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec, Sharding
from optlayout.topology import topology_from_cluster
from tests.conftest import run_main

HOUR, GB = 3600.0, 1e9
NO_RESERVE = CostParams(runtime_reserve_bytes=0)
# Llama 3's 419 interruptions in 54 days on 16,384 GPUs: 1.97e-5 failures per GPU-hour
LLAMA3_RATE_PER_GPU_HOUR = 419 / (54 * 24 * 16384)


# --- checkpoint bytes ---------------------------------------------------------------------------------


@st.composite
def model_and_layout(draw):
    heads = draw(st.sampled_from([4, 8]))
    model = ModelSpec(layers=draw(st.integers(1, 12)), hidden=heads * 32, ffn=heads * 96, heads=heads,
                      kv_heads=draw(st.sampled_from([1, 2, 4])), vocab=draw(st.sampled_from([500, 4096])),
                      tied_embeddings=draw(st.booleans()))  # fmt: skip
    gpus = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    options = SpaceOptions(max_micro_batch=1, max_vp=2, max_cp=4)
    layouts = list(enumerate_layouts(model, JobSpec(seq_len=256, global_batch=64), gpus, 8, options))
    if not layouts:
        return model, None, 8
    return model, draw(st.sampled_from(layouts)), draw(st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=150, deadline=None)
@given(model_and_layout())
def test_unique_state_is_the_same_for_every_layout(case) -> None:
    """Dividing replicated weights (by dp x cp unless FSDP) and replicated optimizer state (by dp x cp under
    plain DDP) by their replication factor leaves params x (2 + 12) bytes whatever the layout; the per-node
    loads add up to it too."""
    model, layout, per_node = case
    if layout is None:
        return
    job = JobSpec(seq_len=256, global_batch=64)
    state = checkpoint_state(model, job, layout, per_node)
    assert state.unique_bytes == pytest.approx(model.param_count * 14, rel=1e-12)
    assert state.nodes == math.ceil(layout.gpus / per_node)
    assert state.largest_node_bytes >= state.unique_bytes / state.nodes * (1 - 1e-12)


@pytest.mark.parametrize(
    ("preset", "layout"),
    [
        ("mixtral-8x7b", Layout(dp=8, ep=8, grad_accum=16, sharding="zero1")),
        (
            "mixtral-8x7b",
            Layout(tp=2, pp=4, dp=4, ep=4, etp=2, grad_accum=32, sharding="zero1", sequence_parallel=True),
        ),
        ("deepseek-v3", Layout(tp=2, pp=2, dp=4, ep=8, grad_accum=32, sharding="zero1", sequence_parallel=True)),
        ("deepseek-v3", Layout(tp=8, pp=16, dp=8, ep=64, grad_accum=32, sharding="fsdp", sequence_parallel=True)),
    ],
)
def test_moe_checkpoint_writes_every_parameter_once(preset: str, layout: Layout) -> None:
    """Routed experts are split over etp x ep and replicated over expert-DP, MLA's down projections and the
    router over tp: whatever the split, the checkpoint holds each of the preset's parameters once, x 14 B."""
    model = model_preset(preset)
    job = JobSpec(seq_len=4096, global_batch=1024)
    state = checkpoint_state(model, job, layout, 8)
    assert state.unique_bytes == pytest.approx(model.param_count * 14, rel=1e-9)
    assert state.largest_node_bytes >= state.unique_bytes / state.nodes * (1 - 1e-12)


def test_state_written_and_staged_for_8b_on_64_gpus() -> None:
    # 8.03e9 params x 14 B = 112.4 GB written by every layout. Staged per GPU for the async copy (tp = 1):
    # DDP 112.4 GB; ZeRO-1 16.06 GB weights + 96.4 / 64 = 1.51 GB optimizer = 17.57 GB; FSDP 112.4 / 64 = 1.76 GB.
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=128)
    staged = {}
    for sharding in Sharding:
        state = checkpoint_state(model, job, Layout(dp=64, grad_accum=2, sharding=sharding), 8)
        assert state.unique_bytes / GB == pytest.approx(112.42, abs=0.01)
        assert state.nodes == 8 and state.largest_node_bytes == pytest.approx(state.unique_bytes / 8)
        staged[sharding] = state.resident_bytes_per_gpu / GB
    assert staged[Sharding.none] == pytest.approx(112.42, abs=0.01)
    assert staged[Sharding.zero1] == pytest.approx(17.57, abs=0.01)
    assert staged[Sharding.zero2] == pytest.approx(staged[Sharding.zero1])  # gradients are not saved
    assert staged[Sharding.fsdp] == pytest.approx(1.757, abs=0.001)


def test_even_stages_write_like_the_reliability_module() -> None:
    # pp = 1: every node writes 1/8 of 112.4 GB; capped at 2 GB/s per node x 8 nodes = 16 GB/s < 50 GB/s
    # aggregate -> 112.4 / 16 = 7.03 s, the same as reliability.checkpoint_write_s(state, 50, 2, 8).
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=128)
    storage = storage_spec(write_Bps=50 * GB, per_node_write_Bps=2 * GB)
    gm = GoodputModel(model, job, failure_spec(mtbf_s=10 * HOUR, restart_s=0), storage, 8)
    est = gm.estimate(Layout(dp=64, grad_accum=2, sharding="zero1"))
    assert est.write_s == pytest.approx(rel.checkpoint_write_s(model.param_count * 14, 50 * GB, 2 * GB, 8))
    assert est.write_s == pytest.approx(7.03, abs=0.01) and est.checkpoint_s == est.write_s
    # young: tau = sqrt(2 x 7.03 x 36000) = 711 s; fraction 1 - sqrt(2 x 7.03 / 36000) = 0.9802
    assert est.interval_s == pytest.approx(math.sqrt(2 * est.checkpoint_s * 10 * HOUR))
    assert est.effective_time_fraction == pytest.approx(rel.goodput_fraction(10 * HOUR, est.checkpoint_s, 0.0))
    assert est.effective_time_fraction == pytest.approx(0.9802, abs=1e-4)


def test_pipeline_stages_holding_the_embedding_write_more() -> None:
    # 8B, pp = 4 (8 layers of 218 M params each): stage 0 adds the 525 M embedding, stage 3 the 525 M output
    # layer: 2.27 B of 8.03 B on each end stage, so their nodes write 2.27 / (8.03 / 4) = 1.13x the average.
    model = model_preset("llama3.1-8b")
    job = JobSpec(seq_len=8192, global_batch=128)
    state = checkpoint_state(model, job, Layout(tp=8, pp=4, dp=2, grad_accum=64, sharding="zero1"), 8)
    assert state.nodes == 8
    assert state.largest_node_bytes / (state.unique_bytes / 8) == pytest.approx(1.131, abs=0.002)


# --- the objective inside the solver ------------------------------------------------------------------


@st.composite
def goodput_problems(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    model = ModelSpec(layers=draw(st.integers(1, 8)), hidden=heads * 32, ffn=draw(st.sampled_from([2, 4])) * heads * 32,
                      heads=heads, kv_heads=draw(st.sampled_from([k for k in (1, 2) if heads % k == 0])),
                      vocab=draw(st.sampled_from([500, 4096])))  # fmt: skip
    per_node = draw(st.sampled_from([2, 4, 8]))
    gpus = draw(st.sampled_from([n for n in (2, 4, 8, 16) if n <= per_node or n % per_node == 0]))
    cluster = ClusterSpec(gpu="h100-sxm", gpus=gpus, gpus_per_node=per_node)
    job = JobSpec(seq_len=draw(st.sampled_from([128, 256])), global_batch=draw(st.sampled_from([8, 16, 32])),
                  memory_headroom=0.999)  # fmt: skip
    failure = failure_spec(mtbf_s=draw(st.floats(2e4, 1e6)), restart_s=draw(st.floats(0, 600)))
    storage = storage_spec(
        write_Bps=draw(st.floats(1e5, 1e8)),
        per_node_write_Bps=draw(st.one_of(st.none(), st.floats(1e4, 1e7))),
        asynchronous=draw(st.booleans()),
        d2h_Bps=draw(st.floats(1e3, 1e6)),
    )
    return model, cluster, job, failure, storage, draw(st.integers(1, 3))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(goodput_problems())
def test_goodput_solver_top_k_equals_goodput_oracle(problem) -> None:
    """The skyline, the largest-accumulation reduction and the CP-SAT objective stay exact under goodput:
    the solver's top k is the exhaustive oracle's when both rank by throughput x effective time fraction."""
    model, cluster, job, failure, storage, k = problem
    topo = topology_from_cluster(cluster)
    try:
        plan = solve(model, topo, job, top=k, params=NO_RESERVE, objective="goodput", failure=failure,
                     storage=storage, max_micro_batch=4, max_vp=4, max_cp=8)  # fmt: skip
    except OptlayoutError as exc:  # the cheapest checkpoint is not shorter than the MTBF: a clear error
        assert str(exc).startswith("goodput: MTBF")
        return
    gm = GoodputModel(model, job, failure, storage, topo.gpus_per_server)
    table = CostTable(model, job, topo.gpu, topo, NO_RESERVE, gm)
    limits = Limits(usable_memory_bytes(topo.gpu.memory_bytes, job))
    options = SpaceOptions(max_micro_batch=4, max_vp=4, max_cp=8)
    truth = oracle_ranking(model, job, topo.num_gpus, topo.domain_size, table, options, limits)
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:k]]
    for p in plan.layouts:
        assert p.goodput is not None
        assert p.goodput.goodput_tokens_per_s_per_gpu == pytest.approx(
            p.prediction.tokens_per_s_per_gpu * p.goodput.effective_time_fraction
        )


def test_goodput_solve_returns_goodput_fields_and_json(capsys, monkeypatch) -> None:
    code, out, err = run_main(capsys, monkeypatch, "solve", "--model", "llama3.1-8b", "--cluster",
                              "gpu=h100-sxm,gpus=16", "--seq-len", "4096", "--global-batch", "64", "--top", "2",
                              "--objective", "goodput", "--mtbf-hours", "2", "--storage-gbytes-per-s", "20",
                              "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["objective"] == "goodput" and len(data["layouts"]) == 2
    for row in data["layouts"]:
        for key in ("mfu", "tokens_per_s_per_gpu", "step_time_s", "memory_per_gpu_bytes", "bubble_fraction"):
            assert key in row["prediction"]  # the existing keys are untouched
        g = row["goodput"]
        for key in ("effective_time_fraction", "checkpoint_s", "interval_s", "goodput_tokens_per_s_per_gpu"):
            assert key in g
        # synchronous: 112.4 GB at 20 GB/s = 5.62 s; young: sqrt(2 x 5.62 / 7200) = 3.95%, restart 600 / 7200 = 8.33%
        assert g["checkpoint_s"] == pytest.approx(5.62, abs=0.01)
        assert g["interval_s"] == pytest.approx(math.sqrt(2 * 5.62 * 7200), rel=1e-3)
        assert g["effective_time_fraction"] == pytest.approx(1 - 0.0395 - 0.0833, abs=2e-4)
        tps = row["prediction"]["tokens_per_s_per_gpu"]
        assert g["goodput_tokens_per_s_per_gpu"] == pytest.approx(tps * g["effective_time_fraction"])


def test_mfu_objective_with_failure_inputs_only_reports_goodput() -> None:
    job = JobSpec(seq_len=4096, global_batch=64)
    plain = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, top=3)
    priced = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, top=3, failure={"mtbf_s": 7200},
                   storage={"write_Bps": 20e9})  # fmt: skip
    assert [p.layout for p in plain.layouts] == [p.layout for p in priced.layouts]
    assert all(p.goodput is None for p in plain.layouts) and all(p.goodput for p in priced.layouts)


# --- where the pick changes, and where it does not ----------------------------------------------------


def test_goodput_takes_fsdp_only_when_its_shorter_pause_outweighs_its_exposed_gathers() -> None:
    """8B on 64 H100 (8 servers), async checkpoints.

    FSDP hides each layer's gathers under the previous layer's compute but not the first gather of the forward
    and of the backward, nor the last reduce-scatter: per micro-batch 2 all-gathers + 1 reduce-scatter of one
    layer's 8.03B x 2 B / 32 = 502 MB over 64 ranks, at 8 NICs x 50 GB/s x 0.85 = 340 GB/s per GPU: 63/64 x
    502 MB / 340 GB/s = 1.453 ms, plus NCCL's ring latency 8.4 us + 56 NVLink steps x 3.4 us + 7 network steps x
    14 us = 0.297 ms; 2 micro-batches: 10.5 ms a step, 0.75% of it. An async checkpoint pauses training while
    each GPU copies what it holds to host memory: ZeRO-1 holds all 16 GB of bf16 weights plus 1/64 of the
    optimizer state (17.6 GB, 0.70 s at 25 GB/s), FSDP 1/64 of everything (1.76 GB, 0.07 s). At Llama 3's
    failure rate (MTBF of 64 GPUs: 792 h) the shorter pause buys 0.05% and goodput keeps ZeRO-1, as MFU does;
    with a failure every 30 minutes it buys more than the 0.75% and goodput takes FSDP."""
    job = JobSpec(seq_len=8192, global_batch=128)
    cluster = "gpu=h100-sxm,gpus=64"
    llama3 = {"gpu_failure_rate_per_s": LLAMA3_RATE_PER_GPU_HOUR / HOUR}
    storage = {"write_Bps": 100e9, "asynchronous": True}
    by_mfu = solve("llama3.1-8b", cluster, job, failure=llama3, storage=storage).best
    assert by_mfu.layout.sharding == Sharding.zero1 and by_mfu.layout.grad_accum == 2
    fsdp = estimate_run("llama3.1-8b", cluster, job, by_mfu.layout.model_copy(update={"sharding": Sharding.fsdp}),
                        failure=llama3, storage=storage)  # fmt: skip
    transfer = 63 / 64 * 8.03e9 * 2 / 32 / (8 * 50e9 * 0.85)
    latency = 8.4e-6 + 56 * 3.4e-6 + 7 * 14e-6
    assert fsdp.prediction.time["dp_comm_s"] == pytest.approx(2 * 3 * (transfer + latency), rel=2e-3)
    assert by_mfu.goodput.mtbf_s / HOUR == pytest.approx(792, abs=1)
    assert by_mfu.goodput.checkpoint_s == pytest.approx(0.703, abs=0.001)
    assert fsdp.goodput.checkpoint_s == pytest.approx(0.0703, abs=0.0001)
    assert solve("llama3.1-8b", cluster, job, objective="goodput", failure=llama3, storage=storage).best.layout == (
        by_mfu.layout
    )
    frequent = {"mtbf_s": 1800}
    by_goodput = solve("llama3.1-8b", cluster, job, objective="goodput", failure=frequent, storage=storage).best
    assert by_goodput.layout == fsdp.layout
    assert by_goodput.prediction.tokens_per_s_per_gpu < by_mfu.prediction.tokens_per_s_per_gpu


def test_goodput_trades_throughput_for_a_shorter_pause_only_under_extreme_inputs() -> None:
    """A case where goodput takes a strictly slower layout: 70B on 64 H100 at 8K without FSDP (Megatron's
    shardings), async checkpoints at 1 GB/s device-to-host, and a failure every 30 minutes.

    MFU's pick tp2 pp4 vp5 cp4 ZeRO-1 holds 31.8 GB of weights + optimizer per GPU (31.8 s pause); tp4 pp4 vp5
    ZeRO-2 holds 22.7 GB (22.7 s) and is ~4% slower, but the shorter pause buys more effective time, so its
    goodput is higher (at 2.5 GB/s goodput keeps MFU's pick in this cost model: the trade needs extreme inputs).
    At Llama 3's failure rate (MTBF 792 h for 64 GPUs) the pick does not change: the pause is seconds against
    weeks. (A day's MTBF already trades 0.1% throughput between near-ties.)"""
    job = JobSpec(seq_len=8192, global_batch=256)
    common = dict(exclude={"sharding": ["fsdp"]}, failure={"mtbf_s": 1800},
                  storage={"write_Bps": 100e9, "asynchronous": True, "d2h_Bps": 1e9})  # fmt: skip
    by_mfu = solve("llama3.1-70b", "gpu=h100-sxm,gpus=64", job, **common).best
    by_goodput = solve("llama3.1-70b", "gpu=h100-sxm,gpus=64", job, objective="goodput", **common).best
    assert by_mfu.layout != by_goodput.layout
    assert by_goodput.prediction.tokens_per_s_per_gpu < by_mfu.prediction.tokens_per_s_per_gpu
    assert by_goodput.goodput.staged_bytes_per_gpu < by_mfu.goodput.staged_bytes_per_gpu
    assert by_goodput.goodput.effective_time_fraction > by_mfu.goodput.effective_time_fraction
    assert by_goodput.goodput.goodput_tokens_per_s_per_gpu > by_mfu.goodput.goodput_tokens_per_s_per_gpu
    realistic = dict(common, failure={"gpu_failure_rate_per_s": LLAMA3_RATE_PER_GPU_HOUR / HOUR})
    assert solve("llama3.1-70b", "gpu=h100-sxm,gpus=64", job, objective="goodput", **realistic).best.layout == (
        by_mfu.layout
    )


def test_synchronous_checkpoints_cost_every_layout_alike() -> None:
    """Slow storage and frequent failures, synchronous checkpoints: every layout writes the same 112.4 GB
    (pp = 1 layouts spread it evenly over the same 2 nodes), so the pick does not change."""
    job = JobSpec(seq_len=4096, global_batch=64)
    common = dict(top=3, failure={"mtbf_s": 1800}, storage={"write_Bps": 5e9, "per_node_write_Bps": 2e9})
    by_mfu = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, **common)
    by_goodput = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, objective="goodput", **common)
    assert by_goodput.best.layout == by_mfu.best.layout
    # 112.4 GB / min(5, 2 x 2) GB/s = 28.1 s
    assert {round(p.goodput.checkpoint_s, 1) for p in by_goodput.layouts} == {28.1}


# --- stragglers ---------------------------------------------------------------------------------------


def test_straggler_slowdown_divides_throughput_and_keeps_the_order(capsys, monkeypatch) -> None:
    # slowdown 0.02: step x 1.02, tokens/s and MFU / 1.02; the cost model's own prediction is unchanged
    job = JobSpec(seq_len=4096, global_batch=64)
    plain = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, top=3)
    slow = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, top=3, straggler_slowdown=0.02)
    assert [p.layout for p in slow.layouts] == [p.layout for p in plain.layouts]
    for a, b in zip(plain.layouts, slow.layouts, strict=True):
        assert b.prediction == a.prediction and a.straggler is None
        assert b.straggler.step_time_s == pytest.approx(a.prediction.step_time_s * 1.02)
        assert b.straggler.tokens_per_s_per_gpu == pytest.approx(a.prediction.tokens_per_s_per_gpu / 1.02)
        assert b.straggler.mfu == pytest.approx(a.prediction.mfu / 1.02)
    code, out, err = run_main(capsys, monkeypatch, "solve", "--model", "llama3.1-8b", "--cluster",
                              "gpu=h100-sxm,gpus=16", "--seq-len", "4096", "--global-batch", "64",
                              "--straggler-slowdown", "0.02", "--json")  # fmt: skip
    assert code == 0, err
    row = json.loads(out)["layouts"][0]
    assert row["straggler"]["tokens_per_s_per_gpu"] == pytest.approx(row["prediction"]["tokens_per_s_per_gpu"] / 1.02)


def test_straggler_and_goodput_combine_in_estimate_run() -> None:
    job = JobSpec(seq_len=4096, global_batch=64)
    layout = Layout(dp=16, micro_batch=2, grad_accum=2, sharding="zero1")
    run = estimate_run("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, layout, straggler_slowdown=0.05,
                       failure={"mtbf_s": 7200}, storage={"write_Bps": 20e9})  # fmt: skip
    assert run.straggler.tokens_per_s_per_gpu == pytest.approx(run.prediction.tokens_per_s_per_gpu / 1.05)
    assert run.goodput.goodput_tokens_per_s_per_gpu == pytest.approx(
        run.prediction.tokens_per_s_per_gpu / 1.05 * run.goodput.effective_time_fraction
    )
    assert with_straggler(run.prediction, 0.0).tokens_per_s_per_gpu == run.prediction.tokens_per_s_per_gpu


# --- bad input ----------------------------------------------------------------------------------------

SOLVE = ("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
         "--global-batch", "64", "--objective", "goodput")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--mtbf-hours", "0", "--storage-gbytes-per-s", "10"), "--mtbf-hours must be a finite number > 0"),
        (("--mtbf-hours", "-2", "--storage-gbytes-per-s", "10"), "--mtbf-hours must be a finite number > 0"),
        (("--mtbf-hours", "2", "--storage-gbytes-per-s", "0"), "--storage-gbytes-per-s must be a finite number > 0"),
        (("--mtbf-hours", "2", "--storage-gbytes-per-s", "-5"), "--storage-gbytes-per-s must be a finite number > 0"),
        (("--mtbf-hours", "2", "--storage-gbytes-per-s", "10", "--per-node-gbytes-per-s", "0"), "--per-node"),
        (("--failures", "0", "--days", "3", "--storage-gbytes-per-s", "10"), "--failures must be"),
        (("--gpu-failure-rate-per-hour", "-1", "--storage-gbytes-per-s", "10"), "--gpu-failure-rate-per-hour"),
        # 112.4 GB at 1 GB/s = 1.87 min, against a failure every 0.6 min
        (("--mtbf-hours", "0.01", "--storage-gbytes-per-s", "1"), "not longer than the checkpoint cost 1.87 min"),
        # async: the 0.9 s pause fits, but a 10-minute restart after every 36-second MTBF leaves nothing
        (("--mtbf-hours", "0.01", "--storage-gbytes-per-s", "100", "--async-checkpoint"), "leaves no training time"),
        ((), "objective goodput: needs failure"),
        (("--mtbf-hours", "2"), "needs --storage-gbytes-per-s"),
        (("--mtbf-hours", "2", "--failures", "4", "--days", "1", "--storage-gbytes-per-s", "9"), "one MTBF source"),
        (("--mtbf-hours", "2", "--storage-gbytes-per-s", "9", "--straggler-slowdown", "-0.1"), "straggler slowdown"),
    ],
)
def test_bad_goodput_input_is_one_line_exit_2(args, needle, capsys, monkeypatch) -> None:
    code, _, err = run_main(capsys, monkeypatch, *SOLVE, *args)
    assert code == 2
    assert needle in err and err.startswith("error: ") and err.count("\n") == 1


def test_bad_goodput_input_in_the_library() -> None:
    with pytest.raises(OptlayoutError, match=r"failure: mtbf_s: Input should be greater than 0"):
        failure_spec(mtbf_s=0)
    with pytest.raises(OptlayoutError, match=r"storage: write_Bps: Input should be greater than 0"):
        storage_spec(write_Bps=-1)
    with pytest.raises(OptlayoutError, match="exactly one of mtbf_s and gpu_failure_rate_per_s"):
        failure_spec(mtbf_s=3600, gpu_failure_rate_per_s=1e-9)
    with pytest.raises(OptlayoutError, match="objective: must be one of mfu, goodput"):
        solve("llama3.1-8b", "gpu=h100-sxm,gpus=8", JobSpec(seq_len=4096, global_batch=8), objective="speed")
