"""Planning: the library entry points launch tooling calls, and the Plan they return.

search.py       solve, SolveRequest: the top layouts, proven optimal within the cost model
estimates.py    estimate_layout, estimate_run, explain_layout: one given layout
replanning.py   replan: a saved plan on another GPU count, and what changes
plan.py         Plan: the versioned, JSON-serializable answer
inputs.py       resolve_model: what the entry points take as a model
"""

from optlayout.planning.estimates import RunEstimate, estimate_layout, estimate_run, explain_layout
from optlayout.planning.inputs import resolve_model
from optlayout.planning.plan import Plan, PlannedLayout
from optlayout.planning.replanning import layout_changes, replan
from optlayout.planning.search import SolveRequest, solve, solve_request

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
