"""PyTorch DeviceMesh in torchtitan's dimension order: `pp, dp_replicate, dp_shard, cp, tp` (degrees > 1 only).

`init_device_mesh` lays `arange(W)` out row-major, so the last dim (tp) holds consecutive ranks: the same
placement as Megatron's `tp-cp-ep-dp-pp` rank order, with dp = dp_replicate x dp_shard.

A layout with expert parallelism (ep > 1) gets torchtitan's sparse mesh beside it, `pp, dp_replicate, efsdp, ep`
(and `etp` innermost where expert TP is on, as torchtitan v0.2.2, which allows only etp = 1 or tp): EP borrows its
ranks from dp_shard x cp x tp, efsdp = dp_shard*cp*tp/(ep*etp) (`torchtitan/distributed/parallel_dims.py`). Its
groups are Megatron's expert grid (expert-TP fastest, then EP, then expert-DP), the ones the cost model priced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optlayout.emit._checks import dp_split, expert_fsdp_degree, global_batch, node_count
from optlayout.errors import UnsupportedError
from optlayout.layout.ranks import RankMap, grid
from optlayout.layout.text import format_layout
from optlayout.specs import JobSpec, Layout, ModelSpec, Sharding

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
EXPERT_MESH_ORDER = ("pp", "dp_replicate", "efsdp", "ep", "etp")
_EXPERT_ONLY = ("efsdp", "ep", "etp")  # the sparse mesh's own dims (pp and dp_replicate are the dense mesh's)


def mesh_dims(layout: Layout) -> dict[str, int]:
    """Mesh dimension name -> degree, in mesh order, keeping only degrees > 1 (one dim of 1 for a 1-GPU world)."""
    replicate, shard = dp_split(layout)
    degrees = {"pp": layout.pp, "dp_replicate": replicate, "dp_shard": shard, "cp": layout.cp, "tp": layout.tp}
    kept = {name: degrees[name] for name in MESH_ORDER if degrees[name] > 1}
    return kept or {("dp_replicate" if layout.sharding is Sharding.none else "dp_shard"): 1}


def expert_mesh_dims(layout: Layout) -> dict[str, int]:
    """torchtitan's sparse mesh of an expert-parallel layout, name -> degree in mesh order (empty when ep = 1):
    ep and efsdp always (torchtitan keeps efsdp at size 1 for FSDP's mixed precision), pp, dp_replicate and etp
    when > 1; a one-line refusal when torchtitan cannot place the experts as planned."""
    if layout.ep == 1:
        if layout.etp not in (1, layout.tp):
            raise UnsupportedError(f"mesh: etp={layout.etp} without ep needs etp == tp (experts split like the rest)")
        return {}
    if layout.etp not in (1, layout.tp):
        raise UnsupportedError(
            f"mesh rule ETP=TP or ETP=1 broken (torchtitan v0.2.2): etp={layout.etp}, tp={layout.tp}"
        )
    efsdp = expert_fsdp_degree(layout, layout.etp, "mesh")
    degrees = {"pp": layout.pp, "dp_replicate": dp_split(layout)[0], "efsdp": efsdp, "ep": layout.ep, "etp": layout.etp}
    return {name: degrees[name] for name in EXPERT_MESH_ORDER if degrees[name] > 1 or name in ("efsdp", "ep")}


def mesh_groups(layout: Layout) -> dict[str, list[list[int]]]:
    """Ranks of every 1-D slice of the mesh (and of the expert mesh: ep, efsdp, etp), per dim name, computed
    without torch (dense: the rank map's groups; expert: row-major over the sparse mesh)."""
    dims = mesh_dims(layout)
    rmap = grid(layout)
    out = {}
    for name in dims:
        out[name] = rmap.groups(name) if name in rmap.sizes else rmap.groups("dp")
    experts = expert_mesh_dims(layout)
    if experts:
        sparse = RankMap(dict(reversed(experts.items())), "-".join(reversed(experts)), layout.gpus)
        out |= {name: sparse.groups(name) for name in experts if name in _EXPERT_ONLY}
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
    experts = expert_mesh_dims(layout)
    if experts:
        lines += [
            "",
            "# experts, as torchtitan's sparse mesh: EP borrows from dp_shard x cp x tp, FSDP over efsdp",
            f"expert_mesh = init_device_mesh({device_type!r}, ({', '.join(map(str, experts.values()))}), "
            f"mesh_dim_names=({', '.join(map(repr, experts))}))",
        ]
        lines += [
            f'{name}_group = expert_mesh.get_group("{name}")' for name in experts if name in ("efsdp", "ep", "etp")
        ]
    return "\n".join(lines) + "\n"


def build_device_mesh(layout: Layout, device_type: str = "cuda", experts: bool = False) -> DeviceMesh:
    """Build the DeviceMesh of a layout (with `experts`, its sparse expert mesh) in the current (already
    initialised) default process group."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError as exc:  # pragma: no cover - torch is an optional dependency
        raise UnsupportedError("mesh: building a DeviceMesh needs torch (pip install optlayout[torch])") from exc
    dims = expert_mesh_dims(layout) if experts else mesh_dims(layout)
    if not dims:
        raise UnsupportedError("mesh: no expert mesh without expert parallelism (ep = 1)")
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


def emit_mesh(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int = 8) -> str:
    """The DeviceMesh code for a plan (after the batch and node checks every emitter makes)."""
    global_batch(job, layout, "mesh")
    node_count(layout, gpus_per_node, "mesh")
    if model.moe is None and layout.ep * layout.etp > 1:
        raise UnsupportedError(f"mesh: ep={layout.ep}, etp={layout.etp} need a mixture-of-experts model")
    return mesh_code(layout)
