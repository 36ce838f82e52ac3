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
            raise InputError(f"log: {where} has no 'elapsed time per iteration (ms)'")
        if batch is None or batch <= 0:
            raise InputError(f"log: {where} has no 'global batch size'")
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
        return RunRecord(
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
