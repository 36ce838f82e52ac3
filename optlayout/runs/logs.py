"""Measured runs from real training logs: Megatron-LM iteration lines and torchtitan metric lines.

A log states throughput but not the whole run (model shape, cluster, layout), so those are given and the
log supplies `measured`. Warm-up lines (the first `warmup` logged lines) and lines that report skipped or
NaN iterations are dropped; the median of the rest is the measurement, and `derived_from` says which
lines were used.

Megatron-LM (`megatron/training/training.py`, `training_log`) prints, every `--log-interval` iterations,
` [date] iteration  N/ M | consumed samples: ... | elapsed time per iteration (ms): T | throughput per GPU
(TFLOP/s/GPU): F | learning rate: ... | global batch size: B | lm loss: ... | loss scale: ... | grad norm: ...
| number of skipped iterations: k | number of nan iterations: n |`, where T is averaged over the interval.
Tokens/s/GPU = B x seq_len / (T / 1000) / GPUs.

torchtitan (`torchtitan/components/metrics.py`, `MetricsProcessor.log`) prints, at step 1 and every
`metrics.log_freq` steps, `step: N  loss: ...  grad_norm: ...  memory: ...GiB(...%)  tps: X  tflops: F
mfu: P%` (ANSI colours unless disabled). There `tps = ntokens_since_last_log / (time_delta *
non_data_parallel_size)`: the tokens a data-parallel rank consumed, per second, divided by the GPUs that
share those tokens, i.e. already tokens/s per GPU. Older versions call it `wps`.

The log's own TFLOP/s and MFU are kept (`source_tflops_per_gpu`, `source_mfu`) for reference only: each
framework counts FLOPs its own way, so optlayout's MFU is always computed from tokens/s/GPU.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.json_doc import parse_json
from optlayout.inputs.numbers import int_from_text, number_from_text
from optlayout.inputs.readers import LOG, RUNS
from optlayout.runs.records import LAYOUT_FIELDS, Measured, RunJob, RunLayout, RunRecord
from optlayout.specs import ClusterSpec, Layout, ModelSpec

LOG_FORMATS: tuple[str, ...] = ("megatron", "torchtitan")
DEFAULT_WARMUP = 2

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RANK_PREFIX = re.compile(r"^\s*\[rank(\d+)\]:")
# Megatron-LM
_MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MEGATRON_PARALLEL = re.compile(r"using world size:\s*(\d+)")
_MEGATRON_SIZES = {
    "dp": re.compile(r"data-parallel size:\s*(\d+)"),
    "cp": re.compile(r"(?<![-\w])context-parallel size:\s*(\d+)"),
    "tp": re.compile(r"(?<![-\w])tensor-model-parallel size:\s*(\d+)"),
    "pp": re.compile(r"(?<![-\w])pipeline-model-parallel size:\s*(\d+)"),
}
_MEGATRON_ARG = re.compile(r"(?:^|[\s:])([a-z_]+) \.{2,} (\S+)\s*$")
_MEGATRON_ARGS = {  # argument dump name -> what it states
    "seq_length": "seq_len",
    "global_batch_size": "global_batch",
    "world_size": "gpus",
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "data_parallel_size": "dp",
    "micro_batch_size": "micro_batch",
}
# torchtitan
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+(.*)$")
_TITAN_FIELD = re.compile(r"([A-Za-z_]+):\s*(\S+)")
_TITAN_CONFIG = {
    "global_batch": re.compile(r"global batch size (\d+)"),
    "seq_len": re.compile(r"sequence length (\d+)"),
}


@dataclass(frozen=True)
class LogLine:
    """One logged interval: its last iteration (step) and what the log says about it."""

    line_number: int
    iteration: int
    tokens_per_s_per_gpu: float
    elapsed_s: float | None = None  # Megatron: average time per iteration over the interval
    global_batch: int | None = None
    skipped: int = 0
    nan: int = 0
    source_tflops_per_gpu: float | None = None
    source_mfu: float | None = None  # fraction, as the log states it (torchtitan)

    @property
    def usable(self) -> bool:
        return self.skipped == 0 and self.nan == 0


@dataclass(frozen=True)
class LogMeasurement:
    """The measurement a log yields: median tokens/s/GPU over the steady-state lines, and which ones."""

    format: str
    tokens_per_s_per_gpu: float
    derived_from: str
    iterations: tuple[int, ...]  # the iterations (steps) of the lines used
    lines_found: int
    source_tflops_per_gpu: float | None = None
    source_mfu: float | None = None

    def measured(self, log_file: str | None = None) -> Measured:
        extra: dict[str, Any] = {}
        if self.source_tflops_per_gpu is not None:
            extra["source_tflops_per_gpu"] = self.source_tflops_per_gpu
        if self.source_mfu is not None:
            extra["source_mfu"] = self.source_mfu
        if log_file is not None:
            extra["log_file"] = log_file
        return Measured(tokens_per_s_per_gpu=self.tokens_per_s_per_gpu, derived_from=self.derived_from, **extra)


def _number(text: str, what: str = "number") -> float:
    """A logged figure: finite (a NaN or infinite throughput, time or count is refused, naming the line)."""
    return number_from_text(text.strip().rstrip("%"), what)


def _count(text: str, where: str) -> int:
    return int_from_text(text, f"log: {where}")


def _short(text: str) -> str:
    return text if len(text) <= 20 else text[:17] + "..."


def _fields(rest: str) -> dict[str, str]:
    """`| key: value | key: value |` -> {key: value}, keys lower-case."""
    out: dict[str, str] = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _clean(lines: list[str]) -> list[str]:
    return [_ANSI.sub("", line) for line in lines]


def parse_megatron_lines(text: str, name: str, seq_len: int, gpus: int) -> tuple[list[LogLine], dict[str, int]]:
    """Every iteration line of a Megatron-LM log, and what its header states (sizes, seq_length, ...)."""
    stated: dict[str, int] = {}
    out: list[LogLine] = []
    for number, line in enumerate(_clean(text.splitlines()), start=1):
        match = _MEGATRON_ITERATION.search(line)
        if match is None:
            _megatron_header(line, stated)
            continue
        fields = _fields(match.group(3))
        where = f"{name} line {number} (iteration {_short(match.group(1))})"
        elapsed_ms = _field(fields, "elapsed time per iteration (ms)", where)
        batch = _field(fields, "global batch size", where)
        if elapsed_ms is None or elapsed_ms <= 0:
            raise _missing_or_not_positive(fields, "elapsed time per iteration (ms)", where)
        if batch is None or batch <= 0:
            raise _missing_or_not_positive(fields, "global batch size", where)
        elapsed_s = elapsed_ms / 1000.0
        out.append(
            LogLine(
                line_number=number,
                iteration=_count(match.group(1), f"{where}: iteration"),
                tokens_per_s_per_gpu=batch * seq_len / elapsed_s / gpus,
                elapsed_s=elapsed_s,
                global_batch=int(batch),
                skipped=int(_field(fields, "number of skipped iterations", where) or 0),
                nan=int(_field(fields, "number of nan iterations", where) or 0),
                source_tflops_per_gpu=_field(fields, "throughput per gpu (tflop/s/gpu)", where),
            )
        )
    return out, stated


def _missing_or_not_positive(fields: dict[str, str], key: str, where: str) -> InputError:
    if key not in fields:
        return InputError(f"log: {where} has no {key!r}")
    return InputError(f"log: {where}: {key!r} is {_short(fields[key])}, not positive")


def _field(fields: dict[str, str], key: str, where: str) -> float | None:
    if key not in fields:
        return None
    try:
        return _number(fields[key])
    except InputError:
        raise InputError(f"log: {where}: {key!r} is not a finite number ({_short(fields[key])!r})") from None


def _megatron_header(line: str, stated: dict[str, int]) -> None:
    world = _MEGATRON_PARALLEL.search(line)
    if world:
        stated.setdefault("gpus", _count(world.group(1), "world size"))
        for key, pattern in _MEGATRON_SIZES.items():
            found = pattern.search(line)
            if found:
                stated.setdefault(key, _count(found.group(1), key))
        return
    arg = _MEGATRON_ARG.search(line)
    if arg and arg.group(1) in _MEGATRON_ARGS and re.fullmatch(r"[0-9]+", arg.group(2)):
        stated.setdefault(_MEGATRON_ARGS[arg.group(1)], _count(arg.group(2), arg.group(1)))


def parse_torchtitan_lines(text: str, name: str) -> tuple[list[LogLine], dict[str, int]]:
    """Every training metric line of a torchtitan log (one rank's), and the batch/sequence it states."""
    stated: dict[str, int] = {}
    out: list[LogLine] = []
    rank: int | None = None
    for number, line in enumerate(_clean(text.splitlines()), start=1):
        match = _TITAN_STEP.search(line)
        if match is None:
            if "Trainer is initialized with" in line or "Training starts at step" in line:
                for key, pattern in _TITAN_CONFIG.items():
                    found = pattern.search(line)
                    if found:
                        stated.setdefault(key, _count(found.group(1), f"{name} line {number}: {key}"))
            continue
        fields = {k.lower(): v for k, v in _TITAN_FIELD.findall(match.group(2))}
        tps_text = fields.get("tps", fields.get("wps"))
        if tps_text is None:
            continue  # some other message that mentions a step
        prefix = _RANK_PREFIX.match(line)
        line_rank = _count(prefix.group(1), f"{name} line {number}: rank") if prefix else None
        rank = line_rank if rank is None else rank
        if line_rank is not None and line_rank != rank:
            continue  # several ranks logging: keep the first one's lines (tps is per GPU on each)
        where = f"{name} line {number} (step {_short(match.group(1))})"
        tps = _number(tps_text, f"log: {where}: tps")
        if tps <= 0:
            raise InputError(f"log: {where}: tps is {_short(tps_text)}, not positive")
        tflops = _number(fields["tflops"], f"log: {where}: tflops") if "tflops" in fields else None
        mfu = _number(fields["mfu"], f"log: {where}: mfu") / 100 if "mfu" in fields else None
        try:  # a NaN or infinite loss is data: it marks an iteration to leave out
            diverged = not math.isfinite(float(fields.get("loss", "0").replace(",", "")))
        except ValueError:
            raise InputError(f"log: {where}: loss is not a number ({_short(fields['loss'])!r})") from None
        out.append(
            LogLine(
                line_number=number,
                iteration=_count(match.group(1), f"{where}: step"),
                tokens_per_s_per_gpu=tps,
                nan=1 if diverged else 0,
                source_tflops_per_gpu=tflops,
                source_mfu=mfu,
            )
        )
    return out, stated


def _check_stated(stated: dict[str, int], given: dict[str, int | None], name: str) -> None:
    """What the log's header states must agree with what was given for the run."""
    words = {"seq_len": "the job's seq_len", "global_batch": "the job's global_batch", "gpus": "the cluster's gpus"}
    for key, value in stated.items():
        expected = given.get(key)
        if expected is not None and value != expected:
            what = words.get(key, f"the layout's {key}")
            raise InputError(f"log: {name} states {key} = {value}, but {what} is {expected}")


def _span(lines: list[LogLine]) -> str:
    its = [ln.iteration for ln in lines]
    steps = {b - a for a, b in itertools.pairwise(its)}
    if len(its) == 1:
        return f"{its[0]}"
    if steps == {1}:
        return f"{its[0]}..{its[-1]}"
    every = f", every {steps.pop()}" if len(steps) == 1 else ""
    return f"{its[0]}..{its[-1]}{every}"


def _measure(
    fmt: str,
    name: str,
    lines: list[LogLine],
    warmup: int,
    unit: str,
    what: str,
    value: Callable[[list[LogLine]], float],
) -> LogMeasurement:
    if not lines:
        raise InputError(f"log: {name} has no {fmt} {unit} lines (is --format {fmt} right?)")
    if warmup < 0:
        raise InputError(f"log: warmup must be >= 0 (got {warmup})")
    steady = lines[warmup:]
    used = [ln for ln in steady if ln.usable]
    if not used:
        raise InputError(
            f"log: {name} has {len(lines)} {unit} lines but none after the {warmup} warm-up lines "
            "with no skipped or NaN iterations"
        )
    excluded = len(steady) - len(used)
    note = f"; {excluded} with skipped/NaN iterations left out" if excluded else ""
    noun = "iterations" if unit == "iteration" else "steps"
    derived = f"{fmt} log: median of {len(used)} {noun} ({_span(used)}{note}), {what}"
    tflops = [ln.source_tflops_per_gpu for ln in used if ln.source_tflops_per_gpu is not None]
    mfus = [ln.source_mfu for ln in used if ln.source_mfu is not None]
    return LogMeasurement(
        format=fmt,
        tokens_per_s_per_gpu=value(used),
        derived_from=derived,
        iterations=tuple(ln.iteration for ln in used),
        lines_found=len(lines),
        source_tflops_per_gpu=statistics.median(tflops) if tflops else None,
        source_mfu=round(statistics.median(mfus), 6) if mfus else None,
    )


def measure_megatron(
    text: str,
    seq_len: int,
    global_batch: int,
    gpus: int,
    warmup: int = DEFAULT_WARMUP,
    name: str = "log",
    layout: RunLayout | None = None,
) -> LogMeasurement:
    """Median tokens/s/GPU of a Megatron-LM log: global batch x seq_len / median elapsed time / GPUs."""
    lines, stated = parse_megatron_lines(text, name, seq_len, gpus)
    for ln in lines:
        if ln.global_batch != global_batch:
            raise InputError(
                f"log: {name} line {ln.line_number} (iteration {ln.iteration}) has global batch size "
                f"{ln.global_batch}, but the job's global_batch is {global_batch}"
            )
    given: dict[str, int | None] = {"seq_len": seq_len, "global_batch": global_batch, "gpus": gpus}
    if layout is not None:
        given |= {k: getattr(layout, k) for k in ("tp", "pp", "cp", "dp", "micro_batch")}
    _check_stated(stated, given, name)

    def value(used: list[LogLine]) -> float:
        elapsed = statistics.median(ln.elapsed_s for ln in used if ln.elapsed_s is not None)
        return global_batch * seq_len / elapsed / gpus

    return _measure("megatron", name, lines, warmup, "iteration", "elapsed time per iteration", value)


def measure_torchtitan(
    text: str, seq_len: int, global_batch: int, warmup: int = DEFAULT_WARMUP, name: str = "log"
) -> LogMeasurement:
    """Median of a torchtitan log's `tps` (already tokens/s per GPU)."""
    lines, stated = parse_torchtitan_lines(text, name)
    _check_stated(stated, {"seq_len": seq_len, "global_batch": global_batch}, name)

    def value(used: list[LogLine]) -> float:
        return statistics.median(ln.tokens_per_s_per_gpu for ln in used)

    return _measure("torchtitan", name, lines, warmup, "step", "tps (tokens/s per GPU as logged)", value)


def measure_log(
    path: str | Path,
    fmt: str,
    job: RunJob,
    cluster: ClusterSpec,
    layout: RunLayout | None = None,
    warmup: int = DEFAULT_WARMUP,
) -> LogMeasurement:
    """Read a training log file and measure it."""
    path = Path(path)
    if fmt not in LOG_FORMATS:
        raise InputError(f"log: unknown format {fmt!r} (known: {', '.join(LOG_FORMATS)})")
    text = LOG.text(path)
    if fmt == "megatron":
        return measure_megatron(text, job.seq_len, job.global_batch, cluster.gpus, warmup, path.name, layout)
    return measure_torchtitan(text, job.seq_len, job.global_batch, warmup, path.name)


def run_layout(text: str) -> RunLayout:
    """`tp=2,pp=1,dp=4,mb=1` -> a RunLayout with only the given fields set, the rest null (not published).

    The text is checked with `parse_layout`; `ga=` is accepted and checked against the batch later, but
    uneven stage splits (`first=`/`last=`) are not part of the run-record format.
    """
    from optlayout.layout import parse_layout

    layout = parse_layout(text)
    given = {_layout_key(part) for part in text.split(",") if part.strip()}
    unknown = given - set(LAYOUT_FIELDS) - {"grad_accum"}
    if unknown:
        raise InputError(f"layout: {', '.join(sorted(unknown))} cannot be stated in a run record")
    values = {k: _plain(getattr(layout, k)) for k in LAYOUT_FIELDS if k in given}
    return RunLayout.model_validate(values)


def _layout_key(part: str) -> str:
    from optlayout.layout.text import axis_key

    return axis_key(part)


def _plain(value: object) -> object:
    return getattr(value, "value", value)


def _check_layout(layout_text: str | None, layout: RunLayout, job: RunJob, cluster: ClusterSpec) -> None:
    """Degrees that multiply to another GPU count, or `ga=` that disagrees with the batch, are errors."""
    known = layout.known()
    degrees = [int(known[k]) for k in ("tp", "pp", "cp", "dp") if k in known]
    if len(degrees) == 4 and math.prod(degrees) != cluster.gpus:
        raise InputError(f"layout: tp*pp*cp*dp = {math.prod(degrees)} but the cluster has {cluster.gpus} GPUs")
    if layout_text is None or "grad_accum" not in {_layout_key(p) for p in layout_text.split(",") if p.strip()}:
        return
    from optlayout.layout import parse_layout

    full: Layout = parse_layout(layout_text)
    if "dp" in known and "micro_batch" in known and full.global_batch != job.global_batch:
        raise InputError(f"layout: mb*ga*dp = {full.global_batch} but the job's global_batch is {job.global_batch}")


@checked_arguments
def run_from_log(
    path: str | Path,
    fmt: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    job: RunJob,
    layout: RunLayout | str,
    run_id: str | None = None,
    source: str | None = None,
    warmup: int = DEFAULT_WARMUP,
) -> RunRecord:
    """A run record for a training log: the given model, cluster, job and layout, measured from the log."""
    path = Path(path)
    layout_text = layout if isinstance(layout, str) else None
    run = run_layout(layout) if isinstance(layout, str) else layout
    _check_layout(layout_text, run, job, cluster)
    measurement = measure_log(path, fmt, job, cluster, run, warmup)
    try:
        record = RunRecord(
            id=run_id or path.stem,
            source=source or f"{fmt} training log",
            model=model,
            cluster=cluster,
            job=job,
            layout=run,
            measured=measurement.measured(path.name),
        )
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "run")) from None
    from optlayout.runs.predict import check_record  # the solver's space: loaded once a record is made

    check_record(record)  # `compare` reads only records some legal layout matches
    return record


def record_line(record: RunRecord) -> str:
    """The record as one JSON line of the run-record format (every layout field present, null if unknown)."""
    data = record.model_dump(mode="json", exclude_none=False)
    if data.get("hardware_note") is None:
        data.pop("hardware_note", None)
    data["model"] = {k: v for k, v in data["model"].items() if v is not None}
    return json.dumps(data)


def append_run(record: RunRecord, path: str | Path) -> None:
    """Append a record to a JSON Lines runs file (created if missing); an id already there is an error."""
    path = Path(path)
    existing = RUNS.text(path) if path.exists() else ""
    for number, line in enumerate(existing.split("\n"), start=1):
        try:
            raw = parse_json(line, "runs") if line.strip() else None
        except InputError:
            raise InputError(f"runs: {path.name} line {number} is not valid JSON; not appending to it") from None
        if isinstance(raw, dict) and raw.get("id") == record.id:
            raise InputError(f"runs: {path.name} already holds a run with id {record.id!r} (give another --id)")
    separator = "" if not existing or existing.endswith("\n") else "\n"
    with path.open("a") as handle:
        handle.write(separator + record_line(record) + "\n")


# ---------------------------------------------------------------- what a log states about its run

_MEGATRON_DUMP = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?([a-z][a-z0-9_]*) \.{2,} (.*?)\s*$")
MAX_ECHOED_COUNT = 2**31
_MEGATRON_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with \d+ dummy tokens")
_TITAN_INIT = re.compile(
    r"local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+), sequence length (\d+)"
)
_TITAN_MESH = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
_TITAN_ARGS = re.compile(r"TransformerModelArgs\((.*)\)")
_TITAN_AC = re.compile(r"Applied (selective|full|SelectiveAC|FullAC) activation checkpointing")
_TITAN_ECHO = re.compile(r"Running with (?:configs|args): (\{.*)$")


@dataclass
class LogFacts:
    """What a training log states about its run (None = not stated), and which lines said so."""

    format: str
    seq_len: int | None = None
    global_batch: int | None = None
    gpus: int | None = None
    layout: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    precision: str | None = None
    fp8_recipe: str | None = None
    read: list[str] | None = None

    def said(self, what: str) -> None:
        self.read = [*(self.read or []), what]


def _dump(text: str) -> tuple[dict[str, str], int | None]:
    """Megatron-LM's argument dump (`name ..... value` between the `arguments` rulers) and the vocabulary size
    its tokenizer reports (`> padded vocab (size: N) with K dummy tokens`)."""
    args: dict[str, str] = {}
    vocab = None
    inside = False
    for line in _clean(text.splitlines()):
        if "----- arguments -----" in line:
            inside = True
            continue
        if "end of arguments" in line:
            inside = False
            continue
        if inside:
            match = _MEGATRON_DUMP.match(line)
            if match:
                args.setdefault(match.group(1), match.group(2))
        found = _MEGATRON_VOCAB.search(line)
        if found and vocab is None:
            vocab = _count(found.group(1), "the padded-vocab line")
    return args, vocab


def _int(value: str | None) -> int | None:
    """An integer argument of the dump, None when unset (`str.isdigit` would also take a superscript '²')."""
    return None if value is None or value == "None" else _count(value, "a Megatron argument")


def _true(value: str | None) -> bool:
    return value == "True"


def megatron_facts(text: str) -> LogFacts:
    """Sequence length, global batch, world, layout, model shape and precision from a Megatron-LM log's
    argument dump (names as in `megatron/training/arguments.py`)."""
    args, vocab = _dump(text)
    facts = LogFacts("megatron")
    if not args:
        return facts
    facts.seq_len, facts.global_batch = _int(args.get("seq_length")), _int(args.get("global_batch_size"))
    facts.gpus = _int(args.get("world_size"))
    layout: dict[str, Any] = {}
    for key, name in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                      ("cp", "context_parallel_size"), ("dp", "data_parallel_size"),
                      ("micro_batch", "micro_batch_size")):  # fmt: skip
        if _int(args.get(name)) is not None:
            layout[key] = _int(args[name])
    if "virtual_pipeline_model_parallel_size" in args:
        layout["vp"] = _int(args["virtual_pipeline_model_parallel_size"]) or 1
    if "sequence_parallel" in args:
        layout["sequence_parallel"] = _true(args["sequence_parallel"]) and layout.get("tp", 1) > 1
    if _true(args.get("use_megatron_fsdp")) or _true(args.get("use_custom_fsdp")):
        strategy = args.get("data_parallel_sharding_strategy", "optim_grads_params")
        layout["sharding"] = {"optim_grads": "zero2", "optim_grads_params": "fsdp", "optim": "zero1"}.get(
            strategy, "none"
        )
    elif "use_distributed_optimizer" in args:
        layout["sharding"] = "zero1" if _true(args["use_distributed_optimizer"]) else "none"
    if "recompute_granularity" in args:
        layout["recompute"] = {"selective": "selective", "full": "full"}.get(args["recompute_granularity"], "none")
        if layout["recompute"] == "full" and args.get("recompute_method") == "block":  # uniform: every layer
            layout["recompute_layers"] = _int(args.get("recompute_num_layers"))
    facts.layout = layout or None
    if _true(args.get("bf16")) or _true(args.get("fp16")):
        fp8 = args.get("fp8")
        facts.precision = "fp8" if fp8 not in (None, "None") else ("bf16" if _true(args.get("bf16")) else "fp16")
        recipe = args.get("fp8_recipe")
        if facts.precision == "fp8" and recipe not in (None, "None"):  # Megatron's delayed scaling is per-tensor
            facts.fp8_recipe = {"delayed": "tensorwise"}.get(recipe, recipe)
    elif "bf16" in args:
        facts.precision = None  # fp32 training: no precision optlayout models
    vocab = vocab or _int(args.get("padded_vocab_size")) or _int(args.get("vocab_size"))
    hidden, heads = _int(args.get("hidden_size")), _int(args.get("num_attention_heads"))
    if hidden and heads and _int(args.get("num_layers")):
        groups = _int(args.get("num_query_groups")) if _true(args.get("group_query_attention")) else heads
        mlp = "swiglu" if _true(args.get("swiglu")) else "relu2" if _true(args.get("squared_relu")) else "gelu"
        learned = args.get("position_embedding_type", "learned_absolute") == "learned_absolute"
        model: dict[str, Any] = {
            "layers": _int(args["num_layers"]),
            "hidden": hidden,
            "ffn": _int(args.get("ffn_hidden_size")) or 4 * hidden,
            "heads": heads,
            "kv_heads": groups or heads,
            "mlp": mlp,
            "tied_embeddings": not _true(args.get("untie_embeddings_and_output_weights")),
            "bias": args.get("add_bias_linear", "True") == "True",
            "position_embeddings": (_int(args.get("max_position_embeddings")) or 0) if learned else 0,
        }
        kv_channels = _int(args.get("kv_channels"))
        if kv_channels and kv_channels * heads != hidden:
            model["head_dim"] = kv_channels
        if vocab:
            model["vocab"] = vocab
        facts.model = model
    facts.said("the argument dump")
    return facts


def _titan_echo(lines: list[str]) -> dict[str, Any] | None:
    """torchtitan's config echo (`debug.print_config` / `job.print_config`): the JSON after `Running with configs:`."""
    for i, line in enumerate(lines):
        match = _TITAN_ECHO.search(line)
        if not match:
            continue
        body = [match.group(1)] + [_RANK_PREFIX.sub("", rest) for rest in lines[i + 1 :]]
        depth, out = 0, []
        for part in body:
            out.append(part)
            depth += part.count("{") - part.count("}")
            if depth <= 0:
                break
        try:  # an echo cut short (or not JSON) is not read; `read` then does not list it
            echo = parse_json("\n".join(out), "log: the config echo")
        except InputError:
            return None
        return echo if isinstance(echo, dict) else None
    return None


def _llama_ffn(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """The Llama FFN rule torchtitan applies: h = 2*4d/3, times the multiplier, rounded up to multiple_of."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class _TitanArgs:
    """The fields of torchtitan's `TransformerModelArgs(...)` line, each read as its type or refused naming it."""

    fields: dict[str, str]

    def _text(self, key: str) -> str | None:
        value = self.fields.get(key)
        return None if value is None or value.strip() == "None" else value

    def count(self, key: str, default: int | None = None) -> int:
        value = self._text(key)
        if value is None:
            if default is None:
                raise InputError(f"log: the model-args line lacks {key}")
            return default
        return _count(value, f"the model-args line: {key}")

    def number(self, key: str, default: float | None = None) -> float | None:
        value = self._text(key)
        return default if value is None else _number(value, f"log: the model-args line: {key}")


def _echo_section(echo: dict[str, Any], name: str) -> dict[str, Any]:
    """One section of torchtitan's config echo, its integer values checked (a degree, a batch, a length)."""
    section = echo.get(name) or {}
    if not isinstance(section, dict):
        raise InputError(f"log: the config echo's {name} is not an object")
    for key, value in section.items():
        counted = key.endswith(("_degree", "_size", "seq_len")) and value is not None
        if counted and (isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= MAX_ECHOED_COUNT):
            raise InputError(f"log: the config echo's {name}.{key} is not a count ({_short(repr(value))})")
    return section


def torchtitan_facts(text: str) -> LogFacts:
    """Sequence length, batch, mesh, model shape, recompute and float8 from a torchtitan log (its trainer-init
    line, device-mesh line, model-args line, and the config echo when printed)."""
    lines = _clean(text.splitlines())
    facts = LogFacts("torchtitan")
    layout: dict[str, Any] = {}
    local = None
    for line in lines:
        if (found := _TITAN_INIT.search(line)) and facts.seq_len is None:
            local, facts.global_batch, _, facts.seq_len = (_count(g, "the trainer-init line") for g in found.groups())
            facts.said("the trainer-init line")
        elif (found := _TITAN_MESH.search(line)) and "mesh" not in (facts.read or []):
            names = [n.strip(" '\"") for n in found.group(1).split(",") if n.strip()]
            sizes = [_count(s, "the device-mesh line") for s in found.group(2).split(",") if s.strip()]
            degrees = dict(zip(names, sizes, strict=False))
            facts.gpus = math.prod(sizes)
            replicate, shard = degrees.get("dp_replicate", 1), degrees.get("dp_shard", 1)
            layout |= {"tp": degrees.get("tp", 1), "pp": degrees.get("pp", 1), "cp": degrees.get("cp", 1)}
            layout["dp"] = replicate * shard
            layout["sharding"] = "none" if shard == 1 else ("zero2" if layout["pp"] > 1 else "fsdp")
            facts.said("mesh")
        elif (found := _TITAN_ARGS.search(line)) and facts.model is None:
            args = _TitanArgs(dict(re.findall(r"(\w+)=([^,()]+)", found.group(1))))
            dim, heads = args.count("dim"), args.count("n_heads")
            facts.model = {
                "layers": args.count("n_layers"),
                "hidden": dim,
                "ffn": _llama_ffn(dim, args.count("multiple_of", 256), args.number("ffn_dim_multiplier")),
                "heads": heads,
                "kv_heads": args.count("n_kv_heads", heads),
                "vocab": args.count("vocab_size"),
                "rope_theta": args.number("rope_theta", 10000.0),
            }
            facts.said("the model-args line")
        elif found := _TITAN_AC.search(line):
            layout["recompute"] = "selective" if found.group(1).lower().startswith("selective") else "full"
        elif "Float8" in line and ("Swapped to" in line or "training active" in line):
            facts.precision = "fp8"
    if facts.read and "mesh" in facts.read:
        facts.read = [r if r != "mesh" else "the device-mesh line" for r in facts.read]
    echo = _titan_echo(lines)
    if echo:
        par, train = _echo_section(echo, "parallelism"), _echo_section(echo, "training")
        facts.seq_len = facts.seq_len or train.get("seq_len")
        facts.global_batch = facts.global_batch if facts.global_batch else train.get("global_batch_size")
        local = local or train.get("local_batch_size")
        for key, name in (("tp", "tensor_parallel_degree"), ("pp", "pipeline_parallel_degree"),
                          ("cp", "context_parallel_degree")):  # fmt: skip
            layout.setdefault(key, par.get(name))
        if layout.get("pp", 1) and layout.get("pp", 1) > 1:
            layout["micro_batch"] = par.get("pipeline_parallel_microbatch_size", 1)
        mode = _echo_section(echo, "activation_checkpoint").get("mode")
        if mode in ("none", "selective", "full"):
            layout.setdefault("recompute", mode)
        converters = _echo_section(echo, "model").get("converters") or []
        if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
            raise InputError("log: the config echo's model.converters is not a list of names")
        if any("float8" in c for c in converters):
            facts.precision = "fp8"
        facts.said("the config echo")
    if local is not None and layout.get("pp", 1) == 1:
        layout["micro_batch"] = local  # without PP each forward takes the local batch; with PP the echo says
    if layout:
        layout.setdefault("recompute", "none")  # torchtitan logs the checkpointing it applies
        facts.layout = {k: v for k, v in layout.items() if v is not None}
    if facts.read and facts.precision is None:
        facts.precision = "bf16"
        facts.said("bf16 assumed (torchtitan's mixed_precision_param default; no float8 converter logged)")
    return facts


def log_facts(text: str, fmt: str) -> LogFacts:
    """What a log of `fmt` states about its run."""
    return megatron_facts(text) if fmt == "megatron" else torchtitan_facts(text)


_SHAPE_KEYS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab")


def record_from_log(
    path: str | Path,
    fmt: str,
    *,
    model: ModelSpec | None = None,
    cluster: ClusterSpec | None = None,
    gpu: str | None = None,
    seq_len: int | None = None,
    global_batch: int | None = None,
    layout: str | None = None,
    precision: str | None = None,
    run_id: str | None = None,
    source: str | None = None,
    warmup: int = DEFAULT_WARMUP,
) -> tuple[RunRecord, list[str]]:
    """A run record from a log: what the log states (Megatron-LM's argument dump; torchtitan's trainer-init,
    mesh and model lines and config echo) fills what is not given; what is given must agree with the log.
    Returns the record and one line per source saying what was read and what was given."""
    path = Path(path)
    if fmt not in LOG_FORMATS:
        raise InputError(f"log: unknown format {fmt!r} (known: {', '.join(LOG_FORMATS)})")
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise InputError(f"log: no such file {str(path)!r}") from None
    except IsADirectoryError:
        raise InputError(f"log: {str(path)!r} is a directory") from None
    facts = log_facts(text, fmt)
    read, given = [], []

    def pick(name: str, value: Any, stated: Any, flag: str) -> Any:
        if value is not None:
            if stated is not None and value != stated:
                raise InputError(f"log: {path.name} states {name} = {stated}, but {flag} gives {value}")
            given.append(f"{name} {value}")
            return value
        if stated is None:
            raise InputError(f"log: {path.name} does not state the {name}; give {flag}")
        read.append(f"{name} {stated}")
        return stated

    seq = pick("sequence length", seq_len, facts.seq_len, "--seq-len")
    batch = pick("global batch", global_batch, facts.global_batch, "--global-batch")
    prec = pick("precision", precision, facts.precision, "--precision")
    if cluster is None:
        if gpu is None:
            raise InputError("cluster: give --gpu NAME (the log does not name its GPU) or --cluster gpu=...,gpus=...")
        gpus = pick("world size", None, facts.gpus, "--cluster gpu=...,gpus=...")
        try:
            cluster = ClusterSpec(gpu=gpu, gpus=gpus, gpus_per_node=min(8, gpus))
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, "cluster")) from None
        given.append(f"gpu {gpu}")
    else:
        pick("world size", cluster.gpus, facts.gpus, "--cluster gpus=")
    if layout is not None:
        run: RunLayout | str = layout
        given.append(f"layout {layout}")
    elif facts.layout:
        try:
            run = RunLayout(**facts.layout)
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, "log layout")) from None
        read.append("layout " + ",".join(f"{k}={_plain(v)}" for k, v in run.known().items()))
    else:
        raise InputError(f"log: {path.name} does not state the layout; give --layout tp=...,pp=...,dp=...")
    stated_shape = {k: v for k, v in (facts.model or {}).items() if k in _SHAPE_KEYS}
    if model is not None:
        for key, value in stated_shape.items():
            if getattr(model, key) != value:
                raise InputError(f"log: {path.name} states the model's {key} = {value}, but {model.name} has "
                                     f"{getattr(model, key)}")  # fmt: skip
        given.append(f"model {model.name}")
    elif facts.model and "vocab" in facts.model:
        try:
            model = ModelSpec(name=f"{path.stem} model", **facts.model)
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, "log model")) from None
        read.append("model " + ", ".join(f"{k} {v}" for k, v in stated_shape.items()))
    else:
        missing = "the vocabulary size" if facts.model else "the model's shape"
        raise InputError(f"log: {path.name} does not state {missing}; give --model or --model-config")
    try:
        recipe = facts.fp8_recipe if prec == "fp8" else None
        if recipe is not None:
            read.append(f"fp8 recipe {recipe}")
        job = RunJob.model_validate({"seq_len": seq, "global_batch": batch, "precision": prec, "fp8_recipe": recipe})
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "job")) from None
    record = run_from_log(path, fmt, model, cluster, job, run, run_id=run_id, source=source, warmup=warmup)
    where = ", ".join(facts.read or ["no header"])
    lines = [f"read from the log ({where}): {'; '.join(read) or 'nothing'}"]
    if given:
        lines.append(f"given: {'; '.join(given)}")
    return record, lines
