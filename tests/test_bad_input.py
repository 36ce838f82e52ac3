"""Bad input never crashes, hangs or prints NaN (issue 17): one regression test per class of bad input, then a
property-based fuzz suite over every command and file kind (fixed seed, bounded count, a time budget per case)."""

from __future__ import annotations

import gzip
import json
import math
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optlayout
from optlayout.errors import InputError, OptlayoutError
from optlayout.inputs.files import read_bytes, read_text
from optlayout.inputs.json_doc import parse_json
from optlayout.inputs.limits import MAX_DEPTH, MAX_GPUS, MAX_YAML_NODES
from optlayout.inputs.yaml_doc import LIBYAML, parse_yaml

sys.path.insert(0, str(Path(__file__).parent))
import hostile

FIXTURES = Path(__file__).parent / "fixtures"
TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"


@contextmanager
def budget(seconds: int) -> Iterator[None]:
    """Fail a case that runs past `seconds` (an in-process alarm: a hang is a failure, never a stuck suite)."""

    def expire(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"ran past its {seconds} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(call: Callable[[], object], *fragments: str) -> str:
    """The one-line InputError `call` raises, checked to contain every fragment."""
    with budget(20), pytest.raises(InputError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------------------------------------- files


def test_files_missing_directory_binary_and_too_large(tmp_path: Path) -> None:
    refused(lambda: read_text(tmp_path / "nope.yaml", "topology", 100), "topology: no such file")
    refused(lambda: read_text(tmp_path, "topology", 100), "is a directory")
    (tmp_path / "bin.yaml").write_bytes(b"gpu: h100\n\xff\xfe")
    refused(lambda: read_text(tmp_path / "bin.yaml", "topology", 100), "not UTF-8 text (byte 0xff at offset 10)")
    refused(lambda: read_bytes("/dev/zero", "topology", 1 << 20), "larger than the 1 MiB")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf{}")
    assert read_text(tmp_path / "bom.json", "plan", 100) == "{}"


def test_json_is_strict_and_depth_limited() -> None:
    refused(lambda: parse_json('{"a": NaN}', "plan p.json"), "plan p.json: NaN is not a number JSON allows")
    refused(lambda: parse_json('{"a": 1e400}', "p"), "overflows")
    refused(lambda: parse_json('{"a": ' + "9" * 5000 + "}", "p"), "an integer of 5000 digits")
    refused(lambda: parse_json('{"id": 1, "id": 2}', "p"), "duplicate key 'id'")
    refused(lambda: parse_json("[" * 100_000 + "]" * 100_000, "p"), f"nested deeper than {MAX_DEPTH} levels")
    refused(lambda: parse_json("[" * 100 + "]" * 100, "p"), f"nested deeper than {MAX_DEPTH} levels")
    refused(lambda: parse_json('{"a": 1', "p"), "not valid JSON")
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "p") is not None


def test_yaml_refuses_duplicate_keys_alias_bombs_and_deep_nesting() -> None:
    assert LIBYAML, "PyYAML without libyaml: install a PyYAML wheel with its C loader"
    refused(lambda: parse_yaml("servers: 4\nservers: 400\n", "topology t.yaml"),
            "topology t.yaml: line 2: duplicate key 'servers' (first given at line 1)")  # fmt: skip
    refused(lambda: parse_yaml("nics: {gbps: 400, gbps: 100}\n", "t"), "duplicate key 'gbps'")
    assert parse_yaml("a: &x {p: 1}\nb:\n  <<: *x\n  p: 2\n", "t") == {"a": {"p": 1}, "b": {"p": 2}}  # merge keys
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join('*' + chr(97 + i) for _ in range(9))}]\n" for i in range(8)
    )  # 9^9 = 387 million nodes once expanded
    refused(lambda: parse_yaml(bomb, "t"), f"aliases expand the document past {MAX_YAML_NODES:,} nodes")
    refused(lambda: parse_yaml("a: &a [*a]\n", "t"), f"nested deeper than {MAX_DEPTH} levels")  # endless
    refused(lambda: parse_yaml("[" * 100_000 + "]" * 100_000, "t"), "YAML syntax error")
    refused(lambda: parse_yaml("a: " + "[" * 100 + "]" * 100, "t"), f"nested deeper than {MAX_DEPTH} levels")
    refused(lambda: parse_yaml("a: " + "9" * 5000, "t"), "an integer of 5000 digits")
    refused(lambda: parse_yaml("a: 1\n---\nb: 2\n", "t"), "at line 2, column 1: expected a single document")
    refused(lambda: parse_yaml("a: !!python/object/apply:os.system ['true']\n", "t"), "YAML syntax error")


# ---------------------------------------------------------------------------------------------- topologies


GEN = "gpu: h100-sxm\nservers: 2\ngpus_per_server: 8\n"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("gpu: h100-sxm\nservers: true\ngpus_per_server: 8\n", ["servers: Input should be a valid integer (got True)"]),
        ("gpu: h100-sxm\nservers: '4'\ngpus_per_server: 8\n", ["servers: Input should be a valid integer (got '4')"]),
        ("gpu: h100-sxm\nservers: 4\nservers: 400\ngpus_per_server: 8\n", ["duplicate key 'servers'"]),
        ("gpu: h100-sxm\nservers: 2\ngpus_per_server: 18446744073709551616\n", ["gpus_per_server", "less than or"]),
        ("gpu: h100-sxm\nservers: 1\ngpus_per_server: 10000000\n", ["gpus_per_server: Input should be less than"]),
        ("gpu: h100-sxm\nservers: 131072\ngpus_per_server: 4096\n", ["GPUs, over 1,048,576"]),
        (
            "gpu: h100-sxm\nservers: 64\ngpus_per_server: 8\nfabric: {spine_switches: 60000, servers_per_leaf: 1}\n",
            ["size: the graph would hold about 30,"],
        ),
        ("gpu: h100-sxm\nservers: 256\ngpus_per_server: 4096\nscale_up: {kind: mesh}\n", ["the graph would hold"]),
        (GEN + "nics: {gbps: .inf}\n", ["nics.gbps: Input should be a finite number"]),
        (GEN + "nics: {gbps: .nan}\n", ["nics.gbps: Input should be a finite number"]),
        (GEN + "nics: {gbps: 1.0e-300}\n", ["nics.gbps: Input should be greater than or equal to 0.0008"]),
        (GEN + "fabric: {oversubscription: .inf}\n", ["fabric.oversubscription: Input should be a finite number"]),
        (GEN + "scale_up: {kind: nvswitch, latency_us: .inf}\n", ["scale_up.latency_us"]),
        (GEN + "nics: {latency_us: -1}\n", ["nics.latency_us: Input should be greater than or equal to 0"]),
        ("gpu: h100-sxm\nname: " + "x" * 100 + "\nservers: 1.5\ngpus_per_server: 8\n", ["servers", "(got 1.5)"]),
    ],
)
def test_topology_fields_are_strict_finite_and_bounded(text: str, fragments: list[str], tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    refused(lambda: optlayout.load_topology(path), *fragments)


def test_zero_nics_between_servers_and_tiny_links_are_refused_not_divided_by() -> None:
    from optlayout.topology import topology_from_dict

    refused(lambda: topology_from_dict(yaml.safe_load(GEN + "nics: {per_server: 0}\n")), "no path to a NIC")
    explicit = {
        "gpu": "h100-sxm",
        "nodes": [{"id": "g0", "kind": "gpu", "server": "s0"}, {"id": "sw", "kind": "nvswitch"}],
        "edges": [{"a": "g0", "b": "sw", "bandwidth_Bps": 5e-324}],
    }
    refused(lambda: topology_from_dict(explicit), "edges.0.bandwidth_Bps: Input should be greater than or equal")


def test_error_values_are_shortened() -> None:
    from optlayout.topology import topology_from_dict

    message = refused(lambda: topology_from_dict({"gpu": "x" * 10_000, "servers": [1] * 10_000}))
    assert len(message) < 300


def test_slurm_hostlists_and_trees_are_bounded() -> None:
    from optlayout.topology.discovery import DiscoverOptions, discover, expand_hostlist

    opts = DiscoverOptions(gpu="h100-sxm")
    refused(lambda: discover("slurm", "SwitchName=s0 Nodes=n[0-99999999]\n", opts), "names more than 131,072 hosts")
    refused(lambda: expand_hostlist("a[0-9999]b[0-9999]"), "names more than")
    refused(lambda: expand_hostlist("n[0-" + "9" * 5000 + "]"), "bad range")
    chain = "".join(f"SwitchName=s{i} Switches=s{i + 1}\n" for i in range(5000)) + "SwitchName=s5000 Nodes=n0\n"
    refused(lambda: discover("slurm", chain, opts), "deeper than 16 tiers")
    refused(lambda: discover("slurm", "SwitchName=a Nodes=n0\nSwitchName=a Nodes=n1\n", opts), "defined twice")
    assert expand_hostlist("dev[00-02],x") == ["dev00", "dev01", "dev02", "x"]


def test_slurm_with_many_switches_builds_in_linear_time() -> None:
    from optlayout.topology import topology_from_dict
    from optlayout.topology.discovery import DiscoverOptions, discover

    text = "".join(f"SwitchName=l{i} Nodes=n{i}\n" for i in range(4000)) + "SwitchName=top Switches=l[0-3999]\n"
    with budget(60):
        topo = topology_from_dict(discover("slurm", text, DiscoverOptions(gpu="h100-sxm")))
    assert topo.num_servers == 4000


@pytest.mark.parametrize(
    ("attribute", "value", "fragment"),
    [
        ("count", "abc", "<nvlink count>: expected an integer, got 'abc'"),
        ("link_width", "abc", "<pci link_width>: expected an integer"),
        ("sm", "abc", "<gpu sm>: expected an integer"),
        ("speed", "abc", "<net speed>: expected a finite number, got 'abc'"),
        ("speed", "nan", "<net speed>: expected a finite number, got 'nan'"),
        ("count", "-5", "1 to 64 links"),
        ("count", "9" * 5000, "<nvlink count>: expected an integer"),
    ],
)
def test_nccl_xml_attributes_are_numbers(attribute: str, value: str, fragment: str) -> None:
    import re

    from optlayout.topology.discovery import DiscoverOptions, discover

    text = (FIXTURES / "discovery" / "nccl-topo-dgx-h100.xml").read_text()
    bad = re.sub(rf'{attribute}="[^"]*"', f'{attribute}="{value}"', text)
    refused(lambda: discover("nccl-xml", bad, DiscoverOptions()), "nccl-xml", fragment)


def test_nccl_xml_without_entities_or_deep_nesting() -> None:
    from optlayout.topology.discovery import DiscoverOptions, discover

    bomb = '<?xml version="1.0"?><!DOCTYPE s [<!ENTITY a "aaaa">]><system>&a;</system>'
    refused(lambda: discover("nccl-xml", bomb, DiscoverOptions()), "a DTD or entity declaration is not accepted")
    deep = '<system><cpu numaid="0">' + "<pci>" * 10_000 + "</pci>" * 10_000 + "</cpu></system>"
    refused(lambda: discover("nccl-xml", deep, DiscoverOptions()), f"nested deeper than {MAX_DEPTH} levels")


# ---------------------------------------------------------------------------------------------- models and runs


def _hf(**changes: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((FIXTURES / "hf" / "llama3.1-8b.json").read_text())
    return {k: v for k, v in (cfg | changes).items() if v is not None}


def test_hf_config_types_are_checked_before_any_arithmetic() -> None:
    from optlayout.presets import model_from_hf_config

    shape = model_from_hf_config(_hf())
    assert (shape.layers, shape.hidden, shape.ffn, shape.heads, shape.kv_heads) == (32, 4096, 14336, 32, 8)
    # a string hidden size with no intermediate_size used to become ffn 4096409640964096
    refused(lambda: model_from_hf_config(_hf(hidden_size="4096", intermediate_size=None)),
            "model-config: hidden_size must be an integer in [1, 2^31], got '4096' (a string)")  # fmt: skip
    refused(lambda: model_from_hf_config(_hf(text_config="x", hidden_size=None)), "text_config must be an object")
    refused(lambda: model_from_hf_config(_hf(num_attention_heads=True)), "num_attention_heads must be an integer")
    refused(lambda: model_from_hf_config(_hf(num_attention_heads=32.0)), "num_attention_heads must be an integer")
    refused(lambda: model_from_hf_config(_hf(num_attention_heads=10**9, num_key_value_heads=10**9)),
            "heads: Input should be less than or equal to 16384")  # fmt: skip
    refused(lambda: model_from_hf_config(_hf(hidden_act=5)), "hidden_act must be a string")


def test_model_spec_is_strict_and_bounded() -> None:
    from optlayout.planning import resolve_model

    base = {"layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "vocab": 128256}
    refused(lambda: resolve_model(base | {"hidden": "4096"}), "model: hidden: Input should be a valid integer")
    refused(lambda: resolve_model(base | {"layers": 10**9}), "layers: Input should be less than or equal to 16384")
    refused(lambda: resolve_model(base | {"layers": True}), "layers: Input should be a valid integer")


GOOD_RECORD = (FIXTURES / "runs" / "runs.jsonl").read_text().splitlines()[0]


@pytest.mark.parametrize(
    ("content", "suffix", "fragment"),
    [
        ("3\n", ".jsonl", "runs: r.jsonl line 1 is a number, not a run-record object"),
        (GOOD_RECORD + "\n[1, 2]\n", ".jsonl", "line 2 is a list, not a run-record object"),
        ("[1, 2]", ".json", "r.json item 0 is a number"),
        ('{"a": NaN}\n', ".jsonl", "runs r.jsonl line 1: NaN is not a number JSON allows"),
        ("id,layout,layout.tp\nx,1,2\n", ".csv", "column 'layout.tp' conflicts with column 'layout'"),
        ("id,layout.tp,layout\nx,1,2\n", ".csv", "column 'layout' conflicts with the columns under it"),
        ("id,model.name\nx," + "y" * 200_000 + "\n", ".csv", "not valid CSV (field larger than field limit"),
        ("", ".jsonl", "holds no run records"),
    ],
)
def test_run_records_refuse_what_is_not_a_record(content: str, suffix: str, fragment: str, tmp_path: Path) -> None:
    from optlayout.runs.records import read_runs

    path = tmp_path / f"r{suffix}"
    path.write_text(content)
    refused(lambda: read_runs(path), fragment)


def _record_with(path: tuple[str, ...], value: Any) -> str:
    record = json.loads((FIXTURES / "runs" / "runs.jsonl").read_text().splitlines()[0])
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(record)


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (("layout", "sharding"), "banana", "layout.sharding: Input should be"),
        (("layout", "tp"), True, "layout.tp: Input should be a valid integer"),
        (("model", "hidden"), "4096", "model.hidden: Input should be a valid integer"),
        (("model", "layers"), 10**9, "model.layers: Input should be less than or equal to 16384"),
        (("job", "seq_len"), 10**9, "job.seq_len: Input should be less than or equal to"),
        (("cluster", "gpus"), 2**64, "cluster.gpus: Input should be less than or equal to 1048576"),
    ],
)
def test_run_record_fields_are_validated_at_load(
    path: tuple[str, ...], value: Any, fragment: str, tmp_path: Path
) -> None:
    from optlayout.runs.records import read_runs

    runs = tmp_path / "r.jsonl"
    runs.write_text(_record_with(path, value) + "\n")
    refused(lambda: read_runs(runs), fragment)


def test_csv_numbers_are_converted_explicitly(tmp_path: Path) -> None:
    from optlayout.runs.records import read_runs

    lines = (FIXTURES / "runs" / "runs.csv").read_text().splitlines()
    path = tmp_path / "r.csv"
    path.write_text(lines[0] + "\n" + lines[1].replace("10152.75", "nan") + "\n")
    refused(lambda: read_runs(path), "measured.tokens_per_s_per_gpu: Input should be a valid number (got 'nan')")


@pytest.mark.parametrize(
    ("field", "value"),
    [("number of skipped iterations", "nan"), ("number of nan iterations", "1e400"),
     ("elapsed time per iteration (ms)", "inf"), ("global batch size", "nan")],
)  # fmt: skip
def test_megatron_counters_must_be_finite(field: str, value: str) -> None:
    import re

    from optlayout.runs.logs import measure_megatron

    text = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    bad = re.sub(re.escape(field) + r":\s*[^|]*", f"{field}: {value} ", text, count=1)
    refused(lambda: measure_megatron(bad, 8192, 128, 8), f"{field!r} is not a finite number ({value!r})")


@pytest.mark.parametrize(
    ("field", "value"),
    [("elapsed time per iteration (ms)", "0.0"), ("elapsed time per iteration (ms)", "-12.5"),
     ("global batch size", "0")],
)  # fmt: skip
def test_megatron_times_and_batches_must_be_positive(field: str, value: str) -> None:
    import re

    from optlayout.runs.logs import measure_megatron

    text = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    bad = re.sub(re.escape(field) + r":\s*[^|]*", f"{field}: {value} ", text)  # every line, as a broken logger writes
    message = refused(lambda: measure_megatron(bad, 8192, 128, 8), f"{field!r} is {value}, not positive")
    assert "has no" not in message


def test_torchtitan_tokens_per_s_must_be_positive() -> None:
    import re

    from optlayout.runs.logs import measure_torchtitan

    text = re.sub(r"tps: [0-9,.]+", "tps: 0", (FIXTURES / "runs" / "torchtitan_llama31_8b.log").read_text())
    refused(lambda: measure_torchtitan(text, 8192, 8), "(step 1): tps is 0, not positive")


def test_log_counts_of_thousands_of_digits_are_refused() -> None:
    from optlayout.runs.logs import measure_megatron, measure_torchtitan

    meg = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    refused(lambda: measure_megatron(meg.replace("using world size: 8", "using world size: " + "9" * 5000),
                                     8192, 128, 8), "world size: expected an integer")  # fmt: skip
    titan = (FIXTURES / "runs" / "torchtitan_llama31_8b.log").read_text()
    refused(lambda: measure_torchtitan(titan.replace("step: 10", "step: " + "9" * 5000, 1), 8192, 8),
            "line 20 (step 99999999999999999...): step: expected an integer")  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("global batch size 8,", "global batch size " + "9" * 5000 + ",", "the trainer-init line: expected an integer"),
        ("dim=4096, ", "", "the model-args line lacks dim"),
        ("n_heads=32,", "n_heads=3x2,", "the model-args line: n_heads: expected an integer, got '3x2'"),
    ],
)
def test_torchtitan_log_facts_are_counts_or_refused(old: str, new: str, fragment: str) -> None:
    from optlayout.runs.logs import torchtitan_facts

    titan = (FIXTURES / "runs" / "torchtitan_llama31_8b.log").read_text()
    assert old in titan
    refused(lambda: torchtitan_facts(titan.replace(old, new, 1)), fragment)


def test_torchtitan_config_echo_values_are_checked() -> None:
    from optlayout.runs.logs import torchtitan_facts

    echo = '[rank0]:[titan] - root - INFO - Running with args: {"parallelism": {"tensor_parallel_degree": "2"}}'
    refused(lambda: torchtitan_facts(echo), "the config echo's parallelism.tensor_parallel_degree is not a count")
    echo = '[rank0]:[titan] - root - INFO - Running with args: {"model": {"converters": [3]}}'
    refused(lambda: torchtitan_facts(echo), "model.converters is not a list of names")


def test_log_arguments_that_are_not_ascii_counts_are_refused() -> None:
    from optlayout.runs.logs import megatron_facts

    meg = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    assert "global_batch_size ............................... 128" in meg
    bad = meg.replace("global_batch_size ............................... 128",
                      "global_batch_size ............................... 1\u00b2")  # fmt: skip
    refused(lambda: megatron_facts(bad), "a Megatron argument: expected an integer, got '1\u00b2'")


# ---------------------------------------------------------------------------------------------- traces


def _trace(tmp_path: Path, events: Any, **top: Any) -> Path:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events, **top}).encode()))
    return path


EV = {"ph": "X", "ts": 1.0, "dur": 2.0, "name": "aten::mm", "pid": 1, "tid": 1, "cat": "cpu_op"}


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        (EV | {"tid": [1]}, "event 0: tid must be a number or a string, got list"),
        (EV | {"ts": float("nan")}, "NaN is not a number JSON allows"),
        (EV | {"dur": float("inf")}, "Infinity is not a number JSON allows"),
        (EV | {"dur": -5.0}, "dur is not a duration >= 0"),
        (EV | {"ts": 10**400}, "ts is not a timestamp"),
        (EV | {"ts": "1"}, "ts is not a timestamp"),
    ],
)
def test_trace_events_are_checked(event: dict[str, Any], fragment: str, tmp_path: Path) -> None:
    from optlayout.trace import analyze

    refused(lambda: analyze([_trace(tmp_path, [event])]), fragment)


def test_trace_values_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import optlayout.trace.analysis as analysis
    from optlayout.trace import analyze

    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": ' + "[" * 100_000 + "]" * 100_000 + "}]}")
    refused(lambda: analyze([deep]), "nested too deep")
    monkeypatch.setattr(analysis, "MAX_EVENT_BYTES", 1 << 20)  # the 64 MiB bound, scaled down for the test
    huge = tmp_path / "huge.json"
    huge.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "name": "' + "a" * (3 << 20) + '"}]}')
    refused(lambda: analyze([huge]), "one JSON value is longer than 1 MiB")
    refused(lambda: analyze([tmp_path]), "is a directory")


# ---------------------------------------------------------------------------------------------- the solver


def test_layouts_and_pins_are_bounded() -> None:
    from optlayout.layout import parse_layout

    refused(lambda: parse_layout("tp=100000000000000000000"), "layout: tp must be a positive integer")
    refused(lambda: parse_layout(f"pp={MAX_GPUS + 1}"), "layout: pp must be at most 1,048,576")
    with pytest.raises(pydantic.ValidationError, match="Input should be a valid integer"):
        optlayout.Layout.model_validate({"tp": True})  # a bool is no degree (pydantic's own error: its API)


def test_huge_requests_are_refused_or_answered_not_enumerated() -> None:
    cluster = "gpu=h100-sxm,gpus=16"
    job = optlayout.JobSpec(seq_len=4096, global_batch=64)
    refused(lambda: optlayout.solve("llama3-8b", cluster, job, top=10**9), "top: must be 1 to 1000")
    with budget(60):  # a pinned micro-batch and a wide batch range are not walked value by value
        plan = optlayout.solve("llama3-8b", cluster, optlayout.JobSpec(seq_len=4096, max_global_batch=2**24),
                               pins={"micro_batch": 2**20})  # fmt: skip
    assert plan.status == "infeasible" and plan.diagnosis


def test_cpsat_coefficients_stay_in_range() -> None:
    """Memory past the capacity is clamped (it cannot fit either way), no limit is the largest integer."""
    import dataclasses

    from optlayout.solver.candidates import Limits
    from optlayout.solver.cpsat import solve_top_k
    from optlayout.solver.problem import Problem
    from optlayout.topology import resolve_cluster

    job = optlayout.JobSpec(seq_len=4096, global_batch=64)
    problem = Problem(optlayout.model_preset("llama3-8b"), job, resolve_cluster("gpu=h100-sxm,gpus=8"))
    candidates = [problem.table.candidate(lay) for lay in problem.layouts()][:20]
    fits = solve_top_k(candidates, Limits(80e9))
    assert fits.ranked
    # every layout but the best one needs 1e300 bytes: the model still builds, and only the best one fits
    best = fits.ranked[0]
    huge = [c if c is best else dataclasses.replace(
        c, evaluation=dataclasses.replace(c.evaluation, memory=dataclasses.replace(
            c.evaluation.memory, activations_bytes=1e300)))
        for c in candidates]  # fmt: skip
    assert huge[0].evaluation.memory_per_gpu_bytes >= 1e300 or huge[0] is best
    assert solve_top_k(huge, Limits(80e9), top_k=3).ranked == [best]
    unlimited = solve_top_k(candidates, Limits(math.inf)).ranked  # no memory limit: the fastest of all
    assert unlimited[0].cluster_tokens_per_s == max(c.cluster_tokens_per_s for c in candidates)


def test_replan_is_the_function() -> None:
    from optlayout import replan

    assert callable(replan) and replan.__name__ == "replan"


# ---------------------------------------------------------------------------------------------- the CLI


def test_json_output_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    from optlayout.cli.common import print_json

    with pytest.raises(OptlayoutError, match=r"result: layouts\.0\.mfu = nan is not a finite number"):
        print_json({"layouts": [{"mfu": float("nan")}]})
    assert capsys.readouterr().out == ""


def test_shorthand_assumptions_are_said(cli: Callable[..., Any]) -> None:
    out = cli("solve", "--model", "llama3-8b", "--cluster", "gpu=a100-80gb,gpus=16", "--seq-len", "4096",
              "--global-batch", "64", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assumed = json.loads(out.stdout)["assumed"]
    assert assumed["inter_node_gbps_per_gpu"]["value"] == 400.0 and "DGX A100 has 200" in assumed[
        "inter_node_gbps_per_gpu"]["why"]  # fmt: skip
    assert set(assumed) == {"gpus_per_node", "nvlink_domain", "inter_node_gbps_per_gpu", "oversubscription"}
    stated = cli("topology", "show", "--cluster", "gpu=a100-80gb,gpus=16,inter_node_gbps_per_gpu=200", "--json")
    assert "inter_node_gbps_per_gpu" not in json.loads(stated.stdout)["assumed"]
    text = cli("topology", "show", "--cluster", "gpu=a100-80gb,gpus=16")
    assert "assumed inter_node_gbps_per_gpu=400.0 (not given: 400 Gb/s" in text.stdout


def test_outputs_never_replace_inputs_nor_follow_links(cli: Callable[..., Any], tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_bytes((FIXTURES / "runs" / "runs.jsonl").read_bytes())
    out = cli("calibrate", str(runs), "-o", str(runs))
    assert out.returncode == 2 and "is also an input of this command" in out.stderr
    assert runs.read_bytes() == (FIXTURES / "runs" / "runs.jsonl").read_bytes()
    topo = tmp_path / "t.yaml"
    topo.write_bytes((TOPOLOGIES / "dgx-h100.yaml").read_bytes())
    link = tmp_path / "plan.json"
    link.symlink_to(topo)
    solve = ["solve", "--model", "llama3-8b", "--topology", str(topo), "--seq-len", "4096", "--global-batch", "64"]
    out = cli(*solve, "--save", str(link))
    assert out.returncode == 2 and "is a symbolic link" in out.stderr and topo.read_bytes().startswith(b"# DGX")
    plan = tmp_path / "real.json"
    first = cli(*solve, "--save", str(plan))
    assert first.returncode == 0 and f"wrote {plan}" in first.stderr
    again = cli(*solve, "--save", str(plan))
    assert again.returncode == 0 and f"replaced {plan}" in again.stderr
    # two outputs of one command on one file: the second would replace the first
    both = cli(*solve, "--save", str(tmp_path / "p.json"), "--report", str(tmp_path / "p.json"))
    assert both.returncode == 2 and "--report: " in both.stderr and "is also the file of --save" in both.stderr
    assert not (tmp_path / "p.json").exists()
    fit = cli("calibrate", str(runs), "-o", str(tmp_path / "c.yaml"), "--heldout", str(tmp_path / "c.yaml"))
    assert fit.returncode == 2 and "is also the file of --output" in fit.stderr and not (tmp_path / "c.yaml").exists()


def test_report_is_reproducible_unless_timings_are_asked_for(cli: Callable[..., Any], tmp_path: Path) -> None:
    args = ["solve", "--model", "llama3-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
            "--global-batch", "64"]  # fmt: skip
    pages = []
    for name in ("a.html", "b.html"):
        assert cli(*args, "--report", str(tmp_path / name)).returncode == 0
        pages.append((tmp_path / name).read_text())
    assert pages[0] == pages[1] and "solve 0." not in pages[0]
    assert cli(*args, "--report", str(tmp_path / "c.html"), "--timings").returncode == 0
    assert "tables " in (tmp_path / "c.html").read_text()


def test_the_same_input_gives_the_same_json(cli: Callable[..., Any]) -> None:
    """`solve --json` is a function of the input (wall-clock times only with --timings)."""
    args = ["solve", "--model", "llama3-8b", "--topology", str(TOPOLOGIES / "dgx-h100.yaml"), "--seq-len", "4096",
            "--global-batch", "256", "--top", "3", "--json"]  # fmt: skip
    first, second = (cli(*args).stdout for _ in range(2))
    assert first == second and len(json.loads(first)["layouts"]) == 3 and "timings" not in json.loads(first)


def test_usage_errors_are_one_line(cli: Callable[..., Any]) -> None:
    out = cli("solve", "--top", "abc")
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: Invalid value for '--top'") and lines[0].endswith("solve --help`)")


# ---------------------------------------------------------------------------------------------- fuzzing

FUZZ = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,  # CI explores the same inputs every run; benchmarks/bad_input.py explores 5,000 more
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SEEDS = hostile.seeds()
FAST_COMMANDS = {  # the commands each kind is fuzzed through here (the benchmark runs all of them)
    "topology": (hostile.COMMANDS["topology"][0], hostile.COMMANDS["topology"][2]),
    "hf-config": hostile.COMMANDS["hf-config"][:2],
    "plan": hostile.COMMANDS["plan"][:2],
}


def _check(case: hostile.Case) -> None:
    outcome = hostile.run_case(case, timeout_s=30)
    assert not outcome.failed, f"{case.name}: {outcome.verdict} (exit {outcome.code})\n{outcome.stderr[-2000:]}"


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    hostile.preload()


@pytest.mark.parametrize("seed_file", SEEDS, ids=lambda s: f"{s.kind}:{s.path.name}")
@FUZZ
@given(mutation=st.randoms(use_true_random=False), pick=st.integers(0, 2))
def test_mutants_of_every_shipped_file_are_answered_or_refused(seed_file: hostile.Seed, mutation: Any,
                                                                pick: int) -> None:  # fmt: skip
    what, data = hostile.mutate(seed_file, mutation)
    commands = FAST_COMMANDS.get(seed_file.kind, hostile.COMMANDS[seed_file.kind])
    argv = commands[pick % len(commands)]
    _check(
        hostile.Case(f"{seed_file.path.name}: {what}", seed_file.kind, argv, data, hostile.suffix_for(seed_file, data))
    )


@pytest.mark.parametrize("kind", sorted(hostile.COMMANDS))
@settings(FUZZ, max_examples=6)
@given(data=st.binary(max_size=4096) | st.text(max_size=2048).map(str.encode))
def test_random_bytes_of_every_kind_are_refused_in_one_line(kind: str, data: bytes) -> None:
    suffix = {"trace": ".json", "runs": ".jsonl", "plan": ".json", "hf-config": ".json"}.get(kind, ".yaml")
    _check(hostile.Case(f"random {kind}", kind, hostile.COMMANDS[kind][0], data, suffix))


@settings(FUZZ, max_examples=200)
@given(text=st.text(max_size=200))
def test_text_parsers_raise_only_input_errors(text: str) -> None:
    from optlayout.layout import parse_layout
    from optlayout.topology import parse_cluster_shorthand
    from optlayout.topology.discovery import expand_hostlist, parse_nvidia_smi, parse_slurm

    for parse in (parse_layout, parse_cluster_shorthand, expand_hostlist, parse_nvidia_smi, parse_slurm,
                  lambda t: parse_yaml(t, "t"), lambda t: parse_json(t, "t")):  # fmt: skip
        with budget(10):
            try:
                parse(text)
            except InputError as exc:
                assert "\n" not in str(exc)


def _entry_points() -> dict[str, tuple[Callable[..., Any], list[Any], dict[str, Any]]]:
    """Every library entry point with good arguments (each test replaces one of them)."""
    from optlayout.planning import estimate_layout, estimate_run, explain_layout, replan, resolve_model
    from optlayout.presets import gpu_preset, model_from_hf_config, model_preset
    from optlayout.runs.calibrate import calibrated_params
    from optlayout.runs.records import read_runs
    from optlayout.topology import load_topology, parse_cluster_shorthand, resolve_cluster
    from optlayout.topology.discovery import DiscoverOptions, discover
    from optlayout.trace import analyze

    job = optlayout.JobSpec(seq_len=4096, global_batch=64)
    layout = optlayout.Layout(tp=2, dp=8, grad_accum=4)
    cluster = "gpu=h100-sxm,gpus=16"
    plan = FIXTURES / "plans" / "llama3-8b-16xh100.json"
    solve_options = {"top": 1, "pins": None, "maxima": None, "exclude": None, "time_limit_s": 10.0,
                     "objective": "mfu", "straggler_slowdown": 0.0}  # fmt: skip
    return {
        "solve": (optlayout.solve, ["llama3-8b", cluster, job], solve_options),
        "replan": (replan, [plan, 32], {"top": 1, "time_limit_s": 10.0}),
        "estimate_layout": (estimate_layout, ["llama3-8b", cluster, job, layout], {}),
        "explain_layout": (explain_layout, ["llama3-8b", cluster, job, layout], {}),
        "estimate_run": (estimate_run, ["llama3-8b", cluster, job, layout], {"straggler_slowdown": 0.0}),
        "resolve_model": (resolve_model, ["llama3-8b"], {}),
        "resolve_cluster": (resolve_cluster, [cluster], {}),
        "parse_cluster_shorthand": (parse_cluster_shorthand, [cluster], {}),
        "load_topology": (load_topology, [TOPOLOGIES / "dgx-h100.yaml"], {}),
        "read_runs": (read_runs, [FIXTURES / "runs" / "runs.jsonl"], {}),
        "analyze": (analyze, [[FIXTURES / "traces" / "cpu_dropout.json.gz"]], {"top": 10}),
        "discover": (discover, ["slurm", "SwitchName=s Nodes=n[0-3]", DiscoverOptions(gpu="h100-sxm")], {}),
        "model_preset": (model_preset, ["llama3-8b"], {}),
        "gpu_preset": (gpu_preset, ["h100-sxm"], {}),
        "model_from_hf_config": (model_from_hf_config, [FIXTURES / "hf" / "llama3.1-8b.json"], {}),
        "calibrated_params": (calibrated_params, ["h100-sxm", "bf16"], {}),
        "Plan.load": (optlayout.Plan.load, [plan], {}),
    }


ENTRY_POINTS = _entry_points()
WRONG: tuple[Any, ...] = (None, 0, -1, 2**64, 1.5, math.nan, math.inf, "", "x", "4096", True, [], {}, [1], {"a": 1},
                          object(), b"x", "tp=8")  # fmt: skip


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
@settings(FUZZ, max_examples=25)
@given(slot=st.integers(0, 20), value=st.sampled_from(WRONG))
def test_library_entry_points_raise_only_optlayout_errors(name: str, slot: int, value: Any) -> None:
    fn, args, kwargs = ENTRY_POINTS[name]
    args, kwargs = list(args), dict(kwargs)
    slots = [*range(len(args)), *kwargs]
    where = slots[slot % len(slots)]
    if isinstance(where, int):
        args[where] = value
    else:
        kwargs[where] = value
    with budget(60):
        try:
            fn(*args, **kwargs)
        except OptlayoutError as exc:
            assert "\n" not in str(exc)


def test_an_all_to_all_without_bandwidth_is_refused_not_divided_by() -> None:
    """The validated topology never has a zero-bandwidth NIC; the link tables refuse one anyway (the cost model
    divides by the bandwidth), as the group and pipeline-pair links do."""
    import copy

    from optlayout.topology import load_cluster

    topo = copy.deepcopy(load_cluster("gpu=h100-sxm,gpus=16,gpus_per_node=8").topology)  # the loader caches it
    assert topo.dim_all_to_all_bandwidth_Bps(16, 1) > 0
    topo._a2a.clear()
    topo._t.nic_bw[:] = 0.0
    refused(
        lambda: topo.dim_all_to_all_bandwidth_Bps(16, 1), "all-to-all groups of 16 GPUs 1 apart have no usable link"
    )
