"""The layout package: axes declared once, one stage split, one rank order, error classes a caller can catch."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import optlayout
from optlayout.cost import group_links
from optlayout.emit import emit, megatron_args
from optlayout.errors import InfeasibleError, InputError, OptlayoutError, UnsupportedError
from optlayout.layout import (
    AXES,
    COSTED_ORDER,
    GRID_AXES,
    SEARCHED_AXES,
    Layout,
    format_layout,
    parse_layout,
    rank_map,
    stage_split,
)
from optlayout.layout.ranks import check_costed_order, grid
from optlayout.planning import estimate_layout, explain_layout
from optlayout.solver.space import PIN_KEYS, space_options
from optlayout.specs import JobSpec, ModelSpec
from tests.conftest import run_main

# 61 layers: pp = 4 does not divide them (DeepSeek-V3 has 61 layers)
MODEL_61 = ModelSpec(name="m61", layers=61, hidden=2048, ffn=8192, heads=16, kv_heads=16, vocab=32000)
CLUSTER = "gpu=h100-sxm,gpus=32"


def test_every_field_is_an_axis_and_the_consumers_read_the_declaration() -> None:
    assert [a.name for a in AXES] == list(Layout.model_fields)
    assert [a.key for a in GRID_AXES] == ["tp", "pp", "cp", "dp"]
    assert tuple(a.name for a in SEARCHED_AXES) == PIN_KEYS
    assert "first_stage_layers" not in PIN_KEYS  # derived by the stage split, never pinned
    lay = Layout(tp=2, pp=2, cp=2, dp=3, micro_batch=2, grad_accum=4, sequence_parallel=True, first_stage_layers=3)
    assert lay.gpus == 2 * 2 * 2 * 3
    assert parse_layout(format_layout(lay)) == lay
    assert format_layout(lay) == "tp=2,pp=2,cp=2,dp=3,mb=2,ga=4,sharding=none,recompute=none,sp,first=3"


def test_one_split_policy_61_layers_on_4_stages() -> None:
    # The old fallback of stage_layer_counts gave [15, 16, 15, 15] (middle stages unequal: Megatron refuses it)
    # while the space searched split_layers' [15, 16, 16, 14]. Now a layout without first/last costs the same
    # split the space searches and Megatron's flags express.
    even = Layout(pp=4, dp=8, grad_accum=4)
    explicit = even.model_copy(update={"first_stage_layers": 15, "last_stage_layers": 14})
    assert stage_split(even, 61) == stage_split(explicit, 61) == [15, 16, 16, 14]
    job = JobSpec(seq_len=4096, global_batch=32)
    assert estimate_layout(MODEL_61, CLUSTER, job, even) == estimate_layout(MODEL_61, CLUSTER, job, explicit)
    args = megatron_args(MODEL_61, job, even)
    first = args.index("--decoder-first-pipeline-num-layers")
    assert args[first + 1] == "15" and args[args.index("--decoder-last-pipeline-num-layers") + 1] == "14"


def test_estimate_then_emit_agree_on_the_cli(tmp_path, capsys, monkeypatch) -> None:
    config = {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 61, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    shape = ["--model", str(path), "--seq-len", "4096", "--layout", "pp=4,dp=8,ga=4"]
    code, out, err = run_main(capsys, monkeypatch, "estimate", "--cluster", CLUSTER, *shape, "--json")
    assert code == 0, err
    assert json.loads(out)["prediction"]["fullest_stage"] in (0, 1, 3)
    code, out, err = run_main(capsys, monkeypatch, "emit", "--format", "megatron", *shape)
    assert code == 0, err  # before: "layers on the middle pipeline stages must be equal" for the costed split
    assert "--decoder-first-pipeline-num-layers 15" in out and "--decoder-last-pipeline-num-layers 14" in out


class _Recorder:
    """A link source that records which (size, stride) groups and which point-to-point pairs the cost model
    asks for."""

    def __init__(self) -> None:
        self.asked: set[tuple[int, int]] = set()
        self.pairs: set[tuple[int, int]] = set()

    def dim_bandwidth_Bps(self, size: int, stride: int) -> float:
        self.asked.add((size, stride))
        return 1e9

    def dim_latency_s(self, size: int, stride: int) -> float:
        return 1e-6

    def dim_domains(self, size: int, stride: int) -> int:
        return 1

    def pairs_link(self, first: int, second: int, count: int) -> tuple[float, float]:
        self.pairs.update((first + j, second + j) for j in range(count))
        return 1e9, 1e-6


def _first_group(ranks: list[int]) -> tuple[int, int]:
    """(size, stride) of an evenly spaced group of ranks."""
    return len(ranks), (ranks[1] - ranks[0]) if len(ranks) > 1 else 1


degree = st.sampled_from([1, 2, 3, 4])


@given(tp=degree, cp=degree, dp=degree, pp=degree)
def test_cost_model_prices_the_groups_of_the_rank_map(tp: int, cp: int, dp: int, pp: int) -> None:
    layout = Layout(tp=tp, cp=cp, dp=dp, pp=pp, grad_accum=pp)
    ranks = rank_map(layout, gpus_per_node=layout.gpus, order=COSTED_ORDER)
    source = _Recorder()
    links = group_links(source, layout)
    expected = {
        "tp": _first_group(ranks.groups("tp")[0]),
        "cp": _first_group(ranks.groups("cp")[0]),
        "dp_cp": _first_group(ranks.groups(["dp", "cp"])[0]),
    }
    for name, (size, stride) in expected.items():
        assert getattr(links, name).size == size
        if size > 1:
            assert (size, stride) in source.asked, name
    # every rank's link to its pipeline successor, on every stage boundary, and no other pair
    successors = {(g[i], g[i + 1]) for g in ranks.groups("pp") for i in range(pp - 1)}
    assert source.pairs == successors


def test_a_launch_order_that_moves_groups_is_refused() -> None:
    model, job = optlayout.model_preset("llama3.1-8b"), JobSpec(seq_len=4096)
    moved = parse_layout("tp=2,pp=2,dp=2,ga=2")
    # the rank map itself follows any Megatron order ...
    assert grid(moved, "tp-cp-ep-pp-dp").groups("dp") != grid(moved, COSTED_ORDER).groups("dp")
    # ... but a launch must place the groups the cost model priced
    for fmt in ("megatron", "ranks"):
        with pytest.raises(UnsupportedError, match=r"order: tp-cp-ep-pp-dp puts the dp and pp groups"):
            emit(fmt, model, job, moved, order="tp-cp-ep-pp-dp")
    # with pp = 1 (or dp = 1) both orders place every group alike
    same = parse_layout("tp=2,dp=4")
    check_costed_order(same, "tp-cp-ep-pp-dp")
    assert "--use-tp-pp-dp-mapping" in emit("megatron", model, job, same, order="tp-cp-ep-pp-dp")


def test_emit_takes_a_config_json_model(tmp_path, capsys, monkeypatch) -> None:
    config = {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run_main(capsys, monkeypatch, "emit", "--format", "megatron", "--model", str(path),
                              "--seq-len", "4096", "--layout", "tp=8")  # fmt: skip
    assert code == 0, err
    assert "--num-layers 32" in out


def test_error_classes_a_caller_can_catch() -> None:
    assert issubclass(InputError, OptlayoutError) and issubclass(InfeasibleError, OptlayoutError)
    assert issubclass(UnsupportedError, OptlayoutError) and issubclass(OptlayoutError, ValueError)
    with pytest.raises(InputError, match="layout: unknown key 'xx'"):
        parse_layout("xx=1")
    with pytest.raises(InputError, match="pin: unknown layout field"):
        space_options(pins={"first": 3})
    model = optlayout.model_preset("llama3.1-70b")
    with pytest.raises(UnsupportedError, match="megatron rule"):
        megatron_args(model, JobSpec(seq_len=4096), Layout(tp=3))
    job = JobSpec(seq_len=4096, global_batch=8, optimizer_bytes_per_param=200)
    with pytest.raises(InfeasibleError, match="explain: no legal layout fits"):
        explain_layout(model, "gpu=h100-sxm,gpus=8", job, Layout(tp=8, grad_accum=8))


def test_lazy_exports_are_the_functions() -> None:
    from optlayout import replan, solve

    assert callable(replan) and replan.__module__ == "optlayout.planning.replanning"
    assert callable(solve) and solve.__module__ == "optlayout.planning.search"
    assert optlayout.specs.Layout is Layout is optlayout.Layout


def test_solve_reads_the_topology_file_once(tmp_path, capsys, monkeypatch) -> None:
    import optlayout.topology.load as load

    reads: list[str] = []
    original = load.read_topology_doc

    def counting(path):
        reads.append(str(path))
        return original(path)

    monkeypatch.setattr(load, "read_topology_doc", counting)
    topology = "topologies/worked-example-256x80gb.yaml"
    args = ["--seq-len", "4096", "--global-batch", "512", "--report", str(tmp_path / "r.html")]
    code, _, err = run_main(capsys, monkeypatch, "solve", "--model", "llama3.1-70b", "--topology", topology, *args)
    assert code == 0, err
    assert reads == [topology]


def test_the_run_record_format_states_every_searched_axis() -> None:
    # the run-record format (shared/data/README.md) is a file format of its own: a new searched axis must be
    # added to it on purpose; the accumulation is derived from the batch there
    from optlayout.runs.records import LAYOUT_FIELDS

    assert set(LAYOUT_FIELDS) == {a.name for a in SEARCHED_AXES} - {"grad_accum"}


def test_the_space_builds_its_layouts_as_unchecked_does() -> None:
    """`LayoutGroup.layout` and the search's recomputed-layer variant build the layout `Layout.unchecked` builds (the
    same values in the same order, the same fields set), without its copies; asked again, the same one."""
    from optlayout.layout.model import Layout
    from optlayout.solver.candidates import least_recomputed
    from optlayout.solver.space import SpaceOptions, enumerate_groups

    model = ModelSpec(layers=8, hidden=256, ffn=1024, heads=8, kv_heads=4, vocab=1000)
    options = SpaceOptions(max_micro_batch=2, max_vp=2, pins={"recompute_modules": "core_attn+mlp"})
    seen = 0
    for group in enumerate_groups(model, JobSpec(seq_len=512, global_batch=16), 8, 8, options):
        for sharding, recompute, sp in itertools.product(group.shardings, group.recomputes, group.sequence_parallel):
            want = Layout.unchecked(**group.degrees, sharding=sharding, recompute=recompute,
                                    recompute_layers=group.recompute_layers if recompute == "full" else None,
                                    recompute_modules=group.recompute_modules if recompute == "selective" else None,
                                    sequence_parallel=sp)  # fmt: skip
            got = group.layout(sharding, recompute, sp)
            assert list(got.__dict__.items()) == list(want.__dict__.items())
            assert got.model_fields_set == want.model_fields_set and got == want
            seen += 1
        for sharding, recompute, sp in itertools.product(group.shardings, group.recomputes, group.sequence_parallel):
            again = group.layout(sharding, recompute, sp)  # kept from the first time, and still that layout
            assert (again.sharding, again.recompute, again.sequence_parallel) == (sharding, recompute, sp)
            assert again is group.layout(sharding, recompute, sp)
        lay = group.layout(group.shardings[0], group.recomputes[-1], group.sequence_parallel[0])
        one = least_recomputed(lay.model_copy(update={"recompute": "full", "recompute_modules": None}))
        want = Layout.unchecked(**{**lay.__dict__, "recompute": "full", "recompute_modules": None,
                                   "recompute_layers": 1})  # fmt: skip
        assert (
            list(one.__dict__.items()) == list(want.__dict__.items()) and one.model_fields_set == want.model_fields_set
        )
    assert seen > 100


def test_sequence_parallelism_needs_an_even_split_of_each_cp_ranks_tokens() -> None:
    # Megatron's SP scatters each CP rank's seq / cp tokens over tp (an uneven split asserts): 4,099 tokens split
    # over no tp > 1; 8,196 = 4 x 2,049 over cp 2 leaves 4,098 per rank: tp 2 splits them, tp 4 does not
    from optlayout.layout import layout_problems, parse_layout
    from optlayout.presets import model_preset
    from optlayout.solver.space import enumerate_groups

    model = model_preset("llama3.1-8b")
    odd = JobSpec(seq_len=4099, global_batch=64)
    assert not any(True in g.sequence_parallel for g in enumerate_groups(model, odd, 16, 8, space_options()))
    assert any(True in g.sequence_parallel for g in enumerate_groups(model, JobSpec(seq_len=4096, global_batch=64),
                                                                    16, 8, space_options()))  # fmt: skip
    problems = layout_problems(model, odd, parse_layout("tp=2,dp=8,mb=1,ga=8,sp"), 16)
    assert problems == ["sequence_parallel: the 4099 tokens per CP rank do not split evenly over tp (2)"]
    assert layout_problems(model, odd, parse_layout("tp=2,dp=8,mb=1,ga=8"), 16) == []
    even = JobSpec(seq_len=8196, global_batch=64)
    assert layout_problems(model, even, parse_layout("tp=2,cp=2,dp=4,mb=1,ga=16,sp"), 16) == []
    assert "over tp (4)" in layout_problems(model, even, parse_layout("tp=4,cp=2,dp=2,mb=1,ga=32,sp"), 16)[0]
