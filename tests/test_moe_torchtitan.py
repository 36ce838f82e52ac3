"""torchtitan expert parallelism: the emitted 0.3.0 recipe and v0.2.2 TOML read by torchtitan's own config manager
and ParallelDims, whose meshes (built under PyTorch's fake process group) must hold the expert groups the emitted
DeviceMesh code and Megatron's expert grid (the cost model's) hold; the Qwen3 MoE flavor built on the meta device
is the plan's model. Refusals name torchtitan's rule and version (moe.md 2.2-2.3).

Needs the `launchers` extra and, for v0.2.2, `OPTLAYOUT_TORCHTITAN_022` (see tests/test_launchers.py); a missing
one skips locally and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from optlayout.emit import emit
from optlayout.emit.mesh import build_device_mesh, expert_mesh_dims, mesh_code, mesh_groups
from optlayout.errors import UnsupportedError
from optlayout.layout import parse_layout
from optlayout.layout.ranks import expert_grid
from optlayout.presets import model_preset
from optlayout.specs import JobSpec, Layout
from tests.conftest import require, torchtitan_022_dir

MODEL = "qwen3-30b-a3b"
# (layout, what 0.3.0 refuses, what v0.2.2 refuses); None: emitted
PLANS = [
    ("dp=16,ep=16,ga=4,sharding=fsdp", None, None),  # EP borrows from dp_shard only
    ("tp=2,dp=8,ep=8,ga=4,sharding=fsdp,sp", None, None),  # EP borrows TP too: efsdp = 8*2/8 = 2
    ("tp=2,dp=8,ep=4,etp=2,ga=4,sharding=fsdp,sp", "removed after v0.2.2, PR #3167", None),  # expert TP
    ("tp=4,dp=4,ep=4,ga=4,sharding=none,sp", None, "v0.2.2 rule DDP with no other parallelism broken"),  # HSDP
    ("tp=2,pp=2,dp=4,ep=4,ga=8,sharding=fsdp,sp", None, None),
    ("tp=2,dp=8,ep=4,ga=4,sharding=none,sp", "rule (dp_shard * cp * tp) % (ep * etp) == 0 broken", "DDP"),
    ("tp=2,dp=8,ga=4,sharding=fsdp,sp", "rule etp == tp when ep == 1 broken", "rule etp == tp when ep == 1"),
    ("dp=16,ep=16,ga=4,sharding=zero1", "FSDP2 keeps 18.00 B/param of expert state", "FSDP2 keeps 18.00"),
]
IDS = [p[0] for p in PLANS]


def _job(lay: Layout) -> JobSpec:
    return JobSpec(seq_len=4096, global_batch=lay.global_batch)


def _emit(layout: str, version: str, refused: str | None) -> str | None:
    lay = parse_layout(layout)
    if refused is None:
        return emit("torchtitan", model_preset(MODEL), _job(lay), lay, torchtitan_version=version)
    with pytest.raises(UnsupportedError) as info:
        emit("torchtitan", model_preset(MODEL), _job(lay), lay, torchtitan_version=version)
    assert refused in str(info.value) and "\n" not in str(info.value)
    return None


def _axis_groups(ranks: list, names: list[str], dims: tuple[str, ...]) -> set[tuple[int, ...]]:
    """Every group of a full mesh (nested lists of ranks, dims `names`) along `dims` (a 1-D or flattened slice)."""
    torch = require("torch")
    mesh = torch.tensor(ranks)
    axes = [names.index(d) for d in dims]
    rest = [i for i in range(mesh.dim()) if i not in axes]
    size = 1
    for i in axes:
        size *= mesh.shape[i]
    return {tuple(g) for g in mesh.permute(*rest, *axes[::-1]).reshape(-1, size).tolist()}


def _same_expert_groups(lay: Layout, ranks: list, names: list[str]) -> None:
    """torchtitan's sparse mesh against the emitted mesh's groups and Megatron's expert grid (the priced one)."""
    ours = {name: {tuple(g) for g in groups} for name, groups in mesh_groups(lay).items()}
    megatron = expert_grid(lay)
    assert _axis_groups(ranks, names, ("ep",)) == ours["ep"] == {tuple(g) for g in megatron.groups("ep")}
    assert _axis_groups(ranks, names, ("efsdp",)) == ours["efsdp"]
    if "etp" in names:  # v0.2.2 keeps etp at size 1 too; the emitted mesh has it only when > 1
        assert _axis_groups(ranks, names, ("etp",)) == {tuple(g) for g in megatron.groups("tp")}
        assert lay.etp == 1 or _axis_groups(ranks, names, ("etp",)) == ours["etp"]
    replicas = ("efsdp", "dp_replicate") if "dp_replicate" in names else ("efsdp",)  # expert-DP, efsdp fastest
    assert _axis_groups(ranks, names, replicas) == {tuple(g) for g in megatron.groups("dp")}


@pytest.mark.parametrize(("layout", "refused", "_"), PLANS, ids=IDS)
def test_torchtitan_030_expert_parallelism(layout, refused, _, tmp_path, monkeypatch):
    text = _emit(layout, "0.3.0", refused)
    if text is None:
        return
    require("triton", "torchtitan 0.3.0's recipes import it; pip install '.[launchers]'")
    manager = require("torchtitan.config.manager")
    dims = require("torchtitan.distributed.parallel_dims")
    torch = require("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    lay = parse_layout(layout)
    name = "optlayout_moe_" + layout.replace("=", "").replace(",", "_")
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = manager.ConfigManager().parse_args(["--module", name, "--config", "optlayout_job"])
    cfg.__post_init__()
    par = cfg.parallelism
    assert par.expert_parallel_degree == lay.ep
    model_cfg = cfg.model_spec.model
    model_cfg.update_from_config(config=cfg)
    with torch.device("meta"):
        model = model_cfg.build()
    spec = model_preset(MODEL)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count  # the q/k norms' weights counted too
    monkeypatch.setattr(dims, "device_type", "cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=lay.gpus)
    try:
        pdims = dims.ParallelDims.from_config(par, lay.gpus)
        pdims.build_mesh()
        sparse = pdims._global_meshes["sparse"]  # [pp, dp_replicate, efsdp, ep] over the whole world
        names = list(sparse.mesh_dim_names)
        assert names == ["pp", "dp_replicate", "efsdp", "ep"]
        assert dict(zip(names, sparse.mesh.shape, strict=True)) == {
            "pp": lay.pp,
            "dp_replicate": 1 if lay.sharding.value != "none" else lay.dp,
            **{k: v for k, v in expert_mesh_dims(lay).items() if k in ("efsdp", "ep")},
        }
        _same_expert_groups(lay, sparse.mesh.tolist(), names)
    finally:
        dist.destroy_process_group()


_TT022 = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import torchtitan
    import torchtitan.distributed.parallel_dims as pd
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec
    pd.device_type = "cpu"
    out = {"version": torchtitan.__file__}
    for path, world in json.loads(sys.argv[1]):
        cfg = ConfigManager().parse_args(["--job.config_file", path])
        p = cfg.parallelism
        dims = pd.ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                               cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                               pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
                               etp=p.expert_tensor_parallel_degree, world_size=world)
        spec = get_train_spec(cfg.model.name)
        args = spec.model_args[cfg.model.flavor]
        args.update_from_config(cfg)
        with torch.device("meta"):
            model = spec.model_cls(args)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        dims.build_mesh()
        sparse = dims._global_meshes["sparse"]
        out[path] = {"params": sum(x.numel() for x in model.parameters()), "names": list(sparse.mesh_dim_names),
                     "ranks": sparse.mesh.tolist(), "ep": dims.ep, "etp": dims.etp}
        dist.destroy_process_group()
    print(json.dumps(out))
    """
)


def test_torchtitan_022_expert_parallelism(tmp_path):
    target = torchtitan_022_dir()
    require("torchtitan", "the launchers extra brings torchtitan's dependencies")
    jobs, layouts = [], {}
    for layout, _, refused in PLANS:
        text = _emit(layout, "0.2.2", refused)
        if text is not None:
            path = tmp_path / f"{len(jobs)}.toml"
            path.write_text(text)
            jobs.append((str(path), parse_layout(layout).gpus))
            layouts[str(path)] = parse_layout(layout)
    assert jobs
    env = os.environ | {"PYTHONPATH": target}
    run = subprocess.run([sys.executable, "-c", _TT022, json.dumps(jobs)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result.pop("version").startswith(target)  # torchtitan 0.2.2 ran
    spec = model_preset(MODEL)
    for path, got in result.items():
        lay = layouts[path]
        assert got["params"] == spec.param_count  # torchtitan 0.2.2's flavor: the same count, q/k norms included
        assert (got["ep"], got["etp"]) == (lay.ep, lay.etp)
        assert got["names"] == ["pp", "dp_replicate", "efsdp", "ep", "etp"]
        _same_expert_groups(lay, got["ranks"], got["names"])


@pytest.mark.parametrize(
    "layout", ["tp=2,cp=2,dp=4,pp=2,ep=4,etp=2,sharding=fsdp,sp", "tp=4,dp=4,ep=8,sharding=fsdp,sp"]
)
def test_pasted_expert_mesh_code_runs(layout):
    """The emitted code (dense and expert meshes) runs under the fake process group; the expert mesh's groups are
    the ones mesh_groups lists."""
    torch = require("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    lay = parse_layout(layout)
    dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=lay.gpus)
    try:
        namespace: dict = {}
        exec(mesh_code(lay, device_type="cpu"), namespace)
        expert_mesh = namespace["expert_mesh"]
        assert expert_mesh.mesh_dim_names == tuple(expert_mesh_dims(lay))
        assert build_device_mesh(lay, "cpu", experts=True).mesh.tolist() == expert_mesh.mesh.tolist()
        names = list(expert_mesh.mesh_dim_names)
        groups = mesh_groups(lay)
        for name in ("ep", "efsdp", "etp"):
            if name in names:
                ranks = dist.get_process_group_ranks(namespace[f"{name}_group"])
                assert ranks in groups[name]
        assert torch.equal(expert_mesh.mesh.flatten(), torch.arange(lay.gpus))
    finally:
        dist.destroy_process_group()


def test_mesh_refuses_what_torchtitan_cannot_place():
    model = model_preset(MODEL)
    for layout, rule in (
        ("tp=2,dp=8,ep=4,sharding=none,sp", "rule (dp_shard * cp * tp) % (ep * etp) == 0 broken"),
        ("tp=4,dp=4,ep=2,etp=2,sharding=fsdp,sp", "rule ETP=TP or ETP=1 broken"),
    ):
        lay = parse_layout(layout)
        with pytest.raises(UnsupportedError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            emit("mesh", model, _job(lay), lay)
    lay = parse_layout("dp=8,ep=2")
    with pytest.raises(UnsupportedError, match="need a mixture-of-experts model"):
        emit("mesh", model_preset("llama3.1-8b"), _job(lay), lay)
