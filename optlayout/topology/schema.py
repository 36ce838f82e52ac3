"""The topology file format (pydantic): a generator form and an explicit form, validated field by field.

Units at this edge are the ones people write: Gb/s for NICs (`gbps`), GB/s for scale-up and PCIe
(`gbytes_per_s`), microseconds for latency (`latency_us`). Builders convert to bytes/s and seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from optlayout.inputs.limits import (
    MAX_GPUS,
    MAX_GPUS_PER_SERVER,
    MAX_LATENCY_S,
    MAX_LINK_BYTES_PER_S,
    MAX_OVERSUBSCRIPTION,
    MAX_SERVERS,
    MAX_SWITCH_TIERS,
    MIN_LINK_BYTES_PER_S,
)
from optlayout.inputs.numbers import Count, NonNegativeCount, Real

ScaleUpKind = Literal["nvswitch", "mesh", "pcie", "none"]
FabricKind = Literal["rail", "fat-tree"]
NodeKind = Literal["gpu", "nvswitch", "pcie_switch", "cpu", "nic", "leaf", "spine", "core", "server"]

SWITCH_TIERS = {"leaf": 1, "spine": 2, "core": 3}
HOST_KINDS = frozenset({"pcie_switch", "cpu"})


# Links in the units people write, bounded to [0.8 Mb/s, 8 Pb/s]; latencies to at most a second.
Gbps = Annotated[Real, Field(ge=MIN_LINK_BYTES_PER_S * 8 / 1e9, le=MAX_LINK_BYTES_PER_S * 8 / 1e9)]
GBytesPerS = Annotated[Real, Field(ge=MIN_LINK_BYTES_PER_S / 1e9, le=MAX_LINK_BYTES_PER_S / 1e9)]
BytesPerS = Annotated[Real, Field(ge=MIN_LINK_BYTES_PER_S, le=MAX_LINK_BYTES_PER_S)]
LatencyUs = Annotated[Real, Field(ge=0, le=MAX_LATENCY_S * 1e6)]
LatencyS = Annotated[Real, Field(ge=0, le=MAX_LATENCY_S)]
Oversubscription = Annotated[Real, Field(ge=1.0, le=MAX_OVERSUBSCRIPTION)]
ServerCount = Annotated[Count, Field(le=MAX_GPUS_PER_SERVER)]


class _Model(BaseModel):
    # strict: `servers: true` or `servers: "4"` is refused, not read as 1 or 4; NaN and infinity are refused
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ScaleUpSpec(_Model):
    """How the GPUs of a server (or of a multi-server NVLink domain) talk to each other."""

    kind: ScaleUpKind = "nvswitch"
    domain_size: Annotated[Count, Field(le=MAX_GPUS)] | None = Field(
        None, description="GPUs per domain; default gpus_per_server"
    )
    gbytes_per_s: GBytesPerS | None = Field(
        None, description="per GPU, per direction: NVSwitch link, mesh total, or the GPU's PCIe link"
    )
    link_gbytes_per_s: GBytesPerS | None = Field(None, description="mesh: one direct GPU-GPU link")
    latency_us: LatencyUs | None = Field(None, description="one hop (GPU-switch, GPU-GPU, PCIe)")
    sockets: Annotated[Count, Field(le=64)] = Field(2, description="pcie: CPU sockets per server")
    switches_per_socket: Annotated[Count, Field(le=256)] = Field(1, description="pcie: PCIe switches under each socket")
    uplink_gbytes_per_s: GBytesPerS | None = Field(None, description="pcie: switch to CPU root port")
    socket_gbytes_per_s: GBytesPerS = Field(16.0, description="pcie: CPU-CPU link for cross-socket traffic")


class NicSpec(_Model):
    """Scale-out NICs of one server."""

    per_server: Annotated[NonNegativeCount, Field(le=MAX_GPUS_PER_SERVER)] | None = Field(
        None, description="default: one per GPU"
    )
    gbps: Gbps = Field(400.0, description="Gb/s per NIC port (400 = NDR = 50e9 bytes/s)")
    latency_us: LatencyUs = Field(1.0, description="GPU to NIC (PCIe + NIC)")
    pcie_gbytes_per_s: GBytesPerS | None = Field(None, description="GPU-NIC path; default: the NIC speed")


class FabricSpec(_Model):
    """Leaf/spine network joining the servers' NICs."""

    kind: FabricKind = "rail"
    servers_per_leaf: Annotated[Count, Field(le=MAX_SERVERS)] | None = Field(
        None, description="rail: 32 (one SU); fat-tree: 32 NIC ports"
    )
    oversubscription: Oversubscription = Field(1.0, description="leaf downlink : uplink bandwidth")
    spine_switches: Annotated[Count, Field(le=65_536)] | None = Field(
        None, description="aggregated spine nodes; default NICs per server"
    )
    leaf_latency_us: LatencyUs = Field(0.5, description="NIC to leaf hop")
    spine_latency_us: LatencyUs = Field(0.5, description="leaf to spine hop")


class NodeSpec(_Model):
    """One node of the explicit form (or of a server template, where ids are relative)."""

    id: str = Field(min_length=1)
    kind: NodeKind
    server: str | None = Field(None, description="server name; required for gpu nodes of the explicit form")
    gbps: Gbps | None = Field(None, description="nic: port speed in Gb/s")
    tier: Annotated[Count, Field(le=MAX_SWITCH_TIERS)] | None = Field(
        None, description="switch tier, when not implied by kind"
    )


class EdgeSpec(_Model):
    """A link: bandwidth per direction in exactly one unit, latency optional (defaults by node kinds)."""

    a: str
    b: str
    gbps: Gbps | None = None
    gbytes_per_s: GBytesPerS | None = None
    bandwidth_Bps: BytesPerS | None = None
    latency_us: LatencyUs | None = None
    latency_s: LatencyS | None = None

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

    gpus_per_server: ServerCount | None = None
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
        if gpus > MAX_GPUS_PER_SERVER:
            raise ValueError(f"server.nodes: {gpus} gpu nodes, over {MAX_GPUS_PER_SERVER} per server")
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
    servers: Annotated[Count, Field(le=MAX_SERVERS)] = Field(description="at most 2^17 servers")
    fabric: FabricSpec = FabricSpec()

    @model_validator(mode="after")
    def _check_size(self) -> GeneratorDoc:
        if self.servers * self.gpu_count > MAX_GPUS:
            raise ValueError(f"servers x gpus per server = {self.servers * self.gpu_count:,} GPUs, over {MAX_GPUS:,}")
        return self


class ExplicitDoc(_Model):
    """Explicit form: nodes and edges; `server` nodes expand to `server_template`."""

    name: str | None = None
    description: str = ""
    gpu: str
    server_template: ServerPart | None = None
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
