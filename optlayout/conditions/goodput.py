"""Failures and checkpoints of a layout (goodput), on top of the one cost model.

Goodput is throughput x the effective time fraction: the share of wall time that trains once checkpoint
pauses, work lost to failures and restarts are paid (`optlayout.conditions.reliability`, Young/Daly). What makes it
depend on the layout is the checkpoint, derived here from the cost model's memory accounting (the
parameters per stage, `stage_params_per_stage`, and their bytes per GPU, `stage_state_bytes`):

* Bytes written: the unique training state, weights + optimizer state (gradients are not saved). Each
  GPU of stage i holds w_i weight and o_i optimizer bytes; over the stage's tp x d ranks (d = dp x cp)
  weights are replicated d times unless FSDP shards them, optimizer state d times unless ZeRO/FSDP shards
  it. Dividing each replicated part by its replication factor, the stage holds tp x d x (w_i/r_w + o_i/r_o)
  unique bytes = its parameters x (weight + optimizer bytes per parameter), and the model holds params x
  14 B with mixed-precision Adam: the same for every layout (the last stage's copy of tied embeddings is a
  replica too and is not counted; routed experts are split over etp x ep and replicated over expert-DP).
  Sharding makes each rank's part smaller, not the total.
* Who writes: every rank writes an equal part of its stage's unique state in parallel (replicas split
  the replicated state among themselves: torch DCP's save-plan deduplication, Megatron's fully parallel
  save). A node writes the parts of its ranks (Megatron rank order, pipeline stage outermost), so the
  write takes max(total / aggregate storage bandwidth, largest node's bytes / per-node bandwidth)
  (`reliability.checkpoint_write_s`, the one write formula); stages holding the embedding or output
  layer make their nodes write more, and layouts leaving GPUs idle write through fewer nodes.
* Synchronous checkpoint: training waits for the write. Asynchronous: training waits only while each
  GPU copies what it holds to host memory; torch DCP's `async_save` stages the rank's whole local state
  dict before the save plan deduplicates replicas, so a GPU copies its resident weights + optimizer
  state (the memory breakdown's per-GPU figures, the fullest stage setting the pause). The write then runs
  in the background and its duration is the durability lag of `reliability`. This is where the layout
  matters most: a data-parallel replica (no sharding) copies all of its stage's state, FSDP 1/d of it.

The effective fraction uses the optimal (Young or Daly) interval for each layout's checkpoint cost; the
MTBF is the job's (given) or a per-GPU failure rate x the GPUs the layout uses. It depends only on tp, pp,
cp, dp, sharding and the stage split, never on micro-batch, accumulation or recomputation, so the
solver's reductions (largest accumulation, memory skips, the top-k skyline) stay exact when the candidate
throughput is multiplied by it.

"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from optlayout.conditions import reliability as rel
from optlayout.cost.memory import stage_params_per_stage, stage_state_bytes
from optlayout.errors import InputError, OptlayoutError, describe_validation_error
from optlayout.specs import JobSpec, Layout, ModelSpec

OBJECTIVES = ("mfu", "goodput")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FailureSpec(_Spec):
    """How often the job fails and what a failure costs besides lost work. Give `mtbf_s` (the job's mean
    time between failures) or `gpu_failure_rate_per_s` (per GPU; the job's MTBF is 1 / (rate x GPUs used))."""

    mtbf_s: float | None = Field(None, gt=0, description="the job's mean time between failures, s")
    gpu_failure_rate_per_s: float | None = Field(None, gt=0, description="failures per GPU-second")
    restart_s: float = Field(rel.DEFAULT_RESTART_S, ge=0, description="detect, reschedule, reload, s")
    method: Literal["young", "daly"] = "young"

    @model_validator(mode="after")
    def _one_source(self) -> FailureSpec:
        if (self.mtbf_s is None) == (self.gpu_failure_rate_per_s is None):
            raise ValueError("give exactly one of mtbf_s and gpu_failure_rate_per_s")
        return self

    def job_mtbf_s(self, gpus: int) -> float:
        if self.mtbf_s is not None:
            return self.mtbf_s
        assert self.gpu_failure_rate_per_s is not None
        return rel.cluster_mtbf_s(gpus, gpu_failure_rate_per_s=self.gpu_failure_rate_per_s)

    def describe(self) -> str:
        if self.mtbf_s is not None:
            return f"MTBF {self.mtbf_s / rel.SECONDS_PER_HOUR:.3g} h"
        assert self.gpu_failure_rate_per_s is not None
        return f"{self.gpu_failure_rate_per_s * rel.SECONDS_PER_HOUR:.3g} failures per GPU-hour x GPUs"


class StorageSpec(_Spec):
    """Where checkpoints go: aggregate write bandwidth, optionally capped per node, and whether the write
    runs in the background (asynchronous: only the copy to host memory blocks)."""

    write_Bps: float = Field(gt=0, description="aggregate storage write bandwidth, bytes/s")
    per_node_write_Bps: float | None = Field(None, gt=0, description="what one node can write, bytes/s")
    asynchronous: bool = False
    d2h_Bps: float = Field(rel.DEFAULT_D2H_BPS, gt=0, description="device-to-host copy per GPU (async), bytes/s")


def failure_spec(**fields: object) -> FailureSpec:
    """A FailureSpec with a one-line error naming the field."""
    try:
        return FailureSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "failure")) from None


def storage_spec(**fields: object) -> StorageSpec:
    """A StorageSpec with a one-line error naming the field."""
    try:
        return StorageSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, "storage")) from None


@dataclass(frozen=True)
class CheckpointState:
    """What a checkpoint of one layout moves: unique bytes written, per-node load, per-GPU staging copy."""

    unique_bytes: float  # weights + optimizer state, each replica counted once
    largest_node_bytes: float  # the most any node writes
    nodes: int  # nodes holding the layout's ranks
    resident_bytes_per_gpu: float  # weights + optimizer state the fullest GPU holds (async staging copy)


def checkpoint_state(model: ModelSpec, job: JobSpec, layout: Layout, gpus_per_node: int) -> CheckpointState:
    """Bytes a checkpoint of `layout` writes, and how they spread over nodes and GPUs (see module docstring).

    A stage's unique parameters are what one GPU of it would hold with tp = ep = etp = 1 (replicated K/V heads,
    MLA's duplicated down projections and the router then counted once, every routed expert once); the last
    stage's own copies of the embedding (tied, or for MTP) replicate the first stage's and are not counted."""
    unsplit = layout.model_copy(update={"tp": 1, "ep": 1, "etp": 1, "sequence_parallel": False})
    per_param = job.weight_bytes_per_param + job.optimizer_bytes_per_param
    ranks_per_stage = layout.gpus // layout.pp
    share, resident = [], 0.0  # unique bytes each rank of a stage writes; the most any GPU holds
    stages = stage_params_per_stage(model, layout)
    for i, unique_params in enumerate(stage_params_per_stage(model, unsplit)):
        weights, _, optim = stage_state_bytes(stages[i], job, layout)
        resident = max(resident, weights + optim)
        count = unique_params.total
        if i == layout.pp - 1 and layout.pp > 1 and (model.tied_embeddings or model.mtp_layers):
            count -= model.vocab * model.hidden  # the last stage's copy of the first stage's embedding
        share.append(count * per_param / ranks_per_stage)
    unique = sum(s * ranks_per_stage for s in share)
    # Node k holds ranks [k g, (k+1) g); rank r belongs to stage r // ranks_per_stage (pp outermost).
    g, total = max(1, gpus_per_node), layout.gpus
    nodes = -(-total // g)
    largest = 0.0
    for k in range(nodes):
        lo, hi = k * g, min((k + 1) * g, total)
        load, r = 0.0, lo
        while r < hi:
            stage = r // ranks_per_stage
            end = min(hi, (stage + 1) * ranks_per_stage)
            load += (end - r) * share[stage]
            r = end
        largest = max(largest, load)
    return CheckpointState(unique, largest, nodes, resident)


class LayoutCheckpointing(BaseModel):
    """Checkpointing of one layout at its optimal interval and the fraction of wall time that trains.

    `goodput_tokens_per_s_per_gpu` = predicted tokens/s/GPU (after any straggler slowdown) x the fraction;
    `problem` is set (and the fraction 0) when the checkpoint takes as long as the MTBF, or failures leave
    no training time at all."""

    effective_time_fraction: float
    checkpoint_s: float = Field(description="training paused per checkpoint (the copy to host when async)")
    write_s: float = Field(description="writing the unique state to storage (in the background when async)")
    interval_s: float | None = Field(description="optimal compute time between checkpoints (None: no interval works)")
    lost_per_failure_s: float | None
    mtbf_s: float
    checkpoint_bytes: float = Field(description="unique weights + optimizer state written")
    staged_bytes_per_gpu: float = Field(description="bytes the fullest GPU copies to host (async); 0 when sync")
    asynchronous: bool
    method: str
    goodput_tokens_per_s_per_gpu: float = 0.0
    problem: str | None = None

    def with_throughput(self, tokens_per_s_per_gpu: float) -> LayoutCheckpointing:
        return self.model_copy(
            update={"goodput_tokens_per_s_per_gpu": tokens_per_s_per_gpu * self.effective_time_fraction}
        )


@dataclass
class GoodputModel:
    """Per-layout checkpoint cost and effective time fraction, cached by what they depend on."""

    model: ModelSpec
    job: JobSpec
    failure: FailureSpec
    storage: StorageSpec
    gpus_per_node: int
    _cache: dict[tuple[object, ...], LayoutCheckpointing] = field(default_factory=dict, repr=False)

    def estimate(self, layout: Layout) -> LayoutCheckpointing:
        """The layout's checkpointing, cached by what it depends on: the degrees, sharding and stage split."""
        key = (layout.tp, layout.pp, layout.vp, layout.cp, layout.dp, layout.ep, layout.etp, layout.sharding,
               layout.first_stage_layers, layout.last_stage_layers)  # fmt: skip
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._estimate(layout)
        return hit

    def _estimate(self, layout: Layout) -> LayoutCheckpointing:
        st = checkpoint_state(self.model, self.job, layout, self.gpus_per_node)
        s = self.storage
        largest = st.largest_node_bytes if s.per_node_write_Bps is not None else None
        write_s = rel.checkpoint_write_s(st.unique_bytes, s.write_Bps, s.per_node_write_Bps,
                                         largest_node_bytes=largest)  # fmt: skip
        staged = st.resident_bytes_per_gpu if s.asynchronous else 0.0
        blocking_s = staged / s.d2h_Bps if s.asynchronous else write_s
        lag_s = write_s if s.asynchronous else 0.0
        mtbf_s = self.failure.job_mtbf_s(layout.gpus)
        common = dict(checkpoint_s=blocking_s, write_s=write_s, mtbf_s=mtbf_s, checkpoint_bytes=st.unique_bytes,
                      staged_bytes_per_gpu=staged, asynchronous=s.asynchronous, method=self.failure.method)  # fmt: skip
        try:
            cp = rel.plan_checkpointing(mtbf_s, blocking_s, self.failure.restart_s, self.failure.method, lag_s)
        except OptlayoutError as exc:
            return LayoutCheckpointing(effective_time_fraction=0.0, interval_s=None, lost_per_failure_s=None,
                                       problem=str(exc), **common)  # fmt: skip
        problem = None
        if cp.effective_time_fraction <= 0:
            problem = (
                f"MTBF {mtbf_s / rel.SECONDS_PER_MINUTE:.3g} min leaves no training time after the restart "
                f"({self.failure.restart_s / rel.SECONDS_PER_MINUTE:.3g} min) and checkpoints ({blocking_s:.3g} s "
                f"every {cp.interval_s / rel.SECONDS_PER_MINUTE:.3g} min)"
            )
        return LayoutCheckpointing(
            effective_time_fraction=cp.effective_time_fraction,
            interval_s=cp.interval_s,
            lost_per_failure_s=cp.lost_per_failure_s,
            problem=problem,
            **common,
        )
