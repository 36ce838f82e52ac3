"""The one cost model: memory per GPU and step time of a layout, used by solve, the oracle, explain and compare."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from optlayout.cost.comm import GroupLinks, LinkSource, group_links
from optlayout.cost.flops import hardware_flops_per_token, mfu, model_flops_per_token
from optlayout.cost.memory import (
    MemoryBreakdown,
    memory_per_gpu,
    stage_layer_counts,
    stage_params,
    usable_memory_bytes,
    vp_fits,
)
from optlayout.cost.params import DEFAULT_PARAMS, CostParams
from optlayout.cost.step import TimeBreakdown, step_time
from optlayout.errors import OptlayoutError
from optlayout.specs import GpuSpec, JobSpec, Layout, ModelSpec

__all__ = [
    "DEFAULT_PARAMS",
    "CostParams",
    "Evaluation",
    "GroupLinks",
    "MemoryBreakdown",
    "Prediction",
    "TimeBreakdown",
    "check_layout",
    "estimate",
    "evaluate",
    "group_links",
    "layout_problems",
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


def layout_problems(model: ModelSpec, job: JobSpec, layout: Layout, gpus: int) -> list[str]:
    """Rules a layout must satisfy to run at all, independent of memory; empty when legal."""
    problems = []
    if layout.gpus != gpus:
        problems.append(f"tp*pp*cp*dp = {layout.gpus} but the cluster has {gpus} GPUs")
    if model.heads % layout.tp:
        problems.append(f"heads ({model.heads}) not divisible by tp ({layout.tp})")
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        problems.append(f"kv_heads ({model.kv_heads}) and tp ({layout.tp}): neither divides the other")
    if layout.pp > model.layers:
        problems.append(f"pp ({layout.pp}) exceeds the layer count ({model.layers})")
    if job.seq_len % (2 * layout.cp) and layout.cp > 1:
        problems.append(f"seq_len ({job.seq_len}) not divisible by 2*cp ({2 * layout.cp}) for load-balanced CP")
    try:
        counts = stage_layer_counts(model.layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers)
    except ValueError as exc:
        problems.append(str(exc))
        counts = []
    if layout.vp > 1 and counts and not vp_fits(counts, layout.vp):
        problems.append(f"layers per stage {sorted(set(counts))} cannot be split into vp ({layout.vp}) chunks")
    if layout.vp > 1 and layout.grad_accum % layout.pp:
        problems.append(f"interleaved schedule needs micro-batches ({layout.grad_accum}) divisible by pp ({layout.pp})")
    if layout.pp > 1 and layout.grad_accum < layout.pp:
        problems.append(f"1F1B needs at least pp ({layout.pp}) micro-batches per step, got {layout.grad_accum}")
    steps = job.sequences_per_step
    if steps is not None and layout.global_batch != steps:
        problems.append(
            f"global batch micro_batch*grad_accum*dp = {layout.global_batch} differs from the job's {steps} sequences"
        )
    return problems


def check_layout(model: ModelSpec, job: JobSpec, layout: Layout, gpus: int) -> None:
    """Raise a one-line OptlayoutError naming the first broken rule."""
    model.require_dense("cost model", job.seq_len)
    problems = layout_problems(model, job, layout, gpus)
    if problems:
        raise OptlayoutError("layout: " + "; ".join(problems))


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
            hfu=mfu(tps, hardware_flops_per_token(model, job.seq_len, self.layout.recompute, job.causal), peak),
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
    memo: dict | None = None,
) -> Evaluation:
    """Memory per GPU and step time of `layout` (assumed legal: see `check_layout`)."""
    model.require_dense("cost model", job.seq_len)
    links = links or group_links(topology, layout)
    mem = memory_per_gpu(model, job, layout, params)
    counts = stage_layer_counts(model.layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers)
    params_on_gpu = max(stage_params(model, layout, i, n) for i, n in enumerate(counts))
    times = step_time(model, job, layout, gpu, links, params, params_on_gpu, memo)
    tps = layout.global_batch * job.seq_len / times.step_time_s / layout.gpus
    return Evaluation(layout, mem, times, tps, usable_memory_bytes(gpu.memory_bytes, job))


def estimate(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    topology: LinkSource,
    params: CostParams = DEFAULT_PARAMS,
    links: GroupLinks | None = None,
) -> Prediction:
    """Predict memory per GPU and step time of `layout` (assumed legal: see `check_layout`)."""
    return evaluate(model, job, layout, gpu, topology, params, links).prediction(model, job, gpu)
