"""Self-contained HTML pages: escaping, tables, number formats, the inline CSS and the two small scripts.

Every piece of text goes through `esc` unless it is a `Raw` string built by these helpers. Pages load
nothing from the network: CSS, SVG and the scripts are inline. The output is a pure function of the input
(no clocks, no random ids), so the same plan gives the same bytes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import TypeIs

from optlayout.errors import InputError

__all__ = [
    "Cell",
    "Raw",
    "esc",
    "fmt_bytes_gb",
    "fmt_num",
    "fmt_pct",
    "fmt_seconds",
    "page",
    "table",
    "write_report",
]


class Raw(str):
    """Markup built by these helpers: inserted as it is, never escaped again."""

    __slots__ = ()


def esc(value: object) -> str:
    """Escape any value for HTML text or a quoted attribute; `Raw` passes through."""
    if isinstance(value, Raw):
        return value
    return html.escape("" if value is None else str(value), quote=True)


@dataclass(frozen=True)
class Cell:
    """A table cell: shown text (or Raw markup), the key the sort script uses, and extra classes."""

    text: object
    sort: float | str | None = None
    cls: str = ""


def _finite(value: object) -> TypeIs[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fmt_num(value: object, digits: int = 0) -> str:
    """Thousands-separated number; `-` when missing."""
    return f"{value:,.{digits}f}" if _finite(value) else "-"


def fmt_pct(value: object, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage (0.417 -> 41.7%)."""
    if not _finite(value):
        return "-"
    return f"{value * 100:+.{digits}f}%" if signed else f"{value * 100:.{digits}f}%"


def fmt_bytes_gb(value: object, digits: int = 1) -> str:
    """Bytes as decimal gigabytes, as the rest of optlayout prints them."""
    return f"{value / 1e9:,.{digits}f} GB" if _finite(value) else "-"


def fmt_seconds(value: object) -> str:
    """Seconds with a unit that keeps three significant figures readable."""
    if not _finite(value):
        return "-"
    if value == 0:
        return "0 s"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} us"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def table(
    headers: Sequence[str | Cell],
    rows: Iterable[Sequence[object]],
    *,
    table_id: str | None = None,
    sortable: bool = False,
    cls: str = "",
    probe: bool = False,
) -> Raw:
    """An HTML table; a `sortable` one sorts by a clicked header (numbers by their `Cell.sort` key)."""
    classes = " ".join(c for c in ("data", cls, "sortable" if sortable else "") if c)
    attrs = f' class="{classes}"'
    if table_id:
        attrs = f' id="{esc(table_id)}"' + attrs
    if probe:
        attrs += " data-probe"
    head = "".join(_cell("th", h) for h in headers)
    body = "".join("<tr>" + "".join(_cell("td", c) for c in row) + "</tr>\n" for row in rows)
    return Raw(f"<table{attrs}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n")


def _cell(tag: str, cell: object) -> str:
    if not isinstance(cell, Cell):
        cell = Cell(cell, cell if _finite(cell) else None)
    attrs = f' class="{esc(cell.cls)}"' if cell.cls else ""
    if cell.sort is not None:
        key = repr(float(cell.sort)) if _finite(cell.sort) else str(cell.sort)
        attrs += f' data-sort="{esc(key)}"'
    return f"<{tag}{attrs}>{esc(cell.text)}</{tag}>"


CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --panel: #f6f8fa; --bad: #b42318; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; color: var(--ink); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.note, .muted { color: var(--muted); }
p.note { margin: 4px 0 10px; max-width: 1100px; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 12px 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px;
  min-width: 150px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 12px; }
table.data { border-collapse: collapse; margin: 8px 0 12px; font-variant-numeric: tabular-nums; }
table.data th, table.data td { border: 1px solid var(--line); padding: 4px 8px; text-align: right;
  vertical-align: top; }
table.data th { background: var(--panel); font-weight: 600; }
table.data td.l, table.data th.l { text-align: left; }
table.data tr.best td { background: #eef6ee; }
table.data td.bad { color: var(--bad); font-weight: 600; }
table.data td.nowrap { white-space: nowrap; }
table.data td.wide { min-width: 15em; }
table.compact { font-size: 12.5px; }
div.scroll { max-width: 100%; overflow-x: auto; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[data-dir="asc"]::after { content: " \\25B2"; font-size: 10px; }
table.sortable th[data-dir="desc"]::after { content: " \\25BC"; font-size: 10px; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 8px 0 4px; background: #fff; }
svg.chart text { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; fill: var(--ink); }
svg.chart .axis line, svg.chart .axis path { stroke: #8c959f; }
svg.chart .grid { stroke: #eaeef2; }
svg.chart .tick { font-size: 11px; fill: var(--muted); }
svg.chart .row-label { font-size: 12px; }
svg.chart .axis-label { font-size: 12px; fill: var(--ink); }
svg.chart .seg-label { font-size: 10.5px; fill: #fff; }
svg.chart .capacity-line { stroke: var(--bad); stroke-width: 2; stroke-dasharray: 6 3; }
svg.chart .identity { stroke: #57606a; stroke-width: 1.5; stroke-dasharray: 5 4; }
svg.chart .band { stroke: #afb8c1; stroke-width: 1; stroke-dasharray: 2 4; }
.diagnosis { background: #fff4f2; border: 1px solid #f3c1bb; border-left: 4px solid var(--bad); padding: 12px 16px;
  border-radius: 4px; max-width: 1100px; white-space: pre-wrap; }
ul.why li { margin: 4px 0; }
ul.legend { list-style: none; padding: 0; margin: 4px 0 8px; display: flex; flex-wrap: wrap; gap: 4px 18px;
  font-size: 12.5px; max-width: 1100px; }
ul.legend .swatch { display: inline-block; width: 11px; height: 11px; border-radius: 50%; margin-right: 6px;
  vertical-align: -1px; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""

# Click a header of a table.sortable: sort its rows by the column's data-sort keys (numbers when all parse).
SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var dir = th.getAttribute("data-dir") === "asc" ? "desc" : "asc";
      table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", dir);
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[col];
        var k = cell.getAttribute("data-sort");
        return k === null ? cell.textContent.trim() : k;
      }
      var numeric = rows.every(function (r) { var k = key(r); return k === "" || !isNaN(parseFloat(k)); });
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), c;
        if (numeric) { c = (parseFloat(x) || 0) - (parseFloat(y) || 0); } else { c = x < y ? -1 : x > y ? 1 : 0; }
        return dir === "asc" ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

# Write the rendered size of every [data-probe] element (and how many of its marks were drawn with a size) into
# <pre id="layout-probe">, so a headless browser's DOM dump shows whether the charts were laid out.
PROBE_JS = """
(function () {
  var out = {};
  document.querySelectorAll("[data-probe]").forEach(function (el) {
    var r = el.getBoundingClientRect();
    var marks = 0;
    el.querySelectorAll(".bar, .point, .slope, .gpu").forEach(function (m) {
      var b = m.getBoundingClientRect();
      if (b.width > 0 || b.height > 0) { marks += 1; }
    });
    out[el.id] = { width: Math.round(r.width), height: Math.round(r.height), marks: marks };
  });
  document.getElementById("layout-probe").textContent = JSON.stringify(out);
})();
"""


def page(title: str, body: str) -> str:
    """One complete HTML document with the inline CSS and scripts."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"{body}\n"
        '<pre id="layout-probe" hidden></pre>\n'
        f"<script>{SORT_JS}{PROBE_JS}</script>\n"
        "</body>\n</html>\n"
    )


def write_report(html_text: str, path: str | Path) -> None:
    """Write a report page (UTF-8); a path that cannot be written is a one-line error."""
    target = Path(path)
    try:
        target.write_text(html_text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"report: cannot write {str(target)!r} ({exc.strerror or exc})") from None
