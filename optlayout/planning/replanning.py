"""Re-planning a saved plan on another GPU count, and which layout changes reshard its checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

from optlayout.conditions.goodput import FailureSpec, StorageSpec
from optlayout.cost import DEFAULT_PARAMS, CostParams
from optlayout.errors import InfeasibleError, InputError, OptlayoutError, UnsupportedError, describe_validation_error
from optlayout.inputs.arguments import checked_arguments
from optlayout.inputs.limits import MAX_GPUS
from optlayout.layout.megatron_core import parse_megatron_core
from optlayout.layout.model import AXES
from optlayout.planning.plan import LayoutChange, Plan, Replan
from optlayout.planning.search import ClusterInput, SolveRequest, failure_input, solve_request, storage_input
from optlayout.runs.uncertainty import Uncertainty
from optlayout.solver.candidates import passes_limits, state_key
from optlayout.solver.problem import Problem
from optlayout.solver.space import SpaceOptions, batch_targets, space_options
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec, Sharding
from optlayout.timings import PhaseClock
from optlayout.topology import Topology, cluster_assumptions, load_cluster, topology_from_dict
from optlayout.topology.schema import GeneratorDoc

_SAVED_SPLIT = {Sharding.none: 0, Sharding.zero1: 1, Sharding.zero2: 1, Sharding.fsdp: 2}  # what the saved state shards


def layout_changes(old: Layout, new: Layout) -> list[LayoutChange]:
    """The fields that differ, in layout order, then the global batch, each marked when it reshards the
    checkpoint: tp, pp, vp and the stage split move weights and optimizer state between ranks, a sharding
    change splits them differently, and dp or cp do too when either layout shards state over dp x cp
    (a plain data-parallel replica holds the whole stage, whatever the replica count). Micro-batch,
    accumulation, recomputation and sequence parallelism leave the checkpoint as it is. Formats that
    reshard on load (torch DCP, Megatron `torch_dist`) do it by themselves; per-rank formats need converting."""
    sharded = old.sharding != Sharding.none or new.sharding != Sharding.none
    out = []
    for axis in AXES:
        name = axis.name
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            if name == "sharding":  # ZeRO-2 differs from ZeRO-1 in gradients only, which are not saved
                reshard = _SAVED_SPLIT[a] != _SAVED_SPLIT[b]
            else:
                reshard = axis.checkpoint == "reshards" or (axis.checkpoint == "reshards_if_sharded" and sharded)
            out.append(LayoutChange(dim=name, before=getattr(a, "value", a), after=getattr(b, "value", b),
                                    reshards_checkpoint=reshard))  # fmt: skip
    if old.global_batch != new.global_batch:
        out.append(LayoutChange(dim="global_batch", before=old.global_batch, after=new.global_batch,
                                reshards_checkpoint=False))  # fmt: skip
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class _ClusterMaker:
    """Builds the plan's kind of cluster on another GPU count: None for a count it cannot build."""

    def __init__(self, shorthand: ClusterSpec | None, doc: dict[str, Any] | None, name: str) -> None:
        self.shorthand, self.doc, self.name = shorthand, doc, name
        self.per_node = 0
        if shorthand is not None:
            self.per_node = shorthand.gpus_per_node
        elif doc is not None:
            try:
                self.per_node = GeneratorDoc.model_validate(doc).gpu_count
            except pydantic.ValidationError as exc:
                raise InputError(describe_validation_error(exc, f"replan: topology {name}")) from None

    @property
    def buildable(self) -> bool:
        return self.per_node > 0

    def valid(self, gpus: int) -> bool:
        if gpus < 1 or not self.buildable:
            return False
        if self.shorthand is not None:
            return gpus <= self.per_node or gpus % self.per_node == 0
        return gpus % self.per_node == 0

    def build(self, gpus: int) -> tuple[Topology, ClusterSpec | None, dict[str, Any] | None]:
        if self.shorthand is not None:
            spec = ClusterSpec.model_validate({**self.shorthand.model_dump(), "gpus": gpus})
            return load_cluster(spec).topology, spec, None
        assert self.doc is not None
        servers = gpus // self.per_node
        doc = {**self.doc, "servers": servers}
        topo = topology_from_dict(doc, default_name=self.name, where=f"replan: topology {self.name}")
        return topo, None, doc

    def unit(self) -> str:
        if self.shorthand is not None:
            cluster = f"gpu={self.shorthand.gpu}, gpus_per_node={self.per_node}"
            return f"{self.per_node}-GPU nodes (the plan's cluster: {cluster})"
        return f"{self.per_node}-GPU servers (the plan's topology {self.name})"


def _has_feasible_layout(problem: Problem) -> bool:
    """Whether any legal layout fits memory and the limits (stops at the first one)."""
    table, capacity, limits = problem.table, problem.capacity_bytes, problem.limits
    state_ok: dict[tuple[object, ...], bool] = {}
    for lay in problem.layouts():
        key = state_key(lay)
        if key not in state_ok:
            state_ok[key] = table.state_fits(lay, capacity)
        if state_ok[key] and passes_limits(table.candidate(lay), limits):
            return True
    return False


def nearest_gpu_counts(
    spec: ModelSpec,
    job: JobSpec,
    maker: _ClusterMaker,
    gpus: int,
    options: SpaceOptions,
    params: CostParams,
    probes: int = 24,
) -> tuple[int | None, int | None]:
    """The nearest GPU counts below and above `gpus` that the cluster kind can build and some layout fits
    (at most `probes` buildable counts looked at on each side)."""
    if not maker.buildable:
        return None, None

    def works(n: int) -> bool:
        try:
            topo, _, _ = maker.build(n)
        except (OptlayoutError, pydantic.ValidationError):
            return False
        return _has_feasible_layout(Problem(spec, job, topo, params, options))

    below = next((n for n in _counts(maker, gpus, -1, probes) if works(n)), None)
    above = next((n for n in _counts(maker, gpus, +1, probes) if works(n)), None)
    return below, above


def _counts(maker: _ClusterMaker, gpus: int, direction: int, probes: int) -> list[int]:
    out: list[int] = []
    n = gpus + direction
    while 1 <= n <= max(4 * gpus, gpus + probes * maker.per_node) and len(out) < probes:
        if maker.valid(n):
            out.append(n)
        n += direction
    return out


def _suggestion(below: int | None, above: int | None) -> str:
    found = [n for n in (below, above) if n is not None]
    if not found:
        return "no nearby GPU count works either"
    if len(found) == 1:
        return f"nearest GPU count that works: {found[0]}"
    return f"nearest GPU counts that work: {found[0]} and {found[1]}"


def _batch_rule(job: JobSpec, spec: ModelSpec, gpus: int) -> str:
    """Why no layout keeps the batch on `gpus` GPUs, when the legal space is empty (no pins)."""
    lo, hi = batch_targets(job)
    fixed = job.sequences_per_step
    if fixed is not None:
        batch = f"the global batch of {fixed} sequences"
        dps = [d for d in _divisors(gpus) if fixed % d == 0]
        rule = f"global batch = micro_batch x grad_accum x dp, so dp must divide {fixed}"
    else:
        batch = f"a global batch in [{lo}, {hi}] sequences"
        dps = [d for d in _divisors(gpus) if d <= hi]
        rule = f"global batch = micro_batch x grad_accum x dp, so dp <= {hi}"
    rest = ", ".join(str(gpus // d) for d in dps)
    return (
        f"no layout keeps {batch} on {gpus} GPUs: {rule}, which leaves tp x cp x pp = {rest} GPUs per replica, and "
        f"no legal tp (divides {spec.heads} heads, within the NVLink domain), cp (2 cp divides seq_len "
        f"{job.seq_len}) and pp (splits {spec.layers} layers) multiply to that"
    )


@checked_arguments
def replan(
    plan: Plan | str | Path,
    gpus: int | None = None,
    *,
    cluster: ClusterInput | None = None,
    top: int = 1,
    pins: Mapping[str, object] | None = None,
    maxima: Mapping[str, object] | None = None,
    exclude: Mapping[str, list[object]] | None = None,
    params: CostParams = DEFAULT_PARAMS,
    time_limit_s: float = 10.0,
    objective: str | None = None,
    failure: FailureSpec | Mapping[str, Any] | None = None,
    storage: StorageSpec | Mapping[str, Any] | None = None,
    straggler_slowdown: float | None = None,
    uncertainty: Uncertainty | None = None,
    robust: bool | None = None,
    **switches: Any,
) -> Plan:
    """The best layout of a saved plan's model and job on another GPU count, and what changes.

    The job is the plan's: a fixed global batch is kept, batch bounds are kept. The cluster is the plan's
    kind on `gpus` GPUs: its shorthand with the new count, or its generator-form topology with
    gpus / gpus_per_server servers; give `cluster` for a plan made from an explicit topology or to move
    elsewhere. The objective, failure, storage, straggler and `robust` inputs default to the plan's.
    `uncertainty` (a calibration's held-out errors) gives each layout its interval and support, as in `solve`;
    a plan ranked robust (or `robust=True`) needs it, since a plan does not carry the intervals it was ranked by.
    The returned plan's `replan.changes` lists the layout fields that differ from the plan's best and
    whether each reshards the checkpoint. Raises a one-line InfeasibleError naming the rule when no layout
    works on `gpus`, with the nearest GPU counts that do.
    """
    old = Plan.load(plan) if isinstance(plan, (str, Path)) else plan
    robust = old.robust if robust is None else robust
    if robust and uncertainty is None:  # the order comes from the calibration's intervals, which a plan does not carry
        whose = "the plan was ranked robust" if old.robust else "robust ranking"
        raise InputError(f"replan: {whose} (by the 80% interval's low end): pass the calibration's held-out errors "
                         "(`uncertainty`), or robust=False")  # fmt: skip
    if gpus is not None and not 1 <= gpus <= MAX_GPUS:
        raise InputError(f"replan: gpus must be a whole number from 1 to {MAX_GPUS:,} (got {gpus!r})")
    if old.megatron_core is not None and switches.get("megatron_core") is None:  # the plan's release, kept
        switches["megatron_core"] = parse_megatron_core(old.megatron_core)
    options = space_options(pins, maxima, exclude, **switches)
    clock = PhaseClock()
    if cluster is not None:
        with clock.phase("topology"):
            loaded = load_cluster(cluster)
        topo, shorthand, doc = loaded.topology, loaded.shorthand, loaded.generator_doc
        if gpus is not None and topo.num_gpus != gpus:
            raise InputError(f"replan: the given cluster has {topo.num_gpus} GPUs, not {gpus}")
        gpus = topo.num_gpus
        maker = _ClusterMaker(shorthand, doc, topo.name)
    else:
        if gpus is None:
            raise InputError("replan: give the new GPU count (or a cluster)")
        maker = _ClusterMaker(old.cluster, old.topology_doc, old.topology_name)
        if not maker.buildable:
            raise UnsupportedError(
                f"replan: the plan's cluster {old.topology_name!r} came from an explicit topology (or a Topology "
                f"object), which cannot be rebuilt on {gpus} GPUs; give the new cluster (--cluster or --topology)"
            )
        if not maker.valid(gpus):
            below, above = nearest_gpu_counts(old.model, old.job, maker, gpus, options, params)
            raise InputError(
                f"replan: {gpus} GPUs is not a whole number of {maker.unit()}; pass --cluster/--topology for "
                f"another shape, or use a multiple of {maker.per_node}; {_suggestion(below, above)}"
            )
        with clock.phase("topology"):
            topo, shorthand, doc = maker.build(gpus)
    request = SolveRequest.make(
        old.model, topo, old.job, top=top, pins=pins, maxima=maxima, exclude=exclude, params=params,
        time_limit_s=time_limit_s, objective=objective if objective is not None else old.objective,
        failure=failure_input(failure) if failure is not None else old.failure,
        storage=storage_input(storage) if storage is not None else old.storage,
        straggler_slowdown=straggler_slowdown if straggler_slowdown is not None else old.straggler_slowdown,
        switches=switches, uncertainty=uncertainty, robust=robust,
    )  # fmt: skip
    new = solve_request(request, clock)
    if not new.layouts:
        below, above = nearest_gpu_counts(old.model, old.job, maker, gpus, options, params)
        if new.legal_layouts == 0 and not (pins or maxima or exclude):
            why = _batch_rule(old.job, old.model, gpus)
        else:
            why = f"no layout of {old.model.name} works on {gpus} GPUs: {new.diagnosis}"
        raise InfeasibleError(f"replan: {why}; {_suggestion(below, above)}")
    from_layout = old.layouts[0].layout if old.layouts else None
    changes = layout_changes(from_layout, new.best.layout) if from_layout is not None else []
    return new.model_copy(
        update={
            "cluster": shorthand,
            "topology_doc": doc,
            "assumed": cluster_assumptions(shorthand) if cluster is not None and shorthand is not None else old.assumed,
            "replan": Replan(from_gpus=old.gpus, from_layout=from_layout, changes=changes),
        }
    )
