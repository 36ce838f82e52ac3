"""The one cost model: memory per GPU and step time of a layout, used by solve, the oracle, explain and compare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from optlayout.cost.comm import GroupLinks, LinkSource, group_links
from optlayout.cost.flops import hardware_flops_per_token, mfu, model_flops_per_token
from optlayout.cost.memory import MemoryBreakdown, memory_per_gpu, usable_memory_bytes
from optlayout.cost.moe import unpriced_sm_share_note
from optlayout.cost.params import DEFAULT_PARAMS, CostParams
from optlayout.cost.step import TimeBreakdown, step_time
from optlayout.frozen import fast_init
from optlayout.layout.stages import recomputed_share
from optlayout.specs import GpuSpec, JobSpec, Layout, ModelSpec, fp8_pricing_note

__all__ = [
    "DEFAULT_PARAMS",
    "CostParams",
    "Evaluation",
    "GroupLinks",
    "MemoryBreakdown",
    "Prediction",
    "TimeBreakdown",
    "evaluate",
    "group_links",
    "pricing_notes",
    "usable_memory_bytes",
]


class Prediction(BaseModel):
    """Everything the cost model says about one layout."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    memory_per_gpu_bytes: float
    memory_capacity_bytes: float
    fits: bool
    bubble_fraction: float
    memory: dict[str, float]
    time: dict[str, float]
    fullest_stage: int


@fast_init
@dataclass(frozen=True)
class Evaluation:
    """The cost model's raw answer for one layout; `prediction()` turns it into the reported form."""

    layout: Layout
    memory: MemoryBreakdown
    times: TimeBreakdown
    tokens_per_s_per_gpu: float
    memory_capacity_bytes: float

    @property
    def memory_per_gpu_bytes(self) -> float:
        return self.memory.total_bytes

    @property
    def bubble_fraction(self) -> float:
        return (self.layout.pp - 1) / (self.layout.vp * self.layout.grad_accum)

    def prediction(self, model: ModelSpec, job: JobSpec, gpu: GpuSpec) -> Prediction:
        mem, times, tps = self.memory, self.times, self.tokens_per_s_per_gpu
        peak = gpu.peak_flops_for(job.precision)
        return Prediction(
            step_time_s=times.step_time_s,
            tokens_per_s_per_gpu=tps,
            mfu=mfu(tps, model_flops_per_token(model, job.seq_len, job.causal), peak),
            hfu=mfu(
                tps,
                hardware_flops_per_token(
                    model, job.seq_len, self.layout.recompute, job.causal, recomputed_share(model.layers, self.layout)
                ),
                peak,
            ),
            memory_per_gpu_bytes=mem.total_bytes,
            memory_capacity_bytes=self.memory_capacity_bytes,
            fits=mem.total_bytes <= self.memory_capacity_bytes,
            bubble_fraction=self.bubble_fraction,
            memory={
                "weights_bytes": mem.weights_bytes,
                "gradients_bytes": mem.gradients_bytes,
                "optimizer_bytes": mem.optimizer_bytes,
                "activations_bytes": mem.activations_bytes,
                "buffers_bytes": mem.buffers_bytes,
                "reserve_bytes": mem.reserve_bytes,
            },
            time={
                "compute_s": times.compute_s,
                "tp_comm_s": times.tp_comm_s,
                "cp_comm_s": times.cp_comm_s,
                "ep_comm_s": times.ep_comm_s,
                "pp_comm_s": times.pp_comm_s,
                "bubble_s": times.bubble_s,
                "dp_comm_s": times.dp_comm_s,
                "optimizer_s": times.optimizer_s,
                "overhead_s": times.overhead_s,
            },
            fullest_stage=mem.stage,
        )


def evaluate(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    topology: LinkSource,
    params: CostParams = DEFAULT_PARAMS,
    links: GroupLinks | None = None,
    memo: dict[tuple[object, ...], Any] | None = None,
    times: TimeBreakdown | None = None,
) -> Evaluation:
    """Memory per GPU and step time of `layout` (assumed legal: see `optlayout.layout.check_layout`); `times`, the
    layout's own `step_time` when the caller has it already (the same figures, not computed again)."""
    links = links or group_links(topology, layout)
    job = job.on_gpu(gpu)
    mem = memory_per_gpu(model, job, layout, params, memo)
    if times is None:
        most, experts = mem.most_params
        times = step_time(model, job, layout, gpu, links, params, most, memo, experts)
    tps = layout.global_batch * job.seq_len / times.step_time_s / layout.gpus
    return Evaluation(layout, mem, times, tps, usable_memory_bytes(gpu.memory_bytes, job))


def pricing_notes(job: JobSpec, gpu: GpuSpec) -> list[str]:
    """What the predictions of `job` on `gpu` do not price of what was asked, one line each."""
    notes = (fp8_pricing_note(job.fp8_recipe), unpriced_sm_share_note(job.moe_dispatcher, job.moe_ep_overlap, gpu))
    return [note for note in notes if note]
