"""Cluster topology: files (generator or explicit form) -> networkx graph -> bandwidth of rank groups; a regular
generator-form cluster (the `--cluster` shorthand, NVSwitch servers) skips the graph: its link tables come from
its template (`topology.regular`), the graph is built only when asked for.

Nodes: GPUs, NVSwitch domains, PCIe switches, CPUs, NICs, leaf/spine/core switches. Edges: bandwidth
(bytes/s per direction) and latency (s). The bandwidth a rank group gets is read from the links its
collective crosses (see `Topology`). File format: `topologies/README.md`.
"""

from optlayout.topology.load import (
    LoadedCluster,
    cluster_assumptions,
    load_cluster,
    load_topology,
    parse_cluster_shorthand,
    resolve_cluster,
    topology_from_cluster,
    topology_from_dict,
)
from optlayout.topology.model import Topology, ordered_gpu_nodes

__all__ = [
    "LoadedCluster",
    "Topology",
    "cluster_assumptions",
    "load_cluster",
    "load_topology",
    "ordered_gpu_nodes",
    "parse_cluster_shorthand",
    "resolve_cluster",
    "topology_from_cluster",
    "topology_from_dict",
]
