"""The cost model's memo changes no figure: every layout evaluated through one shared memo, in an order that makes
later layouts reuse what earlier ones stored, equals the same layout evaluated alone, to the last bit."""

from __future__ import annotations

import random
from typing import Any

import pytest

from optlayout.cost import DEFAULT_PARAMS, evaluate, group_links
from optlayout.cost.memory import memory_floor_bytes, memory_total_bytes
from optlayout.cost.step import step_floor_s
from optlayout.presets import gpu_preset, model_preset
from optlayout.solver.space import SpaceOptions, enumerate_groups
from optlayout.specs import JobSpec, Layout, ModelSpec, Recompute
from optlayout.topology import topology_from_cluster
from optlayout.topology.load import parse_cluster_shorthand

DENSE = ModelSpec(layers=10, hidden=1024, ffn=4096, heads=16, kv_heads=8, vocab=32000)


def sample_layouts(model: ModelSpec, job: JobSpec, gpus: int, count: int) -> list[Layout]:
    """Legal layouts of every kind the space walks, partial recomputation (`rl`) included, shuffled."""
    layouts: list[Layout] = []
    for group in enumerate_groups(model, job, gpus, 8, SpaceOptions(all_grad_accum=True)):
        for lay in group.layouts():
            layouts.append(lay)
            if lay.recompute == Recompute.full and lay.recompute_layers is None:
                layouts += [lay.model_copy(update={"recompute_layers": n}) for n in (1, 2)]
    rng = random.Random(7)
    picked = rng.sample(layouts, min(count, len(layouts)))
    return [
        lay
        for lay in picked
        if lay.recompute_layers is None or lay.recompute_layers <= model.layers // (lay.pp * lay.vp)
    ]


@pytest.mark.parametrize(
    ("model", "job", "gpus"),
    [
        (DENSE, JobSpec(seq_len=2048, global_batch=64), 32),
        (model_preset("deepseek-v3"), JobSpec(seq_len=2048, global_batch=256), 64),
    ],
    ids=["dense", "moe"],
)
def test_a_shared_memo_gives_the_figures_of_no_memo(model: ModelSpec, job: JobSpec, gpus: int) -> None:
    topo = topology_from_cluster(parse_cluster_shorthand(f"gpu=h100-sxm,gpus={gpus},gpus_per_node=8"))
    gpu = gpu_preset("h100-sxm")
    memo: dict[tuple[object, ...], Any] = {}
    layouts = sample_layouts(model, job, gpus, 300)
    assert len(layouts) > 100
    for lay in layouts + layouts[::-1]:  # the second pass reads every entry back
        links = group_links(topo, lay)
        shared = evaluate(model, job, lay, gpu, topo, DEFAULT_PARAMS, links, memo)
        alone = evaluate(model, job, lay, gpu, topo, DEFAULT_PARAMS, links)
        assert shared.memory == alone.memory and shared.times == alone.times, lay.short()
        assert memory_total_bytes(model, job, lay, DEFAULT_PARAMS, memo) == alone.memory.total_bytes
        assert memory_floor_bytes(model, job, lay, DEFAULT_PARAMS, memo) == memory_floor_bytes(
            model, job, lay, DEFAULT_PARAMS, None
        )
        assert step_floor_s(model, job, lay, gpu, links, DEFAULT_PARAMS, memo) == step_floor_s(
            model, job, lay, gpu, links, DEFAULT_PARAMS
        )
