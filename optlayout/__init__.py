"""optlayout: decide how to lay out large-model training over a GPU cluster.

Library entry points for launch tooling (imported lazily, so the CLI's light commands stay fast):
`solve`, `estimate_layout`, `explain_layout`, `Plan`, `calibrated_params` (the CLI's fitted constants), and the
specs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from optlayout.specs import ClusterSpec, GpuSpec, JobSpec, Layout, ModelSpec, Recompute, Sharding

__version__ = "0.1.0"

_LAZY = {
    "solve": "optlayout.api",
    "estimate_layout": "optlayout.api",
    "explain_layout": "optlayout.api",
    "estimate_run": "optlayout.api",
    "replan": "optlayout.replan",
    "resolve_model": "optlayout.api",
    "Plan": "optlayout.plan",
    "load_topology": "optlayout.topology",
    "resolve_cluster": "optlayout.topology",
    "model_preset": "optlayout.presets",
    "gpu_preset": "optlayout.presets",
    "calibrated_params": "optlayout.runs.calibrate",
}

__all__ = ["ClusterSpec", "GpuSpec", "JobSpec", "Layout", "ModelSpec", "Recompute", "Sharding", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optlayout' has no attribute {name!r}")
