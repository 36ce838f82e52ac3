"""The hand-checkable figures of DESIGN.md through the real CLI, and its bad-input behaviour."""

from __future__ import annotations

import json

import pytest


def test_mfu_7b_at_10k_tokens(cli) -> None:
    # 6 x 7e9 x 10,000 = 420 TFLOP/s; / 989.4 (H100 SXM dense BF16) = 0.4245
    out = cli("mfu", "--params", "7e9", "--tokens-per-s", "10000", "--gpu", "h100-sxm", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["mfu"] == pytest.approx(0.424, abs=0.001)
    assert data["achieved_tflops_per_gpu"] == pytest.approx(420.0)


def test_memory_70b_worked_example(cli) -> None:
    # 70e9 x 16 B = 1120 GB; tp8 x pp4 = 32 GPUs share it: 35 GB/GPU; dp = 256/32 = 8
    args = ["memory", "--params", "70e9", "--gpus", "256", "--gpus-per-node", "8", "--gpu-memory-gb", "80",
            "--tp", "8", "--pp", "4", "--json"]  # fmt: skip
    data = json.loads(cli(*args, "--sharding", "none").stdout)
    assert data["state_total_gb"] == pytest.approx(1120)
    assert data["state_per_gpu_gb"] == pytest.approx(35)
    assert data["dp"] == 8
    assert data["activations_per_gpu_bytes"] is None and data["fits"] is True
    # ZeRO-1: 4 B/param unsharded (8.75 GB) + 12 B/param over 8 (3.28 GB) = 12.03 GB
    zero1 = json.loads(cli(*args, "--sharding", "zero1").stdout)
    assert zero1["state_per_gpu_gb"] == pytest.approx(12.03, abs=0.01)


def test_memory_with_model_shape_adds_activations(cli) -> None:
    out = cli("memory", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--seq-len", "4096", "--sp",
              "--gpu", "h100-sxm", "--json")  # fmt: skip
    data = json.loads(out.stdout)
    assert data["activations_per_gpu_bytes"] > 0 and data["dp"] == 4


def test_memory_refuses_what_it_would_ignore_and_states_what_it_assumes(cli) -> None:
    # without a model shape and --seq-len there are no activations: the flags that shape only them do nothing
    base = ["memory", "--params", "70e9", "--gpus", "256", "--tp", "8", "--pp", "4", "--gpu", "h100-sxm"]
    out = cli(*base, "--micro-batch", "64", "--sp", "--recompute", "full")
    assert out.returncode == 2  # before: rc 0, the state-only figure
    assert out.stderr.strip() == (
        "error: micro-batch: --micro-batch, --sp, --recompute change only the activations, which need a model "
        "shape and a sequence; give --model with --seq-len, or drop --micro-batch, --sp, --recompute"
    )
    out = cli("memory", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--recompute", "full")  # no --seq-len
    assert out.returncode == 2 and "error: recompute: --recompute changes only the activations" in out.stderr
    # --gpu and --gpu-memory-gb both set the capacity (before: --gpu-memory-gb won silently)
    out = cli(*base, "--gpu-memory-gb", "40", "--json")
    assert out.returncode == 2 and "give --gpu or --gpu-memory-gb, not both" in out.stderr
    # no --gpus or --dp: dp = 1, said in --json and the table
    args = ["memory", "--params", "70e9", "--tp", "8", "--pp", "4", "--gpu-memory-gb", "80", "--sharding", "zero1"]
    data = json.loads(cli(*args, "--json").stdout)
    assert data["dp"] == 1 and data["assumed"] == {"dp": {"value": 1, "why": "neither --gpus nor --dp given"}}
    assert "assumed dp=1 (neither --gpus nor --dp given)" in cli(*args).stdout
    assert json.loads(cli(*args, "--dp", "8", "--json").stdout)["assumed"] == {}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["mfu", "--params", "-7e9", "--tokens-per-s", "1"], "params"),
        (["mfu", "--params", "7e9", "--tokens-per-s", "1", "--gpu", "h1000"], "h100-sxm"),
        (["memory", "--params", "70e9", "--gpus", "100", "--tp", "8"], "gpus"),
        (["memory", "--params", "70e9", "--tp", "0"], "tp"),
        (["memory", "--model", "nope", "--gpus", "8"], "unknown preset"),
        (["memory", "--params", "70e9", "--sharding", "zero9"], "sharding"),
        # 6 x 7e9 x 1e6 = 42,000 TFLOP/s, 42x the H100's 989.4: a cluster's tokens/s given per GPU
        (["mfu", "--params", "7e9", "--tokens-per-s", "1000000"], "42,000.0 TFLOP/s (6N), over the h100-sxm's bf16"),
    ],
)
def test_bad_input_one_line_exit_2(cli, args: list[str], needle: str) -> None:
    out = cli(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
