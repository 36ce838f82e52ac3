"""Topology documents -> networkx graph. Nodes carry `kind` (and `server`, `tier`, NIC `bandwidth_Bps`);
edges carry `bandwidth_Bps` (bytes/s per direction) and `latency_s`.

The graph is assembled as plain dicts and handed to networkx in one step: 131,072 GPUs with their NICs,
NVSwitches and switches build in about a second this way, against several through `add_edges_from`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import ceil
from typing import TYPE_CHECKING, Any

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_GPUS, MAX_GRAPH_ELEMENTS
from optlayout.specs import GpuSpec
from optlayout.topology.schema import (
    SWITCH_TIERS,
    EdgeSpec,
    ExplicitDoc,
    FabricSpec,
    GeneratorDoc,
    ScaleUpSpec,
    ServerGraphSpec,
    ServerPart,
)

if TYPE_CHECKING:  # loaded by `GraphBuilder.graph`, where a graph is made
    import networkx as nx

US = 1e-6
DEFAULT_PCIE_GBYTES_PER_S = 25.0  # PCIe Gen4 x16, ~25 GB/s per direction in practice (31.5 raw)
SERVER_KINDS = frozenset({"gpu", "nvswitch", "pcie_switch", "cpu", "nic"})


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of small dicts are made (it rescans them all)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class GraphBuilder:
    """Nodes and symmetric adjacency as dicts; `graph()` wraps them in a networkx Graph."""

    node: dict[str, dict[str, Any]] = field(default_factory=dict)
    adj: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def add_node(self, node_id: str, kind: str, **attrs: Any) -> None:
        if node_id in self.node:
            raise InputError(f"nodes: duplicate node id {node_id!r}")
        self.node[node_id] = {"kind": kind, **{k: v for k, v in attrs.items() if v is not None}}
        self.adj[node_id] = {}

    def add_nodes(
        self, ids: Sequence[str], kind: str, servers: Sequence[str | None] | None = None, **attrs: Any
    ) -> None:
        """Bulk add of new ids, each with `kind`, its server (if any) and `attrs`."""
        servers = servers if servers is not None else [None] * len(ids)
        for node_id, server in zip(ids, servers, strict=True):
            data = {"kind": kind, **attrs}
            if server is not None:
                data["server"] = server
            self.node[node_id] = data
            self.adj[node_id] = {}

    def add_edge(self, u: str, v: str, bandwidth_Bps: float, latency_s: float) -> None:
        data = {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s}
        self.adj[u][v] = data
        self.adj[v][u] = data

    def add_edges(self, us: Sequence[str], vs: Sequence[str], bandwidth_Bps: float, latency_s: float) -> None:
        adj = self.adj
        for u, v in zip(us, vs, strict=True):
            data = {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s}
            adj[u][v] = data
            adj[v][u] = data

    def kind(self, node_id: str) -> str:
        return str(self.node[node_id]["kind"])

    def graph(self) -> nx.Graph[str]:
        """The networkx Graph over the built dicts, handed over without copying (see the comment inside)."""
        import networkx as nx

        graph: nx.Graph[str] = nx.Graph()
        # The one private use of networkx: its Graph keeps exactly these dicts (node -> attributes, node ->
        # neighbour -> shared edge data), so they are installed as they are. The public `add_nodes_from` +
        # `add_edges_from` copy every attribute dict: on 16,384 GPUs (35,336 nodes, 53,248 edges) 0.37-0.77 s
        # against 0.003-0.008 s, 100x slower, on the path every command takes; 131,072 GPUs would take seconds.
        graph._node.update(self.node)  # type: ignore[attr-defined]  # networkx keeps _node undeclared in its stubs
        graph._adj.update(self.adj)  # type: ignore[attr-defined]  # as _node
        return graph


@dataclass
class ServerBlock:
    """What `add_servers` made: per server, its GPU and NIC node ids in local order."""

    gpus: list[list[str]]
    nics: list[list[str]]


def default_latency_s(kind_a: str, kind_b: str) -> float:
    """Latency of one hop when a file gives none (documented in topologies/README.md)."""
    pair = {kind_a, kind_b}
    if pair in ({"gpu"}, {"cpu"}, {"gpu", "nic"}):
        return 1.0 * US  # GPU-GPU link, socket link, GPU to NIC
    return 0.5 * US  # one switch hop: NVSwitch, PCIe switch, network switch


# ---------------------------------------------------------------------------------------------- servers


def add_servers(b: GraphBuilder, names: Sequence[str], part: ServerPart, gpu: GpuSpec) -> ServerBlock:
    """Add identical servers named `names` (GPUs `name/gpu{j}`, NICs `name/nic{i}`) with their scale-up."""
    if part.server is not None:
        return _add_custom_servers(b, names, part.server, part.nics.gbps)
    gps = int(part.gpus_per_server or 0)
    gpus = [[f"{name}/gpu{j}" for j in range(gps)] for name in names]
    flat = [g for ids in gpus for g in ids]
    b.add_nodes(flat, "gpu", [name for name in names for _ in range(gps)])
    kind = (part.scale_up or ScaleUpSpec()).kind
    switches = None
    if kind == "pcie":
        switches = _add_pcie(b, names, gpus, part, gps)
    elif kind != "none":  # none: no links between a server's GPUs (an external NVSwitch may join them)
        _add_nvlink(b, names, flat, part, gpu, gps)
    nics = _add_nics(b, names, gpus, switches, part, gps)
    return ServerBlock(gpus, nics)


def _domain_size(part: ServerPart, gps: int, allow_multi_server: bool = True) -> int:
    size = (part.scale_up.domain_size if part.scale_up else None) or gps
    if size <= gps and gps % size:
        raise InputError(f"scale_up.domain_size: {size} must divide gpus_per_server ({gps})")
    if size > gps and (size % gps or not allow_multi_server):
        why = "be a multiple of" if allow_multi_server else "not exceed (inside a server template)"
        raise InputError(f"scale_up.domain_size: {size} must {why} gpus_per_server ({gps})")
    return size


def _add_nvlink(
    b: GraphBuilder, names: Sequence[str], flat: list[str], part: ServerPart, gpu: GpuSpec, gps: int
) -> None:
    """NVSwitch domains (one aggregated switch node per domain) or direct GPU-GPU mesh links."""
    su = part.scale_up or ScaleUpSpec()
    size = _domain_size(part, gps, allow_multi_server=su.kind == "nvswitch")
    per_gpu = su.gbytes_per_s * 1e9 if su.gbytes_per_s else gpu.scale_up_bandwidth_Bps
    if per_gpu <= 0:
        raise InputError(f"scale_up.gbytes_per_s: gpu {gpu.name!r} has no scale-up bandwidth; give one")
    domains = ceil(len(flat) / size)
    if su.kind == "mesh":
        link = su.link_gbytes_per_s * 1e9 if su.link_gbytes_per_s else per_gpu / max(1, size - 1)
        latency = (1.0 if su.latency_us is None else su.latency_us) * US
        for d in range(domains):
            members = flat[d * size : (d + 1) * size]
            for i, u in enumerate(members):
                for v in members[i + 1 :]:
                    b.add_edge(u, v, link, latency)
        return
    latency = (0.5 if su.latency_us is None else su.latency_us) * US
    if size <= gps:
        per_server = gps // size
        switch_ids = [
            f"{name}/nvswitch" if per_server == 1 else f"{name}/nvswitch{m}"
            for name in names
            for m in range(per_server)
        ]
        b.add_nodes(switch_ids, "nvswitch", [name for name in names for _ in range(per_server)])
    else:
        switch_ids = [f"nvl{d}/nvswitch" for d in range(domains)]
        b.add_nodes(switch_ids, "nvswitch")
    b.add_edges(flat, [switch_ids[i // size] for i in range(len(flat))], per_gpu, latency)


def _add_pcie(
    b: GraphBuilder, names: Sequence[str], gpus: list[list[str]], part: ServerPart, gps: int
) -> list[list[str]]:
    """GPUs under PCIe switches under CPU sockets joined by a socket link; returns switch ids per server."""
    su = part.scale_up
    assert su is not None
    if su.domain_size not in (None, gps):
        raise InputError(f"scale_up.domain_size: a pcie server is one domain of {gps} GPUs (got {su.domain_size})")
    link = (su.gbytes_per_s or DEFAULT_PCIE_GBYTES_PER_S) * 1e9
    uplink = su.uplink_gbytes_per_s * 1e9 if su.uplink_gbytes_per_s else link
    latency = (0.5 if su.latency_us is None else su.latency_us) * US
    n_sw = su.sockets * su.switches_per_socket
    out = []
    for name, gpu_ids in zip(names, gpus, strict=True):
        cpus = [f"{name}/cpu{c}" for c in range(su.sockets)]
        switches = [f"{name}/pcie{s}" for s in range(n_sw)]
        b.add_nodes(cpus, "cpu", [name] * len(cpus))
        b.add_nodes(switches, "pcie_switch", [name] * n_sw)
        b.add_edges(switches, [cpus[s // su.switches_per_socket] for s in range(n_sw)], uplink, latency)
        b.add_edges(gpu_ids, [switches[j * n_sw // gps] for j in range(gps)], link, latency)
        for c, u in enumerate(cpus):
            for v in cpus[c + 1 :]:
                b.add_edge(u, v, su.socket_gbytes_per_s * 1e9, 1.0 * US)
        out.append(switches)
    return out


def _add_nics(
    b: GraphBuilder,
    names: Sequence[str],
    gpus: list[list[str]],
    switches: list[list[str]] | None,
    part: ServerPart,
    gps: int,
) -> list[list[str]]:
    """NICs: attached to their GPU(s) on NVLink servers, to the PCIe switches on pcie servers."""
    spec = part.nics
    count = gps if spec.per_server is None else spec.per_server
    if count and switches is None and count % gps and gps % count:
        raise InputError(f"nics.per_server: {count} must divide or be a multiple of gpus_per_server ({gps})")
    port = spec.gbps * 1e9 / 8
    path = spec.pcie_gbytes_per_s * 1e9 if spec.pcie_gbytes_per_s else port
    latency = spec.latency_us * US
    nics = [[f"{name}/nic{i}" for i in range(count)] for name in names]
    flat = [nic for ids in nics for nic in ids]
    b.add_nodes(flat, "nic", [name for name in names for _ in range(count)], bandwidth_Bps=port)
    if switches is not None:
        n_sw = len(switches[0]) if switches else 1
        ends = [sws[i * n_sw // count] for sws in switches for i in range(count)]
        b.add_edges(flat, ends, path, latency)
    elif count >= gps:
        b.add_edges(flat, [g[i * gps // count] for g in gpus for i in range(count)], path, latency)
    elif count:
        share = gps // count
        b.add_edges([g for ids in gpus for g in ids], [n[j // share] for n in nics for j in range(gps)], path, latency)
    return nics


def _add_custom_servers(b: GraphBuilder, names: Sequence[str], spec: ServerGraphSpec, gbps: float) -> ServerBlock:
    """Stamp a custom server graph once per name, ids prefixed `name/`."""
    for i, node in enumerate(spec.nodes):
        if node.kind not in SERVER_KINDS:
            raise InputError(f"server.nodes[{i}].kind: {node.kind!r} is not allowed inside a server")
    local = {n.id: n for n in spec.nodes}
    edges = [(e, _checked_edge(e, i, local)) for i, e in enumerate(spec.edges)]
    gpus, nics = [], []
    for name in names:
        for node in spec.nodes:
            port = (node.gbps or gbps) * 1e9 / 8 if node.kind == "nic" else None
            b.add_node(f"{name}/{node.id}", node.kind, server=name, bandwidth_Bps=port)
        for edge, bandwidth in edges:
            latency = edge.latency()
            if latency is None:
                latency = default_latency_s(local[edge.a].kind, local[edge.b].kind)
            b.add_edge(f"{name}/{edge.a}", f"{name}/{edge.b}", bandwidth, latency)
        gpus.append([f"{name}/{n.id}" for n in spec.nodes if n.kind == "gpu"])
        nics.append([f"{name}/{n.id}" for n in spec.nodes if n.kind == "nic"])
    return ServerBlock(gpus, nics)


def _checked_edge(edge: EdgeSpec, i: int, known: dict[str, Any], where: str = "server.edges") -> float:
    for end in ("a", "b"):
        if getattr(edge, end) not in known:
            raise InputError(f"{where}[{i}].{end}: unknown node {getattr(edge, end)!r}")
    if edge.a == edge.b:
        raise InputError(f"{where}[{i}]: an edge joins two different nodes (got {edge.a!r} twice)")
    bandwidth = edge.bandwidth()
    if bandwidth is None:
        raise InputError(f"{where}[{i}]: bandwidth missing (give gbps, gbytes_per_s or bandwidth_Bps)")
    return bandwidth


# ---------------------------------------------------------------------------------------------- fabric


def servers_per_leaf(spec: FabricSpec, rails: int) -> int:
    """Servers under one leaf (rail: 32, one DGX SU; fat-tree: as many as fill 32 ports)."""
    return spec.servers_per_leaf or (32 if spec.kind == "rail" else max(1, 32 // max(rails, 1)))


def add_fabric(b: GraphBuilder, nics: list[list[str]], spec: FabricSpec) -> None:
    """Leaves (per rail and pod, or per pod) and, with more than one pod, aggregated spine nodes."""
    rails = max((len(n) for n in nics), default=0)
    if rails == 0:
        return
    rail = spec.kind == "rail"
    per_leaf = servers_per_leaf(spec, rails)
    pods = ceil(len(nics) / per_leaf)
    down: dict[str, float] = {}
    latency = spec.leaf_latency_us * US
    node, adj = b.node, b.adj
    for k, nic_ids in enumerate(nics):
        if k % per_leaf == 0:
            pod = k // per_leaf
            leaves = [f"leaf{pod}-rail{i}" for i in range(rails)] if rail else [f"leaf{pod}"] * rails
            b.add_nodes(list(dict.fromkeys(leaves)), "leaf")
            down.update(dict.fromkeys(leaves, 0.0))
        for nic, leaf in zip(nic_ids, leaves, strict=False):
            port = node[nic]["bandwidth_Bps"]
            data = {"bandwidth_Bps": port, "latency_s": latency}
            adj[nic][leaf] = data
            adj[leaf][nic] = data
            down[leaf] += port
    if pods <= 1:
        return
    spines = [f"spine{j}" for j in range(spec.spine_switches or rails)]
    b.add_nodes(spines, "spine")
    for leaf, capacity in down.items():
        up = capacity / spec.oversubscription / len(spines)
        for spine in spines:
            b.add_edge(leaf, spine, up, spec.spine_latency_us * US)


# ---------------------------------------------------------------------------------------------- size


def server_elements(part: ServerPart) -> tuple[int, int]:
    """(nodes + edges, NICs) one server adds: an upper bound, known before anything is built."""
    if part.server is not None:
        nics = sum(n.kind == "nic" for n in part.server.nodes)
        return len(part.server.nodes) + len(part.server.edges), nics
    gps = part.gpu_count
    su = part.scale_up or ScaleUpSpec()
    nics = gps if part.nics.per_server is None else part.nics.per_server
    scale = 2 * gps  # NVSwitch: at most a switch per GPU, one link each
    if su.kind == "pcie":
        switches = su.sockets * su.switches_per_socket
        scale = su.sockets + 2 * switches + gps + su.sockets**2
    elif su.kind == "mesh":
        scale = gps * (min(su.domain_size or gps, gps) - 1) // 2
    return gps + nics + max(gps, nics) + scale, nics


def check_graph_size(servers: int, part: ServerPart | None, fabric: FabricSpec | None, listed: int = 0) -> None:
    """Refuse, before building, a topology whose graph would pass `MAX_GRAPH_ELEMENTS` nodes and edges."""
    per_server, nics = server_elements(part) if part is not None and servers else (0, 0)
    total = servers * per_server + listed
    if fabric is not None and nics:
        pods = ceil(servers / servers_per_leaf(fabric, nics))
        leaves = pods * (nics if fabric.kind == "rail" else 1)
        spines = (fabric.spine_switches or nics) if pods > 1 else 0
        total += servers * nics + leaves + spines + leaves * spines
    if total > MAX_GRAPH_ELEMENTS:
        raise InputError(
            f"size: the graph would hold about {total:,} nodes and links, over {MAX_GRAPH_ELEMENTS:,} "
            "(fewer servers, GPUs, NICs or switches)"
        )


# ---------------------------------------------------------------------------------------------- documents


def build_generator(doc: GeneratorDoc, gpu: GpuSpec) -> GraphBuilder:
    """The generator form: `servers` copies of the server, then the fabric."""
    check_graph_size(doc.servers, doc, doc.fabric)
    b = GraphBuilder()
    names = [f"s{k}" for k in range(doc.servers)]
    block = add_servers(b, names, doc, gpu)
    add_fabric(b, block.nics, doc.fabric)
    return b


def build_explicit(doc: ExplicitDoc, gpu: GpuSpec) -> GraphBuilder:
    """The explicit form: listed nodes and edges; `server` nodes expand to `server_template`."""
    servers = [n.id for n in doc.nodes if n.kind == "server"]
    template = doc.server_template
    widest = max(template.gpu_count, server_elements(template)[1]) if template is not None else 1
    check_graph_size(len(servers), template, None, len(doc.nodes) + len(doc.edges) * widest)
    if servers and template is not None and len(servers) * template.gpu_count > MAX_GPUS:
        raise InputError(f"nodes: {len(servers)} servers x {template.gpu_count} GPUs, over {MAX_GPUS:,} GPUs")
    b = GraphBuilder()
    if servers and template is None:
        raise InputError(f"server_template: required for nodes of kind 'server' (e.g. {servers[0]!r})")
    block = add_servers(b, servers, template, gpu) if servers and template is not None else ServerBlock([], [])
    expanded = dict(zip(servers, zip(block.gpus, block.nics, strict=True), strict=True))
    for i, node in enumerate(doc.nodes):
        if node.kind == "server":
            continue
        if node.kind == "gpu" and not node.server:
            raise InputError(f"nodes[{i}].server: required for gpu nodes (got none for {node.id!r})")
        if node.id in b.node or node.id in expanded:
            raise InputError(f"nodes[{i}].id: duplicate node id {node.id!r}")
        tier = node.tier or SWITCH_TIERS.get(node.kind)
        port = (node.gbps or 400.0) * 1e9 / 8 if node.kind == "nic" else None
        b.add_node(node.id, node.kind, server=node.server, tier=tier, bandwidth_Bps=port)
    for i, edge in enumerate(doc.edges):
        _add_explicit_edge(b, i, edge, expanded, gpu)
    return b


def _add_explicit_edge(
    b: GraphBuilder, i: int, edge: EdgeSpec, servers: dict[str, tuple[list[str], list[str]]], gpu: GpuSpec
) -> None:
    for end in ("a", "b"):
        if getattr(edge, end) not in b.node and getattr(edge, end) not in servers:
            raise InputError(f"edges[{i}].{end}: unknown node {getattr(edge, end)!r}")
    if edge.a == edge.b:
        raise InputError(f"edges[{i}]: an edge joins two different nodes (got {edge.a!r} twice)")
    if edge.a in servers or edge.b in servers:
        _add_server_edge(b, i, edge, servers, gpu)
        return
    bandwidth = _checked_edge(edge, i, b.node, "edges")
    if edge.b in b.adj[edge.a]:
        raise InputError(f"edges[{i}]: duplicate edge {edge.a!r} - {edge.b!r}")
    latency = edge.latency()
    b.add_edge(
        edge.a, edge.b, bandwidth, default_latency_s(b.kind(edge.a), b.kind(edge.b)) if latency is None else latency
    )


def _add_server_edge(
    b: GraphBuilder, i: int, edge: EdgeSpec, servers: dict[str, tuple[list[str], list[str]]], gpu: GpuSpec
) -> None:
    """server - switch: every NIC of the server to the switch; server - nvswitch: every GPU to the NVSwitch."""
    server, other = (edge.a, edge.b) if edge.a in servers else (edge.b, edge.a)
    if other in servers:
        raise InputError(f"edges[{i}]: two servers cannot be joined directly ({server!r}, {other!r})")
    kind = b.kind(other)
    gpus, nics = servers[server]
    if kind == "nvswitch":
        ends, default = gpus, gpu.scale_up_bandwidth_Bps
    elif kind in SWITCH_TIERS:
        ends, default = nics, None
    else:
        raise InputError(f"edges[{i}].b: a server connects to a switch or an nvswitch, not a {kind!r} ({other!r})")
    if not ends:
        raise InputError(f"edges[{i}]: server {server!r} has no {'GPUs' if kind == 'nvswitch' else 'NICs'}")
    latency = edge.latency()
    for end in ends:
        bandwidth = edge.bandwidth() or default or b.node[end]["bandwidth_Bps"]
        b.add_edge(end, other, bandwidth, default_latency_s(b.kind(end), kind) if latency is None else latency)
