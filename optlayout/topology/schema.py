"""The topology file format (pydantic): a generator form and an explicit form, validated field by field.

Units at this edge are the ones people write: Gb/s for NICs (`gbps`), GB/s for scale-up and PCIe
(`gbytes_per_s`), microseconds for latency (`latency_us`). Builders convert to bytes/s and seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

ScaleUpKind = Literal["nvswitch", "mesh", "pcie", "none"]
FabricKind = Literal["rail", "fat-tree"]
NodeKind = Literal["gpu", "nvswitch", "pcie_switch", "cpu", "nic", "leaf", "spine", "core", "server"]

SWITCH_TIERS = {"leaf": 1, "spine": 2, "core": 3}
HOST_KINDS = frozenset({"pcie_switch", "cpu"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScaleUpSpec(_Model):
    """How the GPUs of a server (or of a multi-server NVLink domain) talk to each other."""

    kind: ScaleUpKind = "nvswitch"
    domain_size: PositiveInt | None = Field(None, description="GPUs per domain; default gpus_per_server")
    gbytes_per_s: float | None = Field(
        None, gt=0, description="per GPU, per direction: NVSwitch link, mesh total, or the GPU's PCIe link"
    )
    link_gbytes_per_s: float | None = Field(None, gt=0, description="mesh: one direct GPU-GPU link")
    latency_us: float | None = Field(None, ge=0, description="one hop (GPU-switch, GPU-GPU, PCIe)")
    sockets: PositiveInt = Field(2, description="pcie: CPU sockets per server")
    switches_per_socket: PositiveInt = Field(1, description="pcie: PCIe switches under each socket")
    uplink_gbytes_per_s: float | None = Field(None, gt=0, description="pcie: switch to CPU root port")
    socket_gbytes_per_s: float = Field(16.0, gt=0, description="pcie: CPU-CPU link for cross-socket traffic")


class NicSpec(_Model):
    """Scale-out NICs of one server."""

    per_server: NonNegativeInt | None = Field(None, description="default: one per GPU")
    gbps: float = Field(400.0, gt=0, description="Gb/s per NIC port (400 = NDR = 50e9 bytes/s)")
    latency_us: float = Field(1.0, ge=0, description="GPU to NIC (PCIe + NIC)")
    pcie_gbytes_per_s: float | None = Field(None, gt=0, description="GPU-NIC path; default: the NIC speed")


class FabricSpec(_Model):
    """Leaf/spine network joining the servers' NICs."""

    kind: FabricKind = "rail"
    servers_per_leaf: PositiveInt | None = Field(None, description="rail: 32 (one SU); fat-tree: 32 NIC ports")
    oversubscription: float = Field(1.0, ge=1.0, description="leaf downlink : uplink bandwidth")
    spine_switches: PositiveInt | None = Field(None, description="aggregated spine nodes; default NICs per server")
    leaf_latency_us: float = Field(0.5, ge=0, description="NIC to leaf hop")
    spine_latency_us: float = Field(0.5, ge=0, description="leaf to spine hop")


class NodeSpec(_Model):
    """One node of the explicit form (or of a server template, where ids are relative)."""

    id: str = Field(min_length=1)
    kind: NodeKind
    server: str | None = Field(None, description="server name; required for gpu nodes of the explicit form")
    gbps: float | None = Field(None, gt=0, description="nic: port speed in Gb/s")
    tier: PositiveInt | None = Field(None, description="switch tier, when not implied by kind")


class EdgeSpec(_Model):
    """A link: bandwidth per direction in exactly one unit, latency optional (defaults by node kinds)."""

    a: str
    b: str
    gbps: float | None = Field(None, gt=0)
    gbytes_per_s: float | None = Field(None, gt=0)
    bandwidth_Bps: float | None = Field(None, gt=0)
    latency_us: float | None = Field(None, ge=0)
    latency_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_unit(self) -> EdgeSpec:
        given = [k for k in ("gbps", "gbytes_per_s", "bandwidth_Bps") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of gbps, gbytes_per_s, bandwidth_Bps (got {', '.join(given)})")
        if self.latency_us is not None and self.latency_s is not None:
            raise ValueError("give latency_us or latency_s, not both")
        return self

    def bandwidth(self) -> float | None:
        """Bytes/s per direction, or None when not given."""
        if self.gbps is not None:
            return self.gbps * 1e9 / 8
        if self.gbytes_per_s is not None:
            return self.gbytes_per_s * 1e9
        return self.bandwidth_Bps

    def latency(self) -> float | None:
        if self.latency_us is not None:
            return self.latency_us * 1e-6
        return self.latency_s


class ServerGraphSpec(_Model):
    """Custom internals of one server: nodes and edges with ids relative to the server."""

    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)


class ServerPart(_Model):
    """What one server holds: GPUs with their scale-up links and NICs (generated or custom)."""

    gpus_per_server: PositiveInt | None = None
    scale_up: ScaleUpSpec | None = None
    server: ServerGraphSpec | None = None
    nics: NicSpec = NicSpec()

    @model_validator(mode="after")
    def _check_server(self) -> ServerPart:
        if self.server is None:
            if self.gpus_per_server is None:
                raise ValueError("gpus_per_server is required (or give a custom `server` graph)")
            return self
        if self.scale_up is not None:
            raise ValueError("give scale_up or a custom `server` graph, not both")
        gpus = sum(n.kind == "gpu" for n in self.server.nodes)
        if gpus == 0:
            raise ValueError("server.nodes: a server needs at least one gpu node")
        if self.gpus_per_server is not None and self.gpus_per_server != gpus:
            raise ValueError(f"gpus_per_server ({self.gpus_per_server}) != gpu nodes in server ({gpus})")
        return self

    @property
    def gpu_count(self) -> int:
        if self.server is not None:
            return sum(n.kind == "gpu" for n in self.server.nodes)
        return int(self.gpus_per_server or 0)


class GeneratorDoc(ServerPart):
    """Generator form: `servers` identical servers joined by a rail-optimized or fat-tree fabric."""

    name: str | None = None
    description: str = ""
    gpu: str
    servers: int = Field(gt=0, le=131_072, description="at most 2^17 servers (about a million GPUs)")
    fabric: FabricSpec = FabricSpec()


class ExplicitDoc(_Model):
    """Explicit form: nodes and edges; `server` nodes expand to `server_template`."""

    name: str | None = None
    description: str = ""
    gpu: str
    server_template: ServerPart | None = None
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
