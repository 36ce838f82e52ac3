"""Turn what a cluster already prints into a topology file.

- `nvidia-smi topo -m`: one server's GPUs, NVLink counts (NV#), PCIe relations (PIX/PXB/PHB/NODE/SYS)
  and NICs; parsed by header tokens. Output: the generator form with a custom `server` graph.
- NCCL topology XML (`NCCL_TOPO_DUMP_FILE`): CPUs, the PCIe tree, GPUs with `<nvlink count tclass>`,
  NICs with `<net speed>` in Mb/s. Output: the generator form with a custom `server` graph.
- Slurm `topology.conf`: `topology/tree` (`SwitchName=.. Nodes=..|Switches=..`) becomes the explicit form
  with one `server` node per host; `topology/block` (`BlockName=.. Nodes=..`) makes each block one NVLink
  domain, with a leaf per block and one spine.

Figures the sources do not print are options with stated defaults, written into the file's header.
"""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from optlayout.errors import InputError
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.limits import MAX_GPUS_PER_SERVER, MAX_SERVERS, MAX_SWITCH_TIERS
from optlayout.inputs.xml_doc import int_attribute, number_attribute, parse_xml
from optlayout.presets import gpu_names, gpu_preset

Doc = list[dict[str, Any]]  # nodes or edges of a topology document
ScaleUpChoice = Literal["auto", "nvswitch", "mesh", "pcie"]
FabricChoice = Literal["rail", "fat-tree"]

SOURCES: tuple[str, ...] = ("nvidia-smi", "nccl-xml", "slurm")

# NVLink links per GPU at full width; per-link per-direction bandwidth = preset scale-up / links.
NVLINK_LINKS = {"a100-40gb": 12, "a100-80gb": 12}
DEFAULT_NVLINK_LINKS = 18  # H100, H200, B200, GB200, GB300
PCIE_EFFICIENCY = 0.8  # payload share of the raw PCIe rate (TLP headers, flow control)
# NCCL's effective CPU-to-CPU bandwidths, GB/s (src/graph/topo.h: AMD_BW, SKL_QPI_BW, SRP_QPI_BW, ERP_QPI_BW).
SOCKET_GBYTES_PER_S = {"amd": 16.0, "intel": 10.0, "intel-143": 22.0, "intel-207": 40.0}
DEFAULT_SOCKET_GBYTES_PER_S = 16.0
SM_PRESETS = {80: "a100-80gb", 90: "h100-sxm", 100: "b200"}
NVLINK_GBYTES_PER_S_BY_SM = ((100, 50.0), (70, 25.0), (60, 20.0))  # per link per direction, newest first


@dataclass
class DiscoverOptions:
    """What the sources do not say: GPU preset, server count, NIC speed, fabric."""

    gpu: str | None = None
    servers: int = 1
    gpus_per_server: int = 8
    nics_per_server: int | None = None
    nic_gbps: float | None = None
    scale_up: ScaleUpChoice = "auto"
    fabric: FabricChoice = "rail"
    servers_per_leaf: int | None = None
    oversubscription: float = 1.0
    name: str = "discovered"
    notes: list[str] = field(default_factory=list)


@checked_arguments
def discover(source: str, text: str, options: DiscoverOptions | None = None) -> dict[str, Any]:
    """A topology document (dict) from the text of `source`; `options.notes` collects assumptions."""
    opts = options or DiscoverOptions()
    if source == "nvidia-smi":
        return from_nvidia_smi(text, opts)
    if source == "nccl-xml":
        return from_nccl_xml(text, opts)
    if source == "slurm":
        return from_slurm(text, opts)
    raise InputError(f"from: unknown source {source!r}; valid: {', '.join(SOURCES)}")


def dump_topology(doc: dict[str, Any], notes: list[str]) -> str:
    """YAML text of a document, assumptions first as comments."""
    header = "".join(f"# {line}\n" for line in notes)
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


# ---------------------------------------------------------------------------------------------- shared


def _gpu_name(opts: DiscoverOptions, fallback: str | None, why: str) -> str:
    name = opts.gpu or fallback
    if name is None:
        raise InputError(f"gpu: {why}; pass --gpu PRESET")
    return gpu_preset(name).name


def _nvlink_gbytes_per_s(gpu: str) -> float:
    """One NVLink, per direction: the preset's scale-up bandwidth over the links of a full-width GPU."""
    return gpu_preset(gpu).scale_up_bandwidth_Bps / 1e9 / NVLINK_LINKS.get(gpu, DEFAULT_NVLINK_LINKS)


def _pcie_gbytes_per_s(gts: float, width: int) -> float:
    """Usable PCIe bandwidth per direction: GT/s x lanes x 128/130 / 8 x efficiency (Gen4 x16 ~ 25 GB/s)."""
    encoding = 128 / 130 if gts >= 8 else 0.8
    return round(gts * width * encoding / 8 * PCIE_EFFICIENCY, 2)


def _generator_doc(opts: DiscoverOptions, gpu: str, server: dict[str, Any], description: str) -> dict[str, Any]:
    fabric: dict[str, Any] = {"kind": opts.fabric, "oversubscription": opts.oversubscription}
    if opts.servers_per_leaf:
        fabric["servers_per_leaf"] = opts.servers_per_leaf
    return {
        "name": opts.name,
        "description": description,
        "gpu": gpu,
        "servers": opts.servers,
        "server": server,
        "fabric": fabric,
    }


class _Union:
    """Union-find over hashable items (groups in order of first item)."""

    def __init__(self, items: list[str]) -> None:
        self.parent = {x: x for x in items}
        self._order = {x: i for i, x in enumerate(items)}

    def find(self, x: str) -> str:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb, key=self._order.__getitem__)] = min(ra, rb, key=self._order.__getitem__)

    def groups(self) -> list[list[str]]:
        out: dict[str, list[str]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return list(out.values())


# ---------------------------------------------------------------------------------------------- nvidia-smi

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL = re.compile(r"^(X|NV[0-9]{1,6}|PIX|PXB|PHB|NODE|SYS|SOC|CPU)$")
MAX_SMI_DEVICES = 1024  # GPUs and NICs of one server
MAX_NVLINKS = 64  # NVLinks between two GPUs (18 on H100)


@dataclass
class SmiMatrix:
    """`nvidia-smi topo -m` read by header tokens."""

    devices: list[str]
    cells: dict[tuple[str, str], str]
    nic_names: dict[str, str]
    numa: dict[str, str] = field(default_factory=dict)  # GPU -> "NUMA Affinity" column

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if re.fullmatch(r"GPU\d+", d)]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not re.fullmatch(r"GPU\d+", d)]


def parse_nvidia_smi(text: str) -> SmiMatrix:
    """Header = first line holding GPU0; columns up to `CPU Affinity` are devices; rows start with a device."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    head = next((i for i, line in enumerate(lines) if "GPU0" in line.split()), None)
    if head is None:
        raise InputError("nvidia-smi: no header line with GPU0 (expected the output of `nvidia-smi topo -m`)")
    tokens = lines[head].split()
    devices = tokens[: tokens.index("CPU")] if "CPU" in tokens else tokens
    if len(devices) > MAX_SMI_DEVICES:
        raise InputError(f"nvidia-smi: {len(devices)} columns, over the {MAX_SMI_DEVICES} devices one server holds")
    if len(set(devices)) != len(devices):
        raise InputError("nvidia-smi: a device appears twice in the header line")
    cells: dict[tuple[str, str], str] = {}
    numa: dict[str, str] = {}
    numa_col = _affinity_column(tokens, len(devices))
    for line in lines[head + 1 :]:
        if line.strip().startswith("Legend"):
            break
        row = line.split()
        if not row or row[0] not in devices:
            continue
        if len(row) < len(devices) + 1:
            raise InputError(f"nvidia-smi: row {row[0]} has {len(row) - 1} cells for {len(devices)} columns")
        for col, cell in zip(devices, row[1 : len(devices) + 1], strict=True):
            if not _CELL.match(cell):
                raise InputError(f"nvidia-smi: unknown cell {cell[:20]!r} (row {row[0]}, column {col})")
            if cell.startswith("NV") and not 1 <= int(cell[2:]) <= MAX_NVLINKS:
                raise InputError(f"nvidia-smi: {cell[:20]} (row {row[0]}, column {col}): 1 to {MAX_NVLINKS} NVLinks")
            cells[(row[0], col)] = cell
        extra = row[len(devices) + 1 :]
        if numa_col is not None and len(extra) > numa_col and extra[numa_col].isdigit():
            numa[row[0]] = extra[numa_col]
    missing = [d for d in devices if (d, d) not in cells]
    if missing:
        raise InputError(f"nvidia-smi: no row for {', '.join(missing)}")
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", "\n".join(lines), flags=re.M))
    return SmiMatrix(devices, cells, legend, numa)


def _affinity_column(header: list[str], devices: int) -> int | None:
    """Index of `NUMA Affinity` among a row's values after the cells (`CPU Affinity` comes first)."""
    names = " ".join(header[devices:])
    columns = [c for c in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if c in names]
    return columns.index("NUMA Affinity") if "NUMA Affinity" in columns else None


def from_nvidia_smi(text: str, opts: DiscoverOptions) -> dict[str, Any]:
    """One server from `nvidia-smi topo -m`, stamped `opts.servers` times on a rail or fat-tree fabric."""
    smi = parse_nvidia_smi(text)
    gpus = smi.gpus
    if not gpus:
        raise InputError("nvidia-smi: the matrix lists no GPUs")
    gpu = _gpu_name(opts, None, "nvidia-smi topo -m does not name the GPU model")
    nodes: list[dict[str, Any]] = [{"id": g.lower(), "kind": "gpu"} for g in gpus]
    edges: list[dict[str, Any]] = []
    kind = _smi_scale_up(smi, gpu, opts, nodes, edges)
    _smi_pcie(smi, gpu, nodes, edges)
    gbps = opts.nic_gbps or 400.0
    if opts.nic_gbps is None and smi.nics:
        opts.notes.append("NIC speed is not in nvidia-smi output: assumed 400 Gb/s per NIC (--nic-gbps)")
    for node in nodes:
        if node["kind"] == "nic":
            node["gbps"] = gbps
    opts.notes.append(f"{len(gpus)} GPUs ({kind}), {len(smi.nics)} NICs per server; {opts.servers} server(s)")
    description = f"from nvidia-smi topo -m: {len(gpus)}x {gpu} ({kind}), {len(smi.nics)} NICs per server"
    return _generator_doc(opts, gpu, {"nodes": nodes, "edges": edges}, description)


def _smi_scale_up(smi: SmiMatrix, gpu: str, opts: DiscoverOptions, nodes: Doc, edges: Doc) -> str:
    """NVSwitch when every pair shows the same NV# and a GPU lacks the links for that many direct ones."""
    gpus = smi.gpus
    counts = {
        (a, b): int(smi.cells[(a, b)][2:])
        for a, b in itertools.combinations(gpus, 2)
        if smi.cells[(a, b)].startswith("NV")
    }
    if not counts or opts.scale_up == "pcie":
        return "pcie"
    link = _nvlink_gbytes_per_s(gpu)
    full = NVLINK_LINKS.get(gpu, DEFAULT_NVLINK_LINKS)
    values = set(counts.values())
    all_pairs = len(counts) == len(gpus) * (len(gpus) - 1) // 2
    switched = all_pairs and len(values) == 1 and values.pop() * (len(gpus) - 1) > full
    if opts.scale_up == "nvswitch" or (opts.scale_up == "auto" and switched):
        per_gpu = max(counts.values()) * link
        nodes.append({"id": "nvswitch", "kind": "nvswitch"})
        edges.extend({"a": g.lower(), "b": "nvswitch", "gbytes_per_s": per_gpu} for g in gpus)
        return "nvswitch"
    edges.extend({"a": a.lower(), "b": b.lower(), "gbytes_per_s": n * link} for (a, b), n in counts.items())
    return "mesh"


def _smi_pcie(smi: SmiMatrix, gpu: str, nodes: Doc, edges: Doc) -> None:
    """PCIe switches = devices joined by PIX/PXB; sockets = devices joined by anything but SYS."""
    devices = smi.devices
    pcie = _pcie_gbytes_per_s(16.0 if gpu.startswith("a100") else 32.0, 16)
    switch_sets, sockets = _Union(devices), _Union(devices)
    for (a, b), cell in smi.cells.items():
        if a != b and cell in ("PIX", "PXB"):
            switch_sets.union(a, b)
        if a != b and cell in ("PIX", "PXB", "PHB", "NODE"):
            sockets.union(a, b)
    by_numa: dict[str, str] = {}
    for g, numa in smi.numa.items():
        sockets.union(by_numa.setdefault(numa, g), g)
    socket_of = {d: f"cpu{i}" for i, group in enumerate(sockets.groups()) for d in group}
    cpus = sorted(set(socket_of.values()), key=lambda c: int(c[3:]))
    nodes.extend({"id": c, "kind": "cpu"} for c in cpus)
    for i, c in enumerate(cpus):
        edges.extend({"a": c, "b": o, "gbytes_per_s": DEFAULT_SOCKET_GBYTES_PER_S} for o in cpus[i + 1 :])
    for nic in smi.nics:
        nodes.append({"id": smi.nic_names.get(nic, nic).lower(), "kind": "nic"})
    ids = {d: (d.lower() if d in smi.gpus else smi.nic_names.get(d, d).lower()) for d in devices}
    for i, group in enumerate(g for g in switch_sets.groups() if len(g) > 1):
        switch = f"pcie{i}"
        nodes.append({"id": switch, "kind": "pcie_switch"})
        edges.append({"a": switch, "b": socket_of[group[0]], "gbytes_per_s": pcie})
        edges.extend({"a": ids[d], "b": switch, "gbytes_per_s": pcie} for d in group)
    for group in switch_sets.groups():
        if len(group) == 1:
            edges.append({"a": ids[group[0]], "b": socket_of[group[0]], "gbytes_per_s": pcie})


# ---------------------------------------------------------------------------------------------- NCCL XML


@dataclass
class _XmlServer:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[tuple[int, str, ET.Element]] = field(default_factory=list)  # (dev, node id, <gpu>)
    busid_gpu: dict[str, str] = field(default_factory=dict)
    nic_speeds: list[float] = field(default_factory=list)
    sm: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)  # the GPUs' PCI device ids, as the file writes them


def from_nccl_xml(text: str, opts: DiscoverOptions) -> dict[str, Any]:
    """One server from an NCCL topology dump, stamped `opts.servers` times."""
    root = parse_xml(text, "nccl-xml")
    if root.tag != "system":
        raise InputError(f"nccl-xml: the root element is <{root.tag}>, expected <system>")
    server = _XmlServer()
    cpus = root.findall("cpu")
    if not cpus:
        raise InputError("nccl-xml: no <cpu> element under <system>")
    ids = [f"cpu{int_attribute(c, 'numaid', i, 'nccl-xml')}" for i, c in enumerate(cpus)]
    if len(set(ids)) != len(ids):
        raise InputError("nccl-xml: two <cpu> elements have the same numaid")
    for cpu, cpu_id in zip(cpus, ids, strict=True):
        server.nodes.append({"id": cpu_id, "kind": "cpu"})
        for child in cpu:
            _xml_child(child, cpu_id, server, opts)
    socket = _socket_gbytes_per_s(cpus[0])
    for i, a in enumerate(ids):
        server.edges.extend({"a": a, "b": b, "gbytes_per_s": socket} for b in ids[i + 1 :])
    if not server.gpus:
        raise InputError('nccl-xml: no GPU (<pci class="0x03...">) in the file')
    guess = SM_PRESETS.get(max(server.sm)) if server.sm else None
    gpu = _gpu_name(opts, guess, f"cannot tell the GPU model from sm={sorted(server.sm) or 'none'}")
    if opts.gpu is None:
        opts.notes.append(_sm_guess_note(gpu, server))
    if len(server.gpus) > MAX_GPUS_PER_SERVER:
        raise InputError(f"nccl-xml: {len(server.gpus)} GPUs, over {MAX_GPUS_PER_SERVER} in one server")
    if len({dev for dev, _, _ in server.gpus}) != len(server.gpus):
        raise InputError("nccl-xml: two GPUs have the same <gpu dev>")
    kind = _xml_nvlinks(server, gpu)
    server.gpus.sort(key=lambda g: g[0])
    order = {g: i for i, (_, g, _) in enumerate(server.gpus)}
    server.nodes.sort(key=lambda n: order.get(n["id"], len(order)))  # GPUs first
    speeds = sorted(set(server.nic_speeds))
    opts.notes.append(
        f"{len(order)} GPUs ({kind}), {len(server.nic_speeds)} NICs at {speeds} Gb/s; {opts.servers} server(s)"
    )
    description = f"from NCCL topology XML: {len(order)}x {gpu} ({kind}), {len(server.nic_speeds)} NICs per server"
    return _generator_doc(opts, gpu, {"nodes": server.nodes, "edges": server.edges}, description)


def _sm_guess_note(gpu: str, server: _XmlServer) -> str:
    """The assumption behind a GPU preset read from the SM version alone (which one architecture's parts share)."""
    arch = gpu_preset(gpu).arch
    others = [name for name in gpu_names() if name != gpu and gpu_preset(name).arch == arch]
    devices = f" (PCI device {', '.join(sorted(server.devices))})" if server.devices else ""
    also = f"; other {arch} presets ({', '.join(others)}) differ in memory and peak TFLOP/s" if others else ""
    return (f"GPU model is not in the NCCL topology file: assumed {gpu} from sm {max(server.sm)}{devices}{also}; "
            "give --gpu PRESET")  # fmt: skip


def _socket_gbytes_per_s(cpu: ET.Element) -> float:
    vendor = cpu.get("vendor", "")
    if vendor == "AuthenticAMD":
        return SOCKET_GBYTES_PER_S["amd"]
    if vendor == "GenuineIntel":
        model = int_attribute(cpu, "modelid", 0, "nccl-xml")
        return SOCKET_GBYTES_PER_S.get(f"intel-{model}", SOCKET_GBYTES_PER_S["intel"])
    return DEFAULT_SOCKET_GBYTES_PER_S


def _xml_link(pci: ET.Element) -> float:
    """A <pci> element's link to its parent, from link_speed ("16.0 GT/s PCIe") and link_width (0 = x16)."""
    match = re.match(r"\s*([0-9]{1,4}(?:\.[0-9]{1,4})?)\s*GT/s", pci.get("link_speed", ""))
    gts = float(match.group(1)) if match else 8.0  # NCCL falls back to Gen3 too
    width = int_attribute(pci, "link_width", 0, "nccl-xml") or 16
    if not 0 < gts <= 1000 or not 0 < width <= 64:
        busid = pci.get("busid", "?")[:20]
        raise InputError(f"nccl-xml: <pci busid={busid!r}>: link {gts:g} GT/s x{width} is not a PCIe link")
    return _pcie_gbytes_per_s(gts, width)


def _xml_child(elem: ET.Element, parent: str, server: _XmlServer, opts: DiscoverOptions) -> None:
    if elem.tag == "nic":
        _xml_nets(elem, parent, None, server, opts)
        return
    if elem.tag != "pci":
        return
    cls = elem.get("class", "0x060400").lower()
    busid = elem.get("busid", f"pci{len(server.nodes)}").lower()
    link = _xml_link(elem)
    if cls.startswith("0x03"):
        gpu = elem.find("gpu")
        dev = int_attribute(gpu, "dev", len(server.gpus), "nccl-xml") if gpu is not None else len(server.gpus)
        node = f"gpu{dev}"
        if gpu is not None and gpu.get("sm"):
            server.sm.add(int_attribute(gpu, "sm", 0, "nccl-xml"))
        if elem.get("device"):
            server.devices.add(_short(elem.get("device", "").strip().lower()))
        server.gpus.append((dev, node, gpu if gpu is not None else ET.Element("gpu")))
        server.busid_gpu[busid] = node
        server.nodes.append({"id": node, "kind": "gpu"})
        server.edges.append({"a": node, "b": parent, "gbytes_per_s": link})
    elif cls.startswith("0x02"):
        for nic in elem.findall("nic") or [ET.Element("nic")]:
            _xml_nets(nic, parent, link, server, opts)
    elif cls.startswith("0x0680"):
        return  # a visible NVSwitch: its links are read from the GPUs' <nvlink> elements
    else:
        node = f"pcie{sum(n['kind'] == 'pcie_switch' for n in server.nodes)}"
        server.nodes.append({"id": node, "kind": "pcie_switch"})
        server.edges.append({"a": node, "b": parent, "gbytes_per_s": link})
        for child in elem:
            _xml_child(child, node, server, opts)


def _xml_nets(nic: ET.Element, parent: str, link: float | None, server: _XmlServer, opts: DiscoverOptions) -> None:
    """Each <net> port is one NIC node; speed is in Mb/s (400000 = NDR 400 Gb/s)."""
    for net in nic.findall("net") or [ET.Element("net")]:
        speed = net.get("speed")
        gbps = opts.nic_gbps or (number_attribute(net, "speed", 0.0, "nccl-xml") / 1000 if speed else 400.0)
        if not gbps > 0:
            raise InputError(f"nccl-xml: <net speed={speed!r}>: a NIC speed is a positive number of Mb/s")
        if speed is None and opts.nic_gbps is None:
            opts.notes.append("a NIC without <net speed>: assumed 400 Gb/s (--nic-gbps)")
        node = f"nic{len(server.nic_speeds)}"
        server.nic_speeds.append(gbps)
        server.nodes.append({"id": node, "kind": "nic", "gbps": gbps})
        server.edges.append({"a": node, "b": parent, "gbytes_per_s": link or gbps / 8})


def _xml_nvlinks(server: _XmlServer, gpu: str) -> str:
    """<nvlink tclass=0x068000> = to an NVSwitch (one aggregated node); to a GPU busid = a direct link."""
    sm = max(server.sm) if server.sm else 0
    per_link = next((bw for min_sm, bw in NVLINK_GBYTES_PER_S_BY_SM if sm >= min_sm), None) or _nvlink_gbytes_per_s(gpu)
    switched = False
    direct: dict[tuple[Any, ...], int] = {}
    for _, node, elem in server.gpus:
        links = 0
        for nv in elem.findall("nvlink"):
            count = int_attribute(nv, "count", 1, "nccl-xml")
            if not 1 <= count <= MAX_NVLINKS:
                raise InputError(f"nccl-xml: <nvlink count={count}> of {node}: 1 to {MAX_NVLINKS} links")
            target = server.busid_gpu.get(nv.get("target", "").lower())
            if nv.get("tclass", "").lower() == "0x068000":
                links += count
            elif target is not None and target != node:
                key = tuple(sorted((node, target)))
                direct[key] = max(direct.get(key, 0), count)
        if links:
            switched = True
            server.edges.append({"a": node, "b": "nvswitch", "gbytes_per_s": links * per_link})
    if switched:
        server.nodes.append({"id": "nvswitch", "kind": "nvswitch"})
    server.edges.extend({"a": a, "b": b, "gbytes_per_s": n * per_link} for (a, b), n in sorted(direct.items()))
    return "nvswitch" if switched else "mesh" if direct else "pcie"


# ---------------------------------------------------------------------------------------------- Slurm

_RANGE = re.compile(r"^([0-9]{1,18})(?:-([0-9]{1,18}))?$")


def expand_hostlist(expr: str, limit: int = MAX_SERVERS) -> list[str]:
    """Slurm hostlist: `tux[0-3,12,18-20]`, `dev[00-05]` (zero padded), `a[1-2]-b[1-2]`, `x,y`; more than
    `limit` names is refused before any is made."""
    out: list[str] = []
    for item in _split_top(expr.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        if any(("[" in p) != (p.startswith("[") and p.endswith("]")) or "]" in p.strip("[]") for p in parts):
            raise InputError(f"slurm: bad hostlist {_short(expr)!r}")
        ranges = [_bracket_ranges(p, expr) if p.startswith("[") else None for p in parts]
        count = math.prod(sum(hi - lo + 1 for lo, hi, _ in r) if r is not None else 1 for r in ranges)
        if len(out) + count > limit:
            raise InputError(f"slurm: hostlist {_short(expr)!r} names more than {limit:,} hosts")
        choices = [_expand(r) if r is not None else [p] for p, r in zip(parts, ranges, strict=True)]
        out.extend("".join(c) for c in itertools.product(*choices))
    return out


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _split_top(expr: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise InputError(f"slurm: bad hostlist {expr!r} (unbalanced brackets)")
    return [i for i in [*items, cur] if i]


def _bracket_ranges(group: str, expr: str) -> list[tuple[int, int, int]]:
    """`[00-05,7]` -> [(0, 5, 2), (7, 7, 0)]: (first, last, zero-padded width)."""
    out = []
    for part in group[1:-1].split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise InputError(f"slurm: bad range {_short(part)!r} in hostlist {_short(expr)!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise InputError(f"slurm: range {part!r} runs backwards in hostlist {_short(expr)!r}")
        out.append((int(lo), int(hi), len(lo) if lo.startswith("0") else 0))
    return out


def _expand(ranges: list[tuple[int, int, int]]) -> list[str]:
    return [str(i).zfill(width) for lo, hi, width in ranges for i in range(lo, hi + 1)]


def parse_slurm(text: str) -> list[dict[str, str]]:
    """`topology.conf` lines as dicts of key=value (keys lower-cased), comments and continuations handled."""
    joined = re.sub(r"\\\n", " ", text)
    records = []
    for n, line in enumerate(joined.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        record = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep:
                raise InputError(f"slurm: line {n}: expected Key=Value, got {_short(token)!r}")
            if key.lower() in record:
                raise InputError(f"slurm: line {n}: {_short(key)} given twice")
            record[key.lower()] = value
        records.append(record)
    return records


def from_slurm(text: str, opts: DiscoverOptions) -> dict[str, Any]:
    """Explicit form: `server` nodes per host (from the template options) and the switches or blocks."""
    records = parse_slurm(text)
    kinds = {k for r in records for k in ("switchname", "blockname", "ringname") if k in r}
    if "ringname" in kinds:
        raise InputError("slurm: topology/ring is not supported (use topology/tree or topology/block)")
    if kinds == {"switchname", "blockname"}:
        raise InputError("slurm: the file mixes SwitchName= (tree) and BlockName= (block) lines")
    if not kinds:
        raise InputError("slurm: no SwitchName= or BlockName= line")
    gpu = _gpu_name(opts, None, "topology.conf does not name the GPU model")
    if "blockname" in kinds:
        return _slurm_block(records, opts, gpu)
    return _slurm_tree(records, opts, gpu)


def _template(opts: DiscoverOptions, scale_up: bool) -> dict[str, Any]:
    nics = {"per_server": opts.nics_per_server or opts.gpus_per_server, "gbps": opts.nic_gbps or 400.0}
    if opts.nic_gbps is None:
        opts.notes.append("NIC speed is not in topology.conf: assumed 400 Gb/s per NIC (--nic-gbps)")
    kind = ("nvswitch" if opts.scale_up == "auto" else opts.scale_up) if scale_up else "none"
    template: dict[str, Any] = {"gpus_per_server": opts.gpus_per_server, "scale_up": {"kind": kind}, "nics": nics}
    opts.notes.append(
        f"every host: {opts.gpus_per_server} GPUs, {nics['per_server']} NICs at {nics['gbps']} Gb/s "
        "(--gpus-per-server, --nics-per-server)"
    )
    return template


def _slurm_tree(records: list[dict[str, str]], opts: DiscoverOptions, gpu: str) -> dict[str, Any]:
    switches = _named(records, "switchname")
    children = _expanded(switches, "switches")
    hosts = _expanded(switches, "nodes")
    for s, kids in children.items():
        for kid in kids:
            if kid not in switches:
                raise InputError(f"slurm: switch {_short(kid)!r} (in Switches= of {_short(s)!r}) is not defined")
    tiers = _tiers(children)
    parents: dict[str, list[str]] = {s: [] for s in switches}
    for s in switches:
        for kid in dict.fromkeys(children[s]):
            parents[kid].append(s)
    roots = [s for s, p in parents.items() if not p]
    if len(roots) > 1:
        raise InputError(f"slurm: the tree has several roots ({', '.join(roots)}): their hosts cannot reach each other")
    template = _template(opts, scale_up=True)
    servers = list(dict.fromkeys(h for s in switches for h in hosts[s]))
    if not servers:
        raise InputError("slurm: no Nodes= in any SwitchName= line")
    port = template["nics"]["per_server"] * template["nics"]["gbps"]
    up = _uplinks(switches, children, hosts, parents, port, tiers, opts.oversubscription)
    nodes: list[dict[str, Any]] = [{"id": h, "kind": "server"} for h in servers]
    nodes += [{"id": s, "kind": _tier_kind(t), **({"tier": t} if t > 3 else {})} for s, t in tiers.items()]
    edges: list[dict[str, Any]] = [{"a": h, "b": s} for s in switches for h in hosts[s]]
    for s in switches:
        for parent in parents[s]:
            edges.append({"a": s, "b": parent, "gbps": round(up[s], 3)})
    opts.notes.append(
        f"Slurm topology/tree: {len(servers)} hosts, {len(switches)} switches, uplinks at "
        f"{opts.oversubscription}:1 (--oversubscription)"
    )
    return {
        "name": opts.name,
        "description": f"from Slurm topology/tree: {len(servers)} hosts x {opts.gpus_per_server} {gpu}",
        "gpu": gpu,
        "server_template": template,
        "nodes": nodes,
        "edges": edges,
    }


def _named(records: list[dict[str, str]], key: str) -> dict[str, dict[str, str]]:
    """The records that have `key` (SwitchName, BlockName), by name; a name defined twice is refused."""
    out: dict[str, dict[str, str]] = {}
    for r in records:
        if key in r:
            if r[key] in out:
                raise InputError(f"slurm: {_short(r[key])!r} is defined twice")
            out[r[key]] = r
    return out


def _expanded(records: dict[str, dict[str, str]], key: str) -> dict[str, list[str]]:
    """Each record's hostlist `key`, expanded; all of them together name at most MAX_SERVERS."""
    budget, out = MAX_SERVERS, {}
    for name, record in records.items():
        out[name] = expand_hostlist(record[key], budget) if record.get(key) else []
        budget -= len(out[name])
    return out


def _tiers(children: dict[str, list[str]]) -> dict[str, int]:
    """Tier of every switch, 1 + the highest tier below it (walked without recursion); a cycle, or a tree of more
    than MAX_SWITCH_TIERS tiers, is refused."""
    tier: dict[str, int] = {}
    for root in children:
        if root in tier:
            continue
        path, stack = {root}, [(root, iter(children[root]))]
        while stack:
            node, pending = stack[-1]
            kid = next(pending, None)
            if kid is None:
                stack.pop()
                path.discard(node)
                tier[node] = 1 + max((tier[k] for k in children[node]), default=0)
                if tier[node] > MAX_SWITCH_TIERS:
                    raise InputError(f"slurm: the switch tree is deeper than {MAX_SWITCH_TIERS} tiers")
            elif kid in path:
                raise InputError(f"slurm: switch {_short(kid)!r} is its own ancestor (a cycle in Switches=)")
            elif kid not in tier:
                path.add(kid)
                stack.append((kid, iter(children[kid])))
    return {s: tier[s] for s in children}


def _tier_kind(tier: int) -> str:
    return {1: "leaf", 2: "spine"}.get(tier, "core")


def _uplinks(
    switches: dict[str, Any],
    children: dict[str, list[str]],
    hosts: dict[str, list[str]],
    parents: dict[str, list[str]],
    port_gbps: float,
    tiers: dict[str, int],
    ratio: float,
) -> dict[str, float]:
    """Gb/s from each switch to each parent: (hosts' NICs + child uplinks) / oversubscription / parents."""
    up: dict[str, float] = {}
    for s in sorted(switches, key=lambda x: tiers[x]):
        down = len(hosts[s]) * port_gbps + sum(up[k] for k in children[s])
        up[s] = down / ratio / max(1, len(parents[s]))
    return up


def _slurm_block(records: list[dict[str, str]], opts: DiscoverOptions, gpu: str) -> dict[str, Any]:
    blocks = _expanded(_named(records, "blockname"), "nodes")
    empty = [b for b, hosts in blocks.items() if not hosts]
    if empty:
        raise InputError(f"slurm: block {empty[0]!r} has no Nodes=")
    template = _template(opts, scale_up=False)
    port = template["nics"]["per_server"] * template["nics"]["gbps"]
    nodes: list[dict[str, Any]] = [{"id": "spine0", "kind": "spine"}]
    edges: list[dict[str, Any]] = []
    for b, hosts in blocks.items():
        nodes += [{"id": f"{b}/nvswitch", "kind": "nvswitch"}, {"id": f"{b}/leaf", "kind": "leaf"}]
        nodes += [{"id": h, "kind": "server"} for h in hosts]
        edges += [{"a": h, "b": f"{b}/nvswitch"} for h in hosts] + [{"a": h, "b": f"{b}/leaf"} for h in hosts]
        edges.append({"a": f"{b}/leaf", "b": "spine0", "gbps": round(len(hosts) * port / opts.oversubscription, 3)})
    sizes = [len(h) * opts.gpus_per_server for h in blocks.values()]
    opts.notes.append(
        f"Slurm topology/block: {len(blocks)} blocks = NVLink domains of {sorted(set(sizes))} GPUs; a leaf per block "
        f"and one spine at {opts.oversubscription}:1 (assumed: topology.conf does not describe the network)"
    )
    return {
        "name": opts.name,
        "description": f"from Slurm topology/block: {len(blocks)} NVLink domains of {gpu}",
        "gpu": gpu,
        "server_template": template,
        "nodes": nodes,
        "edges": edges,
    }
