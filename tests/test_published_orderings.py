"""Orderings published work measured, reproduced by the cost model with the shipped calibration profile.

Each compares the layouts the work measured (not the solver's own pick), with the shipped calibration profile:
the ordering between named layouts is the thing a layout optimizer must get right. The NeMo/Paxml pair is among
the calibration runs (in sample); the recomputation comparison is not.
"""

from __future__ import annotations

from pathlib import Path

from optlayout.layout import parse_layout
from optlayout.planning import estimate_layout
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.runs.predict import predict_run
from optlayout.runs.records import read_runs
from optlayout.specs import JobSpec

PROFILE = load_calibration(shipped_calibration_path())
A100 = PROFILE.params_for("a100-80gb", "bf16")

FIXTURES = Path(__file__).parent / "fixtures" / "runs"  # ten runs copied from ../shared/data/calibration_runs.jsonl


def test_the_measured_nemo_layout_beats_the_measured_paxml_fsdp_layout_at_every_scale() -> None:
    """NVIDIA dgxc-benchmarking v24.11.1 measured GPT-3 175B (FP8, H100, seq 2048, global batch 2 x GPUs) twice
    at each of 128-2,048 GPUs: NeMo with tp=4,pp=8,vp=12 and Paxml with FSDP over all GPUs, NeMo faster by 17-28%
    (691.89 against 548.33 tokens/s/GPU at 128). Predicting the measured layouts themselves (not the solver's
    pick), the ordering comes out right at every scale. The margin does not: predicted 1.31x at 128 GPUs against
    1.26x measured, 1.75x at 2,048 against 1.29x (FSDP at scale is over-charged; benchmarks/RESULTS.md)."""
    runs = read_runs(FIXTURES / "gpt3_175b_nemo_vs_paxml.jsonl")
    by_gpus: dict[int, dict[str, tuple[float, float]]] = {}
    for run in runs:
        predicted = predict_run(run, PROFILE.params_for(run.cluster.gpu, run.job.precision))
        stack = run.framework or ""
        by_gpus.setdefault(run.cluster.gpus, {})[stack] = (run.measured.tokens_per_s_per_gpu,
                                                           predicted.prediction.tokens_per_s_per_gpu)  # fmt: skip
    assert sorted(by_gpus) == [128, 256, 512, 1024, 2048]
    for pair in by_gpus.values():
        (nemo_measured, nemo_predicted), (paxml_measured, paxml_predicted) = pair["nemo"], pair["paxml"]
        assert nemo_measured > paxml_measured and nemo_predicted > paxml_predicted


def test_selective_recompute_beats_full_when_memory_allows() -> None:
    # Korthikanti et al. 2022 Table 4: selective recomputation costs ~2-4% against full's ~30-40%.
    job = JobSpec(seq_len=2048, global_batch=256)
    cluster = "gpu=a100-80gb,gpus=64,gpus_per_node=8,inter_node_gbps_per_gpu=200"
    base = "tp=8,pp=2,dp=4,mb=1,ga=64,sharding=zero1,sp"
    selective = estimate_layout("megatron-gpt-18.4b", cluster, job, parse_layout(base + ",recompute=selective"), A100)
    full = estimate_layout("megatron-gpt-18.4b", cluster, job, parse_layout(base + ",recompute=full"), A100)
    assert selective.fits and full.fits
    assert selective.tokens_per_s_per_gpu > full.tokens_per_s_per_gpu
    # full recompute adds about one forward pass: HFU/MFU near 4/3, minus the attention term
    assert 1.25 < full.hfu / full.mfu < 1.34
