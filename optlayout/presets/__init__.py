"""GPU and model presets (data in YAML beside this file) and Hugging Face `config.json` import.

A GPU that is not listed is described in a YAML file of the same form as `gpus.yaml` (name: arch,
memory_gib, peak_tflops, hbm_tbytes_per_s, scale_up_gbytes_per_s, source) named by the environment
variable `OPTLAYOUT_GPU_FILE`; its entries join the presets under their own names.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pydantic

from optlayout.errors import InputError, UnsupportedError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.readers import GPU_FILE, MODEL_CONFIG
from optlayout.inputs.yaml_doc import parse_yaml
from optlayout.presets.hf_config import check_hf_config
from optlayout.specs import GpuSpec, ModelSpec

_HERE = Path(__file__).parent
_GIB = 2**30


GPU_FILE_ENV = "OPTLAYOUT_GPU_FILE"
GPU_FIELDS = ("arch", "memory_gib", "peak_tflops", "hbm_tbytes_per_s", "scale_up_gbytes_per_s", "source")


@cache
def _shipped_gpus() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = parse_yaml((_HERE / "gpus.yaml").read_text(), "presets gpus.yaml")
    return table


def _gpu_table() -> dict[str, dict[str, Any]]:
    """The shipped GPU presets and those of the file `OPTLAYOUT_GPU_FILE` names (which win on a name clash)."""
    table: dict[str, dict[str, Any]] = dict(_shipped_gpus())
    extra = os.environ.get(GPU_FILE_ENV)
    if not extra:
        return table
    rows = GPU_FILE.yaml(extra)
    if not isinstance(rows, dict):
        raise InputError(f"gpu: {extra} must map GPU names to their figures, as optlayout/presets/gpus.yaml does")
    for name, row in rows.items():
        missing = [f for f in GPU_FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise InputError(f"gpu: {extra}: {name!r} lacks {', '.join(missing)}")
        table[str(name).strip().lower()] = row
    return table


@cache
def _model_table() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = parse_yaml((_HERE / "models.yaml").read_text(), "presets models.yaml")
    return table


def gpu_names() -> list[str]:
    return list(_gpu_table())


def model_names() -> list[str]:
    return list(_model_table())


@checked_arguments
def gpu_preset(name: str) -> GpuSpec:
    """A GPU preset by name (`h100-sxm`, ...); an unknown name lists the valid ones."""
    table = _gpu_table()
    key = name.strip().lower()
    if key not in table:
        raise InputError(
            f"gpu: unknown preset {name!r}; valid: {', '.join(table)}. To describe another GPU, write its "
            f"{', '.join(GPU_FIELDS)} in a YAML file shaped like optlayout/presets/gpus.yaml and set {GPU_FILE_ENV} "
            "to its path"
        )
    row = table[key]
    try:
        return GpuSpec(
            name=key,
            arch=row["arch"],
            memory_bytes=float(row["memory_gib"]) * _GIB,
            peak_flops={p: float(v) * 1e12 for p, v in row["peak_tflops"].items()},
            hbm_bandwidth_Bps=float(row["hbm_tbytes_per_s"]) * 1e12,
            scale_up_bandwidth_Bps=float(row["scale_up_gbytes_per_s"]) * 1e9,
            source=row["source"],
        )
    except (pydantic.ValidationError, TypeError, ValueError, AttributeError) as exc:
        detail = describe_validation_error(exc, f"gpu {key}") if isinstance(exc, pydantic.ValidationError) else exc
        raise InputError(f"gpu: preset {key!r} is malformed: {detail}") from None


@checked_arguments
def model_preset(name: str) -> ModelSpec:
    """A model preset by key (`llama3.1-405b`) or by its display name (`Llama 3.1 405B`)."""
    table = _model_table()
    key = name.strip().lower()
    by_name = {row["name"].lower(): k for k, row in table.items()}
    key = by_name.get(key, key)
    if key not in table:
        raise InputError(f"model: unknown preset {name!r}; valid: {', '.join(table)}")
    row = table[key]
    return ModelSpec(name=row["name"], **row["shape"])


def published_param_count(name: str) -> tuple[float | None, bool]:
    """The parameter count the authors published for a preset, and whether their label is rounded."""
    row = _model_table()[name]
    value = row.get("published_param_count")
    return (float(value) if value is not None else None), bool(row.get("published_label_rounded", False))


_HF_MLP = {
    "silu": "swiglu",
    "swiglu": "swiglu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "relu2": "relu2",
    "squared-relu": "relu2",
    "relu": "gelu",
}


def _hf_positions(cfg: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and Llama 3.1 scaling, ALiBi and the norm epsilon (v4 `rope_theta`/`rope_scaling`, v5
    `rope_parameters`); a RoPE scaling other than `llama3` is refused, not dropped."""
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    out: dict[str, Any] = {}
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if theta is not None:
        out["rope_theta"] = theta  # ModelSpec checks the types
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise UnsupportedError(f"model-config: rope_scaling type {kind!r} is not supported (only llama3)")
        out["rope_scaling"] = {
            "factor": scaling.get("factor", 8.0),
            "low_freq_factor": scaling.get("low_freq_factor", 1.0),
            "high_freq_factor": scaling.get("high_freq_factor", 4.0),
            "original_max_position": scaling.get("original_max_position_embeddings", 8192),
        }
    if cfg.get("alibi") or (cfg.get("attn_config") or {}).get("alibi") or cfg.get("model_type") == "bloom":
        out["alibi"] = True
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon")))
    if eps is not None:
        out["norm_eps"] = eps
    return out


@checked_arguments
def model_from_hf_config(source: str | Path | dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face `config.json` (transformers v4 or v5 spellings, `text_config` nesting)."""
    if isinstance(source, dict):
        cfg, label = source, name or "hf-config"
    else:
        path = Path(source)
        cfg = MODEL_CONFIG.json(path)
        label = name or path.stem
    if not isinstance(cfg, dict):
        raise InputError("model-config: expected a JSON object")
    check_hf_config(cfg)
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = cfg["text_config"]
    if any(k in cfg for k in ("num_local_experts", "n_routed_experts", "num_experts")):
        raise UnsupportedError(
            "model-config: mixture-of-experts models are not supported yet (dense transformers only)"
        )

    def pick(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is None:
            raise InputError(f"model-config: missing field {keys[0]!r}")
        return default

    hidden = pick("hidden_size", "n_embd", "d_model")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    act = str(pick("hidden_act", "activation_function", default="silu")).lower()
    mlp = _HF_MLP.get(act)
    if mlp is None:
        raise InputError(f"model-config: hidden_act {act!r} not understood (known: {', '.join(_HF_MLP)})")
    fields = {
        "name": cfg.get("_name_or_path") or label,
        "layers": pick("num_hidden_layers", "n_layer", "n_layers"),
        "hidden": hidden,
        "ffn": pick("intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden),
        "heads": heads,
        "kv_heads": pick("num_key_value_heads", "num_query_groups", default=heads),
        "vocab": pick("vocab_size"),
        "mlp": mlp,
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "head_dim": cfg.get("head_dim"),
        **_hf_positions(cfg),
    }
    try:
        return ModelSpec(**fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "model-config")) from None
