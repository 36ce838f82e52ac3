"""The solver's answer as data: a versioned, JSON-serializable Plan for launch tooling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, Field, PrivateAttr

from optlayout.conditions.goodput import FailureSpec, LayoutCheckpointing, StorageSpec
from optlayout.conditions.stragglers import StragglerPrediction
from optlayout.cost import Prediction
from optlayout.errors import InfeasibleError, InputError, describe_validation_error
from optlayout.inputs.limits import MAX_GPUS
from optlayout.inputs.readers import PLAN
from optlayout.runs.uncertainty import PredictionSupport
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec

SCHEMA_VERSION = 1
"""Fields added since version 1 (objective, goodput, straggler, re-planning) are optional with defaults, so
version-1 plans written before them still load and the version did not change."""


class PlannedLayout(BaseModel):
    """One ranked layout with its full prediction (the cost model's, unchanged by run conditions), and what
    the run conditions make of it: checkpointing and goodput, a straggler slowdown."""

    rank: int
    layout: Layout
    prediction: Prediction
    goodput: LayoutCheckpointing | None = None
    straggler: StragglerPrediction | None = None
    support: PredictionSupport | None = Field(
        None, description="interval of tokens/s/GPU from the calibration's held-out errors; unsupported regimes"
    )
    _context: tuple[ModelSpec, JobSpec, int] | None = PrivateAttr(default=None)

    def _plan_context(self) -> tuple[ModelSpec, JobSpec, int]:
        if self._context is None:
            raise InputError("plan: this layout is not attached to a plan (take it from Plan.layouts)")
        return self._context

    def emit(self, fmt: str, **options: Any) -> str:
        """Launcher output for this layout: megatron | torchtitan | deepspeed | accelerate | mesh | ranks."""
        from optlayout.emit import emit

        model, job, gpus_per_node = self._plan_context()
        return emit(fmt, model, job, self.layout, gpus_per_node, **options)

    def to_megatron_args(self) -> list[str]:
        """Megatron-LM command-line arguments, one token per item."""
        from optlayout.emit import megatron_args

        model, job, gpus_per_node = self._plan_context()
        return megatron_args(model, job, self.layout, gpus_per_node)

    def to_torchtitan_toml(self) -> str:
        return self.emit("torchtitan", torchtitan_version="0.2.2")

    def to_deepspeed_config(self) -> dict[str, Any]:
        config: dict[str, Any] = json.loads(self.emit("deepspeed"))
        return config

    def to_accelerate_yaml(self) -> str:
        return self.emit("accelerate")

    def to_device_mesh_code(self) -> str:
        return self.emit("mesh")

    def to_rank_map(self) -> str:
        return self.emit("ranks")


class LayoutChange(BaseModel):
    """One field of the layout that differs between the plan re-planned from and the new one."""

    dim: str
    before: Any
    after: Any
    reshards_checkpoint: bool = Field(description="the saved checkpoint's shards no longer match this field")

    def text(self) -> str:
        return f"{self.dim} {_show(self.before)} -> {_show(self.after)}"


def _show(value: Any) -> str:
    return "even" if value is None else str(getattr(value, "value", value))


class Replan(BaseModel):
    """Where a re-plan came from and what changes."""

    from_gpus: int
    from_layout: Layout | None = None
    changes: list[LayoutChange] = Field(default_factory=list)

    @property
    def reshard(self) -> bool:
        return any(c.reshards_checkpoint for c in self.changes)


class Plan(BaseModel):
    """What `solve` returns: status, timing, the ranked layouts and the inputs that produced them."""

    schema_version: int = SCHEMA_VERSION
    status: str = Field(
        description="optimal | feasible (time limit hit) | unknown (time limit hit before any layout) | infeasible"
    )
    phases_s: dict[str, float] = Field(
        default_factory=dict,
        description="wall-clock seconds by phase (optlayout.timings.PHASES); not part of the answer, so never saved",
        exclude=True,
    )
    legal_layouts: int = Field(0, description="layouts of the legal space looked at")
    evaluated_layouts: int = Field(0, description="layouts the cost model evaluated (the rest proven over memory)")
    candidates: int = Field(0, description="the CP-SAT model's Booleans: evaluated layouts that can be in the top K")
    model: ModelSpec
    job: JobSpec
    topology_name: str
    gpus: int = Field(ge=1, le=MAX_GPUS)
    gpus_per_server: int = Field(ge=1, le=MAX_GPUS)
    cluster: ClusterSpec | None = None
    assumed: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="cluster fields the shorthand was not given: the value used and why"
    )
    topology_doc: dict[str, Any] | None = Field(
        None, description="the generator-form topology document the cluster came from (re-planning rebuilds it)"
    )
    objective: str = Field("mfu", description="mfu (throughput) | goodput (throughput x effective time fraction)")
    robust: bool = Field(False, description="ranked by the conservative estimate (the interval's low end)")
    failure: FailureSpec | None = None
    storage: StorageSpec | None = None
    straggler_slowdown: float = Field(0.0, description="the slowest rank's slowdown, applied to the predictions")
    replan: Replan | None = None
    layouts: list[PlannedLayout] = Field(default_factory=list)
    diagnosis: str | None = None
    notes: list[str] = Field(
        default_factory=list, description="what the predictions do not price of what the job asks (`pricing_notes`)"
    )
    allow_idle_gpus: bool = Field(False, description="layouts may leave GPUs idle (solve --allow-idle)")
    megatron_core: str | None = Field(
        None, description="the Megatron-Core release the space was kept to (solve --megatron-core); None: current"
    )
    search_limits: dict[str, int] = Field(
        default_factory=dict, description="the bounds beyond the rules the space was searched under (micro_batch, "
        "vp, cp): 'optimal' holds within them; `--max` sets them"
    )  # fmt: skip

    def model_post_init(self, _context: Any) -> None:
        for planned in self.layouts:
            planned._context = (self.model, self.job, self.gpus_per_server)

    @property
    def total_time_s(self) -> float:
        """Wall-clock seconds of every phase timed (a library solve: topology to CP-SAT; the CLI adds the rest)."""
        return sum(self.phases_s.values())

    @property
    def cpsat_time_s(self) -> float:
        """Building and solving the CP-SAT model, every top-K re-solve included."""
        return self.phases_s.get("cpsat", 0.0)

    @property
    def best(self) -> PlannedLayout:
        if not self.layouts:
            raise InfeasibleError(f"plan has no layout: {self.diagnosis or self.status}")
        return self.layouts[0]

    def layout_at(self, rank: int) -> PlannedLayout:
        """The layout ranked `rank` (1 = best); a plan without layouts (infeasible) says why it has none."""
        if not self.layouts:
            why = self.diagnosis or "no diagnosis saved"
            raise InfeasibleError(f"plan: the plan is {self.status} and holds no layout: {why}")
        if not 1 <= rank <= len(self.layouts):
            raise InputError(f"rank: the plan holds layouts 1..{len(self.layouts)}, not {rank}")
        return self.layouts[rank - 1]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a saved plan; an older schema or a hand-edited illegal layout is a one-line error."""
        raw = PLAN.json(path)
        if not isinstance(raw, dict) or "schema_version" not in raw:
            raise InputError(f"plan: {Path(path).name} is not a saved plan (no schema_version); `optlayout solve "
                             "--save PLAN.json` writes one")  # fmt: skip
        version = raw["schema_version"]
        if version != SCHEMA_VERSION:
            raise InputError(
                f"plan: schema_version {version!r} is not supported (this optlayout reads {SCHEMA_VERSION}); "
                "re-run `optlayout solve --save` to regenerate it"
            )
        try:
            plan = cls.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise InputError(describe_validation_error(exc, "plan")) from None
        from optlayout.layout import layout_problems

        for planned in plan.layouts:
            used = planned.layout.gpus
            gpus = used if plan.allow_idle_gpus and used <= plan.gpus else plan.gpus  # idle GPUs, as solved
            problems = layout_problems(plan.model, plan.job, planned.layout, gpus)
            if problems:
                raise InputError(f"plan: layout {planned.rank} is illegal: {'; '.join(problems)}")
        return plan
