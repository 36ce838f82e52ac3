"""`optlayout profile`: torch.profiler traces from benchmarks/profile_example.py, synthetic GPU and
multi-rank traces with hand-computed answers, streaming of a large trace, and one-line errors."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from optlayout.errors import OptlayoutError
from optlayout.trace import TraceStream, analyze, categorize, summarize_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"
DROPOUT = TRACES / "cpu_dropout.json.gz"
NO_DROPOUT = TRACES / "cpu_nodropout.json.gz"
MATMUL_OR_ATTENTION = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul")


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: main() turns OptlayoutError into one line and exit status 2."""
    return subprocess.run(
        [sys.executable, "-m", "optlayout.cli", "profile", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def cli_json(*args: str | Path) -> dict[str, Any]:
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(name: str, ts: float, dur: float, stream: int, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream}}  # fmt: skip


# -- real traces (benchmarks/profile_example.py) --------------------------------------------------------


def test_dropout_trace_top_cost_is_mask_generation() -> None:
    out = cli_json(DROPOUT, "--top", "5")
    assert set(out) == {"top_ops", "categories", "overlap", "ranks", "verdict"}
    top = out["top_ops"][0]
    assert set(top) == {"name", "self_time_us", "share"}
    assert top["name"] in ("aten::bernoulli_", "aten::dropout", "aten::native_dropout")
    assert out["categories"]["random"]["share"] > 0.15
    assert "No" in out["verdict"][0] and "aten::bernoulli_" in out["verdict"][0]
    assert out["ranks"][0]["step_source"] == "ProfilerStep"


def test_dropout_free_trace_top_cost_is_matmul_or_attention() -> None:
    out = cli_json(NO_DROPOUT)
    top = out["top_ops"][0]["name"]
    assert top in MATMUL_OR_ATTENTION or "attention" in top
    assert "aten::bernoulli_" not in [o["name"] for o in out["top_ops"]]
    assert out["categories"]["matmul_attention"]["share"] > out["categories"]["random"]["share"]
    assert out["overlap"]["fraction"] is None
    shares = [c["share"] for c in out["categories"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)


def test_dropout_step_is_slower_than_dropout_free() -> None:
    with_dropout = analyze([DROPOUT]).ranks[0].step_time_us
    without = analyze([NO_DROPOUT]).ranks[0].step_time_us
    assert without < with_dropout


def test_terminal_output_has_tables_and_verdict() -> None:
    proc = run_cli(DROPOUT, "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "aten::bernoulli_" in proc.stdout
    assert "Do large matmuls dominate?" in proc.stdout
    assert "Are ranks equally fast?" in proc.stdout


# -- self time on the event tree ---------------------------------------------------------------------------


def test_self_time_subtracts_direct_children_and_step_gaps_are_idle(tmp_path: Path) -> None:
    events = [
        x("ProfilerStep#1", 0, 120, cat="user_annotation"),
        x("aten::linear", 0, 100),
        x("aten::t", 10, 20),
        x("aten::addmm", 40, 50),
        x("aten::copy_", 50, 10),  # grandchild of linear: only addmm loses it
        x("aten::relu", 105, 5),
        {"ph": "i", "name": "instant", "pid": 1, "tid": 1, "ts": 3},
    ]
    s = summarize_trace(write_trace(tmp_path / "t.json", events))
    assert s.op_time_us == pytest.approx(
        {"aten::linear": 30, "aten::t": 20, "aten::addmm": 40, "aten::copy_": 10, "aten::relu": 5}
    )
    assert s.idle_us == pytest.approx(15)  # 120 - 100 - 5
    assert (s.step_time_us, s.steps, s.step_source) == (120, 1, "ProfilerStep")
    report = analyze([tmp_path / "t.json"])
    assert report.total_us == pytest.approx(120)
    assert report.top_ops[0].name == "aten::addmm"
    assert report.top_ops[0].share == pytest.approx(40 / 120)
    assert report.categories["idle"] == pytest.approx(15)


def test_without_step_markers_step_is_trace_span(tmp_path: Path) -> None:
    events = [x("aten::mm", 10, 30), x("aten::add", 60, 20), x("aten::mul", 65, 5, tid=2)]
    s = summarize_trace(write_trace(tmp_path / "t.json", events))
    assert (s.step_time_us, s.step_source) == (70, "trace span")
    assert s.idle_us == pytest.approx(20)  # the gap 40..60 on the busiest thread


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("aten::bernoulli_", "random"),
        ("aten::native_dropout", "random"),
        ("aten::mm", "matmul_attention"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "matmul_attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "matmul_attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul_attention"),
        ("aten::native_layer_norm", "elementwise_normalization"),
        ("aten::add_", "elementwise_normalization"),
        ("void at::native::vectorized_elementwise_kernel<4>", "elementwise_normalization"),
        ("aten::copy_", "memory_copy"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
        ("c10d::allreduce_", "communication"),
        ("aten::broadcast_tensors", "other"),
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "data_loading"),
        ("aten::view", "other"),
    ],
)
def test_categories(name: str, category: str) -> None:
    assert categorize(name) == category


# -- GPU overlap -----------------------------------------------------------------------------------------


def test_gpu_nccl_overlap_fraction_by_hand(tmp_path: Path) -> None:
    gemm, nccl = "sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    events = [
        x("aten::mm", 0, 5),  # CPU side: ignored for the op ranking of a GPU trace
        x("cudaLaunchKernel", 1, 2, cat="cuda_runtime"),
        kernel(gemm, 0, 100, stream=7),
        kernel(gemm, 150, 100, stream=7),
        kernel("vectorized_elementwise_kernel", 110, 20, stream=20),
        kernel(nccl, 50, 150, stream=13),  # hidden: 50..100, 110..130, 150..200 = 120 of 150
        kernel("layer_norm_kernel", 300, 20, stream=13),  # compute on the NCCL stream: does not hide it
        kernel(nccl, 320, 80, stream=13),  # only a copy runs beside it: exposed
        kernel("Memcpy DtoD", 360, 20, stream=20, cat="gpu_memcpy"),
    ]
    out = cli_json(write_trace(tmp_path / "gpu.json", events))
    ov = out["overlap"]
    assert ov["gpu"] is True
    assert ov["comm_time_us"] == pytest.approx(230)
    assert ov["hidden_us"] == pytest.approx(120)
    assert ov["exposed_us"] == pytest.approx(110)
    assert ov["fraction"] == pytest.approx(round(120 / 230, 4))
    assert out["top_ops"][0] == {"name": nccl, "self_time_us": 230.0, "share": pytest.approx(230 / 540, abs=1e-4)}
    assert out["top_ops"][1]["name"] == gemm
    assert "aten::mm" not in [o["name"] for o in out["top_ops"]]
    # kernel time 490 + device idle (250..300) 50 = 540
    assert out["categories"]["idle"]["time_us"] == pytest.approx(50)
    assert out["categories"]["communication"]["share"] == pytest.approx(230 / 540, abs=1e-4)
    assert out["categories"]["memory_copy"]["time_us"] == pytest.approx(20)
    assert out["verdict"][1].startswith("Is communication overlapped? Partly: 52%")


# -- ranks ------------------------------------------------------------------------------------------------


def rank_trace(path: Path, step_us: float, rank: int | None, steps: int = 2) -> Path:
    events = []
    for i in range(steps):
        t0 = i * (step_us + 10)
        events += [x(f"ProfilerStep#{i}", t0, step_us, cat="user_annotation"), x("aten::mm", t0 + 1, step_us / 2)]
    top = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4}} if rank is not None else {}
    return write_trace(path, events, **top)


def test_slowest_rank_from_distributed_info(tmp_path: Path) -> None:
    # files given out of rank order; distributedInfo decides
    files = [
        rank_trace(tmp_path / "a.json", 130_000, rank=2),
        rank_trace(tmp_path / "b.json", 100_000, rank=0),
        rank_trace(tmp_path / "c.json", 101_000, rank=3),
        rank_trace(tmp_path / "d.json", 102_000, rank=1),
    ]
    out = cli_json(*files)
    assert [r["rank"] for r in out["ranks"]] == [0, 1, 2, 3]
    slow = [r for r in out["ranks"] if r["slowest"]]
    assert len(slow) == 1 and slow[0]["rank"] == 2 and slow[0]["file"].endswith("a.json")
    assert slow[0]["slowdown_vs_median"] == pytest.approx(round(130_000 / 101_500 - 1, 4))
    assert out["ranks"][0]["steps"] == 2
    assert out["verdict"][2].startswith("Are ranks equally fast? No: slowest rank 2 takes 130.00 ms")


def test_ranks_from_file_order_and_equal_speed(tmp_path: Path) -> None:
    files = [rank_trace(tmp_path / f"r{i}.json", 100_000 + 500 * i, rank=None) for i in range(3)]
    report = analyze(files)
    assert [(r.rank, Path(r.file).name) for r in report.ranks] == [(0, "r0.json"), (1, "r1.json"), (2, "r2.json")]
    assert next(r for r in report.ranks if r.slowest).rank == 2
    assert report.verdict[2].startswith("Are ranks equally fast? Yes")


def test_same_rank_twice_is_an_error(tmp_path: Path) -> None:
    a = rank_trace(tmp_path / "a.json", 100, rank=1)
    b = rank_trace(tmp_path / "b.json", 100, rank=1)
    with pytest.raises(OptlayoutError, match="rank 1 appears twice"):
        analyze([a, b])


# -- streaming ---------------------------------------------------------------------------------------------


def big_trace(path: Path, n_steps: int) -> tuple[int, float]:
    """Write a multi-MB trace step by step; return (events, expected bernoulli_ self time)."""
    names = ["aten::linear", "aten::addmm", "aten::bernoulli_", "aten::add", "aten::native_layer_norm"]
    with path.open("w") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [\n')
        n = 0
        for step in range(n_steps):
            t = step * 1000.0
            batch = [x(f"ProfilerStep#{step}", t, 990.0, cat="user_annotation", **{"External id": n})]
            for j in range(24):
                t0 = t + 1 + j * 40
                batch.append(x(names[0], t0, 30.0, **{"External id": n + j, "Sequence number": j}))
                batch.append(x(names[1], t0 + 5, 20.0, **{"External id": n + j, "Sequence number": j}))
                batch.append(x(names[j % 3 + 2], t0 + 31, 4.0, **{"External id": n + j}))
            n += len(batch)
            f.write(",\n".join(json.dumps(e) for e in batch) + ("\n" if step == n_steps - 1 else ",\n"))
        # metadata after the events, as some exporters write it
        f.write('], "distributedInfo": {"rank": 5, "world_size": 8}, "traceName": "big"}\n')
    return n, n_steps * 8 * 4.0


def test_large_trace_streams_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    n_events, bernoulli_us = big_trace(path, n_steps=2500)
    size = path.stat().st_size
    assert size > 20e6 and n_events > 150_000
    code = textwrap.dedent(
        f"""
        import json, resource, sys
        from optlayout.trace import analyze
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = analyze([{str(path)!r}], top=5)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ops = {{o.name: o.self_time_us for o in r.top_ops}}
        print(json.dumps({{"grown_kb": after - before, "ops": ops, "rank": r.ranks[0].rank,
                           "steps": r.ranks[0].steps, "idle": r.categories["idle"]}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rank"] == 5 and out["steps"] == 2500
    assert out["ops"]["aten::bernoulli_"] == pytest.approx(bernoulli_us)
    assert out["ops"]["aten::addmm"] == pytest.approx(2500 * 24 * 20.0)
    assert out["ops"]["aten::linear"] == pytest.approx(2500 * 24 * 10.0)
    assert out["idle"] == pytest.approx(2500 * (990 - 24 * 34.0))
    # json.load of this file grows the process by about 5.6 times its size; the stream keeps compact arrays.
    assert out["grown_kb"] * 1024 < size, out["grown_kb"]


def test_stream_chunk_boundaries_match_json_load(tmp_path: Path) -> None:
    events = [x(f"op\u00e9{i}", i * 1.5, 1.0 + i % 7, n=i, s='a\\"b,]}' * (i % 3)) for i in range(400)]
    path = write_trace(tmp_path / "t.json", events, baseTimeNanoseconds=1790857026000000000)
    for chunk in (1, 7, 64, 4096):
        stream = TraceStream(path, chunk_chars=chunk)
        assert list(stream.events()) == events
        assert stream.metadata == {"schemaVersion": 1, "baseTimeNanoseconds": 1790857026000000000}


def test_bare_array_and_gzip_by_content(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"  # gzip data despite the name
    path.write_bytes(gzip.compress(json.dumps([x("aten::mm", 0, 10)]).encode()))
    assert summarize_trace(path).op_time_us == {"aten::mm": 10}


# -- bad input: one line on stderr, exit status 2 -----------------------------------------------------------


def bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    raw = DROPOUT.read_bytes()
    text = gzip.decompress(raw)
    cases = {
        "text file": ("notes.txt", b"step time was 80 ms\n", "not JSON"),
        "random JSON": ("config.json", b'{"model": "llama", "layers": [1, 2, 3]}', "no 'traceEvents'"),
        "JSON array of numbers": ("list.json", b"[1, 2, 3]", "not an event object"),
        "cut gzip": ("cut.json.gz", raw[: len(raw) // 2], "truncated"),
        "cut JSON": ("cut.json", text[: len(text) // 2], "truncated"),
        "empty trace": ("empty.json", b'{"traceEvents": []}', "no complete ('X') events"),
        "only metadata events": ("meta.json", b'{"traceEvents": [{"ph": "M", "name": "process_name"}]}', "empty"),
        "only 0-us events": ("zero_us.json", b'{"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 0, "dur": 0, '
                             b'"pid": 1, "tid": 1, "cat": "cpu_op"}, {"name": "aten::add", "ph": "X", "ts": 5, '
                             b'"pid": 1, "tid": 1}]}', "every complete ('X') event lasts 0 us (2 of them)"),
        "empty file": ("zero.json", b"", "empty file"),
        "binary": ("bin.json", bytes(range(256)) * 4, "not"),
    }
    out = {}
    for key, (name, data, msg) in cases.items():
        (tmp / name).write_bytes(data)
        out[key] = (tmp / name, msg)
    return out


@pytest.mark.parametrize(
    "case",
    [
        "text file",
        "random JSON",
        "JSON array of numbers",
        "cut gzip",
        "cut JSON",
        "empty trace",
        "only metadata events",
        "only 0-us events",
        "empty file",
        "binary",
    ],
)
def test_bad_input_one_line_exit_2(tmp_path: Path, case: str) -> None:
    path, message = bad_inputs(tmp_path)[case]
    proc = run_cli(path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: trace {path}:")
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_file_and_bad_top(tmp_path: Path) -> None:
    proc = run_cli(tmp_path / "nope.json")
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: trace: no such file {str(tmp_path / 'nope.json')!r}"
    proc = run_cli(DROPOUT, "--top", "0")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: top: must be 1 to 10,000 (got 0)"
