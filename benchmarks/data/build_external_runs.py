"""Build `external_runs.jsonl`: published measured pre-training runs that are not in ../shared/data, for
out-of-sample checks only (nothing is fitted to them).

Reproduce:  python benchmarks/data/build_external_runs.py BRIDGE_GIT_DIR [--out benchmarks/data/external_runs.jsonl]
BRIDGE_GIT_DIR: a clone of github.com/NVIDIA-NeMo/Megatron-Bridge holding commit `BRIDGE_COMMIT`; its tables are read
with `git show BRIDGE_COMMIT:docs/performance-summary*.md` and parsed here, so no Megatron-Bridge number is typed by
hand. The torchtitan rows (`TORCHTITAN_ROWS`) are transcribed from github.com/pytorch/torchtitan @`TITAN_COMMIT`
benchmarks/*.md, each with its table; the sequence length those tables leave out is the default of the training
config of the torchtitan commit each benchmark names (quoted per row).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

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


def bridge_rows(git_dir: str) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Every pre-training row of the Megatron-Bridge tables the tool can express, and the others counted by why."""
    out: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
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
                    out.append(rec)
    return out, skipped


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
    bridge, skipped = bridge_rows(args.bridge_git_dir)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
