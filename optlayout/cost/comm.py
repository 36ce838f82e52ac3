"""Collectives on links: the time of ring all-reduce, all-gather, reduce-scatter and point-to-point.

Bandwidth is the per-GPU, per-direction bandwidth the group gets from the topology graph (the links its
collective crosses); the ring moves (n-1)/n of the buffer per GPU per pass (Patarasuk & Yuan 2009, NCCL's
bus-bandwidth convention). Latency grows with log2(n), as NCCL's tree and NVLS algorithms do at scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from optlayout.specs import Layout


class LinkSource(Protocol):
    """What the cost model needs from a topology: bandwidth and latency of a strided rank group, and the worst
    of the point-to-point pairs (first + j, second + j), j < count (a pipeline stage boundary)."""

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_latency_s(self, size: int, stride: int) -> float: ...

    def pairs_link(self, first: int, second: int, count: int) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Link:
    """Per-GPU bandwidth (bytes/s, per direction) and latency of one rank group."""

    size: int
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True)
class GroupLinks:
    """The links of every parallel group of a layout, in Megatron's rank order tp-cp-dp-pp."""

    tp: Link
    cp: Link
    dp_cp: Link  # gradient reduction and optimizer sharding run over dp x cp
    pp: Link  # the slowest stage boundary of the steady state (worst bandwidth, worst latency): it sets the pace
    pp_fill: tuple[Link, ...] = ()  # boundaries 0|1, ..., p-2|p-1: the warm-up and cool-down cross each once


def group_links(topology: LinkSource, layout: Layout) -> GroupLinks:
    """Place the layout's groups in Megatron order (TP fastest, then CP, DP, PP) and read their links.

    Every pipeline stage boundary is read on its own: stage i holds ranks [i*s, (i+1)*s) with s = tp*cp*dp,
    and each rank sends to the rank s above it. Interleaved (vp > 1), the last stage also sends to the first
    (chunk k on stage p-1 feeds chunk k+1 on stage 0; Megatron's pipeline ranks wrap around), so that
    boundary joins the steady state's, not the fill's."""

    def link(size: int, stride: int) -> Link:
        if size <= 1:
            return Link(1, math.inf, 0.0)
        return Link(size, topology.dim_bandwidth_Bps(size, stride), topology.dim_latency_s(size, stride))

    tp, cp, dp, p = layout.tp, layout.cp, layout.dp, layout.pp
    s = tp * cp * dp
    fill = tuple(Link(2, *topology.pairs_link(i * s, (i + 1) * s, s)) for i in range(p - 1))
    steady = fill + ((Link(2, *topology.pairs_link((p - 1) * s, 0, s)),) if layout.vp > 1 else ())
    # the worst bandwidth and the worst latency of the boundaries, as the strided groups read their worst group
    pp = Link(2, min(b.bandwidth_Bps for b in steady), max(b.latency_s for b in steady)) if steady else link(1, 1)
    return GroupLinks(tp=link(tp, 1), cp=link(cp, tp), dp_cp=link(dp * cp, tp), pp=pp, pp_fill=fill)


def _latency(link: Link, passes: int) -> float:
    return passes * math.ceil(math.log2(link.size)) * link.latency_s if link.size > 1 else 0.0


def all_reduce_s(buffer_bytes: float, link: Link, efficiency: float) -> float:
    """Ring all-reduce of a buffer held whole by each of the group's GPUs."""
    if link.size <= 1 or buffer_bytes <= 0:
        return 0.0
    n = link.size
    return 2 * (n - 1) / n * buffer_bytes / (link.bandwidth_Bps * efficiency) + _latency(link, 2)


def all_gather_s(buffer_bytes: float, link: Link, efficiency: float) -> float:
    """All-gather (or reduce-scatter) whose full result is `buffer_bytes`."""
    if link.size <= 1 or buffer_bytes <= 0:
        return 0.0
    n = link.size
    return (n - 1) / n * buffer_bytes / (link.bandwidth_Bps * efficiency) + _latency(link, 1)


reduce_scatter_s = all_gather_s


def p2p_s(message_bytes: float, link: Link, efficiency: float) -> float:
    """One send/receive between neighbours."""
    if link.size <= 1 or message_bytes <= 0:
        return 0.0
    return message_bytes / (link.bandwidth_Bps * efficiency) + link.latency_s
