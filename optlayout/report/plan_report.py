"""The plan page: the top layouts side by side, memory and step-time bars, placement on the topology levels,
and why the runners-up lost (or, for an infeasible plan, the diagnosis)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import isfinite
from typing import Any

from optlayout.cost import group_links
from optlayout.errors import InputError, OptlayoutError
from optlayout.layout.axes import Axis
from optlayout.layout.model import SEARCHED_AXES
from optlayout.layout.ranks import COSTED_ORDER, RankMap, grid, rank_map
from optlayout.planning.plan import Plan, PlannedLayout
from optlayout.report.html import (
    Cell,
    Raw,
    esc,
    fmt_bytes_gb,
    fmt_num,
    fmt_pct,
    fmt_seconds,
    page,
    table,
)
from optlayout.report.svg import PALETTE, Series, stacked_hbar
from optlayout.solver.explain import why_it_lost
from optlayout.specs import Layout
from optlayout.timings import timings_line
from optlayout.topology import Topology

__all__ = ["DimPlacement", "placement", "plan_report_html"]

MEMORY_SERIES = (
    Series("weights_bytes", "weights", "#0072B2"),
    Series("gradients_bytes", "gradients", "#56B4E9"),
    Series("optimizer_bytes", "optimizer state", "#009E73"),
    Series("activations_bytes", "activations", "#E69F00"),
    Series("buffers_bytes", "buffers", "#CC79A7"),
    Series("reserve_bytes", "reserve", "#8C959F"),
)
TIME_SERIES = (
    Series("compute_s", "compute", "#0072B2"),
    Series("tp_comm_s", "exposed TP comm", "#E69F00"),
    Series("cp_comm_s", "exposed CP comm", "#CC79A7"),
    Series("pp_comm_s", "PP send/recv", "#56B4E9"),
    Series("dp_comm_s", "exposed DP comm", "#009E73"),
    Series("bubble_s", "pipeline bubble", "#D55E00"),
    Series("optimizer_s", "optimizer step", "#8C564B"),
    Series("overhead_s", "step overhead", "#8C959F"),
)
MAX_SAMPLED_GROUPS = 64
_SCALE_UP_NAMES = {"nvswitch": "NVLink (NVSwitch)", "mesh": "NVLink (mesh)", "pcie": "PCIe", "none": "host"}


# ---------------------------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class DimPlacement:
    """Where one parallel dimension's groups land, in the rank order the cost model prices (first fastest)."""

    dim: str
    size: int
    stride: int
    example: tuple[int, ...]  # the group holding rank 0
    servers: int  # most servers one group spans
    domains: int  # most scale-up domains one group spans
    level: str  # the slowest link level a group crosses
    on_scale_up: bool
    bandwidth_Bps: float | None  # per-GPU bandwidth the cost model reads (topology given), else None


def placement(layout: Layout, gpus_per_server: int, topology: Topology | None = None) -> list[DimPlacement]:
    """Place each dimension of `layout` on the link levels, from its rank strides and the server size.

    Without a topology the scale-up domain is the server. With one, its domains and network tiers name the
    level, and the bandwidth is the one the cost model reads for the group (DP: the DP x CP gradient group;
    PP: a pair of neighbouring stages).
    """
    ranks = _rank_map(layout, gpus_per_server)
    if topology is not None:
        domain_of: Callable[[int], object] = topology.domain_of
        levels = topology.levels()
        links = group_links(topology, layout)
        bandwidth = {"tp": links.tp, "cp": links.cp, "dp": links.dp_cp, "pp": links.pp}
    else:
        domain_of, levels, bandwidth = (lambda r: r // gpus_per_server), [], {}
    scale_up = next((lv for lv in levels if lv["level"] == "scale-up"), None)
    up_name = _SCALE_UP_NAMES.get(scale_up["kind"], scale_up["kind"]) if scale_up else "NVLink"
    out = []
    for dim in ranks.grid_dims:
        size, stride = ranks.sizes[dim], ranks.stride(dim)
        groups = ranks.groups(dim)
        sample = _sample(groups)
        servers = max(len({r // gpus_per_server for r in g}) for g in sample)
        domains = max(len({domain_of(r) for r in g}) for g in sample)
        if size == 1:
            level = "not split"
        elif domains == 1:
            where = "inside one server" if servers == 1 else f"one domain over {servers} servers"
            level = f"{up_name}, {where}"
        else:
            tier = _network_tier(sample, levels)
            level = f"network{f' ({tier})' if tier else ''}, across {servers} servers"
        link = bandwidth.get(dim)
        bw = link.bandwidth_Bps if link is not None and link.size > 1 and isfinite(link.bandwidth_Bps) else None
        out.append(DimPlacement(dim, size, stride, tuple(groups[0]), servers, domains, level, domains == 1, bw))
    return out


def _rank_map(layout: Layout, gpus_per_server: int) -> RankMap:
    """The rank map the cost model priced; a layout that leaves GPUs idle (not a whole number of servers) keeps
    its ranks."""
    try:
        return rank_map(layout, gpus_per_node=gpus_per_server, order=COSTED_ORDER)
    except OptlayoutError:
        return grid(layout, COSTED_ORDER, gpus_per_server)


def _sample(groups: list[list[int]]) -> list[list[int]]:
    if len(groups) <= MAX_SAMPLED_GROUPS:
        return groups
    last = len(groups) - 1
    return [groups[round(i * last / (MAX_SAMPLED_GROUPS - 1))] for i in range(MAX_SAMPLED_GROUPS)]


def _network_tier(groups: list[list[int]], levels: list[dict[str, Any]]) -> str:
    """The lowest network tier whose aligned block of GPUs holds every group (empty without a topology)."""
    for lv in levels:
        if lv["kind"] != "network":
            continue
        reach = int(lv["gpus"])
        if all(min(g) // reach == max(g) // reach for g in groups):
            return str(lv["level"])
    return str(levels[-1]["level"]) if levels else ""


# ---------------------------------------------------------------------------------------------- page


def plan_report_html(plan: Plan, topology: Topology | None = None, timings: bool = False) -> str:
    """One self-contained HTML page for a `Plan` (pass the Topology for link levels and bandwidths). The same
    plan gives the same page; `timings` adds the wall-clock time of each phase, which differs run to run."""
    if topology is not None and topology.num_gpus != plan.gpus:
        raise InputError(f"report: the topology has {topology.num_gpus} GPUs but the plan {plan.gpus}")
    gps = topology.gpus_per_server if topology is not None else plan.gpus_per_server
    parts = [_header(plan, topology, timings)]
    if not plan.layouts:
        parts.append(_diagnosis(plan))
    else:
        parts += [
            _layouts_table(plan),
            _memory_chart(plan),
            _time_chart(plan),
            _placement_section(plan, gps, topology),
            _why_lost(plan),
        ]
    parts.append(
        "<footer>optlayout plan report. Predictions come from optlayout's analytic cost model; "
        "the ranking is proven optimal within that model by CP-SAT.</footer>"
    )
    title = f"optlayout plan: {plan.model.name} on {plan.topology_name}"
    return page(title, "\n".join(parts))


def _label(planned: PlannedLayout) -> str:
    lay = planned.layout
    parts = [f"tp{lay.tp}"]
    if lay.pp > 1:
        parts.append(f"pp{lay.pp}" + (f"v{lay.vp}" if lay.vp > 1 else ""))
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    parts += [f"dp{lay.dp}", f"mb{lay.micro_batch}"]
    if lay.sharding.value != "none":
        parts.append(lay.sharding.value)
    if lay.recompute.value != "none":
        parts.append(f"rc-{lay.recompute.value}" + (f"{lay.recompute_layers}" if lay.recompute_layers else ""))
    return f"#{planned.rank} " + " ".join(parts)


def _header(plan: Plan, topology: Topology | None, timings: bool) -> str:
    job = plan.job
    sequences = job.sequences_per_step
    batch = f"{sequences} sequences = {fmt_num(sequences * job.seq_len)} tokens" if sequences else "solver's choice"
    gpu = f" ({topology.gpu.name})" if topology is not None else ""
    m = plan.model
    facts = [
        ("model", f"{m.name}: {fmt_num(m.param_count / 1e9, 2)} B parameters, {m.layers} layers"),
        ("cluster", f"{plan.topology_name}{gpu}: {plan.gpus} GPUs, {plan.gpus_per_server} per server"),
        ("job", f"sequence {fmt_num(job.seq_len)} tokens, global batch {batch}, {job.numerics}"),
        ("status", plan.status),
        (
            "search",
            f"{fmt_num(plan.legal_layouts)} legal layouts, {fmt_num(plan.evaluated_layouts)} evaluated, "
            f"{fmt_num(plan.candidates)} in the CP-SAT model",
        ),
    ]
    if timings and plan.phases_s:
        facts.append(("time", timings_line(plan.phases_s).removeprefix("time: ")))
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    return (
        f'<h1>{esc(f"Plan: {plan.model.name} on {plan.gpus} GPUs")}</h1>\n<dl class="facts" id="plan-facts">{rows}</dl>'
    )


def _diagnosis(plan: Plan) -> str:
    text = plan.diagnosis or f"the solver returned no layout (status {plan.status})"
    return (
        '<h2>No layout fits</h2>\n<p class="note">The solver found no layout that satisfies every constraint. '
        "Its diagnosis:</p>\n"
        f'<div id="diagnosis" class="diagnosis" data-probe>{esc(text)}</div>'
    )


def _axis_cell(axis: Axis, value: object) -> object:
    if axis.kind is bool:
        return "yes" if value else "no"
    return value if axis.numeric else Cell(getattr(value, "value", value), cls="l")


def _shown_axes(plan: Plan) -> list[Axis]:
    """The searched axes, less the expert-only ones (ep, etp) when no layout of the plan sets them (dense models)."""
    return [a for a in SEARCHED_AXES if not a.expert_token or a.grid
            or any(getattr(p.layout, a.name) != a.default for p in plan.layouts)]  # fmt: skip


def _layouts_table(plan: Plan) -> str:
    axes = _shown_axes(plan)
    headers: list[str | Cell] = ["rank"]
    headers += [a.label if a.numeric or a.kind is bool else Cell(a.label, cls="l") for a in axes]
    headers += ["MFU", "tokens/s/GPU", "step time", "memory/GPU", "of capacity", "bubble"]
    supported = any(p.support is not None for p in plan.layouts)
    if supported:
        headers += ["tokens/s/GPU 80%", Cell("no calibration run covers", cls="l")]
    rows = []
    for p in plan.layouts:
        lay, pred = p.layout, p.prediction
        used = pred.memory_per_gpu_bytes / pred.memory_capacity_bytes if pred.memory_capacity_bytes else None
        rows.append(
            [
                p.rank,
                *(_axis_cell(a, getattr(lay, a.name)) for a in axes),
                Cell(fmt_pct(pred.mfu), pred.mfu),
                Cell(fmt_num(pred.tokens_per_s_per_gpu), pred.tokens_per_s_per_gpu),
                Cell(fmt_seconds(pred.step_time_s), pred.step_time_s),
                Cell(fmt_bytes_gb(pred.memory_per_gpu_bytes), pred.memory_per_gpu_bytes),
                Cell(fmt_pct(used, 0), used, "bad" if used is not None and used > 1 else ""),
                Cell(fmt_pct(pred.bubble_fraction), pred.bubble_fraction),
            ]
        )
        if supported:
            s = p.support
            rows[-1] += ["", ""] if s is None else [
                Cell(f"{fmt_num(s.tokens_per_s_per_gpu_low)}-{fmt_num(s.tokens_per_s_per_gpu_high)}",
                     s.tokens_per_s_per_gpu_low),
                Cell("; ".join(s.unsupported) or "-", cls="l"),
            ]  # fmt: skip
    ranked = "the low end of its 80% interval (--robust)" if plan.robust else "predicted throughput"
    note = (
        f'<p class="note">Ranked by {ranked} (MFU = 6N-style model FLOPs x tokens/s / peak). '
        "Click a column header to sort.</p>"
    )
    body = table(headers, rows, table_id="layouts-table", sortable=True, probe=True)
    return f"<h2>Top {len(plan.layouts)} layouts</h2>\n{note}\n{body}"


def _memory_chart(plan: Plan) -> str:
    rows = [(_label(p), p.prediction.memory) for p in plan.layouts]
    caps = {p.prediction.memory_capacity_bytes for p in plan.layouts}
    capacity = max(caps)
    svg = stacked_hbar(
        "memory-chart",
        rows,
        MEMORY_SERIES,
        lambda v: f"{v / 1e9:.1f} GB",
        "memory per GPU (GB), fullest pipeline stage",
        scale=1e9,
        reference=capacity,
        reference_label="usable capacity",
        totals=[p.prediction.memory_per_gpu_bytes for p in plan.layouts],
    )
    note = (
        '<p class="note">Memory per GPU of each layout, stacked by kind, against the usable capacity '
        f"(dashed line: {esc(fmt_bytes_gb(capacity))}, the GPU's memory less the job's headroom).</p>"
    )
    return f"<h2>Memory per GPU</h2>\n{note}\n{svg}"


def _time_chart(plan: Plan) -> str:
    rows = [(_label(p), p.prediction.time) for p in plan.layouts]
    svg = stacked_hbar(
        "time-chart",
        rows,
        TIME_SERIES,
        fmt_seconds,
        "step time (s): compute plus what is not hidden behind it",
        totals=[p.prediction.step_time_s for p in plan.layouts],
    )
    note = (
        '<p class="note">Step time of each layout: compute, the communication the model predicts is exposed '
        "(not overlapped), the pipeline bubble and the optimizer step. All layouts process the same global batch, "
        "so shorter is faster.</p>"
    )
    return f"<h2>Step time</h2>\n{note}\n{svg}"


def _placement_section(plan: Plan, gps: int, topology: Topology | None) -> str:
    placed = {p.rank: placement(p.layout, gps, topology) for p in plan.layouts}
    headers = [Cell("layout", cls="l"), *(Cell(d.dim.upper(), cls="l") for d in placed[plan.layouts[0].rank])]
    rows = []
    for p in plan.layouts:
        cells: list[object] = [Cell(_label(p), cls="l")]
        for d in placed[p.rank]:
            text = "-" if d.size == 1 else f"{d.size}: {d.level}"
            if d.size > 1 and d.bandwidth_Bps is not None:
                text += f", {d.bandwidth_Bps / 1e9:.0f} GB/s"
            cells.append(Cell(text, cls="l"))
        rows.append(cells)
    compact = table(headers, rows, table_id="placement-table", probe=True)
    best = plan.layouts[0]
    detail_rows = []
    for d in placed[best.rank]:
        example = ", ".join(str(r) for r in d.example[:16]) + (", ..." if len(d.example) > 16 else "")
        detail_rows.append(
            [
                Cell(d.dim.upper(), cls="l"),
                d.size,
                d.stride,
                Cell(example if d.size > 1 else "-", cls="l mono"),
                d.servers,
                Cell(d.level, cls="l"),
                Cell(f"{d.bandwidth_Bps / 1e9:.0f} GB/s" if d.size > 1 and d.bandwidth_Bps else "-", d.bandwidth_Bps),
            ]
        )
    detail = table(
        [
            Cell("dim", cls="l"),
            "size",
            "rank stride",
            Cell("group of rank 0", cls="l"),
            "servers per group",
            Cell("link level", cls="l"),
            "bandwidth/GPU",
        ],
        detail_rows,
        table_id="placement-detail",
    )
    source = (
        f"the topology's link levels ({esc(', '.join(str(lv['level']) for lv in topology.levels()))})"
        if topology is not None
        else f"{gps} GPUs per server, the server taken as the NVLink domain"
    )
    note = (
        '<p class="note">Megatron rank order tp-cp-dp-pp (TP fastest): a dimension\'s ranks are '
        "stride = product of the faster sizes apart. A group stays on the scale-up links when it fits in one "
        f"domain; otherwise it crosses the network. Derived from {source}. Bandwidth per GPU is what the cost "
        "model reads: for DP the DP x CP gradient group, for PP a pair of neighbouring stages.</p>"
    )
    grid = _rank_grid(best, gps, placed[best.rank])
    return (
        f"<h2>Placement on the topology</h2>\n{note}\n{compact}\n"
        f"<h3>{esc(_label(best))}: groups and links</h3>\n{detail}\n{grid}"
    )


def _rank_grid(best: PlannedLayout, gps: int, placed: Sequence[DimPlacement]) -> str:
    """GPU cells per server, coloured by pipeline stage, TP groups outlined (first and last servers)."""
    lay = best.layout
    ranks = _rank_map(lay, gps)
    world = ranks.world_size
    servers = -(-world // gps)
    shown = list(range(servers)) if servers <= 4 else [0, 1, servers - 2, servers - 1]
    cols = min(gps, 16)
    cell_w, cell_h, gap, left, top = 78, 40, 6, 110, 28
    tp_note = f"outline = TP group of {lay.tp}" if lay.tp > 1 else "TP not split"
    rows_per_server = -(-gps // cols)
    block_h = rows_per_server * (cell_h + gap) + 14
    width = max(left + cols * (cell_w + gap) + 20, left + min(lay.pp, len(PALETTE)) * 70 + 260)
    height = top + len(shown) * block_h + (20 if servers > 4 else 0) + 30
    out = [
        f'<svg id="placement-chart" class="chart" data-probe width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="GPU ranks per server">',
        f'<text class="axis-label" x="{left}" y="16">GPU ranks per server: colour = PP stage, '
        f"{tp_note}; cell text = rank, then cp/dp/pp coordinates</text>",
    ]
    y = top
    for i, s in enumerate(shown):
        if i == 2 and servers > 4:
            out.append(f'<text class="tick" x="{left}" y="{y + 12}">... {servers - 4} more servers ...</text>')
            y += 20
        out.append(f'<text class="tick" x="{left - 10}" y="{y + cell_h / 2 + 4}" text-anchor="end">server {s}</text>')
        for local in range(gps):
            rank = s * gps + local
            x = left + (local % cols) * (cell_w + gap)
            yy = y + (local // cols) * (cell_h + gap)
            if rank >= world:
                out.append(
                    f'<rect class="gpu idle" x="{x}" y="{yy}" width="{cell_w}" height="{cell_h}" rx="4" '
                    f'fill="#ffffff" stroke="#d1d9e0"><title>GPU {rank}: idle</title></rect>'
                )
                continue
            c = ranks.coords(rank)
            color = PALETTE[c["pp"] % len(PALETTE)]
            tip = f"rank {rank}: " + ", ".join(f"{d} {c[d]}" for d in ranks.grid_dims)
            out.append(
                f'<rect class="gpu" x="{x}" y="{yy}" width="{cell_w}" height="{cell_h}" rx="4" fill="{color}" '
                f'fill-opacity="0.28" stroke="{color}"><title>{esc(tip)}</title></rect>'
                f'<text class="tick" x="{x + cell_w / 2}" y="{yy + 16}" text-anchor="middle">r{rank}</text>'
                f'<text class="tick" x="{x + cell_w / 2}" y="{yy + 31}" text-anchor="middle">'
                + " ".join(f"{d[0]}{c[d]}" for d in ranks.grid_dims[1:])
                + "</text>"
            )
        if lay.tp > 1:
            for start in range(0, gps, lay.tp):
                n = min(lay.tp, gps - start)
                if start // cols != (start + n - 1) // cols:
                    continue  # a TP group wrapping a display row: the cells' tooltips still say it
                x = left + (start % cols) * (cell_w + gap) - 3
                yy = y + (start // cols) * (cell_h + gap) - 3
                w = n * (cell_w + gap) - gap + 6
                out.append(
                    f'<rect class="tp-group" x="{x}" y="{yy}" width="{w}" height="{cell_h + 6}" rx="6" '
                    'fill="none" stroke="#1f2328" stroke-width="1.5"/>'
                )
        y += block_h
    stages = min(lay.pp, len(PALETTE))
    legend = "".join(
        f'<rect x="{left + i * 70}" y="{y + 4}" width="12" height="12" fill="{PALETTE[i]}" fill-opacity="0.5"/>'
        f'<text class="tick" x="{left + i * 70 + 16}" y="{y + 14}">stage {i}</text>'
        for i in range(stages)
    )
    if lay.pp > len(PALETTE):
        legend += (
            f'<text class="tick" x="{left + stages * 70 + 4}" y="{y + 14}">'
            f"(colours repeat every {len(PALETTE)} stages)</text>"
        )
    out.append(legend)
    out.append("</svg>")
    tp = next(d for d in placed if d.dim == "tp")
    note = f'<p class="note">TP groups: {esc(tp.level)}.</p>' if lay.tp > 1 else ""
    return Raw("\n".join(out) + "\n" + note)


def _why_lost(plan: Plan) -> str:
    best = plan.layouts[0]
    if len(plan.layouts) == 1:
        body = '<p class="note">Only the best layout was requested; solve with a larger top to compare.</p>'
        return f'<h2>Why the next candidates lost</h2>\n<div id="why-lost">{body}</div>'
    items = []
    for p in plan.layouts[1:]:
        line = why_it_lost(p.layout, p.prediction, best.layout, best.prediction, plan.job)
        dmem = p.prediction.memory_per_gpu_bytes - best.prediction.memory_per_gpu_bytes
        mem = f"memory/GPU {fmt_bytes_gb(p.prediction.memory_per_gpu_bytes)} ({dmem / 1e9:+.1f} GB against #1)"
        items.append(
            f"<li><strong>{esc(_label(p))}</strong> <code>{esc(p.layout.short())}</code>: {esc(line)}; {esc(mem)}</li>"
        )
    note = (
        '<p class="note">Against #1 <code>'
        f"{esc(best.layout.short())}</code>: the throughput gap, what differs, and the two cost terms (time per "
        "token on one GPU) that cost the most. Equal throughput means a tie in the cost model; the solver then "
        "orders layouts deterministically.</p>"
    )
    return (
        f'<h2>Why the next candidates lost</h2>\n{note}\n<ul class="why" id="why-lost">\n'
        + "\n".join(items)
        + ("\n</ul>")
    )
