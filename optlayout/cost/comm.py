"""Collectives on links: the time of ring all-reduce, all-gather, reduce-scatter and point-to-point.

Bandwidth is the per-GPU, per-direction bandwidth the group gets from the topology graph (the links its
collective crosses); the ring moves (n-1)/n of the buffer per GPU per pass (Patarasuk & Yuan 2009, NCCL's
bus-bandwidth convention). Latency grows with log2(n), as NCCL's tree and NVLS algorithms do at scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from optlayout.layout.model import Layout
from optlayout.layout.ranks import COSTED_ORDER, grid


class LinkSource(Protocol):
    """What the cost model needs from a topology: bandwidth and latency of a strided rank group."""

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_latency_s(self, size: int, stride: int) -> float: ...


@dataclass(frozen=True)
class Link:
    """Per-GPU bandwidth (bytes/s, per direction) and latency of one rank group."""

    size: int
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True)
class GroupLinks:
    """The links of every parallel group of a layout, placed in the rank order the cost model prices."""

    tp: Link
    cp: Link
    dp_cp: Link  # gradient reduction and optimizer sharding run over dp x cp
    pp: Link  # a pair of neighbouring stages


def group_links(topology: LinkSource, layout: Layout) -> GroupLinks:
    """Place the layout's groups in `COSTED_ORDER` (Megatron's tp-cp-ep-dp-pp: TP fastest, then CP, DP, PP)
    and read their links."""

    def link(size: int, stride: int) -> Link:
        if size <= 1:
            return Link(1, math.inf, 0.0)
        return Link(size, topology.dim_bandwidth_Bps(size, stride), topology.dim_latency_s(size, stride))

    ranks = grid(layout, COSTED_ORDER)
    pair = link(2, ranks.stride("pp")) if layout.pp > 1 else link(1, 1)
    return GroupLinks(
        tp=link(*ranks.span(["tp"])), cp=link(*ranks.span(["cp"])), dp_cp=link(*ranks.span(["dp", "cp"])), pp=pair
    )


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
