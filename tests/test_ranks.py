"""Rank map: Megatron's documented grouping, an independent numpy model of the order, domains and launch forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optlayout.emit.ranks import (
    ORDERS,
    check_groups_in_domain,
    check_tp_in_domain,
    env_lines,
    hostfile,
    rank_map,
    render,
)
from optlayout.errors import OptlayoutError
from optlayout.specs import Layout


def test_megatron_documented_grouping_w16_tp2_dp2_pp4():
    # parallel_state.initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 (so dp=2).
    rm = rank_map(Layout(tp=2, dp=2, pp=4))
    assert rm.world_size == 16
    assert rm.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert rm.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert rm.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert rm.groups("cp") == [[r] for r in range(16)]


def test_tp_pp_dp_order_moves_dp_outermost():
    rm = rank_map(Layout(tp=2, dp=2, pp=4), order="tp-cp-ep-pp-dp")
    assert rm.groups("pp") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert rm.groups("dp") == [[r, r + 8] for r in range(8)]


def _reference_groups(sizes: dict[str, int], order: str, dims: tuple[str, ...]) -> list[list[int]]:
    """Independent model: arange(W) shaped with the last order token as axis 0 (first token fastest)."""
    tokens = order.split("-")
    rev = tokens[::-1]
    grid = np.arange(int(np.prod([sizes[t] for t in tokens]))).reshape([sizes[t] for t in rev])
    outer = [rev.index(t) for t in rev if t not in dims]
    inner = [rev.index(t) for t in rev if t in dims]
    inner_size = int(np.prod([sizes[t] for t in dims]))
    return grid.transpose(outer + inner).reshape(-1, inner_size).tolist()


degree = st.sampled_from([1, 2, 3, 4])


@settings(max_examples=150, deadline=None)
@given(tp=degree, cp=degree, dp=degree, pp=degree, order=st.sampled_from(ORDERS))
def test_groups_match_numpy_reshape(tp, cp, dp, pp, order):
    layout = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
    rm = rank_map(layout, gpus_per_node=layout.gpus, order=order)
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    for dims in (("tp",), ("cp",), ("dp",), ("pp",), ("dp", "cp"), ("tp", "cp")):
        assert rm.groups(dims) == _reference_groups(sizes, order, dims), dims
    for rank in range(rm.world_size):
        coords = rm.coords(rank)
        assert rm.rank_of(**coords) == rank
        for dims in ("tp", "cp", "dp", "pp"):
            group = rm.group_of(rank, dims)
            assert rank in group
            assert group in rm.groups(dims)


@settings(max_examples=50, deadline=None)
@given(tp=degree, dp=degree, pp=degree, gpn=st.sampled_from([1, 2, 4, 8]))
def test_node_and_local_rank_follow_torchrun(tp, dp, pp, gpn):
    layout = Layout(tp=tp, dp=dp, pp=pp)
    if layout.gpus > gpn and layout.gpus % gpn:
        with pytest.raises(OptlayoutError, match="gpus_per_node"):
            rank_map(layout, gpus_per_node=gpn)
        return
    rm = rank_map(layout, gpus_per_node=gpn)
    for rank in range(rm.world_size):
        assert rank == rm.node_of(rank) * rm.local_world_size + rm.local_rank(rank)


def test_tp_in_domain_by_node_size():
    layout = Layout(tp=8, pp=4, dp=2)
    assert check_tp_in_domain(rank_map(layout), 8) == []
    bad = check_tp_in_domain(rank_map(layout, gpus_per_node=4), 4)
    assert len(bad) == 8
    assert bad[0].group == list(range(8))
    assert bad[0].domains == ["node0", "node1"]
    assert "spans domains node0, node1" in str(bad[0])


class _FakeTopology:
    """Duck-typed stand-in for optlayout.topology.Topology: NVL-style 16-GPU domains over 4-GPU nodes."""

    def domain_of(self, rank: int) -> str:
        return f"nvl{rank // 16}"


def test_tp_in_domain_accepts_domain_of_objects_and_callables():
    rm = rank_map(Layout(tp=16, dp=4), gpus_per_node=4)
    assert check_tp_in_domain(rm, _FakeTopology()) == []
    assert check_tp_in_domain(rm, 4)  # domain = node: a 16-way TP group spans 4 nodes
    assert check_tp_in_domain(rm, lambda r: "one") == []
    wide = rank_map(Layout(tp=32, dp=2), gpus_per_node=4)
    assert len(check_tp_in_domain(wide, _FakeTopology())) == 2
    assert check_groups_in_domain(rm, ("tp", "dp"), _FakeTopology())


def test_tp_pp_dp_order_still_keeps_tp_on_a_node():
    rm = rank_map(Layout(tp=8, pp=4, dp=2), order="tp-cp-ep-pp-dp")
    assert check_tp_in_domain(rm, 8) == []


def test_bad_domain_argument():
    with pytest.raises(OptlayoutError, match="domain"):
        check_tp_in_domain(rank_map(Layout(tp=2)), "node")  # type: ignore[arg-type]


def test_hostfile_and_env_lines():
    rm = rank_map(Layout(tp=8, dp=2), hostnames=["gpu-a", "gpu-b"])
    assert hostfile(rm) == "gpu-a slots=8\ngpu-b slots=8\n"
    lines = env_lines(rm).splitlines()
    assert len(lines) == 16
    assert lines[9] == "RANK=9 LOCAL_RANK=1 GROUP_RANK=1 WORLD_SIZE=16 LOCAL_WORLD_SIZE=8  # gpu-b"
    placeholder = rank_map(Layout(tp=4, dp=4))
    assert hostfile(placeholder) == "node0 slots=8\nnode1 slots=8\n"


def test_small_world_is_one_partial_node():
    rm = rank_map(Layout(tp=2, dp=2))
    assert (rm.num_nodes, rm.local_world_size) == (1, 4)
    assert hostfile(rm) == "node0 slots=4\n"


def test_bad_inputs():
    with pytest.raises(OptlayoutError, match="hostnames"):
        rank_map(Layout(tp=8, dp=2), hostnames=["only-one"])
    with pytest.raises(OptlayoutError, match="order"):
        rank_map(Layout(tp=2), order="pp-dp-tp")
    with pytest.raises(OptlayoutError, match="multiple of gpus_per_node"):
        rank_map(Layout(tp=4, dp=3), gpus_per_node=8)
    rm = rank_map(Layout(tp=2))
    with pytest.raises(OptlayoutError, match="unknown dimension"):
        rm.groups("sp")
    with pytest.raises(OptlayoutError, match="outside"):
        rm.coords(2)


def test_render_and_dict_are_consistent():
    rm = rank_map(Layout(tp=2, cp=2, dp=2, pp=2), gpus_per_node=4)
    text = render(rm)
    assert "# tp groups\n[0, 1]\n[2, 3]" in text
    assert "# TP groups inside one node: yes" in text
    assert "node1 slots=4" in text
    d = rm.to_dict()
    assert d["world_size"] == 16 and d["num_nodes"] == 4
    assert d["groups"]["dp-cp"][0] == [0, 2, 4, 6]
    assert d["ranks"][5] == {
        "rank": 5,
        "node": 1,
        "host": "node1",
        "local_rank": 1,
        "tp": 1,
        "cp": 0,
        "ep": 0,
        "dp": 1,
        "pp": 0,
    }
