"""Launcher configs for a plan: one module per launcher, and `emit(fmt, ...)` to pick one by name.

Every emitter takes `(model, job, layout, gpus_per_node=8)`, checks that the job's global batch (when given)
equals micro_batch x grad_accum x dp, and refuses a plan its launcher would reject, or would run with more
memory than the memory model counted, with an UnsupportedError naming the rule (also a rank order that would
place the layout's groups on other ranks than the cost model priced). `emit` gives what the launcher
reads, as it reads it; `emit_notes` gives what goes with it (the launch command, the launcher version, what
was substituted), which the TOML, YAML and Python forms also carry as comments.

Launcher versions: Megatron-LM main (d98e8a64) / megatron-core 0.16, megatron-bridge 0.3.1, torchtitan 0.3.0
(the default) and 0.2.2, DeepSpeed 0.19.8, Accelerate 1.15.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from optlayout.emit._checks import global_batch, node_count
from optlayout.emit.accelerate import accelerate_config, accelerate_notes, accelerate_yaml
from optlayout.emit.deepspeed import deepspeed_config, deepspeed_json, deepspeed_notes
from optlayout.emit.megatron import (
    MEGATRON_MODEL_FEATURES,
    FsdpImpl,
    megatron_args,
    megatron_fsdp_impl,
    megatron_notes,
    megatron_problems,
    megatron_text,
)
from optlayout.emit.megatron_bridge import bridge_notes, bridge_overrides, bridge_text
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
from optlayout.emit.torchtitan import (
    CURRENT_TORCHTITAN,
    TORCHTITAN_VERSIONS,
    torchtitan_config,
    torchtitan_notes,
    torchtitan_overrides,
    torchtitan_python,
    torchtitan_toml,
)
from optlayout.errors import InputError
from optlayout.layout.megatron_core import Version
from optlayout.layout.ranks import check_costed_order
from optlayout.layout.rules import job_problems
from optlayout.specs import JobSpec, Layout, ModelSpec

FORMATS = ("megatron", "megatron-bridge", "torchtitan", "deepspeed", "accelerate", "mesh", "ranks")

__all__ = [
    "CURRENT_TORCHTITAN",
    "DEFAULT_ORDER",
    "FORMATS",
    "MESH_ORDER",
    "ORDERS",
    "TORCHTITAN_VERSIONS",
    "DomainViolation",
    "RankMap",
    "accelerate_config",
    "accelerate_notes",
    "accelerate_yaml",
    "bridge_notes",
    "bridge_overrides",
    "bridge_text",
    "build_device_mesh",
    "check_groups_in_domain",
    "check_tp_in_domain",
    "deepspeed_config",
    "deepspeed_json",
    "deepspeed_notes",
    "emit",
    "emit_mesh",
    "emit_notes",
    "env_lines",
    "hostfile",
    "megatron_args",
    "megatron_notes",
    "megatron_problems",
    "megatron_text",
    "mesh_code",
    "mesh_dims",
    "mesh_groups",
    "rank_map",
    "render_ranks",
    "torchtitan_config",
    "torchtitan_notes",
    "torchtitan_overrides",
    "torchtitan_python",
    "torchtitan_toml",
]


RANKS_MODEL_FEATURES = frozenset({"moe", "mla", "mtp"})  # the rank map shows the expert grid; MLA/MTP move no rank
EXPERT_FEATURES = frozenset({"moe"})  # torchtitan, Bridge (their Qwen3 MoE models), the mesh: experts, no MLA/MTP


def _format(fmt: str, overrides: bool, torchtitan_version: str) -> str:
    key = fmt.strip().lower()
    if key not in FORMATS:
        raise InputError(f"format: unknown {fmt!r}; valid: {', '.join(FORMATS)}")
    if overrides and (key != "torchtitan" or torchtitan_version != "0.2.2"):
        raise InputError("overrides: only torchtitan 0.2.2 takes --section.key overrides (0.3.0 runs Python)")
    if torchtitan_version not in TORCHTITAN_VERSIONS:
        valid = ", ".join(TORCHTITAN_VERSIONS)
        raise InputError(f"torchtitan-version: one of {valid} (got {torchtitan_version!r})")
    return key


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
    torchtitan_version: str = CURRENT_TORCHTITAN,
    megatron_core: Version | None = None,
) -> str:
    """The launcher text for `fmt` in megatron|megatron-bridge|torchtitan|deepspeed|accelerate|mesh|ranks.

    `torchtitan_version` picks torchtitan 0.3.0 (a Python config module) or 0.2.2 (TOML; `overrides` gives
    `--section.key value` flags instead); `order` picks Megatron's rank order (megatron, ranks); `fsdp_impl`
    picks Megatron-FSDP or torch FSDP2 (megatron; torch FSDP2 where `megatron_core` predates Megatron-FSDP);
    `megatron_core` refuses the flags that release lacks (megatron); `hostnames` names the nodes (ranks;
    accelerate's main process).
    """
    key = _format(fmt, overrides, torchtitan_version)
    if problems := job_problems(model, job):
        raise InputError(f"emit: {'; '.join(problems)}")
    if key in ("megatron", "ranks"):
        check_costed_order(layout, order)
    handled = {
        "megatron": MEGATRON_MODEL_FEATURES,
        "ranks": RANKS_MODEL_FEATURES,
        "torchtitan": EXPERT_FEATURES,
        "mesh": EXPERT_FEATURES,
        "megatron-bridge": EXPERT_FEATURES,
        "deepspeed": EXPERT_FEATURES,
    }.get(key, frozenset())  # deepspeed refuses MoE itself, naming DeepSpeed-MoE's model-code API
    model.require_dense(f"emit {key}", job.seq_len, handled)
    if key == "megatron":
        return megatron_text(model, job, layout, gpus_per_node, order=order,
                             fsdp_impl=megatron_fsdp_impl(fsdp_impl, megatron_core),
                             megatron_core=megatron_core)  # fmt: skip
    if key == "megatron-bridge":
        return bridge_text(model, job, layout, gpus_per_node)
    if key == "torchtitan":
        if torchtitan_version == "0.3.0":
            return torchtitan_python(model, job, layout, gpus_per_node)
        if overrides:
            return shlex.join(torchtitan_overrides(model, job, layout, gpus_per_node)) + "\n"
        return torchtitan_toml(model, job, layout, gpus_per_node)
    if key == "deepspeed":
        return deepspeed_json(model, job, layout, gpus_per_node)
    if key == "accelerate":
        return accelerate_yaml(model, job, layout, gpus_per_node, hostnames)
    if key == "mesh":
        return emit_mesh(model, job, layout, gpus_per_node)
    global_batch(job, layout, "ranks")
    node_count(layout, gpus_per_node, "ranks")
    experts = rank_map(layout, gpus_per_node, order, hostnames, expert=True) if model.moe is not None else None
    return render_ranks(rank_map(layout, gpus_per_node, order, hostnames), experts)


def emit_notes(
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
    torchtitan_version: str = CURRENT_TORCHTITAN,
    megatron_core: Version | None = None,
) -> list[str]:
    """What goes with `emit`'s text (launch command, launcher version, substitutions), one line each; the CLI
    prints them on stderr so that the text itself stays exactly what the launcher reads."""
    key = _format(fmt, overrides, torchtitan_version)
    if key == "megatron":
        return megatron_notes(model, job, layout, gpus_per_node, order=order,
                              fsdp_impl=megatron_fsdp_impl(fsdp_impl, megatron_core),
                              megatron_core=megatron_core)  # fmt: skip
    if key == "megatron-bridge":
        return bridge_notes(model, job, layout, gpus_per_node)
    if key == "torchtitan":
        return torchtitan_notes(model, job, layout, gpus_per_node, torchtitan_version)
    if key == "deepspeed":
        return deepspeed_notes(model, job, layout, gpus_per_node)
    if key == "accelerate":
        return accelerate_notes(model, job, layout, gpus_per_node, hostnames)
    return []
