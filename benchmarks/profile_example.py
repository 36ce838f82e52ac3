"""Profile one CPU training step of a ~1M-parameter transformer, with and without dropout.

Builds an embedding + 4 `torch.nn.TransformerEncoderLayer` (d_model 128, nhead 4, dim_feedforward 512)
+ output head (1.05M parameters), trains it with AdamW on random tokens (batch 4 x 128 tokens), and for
dropout 0.1 (the layer's default) and 0.0:

- times unprofiled steps after warm-up (the two models alternate; min and median of N steps each);
- profiles one step (after warm-up) with torch.profiler, five times, and keeps the trace of the fastest
  profiled step as a gzip Chrome trace (the machine may be shared: the minimum is the least disturbed);
- reads the trace back with `optlayout.trace.analyze` and prints a table.

Usage: python benchmarks/profile_example.py [--out-dir tests/fixtures/traces] [--threads 2] [--steps 30] [--tries 5]
Requires torch (`pip install -e .[torch]`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optlayout.trace import analyze  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, FFN = 1000, 128, 4, 4, 512
BATCH, SEQ = 4, 128
TRACE_NAMES = {0.1: "cpu_dropout.json.gz", 0.0: "cpu_nodropout.json.gz"}


def build_model(dropout: float) -> nn.Module:
    """Embedding, LAYERS encoder layers (batch first) and a vocabulary head."""
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=dropout, batch_first=True) for _ in range(LAYERS)]
    return nn.Sequential(nn.Embedding(VOCAB, D_MODEL), *layers, nn.Linear(D_MODEL, VOCAB))


def make_step(model: nn.Module) -> Callable[[], None]:
    """One training step on a fixed random batch: forward, cross-entropy, backward, AdamW."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()

    return step


def profile_step(step: Callable[[], None], path: Path) -> None:
    """Profile the third of three steps (one skipped, one profiler warm-up) into a gzip Chrome trace."""
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(3):
            step()
            prof.step()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "fixtures" / "traces")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--tries", type=int, default=5, help="profiled steps per model; the fastest is kept")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    models = {dp: build_model(dp) for dp in TRACE_NAMES}
    steps = {dp: make_step(m) for dp, m in models.items()}
    n_params = sum(p.numel() for p in models[0.1].parameters())
    for step in steps.values():  # warm-up
        for _ in range(5):
            step()
    times: dict[float, list[float]] = {dp: [] for dp in steps}
    for _ in range(args.steps):  # alternate so that machine noise hits both alike
        for dp, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[dp].append(time.perf_counter() - t0)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    best = dict.fromkeys(steps, float("inf"))
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.tries):  # alternate here too, keep each model's fastest profiled step
            for dp, step in steps.items():
                candidate = Path(tmp) / f"{dp}-{i}.json.gz"
                profile_step(step, candidate)
                step_us = analyze([candidate]).ranks[0].step_time_us
                if step_us < best[dp]:
                    best[dp] = step_us
                    shutil.copyfile(candidate, args.out_dir / TRACE_NAMES[dp])
    rows = []
    for dp in steps:
        path = args.out_dir / TRACE_NAMES[dp]
        report = analyze([path], top=3)
        ops = {o.name: o for o in analyze([path], top=1000).top_ops}
        bern = ops["aten::bernoulli_"].share if "aten::bernoulli_" in ops else 0.0
        rows.append(
            (
                f"dropout={dp}",
                min(times[dp]) * 1e3,
                statistics.median(times[dp]) * 1e3,
                report.ranks[0].step_time_us / 1e3,
                bern,
                report.category_share("matmul_attention"),
                ", ".join(f"{o.name} {o.share:.0%}" for o in report.top_ops),
                path.stat().st_size,
            )
        )

    print(
        f"model: {n_params / 1e6:.2f}M parameters ({LAYERS} x TransformerEncoderLayer d_model {D_MODEL}, nhead "
        f"{HEADS}, ffn {FFN}), batch {BATCH} x {SEQ} tokens, torch {torch.__version__}, {args.threads} threads, "
        f"{args.steps} unprofiled steps (min, median), profiled = fastest of {args.tries}"
    )
    header = (
        "config",
        "step ms min",
        "median",
        "profiled step ms",
        "bernoulli_",
        "matmul+attn",
        "top 3 ops (self time)",
        "trace",
    )
    print(" | ".join(header))
    for name, step_ms, median_ms, prof_ms, bern, mm, top, size in rows:
        cells = (name, f"{step_ms:.1f}", f"{median_ms:.1f}", f"{prof_ms:.1f}", f"{bern:.0%}", f"{mm:.0%}", top)
        print(" | ".join(cells) + f" | {size / 1e3:.0f} KB")
    for label, col in (("unprofiled min", 1), ("unprofiled median", 2), ("profiled", 3)):
        faster = 1 - rows[1][col] / rows[0][col]
        print(f"dropout off, {label}: step {faster:.0%} faster ({rows[0][col]:.1f} -> {rows[1][col]:.1f} ms)")


if __name__ == "__main__":
    main()
