"""Read the link structure out of a topology graph once, into per-rank arrays the group queries index.

For every GPU (rank): its server, its scale-up domain (connected component of NVSwitch / GPU-GPU links,
or the server's PCIe tree when it has none), its scale-up bandwidth, the NIC bandwidth it owns (each NIC
is shared by the GPUs nearest to it), and for every network tier the block it sits in (leaf block, then
connected components of the switches up to each higher tier), the oversubscription it meets climbing
out of that block and the one-way latency up to it. Everything is computed from node kinds and edge
attributes only, so generated and explicit topologies are read the same way.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from optlayout.errors import InputError
from optlayout.topology.schema import HOST_KINDS, SWITCH_TIERS

if TYPE_CHECKING:  # loaded by the functions that build graphs: a regular cluster's tables need none
    import networkx as nx

Adjacency = Mapping[str, Mapping[str, Mapping[str, Any]]]  # node -> neighbour -> edge data (graph.adj)
Chain = list[tuple[str, float, float]]  # (parent node, bandwidth of the edge up to it, latency of that edge)


@dataclass
class Tables:
    """Per-rank link data (index = global rank) and per-domain facts."""

    server: np.ndarray  # server index per rank
    server_names: list[str]
    domain: np.ndarray  # scale-up domain index per rank
    domain_kind: list[str]  # per domain: nvswitch | mesh | pcie | none
    domain_sizes: np.ndarray
    su_bw: np.ndarray  # per rank: bandwidth of its NVSwitch links
    su_lat: np.ndarray  # per rank: latency of one NVSwitch hop
    nic_bw: np.ndarray  # per rank: NIC bandwidth it owns
    blocks: list[np.ndarray] = field(default_factory=list)  # per tier k: block id per rank (k = 0: leaf block)
    factor: list[np.ndarray] = field(default_factory=list)  # per tier k: oversubscription met climbing to it
    lat_up: list[np.ndarray] = field(default_factory=list)  # per tier k: one-way latency up to its switches
    uplink_total: list[float] = field(default_factory=list)  # per tier k: capacity leaving its switches upwards
    mesh: dict[int, dict[int, tuple[float, float]]] = field(default_factory=dict)  # rank -> peer -> (bw, latency)
    host: dict[int, Chain] = field(default_factory=dict)  # rank -> edges up its PCIe tree (pcie domains)
    # ranks r and r + period are alike (same values; same domain, server and block boundaries), where known
    period: int | None = None


@dataclass
class _Switches:
    tier: dict[str, int]
    oversub: dict[str, float]
    up_latency: dict[str, float]
    up_capacity: dict[str, float]
    down_capacity: dict[str, float]
    comp: list[dict[str, int]]  # comp[j][leaf] = component id at tier j + 2


def analyse(graph: nx.Graph[str], gpu_nodes: list[str]) -> Tables:
    """Per-rank tables for `gpu_nodes` (rank order) in `graph`."""
    # `adjacency()` and `nodes(data=True)` hand out networkx's own attribute dicts: reading through them is
    # as fast as the raw dicts, where the `graph.adj` views cost 1.5 s more on 131,072 GPUs.
    adj: Adjacency = dict(graph.adjacency())
    nodes: dict[str, dict[str, Any]] = dict(cast(Iterable[tuple[str, dict[str, Any]]], graph.nodes(data=True)))
    kind = {n: d["kind"] for n, d in nodes.items()}
    switches = _switch_info(adj, nodes, kind)
    server, server_names = _servers(nodes, gpu_nodes)
    scan = _scan_gpus(adj, kind, gpu_nodes, switches)
    domain, domain_kind = _domains(scan, server, gpu_nodes)
    tables = Tables(
        server=server,
        server_names=server_names,
        domain=domain,
        domain_kind=domain_kind,
        domain_sizes=np.bincount(domain),
        su_bw=np.array(scan.su_bw),
        su_lat=np.array(scan.su_lat),
        nic_bw=np.array(scan.nic_bw),
        mesh=scan.mesh,
    )
    tables.host = {r: _host_chain(adj, kind, gpu_nodes[r]) for r in range(len(gpu_nodes)) if scan.host_domain[r]}
    _network_tiers(tables, scan, switches)
    _check_reachable(tables, gpu_nodes, scan)
    return tables


# ---------------------------------------------------------------------------------------------- servers


def _servers(nodes: dict[str, dict[str, Any]], gpu_nodes: list[str]) -> tuple[np.ndarray, list[str]]:
    """Server index per rank; ranks must be server-major with the same GPU count per server."""
    index: dict[str, int] = {}
    out = []
    for g in gpu_nodes:
        name = nodes[g].get("server")
        if name is None:
            raise InputError(f"nodes: gpu {g!r} has no server")
        if name not in index:
            index[name] = len(index)
        elif index[name] != len(index) - 1:
            raise InputError(f"nodes: gpus of server {name!r} are not contiguous in rank order (at {g!r})")
        out.append(index[name])
    server = np.array(out, dtype=np.int64)
    counts = np.bincount(server)
    if counts.min() != counts.max():
        names = list(index)
        raise InputError(
            f"nodes: servers hold different GPU counts ({names[counts.argmin()]}: {counts.min()}, "
            f"{names[counts.argmax()]}: {counts.max()})"
        )
    return server, list(index)


# ---------------------------------------------------------------------------------------------- switches


def _switch_info(adj: Adjacency, nodes: dict[str, dict[str, Any]], kind: dict[str, str]) -> _Switches:
    """Tier, oversubscription (down/up capacity), up-link latency and tier components of every switch."""
    tier = {n: int(nodes[n].get("tier") or SWITCH_TIERS[k]) for n, k in kind.items() if k in SWITCH_TIERS}
    oversub, up_lat, up_cap, down_cap = {}, {}, {}, {}
    for s, t in tier.items():
        down = up = lat = 0.0
        for nb, d in adj[s].items():
            if tier.get(nb, 0) > t:
                up += d["bandwidth_Bps"]
                lat = max(lat, d["latency_s"])
            else:
                down += d["bandwidth_Bps"]
        oversub[s] = max(1.0, down / up) if up > 0 else math.inf
        up_lat[s], up_cap[s], down_cap[s] = lat, up, down
    top = max(tier.values(), default=1)
    comps = [_components(adj, tier, t) for t in range(2, top + 1)]
    return _Switches(tier, oversub, up_lat, up_cap, down_cap, comps)


def _components(adj: Adjacency, tier: dict[str, int], top: int) -> dict[str, int]:
    """Connected components of the switches of tier <= top (ids in order of first node)."""
    import networkx as nx

    below: nx.Graph[str] = nx.Graph()
    below.add_nodes_from(s for s, t in tier.items() if t <= top)
    below.add_edges_from((s, nb) for s in below for nb in adj[s] if tier.get(nb, top + 1) <= top)
    return {n: label for label, members in enumerate(nx.connected_components(below)) for n in members}


# ---------------------------------------------------------------------------------------------- GPUs


@dataclass
class _Scan:
    su_bw: list[float]
    su_lat: list[float]
    su_links: list[list[str] | None]  # scale-up neighbours (NVSwitches, GPUs) per rank
    host_domain: list[bool]
    mesh: dict[int, dict[int, tuple[float, float]]]
    picks: list[list[tuple[str, float, float]]]  # nearest NICs: (nic, path bandwidth, path latency)
    ports: dict[str, tuple[float, list[tuple[str, float]]]]  # cabled nic -> (port bandwidth, [(switch, latency)])
    nic_bw: list[float] = field(default_factory=list)
    leaf_oversub: list[float] = field(default_factory=list)
    leaf_lat: list[float] = field(default_factory=list)
    leaf: list[str] = field(default_factory=list)  # first switch above the rank's NICs ("" when none)
    leaves: list[tuple[str, ...]] = field(default_factory=list)  # every switch above the rank's NICs


def _nic_ports(adj: Adjacency, kind: dict[str, str], sw: _Switches) -> dict[str, tuple[float, list[tuple[str, float]]]]:
    """Every NIC cabled to a network switch: total port bandwidth and the switches with their latency."""
    ports: dict[str, list[Any]] = {}
    for s in sw.tier:
        for nb, d in adj[s].items():
            if kind[nb] == "nic":
                entry = ports.get(nb)
                if entry is None:
                    ports[nb] = [d["bandwidth_Bps"], [(s, d["latency_s"])]]
                else:
                    entry[0] += d["bandwidth_Bps"]
                    entry[1].append((s, d["latency_s"]))
    return {nic: (bw, leaves) for nic, (bw, leaves) in ports.items()}


def _scan_gpus(adj: Adjacency, kind: dict[str, str], gpu_nodes: list[str], sw: _Switches) -> _Scan:
    """One pass over every GPU's links: scale-up links, nearest NICs; then the NIC share of each GPU."""
    n = len(gpu_nodes)
    ports = _nic_ports(adj, kind, sw)
    scan = _Scan([0.0] * n, [0.0] * n, [None] * n, [False] * n, {}, [[]] * n, ports)
    su_bw, su_lat, su_links, host_domain, picks = scan.su_bw, scan.su_lat, scan.su_links, scan.host_domain, scan.picks
    named_mesh: dict[int, dict[str, tuple[float, float]]] = {}  # rank -> peer GPU node -> (bw, latency)
    for r, g in enumerate(gpu_nodes):
        links: list[str] = []
        direct: list[tuple[str, float, float]] = []
        host, bw, lat = False, 0.0, 0.0
        for nb, d in adj[g].items():
            k = kind[nb]
            if k == "nvswitch":
                bw += d["bandwidth_Bps"]
                lat = max(lat, d["latency_s"])
                links.append(nb)
            elif k == "nic":
                if nb in ports:
                    direct.append((nb, d["bandwidth_Bps"], d["latency_s"]))
            elif k == "gpu":
                named_mesh.setdefault(r, {})[nb] = (d["bandwidth_Bps"], d["latency_s"])
                links.append(nb)
            elif k in HOST_KINDS:
                host = True
        su_bw[r], su_lat[r] = bw, lat
        if links:
            su_links[r] = links
        elif host:
            host_domain[r] = True
        if not direct and host:
            direct = _nearest_nics(adj, kind, ports, g)
        if direct:
            picks[r] = direct
    if named_mesh:
        rank_of = {name: i for i, name in enumerate(gpu_nodes)}
        scan.mesh = {r: {rank_of[g]: v for g, v in links.items()} for r, links in named_mesh.items()}
    _share_nics(scan, sw)
    return scan


def _nearest_nics(
    adj: Adjacency, kind: dict[str, str], ports: dict[str, tuple[float, list[tuple[str, float]]]], gpu: str
) -> list[tuple[str, float, float]]:
    """Cabled NICs reachable through the fewest PCIe switches / CPUs, with path bottleneck and latency."""
    best: dict[str, tuple[float, float]] = {}
    frontier = [(gpu, math.inf, 0.0)]
    seen = {gpu}
    while frontier and not best:
        nxt = []
        for node, bw, lat in frontier:
            for nb, d in adj[node].items():
                if nb in seen:
                    continue
                path = (min(bw, d["bandwidth_Bps"]), lat + d["latency_s"])
                if kind[nb] == "nic" and nb in ports:
                    best.setdefault(nb, path)
                elif kind[nb] in HOST_KINDS:
                    seen.add(nb)
                    nxt.append((nb, *path))
        frontier = nxt
    return [(nic, bw, lat) for nic, (bw, lat) in best.items()]


def _share_nics(scan: _Scan, sw: _Switches) -> None:
    """Owned NIC bandwidth (min(port, path) / GPUs sharing the NIC), leaf oversubscription and latency."""
    pickers: dict[str, int] = {}
    for picks in scan.picks:
        for pick in picks:
            pickers[pick[0]] = pickers.get(pick[0], 0) + 1
    ports, oversub = scan.ports, sw.oversub
    for picks in scan.picks:
        owned, over, lat = 0.0, 1.0, 0.0
        above: tuple[str, ...] = ()
        for nic, path_bw, path_lat in picks:
            port_bw, leaves = ports[nic]
            owned += min(port_bw, path_bw) / pickers[nic]
            for s, link_lat in leaves:
                over = max(over, oversub[s])
                lat = max(lat, path_lat + link_lat)
                above = (*above, s)
        scan.nic_bw.append(owned)
        scan.leaf_oversub.append(over)
        scan.leaf_lat.append(lat)
        scan.leaf.append(above[0] if above else "")
        scan.leaves.append(above)


# ---------------------------------------------------------------------------------------------- domains


def _domains(scan: _Scan, server: np.ndarray, gpu_nodes: list[str]) -> tuple[np.ndarray, list[str]]:
    """Scale-up domain per rank (numbered in rank order) and each domain's kind: the connected components of
    the NVSwitch and GPU-GPU links, else the server's PCIe tree, else the GPU alone."""

    import networkx as nx

    # A GPU on one NVSwitch and nothing else (the common case) only hangs off that switch: it is left out
    # of the graph and takes its switch's component (131,072 such GPUs would add 1.5 s of edges).
    def alone(r: int, peers: list[str] | None) -> bool:
        return peers is not None and len(peers) == 1 and r not in scan.mesh

    links: nx.Graph[str] = nx.Graph()
    links.add_edges_from(
        (gpu_nodes[r], peer) for r, peers in enumerate(scan.su_links) if peers and not alone(r, peers) for peer in peers
    )
    component: dict[str, object] = {n: c for c, members in enumerate(nx.connected_components(links)) for n in members}
    number: dict[tuple[str, object], int] = {}
    domain, kinds = [], []
    for r, peers in enumerate(scan.su_links):
        if peers:
            node = peers[0] if alone(r, peers) else gpu_nodes[r]
            key: tuple[str, object] = ("su", component.get(node, node))
        else:
            key = ("host", int(server[r])) if scan.host_domain[r] else ("single", r)
        if key not in number:
            number[key] = len(number)
            tag = key[0]
            kinds.append({"host": "pcie", "single": "none"}.get(tag) or ("nvswitch" if scan.su_bw[r] > 0 else "mesh"))
        domain.append(number[key])
    return np.array(domain, dtype=np.int64), kinds


def _host_chain(adj: Adjacency, kind: dict[str, str], gpu: str) -> Chain:
    """Edges from a GPU up its PCIe tree to its CPU, then to a virtual host root over the socket links."""
    dist = _distance_to_cpu(adj, kind, gpu)
    chain: Chain = []
    node = gpu
    while kind[node] != "cpu":
        ups = sorted(
            (dist[nb], nb) for nb in adj[node] if nb in dist and (kind[node] == "gpu" or dist[nb] < dist[node])
        )
        if not ups:
            break
        parent = ups[0][1]
        d = adj[node][parent]
        chain.append((parent, d["bandwidth_Bps"], d["latency_s"]))
        node = parent
    sockets = [(nb, d) for nb, d in adj[node].items() if kind[nb] == "cpu"] if kind[node] == "cpu" else []
    if sockets:
        chain.append(
            ("host-root", sum(d["bandwidth_Bps"] for _, d in sockets), max(d["latency_s"] for _, d in sockets))
        )
    return chain


def _distance_to_cpu(adj: Adjacency, kind: dict[str, str], gpu: str) -> dict[str, int]:
    """Hops from the nearest CPU for every PCIe switch / CPU in the GPU's host tree."""
    tree, queue = set(), deque(nb for nb in adj[gpu] if kind[nb] in HOST_KINDS)
    while queue:
        node = queue.popleft()
        if node not in tree:
            tree.add(node)
            queue.extend(nb for nb in adj[node] if kind[nb] in HOST_KINDS and nb not in tree)
    roots = sorted(n for n in tree if kind[n] == "cpu") or sorted(tree)[:1]
    dist = dict.fromkeys(roots, 0)
    queue = deque(roots)
    while queue:
        node = queue.popleft()
        for nb in adj[node]:
            if nb in tree and nb not in dist:
                dist[nb] = dist[node] + 1
                queue.append(nb)
    return dist


# ---------------------------------------------------------------------------------------------- network


def _network_tiers(t: Tables, scan: _Scan, sw: _Switches) -> None:
    """Blocks, oversubscription products and up-latencies per network tier (indexed through each rank's leaf)."""
    if not any(scan.leaf):
        return
    gps = len(t.server) // len(t.server_names)
    block_ids: dict[frozenset[str], int] = {}
    per_server = [
        block_ids.setdefault(
            frozenset(x for leaves in scan.leaves[k * gps : (k + 1) * gps] for x in leaves), len(block_ids)
        )
        for k in range(len(t.server_names))
    ]
    t.blocks.append(np.array(per_server)[t.server])
    t.factor.append(np.ones(len(t.server)))
    t.lat_up.append(np.array(scan.leaf_lat))
    t.uplink_total.append(sum(c for s, c in sw.up_capacity.items() if sw.tier[s] == 1))
    names = list(dict.fromkeys(scan.leaf))
    index = {s: i for i, s in enumerate(names)}
    leaf = np.array([index[s] for s in scan.leaf])
    factor = np.array(scan.leaf_oversub)
    lat = t.lat_up[0] + np.array([sw.up_latency.get(s, 0.0) for s in names])[leaf]
    for j, comp in enumerate(sw.comp):
        comp_of = np.array([comp.get(s, -1) for s in names])
        t.blocks.append(comp_of[leaf])
        t.factor.append(factor)
        t.lat_up.append(lat)
        over, up_lat, cap = _tier_aggregates(sw, comp, j + 2)
        t.uplink_total.append(sum(cap.values()))
        factor = factor * np.array([over.get(c, math.inf) for c in comp_of])[leaf]
        lat = lat + np.array([up_lat.get(c, 0.0) for c in comp_of])[leaf]


def _tier_aggregates(
    sw: _Switches, comp: dict[str, int], tier: int
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Per component: oversubscription of its tier-`tier` switches (sum down / sum up), up latency, up capacity."""
    down: dict[int, float] = {}
    up: dict[int, float] = {}
    lat: dict[int, float] = {}
    for s, c in comp.items():
        if sw.tier[s] != tier:
            continue
        down[c] = down.get(c, 0.0) + sw.down_capacity[s]
        up[c] = up.get(c, 0.0) + sw.up_capacity[s]
        lat[c] = max(lat.get(c, 0.0), sw.up_latency[s])
    over_c = {c: (max(1.0, down[c] / up[c]) if up[c] > 0 else math.inf) for c in down}
    return over_c, lat, up


def _check_reachable(t: Tables, gpu_nodes: list[str], scan: _Scan) -> None:
    """Several domains must be joined by a network: every GPU needs a NIC and one top block."""
    if len(t.domain_kind) <= 1:
        return
    for r, picks in enumerate(scan.picks):
        if not picks:
            raise InputError(f"topology: gpu {gpu_nodes[r]!r} has no path to a NIC cabled to a switch")
    top = t.blocks[-1]
    if (top != top[0]).any():
        other = int(np.flatnonzero(top != top[0])[0])
        raise InputError(
            f"topology: the network does not join {gpu_nodes[0]!r} and {gpu_nodes[other]!r} (no common switch tier)"
        )
