"""What the library entry points accept as a model: a preset name, a Hugging Face config.json, a dict of
shape fields, or a ModelSpec."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

from optlayout.errors import InputError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.presets import model_from_hf_config, model_preset
from optlayout.specs import ModelSpec

ModelInput = str | Path | ModelSpec | Mapping[str, Any]


@checked_arguments
def resolve_model(model: ModelInput) -> ModelSpec:
    """A preset name, a path to a Hugging Face config.json, a dict of shape fields, or a ModelSpec."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        try:
            return ModelSpec(**model)
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, "model")) from None
    text = str(model)
    if text.endswith(".json") or Path(text).is_file():
        return model_from_hf_config(text)
    return model_preset(text)
