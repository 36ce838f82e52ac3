"""GPU and model presets (data in YAML beside this file) and Hugging Face `config.json` import.

A GPU that is not listed is described in a YAML file of the same form as `gpus.yaml` (name: arch,
memory_gib, peak_tflops, hbm_tbytes_per_s, scale_up_gbytes_per_s, source; optionally sfu_texp_per_s and
sfu_source, sm_count and sm_source) named by the environment variable `OPTLAYOUT_GPU_FILE`; its entries join the
presets under their own names, and an entry named as a shipped preset replaces it (the CLI says so on stderr:
`replaced_presets`).
"""

from __future__ import annotations

import os
from functools import cache, partial
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


def replaced_presets() -> list[str]:
    """The shipped GPU presets the file `OPTLAYOUT_GPU_FILE` names replaces; none where it is unset or unreadable
    (reading it again reports that)."""
    extra = os.environ.get(GPU_FILE_ENV)
    if not extra:
        return []
    try:
        rows = GPU_FILE.yaml(extra)
    except (InputError, OSError):
        return []
    shipped = _shipped_gpus()
    return [key for key in (str(n).strip().lower() for n in rows) if key in shipped] if isinstance(rows, dict) else []


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
    texp = row.get("sfu_texp_per_s")
    try:
        return GpuSpec(
            name=key,
            arch=row["arch"],
            memory_bytes=float(row["memory_gib"]) * _GIB,
            peak_flops={p: float(v) * 1e12 for p, v in row["peak_tflops"].items()},
            hbm_bandwidth_Bps=float(row["hbm_tbytes_per_s"]) * 1e12,
            scale_up_bandwidth_Bps=float(row["scale_up_gbytes_per_s"]) * 1e9,
            sfu_exp_per_s=None if texp is None else float(texp) * 1e12,
            sm_count=row.get("sm_count"),
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


def published_figures(name: str) -> dict[str, Any]:
    """Everything models.yaml records as published for a preset (its `published_*` keys, prefix dropped; counts
    as floats: YAML 1.1 reads `671.0e9` as text)."""
    row = _model_table()[name]
    return {
        k.removeprefix("published_"): float(v) if k.endswith("param_count") and v is not None else v
        for k, v in row.items()
        if k.startswith("published_")
    }


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
    """RoPE base and Llama 3.1 scaling, ALiBi, the norm and its epsilon (v4 `rope_theta`/`rope_scaling`, v5
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
    if cfg.get("rms_norm_eps") is not None:  # the config class names its norm by its epsilon's key
        out["norm"] = "rmsnorm"
    elif eps is not None or cfg.get("model_type") == "nemotron":  # NemotronConfig: LayerNorm1P, `norm_eps`
        out["norm"] = "layernorm"
    return out


@checked_arguments
def model_from_hf_config(source: str | Path | dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face `config.json` (transformers v4 or v5 spellings, `text_config` nesting).

    Dense configs, and the MoE config classes DeepseekV3Config (Kimi K2 too), Qwen3MoeConfig, GptOssConfig,
    MixtralConfig and Llama4Config: experts, top-k, expert and shared-expert widths, which layers are MoE,
    multi-latent attention, sliding windows, sinks and MTP modules. Llama 4's chunked attention is not modelled.
    """
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
    kind = str(cfg.get("model_type", "")).lower()
    if "grok" in kind or any("grok" in str(a).lower() for a in cfg.get("architectures") or []):
        raise InputError("model-config: Grok-1 has no config class in transformers (xai-org/grok-1 ships JAX "
                             "code and run.py); use the grok-1 preset")  # fmt: skip

    pick = partial(_pick, cfg)
    hidden = pick("hidden_size", "n_embd", "d_model")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    act = str(pick("hidden_act", "activation_function", default="silu")).lower()
    mlp = _HF_MLP.get(act)
    if mlp is None:
        raise InputError(f"model-config: hidden_act {act!r} not understood (known: {', '.join(_HF_MLP)})")
    layers = pick("num_hidden_layers", "n_layer", "n_layers")
    attention = _hf_attention(cfg, kind)
    fields = {
        "name": cfg.get("_name_or_path") or label,
        "layers": layers,
        "hidden": hidden,
        "ffn": pick("intermediate_size_mlp", "intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden),
        "heads": heads,
        "kv_heads": pick("num_key_value_heads", "num_query_groups", default=heads),
        "vocab": pick("vocab_size"),
        "mlp": mlp,
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "head_dim": None if attention.get("kind") == "mla" else cfg.get("head_dim"),
        "attention": attention,
        "moe": _hf_moe(cfg, kind, layers),
        "mtp_layers": cfg.get("num_nextn_predict_layers") or 0,
        **_hf_positions(cfg),
    }
    if kind == "gpt_oss":  # GptOssConfig: attention (attention_bias), router and experts carry biases; RMSNorm
        fields |= {"bias": bool(cfg.get("attention_bias", True)), "norm": "rmsnorm"}
    try:
        return ModelSpec(**fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "model-config")) from None


def _pick(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """The first of `keys` the config sets; `default`, or a one-line error naming the first key."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is None:
        raise InputError(f"model-config: missing field {keys[0]!r}")
    return default


_HF_EXPERT_COUNT = ("n_routed_experts", "num_local_experts", "num_experts")  # DeepSeek; Mixtral, GPT-OSS, Llama 4; Qwen


def _hf_moe(cfg: dict[str, Any], kind: str, layers: int) -> dict[str, Any] | None:
    """The `moe` block of a ModelSpec from an MoE config class; None for a dense config."""
    experts = next((cfg[k] for k in _HF_EXPERT_COUNT if cfg.get(k)), None)
    if experts is None:
        return None
    moe: dict[str, Any] = {
        "experts": experts,
        "top_k": _pick(cfg, "num_experts_per_tok", "experts_per_token"),
        "expert_ffn": _pick(cfg, "moe_intermediate_size", "intermediate_size"),
    }
    if cfg.get("n_shared_experts"):  # DeepseekV3Config: shared experts as wide as a routed one
        moe["shared_experts"] = cfg["n_shared_experts"]
    elif cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE style: one shared expert of its own width
        moe |= {"shared_experts": 1, "shared_expert_ffn": cfg["shared_expert_intermediate_size"]}
    elif kind.startswith("llama4"):  # Llama4TextMoe: one shared expert of intermediate_size, sigmoid router scores
        moe |= {"shared_experts": 1, "router_score": "sigmoid"}
    if "first_k_dense_replace" in cfg or "n_routed_experts" in cfg:  # DeepseekV3Config (+ remote code's freq)
        moe["dense_layers"] = cfg.get("first_k_dense_replace") or 0
        moe["layer_freq"] = cfg.get("moe_layer_freq") or 1
        moe["router_bias"] = cfg.get("topk_method", "noaux_tc") == "noaux_tc"  # V3's e_score_correction_bias
        # its sigmoid scores and group-limited top-k, with DeepseekV3Config's defaults (8 groups of which 4, x2.5)
        score = cfg.get("scoring_func") or "sigmoid"  # DeepSeek-V2's configs say softmax
        moe |= {"router_score": score, "router_scaling": cfg.get("routed_scaling_factor") or 2.5}
        groups = cfg.get("n_group", 8) or 1  # DeepseekV2Config's default is null: no group limit
        if groups > 1:
            moe |= {"router_groups": groups, "router_group_top_k": cfg.get("topk_group") or 4}
    else:
        flags = _hf_moe_layer_flags(cfg, layers)
        if not all(flags):
            moe["layer_freq"] = [int(f) for f in flags]
    if kind == "gpt_oss":
        moe["router_bias"] = True  # GptOssTopKRouter has a bias
    return moe


def _hf_moe_layer_flags(cfg: dict[str, Any], layers: int) -> list[bool]:
    """Which layers are MoE: Llama4TextConfig's moe_layers / interleave_moe_layer_step, Qwen3MoeConfig's
    decoder_sparse_step (layer i when (i + 1) % step == 0) and mlp_only_layers; otherwise every layer."""
    if cfg.get("moe_layers") is not None:
        chosen = set(cfg["moe_layers"])
        return [i in chosen for i in range(layers)]
    if cfg.get("interleave_moe_layer_step"):
        step = cfg["interleave_moe_layer_step"]
        return [i in range(step - 1, layers, step) for i in range(layers)]
    step, dense = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or [])
    return [(i + 1) % step == 0 and i not in dense for i in range(layers)]


def _hf_attention(cfg: dict[str, Any], kind: str) -> dict[str, Any]:
    """The `attention` block: multi-latent (DeepseekV3Config's LoRA ranks), sliding windows, GPT-OSS's sinks, Qwen3's
    query/key norms."""
    att: dict[str, Any] = {}
    if cfg.get("kv_lora_rank"):
        att = {"kind": "mla", "q_lora_rank": cfg.get("q_lora_rank"), "kv_lora_rank": cfg["kv_lora_rank"],
               "qk_head_dim": _pick(cfg, "qk_nope_head_dim"), "qk_rope_head_dim": _pick(cfg, "qk_rope_head_dim"),
               "v_head_dim": _pick(cfg, "v_head_dim")}  # fmt: skip
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if window and isinstance(types, list) and "sliding_attention" in types:
        att |= {"sliding_window": window, "sliding_window_layers": [int(t == "sliding_attention") for t in types]}
    elif window and cfg.get("use_sliding_window", True) and not isinstance(types, list):
        att["sliding_window"] = window  # Mistral/Mixtral style: every layer (Qwen sets use_sliding_window false)
    if kind == "gpt_oss":
        att["sinks"] = True  # GptOssAttention has one learned sink per head
    if kind in ("qwen3", "qwen3_moe"):
        att["qk_norm"] = True  # Qwen3Attention's q_norm and k_norm (RMSNorm over head_dim)
    return att
