"""One MoE layer's forward and backward against Megatron-Core's own CI measurement of it (out of sample).

Reproduce:  python benchmarks/moe_layer.py [--write]

Megatron-LM's MoE performance test (`tests/functional_tests/test_cases/common/moe_perf/`, Megatron-LM d98e8a64dd)
times one `MoELayer` (router, dispatch, experts, combine; no attention) on 8 H100s, EP 8, TP 1, 4,096 tokens per
rank, routing forced uniform, for a Mixtral proxy (h 4096, 8 experts, top-2, width 14336) and a DeepSeek proxy
(h 7168, 32 experts, top-8, width 2048, one shared expert of 2048), with the alltoall, DeepEP and HybridEP
dispatchers in BF16 and FP8 (blockwise). Its `baseline.json` figures are copied below: published measurements
that are not in ../shared/data/, used as a check only (no constant is fitted to them).

The cost model's figure is the step model's own: `stage_times` of a one-layer stage of the MoE layer minus that of
its attention-only twin (same attention, a dense FFN of width 1), plus the layer's exposed all-to-all. Reported
with the sourced constants (`DEFAULT_PARAMS`) and with the shipped calibration (fitted on dense end-to-end runs).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from _results import publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optlayout.cost import comm  # noqa: E402
from optlayout.cost.attention import DENSE_LAYER, LayerKind  # noqa: E402
from optlayout.cost.params import DEFAULT_PARAMS, CostParams  # noqa: E402
from optlayout.cost.step import layer_times, stage_times  # noqa: E402
from optlayout.layout import parse_layout  # noqa: E402
from optlayout.presets import gpu_preset  # noqa: E402
from optlayout.runs.calibrate import calibrated_params  # noqa: E402
from optlayout.specs import ClusterSpec, JobSpec, ModelSpec  # noqa: E402
from optlayout.topology import topology_from_cluster  # noqa: E402

SOURCE = "Megatron-LM d98e8a64dd tests/functional_tests/test_cases/common/moe_perf/baseline.json"
# (forward ms, backward ms) per case, as baseline.json has them (rounded to 0.01 ms here)
MEASURED_MS: dict[tuple[str, str, str], tuple[float, float]] = {
    ("deepseek", "alltoall", "bf16"): (7.12, 10.48),
    ("deepseek", "alltoall", "fp8"): (7.61, 10.13),
    ("deepseek", "deepep", "bf16"): (5.68, 9.06),
    ("deepseek", "deepep", "fp8"): (6.03, 8.60),
    ("deepseek", "hybridep", "bf16"): (5.39, 8.80),
    ("deepseek", "hybridep", "fp8"): (5.14, 7.69),
    ("mixtral", "alltoall", "bf16"): (4.33, 7.68),
    ("mixtral", "alltoall", "fp8"): (3.79, 6.62),
    ("mixtral", "deepep", "bf16"): (4.64, 7.85),
    ("mixtral", "deepep", "fp8"): (4.10, 6.83),
    ("mixtral", "hybridep", "bf16"): (4.34, 7.74),
    ("mixtral", "hybridep", "fp8"): (3.70, 6.57),
}
PROXIES = {  # test_cases.py MIXTRAL_PROXY, DEEPSEEK_PROXY (8 attention heads: the layer measured has no attention)
    "mixtral": {"hidden": 4096, "moe": {"experts": 8, "top_k": 2, "expert_ffn": 14336}},
    "deepseek": {"hidden": 7168, "moe": {"experts": 32, "top_k": 8, "expert_ffn": 2048, "shared_experts": 1,
                                         "shared_expert_ffn": 2048}},
}  # fmt: skip
DISPATCHER = {"alltoall": "alltoall", "deepep": "flex", "hybridep": "flex"}


def layer_ms(proxy: str, dispatcher: str, precision: str, params: CostParams) -> tuple[float, float]:
    """The cost model's forward and backward of the proxy's MoE layer (ms)."""
    shape = {"layers": 1, "heads": 8, "kv_heads": 8, "vocab": 32000, **PROXIES[proxy]}
    moe_model = ModelSpec(name=proxy, ffn=1, **shape)
    twin = ModelSpec(name=f"{proxy} attention", ffn=1, **{k: v for k, v in shape.items() if k != "moe"})
    job = JobSpec(seq_len=4096, global_batch=8, precision=precision, moe_routing="balanced",
                  moe_dispatcher=DISPATCHER[dispatcher])  # fmt: skip
    layout = parse_layout("dp=8,ep=8,ga=1")
    gpu = gpu_preset("h100-sxm")
    links = comm.group_links(topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=8)), layout)
    moe = layer_times(moe_model, job, layout, gpu, links, params, LayerKind(True, False))
    attention = layer_times(twin, job, layout, gpu, links, params, DENSE_LAYER)
    with_moe = stage_times(moe_model, job, layout, gpu, params, ((moe, 1),), False)
    without = stage_times(twin, job, layout, gpu, params, ((attention, 1),), False)
    fwd = with_moe.compute_fwd_s - without.compute_fwd_s + moe.ep_comm_fwd_s
    bwd = with_moe.compute_bwd_s - without.compute_bwd_s + moe.ep_comm_bwd_s
    return fwd * 1e3, bwd * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    sets = {"sourced": DEFAULT_PARAMS}
    lines = [
        f"Measured: {SOURCE} (one MoE layer, 8 H100, EP 8, 4,096 tokens per rank, forced balance). Predicted: the "
        f"step model (`python benchmarks/moe_layer.py`), {platform.machine()} Python {platform.python_version()}. "
        "Signed error = predicted / measured - 1 (positive: the model is slower than the run).",
        "",
        "| proxy | dispatcher | precision | measured fwd / bwd ms | sourced constants | shipped calibration |",
        "|---|---|---|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {"sourced": [], "calibrated": []}
    for (proxy, dispatcher, precision), (fwd_ms, bwd_ms) in MEASURED_MS.items():
        sets["calibrated"] = calibrated_params("h100-sxm", precision)
        cells = []
        for name, params in sets.items():
            fwd, bwd = layer_ms(proxy, dispatcher, precision, params)
            errors[name] += [fwd / fwd_ms - 1, bwd / bwd_ms - 1]
            cells.append(f"{fwd:.2f} / {bwd:.2f} ({fwd / fwd_ms - 1:+.0%} / {bwd / bwd_ms - 1:+.0%})")
        lines.append(f"| {proxy} | {dispatcher} | {precision} | {fwd_ms:.2f} / {bwd_ms:.2f} | {' | '.join(cells)} |")
    lines.append("")
    for name, signed in errors.items():
        mape = sum(map(abs, signed)) / len(signed)
        lines.append(f"- {name}: mean absolute error {mape:.1%} over the {len(signed)} forward and backward figures, "
                     f"signed from {min(signed):+.0%} to {max(signed):+.0%}")  # fmt: skip
    publish("moe-layer", "One MoE layer against Megatron-Core's CI measurement", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
