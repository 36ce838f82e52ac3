"""Re-planning a saved plan on another GPU count: same job, same kind of cluster, what changes, and why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optlayout.errors import OptlayoutError
from optlayout.planning import layout_changes, replan, solve
from optlayout.planning.plan import Plan
from optlayout.specs import JobSpec, Layout, ModelSpec
from tests.conftest import run_main

# 4 heads (tp in 1, 2, 4), 2 layers (pp in 1, 2), cp a power of two: no layout can hold a factor of 3.
TINY = ModelSpec(name="tiny", layers=2, hidden=128, ffn=512, heads=4, kv_heads=4, vocab=1000)
TINY_CLUSTER = "gpu=h100-sxm,gpus=16,gpus_per_node=4"

SMALL_TOPOLOGY = """\
name: small-dgx
description: 4x DGX H100
gpu: h100-sxm
servers: 4
gpus_per_server: 8
scale_up: {kind: nvswitch}
nics: {per_server: 8, gbps: 400}
fabric: {kind: rail, servers_per_leaf: 32, oversubscription: 1}
"""


@pytest.fixture(scope="module")
def saved_8b(tmp_path_factory) -> str:
    """Llama 3.1 8B on 16 H100, global batch 64, saved as a plan file."""
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", JobSpec(seq_len=4096, global_batch=64), top=2).save(path)
    return str(path)


def test_replan_on_fewer_gpus_keeps_the_global_batch_and_lists_changes(saved_8b, tmp_path) -> None:
    old = Plan.load(saved_8b)
    new = replan(saved_8b, 8)
    assert new.gpus == 8 and new.status == "optimal"
    assert new.cluster is not None and new.cluster.gpus == 8 and new.cluster.gpu == "h100-sxm"
    assert new.best.layout.gpus == 8
    assert new.best.layout.global_batch == old.best.layout.global_batch == 64
    assert new.replan is not None and new.replan.from_gpus == 16 and new.replan.from_layout == old.best.layout
    changed = {c.dim: (c.before, c.after) for c in new.replan.changes}
    for dim, (before, after) in changed.items():
        old_value, new_value = getattr(old.best.layout, dim), getattr(new.best.layout, dim)
        assert (getattr(old_value, "value", old_value), getattr(new_value, "value", new_value)) == (before, after)
    assert changed["dp"] == (old.best.layout.dp, new.best.layout.dp)
    assert "global_batch" not in changed
    # the re-planned plan saves and loads like any other
    path = tmp_path / "replanned.json"
    new.save(path)
    assert Plan.load(path).replan == new.replan


def test_cli_from_plan_prints_changes_and_json(saved_8b, capsys, monkeypatch) -> None:
    code, out, err = run_main(capsys, monkeypatch, "solve", "--from-plan", saved_8b, "--gpus", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["gpus"] == 8 and data["replanned_from"]["gpus"] == 16
    assert data["changes"] and {"dim", "before", "after", "reshards_checkpoint"} <= set(data["changes"][0])
    lay = data["layouts"][0]["layout"]
    assert lay["micro_batch"] * lay["grad_accum"] * lay["dp"] == 64
    code, out, err = run_main(capsys, monkeypatch, "solve", "--from-plan", saved_8b, "--gpus", "8", "--top", "1")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("re-planned from 16 to 8 GPUs: changes "))
    for change in data["changes"]:  # the same changes as the JSON, on one line
        assert f"{change['dim']} {change['before']} -> {change['after']}" in line
    reshard = [c["dim"] for c in data["changes"] if c["reshards_checkpoint"]]
    assert line.endswith(f"the checkpoint must be resharded on load ({', '.join(reshard)})")


def test_impossible_gpu_count_names_the_batch_rule(tmp_path, capsys, monkeypatch) -> None:
    """Global batch 8 on 12 GPUs: dp must divide 8 (dp in 1, 2, 4), leaving 12, 6 or 3 GPUs per replica for
    tp x cp x pp, and none of tp (1, 2, 4), cp (a power of two) and pp (1, 2) multiplies to a multiple of 3."""
    path = tmp_path / "tiny.json"
    solve(TINY, TINY_CLUSTER, JobSpec(seq_len=128, global_batch=8)).save(path)
    with pytest.raises(OptlayoutError) as info:
        replan(path, 12)
    msg = str(info.value)
    assert msg.startswith("replan: no layout keeps the global batch of 8 sequences on 12 GPUs")
    assert "dp must divide 8" in msg and "tp x cp x pp = 12, 6, 3" in msg
    assert msg.endswith("nearest GPU counts that work: 8 and 16") and "\n" not in msg
    code, _, err = run_main(capsys, monkeypatch, "solve", "--from-plan", str(path), "--gpus", "12")
    assert code == 2 and err.startswith("error: replan: no layout keeps the global batch") and err.count("\n") == 1


def test_gpu_count_off_the_node_size_is_an_error(saved_8b, capsys, monkeypatch) -> None:
    code, _, err = run_main(capsys, monkeypatch, "solve", "--from-plan", saved_8b, "--gpus", "12")
    assert code == 2 and err.count("\n") == 1
    assert "12 GPUs is not a whole number of 8-GPU nodes" in err and "nearest GPU counts that work: 8 and 16" in err


def test_too_few_gpus_for_the_state_says_memory_and_suggests_more(saved_8b) -> None:
    # 8.03e9 x 16 B = 128.5 GB of state cannot fit one 80 GB GPU; two GPUs can hold it sharded
    pattern = r"^replan: no layout of Llama 3.1 8B works on 1 GPUs: memory: .*nearest GPU count that works: 2$"
    with pytest.raises(OptlayoutError, match=pattern):
        replan(saved_8b, 1)


def test_batch_bounds_are_kept(tmp_path) -> None:
    path = tmp_path / "bounds.json"
    job = JobSpec(seq_len=4096, min_global_batch=32, max_global_batch=96)
    solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job).save(path)
    new = replan(path, 8, top=3)
    assert all(32 <= p.layout.global_batch <= 96 for p in new.layouts)
    assert new.job == job


def test_replan_rebuilds_a_generator_topology_with_fewer_servers(tmp_path) -> None:
    topo = tmp_path / "small.yaml"
    topo.write_text(SMALL_TOPOLOGY)
    path = tmp_path / "topo-plan.json"
    solve("llama3.1-8b", topo, JobSpec(seq_len=4096, global_batch=64)).save(path)
    assert Plan.load(path).topology_doc["servers"] == 4
    new = replan(path, 16)
    assert new.gpus == 16 and new.topology_name == "small-dgx" and new.topology_doc["servers"] == 2
    assert new.best.layout.global_batch == 64
    with pytest.raises(OptlayoutError, match=r"20 GPUs is not a whole number of 8-GPU servers .* 16 and 24$"):
        replan(path, 20)


def test_explicit_topology_needs_the_new_cluster(tmp_path) -> None:
    from optlayout.topology import resolve_cluster

    path = tmp_path / "obj.json"
    # a Topology object (like an explicit topology file) carries no recipe for other GPU counts
    solve("llama3.1-8b", resolve_cluster("gpu=h100-sxm,gpus=16"), JobSpec(seq_len=4096, global_batch=64)).save(path)
    with pytest.raises(OptlayoutError, match="cannot be rebuilt on 8 GPUs; give the new cluster"):
        replan(path, 8)
    new = replan(path, cluster="gpu=h100-sxm,gpus=8")
    assert new.gpus == 8 and new.best.layout.global_batch == 64
    with pytest.raises(OptlayoutError, match="the given cluster has 8 GPUs, not 16"):
        replan(path, 16, cluster="gpu=h100-sxm,gpus=8")


def test_a_plan_saved_before_the_new_fields_still_loads_and_replans(saved_8b, tmp_path) -> None:
    raw = json.loads(Path(saved_8b).read_text())
    for key in ("objective", "failure", "storage", "straggler_slowdown", "replan", "topology_doc", "cluster"):
        raw.pop(key, None)
    for row in raw["layouts"]:
        row.pop("goodput", None)
        row.pop("straggler", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    assert Plan.load(old).objective == "mfu"
    assert replan(old, cluster="gpu=h100-sxm,gpus=8").best.layout.global_batch == 64


def test_replan_keeps_the_goodput_objective_and_inputs(tmp_path) -> None:
    path = tmp_path / "goodput.json"
    job = JobSpec(seq_len=4096, global_batch=64)
    solve("llama3.1-8b", "gpu=h100-sxm,gpus=16", job, objective="goodput",
          failure={"gpu_failure_rate_per_s": 1e-5 / 3600}, storage={"write_Bps": 50e9, "asynchronous": True},
          straggler_slowdown=0.03).save(path)  # fmt: skip
    new = replan(path, 8)
    assert new.objective == "goodput" and new.straggler_slowdown == 0.03
    # the per-GPU failure rate follows the GPU count: MTBF = 1 / (1e-5 x 8) h = 12,500 h
    assert new.best.goodput.mtbf_s / 3600 == pytest.approx(12500)
    assert new.best.straggler.slowdown == 0.03


def test_which_changes_reshard_the_checkpoint() -> None:
    def reshards(a: Layout, b: Layout) -> dict[str, bool]:
        return {c.dim: c.reshards_checkpoint for c in layout_changes(a, b)}

    old = Layout(tp=2, dp=8, micro_batch=2, grad_accum=4, sharding="zero1")
    zero2 = Layout(tp=2, dp=8, micro_batch=1, grad_accum=8, sharding="zero2")
    # ZeRO-2 shards gradients too, which are not saved; micro-batch and accumulation never matter
    assert reshards(old, zero2) == {"micro_batch": False, "grad_accum": False, "sharding": False}
    tp4 = Layout(tp=4, dp=4, micro_batch=2, grad_accum=8, sharding="zero1")
    assert reshards(old, tp4) == {"tp": True, "dp": True, "grad_accum": False}  # ZeRO-1 shards over dp
    ddp = Layout(tp=2, dp=8, micro_batch=2, grad_accum=4)
    half = ddp.model_copy(update={"dp": 4, "grad_accum": 8})
    assert reshards(ddp, half) == {"dp": False, "grad_accum": False}  # a DDP replica holds the whole state
    assert reshards(ddp, ddp.model_copy(update={"sharding": "fsdp"})) == {"sharding": True}
    assert [c.dim for c in layout_changes(ddp, ddp.model_copy(update={"dp": 4}))] == ["dp", "global_batch"]
