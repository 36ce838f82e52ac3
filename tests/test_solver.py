"""The CP-SAT solver against the exhaustive oracle, published layouts, and infeasible requests."""

from __future__ import annotations

import heapq
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optlayout.conditions.goodput import GoodputModel, failure_spec, storage_spec
from optlayout.cost import CostParams, usable_memory_bytes
from optlayout.cost.memory import memory_floor_bytes, most_stage_params
from optlayout.cost.step import dp_comm_floor_s
from optlayout.errors import OptlayoutError
from optlayout.layout import layout_problems
from optlayout.planning import solve
from optlayout.presets import model_preset
from optlayout.runs.uncertainty import LayoutUncertainty, Quantiles, Support, Uncertainty
from optlayout.solver.candidates import CostTable, capacity_mib, memory_mib, variant_bound
from optlayout.solver.cpsat import Limits, passes_limits
from optlayout.solver.oracle import oracle_ranking
from optlayout.solver.space import FAMILY_AXES, SpaceOptions, enumerate_groups, node_key, space_nodes, space_options
from optlayout.specs import ClusterSpec, JobSpec, ModelSpec, Recompute
from optlayout.topology import topology_from_cluster
from tests.conftest import ROOT

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
    node of its family, and each group's `pipeline_bound` at least its own bound (`throughput_bound` over the
    shardings whose state fits the GPU, at most its node's); and the walk yields the groups, with their bounds, in
    the order bounding every node and group first does."""
    table = CostTable(model, job, topo.gpu, topo)
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    space = space_nodes(model, job, topo.num_gpus, topo.domain_size, options)
    pairs = zip(space.nodes, space.most_dp_pp, strict=True)
    node_tps = [table.node_bound(space.groups(node[:1])[0], most) for node, most in pairs]
    families: dict[tuple, list[int]] = {}
    for i, node in enumerate(space.nodes):
        families.setdefault(space.key(node)[: len(FAMILY_AXES)], []).append(i)
    for family in families.values():
        bound = table.family_bound(space.groups(space.nodes[family[0]][:1])[0],
                                   max(space.most_dp_pp[i] for i in family))  # fmt: skip
        assert all(node_tps[i] <= bound for i in family)
    heap: list = [(-tps, i, node) for i, (tps, node) in enumerate(zip(node_tps, space.nodes, strict=True))]
    heapq.heapify(heap)
    count, eager = len(heap), []
    while heap:
        priority, index, entry = heapq.heappop(heap)
        if isinstance(entry, list):
            for g in space.groups(entry):
                count += 1
                bound = min(table.throughput_bound(g, capacity), -priority)
                assert bound <= table.pipeline_bound(g, -priority, space.most_dp_pp[index])
                heapq.heappush(heap, (-bound, count, g))
        else:
            eager.append((-priority, entry.degrees))
    lazy = CostTable(model, job, topo.gpu, topo).best_first(space, capacity)
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
        bound, fitting_bound = table.throughput_bound(group), table.throughput_bound(group, capacity)
        factor = table.group_factor(group)
        assert factor <= table.bound_factor and fitting_bound <= bound
        most = most_stage_params(model, group.cheapest_variant(), {})
        for recompute, sp in group.variants():
            variant = [table.candidate(group.layout(s, recompute, sp)) for s in group.shardings]
            for probe in variant:
                assert table.times(probe.layout) == probe.evaluation.times  # the bound's step time is evaluate's
                probe_bound = variant_bound(probe.layout, probe.evaluation.times, job.seq_len) * factor
                assert all(c.cluster_tokens_per_s <= probe_bound * (1 + 1e-12) for c in variant)
                # the group bound's data-parallel floor, at the heaviest compute of the probe's sharding
                heaviest = group.heaviest_variant(probe.layout.sharding)
                dp_floor_s = dp_comm_floor_s(model, job, heaviest, topo.gpu, table.links(heaviest), params,
                                             most.total, None, most.experts)  # fmt: skip
                assert dp_floor_s <= probe.evaluation.times.dp_comm_s * (1 + 1e-12)
            assert all(c.cluster_tokens_per_s <= bound * factor * (1 + 1e-12) for c in variant)
            assert all(c.cluster_tokens_per_s <= fitting_bound * factor * (1 + 1e-12)
                       for c in variant if table.state_fits(c.layout, capacity))  # fmt: skip
            if recompute != Recompute.none:  # the twin rule's skip: the bounds of a recomputing layout as searched
                floor = table.recomputing_floor_tps(group.layout(group.shardings[0], recompute, sp))
                for s in group.shardings:
                    lay = group.layout(s, recompute, sp)
                    searched = table.candidate(table.fewest_recomputed(lay, capacity)).cluster_tokens_per_s
                    own = table.factor(lay)
                    assert searched <= min(floor, table.recomputing_tps(lay)) * own * (1 + 1e-12)


@pytest.mark.parametrize("preset", ["llama3-8b", "qwen3-30b-a3b"])
def test_the_data_parallel_floor_holds_where_it_binds(preset: str) -> None:
    """What `throughput_bound`'s data-parallel term relies on, where it is partly hidden (100 Gb/s per GPU across
    two servers): `dp_comm_floor_s` at a group's `heaviest_variant` is at most the exposed data-parallel time of each
    of the group's layouts of that sharding, and lies strictly between 0 and it for some (taking the floor at the
    variant without recomputation, or with sequence parallelism, breaks the first)."""
    model, job = model_preset(preset), JobSpec(seq_len=4096, global_batch=64)
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16, inter_node_gbps_per_gpu=100))
    table = CostTable(model, job, topo.gpu, topo)
    options = SpaceOptions(max_micro_batch=2, max_vp=2, max_cp=2)
    inside = 0
    for group in enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options):
        most = most_stage_params(model, group.cheapest_variant(), {})
        for lay in group.layouts():
            heaviest = group.heaviest_variant(lay.sharding)
            floor_s = dp_comm_floor_s(model, job, heaviest, topo.gpu, table.links(heaviest), table.params,
                                      most.total, None, most.experts)  # fmt: skip
            exposed_s = table.times(lay).dp_comm_s
            assert floor_s <= exposed_s * (1 + 1e-12), lay
            inside += 0 < floor_s < exposed_s
    assert inside > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([0.0, 0.5, 1.0]))
def test_a_variant_overflows_exactly_when_each_of_its_layouts_does(problem, where) -> None:
    """What the walk's skip of a variant (and of a whole group) relies on: `overflowing_variants` (the first-stage
    memory floor of each variant at the most sharded sharding) holds a (recomputation, sequence parallelism) variant
    exactly when every one of its layouts' memory floors overflows a capacity; the capacities tried lie at the least,
    middle and largest floor of the space."""
    model, cluster, job, _ = problem
    topo = topology_from_cluster(cluster)
    table = CostTable(model, job, topo.gpu, topo)
    groups = list(enumerate_groups(model, job, topo.num_gpus, topo.domain_size, SpaceOptions(max_micro_batch=4)))
    floors = [{(r, sp): [memory_mib(memory_floor_bytes(model, job, g.layout(s, r, sp), table.params, None))
                         for s in g.shardings] for r, sp in g.variants()} for g in groups]  # fmt: skip
    every = sorted(f for fs in floors for v in fs.values() for f in v)
    if not every:
        return
    cap = every[round(where * (len(every) - 1))]
    for group, fs in zip(groups, floors, strict=True):
        assert table.overflowing_variants(group, cap) == {v for v, f in fs.items() if all(x > cap for x in f)}


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


@pytest.mark.parametrize(
    ("pins", "exclude", "said"),
    [
        ({"recompute_layers": 100}, None, "recompute_layers: 100 layers recomputed per model chunk, but a chunk has at "
         "most 32 (the model's 32 layers)"),
        ({"rl": 33, "recompute": "full"}, None, "recompute_layers: 33 layers"),
        ({"rl": 9, "pp": 4}, None, "recompute_layers: 9 layers recomputed per model chunk, but a chunk has at most 8"
         " (the model's 32 layers over pp x vp = 4 chunks)"),
        ({"rl": 4}, {"recompute": ["full"]}, "recompute_layers: a layer count (4) is full recomputation's, but "
         "recompute=full is excluded"),
        ({"recompute": "full"}, {"recompute": ["full"]}, "recompute: your pins and exclusions forbid every value "
         "(none, selective, full)"),
    ],
)  # fmt: skip
def test_an_impossible_recomputation_pin_is_diagnosed_by_its_rule(pins, exclude, said) -> None:
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=64", JobSpec(seq_len=4096, global_batch=128), pins=pins,
                 exclude=exclude)  # fmt: skip
    assert plan.status == "infeasible"
    assert plan.diagnosis.startswith(said.split(":")[0] + ":") and said in plan.diagnosis, plan.diagnosis
    assert "global batch" not in plan.diagnosis
    job = JobSpec(seq_len=4096, global_batch=128)
    fits = solve("llama3.1-8b", "gpu=h100-sxm,gpus=64", job, pins={"rl": 8, "pp": 4})
    assert fits.layouts and all(p.layout.recompute_layers == 8 for p in fits.layouts)


def test_cli_excludes_several_values_of_one_field(cli) -> None:
    base = ("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=64", "--seq-len", "4096",
            "--global-batch", "1024", "--top", "5", "--json")  # fmt: skip
    out = cli(*base, "--exclude", "recompute=full", "--exclude", "recompute=selective", "--exclude", "tp=1",
              "--exclude", "tp=2")  # fmt: skip
    assert out.returncode == 0, out.stderr
    layouts = [p["layout"] for p in json.loads(out.stdout)["layouts"]]
    assert len(layouts) == 5 and all(lay["recompute"] == "none" and lay["tp"] > 2 for lay in layouts)
    comma = cli(*base, "--exclude", "recompute=full,selective")
    assert comma.returncode == 2 and comma.stderr.startswith("error: exclude: 'selective'"), comma.stderr
    assert "--exclude recompute=full --exclude recompute=selective" in comma.stderr
    for option, word in (("--exclude", "exclude"), ("--max", "max"), ("--pin", "pin")):
        unknown = cli(*base, option, "tq=2")
        assert unknown.returncode == 2 and unknown.stderr.startswith(f"error: {word}: unknown layout field 'tq'")


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
    # every term of the step is named for people, the MoE token exchange too (no field names)
    assert {t["term"] for t in data["terms"]} == {
        "compute", "exposed TP communication", "exposed CP communication", "exposed EP communication",
        "pipeline send/receive", "pipeline bubble", "exposed DP communication", "optimizer step", "step overhead"}


def test_search_limits_are_stated_and_max_raises_them(cli) -> None:
    # the space bounds micro-batch, vp and cp beyond the rules; "optimal" holds within them, which solve states
    worked = ["--model", "llama3.1-70b", "--topology", str(ROOT / "topologies" / "worked-example-256x80gb.yaml"),
              "--seq-len", "4096", "--global-batch", "512", "--top", "1", "--json"]  # fmt: skip
    default = json.loads(cli("solve", *worked).stdout)
    assert default["search_limits"] == {"micro_batch": 16, "vp": 8, "cp": 64}
    wider = json.loads(cli("solve", *worked, "--max", "vp=40").stdout)
    assert wider["search_limits"]["vp"] == 40 and wider["status"] == "optimal"
    best = [d["layouts"][0]["prediction"]["tokens_per_s_per_gpu"] for d in (default, wider)]
    assert best[1] >= best[0]  # a superset of the space: never a worse optimum
    # 1M tokens on 1,024 GPUs at one sequence per step needs tp x cp = 1,024 (pp needs >= pp micro-batches): cp 128
    long = ["--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=1024", "--seq-len", "1048576",
            "--global-batch", "1", "--top", "1"]  # fmt: skip
    refused = cli("solve", *long)
    assert refused.returncode == 1 and "(searched mb <= 16, vp <= 8, cp <= 64; --max raises them)" in refused.stderr
    raised = json.loads(cli("solve", *long, "--max", "cp=128", "--json").stdout)
    assert raised["status"] == "optimal" and raised["layouts"][0]["layout"]["cp"] == 128
    # explain ranks a layout beyond the default limits among a space raised to hold it, never above the "best"
    mine = "tp=4,pp=2,vp=20,dp=32,mb=2,ga=8,sharding=zero2,recompute=none,sp"
    report = json.loads(cli("explain", *worked[:-3], "--layout", mine, "--json").stdout)
    assert report["search_limits"]["vp"] == 20 and report["best_mfu"] >= report["mfu"]


def test_a_plan_that_leaves_gpus_idle_is_usable_downstream(cli, tmp_path) -> None:
    # 70B on 200 GPUs at 512 sequences: the best layouts use 160 (dp 8 of 20-GPU model replicas), 40 idle
    path = tmp_path / "idle.json"
    args = ["--model", "llama3.1-70b", "--cluster", "gpu=h100-sxm,gpus=200", "--seq-len", "4096", "--global-batch",
            "512", "--allow-idle", "--top", "2"]  # fmt: skip
    solved = cli("solve", *args, "--save", str(path))
    assert solved.returncode == 0, solved.stderr
    data = json.loads(cli("solve", *args, "--json").stdout)
    used = data["layouts"][0]["gpus_used"]
    assert data["allow_idle_gpus"] and used < 200 and f"#1 uses {used} of 200 ({200 - used} idle)" in solved.stdout
    emitted = cli("emit", "-f", "megatron", "--plan", str(path))
    assert emitted.returncode == 0, emitted.stderr
    assert f"uses {used} of the plan's 200 GPUs" in emitted.stderr and f"# world {used} = " in emitted.stderr
    assert cli("solve", "--from-plan", str(path), "--gpus", "256").returncode == 0


def test_saved_plan_of_older_schema_is_refused(tmp_path) -> None:
    from optlayout.planning.plan import Plan

    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 0, "status": "optimal"}))
    with pytest.raises(OptlayoutError, match="schema_version 0"):
        Plan.load(path)


def test_a_time_limit_that_runs_out_before_any_layout_says_so(cli) -> None:
    # a nanosecond is too short for CP-SAT to find any layout or to prove there is none: status "unknown"
    plan = solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64), time_limit_s=1e-9)
    assert plan.status == "unknown" and not plan.layouts
    assert plan.diagnosis == (
        "time limit: the 1e-09 s time limit ran out before CP-SAT found a layout or proved there is none "
        "(status unknown, not infeasible); raise --time-limit"
    )  # before: "CP-SAT found no layout within 1e-09 s"
    out = cli("solve", "--model", "llama3.1-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "64", "--time-limit", "1e-9")  # fmt: skip
    assert out.returncode == 1 and out.stderr.strip().endswith(f"unknown: {plan.diagnosis}"), out.stderr


def test_emit_of_an_infeasible_plan_gives_its_diagnosis_and_of_a_config_says_not_a_plan(cli, tmp_path) -> None:
    from optlayout.planning.plan import Plan

    plan = solve("llama3.1-405b", "gpu=h100-sxm,gpus=8", JobSpec(seq_len=4096, global_batch=64))
    assert plan.status == "infeasible" and not plan.layouts and plan.diagnosis
    path = tmp_path / "inf.json"
    plan.save(path)
    with pytest.raises(OptlayoutError, match="plan: the plan is infeasible and holds no layout: memory: ") as err:
        Plan.load(path).layout_at(1)  # before: "rank: the plan holds layouts 1..0, not 1"
    assert plan.diagnosis in str(err.value)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32}))  # an HF config, say
    out = cli("emit", "--plan", str(config), "--format", "megatron")
    assert out.returncode == 2  # before: "schema_version None is not supported ... re-run solve --save"
    assert "plan: config.json is not a saved plan (no schema_version)" in out.stderr, out.stderr
    with pytest.raises(OptlayoutError, match="not a saved plan"):
        Plan.load(config)


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
