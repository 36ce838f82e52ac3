"""Expert parallelism in the layout: the `ep`/`etp` axes, Megatron's rules, the expert rank grid and the links of
its groups (the all-to-all read from every member of every EP group)."""

from __future__ import annotations

import pytest

from optlayout.errors import InputError
from optlayout.layout import Layout, layout_problems, parse_layout
from optlayout.layout.ranks import expert_grid, grid, rank_map
from optlayout.presets import model_preset
from optlayout.solver.space import SpaceOptions, enumerate_layouts
from optlayout.specs import ClusterSpec, JobSpec
from optlayout.topology import topology_from_cluster


def test_text_form_writes_expert_degrees_only_when_set() -> None:
    lay = parse_layout("tp=2,pp=2,cp=2,dp=2,ep=4,etp=2,sp")
    assert (lay.ep, lay.etp, lay.edp) == (4, 2, 1)
    assert parse_layout(lay.short()) == lay and "ep=4,etp=2" in lay.short()
    assert "ep" not in Layout(tp=8, dp=4).short()  # a dense layout's text is unchanged
    assert parse_layout("dp=8,expert_parallel=8").ep == 8


def test_an_expert_grid_that_does_not_fit_is_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"etp\*ep = 16 must divide tp\*cp\*dp = 8") as err:
        parse_layout("tp=2,dp=4,ep=16")
    assert "\n" not in str(err.value)


def test_megatron_rules_tie_expert_parallelism_to_the_model() -> None:
    qwen, gpt, dense = model_preset("qwen3-30b-a3b"), model_preset("gpt-oss-120b"), model_preset("llama3-8b")

    def problems(model, text: str, global_batch: int = 64) -> list[str]:
        lay = parse_layout(text)
        return layout_problems(model, JobSpec(seq_len=4096, global_batch=global_batch), lay, lay.gpus)

    assert problems(qwen, "dp=16,ep=16,ga=4") == [] and problems(qwen, "dp=32,ep=16,etp=2,ga=2") == []
    assert problems(qwen, "dp=12,ep=3,ga=4", global_batch=48) == ["experts (128) not divisible by ep (3)"]
    assert problems(qwen, "tp=2,dp=8,ep=8,ga=8") == ["tp (2) > 1 on an MoE model needs sequence_parallel "
                                                     "(Megatron's MoELayer)"]  # fmt: skip
    assert problems(qwen, "tp=2,dp=8,ep=8,ga=8,sp") == []
    assert problems(gpt, "tp=2,dp=8,ep=8,etp=2,ga=8,sp") == [
        "etp (2) must be 1: the experts carry biases (Megatron: linear biases in MoE)"
    ]
    assert problems(dense, "dp=16,ep=2,ga=4") == ["ep/etp > 1 need a mixture-of-experts model"]


def test_expert_rank_grid_is_megatrons_worked_example() -> None:
    """moe.md section 1.4: 16 GPUs, attention TP2 CP2 DP2 PP2; experts ETP1 EP8 (EDP 1), then ETP2 EP4."""
    lay = parse_layout("tp=2,cp=2,dp=2,pp=2,ep=8,sp")
    dense = grid(lay)
    assert dense.groups("tp")[:2] == [[0, 1], [2, 3]] and dense.groups("cp")[:2] == [[0, 2], [1, 3]]
    assert dense.groups("dp")[:2] == [[0, 4], [1, 5]] and dense.groups("pp")[0] == [0, 8]
    experts = expert_grid(lay)
    assert experts.groups("ep") == [list(range(8)), list(range(8, 16))]  # the whole tp x cp x dp block of a stage
    assert experts.groups("pp") == dense.groups("pp")  # Megatron: the PP groups of both grids are the same
    folded = expert_grid(parse_layout("tp=2,cp=2,dp=2,pp=2,ep=4,etp=2,sp"))
    assert folded.groups("tp")[:2] == [[0, 1], [2, 3]]  # expert-TP
    assert folded.groups("ep")[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert folded.groups("dp")[0] == [0] and folded.grid_dims == ["tp", "ep", "dp", "pp"]
    mapped = rank_map(lay, gpus_per_node=8, expert=True).to_dict()
    assert mapped["groups"]["ep"] == experts.groups("ep") and "tp-ep" in mapped["groups"]


def test_all_to_all_bandwidth_from_every_member_of_the_ep_group() -> None:
    """DGX H100: 450 GB/s NVLink per GPU, one 50 GB/s NIC per GPU; GB200 NVL72: 900 GB/s inside the rack."""
    h100 = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=64))
    # inside a node each member sends 7/8 of its buffer over its NVLink: 450 x 8/7 buffer bytes per second
    assert h100.dim_all_to_all_bandwidth_Bps(8, 1) == pytest.approx(450e9 * 8 / 7)
    # EP16 over two nodes: half of each buffer leaves the node over the member's own 50 GB/s NIC
    assert h100.dim_all_to_all_bandwidth_Bps(16, 1) == pytest.approx(100e9)
    # EP8 at stride 4 (etp 4): two members per node, 6/8 of the buffer over the two NICs they own
    assert h100.dim_all_to_all_bandwidth_Bps(8, 4) == pytest.approx(50e9 / 0.75)
    nvl72 = topology_from_cluster(ClusterSpec(gpu="gb200", gpus=64, gpus_per_node=4, nvlink_domain=72))
    assert nvl72.dim_all_to_all_bandwidth_Bps(64, 1) == pytest.approx(900e9 * 64 / 63)  # one NVLink domain
    two_racks = topology_from_cluster(ClusterSpec(gpu="gb200", gpus=144, gpus_per_node=4, nvlink_domain=72))
    # 144 = 2 racks: 72 members per rack, half of each buffer leaves it over 400 Gb/s per GPU
    assert two_racks.dim_all_to_all_bandwidth_Bps(144, 1) == pytest.approx(50e9 * 2)


def test_space_enumerates_the_expert_axes_of_moe_models_only() -> None:
    job = JobSpec(seq_len=4096, global_batch=64)
    options = SpaceOptions(max_micro_batch=1, max_vp=1)
    qwen = model_preset("qwen3-30b-a3b")
    layouts = list(enumerate_layouts(qwen, job, 16, 8, options))
    pairs = {(lay.ep, lay.etp) for lay in layouts}
    assert (16, 1) in pairs and (8, 2) in pairs and (1, 8) in pairs and (3, 1) not in pairs
    assert all(layout_problems(qwen, job, lay, 16) == [] for lay in layouts)
    assert all(lay.sequence_parallel for lay in layouts if lay.tp > 1)
    dense = list(enumerate_layouts(model_preset("llama3-8b"), job, 16, 8, options))
    assert {(lay.ep, lay.etp) for lay in dense} == {(1, 1)}
    gpt = list(enumerate_layouts(model_preset("gpt-oss-20b"), job, 16, 8, options))
    assert {lay.etp for lay in gpt} == {1}  # biased experts: etp 1 only


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ("ep=3", "expert degrees: experts (128) not divisible by ep (3)"),
        ("ep=32", "expert grid: the EP group does not fit: etp x ep = 32 must divide the GPUs (16)"),
    ],
)
def test_bad_expert_pins_name_the_rule(cli, pin: str, message: str) -> None:
    proc = cli("solve", "--model", "qwen3-30b-a3b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
               "--global-batch", "1024", "--pin", pin, "--json")  # fmt: skip
    assert proc.returncode == 1
    assert message in " ".join(proc.stdout.split())
