"""The legal layout space: degrees, micro-batch, accumulation, sharding, recomputation, sequence parallelism.

Both the CP-SAT solver and the exhaustive oracle walk this space, under the rules of `optlayout.layout.rules`.
Memory is not a rule of the space: it is a constraint of the model (it needs the cost model).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from optlayout.errors import InputError
from optlayout.frozen import fast_init
from optlayout.layout.axes import Axis
from optlayout.layout.megatron_core import (
    FSDP_SHARDINGS,
    Version,
    cp_offered,
    sharding_offered,
    split_offered,
    torch_fsdp2_only,
    torch_fsdp2_runs,
)
from optlayout.layout.model import LAYOUT_DEFAULTS, SEARCHED_AXES, Layout, Recompute, Sharding
from optlayout.layout.recompute import DEFAULT_MODULES, RecomputeModule, module_problems, parse_modules
from optlayout.layout.rules import (
    cp_fits_sequence,
    expert_degree_problems,
    field_conflicts,
    pp_fits_layers,
    sp_fits_sequence,
    tp_fits_heads,
)
from optlayout.layout.stages import split_layers, stage_layer_counts, vp_fits, warmup_chunks
from optlayout.specs import JobSpec, ModelSpec

PIN_KEYS = tuple(a.name for a in SEARCHED_AXES)
_PINNABLE: dict[str, Axis] = {key: a for a in SEARCHED_AXES for key in a.keys}


@dataclass(frozen=True)
class SpaceOptions:
    """User limits on the space: pins (`tp=8`), maxima (`pp<=16`), exclusions and switches."""

    pins: dict[str, object] = field(default_factory=dict)
    maxima: dict[str, int] = field(default_factory=dict)
    exclude: dict[str, frozenset[object]] = field(default_factory=dict)
    allow_tp_beyond_domain: bool = False
    allow_idle_gpus: bool = False
    max_micro_batch: int = 16
    max_vp: int = 8
    max_cp: int = 64
    max_bubble_fraction: float | None = None
    all_grad_accum: bool = False  # the oracle walks every accumulation; the solver only the largest legal one
    megatron_core: Version | None = None  # only what this Megatron-Core release runs (`layout.megatron_core`)


def normalize_key(key: str, what: str = "pin") -> str:
    """The field a pin (a maximum, an exclusion: `what`) names (`mb` -> `micro_batch`); only searched axes."""
    axis = _PINNABLE.get(key.strip())
    if axis is None:
        raise InputError(f"{what}: unknown layout field {key.strip()!r} (known: {', '.join(PIN_KEYS)})")
    return axis.name


def coerce_value(key: str, value: object, what: str = "pin") -> object:
    """Turn a pin (maximum, exclusion) value into the field's type with a one-line error naming the field."""
    try:
        return _PINNABLE[key].parse(value)
    except ValueError:
        raise InputError(f"{what}: {key}={value!r} is not a valid value") from None


def space_options(
    pins: Mapping[str, object] | None = None,
    maxima: Mapping[str, object] | None = None,
    exclude: Mapping[str, list[object]] | None = None,
    **switches: Any,
) -> SpaceOptions:
    """Normalize user pins (`{"tp": 8, "sharding": "fsdp"}`), maxima and exclusions, and refuse the ones that
    contradict a layout rule, so that a request fails naming the rule rather than with an empty space."""
    pinned = {normalize_key(k): coerce_value(normalize_key(k), v) for k, v in (pins or {}).items()}
    maxed: dict[str, int] = {}
    for key, value in (maxima or {}).items():
        name = normalize_key(key, "max")
        if not _PINNABLE[name].numeric:
            raise InputError(f"max: {name} is not a number; use --pin or --exclude")
        if name == "recompute_layers":
            raise InputError("max: recompute_layers is searched as the fewest that fit; pin it to fix it")
        maxed[name] = int(str(coerce_value(name, value, "max")))
    excluded: dict[str, frozenset[object]] = {}
    for key, values in (exclude or {}).items():  # several values of a field forbid them all
        name = normalize_key(key, "exclude")
        excluded[name] = excluded.get(name, frozenset()) | {coerce_value(name, v, "exclude") for v in values}
    if "recompute_layers" in excluded:
        raise InputError("exclude: recompute_layers is searched as the fewest that fit; pin it to fix it")
    if "recompute_modules" in excluded:
        raise InputError("exclude: recompute_modules is not searched (selective recomputes core_attn); pin a set")
    for problem in field_conflicts(pinned):
        raise InputError(f"pin: {problem}")
    bubble = switches.get("max_bubble_fraction")
    if bubble is not None and not 0 <= bubble <= 1:
        raise InputError(f"max-bubble: a fraction in [0, 1] (got {bubble})")
    # `--max` sets a search limit (raising it too); a pinned value above the limit raises it rather than emptying
    # the space
    defaults = {f.name: f.default for f in dataclasses.fields(SpaceOptions)}
    for axis, limit in SEARCH_LIMITS.items():
        if axis in maxed:
            switches[limit] = maxed[axis]
        if axis in pinned:
            switches[limit] = max(int(switches.get(limit, defaults[limit])), int(str(pinned[axis])))
    return SpaceOptions(pins=pinned, maxima=maxed, exclude=excluded, **switches)


SEARCH_LIMITS: Final = {"micro_batch": "max_micro_batch", "vp": "max_vp", "cp": "max_cp"}
"""The axes the space bounds beyond the rules (the SpaceOptions field of each): "optimal" holds within them."""


def search_limits(options: SpaceOptions) -> dict[str, int]:
    """The bounds the space was searched under, by axis (`SEARCH_LIMITS`)."""
    return {axis: int(getattr(options, limit)) for axis, limit in SEARCH_LIMITS.items()}


def describe_limits(limits: Mapping[str, int]) -> str:
    """`mb <= 16, vp <= 8, cp <= 64`, in the layout's own keys."""
    return ", ".join(f"{_PINNABLE[axis].keys[0]} <= {value}" for axis, value in limits.items())


def pinned_modules(model: ModelSpec, options: SpaceOptions) -> tuple[RecomputeModule, ...] | None:
    """The pinned selective-recomputation modules (None: Megatron's default, core_attn); a set the model refuses
    is an error naming the rule."""
    pinned = options.pins.get("recompute_modules")
    if pinned is None:
        return None
    modules = parse_modules(pinned)
    for problem in module_problems(model, modules):
        raise InputError(f"pin: {problem}")
    return None if modules == DEFAULT_MODULES else modules


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def allowed(options: SpaceOptions, key: str, value: object) -> bool:
    """Whether the pins, maxima and exclusions leave `key=value` in the space."""
    if key in options.pins and options.pins[key] != value:
        return False
    if key in options.maxima and isinstance(value, int) and value > options.maxima[key]:
        return False
    return value not in options.exclude.get(key, frozenset())


def tp_choices(model: ModelSpec, gpus: int, domain_size: int, options: SpaceOptions) -> list[int]:
    """TP divides the heads; kv heads divide or are replicated; within the NVLink domain unless allowed."""
    limit = gpus if options.allow_tp_beyond_domain else min(domain_size, gpus)
    return [t for t in _divisors(model.heads) if t <= limit and tp_fits_heads(model, t) and allowed(options, "tp", t)]


def expert_choices(model: ModelSpec, stage_gpus: int, domain_size: int, options: SpaceOptions) -> list[tuple[int, int]]:
    """(ep, etp) pairs of an MoE model over a stage of `stage_gpus` = tp x cp x dp GPUs: etp x ep divides them
    (Megatron's expert grid), ep divides the experts, etp the expert width (1 with expert biases) and stays in
    the NVLink domain as tp does; (1, 1) for a dense model."""
    if model.moe is None:
        return [(1, 1)] if allowed(options, "ep", 1) and allowed(options, "etp", 1) else []
    limit = stage_gpus if options.allow_tp_beyond_domain else min(domain_size, stage_gpus)
    out = []
    for etp in _divisors(stage_gpus):
        if etp > limit or not allowed(options, "etp", etp):
            continue
        for ep in _divisors(stage_gpus // etp):
            if not allowed(options, "ep", ep):
                continue
            if not expert_degree_problems(model, ep, etp):
                out.append((ep, etp))
    return out


def batch_targets(job: JobSpec) -> tuple[int, int]:
    """(min, max) sequences per step the job admits."""
    fixed = job.sequences_per_step
    if fixed is not None:
        return fixed, fixed
    lo, hi = job.min_global_batch, job.max_global_batch
    if lo is None and hi is None:
        raise InputError("global batch: give --global-batch, --global-batch-tokens, or min/max bounds")
    return lo or 1, hi or (lo or 1) * 64


_VARIANT_FIELDS = ("sharding", "recompute", "recompute_layers", "recompute_modules", "sequence_parallel")


@fast_init
@dataclass(frozen=True)
class LayoutGroup:
    """Layouts sharing everything but sharding, recomputation and sequence parallelism."""

    degrees: dict[str, int | None]  # tp, pp, vp, cp, dp, micro_batch, grad_accum, first/last stage layers
    shardings: tuple[Sharding, ...]
    recomputes: tuple[Recompute, ...]
    sequence_parallel: tuple[bool, ...]
    recompute_layers: int | None = None  # pinned; else the search takes the fewest that fit (`fewest_recomputed`)
    recompute_modules: tuple[RecomputeModule, ...] | None = None  # pinned; else Megatron's default (core_attn)

    def __len__(self) -> int:
        return len(self.shardings) * len(self.recomputes) * len(self.sequence_parallel)

    def layout(self, sharding: Sharding, recompute: Recompute, sequence_parallel: bool) -> Layout:
        # the space only yields legal degrees (the Layout's own field rules included): no validation to repeat;
        # `Layout.unchecked(**degrees, sharding=..., ...)`, from the group's fields once
        # the layouts built so far, and the fields they share, kept on first use (a walk asks for a layout again)
        cache = self.__dict__
        built: dict[tuple[Sharding, Recompute, bool], Layout] | None = cache.get("_built")
        if built is None:
            built = cache["_built"] = {}
            cache["_fields"] = {**LAYOUT_DEFAULTS, **self.degrees}
            cache["_fields_set"] = frozenset((*self.degrees, *_VARIANT_FIELDS))
        choice = (sharding, recompute, sequence_parallel)
        layout = built.get(choice)
        if layout is None:
            values = cache["_fields"].copy()
            values["sharding"] = sharding
            values["recompute"] = recompute
            values["recompute_layers"] = self.recompute_layers if recompute == Recompute.full else None
            values["recompute_modules"] = self.recompute_modules if recompute == Recompute.selective else None
            values["sequence_parallel"] = sequence_parallel
            layout = built[choice] = Layout.unchecked_fields(values, set(cache["_fields_set"]))
        return layout

    def layouts(self) -> Iterator[Layout]:
        for sharding, recompute, sp in itertools.product(self.shardings, self.recomputes, self.sequence_parallel):
            yield self.layout(sharding, recompute, sp)

    def variants(self) -> Iterator[tuple[Recompute, bool]]:
        """(recomputation, sequence parallelism) pairs: the layouts of one pair, one per sharding, share their
        compute, exposed TP/CP time and bubble (sharding changes none of them)."""
        return itertools.product(self.recomputes, self.sequence_parallel)

    def cheapest_variant(self) -> Layout:
        """No recomputation, sequence-parallel elementwise work and pipeline messages, the state sharded where
        there is a data-parallel group: the variant whose compute, exposed TP/CP time, bubble, pipeline
        send/receive and optimizer step are the least of the group's (it may itself be excluded by a pin)."""
        tp, dp, cp = self.degrees["tp"], self.degrees["dp"], self.degrees["cp"]
        sharded = dp is not None and cp is not None and dp * cp > 1
        return self.layout(Sharding.fsdp if sharded else Sharding.none, Recompute.none, tp is not None and tp > 1)

    def heaviest_variant(self, sharding: Sharding) -> Layout:
        """At `sharding`: full recomputation of every layer, without sequence parallelism unless the group has no
        layout without it. Each of its stages runs at least the forward and the backward compute of the same stage
        of each of the group's layouts of that sharding (a recomputation re-runs at most each layer's forward, and
        sequence parallelism only divides elementwise work). It may lie outside the group's pins."""
        cache = self.__dict__
        heaviest: dict[str, object] | None = cache.get("_heaviest")
        if heaviest is None:
            heaviest = cache["_heaviest"] = {**LAYOUT_DEFAULTS, **self.degrees, "recompute": Recompute.full,
                                             "recompute_layers": None, "recompute_modules": None,
                                             "sequence_parallel": min(self.sequence_parallel)}  # fmt: skip
        values = heaviest.copy()
        values["sharding"] = sharding
        return Layout.unchecked_fields(values, {*self.degrees, *_VARIANT_FIELDS})


def enumerate_layouts(
    model: ModelSpec, job: JobSpec, gpus: int, domain_size: int, options: SpaceOptions
) -> Iterator[Layout]:
    """Every legal layout, in a deterministic order."""
    for group in enumerate_groups(model, job, gpus, domain_size, options):
        yield from group.layouts()


def enumerate_groups(
    model: ModelSpec, job: JobSpec, gpus: int, domain_size: int, options: SpaceOptions
) -> Iterator[LayoutGroup]:
    """Every legal layout, grouped (see LayoutGroup), in a deterministic order."""
    batch_targets(job)  # a job without a batch is refused even where the pins leave no layout
    shared = _shared_choices(model, options)
    if shared is not None:
        for spec in _group_specs(model, job, gpus, domain_size, options, shared):
            yield _group(spec, shared)


class SharedChoices(NamedTuple):
    """What every group of the space has: the shardings allowed, the recomputations, the pinned recomputed layer
    count and module set."""

    shardings: tuple[Sharding, ...]
    recomputes: tuple[Recompute, ...]
    recompute_layers: int | None
    modules: tuple[RecomputeModule, ...] | None


GroupSpec = tuple[int, int, int, int, int, int, int, int, int, int | None, int | None, tuple[Sharding, ...],
                  tuple[bool, ...]]  # fmt: skip
"""A group's degrees in `LayoutGroup.degrees`' order, its shardings and its sequence-parallel choices."""
_DEGREES = ("tp", "pp", "vp", "cp", "dp", "ep", "etp", "micro_batch", "grad_accum", "first_stage_layers",
            "last_stage_layers")  # fmt: skip
NODE_AXES = ("tp", "cp", "micro_batch", "ep", "etp")
"""What the groups of one of the solver's bound nodes share (`CostTable.best_first`)."""
FAMILY_AXES = ("tp", "cp", "micro_batch")
"""What the nodes of one of the solver's bound families share (`CostTable.best_first`): all but the expert degrees."""
assert NODE_AXES[: len(FAMILY_AXES)] == FAMILY_AXES
NodeKey = tuple[int | None, ...]
_spec_node = operator.itemgetter(*(_DEGREES.index(a) for a in NODE_AXES))
# a `GroupSpec`'s fields, by name (literals, which the type checker reads)
_PP: Final = 1
_DP: Final = 4
_SHARDINGS: Final = 11
_SEQUENCE_PARALLEL: Final = 12
assert (_DEGREES[_PP], _DEGREES[_DP], len(_DEGREES)) == ("pp", "dp", _SHARDINGS)


def node_key(group: LayoutGroup) -> NodeKey:
    """The group's `NODE_AXES`."""
    return tuple(group.degrees[a] for a in NODE_AXES)


@dataclass(frozen=True)
class SpaceNodes:
    """The legal space as the solver's bound nodes (`CostTable.best_first`): groups sharing their `NODE_AXES`, the
    nodes in the order their first group comes in `enumerate_groups`, each node's groups in theirs,
    built as `LayoutGroup`s only when asked for; and the number of legal layouts."""

    nodes: list[list[GroupSpec]]
    layout_count: int
    shared: SharedChoices | None
    most_dp_pp: list[int]  # per node, the largest dp x pp of its groups

    def groups(self, node: list[GroupSpec]) -> list[LayoutGroup]:
        assert self.shared is not None  # a space with nodes has its shared choices
        return [_group(spec, self.shared) for spec in node]

    @staticmethod
    def key(node: list[GroupSpec]) -> NodeKey:
        """The node's `NODE_AXES`."""
        return _spec_node(node[0])  # type: ignore[no-any-return]


def space_nodes(model: ModelSpec, job: JobSpec, gpus: int, domain_size: int, options: SpaceOptions) -> SpaceNodes:
    """The groups of `enumerate_groups`, in nodes (see `SpaceNodes`)."""
    batch_targets(job)  # as `enumerate_groups`
    shared = _shared_choices(model, options)
    if shared is None:
        return SpaceNodes([], 0, None, [])
    nodes: dict[NodeKey, list[GroupSpec]] = {}
    count = 0
    per_group = len(shared.recomputes)
    for spec in _group_specs(model, job, gpus, domain_size, options, shared):
        key = _spec_node(spec)
        node = nodes.get(key)
        if node is None:
            node = nodes[key] = []
        node.append(spec)
        count += len(spec[_SHARDINGS]) * len(spec[_SEQUENCE_PARALLEL]) * per_group
    most = [max([spec[_DP] * spec[_PP] for spec in node]) for node in nodes.values()]
    return SpaceNodes(list(nodes.values()), count, shared, most)


def _shared_choices(model: ModelSpec, options: SpaceOptions) -> SharedChoices | None:
    """The choices every group of the space shares; None for an empty space."""
    version = options.megatron_core
    shardings = tuple(
        s for s in Sharding if allowed(options, "sharding", s) and (version is None or sharding_offered(version, s))
    )
    recomputes = tuple(r for r in Recompute if allowed(options, "recompute", r))
    pinned = options.pins.get("recompute_layers")
    if pinned is not None:  # a layer count is full recomputation's
        recomputes = tuple(r for r in recomputes if r == Recompute.full)
    modules = pinned_modules(model, options)
    if options.pins.get("recompute_modules") is not None:  # a module set is selective recomputation's
        recomputes = tuple(r for r in recomputes if r == Recompute.selective)
    if not shardings or not recomputes:
        return None
    return SharedChoices(shardings, recomputes, pinned if isinstance(pinned, int) else None, modules)


def _group(spec: GroupSpec, shared: SharedChoices) -> LayoutGroup:
    degrees: dict[str, int | None] = dict(zip(_DEGREES, spec[:_SHARDINGS], strict=True))
    return LayoutGroup(degrees, spec[_SHARDINGS], shared.recomputes, spec[_SEQUENCE_PARALLEL], shared.recompute_layers,
                       shared.modules)  # fmt: skip


def _group_specs(
    model: ModelSpec,
    job: JobSpec,
    gpus: int,
    domain_size: int,
    options: SpaceOptions,
    shared: SharedChoices,
) -> Iterator[GroupSpec]:
    """Every legal group (`GroupSpec`), in `enumerate_groups`' order."""
    lo, hi = batch_targets(job)
    accums: dict[tuple[int, int, int], list[int]] = {}  # `_grad_accums` by (sequences per step, pp, vp)
    experts: dict[int, list[tuple[int, int]]] = {}  # `expert_choices` by the GPUs of a stage
    fsdp2_only = options.megatron_core is not None and torch_fsdp2_only(options.megatron_core)
    for tp in tp_choices(model, gpus, domain_size, options):
        values = ((True,) if model.moe is not None else (False, True)) if tp > 1 else (False,)  # MoE: SP with tp > 1
        sps = tuple(sp for sp in values if allowed(options, "sequence_parallel", sp))
        if not sps:
            continue
        for cp in _divisors(gpus // tp):
            if cp > options.max_cp or not cp_fits_sequence(job.seq_len, cp) or not allowed(options, "cp", cp):
                continue
            if options.megatron_core is not None and not cp_offered(options.megatron_core, model, cp):
                continue
            cp_sps = tuple(sp for sp in sps if not sp or sp_fits_sequence(job.seq_len, cp, tp))
            if not cp_sps:
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if not pp_fits_layers(model.layers, pp) or not allowed(options, "pp", pp):
                    continue
                split = split_layers(model.layers, pp)
                if split is None:
                    continue
                shardings = shared.shardings
                if fsdp2_only and not torch_fsdp2_runs(model, job, pp, 1):
                    shardings = tuple(s for s in shardings if s not in FSDP_SHARDINGS)
                yield from _groups(model, gpus, domain_size, options, tp, cp, pp, split, lo, hi, shardings,
                                   cp_sps, shared.recompute_layers, accums, experts)  # fmt: skip


def _groups(
    model: ModelSpec,
    gpus: int,
    domain_size: int,
    options: SpaceOptions,
    tp: int,
    cp: int,
    pp: int,
    split: tuple[int | None, int | None],
    lo: int,
    hi: int,
    shardings: tuple[Sharding, ...],
    sps: tuple[bool, ...],
    pinned_layers: int | None,
    accums: dict[tuple[int, int, int], list[int]],
    experts_by_gpus: dict[int, list[tuple[int, int]]],
) -> Iterator[GroupSpec]:
    """The legal groups of (tp, cp, pp) and its stage split, in `enumerate_groups`' order; `accums` and
    `experts_by_gpus` keep the accumulations and expert degrees found so far (they repeat across the calls)."""
    first, last = split
    full_dp = gpus // (tp * cp * pp)
    fsdp2_only = options.megatron_core is not None and torch_fsdp2_only(options.megatron_core)
    dps = range(1, full_dp + 1) if options.allow_idle_gpus else (full_dp,)
    counts = stage_layer_counts(model.layers, pp, first, last)
    version = options.megatron_core
    vps = [
        v
        for v in range(1, options.max_vp + 1)
        if (v == 1 or (pp > 1 and vp_fits(counts, v))) and (version is None or split_offered(version, counts, v))
    ]
    if pinned_layers is not None:  # a pinned layer count within the largest model chunk
        vps = [v for v in vps if pinned_layers <= max(counts) // v]
    for dp in dps:
        if not allowed(options, "dp", dp) or dp > hi:
            continue
        # nothing to shard over with a single data-parallel replica
        group_shardings = shardings if dp * cp > 1 else tuple(s for s in shardings if s == Sharding.none)
        if not group_shardings:
            continue
        # torch FSDP2, where it is the release's only FSDP, runs without expert parallelism
        expert_shardings = (
            tuple(s for s in group_shardings if s not in FSDP_SHARDINGS) if fsdp2_only else group_shardings
        )
        experts = experts_by_gpus.get(tp * cp * dp)
        if experts is None:
            experts = experts_by_gpus[tp * cp * dp] = expert_choices(model, tp * cp * dp, domain_size, options)
        for mb in _micro_batches(options, dp, hi):
            for vp in vps:
                if not allowed(options, "vp", vp):
                    continue
                gas = accums.get((mb * dp, pp, vp))
                if gas is None:
                    gas = accums[mb * dp, pp, vp] = _grad_accums(mb * dp, lo, hi, pp, vp, options)
                for ga in gas:
                    if options.max_bubble_fraction is not None and (pp - 1) / (vp * ga) > options.max_bubble_fraction:
                        continue
                    for ep, etp in experts:
                        kept = expert_shardings if ep > 1 else group_shardings
                        if kept:
                            yield tp, pp, vp, cp, dp, ep, etp, mb, ga, first, last, kept, sps


def _micro_batches(options: SpaceOptions, dp: int, hi: int) -> list[int]:
    """Micro-batches up to the search limit with mb x dp within the batch bound (a pin: only its value)."""
    top = min(options.max_micro_batch, hi // dp)
    pinned = options.pins.get("micro_batch")
    if pinned is not None:
        usable = isinstance(pinned, int) and pinned <= top and allowed(options, "micro_batch", pinned)
        return [pinned] if usable and isinstance(pinned, int) else []
    return [mb for mb in range(1, top + 1) if allowed(options, "micro_batch", mb)]


def _grad_accums(per_step: int, lo: int, hi: int, pp: int, vp: int, options: SpaceOptions) -> list[int]:
    """Accumulation steps putting the global batch in [lo, hi], with at least pp micro-batches (1F1B) and a
    multiple of pp when interleaved.

    The solver keeps the largest, and under interleaving also those too few to fill the warm-up: per-token
    cost never rises with more micro-batches (bubble and reductions amortize) and memory only grows until
    the first stage's warm-up, (p-1)*2 + (v-1)*p + 1 chunks, is in flight. The oracle walks them all, which
    the tests use to check this reduction. Goodput keeps it exact: the effective time fraction does not
    depend on the accumulation (only on the degrees, sharding and stage split)."""
    first = max(-(-lo // per_step), pp if pp > 1 else 1)
    last = hi // per_step

    def legal(ga: int) -> bool:
        return (vp == 1 or ga % pp == 0) and allowed(options, "grad_accum", ga)

    if options.all_grad_accum:
        return [ga for ga in range(first, last + 1) if legal(ga)]
    # the largest legal value, walking down (at most pp + the excluded values), never the whole range
    pinned = options.pins.get("grad_accum")
    top = min(last, pinned) if isinstance(pinned, int) else min(last, options.maxima.get("grad_accum", last))
    largest = next((ga for ga in range(top, first - 1, -1) if legal(ga)), None)
    if largest is None:
        return []
    below = range(first, min(largest, -(-warmup_chunks(pp, vp) // vp))) if vp > 1 else range(0)
    return [ga for ga in below if legal(ga)] + [largest]
