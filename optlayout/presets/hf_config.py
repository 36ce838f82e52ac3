"""The types of a Hugging Face `config.json`, checked before any arithmetic on them: a count written as a string
(`"hidden_size": "4096"`), a float, a bool or a nested object is refused naming the key, never multiplied."""

from __future__ import annotations

from typing import Any

from optlayout.errors import InputError

# transformers config keys read as counts (dense, then the mixture-of-experts and attention variants)
POSITIVE = (
    "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "n_heads", "num_hidden_layers", "n_layer",
    "n_layers", "intermediate_size", "intermediate_size_mlp", "n_inner", "ffn_hidden_size", "num_key_value_heads",
    "num_query_groups", "vocab_size", "head_dim", "n_routed_experts", "num_local_experts", "num_experts",
    "num_experts_per_tok", "experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size",
    "interleave_moe_layer_step", "decoder_sparse_step", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "sliding_window", "n_group", "topk_group",
)  # fmt: skip
NON_NEGATIVE = ("n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers")
INT_LISTS = ("moe_layers", "mlp_only_layers")
TEXT = ("hidden_act", "activation_function", "_name_or_path", "model_type", "scoring_func", "topk_method")
FLAGS = ("tie_word_embeddings", "attention_bias", "use_sliding_window", "alibi")
NUMBERS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "routed_scaling_factor")  # > 0
OBJECTS = ("rope_scaling", "rope_parameters", "attn_config")
MAX_COUNT = 2**31


def check_hf_config(cfg: dict[str, Any], where: str = "model-config") -> dict[str, Any]:
    """`cfg` when every key optlayout reads has its transformers type (null means unset); `text_config`, when
    present, is checked the same way."""
    if "text_config" in cfg:
        nested = cfg["text_config"]
        if isinstance(nested, dict):
            check_hf_config(nested, f"{where}: text_config")
        elif "hidden_size" not in cfg:  # the text model's fields are read from it
            raise InputError(f"{where}: text_config must be an object, got {_shown(nested)}")
    for key in (*POSITIVE, *NON_NEGATIVE):
        value = cfg.get(key)
        if value is None:
            continue
        low = 1 if key in POSITIVE else 0
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_COUNT:
            raise InputError(f"{where}: {key} must be an integer in [{low}, 2^31], got {_shown(value)}")
    for key in INT_LISTS:
        value = cfg.get(key)
        if value is not None and not (isinstance(value, list) and all(_is_int(v) for v in value)):
            raise InputError(f"{where}: {key} must be a list of integers, got {_shown(value)}")
    freq = cfg.get("moe_layer_freq")
    if freq is not None and not ((_is_int(freq) and freq >= 1) or (isinstance(freq, list) and all(map(_is_int, freq)))):
        raise InputError(f"{where}: moe_layer_freq must be a positive integer or a list of 0/1, got {_shown(freq)}")
    types = cfg.get("layer_types")
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise InputError(f"{where}: layer_types must be a list of strings, got {_shown(types)}")
    for key in TEXT:
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            raise InputError(f"{where}: {key} must be a string, got {_shown(cfg[key])}")
    for key in FLAGS:
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise InputError(f"{where}: {key} must be true or false, got {_shown(cfg[key])}")
    for key in NUMBERS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise InputError(f"{where}: {key} must be a positive number, got {_shown(value)}")
    for key in OBJECTS:
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise InputError(f"{where}: {key} must be an object, got {_shown(cfg[key])}")
    if cfg.get("architectures") is not None and not isinstance(cfg["architectures"], list):
        raise InputError(f"{where}: architectures must be a list, got {_shown(cfg['architectures'])}")
    return cfg


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _kind(value: object) -> str:
    names = {str: "a string", list: "a list", dict: "an object", bool: "a boolean", float: "a number"}
    names[int] = "an integer"
    return names.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({_kind(value)})"
