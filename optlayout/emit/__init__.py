"""Launcher configs for a plan: one module per launcher, and `emit(fmt, ...)` to pick one by name.

Every emitter takes `(model, job, layout, gpus_per_node=8)`, checks that the job's global batch (when given)
equals micro_batch x grad_accum x dp, and refuses a plan its launcher would reject with an UnsupportedError
naming the rule. `emit` also refuses a rank order that would place the layout's groups on other ranks than
the cost model priced.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from optlayout.emit._checks import global_batch, node_count
from optlayout.emit.accelerate import accelerate_config, accelerate_yaml
from optlayout.emit.deepspeed import deepspeed_config, deepspeed_json
from optlayout.emit.megatron import FsdpImpl, megatron_args, megatron_problems, megatron_text
from optlayout.emit.mesh import MESH_ORDER, build_device_mesh, emit_mesh, mesh_code, mesh_dims, mesh_groups
from optlayout.emit.ranks import (
    DEFAULT_ORDER,
    ORDERS,
    DomainViolation,
    RankMap,
    check_groups_in_domain,
    check_tp_in_domain,
    env_lines,
    hostfile,
    rank_map,
)
from optlayout.emit.ranks import render as render_ranks
from optlayout.emit.torchtitan import torchtitan_config, torchtitan_overrides, torchtitan_toml
from optlayout.errors import InputError
from optlayout.layout.ranks import check_costed_order
from optlayout.specs import JobSpec, Layout, ModelSpec

FORMATS = ("megatron", "torchtitan", "deepspeed", "accelerate", "mesh", "ranks")

__all__ = [
    "DEFAULT_ORDER",
    "FORMATS",
    "MESH_ORDER",
    "ORDERS",
    "DomainViolation",
    "RankMap",
    "accelerate_config",
    "accelerate_yaml",
    "build_device_mesh",
    "check_groups_in_domain",
    "check_tp_in_domain",
    "deepspeed_config",
    "deepspeed_json",
    "emit",
    "emit_mesh",
    "env_lines",
    "hostfile",
    "megatron_args",
    "megatron_problems",
    "megatron_text",
    "mesh_code",
    "mesh_dims",
    "mesh_groups",
    "rank_map",
    "render_ranks",
    "torchtitan_config",
    "torchtitan_overrides",
    "torchtitan_toml",
]


def emit(
    fmt: str,
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpus_per_node: int = 8,
    *,
    overrides: bool = False,
    order: str = DEFAULT_ORDER,
    fsdp_impl: FsdpImpl = "megatron",
    hostnames: Sequence[str] | None = None,
) -> str:
    """The launcher text for `fmt` in megatron|torchtitan|deepspeed|accelerate|mesh|ranks.

    `overrides` (torchtitan) gives `--section.key value` flags instead of TOML; `order` picks Megatron's rank
    order (megatron, ranks); `fsdp_impl` picks Megatron-FSDP or torch FSDP2 (megatron); `hostnames` names
    the nodes of the rank map (ranks).
    """
    key = fmt.strip().lower()
    if key not in FORMATS:
        raise InputError(f"format: unknown {fmt!r}; valid: {', '.join(FORMATS)}")
    if overrides and key != "torchtitan":
        raise InputError("overrides: only the torchtitan format has CLI overrides")
    if key in ("megatron", "ranks"):
        check_costed_order(layout, order)
    model.require_dense("emit")
    if key == "megatron":
        return megatron_text(model, job, layout, gpus_per_node, order=order, fsdp_impl=fsdp_impl)
    if key == "torchtitan":
        if overrides:
            return shlex.join(torchtitan_overrides(model, job, layout, gpus_per_node)) + "\n"
        return torchtitan_toml(model, job, layout, gpus_per_node)
    if key == "deepspeed":
        return deepspeed_json(model, job, layout, gpus_per_node)
    if key == "accelerate":
        return accelerate_yaml(model, job, layout, gpus_per_node)
    if key == "mesh":
        return emit_mesh(model, job, layout, gpus_per_node)
    global_batch(job, layout, "ranks")
    node_count(layout, gpus_per_node, "ranks")
    return render_ranks(rank_map(layout, gpus_per_node, order, hostnames))
