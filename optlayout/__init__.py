"""optlayout: decide how to lay out large-model training over a GPU cluster.

Library entry points for launch tooling (imported lazily, so the CLI's light commands stay fast; the specs too):
`solve`, `replan`, `estimate_layout`, `explain_layout`, `Plan`, `calibrated_params` (the CLI's fitted
constants), the specs and the error classes (`OptlayoutError` and its `InputError`, `InfeasibleError`,
`UnsupportedError`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from optlayout.errors import InfeasibleError, InputError, OptlayoutError, UnsupportedError

if TYPE_CHECKING:
    from optlayout.layout.model import Layout, Recompute, Sharding
    from optlayout.specs import ClusterSpec, GpuSpec, JobSpec, ModelSpec

__version__ = "0.1.0"

_SPECS = {
    "Layout": "optlayout.layout.model",
    "Recompute": "optlayout.layout.model",
    "Sharding": "optlayout.layout.model",
    "ClusterSpec": "optlayout.specs",
    "GpuSpec": "optlayout.specs",
    "JobSpec": "optlayout.specs",
    "ModelSpec": "optlayout.specs",
}
_LAZY = {
    "solve": "optlayout.planning",
    "estimate_layout": "optlayout.planning",
    "explain_layout": "optlayout.planning",
    "estimate_run": "optlayout.planning",
    "replan": "optlayout.planning",
    "resolve_model": "optlayout.planning",
    "Plan": "optlayout.planning",
    "load_topology": "optlayout.topology",
    "resolve_cluster": "optlayout.topology",
    "model_preset": "optlayout.presets",
    "gpu_preset": "optlayout.presets",
    "calibrated_params": "optlayout.runs.calibrate",
}

__all__ = [
    "ClusterSpec",
    "GpuSpec",
    "InfeasibleError",
    "InputError",
    "JobSpec",
    "Layout",
    "ModelSpec",
    "OptlayoutError",
    "Recompute",
    "Sharding",
    "UnsupportedError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _SPECS.get(name) or _LAZY.get(name)
    if module is not None:
        return getattr(import_module(module), name)
    raise AttributeError(f"module 'optlayout' has no attribute {name!r}")
