"""The Topology: a networkx graph plus the queries the cost model asks of it.

Bandwidths are per GPU, bytes/s per direction, of a ring-style collective over a rank group:
- inside one scale-up domain: NVSwitch: the GPU's link to the switch; mesh: the sum of its direct links
  to the other group members (NCCL runs several rings); PCIe tree: the slowest PCIe/socket link the ring
  crosses (a ring crosses each tree link once per direction);
- across domains: per scale-up domain, the NIC bandwidth the group's GPUs there own, divided by the oversubscription
  of every leaf->spine (->core) boundary the group climbs over. Not divided by the group's GPUs there: NCCL
  runs one ring (channel) per NIC, each carrying its share of the buffer, so a ring collective over g GPUs
  per server with g NICs moves data at g x the NIC rate per GPU, capped by the scale-up links (the
  multi-node busbw of nccl-tests on DGX A100, ~185 of 8 x 25 GB/s, shows this);
- the result is the minimum over the levels crossed and over servers. Latency is that of the slowest
  level crossed (end to end, both directions of the path up to the highest switch tier reached).

All-to-all (the MoE token dispatch and combine over an EP group) is priced apart, on every member of every
group of the dimension: a member scatters its buffer evenly over the n members, (n_d - 1)/n of it to the
n_d - 1 others in its scale-up domain over its scale-up links and (n - n_d)/n out of the domain over the NIC
share the group owns there (the domain's members pool their NICs, as NCCL's PXN and DeepEP's NVLink
forwarding do), divided by the oversubscription climbed; the two run at once, so the slower one sets the time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from optlayout.errors import InputError
from optlayout.specs import GpuSpec
from optlayout.topology.analysis import Tables, analyse

if TYPE_CHECKING:  # networkx loads only where a graph is built (`graph`, `analyse`)
    import networkx as nx

TIER_NAMES = ("leaf", "spine", "core")
_KIND_CODE = {"nvswitch": 0, "mesh": 1, "pcie": 2, "none": 3}


def ordered_gpu_nodes(graph: nx.Graph[str]) -> list[str]:
    """GPU nodes in rank order: grouped by server (in order of first appearance), then insertion order."""
    gpus = [n for n, data in graph.nodes.items() if data.get("kind") == "gpu"]
    first: dict[Any, int] = {}
    for g in gpus:
        first.setdefault(graph.nodes[g].get("server"), len(first))
    return sorted(gpus, key=lambda g: first[graph.nodes[g].get("server")])


class Topology:
    """A cluster as a graph of GPUs, NVSwitches, PCIe switches, CPUs, NICs and leaf/spine switches.

    Ranks are numbered server-major (rank = server_index * gpus_per_server + local_gpu). Treat `graph`
    as read-only: the link tables are read from it once, when the Topology is made, unless they are given
    (`tables`, with `gpu_nodes`): then `graph` may be a function that builds it, called the first time
    `graph` is read (a regular cluster's tables come from its template, see `topology.regular`).
    """

    def __init__(
        self,
        name: str,
        gpu: GpuSpec,
        graph: nx.Graph[str] | Callable[[], nx.Graph[str]],
        gpu_nodes: Sequence[str] | None = None,
        description: str = "",
        tables: Tables | None = None,
    ) -> None:
        self.name = name
        self.gpu = gpu
        self._graph = graph
        self.description = description
        if tables is not None and gpu_nodes is None:
            raise ValueError("Topology: given tables need their gpu_nodes")
        if gpu_nodes is None:
            self._gpu_nodes: Sequence[str] = ordered_gpu_nodes(self.graph)
        else:
            self._gpu_nodes = gpu_nodes if tables is not None else list(gpu_nodes)
        if not self._gpu_nodes:
            raise InputError("nodes: the topology has no gpu nodes")
        self._t: Tables = tables if tables is not None else analyse(self.graph, list(self._gpu_nodes))
        self.num_gpus = len(self._gpu_nodes)
        self.num_servers = len(self._t.server_names)
        self.gpus_per_server = self.num_gpus // self.num_servers
        self._kind_code = np.array([_KIND_CODE[k] for k in self._t.domain_kind])
        self._dims: dict[tuple[int, int], tuple[float, float]] = {}
        self._a2a: dict[tuple[int, int], tuple[float, float]] = {}
        self._pairs: dict[tuple[int, int, int], tuple[float, float]] = {}
        self._dim_domains: dict[tuple[int, int], int] = {}
        self._contiguous_domains = bool((np.diff(self._t.domain) >= 0).all())
        self._factor = np.stack(self._t.factor) if self._t.factor else np.ones((0, self.num_gpus))
        self._lat_up = np.stack(self._t.lat_up) if self._t.lat_up else np.zeros((0, self.num_gpus))

    @property
    def graph(self) -> nx.Graph[str]:
        """The cluster's graph (built on first use when the Topology was made from its tables)."""
        if callable(self._graph):  # a builder (a networkx Graph is not callable)
            self._graph = self._graph()
        return self._graph

    def __repr__(self) -> str:
        return (
            f"Topology({self.name!r}, gpu={self.gpu.name}, gpus={self.num_gpus}, servers={self.num_servers}, "
            f"domain_size={self.domain_size})"
        )

    # ------------------------------------------------------------------------------------------ ranks

    def _check(self, rank: int) -> int:
        if not 0 <= rank < self.num_gpus:
            raise InputError(f"rank: {rank} is outside 0..{self.num_gpus - 1}")
        return rank

    def gpu_node(self, rank: int) -> str:
        """Graph node id of a global rank."""
        return self._gpu_nodes[self._check(rank)]

    def server_of(self, rank: int) -> int:
        return int(self._t.server[self._check(rank)])

    def server_name(self, index: int) -> str:
        return self._t.server_names[index]

    def domain_of(self, rank: int) -> str:
        """Id of the scale-up (NVLink) domain holding the rank."""
        return f"domain{int(self._t.domain[self._check(rank)])}"

    @property
    def num_domains(self) -> int:
        return len(self._t.domain_kind)

    @property
    def domain_size(self) -> int:
        """GPUs per scale-up domain (the smallest one)."""
        return int(self._t.domain_sizes.min())

    @property
    def scale_up_kinds(self) -> list[str]:
        """Distinct kinds of scale-up domain: nvswitch, mesh, pcie, none."""
        return sorted(set(self._t.domain_kind))

    # ------------------------------------------------------------------------------------------ groups

    def group_bandwidth_Bps(self, ranks: Sequence[int]) -> float:
        """Per-GPU bandwidth (bytes/s per direction) of a ring collective over exactly these ranks."""
        return self._group(self._ranks(ranks))[0]

    def group_latency_s(self, ranks: Sequence[int]) -> float:
        """Latency of the slowest link level the group crosses."""
        return self._group(self._ranks(ranks))[1]

    def _ranks(self, ranks: Sequence[int]) -> np.ndarray:
        arr = np.asarray(ranks, dtype=np.int64).ravel()
        if arr.size == 0:
            raise InputError("ranks: a group needs at least one rank")
        uniq = np.unique(arr)
        if uniq.size != arr.size:
            raise InputError("ranks: a group lists a rank twice")
        if uniq[0] < 0 or uniq[-1] >= self.num_gpus:
            bad = int(uniq[0] if uniq[0] < 0 else uniq[-1])
            raise InputError(f"rank: {bad} is outside 0..{self.num_gpus - 1}")
        return uniq

    def _group(self, ranks: np.ndarray) -> tuple[float, float]:
        """(bandwidth, latency) of a sorted array of distinct ranks."""
        if ranks.size == 1:
            return math.inf, 0.0
        t = self._t
        dom = t.domain[ranks]
        if (dom[0] == dom).all():
            return self._domain_link(int(dom[0]), ranks)
        bw, lat = self._scale_up_part(ranks, dom)
        net_bw, net_lat = self._network_part(ranks)
        return min(bw, net_bw), max(lat, net_lat)

    def _scale_up_part(self, ranks: np.ndarray, dom: np.ndarray) -> tuple[float, float]:
        """Links inside the domains that hold two or more of the group's ranks."""
        if (dom[1:] < dom[:-1]).any():
            order = np.argsort(dom, kind="stable")
            ranks, dom = ranks[order], dom[order]
        starts = np.flatnonzero(np.r_[True, dom[1:] != dom[:-1]])
        lengths = np.diff(np.r_[starts, dom.size])
        multi = lengths >= 2
        if not multi.any():
            return math.inf, 0.0
        members = ranks[np.repeat(multi, lengths)]
        if (self._kind_code[dom[starts[multi]]] == 0).all():
            return float(self._t.su_bw[members].min()), 2 * float(self._t.su_lat[members].max())
        bw, lat = math.inf, 0.0
        for start, length in zip(starts[multi], lengths[multi], strict=True):
            b, l_ = self._domain_link(int(dom[start]), ranks[start : start + length])
            bw, lat = min(bw, b), max(lat, l_)
        return bw, lat

    def _domain_link(self, domain: int, ranks: np.ndarray) -> tuple[float, float]:
        kind = self._t.domain_kind[domain]
        if kind == "nvswitch":
            return float(self._t.su_bw[ranks].min()), 2 * float(self._t.su_lat[ranks].max())
        if kind == "mesh":
            return self._mesh_link(ranks)
        return self._host_link(ranks)

    def _mesh_link(self, ranks: np.ndarray) -> tuple[float, float]:
        """Each GPU drives all its direct links to other members; a GPU with none relays at half a link."""
        members = {int(r) for r in ranks}
        bw, lat = math.inf, 0.0
        for r in members:
            links = self._t.mesh.get(r, {})
            mine = [links[m] for m in members if m in links]
            if mine:
                bw = min(bw, sum(b for b, _ in mine))
                lat = max(lat, max(l_ for _, l_ in mine))
            else:
                bw = min(bw, max((b for b, _ in links.values()), default=0.0) / 2)
                lat = max(lat, 2 * max((l_ for _, l_ in links.values()), default=0.0))
        return bw, lat

    def _host_link(self, ranks: np.ndarray) -> tuple[float, float]:
        """PCIe tree: the slowest link below the lowest common ancestor (a ring crosses each once)."""
        chains = [self._t.host[int(r)] for r in ranks]
        common = set.intersection(*({node for node, _, _ in chain} for chain in chains))
        bw, lat = math.inf, 0.0
        for chain in chains:
            up = 0.0
            for node, edge_bw, edge_lat in chain:
                bw, up = min(bw, edge_bw), up + edge_lat
                if node in common:
                    break
            lat = max(lat, 2 * up)
        return bw, lat

    def _network_part(self, ranks: np.ndarray) -> tuple[float, float]:
        """Per domain: owned NIC bandwidth / oversubscription of the tiers climbed (one ring per NIC)."""
        t = self._t
        level = next((k for k, b in enumerate(t.blocks) if (b[ranks] == b[ranks[0]]).all()), None)
        if level is None:
            raise InputError(f"topology: no network path joins ranks {int(ranks[0])} and {int(ranks[-1])}")
        # NIC pools: the group's GPUs in one scale-up domain reach each other's NICs over NVLink (PXN).
        _, pool = np.unique(t.domain[ranks], return_inverse=True)
        owned = np.bincount(pool, weights=t.nic_bw[ranks])
        oversub = np.zeros(owned.size)
        np.maximum.at(oversub, pool, t.factor[level][ranks])
        bw = float((owned / oversub).min())
        return bw, 2 * float(t.lat_up[level][ranks].max())

    # ------------------------------------------------------------------------------------------ pairs

    def pairs_link(self, first: int, second: int, count: int) -> tuple[float, float]:
        """Worst (bandwidth, latency) over the point-to-point pairs (first + j, second + j), j < count; cached.

        What a pipeline stage boundary needs: each of a stage's ranks sends to its peer in the next stage at
        once, each pair over its own path (per GPU: its NVSwitch link inside a domain, its own share of the
        NICs across domains, divided by the oversubscription of the tiers climbed), as a group of the two."""
        if count < 1 or min(first, second) < 0 or max(first, second) + count > self.num_gpus:
            raise InputError(f"pairs: ranks {first}+j and {second}+j (j < {count}) leave 0..{self.num_gpus - 1}")
        if first == second:
            raise InputError("pairs: a rank is paired with itself")
        period = self._t.period
        if period is not None:  # pairs shifted by a multiple of the period are alike: one period's worth, from 0
            shift = min(first, second) // period * period
            first, second, count = first - shift, second - shift, min(count, period)
        key = (first, second, count)
        hit = self._pairs.get(key)
        if hit is None:
            hit = self._pairs[key] = self._evaluate_pairs(first, second, count)
        return hit

    def _evaluate_pairs(self, first: int, second: int, count: int) -> tuple[float, float]:
        j = np.arange(count, dtype=np.int64)
        bw, lat = self._worst_group(np.sort(np.stack([first + j, second + j], axis=1), axis=1))
        if not (0 < bw <= math.inf and 0 <= lat < math.inf):  # the cost model divides by it
            raise InputError(f"topology: ranks {first}+j and {second}+j have no usable link (bandwidth {bw:g})")
        return bw, lat

    def _worst_group(self, rows: np.ndarray) -> tuple[float, float]:
        """Worst bandwidth and worst latency over every group (a row of ascending distinct ranks), each read as
        `_group` reads it, vectorized: NVSwitch links of the members sharing a domain, and per domain the NIC
        bandwidth the members there own over the oversubscription of the lowest tier joining the row. Rows
        with two or more members in a mesh or PCIe domain, or domains that are not rank-contiguous, go one by one."""
        t = self._t
        dom = t.domain[rows]
        same = dom[:, 1:] == dom[:, :-1]  # rows ascend, domains are rank blocks: members of a domain are adjacent
        shared = np.zeros(rows.shape, dtype=bool)
        shared[:, 1:] |= same
        shared[:, :-1] |= same
        one_by_one = (shared & (self._kind_code[dom] != 0)).any(axis=1) | (not self._contiguous_domains)
        bw, lat = math.inf, 0.0
        for row in rows[one_by_one]:
            b, l_ = self._group(row)
            bw, lat = min(bw, b), max(lat, l_)
        keep = ~one_by_one
        rows, dom, same, shared = rows[keep], dom[keep], same[keep], shared[keep]
        if shared.any():
            bw = min(bw, float(t.su_bw[rows][shared].min()))
            lat = max(lat, 2 * float(t.su_lat[rows][shared].max()))
        cross = ~same.all(axis=1)
        if not cross.any():
            return bw, lat
        rows, dom = rows[cross], dom[cross]
        level = np.full(len(rows), -1)
        for k, block in enumerate(t.blocks):
            b = block[rows]
            level[(level < 0) & (b == b[:, :1]).all(axis=1)] = k
        if (level < 0).any():
            row = rows[int(np.flatnonzero(level < 0)[0])]
            raise InputError(f"topology: no network path joins ranks {int(row[0])} and {int(row[-1])}")
        starts = np.flatnonzero(np.c_[np.ones((len(rows), 1), dtype=bool), dom[:, 1:] != dom[:, :-1]].ravel())
        owned = np.add.reduceat(t.nic_bw[rows].ravel(), starts)
        oversub = np.maximum.reduceat(self._factor[level[:, None], rows].ravel(), starts)
        bw = min(bw, float((owned / oversub).min()))
        return bw, max(lat, 2 * float(self._lat_up[level[:, None], rows].max()))

    # ------------------------------------------------------------------------------------------ dims

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float:
        """Worst group of a parallel dimension laid out Megatron-style (ranks base + stride*i); cached."""
        return self._dim(size, stride)[0]

    def dim_latency_s(self, size: int, stride: int) -> float:
        return self._dim(size, stride)[1]

    def dim_domains(self, size: int, stride: int) -> int:
        """Most scale-up domains (NCCL's nodes) one group of the dimension spans; cached."""
        key = (size, stride)
        hit = self._dim_domains.get(key)
        if hit is None:
            self._dim(size, stride)  # checks the arguments
            if size == 1:
                hit = 1
            else:
                dom = self._t.domain[self._tiled_groups(size, stride)]
                dom.sort(axis=1)
                hit = int((1 + (dom[:, 1:] != dom[:, :-1]).sum(axis=1)).max())
            self._dim_domains[key] = hit
        return hit

    def _dim(self, size: int, stride: int) -> tuple[float, float]:
        key = (size, stride)
        hit = self._dims.get(key)
        if hit is None:
            hit = self._dims[key] = self._evaluate_dim(size, stride)
        return hit

    def _evaluate_dim(self, size: int, stride: int) -> tuple[float, float]:
        """Groups tile the first floor(N / (size*stride)) * size*stride ranks; every one is read, or on a periodic
        cluster one of each alike kind (`_tiled_groups`). A sample could miss the groups that straddle a domain or
        pod edge: tp 16 in 72-GPU NVLink domains, say."""
        if size < 1 or stride < 1:
            raise InputError(f"dim: size ({size}) and stride ({stride}) must be positive")
        if size == 1:
            return math.inf, 0.0
        bw, lat = self._worst_group(self._tiled_groups(size, stride))
        if not (0 < bw <= math.inf and 0 <= lat < math.inf):  # the cost model divides by it
            raise InputError(f"topology: groups of {size} GPUs {stride} apart have no usable link (bandwidth {bw:g})")
        return bw, lat

    def dim_all_to_all_bandwidth_Bps(self, size: int, stride: int) -> float:
        """Effective bandwidth of an all-to-all over the dimension's groups (ranks base + stride*i): the slowest
        member's buffer bytes per second (its whole buffer, its own share included); every group read; cached."""
        return self._all_to_all(size, stride)[0]

    def dim_all_to_all_latency_s(self, size: int, stride: int) -> float:
        return self._all_to_all(size, stride)[1]

    def _all_to_all(self, size: int, stride: int) -> tuple[float, float]:
        key = (size, stride)
        hit = self._a2a.get(key)
        if hit is None:
            hit = self._a2a[key] = self._evaluate_all_to_all(size, stride)
        return hit

    def _tiled_groups(self, size: int, stride: int) -> np.ndarray:
        """Every group of a dimension laid out Megatron-style, one row each (size x stride blocks tiled), or on a
        periodic cluster the blocks up to the first that repeats one (shifted by a multiple of the period: alike
        ranks, the same worst case)."""
        if size < 1 or stride < 1:
            raise InputError(f"dim: size ({size}) and stride ({stride}) must be positive")
        span = size * stride
        if span > self.num_gpus:
            raise InputError(f"dim: size {size} x stride {stride} = {span} exceeds the {self.num_gpus} GPUs")
        blocks = self.num_gpus // span
        if self._t.period is not None:
            blocks = min(blocks, math.lcm(span, self._t.period) // span)
        g = np.arange(blocks * stride, dtype=np.int64)
        return ((g // stride) * span + g % stride)[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride

    def _evaluate_all_to_all(self, size: int, stride: int) -> tuple[float, float]:
        if size == 1:
            return math.inf, 0.0
        t, groups = self._t, self._tiled_groups(size, stride)
        dom = t.domain[groups]
        # members of the same group in the same domain: n_d, and the NIC bandwidth they own together
        key = np.arange(groups.shape[0])[:, None] * self.num_domains + dom
        _, where, n_d = np.unique(key.ravel(), return_inverse=True, return_counts=True)
        owned = np.bincount(where, weights=t.nic_bw[groups].ravel())[where].reshape(groups.shape)
        n_d = n_d[where].reshape(groups.shape).astype(float)
        if (self._kind_code[dom] == 0).all():  # NVSwitch domains: each GPU's own links to the switch
            inside = t.su_bw[groups].astype(float)
        else:
            inside = np.stack([self._scale_up_members(m, d) for m, d in zip(groups, dom, strict=True)])
        with np.errstate(divide="ignore"):  # a link of bandwidth 0 takes forever: refused below
            seconds_per_byte = np.where(n_d > 1, (n_d - 1) / size / inside, 0.0)
        latency = np.where(n_d > 1, 2 * t.su_lat[groups], 0.0).max()
        if (n_d < size).any():
            joined = np.stack([(b[groups] == b[groups[:, :1]]).all(axis=1) for b in t.blocks])
            if not joined.any(axis=0).all():
                row = int(np.flatnonzero(~joined.any(axis=0))[0])
                raise InputError(f"topology: no network path joins ranks {groups[row, 0]} and {groups[row, -1]}")
            level = joined.argmax(axis=0)
            factor = self._factor[level[:, None], groups]
            oversub = factor.max(axis=1, keepdims=True)
            network = owned / n_d / oversub
            with np.errstate(divide="ignore"):
                out = np.where(n_d < size, (size - n_d) / size / network, 0.0)
            seconds_per_byte = np.maximum(seconds_per_byte, out)
            latency = max(latency, 2 * float(self._lat_up[level[:, None], groups].max()))
        slowest_s = float(seconds_per_byte.max())
        bw = 1.0 / slowest_s if slowest_s > 0 else math.inf
        if not (0 < bw <= math.inf and 0 <= latency < math.inf):  # the cost model divides by it
            raise InputError(f"topology: all-to-all groups of {size} GPUs {stride} apart have no usable link")
        return bw, float(latency)

    def _scale_up_members(self, members: np.ndarray, dom: np.ndarray) -> np.ndarray:
        """Per member, the scale-up bandwidth it drives to the group's other members in its domain."""
        out = np.full(members.size, math.inf)
        for d in np.unique(dom):
            here = dom == d
            if here.sum() > 1:
                if self._t.domain_kind[int(d)] == "nvswitch":
                    out[here] = self._t.su_bw[members[here]]
                else:
                    out[here] = self._domain_link(int(d), np.sort(members[here]))[0]
        return out

    # ------------------------------------------------------------------------------------------ display

    def levels(self) -> list[dict[str, Any]]:
        """Each link level (scale-up, leaf, spine, ...) with per-GPU bandwidth, latency and GPUs in reach."""
        t = self._t
        out = []
        multi = [d for d in range(self.num_domains) if t.domain_sizes[d] > 1]
        if multi:  # the slowest domain's links (the cost model prices a group by its slowest link)
            links = [self._domain_link(d, members) for d, members in self._domain_members(multi, alike_once=True)]
            kinds = ", ".join(sorted({t.domain_kind[d] for d in multi}))
            gpus = int(min(t.domain_sizes[d] for d in multi))
            out.append(_level("scale-up", kinds, gpus, min(b for b, _ in links), max(lat for _, lat in links), 1.0))
        heads = np.unique(t.domain, return_index=True)[1]
        heads.sort()
        for k, block in enumerate(t.blocks):
            same = heads[block[heads] == block[0]]
            other = same[1:] if k == 0 else same[t.blocks[k - 1][same] != t.blocks[k - 1][0]]
            if other.size == 0:
                continue
            bw, lat = self._group(np.array([0, int(other[0])]))
            name = TIER_NAMES[k] if k < len(TIER_NAMES) else f"tier{k + 1}"
            out.append(_level(name, "network", int((block == block[0]).sum()), bw, lat, float(t.factor[k][0])))
        return out

    def _domain_members(self, domains: list[int], alike_once: bool = False) -> list[tuple[int, np.ndarray]]:
        """Each listed domain with its sorted ranks; with `alike_once`, NVSwitch domains of equal links once."""
        t = self._t
        order = np.argsort(t.domain, kind="stable")
        starts = np.r_[0, np.cumsum(t.domain_sizes)]
        seen: set[tuple[object, ...]] = set()
        out = []
        for d in domains:
            members = np.sort(order[starts[d] : starts[d + 1]])
            key = (t.domain_kind[d], tuple(t.su_bw[members].tolist()), tuple(t.su_lat[members].tolist()))
            if not alike_once or t.domain_kind[d] != "nvswitch" or key not in seen:
                seen.add(key)
                out.append((d, members))
        return out

    def irregular_domains(self) -> list[str]:
        """The scale-up domains smaller than the largest, by their GPUs (empty when all are alike in size): the
        search takes the smallest domain as every group's reach."""
        t = self._t
        largest = int(t.domain_sizes.max())
        out = []
        for d, members in self._domain_members([d for d in range(self.num_domains) if t.domain_sizes[d] < largest]):
            names = [self._gpu_nodes[int(r)] for r in members]
            listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            out.append(f"{listed} ({len(names)} GPU{'s' if len(names) > 1 else ''}, {t.domain_kind[d]})")
        return out

    def bisection_bandwidth_Bps(self) -> float:
        """Bytes/s per direction across the worst cut into two halves (by level capacities)."""
        t = self._t
        n = self.num_gpus
        if n == 1:
            return 0.0
        if self.num_domains == 1:
            kind = t.domain_kind[0]
            if kind == "nvswitch":
                return n // 2 * float(t.su_bw.min())
            if kind == "mesh":
                half = n // 2
                return sum(b for r in range(half) for m, (b, _) in t.mesh.get(r, {}).items() if m >= half)
            return self._host_link(np.arange(n))[0]
        caps = [float(t.nic_bw.sum()) / 2]
        caps += [t.uplink_total[k] / 2 for k, block in enumerate(t.blocks) if (block != block[0]).any()]
        return min(caps)

    def summary(self) -> dict[str, Any]:
        """What `optlayout topology show` prints."""
        return {
            "name": self.name,
            "description": self.description,
            "gpu": self.gpu.name,
            "gpus": self.num_gpus,
            "servers": self.num_servers,
            "gpus_per_server": self.gpus_per_server,
            "domains": self.num_domains,
            "domain_size": self.domain_size,
            "largest_domain_size": int(self._t.domain_sizes.max()),
            "smaller_domains": self.irregular_domains(),
            "scale_up": self.scale_up_kinds,
            "levels": self.levels(),
            "bisection_bandwidth_Bps": self.bisection_bandwidth_Bps(),
            "graph_nodes": self.graph.number_of_nodes(),
            "graph_edges": self.graph.number_of_edges(),
        }


def _level(name: str, kind: str, gpus: int, bw: float, lat: float, oversub: float) -> dict[str, Any]:
    return {
        "level": name,
        "kind": kind,
        "gpus": int(gpus),
        "bandwidth_Bps": bw,
        "latency_s": lat,
        "oversubscription": oversub,
    }
