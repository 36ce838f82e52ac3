"""Prediction error of tokens/s/GPU on the published runs, per source, GPU and precision; the mixture-of-experts
runs apart, cross-validated leaving one model out, with where the published Megatron-Bridge layouts rank.

Reproduce:  python benchmarks/accuracy.py [RUNS.jsonl] [--calibration calibration.yaml] [--write]
            python benchmarks/accuracy.py --moe [MOE_RUNS.jsonl] [--write]
`--write` replaces the accuracy (or accuracy-moe) section of benchmarks/RESULTS.md with the tables printed.
Runs whose layout has unpublished fields are filled by the solver with the published fields pinned
(`optlayout.runs.predict`); the table counts how many runs needed filling.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from _results import publish

from optlayout.cost import DEFAULT_PARAMS
from optlayout.runs.predict import RunPrediction, predict_run
from optlayout.runs.records import RunRecord, read_runs

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE.parent.parent / "shared" / "data" / "calibration_runs.jsonl"
DEFAULT_MOE_RUNS = HERE.parent.parent / "shared" / "data" / "calibration_runs_moe.jsonl"


def _short_source(source: str) -> str:
    for key, label in (("dgxc", "NVIDIA dgxc-benchmarking"), ("Megatron-Bridge", "Megatron-Bridge tables"),
                       ("NeMo", "NeMo performance tables"), ("llm-foundry", "MosaicML llm-foundry")):  # fmt: skip
        if key in source:
            return label
    return source[:40]


def _table(title: str, groups: dict[str, list[RunPrediction]]) -> list[str]:
    lines = [f"| {title} | runs | filled | MAPE | median APE | mean signed error |", "|---|---:|---:|---:|---:|---:|"]
    for key in sorted(groups):
        preds = groups[key]
        apes = [p.ape for p in preds]
        signed = [p.prediction.tokens_per_s_per_gpu / p.record.measured.tokens_per_s_per_gpu - 1 for p in preds]
        filled = sum(bool(p.filled_fields) for p in preds)
        lines.append(
            f"| {key} | {len(preds)} | {filled} | {statistics.mean(apes):.1%} | {statistics.median(apes):.1%} "
            f"| {statistics.mean(signed):+.1%} |"
        )
    return lines


def _cross_validation(records: list) -> list[str]:
    """Calibrated error, out of sample first: fit on the other sources (or GPUs), predict the held-out one."""
    from optlayout.runs.calibrate import calibrate

    t0 = time.perf_counter()
    rep = calibrate(records, fitted_on="benchmark").report
    keys = ("cross_validated_by_source", "cross_validated_by_gpu", "in_sample", "uncalibrated")
    out = [
        f"Calibrated (`optlayout calibrate`, four constants per GPU/precision, {time.perf_counter() - t0:.0f} s): "
        "MAPE of tokens/s/GPU and, in brackets, the median signed error (predicted / measured - 1; positive: "
        "optimistic), cross-validated leaving one source out and leaving one GPU out (its runs then get the "
        "constants fitted on the other GPUs), against in-sample and uncalibrated.",
        "",
        "| runs | leave source out | leave GPU out | in-sample | uncalibrated |",
        "|---|---:|---:|---:|---:|",
        "| all | " + " | ".join(f"{rep[k]['mape']:.1%} ({rep[k]['median_signed_error']:+.1%})" for k in keys) + " |",
    ]
    for name, field in (("per_source", rep["sources"]), ("per_gpu_precision", rep["in_sample"]["per_gpu_precision"])):
        for key in sorted(field):
            cells = (f"{rep[k][name][key]:.1%} ({rep[k][name + '_median_signed_error'][key]:+.1%})" for k in keys)
            out.append(f"| {key} | " + " | ".join(cells) + " |")
    return out


def _moe_table(title: str, groups: dict[str, list[float]], signed: dict[str, list[float]]) -> list[str]:
    lines = [f"| {title} | runs | MAPE | median APE | mean signed error |", "|---|---:|---:|---:|---:|"]
    for key in sorted(groups):
        apes = groups[key]
        lines.append(f"| {key} | {len(apes)} | {statistics.mean(apes):.1%} | {statistics.median(apes):.1%} "
                     f"| {statistics.mean(signed[key]):+.1%} |")  # fmt: skip
    return lines


def _published_fields(record: RunRecord) -> dict[str, object]:
    return {k: v for k, v in record.layout.known().items() if k not in ("sharding", "recompute")}


def _same_setup_floor(records: list[RunRecord]) -> tuple[float, int]:
    """The least MAPE any prediction from model, cluster, job and published layout alone can reach: runs sharing
    all of them (other releases of the same recipe) get one value each, the one minimizing their APE (the
    median of the measured tokens/s weighted by 1/measured). Returns that MAPE and the number of such setups."""
    setups: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for rec in records:
        setups[(rec.group_key, tuple(sorted(rec.layout.known().items())))].append(rec.measured.tokens_per_s_per_gpu)
    apes = []
    for measured in setups.values():
        ranked = sorted(measured)
        weights = [1 / m for m in ranked]
        acc, best = 0.0, ranked[-1]
        for m, w in zip(ranked, weights, strict=True):
            acc += w
            if acc >= sum(weights) / 2:
                best = m
                break
        apes += [abs(best - m) / m for m in measured]
    return statistics.mean(apes), len(setups)


def _unexplained(preds: list[RunPrediction]) -> tuple[list[str], dict[tuple[object, ...], float]]:
    """Per setup (model, system, job, layout used), the measured time the model does not account for, per token and
    layer on one GPU: (1 / measured - 1 / predicted tokens/s/GPU) / layers, the median over the setup's runs (its
    releases). A cost linear in tokens shows as the same figure at any micro-batch and sequence length; attention's
    grows with the sequence; a fixed cost per kernel or per micro-batch shrinks as the micro-batch's tokens grow.
    Also the medians (s) by (model, GPU, precision, sequence, tokens per micro-batch and GPU, ep)."""
    setups: dict[tuple[object, ...], list[RunPrediction]] = defaultdict(list)
    for p in preds:
        rec = p.record
        if rec.model.name.startswith("Grok"):
            continue
        setups[(rec.model.name, rec.cluster.gpu, rec.cluster.gpus, rec.job.precision, rec.job.seq_len,
                p.layout.short())].append(p)  # fmt: skip
    lines = [
        "| model, GPU, precision | GPUs | seq | layout used | tokens per micro-batch and GPU | runs "
        "| unexplained us per token and layer | share of the measured step |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    figures: dict[tuple[object, ...], float] = {}
    for (name, gpu, gpus, precision, seq, short), group in sorted(setups.items()):
        lay = group[0].layout
        layers = group[0].record.model.layers
        gaps = [(1 / p.record.measured.tokens_per_s_per_gpu - 1 / p.prediction.tokens_per_s_per_gpu) / layers
                for p in group]  # fmt: skip
        shares = [g * layers * p.record.measured.tokens_per_s_per_gpu for g, p in zip(gaps, group, strict=True)]
        tokens = seq * lay.micro_batch / (lay.cp * lay.tp)
        figures[(name, gpu, precision, seq, tokens, lay.ep)] = statistics.median(gaps)
        lines.append(f"| {name}, {gpu} {precision} | {gpus} | {seq} | {short} | {tokens:,.0f} | {len(group)} "
                     f"| {statistics.median(gaps) * 1e6:+.2f} | {statistics.median(shares):+.0%} |")  # fmt: skip
    return lines, figures


def _recipe_agreement(records: list[RunRecord], params_for) -> tuple[list[str], list[float], int, int]:
    """Each Megatron-Bridge group (model, system, job): is the published layout in the solver's top 10, and how
    much faster the solver claims its pick is than the published layout (both predicted by the same model)."""
    from optlayout.planning import solve
    from optlayout.runs.predict import predict_run

    groups: dict[tuple[object, ...], RunRecord] = {}
    for rec in records:
        if rec.source.startswith("NVIDIA-NeMo/Megatron-Bridge"):
            key = (rec.group_key, tuple(sorted(_published_fields(rec).items())))
            groups.setdefault(key, rec)
    lines = ["| model, system, job | published layout (filled) | predicted tok/s/GPU | in top 10 | solver's pick "
             "| claimed gain |", "|---|---|---:|---|---|---:|"]  # fmt: skip
    gains, inside = [], 0
    for rec in groups.values():
        params = params_for(rec.cluster.gpu, rec.job.precision)
        published = predict_run(rec, params)
        plan = solve(rec.model, rec.cluster, rec.job_spec(), top=10, params=params)
        want = _published_fields(rec)
        found = any(all(getattr(p.layout, k) == v for k, v in want.items()) for p in plan.layouts)
        inside += found
        best = plan.layouts[0]
        gain = best.prediction.tokens_per_s_per_gpu / published.prediction.tokens_per_s_per_gpu - 1
        gains.append(gain)
        c, j = rec.cluster, rec.job
        lines.append(f"| {rec.model.name}, {c.gpu} x {c.gpus}, seq {j.seq_len}, batch {j.global_batch}, {j.precision} "
                     f"| {published.layout.short()} | {published.prediction.tokens_per_s_per_gpu:,.0f} "
                     f"| {'yes' if found else 'no'} | {best.layout.short()} | {gain:+.1%} |")  # fmt: skip
    return lines, gains, inside, len(groups)


FUSED_MOE_RELEASE = (26, 6)
"""The first Megatron-Bridge container (26.06, Bridge v0.5.0: docs/releases/software-versions.md @v0.6.0) whose
Blackwell MoE recipes set cuda_graph_impl="full_iteration", cutedsl_fused_grouped_mlp, fp8_dot_product_attention and
moe_a2a_overlap (qwen3_workload_base_configs.py @v0.5.0 lines 358-365, 388-398; @v0.4.1 lines 338, 361-368)."""


def _by_generation(preds: list[RunPrediction]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """APEs and signed errors of the Megatron-Bridge MoE runs by model, GPU and recipe generation (before or from
    `FUSED_MOE_RELEASE`)."""
    apes: dict[str, list[float]] = defaultdict(list)
    signed: dict[str, list[float]] = defaultdict(list)
    for p in sorted(preds, key=lambda p: (p.record.model.name, p.record.cluster.gpu, p.record.id)):
        release = p.record.release()
        if p.record.framework != "megatron-bridge" or release is None:
            continue
        version = tuple(int(part) for part in release.removeprefix("mb-").split(".")[:2])
        generation = "from 26.06" if version >= FUSED_MOE_RELEASE else "before 26.06"
        key = f"{p.record.model.name}, {p.record.cluster.gpu}, {generation}"
        apes[key].append(p.ape)
        signed[key].append(p.prediction.tokens_per_s_per_gpu / p.record.measured.tokens_per_s_per_gpu - 1)
    return apes, signed


def moe_main(path: str, write: bool) -> int:
    """The MoE runs: dense constants from the shipped calibration (fitted on dense runs only), the MoE-only
    constants at their sourced defaults (nothing fitted on an MoE run) and fitted leaving one model out."""
    from optlayout.runs.calibrate import calibrate_moe, load_calibration, shipped_calibration_path
    from optlayout.runs.uncertainty import bounds, quantiles, with_moe

    records = read_runs(path)
    dense = load_calibration(shipped_calibration_path())
    t0 = time.perf_counter()
    values, report, rows = calibrate_moe(records, dense, lambda _m: None)
    elapsed = time.perf_counter() - t0
    preds = [predict_run(rec, dense.params_for(rec.cluster.gpu, rec.job.precision)) for rec in records]
    by_model: dict[str, list[float]] = defaultdict(list)
    signed: dict[str, list[float]] = defaultdict(list)
    by_hw: dict[str, list[float]] = defaultdict(list)
    signed_hw: dict[str, list[float]] = defaultdict(list)
    for p in preds:
        err = p.prediction.tokens_per_s_per_gpu / p.record.measured.tokens_per_s_per_gpu - 1
        for key, table, sign in ((p.record.model.name, by_model, signed), ("all", by_model, signed),
                                 (f"{p.record.model.name}, {p.record.cluster.gpu} {p.record.job.precision}", by_hw,
                                  signed_hw)):  # fmt: skip
            table[key].append(p.ape)
            sign[key].append(err)
    cv, ins = report["cross_validated_by_model"], report["in_sample"]
    fitted = ", ".join(f"{k} {v:.3f}" for k, v in values.items())
    lines = [
        f"{len(records)} runs of `{Path(path).name}` (Grok-1 on H100 by NVIDIA dgxc-benchmarking, real routing; "
        "Qwen3-30B-A3B and GPT-OSS 120B by Megatron-Bridge, force-balanced), on "
        f"{platform.machine()} {platform.python_version()}. Command: `python benchmarks/accuracy.py --moe`.",
        "Dense constants: the shipped calibration (fitted on dense runs only, never refit here). MoE-only constants "
        f"({', '.join(report['fitted'])}): their sourced defaults, or fitted by `optlayout calibrate` "
        f"({elapsed:.0f} s).",
        "",
        "Out of sample first: MAPE of tokens/s/GPU per model held out.",
        "",
        "| model | runs | sourced MoE constants (none fitted) | MoE constants fitted on the other models "
        "| in-sample fit |",
        "|---|---:|---:|---:|---:|",
    ]
    for model in report["models"]:
        n = len(by_model[model])
        lines.append(f"| {model} | {n} | {report['uncalibrated']['per_model'][model]:.1%} "
                     f"| {cv['per_model'][model]:.1%} | {ins['per_model'][model]:.1%} |")  # fmt: skip
    lines.append(f"| all | {len(records)} | {report['uncalibrated']['mape']:.1%} | {cv['mape']:.1%} "
                 f"| {ins['mape']:.1%} |")  # fmt: skip
    floor, setups = _same_setup_floor(records)
    lines += [
        "",
        f"Fitted on all MoE runs: {fitted}; `optlayout calibrate` keeps the {report['kept']} values (it keeps the "
        "fitted ones only where, leaving one model out, they beat the sourced ones).",
        "",
        f"What the data allow: the {len(records)} runs are {setups} setups (model, cluster, job, published "
        "layout), most measured in several container releases; the release moves the same setup by up to "
        f"2.9x (Qwen3-30B-A3B on 8 B200, MXFP8: 9,299 tok/s/GPU in 25.11, 26,695 in 26.02.01). One value per "
        f"setup, the best possible, still has a MAPE of {floor:.1%}: no layout-only prediction does better.",
        "",
        "Sourced MoE constants, by model and by system:",
        "",
        *_moe_table("model", by_model, signed),
        "",
        *_moe_table("model, GPU, precision", by_hw, signed_hw),
        "",
        "By Megatron-Bridge recipe generation: from the 26.06 container (Bridge v0.5.0) the Blackwell recipes turn on "
        "full-iteration CUDA graphs, the fused grouped MLP, FP8 attention and EP overlap (`scripts/performance/configs/"
        "{qwen,gpt_oss}/*_workload_base_configs.py` @v0.5.0 against @v0.4.1), which no record field states and the "
        "cost model does not price; the Hopper recipes are unchanged.",
        "",
        *_moe_table("model, GPU, recipes", *_by_generation(preds)),
        "",
    ]
    worst = sorted(preds, key=lambda p: -p.ape)[:8]
    lines += ["Worst runs:", "", "| run | measured tok/s/GPU | predicted | APE | layout used | filled |",
              "|---|---:|---:|---:|---|---|"]  # fmt: skip
    for p in worst:
        lines.append(f"| {p.record.id} | {p.record.measured.tokens_per_s_per_gpu:,.0f} | "
                     f"{p.prediction.tokens_per_s_per_gpu:,.0f} | {p.ape:.0%} | {p.layout.short()} | "
                     f"{', '.join(f'{k}={v}' for k, v in p.filled_fields.items())} |")  # fmt: skip
    table, gains, inside, total = _recipe_agreement(records, dense.params_for)
    lines += ["", "Published Megatron-Bridge layouts against the solver's top 10 (one row per model, system, job and "
              f"published layout; sourced MoE constants): {inside} of {total} in the top 10, median claimed gain "
              f"{statistics.median(gains):+.1%}.", "", *table]  # fmt: skip
    unexplained, gap = _unexplained(preds)
    oss, qwen = "GPT-OSS 120B", "Qwen3-30B-A3B"
    lines += ["", "Time the model does not account for, per setup (median over its releases; GPT-OSS 120B and "
              "Qwen3-30B-A3B):", "", *unexplained]  # fmt: skip

    def us(name: str, gpu: str, precision: str, seq: int, tokens: int, ep: int) -> str:
        return f"{gap[(name, gpu, precision, seq, float(tokens), ep)] * 1e6:+.2f}"

    g200, g300 = us(oss, "gb200", "bf16", 4096, 16384, 64), us(oss, "gb300", "bf16", 4096, 16384, 64)
    g200_8k, g300_8k = us(oss, "gb200", "bf16", 8192, 8192, 64), us(oss, "gb300", "bf16", 8192, 16384, 64)
    small = us(oss, "h100-sxm", "bf16", 4096, 4096, 8), us(qwen, "b200", "fp8", 4096, 4096, 8)
    large = us(oss, "h100-sxm", "bf16", 4096, 16384, 8), us(qwen, "b200", "fp8", 4096, 16384, 8)
    fixed_ms = [gap[(name, gpu, precision, 4096, 4096.0, 8)] * 4096 * 1e3
                for name, gpu, precision in ((oss, "h100-sxm", "bf16"), (qwen, "b200", "fp8"))]  # fmt: skip

    shipped = dense.uncertainty
    now = with_moe(shipped, rows) if shipped is not None else None
    moe_cov = now.coverage["moe"] if now is not None else {}
    q = quantiles([row.log_error for row in rows])
    widest = ""
    if shipped is not None and now is not None:  # the rule before the moe regime: the widest dense quantiles
        before = shipped.model_copy(update={"regimes": {k: v for k, v in shipped.regimes.items() if k != "moe"}})
        old_b, new_b = [bounds(before, r.regimes) for r in rows], [bounds(now, r.regimes) for r in rows]
        hit = statistics.mean(b.low <= r.log_error <= b.high for b, r in zip(old_b, rows, strict=True))
        widest = (f" The widest quantiles MoE predictions took before (the dense runs' alone) cover {hit:.0%} at "
                  f"a mean log width of {statistics.mean(b.high - b.low for b in old_b):.2f}, against "
                  f"{statistics.mean(b.high - b.low for b in new_b):.2f} now.")  # fmt: skip
    lines += ["", "Reading (targets of issue 14: leave-one-model-out MAPE <= 12%; the published layouts in the top 10 "
              "for most setups, median claimed gain <= 5%): both missed. Out of sample the error is "
              f"{cv['mape']:.1%} with the MoE constants fitted on the other two models and "
              f"{report['uncalibrated']['mape']:.1%} with their sourced defaults; the data's own floor is "
              f"{floor:.1%}. Grok-1 (8 wide experts, top-2) is predicted within "
              f"{statistics.mean(by_model['Grok-1 314B']):.1%}; the fine-grained models run slower than the model "
              f"says (mean signed error {statistics.mean(signed[oss]):+.1%} for GPT-OSS 120B, "
              f"{statistics.mean(signed[qwen]):+.1%} for Qwen3-30B-A3B). The two MoE constants cannot close it: a fit "
              "pulls them towards Grok-1 (half the runs) and predicts the held-out models worse than the defaults.",
              "",
              "Where the gap is (the table above). Two different costs the model lacks, each located by how it "
              "scales: (1) GPT-OSS 120B in BF16 on Blackwell leaves a cost linear in tokens: the same per token at "
              f"16,384 and 8,192 tokens per micro-batch and at 4K and 8K sequences (GB200 {g200} and {g200_8k} us "
              f"per token and layer, GB300 {g300} and {g300_8k}), where "
              "a mispriced attention core would grow with the sequence (the full layers' keys per query double) "
              "and a fixed cost per micro-batch would shrink with its tokens; and the same with the all-to-all over "
              f"InfiniBand (B200, ep 64: {us(oss, 'b200', 'bf16', 4096, 16384, 64)}) as over NVLink, so not the "
              "token exchange. The optimized MXFP8 recipes of the same model (HybridEP, fused MoE kernels, CUDA "
              f"graphs) leave much less ({us(oss, 'gb200', 'fp8', 4096, 16384, 64)} on GB200). (2) Micro-batches "
              "of 4,096 tokens per GPU leave a fixed cost per layer and micro-batch on H100 and B200 for both "
              f"models (GPT-OSS H100 {small[0]}, Qwen3 B200 {small[1]} us per token and layer, "
              f"{fixed_ms[0]:.1f} and {fixed_ms[1]:.1f} ms per layer and micro-batch) that the same models at "
              "16,384 tokens on the same GPUs show less of it or none "
              f"({large[0]} and {large[1]}; "
              "those pairs also differ in release or batch, so this is a reading, not a proof; the GPT-OSS H100 "
              "run at 16,384 tokens is the MoE file's one memory-model miss once its recipe's recomputation is "
              "filled in: its record gives micro-batch 4 where the Megatron-Bridge v0.2.0 H100 recipe it names "
              "sets 1, scripts/performance/configs/gpt_oss/workload_base_configs.py; Qwen3 on 16 H100 "
              "at ep 16, whose HybridEP all-to-all crosses InfiniBand once per destination node, shows it too, "
              f"{us(qwen, 'h100-sxm', 'fp8', 4096, 4096, 16)}): the "
              "signature of host-bound steps (eager launches and the all-to-all dispatcher's host synchronisation "
              "per layer, which Megatron-Bridge's MoE optimization guide lists as 'CPU overhead' and treats with "
              "CUDA graphs and larger micro-batches), of which the model charges 4 us per kernel, a grouped GEMM "
              "one launch per local expert (Transformer Engine's GroupedLinear issues one cuBLAS GEMM per expert). "
              "Neither has a sourced constant beyond that, so neither is charged further; dense predictions are "
              "not touched by the MoE terms.",
              "",
              "Ruled out, with the evidence: (a) attention sinks outside the fused kernel: every measured release "
              "runs them in cuDNN's fused attention (Transformer Engine >= 2.8 with cuDNN >= 9.13.1 for BSHD/SBHD, "
              "TE fused_attn.cpp; NeMo 25.11 ships TE 2.9 with cuDNN 9.13.1, 26.02 TE 2.12 / 9.18, 26.04 TE 2.14 / "
              "9.20, 26.06 TE 2.16 / 9.21.1, Megatron-Bridge docs/releases/software-versions.md; TE#2318's unfused "
              "fallback was TE 2.8 with cuDNN 9.10.2; Bridge's GPT-OSS provider falls back to MCore's local sink "
              "attention only below TE 2.8); a mispriced core (a window the kernel does not exploit, a slow head "
              "dim of 64) would grow with the sequence, which the gap does not, and a windowed layer's core is "
              "charged two orders of magnitude less time than the gap; (b) the clamped GeGLU with expert "
              "biases: one fused kernel each way (the Bridge GPT-OSS provider sets bias_activation_fusion; Megatron's "
              "weighted_bias_quick_geglu_impl, Megatron-LM 2e29a5e1, 2025-09), priced as a SwiGLU; (c) the LM head "
              "and loss at 201,088 logits: charged (logits GEMM, 16 B per logit), and per token they would need to "
              "be over ten times dearer to fill 36 layers' gap; (d) permutation (fused), router (fused, 128 "
              "experts) and probability multiply: a gap of 0.8 us per token and layer on GB200 is ~5 MB of HBM "
              "traffic per token and layer, far beyond their bytes; (e) optimizer and expert-DP reduction: at ep 64 "
              "a GPU updates its 1.8 billion expert parameters unsharded (expert DP 1), 9 ms of a 5 s step; (f) the "
              "token exchange (above). Not MoE physics: GB300 runs the same recipe 1.2x faster than GB200 "
              "(GPT-OSS BF16; 1.05-1.27x in the dense Llama 3 FP8 runs) while the GPU presets give both the same "
              "peaks. NVIDIA reports that fusing the MoE MLP (grouped GEMM with GLU and quantization, sync-free) "
              "sped GPT-OSS pre-training up 93% end to end (NVIDIA technical blog 'Boosting MoE training throughput "
              "with advanced fusion kernels', 2026-06-15): the size of gap (1), but no per-term figure to charge.",
              "",
              f"Uncertainty: the MoE runs' held-out log errors ({report['kept']} MoE constants) are the calibration's "
              f"`moe` regime: p10 {q.low:+.3f}, median {q.median:+.3f}, p90 {q.high:+.3f}; an MoE prediction's 80% "
              "interval takes it with the dense distributions instead of the widest quantiles. Held out by model, "
              f"it covers {moe_cov.get('covered', 0):.0%} of the {moe_cov.get('runs', 0)} runs (nominal 80%; "
              + ", ".join(f"{m} {c:.0%}" for m, c in sorted(moe_cov.get("per_model", {}).items()))
              + "): with three models, one held out is judged by the other two, and GPT-OSS's gap lies beyond both."
              + widest,
              "",
              "Because the model misprices the very layouts Megatron-Bridge publishes (expert parallelism over the "
              "whole NVLink domain, no pipeline), its top 10 prefers others; the claimed gains above inherit that "
              "bias and are not evidence that the published recipes are slow."]  # fmt: skip
    publish("accuracy-moe", "Prediction accuracy on the published mixture-of-experts runs", "\n".join(lines), write)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=None)
    parser.add_argument("--calibration", default=None)
    parser.add_argument("--moe", action="store_true", help="the mixture-of-experts runs (default file: ../shared)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.moe:
        return moe_main(args.runs or str(DEFAULT_MOE_RUNS), args.write)
    args.runs = args.runs or str(DEFAULT_RUNS)

    records = read_runs(args.runs)
    calibration = None
    if args.calibration:
        from optlayout.runs.calibrate import load_calibration

        calibration = load_calibration(args.calibration)
    t0 = time.perf_counter()
    preds: list[RunPrediction] = []
    for rec in records:
        params = calibration.params_for(rec.cluster.gpu, rec.job.precision) if calibration else DEFAULT_PARAMS
        preds.append(predict_run(rec, params))
    elapsed = time.perf_counter() - t0

    by_source: dict[str, list[RunPrediction]] = defaultdict(list)
    by_hw: dict[str, list[RunPrediction]] = defaultdict(list)
    for p in preds:
        by_source[_short_source(p.record.source)].append(p)
        by_hw[f"{p.record.cluster.gpu} {p.record.job.precision}"].append(p)
    overall = {"all runs": preds}
    worst = sorted(preds, key=lambda p: -p.ape)[:8]
    label = "calibrated: " + args.calibration if args.calibration else "uncalibrated (default CostParams)"
    lines = [
        f"Cost model {label}, {len(preds)} runs of `{Path(args.runs).name}`, "
        f"{elapsed:.1f} s on {platform.machine()} {platform.python_version()} ({platform.node() or 'this machine'}).",
        "Command: `python benchmarks/accuracy.py"
        + (f" --calibration {args.calibration}" if args.calibration else "")
        + "`.",
        "",
        *_table("overall", overall),
        "",
        *_table("source", by_source),
        "",
        *_table("GPU, precision", by_hw),
        "",
        "Worst runs:",
        "",
        "| run | measured tok/s/GPU | predicted | APE | layout used | filled |",
        "|---|---:|---:|---:|---|---|",
    ]
    for p in worst:
        lines.append(
            f"| {p.record.id} | {p.record.measured.tokens_per_s_per_gpu:,.0f} | "
            f"{p.prediction.tokens_per_s_per_gpu:,.0f} | {p.ape:.0%} | {p.layout.short()} | "
            f"{', '.join(f'{k}={v}' for k, v in p.filled_fields.items())} |"
        )
    if not args.calibration:  # out of sample first
        lines = [*_cross_validation(records), "", *lines]
    text = "\n".join(lines)
    publish("accuracy", "Prediction accuracy on the published runs", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
