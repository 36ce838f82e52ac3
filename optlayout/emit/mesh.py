"""PyTorch DeviceMesh in torchtitan's dimension order: `pp, dp_replicate, dp_shard, cp, tp` (degrees > 1 only).

`init_device_mesh` lays `arange(W)` out row-major, so the last dim (tp) holds consecutive ranks: the same
placement as Megatron's `tp-cp-ep-dp-pp` rank order, with dp = dp_replicate x dp_shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optlayout.emit._checks import dp_split, global_batch, node_count
from optlayout.errors import UnsupportedError
from optlayout.layout.ranks import grid
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Sharding

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def mesh_dims(layout: Layout) -> dict[str, int]:
    """Mesh dimension name -> degree, in mesh order, keeping only degrees > 1 (one dim of 1 for a 1-GPU world)."""
    replicate, shard = dp_split(layout)
    degrees = {"pp": layout.pp, "dp_replicate": replicate, "dp_shard": shard, "cp": layout.cp, "tp": layout.tp}
    kept = {name: degrees[name] for name in MESH_ORDER if degrees[name] > 1}
    return kept or {("dp_replicate" if layout.sharding is Sharding.none else "dp_shard"): 1}


def mesh_groups(layout: Layout) -> dict[str, list[list[int]]]:
    """Ranks of every 1-D slice of the mesh, per dim name, computed without torch (same order as the rank map)."""
    dims = mesh_dims(layout)
    rmap = grid(layout)
    out = {}
    for name in dims:
        out[name] = rmap.groups(name) if name in rmap.sizes else rmap.groups("dp")
    return out


def mesh_code(layout: Layout, device_type: str = "cuda") -> str:
    """Python to paste into a launcher: the `init_device_mesh` call and the flattened views torchtitan uses."""
    dims = mesh_dims(layout)
    shape = ", ".join(str(v) for v in dims.values()) + ("," if len(dims) == 1 else "")
    names = ", ".join(repr(n) for n in dims) + ("," if len(dims) == 1 else "")
    lines = [
        f"# optlayout: {format_layout(layout)} -> world of {layout.gpus} ranks",
        "from torch.distributed.device_mesh import init_device_mesh",
        "",
        f"mesh = init_device_mesh({device_type!r}, ({shape}), mesh_dim_names=({names}))",
    ]
    dp_names = [n for n in ("dp_replicate", "dp_shard") if n in dims]
    if len(dp_names) == 2:
        lines.append('# data parallel as one group: mesh["dp_replicate", "dp_shard"]._flatten("dp")  (private API)')
    shard_cp = [n for n in ("dp_shard", "cp") if n in dims]
    if len(shard_cp) == 2:
        lines.append('# FSDP over dp_shard x cp, as torchtitan: mesh["dp_shard", "cp"]._flatten("dp_shard_cp")')
    for name in dims:
        lines.append(f'{name}_group = mesh.get_group("{name}")')
    return "\n".join(lines) + "\n"


def build_device_mesh(layout: Layout, device_type: str = "cuda") -> DeviceMesh:
    """Build the DeviceMesh of a layout in the current (already initialised) default process group."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError as exc:  # pragma: no cover - torch is an optional dependency
        raise UnsupportedError("mesh: building a DeviceMesh needs torch (pip install optlayout[torch])") from exc
    dims = mesh_dims(layout)
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


def emit_mesh(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The DeviceMesh code for a plan (after the batch and node checks every emitter makes)."""
    global_batch(job, layout, "mesh")
    node_count(layout, gpus_per_node, "mesh")
    return mesh_code(layout)
