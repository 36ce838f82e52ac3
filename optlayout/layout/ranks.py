"""The rank order: which coordinate of the rank grid every global rank holds, in Megatron's order.

Megatron-Core (`parallel_state.py`, `RankGenerator`) numbers ranks over an order string such as
`tp-cp-ep-dp-pp` with the first token fastest: `rank = sum_i coord_i * prod_{j<i} size_j`. The default order
puts TP on consecutive ranks, so with ranks 0..7 on node 0 a TP group of at most one node stays on NVLink.
`--use-tp-pp-dp-mapping` switches to `tp-cp-ep-pp-dp`. torchrun gives `RANK = GROUP_RANK * nproc + LOCAL_RANK`.

One implementation for the cost model (which groups' links it prices), the launchers (rank maps, meshes)
and the reports (placement on the topology).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from optlayout.errors import InputError, UnsupportedError
from optlayout.layout.axes import MEGATRON_ORDERS
from optlayout.layout.model import GRID_AXES, Layout

ORDERS = MEGATRON_ORDERS
DEFAULT_ORDER = ORDERS[0]
COSTED_ORDER = DEFAULT_ORDER
"""The order whose group placement the cost model prices; a launch in another order must place alike."""


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
    def grid_dims(self) -> list[str]:
        """The tokens that are Layout axes, in rank order (first fastest)."""
        axes = {a.key for a in GRID_AXES}
        return [t for t in self.tokens if t in axes]

    @property
    def world_size(self) -> int:
        return prod(self.sizes.values())

    @property
    def local_world_size(self) -> int:
        return min(self.gpus_per_node, self.world_size)

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.local_world_size)

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along `dim`: the product of the sizes of the faster dims."""
        self._dims(dim)
        return prod(self.sizes[t] for t in self.tokens[: self.tokens.index(dim)])

    def span(self, dims: Sequence[str]) -> tuple[int, int]:
        """(size, stride) of the group along `dims` when its ranks are evenly spaced (the dims adjacent in the
        order once size-1 dims are skipped); InputError otherwise."""
        wanted = self._dims(dims)
        used = [t for t in self.tokens if t in wanted and self.sizes[t] > 1]
        size = prod(self.sizes[t] for t in wanted)
        if not used:
            return size, self.stride(next(t for t in self.tokens if t in wanted))
        between = self.tokens[self.tokens.index(used[0]) : self.tokens.index(used[-1]) + 1]
        if any(self.sizes[t] > 1 and t not in wanted for t in between):
            raise InputError(f"ranks: the {'-'.join(dims)} group is not evenly spaced in order {self.order}")
        return size, self.stride(used[0])

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
        """JSON-ready form: sizes, node shape, per-rank records and every group (and DP x CP, the gradient's)."""
        return {
            "order": self.order,
            "world_size": self.world_size,
            "gpus_per_node": self.local_world_size,
            "num_nodes": self.num_nodes,
            "sizes": dict(self.sizes),
            "ranks": self.entries(),
            "groups": {d: self.groups(d) for d in (*self.grid_dims, "dp-cp")},
        }

    def _dims(self, dims: str | Sequence[str]) -> set[str]:
        names = dims.split("-") if isinstance(dims, str) else list(dims)
        unknown = [n for n in names if n not in self.sizes]
        if unknown:
            raise InputError(f"ranks: unknown dimension {unknown[0]!r} (known: {', '.join(self.tokens)})")
        return set(names)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise InputError(f"ranks: rank {rank} outside world of {self.world_size}")


def _offset(index: int, dims: list[int], sizes: list[int], strides: list[int]) -> int:
    total = 0
    for i in dims:
        index, c = divmod(index, sizes[i])
        total += c * strides[i]
    return total


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise InputError(f"ranks: order must be one of {', '.join(ORDERS)} (got {order!r})")
    return order


def grid_sizes(layout: Layout, order: str = DEFAULT_ORDER) -> dict[str, int]:
    """Size of every token of `order` for `layout` (1 for a token that is not a Layout axis, as `ep`)."""
    degrees = {a.key: getattr(layout, a.name) for a in GRID_AXES}
    return {t: degrees.get(t, 1) for t in check_order(order).split("-")}


def grid(layout: Layout, order: str = DEFAULT_ORDER, gpus_per_node: int | None = None) -> RankMap:
    """The layout's rank grid in `order` (one node holding the world unless `gpus_per_node` is given); no
    check that the world fills whole nodes (a layout may leave GPUs idle)."""
    return RankMap(grid_sizes(layout, order), order, gpus_per_node or layout.gpus)


def rank_map(
    layout: Layout,
    gpus_per_node: int = 8,
    order: str = DEFAULT_ORDER,
    hostnames: Sequence[str] | None = None,
) -> RankMap:
    """The rank map of a layout in Megatron order `tp-cp-ep-dp-pp` or `tp-cp-ep-pp-dp` over whole nodes."""
    sizes = grid_sizes(layout, order)
    if gpus_per_node < 1:
        raise InputError(f"ranks: gpus_per_node must be at least 1 (got {gpus_per_node})")
    world = prod(sizes.values())
    if world > gpus_per_node and world % gpus_per_node:
        raise InputError(f"ranks: world size {world} is not a multiple of gpus_per_node ({gpus_per_node})")
    hosts = tuple(hostnames) if hostnames else None
    nodes = -(-world // min(gpus_per_node, world))
    if hosts is not None and len(hosts) != nodes:
        raise InputError(f"ranks: {len(hosts)} hostnames given for {nodes} nodes")
    return RankMap(sizes=sizes, order=order, gpus_per_node=gpus_per_node, hostnames=hosts)


def check_costed_order(layout: Layout, order: str) -> None:
    """A launch in `order` must place every group on the ranks the cost model priced (`COSTED_ORDER`);
    UnsupportedError naming the groups that would move otherwise (an unknown order is left to the caller)."""
    if order == COSTED_ORDER or order not in ORDERS:
        return
    launched, costed = grid(layout, order), grid(layout, COSTED_ORDER)
    moved = [d for d in costed.grid_dims if launched.groups(d) != costed.groups(d)]
    if moved:
        raise UnsupportedError(
            f"order: {order} puts the {' and '.join(moved)} groups of this layout on other ranks than the order "
            f"the cost model priced ({COSTED_ORDER}), so its prediction would not hold; launch it in {COSTED_ORDER}"
        )
