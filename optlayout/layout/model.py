"""The `Layout` model: how one training job is laid out over the GPUs. Each field is an axis (`Axis`)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from math import prod
from types import MappingProxyType
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from optlayout.inputs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS
from optlayout.inputs.numbers import Count
from optlayout.layout.axes import Axis, declared_axes
from optlayout.layout.recompute import DEFAULT_MODULES, RecomputeModule, canonical_modules
from optlayout.layout.rules import field_conflicts


class Sharding(StrEnum):
    """How training state is sharded over the data-parallel group."""

    none = "none"  # plain DDP: every DP rank keeps all of its stage's state
    zero1 = "zero1"  # optimizer state sharded (Megatron distributed optimizer)
    zero2 = "zero2"  # + gradients sharded
    fsdp = "fsdp"  # + weights sharded (ZeRO-3)


class Recompute(StrEnum):
    """Activation recomputation (Korthikanti et al. 2022)."""

    none = "none"
    selective = "selective"  # the modules of `recompute_modules` recomputed (default: the attention core)
    full = "full"  # whole layer recomputed; only its input is kept


Degree = Annotated[Count, Field(le=MAX_GPUS)]  # a strict integer: `tp: true` or `tp: "8"` is refused
PerStep = Annotated[Count, Field(le=MAX_GLOBAL_BATCH)]
Chunks = Annotated[Count, Field(le=MAX_LAYERS)]


class Layout(BaseModel):
    """How one training job is laid out over the GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: Annotated[Degree, Axis("tp", "tensor-parallel degree", grid=True, splits_model=True, checkpoint="reshards")] = 1
    pp: Annotated[
        Degree, Axis("pp", "pipeline stages", grid=True, expert_token="pp", splits_model=True, checkpoint="reshards")
    ] = 1
    vp: Annotated[
        Chunks,
        Axis("vp", "virtual stages per pipeline rank", splits_model=True, shown="not_default", checkpoint="reshards"),
    ] = 1
    cp: Annotated[
        Degree,
        Axis("cp", "context-parallel degree", grid=True, splits_model=True, checkpoint="reshards_if_sharded"),
    ] = 1
    dp: Annotated[Degree, Axis("dp", "data-parallel degree", grid=True, checkpoint="reshards_if_sharded")] = 1
    ep: Annotated[
        Degree,
        Axis("ep", "expert-parallel degree (MoE; folded over tp x cp x dp)", aliases=("expert_parallel",),
             expert_token="ep", splits_model=True, shown="not_default", checkpoint="reshards"),
    ] = 1  # fmt: skip
    etp: Annotated[
        Degree,
        Axis("etp", "expert tensor-parallel degree (MoE)", aliases=("expert_tensor_parallel",), expert_token="tp",
             splits_model=True, shown="not_default", checkpoint="reshards"),
    ] = 1  # fmt: skip
    micro_batch: Annotated[PerStep, Axis("mb", "sequences per micro-batch", label="micro-batch")] = 1
    grad_accum: Annotated[PerStep, Axis("ga", "micro-batches per step", label="grad accum")] = 1
    sharding: Annotated[Sharding, Axis("sharding", "state sharded over dp x cp", checkpoint="reshards")] = Sharding.none
    recompute: Annotated[Recompute, Axis("recompute", "activation recomputation")] = Recompute.none
    recompute_layers: Annotated[
        Chunks | None,
        Field(description="with recompute=full, the layers recomputed in each model chunk; null: all of them"),
        Axis("rl", "layers per model chunk recomputed with recompute=full (Megatron's block method; default all)",
             aliases=("recompute_num_layers",), shown="not_default", label="recomputed layers"),
    ] = None  # fmt: skip
    recompute_modules: Annotated[
        tuple[RecomputeModule, ...] | None,
        Field(description="with recompute=selective, the modules recomputed (Megatron's --recompute-modules); "
                          "null: core_attn, Megatron's default"),
        Axis("rm", "modules selective recomputation re-runs, joined by '+' (default core_attn; text form "
             "recompute=selective:core_attn+moe_act)", aliases=("recompute_modules",), shown="not_default",
             label="recomputed modules"),
    ] = None  # fmt: skip
    sequence_parallel: Annotated[
        bool, Axis("sp", "sequence-parallel norms and dropout", shown="not_default", label="SP")
    ] = False
    first_stage_layers: Annotated[
        Chunks | None,
        Field(description="layers on the first pipeline stage (uneven split)"),
        Axis("first", "layers on the first stage", searched=False, shown="not_default", checkpoint="reshards"),
    ] = None
    last_stage_layers: Annotated[
        Chunks | None,
        Field(description="layers on the last pipeline stage (uneven split)"),
        Axis("last", "layers on the last stage", searched=False, shown="not_default", checkpoint="reshards"),
    ] = None

    @field_validator("recompute_modules", mode="after")
    @classmethod
    def _canonical_modules(cls, value: tuple[RecomputeModule, ...] | None) -> tuple[RecomputeModule, ...] | None:
        """Sorted and repeat-free; Megatron's default set is written as None, so `recompute=selective` and
        `recompute=selective:core_attn` are one layout."""
        if value is None:
            return None
        if not value:
            raise ValueError("recompute_modules needs at least one module (none recomputed is recompute=none)")
        modules = canonical_modules(value)
        return None if modules == DEFAULT_MODULES else modules

    @model_validator(mode="after")
    def _check(self) -> Layout:
        problems = field_conflicts(self.model_dump())
        if problems:
            raise ValueError(problems[0])
        return self

    @classmethod
    def unchecked(cls, **values: object) -> Layout:
        """A layout built without validation, as pydantic's `model_construct` builds it (the same attributes) at a
        quarter of its cost: for the space, which yields only legal degrees, walked by the hundred thousand."""
        return cls.unchecked_fields({**_DEFAULTS, **values}, set(values))

    @classmethod
    def unchecked_fields(cls, values: dict[str, object], fields_set: set[str]) -> Layout:
        """`unchecked` from the value of every field, in field order (`values`, which the layout keeps as its own),
        and the fields set: what `unchecked(**given)` builds from `values = {**defaults, **given}` and
        `fields_set = set(given)`, without copying either."""
        obj = _new(cls)
        _set_dict(obj, values)
        _set_fields_set(obj, fields_set)
        _set_extra(obj, None)
        _set_private(obj, None)
        return obj

    @property
    def selective_modules(self) -> frozenset[RecomputeModule]:
        """The modules recomputed by selective recomputation (empty unless recompute=selective)."""
        if self.recompute != Recompute.selective:
            return frozenset()
        return frozenset(self.recompute_modules or DEFAULT_MODULES)

    @property
    def gpus(self) -> int:
        """GPUs the layout uses: the product of its rank-grid degrees."""
        return prod(getattr(self, a.name) for a in GRID_AXES)

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: the GPUs over the expert grid's etp x ep x pp (Megatron's EDP)."""
        return self.gpus // (self.pp * self.ep * self.etp)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    def short(self) -> str:
        """Compact one-line form, also accepted by `parse_layout`."""
        from optlayout.layout.text import format_layout

        return format_layout(self)


_DEFAULTS = {name: info.default for name, info in Layout.model_fields.items()}
LAYOUT_DEFAULTS: Mapping[str, object] = MappingProxyType(_DEFAULTS)
"""Every field's default, in field order."""
# `unchecked`'s setters, looked up once: the slots' and the instance dict's own descriptors (what
# `object.__setattr__` finds on each call)
_new = object.__new__
_set_dict, _set_fields_set, _set_extra, _set_private = (
    next(c.__dict__[name] for c in Layout.__mro__ if name in c.__dict__).__set__
    for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
)
AXES = declared_axes(Layout)
"""Every axis of a layout, in field order."""
GRID_AXES = tuple(a for a in AXES if a.grid)
"""The rank-grid axes (their degrees multiply the GPUs), in field order: tp, pp, cp, dp."""
EXPERT_GRID_AXES = tuple(a for a in AXES if a.expert_token)
"""The axes placed in the expert rank grid (its expert-DP is what the GPUs leave): pp, ep, etp."""
SEARCHED_AXES = tuple(a for a in AXES if a.searched)
"""The axes the space enumerates and pins name."""
