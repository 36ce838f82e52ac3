"""Discovery: nvidia-smi topo -m, NCCL topology XML and Slurm topology.conf round-trip through load_topology."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from optlayout.cli import topology as topology_cli
from optlayout.errors import OptlayoutError
from optlayout.topology import Topology, load_topology, topology_from_dict
from optlayout.topology.discovery import (
    DiscoverOptions,
    discover,
    dump_topology,
    expand_hostlist,
    parse_nvidia_smi,
    parse_slurm,
)

FIXTURES = Path(__file__).parent / "fixtures" / "discovery"


def roundtrip(source: str, fixture: str, tmp_path: Path, **options: object) -> Topology:
    """discover -> YAML text on disk -> load_topology."""
    opts = DiscoverOptions(**options)  # type: ignore[arg-type]
    doc = discover(source, (FIXTURES / fixture).read_text(), opts)
    path = tmp_path / "topo.yaml"
    path.write_text(dump_topology(doc, opts.notes))
    return load_topology(path)


# ---------------------------------------------------------------------------------------------- nvidia-smi


def test_parse_dgx_h100_matrix_by_header_tokens():
    smi = parse_nvidia_smi((FIXTURES / "dgx-h100-topo-m.txt").read_text())
    assert smi.gpus == [f"GPU{i}" for i in range(8)] and smi.nics == [f"NIC{i}" for i in range(8)]
    assert smi.cells[("GPU0", "GPU7")] == "NV18" and smi.cells[("GPU0", "NIC0")] == "PIX"
    assert smi.cells[("GPU0", "NIC4")] == "SYS" and smi.nic_names["NIC5"] == "mlx5_9"
    assert smi.numa == {f"GPU{i}": str(i // 4) for i in range(8)}


def test_dgx_h100_nvidia_smi_roundtrip(tmp_path: Path):
    # NV18 on every pair, 18 links x 25 GB/s = 450 GB/s per GPU through the NVSwitch; 8 NICs at 400G.
    topo = roundtrip("nvidia-smi", "dgx-h100-topo-m.txt", tmp_path, gpu="h100-sxm", servers=4)
    assert (topo.num_gpus, topo.num_servers, topo.domain_size, topo.num_domains) == (32, 4, 8, 4)
    assert topo.scale_up_kinds == ["nvswitch"]
    assert topo.group_bandwidth_Bps(range(8)) == pytest.approx(450e9)
    assert topo.dim_bandwidth_Bps(4, 8) == 50e9  # each GPU owns the NIC on its PCIe switch
    server = topo.graph.nodes["s0/mlx5_0"]
    assert server["kind"] == "nic" and server["bandwidth_Bps"] == 50e9
    assert "s0/gpu0" in topo.graph["s0/pcie0"] and "s0/mlx5_0" in topo.graph["s0/pcie0"]


def test_pcie_box_nvidia_smi_roundtrip(tmp_path: Path):
    # No NVLink: one PCIe domain of 8. Gen4 x16 = 16 GT/s x 16 x 128/130 / 8 x 0.8 = 25.2 GB/s;
    # across the sockets the 16 GB/s socket link. 2 x 200G NICs (25e9), each nearest to 4 GPUs: 6.25e9.
    topo = roundtrip("nvidia-smi", "pcie-8x-a100-topo-m.txt", tmp_path, gpu="a100-40gb", servers=2, nic_gbps=200)
    assert (topo.num_gpus, topo.domain_size, topo.scale_up_kinds) == (16, 8, ["pcie"])
    assert topo.group_bandwidth_Bps([0, 1]) == pytest.approx(25.21e9)
    assert topo.group_bandwidth_Bps(range(8)) == 16e9
    assert topo.dim_bandwidth_Bps(2, 8) == 25e9 / 4


def test_nvidia_smi_with_ansi_and_bad_input():
    text = (FIXTURES / "dgx-h100-topo-m.txt").read_text()
    coloured = "\x1b[4m" + text.replace("\n", "\x1b[0m\n", 1)
    assert parse_nvidia_smi(coloured).gpus == parse_nvidia_smi(text).gpus
    with pytest.raises(OptlayoutError, match="no header line with GPU0"):
        parse_nvidia_smi("hello\n")
    with pytest.raises(OptlayoutError, match=r"unknown cell 'NVX' \(row GPU0, column GPU1\)"):
        parse_nvidia_smi(text.replace("NV18", "NVX", 1))
    with pytest.raises(OptlayoutError, match="gpu: nvidia-smi topo -m does not name"):
        discover("nvidia-smi", text, DiscoverOptions())


def test_nvidia_smi_direct_mesh():
    # 4 A100s with NV4 to each peer and no NVSwitch (HGX A100 4-GPU): 4 links x 25 GB/s per pair.
    lines = ["\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity"]
    for i in range(4):
        cells = ["X" if i == j else "NV4" for j in range(4)]
        lines.append("\t".join([f"GPU{i}", *cells, "0-63", "0"]))
    doc = discover("nvidia-smi", "\n".join(lines), DiscoverOptions(gpu="a100-80gb"))
    topo = topology_from_dict(doc)
    assert topo.scale_up_kinds == ["mesh"]
    assert topo.group_bandwidth_Bps(range(4)) == pytest.approx(3 * 100e9)


# ---------------------------------------------------------------------------------------------- NCCL XML


def test_nccl_xml_dgx_h100_roundtrip(tmp_path: Path):
    # sm 90 -> h100-sxm; nvlink counts 5+5+4+4 = 18 to the NVSwitches, x 25 GB/s = 450 GB/s;
    # net speed 400000 Mb/s = 400 Gb/s = 50e9 bytes/s; GPU and NIC behind the same PCIe Gen5 switch.
    topo = roundtrip("nccl-xml", "nccl-topo-dgx-h100.xml", tmp_path, servers=2)
    assert topo.gpu.name == "h100-sxm"
    assert (topo.num_gpus, topo.domain_size, topo.num_domains) == (16, 8, 2)
    assert topo.group_bandwidth_Bps(range(8)) == pytest.approx(450e9)
    assert topo.group_bandwidth_Bps([0, 8]) == 50e9
    assert topo.gpu_node(3) == "s0/gpu3"
    nics = [n for n, k in topo.graph.nodes(data="kind") if k == "nic" and n.startswith("s0/")]
    assert len(nics) == 8


def test_nccl_xml_writes_the_gpu_it_guessed_from_sm_as_an_assumption(tmp_path: Path):
    """sm 90 is every Hopper part (an H200's dump reads the same but for its PCI device id): the preset read from
    sm alone is written as an assumption, with its siblings and --gpu; a --gpu given is no assumption."""
    text = (FIXTURES / "nccl-topo-dgx-h100.xml").read_text()
    opts = DiscoverOptions()
    discover("nccl-xml", text, opts)
    note = next(n for n in opts.notes if n.startswith("GPU model"))
    assert note == (
        "GPU model is not in the NCCL topology file: assumed h100-sxm from sm 90 (PCI device 0x2330); "
        "other hopper presets (h200, h800, h20) differ in memory and peak TFLOP/s; give --gpu PRESET"
    )
    roundtrip("nccl-xml", "nccl-topo-dgx-h100.xml", tmp_path)
    assert "# GPU model is not in the NCCL topology file: assumed h100-sxm" in (tmp_path / "topo.yaml").read_text()
    opts = DiscoverOptions(gpu="h200")
    topo = topology_from_dict(discover("nccl-xml", text.replace('device="0x2330"', 'device="0x2335"'), opts))
    assert topo.gpu.name == "h200" and not any("GPU model" in n for n in opts.notes)
    opts = DiscoverOptions()
    discover("nccl-xml", NCCL_MESH, opts)  # no PCI device ids in the file
    assert ("assumed a100-80gb from sm 80; other ampere presets (a100-40gb) differ in memory and peak TFLOP/s; "
            "give --gpu PRESET") in opts.notes[0]  # fmt: skip


NCCL_MESH = """<system version="1">
  <cpu numaid="0" arch="x86_64" vendor="AuthenticAMD" familyid="25" modelid="1">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="80" rank="1" gdr="1">
        <nvlink target="0000:02:00.0" count="4" tclass="0x030200"/>
      </gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="0">
      <gpu dev="0" sm="80" rank="0" gdr="1">
        <nvlink target="0000:01:00.0" count="4" tclass="0x030200"/>
      </gpu>
    </pci>
    <nic>
      <net name="eth0" dev="0" speed="100000" port="0" gdr="0"/>
    </nic>
  </cpu>
</system>
"""


def test_nccl_xml_direct_links_and_gpu_order():
    doc = discover("nccl-xml", NCCL_MESH, DiscoverOptions())
    topo = topology_from_dict(doc)
    assert topo.gpu.name == "a100-80gb" and topo.scale_up_kinds == ["mesh"]
    assert topo.gpu_node(0) == "s0/gpu0"  # ordered by dev, not by file order
    assert topo.group_bandwidth_Bps([0, 1]) == 4 * 25e9


def test_nccl_xml_errors():
    with pytest.raises(OptlayoutError, match="nccl-xml: not valid XML"):
        discover("nccl-xml", "<system><cpu>", DiscoverOptions())
    with pytest.raises(OptlayoutError, match="root element is <topology>"):
        discover("nccl-xml", "<topology/>", DiscoverOptions())
    with pytest.raises(OptlayoutError, match="no GPU"):
        discover("nccl-xml", '<system version="1"><cpu numaid="0"/></system>', DiscoverOptions())
    unknown = NCCL_MESH.replace('sm="80"', 'sm="75"')
    with pytest.raises(OptlayoutError, match=r"gpu: cannot tell the GPU model from sm=\[75\]; pass --gpu"):
        discover("nccl-xml", unknown, DiscoverOptions())
    assert topology_from_dict(discover("nccl-xml", unknown, DiscoverOptions(gpu="a100-40gb"))).num_gpus == 2


# ---------------------------------------------------------------------------------------------- Slurm


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("tux[0-3,12,18-20]", ["tux0", "tux1", "tux2", "tux3", "tux12", "tux18", "tux19", "tux20"]),
        ("dev[00-02]", ["dev00", "dev01", "dev02"]),
        ("a[1-2]-b[1-2]", ["a1-b1", "a1-b2", "a2-b1", "a2-b2"]),
        ("x,y[1-2],z", ["x", "y1", "y2", "z"]),
        ("gpu-[001-003]", ["gpu-001", "gpu-002", "gpu-003"]),
    ],
)
def test_hostlist_expansion(expr: str, hosts: list[str]):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["dev[0-", "dev[3-1]", "dev[a-b]", "dev]1["])
def test_bad_hostlists(expr: str):
    with pytest.raises(OptlayoutError, match=r"slurm: bad|runs backwards"):
        expand_hostlist(expr)


def test_slurm_tree_roundtrip(tmp_path: Path):
    # 4 leaves x 16 hosts x 8 GPUs = 512 GPUs; two spines of two leaves each; one core.
    topo = roundtrip("slurm", "slurm-tree-topology.conf", tmp_path, gpu="h100-sxm")
    assert (topo.num_gpus, topo.num_servers, topo.domain_size) == (512, 64, 8)
    assert topo.server_name(0) == "gpu-001" and topo.gpu_node(8) == "gpu-002/gpu0"
    assert [lv["level"] for lv in topo.levels()] == ["scale-up", "leaf", "spine", "core"]
    assert topo.dim_bandwidth_Bps(64, 8) == 50e9  # non-blocking by default
    kinds = dict(topo.graph.nodes(data="kind"))
    assert kinds["leaf01"] == "leaf" and kinds["spine02"] == "spine" and kinds["core01"] == "core"


def test_slurm_tree_oversubscription(tmp_path: Path):
    # 2:1 at every uplink: hosts on leaf01 and leaf02 meet at spine01 -> 50e9 / 2;
    # leaf01 and leaf03 meet at the core -> 50e9 / 2 / 2.
    topo = roundtrip("slurm", "slurm-tree-topology.conf", tmp_path, gpu="h100-sxm", oversubscription=2)
    assert topo.group_bandwidth_Bps([0, 8]) == 50e9
    assert topo.group_bandwidth_Bps([0, 16 * 8]) == 25e9
    assert topo.group_bandwidth_Bps([0, 32 * 8]) == 12.5e9


def test_slurm_block_roundtrip(tmp_path: Path):
    # Two NVL72 racks: blocks of 18 trays x 4 GPUs = 72-GPU NVLink domains at 900 GB/s; 800G per GPU across.
    topo = roundtrip("slurm", "slurm-block-topology.conf", tmp_path, gpu="gb200", gpus_per_server=4, nic_gbps=800)
    assert (topo.num_gpus, topo.num_servers, topo.domain_size, topo.num_domains) == (144, 36, 72, 2)
    assert topo.group_bandwidth_Bps(range(64)) == 900e9
    assert topo.group_bandwidth_Bps([0, 72]) == 100e9
    assert topo.domain_of(71) != topo.domain_of(72)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Switches=s9\n",
            "switch 's9' (in Switches= of 's1') is not defined",
        ),
        ("SwitchName=s0 Nodes=a1\nBlockName=b Nodes=a2\n", "mixes SwitchName="),
        ("RingName=r0 Nodes=a[1-8]\n", "topology/ring is not supported"),
        ("# nothing\n", "no SwitchName= or BlockName= line"),
        ("SwitchName=s0 Nodes=a1\nSwitchName=s1 Nodes=a2\n", "several roots (s0, s1)"),
        ("SwitchName s0\n", "line 1: expected Key=Value"),
        ("SwitchName=s0 Switches=s0 Nodes=a1\n", "its own ancestor"),
    ],
)
def test_slurm_errors(text: str, expected: str):
    with pytest.raises(OptlayoutError, match="slurm: ") as info:
        discover("slurm", text, DiscoverOptions(gpu="h100-sxm"))
    assert expected in str(info.value)


def test_parse_slurm_comments_and_continuations():
    records = parse_slurm("# c\nSwitchName=s0 \\\n  Nodes=n[1-2] # trailing\n")
    assert records == [{"switchname": "s0", "nodes": "n[1-2]"}]


def test_unknown_source():
    with pytest.raises(OptlayoutError, match="from: unknown source 'lldp'"):
        discover("lldp", "", DiscoverOptions())


# ---------------------------------------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)
    topology_cli.register(app)
    return app


def test_cli_discover_writes_a_loadable_file(tmp_path: Path):
    out = tmp_path / "dgx.yaml"
    args = ["topology", "discover", str(FIXTURES / "dgx-h100-topo-m.txt"), "--from", "nvidia-smi", "-o", str(out)]
    result = CliRunner().invoke(_app(), [*args, "--gpu", "h100-sxm", "--servers", "2", "--nic-gbps", "400"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# discovered by `optlayout topology discover --from nvidia-smi")
    topo = load_topology(out)
    assert topo.name == "dgx" and topo.num_gpus == 16 and topo.group_bandwidth_Bps([0, 8]) == 50e9


def test_cli_discover_to_stdout_and_errors():
    runner = CliRunner()
    conf = str(FIXTURES / "slurm-block-topology.conf")
    result = runner.invoke(
        _app(), ["topology", "discover", conf, "--from", "slurm", "--gpu", "gb200", "--gpus-per-server", "4"]
    )
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output)["server_template"]["gpus_per_server"] == 4
    bad = runner.invoke(_app(), ["topology", "discover", conf, "--from", "lldp"])
    assert isinstance(bad.exception, OptlayoutError) and "lldp" in str(bad.exception)
    missing = runner.invoke(_app(), ["topology", "discover", "nope.conf", "--from", "slurm", "--gpu", "gb200"])
    assert isinstance(missing.exception, OptlayoutError) and "no such file" in str(missing.exception)
