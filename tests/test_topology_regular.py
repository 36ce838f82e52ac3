"""The link tables of a regular generator-form cluster, read off its template, equal those scanned from its graph."""

from __future__ import annotations

import pickle
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from optlayout.presets import gpu_preset
from optlayout.specs import ClusterSpec
from optlayout.topology import load_topology, topology_from_cluster, topology_from_dict
from optlayout.topology.analysis import Tables, analyse
from optlayout.topology.build import build_generator
from optlayout.topology.model import Topology, ordered_gpu_nodes
from optlayout.topology.regular import ServerMajorNames, regular_tables
from optlayout.topology.schema import GeneratorDoc

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


def generator(**fields_: Any) -> dict[str, Any]:
    return {"gpu": "h100-sxm", "servers": 4, "gpus_per_server": 8, **fields_}


SHAPES = {
    "one server": generator(servers=1),
    "one pod, rail": generator(servers=8),
    "pods with a partial last one": generator(servers=70),
    "rail, 3 servers a leaf, 2:1": generator(
        servers=10, fabric={"kind": "rail", "servers_per_leaf": 3, "oversubscription": 2.0}
    ),
    "fat-tree, partial pod, 3 spines, odd latencies": generator(
        servers=11,
        fabric={
            "kind": "fat-tree",
            "spine_switches": 3,
            "oversubscription": 3.0,
            "leaf_latency_us": 0.7,
            "spine_latency_us": 1.3,
        },
    ),
    "2 NICs per GPU, PCIe path slower": generator(
        servers=40, nics={"per_server": 16, "gbps": 200, "pcie_gbytes_per_s": 20.0}
    ),
    "a NIC per 2 GPUs": generator(servers=36, nics={"per_server": 4, "gbps": 400, "latency_us": 2.0}),
    "domains of 4 in a server": generator(
        servers=34, scale_up={"kind": "nvswitch", "domain_size": 4, "gbytes_per_s": 300, "latency_us": 0.8}
    ),
    "NVL72 racks, partial last domain": generator(
        gpu="gb200",
        servers=80,
        gpus_per_server=4,
        scale_up={"kind": "nvswitch", "domain_size": 72},
        nics={"per_server": 4, "gbps": 800},
        fabric={"kind": "rail", "servers_per_leaf": 72},
    ),
}


def assert_same_tables(template: Tables, graph: Tables) -> None:
    for f in fields(Tables):
        if f.name == "period":  # known from the template only; checked by `test_a_periodic_cluster_...`
            continue
        a, b = getattr(template, f.name), getattr(graph, f.name)
        if f.name in ("blocks", "factor", "lat_up"):
            assert len(a) == len(b), f.name
            for x, y in zip(a, b, strict=True):
                assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name
        else:
            assert a == b, f.name  # exact: the same floats, not close ones


@pytest.mark.parametrize("shape", SHAPES)
def test_template_tables_equal_the_graph_scan(shape: str) -> None:
    doc = GeneratorDoc.model_validate(SHAPES[shape])
    gpu = gpu_preset(doc.gpu)
    graph = build_generator(doc, gpu).graph()
    names = ordered_gpu_nodes(graph)
    template = regular_tables(doc, gpu)
    assert template is not None
    assert_same_tables(template, analyse(graph, names))
    assert list(ServerMajorNames(doc.servers, doc.gpu_count)) == names


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100", "dgx-b200", "dgx-h200", "gb200-nvl72", "roce-1600g"])
def test_shipped_generator_files_are_read_from_their_template(name: str) -> None:
    doc = yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text())
    spec = GeneratorDoc.model_validate(doc)
    gpu = gpu_preset(spec.gpu)
    graph = build_generator(spec, gpu).graph()
    template = regular_tables(spec, gpu)
    assert template is not None
    assert_same_tables(template, analyse(graph, ordered_gpu_nodes(graph)))


def test_irregular_templates_go_through_the_graph() -> None:
    gpu = gpu_preset("h100-sxm")
    for doc in (
        generator(scale_up={"kind": "pcie"}),
        generator(gpu="mi300x", scale_up={"kind": "mesh"}),
        generator(scale_up={"kind": "none"}),
        generator(nics={"per_server": 0}),
        generator(nics={"per_server": 3}),  # refused by the builder, with its message
        generator(scale_up={"kind": "nvswitch", "domain_size": 3}),
    ):
        assert regular_tables(GeneratorDoc.model_validate(doc), gpu) is None


def graph_built(doc: dict[str, Any]) -> Topology:
    spec = GeneratorDoc.model_validate(doc)
    gpu = gpu_preset(spec.gpu)
    graph = build_generator(spec, gpu).graph()
    return Topology(spec.name or "topology", gpu, graph, ordered_gpu_nodes(graph))


@pytest.mark.parametrize(
    ("doc", "period"),
    [
        (generator(servers=20, fabric={"kind": "rail", "servers_per_leaf": 4, "oversubscription": 2.0}), 32),
        (generator(servers=3, gpus_per_server=4, scale_up={"kind": "nvswitch", "domain_size": 12}), 12),
        (generator(servers=2), 8),  # one pod: every server alike
        (generator(servers=21, fabric={"kind": "rail", "servers_per_leaf": 4, "oversubscription": 2.0}), None),
        (generator(gpu="gb200", servers=80, gpus_per_server=4, scale_up={"kind": "nvswitch", "domain_size": 72}), None),
    ],
)
def test_a_template_topology_answers_as_the_graph_one(doc: dict[str, Any], period: int | None) -> None:
    """Every query (groups, dims, pairs, all-to-all, levels, summary) of the template-built Topology equals the
    graph-built one, which reads every group of a dimension, where the template one reads one period's worth."""
    fast, slow = topology_from_dict(doc), graph_built(doc)
    assert fast._t.period == period
    n = fast.num_gpus
    for size, stride in [(2, 1), (8, 1), (2, 8), (4, 8), (16, 8), (5, 32), (3, 1), (n // 4, 2), (n, 1), (2, n // 2)]:
        if size * stride > n or size < 1:
            continue
        assert fast.dim_bandwidth_Bps(size, stride) == slow.dim_bandwidth_Bps(size, stride), (size, stride)
        assert fast.dim_latency_s(size, stride) == slow.dim_latency_s(size, stride)
        assert fast.dim_all_to_all_bandwidth_Bps(size, stride) == slow.dim_all_to_all_bandwidth_Bps(size, stride)
        assert fast.dim_all_to_all_latency_s(size, stride) == slow.dim_all_to_all_latency_s(size, stride)
        assert fast.dim_domains(size, stride) == slow.dim_domains(size, stride)
    q = n // 4
    for first, second, count in [(0, 2 * q, q), (q, 2 * q, q), (3 * q, 0, q), (8, 8 + 2 * q, q), (0, 4, 4), (4, 8, 4)]:
        if max(first, second) + count <= n:
            assert fast.pairs_link(first, second, count) == slow.pairs_link(first, second, count), (first, second)
    assert fast.group_bandwidth_Bps([0, 9, n - 1]) == slow.group_bandwidth_Bps([0, 9, n - 1])
    assert fast.summary() == slow.summary()  # its graph counts build the graph on demand
    assert fast.gpu_node(n - 1) == slow.gpu_node(n - 1)


def test_the_period_is_a_translation_of_every_table() -> None:
    """Ranks r and r + period have the same values and sit at the same domain, server and block boundaries."""
    doc = GeneratorDoc.model_validate(
        generator(servers=24, fabric={"kind": "fat-tree", "servers_per_leaf": 3, "oversubscription": 1.5})
    )
    t = regular_tables(doc, gpu_preset(doc.gpu))
    assert t is not None and t.period == 24
    p = t.period
    for values in (t.su_bw, t.su_lat, t.nic_bw, *t.factor, *t.lat_up):
        assert np.array_equal(values[p:], values[:-p])
    for ids in (t.server, t.domain, *t.blocks):
        boundary = ids[1:] != ids[:-1]
        assert np.array_equal(boundary[p:], boundary[:-p])


def test_the_shorthand_builds_its_graph_only_when_asked() -> None:
    topo = topology_from_cluster.__wrapped__(ClusterSpec(gpu="h100-sxm", gpus=64, gpus_per_node=8))  # uncached
    assert not hasattr(topo._graph, "nodes")  # a builder, not yet called
    assert topo.graph.number_of_nodes() == 64 + 8 + 64 + 8  # GPUs, NVSwitches, NICs, one leaf per rail
    assert load_topology(TOPOLOGIES / "dgx-h100.yaml").num_gpus == 1024
    copy = pickle.loads(pickle.dumps(topology_from_cluster.__wrapped__(ClusterSpec(gpu="h100-sxm", gpus=16))))
    assert copy.graph.number_of_nodes() == 16 + 2 + 16 + 8  # the builder travels with it
