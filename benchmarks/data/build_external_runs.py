"""Build `external_runs.jsonl`: published measured pre-training runs that are not in ../shared/data, for
out-of-sample checks only (nothing is fitted to them).

Reproduce:  python benchmarks/data/build_external_runs.py BRIDGE_GIT_DIR [--out benchmarks/data/external_runs.jsonl]
BRIDGE_GIT_DIR: a clone of github.com/NVIDIA-NeMo/Megatron-Bridge holding commit `BRIDGE_COMMIT`; its tables are read
with `git show BRIDGE_COMMIT:docs/performance-summary*.md` and parsed here, so no Megatron-Bridge number is typed by
hand. The torchtitan rows (`TORCHTITAN_ROWS`) are transcribed from github.com/pytorch/torchtitan @`TITAN_COMMIT`
benchmarks/*.md, each with its table; the sequence length those tables leave out is the default of the training
config of the torchtitan commit each benchmark names (quoted per row).

Recipe fills (`BRIDGE_PRESETS`, `_BRIDGE_RULES`, `_recipe_fill`): the tables leave the token dispatcher, recomputation,
sharding and (Kimi K2) optimizer unstated; each Bridge record states the run-record fields its release's performance
recipe sets (job.moe_dispatcher, job.moe_ep_overlap, layout.recompute / recompute_modules, layout.sharding,
job.optimizer, job.fp8_param_gather), transcribed from the release's tag (`BRIDGE_TAGS`;
scripts/performance/configs/*/... workload presets, or src/megatron/bridge/perf_recipes at v0.6.0) with file, tag and
lines in the record's `source`, and only where the record's published (tp, pp, cp, vp, ep, micro batch) are the
preset's. job.moe_ep_overlap is true or false where the recipe sets overlap_moe_expert_parallel_comm (the preset's
moe_a2a_overlap, the model recipe's assignment, or the v0.6.0 recipe), and left unstated where nothing in it does.
What the recipe sets that the format has no field for (a custom pipeline layout) is named in `source` only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from optlayout.layout.stages import stage_layer_counts, vp_fits

HERE = Path(__file__).resolve().parent
BRIDGE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
BRIDGE_FILES = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
TITAN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
MODELS_YAML = HERE.parent.parent / "optlayout" / "presets" / "models.yaml"

# Calibration set (../shared/data): Megatron-Bridge Llama 3 8B / 70B and Qwen3-30B-A3B / GPT-OSS 120B rows.
IN_CALIBRATION = ("LLAMA3_8B", "LLAMA3_70B", "Qwen3_30B_a3B", "GPT OSS 120B")
# Megatron-Bridge system -> cluster, as the calibration records of the same tables give them
SYSTEMS: dict[str, dict[str, Any]] = {
    "DGX-GB300": {"gpu": "gb300", "gpus_per_node": 4, "nvlink_domain": 72, "inter_node_gbps_per_gpu": 800},
    "DGX-GB200": {"gpu": "gb200", "gpus_per_node": 4, "nvlink_domain": 72, "inter_node_gbps_per_gpu": 400},
    "DGX-B200": {"gpu": "b200", "gpus_per_node": 8, "nvlink_domain": 8, "inter_node_gbps_per_gpu": 400},
    "DGX-H100": {"gpu": "h100-sxm", "gpus_per_node": 8, "nvlink_domain": 8, "inter_node_gbps_per_gpu": 400},
}
PRECISIONS: dict[str, tuple[str, str | None]] = {  # table label -> (precision, fp8_recipe)
    "BF16": ("bf16", None), "FP8": ("fp8", "tensorwise"), "FP8-CS": ("fp8", "tensorwise"),
    "MXFP8": ("fp8", "mxfp8"), "FP8-MX": ("fp8", "mxfp8"),
}  # fmt: skip
LLAMA31_405B = {"name": "Llama 3.1 405B", "layers": 126, "hidden": 16384, "ffn": 53248, "heads": 128, "kv_heads": 8,
                "vocab": 128256, "mlp": "swiglu", "tied_embeddings": False}  # fmt: skip
LLAMA31_70B = {"name": "Llama 3.1 70B", "layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8,
               "vocab": 128256, "mlp": "swiglu", "tied_embeddings": False}  # fmt: skip
LLAMA31_8B = {"name": "Llama 3.1 8B", "layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8,
              "vocab": 128256, "mlp": "swiglu", "tied_embeddings": False}  # fmt: skip


def _preset_model(key: str, **override: object) -> dict[str, Any]:
    entry = yaml.safe_load(MODELS_YAML.read_text())[key]
    return {"name": entry["name"], **entry["shape"], "tied_embeddings": False, **override}


def _bridge_model(label: str) -> tuple[str, dict[str, Any]] | str:
    """(id slug, model) for a table's model label, or why it is left out."""
    if label == "LLAMA3.1_405B":
        return "llama31405b", dict(LLAMA31_405B)
    if label.startswith("DeepSeekV3"):  # 26.x tables do not say; the recipe keeps the model's 1 MTP layer
        mtp = 0 if "w/o MTP" in label else 1
        return "deepseekv3", _preset_model("deepseek-v3", mtp_layers=mtp)
    if label == "Qwen3_235B_a22B":
        return "qwen3235ba22b", _preset_model("qwen3-235b-a22b")
    if label == "Kimi_K2":
        return "kimik2", _preset_model("kimi-k2")
    if label in IN_CALIBRATION:
        return "in the calibration set"
    if label.startswith("Nemotron_3"):
        return "hybrid Mamba-Transformer (Nemotron 3): no Mamba layers in the model format"
    if label.startswith("DeepSeekV4"):
        return "DeepSeek-V4 attention and mHC: not expressible, no preset"
    return f"unknown model {label}"


def _split(cell: str) -> tuple[str, str | None]:
    """'661 (624)' -> ('661', '624'); footnote marks dropped."""
    cell = re.sub(r"\[\^[^\]]*\]", "", cell).strip()
    m = re.fullmatch(r"(.+?)\s*\((.+)\)", cell)
    return (m.group(1).strip(), m.group(2).strip()) if m else (cell, None)


def _int(cell: str) -> int | None:
    return None if cell in ("n/a", "") else int(cell)


def bridge_rows(git_dir: str) -> tuple[list[dict[str, Any]], Counter[str], Counter[str]]:
    """Every pre-training row of the Megatron-Bridge tables the tool can express (with its recipe's fields filled,
    `_recipe_fill`), the others counted by why, and the recipe fills counted."""
    out: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    filled: Counter[str] = Counter()
    for path in BRIDGE_FILES:
        text = subprocess.run(["git", "-C", git_dir, "show", f"{BRIDGE_COMMIT}:{path}"], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
        release = phase = heading = None
        header: list[str] | None = None
        for line in text.splitlines():
            if m := re.match(r"## (\S+) NeMo Container", line):
                release, header = m.group(1), None
            elif line.startswith("### "):
                phase, header = line[4:].strip(), None
            elif m := re.match(r"#### (Model|System): (.+)", line):
                heading, header = m.group(2).strip(), None
            elif line.startswith("| System") or line.startswith("| Model"):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
            elif header and line.startswith("|") and not line.startswith("|--"):
                cells = dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")), strict=True))
                assert release and phase and heading
                for rec in _bridge_records(path, release, phase, heading, cells, skipped):
                    _recipe_fill(rec, release, rec["id"].split("-")[4], filled)
                    out.append(rec)
    return out, skipped, filled


def _bridge_records(path: str, release: str, phase: str, heading: str, cells: dict[str, str],
                    skipped: Counter[str]) -> list[dict[str, Any]]:  # fmt: skip
    system = cells.get("System", heading)
    label = re.sub(r"\s+", " ", cells.get("Model", heading)).strip()
    if phase != "Pre-Training Performance":
        skipped[f"{phase}: not pre-training"] += 1
        return []
    if release == "25.09":
        skipped["25.09: the table gives no precision (its recipe matrix lists bf16 and several FP8 recipes)"] += 1
        return []
    model = _bridge_model(label)
    if isinstance(model, str):
        skipped[f"{label}: {model}"] += 1
        return []
    if system not in SYSTEMS:
        skipped[f"{system}: no GPU preset"] += 1
        return []
    precisions = _split(cells["Precision"])
    measured = _split(cells["Tokens / sec / GPU"])
    slug, spec = model
    pp, vp = int(cells["PP"]), _int(cells["VP"])
    counts = stage_layer_counts(spec["layers"], pp)
    if vp and vp > 1 and not vp_fits(counts, vp):  # Megatron-Bridge sets a custom --pipeline-model-parallel-layout
        why = (f"{label}: pp {pp} x vp {vp} over {spec['layers']} layers: not the tool's stage split (stages of "
               f"{sorted(set(counts))} layers; the recipe's own pipeline layout is not expressible)")  # fmt: skip
        skipped[why] += 1
        return []
    records = []
    for variant, (prec_label, tps) in enumerate(((precisions[0], measured[0]), (precisions[1], measured[1]))):
        if prec_label is None or tps is None:
            continue
        if prec_label not in PRECISIONS:
            skipped[f"{prec_label}: no such precision in the tool"] += 1
            continue
        precision, recipe = PRECISIONS[prec_label]
        gpus = int(cells["#-GPUs"])
        cluster: dict[str, Any] = dict(SYSTEMS[system], gpus=gpus)
        tp, pp, cp = (int(_split(cells[k])[0]) for k in ("TP", "PP", "CP"))
        fsdp = _int(_split(cells.get("FSDP", "0"))[0])
        job: dict[str, Any] = {"seq_len": int(cells["Sequence Length"]), "global_batch": int(cells["GBS"]),
                               "precision": precision}  # fmt: skip
        if recipe:
            job["fp8_recipe"] = recipe
        layout: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp)}
        if "moe" in spec:
            job["moe_routing"] = "balanced"  # "we force-balance the token distribution among experts", dropless
            layout |= {"ep": int(cells["EP"]), "etp": 1}
        layout |= {"vp": _int(_split(cells["VP"])[0]), "micro_batch": int(cells["MBS"]),
                   "sharding": "fsdp" if fsdp else None, "recompute": None, "sequence_parallel": None}  # fmt: skip
        gpu = str(cluster["gpu"])
        tag = "main" if variant == 0 else "alt"
        prec_slug = {"tensorwise": "fp8", "mxfp8": "mxfp8"}.get(recipe or "", precision)  # the calibration's ids
        rid = f"mb-{release}-pretrain-{gpu.removesuffix('-sxm')}-{slug}-{prec_slug}-{gpus}g-{tag}"
        source = (f"NVIDIA-NeMo/Megatron-Bridge@{BRIDGE_COMMIT[:8]} {path}, {release} NeMo Container, "
                  f"{phase}, {'Model' if 'Model' not in cells else 'System'}: {heading}"
                  + (f", row {label}" if "Model" in cells else ""))  # fmt: skip
        records.append({"id": rid, "source": source, "model": spec, "cluster": cluster, "job": job,
                        "framework": "megatron-bridge", "layout": layout,
                        "measured": {"tokens_per_s_per_gpu": float(tps.replace(",", "")),
                                     "derived_from": "tokens_per_s"}})  # fmt: skip
    return records


# --- Recipe fills: what the Megatron-Bridge performance recipe of each release sets that the tables leave out ---
# The container each release ships (docs/versions1.json @BRIDGE_COMMIT lines 7-48).
BRIDGE_TAGS = {"25.11": "v0.2.0", "26.02": "v0.3.0", "26.02.01": "v0.3.1", "26.04": "v0.4.0", "26.04.01": "v0.4.2",
               "26.06": "v0.5.0", "26.06.01": "v0.5.1", "26.08": "v0.6.0"}  # fmt: skip
_PRESET_FILES = {  # scripts/performance/configs/<file> at each tag up to v0.5.1 (v0.6.0: src/.../perf_recipes)
    "deepseekv3": ("deepseek/workload_base_configs.py", "deepseek/deepseek_workload_base_configs.py"),
    "qwen3235ba22b": ("qwen3/workload_base_configs.py", "qwen/qwen3_workload_base_configs.py"),
    "kimik2": ("", "kimi/kimi_workload_base_configs.py"),
    "llama31405b": ("llama31/workload_base_configs.py", "llama/llama31_workload_base_configs.py"),
}
_PERF = "scripts/performance"


class _Preset(NamedTuple):
    """A release's workload preset of the performance scripts (or v0.6.0 perf recipe) as it resolves: `lines` the
    preset's definition and the presets it derives from; `degrees` (tp, pp, cp, vp, ep, micro batch) it runs;
    `dispatcher` the token dispatcher the run ends with (None: dense); `recompute_modules` the selective recompute
    modules (None: no recomputation); `ep_overlap` the preset's moe_a2a_overlap (None: no preset of its chain sets
    it; at v0.6.0 the recipe's overlap_moe_expert_parallel_comm); `pp_layout` its own
    --pipeline-model-parallel-layout; `fsdp` use_megatron_fsdp; `offload_layers` cpu_offloading_num_layers."""

    tag: str
    name: str
    lines: str
    degrees: tuple[int, int, int, int | None, int, int]
    dispatcher: str | None
    recompute_modules: tuple[str, ...] | None
    ep_overlap: bool | None
    pp_layout: str | None = None
    fsdp: bool = False
    offload_layers: int | None = None
    where: str | None = None  # the file, where not the tag's workload preset file


# Resolved from each tag's preset file (dataclasses.replace chains followed; V2 presets where the published GBS is
# V2's, V1 / unversioned otherwise; 25.11's file has one preset per GPU and precision). The dispatcher, recompute and
# sharding each preset leads to follow the tag's rules in `_BRIDGE_RULES`.
BRIDGE_PRESETS: dict[tuple[str, str, str, str, str | None], _Preset] = {
    ("25.11", "deepseekv3", "b200", "fp8", "mxfp8"): _Preset(
        "v0.2.0", "DEEPSEEK_V3_B200_FP8_MX_BASE_CONFIG", "74, 73, 63-71, 22-24", (1, 16, 1, None, 8, 1), "alltoall",
        ("mla_up_proj",), False),
    ("25.11", "deepseekv3", "gb200", "bf16", None): _Preset(
        "v0.2.0", "DEEPSEEK_V3_GB200_BF16_BASE_CONFIG", "58, 45-57, 22-24", (1, 4, 1, 4, 64, 1), "flex",
        ("mla_up_proj",), False),
    ("25.11", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.2.0", "DEEPSEEK_V3_GB200_FP8_MX_BASE_CONFIG", "60, 45-57, 22-24", (1, 4, 1, 4, 64, 1), "flex",
        ("mla_up_proj",), False),
    ("25.11", "llama31405b", "b200", "fp8", "mxfp8"): _Preset(
        "v0.2.0", "LLAMA31_405B_B200_FP8_MX_BASE_CONFIG", "136, 125-133, 22", (4, 8, 2, 8, 1, 1), None, None, False),
    ("25.11", "llama31405b", "b200", "fp8", "tensorwise"): _Preset(
        "v0.2.0", "LLAMA31_405B_B200_FP8_CS_BASE_CONFIG", "125-133, 22", (4, 8, 2, 8, 1, 1), None, None, False),
    ("25.11", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.2.0", "LLAMA31_405B_GB200_FP8_CS_BASE_CONFIG", "81-88, 22", (2, 1, 1, None, 1, 1), None, None, False,
        fsdp=True, offload_layers=92),
    ("25.11", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.2.0", "LLAMA31_405B_GB300_FP8_CS_BASE_CONFIG", "37-44, 22", (2, 1, 1, None, 1, 1), None, None, False,
        fsdp=True, offload_layers=10),
    ("25.11", "llama31405b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.2.0", "LLAMA31_405B_H100_FP8_CS_BASE_CONFIG", "159-167, 22", (8, 8, 2, 8, 1, 1), None, None, False),
    ("25.11", "qwen3235ba22b", "b200", "fp8", "mxfp8"): _Preset(
        "v0.2.0", "QWEN3_235B_A22B_B200_FP8_MX_BASE_CONFIG", "120, 109-117, 22-24", (1, 8, 1, 4, 8, 1), "alltoall",
        None, True),
    ("25.11", "qwen3235ba22b", "gb200", "bf16", None): _Preset(
        "v0.2.0", "QWEN3_235B_A22B_GB200_BF16_BASE_CONFIG", "71-80, 22-24", (1, 8, 1, None, 8, 1), "flex", None, None),
    ("25.11", "qwen3235ba22b", "gb300", "bf16", None): _Preset(
        "v0.2.0", "QWEN3_235B_A22B_GB300_BF16_BASE_CONFIG", "42-52, 22-24", (2, 1, 1, None, 64, 4), "flex", None,
        None),
    ("25.11", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.2.0", "QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG", "135-144, 22-24", (2, 8, 1, 4, 32, 1), "alltoall", None,
        True),
    ("26.02", "deepseekv3", "b200", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2", "184, 183, 178-181, 105-114, 32-34",
        (1, 16, 1, None, 8, 1), "flex", ("mla_up_proj",), False),
    ("26.02", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "161, 155-158, 72-84, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mla_up_proj",), False),
    ("26.02", "llama31405b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "275-281, 98-106, 29", (4, 16, 1, 8, 1, 1), None,
        None, False),
    ("26.02", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.3.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", "262-272, 88-95, 29", (4, 16, 1, 4, 1, 1), None, None,
        False),
    ("26.02", "llama31405b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "238-243, 54-62, 29", (2, 8, 2, 4, 1, 1), None, None,
        False),
    ("26.02", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.3.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", "225-235, 44-51, 29", (4, 8, 1, 4, 1, 1), None, None,
        False),
    ("26.02", "llama31405b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.3.0", "LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "297-300, 203-211, 29", (8, 8, 2, 8, 1, 1), None, None,
        False),
    ("26.02", "qwen3235ba22b", "b200", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_MX_V2", "259, 252-256, 146-153, 32-34",
        (1, 8, 1, None, 8, 1), "alltoall", None, False),
    ("26.02", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "225, 217-222, 95-104, 32-34",
        (1, 8, 1, None, 32, 1), "flex", None, None),
    ("26.02", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.3.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "207, 197-204, 67-77, 32-34",
        (1, 4, 1, None, 32, 2), "flex", None, None),
    ("26.02", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.3.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "268-271, 171-180, 32-34", (2, 8, 1, 4, 32, 1),
        "alltoall", None, True),
    ("26.02.01", "deepseekv3", "b200", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2", "184, 183, 178-181, 105-114, 32-34",
        (1, 16, 1, None, 8, 1), "flex", ("mla_up_proj",), False),
    ("26.02.01", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "161, 155-158, 72-84, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mla_up_proj",), False),
    ("26.02.01", "kimik2", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX", "42, 27-39, 22-24", (1, 4, 1, 4, 64, 2), "flex",
        ("mla_up_proj",), False),
    ("26.02.01", "llama31405b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "275-281, 98-106, 29", (4, 16, 1, 8, 1, 1), None,
        None, False),
    ("26.02.01", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.3.1", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", "262-272, 88-95, 29", (4, 16, 1, 4, 1, 1), None, None,
        False),
    ("26.02.01", "llama31405b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "238-243, 54-62, 29", (2, 8, 2, 4, 1, 1), None, None,
        False),
    ("26.02.01", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.3.1", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", "225-235, 44-51, 29", (4, 8, 1, 4, 1, 1), None, None,
        False),
    ("26.02.01", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "216, 208-213, 97-106, 32-35",
        (1, 8, 1, None, 32, 1), "flex", None, None),
    ("26.02.01", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.3.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "198, 197, 187-194, 56-66, 32-35",
        (1, 4, 1, None, 32, 2), "flex", None, None),
    ("26.02.01", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.3.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "259-262, 171-180, 32-35", (2, 8, 1, 4, 32, 1),
        "alltoall", None, True),
    ("26.04", "deepseekv3", "b200", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2", "201, 200, 195-198, 110-119, 32-34",
        (1, 16, 1, None, 8, 1), "flex", ("mla_up_proj",), False),
    ("26.04", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "170, 161-164, 72-84, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mlp",), False),
    ("26.04", "kimik2", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX", "42, 27-39, 22-24", (1, 4, 1, 4, 64, 2), "flex",
        ("mla_up_proj",), False),
    ("26.04", "llama31405b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "275-281, 98-106, 29", (4, 16, 1, 8, 1, 1), None,
        None, False),
    ("26.04", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.4.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", "262-272, 88-95, 29", (4, 16, 1, 4, 1, 1), None, None,
        False),
    ("26.04", "llama31405b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "238-243, 54-62, 29", (2, 8, 2, 4, 1, 1), None, None,
        False),
    ("26.04", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.4.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", "225-235, 44-51, 29", (4, 8, 1, 4, 1, 1), None, None,
        False),
    ("26.04", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "222-225, 214-219, 96-105, 32-34",
        (1, 8, 1, 3, 32, 1), "flex", None, None),
    ("26.04", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "200-203, 199, 189-196, 54-64, 32-34",
        (1, 4, 1, 12, 32, 2), "flex", None, None),
    ("26.04", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.4.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "273-276, 173-182, 32-34", (2, 8, 1, 4, 32, 1),
        "alltoall", None, True),
    ("26.04.01", "deepseekv3", "b200", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2", "203-214, 202, 197-200, 110-119, 32-34",
        (1, 8, 1, 2, 32, 1), "flex", ("mla_up_proj", "mlp"), True, pp_layout="Et*4|(t*4|)*14tmL"),
    ("26.04.01", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "170, 161-164, 72-84, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mlp",), False),
    ("26.04.01", "kimik2", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX", "42, 27-39, 22-24", (1, 4, 1, 4, 64, 2), "flex",
        ("mla_up_proj",), False),
    ("26.04.01", "llama31405b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "275-281, 98-106, 29", (4, 16, 1, 8, 1, 1), None,
        None, False),
    ("26.04.01", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.4.2", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", "262-272, 88-95, 29", (4, 16, 1, 4, 1, 1), None, None,
        False),
    ("26.04.01", "llama31405b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "238-243, 54-62, 29", (2, 8, 2, 4, 1, 1), None, None,
        False),
    ("26.04.01", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.4.2", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", "225-235, 44-51, 29", (4, 8, 1, 4, 1, 1), None, None,
        False),
    ("26.04.01", "llama31405b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.4.2", "LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "297-300, 203-211, 29", (8, 8, 2, 8, 1, 1), None, None,
        False),
    ("26.04.01", "qwen3235ba22b", "b200", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_MX_V2", "265, 258-262, 149-156, 32-34",
        (1, 8, 1, None, 8, 1), "alltoall", None, False),
    ("26.04.01", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "224-227, 216-221, 96-105, 32-34",
        (1, 8, 1, 3, 32, 1), "flex", None, None),
    ("26.04.01", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.4.2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "202-205, 201, 191-198, 54-64, 32-34",
        (1, 4, 1, 12, 32, 2), "flex", None, None),
    ("26.04.01", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.4.2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "275-278, 175-184, 32-34", (2, 8, 1, 4, 32, 1),
        "alltoall", None, True),
    ("26.06", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "209-212, 98-105, 80-92, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mla_up_proj",), True),
    ("26.06", "kimik2", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX", "42, 27-39, 22-24", (1, 4, 1, 4, 64, 2), "flex",
        ("mla_up_proj",), False),
    ("26.06", "llama31405b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "276-282, 98-106, 29", (4, 16, 1, 8, 1, 1), None,
        None, False),
    ("26.06", "llama31405b", "gb200", "fp8", "tensorwise"): _Preset(
        "v0.5.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", "263-273, 88-95, 29", (4, 16, 1, 4, 1, 1), None, None,
        False),
    ("26.06", "llama31405b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "238-243, 54-62, 29", (2, 8, 2, 4, 1, 1), None, None,
        False),
    ("26.06", "llama31405b", "gb300", "fp8", "tensorwise"): _Preset(
        "v0.5.0", "LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", "225-235, 44-51, 29", (4, 8, 1, 4, 1, 1), None, None,
        False),
    ("26.06", "llama31405b", "h100-sxm", "fp8", "tensorwise"): _Preset(
        "v0.5.0", "LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS_V2", "314-317, 203-211, 29", (8, 8, 2, 8, 1, 1), None, None,
        False),
    ("26.06", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "229-237, 221-226, 96-105, 32-34",
        (1, 8, 1, 3, 32, 1), "flex", None, True),
    ("26.06", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.5.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "202-210, 201, 191-198, 54-64, 32-34",
        (1, 4, 1, 12, 32, 2), "flex", None, True),
    ("26.06.01", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.5.1", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "224-227, 98-105, 80-92, 32-34", (1, 4, 1, 4, 64, 1),
        "flex", ("mla_up_proj",), True),
    ("26.06.01", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.5.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "229-237, 221-226, 96-105, 32-34",
        (1, 8, 1, 3, 32, 1), "flex", None, True),
    ("26.06.01", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.5.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "202-210, 201, 191-198, 54-64, 32-34",
        (1, 4, 1, 12, 32, 2), "flex", None, True),
    # 26.08 (v0.6.0): flat perf recipes replace the presets; the Qwen3 ones are named 64-GPU (GBS 2048), the same
    # per-GPU degrees as the published 256-GPU runs
    ("26.08", "deepseekv3", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.6.0",
        "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config",
        "134-160; perf_recipes/deepseek/common.py 31-37 "
        "(recompute_granularity selective), 49-77 (_enable_deepseek_full_iteration_mxfp8: hybridep flex dispatcher, "
        "overlap_moe_expert_parallel_comm, moe_paged_stash, moe_expert_rank_capacity_factor 1.5)",
        (1, 4, 1, 4, 64, 1),
        "flex",
        ("mla_up_proj",),
        True,
        where="src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v3.py",
    ),
    ("26.08", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): _Preset(
        "v0.6.0",
        "qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx_config",
        "142-168 (recompute_granularity None 147-149, "
        "hybridep flex 164-165); perf_recipes/qwen/common.py 36-60 (_enable_hybridep_full_iteration_mxfp8: "
        "overlap_moe_expert_parallel_comm, moe_paged_stash)",
        (1, 8, 1, 3, 32, 1),
        "flex",
        None,
        True,
        where="src/megatron/bridge/perf_recipes/qwen/gb200/qwen3_moe.py",
    ),
    ("26.08", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): _Preset(
        "v0.6.0",
        "qwen3_235b_a22b_pretrain_64gpu_gb300_fp8mx_config",
        "141-167 (recompute_granularity None 146-148, "
        "hybridep flex 163-164); perf_recipes/qwen/common.py 36-60 (_enable_hybridep_full_iteration_mxfp8: "
        "overlap_moe_expert_parallel_comm, moe_paged_stash)",
        (1, 4, 1, 12, 32, 2),
        "flex",
        None,
        True,
        where="src/megatron/bridge/perf_recipes/qwen/gb300/qwen3_moe.py",
    ),
}  # fmt: skip

_DS_RULE = (
    "{perf}/configs/deepseek/deepseek_llm_pretrain.py line {sel} recompute_granularity selective with the "
    "preset's recompute_modules; {disp}; src/megatron/bridge/recipes/deepseek/deepseek_v3.py {opt}"
)
_QW_RULE = (
    "{perf}/configs/{q}/qwen3_llm_pretrain.py set_qwen3_common_configs lines {none} recompute_granularity "
    "None (no preset sets recompute); {disp}; src/megatron/bridge/recipes/qwen/qwen3_moe.py {opt}"
)
_KIMI_RULE = (
    "{perf}/configs/kimi/kimi_llm_pretrain.py line 47 recompute_granularity selective with the preset's "
    "modules, lines 77-79 apply_flex_dispatcher_backend with the preset's hybridep{ovr}; optimizer_type "
    "muon by default ({perf}/argument_parser.py line {argp}; src/megatron/bridge/recipes/kimi/kimi_k2.py lines {muon}: "
    "distributed_muon, use_distributed_optimizer False), and with it and MXFP8 fp8_param_gather False "
    "(kimi_llm_pretrain.py lines 38-44)"
)
_LL_RULE = "src/megatron/bridge/recipes/llama/llama3.py {rule} (the presets set no recompute or offload)"
_FLEX_OLD = (
    "the recipe's apply_flex_dispatcher_backend (src/megatron/bridge/recipes/{f} line {a}) makes the preset's "
    "backend flex; without one the provider's alltoall stays (src/megatron/bridge/{p})"
)
_FLEX_NEW = _PERF + "/utils/overrides.py lines {l}: the preset's backend -> flex dispatcher, none -> alltoall"
_BRIDGE_RULES: dict[tuple[str, str], str] = {
    ("v0.2.0", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=37, disp=_FLEX_OLD.format(
        f="deepseek/deepseek_v3.py", a=260, p="models/deepseek/deepseek_provider.py line 76"),
        opt="line 307 use_distributed_optimizer True, line 166 use_megatron_fsdp False"),
    ("v0.3.0", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=34, disp=_FLEX_OLD.format(
        f="deepseek/deepseek_v3.py", a=267, p="models/deepseek/deepseek_provider.py line 76"),
        opt="line 314 use_distributed_optimizer True, line 190 use_megatron_fsdp False"),
    ("v0.3.1", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=39, disp="src/megatron/bridge/recipes/"
        "deepseek/deepseek_v3.py lines 105-106 and 196: hybridep flex dispatcher, the perf script keeps the "
        "preset's backend",
        opt="lines 185-186 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.4.0", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=39, disp=_FLEX_NEW.format(l="225-228"),
        opt="lines 185-186 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.4.2", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=39, disp=_FLEX_NEW.format(l="230-233"),
        opt="lines 185-186 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.5.0", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=40, disp=_FLEX_NEW.format(l="258-261"),
        opt="lines 229-230 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.5.1", "deepseekv3"): _DS_RULE.format(perf=_PERF, sel=44, disp=_FLEX_NEW.format(l="258-261"),
        opt="lines 229-230 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.6.0", "deepseekv3"): "src/megatron/bridge/recipes/deepseek/deepseek_v3.py lines 26-27 -> "
        "recipes/deepseek/h100/deepseek_v3.py lines 230-231: use_distributed_optimizer True, use_megatron_fsdp False",
    ("v0.2.0", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen3", none="33-38", disp=_FLEX_OLD.format(
        f="qwen/qwen3_moe.py", a=270, p="models/qwen/qwen_provider.py line 395"),
        opt="lines 318-319 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.3.0", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="30-35", disp=_FLEX_OLD.format(
        f="qwen/qwen3_moe.py", a=270, p="models/qwen/qwen_provider.py line 396"),
        opt="lines 318-319 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.3.1", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="30-35", disp="qwen3_llm_pretrain.py "
        "sets moe_token_dispatcher_type flex on GB300 / GB200 (lines 81, 107), alltoall on B200 / H100 (lines 159, "
        "185; the H100 preset's deepep backend is not applied: scripts/performance/utils/overrides.py @v0.3.1 applies "
        "no backend)",
        opt="lines 235-236 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.4.0", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="30-35", disp=_FLEX_NEW.format(
        l="225-228"), opt="lines 235-236 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.4.2", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="30-35", disp=_FLEX_NEW.format(
        l="230-233"), opt="lines 235-236 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.5.0", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="31-36", disp=_FLEX_NEW.format(
        l="258-261"), opt="lines 235-236 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.5.1", "qwen3235ba22b"): _QW_RULE.format(perf=_PERF, q="qwen", none="31-36", disp=_FLEX_NEW.format(
        l="258-261"), opt="lines 235-236 use_distributed_optimizer True, use_megatron_fsdp False"),
    ("v0.6.0", "qwen3235ba22b"): "src/megatron/bridge/recipes/qwen/qwen3_moe.py line 32 -> recipes/qwen/h100/"
        "qwen3_moe.py lines 330-331: use_distributed_optimizer True, use_megatron_fsdp False",
    ("v0.3.1", "kimik2"): _KIMI_RULE.format(perf=_PERF, ovr="", argp=522, muon="120-121, 196"),
    ("v0.4.0", "kimik2"): _KIMI_RULE.format(perf=_PERF, ovr=f" (and {_PERF}/utils/overrides.py lines 225-228)",
                                            argp=600, muon="123-124, 199"),
    ("v0.4.2", "kimik2"): _KIMI_RULE.format(perf=_PERF, ovr=f" (and {_PERF}/utils/overrides.py lines 230-233)",
                                            argp=607, muon="123-124, 199"),
    ("v0.5.0", "kimik2"): _KIMI_RULE.format(perf=_PERF, ovr=f" (and {_PERF}/utils/overrides.py lines 258-261)",
                                            argp=689, muon="123-124, 199"),
    ("v0.2.0", "llama31405b"): _LL_RULE.format(rule="lines 559-560 use_distributed_optimizer True, "
                                               "use_megatron_fsdp from the preset (none); no recompute"),
    ("v0.3.0", "llama31405b"): _LL_RULE.format(rule="lines 560-561 use_distributed_optimizer True, "
                                               "use_megatron_fsdp from the preset (none); no recompute"),
    **{(tag, "llama31405b"): _LL_RULE.format(rule=f"llama31_405b_pretrain_config line {a} recompute_granularity "
                                             f"None, lines {b} use_distributed_optimizer True, use_megatron_fsdp "
                                             "False") for tag, a, b in (("v0.3.1", 1156, "1181-1182"),
       ("v0.4.0", 1156, "1181-1182"), ("v0.4.2", 1156, "1181-1182"), ("v0.5.0", 1170, "1195-1196"))},
}  # fmt: skip


# EP overlap (job.moe_ep_overlap). The line of each preset's chain that sets moe_a2a_overlap (`_Preset.ep_overlap`);
# no key: no preset of the chain sets it (the WorkloadBaseConfig default False, which turns nothing on).
_A2A_OVERLAP_LINE: dict[tuple[str, str, str, str, str | None], int] = {
    ("25.11", "deepseekv3", "b200", "fp8", "mxfp8"): 70,
    ("25.11", "deepseekv3", "gb200", "bf16", None): 53,
    ("25.11", "deepseekv3", "gb200", "fp8", "mxfp8"): 53,
    ("25.11", "qwen3235ba22b", "b200", "fp8", "mxfp8"): 116,
    ("25.11", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): 143,
    ("26.02", "deepseekv3", "b200", "fp8", "mxfp8"): 113,
    ("26.02", "deepseekv3", "gb200", "fp8", "mxfp8"): 80,
    ("26.02", "qwen3235ba22b", "b200", "fp8", "mxfp8"): 152,
    ("26.02", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): 179,
    ("26.02.01", "deepseekv3", "b200", "fp8", "mxfp8"): 113,
    ("26.02.01", "deepseekv3", "gb200", "fp8", "mxfp8"): 80,
    ("26.02.01", "kimik2", "gb300", "fp8", "mxfp8"): 35,
    ("26.02.01", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): 179,
    ("26.04", "deepseekv3", "b200", "fp8", "mxfp8"): 118,
    ("26.04", "deepseekv3", "gb200", "fp8", "mxfp8"): 80,
    ("26.04", "kimik2", "gb300", "fp8", "mxfp8"): 35,
    ("26.04", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): 181,
    ("26.04.01", "deepseekv3", "b200", "fp8", "mxfp8"): 209,
    ("26.04.01", "deepseekv3", "gb200", "fp8", "mxfp8"): 80,
    ("26.04.01", "kimik2", "gb300", "fp8", "mxfp8"): 35,
    ("26.04.01", "qwen3235ba22b", "b200", "fp8", "mxfp8"): 155,
    ("26.04.01", "qwen3235ba22b", "h100-sxm", "fp8", "tensorwise"): 183,
    ("26.06", "deepseekv3", "gb200", "fp8", "mxfp8"): 102,
    ("26.06", "kimik2", "gb300", "fp8", "mxfp8"): 35,
    ("26.06", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): 232,
    ("26.06", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): 205,
    ("26.06.01", "deepseekv3", "gb200", "fp8", "mxfp8"): 102,
    ("26.06.01", "qwen3235ba22b", "gb200", "fp8", "mxfp8"): 232,
    ("26.06.01", "qwen3235ba22b", "gb300", "fp8", "mxfp8"): 205,
}
# How the perf scripts apply it at each tag: moe_a2a_overlap True sets overlap_moe_expert_parallel_comm True; False
# sets nothing (the model recipe's value stays).
_A2A_OVERRIDE: dict[str, str] = {
    "v0.2.0": f"{_PERF}/utils/helpers.py lines 76-77, 182-184",
    **{
        tag: f"{_PERF}/utils/overrides.py lines {lines}"
        for tag, lines in (
            ("v0.3.0", "148-151, 214"),
            ("v0.3.1", "149-152, 215"),
            ("v0.4.0", "150-153, 216"),
            ("v0.4.2", "155-158, 221"),
            ("v0.5.0", "165-171, 237"),
            ("v0.5.1", "165-171, 237"),
        )
    },
}
# Model recipes (the pretrain_config the perf script starts from) that set overlap_moe_expert_parallel_comm False;
# the Qwen3 recipes leave it unset (commented out from v0.3.1), DeepSeek-V3's sets it from v0.3.1.
_EP_OFF_RECIPE: dict[tuple[str, str], str] = {
    **{
        (tag, "deepseekv3"): f"src/megatron/bridge/recipes/deepseek/deepseek_v3.py line {n} "
        "(deepseek_v3_pretrain_config)"
        for tag, n in (("v0.3.1", 170), ("v0.4.0", 170), ("v0.4.2", 170), ("v0.5.0", 214), ("v0.5.1", 214))
    },
    **{
        (tag, "kimik2"): f"src/megatron/bridge/recipes/kimi/kimi_k2.py line {n} (kimi_k2_pretrain_config)"
        for tag, n in (("v0.3.1", 181), ("v0.4.0", 184), ("v0.4.2", 184), ("v0.5.0", 184))
    },
}
_EP_ON_V060 = {
    "deepseekv3": "perf_recipes/deepseek/common.py line 77 (_enable_deepseek_full_iteration_mxfp8)",
    "qwen3235ba22b": "perf_recipes/qwen/common.py line 58 (_enable_hybridep_full_iteration_mxfp8)",
}


def _ep_overlap(preset: _Preset, key: tuple[str, str, str, str, str | None], slug: str) -> tuple[bool | None, str]:
    """overlap_moe_expert_parallel_comm as the run's recipe sets it (None: the recipe does not set it) and where."""
    tag = preset.tag
    if preset.where:  # v0.6.0: the flat recipe sets it itself
        assert preset.ep_overlap is True, key
        return True, f"src/megatron/bridge/{_EP_ON_V060[slug]} @{tag} overlap_moe_expert_parallel_comm True"
    line = _A2A_OVERLAP_LINE.get(key)
    assert (line is None) == (preset.ep_overlap is None), key
    stated = (f"{preset.name} line {line} moe_a2a_overlap {preset.ep_overlap}" if line
              else f"no preset of {preset.name}'s chain sets moe_a2a_overlap")  # fmt: skip
    off = _EP_OFF_RECIPE.get((tag, slug))
    rule = f"{_A2A_OVERRIDE[tag]} (moe_a2a_overlap True -> overlap_moe_expert_parallel_comm True; False sets nothing)"
    if preset.ep_overlap:
        return True, f"{stated}, applied by {rule} @{tag}"
    recipe = f"{off} overlap_moe_expert_parallel_comm False" if off else "the model recipe does not set it"
    if preset.ep_overlap is False or off:
        return False, f"{stated}; {recipe}; {rule} @{tag}"
    return None, f"{stated}, {recipe} @{tag}"


def _recipe_fill(rec: dict[str, Any], release: str, slug: str, filled: Counter[str]) -> None:
    """State in `rec` the fields of the run-record format its release's recipe sets (`BRIDGE_PRESETS`), where the
    record's published degrees are the preset's; say in its source what was filled and from where, or why not."""
    job, lay = rec["job"], rec["layout"]
    key = (release, slug, rec["cluster"]["gpu"], job["precision"], job.get("fp8_recipe"))
    preset = BRIDGE_PRESETS.get(key)
    if preset is None:
        filled["no recipe for the release"] += 1
        rec["source"] += "; recipe fill: none (no preset of this release for the run)"
        return
    tag = preset.tag
    where = preset.where or f"{_PERF}/configs/{_PRESET_FILES[slug][tag != 'v0.2.0']}"
    cite = f"Megatron-Bridge {where} @{tag} {preset.name} (lines {preset.lines})"
    published = (lay["tp"], lay["pp"], lay["cp"], None if lay["vp"] == 1 else lay["vp"], lay.get("ep") or 1,
                 lay["micro_batch"])  # fmt: skip
    if published != preset.degrees:
        filled["published degrees not the preset's: left as published"] += 1
        rec["source"] += (f"; recipe fill: none, the run's (tp, pp, cp, vp, ep, mbs) {published} are not the preset's "
                          f"{preset.degrees} ({cite})")  # fmt: skip
        return
    said = []
    if preset.dispatcher is not None:
        job["moe_dispatcher"] = preset.dispatcher
        said.append(f"job.moe_dispatcher {preset.dispatcher}")
    if preset.recompute_modules:
        lay["recompute"], lay["recompute_modules"] = "selective", list(preset.recompute_modules)
        said.append(f"layout.recompute selective {'+'.join(preset.recompute_modules)}")
    else:
        lay["recompute"] = "none"
        said.append("layout.recompute none")
    if slug == "kimik2":  # Muon's layer-wise distributed optimizer: not one of the format's shardings, left null
        job["optimizer"] = "muon"
        said.append("job.optimizer muon")
        if job.get("fp8_recipe") == "mxfp8":
            job["fp8_param_gather"] = False
            said.append("job.fp8_param_gather false")
    elif lay["sharding"] is None and not preset.fsdp:
        lay["sharding"] = "zero1"
        said.append("layout.sharding zero1")
    overlap = ""
    if preset.dispatcher is not None:  # MoE: EP overlap as the recipe sets it, unstated where it does not
        on, where = _ep_overlap(preset, key, slug)
        if on is None:
            overlap = f"; job.moe_ep_overlap left unstated, overlap_moe_expert_parallel_comm not set: {where}"
        else:
            job["moe_ep_overlap"] = on
            said.append(f"job.moe_ep_overlap {str(on).lower()}")
            overlap = f"; job.moe_ep_overlap {str(on).lower()} from {where}"
    unstated = [f"pipeline layout {preset.pp_layout} (not the tool's stage split)"] if preset.pp_layout else []
    filled[f"filled ({', '.join(s.split(' ')[0] for s in said)})"] += 1
    rec["source"] += (f"; recipe fill: {', '.join(said)} from {cite} and {_BRIDGE_RULES[(tag, slug)]} @{tag}"
                      + overlap + (f"; the recipe also sets, not in the run-record format: {'; '.join(unstated)}"
                         if unstated else ""))  # fmt: skip


_TT_H100 = {"gpu": "h100-sxm", "gpus_per_node": 8, "nvlink_domain": 8, "inter_node_gbps_per_gpu": 400}
_TT_NOTE = ("Grand Teton H100: 96 GB HBM2e at 2.4 TB/s, 500 W power limit (the source); the h100-sxm preset is "
            "80 GB HBM3 at 3.35 TB/s, 700 W: slower hardware than the preset")  # fmt: skip
_DOC_2412 = f"pytorch/torchtitan@{TITAN_COMMIT[:8]} benchmarks/llama3_h100_202412_torchtitan.md"
_DOC_2506 = f"pytorch/torchtitan@{TITAN_COMMIT[:8]} benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
_DOC_H200 = f"pytorch/torchtitan@{TITAN_COMMIT[:8]} benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md"
_SEQ_9DEC = "seq_len 8192: train_configs/llama3_{m}.toml @9dec370 (the torchtitan commit the document names)"
_SEQ_8205 = "seq_len 8192: torchtitan/models/llama3/train_configs/llama3_{m}.toml @820504e (the commit named)"
_SEQ_E7C0 = "seq_len 8192: torchtitan/models/llama3/train_configs/llama3_8b.toml @e7c0cae (the commit named)"

# (id, source, model, gpus, seq_len, global_batch, precision, fp8_recipe, tp, pp, cp, vp, micro_batch, recompute,
#  tokens/s/GPU). FSDP over the data-parallel ranks throughout (torchtitan's dp_shard); torch.compile on;
# recompute null where the source says torchtitan's per-op selective checkpointing (not Megatron's selective).
TORCHTITAN_ROWS: tuple[tuple[Any, ...], ...] = (
    ("tt-2412-llama318b-bf16-8g-t1", f"{_DOC_2412} Table 1, FSDP + torch.compile; {_SEQ_9DEC.format(m='8b')}",
     LLAMA31_8B, 8, 8192, 16, "bf16", None, 1, 1, 1, None, 2, None, 6667),
    ("tt-2412-llama318b-fp8-8g-t1", f"{_DOC_2412} Table 1, FSDP + torch.compile + Float8; {_SEQ_9DEC.format(m='8b')}",
     LLAMA31_8B, 8, 8192, 16, "fp8", "tensorwise", 1, 1, 1, None, 2, None, 8532),
    ("tt-2412-llama318b-fp8-8g-cp1-t2", f"{_DOC_2412} Table 2, FSDP 8, CP 1", LLAMA31_8B, 8, 32768, 8, "fp8",
     "tensorwise", 1, 1, 1, None, 1, "full", 3890),
    ("tt-2412-llama318b-fp8-8g-cp2-t2", f"{_DOC_2412} Table 2, FSDP 4, CP 2", LLAMA31_8B, 8, 65536, 4, "fp8",
     "tensorwise", 1, 1, 2, None, 1, "full", 2540),
    ("tt-2412-llama318b-fp8-8g-cp4-t2", f"{_DOC_2412} Table 2, FSDP 2, CP 4", LLAMA31_8B, 8, 131072, 2, "fp8",
     "tensorwise", 1, 1, 4, None, 1, "full", 1071),
    ("tt-2412-llama318b-fp8-8g-cp8-t2", f"{_DOC_2412} Table 2, FSDP 1, CP 8", LLAMA31_8B, 8, 262144, 1, "fp8",
     "tensorwise", 1, 1, 8, None, 1, "full", 548),
    ("tt-2412-llama318b-bf16-128g-t3", f"{_DOC_2412} Table 3, FSDP + torch.compile; {_SEQ_9DEC.format(m='8b')}",
     LLAMA31_8B, 128, 8192, 256, "bf16", None, 1, 1, 1, None, 2, None, 6514),
    ("tt-2412-llama318b-fp8-128g-t3", f"{_DOC_2412} Table 3, FSDP + torch.compile + Float8; "
     f"{_SEQ_9DEC.format(m='8b')}", LLAMA31_8B, 128, 8192, 256, "fp8", "tensorwise", 1, 1, 1, None, 2, None, 8380),
    ("tt-2412-llama3170b-fp8-256g-t4", f"{_DOC_2412} Table 4, 2D + AsyncTP; {_SEQ_9DEC.format(m='70b')}",
     LLAMA31_70B, 256, 8192, 512, "fp8", "tensorwise", 8, 1, 1, None, 16, "full", 876),
    ("tt-2412-llama31405b-fp8-512g-1f1b-t5", f"{_DOC_2412} Table 5, 1F1B; {_SEQ_9DEC.format(m='405b')}",
     LLAMA31_405B, 512, 8192, 256, "fp8", "tensorwise", 8, 8, 1, 1, None, "full", 100),
    ("tt-2412-llama31405b-fp8-512g-i1f1b-t5", f"{_DOC_2412} Table 5, Interleaved 1F1B; "
     f"{_SEQ_9DEC.format(m='405b')}", LLAMA31_405B, 512, 8192, 256, "fp8", "tensorwise", 8, 8, 1, None, None, "full",
     128),
    ("tt-2412-llama31405b-fp8-512g-cp1-t6", f"{_DOC_2412} Table 6, FSDP 8, CP 1", LLAMA31_405B, 512, 32768, 64, "fp8",
     "tensorwise", 8, 8, 1, 1, None, "full", 76),
    ("tt-2412-llama31405b-fp8-512g-cp2-t6", f"{_DOC_2412} Table 6, FSDP 4, CP 2", LLAMA31_405B, 512, 65536, 32, "fp8",
     "tensorwise", 8, 8, 2, 1, None, "full", 47),
    ("tt-2412-llama31405b-fp8-512g-cp4-t6", f"{_DOC_2412} Table 6, FSDP 2, CP 4", LLAMA31_405B, 512, 131072, 16,
     "fp8", "tensorwise", 8, 8, 4, 1, None, "full", 31),
    ("tt-2412-llama31405b-fp8-512g-cp8-t6", f"{_DOC_2412} Table 6, FSDP 1, CP 8", LLAMA31_405B, 512, 262144, 8, "fp8",
     "tensorwise", 8, 8, 8, 1, None, "full", 16),
    ("tt-2506-llama3170b-bf16-256g", f"{_DOC_2506} Llama3 70b table, None (bfloat16), Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='70b')}", LLAMA31_70B, 256, 8192, 512, "bf16", None, 8, 1, 1, None, 16, "full", 652.4),
    ("tt-2506-llama3170b-fp8-256g", f"{_DOC_2506} Llama3 70b table, float8 tensorwise, Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='70b')}", LLAMA31_70B, 256, 8192, 512, "fp8", "tensorwise", 8, 1, 1, None, 16, "full",
     942.4),
    ("tt-2506-llama3170b-fp8rowwise-256g", f"{_DOC_2506} Llama3 70b table, float8 rowwise, Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='70b')}", LLAMA31_70B, 256, 8192, 512, "fp8", "rowwise", 8, 1, 1, None, 16, "full", 624.8),
    ("tt-2506-llama318b-bf16-64g", f"{_DOC_2506} Llama3 8b table, None (bfloat16), Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='8b')}", LLAMA31_8B, 64, 8192, 96, "bf16", None, 8, 1, 1, None, 12, None, 4809.4),
    ("tt-2506-llama318b-fp8-64g", f"{_DOC_2506} Llama3 8b table, float8 tensorwise, Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='8b')}", LLAMA31_8B, 64, 8192, 96, "fp8", "tensorwise", 8, 1, 1, None, 12, None, 5570.1),
    ("tt-2506-llama318b-fp8rowwise-64g", f"{_DOC_2506} Llama3 8b table, float8 rowwise, Async TP tokens/sec; "
     f"{_SEQ_8205.format(m='8b')}", LLAMA31_8B, 64, 8192, 96, "fp8", "rowwise", 8, 1, 1, None, 12, None, 3914.9),
    ("tt-2506h200-llama318b-fp8-32g", f"{_DOC_H200} Results, NUM_NODES 4; {_SEQ_E7C0}", LLAMA31_8B, 32, 8192, 64,
     "fp8", "tensorwise", 1, 1, 1, None, 2, None, 10938),
    ("tt-2506h200-llama318b-fp8-64g", f"{_DOC_H200} Results, NUM_NODES 8; {_SEQ_E7C0}", LLAMA31_8B, 64, 8192, 128,
     "fp8", "tensorwise", 1, 1, 1, None, 2, None, 10753),
)  # fmt: skip


def torchtitan_records() -> list[dict[str, Any]]:
    out = []
    for rid, source, model, gpus, seq, gbs, precision, recipe, tp, pp, cp, vp, mbs, recompute, tps in TORCHTITAN_ROWS:
        h200 = "h200" in rid
        cluster = {**_TT_H100, "gpu": "h200"} if h200 else dict(_TT_H100)
        job: dict[str, Any] = {"seq_len": seq, "global_batch": gbs, "precision": precision}
        if recipe:
            job["fp8_recipe"] = recipe
        rec: dict[str, Any] = {
            "id": rid, "source": source, "model": dict(model), "cluster": {**cluster, "gpus": gpus}, "job": job,
            "framework": "torchtitan",
            "layout": {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "vp": vp, "micro_batch": mbs,
                       "sharding": "fsdp", "recompute": recompute, "sequence_parallel": None},
            "measured": {"tokens_per_s_per_gpu": float(tps), "derived_from": "tokens_per_s"},
        }  # fmt: skip
        if not h200:
            rec["hardware_note"] = _TT_NOTE
        out.append(rec)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bridge_git_dir")
    parser.add_argument("--out", default=str(HERE / "external_runs.jsonl"))
    args = parser.parse_args()
    bridge, skipped, filled = bridge_rows(args.bridge_git_dir)
    records = bridge + torchtitan_records()
    ids = Counter(r["id"] for r in records)
    for rec in records:  # the same setup twice in one release (another global batch): name the batch
        if ids[rec["id"]] > 1:
            rec["id"] += f"-gbs{rec['job']['global_batch']}"
    assert len({r["id"] for r in records}) == len(records), "duplicate ids"
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} records ({len(bridge)} Megatron-Bridge, {len(records) - len(bridge)} torchtitan) -> "
          f"{args.out}")  # fmt: skip
    for why, n in sorted(skipped.items()):
        print(f"  left out {n:3d}: {why}")
    for what, n in sorted(filled.items()):
        print(f"  recipe {n:3d}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
