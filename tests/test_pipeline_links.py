"""Pipeline send/receive priced on every stage boundary's own link: only the network changes between two clusters.

Four 8-GPU H100 servers with 400 Gb/s or 10 Gb/s NICs per GPU (issue 13's reproducer). With tp 4 and no CP or
DP a stage holds 4 GPUs, so stage boundaries 0|1, 2|3, 4|5, 6|7 stay on NVSwitch and 1|2, 3|4, 5|6 cross the
network. Reading one pair of ranks tp*cp*dp apart per pair of stages, (0, 4), (8, 12), ..., saw only the first
kind, and priced the pipeline alike on both clusters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from optlayout import estimate_layout, solve
from optlayout.cost import DEFAULT_PARAMS, group_links
from optlayout.presets import model_preset
from optlayout.specs import JobSpec, Layout
from optlayout.topology import Topology, topology_from_dict
from tests.conftest import run_main

MODEL = model_preset("llama3.1-70b")
JOB = JobSpec(seq_len=4096, global_batch=64)
LAYOUT = Layout(tp=4, pp=8, dp=1, micro_batch=1, grad_accum=64)
BLIND_SPOT = Layout(tp=2, pp=8, vp=5, cp=2, dp=1, micro_batch=1, grad_accum=64, sharding="zero1",
                    sequence_parallel=True)  # fmt: skip


def cluster(gbps: float) -> dict:
    return {"name": f"4x8-h100-{gbps:g}g", "gpu": "h100-sxm", "servers": 4, "gpus_per_server": 8,
            "scale_up": {"kind": "nvswitch"}, "nics": {"per_server": 8, "gbps": gbps},
            "fabric": {"kind": "rail", "servers_per_leaf": 32}}  # fmt: skip


def topo(gbps: float) -> Topology:
    return topology_from_dict(cluster(gbps))


def test_boundaries_on_their_own_links() -> None:
    links = group_links(topo(10), LAYOUT)
    assert [b.bandwidth_Bps for b in links.pp_fill] == [450e9, 1.25e9] * 3 + [450e9]
    assert links.pp.bandwidth_Bps == 1.25e9  # the slowest sets the pace
    interleaved = group_links(topo(400), Layout(tp=8, pp=4, vp=2, grad_accum=8))  # stages = servers
    assert interleaved.pp.bandwidth_Bps == 50e9 and len(interleaved.pp_fill) == 3


@pytest.mark.parametrize("gbps", [400, 10])
def test_pipeline_time_by_hand(gbps: float) -> None:
    """Message: one micro-batch's activation, 4,096 x 8,192 x 2 B = 67.1 MB (no sequence parallelism).
    Per message: bytes / (link x 0.85 collective efficiency) + latency (NVSwitch: 2 hops of 0.5 us; network:
    2 x (1 us to the NIC + 0.5 us to the leaf)). Steady state, 1F1B (blocking exchanges): 64 micro-batches x 2
    messages on the network boundary; warm-up and cool-down: 2 messages over each of the 4 NVSwitch and 3
    network boundaries."""
    msg = 2.0 * 4096 * 8192
    net = msg / (gbps / 8 * 1e9 * 0.85) + 3e-6
    nvswitch = msg / (450e9 * 0.85) + 1e-6
    expected = 64 * 2 * net + 2 * (4 * nvswitch + 3 * net)
    pred = estimate_layout(MODEL, topo(gbps), JOB, LAYOUT, DEFAULT_PARAMS)
    assert pred.time["pp_comm_s"] == pytest.approx(expected, rel=1e-9)


def test_interleaved_sends_hide_under_a_chunk() -> None:
    """vp 2 on the 400 Gb/s cluster: a 67.1 MB message takes 1.6 ms on the network, far less than a chunk (5 of
    the 80 layers' forward of 4,096 tokens of Llama 3.1 70B), so the steady state exposes nothing; the warm-up
    and cool-down still cross every boundary (4 on NVSwitch, 3 on the network)."""
    layout = LAYOUT.model_copy(update={"vp": 2})
    msg = 2.0 * 4096 * 8192
    fill = 2 * (4 * (msg / (450e9 * 0.85) + 1e-6) + 3 * (msg / (50e9 * 0.85) + 3e-6))
    pred = estimate_layout(MODEL, topo(400), JOB, layout, DEFAULT_PARAMS)
    assert pred.time["pp_comm_s"] == pytest.approx(fill, rel=1e-9)


def test_estimate_differs_when_only_the_network_does(capsys, monkeypatch, tmp_path: Path) -> None:
    figures = {}
    for gbps in (400, 10):
        path = tmp_path / f"c{gbps}.yaml"
        path.write_text(yaml.safe_dump(cluster(gbps)))
        code, out, err = run_main(capsys, monkeypatch, "estimate", "--model", "llama3.1-70b", "--topology",
                                  str(path), "--seq-len", "4096", "--global-batch", "64", "--layout",
                                  "tp=4,pp=8,dp=1,mb=1,ga=64", "--json")  # fmt: skip
        assert code == 0, err
        figures[gbps] = json.loads(out)["prediction"]
    assert figures[10]["time"]["pp_comm_s"] > 30 * figures[400]["time"]["pp_comm_s"]
    assert figures[10]["tokens_per_s_per_gpu"] < figures[400]["tokens_per_s_per_gpu"]
    assert figures[10]["time"]["compute_s"] == figures[400]["time"]["compute_s"]


def test_solve_on_the_slow_network_leaves_the_blind_spot() -> None:
    """Before, the 10 Gb/s cluster's optimum was tp 2, pp 8, vp 5, cp 2 (stages of 4 GPUs, half the boundaries
    and the interleaved wrap on 10 Gb/s NICs, priced as NVSwitch). Priced on its links it loses to the pick."""
    slow, fast = topo(10), topo(400)
    plan = solve(MODEL, slow, JOB, top=5)
    pick = plan.best.layout
    assert all(p.layout.model_dump() != BLIND_SPOT.model_dump() for p in plan.layouts)
    blind_slow = estimate_layout(MODEL, slow, JOB, BLIND_SPOT)
    blind_fast = estimate_layout(MODEL, fast, JOB, BLIND_SPOT)
    assert blind_slow.tokens_per_s_per_gpu < plan.best.prediction.tokens_per_s_per_gpu
    assert blind_slow.time["pp_comm_s"] > 30 * blind_fast.time["pp_comm_s"]
    assert pick.pp == 1 or group_links(slow, pick).pp.bandwidth_Bps == 1.25e9  # its stages sit one per server
