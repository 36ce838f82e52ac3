"""Collectives on links: the time of ring all-reduce, all-gather, reduce-scatter and point-to-point.

Bandwidth is the per-GPU, per-direction bandwidth the group gets from the topology graph (the links its
collective crosses); the ring moves (n-1)/n of the buffer per GPU per pass (Patarasuk & Yuan 2009, NCCL's
bus-bandwidth convention). Latency grows with log2(n), as NCCL's tree and NVLS algorithms do at scale.
An all-to-all's link is its own (`Topology.dim_all_to_all_bandwidth_Bps`): the bytes per second at which the
slowest member of the EP group scatters its whole buffer, its own share included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from optlayout.layout.model import Layout
from optlayout.layout.ranks import COSTED_ORDER, expert_grid, grid


class LinkSource(Protocol):
    """What the cost model needs from a topology: bandwidth and latency of a strided rank group."""

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_latency_s(self, size: int, stride: int) -> float: ...

    def dim_all_to_all_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_all_to_all_latency_s(self, size: int, stride: int) -> float: ...


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
    ep: Link = Link(1, math.inf, 0.0)  # the expert-parallel group's all-to-all (token dispatch and combine)
    etp: Link = Link(1, math.inf, 0.0)  # the expert-tensor-parallel group (gathers of the routed tokens)
    edp: Link = Link(1, math.inf, 0.0)  # the expert-data-parallel group (expert gradients and optimizer sharding)


def group_links(topology: LinkSource, layout: Layout) -> GroupLinks:
    """Place the layout's groups in `COSTED_ORDER` (Megatron's tp-cp-ep-dp-pp: TP fastest, then CP, DP, PP),
    the expert groups in its expert grid (expert-TP fastest, then EP, expert-DP, PP), and read their links."""

    def link(size: int, stride: int) -> Link:
        if size <= 1:
            return Link(1, math.inf, 0.0)
        return Link(size, topology.dim_bandwidth_Bps(size, stride), topology.dim_latency_s(size, stride))

    tp, cp, dp_cp, pp_stride = _dense_spans(layout.tp, layout.cp, layout.dp, layout.pp)
    etp, (size, stride), edp = _expert_spans(layout.etp, layout.ep, layout.edp, layout.pp)
    a2a = Link(1, math.inf, 0.0)
    if size > 1:
        a2a = Link(size, topology.dim_all_to_all_bandwidth_Bps(size, stride), topology.dim_all_to_all_latency_s(size,
                   stride))  # fmt: skip
    pair = link(2, pp_stride) if layout.pp > 1 else link(1, 1)
    return GroupLinks(tp=link(*tp), cp=link(*cp), dp_cp=link(*dp_cp), pp=pair, ep=a2a, etp=link(*etp),
                      edp=link(*edp))  # fmt: skip


Span = tuple[int, int]


@lru_cache(maxsize=65536)
def _dense_spans(tp: int, cp: int, dp: int, pp: int) -> tuple[Span, Span, Span, int]:
    """(size, stride) of the TP, CP and DP x CP groups in `COSTED_ORDER`, and the stride between pipeline stages."""
    ranks = grid(Layout.unchecked(tp=tp, cp=cp, dp=dp, pp=pp), COSTED_ORDER)
    return ranks.span(["tp"]), ranks.span(["cp"]), ranks.span(["dp", "cp"]), ranks.stride("pp")


@lru_cache(maxsize=65536)
def _expert_spans(etp: int, ep: int, edp: int, pp: int) -> tuple[Span, Span, Span]:
    """(size, stride) of the expert-TP, EP and expert-DP groups of the expert grid in `COSTED_ORDER` (an MoE
    model's experts reduce over expert-DP even with ep = 1)."""
    lay = Layout.unchecked(tp=etp, dp=ep * edp, ep=ep, etp=etp, pp=pp)  # tp*cp*dp covers etp x ep x edp
    experts = expert_grid(lay, COSTED_ORDER)
    return experts.span(["tp"]), experts.span(["ep"]), experts.span(["dp"])


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


def all_to_all_s(buffer_bytes: float, link: Link, efficiency: float) -> float:
    """All-to-all in which every member scatters `buffer_bytes` evenly over the group (its own share included)."""
    if link.size <= 1 or buffer_bytes <= 0:
        return 0.0
    return buffer_bytes / (link.bandwidth_Bps * efficiency) + link.latency_s


def p2p_s(message_bytes: float, link: Link, efficiency: float) -> float:
    """One send/receive between neighbours."""
    if link.size <= 1 or message_bytes <= 0:
        return 0.0
    return message_bytes / (link.bandwidth_Bps * efficiency) + link.latency_s
