"""HTML reports: text checks without a browser, then the pages rendered in headless Chromium.

The browser tests need Debian's `chromium` (`.ci/run` installs it). Where it is missing they are skipped
only when the environment variable CI is unset; under CI a missing or failing browser fails the test.
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from optlayout.errors import OptlayoutError
from optlayout.planning import solve
from optlayout.report import compare_report_html, plan_report_html, write_report
from optlayout.report.compare_report import competition_ranks
from optlayout.report.plan_report import placement
from optlayout.specs import JobSpec, Layout
from optlayout.topology import resolve_cluster

CLUSTER = "gpu=h100-sxm,gpus=16"
EXTERNAL = re.compile(r"https?://", re.IGNORECASE)
EXTERNAL_REF = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)
WEIGHTS_RGB = (0x00, 0x72, 0xB2)  # the memory chart's weights segments, PALETTE[0]: the first source's bars


@pytest.fixture(scope="module")
def plan():
    return solve("llama3.1-8b", CLUSTER, JobSpec(seq_len=4096, global_batch=64), top=5)


@pytest.fixture(scope="module")
def infeasible():
    return solve("llama3.1-405b", "gpu=h100-sxm,gpus=8", JobSpec(seq_len=4096, global_batch=64), top=5)


def _run(rid, source, group, measured, predicted, layout, rank=None, pick=None, gain=None, filled=None):
    peak = 989.5e12
    return {
        "id": rid,
        "source": source,
        "group": group,
        "measured_tokens_per_s_per_gpu": measured,
        "predicted_tokens_per_s_per_gpu": predicted,
        "ape": abs(predicted - measured) / measured,
        "measured_mfu": 6 * 8.0e9 * measured / peak,
        "predicted_mfu": 6 * 8.0e9 * predicted / peak,
        "filled_fields": filled or {},
        "layout": layout,
        "measured_layout_rank": rank,
        "legal_layouts": 420,
        "solver_pick": pick,
        "solver_predicted_gain": gain,
    }


G8 = "llama3.1-8b | h100-sxm x 16 | 4096 | 64 | bf16"
G70 = "llama3.1-70b | h100-sxm x 64 | 8192 | 128 | bf16"
G405 = "llama3.1-405b | h100-sxm x 1024 | 8192 | 1024 | bf16"
L8 = {"tp": 2, "pp": 1, "cp": 1, "dp": 8, "vp": 1, "micro_batch": 4, "sharding": "zero1", "recompute": "none"}


@pytest.fixture
def compare_result() -> dict:
    pick = {**L8, "sharding": "zero2", "sequence_parallel": True}
    runs = [
        _run("mlperf-8b-a", "mlperf", G8, 12000.0, 12500.0, {**L8, "sequence_parallel": True}, 1, pick, 0.0),
        _run("mlperf-8b-b", "mlperf", G8, 11000.0, 10200.0, {**L8, "tp": 4, "dp": 4}, 7, pick, 0.225),
        _run("paper-8b-c", "paper", G8, 9000.0, 10800.0, {**L8, "tp": 1, "dp": 16}, 3, pick, 0.157),
        _run("blog-70b-a", "blog", G70, 1500.0, 1450.0, {**L8, "tp": 8, "pp": 2, "dp": 4}, 2, None, 0.02),
        _run("blog-70b-b", "blog", G70, 1400.0, 1480.0, {**L8, "tp": 8, "pp": 4, "dp": 2}, 1, None, None),
        _run("paper-405b", "paper", G405, 400.0, 440.0, {**L8, "tp": 8, "pp": 16, "dp": 8}, None, None, None,
             {"recompute": "none", "micro_batch": 1}),
    ]  # fmt: skip
    apes = sorted(r["ape"] for r in runs)
    return {
        "runs": runs,
        "summary": {
            "n": len(runs),
            "mape": sum(apes) / len(apes),
            "median_ape": (apes[2] + apes[3]) / 2,
            "pairwise_order_accuracy": 2 / 4,
            "pairs": 4,
            "per_source": {
                "mlperf": {"n": 2, "mape": 0.0572, "median_ape": 0.0572},
                "paper": {"n": 2, "mape": 0.15, "median_ape": 0.15},
                "blog": {"n": 2, "mape": 0.0452, "median_ape": 0.0452},
            },
            "worst": ["paper-8b-c", "paper-405b", "mlperf-8b-b"],
        },
    }


# ---------------------------------------------------------------------------------------------- text


def _assert_offline(page: str) -> None:
    assert not EXTERNAL_REF.search(page), "a src/href points off the page"
    assert not EXTERNAL.search(page), "the page names an http(s) URL"
    assert "<link" not in page and "@import" not in page and "<iframe" not in page


def test_plan_report_shows_every_layout_and_its_numbers(plan):
    page = plan_report_html(plan)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for element in ('id="layouts-table"', 'id="memory-chart"', 'id="time-chart"', 'id="placement-table"'):
        assert element in page
    assert 'id="why-lost"' in page and 'class="capacity-line"' in page
    assert len(plan.layouts) == 5
    for p in plan.layouts:
        pred = p.prediction
        assert f"{pred.mfu * 100:.1f}%" in page
        assert f"{pred.tokens_per_s_per_gpu:,.0f}" in page
        assert f"{pred.memory_per_gpu_bytes / 1e9:,.1f} GB" in page
        assert html.escape(p.layout.short()) in page or p.rank == 1  # runners-up are named in "why they lost"
    # one memory segment per non-zero kind of every layout; one bar per time term
    segments = sum(v > 0 for p in plan.layouts for v in p.prediction.memory.values())
    assert page.count('class="bar seg-') >= segments
    assert f"{plan.layouts[0].prediction.memory_capacity_bytes / 1e9:.1f} GB" in page
    assert "slower" in page  # why_it_lost lines


def test_plan_report_is_deterministic_self_contained_and_offline(plan):
    topo = resolve_cluster(CLUSTER)
    first, second = plan_report_html(plan, topo), plan_report_html(plan, topo)
    assert first == second
    assert "<style>" in first and "<svg" in first
    _assert_offline(first)
    assert "network (leaf)" in first or "NVLink (NVSwitch)" in first  # level names from the topology


def test_plan_report_escapes_text(plan):
    hostile = plan.model_copy(
        update={"model": plan.model.model_copy(update={"name": "<script>alert(1)</script>"}), "topology_name": "a&b"}
    )
    page = plan_report_html(hostile)
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a&amp;b" in page


def test_infeasible_plan_shows_the_diagnosis(infeasible):
    assert infeasible.status == "infeasible" and not infeasible.layouts and infeasible.diagnosis
    page = plan_report_html(infeasible)
    assert 'id="diagnosis"' in page
    assert html.escape(infeasible.diagnosis) in page
    assert 'id="memory-chart"' not in page
    _assert_offline(page)


def test_topology_of_another_size_is_refused(plan):
    with pytest.raises(OptlayoutError, match="topology has 8 GPUs"):
        plan_report_html(plan, resolve_cluster("gpu=h100-sxm,gpus=8"))


def test_placement_follows_megatron_rank_order():
    # tp=2, cp=2, dp=2, pp=2 on 16 GPUs, 8 per server: strides 1, 2, 4, 8
    dims = {d.dim: d for d in placement(Layout(tp=2, cp=2, dp=2, pp=2, grad_accum=2), 8)}
    assert [dims[k].stride for k in ("tp", "cp", "dp", "pp")] == [1, 2, 4, 8]
    assert dims["tp"].example == (0, 1) and dims["tp"].on_scale_up and dims["tp"].servers == 1
    assert dims["dp"].example == (0, 4) and dims["dp"].on_scale_up
    assert dims["pp"].example == (0, 8) and not dims["pp"].on_scale_up and dims["pp"].servers == 2
    assert "NVLink" in dims["tp"].level and "network" in dims["pp"].level
    # DP after TP=2 spans both servers; with the topology the level and bandwidth come from its graph
    topo = resolve_cluster(CLUSTER)
    dims = {d.dim: d for d in placement(Layout(tp=2, dp=8), 8, topo)}
    assert dims["tp"].level == "NVLink (NVSwitch), inside one server" and dims["tp"].bandwidth_Bps
    assert dims["dp"].level == "network (leaf), across 2 servers" and dims["dp"].bandwidth_Bps
    assert dims["pp"].level == "not split" and dims["cp"].size == 1


def test_compare_report_text(compare_result):
    page = compare_report_html(compare_result)
    for element in ('id="scatter"', 'class="identity"', 'id="error-chart"', 'id="runs-table"', 'id="summary"'):
        assert element in page
    for run in compare_result["runs"]:
        assert run["id"] in page
        assert f"{run['measured_tokens_per_s_per_gpu']:,.0f}" in page
        assert f"{run['ape'] * 100:.1f}%" in page
    assert page.count('class="point"') == len(compare_result["runs"])
    assert "measured tokens/s per GPU" in page and "predicted tokens/s per GPU" in page  # axis labels
    assert f"{compare_result['summary']['mape'] * 100:.1f}%" in page and "50.0% of 4 pairs" in page
    # groups with more than one run, sorted by name: 70b then 8b; the single 405b run has no order chart
    assert 'id="order-chart-1"' in page and 'id="order-chart-2"' in page and 'id="order-chart-3"' not in page
    assert "paper-8b-c: measured #3, predicted #2" in page
    assert "mlperf-8b-b: measured #2, predicted #3" in page
    assert "blog-70b-a: measured #1, predicted #2" in page
    assert "2 of 3 pairs in the measured order" in page and "0 of 1 pairs in the measured order" in page
    assert "micro_batch=1, recompute=none" in page  # the filled-in fields
    assert compare_report_html(copy.deepcopy(compare_result)) == page
    _assert_offline(page)


def test_compare_report_escapes_and_survives_empty_input(compare_result):
    compare_result["runs"][0]["id"] = '<img src=x onerror="boom">'
    compare_result["runs"][0]["source"] = "a&b"
    page = compare_report_html(compare_result)
    assert "<img src=x" not in page and "&lt;img src=x onerror=&quot;boom&quot;&gt;" in page
    assert "a&amp;b" in page
    empty = compare_report_html({"runs": [], "summary": {"n": 0}})
    assert 'id="no-runs"' in empty
    with pytest.raises(OptlayoutError):
        compare_report_html([])  # type: ignore[arg-type]


def test_compare_report_scales_to_many_runs(compare_result):
    base = compare_result["runs"][0]
    runs = [
        {**base, "id": f"run-{i:03d}", "group": f"g{i}", "measured_tokens_per_s_per_gpu": 1000.0 + i} for i in range(60)
    ]
    page = compare_report_html({"runs": runs, "summary": {"n": 60, "pairwise_order_accuracy": None, "pairs": 0}})
    assert page.count('class="point"') == 60
    error_chart = page[page.index('id="error-chart"') : page.index("</svg>", page.index('id="error-chart"'))]
    assert error_chart.count('class="bar"') == 40  # the largest errors; the table lists all 60
    assert "n/a (no group has two layouts)" in page and 'id="order-none"' in page


def test_competition_ranks():
    assert competition_ranks([5.0, 7.0, 7.0, 1.0]) == [3, 1, 1, 4]


def test_write_report(tmp_path, plan):
    target = tmp_path / "plan.html"
    write_report(plan_report_html(plan), target)
    assert target.read_text(encoding="utf-8") == plan_report_html(plan)
    with pytest.raises(OptlayoutError, match="report: cannot write"):
        write_report("x", tmp_path / "missing" / "plan.html")


# ---------------------------------------------------------------------------------------------- browser

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,2000",
)


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("CI", "") != "":
        pytest.fail("chromium is not installed but CI is set: the report rendering test must run in CI")
    pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")


def _chromium(exe: str, page: Path, profile: Path, *args: str) -> str:
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"chromium did not run: {exc}")
    if proc.returncode != 0:
        pytest.fail(f"chromium exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc.stdout


def render(exe: str, page_html: str, tmp_path: Path, name: str) -> tuple[Path, dict, np.ndarray]:
    """Screenshot the page and read the sizes its probe script measured; returns (png, probe, pixels)."""
    page = tmp_path / f"{name}.html"
    write_report(page_html, page)
    png = tmp_path / f"{name}.png"
    _chromium(exe, page, tmp_path / f"{name}-shot-profile", f"--screenshot={png}")
    if not png.is_file():
        pytest.fail(f"chromium wrote no screenshot {png}")
    dom = _chromium(exe, page, tmp_path / f"{name}-dom-profile", "--dump-dom")
    found = re.search(r'<pre id="layout-probe"[^>]*>(.*?)</pre>', dom, re.DOTALL)
    assert found, "the dumped DOM has no layout probe"
    assert found.group(1).strip(), "the probe script did not run"
    probe = json.loads(html.unescape(found.group(1)))
    assert png.stat().st_size > 10_000, "the screenshot is suspiciously small"
    pixels = png_rgb(png)
    assert pixels.shape[:2] == (2000, 1400)
    assert len(np.unique(pixels.reshape(-1, 3)[::7], axis=0)) > 20, "the screenshot is nearly one colour"
    return png, probe, pixels


def _sized(probe: dict, element: str, min_marks: int = 0) -> None:
    assert element in probe, f"{element} missing from the rendered page: {sorted(probe)}"
    box = probe[element]
    assert box["width"] > 0 and box["height"] > 0, f"{element} rendered with no size: {box}"
    assert box["marks"] >= min_marks, f"{element}: {box['marks']} marks drawn, expected at least {min_marks}"


def _count(pixels: np.ndarray, rgb: tuple[int, int, int]) -> int:
    return int((pixels == np.array(rgb, dtype=np.uint8)).all(axis=2).sum())


def test_plan_report_renders_in_chromium(chromium, plan, tmp_path):
    _png, probe, pixels = render(chromium, plan_report_html(plan, resolve_cluster(CLUSTER)), tmp_path, "plan")
    n = len(plan.layouts)
    segments = sum(v > 0 for p in plan.layouts for v in p.prediction.memory.values())
    _sized(probe, "memory-chart", segments)
    _sized(probe, "time-chart", n)
    _sized(probe, "placement-chart", plan.gpus)
    _sized(probe, "layouts-table")
    _sized(probe, "placement-table")
    assert probe["memory-chart"]["width"] > 500 and probe["memory-chart"]["height"] > 100
    assert _count(pixels, WEIGHTS_RGB) > 2000, "the memory chart's weight segments were not painted"


def test_infeasible_report_renders_in_chromium(chromium, infeasible, tmp_path):
    _png, probe, _pixels = render(chromium, plan_report_html(infeasible), tmp_path, "infeasible")
    _sized(probe, "diagnosis")
    assert probe["diagnosis"]["height"] > 20


def test_compare_report_renders_in_chromium(chromium, compare_result, tmp_path):
    _png, probe, pixels = render(chromium, compare_report_html(compare_result), tmp_path, "compare")
    runs = len(compare_result["runs"])
    _sized(probe, "scatter", runs)
    _sized(probe, "error-chart", runs)
    _sized(probe, "runs-table")
    _sized(probe, "order-chart-1", 2)
    _sized(probe, "order-chart-2", 3)
    assert probe["scatter"]["width"] > 400 and probe["scatter"]["height"] > 400
    assert _count(pixels, WEIGHTS_RGB) > 500, "the error bars of the first source were not painted"


# ---------------------------------------------------------------------------------------------- png


def png_rgb(path: Path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes) into an (h, w, 3) array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    assert header is not None, "PNG without IHDR"
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = int(raw[y, 0]), raw[y, 1:]
        if kind == 0:
            cur = line.copy()
        elif kind == 1:  # Sub: running sum per channel
            cur = (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint32) % 256).astype(np.uint8).ravel()
        elif kind == 2:  # Up
            cur = line + prev
        else:  # Average, Paeth: sequential along the row
            row, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b = up[i]
                if kind == 3:
                    row[i] = (row[i] + ((a + b) >> 1)) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(row), dtype=np.uint8)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]
