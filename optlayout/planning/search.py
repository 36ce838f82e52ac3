"""`solve`: the top layouts of a model on a cluster, proven optimal within the cost model; `SolveRequest`,
the validated request that solve and re-planning send down one pipeline (`solve_request`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optlayout.conditions.goodput import (
    OBJECTIVES,
    FailureSpec,
    GoodputModel,
    StorageSpec,
    failure_spec,
    storage_spec,
)
from optlayout.conditions.stragglers import check_straggler, with_straggler
from optlayout.cost import DEFAULT_PARAMS, CostParams, pricing_notes
from optlayout.errors import InfeasibleError, InputError
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.limits import MAX_TOP
from optlayout.layout.megatron_core import flag_problems, space_limits, version_text
from optlayout.layout.recompute import parse_modules
from optlayout.planning.inputs import ModelInput, resolve_model
from optlayout.planning.plan import Plan, PlannedLayout
from optlayout.runs.uncertainty import LayoutUncertainty, Uncertainty
from optlayout.solver.candidates import passes_limits, throughput_scale, top_k_skyline
from optlayout.solver.diagnose import diagnose_empty_space, diagnose_no_fit
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions, describe_limits, search_limits, space_options
from optlayout.specs import ClusterSpec, JobSpec, ModelSpec
from optlayout.timings import PhaseClock
from optlayout.topology import LoadedCluster, Topology, load_cluster

ClusterInput = str | Path | ClusterSpec | Topology | LoadedCluster


def failure_input(value: FailureSpec | Mapping[str, Any] | None) -> FailureSpec | None:
    """A FailureSpec from itself or a dict of its fields."""
    return failure_spec(**value) if isinstance(value, Mapping) else value


def storage_input(value: StorageSpec | Mapping[str, Any] | None) -> StorageSpec | None:
    """A StorageSpec from itself or a dict of its fields."""
    return storage_spec(**value) if isinstance(value, Mapping) else value


def check_run_conditions(failure: FailureSpec | None, storage: StorageSpec | None) -> None:
    if (failure is None) != (storage is None):
        raise InputError("goodput: failure and storage go together (an MTBF and a storage bandwidth)")


def refuse_unrunnable(model: ModelSpec, job: JobSpec, options: SpaceOptions) -> None:
    """Refuse, naming the flags, a model, job or pinned module set that `options.megatron_core` cannot run whatever
    the layout (the space leaves out the layouts it cannot run)."""
    from optlayout.emit.megatron import release_problems

    version = options.megatron_core
    if version is None:
        return
    problems = release_problems(model, job, version)
    modules = options.pins.get("recompute_modules")
    if modules is not None:
        problems += flag_problems(["--recompute-modules", *(m.value for m in parse_modules(modules))], version)
    if problems:
        raise InputError(f"{'; '.join(problems)}: not runnable on the Megatron-Core asked for "
                         f"({version_text(version)})")  # fmt: skip


@dataclass(frozen=True)
class SolveRequest:
    """One solve, validated: the problem (model, job, topology, constants, space) and what to return."""

    problem: Problem
    top: int = 1
    time_limit_s: float = 10.0
    objective: str = "mfu"
    failure: FailureSpec | None = None
    storage: StorageSpec | None = None
    straggler_slowdown: float = 0.0
    uncertainty: LayoutUncertainty | None = None  # set: every layout carries its interval and support

    @classmethod
    def make(
        cls,
        model: ModelInput,
        topology: Topology,
        job: JobSpec,
        *,
        top: int = 1,
        pins: Mapping[str, object] | None = None,
        maxima: Mapping[str, object] | None = None,
        exclude: Mapping[str, list[object]] | None = None,
        params: CostParams = DEFAULT_PARAMS,
        time_limit_s: float = 10.0,
        objective: str = "mfu",
        failure: FailureSpec | Mapping[str, Any] | None = None,
        storage: StorageSpec | Mapping[str, Any] | None = None,
        straggler_slowdown: float = 0.0,
        switches: Mapping[str, Any] | None = None,
        uncertainty: Uncertainty | None = None,
        robust: bool = False,
    ) -> SolveRequest:
        """Check the request field by field (one-line errors naming the field) and build its problem."""
        spec = resolve_model(model)
        fail, store = failure_input(failure), storage_input(storage)
        if not 0 < time_limit_s < math.inf:
            raise InputError(f"time-limit: must be a finite number of seconds > 0 (got {time_limit_s})")
        if not 1 <= top <= MAX_TOP:
            raise InputError(f"top: must be 1 to {MAX_TOP} (got {top})")
        if objective not in OBJECTIVES:
            raise InputError(f"objective: must be one of {', '.join(OBJECTIVES)} (got {objective!r})")
        if objective == "goodput" and (fail is None or store is None):
            need = (("failure (an MTBF)", fail), ("storage (a write bandwidth)", store))
            missing = " and ".join(name for name, value in need if value is None)
            raise InputError(f"objective goodput: needs {missing} to price checkpoints and failures")
        check_run_conditions(fail, store)
        if robust and uncertainty is None:
            raise InputError("robust: needs a calibration with held-out errors (`uncertainty`, written by "
                             "`optlayout calibrate` since calibration schema 2)")  # fmt: skip
        layout_uncertainty = None
        if uncertainty is not None:
            layout_uncertainty = LayoutUncertainty.on(uncertainty, spec, job, topology.gpu.name)
        slowdown = check_straggler(straggler_slowdown)
        options = space_options(pins, maxima, exclude, **(switches or {}))
        refuse_unrunnable(spec, job, options)
        goodput = None
        if fail is not None and store is not None:
            goodput = GoodputModel(spec, job, fail, store, topology.gpus_per_server)
        problem = Problem(spec, job, topology, params, options, goodput if objective == "goodput" else None,
                          layout_uncertainty if robust else None)  # fmt: skip
        return cls(problem, top, time_limit_s, objective, fail, store, slowdown, layout_uncertainty)

    @property
    def options(self) -> SpaceOptions:
        return self.problem.options

    def goodput_model(self) -> GoodputModel | None:
        """The run conditions' model: the problem's (goodput objective), or one for reporting goodput."""
        if self.problem.goodput is not None or self.failure is None or self.storage is None:
            return self.problem.goodput
        p = self.problem
        return GoodputModel(p.model, p.job, self.failure, self.storage, p.topology.gpus_per_server)


@checked_arguments
def solve(
    model: ModelInput,
    cluster: ClusterInput,
    job: JobSpec,
    *,
    top: int = 1,
    pins: Mapping[str, object] | None = None,
    maxima: Mapping[str, object] | None = None,
    exclude: Mapping[str, list[object]] | None = None,
    params: CostParams = DEFAULT_PARAMS,
    time_limit_s: float = 10.0,
    objective: str = "mfu",
    failure: FailureSpec | Mapping[str, Any] | None = None,
    storage: StorageSpec | Mapping[str, Any] | None = None,
    straggler_slowdown: float = 0.0,
    uncertainty: Uncertainty | None = None,
    robust: bool = False,
    **switches: Any,
) -> Plan:
    """The `top` layouts with the highest predicted throughput (objective "mfu") or goodput (objective
    "goodput": throughput x the effective time fraction left by checkpoints and failures), proven optimal
    within the cost model.

    `cluster` is a topology file, a shorthand string (`gpu=h100-sxm,gpus=64`), a ClusterSpec or a Topology.
    `failure` and `storage` (FailureSpec/StorageSpec or dicts of their fields) are required by the goodput
    objective; given with "mfu" they only add each layout's goodput to the plan. `straggler_slowdown` s
    (0.02 = the slowest rank 2% slower) divides every layout's throughput by 1 + s in the reported
    `straggler` figures; it never changes the order.
    `uncertainty` (a calibration's, `Calibration.uncertainty`) adds each layout's `support`: its 10th-90th
    percentile interval of tokens/s/GPU from the calibration's held-out errors and the regimes no calibration run
    covers; with `robust`, layouts rank by that interval's low end (the conservative estimate) instead.
    Switches: allow_tp_beyond_domain, allow_idle_gpus, max_micro_batch, max_vp, max_cp, max_bubble_fraction,
    megatron_core (a release, `parse_megatron_core`: only the layouts it runs).
    """
    clock = PhaseClock()
    with clock.phase("parse"):
        spec = resolve_model(model)
    with clock.phase("topology"):
        loaded = load_cluster(cluster)
    request = SolveRequest.make(
        spec, loaded.topology, job, top=top, pins=pins, maxima=maxima, exclude=exclude, params=params,
        time_limit_s=time_limit_s, objective=objective, failure=failure, storage=storage,
        straggler_slowdown=straggler_slowdown, switches=switches, uncertainty=uncertainty, robust=robust,
    )  # fmt: skip
    plan = solve_request(request, clock)
    return plan.model_copy(
        update={"cluster": loaded.shorthand, "topology_doc": loaded.generator_doc, "assumed": loaded.assumed}
    )


def solve_request(request: SolveRequest, clock: PhaseClock | None = None) -> Plan:
    """The pipeline: enumerate and evaluate (with the exact reductions), solve CP-SAT, diagnose an empty answer,
    add the run conditions to each layout. `clock` (the caller's phases so far) gets this solve's phases."""
    clock = clock if clock is not None else PhaseClock()
    with clock.phase("parse"):  # OR-Tools loads only for a solve (not for an estimate)
        from optlayout.solver.cpsat import solve_top_k

    problem, top = request.problem, request.top
    limits, topo = problem.limits, problem.topology
    with clock.phase("enumeration"):
        space = problem.nodes()
    evaluated, legal = problem.table.evaluated_candidates(space, limits, k=top, clock=clock)
    with clock.phase("reductions"):
        # the objective's scale: the best feasible throughput, the same the CP-SAT model derives from its booleans
        scale = throughput_scale([c for c in evaluated if passes_limits(c, limits)] or evaluated)
        candidates = top_k_skyline(evaluated, top, scale)
    with clock.phase("cpsat"):
        result = solve_top_k(candidates, limits, top_k=top, time_limit_s=request.time_limit_s)
    diagnosis = None
    if result.status == "unknown":
        diagnosis = (f"time limit: the {request.time_limit_s:g} s time limit ran out before CP-SAT found a layout or "
                     "proved there is none (status unknown, not infeasible); raise --time-limit")  # fmt: skip
    elif not result.ranked:
        if legal:  # the memory of every layout, to say how far the closest one is
            with clock.phase("cost_tables"):
                least = problem.table.least_memory(problem.groups())
                assert least is not None
                diagnosis = diagnose_no_fit(problem.table.candidate(least), problem.capacity_bytes, topo.num_gpus)
        else:
            diagnosis = diagnose_empty_space(problem.model, problem.job, topo.num_gpus, topo.domain_size,
                                             problem.options)  # fmt: skip
            diagnosis += f" (searched {describe_limits(search_limits(problem.options))}; --max raises them)"
        if problem.options.megatron_core is not None:  # what the release leaves out may be why nothing fits
            left_out = ", ".join(space_limits(problem.options.megatron_core)) or "nothing left out"
            diagnosis += f"; with what Megatron-Core {version_text(problem.options.megatron_core)} runs: {left_out}"
    version = problem.options.megatron_core
    with clock.phase("output"):  # the answer: predictions and run conditions of the layouts found
        gm = request.goodput_model()
        slowdown = request.straggler_slowdown
        planned = []
        for i, c in enumerate(result.ranked):
            straggler = with_straggler(c.prediction, slowdown) if slowdown > 0 else None
            ckpt = None
            if gm is not None:
                tps = straggler.tokens_per_s_per_gpu if straggler is not None else c.prediction.tokens_per_s_per_gpu
                ckpt = gm.estimate(c.layout).with_throughput(tps)
                if i == 0 and ckpt.problem is not None:
                    raise InfeasibleError(
                        f"goodput: {ckpt.problem} ({ckpt.checkpoint_bytes / 1e9:.3g} GB of weights and optimizer state "
                        f"per checkpoint, {ckpt.write_s / 60:.3g} min to write at the given storage bandwidth)"
                    )
            lu = request.uncertainty
            support = lu.support(c.layout, c.prediction.tokens_per_s_per_gpu) if lu is not None else None
            planned.append(PlannedLayout(rank=i + 1, layout=c.layout, prediction=c.prediction, goodput=ckpt,
                                         straggler=straggler, support=support))  # fmt: skip
    return Plan(
        status=result.status,
        phases_s=clock.phases_s(),
        legal_layouts=legal,
        evaluated_layouts=len(evaluated),
        candidates=result.model_size,
        model=problem.model,
        job=problem.job,
        topology_name=topo.name,
        gpus=topo.num_gpus,
        gpus_per_server=topo.gpus_per_server,
        objective=request.objective,
        robust=problem.robust is not None,
        failure=request.failure,
        storage=request.storage,
        straggler_slowdown=slowdown,
        layouts=planned,
        diagnosis=diagnosis,
        notes=pricing_notes(problem.job, topo.gpu),
        allow_idle_gpus=problem.options.allow_idle_gpus,
        search_limits=search_limits(problem.options),
        megatron_core=None if version is None else version_text(version),
    )
