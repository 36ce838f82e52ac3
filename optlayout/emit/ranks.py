"""Which GPU every global rank runs on and which TP/CP/PP/DP groups it joins, in Megatron's rank order.

Megatron-Core (`parallel_state.py`, `RankGenerator`) numbers ranks over an order string such as
`tp-cp-ep-dp-pp` with the first token fastest: `rank = sum_i coord_i * prod_{j<i} size_j`. The default order
puts TP on consecutive ranks, so with ranks 0..7 on node 0 a TP group of at most one node stays on NVLink.
`--use-tp-pp-dp-mapping` switches to `tp-cp-ep-pp-dp`. torchrun gives `RANK = GROUP_RANK * nproc + LOCAL_RANK`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, Protocol, runtime_checkable

from optlayout.errors import OptlayoutError
from optlayout.specs import Layout

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
DIMS = ("tp", "cp", "ep", "dp", "pp")


@runtime_checkable
class HasDomains(Protocol):
    """Anything that names the NVLink domain of a global rank (e.g. `optlayout.topology.Topology`)."""

    def domain_of(self, rank: int) -> str: ...


@dataclass(frozen=True)
class RankMap:
    """Global ranks laid over nodes and parallel groups."""

    sizes: dict[str, int]
    order: str = DEFAULT_ORDER
    gpus_per_node: int = 8
    hostnames: tuple[str, ...] | None = None

    @property
    def tokens(self) -> list[str]:
        return self.order.split("-")

    @property
    def world_size(self) -> int:
        return prod(self.sizes.values())

    @property
    def local_world_size(self) -> int:
        return min(self.gpus_per_node, self.world_size)

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.local_world_size)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of `rank` along every dimension."""
        self._check_rank(rank)
        out = {}
        for token in self.tokens:
            rank, out[token] = divmod(rank, self.sizes[token])
        return out

    def rank_of(self, **coords: int) -> int:
        """Global rank at the given coordinates (missing ones are 0)."""
        rank, stride = 0, 1
        for token in self.tokens:
            rank += coords.get(token, 0) * stride
            stride *= self.sizes[token]
        return rank

    def node_of(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.local_world_size

    def local_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank % self.local_world_size

    def host(self, node: int) -> str:
        """Hostname of a node: the given list, else the placeholder `node{N}`."""
        return self.hostnames[node] if self.hostnames else f"node{node}"

    def groups(self, dims: str | Sequence[str]) -> list[list[int]]:
        """All groups spanning `dims` (e.g. "tp", "dp", ("dp", "cp")), ordered as Megatron generates them."""
        wanted = self._dims(dims)
        sizes = [self.sizes[t] for t in self.tokens]
        strides = [prod(sizes[:i]) for i in range(len(sizes))]
        inner = [i for i, t in enumerate(self.tokens) if t in wanted]
        outer = [i for i, t in enumerate(self.tokens) if t not in wanted]
        result = []
        for o in range(prod(sizes[i] for i in outer)):
            base = _offset(o, outer, sizes, strides)
            result.append([base + _offset(k, inner, sizes, strides) for k in range(prod(sizes[i] for i in inner))])
        return result

    def group_of(self, rank: int, dims: str | Sequence[str]) -> list[int]:
        """The group along `dims` that contains `rank`."""
        coords = self.coords(rank)
        wanted = self._dims(dims)
        fixed = {t: c for t, c in coords.items() if t not in wanted}
        inner = [t for t in self.tokens if t in wanted]
        members = []
        for k in range(prod(self.sizes[t] for t in inner)):
            point = dict(fixed)
            for t in inner:
                k, point[t] = divmod(k, self.sizes[t])
            members.append(self.rank_of(**point))
        return members

    def entries(self) -> list[dict[str, Any]]:
        """One record per global rank: node, host, local rank and coordinates."""
        rows = []
        for rank in range(self.world_size):
            node = self.node_of(rank)
            rows.append(
                {"rank": rank, "node": node, "host": self.host(node), "local_rank": self.local_rank(rank)}
                | self.coords(rank)
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: sizes, node shape, per-rank records and every group."""
        return {
            "order": self.order,
            "world_size": self.world_size,
            "gpus_per_node": self.local_world_size,
            "num_nodes": self.num_nodes,
            "sizes": dict(self.sizes),
            "ranks": self.entries(),
            "groups": {d: self.groups(d) for d in ("tp", "cp", "pp", "dp", "dp-cp")},
        }

    def _dims(self, dims: str | Sequence[str]) -> set[str]:
        names = dims.split("-") if isinstance(dims, str) else list(dims)
        unknown = [n for n in names if n not in self.sizes]
        if unknown:
            raise OptlayoutError(f"ranks: unknown dimension {unknown[0]!r} (known: {', '.join(self.tokens)})")
        return set(names)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise OptlayoutError(f"ranks: rank {rank} outside world of {self.world_size}")


def _offset(index: int, dims: list[int], sizes: list[int], strides: list[int]) -> int:
    total = 0
    for i in dims:
        index, c = divmod(index, sizes[i])
        total += c * strides[i]
    return total


def rank_map(
    layout: Layout,
    gpus_per_node: int = 8,
    order: str = DEFAULT_ORDER,
    hostnames: Sequence[str] | None = None,
) -> RankMap:
    """The rank map of a layout (EP = 1) in Megatron order `tp-cp-ep-dp-pp` or `tp-cp-ep-pp-dp`."""
    if order not in ORDERS:
        raise OptlayoutError(f"ranks: order must be one of {', '.join(ORDERS)} (got {order!r})")
    if gpus_per_node < 1:
        raise OptlayoutError(f"ranks: gpus_per_node must be at least 1 (got {gpus_per_node})")
    sizes = {t: 1 if t == "ep" else getattr(layout, t) for t in order.split("-")}
    world = prod(sizes.values())
    if world > gpus_per_node and world % gpus_per_node:
        raise OptlayoutError(f"ranks: world size {world} is not a multiple of gpus_per_node ({gpus_per_node})")
    hosts = tuple(hostnames) if hostnames else None
    nodes = -(-world // min(gpus_per_node, world))
    if hosts is not None and len(hosts) != nodes:
        raise OptlayoutError(f"ranks: {len(hosts)} hostnames given for {nodes} nodes")
    return RankMap(sizes=sizes, order=order, gpus_per_node=gpus_per_node, hostnames=hosts)


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
        raise OptlayoutError("ranks: domain must be gpus_per_node, a callable or an object with domain_of()")
    if isinstance(domain, int):
        if domain < 1:
            raise OptlayoutError(f"ranks: gpus_per_node must be at least 1 (got {domain})")
        return lambda rank: f"node{rank // domain}"
    if isinstance(domain, HasDomains):
        return domain.domain_of
    if callable(domain):
        return domain
    raise OptlayoutError("ranks: domain must be gpus_per_node, a callable or an object with domain_of()")


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


def render(rank_map: RankMap) -> str:
    """Human- and grep-friendly rank map: table, groups, hostfile, environment and launch hints."""
    sizes = " ".join(f"{t}={rank_map.sizes[t]}" for t in rank_map.tokens)
    out = [
        f"# rank map, order {rank_map.order} (first token fastest); sizes {sizes}",
        f"# world {rank_map.world_size} = {rank_map.num_nodes} node(s) x {rank_map.local_world_size} GPUs",
        "# rank\tnode\thost\tlocal_rank\t" + "\t".join(rank_map.tokens),
    ]
    for row in rank_map.entries():
        coords = "\t".join(str(row[t]) for t in rank_map.tokens)
        out.append(f"{row['rank']}\t{row['node']}\t{row['host']}\t{row['local_rank']}\t{coords}")
    for dims in ("tp", "cp", "pp", "dp"):
        if rank_map.sizes[dims] > 1:
            out.append(f"# {dims} groups")
            out += [json.dumps(g) for g in rank_map.groups(dims)]
    bad = check_tp_in_domain(rank_map, rank_map.local_world_size)
    out.append(f"# TP groups inside one node: {'yes' if not bad else 'NO, ' + str(bad[0])}")
    out.append("# hostfile (DeepSpeed/MPI)")
    out += hostfile(rank_map).splitlines()
    out.append("# per-rank environment")
    out += env_lines(rank_map).splitlines()
    out += [
        "# launch: node ranks must follow the host order above. torchrun honours --node-rank only with",
        f"#   --rdzv-backend static: torchrun --nnodes {rank_map.num_nodes} "
        f"--nproc-per-node {rank_map.local_world_size} --rdzv-backend static --node-rank $SLURM_NODEID ...",
        "#   or srun one task per GPU with RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID (block distribution).",
    ]
    return "\n".join(out) + "\n"
