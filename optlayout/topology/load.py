"""Entry points: topology files, documents, the ClusterSpec shorthand, and `resolve_cluster` for all of them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import pydantic

from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.numbers import int_from_text, number_from_text
from optlayout.inputs.readers import TOPOLOGY
from optlayout.presets import gpu_preset
from optlayout.specs import ClusterSpec, GpuSpec
from optlayout.topology.build import build_explicit, build_generator, check_graph_size, paused_gc
from optlayout.topology.model import Topology, ordered_gpu_nodes
from optlayout.topology.regular import ServerMajorNames, regular_tables
from optlayout.topology.schema import ExplicitDoc, FabricSpec, GeneratorDoc, NicSpec, ScaleUpSpec

if TYPE_CHECKING:
    import networkx as nx

SHORTHAND_KEYS = tuple(ClusterSpec.model_fields)


# What the shorthand assumes for each field it is not given, and why (said in every output, never silently).
ASSUMED_BECAUSE = {
    "gpus_per_node": "not given: 8 GPUs per node, as DGX/HGX servers",
    "nvlink_domain": "not given: one NVLink domain per node",
    "inter_node_gbps_per_gpu": "not given: 400 Gb/s of scale-out per GPU, one NDR NIC per GPU as DGX H100 "
    "(DGX A100 has 200)",
    "oversubscription": "not given: a non-blocking fabric",
}


def cluster_assumptions(spec: ClusterSpec) -> dict[str, dict[str, Any]]:
    """The shorthand's fields that were not given: {field: {"value": ..., "why": ...}}."""
    defaults = {"nvlink_domain": spec.gpus_per_node}
    return {
        name: {"value": defaults.get(name, getattr(spec, name)), "why": why}
        for name, why in ASSUMED_BECAUSE.items()
        if name not in spec.model_fields_set
    }


@dataclass(frozen=True)
class LoadedCluster:
    """A topology and the recipe it came from, which rebuilds it on another GPU count: its shorthand, or its
    generator-form document (neither for an explicit-form file or a Topology object)."""

    topology: Topology
    shorthand: ClusterSpec | None = None
    generator_doc: dict[str, Any] | None = None

    @property
    def assumed(self) -> dict[str, dict[str, Any]]:
        """The shorthand's assumed fields (see `cluster_assumptions`); none for a topology file."""
        return cluster_assumptions(self.shorthand) if self.shorthand is not None else {}


def load_cluster(spec: str | Path | ClusterSpec | Topology | LoadedCluster) -> LoadedCluster:
    """A topology file (read once), a shorthand string, a ClusterSpec or a Topology, with its recipe."""
    if isinstance(spec, LoadedCluster):
        return spec
    if isinstance(spec, Topology):
        return LoadedCluster(spec)
    if isinstance(spec, str) and "=" in spec and not Path(spec).is_file():
        spec = parse_cluster_shorthand(spec)
    if isinstance(spec, str) and (not spec.strip() or (_bare_word(spec) and not Path(spec).exists())):
        raise InputError(f"cluster: {spec!r} is neither a cluster shorthand (gpu=...,gpus=..., e.g. "
                         "gpu=h100-sxm,gpus=64) nor a topology file")  # fmt: skip
    if isinstance(spec, ClusterSpec):
        gpu_preset(spec.gpu)  # unknown preset -> one-line error naming the field
        return LoadedCluster(topology_from_cluster(spec), shorthand=spec)
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        doc = read_topology_doc(path)
        topo = topology_from_dict(doc, default_name=path.stem, where=f"topology {path.name}")
        generator = isinstance(doc, dict) and "servers" in doc and "nodes" not in doc
        return LoadedCluster(topo, generator_doc=doc if generator else None)
    raise InputError(f"cluster: expected a topology file, a shorthand string or a ClusterSpec, got {spec!r}")


def _bare_word(text: str) -> bool:
    """Text that names no file (no folder, no suffix), such as a shorthand missing its `=`."""
    return "/" not in text and "\\" not in text and not Path(text.strip()).suffix


@checked_arguments
def load_topology(path: str | Path) -> Topology:
    """Read a topology YAML file (generator or explicit form)."""
    path = Path(path)
    return topology_from_dict(read_topology_doc(path), default_name=path.stem, where=f"topology {path.name}")


def read_topology_doc(path: Path) -> Any:
    """The parsed document of a topology YAML file (size-limited, UTF-8, duplicate keys and alias bombs refused)."""
    return TOPOLOGY.yaml(path)


def topology_from_dict(doc: Any, default_name: str = "topology", where: str = "topology") -> Topology:
    """Build a Topology from a parsed document (the dict a topology YAML file holds)."""
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected a mapping of fields, got {type(doc).__name__}")
    if "nodes" in doc and "servers" in doc:
        raise InputError(f"{where}: give `servers` (generator form) or `nodes` (explicit form), not both")
    if "nodes" not in doc and "servers" not in doc:
        raise InputError(f"{where}: missing field 'servers' (generator form) or 'nodes' (explicit form)")
    model = ExplicitDoc if "nodes" in doc else GeneratorDoc
    try:
        spec = model.model_validate(doc)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, where)) from None
    try:
        gpu = gpu_preset(spec.gpu)
        if isinstance(spec, GeneratorDoc):
            return _generated(spec, gpu, spec.name or default_name)
        with paused_gc():
            graph = build_explicit(spec, gpu).graph()
            return Topology(spec.name or default_name, gpu, graph, ordered_gpu_nodes(graph), spec.description)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _generated(doc: GeneratorDoc, gpu: GpuSpec, name: str) -> Topology:
    """A generator-form cluster: from its template's tables where it is regular (the graph then built only if
    asked for), else from its graph."""
    check_graph_size(doc.servers, doc, doc.fabric)
    tables = regular_tables(doc, gpu)
    if tables is None:
        graph = _generated_graph(doc, gpu)
        return Topology(name, gpu, graph, ordered_gpu_nodes(graph), doc.description)

    names = ServerMajorNames(doc.servers, int(doc.gpus_per_server or 0))
    return Topology(name, gpu, partial(_generated_graph, doc, gpu), names, doc.description, tables=tables)


def _generated_graph(doc: GeneratorDoc, gpu: GpuSpec) -> nx.Graph[str]:
    with paused_gc():
        return build_generator(doc, gpu).graph()


@lru_cache(maxsize=16)
def topology_from_cluster(cluster: ClusterSpec) -> Topology:
    """The standard graph of the shorthand: NVSwitch domains, one NIC per GPU, rail-optimized fat tree.

    Cached per ClusterSpec; treat the result as read-only.
    """
    per_server = min(cluster.gpus_per_node, cluster.gpus)
    doc = GeneratorDoc(
        name=f"{cluster.gpu}-x{cluster.gpus}",
        description="expanded from the cluster shorthand",
        gpu=cluster.gpu,
        servers=cluster.gpus // per_server,
        gpus_per_server=per_server,
        scale_up=ScaleUpSpec(kind="nvswitch", domain_size=cluster.domain_size),
        nics=NicSpec(per_server=per_server, gbps=cluster.inter_node_gbps_per_gpu),
        fabric=FabricSpec(kind="rail", oversubscription=cluster.oversubscription),
    )
    return _generated(doc, gpu_preset(cluster.gpu), doc.name or "cluster")


@checked_arguments
def parse_cluster_shorthand(text: str) -> ClusterSpec:
    """`gpu=h100-sxm,gpus=16384,gpus_per_node=8` -> ClusterSpec (fields named in errors)."""
    fields: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise InputError(f"cluster: expected key=value, got {part!r}")
        if key not in SHORTHAND_KEYS:
            raise InputError(f"cluster: unknown key {key!r}; valid: {', '.join(SHORTHAND_KEYS)}")
        if key in fields:
            raise InputError(f"cluster: {key} given twice")
        fields[key] = _shorthand_value(key, value)
    if "gpu" not in fields or "gpus" not in fields:
        raise InputError(f"cluster: the shorthand needs gpu=... and gpus=... (got {text!r})")
    try:
        return ClusterSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "cluster")) from None


def _shorthand_value(key: str, text: str) -> object:
    """A shorthand value converted, explicitly, to its field's type (counts: integers; rates: finite numbers)."""
    annotation = ClusterSpec.model_fields[key].annotation
    if _holds(annotation, int):
        return int_from_text(text, f"cluster: {key}")
    if _holds(annotation, float):
        return number_from_text(text, f"cluster: {key}")
    return text.strip()


def _holds(annotation: object, kind: type) -> bool:
    """Whether a field annotation (`int`, `Annotated[int, ...] | None`) has values of `kind`."""
    return annotation is kind or any(_holds(a, kind) for a in get_args(annotation))


def resolve_cluster(spec: str | Path | ClusterSpec | Topology | LoadedCluster) -> Topology:
    """A Topology, a ClusterSpec, a path to a topology YAML file, or a shorthand string."""
    return load_cluster(spec).topology
