"""Analysis of torch.profiler Chrome traces: where a training step's time goes.

Answers three questions about one or more traces (one per rank):

1. Do large matrix multiplications dominate? Self time per operation (an op's duration minus its direct
   children's, from the tree of complete 'X' events on each CPU thread) or, on GPU traces, kernel time on
   GPU streams, grouped into categories.
2. Is communication overlapped? On GPU traces, the fraction of collective (NCCL) kernel time that runs
   while compute kernels run on another stream of the same device.
3. Are the ranks equally fast? Each rank's step time (ProfilerStep#N spans, else the trace span) and the
   slowest rank's slowdown against the median.

Traces are read as a stream (`iter_trace_events`): plain or gzip JSON, chunk by chunk, each element of
`traceEvents` decoded on its own with `json.JSONDecoder.raw_decode`, so a trace of hundreds of MB never
sits in memory; only compact per-event arrays (start, duration, name id) are kept.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from optlayout.errors import InputError
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.files import check_readable
from optlayout.inputs.json_doc import refuse_constant
from optlayout.inputs.limits import MAX_EVENT_BYTES

__all__ = [
    "CATEGORIES",
    "OpTime",
    "Overlap",
    "ProfileReport",
    "RankTime",
    "TraceStream",
    "TraceSummary",
    "analyze",
    "categorize",
    "iter_trace_events",
    "summarize_trace",
]

# Category keys, in report order.
CATEGORIES: tuple[str, ...] = (
    "matmul_attention",
    "elementwise_normalization",
    "random",
    "memory_copy",
    "communication",
    "data_loading",
    "idle",
    "other",
)

_COMM = re.compile(
    r"nccl|c10d|gloo|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
    r"|(?<![a-z_])broadcast(?![a-z_])|(?<![a-z])(send|recv|sendrecv)(?![a-z])"
)
_DATA = re.compile(r"dataloader|data_loader|collate")
_RANDOM = re.compile(
    r"bernoulli|dropout|philox|curand|(?<![a-z])(rand|randn|randint|randperm)(?![a-z])|uniform_|normal_"
)
_COPY = re.compile(r"memcpy|memset|copy|(?<![a-z])to(?![a-z_])|contiguous|clone")
_MATMUL = re.compile(
    r"(?<![a-z])(addmm|baddbmm|bmm|mm|addmv|mv|matmul|linear|einsum)(?![a-z])|mmbackward|gemm|gemv|cublas|cutlass"
    r"|xmma|attention|attn|sdpa|flash|convolution|conv\dd"
)
_ELEMENTWISE = re.compile(
    r"elementwise|pointwise|vectorized|unrolled|reduce_kernel|triton_(poi|red|per)|norm|softmax|gelu|relu|silu"
    r"|sigmoid|tanh|loss|_foreach|adam|lerp|addcmul|addcdiv|where|masked|threshold"
    r"|(?<![a-z])(add|sub|mul|div|pow|sqrt|rsqrt|exp|log|neg|abs|clamp|clamp_min|fill|zero|sum|mean|max|min)_?"
    r"(backward\d*)?(?![a-z])"
)

_STEP_PREFIX = "ProfilerStep#"
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_SKIP_CATS = frozenset({"trace", "gpu_user_annotation"})
_EPS_US = 1e-3  # timestamps are in microseconds with nanosecond decimals
_CHUNK_CHARS = 1 << 20


def categorize(name: str, cat: str = "") -> str:
    """Category key of an operation or kernel, from its name (and trace category for GPU copies)."""
    low = name.lower()
    if cat.lower() in ("gpu_memcpy", "gpu_memset"):
        return "memory_copy"
    for key, pattern in (
        ("communication", _COMM),
        ("data_loading", _DATA),
        ("random", _RANDOM),
        ("memory_copy", _COPY),
        ("matmul_attention", _MATMUL),
        ("elementwise_normalization", _ELEMENTWISE),
    ):
        if pattern.search(low):
            return key
    return "other"


# --------------------------------------------------------------------------------------------------
# Streaming reader
# --------------------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")


class TraceStream:
    """Streams the items of a Chrome trace's `traceEvents` array; other top-level keys land in `metadata`.

    Accepts the object form `{"traceEvents": [...], ...}` and the bare array form `[...]`, plain or gzip.
    `metadata` (e.g. `distributedInfo`) is complete once `events()` has been exhausted.
    """

    def __init__(self, path: str | Path, chunk_chars: int = _CHUNK_CHARS) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self._chunk = chunk_chars
        self._decoder = json.JSONDecoder(parse_constant=refuse_constant(f"trace {self.path}"))
        self._fh: IO[str] | None = None
        self._buf = ""
        self._pos = 0
        self._eof = False

    # -- low level ---------------------------------------------------------------------------------
    def _fail(self, what: str) -> InputError:
        return InputError(f"trace {self.path}: {what}")

    def _read(self, n: int) -> str:
        assert self._fh is not None
        try:
            return self._fh.read(n)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise self._fail(f"truncated or corrupt gzip data ({exc})") from None
        except UnicodeDecodeError:
            raise self._fail("not a text (JSON) file") from None

    def _fill(self) -> bool:
        """Append at least one chunk (more for a long pending value); False at end of file."""
        if self._eof:
            return False
        pending = len(self._buf) - self._pos
        if pending > MAX_EVENT_BYTES:
            raise self._fail(f"one JSON value is longer than {MAX_EVENT_BYTES >> 20} MiB: not a profiler event")
        chunk = self._read(max(self._chunk, pending))
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _peek(self) -> str | None:
        """Next non-whitespace character (not consumed), or None at end of file."""
        while True:
            blank = _WS.match(self._buf, self._pos)
            assert blank is not None  # [ \t\n\r]* matches the empty string too
            self._pos = blank.end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _expect(self, chars: str, where: str) -> str:
        c = self._peek()
        if c is None:
            raise self._fail(f"truncated: file ends {where}")
        if c not in chars:
            raise self._fail(f"invalid JSON {where}: expected {' or '.join(repr(x) for x in chars)}, got {c!r}")
        self._pos += 1
        return c

    def _value(self, where: str) -> Any:
        """Decode one JSON value at the cursor, reading more until it is complete."""
        if self._peek() is None:
            raise self._fail(f"truncated: file ends {where}")
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._fill():
                    continue
                if exc.msg.startswith("Unterminated") or exc.pos >= len(self._buf.rstrip()) - 1:
                    raise self._fail(f"truncated: file ends {where}") from None
                raise self._fail(f"invalid JSON {where} ({exc.msg})") from None
            except RecursionError:
                raise self._fail(f"a value nested too deep {where}") from None
            except InputError:
                raise
            except ValueError:  # Python refuses to read an integer of more than 4,300 digits
                raise self._fail(f"a number of thousands of digits {where}") from None
            # A number may continue in the next chunk: only trust a value that does not touch the end.
            if end >= len(self._buf) and self._fill():
                continue
            self._pos = end
            return value

    # -- structure ---------------------------------------------------------------------------------
    def _array_items(self) -> Iterator[Any]:
        """Items of the array whose '[' has just been consumed."""
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            yield self._value("inside traceEvents")
            if self._expect(",]", "inside traceEvents") == "]":
                return

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield each trace event (a dict) in file order."""
        check_readable(self.path, "trace")
        try:
            with self.path.open("rb") as raw:
                magic = raw.read(2)
        except OSError as exc:
            raise self._fail(f"cannot read ({exc.strerror})") from None
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(self.path, "rt", encoding="utf-8") as fh:
            self._fh = fh
            first = self._peek()
            if first is None:
                raise self._fail("empty file, not a Chrome trace")
            if first == "[":
                self._pos += 1
                yield from self._checked(self._array_items())
                return
            if first != "{":
                raise self._fail("not JSON: a Chrome trace starts with '{' or '['")
            self._pos += 1
            found = False
            if self._peek() == "}":
                self._pos += 1
            else:
                while True:
                    if self._peek() != '"':
                        raise self._fail("invalid JSON: expected a key string in the top-level object")
                    key = self._value("in the top-level object")
                    self._expect(":", "in the top-level object")
                    if key == "traceEvents":
                        self._expect("[", "after 'traceEvents' (it must be an array)")
                        found = True
                        yield from self._checked(self._array_items())
                    else:
                        self.metadata[key] = self._value("in the top-level object")
                    if self._expect(",}", "in the top-level object") == "}":
                        break
            if not found:
                raise self._fail("no 'traceEvents' array: not a Chrome trace from torch.profiler")

    def _checked(self, items: Iterator[Any]) -> Iterator[dict[str, Any]]:
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise self._fail(f"traceEvents item {i} is a {type(item).__name__}, not an event object")
            yield item


def iter_trace_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """Stream the events of a Chrome trace (plain or gzip JSON) without loading the file."""
    return TraceStream(path).events()


# --------------------------------------------------------------------------------------------------
# Per-trace summary
# --------------------------------------------------------------------------------------------------


@dataclass
class _Lane:
    """Compact storage of one thread's or stream's complete events."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    dur: array[float] = field(default_factory=lambda: array("d"))
    name: array[int] = field(default_factory=lambda: array("q"))

    def add(self, ts: float, dur: float, name_id: int) -> None:
        self.ts.append(ts)
        self.dur.append(dur)
        self.name.append(name_id)


@dataclass(frozen=True)
class TraceSummary:
    """What one trace contributes: self time per op, idle time, NCCL overlap, step time."""

    path: Path
    rank: int | None
    gpu: bool
    op_time_us: dict[str, float]
    op_category: dict[str, str]
    idle_us: float
    comm_kernel_us: float
    comm_hidden_us: float
    step_time_us: float
    steps: int
    step_source: str


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint sorted ones (vectorized)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, reach = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def _covered(intervals: tuple[np.ndarray, np.ndarray]) -> float:
    return float((intervals[1] - intervals[0]).sum())


def _intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two disjoint interval sets: |A| + |B| - |A u B|."""
    both = _union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return max(0.0, _covered(a) + _covered(b) - _covered(both))


def _self_times(lane: _Lane) -> np.ndarray:
    """Self time of each event of one thread: its duration minus the part covered by direct children."""
    ts = np.frombuffer(lane.ts, dtype=np.float64)
    dur = np.frombuffer(lane.dur, dtype=np.float64)
    order = np.lexsort((-dur, ts))  # by start, the longer (outer) event first
    ts_s = ts[order]
    end_s = ts_s + dur[order]
    self_s = array("d", dur[order].tobytes())  # compact, fast to index from Python
    stack: list[tuple[float, int]] = []
    chunk = 1 << 16
    for lo in range(0, len(ts_s), chunk):
        pairs = zip(ts_s[lo : lo + chunk].tolist(), end_s[lo : lo + chunk].tolist(), strict=True)
        for i, (t, end) in enumerate(pairs, lo):
            while stack and stack[-1][0] <= t + _EPS_US:
                stack.pop()
            if stack:
                parent_end, parent = stack[-1]
                self_s[parent] -= min(end, parent_end) - t
            stack.append((end, i))
    out = np.empty(len(ts_s))
    out[order] = np.frombuffer(self_s, dtype=np.float64)
    return np.maximum(out, 0.0)


def _rank_of(metadata: dict[str, Any]) -> int | None:
    info = metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if type(rank) is int else None


_MAX_TIME_US = 1e17  # timestamps are microseconds since an epoch (1.7e15 in 2024); durations are shorter


def _time_us(value: object, field: str, i: int, ev: dict[str, Any], stream: TraceStream) -> float:
    """A timestamp or duration of event `i`: a finite number of microseconds (a duration is >= 0)."""
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer past 1.8e308
        number = math.inf
    if not (math.isfinite(number) and abs(number) <= _MAX_TIME_US) or (field == "dur" and number < 0):
        what = "a duration >= 0" if field == "dur" else "a timestamp"
        name = str(ev.get("name", ""))[:40]
        raise stream._fail(f"event {i} ({name!r}): {field} is not {what} in us ({str(value)[:40]})")
    return number


def _lane_key(value: object, field: str, i: int, stream: TraceStream) -> object:
    """A pid, tid, device or stream: a number or a name (None when absent)."""
    if value is None or isinstance(value, int | str):
        return value
    raise stream._fail(f"event {i}: {field} must be a number or a string, got {type(value).__name__}")


def summarize_trace(path: str | Path) -> TraceSummary:
    """Stream one trace and reduce it to a `TraceSummary`; raises OptlayoutError on a bad trace."""
    stream = TraceStream(path)
    names: dict[str, int] = {}
    cpu: dict[tuple[Any, Any], _Lane] = {}
    gpu: dict[tuple[Any, Any], _Lane] = {}  # (device, stream)
    gpu_cat: dict[int, str] = {}
    cpu_steps: list[float] = []
    gpu_steps: list[float] = []
    t_min, t_max = float("inf"), float("-inf")
    n_complete = 0
    longest_us = 0.0
    for i, ev in enumerate(stream.events()):
        if ev.get("ph") != "X":
            continue
        ts, dur = _time_us(ev.get("ts"), "ts", i, ev, stream), _time_us(ev.get("dur", 0.0), "dur", i, ev, stream)
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        if name.startswith(_STEP_PREFIX):
            (gpu_steps if cat.startswith("gpu") else cpu_steps).append(dur)
        if cat in _SKIP_CATS:
            continue
        n_complete += 1
        longest_us = max(longest_us, dur)
        t_min, t_max = min(t_min, ts), max(t_max, ts + dur)
        name_id = names.setdefault(name, len(names))
        raw_args = ev.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        if cat in _GPU_CATS or (cat.endswith("kernel") and ("stream" in args or "device" in args)):
            key = (_lane_key(args.get("device", ev.get("pid")), "device", i, stream),
                   _lane_key(args.get("stream", ev.get("tid")), "stream", i, stream))  # fmt: skip
            gpu.setdefault(key, _Lane()).add(ts, dur, name_id)
            gpu_cat.setdefault(name_id, cat)
        else:
            key = (_lane_key(ev.get("pid"), "pid", i, stream), _lane_key(ev.get("tid"), "tid", i, stream))
            cpu.setdefault(key, _Lane()).add(ts, dur, name_id)
    if n_complete == 0:
        raise stream._fail("no complete ('X') events: the trace is empty")
    if longest_us <= 0:
        raise stream._fail(f"every complete ('X') event lasts 0 us ({n_complete} of them): the trace records no time")

    id_to_name = list(names)
    totals = np.zeros(len(names))
    idle_us = comm_us = hidden_us = 0.0
    is_gpu = any(len(lane.ts) for lane in gpu.values())
    if is_gpu:
        idle_us, comm_us, hidden_us = _gpu_lanes(gpu, id_to_name, gpu_cat, totals)
    else:
        idle_us = _cpu_lanes(cpu, id_to_name, totals)

    op_time = {id_to_name[i]: float(totals[i]) for i in np.flatnonzero(totals > 0).tolist()}
    op_time = {k: v for k, v in op_time.items() if not k.startswith(_STEP_PREFIX)}
    op_cat = {n: categorize(n, gpu_cat.get(names[n], "")) for n in op_time}
    steps = cpu_steps or gpu_steps
    if steps:
        step_us, n_steps, source = statistics.fmean(steps), len(steps), "ProfilerStep"
    else:
        step_us, n_steps, source = t_max - t_min, 0, "trace span"
    return TraceSummary(
        path=Path(path),
        rank=_rank_of(stream.metadata),
        gpu=is_gpu,
        op_time_us=op_time,
        op_category=op_cat,
        idle_us=idle_us,
        comm_kernel_us=comm_us,
        comm_hidden_us=hidden_us,
        step_time_us=step_us,
        steps=n_steps,
        step_source=source,
    )


def _cpu_lanes(cpu: dict[tuple[Any, Any], _Lane], id_to_name: list[str], totals: np.ndarray) -> float:
    """Add CPU self times into `totals`; return idle time (gaps in the step on the main thread)."""
    step_ids = {i for i, n in enumerate(id_to_name) if n.startswith(_STEP_PREFIX)}
    idle = 0.0
    busiest, busiest_us, has_steps = None, -1.0, False
    for key, lane in cpu.items():
        self_t = _self_times(lane)
        ids = np.frombuffer(lane.name, dtype=np.int64)
        totals += np.bincount(ids, weights=self_t, minlength=len(totals))
        if step_ids:
            is_step = np.isin(ids, list(step_ids))
            if is_step.any():
                has_steps = True
                idle += float(self_t[is_step].sum())  # step time not covered by any op
        busy = float(self_t.sum())
        if busy > busiest_us:
            busiest, busiest_us = key, busy
    if not has_steps and busiest is not None:
        # No step markers: idle = gaps between the main thread's ops within the trace span.
        lanes = list(cpu.values())
        starts = np.concatenate([np.frombuffer(lane.ts) for lane in lanes])
        ends = starts + np.concatenate([np.frombuffer(lane.dur) for lane in lanes])
        lane = cpu[busiest]
        ts = np.frombuffer(lane.ts)
        span = float(ends.max() - starts.min())
        idle = max(0.0, span - _covered(_union(ts, ts + np.frombuffer(lane.dur))))
    return idle


def _gpu_lanes(
    gpu: dict[tuple[Any, Any], _Lane], id_to_name: list[str], gpu_cat: dict[int, str], totals: np.ndarray
) -> tuple[float, float, float]:
    """Add kernel times into `totals`; return (idle, NCCL kernel time, NCCL time hidden under compute).

    Compute = GPU kernels that are neither collectives nor copies; idle = gaps between the first and the
    last GPU event of each device where nothing runs on any stream.
    """
    is_comm = np.array([bool(_COMM.search(n.lower())) for n in id_to_name], dtype=bool)
    is_copy = np.array(
        [categorize(n, gpu_cat.get(i, "")) == "memory_copy" for i, n in enumerate(id_to_name)], dtype=bool
    )
    idle = comm_total = hidden = 0.0
    devices = sorted({dev for dev, _ in gpu}, key=str)
    for dev in devices:
        lanes = {stream: lane for (d, stream), lane in gpu.items() if d == dev}
        all_start, all_end = [], []
        compute: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
        comm: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
        for stream, lane in lanes.items():
            ts, dur = np.frombuffer(lane.ts), np.frombuffer(lane.dur)
            ids = np.frombuffer(lane.name, dtype=np.int64)
            totals += np.bincount(ids, weights=dur, minlength=len(totals))
            all_start.append(ts)
            all_end.append(ts + dur)
            c = is_comm[ids]
            k = ~c & ~is_copy[ids]
            comm[stream] = (ts[c], ts[c] + dur[c])
            compute[stream] = (ts[k], ts[k] + dur[k])
        starts, ends = np.concatenate(all_start), np.concatenate(all_end)
        idle += max(0.0, float(ends.max() - starts.min()) - _covered(_union(starts, ends)))
        for stream, (cs, ce) in comm.items():
            if not len(cs):
                continue
            comm_union = _union(cs, ce)
            comm_total += _covered(comm_union)
            others = [compute[s] for s in compute if s != stream]
            if others:
                os_ = np.concatenate([o[0] for o in others])
                oe = np.concatenate([o[1] for o in others])
                hidden += _intersection(comm_union, _union(os_, oe))
    return idle, comm_total, hidden


# --------------------------------------------------------------------------------------------------
# Report over one or more traces
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpTime:
    """One operation's (or kernel's) summed self time and its share of the accounted time."""

    name: str
    self_time_us: float
    share: float
    category: str


@dataclass(frozen=True)
class Overlap:
    """Collective kernel time and the part of it that runs under compute kernels on other streams."""

    gpu: bool
    comm_time_us: float
    hidden_us: float

    @property
    def exposed_us(self) -> float:
        return self.comm_time_us - self.hidden_us

    @property
    def fraction(self) -> float | None:
        return self.hidden_us / self.comm_time_us if self.comm_time_us > 0 else None


@dataclass(frozen=True)
class RankTime:
    """A rank's mean step time and its slowdown against the median rank (0.10 = 10% slower)."""

    rank: int
    file: str
    step_time_us: float
    steps: int
    step_source: str
    slowdown_vs_median: float
    slowest: bool


@dataclass(frozen=True)
class ProfileReport:
    """Result of `analyze`: top ops, category shares, NCCL overlap, per-rank step times and a verdict."""

    top_ops: list[OpTime]
    categories: dict[str, float]  # category -> time in microseconds, every key of CATEGORIES
    total_us: float
    overlap: Overlap
    ranks: list[RankTime]
    verdict: list[str]

    def category_share(self, key: str) -> float:
        return self.categories[key] / self.total_us if self.total_us > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The `--json` payload: keys top_ops, categories, overlap, ranks, verdict."""
        return {
            "top_ops": [
                {"name": o.name, "self_time_us": round(o.self_time_us, 3), "share": round(o.share, 4)}
                for o in self.top_ops
            ],
            "categories": {
                k: {"time_us": round(v, 3), "share": round(self.category_share(k), 4)}
                for k, v in self.categories.items()
            },
            "overlap": {
                "gpu": self.overlap.gpu,
                "comm_time_us": round(self.overlap.comm_time_us, 3),
                "hidden_us": round(self.overlap.hidden_us, 3),
                "exposed_us": round(self.overlap.exposed_us, 3),
                "fraction": None if self.overlap.fraction is None else round(self.overlap.fraction, 4),
            },
            "ranks": [
                {
                    "rank": r.rank,
                    "file": r.file,
                    "step_time_us": round(r.step_time_us, 3),
                    "steps": r.steps,
                    "step_source": r.step_source,
                    "slowdown_vs_median": round(r.slowdown_vs_median, 4),
                    "slowest": r.slowest,
                }
                for r in self.ranks
            ],
            "verdict": list(self.verdict),
        }


def _ranks(summaries: Sequence[TraceSummary]) -> list[RankTime]:
    seen: dict[int, Path] = {}
    rows: list[tuple[int, TraceSummary]] = []
    for index, s in enumerate(summaries):
        rank = s.rank if s.rank is not None else index
        if rank in seen:
            raise InputError(f"rank {rank} appears twice: {seen[rank]} and {s.path} (give one trace per rank)")
        seen[rank] = s.path
        rows.append((rank, s))
    rows.sort(key=lambda r: r[0])
    median = statistics.median(s.step_time_us for _, s in rows)
    slowest = max(rows, key=lambda r: (r[1].step_time_us, -r[0]))[0]
    return [
        RankTime(
            rank=rank,
            file=str(s.path),
            step_time_us=s.step_time_us,
            steps=s.steps,
            step_source=s.step_source,
            slowdown_vs_median=s.step_time_us / median - 1.0 if median > 0 else 0.0,
            slowest=len(rows) > 1 and rank == slowest,
        )
        for rank, s in rows
    ]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _verdict(report: ProfileReport) -> list[str]:
    """Three one-line answers: do large matmuls dominate, is communication overlapped, are ranks equal."""
    mm = report.category_share("matmul_attention")
    top = report.top_ops[0] if report.top_ops else None
    top_text = f"; top op {top.name} ({_pct(top.share)}, {top.category})" if top is not None else ""
    if mm >= 0.5:
        first = f"Do large matmuls dominate? Yes: matrix multiplication and attention take {_pct(mm)} of the step"
    else:
        biggest = max((k for k in CATEGORIES if k not in ("idle", "matmul_attention")), key=report.category_share)
        first = (
            f"Do large matmuls dominate? No: matrix multiplication and attention take {_pct(mm)} of the step "
            f"(largest other category: {biggest} {_pct(report.category_share(biggest))})"
        )
    first += top_text + "."
    ov = report.overlap
    comm_share = report.category_share("communication")
    if ov.fraction is not None:
        answer = "Yes" if ov.fraction >= 0.8 else "Partly" if ov.fraction >= 0.3 else "No"
        second = (
            f"Is communication overlapped? {answer}: {_pct(ov.fraction)} of collective kernel time "
            f"({ov.comm_time_us / 1e3:.2f} ms) runs under compute kernels on other streams, "
            f"{ov.exposed_us / 1e3:.2f} ms exposed."
        )
    elif comm_share > 0:
        second = (
            f"Is communication overlapped? Unknown: communication takes {_pct(comm_share)} of the step, but overlap "
            "is measured only on GPU traces (collective kernels on their own stream)."
        )
    else:
        second = "Is communication overlapped? Nothing to overlap: no communication in the trace."
    if len(report.ranks) < 2:
        third = "Are ranks equally fast? One trace only: give one trace per rank to compare."
    else:
        slow = next(r for r in report.ranks if r.slowest)
        median_ms = slow.step_time_us / (1 + slow.slowdown_vs_median) / 1e3
        answer = "Yes" if slow.slowdown_vs_median < 0.05 else "No"
        third = (
            f"Are ranks equally fast? {answer}: slowest rank {slow.rank} takes {slow.step_time_us / 1e3:.2f} ms per "
            f"step, {_pct(slow.slowdown_vs_median)} over the median {median_ms:.2f} ms of {len(report.ranks)} ranks."
        )
    return [first, second, third]


@checked_arguments
def analyze(paths: Sequence[str | Path], top: int = 10) -> ProfileReport:
    """Analyze one trace, or several (one per rank: `distributedInfo.rank` if present, else file order)."""
    if not paths:
        raise InputError("profile: give at least one trace file")
    if not 1 <= top <= 10_000:
        raise InputError(f"top: must be 1 to 10,000 (got {top})")
    for p in paths:
        check_readable(p, "trace")
    summaries = [summarize_trace(p) for p in paths]
    op_time: dict[str, float] = {}
    op_cat: dict[str, str] = {}
    for s in summaries:
        for name, t in s.op_time_us.items():
            op_time[name] = op_time.get(name, 0.0) + t
        op_cat.update(s.op_category)
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for name, t in op_time.items():
        categories[op_cat[name]] += t
    categories["idle"] = sum(s.idle_us for s in summaries)
    total = sum(categories.values())
    ranked = sorted(op_time.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    top_ops = [OpTime(n, t, t / total if total > 0 else 0.0, op_cat[n]) for n, t in ranked]
    overlap = Overlap(
        gpu=any(s.gpu for s in summaries),
        comm_time_us=sum(s.comm_kernel_us for s in summaries),
        hidden_us=sum(s.comm_hidden_us for s in summaries),
    )
    report = ProfileReport(top_ops, categories, total, overlap, _ranks(summaries), [])
    return replace(report, verdict=_verdict(report))
