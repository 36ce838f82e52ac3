"""The CP-SAT solver against the exhaustive oracle, published layouts, and infeasible requests."""

from __future__ import annotations

import heapq
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optlayout.conditions.goodput import GoodputModel, failure_spec, storage_spec
from optlayout.cost import CostParams, usable_memory_bytes
from optlayout.cost.memory import memory_floor_bytes
from optlayout.errors import OptlayoutError
from optlayout.layout import layout_problems
from optlayout.planning import solve
from optlayout.runs.uncertainty import LayoutUncertainty, Quantiles, Support, Uncertainty
from optlayout.solver.candidates import CostTable, capacity_mib, memory_mib, variant_bound
from optlayout.solver.cpsat import Limits, passes_limits
from optlayout.solver.oracle import oracle_ranking
from optlayout.solver.space import FAMILY_AXES, SpaceOptions, enumerate_groups, node_key, space_nodes, space_options
from optlayout.specs import ClusterSpec, JobSpec, ModelSpec, Recompute
from optlayout.topology import topology_from_cluster

NO_RESERVE = CostParams(runtime_reserve_bytes=0)
# An uncertainty under which the small problems' layouts get different conservative factors: regimes with their own
# quantiles (short CP chunks, interleaving), one with too few runs (thin stages), an unmeasured GPU (a100-40gb) and
# degrees outside the support; the overall high quantile is negative, so factors above 1 occur too.
ROBUST = Uncertainty(
    overall=Quantiles(runs=50, low=-0.3, median=-0.1, high=-0.02),
    unmeasured_gpu=Quantiles(runs=50, low=-0.2, median=0.1, high=0.25),
    regime_runs={"cp_short_chunks": 9, "interleaved": 12, "thin_stages": 3},
    regimes={"cp_short_chunks": Quantiles(runs=9, low=-0.1, median=0.2, high=0.4),
             "interleaved": Quantiles(runs=12, low=-0.25, median=0.0, high=0.07)},
    support=Support(categories={"gpu": ["h100-sxm/bf16"]},
                    ranges={"seq_len": [1, 1e6], "tp": [1, 8], "pp": [1, 2], "vp": [1, 4], "cp": [1, 8], "dp": [1, 4],
                            "cp_chunk_tokens": [1, 1e6], "layers_per_chunk": [1, 100], "fsdp_shards": [1, 1e6]}),
)  # fmt: skip


def robust_rank(model: ModelSpec, job: JobSpec, gpu: str) -> LayoutUncertainty:
    return LayoutUncertainty.on(ROBUST, model, job, gpu)


@st.composite
def problems(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
    head_dim = draw(st.sampled_from([16, 32]))
    model = ModelSpec(
        layers=draw(st.integers(1, 8)),
        hidden=heads * head_dim,
        ffn=draw(st.sampled_from([2, 3, 4])) * heads * head_dim,
        heads=heads,
        kv_heads=kv,
        vocab=draw(st.sampled_from([500, 1000, 4096])),
        mlp=draw(st.sampled_from(["swiglu", "gelu", "relu2"])),
    )
    per_node = draw(st.sampled_from([2, 4, 8]))
    gpus = draw(st.sampled_from([n for n in (1, 2, 4, 8, 16) if n <= per_node or n % per_node == 0]))
    cluster = ClusterSpec(gpu=draw(st.sampled_from(["h100-sxm", "a100-40gb"])), gpus=gpus, gpus_per_node=per_node)
    seq = draw(st.sampled_from([128, 256, 512]))
    if draw(st.booleans()):
        job = JobSpec(seq_len=seq, global_batch=draw(st.sampled_from([8, 16, 32, 64])),
                      memory_headroom=draw(st.floats(0.99, 0.9995)))  # fmt: skip
    else:
        lo = draw(st.sampled_from([4, 8, 16]))
        job = JobSpec(seq_len=seq, min_global_batch=lo, max_global_batch=lo * draw(st.sampled_from([1, 2, 4])),
                      memory_headroom=draw(st.floats(0.99, 0.9995)))  # fmt: skip
    return model, cluster, job, draw(st.integers(1, 4))


def assert_nodes_walk_as_groups(model: ModelSpec, job: JobSpec, topo, options: SpaceOptions, k: int) -> None:
    """`space_nodes` holds `enumerate_groups`' groups, each node's in their order, the nodes in the order their first
    group comes, with the space's layout count; and the walk over it evaluates what the walk over the groups does."""
    groups = list(enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options))
    space = space_nodes(model, job, topo.num_gpus, topo.domain_size, options)
    by_node: dict[tuple, list] = {}
    for g in groups:
        d = g.degrees
        by_node.setdefault((d["tp"], d["cp"], d["micro_batch"], d["ep"], d["etp"]), []).append(g)
    assert all(node_key(g) == key for key, members in by_node.items() for g in members)
    assert [space.groups(node) for node in space.nodes] == list(by_node.values())
    assert space.layout_count == sum(len(g) for g in groups)
    limits = Limits(usable_memory_bytes(topo.gpu.memory_bytes, job), job.min_global_batch, job.max_global_batch)
    table = CostTable(model, job, topo.gpu, topo, NO_RESERVE)
    want, want_count = table.evaluated_candidates(groups, limits, k)
    table = CostTable(model, job, topo.gpu, topo, NO_RESERVE)
    got, got_count = table.evaluated_candidates(space, limits, k)
    assert [c.layout for c in got] == [c.layout for c in want] and got_count == want_count
    assert_bounds_lead_in_order(model, job, topo, options)


def assert_bounds_lead_in_order(model: ModelSpec, job: JobSpec, topo, options: SpaceOptions) -> None:
    """What `CostTable.best_first`'s lazy bounds rely on: each `family_bound` is at least the `node_bound` of every
    node of its family, and each group's `pipeline_bound` at least its own bound (`throughput_bound`, at most its
    node's); and the walk yields the groups, with their bounds, in the order bounding every node and group first
    does."""
    table = CostTable(model, job, topo.gpu, topo)
    space = space_nodes(model, job, topo.num_gpus, topo.domain_size, options)
    node_tps = [table.node_bound(space.groups(node[:1])[0], space.most_dp_pp(node)) for node in space.nodes]
    families: dict[tuple, list[int]] = {}
    for i, node in enumerate(space.nodes):
        families.setdefault(space.key(node)[: len(FAMILY_AXES)], []).append(i)
    for family in families.values():
        bound = table.family_bound(space.groups(space.nodes[family[0]][:1])[0],
                                   max(space.most_dp_pp(space.nodes[i]) for i in family))  # fmt: skip
        assert all(node_tps[i] <= bound for i in family)
    heap: list = [(-tps, i, node) for i, (tps, node) in enumerate(zip(node_tps, space.nodes, strict=True))]
    heapq.heapify(heap)
    count, eager = len(heap), []
    while heap:
        priority, _, entry = heapq.heappop(heap)
        if isinstance(entry, list):
            for g in space.groups(entry):
                count += 1
                bound = min(table.throughput_bound(g), -priority)
                assert bound <= table.pipeline_bound(g, -priority, space.most_dp_pp(entry))
                heapq.heappush(heap, (-bound, count, g))
        else:
            eager.append((-priority, entry.degrees))
    lazy = CostTable(model, job, topo.gpu, topo).best_first(space)
    assert [(bound, g.degrees) for bound, g in lazy] == eager


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([{}, {"rl": 1}, {"rm": "core_attn+mlp"}, {"sharding": "zero1"}]))
def test_the_space_in_nodes_is_walked_as_its_groups(problem, pins) -> None:
    model, cluster, job, k = problem
    options = space_options(pins, max_micro_batch=4, max_vp=4, max_cp=8, allow_idle_gpus=k % 2 == 0)
    assert_nodes_walk_as_groups(model, job, topology_from_cluster(cluster), options, k)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans())
def test_solver_top_k_equals_oracle(problem, robust) -> None:
    """Under the cost model's throughput and under the robust objective (the conservative throughput)."""
    model, cluster, job, k = problem
    topo = topology_from_cluster(cluster)
    options = SpaceOptions(max_micro_batch=4, max_vp=4, max_cp=8)
    plan = solve(model, topo, job, top=k, params=NO_RESERVE, max_micro_batch=4, max_vp=4, max_cp=8,
                 uncertainty=ROBUST if robust else None, robust=robust)  # fmt: skip
    table = CostTable(model, job, topo.gpu, topo, NO_RESERVE, robust=robust_rank(model, job, cluster.gpu) if robust
                      else None)  # fmt: skip
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    limits = Limits(capacity, job.min_global_batch, job.max_global_batch)
    truth = oracle_ranking(model, job, topo.num_gpus, topo.domain_size, table, options, limits)
    got = [p.layout for p in plan.layouts]
    assert got == [c.layout for c in truth[:k]]
    assert plan.status == ("optimal" if truth else "infeasible")
    for planned in plan.layouts:  # every returned layout passes the cost model's own checks
        assert layout_problems(model, job, planned.layout, topo.num_gpus) == []
        assert planned.prediction.fits
        assert passes_limits(table.candidate(planned.layout), limits)
    # the evaluated candidates: only layouts that fit memory get a step time, and the top k are among them
    groups = enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options)
    evaluated, _ = table.evaluated_candidates(groups, limits, k)
    assert all(memory_mib(c.evaluation.memory_per_gpu_bytes) <= capacity_mib(capacity) for c in evaluated)
    assert {c.layout for c in truth[:k]} <= {c.layout for c in evaluated}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["mfu", "goodput", "robust"]), st.sampled_from([0.0, 0.9]),
       st.sampled_from([0.0, 0.01]))  # fmt: skip
def test_the_bounds_of_branch_and_bound_hold(problem, objective, dp_overlap, overhead_s) -> None:
    """What the reductions rely on, checked on the cost model itself: a group's `throughput_bound` and each
    evaluated layout's `variant_bound` (over the other shardings of its recomputation and sequence
    parallelism), times the group's largest robust factor (at most the table's `bound_factor`), are at least the
    ranked throughput of every layout they bound."""
    model, cluster, job, _ = problem
    topo = topology_from_cluster(cluster)
    goodput = None
    if objective == "goodput":
        failure, storage = failure_spec(mtbf_s=3600.0), storage_spec(write_Bps=1e9)
        goodput = GoodputModel(model, job, failure, storage, topo.gpus_per_server)
    params = CostParams(runtime_reserve_bytes=0, dp_comm_overlap=dp_overlap, step_overhead_s=overhead_s)
    robust = robust_rank(model, job, cluster.gpu) if objective == "robust" else None
    table = CostTable(model, job, topo.gpu, topo, params, goodput, robust)
    options = SpaceOptions(max_micro_batch=4, max_vp=4, max_cp=8)
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    for group in enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options):
        bound = table.throughput_bound(group)
        factor = table.group_factor(group)
        assert factor <= table.bound_factor
        for recompute, sp in group.variants():
            variant = [table.candidate(group.layout(s, recompute, sp)) for s in group.shardings]
            for probe in variant:
                assert table.times(probe.layout) == probe.evaluation.times  # the bound's step time is evaluate's
                probe_bound = variant_bound(probe.layout, probe.evaluation.times, job.seq_len) * factor
                assert all(c.cluster_tokens_per_s <= probe_bound * (1 + 1e-12) for c in variant)
            assert all(c.cluster_tokens_per_s <= bound * factor * (1 + 1e-12) for c in variant)
            if recompute != Recompute.none:  # the twin rule's skip: the bounds of a recomputing layout as searched
                floor = table.recomputing_floor_tps(group.layout(group.shardings[0], recompute, sp))
                for s in group.shardings:
                    lay = group.layout(s, recompute, sp)
                    searched = table.candidate(table.fewest_recomputed(lay, capacity)).cluster_tokens_per_s
                    own = table.factor(lay)
                    assert searched <= min(floor, table.recomputing_tps(lay)) * own * (1 + 1e-12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([0.0, 0.5, 1.0]))
def test_a_group_overflows_exactly_when_each_of_its_layouts_does(problem, where) -> None:
    """What the walk's skip of a whole group relies on: `group_overflows` (the first-stage memory floor of each
    variant at the most sharded sharding) says a group overflows a capacity exactly when every one of its layouts'
    memory floors does; the capacities tried lie at the least, middle and largest floor of the space."""
    model, cluster, job, _ = problem
    topo = topology_from_cluster(cluster)
    table = CostTable(model, job, topo.gpu, topo)
    groups = list(enumerate_groups(model, job, topo.num_gpus, topo.domain_size, SpaceOptions(max_micro_batch=4)))
    floors = [[memory_mib(memory_floor_bytes(model, job, lay, table.params, None)) for lay in g.layouts()]
              for g in groups]  # fmt: skip
    every = sorted(f for fs in floors for f in fs)
    if not every:
        return
    cap = every[round(where * (len(every) - 1))]
    for group, fs in zip(groups, floors, strict=True):
        assert table.group_overflows(group, cap) == all(f > cap for f in fs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_least_memory_layout_is_the_first_of_least_memory(problem) -> None:
    """The infeasible diagnosis's layout: `least_memory`, which skips layouts by their memory floor, finds the layout
    `min` over every layout's memory finds (the first of the least, in the space's order)."""
    model, cluster, job, _ = problem
    topo = topology_from_cluster(cluster)
    table = CostTable(model, job, topo.gpu, topo)
    options = SpaceOptions(max_micro_batch=4)
    groups = list(enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options))
    layouts = [lay for g in groups for lay in g.layouts()]
    expected = min(layouts, key=CostTable(model, job, topo.gpu, topo).memory_bytes) if layouts else None
    assert table.least_memory(groups) == expected


def test_oracle_and_solver_agree_on_a_larger_space() -> None:
    # 8B on 64 H100: thousands of layouts; the CP-SAT top-3 must be the oracle's top-3.
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=64))
    job = JobSpec(seq_len=8192, global_batch=128)
    model_name = "llama3.1-8b"
    plan = solve(model_name, topo, job, top=3)
    from optlayout.presets import model_preset

    model = model_preset(model_name)
    table = CostTable(model, job, topo.gpu, topo)
    limits = Limits(usable_memory_bytes(topo.gpu.memory_bytes, job))
    truth = oracle_ranking(model, job, 64, topo.domain_size, table, SpaceOptions(), limits)
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:3]]
    assert len(truth) > 1000


def test_405b_on_8_gpus_is_infeasible_and_says_why() -> None:
    plan = solve("llama3.1-405b", "gpu=h100-sxm,gpus=8", JobSpec(seq_len=8192, global_batch=16))
    assert plan.status == "infeasible" and not plan.layouts
    # 405.9e9 x 16 B over 8 GPUs at tp 8 = 812 GB of state per GPU, against 81.6 GB usable (80 GiB less 5%)
    assert "state alone" in plan.diagnosis and "GB usable" in plan.diagnosis
    with pytest.raises(OptlayoutError, match="no layout"):
        _ = plan.best


def test_batch_bound_no_layout_can_meet() -> None:
    # 64 GPUs with tp <= 8, cp <= 2 (seq 4 / 2), pp <= 2 layers: dp >= 64 / 32 = 2, but the batch is 1.
    model = ModelSpec(layers=2, hidden=64, ffn=256, heads=8, kv_heads=8, vocab=1000)
    plan = solve(model, "gpu=h100-sxm,gpus=64", JobSpec(seq_len=4, global_batch=1), max_cp=2)
    assert plan.status == "infeasible"
    assert "global batch" in plan.diagnosis and "dp >= 2" in plan.diagnosis


def test_pins_and_maxima_are_respected() -> None:
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64), top=3,
                 pins={"tp": 2, "sharding": "fsdp"}, maxima={"pp": 1})  # fmt: skip
    assert plan.layouts
    for p in plan.layouts:
        assert p.layout.tp == 2 and p.layout.sharding.value == "fsdp" and p.layout.pp == 1


def test_unknown_pin_is_a_clear_error() -> None:
    with pytest.raises(OptlayoutError, match="unknown layout field 'tq'"):
        solve("llama3.1-8b", "gpu=h100-sxm,gpus=8", JobSpec(seq_len=4096, global_batch=8), pins={"tq": 2})


def test_cli_solve_json_schema_and_save(cli, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    out = cli("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "64", "--top", "2", "--json", "--save", str(plan_path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] == "optimal" and len(data["layouts"]) == 2
    pred = data["layouts"][0]["prediction"]
    for key in ("mfu", "tokens_per_s_per_gpu", "step_time_s", "memory_per_gpu_bytes", "bubble_fraction"):
        assert key in pred
    lay = data["layouts"][0]["layout"]
    assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 16
    from optlayout.planning.plan import Plan

    assert Plan.load(plan_path).best.layout.model_dump(mode="json") == lay


def test_cli_infeasible_exits_1_with_reason(cli) -> None:
    out = cli("solve", "--model", "llama3.1-405b", "--cluster", "gpu=h100-sxm,gpus=8", "--seq-len", "8192",
              "--global-batch", "16")  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()  # the diagnosis: one line on stderr, never wrapped
    assert len(lines) == 1 and lines[0].startswith("infeasible: memory:") and "state alone" in lines[0]
    with_json = cli("solve", "--model", "llama3.1-405b", "--cluster", "gpu=h100-sxm,gpus=8", "--seq-len", "8192",
                    "--global-batch", "16", "--json")  # fmt: skip
    assert with_json.returncode == 1 and with_json.stderr == out.stderr
    assert json.loads(with_json.stdout)["diagnosis"] == lines[0].removeprefix("infeasible: ")


def test_explain_ranks_users_layout(cli) -> None:
    out = cli("explain", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "64", "--layout", "tp=8,pp=2,dp=1,mb=1,ga=64", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["rank"] > 1 and data["feasible"] > data["rank"]
    assert data["terms"][0]["delta_us"] >= data["terms"][-1]["delta_us"]


def test_saved_plan_of_older_schema_is_refused(tmp_path) -> None:
    from optlayout.planning.plan import Plan

    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 0, "status": "optimal"}))
    with pytest.raises(OptlayoutError, match="schema_version 0"):
        Plan.load(path)


def test_plan_emits_launcher_flags_and_emit_reads_saved_plan(cli, tmp_path) -> None:
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64), top=2)
    args = plan.best.to_megatron_args()
    lay = plan.best.layout
    flag = args.index("--tensor-model-parallel-size")
    assert args[flag + 1] == str(lay.tp)
    assert args[args.index("--global-batch-size") + 1] == "64"
    second = plan.layout_at(2).layout
    if second.pp == 1:  # DeepSpeed's ZeRO path has no pipeline stages
        ds = plan.layout_at(2).to_deepspeed_config()
        assert ds["train_batch_size"] == 64
        assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * second.dp == 64
    path = tmp_path / "plan.json"
    plan.save(path)
    out = cli("emit", "--plan", str(path), "--format", "megatron")
    assert out.returncode == 0, out.stderr
    assert f"--tensor-model-parallel-size {lay.tp}" in out.stdout
    bad = cli("emit", "--plan", str(path), "--format", "megatron", "--rank", "9")
    assert bad.returncode == 2 and "rank" in bad.stderr


def test_solve_writes_html_report(cli, tmp_path) -> None:
    report = tmp_path / "plan.html"
    out = cli("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "64", "--report", str(report))  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = report.read_text()
    assert "memory-chart" in text and "https://" not in text


def test_hand_edited_illegal_plan_is_refused(cli, tmp_path) -> None:
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64))
    path = tmp_path / "plan.json"
    plan.save(path)
    raw = json.loads(path.read_text())
    raw["layouts"][0]["layout"]["tp"] = 3  # 32 heads are not divisible by 3, and 3 x ... != 16 GPUs
    path.write_text(json.dumps(raw))
    out = cli("emit", "--plan", str(path), "--format", "megatron")
    assert out.returncode == 2
    assert "layout 1 is illegal" in out.stderr and "heads (32) not divisible by tp (3)" in out.stderr


def test_a_job_without_a_batch_is_refused_even_where_the_pins_leave_no_layout() -> None:
    model = ModelSpec(layers=2, hidden=64, ffn=256, heads=8, kv_heads=8, vocab=1000)
    no_sharding = space_options(exclude={"sharding": ["none", "zero1", "zero2", "fsdp"]})
    with pytest.raises(OptlayoutError, match="global batch"):
        list(enumerate_groups(model, JobSpec(seq_len=4), 8, 8, no_sharding))
    with pytest.raises(OptlayoutError, match="global batch"):
        space_nodes(model, JobSpec(seq_len=4), 8, 8, no_sharding)
