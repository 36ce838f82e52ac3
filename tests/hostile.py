"""Hostile inputs for every command and file kind, and a runner that says what each one did.

- `SEEDS`: per file kind, the shipped files (topologies, fixtures, a saved plan, the calibration) and the commands
  that read them (`{F}` is the input file, `{DIR}` a scratch directory for outputs).
- `hand_made_cases()`: one or more inputs per class of bad input of issue 17 (non-numeric XML attributes, deep
  nesting, binary files, huge counts, NaN, duplicate YAML keys, alias bombs, type coercion, outputs over inputs...).
- `mutant_cases(n, seed)`: seeded mutants of the seeds: text edits (lines dropped, repeated, truncated, bytes that
  are not UTF-8, a number replaced by a hostile one) and structural edits of the parsed document (a value replaced
  by a hostile one, a key dropped or duplicated, a list where a number was).
- `run_case(case)`: `optlayout ARGS` in a forked child (the CLI's own `main`, as the console script runs it) under a
  time and an address-space budget, classified as ok (exit 0, finite output), refused (exit 1/2, one line on stderr),
  or a failure: traceback, nan (a non-finite figure in an exit-0 output or a written file), hang, memory, crash,
  message (exit 1/2 but not one line), overwrote-input.

Used by tests/test_bad_input.py (hypothesis, bounded) and benchmarks/bad_input.py (the 5,000-input corpus).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import random
import re
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TOPOLOGIES = ROOT / "topologies"
CALIBRATION = ROOT / "optlayout" / "data" / "default_calibration.yaml"

FAILURES = ("traceback", "nan", "hang", "memory", "crash", "message", "overwrote-input")
VERDICTS = ("ok", "refused", *FAILURES)


@dataclass(frozen=True)
class Case:
    """One input file (or none) and the command line that reads it."""

    name: str  # class of input / what was done to it
    kind: str  # file kind, or "cli" for flag values
    argv: tuple[str, ...]
    data: bytes | None = None
    suffix: str = ".txt"
    extra_files: tuple[tuple[str, bytes], ...] = ()  # (name in {DIR}, contents)
    keep_input: bool = False  # the command must not change its input file


@dataclass(frozen=True)
class Outcome:
    verdict: str
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def failed(self) -> bool:
        return self.verdict in FAILURES


# ---------------------------------------------------------------------------------------------- commands

SOLVE_JOB = ("--seq-len", "4096", "--global-batch", "64", "--json")
SMALL_CLUSTER = "gpu=h100-sxm,gpus=16"
LAYOUT_8 = "tp=2,pp=1,dp=4,mb=1,ga=8"
COMMANDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "topology": (
        ("topology", "show", "{F}", "--json"),
        ("solve", "--model", "llama3-8b", "--topology", "{F}", *SOLVE_JOB),
        ("estimate", "--model", "llama3-8b", "--topology", "{F}", "--layout", "tp=8,pp=1,dp=1,mb=1,ga=64",
         "--seq-len", "4096", "--json"),
    ),
    "nvidia-smi": (("topology", "discover", "{F}", "--from", "nvidia-smi", "--gpu", "h100-sxm", "--servers", "2"),),
    "nccl-xml": (("topology", "discover", "{F}", "--from", "nccl-xml", "--servers", "2"),),
    "slurm": (("topology", "discover", "{F}", "--from", "slurm", "--gpu", "h100-sxm"),),
    "hf-config": (
        ("mfu", "--model-config", "{F}", "--tokens-per-s", "3000", "--seq-len", "4096", "--json"),
        ("memory", "--model-config", "{F}", "--gpus", "8", "--tp", "8", "--seq-len", "2048", "--gpu", "h100-sxm",
         "--json"),
        ("solve", "--model-config", "{F}", "--cluster", "gpu=h100-sxm,gpus=8", "--seq-len", "2048",
         "--global-batch", "16", "--json"),
    ),
    "runs": (("compare", "{F}", "--no-rank", "--json"),),
    "plan": (
        ("emit", "--plan", "{F}", "--format", "megatron"),
        ("emit", "--plan", "{F}", "--format", "ranks"),
        ("solve", "--from-plan", "{F}", "--gpus", "32", "--json"),
    ),
    "calibration": (
        ("estimate", "--calibration", "{F}", "--model", "llama3-8b", "--cluster", SMALL_CLUSTER, "--layout",
         "tp=2,pp=1,dp=8,mb=1,ga=4", "--seq-len", "4096", "--global-batch", "32", "--json"),
    ),
    "trace": (("profile", "{F}", "--json"),),
    "megatron-log": (
        ("runs", "from-log", "{F}", "--format", "megatron", "--model", "llama3.1-8b", "--cluster",
         "gpu=h100-sxm,gpus=8", "--seq-len", "8192", "--global-batch", "128", "--layout", "tp=1,pp=1,cp=2,dp=4,mb=1",
         "-o", "{DIR}/runs.jsonl", "--json"),
    ),
    "torchtitan-log": (
        ("runs", "from-log", "{F}", "--format", "torchtitan", "--model", "llama3.1-8b", "--cluster",
         "gpu=h100-sxm,gpus=8", "--seq-len", "8192", "--global-batch", "8", "--layout", "dp=8,sharding=fsdp",
         "-o", "{DIR}/runs.jsonl", "--json"),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Seed:
    """A shipped file of one kind and the commands that read it."""

    kind: str  # a COMMANDS key
    path: Path
    form: str  # yaml | json | jsonl | csv | text | xml | trace

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()


def seeds() -> list[Seed]:
    out = [Seed("topology", p, "yaml") for p in sorted(TOPOLOGIES.glob("*.yaml"))]
    disc = FIXTURES / "discovery"
    out += [Seed("nvidia-smi", p, "text") for p in sorted(disc.glob("*topo-m.txt"))]
    out += [Seed("nccl-xml", disc / "nccl-topo-dgx-h100.xml", "xml")]
    out += [Seed("slurm", p, "text") for p in sorted(disc.glob("slurm-*.conf"))]
    out += [Seed("hf-config", p, "json") for p in sorted((FIXTURES / "hf").glob("*.json"))]
    out += [
        Seed("runs", FIXTURES / "runs" / "runs.jsonl", "jsonl"),
        Seed("runs", FIXTURES / "runs" / "runs.csv", "csv"),
    ]
    out += [Seed("plan", p, "json") for p in sorted((FIXTURES / "plans").glob("*.json"))]
    out += [Seed("calibration", CALIBRATION, "yaml")]
    out += [Seed("trace", p, "trace") for p in sorted((FIXTURES / "traces").glob("*.json.gz"))]
    out += [Seed("megatron-log", FIXTURES / "runs" / "megatron_llama31_8b.log", "text")]
    out += [Seed("torchtitan-log", FIXTURES / "runs" / "torchtitan_llama31_8b.log", "text")]
    return out


# ---------------------------------------------------------------------------------------------- mutation

HOSTILE_NUMBERS = (
    "0", "-1", "-0", "1e400", "-1e400", "1e-400", "nan", "NaN", ".nan", ".inf", "-.inf", "Infinity", "-Infinity",
    "inf", "18446744073709551616", "1000000000", "1e9", "4294967296", "9" * 5000, "0.5", "1e308", "5e-324", "0x10",
    "1_000", "true", "null", '"4096"', "[]", "{}", "abc", "",
)  # fmt: skip
HOSTILE_VALUES: tuple[Any, ...] = (
    0, -1, 1, 2**31, 2**63, 2**64, 10**30, 10**9, 0.5, -0.0, 1e-320, 1e308, float("inf"), float("-inf"),
    float("nan"), "", "abc", "4096", "nan", True, False, None, [], {}, [1, 2], {"a": 1}, "x" * 5000,
)  # fmt: skip
_NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def mutate_text(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One edit of the raw bytes: a number replaced, a line dropped or repeated, a cut, bytes that are not UTF-8."""
    lines = data.split(b"\n")
    pick = rng.randrange(9)
    if pick <= 2:  # a number (weighted: numbers are what the readers validate)
        numbers = list(_NUMBER.finditer(data))
        if numbers:
            m = rng.choice(numbers)
            value = rng.choice(HOSTILE_NUMBERS).encode()
            return f"number->{value[:20].decode()}", data[: m.start()] + value + data[m.end() :]
    if pick == 3 and len(lines) > 1:
        i = rng.randrange(len(lines))
        return "drop-line", b"\n".join(lines[:i] + lines[i + 1 :])
    if pick == 4 and lines:
        i = rng.randrange(len(lines))
        times = rng.choice((2, 10, 1000))
        return f"repeat-line-x{times}", b"\n".join(lines[:i] + [lines[i]] * times + lines[i + 1 :])
    if pick == 5 and data:
        cut = rng.randrange(len(data))
        return "truncate", data[:cut]
    if pick == 6 and data:
        at = rng.randrange(len(data))
        junk = rng.choice((b"\xff\xfe", b"\x00", b"\xc3\x28", b"\x1b[31m", "\u202e".encode(), b"\r"))
        return "insert-bytes", data[:at] + junk + data[at:]
    if pick == 7 and len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "swap-lines", b"\n".join(lines)
    if data:
        at = rng.randrange(len(data))
        return "flip-char", data[:at] + bytes([rng.randrange(32, 127)]) + data[at + 1 :]
    return "empty", b""


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:50]):
            yield from _paths(v, (*prefix, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def mutate_doc(doc: Any, rng: random.Random) -> tuple[str, Any]:
    """One edit of a parsed document: a value replaced by a hostile one, a key dropped or renamed, a list added."""
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return "whole", rng.choice(HOSTILE_VALUES)
    path = rng.choice(paths)
    pick = rng.randrange(6)
    if pick <= 2:
        value = rng.choice(HOSTILE_VALUES)
        return f"{'.'.join(map(str, path))}={str(value)[:20]}", _set(doc, path, value)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if pick == 3 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"drop {'.'.join(map(str, path))}", doc
    if pick == 3 and isinstance(parent, list):
        del parent[path[-1]]
        return f"drop item {'.'.join(map(str, path))}", doc
    if pick == 4 and isinstance(parent, dict):
        parent[f"{path[-1]}_x"] = parent[path[-1]]
        return f"unknown key {path[-1]}_x", doc
    if pick == 4 and isinstance(parent, list):
        parent.extend([parent[path[-1]]] * rng.choice((1, 100)))
        return "repeat item", doc
    return f"list {'.'.join(map(str, path))}", _set(doc, path, [_get(doc, path)] * 3)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _dump(doc: Any, form: str) -> bytes:
    if form == "yaml":
        return yaml.safe_dump(doc, sort_keys=False).encode()
    return json.dumps(doc).encode()  # NaN and Infinity tokens included, as a careless writer makes them


def mutate(seed: Seed, rng: random.Random) -> tuple[str, bytes]:
    """A mutant of a seed file: a text edit or (for documents) a structural one; traces stay gzip or go plain."""
    data = seed.data
    if seed.form == "trace":
        text = gzip.decompress(data)
        if rng.random() < 0.5:
            doc = json.loads(text)
            events = doc["traceEvents"]
            i = rng.randrange(len(events))
            what, events[i] = mutate_doc(events[i], rng)
            what, raw = f"event {i} {what}", json.dumps(doc).encode()
        else:
            what, raw = mutate_text(text, rng)
        return what, gzip.compress(raw, compresslevel=1) if rng.random() < 0.5 else raw
    if seed.form in ("yaml", "json") and rng.random() < 0.5:
        try:
            doc = yaml.safe_load(data) if seed.form == "yaml" else json.loads(data)
        except (yaml.YAMLError, ValueError):
            doc = None
        if doc is not None:
            what, doc = mutate_doc(doc, rng)
            return what, _dump(doc, seed.form)
    if seed.form == "jsonl" and rng.random() < 0.5:
        lines = data.decode().splitlines()
        i = rng.randrange(len(lines))
        what, doc = mutate_doc(json.loads(lines[i]), rng)
        lines[i] = json.dumps(doc)
        return f"line {i + 1} {what}", "\n".join(lines).encode()
    return mutate_text(data, rng)


def suffix_for(seed: Seed, data: bytes) -> str:
    if seed.form == "trace":
        return ".json.gz" if data[:2] == b"\x1f\x8b" else ".json"
    return "".join(seed.path.suffixes[-1:]) or ".txt"


def mutant_cases(count: int, seed: int = 0) -> list[Case]:
    """`count` seeded mutants spread over the seed files and their commands."""
    rng = random.Random(seed)
    pool = seeds()
    out = []
    for n in range(count):
        s = pool[n % len(pool)]
        what, data = mutate(s, rng)
        argv = rng.choice(COMMANDS[s.kind])
        out.append(Case(f"mutant {s.path.name}: {what}", s.kind, argv, data, suffix_for(s, data)))
    return out


# ---------------------------------------------------------------------------------------------- hand-made


def _yaml(text: str) -> bytes:
    return text.encode()


GEN = "gpu: h100-sxm\nservers: 2\ngpus_per_server: 8\n"
EXPLICIT = (TOPOLOGIES / "example-explicit.yaml").read_text() if (TOPOLOGIES / "example-explicit.yaml").exists() else ""


def _topology_cases() -> Iterator[tuple[str, bytes]]:
    yield "gpus_per_server 2^64", _yaml("gpu: h100-sxm\nservers: 2\ngpus_per_server: 18446744073709551616\n")
    yield "gpus_per_server 10^7", _yaml("gpu: h100-sxm\nservers: 1\ngpus_per_server: 10000000\n")
    yield "gpus_per_server 10^7 x 10^5 servers", _yaml("gpu: h100-sxm\nservers: 100000\ngpus_per_server: 10000000\n")
    yield "spine switches 10^7", _yaml(GEN + "fabric: {spine_switches: 10000000, servers_per_leaf: 1}\n")
    yield "servers true", _yaml("gpu: h100-sxm\nservers: true\ngpus_per_server: 8\n")
    yield "servers string", _yaml("gpu: h100-sxm\nservers: '4'\ngpus_per_server: 8\n")
    yield "servers float", _yaml("gpu: h100-sxm\nservers: 4.0\ngpus_per_server: 8\n")
    yield "duplicate key", _yaml("gpu: h100-sxm\nservers: 4\nservers: 400\ngpus_per_server: 8\n")
    yield "duplicate nested key", _yaml(GEN + "nics: {gbps: 400, gbps: 100}\n")
    yield "nics gbps inf", _yaml(GEN + "nics: {gbps: .inf}\n")
    yield "nics gbps nan", _yaml(GEN + "nics: {gbps: .nan}\n")
    yield "nics gbps 1e-300", _yaml(GEN + "nics: {gbps: 1.0e-300}\n")
    yield "nics per_server 0", _yaml(GEN + "nics: {per_server: 0}\n")
    yield "nic latency inf", _yaml(GEN + "nics: {latency_us: .inf}\n")
    yield "oversubscription inf", _yaml(GEN + "fabric: {oversubscription: .inf}\n")
    yield "oversubscription nan", _yaml(GEN + "fabric: {oversubscription: .nan}\n")
    yield "latency inf", _yaml(GEN + "scale_up: {kind: nvswitch, latency_us: .inf}\n")
    yield "scale-up gbytes nan", _yaml(GEN + "scale_up: {kind: nvswitch, gbytes_per_s: .nan}\n")
    yield "mesh 4096", _yaml("gpu: h100-sxm\nservers: 1\ngpus_per_server: 4096\nscale_up: {kind: mesh}\n")
    yield "pcie sockets 10^6", _yaml(GEN + "scale_up: {kind: pcie, sockets: 1000000}\n")
    yield "pcie switches 10^6", _yaml(GEN + "scale_up: {kind: pcie, switches_per_socket: 1000000}\n")
    yield "nics 10^7", _yaml(GEN + "nics: {per_server: 10000000}\n")
    yield "domain 10^9", _yaml(GEN + "scale_up: {kind: nvswitch, domain_size: 1000000000}\n")
    yield "servers 16384 x 8", _yaml("gpu: h100-sxm\nservers: 16384\ngpus_per_server: 8\n")  # 131,072 GPUs
    yield "deep flow", ("gpu: " + "[" * 100_000 + "]" * 100_000 + "\n").encode()
    yield "deep flow 500", ("gpu: h100-sxm\nservers: " + "[" * 500 + "1" + "]" * 500 + "\n").encode()
    yield "deep block", ("gpu: h100-sxm\nservers:\n" + "".join("  " * i + "- \n" for i in range(1, 300))).encode()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join('*' + chr(97 + i) for _ in range(9))}]\n" for i in range(8)
    )
    yield "alias bomb", (bomb + "gpu: *i\nservers: 1\ngpus_per_server: 8\n").encode()
    yield "alias bomb in name", (bomb + "name: *i\ngpu: h100-sxm\nservers: 1\ngpus_per_server: 8\n").encode()
    yield "binary", bytes(range(256)) * 4
    yield "latin-1", "gpu: h100-sxm\nname: caf\xe9\nservers: 1\ngpus_per_server: 8\n".encode("latin-1")
    yield "utf-16", GEN.encode("utf-16")
    yield "empty", b""
    yield "only comment", b"# nothing\n"
    yield "a list", b"- 1\n- 2\n"
    yield "a number", b"3\n"
    yield "two documents", (GEN + "---\n" + GEN).encode()
    yield "python tag", b"gpu: !!python/object/apply:os.system ['true']\nservers: 1\ngpus_per_server: 8\n"
    yield "binary tag", b"gpu: !!binary aGVsbG8=\nservers: 1\ngpus_per_server: 8\n"
    yield "set tag", b"gpu: !!set {a, b}\nservers: 1\ngpus_per_server: 8\n"
    yield "timestamp", b"gpu: 2001-12-14\nservers: 1\ngpus_per_server: 8\n"
    yield "unhashable key", b"? [a, b]\n: 1\ngpu: h100-sxm\nservers: 1\ngpus_per_server: 8\n"
    yield "int key", b"1: 2\ngpu: h100-sxm\nservers: 1\ngpus_per_server: 8\n"
    yield "5000-digit int", ("gpu: h100-sxm\nservers: " + "9" * 5000 + "\ngpus_per_server: 8\n").encode()
    yield "huge string", ("gpu: h100-sxm\nname: " + "x" * 5_000_000 + "\nservers: 1\ngpus_per_server: 8\n").encode()
    yield "nul byte", b"gpu: h100\x00-sxm\nservers: 1\ngpus_per_server: 8\n"
    yield "unknown gpu", _yaml("gpu: h999\nservers: 1\ngpus_per_server: 8\n")
    yield "gpu a number", _yaml("gpu: 100\nservers: 1\ngpus_per_server: 8\n")
    yield (
        "explicit edge gbps 0",
        _yaml(
            "gpu: h100-sxm\nnodes:\n- {id: g0, kind: gpu, server: s0}\n- {id: g1, kind: gpu, server: s1}\n"
            "- {id: n0, kind: nic, server: s0}\n- {id: n1, kind: nic, server: s1}\n- {id: l, kind: leaf}\n"
            "edges:\n- {a: g0, b: n0, gbps: 400}\n- {a: g1, b: n1, gbps: 400}\n- {a: n0, b: l, gbps: 0}\n"
            "- {a: n1, b: l, gbps: 400}\n"
        ),
    )
    yield (
        "explicit edge 5e-324",
        _yaml(
            "gpu: h100-sxm\nnodes:\n- {id: g0, kind: gpu, server: s0}\n- {id: g1, kind: gpu, server: s1}\n"
            "- {id: n0, kind: nic, server: s0}\n- {id: n1, kind: nic, server: s1}\n- {id: l, kind: leaf}\n"
            "edges:\n- {a: g0, b: n0, bandwidth_Bps: 5.0e-324}\n- {a: g1, b: n1, gbps: 400}\n"
            "- {a: n0, b: l, gbps: 400}\n- {a: n1, b: l, gbps: 400}\n"
        ),
    )
    yield (
        "explicit negative latency",
        _yaml(
            "gpu: h100-sxm\nnodes:\n- {id: g0, kind: gpu, server: s0}\n- {id: g1, kind: gpu, server: s0}\n"
            "- {id: sw, kind: nvswitch}\nedges:\n- {a: g0, b: sw, gbps: 400, latency_us: -5}\n"
            "- {a: g1, b: sw, gbps: 400}\n"
        ),
    )
    yield (
        "explicit nan bandwidth",
        _yaml(
            "gpu: h100-sxm\nnodes:\n- {id: g0, kind: gpu, server: s0}\n- {id: g1, kind: gpu, server: s0}\n"
            "- {id: sw, kind: nvswitch}\nedges:\n- {a: g0, b: sw, gbytes_per_s: .nan}\n- {a: g1, b: sw, gbps: 400}\n"
        ),
    )
    yield (
        "explicit tier 10^9",
        _yaml(
            "gpu: h100-sxm\nnodes:\n- {id: g0, kind: gpu, server: s0}\n- {id: n0, kind: nic, server: s0}\n"
            "- {id: l, kind: leaf, tier: 1000000000}\nedges:\n- {a: g0, b: n0, gbps: 400}\n- {a: n0, b: l, gbps: 400}\n"
        ),
    )
    yield (
        "template x 10^6 servers",
        _yaml("gpu: h100-sxm\nserver_template: {gpus_per_server: 1000000}\nnodes:\n- {id: s0, kind: server}\n"),
    )


def _hf(**fields: Any) -> bytes:
    base = json.loads((FIXTURES / "hf" / "llama3.1-8b.json").read_text())
    for k, v in fields.items():
        if v is ...:
            base.pop(k, None)
        else:
            base[k] = v
    return json.dumps(base).encode()


def _hf_cases() -> Iterator[tuple[str, bytes]]:
    yield "hidden_size string, no ffn", _hf(hidden_size="4096", intermediate_size=...)
    yield "hidden_size string", _hf(hidden_size="4096")
    yield "heads 10^9", _hf(num_attention_heads=1_000_000_000, num_key_value_heads=1_000_000_000)
    yield "heads 10^9 hidden 10^9", _hf(num_attention_heads=10**9, num_key_value_heads=10**9, hidden_size=10**9)
    yield "layers 10^9", _hf(num_hidden_layers=1_000_000_000)
    yield "vocab 2^64", _hf(vocab_size=2**64)
    yield "text_config string", _hf(text_config="x", hidden_size=...)
    yield "text_config list", _hf(text_config=[1], hidden_size=...)
    yield "heads list", _hf(num_attention_heads=[32])
    yield "heads bool", _hf(num_attention_heads=True)
    yield "heads float", _hf(num_attention_heads=32.0)
    yield "heads 1.5", _hf(num_attention_heads=1.5)
    yield "hidden_act 5", _hf(hidden_act=5)
    yield "hidden_act list", _hf(hidden_act=["silu"])
    yield "tie string", _hf(tie_word_embeddings="yes")
    yield "name dict", _hf(_name_or_path={"a": 1})
    yield "head_dim 0", _hf(head_dim=0)
    yield "vocab null", _hf(vocab_size=None)
    yield "5000 digits", _hf(hidden_size=0).replace(b'"hidden_size": 0', b'"hidden_size": ' + b"9" * 5000)
    yield "1e400", _hf(hidden_size=0).replace(b'"hidden_size": 0', b'"hidden_size": 1e400')
    yield "NaN", _hf(hidden_size=float("nan"))
    yield "duplicate key", _hf().replace(b'"hidden_size": 4096', b'"hidden_size": 4096, "hidden_size": 8192')
    yield "deep", b'{"hidden_size": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    yield "a list", b"[1, 2]"
    yield "binary", b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    yield "utf-8 bom", b"\xef\xbb\xbf" + _hf()
    yield "empty", b""
    yield "moe experts string", _hf(num_local_experts="8", num_experts_per_tok=2)


def _runs_cases() -> Iterator[tuple[str, bytes, str]]:
    good = (FIXTURES / "runs" / "runs.jsonl").read_bytes().splitlines()[0]
    yield "line is a number", b"3\n", ".jsonl"
    yield "line is a list", b"[1, 2]\n" + good, ".jsonl"
    yield "line is a string", b'"x"\n', ".jsonl"
    yield "array of numbers", b"[1, 2, 3]", ".json"
    yield "deep array", b"[" * 100_000 + b"]" * 100_000, ".json"
    yield "deep line", b'{"id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ".jsonl"
    for path, value in (
        (("layout", "sharding"), "banana"), (("layout", "recompute"), "all"), (("model", "layers"), 10**9),
        (("model", "hidden"), "4096"), (("job", "seq_len"), 10**9), (("job", "seq_len"), True),
        (("cluster", "gpus"), 2**64), (("cluster", "inter_node_gbps_per_gpu"), float("inf")),
        (("measured", "tokens_per_s_per_gpu"), float("nan")), (("measured", "tokens_per_s_per_gpu"), 1e308),
        (("layout", "pp"), 10**20), (("layout", "tp"), True), (("job", "global_batch"), 10**15),
        (("model", "heads"), 10**9), (("cluster", "gpus_per_node"), 10**7), (("model",), "x"), (("layout",), [1]),
    ):  # fmt: skip
        r = json.loads(good)
        _set(r, path, value)
        yield f"{'.'.join(path)}={str(value)[:12]}", json.dumps(r).encode(), ".jsonl"
    yield "duplicate key", good.replace(b'"id":', b'"id": "a", "id":', 1), ".jsonl"
    yield "1e400", good.replace(b'"seq_len": 8192', b'"seq_len": 1e400'), ".jsonl"
    yield "binary", b"\xff\xfe\x00\x01" * 100, ".jsonl"
    yield "empty", b"", ".jsonl"
    header = (FIXTURES / "runs" / "runs.csv").read_bytes().splitlines()
    yield "csv layout and layout.tp", header[0] + b",layout\n" + header[1] + b",x\n", ".csv"
    yield "csv model and model.hidden", header[0].replace(b"model.name", b"model") + b"\n" + header[1] + b"\n", ".csv"
    yield "csv huge field", header[0] + b"\n" + header[1].replace(b"swiglu", b"x" * 200_000) + b"\n", ".csv"
    yield "csv nan", header[0] + b"\n" + header[1].replace(b"10152.75", b"nan") + b"\n", ".csv"
    yield "csv inf", header[0] + b"\n" + header[1].replace(b"10152.75", b"inf") + b"\n", ".csv"
    yield "csv 5000 digits", header[0] + b"\n" + header[1].replace(b",8192,", b"," + b"9" * 5000 + b",") + b"\n", ".csv"
    yield "csv unbalanced quote", header[0] + b"\n" + b'"' + header[1] + b"\n", ".csv"
    yield "csv nul", header[0] + b"\n" + header[1].replace(b"swiglu", b"swi\x00glu") + b"\n", ".csv"
    yield "csv only header", header[0] + b"\n", ".csv"
    yield "csv empty header", b"\n" + header[1] + b"\n", ".csv"
    yield "csv extra cells", header[0] + b"\n" + header[1] + b",1,2,3\n", ".csv"
    yield "csv dotted empty parts", header[0].replace(b"model.name", b"model..name") + b"\n" + header[1] + b"\n", ".csv"


def _plan_cases() -> Iterator[tuple[str, bytes]]:
    plan = json.loads(next((FIXTURES / "plans").glob("*.json")).read_text())

    def edit(path: tuple[Any, ...], value: Any) -> bytes:
        doc = json.loads(json.dumps(plan))
        _set(doc, path, value)
        return json.dumps(doc).encode()

    layout = ("layouts", 0, "layout")
    yield "pp 10^20", edit((*layout, "pp"), 10**20)
    yield "tp 10^9", edit((*layout, "tp"), 10**9)
    yield "micro_batch 10^12", edit((*layout, "micro_batch"), 10**12)
    yield "grad_accum 2^63", edit((*layout, "grad_accum"), 2**63)
    yield "tp true", edit((*layout, "tp"), True)
    yield "sharding banana", edit((*layout, "sharding"), "banana")
    yield "gpus_per_server 10^9", edit(("gpus_per_server",), 10**9)
    yield "gpus 10^9", edit(("gpus",), 10**9)
    yield "gpus 0", edit(("gpus",), 0)
    yield "model layers 10^9", edit(("model", "layers"), 10**9)
    yield "job seq_len 1e9", edit(("job", "seq_len"), 10**9)
    yield "mfu NaN", edit(("layouts", 0, "prediction", "mfu"), float("nan"))
    yield "schema 2", edit(("schema_version",), 2)
    yield "layouts a dict", edit(("layouts",), {"a": 1})
    yield "topology_doc bomb", edit(("topology_doc",), {"gpu": "h100-sxm", "servers": 131072, "gpus_per_server": 8})
    yield "topology_doc huge", edit(("topology_doc",), {"gpu": "h100-sxm", "servers": 1, "gpus_per_server": 10**7})
    yield "cluster gpus 2^64", edit(("cluster",), {"gpu": "h100-sxm", "gpus": 2**64})
    yield "deep", b'{"schema_version": 1, "model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    yield "binary", bytes(range(256))
    yield "empty", b""
    yield "not an object", b"[]"


def _calibration_cases() -> Iterator[tuple[str, bytes]]:
    text = CALIBRATION.read_text()
    yield "default nan", text.replace("gemm_efficiency: ", "gemm_efficiency: .nan #", 1).encode()
    yield "default inf", text.replace("gemm_efficiency: ", "gemm_efficiency: .inf #", 1).encode()
    yield "duplicate key", text.replace("schema_version: 1", "schema_version: 1\nschema_version: 1", 1).encode()
    yield "unknown constant", text.replace("gemm_efficiency: ", "banana: 1\n  gemm_efficiency: ", 1).encode()
    yield "string constant", text.replace("gemm_efficiency: ", "gemm_efficiency: 'x' #", 1).encode()
    yield "bool constant", text.replace("gemm_efficiency: ", "gemm_efficiency: true #", 1).encode()
    yield "deep", ("schema_version: 1\ndefault: " + "[" * 50_000 + "]" * 50_000 + "\n").encode()
    yield "binary", b"\x00\xff" * 1000
    yield "schema string", text.replace("schema_version: 1", "schema_version: '1'", 1).encode()
    yield "schema true", text.replace("schema_version: 1", "schema_version: true", 1).encode()


def _nvidia_smi_cases() -> Iterator[tuple[str, bytes]]:
    text = (FIXTURES / "discovery" / "dgx-h100-topo-m.txt").read_text()
    yield "NV huge", text.replace("NV18", "NV99999999999999999999", 1).encode()
    yield "NV 5000 digits", text.replace("NV18", "NV" + "9" * 5000).encode()
    yield "NV0", text.replace("NV18", "NV0").encode()
    header = "\t" + "\t".join(f"GPU{i}" for i in range(3000)) + "\tCPU Affinity\n"
    rows = "".join(f"GPU{i}\t" + "\t".join("X" if i == j else "NV1" for j in range(3000)) + "\n" for i in range(40))
    yield "3000 GPU columns", (header + rows).encode()
    yield "binary", bytes(range(256)) * 10
    yield "no rows", b"\tGPU0\tGPU1\tCPU Affinity\n"
    yield "GPU0 only header", b"GPU0\n"
    yield "ansi junk", ("\x1b[" + "1;" * 100_000 + text).encode()


def _nccl_xml_cases() -> Iterator[tuple[str, bytes]]:
    text = (FIXTURES / "discovery" / "nccl-topo-dgx-h100.xml").read_text()
    for attr, value in (
        ("count", "abc"), ("link_width", "abc"), ("sm", "abc"), ("speed", "abc"), ("dev", "x"), ("count", "-5"),
        ("count", "1e400"), ("speed", "nan"), ("speed", "inf"), ("speed", "-1"), ("speed", "0"), ("sm", "-1"),
        ("link_speed", "nan GT/s"), ("link_speed", "1e400 GT/s"), ("link_width", "99999999999999999999"),
        ("count", "9" * 5000), ("numaid", "[]"), ("class", ""), ("dev", "99999999999999999999"),
    ):  # fmt: skip
        yield f"{attr}={value[:12]}", re.sub(rf'{attr}="[^"]*"', f'{attr}="{value}"', text).encode()
    yield (
        "entity bomb",
        (
            '<?xml version="1.0"?><!DOCTYPE system [<!ENTITY a "aaaaaaaaaa">'
            + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8))
            + ']><system><cpu numaid="&i;"/></system>'
        ).encode(),
    )
    yield (
        "external entity",
        b'<?xml version="1.0"?><!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]><system>&x;</system>',
    )
    yield "deep pci", ('<system><cpu numaid="0">' + "<pci>" * 100_000 + "</pci>" * 100_000 + "</cpu></system>").encode()
    yield "binary", bytes(range(256))
    yield "utf-16", text.encode("utf-16")
    yield (
        "10^5 gpus",
        (
            '<system><cpu numaid="0">'
            + "".join(f'<pci busid="{i}" class="0x030200"><gpu dev="{i}" sm="90"/></pci>' for i in range(100_000))
            + "</cpu></system>"
        ).encode(),
    )


def _slurm_cases() -> Iterator[tuple[str, bytes]]:
    yield "Nodes=n[0-99999999]", b"SwitchName=s0 Nodes=n[0-99999999]\n"
    yield "Nodes 3 ranges", b"SwitchName=s0 Nodes=a[0-9999]b[0-9999]c[0-9999]\n"
    yield "block 10^8", b"BlockName=b0 Nodes=n[0-99999999]\n"
    yield "5000 digits", ("SwitchName=s0 Nodes=n[0-" + "9" * 5000 + "]\n").encode()
    chain = "".join(f"SwitchName=s{i} Switches=s{i + 1}\n" for i in range(5000)) + "SwitchName=s5000 Nodes=n[0-3]\n"
    yield "switch chain 5000", chain.encode()
    many = "".join(f"SwitchName=l{i} Nodes=n{i}\n" for i in range(8000)) + "SwitchName=top Switches=l[0-7999]\n"
    yield "8000 leaves", many.encode()  # 64,000 GPUs
    yield "cycle", b"SwitchName=a Switches=b\nSwitchName=b Switches=a\n"
    yield "unbalanced", b"SwitchName=s0 Nodes=n[0-3\n"
    yield "binary", bytes(range(256))
    yield "key only", b"SwitchName\n"
    yield "empty", b""
    yield "nested brackets", b"SwitchName=s0 Nodes=n[[0-3]]\n"
    yield "unicode digits", "SwitchName=s0 Nodes=n[\u0663-\u0665]\n".encode()


def _trace(events: list[Any], gz: bool = True, **top: Any) -> bytes:
    raw = json.dumps({"traceEvents": events, **top}).encode()
    return gzip.compress(raw, compresslevel=1) if gz else raw


def _big_string_gzip(size: int) -> bytes:
    """A gzip trace holding one string of `size` characters (made in chunks, never whole in memory)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "name": "')
        chunk = b"a" * (1 << 20)
        for _ in range(size // len(chunk)):
            fh.write(chunk)
        fh.write(b'"}]}')
    return buf.getvalue()


def _trace_cases() -> Iterator[tuple[str, bytes, str]]:
    ev = {"ph": "X", "ts": 1.0, "dur": 2.0, "name": "aten::mm", "pid": 1, "tid": 1, "cat": "cpu_op"}
    k = {"ph": "X", "ts": 1.0, "dur": 2.0, "name": "ncclKernel", "pid": 0, "tid": 7, "cat": "kernel",
         "args": {"device": 0, "stream": 7}}  # fmt: skip
    yield "tid a list", _trace([ev | {"tid": [1]}]), ".json.gz"
    yield "pid a dict", _trace([ev | {"pid": {"a": 1}}]), ".json.gz"
    yield "stream a list", _trace([k | {"args": {"device": 0, "stream": [7]}}]), ".json.gz"
    yield "device a dict", _trace([k | {"args": {"device": {}, "stream": 7}}]), ".json.gz"
    deep = b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    yield "deep args", gzip.compress(deep), ".json.gz"
    yield (
        "huge int ts",
        gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": 1' + b"0" * 400 + b', "dur": 1}]}'),
        ".json.gz",
    )
    yield (
        "5000-digit ts",
        gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": ' + b"9" * 5000 + b', "dur": 1}]}'),
        ".json.gz",
    )
    yield "NaN ts", _trace([ev | {"ts": float("nan")}]), ".json.gz"
    yield "Infinity dur", _trace([ev | {"dur": float("inf")}]), ".json.gz"
    yield "negative dur", _trace([ev | {"dur": -5.0}]), ".json.gz"
    yield "1e308 ts", _trace([ev | {"ts": 1e308, "dur": 1e308}, ev]), ".json.gz"
    yield "ts string", _trace([ev | {"ts": "1"}]), ".json.gz"
    yield "ts bool", _trace([ev | {"ts": True}]), ".json.gz"
    yield "name a list", _trace([ev | {"name": ["a"]}]), ".json.gz"
    yield "args a list", _trace([ev | {"args": [1]}]), ".json.gz"
    yield "rank a string", _trace([ev], distributedInfo={"rank": "0"}), ".json.gz"
    yield "rank 2^70", _trace([ev], distributedInfo={"rank": 2**70}), ".json.gz"
    yield "rank bool", _trace([ev], distributedInfo={"rank": True}), ".json.gz"
    yield "traceEvents a dict", _trace({"a": 1}), ".json.gz"  # type: ignore[arg-type]
    yield "events numbers", _trace([1, 2, 3]), ".json.gz"
    yield "empty", b"", ".json"
    yield "truncated gzip", _trace([ev] * 100)[:-20], ".json.gz"
    yield "garbage gzip", b"\x1f\x8b" + bytes(range(200)), ".json.gz"
    yield "binary", bytes(range(256)) * 4, ".json"
    yield "latin-1", '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "name": "caf\xe9"}]}'.encode("latin-1"), ".json"
    yield "1.6 GB string in 1.5 MB", _big_string_gzip(1600 << 20), ".json.gz"
    yield "10^6 events one name", _trace([ev] * 200_000), ".json.gz"
    yield "one step many ops", _trace([ev | {"name": "ProfilerStep#1", "dur": 1e9}] + [ev] * 1000), ".json.gz"


def _log_cases() -> Iterator[tuple[str, str, bytes]]:
    meg = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    titan = (FIXTURES / "runs" / "torchtitan_llama31_8b.log").read_text()
    m = re.search(r".*iteration\s+5/.*", meg)
    line = m.group(0) if m else ""
    for name, value in (
        ("number of skipped iterations", "nan"), ("number of nan iterations", "1e400"),
        ("elapsed time per iteration (ms)", "nan"), ("elapsed time per iteration (ms)", "inf"),
        ("elapsed time per iteration (ms)", "1e-320"), ("global batch size", "1e400"), ("global batch size", "nan"),
        ("throughput per GPU (TFLOP/s/GPU)", "inf"), ("number of skipped iterations", "9" * 5000),
        ("elapsed time per iteration (ms)", "9" * 5000),
    ):  # fmt: skip
        bad = re.sub(re.escape(name) + r":\s*[^|]*", f"{name}: {value} ", line)
        yield "megatron-log", f"{name}={value[:10]}", meg.replace(line, bad).encode()
    yield (
        "megatron-log",
        "iteration 5000 digits",
        meg.replace(line, line.replace("iteration        5/", "iteration " + "9" * 5000 + "/")).encode(),
    )
    yield (
        "megatron-log",
        "world size 5000 digits",
        meg.replace("using world size: 8", "using world size: " + "9" * 5000).encode(),
    )
    yield (
        "megatron-log",
        "superscript digit arg",
        meg.replace(
            "global_batch_size ............................... 128",
            "global_batch_size ............................... 1\u00b2",
        ).encode(),
    )
    yield "megatron-log", "200k iteration lines", (meg + "\n".join([line] * 200_000)).encode()
    yield "megatron-log", "one 10 MB line", (meg + "\n" + "a .. " * 2_000_000 + "\n").encode()
    yield "megatron-log", "many pipes", (meg + "\n iteration 1/ 2 |" + "x: 1 |" * 500_000 + "\n").encode()
    yield "megatron-log", "binary", bytes(range(256)) * 100
    yield "megatron-log", "latin-1", (meg + "caf\xe9\n").encode("latin-1")
    for name, value in (("tps", "nan"), ("tps", "inf"), ("tps", "1e400"), ("tflops", "nan"), ("mfu", "inf"),
                        ("loss", "nan"), ("tps", "9" * 5000), ("tps", "-5")):  # fmt: skip
        bad = re.sub(rf"{name}:\s*\S+", f"{name}: {value}", titan)
        yield "torchtitan-log", f"{name}={value[:10]}", bad.encode()
    yield "torchtitan-log", "step 5000 digits", re.sub(r"step:\s*\d+", "step: " + "9" * 5000, titan, count=3).encode()
    yield "torchtitan-log", "rank 5000 digits", titan.replace("[rank0]:", "[rank" + "9" * 5000 + "]:", 3).encode()
    yield (
        "torchtitan-log",
        "batch 5000 digits",
        titan.replace("global batch size 8", "global batch size " + "9" * 5000).encode(),
    )
    yield "torchtitan-log", "binary", b"\xff" * 1000


def _cli_cases() -> Iterator[tuple[str, tuple[str, ...]]]:
    topo = str(TOPOLOGIES / "dgx-h100.yaml")
    base = ("solve", "--model", "llama3-8b", "--topology", topo, "--seq-len", "4096", "--global-batch", "64", "--json")
    yield "--top 10^9", (*base, "--top", "1000000000")
    yield "--top 2^64", (*base, "--top", "18446744073709551616")
    yield "--top 0", (*base, "--top", "0")
    yield "--seq-len 10^9", ("solve", "--model", "llama3-8b", "--topology", topo, "--seq-len", "1000000000",
                             "--global-batch", "64", "--json")  # fmt: skip
    yield "--global-batch 10^18", ("solve", "--model", "llama3-8b", "--topology", topo, "--seq-len", "4096",
                                   "--global-batch", "1000000000000000000", "--json")  # fmt: skip
    yield "--max-global-batch 10^12", ("solve", "--model", "llama3-8b", "--topology", topo, "--seq-len", "4096",
                                       "--max-global-batch", "1000000000000", "--json")  # fmt: skip
    for flag in ("--optimizer-bytes", "--headroom", "--time-limit", "--max-bubble", "--straggler-slowdown"):
        for value in ("nan", "inf", "-inf", "-1", "1e400", "0"):
            yield f"{flag} {value}", (*base, flag, value)
    for pin in (
        "tp=1000000000",
        "pp=100000000000000000000",
        "mb=1000000000",
        "vp=1000000",
        "cp=1000000000",
        "ga=1000000000000",
        "sharding=banana",
        "tp=nan",
        "tp=-1",
        "dp=0",
        "mb=1e400",
        "tp=" + "9" * 5000,
    ):
        yield f"--pin {pin[:20]}", (*base, "--pin", pin)
    for mx in ("pp=-1", "tp=nan", "pp=" + "9" * 5000, "sharding=2"):
        yield f"--max {mx[:20]}", (*base, "--max", mx)
    yield "--exclude banana", (*base, "--exclude", "sharding=banana")
    for value in ("nan", "inf", "-1", "0", "1e400", "1e-320"):
        yield f"mfu --tokens-per-s {value}", ("mfu", "--params", "7e9", "--tokens-per-s", value, "--json")
        yield f"mfu --params {value}", ("mfu", "--params", value, "--tokens-per-s", "1000", "--json")
        yield f"memory --params {value}", ("memory", "--params", value, "--gpus", "8", "--json")
        yield f"memory --gpu-memory-gb {value}", ("memory", "--params", "7e9", "--gpus", "8", "--gpu-memory-gb", value,
                                                  "--json")  # fmt: skip
        yield f"memory --optimizer-bytes {value}", ("memory", "--params", "7e9", "--gpus", "8", "--optimizer-bytes",
                                                    value, "--json")  # fmt: skip
        for flag in ("--mtbf-hours", "--checkpoint-minutes"):
            other = "--checkpoint-minutes" if flag == "--mtbf-hours" else "--mtbf-hours"
            yield f"checkpoint {flag} {value}", ("checkpoint", flag, value, other, "5", "--json")
    for value in ("1000000000", "18446744073709551616", "0", "-8"):
        yield f"memory --tp {value}", ("memory", "--params", "7e9", "--tp", value, "--json")
        yield f"memory --gpus {value}", ("memory", "--params", "7e9", "--gpus", value, "--json")
        yield f"memory --micro-batch {value}", ("memory", "--model", "llama3-8b", "--seq-len", "4096", "--micro-batch",
                                                value, "--json")  # fmt: skip
        yield f"--cluster gpus={value}", ("topology", "show", "--cluster", f"gpu=h100-sxm,gpus={value}", "--json")
        yield f"--cluster gpus_per_node={value}", ("topology", "show", "--cluster",
                                                   f"gpu=h100-sxm,gpus=64,gpus_per_node={value}", "--json")  # fmt: skip
        smi = str(FIXTURES / "discovery" / "dgx-h100-topo-m.txt")
        yield f"discover --servers {value}", ("topology", "discover", smi, "--from", "nvidia-smi", "--gpu", "h100-sxm",
                                              "--servers", value)  # fmt: skip
        yield (
            f"discover --gpus-per-server {value}",
            (
                "topology",
                "discover",
                str(FIXTURES / "discovery" / "slurm-tree-topology.conf"),
                "--from",
                "slurm",
                "--gpu",
                "h100-sxm",
                "--gpus-per-server",
                value,
            ),
        )
        yield f"emit --gpus-per-node {value}", ("emit", "--format", "ranks", "--layout", "tp=8,pp=1,dp=1", "--seq-len",
                                                "4096", "--model", "llama3-8b", "--gpus-per-node", value)  # fmt: skip
        yield f"profile --top {value}", ("profile", str(FIXTURES / "traces" / "cpu_dropout.json.gz"), "--top", value)
    for value in ("nan", "inf", "1e400", "-1", "true", "abc", "1e9", "0"):
        yield f"--cluster inter_node_gbps_per_gpu={value}", ("topology", "show", "--cluster",
                                                             f"gpu=h100-sxm,gpus=64,inter_node_gbps_per_gpu={value}",
                                                             "--json")  # fmt: skip
        yield (
            f"--cluster oversubscription={value}",
            ("topology", "show", "--cluster", f"gpu=h100-sxm,gpus=64,oversubscription={value}", "--json"),
        )
        yield (
            f"discover --nic-gbps {value}",
            (
                "topology",
                "discover",
                str(FIXTURES / "discovery" / "dgx-h100-topo-m.txt"),
                "--from",
                "nvidia-smi",
                "--gpu",
                "h100-sxm",
                "--nic-gbps",
                value,
            ),
        )
        yield (
            f"discover --oversubscription {value}",
            (
                "topology",
                "discover",
                str(FIXTURES / "discovery" / "slurm-tree-topology.conf"),
                "--from",
                "slurm",
                "--gpu",
                "h100-sxm",
                "--oversubscription",
                value,
            ),
        )
    yield "topology show /dev/zero", ("topology", "show", "/dev/zero", "--json")
    yield "topology show a directory", ("topology", "show", str(TOPOLOGIES), "--json")
    yield "topology show missing", ("topology", "show", "/nonexistent/x.yaml", "--json")
    yield "profile a directory", ("profile", str(FIXTURES), "--json")
    yield "compare /dev/zero", ("compare", "/dev/zero", "--no-rank", "--json")
    yield "model-config a directory", ("mfu", "--model-config", str(FIXTURES), "--tokens-per-s", "1", "--json")
    yield "calibration a directory", ("estimate", "--calibration", str(FIXTURES), "--model", "llama3-8b", "--cluster",
                                      SMALL_CLUSTER, "--layout", "tp=2,pp=1,dp=8,mb=1,ga=4", "--seq-len", "4096",
                                      "--global-batch", "32")  # fmt: skip
    yield "emit --plan a directory", ("emit", "--plan", str(FIXTURES), "--format", "megatron")
    yield "bad flag value", (*base, "--top", "abc")
    yield "unknown flag", (*base, "--banana")
    yield "unknown command", ("banana",)


def hand_made_cases() -> list[Case]:
    """Every class of bad input, at least one reproducer each."""
    out: list[Case] = []
    topo_cmds = COMMANDS["topology"]
    for i, (name, data) in enumerate(_topology_cases()):
        out.append(Case(f"topology: {name}", "topology", topo_cmds[i % 2], data, ".yaml"))
    for i, (name, data) in enumerate(_hf_cases()):
        out.append(Case(f"hf-config: {name}", "hf-config", COMMANDS["hf-config"][i % 3], data, ".json"))
    for name, data, suffix in _runs_cases():
        out.append(Case(f"runs: {name}", "runs", COMMANDS["runs"][0], data, suffix))
    for i, (name, data) in enumerate(_plan_cases()):
        out.append(Case(f"plan: {name}", "plan", COMMANDS["plan"][i % 3], data, ".json"))
    for name, data in _calibration_cases():
        out.append(Case(f"calibration: {name}", "calibration", COMMANDS["calibration"][0], data, ".yaml"))
    for name, data in _nvidia_smi_cases():
        out.append(Case(f"nvidia-smi: {name}", "nvidia-smi", COMMANDS["nvidia-smi"][0], data))
    for name, data in _nccl_xml_cases():
        out.append(Case(f"nccl-xml: {name}", "nccl-xml", COMMANDS["nccl-xml"][0], data, ".xml"))
    for name, data in _slurm_cases():
        out.append(Case(f"slurm: {name}", "slurm", COMMANDS["slurm"][0], data, ".conf"))
    for name, data, suffix in _trace_cases():
        out.append(Case(f"trace: {name}", "trace", COMMANDS["trace"][0], data, suffix))
    for kind, name, data in _log_cases():
        out.append(Case(f"{kind}: {name}", kind, COMMANDS[kind][0], data, ".log"))
    for name, argv in _cli_cases():
        out.append(Case(f"cli: {name}", "cli", argv))
    out += _output_cases()
    return out


def _output_cases() -> list[Case]:
    """Outputs must not replace the command's own input, nor write through a symlink silently."""
    runs = (FIXTURES / "runs" / "runs.jsonl").read_bytes()
    topo = (TOPOLOGIES / "dgx-h100.yaml").read_bytes()
    log = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_bytes()
    smi = (FIXTURES / "discovery" / "dgx-h100-topo-m.txt").read_bytes()
    meg = COMMANDS["megatron-log"][0]
    return [
        Case("output: calibrate -o its input", "runs", ("calibrate", "{F}", "-o", "{F}"), runs, ".jsonl",
             keep_input=True),
        Case("output: compare --report its input", "runs", ("compare", "{F}", "--no-rank", "--report", "{F}"), runs,
             ".jsonl", keep_input=True),
        Case("output: solve --save its topology", "topology", ("solve", "--model", "llama3-8b", "--topology", "{F}",
             "--seq-len", "4096", "--global-batch", "64", "--save", "{F}"), topo, ".yaml", keep_input=True),
        Case("output: solve --report its topology", "topology", ("solve", "--model", "llama3-8b", "--topology", "{F}",
             "--seq-len", "4096", "--global-batch", "64", "--report", "{F}"), topo, ".yaml", keep_input=True),
        Case("output: from-log -o its log", "megatron-log", tuple("{F}" if a == "{DIR}/runs.jsonl" else a for a in meg),
             log, ".log", keep_input=True),
        Case("output: discover -o its input", "nvidia-smi", ("topology", "discover", "{F}", "--from", "nvidia-smi",
             "--gpu", "h100-sxm", "-o", "{F}"), smi, ".txt", keep_input=True),
        Case("output: --save through a symlink", "topology", ("solve", "--model", "llama3-8b", "--topology", "{F}",
             "--seq-len", "4096", "--global-batch", "64", "--save", "{DIR}/link.json"), topo, ".yaml",
             extra_files=(("link.json", b"->{F}"),), keep_input=True),
        Case("output: -o a directory", "runs", ("calibrate", "{F}", "-o", "{DIR}"), runs, ".jsonl", keep_input=True),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- running

_NONFINITE = re.compile(r"(?<![\w.])-?\.?(nan|inf|infinity)(?![\w])", re.IGNORECASE)


def _strict_json(text: str) -> None:
    def refuse(token: str) -> None:
        raise ValueError(f"non-finite JSON token {token}")

    json.loads(text, parse_constant=refuse)


def _nonfinite(text: str) -> str | None:
    m = _NONFINITE.search(text)
    return m.group(0) if m else None


def _walk_nonfinite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _file_nonfinite(path: Path) -> bool:
    """A non-finite number in a file a command wrote: JSON (Lines) strictly parsed, YAML walked, else any token."""
    text = path.read_text(errors="replace")
    try:
        if path.suffix in (".json", ".jsonl"):
            for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
                if line.strip():
                    _strict_json(line)
            return False
        if path.suffix in (".yaml", ".yml"):
            return _walk_nonfinite(yaml.safe_load(text))
    except (ValueError, yaml.YAMLError):
        return True
    return _nonfinite(text) is not None


def _child(argv: list[str], out_path: str, err_path: str, memory_bytes: int) -> None:
    """In the forked child: run the console entry point; exit with its status (99: an uncaught exception)."""
    code = 97
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # fresh streams on fds 1 and 2: the parent's may be a capture object (pytest) that writes elsewhere
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", write_through=True)
        sys.argv = ["optlayout", *argv]
        from optlayout.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except MemoryError:
            sys.stderr.write("MemoryError\n")
            code = 98
        except BaseException:
            traceback.print_exc()
            code = 99
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _materialize(case: Case, tmp: Path) -> tuple[list[str], Path | None]:
    path = None
    if case.data is not None:
        path = tmp / f"input{case.suffix}"
        path.write_bytes(case.data)
    for name, data in case.extra_files:
        target = tmp / name
        if data.startswith(b"->"):
            link = data[2:].decode().replace("{F}", str(path))
            target.symlink_to(link)
        else:
            target.write_bytes(data)
    argv = [a.replace("{F}", str(path)).replace("{DIR}", str(tmp)) for a in case.argv]
    return argv, path


def classify(case: Case, code: int, out: str, err: str, tmp: Path, before: bytes | None, after: bytes | None) -> str:
    if code == 99 or "Traceback (most recent call last)" in err:
        return "traceback"
    if code == 98 or "MemoryError" in err:
        return "memory"
    if code < 0 or code == 97:
        return "crash"
    if case.keep_input and before is not None and before != after:
        return "overwrote-input"
    if code == 0:
        if "--json" in case.argv:
            try:
                _strict_json(out)
            except ValueError:
                return "nan"
        elif _nonfinite(out):
            return "nan"
        for written in tmp.iterdir():
            if written.name.startswith(("input", "stdout", "stderr")) or not written.is_file():
                continue
            if _file_nonfinite(written):
                return "nan"
        return "ok"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code in (1, 2) and len(lines) == 1:
        return "refused"
    return "message"


def run_case(case: Case, timeout_s: float = 30.0, memory_bytes: int = 3 << 30) -> Outcome:
    """Run one case in a forked child under the budgets; the scratch directory is removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        argv, path = _materialize(case, tmp)
        before = path.read_bytes() if path is not None and case.keep_input else None
        out_path, err_path = tmp / "stdout", tmp / "stderr"
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(argv, str(out_path), str(err_path), memory_bytes)
        fd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            if not ready:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - t0
        out = out_path.read_text(errors="replace") if out_path.exists() else ""
        err = err_path.read_text(errors="replace") if err_path.exists() else ""
        if not ready:
            return Outcome("hang", -9, out, err, seconds)
        code = os.waitstatus_to_exitcode(status)
        after = path.read_bytes() if path is not None and path.is_file() and case.keep_input else None
        return Outcome(classify(case, code, out, err, tmp, before, after), code, out, err, seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def preload() -> None:
    """Import what every command needs once in the parent, so each forked child starts warm."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import optlayout.cli
    import optlayout.planning
    import optlayout.runs.calibrate
    import optlayout.runs.compare
    import optlayout.topology.discovery  # noqa: F401


@dataclass
class Tally:
    """Verdict counts per kind, and the first few failures of each verdict."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, case: Case, outcome: Outcome) -> None:
        row = self.counts.setdefault(case.kind, dict.fromkeys(VERDICTS, 0))
        row[outcome.verdict] += 1
        self.seconds += outcome.seconds
        if outcome.failed:
            tail = (outcome.stderr.strip().splitlines() or [""])[-1][:300]
            self.examples.setdefault(outcome.verdict, []).append((case.name, tail))

    def total(self, verdict: str) -> int:
        return sum(row[verdict] for row in self.counts.values())

    @property
    def cases(self) -> int:
        return sum(sum(row.values()) for row in self.counts.values())


def run_all(cases: list[Case], timeout_s: float, progress: Callable[[int, Case, Outcome], None] | None = None) -> Tally:
    tally = Tally()
    for i, case in enumerate(cases):
        outcome = run_case(case, timeout_s)
        tally.add(case, outcome)
        if progress is not None:
            progress(i, case, outcome)
    return tally
