"""What the library entry points accept as a model: a preset name, a Hugging Face config.json, a dict of
shape fields, or a ModelSpec."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optlayout.presets import model_from_hf_config, model_preset
from optlayout.specs import ModelSpec

ModelInput = str | Path | ModelSpec | Mapping[str, Any]


def resolve_model(model: ModelInput) -> ModelSpec:
    """A preset name, a path to a Hugging Face config.json, a dict of shape fields, or a ModelSpec."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec(**model)
    text = str(model)
    if text.endswith(".json") or Path(text).is_file():
        return model_from_hf_config(text)
    return model_preset(text)
