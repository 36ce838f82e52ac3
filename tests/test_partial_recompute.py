"""Partial activation recomputation (Megatron's `--recompute-method block --recompute-num-layers N`): the layout
axis, its rules, its memory and step time by hand."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_solver import problems

from optlayout.cost import DEFAULT_PARAMS, CostParams, group_links, usable_memory_bytes
from optlayout.cost.memory import activation_bytes_per_layer, memory_per_gpu
from optlayout.cost.step import layer_times, step_floor_s, step_time
from optlayout.errors import OptlayoutError
from optlayout.layout import layout_problems, parse_layout
from optlayout.layout.stages import chunk_layer_counts, rank_chunk_recomputed, stage_split
from optlayout.presets import gpu_preset
from optlayout.solver.candidates import CostTable, capacity_mib, memory_mib, variant_bound
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions, enumerate_groups
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute
from optlayout.topology import parse_cluster_shorthand, topology_from_cluster

MODEL = ModelSpec(layers=8, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000, mlp="gelu")
JOB = JobSpec(seq_len=1024, global_batch=8)
H100 = gpu_preset("h100-sxm")


def test_text_form_and_rules() -> None:
    lay = parse_layout("tp=1,pp=1,dp=1,mb=1,ga=8,recompute=full,rl=3")
    assert lay.recompute_layers == 3 and lay.short().endswith("recompute=full,rl=3")
    assert parse_layout("recompute=full").short() == "tp=1,pp=1,cp=1,dp=1,mb=1,ga=1,sharding=none,recompute=full"
    with pytest.raises(OptlayoutError, match="recompute_layers needs recompute=full"):
        parse_layout("recompute=selective,rl=2")
    # N counts per model chunk: 8 layers over pp 2 x vp 2 leave chunks of 2
    chunked = Layout(pp=2, vp=2, grad_accum=8, recompute="full", recompute_layers=3)
    assert layout_problems(MODEL, JOB, chunked, 2) == [
        "recompute_layers (3) exceeds the layers of the largest model chunk (2); leave it out to recompute them all"
    ]
    assert layout_problems(MODEL, JOB, chunked.model_copy(update={"recompute_layers": 2}), 2) == []


def test_block_method_recomputes_the_first_layers_of_every_chunk() -> None:
    # 8 layers, pp 2, first stage 3 / last 5, vp 1: N = 4 recomputes 3 of the first stage and 4 of the last
    lay = Layout(pp=2, grad_accum=2, first_stage_layers=3, last_stage_layers=5, recompute="full", recompute_layers=4)
    split = rank_chunk_recomputed(tuple("abcdefgh"), lay)
    assert split == (((tuple((k, 1) for k in "abc"), ()),), ((tuple((k, 1) for k in "defg"), (("h", 1),)),))


def _acts(layout: Layout) -> float:
    return memory_per_gpu(MODEL, JOB, layout, DEFAULT_PARAMS).activations_bytes


def test_memory_recomputed_layers_keep_their_input_the_rest_everything() -> None:
    # One stage, 8 layers: N recomputed layers keep their input (2 s b h bytes), 8 - N keep their whole set; the
    # peak also holds the one layer being recomputed, the embedding output and the logits (as with full).
    whole = activation_bytes_per_layer(MODEL, JOB, Layout())
    layer_input = 2 * 1024 * 1024
    embedding_out, logits = 2 * 1024 * 1024, 4 * 1024 * 32000
    for n in (1, 3, 7):
        lay = Layout(grad_accum=8, recompute="full", recompute_layers=n)
        assert _acts(lay) == pytest.approx(n * layer_input + (8 - n) * whole + whole + embedding_out + logits)
    assert _acts(Layout(grad_accum=8, recompute="full", recompute_layers=8)) == _acts(
        Layout(grad_accum=8, recompute="full")
    )


def test_memory_counts_n_per_virtual_chunk_in_flight() -> None:
    # pp 2, vp 2, 4 micro-batches: chunks of 2 layers; the first stage holds (p-1)*2 + (v-1)*p + 1 = 5 chunk
    # forwards at its peak (Megatron's interleaved warm-up), so recomputing 1 layer per chunk instead of both
    # keeps 5 more whole layers less 5 inputs (a small vocabulary: the last stage's logits do not make it the fullest).
    model = MODEL.model_copy(update={"vocab": 512})
    whole = activation_bytes_per_layer(model, JOB, Layout())
    layer_input = 2 * 1024 * 1024
    full = Layout(pp=2, vp=2, grad_accum=4, recompute="full")
    partial = full.model_copy(update={"recompute_layers": 1})
    mem_full, mem_partial = (memory_per_gpu(model, JOB, x, DEFAULT_PARAMS) for x in (full, partial))
    assert mem_full.stage == mem_partial.stage == 0
    assert mem_partial.activations_bytes - mem_full.activations_bytes == pytest.approx(5 * (whole - layer_input))


def test_step_time_recomputes_the_forward_of_n_layers_only() -> None:
    # One GPU, 8 micro-batches: recomputing N layers adds N layer forwards per micro-batch to the backward.
    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=1"))
    plain = Layout(grad_accum=8)
    links = group_links(topo, plain)
    forward = layer_times(MODEL, JOB, plain, H100, links, DEFAULT_PARAMS).forward_compute_s()

    def compute_s(lay: Layout) -> float:
        return step_time(MODEL, JOB, lay, H100, links, DEFAULT_PARAMS, MODEL.param_count).compute_s

    base = compute_s(plain)
    for n, expected in ((1, 1), (3, 3), (None, 8)):
        lay = Layout(grad_accum=8, recompute="full", recompute_layers=n)
        assert compute_s(lay) - base == pytest.approx(8 * expected * forward, rel=1e-12)


def test_hardware_flops_count_the_recomputed_layers_only() -> None:
    from optlayout.cost.flops import hardware_flops_per_token, model_flops_per_token

    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=2"))
    base = model_flops_per_token(MODEL, 1024)
    every = hardware_flops_per_token(MODEL, 1024, "full") - base
    for n, share in ((1, 2 / 8), (3, 6 / 8), (None, 1.0)):  # pp 2: 4 layers a stage, n of them on each
        lay = Layout(pp=2, grad_accum=4, recompute="full", recompute_layers=n)
        pred = Problem(MODEL, JOB, topo).table.predict(lay)
        assert pred.hfu / pred.mfu == pytest.approx((base + share * every) / base, rel=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([0.0, 0.9]), st.sampled_from([0.0, 0.01]))
def test_the_fewest_recomputed_layers_that_fit_are_the_fastest(problem, dp_overlap, overhead_s) -> None:
    """What the search relies on, checked on the cost model itself: along a full-recompute layout's layer counts
    memory never rises and throughput never rises, so the fewest that fit (`fewest_recomputed`) is the best of
    them; and the bounds the walk takes from one recomputed layer hold for every sharding's fewest."""
    model, cluster, job, _ = problem
    topo = topology_from_cluster(cluster)
    params = CostParams(runtime_reserve_bytes=0, dp_comm_overlap=dp_overlap, step_overhead_s=overhead_s)
    table = CostTable(model, job, topo.gpu, topo, params)
    capacity = usable_memory_bytes(topo.gpu.memory_bytes, job)
    cap = capacity_mib(capacity)
    options = SpaceOptions(max_micro_batch=4, max_vp=4, max_cp=8, exclude={"recompute": frozenset({"none"})})
    partial = 0
    for group in enumerate_groups(model, job, topo.num_gpus, topo.domain_size, options):
        for sp in group.sequence_parallel:
            chosen = []
            for sharding in group.shardings:
                lay = group.layout(sharding, Recompute.full, sp)
                largest = max(chunk_layer_counts(stage_split(lay, model.layers), lay.vp))
                counts = [*range(1, largest), None]
                cands = [table.candidate(lay.model_copy(update={"recompute_layers": n})) for n in counts]
                mems = [memory_mib(c.evaluation.memory_per_gpu_bytes) for c in cands]
                tps = [c.cluster_tokens_per_s for c in cands]
                assert mems == sorted(mems, reverse=True)
                assert all(a >= b * (1 - 1e-12) for a, b in itertools.pairwise(tps))
                fewest = table.fewest_recomputed(lay, capacity)
                fitting = [n for n, m in zip(counts, mems, strict=True) if m <= cap]
                assert fewest.recompute_layers == (fitting[0] if fitting else None)
                partial += fewest.recompute_layers is not None
                chosen.append(table.candidate(fewest))
            one = group.layout(group.shardings[0], Recompute.full, sp).model_copy(update={"recompute_layers": 1})
            floor = one.global_batch * job.seq_len / step_floor_s(model, job, one, topo.gpu, table.links(one), params)
            for sharding in group.shardings:
                probe = group.layout(sharding, Recompute.full, sp).model_copy(update={"recompute_layers": 1})
                bound = variant_bound(probe, table.times(probe), job.seq_len)
                assert all(c.cluster_tokens_per_s <= min(bound, floor) * (1 + 1e-12) for c in chosen)
    assume(partial)  # a space where memory takes fewer than all layers


def test_pinned_layer_count_is_full_recomputation_within_the_chunks() -> None:
    from optlayout.solver.space import space_options

    options = space_options(pins={"rl": 3}, max_vp=4)
    layouts = list(enumerate_groups(MODEL, JOB, 2, 8, options))
    assert layouts and all(g.recomputes == (Recompute.full,) for g in layouts)
    for group in layouts:
        lay = next(group.layouts())
        assert lay.recompute_layers == 3 and layout_problems(MODEL, JOB, lay, 2) == []
    assert {g.degrees["vp"] for g in layouts if g.degrees["pp"] == 2} == {1}  # 4 layers a stage: vp 2 leaves 2
    with pytest.raises(OptlayoutError, match="recompute_layers needs recompute=full"):
        space_options(pins={"rl": 3, "recompute": "selective"})
    with pytest.raises(OptlayoutError, match="pin it to fix it"):
        space_options(maxima={"recompute_layers": 3})


def test_why_it_lost_names_the_layer_count_only_with_full_recomputation() -> None:
    from optlayout.solver.explain import why_it_lost

    topo = topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=1"))
    table = Problem(MODEL, JOB, topo).table
    best, full, none = (Layout(grad_accum=8, recompute="full", recompute_layers=2),
                        Layout(grad_accum=8, recompute="full"), Layout(grad_accum=8))  # fmt: skip
    assert "(recompute_layers=all)" in why_it_lost(full, table.predict(full), best, table.predict(best), JOB)
    slower = why_it_lost(best, table.predict(best), none, table.predict(none), JOB)
    assert "(recompute=full, recompute_layers=2)" in slower


def test_a_shared_memo_keeps_each_split_of_recomputed_layers_apart() -> None:
    """Middle stages holding the same layer kinds in another order split differently under partial recomputation:
    the stage states cached for one layout must not serve another (found by review: a zip length error)."""
    from optlayout.model import MoeSpec

    flags = (1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1)
    model = ModelSpec(name="toy", layers=16, hidden=1024, ffn=4096, heads=8, kv_heads=8, vocab=32000,
                      moe=MoeSpec(experts=8, top_k=2, expert_ffn=4096, layer_freq=flags))  # fmt: skip
    job = JobSpec(seq_len=2048, global_batch=8)
    memo: dict = {}
    plain = parse_layout("pp=4,dp=2,ga=4")
    partial = Layout.unchecked(**{**dict(plain), "recompute": Recompute.full, "recompute_layers": 1})
    for layout in (plain, partial):
        shared = memory_per_gpu(model, job, layout, DEFAULT_PARAMS, memo)
        assert shared == memory_per_gpu(model, job, layout, DEFAULT_PARAMS)  # the same as without the memo


def test_torchtitan_every_block_covers_a_count_as_large_as_the_largest_chunk() -> None:
    """32 layers on 3 stages are chunks of 11 and 10: N = 11 recomputes every layer of both (min(N, chunk)), which
    torchtitan 0.2.2's every-block selective AC (k = 1) does; N = 5 has no k."""
    from optlayout.emit.torchtitan import _layer_ac_frequency
    from optlayout.presets import model_preset

    model = model_preset("llama3.1-8b")
    assert _layer_ac_frequency(model, parse_layout("pp=3,dp=2,ga=4,recompute=full,rl=11"), "0.2.2") == 1
    with pytest.raises(OptlayoutError, match="checkpoints 5 of each chunk of"):
        _layer_ac_frequency(model, parse_layout("pp=3,dp=2,ga=4,recompute=full,rl=5"), "0.2.2")
