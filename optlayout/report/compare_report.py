"""The compare page: predicted against measured throughput, the error of every run, and whether the model
orders the layouts of one group (same model, cluster, sequence, batch and precision) as the runs did.

Input: the dict `optlayout compare --json` prints:
    {"runs": [{"id", "source", "group", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu",
               "ape", "measured_mfu", "predicted_mfu", "filled_fields", "layout", "measured_layout_rank",
               "twin_ahead", "legal_layouts", "solver_pick", "solver_predicted_gain", "memory_model_miss"}, ...],
     "summary": {"n", "mape", "median_ape", "pairwise_order_accuracy", "pairs", "per_source", "worst",
                 "memory_model_misses"}}
APE and MAPE are fractions (0.12 = 12%), as MFU is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from optlayout.errors import InputError
from optlayout.layout.model import AXES
from optlayout.report.html import Cell, Raw, esc, fmt_num, fmt_pct, page, table
from optlayout.report.svg import (
    PALETTE,
    Point,
    Series,
    compact_num,
    diverging_hbar,
    html_legend,
    scatter,
    slope_chart,
)

__all__ = ["compare_report_html", "competition_ranks"]

MAX_ERROR_BARS = 40  # the error chart shows the largest errors; the runs table lists every run


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def competition_ranks(values: Sequence[float]) -> list[int]:
    """Rank 1 = largest; equal values share a rank (1, 2, 2, 4)."""
    return [1 + sum(other > v for other in values) for v in values]


def layout_text(layout: object, filled: object = None) -> str:
    """A run's layout dict as `tp=8 pp=2 ... sp`; fields the compare filled in are starred."""
    if not isinstance(layout, Mapping):
        return "-" if layout is None else str(layout)
    filled_keys = set(filled) if isinstance(filled, Mapping | list | tuple | set) else set()
    parts = []
    for axis in AXES:
        value = layout.get(axis.name)
        if value is None or (axis.kind is bool and not value):
            continue
        shown = axis.key if axis.kind is bool else f"{axis.key}={value}"
        parts.append(shown + ("*" if axis.name in filled_keys else ""))
    return " ".join(parts) or "-"


def _filled_text(filled: object) -> str:
    if isinstance(filled, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(filled.items(), key=lambda kv: str(kv[0]))) or "-"
    if isinstance(filled, list | tuple | set):
        return ", ".join(sorted(str(k) for k in filled)) or "-"
    return "-"


def compare_report_html(result: dict[str, Any]) -> str:
    """One self-contained HTML page for the `optlayout compare --json` dict."""
    if not isinstance(result, Mapping):
        raise InputError("report: the compare result must be a JSON object with 'runs' and 'summary'")
    runs = [r for r in result.get("runs") or [] if isinstance(r, Mapping)]
    summary = result.get("summary") or {}
    sources = sorted({str(r.get("source", "")) for r in runs})
    series = [Series(s, s or "(no source)", PALETTE[i % len(PALETTE)]) for i, s in enumerate(sources)]
    colors = {s.key: s.color for s in series}
    anchors = {str(r.get("id")): f"run-{i + 1}" for i, r in enumerate(runs)}
    parts = [
        f"<h1>{esc(f'Compare: predictions against {len(runs)} measured runs')}</h1>",
        _summary(summary, anchors),
    ]
    if not runs:
        parts.append('<p class="note" id="no-runs">No runs to compare.</p>')
    else:
        parts += [
            _scatter(runs, series),
            _errors(runs, colors),
            _runs_table(runs, anchors),
            _orders(runs),
        ]
    parts.append(
        "<footer>optlayout compare report. Predictions from optlayout's cost model for each run's measured layout; "
        "error = predicted / measured - 1, APE = |error|.</footer>"
    )
    return page("optlayout compare report", "\n".join(parts))


def _summary(summary: Mapping[str, Any], anchors: Mapping[str, str]) -> str:
    pairs = _num(summary.get("pairs"))
    cards = [
        ("runs", fmt_num(_num(summary.get("n")))),
        ("MAPE", fmt_pct(_num(summary.get("mape")))),
        ("median APE", fmt_pct(_num(summary.get("median_ape")))),
        ("pairwise order accuracy", _order_text(_num(summary.get("pairwise_order_accuracy")), pairs)),
    ]
    html_cards = "".join(
        f'<div class="card"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>' for k, v in cards
    )
    out = [f'<div class="cards" id="summary">{html_cards}</div>']
    per_source = summary.get("per_source")
    if isinstance(per_source, Mapping) and per_source:
        rows = []
        for name in sorted(per_source, key=str):
            s = per_source[name] if isinstance(per_source[name], Mapping) else {}
            mape, median = _num(s.get("mape")), _num(s.get("median_ape"))
            n = _num(s.get("n"))
            rows.append(
                [Cell(name, cls="l"), Cell(fmt_num(n), n), Cell(fmt_pct(mape), mape), Cell(fmt_pct(median), median)]
            )
        out.append(
            table(
                [Cell("source", cls="l"), "runs", "MAPE", "median APE"],
                rows,
                table_id="per-source-table",
                sortable=True,
            )
        )
    misses = summary.get("memory_model_misses")
    if isinstance(misses, list) and misses:
        links = ", ".join(f'<a href="#{anchors[str(w)]}">{esc(w)}</a>' if str(w) in anchors else esc(w) for w in misses)
        out.append(
            f'<p class="note" id="memory-misses">Memory-model misses (predicted over memory, yet they ran; '
            f"predicted anyway): {links}</p>"
        )
    worst = summary.get("worst")
    if isinstance(worst, list) and worst:
        links = ", ".join(f'<a href="#{anchors[str(w)]}">{esc(w)}</a>' if str(w) in anchors else esc(w) for w in worst)
        out.append(f'<p class="note" id="worst">Largest errors: {links}</p>')
    return "<h2>Summary</h2>\n" + "\n".join(out)


def _order_text(accuracy: float | None, pairs: float | None) -> str:
    if accuracy is None:
        return "n/a (no group has two layouts)"
    return fmt_pct(accuracy) + (f" of {fmt_num(pairs)} pairs" if pairs is not None else "")


def _scatter(runs: Sequence[Mapping[str, Any]], series: Sequence[Series]) -> str:
    points = []
    for r in runs:
        m, p = _num(r.get("measured_tokens_per_s_per_gpu")), _num(r.get("predicted_tokens_per_s_per_gpu"))
        if m is None or p is None:
            continue
        label = f"{r.get('id')} ({r.get('source')}): measured {fmt_num(m)}, predicted {fmt_num(p)} tokens/s/GPU"
        points.append(Point(m, p, str(r.get("source", "")), label))
    svg = scatter(
        "scatter",
        points,
        series,
        "measured tokens/s per GPU",
        "predicted tokens/s per GPU",
        compact_num,
    )
    note = (
        '<p class="note">Each point is a run, coloured by source. On the dashed identity line the prediction is '
        "exact; the dotted lines mark +-10%. Above the line the model is optimistic.</p>"
    )
    legend = html_legend(series, "scatter-legend")
    return f"<h2>Predicted against measured throughput</h2>\n{note}\n{svg}{legend}"


def _signed_error(r: Mapping[str, Any]) -> float | None:
    m, p = _num(r.get("measured_tokens_per_s_per_gpu")), _num(r.get("predicted_tokens_per_s_per_gpu"))
    if m and p is not None:
        return p / m - 1
    return _num(r.get("ape"))


def _errors(runs: Sequence[Mapping[str, Any]], colors: Mapping[str, str]) -> str:
    rows = []
    for r in runs:
        err = _signed_error(r)
        if err is None:
            continue
        ape = _num(r.get("ape"))
        tip = f"{r.get('id')} ({r.get('source')}): error {fmt_pct(err, signed=True)}, APE {fmt_pct(ape)}"
        rows.append((abs(err), str(r.get("id")), err, colors.get(str(r.get("source", "")), "#333"), tip))
    rows.sort(key=lambda t: (-t[0], t[1]))
    note = "Largest error first; colour = source."
    if len(rows) > MAX_ERROR_BARS:
        note = f"The {MAX_ERROR_BARS} largest errors of {len(rows)} runs, largest first; colour = source."
        rows = rows[:MAX_ERROR_BARS]
    svg = diverging_hbar(
        "error-chart",
        [(label, err, color, tip) for _, label, err, color, tip in rows],
        lambda v: fmt_pct(v, 0 if abs(v) >= 0.1 or v == 0 else 1, signed=v != 0),
        "prediction error (predicted / measured - 1); right of zero: over-predicted",
    )
    return f'<h2>Error per run</h2>\n<p class="note">{esc(note)}</p>\n{svg}'


def _layout_cell(run: Mapping[str, Any]) -> Raw:
    """The measured layout, with the fields the compare filled in (not published) starred and listed."""
    filled = run.get("filled_fields")
    text = esc(layout_text(run.get("layout"), filled))
    listed = _filled_text(filled)
    if listed != "-":
        text += f'<br><span class="muted">filled: {esc(listed)}</span>'
    return Raw(text)


def _runs_table(runs: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    text = ("run", "source", "group", "layout (* = filled in)", "solver's pick")
    headers = ["run", "source", "group", "measured tok/s/GPU", "predicted tok/s/GPU", "error", "APE"]
    headers += ["measured MFU", "predicted MFU", "layout (* = filled in)", "measured layout rank"]
    headers += ["solver's pick", "predicted gain"]
    header_cells = [Cell(h, cls="l") if h in text else h for h in headers]
    rows = []
    for r in runs:
        m, p = _num(r.get("measured_tokens_per_s_per_gpu")), _num(r.get("predicted_tokens_per_s_per_gpu"))
        err, ape = _signed_error(r), _num(r.get("ape"))
        mm, pm = _num(r.get("measured_mfu")), _num(r.get("predicted_mfu"))
        rank, legal = r.get("measured_layout_rank"), _num(r.get("legal_layouts"))
        rank_n = _num(rank)
        rank_text = "-" if rank_n is None else f"{int(rank_n)} of {fmt_num(legal)}" if legal else str(int(rank_n))
        if rank_n is not None and r.get("twin_ahead"):  # the twin rule ranks its faster recomputation twin instead
            rank_text += " (twin ahead)"
        if rank_n is not None and r.get("ranked_in_megatron_core"):  # ranked in what the run's release runs
            rank_text += f" in Megatron-Core {r['ranked_in_megatron_core']}"
        gain = _num(r.get("solver_predicted_gain"))
        pick = r.get("solver_pick")
        anchor = anchors.get(str(r.get("id")), "")
        rows.append(
            [
                Cell(Raw(f'<span id="{esc(anchor)}">{esc(r.get("id"))}</span>'), str(r.get("id")), "l nowrap"),
                Cell(r.get("source", ""), cls="l"),
                Cell(r.get("group", ""), cls="l"),
                Cell(fmt_num(m), m),
                Cell(fmt_num(p) + (" (over memory)" if r.get("predicted_fits_memory") is False else ""), p),
                Cell(fmt_pct(err, signed=True), err),
                Cell(fmt_pct(ape), ape, "bad" if ape is not None and ape > 0.2 else ""),
                Cell(fmt_pct(mm), mm),
                Cell(fmt_pct(pm), pm),
                Cell(_layout_cell(r), cls="l mono wide"),
                Cell(rank_text, rank_n),
                Cell(layout_text(pick) if pick else "-", cls="l mono wide"),
                Cell(fmt_pct(gain, signed=True), gain),
            ]
        )
    note = (
        '<p class="note">Click a header to sort. Measured layout rank: where the run\'s layout falls among the '
        "legal layouts by predicted throughput (1 = the solver's pick); predicted gain: the pick's predicted "
        "throughput over the measured layout's; over memory: the model predicts the measured layout does not "
        "fit, yet it ran.</p>"
    )
    body = table(header_cells, rows, table_id="runs-table", sortable=True, probe=True, cls="compact")
    return f'<h2>Runs</h2>\n{note}\n<div class="scroll">{body}</div>'


def _orders(runs: Sequence[Mapping[str, Any]]) -> str:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        m, p = _num(r.get("measured_tokens_per_s_per_gpu")), _num(r.get("predicted_tokens_per_s_per_gpu"))
        if m is not None and p is not None:
            groups.setdefault(str(r.get("group", "")), []).append(r)
    multi = [(name, rs) for name, rs in sorted(groups.items()) if len(rs) > 1]
    head = (
        "<h2>Order of layouts within each group</h2>\n"
        '<p class="note">Runs of one group share model, cluster, sequence, batch and precision and differ in layout. '
        "Rank 1 is the fastest; a flat green line means the model put that run where the measurement did.</p>"
    )
    if not multi:
        return head + '\n<p class="note" id="order-none">No group has more than one run.</p>'
    out = [head]
    for k, (name, rs) in enumerate(multi, 1):
        measured = [float(r["measured_tokens_per_s_per_gpu"]) for r in rs]
        predicted = [float(r["predicted_tokens_per_s_per_gpu"]) for r in rs]
        mr, pr = competition_ranks(measured), competition_ranks(predicted)
        agree = total = 0
        for i in range(len(rs)):
            for j in range(i + 1, len(rs)):
                if measured[i] == measured[j] or rs[i].get("layout") == rs[j].get("layout"):
                    continue  # as the summary counts pairs: different layouts, different measurements
                total += 1
                agree += (measured[i] > measured[j]) == (predicted[i] > predicted[j])
        order = sorted(range(len(rs)), key=lambda i: (mr[i], pr[i], str(rs[i].get("id"))))
        rows: list[list[object]] = []
        for i in order:
            r = rs[i]
            rows.append(
                [
                    Cell(r.get("id"), cls="l"),
                    Cell(layout_text(r.get("layout"), r.get("filled_fields")), cls="l mono"),
                    Cell(fmt_num(measured[i]), measured[i]),
                    Cell(fmt_num(predicted[i]), predicted[i]),
                    mr[i],
                    Cell(pr[i], pr[i], "" if mr[i] == pr[i] else "bad"),
                ]
            )
        chart = slope_chart(
            f"order-chart-{k}",
            [(str(rs[i].get("id")), mr[i], pr[i]) for i in order],
            "measured rank",
            "predicted rank",
        )
        headers: list[str | Cell] = [Cell("run", cls="l"), Cell("layout", cls="l"), "measured tok/s/GPU",
                                     "predicted tok/s/GPU"]  # fmt: skip
        tbl = table([*headers, "measured rank", "predicted rank"], rows, cls="order-table")
        out.append(
            f'<h3 class="group-name">{esc(name)}</h3>\n'
            f'<p class="note">{agree} of {total} pairs in the measured order.</p>\n{chart}\n{tbl}'
        )
    return "\n".join(out)
