"""The link tables of a regular generator-form cluster, read off its server and fabric template.

A generator document (the `--cluster` shorthand, or a file with `servers:`) whose servers are NVSwitch
servers with NICs stamped from the template is the same at every server: each GPU has one link to its
domain's NVSwitch and the same NICs, every leaf of a pod has the same ports. Its `Tables` follow from the
template in closed form, without building and scanning a graph of 131,072 GPUs and their NICs and switches
(seconds). Every value is computed with the same floating-point operations, in the same order, as
`analysis.analyse` on the graph `build.build_generator` makes, so the tables are identical (a test compares
them on several shapes). Anything else (custom servers, PCIe trees, meshes, no NICs, a template the builder
refuses) returns None and goes through the graph, which also gives its error messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import ceil
from typing import overload

import numpy as np

from optlayout.specs import GpuSpec
from optlayout.topology.analysis import Tables
from optlayout.topology.build import US, servers_per_leaf
from optlayout.topology.schema import GeneratorDoc, ScaleUpSpec


class ServerMajorNames(Sequence[str]):
    """The GPU node ids of a generated cluster in rank order (`s{k}/gpu{j}`), made on demand."""

    def __init__(self, servers: int, gpus_per_server: int) -> None:
        self._servers, self._gps = servers, gpus_per_server

    def __len__(self) -> int:
        return self._servers * self._gps

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return f"s{index // self._gps}/gpu{index % self._gps}"


def _repeated_sum(value: float, times: int) -> float:
    """0.0 + value + value + ... (`times` terms, left to right), as the graph scan accumulates links."""
    total = 0.0
    for _ in range(times):
        total += value
    return total


def regular_tables(doc: GeneratorDoc, gpu: GpuSpec) -> Tables | None:
    """The `Tables` `analyse` would read from `build_generator(doc, gpu)`, or None where the template is not
    an NVSwitch server with NICs the builder accepts."""
    gps, servers = int(doc.gpus_per_server or 0), doc.servers
    su = doc.scale_up or ScaleUpSpec()
    count = gps if doc.nics.per_server is None else doc.nics.per_server
    size = su.domain_size or gps
    per_gpu = su.gbytes_per_s * 1e9 if su.gbytes_per_s else gpu.scale_up_bandwidth_Bps
    if doc.server is not None or su.kind != "nvswitch" or gps < 1 or count < 1 or per_gpu <= 0:
        return None
    if (size <= gps and gps % size) or (size > gps and size % gps) or (count % gps and gps % count):
        return None  # the builder refuses these, with its message
    n = servers * gps
    rank = np.arange(n, dtype=np.int64)
    server = rank // gps
    domain = rank // size

    # GPU -> NIC links (build._add_nics) and what each GPU owns of them (analysis._share_nics)
    port = doc.nics.gbps * 1e9 / 8
    path = doc.nics.pcie_gbytes_per_s * 1e9 if doc.nics.pcie_gbytes_per_s else port
    nics_per_gpu, pickers = (count // gps, 1) if count >= gps else (1, gps // count)
    owned = _repeated_sum(min(port, path) / pickers, nics_per_gpu)

    # leaves and spines (build.add_fabric; analysis._switch_info)
    fabric = doc.fabric
    rail = fabric.kind == "rail"
    per_leaf = servers_per_leaf(fabric, count)
    pods = ceil(servers / per_leaf)
    spines = (fabric.spine_switches or count) if pods > 1 else 0
    leaf_lat_s, spine_lat_s = fabric.leaf_latency_us * US, fabric.spine_latency_us * US
    leaves_per_pod = count if rail else 1

    def leaf(in_pod: int) -> tuple[float, float]:
        """(oversubscription, uplink capacity) of a leaf of a pod of `in_pod` servers."""
        down = _repeated_sum(port, in_pod * (1 if rail else count))
        up = _repeated_sum(down / fabric.oversubscription / spines, spines) if spines else 0.0
        return (max(1.0, down / up) if up > 0 else math.inf), up

    sizes = [per_leaf] * (servers // per_leaf) + ([servers % per_leaf] if servers % per_leaf else [])
    alike = {in_pod: leaf(in_pod) for in_pod in set(sizes)}  # a full pod, and a smaller last one
    oversub_of_pod = [alike[in_pod][0] for in_pod in sizes]
    up_capacity = [alike[in_pod][1] for in_pod in sizes for _ in range(leaves_per_pod)]
    pod_of = server // per_leaf
    leaf_oversub = np.array(oversub_of_pod)[pod_of]
    lat_up0 = np.full(n, max(0.0, doc.nics.latency_us * US + leaf_lat_s))

    pod_gpus = gps * (per_leaf if pods > 1 else 1)  # one pod: every server alike
    period = math.lcm(size, pod_gpus)
    whole = servers % per_leaf == 0 or pods == 1  # no smaller last pod
    tables = Tables(
        period=period if whole and n % period == 0 else None,
        server=server,
        server_names=[f"s{k}" for k in range(servers)],
        domain=domain,
        domain_kind=["nvswitch"] * ceil(n / size),
        domain_sizes=np.bincount(domain),
        su_bw=np.full(n, 0.0 + per_gpu),
        su_lat=np.full(n, max(0.0, (0.5 if su.latency_us is None else su.latency_us) * US)),
        nic_bw=np.full(n, owned),
    )
    tables.blocks.append(pod_of)
    tables.factor.append(np.ones(n))
    tables.lat_up.append(lat_up0)
    tables.uplink_total.append(sum(up_capacity))
    if spines:  # one more tier: every leaf under every spine, one component
        tables.blocks.append(np.zeros(n, dtype=np.int64))
        tables.factor.append(leaf_oversub)
        tables.lat_up.append(lat_up0 + max(0.0, spine_lat_s))
        tables.uplink_total.append(0.0)  # the spines have no uplinks
    return tables
