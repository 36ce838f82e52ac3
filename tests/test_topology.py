"""Topology graph: figures derived by hand in the comments, every shipped file, bad input, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from optlayout.cli import topology as topology_cli
from optlayout.errors import OptlayoutError
from optlayout.specs import ClusterSpec
from optlayout.topology import (
    Topology,
    load_topology,
    ordered_gpu_nodes,
    parse_cluster_shorthand,
    resolve_cluster,
    topology_from_cluster,
    topology_from_dict,
)

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "topologies"
SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))
GB = 1e9


def shipped(name: str) -> Topology:
    return load_topology(TOPOLOGIES / f"{name}.yaml")


# ---------------------------------------------------------------------------------------------- figures


def test_tp8_on_one_dgx_h100_gets_nvswitch_bandwidth():
    # NVLink4 900 GB/s bidirectional -> 450 GB/s per direction per GPU, the GPU's link to the NVSwitch.
    topo = shipped("dgx-h100")
    assert topo.group_bandwidth_Bps(range(8)) == 450e9
    assert topo.dim_bandwidth_Bps(8, 1) == 450e9
    assert topo.group_latency_s(range(8)) == pytest.approx(1e-6)  # 2 hops of 0.5 us through the switch


def test_dp_across_servers_on_ndr400_gets_one_nic():
    # Stride 8 = one GPU per server; each GPU owns one 400 Gb/s NIC = 400e9 / 8 = 50e9 bytes/s.
    topo = shipped("worked-example-256x80gb")
    assert topo.group_bandwidth_Bps(range(0, 256, 8)) == 50e9
    assert topo.dim_bandwidth_Bps(32, 8) == 50e9


def test_two_full_servers_get_min_of_nvlink_and_their_nics():
    # 16 ranks = 2 servers x 8 GPUs: NCCL runs a ring per NIC, so each GPU moves data at
    # min(450e9 NVLink, 8 NICs x 50e9) = 400e9; 2 GPUs per server (stride 4) own 2 NICs: 100e9.
    topo = shipped("worked-example-256x80gb")
    assert topo.group_bandwidth_Bps(range(16)) == 400e9
    assert topo.group_bandwidth_Bps([0, 4, 8, 12]) == 100e9
    assert topo.group_latency_s(range(16)) == pytest.approx(3e-6)  # 2 x (GPU->NIC 1 us + NIC->leaf 0.5 us)


def test_roce_2_to_1_halves_traffic_that_leaves_a_leaf():
    # 200 Gb/s per GPU = 25e9 bytes/s; 8 servers per leaf. Servers 0 and 1 share leaf0: 25e9.
    # Servers 0 and 8 sit on different leaves: 25e9 / 2 (2:1 leaf->spine) = 12.5e9.
    topo = shipped("roce-1600g")
    assert topo.group_bandwidth_Bps([0, 8]) == 25e9
    assert topo.group_bandwidth_Bps([0, 64]) == 12.5e9
    assert topo.dim_bandwidth_Bps(32, 8) == 12.5e9  # DP over all 32 servers crosses leaves
    assert topo.group_latency_s([0, 64]) > topo.group_latency_s([0, 8])


def test_mi300x_mesh_sums_direct_links_to_group_members():
    # 7 Infinity Fabric links of 64 GB/s per direction; a group of n uses n-1 of them.
    topo = shipped("mi300x")
    assert topo.group_bandwidth_Bps(range(8)) == 7 * 64e9
    assert topo.group_bandwidth_Bps(range(4)) == 3 * 64e9
    assert topo.group_bandwidth_Bps([0, 1]) == 64e9
    assert topo.scale_up_kinds == ["mesh"]
    assert topo.bisection_bandwidth_Bps() == 32 * 8 / 2 * 50e9  # 256 GPUs x 400G, non-blocking


def test_pcie_box_gets_pcie_figure_and_less_across_sockets():
    # 2 sockets x 2 PCIe switches x 2 GPUs; Gen4 x16 links at 25 GB/s; socket link 16 GB/s.
    topo = shipped("pcie-a100-8x")
    assert topo.domain_size == 8 and topo.scale_up_kinds == ["pcie"]
    assert topo.group_bandwidth_Bps([0, 1]) == 25e9  # same switch
    assert topo.group_bandwidth_Bps([0, 1, 2, 3]) == 25e9  # two switches, one socket: uplinks at 25
    assert topo.group_bandwidth_Bps(range(8)) == 16e9  # the ring crosses the socket link
    # 4 HDR NICs of 25e9 per server, one per switch, shared by its two GPUs: 12.5e9 per GPU.
    assert topo.group_bandwidth_Bps([0, 8]) == 12.5e9


def test_gb200_nvl72_group_of_64_over_16_servers_stays_on_nvlink():
    # 72-GPU domain = 18 trays x 4 GPUs; ranks 0..63 span trays 0..15, one domain: 900 GB/s (NVLink5).
    topo = shipped("gb200-nvl72")
    assert topo.domain_size == 72 and topo.gpus_per_server == 4
    assert {topo.server_of(r) for r in range(64)} == set(range(16))
    assert topo.group_bandwidth_Bps(range(64)) == 900e9
    assert topo.domain_of(0) == topo.domain_of(71) != topo.domain_of(72)
    # Across two racks each GPU owns one 800 Gb/s NIC = 100e9 bytes/s.
    assert topo.group_bandwidth_Bps([0, 72]) == 100e9
    assert topo.dim_bandwidth_Bps(8, 72) == 100e9


def test_bisection_of_non_blocking_fat_tree_is_half_the_gpus_times_nic():
    # N GPUs x 50 GB/s, non-blocking: N/2 x 50e9.
    assert shipped("worked-example-256x80gb").bisection_bandwidth_Bps() == 256 / 2 * 50e9
    assert shipped("dgx-h100").bisection_bandwidth_Bps() == 1024 / 2 * 50e9
    big = resolve_cluster("gpu=h100-sxm,gpus=16384,gpus_per_node=8")
    assert big.bisection_bandwidth_Bps() == 16384 / 2 * 50e9
    # 2:1 oversubscribed: the spine carries half -> N/2 x 25e9 / 2.
    assert shipped("roce-1600g").bisection_bandwidth_Bps() == 256 / 2 * 25e9 / 2
    # One server: the NVSwitch, 4 GPUs x 450e9 each way.
    assert topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=8)).bisection_bandwidth_Bps() == 4 * 450e9


def test_nic_shared_by_two_gpus_halves_the_share():
    # 4 NICs of 400G for 8 GPUs: each GPU owns half a NIC = 25e9; a whole server's ring pool = 4 x 50e9.
    topo = topology_from_dict({"gpu": "h100-sxm", "servers": 4, "gpus_per_server": 8, "nics": {"per_server": 4}})
    assert topo.dim_bandwidth_Bps(4, 8) == 25e9
    assert topo.group_bandwidth_Bps(range(16)) == 200e9


def test_nvlink_domain_smaller_than_server():
    # Shorthand nvlink_domain=4 on 8-GPU nodes: a TP4 stays on NVLink, a TP8 goes through the NICs,
    # each domain's 4 GPUs pooling their 4 x 50e9 NICs = 200e9; one GPU per domain (stride 4) gets 50e9.
    topo = resolve_cluster(ClusterSpec(gpu="h100-sxm", gpus=16, nvlink_domain=4))
    assert topo.domain_size == 4 and topo.num_domains == 4
    assert topo.dim_bandwidth_Bps(4, 1) == 450e9
    assert topo.dim_bandwidth_Bps(8, 1) == 200e9
    assert topo.dim_bandwidth_Bps(4, 4) == 50e9


def test_oversubscribed_shorthand_and_levels():
    topo = resolve_cluster(ClusterSpec(gpu="h100-sxm", gpus=1024, oversubscription=2))
    levels = {lv["level"]: lv for lv in topo.levels()}
    assert list(levels) == ["scale-up", "leaf", "spine"]
    assert levels["scale-up"]["bandwidth_Bps"] == 450e9 and levels["scale-up"]["gpus"] == 8
    assert levels["leaf"]["bandwidth_Bps"] == 50e9 and levels["leaf"]["gpus"] == 256  # 32 servers per SU
    assert levels["spine"]["bandwidth_Bps"] == 25e9 and levels["spine"]["oversubscription"] == 2
    assert levels["spine"]["latency_s"] > levels["leaf"]["latency_s"] > levels["scale-up"]["latency_s"]


def test_single_rank_and_rank_helpers():
    topo = shipped("worked-example-256x80gb")
    assert topo.group_bandwidth_Bps([5]) == math.inf and topo.group_latency_s([5]) == 0.0
    assert topo.dim_bandwidth_Bps(1, 1) == math.inf
    assert topo.gpu_node(9) == "s1/gpu1" and topo.server_of(9) == 1
    assert topo.graph.nodes[topo.gpu_node(9)]["kind"] == "gpu"
    with pytest.raises(OptlayoutError, match="rank: 256"):
        topo.gpu_node(256)
    with pytest.raises(OptlayoutError, match="twice"):
        topo.group_bandwidth_Bps([1, 1])
    with pytest.raises(OptlayoutError, match="exceeds"):
        topo.dim_bandwidth_Bps(64, 8)


def test_pipeline_pair_and_group_order_do_not_matter():
    topo = shipped("dgx-h100")
    assert topo.dim_bandwidth_Bps(2, 512) == 50e9  # stage pairs 512 ranks apart: different SUs, spine
    assert topo.group_bandwidth_Bps([300, 4, 17]) == topo.group_bandwidth_Bps([4, 17, 300])


def test_dim_reads_every_group_and_caches(monkeypatch: pytest.MonkeyPatch):
    shorthand = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16384))
    graph = shorthand.graph
    topo = Topology("from its graph", shorthand.gpu, graph, ordered_gpu_nodes(graph))  # no period known
    calls: list[tuple[int, ...]] = []
    original = Topology._worst_group

    def counting(self: Topology, rows: Any) -> tuple[float, float]:
        calls.append(rows.shape)
        return original(self, rows)

    monkeypatch.setattr(Topology, "_worst_group", counting)
    assert topo.dim_bandwidth_Bps(2, 4096) == 50e9  # 8,192 groups in the world, all read at once
    assert calls == [(8192, 2)]
    topo.dim_bandwidth_Bps(2, 4096)
    assert calls == [(8192, 2)]  # cached
    # The shorthand's tables repeat every pod of 32 servers (256 GPUs): the 4,096 groups of ranks i and i + 4096
    # (i < 4096) are the other 4,096 shifted by 8,192 ranks, a multiple of 256: alike, read once.
    shorthand._dims.clear()
    assert shorthand.dim_bandwidth_Bps(2, 4096) == 50e9
    assert calls[1:] == [(4096, 2)]
    shorthand._dims.clear()
    assert shorthand.dim_bandwidth_Bps(8, 1) == topo.dim_bandwidth_Bps(8, 1)
    assert calls[2:] == [(32, 8), (2048, 8)]  # one pod's 32 tp groups against all 2,048


def test_dim_finds_tp_groups_straddling_an_nvl72_edge():
    # tp 16 in 72-GPU NVLink domains: the group of ranks 64..79 holds 8 GPUs of each of the first two domains,
    # joined by their NICs: 8 x 400 Gb/s = 400 GB/s per GPU (one ring per NIC), below NVLink5's 900 GB/s.
    # A sample of 64 of the 144 groups (the reading before) picked none of the 16 straddling ones.
    topo = topology_from_cluster(ClusterSpec(gpu="gb200", gpus=2304, gpus_per_node=4, nvlink_domain=72))
    assert topo.group_bandwidth_Bps(range(64, 80)) == 400e9
    assert topo.dim_bandwidth_Bps(16, 1) == 400e9
    assert topo.dim_bandwidth_Bps(8, 1) == 900e9  # 72 / 8: every tp 8 group inside one domain


def test_dim_matches_reading_group_by_group():
    """The vectorized reading equals `_group` over every group, on files with mesh, PCIe, oversubscribed and
    uneven (NVL72) structure."""
    for topo in (shipped("mi300x"), shipped("pcie-a100-8x"), shipped("gb200-nvl72"),
                 topology_from_cluster(ClusterSpec(gpu="gb200", gpus=720, gpus_per_node=4, nvlink_domain=72,
                                                   oversubscription=2))):  # fmt: skip
        n = topo.num_gpus
        for size, stride in ((2, 1), (8, 1), (16, 1), (2, 8), (4, 5), (n // 8, 8), (2, n // 2)):
            if n % (size * stride):
                continue
            span, groups = size * stride, n // (size * stride) * stride
            worst = [topo._group(np.array([(g // stride) * span + g % stride + i * stride for i in range(size)]))
                     for g in range(groups)]  # fmt: skip
            assert topo._evaluate_dim(size, stride) == (min(b for b, _ in worst), max(l_ for _, l_ in worst))


def test_stage_boundaries_are_read_one_by_one():
    # Four 8-GPU servers, stages of 4 GPUs: boundary 0|1 (ranks 0-3 -> 4-7) stays on NVSwitch, 1|2 (4-7 -> 8-11)
    # crosses servers, each GPU on its own 400 Gb/s NIC = 50 GB/s. The old pair sample (0, 4), (8, 12), ...
    # read only the first kind.
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=32))
    assert topo.pairs_link(0, 4, 4)[0] == 450e9
    assert topo.pairs_link(4, 8, 4)[0] == 50e9
    assert topo.pairs_link(28, 0, 4)[0] == 50e9  # the interleaved wrap, last stage -> first
    assert topo.pairs_link(4, 8, 4) == topo._group(np.array([4, 8]))
    with pytest.raises(OptlayoutError, match="pairs"):
        topo.pairs_link(30, 0, 4)


def test_dim_finds_the_slow_server_at_the_end():
    # The explicit last server has a 100G NIC on GPU 3; the sampled groups include the last one.
    doc = yaml.safe_load((TOPOLOGIES / "example-explicit.yaml").read_text())
    for edge in doc["edges"]:
        if "b/nic3" in (edge["a"], edge["b"]):
            edge.pop("gbps")
            edge["gbps"] = 100
    topo = topology_from_dict(doc)
    assert topo.dim_bandwidth_Bps(2, 4) == 12.5e9
    assert topo.group_bandwidth_Bps([0, 4]) == 50e9


def test_explicit_form_matches_generator_form():
    explicit = shipped("example-explicit")
    generated = topology_from_dict({"gpu": "h100-sxm", "servers": 2, "gpus_per_server": 4, "nics": {"gbps": 400}})
    for group in ([0, 1, 2, 3], [0, 4], list(range(8))):
        assert explicit.group_bandwidth_Bps(group) == generated.group_bandwidth_Bps(group)
        assert explicit.group_latency_s(group) == pytest.approx(generated.group_latency_s(group))
    assert explicit.gpu_node(4) == "b/gpu0" and explicit.domain_size == 4


def test_explicit_server_nodes_joined_by_an_external_nvswitch():
    # Two 4-GPU trays on one NVSwitch (an NVL8 domain) and one leaf: a group of 8 stays on NVLink.
    doc = {
        "gpu": "gb200",
        "server_template": {"gpus_per_server": 4, "scale_up": {"kind": "none"}, "nics": {"gbps": 800}},
        "nodes": [
            {"id": "t0", "kind": "server"},
            {"id": "t1", "kind": "server"},
            {"id": "nvl", "kind": "nvswitch"},
            {"id": "leaf", "kind": "leaf"},
        ],
        "edges": [
            {"a": "t0", "b": "nvl"},
            {"a": "t1", "b": "nvl"},
            {"a": "t0", "b": "leaf"},
            {"a": "t1", "b": "leaf"},
        ],
    }
    topo = topology_from_dict(doc)
    assert topo.num_gpus == 8 and topo.domain_size == 8 and topo.num_servers == 2
    assert topo.group_bandwidth_Bps(range(8)) == 900e9


def test_shorthand_graph_is_lean_with_real_nodes():
    topo = resolve_cluster("gpu=h100-sxm,gpus=16384,gpus_per_node=8")
    assert isinstance(topo.graph, nx.Graph)
    kinds: dict[str, int] = {}
    for _, kind in topo.graph.nodes(data="kind"):
        kinds[kind] = kinds.get(kind, 0) + 1
    # 2,048 servers; 64 SUs of 32 servers x 8 rails = 512 leaves; 8 aggregated spines.
    assert kinds == {"gpu": 16384, "nic": 16384, "nvswitch": 2048, "leaf": 512, "spine": 8}
    # GPU-NVSwitch + GPU-NIC + NIC-leaf per GPU, leaf-spine per leaf and spine: no per-pair edges.
    assert topo.graph.number_of_edges() == 3 * 16384 + 512 * 8
    edge = topo.graph.edges["s0/gpu0", "s0/nic0"]
    assert edge["bandwidth_Bps"] == 50e9 and edge["latency_s"] > 0


def test_16384_gpus_build_and_answer():
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16384, gpus_per_node=8, nvlink_domain=8))
    assert topo.dim_bandwidth_Bps(2048, 8) == 50e9  # one 400 Gb/s NIC per GPU across servers


def test_131072_gpus_build_and_answer():
    # Build and query times are measured in benchmarks/solve_speed.py, not asserted here.
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=131072, gpus_per_node=8))
    assert topo.num_gpus == 131072 and topo.num_servers == 16384
    assert topo.dim_bandwidth_Bps(16384, 8) == 50e9
    assert topo.dim_bandwidth_Bps(8, 1) == 450e9


# ---------------------------------------------------------------------------------------------- shipped files


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_file_loads(path: Path):
    topo = load_topology(path)
    doc = yaml.safe_load(path.read_text())
    assert topo.name == path.stem
    if "servers" in doc:
        assert topo.num_gpus == doc["servers"] * doc["gpus_per_server"]
    assert topo.levels() and topo.bisection_bandwidth_Bps() > 0
    assert path.read_text().startswith("#")  # a comment with the sizes and sources


def test_shipped_set_is_complete():
    names = {p.stem for p in SHIPPED}
    assert {
        "dgx-a100",
        "dgx-h100",
        "dgx-h200",
        "dgx-b200",
        "gb200-nvl72",
        "mi300x",
        "pcie-a100-8x",
        "roce-1600g",
        "worked-example-256x80gb",
    } <= names
    worked = shipped("worked-example-256x80gb")
    assert (worked.num_gpus, worked.num_servers, worked.gpus_per_server, worked.gpu.name) == (256, 32, 8, "h100-sxm")
    assert shipped("dgx-a100").group_bandwidth_Bps([0, 8]) == 25e9  # HDR 200
    assert shipped("dgx-b200").group_bandwidth_Bps(range(8)) == 900e9  # NVLink5


# ---------------------------------------------------------------------------------------------- bad input

GOOD: dict[str, Any] = {"gpu": "h100-sxm", "servers": 2, "gpus_per_server": 8}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"gpu": "h900"}, "gpu: unknown preset 'h900'"),
        ({"nics": {"gbps": -400}}, "nics.gbps: Input should be greater than or equal to 0.0008 (got -400)"),
        ({"fabric": {"kind": "torus"}}, "fabric.kind: Input should be 'rail' or 'fat-tree' (got 'torus')"),
        ({"scale_up": {"kind": "ring"}}, "scale_up.kind"),
        ({"servers": 0}, "servers: Input should be greater than or equal to 1 (got 0)"),
        ({"scale_up": {"domain_size": 3}}, "scale_up.domain_size: 3"),
        ({"nics": {"per_server": 3}}, "nics.per_server: 3"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"fabric": {"oversubscription": 0.5}}, "fabric.oversubscription"),
    ],
)
def test_bad_generator_fields_name_the_field(change: dict[str, Any], expected: str):
    with pytest.raises(OptlayoutError) as info:
        topology_from_dict({**GOOD, **change})
    assert expected in str(info.value) and "\n" not in str(info.value)


def _explicit(**over: Any) -> dict[str, Any]:
    doc = yaml.safe_load((TOPOLOGIES / "example-explicit.yaml").read_text())
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (_explicit(edges=[{"a": "a/gpu0", "b": "nowhere", "gbps": 400}]), "edges[0].b: unknown node 'nowhere'"),
        (_explicit(edges=[{"a": "a/gpu0", "b": "a/nvswitch"}]), "edges[0]: bandwidth missing"),
        (_explicit(edges=[{"a": "a/gpu0", "b": "a/nvswitch", "gbps": -1}]), "edges.0.gbps: Input should be greater"),
        (_explicit(nodes=[{"id": "g", "kind": "gpu"}]), "nodes[0].server: required for gpu nodes"),
        (_explicit(nodes=[{"id": "g", "kind": "router"}]), "nodes.0.kind"),
        (_explicit(nodes=[{"id": "x", "kind": "server"}]), "server_template: required"),
        ({**_explicit(), "servers": 3}, "not both"),
        ({"gpu": "h100-sxm"}, "missing field 'servers'"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_explicit_fields_name_the_field(doc: Any, expected: str):
    with pytest.raises(OptlayoutError) as info:
        topology_from_dict(doc)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_disconnected_servers_are_refused():
    doc = _explicit()
    doc["edges"] = [e for e in doc["edges"] if not (str(e["a"]).startswith("b/nic") and e["b"] == "leaf0")]
    with pytest.raises(OptlayoutError, match="no path to a NIC"):
        topology_from_dict(doc)


def test_show_of_an_irregular_explicit_topology_names_the_smaller_domains_and_the_slowest_link(cli, tmp_path):
    doc = _explicit()
    doc["edges"] = [e for e in doc["edges"] if (e["a"], e["b"]) != ("a/gpu0", "a/nvswitch")]
    s = topology_from_dict(doc).summary()
    assert (s["domains"], s["domain_size"], s["largest_domain_size"]) == (3, 1, 4)
    assert s["smaller_domains"] == ["a/gpu0 (1 GPU, none)", "a/gpu1, a/gpu2, a/gpu3 (3 GPUs, nvswitch)"]
    path = tmp_path / "nonvl.yaml"
    path.write_text(yaml.safe_dump(doc))
    shown = " ".join(cli("topology", "show", str(path)).stdout.split())
    assert "3 scale-up domain(s) of 1 to 4 GPUs (none, nvswitch)" in shown
    assert "irregular: 2 domain(s) smaller than 4 GPUs: a/gpu0 (1 GPU, none); a/gpu1, a/gpu2, a/gpu3" in shown
    assert "within 1 GPU" in shown
    assert topology_from_dict(_explicit()).summary()["smaller_domains"] == []
    slow = _explicit()
    for edge in slow["edges"]:
        if edge["a"].startswith("b/gpu") and edge["b"] == "b/nvswitch":
            edge["gbytes_per_s"] = 10
    up = topology_from_dict(slow).levels()[0]
    assert (up["level"], up["gpus"], up["bandwidth_Bps"]) == ("scale-up", 4, 10e9)  # server b's links, not a's 450
    assert topology_from_dict(_explicit()).levels()[0]["bandwidth_Bps"] == 450e9


@pytest.mark.parametrize("text", ["", "  ", "h100-sxm"])
def test_cli_cluster_that_is_no_shorthand_is_named_as_such(cli, text: str) -> None:
    for args in (("topology", "show"), ("solve", "--model", "llama3.1-8b", "--seq-len", "4096", "--global-batch", "8")):
        out = cli(*args, "--cluster", text)
        assert out.returncode == 2 and out.stderr.strip() == (
            f"error: cluster: {text!r} is neither a cluster shorthand (gpu=...,gpus=..., e.g. gpu=h100-sxm,gpus=64) "
            "nor a topology file"
        ), out.stderr
    assert "no such file 'x.yaml'" in cli("topology", "show", "--cluster", "x.yaml").stderr  # a file name stays one


def test_file_errors(tmp_path: Path):
    with pytest.raises(OptlayoutError, match="topology: no such file"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: h100-sxm\nservers: [1, 2\n")
    with pytest.raises(OptlayoutError, match=r"topology bad.yaml: YAML syntax error at line \d+"):
        load_topology(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("gpu: h100-sxm\nservers: 2\ngpus_per_server: 8\nfabric: {kind: torus}\n")
    with pytest.raises(OptlayoutError, match=r"topology wrong.yaml: fabric.kind: .*'torus'"):
        load_topology(wrong)


def test_shorthand_parsing():
    spec = parse_cluster_shorthand("gpu=h100-sxm, gpus=64, gpus_per_node=8, oversubscription=2")
    assert spec == ClusterSpec(gpu="h100-sxm", gpus=64, gpus_per_node=8, oversubscription=2)
    with pytest.raises(OptlayoutError, match="unknown key 'nodes'"):
        parse_cluster_shorthand("gpu=h100-sxm,gpus=64,nodes=8")
    with pytest.raises(OptlayoutError, match="cluster: gpus: expected an integer, got 'lots'"):
        parse_cluster_shorthand("gpu=h100-sxm,gpus=lots")
    with pytest.raises(OptlayoutError, match="gpu: unknown preset 'z100'"):
        resolve_cluster("gpu=z100,gpus=8")
    small = resolve_cluster("gpu=h100-sxm,gpus=4")
    assert (small.num_gpus, small.num_servers, small.domain_size) == (4, 1, 4)
    nvl = resolve_cluster("gpu=gb200,gpus=144,gpus_per_node=4,nvlink_domain=72,inter_node_gbps_per_gpu=800")
    assert nvl.domain_size == 72 and nvl.dim_bandwidth_Bps(2, 72) == 100e9


def test_resolve_cluster_accepts_every_form():
    topo = shipped("dgx-b200")
    assert resolve_cluster(topo) is topo
    assert resolve_cluster(TOPOLOGIES / "dgx-b200.yaml").num_gpus == 256
    assert resolve_cluster(str(TOPOLOGIES / "dgx-b200.yaml")).name == "dgx-b200"
    spec = ClusterSpec(gpu="b200", gpus=16)
    assert resolve_cluster(spec) is resolve_cluster(spec)  # cached
    with pytest.raises(OptlayoutError, match="cluster: expected"):
        resolve_cluster(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)  # keep `topology` a sub-command group
    topology_cli.register(app)
    return app


def test_cli_show_json():
    result = CliRunner().invoke(
        _app(), ["topology", "show", str(TOPOLOGIES / "worked-example-256x80gb.yaml"), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["gpus"], data["servers"], data["domain_size"], data["domains"]) == (256, 32, 8, 32)
    assert data["levels"][0]["bandwidth_Bps"] == 450e9 and data["levels"][1]["bandwidth_Bps"] == 50e9
    assert data["bisection_bandwidth_Bps"] == 128 * 50e9


def test_cli_show_cluster_and_table():
    runner = CliRunner()
    result = runner.invoke(_app(), ["topology", "show", "--cluster", "gpu=h100-sxm,gpus=64", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["gpus"] == 64
    table = runner.invoke(_app(), ["topology", "show", str(TOPOLOGIES / "roce-1600g.yaml")])
    assert table.exit_code == 0 and "spine" in table.output and "bisection" in table.output
    both = runner.invoke(_app(), ["topology", "show", "x.yaml", "--cluster", "gpu=h100-sxm,gpus=8"])
    assert isinstance(both.exception, OptlayoutError)


def test_cli_main_errors_are_one_line_exit_2(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: h100-sxm\nservers: 2\ngpus_per_server: 8\nnics: {gbps: -1}\n")
    cmd = [sys.executable, "-m", "optlayout.cli", "topology", "show", str(bad)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nics.gbps" in proc.stderr and "-1" in proc.stderr
    ok = subprocess.run(
        [*cmd[:-1], str(TOPOLOGIES / "mi300x.yaml"), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["scale_up"] == ["mesh"]
