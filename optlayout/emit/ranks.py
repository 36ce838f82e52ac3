"""Rank maps for launchers: which GPU every global rank runs on and which TP/CP/PP/DP groups it joins, whether
groups stay inside one NVLink domain, hostfiles and per-rank environments. The rank order itself is
`optlayout.layout.ranks` (`RankMap`, `rank_map`), re-exported here. torchrun gives
`RANK = GROUP_RANK * nproc + LOCAL_RANK`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Protocol, runtime_checkable

from optlayout.errors import InputError
from optlayout.layout.ranks import DEFAULT_ORDER, ORDERS, RankMap, rank_map

__all__ = [
    "DEFAULT_ORDER",
    "ORDERS",
    "DomainViolation",
    "HasDomains",
    "RankMap",
    "check_groups_in_domain",
    "check_tp_in_domain",
    "domain_function",
    "env_lines",
    "hostfile",
    "rank_map",
    "render",
]


@runtime_checkable
class HasDomains(Protocol):
    """Anything that names the NVLink domain of a global rank (e.g. `optlayout.topology.Topology`)."""

    def domain_of(self, rank: int) -> str: ...


@dataclass(frozen=True)
class DomainViolation:
    """A group whose ranks fall into more than one NVLink domain."""

    dims: str
    group: list[int]
    domains: list[str]

    def __str__(self) -> str:
        return f"{self.dims} group {self.group} spans domains {', '.join(self.domains)}"


Domain = int | Callable[[int], str] | HasDomains


def domain_function(domain: Domain) -> Callable[[int], str]:
    """Normalise a domain description: `gpus_per_node` (domain = node), `f(rank) -> str`, or `.domain_of`."""
    if isinstance(domain, bool):
        raise InputError("ranks: domain must be gpus_per_node, a callable or an object with domain_of()")
    if isinstance(domain, int):
        if domain < 1:
            raise InputError(f"ranks: gpus_per_node must be at least 1 (got {domain})")
        return lambda rank: f"node{rank // domain}"
    if isinstance(domain, HasDomains):
        return domain.domain_of
    if callable(domain):
        return domain
    raise InputError("ranks: domain must be gpus_per_node, a callable or an object with domain_of()")


def check_groups_in_domain(rank_map: RankMap, dims: str | Sequence[str], domain: Domain) -> list[DomainViolation]:
    """Every group along `dims` that leaves one domain; empty when all stay inside."""
    where = domain_function(domain)
    label = dims if isinstance(dims, str) else "-".join(dims)
    bad = []
    for group in rank_map.groups(dims):
        seen = sorted({str(where(r)) for r in group})
        if len(seen) > 1:
            bad.append(DomainViolation(label, group, seen))
    return bad


def check_tp_in_domain(rank_map: RankMap, domain: Domain) -> list[DomainViolation]:
    """TP groups that cross an NVLink domain (TP is the most frequent collective); empty when all fit."""
    return check_groups_in_domain(rank_map, "tp", domain)


def hostfile(rank_map: RankMap) -> str:
    """DeepSpeed/MPI hostfile: one `host slots=N` line per node."""
    return "".join(f"{rank_map.host(n)} slots={rank_map.local_world_size}\n" for n in range(rank_map.num_nodes))


def env_lines(rank_map: RankMap) -> str:
    """torchrun-style environment of every rank, one line each (`RANK = GROUP_RANK * nproc + LOCAL_RANK`)."""
    lines = []
    for rank in range(rank_map.world_size):
        node = rank_map.node_of(rank)
        lines.append(
            f"RANK={rank} LOCAL_RANK={rank_map.local_rank(rank)} GROUP_RANK={node} "
            f"WORLD_SIZE={rank_map.world_size} LOCAL_WORLD_SIZE={rank_map.local_world_size}  # {rank_map.host(node)}"
        )
    return "\n".join(lines) + "\n"


def render(rank_map: RankMap, experts: RankMap | None = None) -> str:
    """Human- and grep-friendly rank map: table, groups, hostfile, environment and launch hints; with `experts`
    (an MoE layout's expert grid over the same ranks), its expert-TP, EP and expert-DP groups too."""
    sizes = " ".join(f"{t}={rank_map.sizes[t]}" for t in rank_map.tokens)
    out = [
        f"# rank map, order {rank_map.order} (first token fastest); sizes {sizes}",
        f"# world {rank_map.world_size} = {rank_map.num_nodes} node(s) x {rank_map.local_world_size} GPUs",
        "# rank\tnode\thost\tlocal_rank\t" + "\t".join(rank_map.tokens),
    ]
    for row in rank_map.entries():
        coords = "\t".join(str(row[t]) for t in rank_map.tokens)
        out.append(f"{row['rank']}\t{row['node']}\t{row['host']}\t{row['local_rank']}\t{coords}")
    for dims in rank_map.grid_dims:
        if rank_map.sizes[dims] > 1:
            out.append(f"# {dims} groups")
            out += [json.dumps(g) for g in rank_map.groups(dims)]
    if experts is not None:
        sizes = " ".join(f"{t}={experts.sizes[t]}" for t in experts.tokens)
        out.append(f"# expert grid, order {experts.order} (tp: expert-TP, dp: expert-DP); sizes {sizes}")
        for dims in (*experts.grid_dims, "tp-ep"):
            if prod(experts.sizes[d] for d in dims.split("-")) > 1:
                out.append(f"# expert {dims} groups")
                out += [json.dumps(g) for g in experts.groups(dims)]
    bad = check_tp_in_domain(rank_map, rank_map.local_world_size)
    out.append(f"# TP groups inside one node: {'yes' if not bad else 'NO, ' + str(bad[0])}")
    out.append("# hostfile (DeepSpeed/MPI)")
    out += hostfile(rank_map).splitlines()
    out.append("# per-rank environment")
    out += env_lines(rank_map).splitlines()
    out += [
        "# launch: node ranks must follow the host order above. torchrun honours --node-rank only with",
        f"#   --rdzv-backend static: torchrun --nnodes {rank_map.num_nodes} "
        f"--nproc-per-node {rank_map.local_world_size} --rdzv-backend static --node-rank $SLURM_NODEID "
        "--master-addr $MASTER_ADDR ...",
        "#   or srun one task per GPU with RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID (block distribution).",
    ]
    return "\n".join(out) + "\n"
