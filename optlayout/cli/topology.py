"""`optlayout topology show` and `optlayout topology discover`: inspect and create topology files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.table import Table

from optlayout.cli import common, outputs
from optlayout.errors import InputError
from optlayout.inputs.limits import (
    MAX_GPUS_PER_SERVER,
    MAX_LINK_BYTES_PER_S,
    MAX_OVERSUBSCRIPTION,
    MAX_SERVERS,
    MIN_LINK_BYTES_PER_S,
)

if TYPE_CHECKING:
    from optlayout.topology.discovery import FabricChoice, ScaleUpChoice

SOURCE_HELP = "nvidia-smi (`nvidia-smi topo -m` output) | nccl-xml (NCCL_TOPO_DUMP_FILE) | slurm (topology.conf)"


def register(app: typer.Typer) -> None:
    topology = typer.Typer(
        name="topology", help="Cluster topology files: show one, or discover one from a cluster.", no_args_is_help=True
    )
    topology.command("show")(show_command)
    topology.command("discover")(discover_command)
    app.add_typer(topology, name="topology")


def show_command(
    file: Annotated[Path | None, typer.Argument(help="topology YAML file")] = None,
    cluster: common.ClusterOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """GPUs, servers, NVLink domains, bandwidth and latency per link level, bisection bandwidth."""
    from optlayout.topology import resolve_cluster

    if file is not None and cluster is None:
        topo = resolve_cluster(file)
    elif cluster is not None and file is None:
        topo = resolve_cluster(cluster)
    else:
        raise InputError("topology: give a topology FILE or --cluster gpu=...,gpus=... (exactly one)")
    summary = topo.summary() | {"assumed": common.assumed_arg(cluster)}
    if as_json:
        common.print_json(summary)
        return
    _print_summary(summary)


def _print_summary(s: dict[str, Any]) -> None:
    console = common.console
    console.print(f"[bold]{s['name']}[/bold]" + (f": {s['description']}" if s["description"] else ""))
    console.print(
        f"{s['gpus']} x {s['gpu']} GPUs on {s['servers']} servers ({s['gpus_per_server']} per server); "
        f"{s['domains']} scale-up domain(s) of {s['domain_size']}"
        + (f" to {s['largest_domain_size']}" if s["smaller_domains"] else "")
        + f" GPUs ({', '.join(s['scale_up'])})"
    )
    smaller = s["smaller_domains"]
    if smaller:  # an irregular cluster: name the domains below the largest, which bound every group's reach
        more = f"; and {len(smaller) - 5} more" if len(smaller) > 5 else ""
        reach = f"{s['domain_size']} GPU" + ("s" if s["domain_size"] > 1 else "")
        console.print(
            f"irregular: {len(smaller)} domain(s) smaller than {s['largest_domain_size']} GPUs: "
            + "; ".join(smaller[:5]) + more + f"; the search plans every scale-up group within {reach}"
        )  # fmt: skip
    table = Table(title="link levels (per GPU, per direction)")
    for column in ("level", "kind", "GPUs", "GB/s", "latency us", "oversub"):
        table.add_column(column, justify="left" if column in ("level", "kind") else "right")
    for level in s["levels"]:
        table.add_row(
            level["level"],
            level["kind"],
            str(level["gpus"]),
            f"{level['bandwidth_Bps'] / 1e9:g}",
            f"{level['latency_s'] * 1e6:g}",
            f"{level['oversubscription']:g}:1",
        )
    console.print(table)
    console.print(
        f"bisection bandwidth {s['bisection_bandwidth_Bps'] / 1e12:g} TB/s per direction; "
        f"graph: {s['graph_nodes']} nodes, {s['graph_edges']} edges"
    )
    common.print_assumed(s["assumed"])


def discover_command(
    file: Annotated[Path, typer.Argument(help="the file the cluster printed")],
    source: Annotated[str, typer.Option("--from", help=SOURCE_HELP)],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="topology YAML to write (default: stdout)")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset (nccl-xml infers it from sm)")] = None,
    servers: Annotated[int, typer.Option("--servers", help="nvidia-smi/nccl-xml: identical servers")] = 1,
    gpus_per_server: Annotated[int, typer.Option("--gpus-per-server", help="slurm: GPUs per host")] = 8,
    nics_per_server: Annotated[int | None, typer.Option("--nics-per-server", help="slurm: default one per GPU")] = None,
    nic_gbps: Annotated[
        float | None, typer.Option("--nic-gbps", help="Gb/s per NIC (default 400 or the XML's)")
    ] = None,
    scale_up: Annotated[str, typer.Option("--scale-up", help="auto | nvswitch | mesh | pcie")] = "auto",
    fabric: Annotated[str, typer.Option("--fabric", help="rail | fat-tree (nvidia-smi, nccl-xml)")] = "rail",
    servers_per_leaf: Annotated[int | None, typer.Option("--servers-per-leaf")] = None,
    oversubscription: Annotated[float, typer.Option("--oversubscription", help="leaf uplink ratio")] = 1.0,
    name: Annotated[str | None, typer.Option("--name", help="topology name (default: output file stem)")] = None,
) -> None:
    """Write a topology file from nvidia-smi topo -m, an NCCL topology dump or a Slurm topology.conf."""
    from optlayout.inputs.readers import DISCOVERY
    from optlayout.topology import topology_from_dict
    from optlayout.topology.discovery import SOURCES, DiscoverOptions, discover, dump_topology

    if source not in SOURCES:
        raise InputError(f"from: unknown source {source!r}; valid: {', '.join(SOURCES)}")
    _check_choices(scale_up, fabric, servers, gpus_per_server, oversubscription)
    _check_counts(nics_per_server, nic_gbps, servers_per_leaf)
    if output is not None:
        outputs.check_output(output, "--output", [file])
    text = DISCOVERY[source].text(file)
    options = DiscoverOptions(
        gpu=gpu,
        servers=servers,
        gpus_per_server=gpus_per_server,
        nics_per_server=nics_per_server,
        nic_gbps=nic_gbps,
        scale_up=cast("ScaleUpChoice", scale_up),  # checked by _check_choices
        fabric=cast("FabricChoice", fabric),  # checked by _check_choices
        servers_per_leaf=servers_per_leaf,
        oversubscription=oversubscription,
        name=name or (output.stem if output else file.stem),
    )
    doc = discover(source, text, options)
    topo = topology_from_dict(doc, where=f"discovered from {file.name}")  # what we write must load back
    notes = [f"discovered by `optlayout topology discover --from {source} {file.name}`", *options.notes]
    yaml_text = dump_topology(doc, notes)
    if output is None:
        typer.echo(yaml_text, nl=False)
        return
    outputs.write_output(output, yaml_text, "--output", [file])
    common.err_console.print(
        f"wrote {output}: {topo.num_gpus} GPUs on {topo.num_servers} server(s), "
        f"{topo.num_domains} domain(s) of {topo.domain_size}"
    )


def _check_choices(scale_up: str, fabric: str, servers: int, gpus_per_server: int, oversubscription: float) -> None:
    if scale_up not in ("auto", "nvswitch", "mesh", "pcie"):
        raise InputError(f"scale-up: {scale_up!r} is not one of auto, nvswitch, mesh, pcie")
    if fabric not in ("rail", "fat-tree"):
        raise InputError(f"fabric: {fabric!r} is not one of rail, fat-tree")
    if not 1 <= servers <= MAX_SERVERS or not 1 <= gpus_per_server <= MAX_GPUS_PER_SERVER:
        raise InputError(
            f"servers/gpus-per-server: must be 1 to {MAX_SERVERS:,} and 1 to {MAX_GPUS_PER_SERVER:,} "
            f"(got {servers}, {gpus_per_server})"
        )
    if not 1 <= oversubscription <= MAX_OVERSUBSCRIPTION:
        raise InputError(f"oversubscription: must be 1 to {MAX_OVERSUBSCRIPTION:g} (got {oversubscription})")


def _check_counts(nics_per_server: int | None, nic_gbps: float | None, servers_per_leaf: int | None) -> None:
    if nics_per_server is not None and not 0 <= nics_per_server <= MAX_GPUS_PER_SERVER:
        raise InputError(f"nics-per-server: must be 0 to {MAX_GPUS_PER_SERVER:,} (got {nics_per_server})")
    if servers_per_leaf is not None and not 1 <= servers_per_leaf <= MAX_SERVERS:
        raise InputError(f"servers-per-leaf: must be 1 to {MAX_SERVERS:,} (got {servers_per_leaf})")
    top = MAX_LINK_BYTES_PER_S * 8 / 1e9
    if nic_gbps is not None and not MIN_LINK_BYTES_PER_S * 8 / 1e9 <= nic_gbps <= top:
        raise InputError(f"nic-gbps: must be a NIC speed in Gb/s, up to {top:g} (got {nic_gbps})")
