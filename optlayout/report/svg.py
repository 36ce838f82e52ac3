"""Hand-written inline SVG charts: stacked and diverging horizontal bars, a scatter with the identity line,
and a slope chart of two rankings. Each chart is one `<svg class="chart" id=...>` whose marks carry the
class `bar`, `point` or `slope` (and a <title> tooltip), so tests and readers can find them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from optlayout.report.html import Raw, esc

# Colour-blind-friendly palette (Okabe-Ito, then Tableau-like extras): a series keeps its colour.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#000000",
    "#8C564B",
    "#7F7F7F",
    "#17BECF",
    "#BCBD22",
)

LABEL_W = 250  # left margin for row labels
PLOT_W = 700
ROW_H = 26
ROW_GAP = 10
LOG_SPAN = 20  # a scatter whose values span more than this factor goes log-log


@dataclass(frozen=True)
class Series:
    key: str
    name: str
    color: str


def _f(x: float) -> str:
    """Coordinates with one decimal: short and deterministic."""
    return f"{x:.1f}".rstrip("0").rstrip(".") if x == x else "0"


def compact_num(v: float) -> str:
    """Axis numbers that stay short: 500, 2k, 12.5k, 1.2M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= limit:
            return f"{v / limit:.3g}{suffix}"
    return f"{v:.3g}"


def nice_ticks(vmax: float, count: int = 5) -> list[float]:
    """0 and round steps up to at least `vmax` (1, 2, 2.5 or 5 times a power of ten)."""
    if not vmax > 0 or not math.isfinite(vmax):
        return [0.0, 1.0]
    raw = vmax / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(n + 1)]


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _title(text: str) -> str:
    return f"<title>{esc(text)}</title>"


def _legend(series: Sequence[Series], x0: float, y: float, width: float) -> tuple[str, float]:
    """A wrapped row of swatches; returns the markup and the height used."""
    parts, x, line = [], x0, 0
    for s in series:
        w = 22 + 7 * len(s.name) + 18
        if x + w > x0 + width and x > x0:
            x, line = x0, line + 1
        yy = y + line * 20
        parts.append(
            f'<g class="legend-item"><rect x="{_f(x)}" y="{_f(yy)}" width="12" height="12" fill="{s.color}"/>'
            f'<text x="{_f(x + 17)}" y="{_f(yy + 10.5)}" class="tick">{esc(s.name)}</text></g>'
        )
        x += w
    return '<g class="legend">' + "".join(parts) + "</g>", (line + 1) * 20


def html_legend(series: Sequence[Series], legend_id: str = "") -> Raw:
    """A wrapping HTML legend: full series names (sources can be long), a colour swatch each."""
    ident = f' id="{esc(legend_id)}"' if legend_id else ""
    items = "".join(f'<li><span class="swatch" style="background:{s.color}"></span>{esc(s.name)}</li>' for s in series)
    return Raw(f'<ul class="legend"{ident}>{items}</ul>\n')


def stacked_hbar(
    chart_id: str,
    rows: Sequence[tuple[str, Mapping[str, float]]],
    series: Sequence[Series],
    fmt: Callable[[float], str],
    axis_label: str,
    *,
    scale: float = 1.0,
    reference: float | None = None,
    reference_label: str = "",
    totals: Sequence[float] | None = None,
) -> Raw:
    """One stacked horizontal bar per row; `reference` draws a dashed vertical line (e.g. capacity).

    Values are in base units; `scale` divides them for the axis (bytes -> GB) and `fmt` prints base units.
    """
    sums = [sum(max(v.get(s.key, 0.0), 0.0) for s in series) for _, v in rows]
    totals = list(totals) if totals is not None else sums
    top = max([*totals, *sums, reference or 0.0, 0.0]) / scale
    ticks = nice_ticks(top * 1.02)
    xmax = ticks[-1]
    legend, legend_h = _legend(series, LABEL_W, 6, PLOT_W)
    y0 = legend_h + 18
    plot_h = len(rows) * (ROW_H + ROW_GAP) + ROW_GAP
    height = y0 + plot_h + 46
    width = LABEL_W + PLOT_W + 90

    def x(v: float) -> float:
        return LABEL_W + (v / scale) / xmax * PLOT_W

    out = [
        f'<svg id="{esc(chart_id)}" class="chart" data-probe width="{width}" height="{_f(height)}" '
        f'viewBox="0 0 {width} {_f(height)}" role="img" aria-label="{esc(axis_label)}">',
        legend,
    ]
    grid = []
    for t in ticks:
        gx = LABEL_W + t / xmax * PLOT_W
        grid.append(f'<line class="grid" x1="{_f(gx)}" y1="{_f(y0)}" x2="{_f(gx)}" y2="{_f(y0 + plot_h)}"/>')
        grid.append(f'<text class="tick" x="{_f(gx)}" y="{_f(y0 + plot_h + 15)}" text-anchor="middle">{t:g}</text>')
    out.append("".join(grid))
    for i, (label, values) in enumerate(rows):
        y = y0 + ROW_GAP + i * (ROW_H + ROW_GAP)
        out.append(
            f'<text x="{LABEL_W - 8}" y="{_f(y + ROW_H / 2 + 4)}" text-anchor="end" class="row-label">'
            f"{_title(label)}{esc(truncate(label, 36))}</text>"
        )
        acc = 0.0
        for s in series:
            v = max(values.get(s.key, 0.0), 0.0)
            if v <= 0:
                continue
            x1, x2 = x(acc), x(acc + v)
            out.append(
                f'<rect class="bar seg-{esc(s.key)}" x="{_f(x1)}" y="{_f(y)}" width="{_f(max(x2 - x1, 0.5))}" '
                f'height="{ROW_H}" fill="{s.color}">{_title(f"{label}: {s.name} {fmt(v)}")}</rect>'
            )
            if x2 - x1 > 46:
                out.append(
                    f'<text class="seg-label" x="{_f((x1 + x2) / 2)}" y="{_f(y + ROW_H / 2 + 4)}" '
                    f'text-anchor="middle">{esc(fmt(v))}</text>'
                )
            acc += v
        out.append(
            f'<text class="tick total" x="{LABEL_W + PLOT_W + 8}" y="{_f(y + ROW_H / 2 + 4)}">'
            f"{esc(fmt(totals[i]))}</text>"
        )
    if reference is not None and reference > 0:
        rx = x(reference)
        out.append(
            f'<line class="capacity-line" x1="{_f(rx)}" y1="{_f(y0 - 4)}" x2="{_f(rx)}" y2="{_f(y0 + plot_h)}">'
            f"{_title(f'{reference_label} {fmt(reference)}')}</line>"
        )
        out.append(
            f'<text class="tick" x="{_f(rx)}" y="{_f(y0 - 7)}" text-anchor="middle" fill="#b42318">'
            f"{esc(reference_label)} {esc(fmt(reference))}</text>"
        )
    out.append(
        f'<g class="axis"><line x1="{LABEL_W}" y1="{_f(y0 + plot_h)}" x2="{LABEL_W + PLOT_W}" y2="{_f(y0 + plot_h)}"/>'
        f'<line x1="{LABEL_W}" y1="{_f(y0)}" x2="{LABEL_W}" y2="{_f(y0 + plot_h)}"/></g>'
        f'<text class="axis-label" x="{LABEL_W + PLOT_W / 2}" y="{_f(height - 8)}" text-anchor="middle">'
        f"{esc(axis_label)}</text>"
    )
    out.append("</svg>")
    return Raw("\n".join(out) + "\n")


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    series: str
    label: str


def scatter(
    chart_id: str,
    points: Sequence[Point],
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    fmt: Callable[[float], str],
    band: float = 0.1,
) -> Raw:
    """Square scatter on equal axes with the identity line y = x and a +-`band` relative band.

    Linear from 0, or log-log when the values span more than `LOG_SPAN` (runs of 8B and 405B models).
    """
    size, left, top_m, right = 520, 80, 20, 30
    values = [v for p in points for v in (p.x, p.y)]
    log = bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SPAN
    if log:
        steps = [m * 10**k for k in range(math.floor(math.log10(min(values))) - 1, 16) for m in (1, 2, 5)]
        lo = max(t for t in steps if t <= min(values) / 1.05)
        hi = min(t for t in steps if t >= max(values) * 1.05)
        ticks = [t for t in steps if lo <= t <= hi]

        def unit(v: float) -> float:
            return (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    else:
        ticks = nice_ticks(max([*values, 0.0]) * 1.05)
        lo, hi = 0.0, ticks[-1]

        def unit(v: float) -> float:
            return v / hi

    if log:
        x_label, y_label = f"{x_label} (log scale)", f"{y_label} (log scale)"
    width, height = left + size + right, top_m + size + 60
    colors = {s.key: s.color for s in series}

    def px(v: float) -> float:
        return left + unit(v) * size

    def py(v: float) -> float:
        return top_m + size - unit(v) * size

    out = [
        f'<svg id="{esc(chart_id)}" class="chart" data-probe width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(y_label)} against {esc(x_label)}">'
    ]
    for t in ticks:
        out.append(
            f'<line class="grid" x1="{_f(px(t))}" y1="{top_m}" x2="{_f(px(t))}" y2="{top_m + size}"/>'
            f'<line class="grid" x1="{left}" y1="{_f(py(t))}" x2="{left + size}" y2="{_f(py(t))}"/>'
            f'<text class="tick" x="{_f(px(t))}" y="{top_m + size + 16}" text-anchor="middle">{esc(fmt(t))}</text>'
            f'<text class="tick" x="{left - 6}" y="{_f(py(t) + 4)}" text-anchor="end">{esc(fmt(t))}</text>'
        )
    out.append(
        f'<line class="identity" x1="{_f(px(lo))}" y1="{_f(py(lo))}" x2="{_f(px(hi))}" y2="{_f(py(hi))}">'
        f"{_title('predicted = measured')}</line>"
    )
    for k in (1 + band, 1 - band):
        # y = k x, clipped to the plot square
        xs, xe = max(lo, lo / k), min(hi, hi / k)
        out.append(
            f'<line class="band" x1="{_f(px(xs))}" y1="{_f(py(k * xs))}" x2="{_f(px(xe))}" y2="{_f(py(k * xe))}">'
            f"{_title(f'predicted = {k:g} x measured')}</line>"
        )
    out.append(
        f'<g class="axis"><line x1="{left}" y1="{top_m + size}" x2="{left + size}" y2="{top_m + size}"/>'
        f'<line x1="{left}" y1="{top_m}" x2="{left}" y2="{top_m + size}"/></g>'
        f'<text class="axis-label" x="{left + size / 2}" y="{top_m + size + 40}" text-anchor="middle">'
        f"{esc(x_label)}</text>"
        f'<text class="axis-label" transform="translate(18 {top_m + size / 2}) rotate(-90)" text-anchor="middle">'
        f"{esc(y_label)}</text>"
    )
    for p in points:
        out.append(
            f'<circle class="point" cx="{_f(px(p.x))}" cy="{_f(py(p.y))}" r="6" fill="{colors.get(p.series, "#333")}" '
            f'fill-opacity="0.85" stroke="#fff" stroke-width="1">{_title(p.label)}</circle>'
        )
    out.append("</svg>")
    return Raw("\n".join(out) + "\n")


def diverging_hbar(
    chart_id: str,
    rows: Sequence[tuple[str, float, str, str]],
    fmt: Callable[[float], str],
    axis_label: str,
) -> Raw:
    """One bar per row from zero (negative to the left); rows are (label, value, colour, tooltip)."""
    row_h, gap = 18, 5
    vmax = max([abs(v) for _, v, _, _ in rows] + [1e-12])
    ticks = nice_ticks(vmax * 1.05, 3)
    m = ticks[-1]
    half = PLOT_W / 2
    zero = LABEL_W + half
    plot_h = len(rows) * (row_h + gap) + gap
    y0 = 8
    height, width = y0 + plot_h + 46, LABEL_W + PLOT_W + 80

    def x(v: float) -> float:
        return zero + v / m * half

    out = [
        f'<svg id="{esc(chart_id)}" class="chart" data-probe width="{width}" height="{_f(height)}" '
        f'viewBox="0 0 {width} {_f(height)}" role="img" aria-label="{esc(axis_label)}">'
    ]
    for t in [-t for t in reversed(ticks[1:])] + ticks:
        out.append(
            f'<line class="grid" x1="{_f(x(t))}" y1="{y0}" x2="{_f(x(t))}" y2="{_f(y0 + plot_h)}"/>'
            f'<text class="tick" x="{_f(x(t))}" y="{_f(y0 + plot_h + 15)}" text-anchor="middle">{esc(fmt(t))}</text>'
        )
    for i, (label, v, color, tip) in enumerate(rows):
        y = y0 + gap + i * (row_h + gap)
        x1, x2 = sorted((x(0), x(v)))
        out.append(
            f'<text x="{LABEL_W - 8}" y="{_f(y + row_h / 2 + 4)}" text-anchor="end" class="tick">'
            f"{_title(label)}{esc(truncate(label, 36))}</text>"
            f'<rect class="bar" x="{_f(x1)}" y="{_f(y)}" width="{_f(max(x2 - x1, 1.0))}" height="{row_h}" '
            f'fill="{color}">{_title(tip)}</rect>'
            f'<text class="tick" x="{_f(x2 + 5 if v >= 0 else x1 - 5)}" y="{_f(y + row_h / 2 + 4)}" '
            f'text-anchor="{"start" if v >= 0 else "end"}">{esc(fmt(v))}</text>'
        )
    out.append(
        f'<g class="axis"><line x1="{_f(zero)}" y1="{y0}" x2="{_f(zero)}" y2="{_f(y0 + plot_h)}"/></g>'
        f'<text class="axis-label" x="{_f(zero)}" y="{_f(height - 8)}" text-anchor="middle">{esc(axis_label)}</text>'
    )
    out.append("</svg>")
    return Raw("\n".join(out) + "\n")


def slope_chart(
    chart_id: str,
    items: Sequence[tuple[str, int, int]],
    left_title: str,
    right_title: str,
) -> Raw:
    """Two rankings side by side (1 at the top), a line per item: flat when both agree."""
    n = max([max(a, b) for _, a, b in items] + [1])
    step, top = 26, 34
    lx, rx = 250, 430
    width, height = 700, top + n * step + 10
    out = [
        f'<svg id="{esc(chart_id)}" class="chart order-chart" data-probe width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(left_title)} against {esc(right_title)}">',
        f'<text class="axis-label" x="{lx}" y="16" text-anchor="middle">{esc(left_title)}</text>',
        f'<text class="axis-label" x="{rx}" y="16" text-anchor="middle">{esc(right_title)}</text>',
    ]
    for label, a, b in items:
        ya, yb = top + (a - 1) * step + 8, top + (b - 1) * step + 8
        color = "#2da44e" if a == b else "#cf222e"
        out.append(
            f'<line class="slope" x1="{lx}" y1="{ya}" x2="{rx}" y2="{yb}" stroke="{color}" stroke-width="2.5">'
            f"{_title(f'{label}: measured #{a}, predicted #{b}')}</line>"
            f'<circle cx="{lx}" cy="{ya}" r="4" fill="{color}"/><circle cx="{rx}" cy="{yb}" r="4" fill="{color}"/>'
            f'<text class="tick" x="{lx - 10}" y="{ya + 4}" text-anchor="end">#{a} {esc(truncate(label, 30))}</text>'
            f'<text class="tick" x="{rx + 10}" y="{yb + 4}">#{b} {esc(truncate(label, 30))}</text>'
        )
    out.append("</svg>")
    return Raw("\n".join(out) + "\n")
