"""GPU and model presets (data in YAML beside this file) and Hugging Face `config.json` import."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pydantic
import yaml

from optlayout.errors import InputError, UnsupportedError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.readers import MODEL_CONFIG
from optlayout.presets.hf_config import check_hf_config
from optlayout.specs import GpuSpec, ModelSpec

_HERE = Path(__file__).parent
_GIB = 2**30


@cache
def _gpu_table() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = yaml.safe_load((_HERE / "gpus.yaml").read_text())
    return table


@cache
def _model_table() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = yaml.safe_load((_HERE / "models.yaml").read_text())
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
        raise InputError(f"gpu: unknown preset {name!r}; valid: {', '.join(table)}")
    row = table[key]
    return GpuSpec(
        name=key,
        arch=row["arch"],
        memory_bytes=row["memory_gib"] * _GIB,
        peak_flops={p: float(v) * 1e12 for p, v in row["peak_tflops"].items()},
        hbm_bandwidth_Bps=float(row["hbm_tbytes_per_s"]) * 1e12,
        scale_up_bandwidth_Bps=float(row["scale_up_gbytes_per_s"]) * 1e9,
        source=row["source"],
    )


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
    }
    try:
        return ModelSpec(**fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "model-config")) from None
