"""The emitted DeviceMesh, built by PyTorch under its fake process group on a 64-rank world, equals the rank map."""

from __future__ import annotations

import pytest

from optlayout.emit.mesh import build_device_mesh, mesh_code, mesh_dims, mesh_groups
from optlayout.emit.ranks import rank_map
from optlayout.layout import parse_layout

torch = pytest.importorskip("torch")  # the only skip: with torch installed these tests must run

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

WORLD = 64
LAYOUTS = [
    "tp=8,cp=2,dp=4,sharding=zero1",  # mesh (dp_shard, cp, tp)
    "tp=4,pp=2,dp=8",  # mesh (pp, dp_replicate, tp)
    "tp=2,pp=2,cp=2,dp=8,sharding=fsdp",  # mesh (pp, dp_shard, cp, tp)
    "tp=4,pp=4,vp=2,dp=4,ga=8,sharding=zero2",
    "dp=64",
]


def _token(mesh_dim: str) -> str:
    return "dp" if mesh_dim.startswith("dp_") else mesh_dim


@pytest.fixture
def fake_world():
    """Start the fake process group as a given rank; always torn down."""

    def start(rank: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("text", LAYOUTS)
def test_device_mesh_groups_equal_rank_map(text, fake_world):
    layout = parse_layout(text)
    assert layout.gpus == WORLD
    rm = rank_map(layout, gpus_per_node=8)
    seen: dict[str, set[tuple[int, ...]]] = {name: set() for name in mesh_dims(layout)}
    for rank in range(WORLD):
        fake_world(rank)
        mesh = build_device_mesh(layout, device_type="cpu")
        assert mesh.mesh_dim_names == tuple(mesh_dims(layout))
        assert list(mesh.mesh.shape) == list(mesh_dims(layout).values())
        assert mesh.mesh.flatten().tolist() == list(range(WORLD))
        for name in mesh.mesh_dim_names:
            ranks = dist.get_process_group_ranks(mesh.get_group(name))
            assert ranks == rm.group_of(rank, _token(name)), (name, rank)
            seen[name].add(tuple(ranks))
        dist.destroy_process_group()
    for name, groups in mesh_groups(layout).items():
        assert {tuple(g) for g in groups} == seen[name]


@pytest.mark.parametrize("text", LAYOUTS[:3])
def test_pasted_mesh_code_runs(text, fake_world):
    layout = parse_layout(text)
    fake_world(5)
    namespace: dict = {}
    exec(mesh_code(layout, device_type="cpu"), namespace)
    mesh = namespace["mesh"]
    assert mesh.mesh_dim_names == tuple(mesh_dims(layout))
    tp_ranks = dist.get_process_group_ranks(namespace["tp_group"])
    assert tp_ranks == rank_map(layout).group_of(5, "tp")


def test_mesh_order_and_dp_split():
    assert mesh_dims(parse_layout("tp=8,pp=4,cp=2,dp=2,sharding=fsdp")) == {"pp": 4, "dp_shard": 2, "cp": 2, "tp": 8}
    assert mesh_dims(parse_layout("tp=8,dp=4")) == {"dp_replicate": 4, "tp": 8}
    assert mesh_dims(parse_layout("tp=1")) == {"dp_replicate": 1}
    assert mesh_dims(parse_layout("tp=1,sharding=zero1")) == {"dp_shard": 1}
