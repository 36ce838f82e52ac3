"""Planning: the library entry points launch tooling calls, and the Plan they return.

search.py       solve, SolveRequest: the top layouts, proven optimal within the cost model
estimates.py    estimate_layout, estimate_run, explain_layout: one given layout
replanning.py   replan: a saved plan on another GPU count, and what changes
plan.py         Plan: the versioned, JSON-serializable answer
inputs.py       resolve_model: what the entry points take as a model

Each name loads its module on first use, so reading a saved plan or a model never imports the solver.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optlayout.planning.estimates import RunEstimate, estimate_layout, estimate_run, explain_layout
    from optlayout.planning.inputs import resolve_model
    from optlayout.planning.plan import Plan, PlannedLayout
    from optlayout.planning.replanning import layout_changes, replan
    from optlayout.planning.search import SolveRequest, solve, solve_request

_MODULES = {
    "Plan": "plan",
    "PlannedLayout": "plan",
    "RunEstimate": "estimates",
    "SolveRequest": "search",
    "estimate_layout": "estimates",
    "estimate_run": "estimates",
    "explain_layout": "estimates",
    "layout_changes": "replanning",
    "replan": "replanning",
    "resolve_model": "inputs",
    "solve": "search",
    "solve_request": "search",
}

__all__ = [
    "Plan",
    "PlannedLayout",
    "RunEstimate",
    "SolveRequest",
    "estimate_layout",
    "estimate_run",
    "explain_layout",
    "layout_changes",
    "replan",
    "resolve_model",
    "solve",
    "solve_request",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(import_module(f"optlayout.planning.{_MODULES[name]}"), name)
    raise AttributeError(f"module 'optlayout.planning' has no attribute {name!r}")
