"""Collectives on links: the time of ring all-reduce, all-gather, reduce-scatter and point-to-point.

Bandwidth is the per-GPU, per-direction bandwidth the group gets from the topology graph (the links its
collective crosses); the ring moves (n-1)/n of the buffer per GPU per pass (Patarasuk & Yuan 2009, NCCL's
bus-bandwidth convention). Data-parallel collectives run on NCCL, whose own latency model this follows
(src/graph/tuning.cc, v2.23.4 to v2.30, Simple protocol of large buffers): a base cost plus one step latency
per ring step, NVLink steps inside a scale-up domain and network steps between domains, so all-gather and
reduce-scatter (rings only) grow linearly with the ranks; all-reduce takes the faster of the ring and the tree
(a chain inside each domain, log2 of the domains across), as NCCL's tuner does. Tensor-parallel collectives
(overlapped GEMM + userbuffers exchange in Transformer Engine) pay the link latency per ring step.
An all-to-all's link is its own (`Topology.dim_all_to_all_bandwidth_Bps`): the bytes per second at which the
slowest member of the EP group scatters its whole buffer, its own share included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from optlayout.cost.params import CostParams
from optlayout.layout.model import Layout
from optlayout.layout.ranks import COSTED_ORDER, expert_grid, grid


class LinkSource(Protocol):
    """What the cost model needs from a topology: bandwidth and latency of a strided rank group, and the worst
    of the point-to-point pairs (first + j, second + j), j < count (a pipeline stage boundary)."""

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_latency_s(self, size: int, stride: int) -> float: ...

    def dim_all_to_all_bandwidth_Bps(self, size: int, stride: int) -> float: ...

    def dim_all_to_all_latency_s(self, size: int, stride: int) -> float: ...

    def pairs_link(self, first: int, second: int, count: int) -> tuple[float, float]: ...

    def dim_domains(self, size: int, stride: int) -> int: ...


@dataclass(frozen=True)
class Link:
    """Per-GPU bandwidth (bytes/s, per direction) and latency of one rank group."""

    size: int
    bandwidth_Bps: float
    latency_s: float
    domains: int = 1  # scale-up domains the group spans (NCCL's nodes)


@dataclass(frozen=True)
class GroupLinks:
    """The links of every parallel group of a layout, placed in the rank order the cost model prices."""

    tp: Link
    cp: Link
    dp_cp: Link  # gradient reduction and optimizer sharding run over dp x cp
    pp: Link  # the slowest stage boundary of the steady state (worst bandwidth, worst latency): it sets the pace
    pp_fill: tuple[Link, ...] = ()  # boundaries 0|1, ..., p-2|p-1: the warm-up and cool-down cross each once
    ep: Link = Link(1, math.inf, 0.0)  # the expert-parallel group's all-to-all (token dispatch and combine)
    etp: Link = Link(1, math.inf, 0.0)  # the expert-tensor-parallel group (gathers of the routed tokens)
    edp: Link = Link(1, math.inf, 0.0)  # the expert-data-parallel group (expert gradients and optimizer sharding)


def group_links(
    topology: LinkSource, layout: Layout, memo: dict[tuple[object, ...], object] | None = None
) -> GroupLinks:
    """Place the layout's groups in `COSTED_ORDER` (Megatron's tp-cp-ep-dp-pp: TP fastest, then CP, DP, PP),
    the expert groups in its expert grid (expert-TP fastest, then EP, expert-DP, PP), and read their links.

    Every pipeline stage boundary is read on its own: PP is the slowest axis of that order, so stage i holds
    ranks [i*s, (i+1)*s) with s the PP stride, and each rank sends to the rank s above it. Interleaved (vp > 1),
    the last stage also sends to the first (chunk k on stage p-1 feeds chunk k+1 on stage 0; Megatron's pipeline
    ranks wrap around), so that boundary joins the steady state's, not the fill's. `memo` (one per topology) keeps
    the links read, under each group's (size, stride), the all-to-all's and the pipeline's (stages, stride,
    wrap-around)."""
    memo = {} if memo is None else memo

    def link(size: int, stride: int) -> Link:
        if size <= 1:
            return Link(1, math.inf, 0.0)
        found = memo.get(("link", size, stride))
        if not isinstance(found, Link):
            bw, lat = topology.dim_bandwidth_Bps(size, stride), topology.dim_latency_s(size, stride)
            found = memo["link", size, stride] = Link(size, bw, lat, topology.dim_domains(size, stride))
        return found

    tp, cp, dp_cp, pp_stride = _dense_spans(layout.tp, layout.cp, layout.dp, layout.pp)
    etp, (size, stride), edp = _expert_spans(layout.etp, layout.ep, layout.edp, layout.pp)
    a2a = memo.get(("a2a", size, stride))
    if not isinstance(a2a, Link):
        a2a = Link(1, math.inf, 0.0)
        if size > 1:
            a2a = Link(size, topology.dim_all_to_all_bandwidth_Bps(size, stride), topology.dim_all_to_all_latency_s(
                size, stride), topology.dim_domains(size, stride))  # fmt: skip
        memo["a2a", size, stride] = a2a
    pp, fill = _pipeline_links(topology, layout.pp, pp_stride, layout.vp > 1, memo)
    return GroupLinks(tp=link(*tp), cp=link(*cp), dp_cp=link(*dp_cp), pp=pp, pp_fill=fill, ep=a2a, etp=link(*etp),
                      edp=link(*edp))  # fmt: skip


def _pipeline_links(
    topology: LinkSource, p: int, s: int, wraps: bool, memo: dict[tuple[object, ...], object]
) -> tuple[Link, tuple[Link, ...]]:
    """(the steady state's slowest boundary, the fill's boundaries 0|1, ..., p-2|p-1) of `p` stages `s` ranks apart;
    `wraps`: the last stage also sends to the first (interleaved). Through `memo`."""
    key = ("pp", p, s, wraps)
    found = memo.get(key)
    if found is None:
        fill = tuple(Link(2, *topology.pairs_link(i * s, (i + 1) * s, s)) for i in range(p - 1))
        steady = fill + ((Link(2, *topology.pairs_link((p - 1) * s, 0, s)),) if wraps else ())
        # the worst bandwidth and the worst latency of the boundaries, as the strided groups read their worst group
        pp = Link(2, min(b.bandwidth_Bps for b in steady), max(b.latency_s for b in steady)) if steady else Link(
            1, math.inf, 0.0)  # fmt: skip
        found = memo[key] = (pp, fill)
    return found  # type: ignore[return-value]


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


def _ring_latency_s(link: Link, passes: int, params: CostParams | None) -> float:
    """Ring latency: (n - 1) steps per pass. With `params`, NCCL's model: its base latency, NVLink steps inside
    a domain and network steps between domains, (domains - 1) per pass; without, the group's link latency per
    step (a ring of direct copies, as Transformer Engine's userbuffers exchange)."""
    n, domains = link.size, max(1, min(link.domains, link.size))
    steps = passes * (n - 1)
    if params is None:
        return steps * link.latency_s
    net_steps = passes * (domains - 1)
    return (
        params.nccl_base_latency_s
        + (steps - net_steps) * params.nccl_nvlink_step_latency_s
        + net_steps * params.nccl_net_step_latency_s
    )


def _tree_latency_s(link: Link, params: CostParams) -> float:
    """NCCL tree all-reduce latency: up and down a chain inside each domain and a tree over the domains
    (log2 rounded down, as NCCL's log2i)."""
    n, domains = link.size, max(1, min(link.domains, link.size))
    chain, tree = n // domains - 1, domains.bit_length() - 1
    return params.nccl_base_latency_s + 2 * (
        chain * params.nccl_tree_nvlink_step_latency_s + tree * params.nccl_net_step_latency_s
    )


def all_reduce_s(buffer_bytes: float, link: Link, efficiency: float, params: CostParams | None = None) -> float:
    """All-reduce of a buffer held whole by each of the group's GPUs: ring bandwidth; with NCCL (`params`), the
    faster of its ring and tree latencies."""
    if link.size <= 1 or buffer_bytes <= 0:
        return 0.0
    n = link.size
    latency = _ring_latency_s(link, 2, params)
    if params is not None:
        latency = min(latency, _tree_latency_s(link, params))
    return 2 * (n - 1) / n * buffer_bytes / (link.bandwidth_Bps * efficiency) + latency


def all_gather_s(buffer_bytes: float, link: Link, efficiency: float, params: CostParams | None = None) -> float:
    """All-gather (or reduce-scatter) whose full result is `buffer_bytes`: a ring (NCCL's with `params`)."""
    if link.size <= 1 or buffer_bytes <= 0:
        return 0.0
    n = link.size
    return (n - 1) / n * buffer_bytes / (link.bandwidth_Bps * efficiency) + _ring_latency_s(link, 1, params)


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
