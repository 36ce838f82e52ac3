"""Step time: compute on the slowest pipeline stage, exposed TP/CP/PP/DP communication, bubble, optimizer.

Per micro-batch and layer, on one GPU: the layer's GEMMs (per GEMM: a main loop bound by FLOPs at the
GEMM efficiency of the precision's peak, with tile padding, or by operand bytes, then the output store,
plus a launch cost), the attention core (at the attention kernel's efficiency of the slower of its tensor-core
FLOPs and its softmax exponentials), and memory-bound elementwise work. Backward is twice the GEMMs and
`attention_backward_ratio` times the attention's FLOPs (one more exponential per score);
recomputation repeats the forward (full) or the attention core (selective). The pipeline runs
(m + (p - 1)/v) slots of the slowest stage (1F1B / interleaved 1F1B).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from optlayout.cost import comm
from optlayout.cost.attention import (
    ACT_BYTES,
    DENSE_LAYER,
    LayerKind,
    attention_gemm_shapes,
    attention_norm_elementwise_bytes,
    context,
    core_widths,
    io_aware_core_s,
    kv_width_per_rank,
    mtp_kind,
)
from optlayout.cost.moe import exposed_comm_s, held_sm_share, overlap_allowed, routed_gemm_floor_s, routed_times
from optlayout.cost.params import CostParams
from optlayout.frozen import fast_init
from optlayout.layout.recompute import RecomputeModule
from optlayout.layout.stages import rank_kinds, rank_recomputed_kinds
from optlayout.specs import HOPPER_OR_NEWER, GpuSpec, JobSpec, Layout, ModelSpec, Recompute, Sharding


@fast_init
@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step, split by where the time goes."""

    compute_s: float  # GEMMs, attention and elementwise work of all micro-batches on the slowest stage
    tp_comm_s: float  # exposed tensor-parallel collectives
    cp_comm_s: float  # exposed context-parallel exchange
    ep_comm_s: float  # exposed MoE token exchange (expert all-to-all, expert-TP gathers)
    pp_comm_s: float  # exposed pipeline send/receive
    bubble_s: float  # pipeline fill and drain
    dp_comm_s: float  # exposed gradient reduction / FSDP gathers
    optimizer_s: float
    overhead_s: float

    @property
    def step_time_s(self) -> float:
        return (
            self.compute_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.ep_comm_s
            + self.pp_comm_s
            + self.bubble_s
            + self.dp_comm_s
            + self.optimizer_s
            + self.overhead_s
        )


def _padded(dim: float, tile: int) -> float:
    return math.ceil(dim / tile) * tile


def gemm_s(m: float, n: float, k: float, flops_per_s: float, gpu: GpuSpec, params: CostParams) -> float:
    """Time of one (m x k) @ (k x n) GEMM in 16-bit operands.

    The main loop streams the operands while the tensor cores work, so it takes the longer of the (tile-padded)
    FLOPs at the GEMM rate and the operand bytes at HBM bandwidth; the epilogue then stores the (m x n) output,
    counted as not hidden. That holds for non-persistent kernels; Hopper's persistent warp-specialized kernels
    overlap part of it, a difference the fitted GEMM efficiency absorbs. Narrow GEMMs (hidden 768-2048) pay
    most: cross-validated on the published runs this fits better than a pure roofline (benchmarks/RESULTS.md).
    """
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    tile = params.gemm_tile
    flops = 2.0 * _padded(m, tile) * _padded(n, tile) * _padded(k, tile)
    hbm = gpu.hbm_bandwidth_Bps * params.hbm_efficiency
    main_loop = max(flops / flops_per_s, 2.0 * (m * k + k * n) / hbm)
    return main_loop + 2.0 * m * n / hbm + params.kernel_overhead_s


def attention_length_factor(seq_len: int, cp: int, causal: bool, params: CostParams) -> float:
    """Time of the IO-aware attention of one sequence over its long-key-length time, for the keys each kernel call
    sees: a call over L keys runs at L / (L + L0) of its long-sequence speed (a fixed cost per query tile, worth
    L0 = `attention_overhead_keys` keys). Causal: each query tile also computes its diagonal key tile (T =
    `attention_tile`), so a causal sequence of s keys costs 1 + (T + 2 L0) / s. Ring attention with the
    load-balanced split (2cp chunks, rank r holds r and 2cp-1-r, as Megatron/TE) runs cp steps of equal work:
    one causal over the rank's s/cp keys, then, on the slowest rank (the last, which sets the pace), cp - 1
    steps of all its s/cp queries against the first half of a received chunk, s/(2cp) keys, each 1 + 2 cp L0 / s:
    1 + (T + 2 L0 + 2 (cp - 1) L0) / s. Non-causal: every step sees s/cp keys."""
    l0 = params.attention_overhead_keys
    if not causal:
        return 1.0 + l0 * cp / seq_len
    return 1.0 + (params.attention_tile + 2 * l0 + 2 * (cp - 1) * l0) / seq_len


def fp8_cast_widths(model: ModelSpec, shapes: list[tuple[float, float]], sp_div: int, ffn: bool) -> float:
    """Elements per token one TP rank quantizes for its layer's FP8 GEMMs: each GEMM's input width k, the inputs
    of the column-parallel GEMMs that sequence parallelism gathers (GQA's QKV projection and the FFN's first) over
    the rank's 1/`sp_div` sequence shard only: Transformer Engine quantizes the local shard and all-gathers the
    FP8 data (v1.x module/linear.py _Linear.forward: cast_to_fp8 of inputmat, then gather_along_first_dim under
    sequence_parallel; v2.x: input_quantizer(inputmat) before gather_along_first_dim(..., quantizer)). MLA's down
    projections are duplicated on every rank over the gathered sequence (`attention` module doc): cast whole."""
    widths = sum(k for _, k in shapes)
    gathered = (shapes[0][1] if model.attention.kind != "mla" else 0.0) + (shapes[-2][1] if ffn else 0.0)
    return widths - gathered * (1 - 1 / sp_div)


@fast_init
@dataclass(frozen=True)
class LayerTimes:
    """One transformer layer, one micro-batch, one GPU (seconds)."""

    gemm_fwd_s: float
    attention_fwd_s: float
    attention_bwd_s: float  # the attention core's backward (without recomputation)
    elementwise_fwd_s: float
    tp_comm_fwd_s: float  # collectives of one forward, before overlap
    cp_comm_fwd_s: float
    ep_comm_fwd_s: float = 0.0  # MoE token exchange (all-to-all, expert-TP gathers), forward
    ep_comm_bwd_s: float = 0.0
    modules: tuple[ModuleTimes, ...] = ()  # what each module selective recomputation can re-run costs
    cp_merge_fwd_s: float = 0.0  # ring attention (CP): the forward's per-step output correction
    cp_merge_bwd_s: float = 0.0  # and the backward's per-step gradient sums

    def forward_compute_s(self) -> float:
        return self.gemm_fwd_s + self.attention_fwd_s + self.elementwise_fwd_s + self.cp_merge_fwd_s

    def recomputed(self, modules: frozenset[RecomputeModule]) -> tuple[float, float, float]:
        """(compute, TP collective, MoE token exchange) seconds of the forward that selective recomputation of
        `modules` repeats in this layer's backward."""
        picked = [m for m in self.modules if m.module in modules]
        return (sum(m.compute_s for m in picked), sum(m.tp_comm_s for m in picked),
                sum(m.ep_comm_s for m in picked))  # fmt: skip


@fast_init
@dataclass(frozen=True)
class ModuleTimes:
    """One module's forward in one layer, one micro-batch, one GPU (seconds): what recomputing it repeats."""

    module: RecomputeModule
    compute_s: float
    tp_comm_s: float = 0.0  # its TP collectives (before overlap)
    ep_comm_s: float = 0.0  # its MoE token exchange


def layer_times(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    kind: LayerKind = DENSE_LAYER,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> LayerTimes:
    """Forward-pass pieces of one layer of `kind`; the backward and recompute are derived from them (`memo`: see
    `step_time`). An MoE layer is its attention and shared experts (`_layer_base`) plus its routed experts."""
    base = _memo_layer_base(model, job, layout, gpu, links, params, kind, memo)
    if not kind.moe:
        return base
    routed = routed_times(model, job, layout, gpu, links, params, memo)
    shared = next((m for m in base.modules if m.module == RecomputeModule.shared_experts), None)
    block = ModuleTimes(RecomputeModule.moe, routed.gemm_s + routed.elementwise_s + (shared.compute_s if shared else 0),
                        shared.tp_comm_s if shared else 0.0, routed.comm_fwd_s)  # fmt: skip
    act = ModuleTimes(RecomputeModule.moe_act, routed.activation_s)
    return LayerTimes(base.gemm_fwd_s + routed.gemm_s, base.attention_fwd_s, base.attention_bwd_s,
                      base.elementwise_fwd_s + routed.elementwise_s, base.tp_comm_fwd_s, base.cp_comm_fwd_s,
                      routed.comm_fwd_s, routed.comm_bwd_s, (*base.modules, block, act), base.cp_merge_fwd_s,
                      base.cp_merge_bwd_s)  # fmt: skip


def _memo_layer_base(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    kind: LayerKind,
    memo: dict[tuple[object, ...], Any] | None,
) -> LayerTimes:
    """`_layer_base` through the memo, under what it depends on: (tp, cp, micro-batch, sequence parallelism, kind)."""
    key = ("base", layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, kind)
    base: LayerTimes | None = memo.get(key) if memo is not None else None
    if base is None:
        base = _layer_base(model, job, layout, gpu, links, params, kind)
        if memo is not None:
            memo[key] = base
    return base


def _layer_base(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    kind: LayerKind,
) -> LayerTimes:
    """A layer without its routed experts: attention, the dense FFN or the shared experts, TP and CP exchanges."""
    t = layout.tp
    tokens = job.seq_len * layout.micro_batch / layout.cp
    h, f = model.hidden, model.ffn
    kv_rank = kv_width_per_rank(model, t)  # replicated when tp > kv_heads
    gemm_rate = gpu.peak_flops_for(job.precision) * params.gemm_peak_fraction(job.precision)
    shapes = attention_gemm_shapes(model, t)
    # the FFN: dense, or an MoE layer's shared experts (a dense MLP of their total width; none without them)
    moe = model.moe
    ffn_width = (f if moe is None or not kind.moe else moe.shared_experts * moe.shared_width) / t
    if ffn_width:
        shapes += [((model.mlp_matrices - 1) * ffn_width, h), (h, ffn_width)]
    shape_s = [gemm_s(tokens, n, k, gemm_rate, gpu, params) for n, k in shapes]
    gemms = sum(shape_s)
    score, value = core_widths(model, t)
    ctx = context(model, job.seq_len, job.causal, kind)
    # each CP rank's queries see the whole sequence (ring attention)
    attn_flops = 2.0 * tokens * ctx * (score + value)
    hbm = gpu.hbm_bandwidth_Bps * params.hbm_efficiency
    bf16_peak = gpu.peak_flops_for("bf16") if "bf16" in gpu.peak_flops else gpu.peak_flops_for(job.precision)
    scores = model.heads / t * tokens * ctx
    ratio = params.attention_backward_ratio
    if job.attention_kernel != "naive":
        efficiency = params.attention_efficiency
        if job.attention_kernel in ("flash2", "triton") and gpu.arch in HOPPER_OR_NEWER:
            efficiency *= params.flash2_speed_on_hopper  # both are Ampere kernels (mma.sync, no TMA/wgmma)
        if job.attention_kernel == "triton":
            efficiency *= params.triton_flash_speed
        # ring attention (CP) runs the kernel once per K/V chunk, on shorter keys; the diagonal tiles exponentiate
        # their masked scores too
        length = attention_length_factor(job.seq_len, layout.cp, job.causal, params)
        launches = layout.cp * params.kernel_overhead_s
        attention, attention_bwd = io_aware_core_s(
            attn_flops * length, scores * length, bf16_peak, gpu.sfu_exp_per_s, efficiency, ratio, launches
        )
    else:  # two batched GEMMs plus a materialized softmax (read and write the scores, fp16)
        attention = attn_flops / (bf16_peak * params.gemm_efficiency) + 3 * 2.0 * scores / hbm
        attention_bwd = ratio * attention
    sp_div = t if layout.sequence_parallel else 1
    dropout_bytes = 6.0 if job.dropout else 0.0  # two masks written and read, and the dropped values
    elementwise_bytes = (
        tokens * h / sp_div * (params.elementwise_bytes_per_token_hidden + dropout_bytes)
        + tokens * ffn_width * params.elementwise_bytes_per_token_ffn
        + tokens * attention_norm_elementwise_bytes(model, layout.tp)
    )
    # ring attention (CP): the forward merges each step's partial output into the output (TE's out correction),
    # the backward sums each step's dq, and its dk, dv (packed first) into those received; per step, over the rank's
    # tokens
    merge_fwd = merge_bwd = 0.0
    if layout.cp > 1:
        merge_fwd = layout.cp * tokens * value * params.cp_correction_bytes_per_element / hbm
        kv_grad_bytes = params.cp_grad_accumulation_bytes_per_element + params.cp_kv_grad_concat_bytes_per_element
        merge_bwd = layout.cp * tokens * (score * params.cp_grad_accumulation_bytes_per_element
                                          + 2 * kv_rank * kv_grad_bytes) / hbm  # fmt: skip
    if job.precision == "fp8":  # each GEMM input is cast to fp8 first (the backward casts the gradients alike)
        elementwise_bytes += params.fp8_cast_bytes_per_element * tokens * fp8_cast_widths(model, shapes, sp_div,
                                                                                          ffn_width > 0)  # fmt: skip
    shared_block = kind.moe and ffn_width > 0  # the shared experts launch their own 3 kernels
    kernels = 8 + 3 * shared_block + 2 * model.attention.qk_norm  # the query and key norms: one kernel each
    elementwise = elementwise_bytes / hbm + kernels * params.kernel_overhead_s
    # TP: 2 all-reduces per forward (or 2 all-gathers + 2 reduce-scatters with SP: same volume): the attention's
    # and the MLP's; an MoE layer's routed experts have none (their split is etp), its shared experts have one.
    activation = 2.0 * tokens * h
    tp_collectives = 1 + (ffn_width > 0)
    tp_comm = tp_collectives * comm.all_reduce_s(activation, links.tp, params.collective_efficiency)
    # CP ring attention: each of cp-1 steps passes this rank's K and V chunk to its neighbour.
    kv_chunk = 2.0 * 2.0 * tokens * kv_rank
    cp_comm = (layout.cp - 1) * comm.p2p_s(kv_chunk, links.cp, params.collective_efficiency)
    one_collective = tp_comm / tp_collectives
    # the modules selective recomputation re-runs: the core; the 2 norms (read and write 2 B each, the norms'
    # share of elementwise_bytes_per_token_hidden); the dense MLP or the shared experts (their GEMMs, activation
    # and TP collective); MLA's up projections (their GEMMs, and RoPE reading and writing Q and K)
    modules = [ModuleTimes(RecomputeModule.core_attn, attention),
               ModuleTimes(RecomputeModule.layernorm, 2 * 2 * ACT_BYTES * tokens * h / sp_div / hbm
                           + 2 * params.kernel_overhead_s)]  # fmt: skip
    if ffn_width:
        ffn_s = sum(shape_s[-2:]) + tokens * ffn_width * params.elementwise_bytes_per_token_ffn / hbm
        ffn_s += (3 if shared_block else 1) * params.kernel_overhead_s
        modules.append(ModuleTimes(RecomputeModule.shared_experts if kind.moe else RecomputeModule.mlp, ffn_s,
                                   one_collective))  # fmt: skip
    if model.attention.kind == "mla":
        q_up = 1 if model.attention.q_lora_rank else 0  # the query's up projection (none without a query LoRA)
        up_s = shape_s[q_up] * q_up + shape_s[q_up + 2] + 2 * ACT_BYTES * tokens * 2 * score / hbm
        modules.append(ModuleTimes(RecomputeModule.mla_up_proj, up_s + (1 + q_up) * params.kernel_overhead_s))
    return LayerTimes(gemms, attention, attention_bwd, elementwise, tp_comm, cp_comm, modules=tuple(modules),
                      cp_merge_fwd_s=merge_fwd, cp_merge_bwd_s=merge_bwd)  # fmt: skip


@fast_init
@dataclass(frozen=True)
class StageTimes:
    """Per micro-batch on one stage (seconds): forward and backward, with exposed TP, CP and EP time apart."""

    compute_fwd_s: float
    compute_bwd_s: float
    tp_exposed_s: float
    cp_exposed_s: float
    ep_exposed_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_fwd_s + self.compute_bwd_s + self.tp_exposed_s + self.cp_exposed_s + self.ep_exposed_s


def tp_overlap_applies(layout: Layout) -> bool:
    """Whether the layout's TP collectives run under the GEMMs: TP with sequence parallelism. Transformer Engine's
    userbuffers overlap (Megatron's --tp-comm-overlap) needs SP (Megatron-LM megatron/training/arguments.py: "Tensor
    parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"); without SP the
    all-reduces block. The emitters turn the overlap on exactly here."""
    return layout.tp > 1 and layout.sequence_parallel


def tp_exposed_share(layout: Layout, params: CostParams) -> float:
    """The share of the TP collectives' time left exposed: all of it, or where the overlap applies what
    `CostParams.tp_comm_overlap` leaves."""
    return 1.0 - params.tp_comm_overlap if tp_overlap_applies(layout) else 1.0


def stage_times(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    params: CostParams,
    mix: tuple[tuple[LayerTimes, int], ...],
    last: bool,
    mtp: LayerTimes | None = None,
    overlapped: bool | None = None,
    recomputed: tuple[int, ...] | None = None,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> StageTimes:
    """One micro-batch through one stage: its layers (`mix`: each kind's times and count), plus the output layer
    and loss on the last, and there the multi-token-prediction modules (`mtp`: their block's times). `overlapped`:
    whether EP overlap applies (default: where Megatron allows it for this layout). `recomputed`: with full
    recomputation, how many of each kind's layers it re-runs (default all; the MTP modules always). `memo`: see
    `step_time`."""
    fwd_s = bwd_s = tp_s = cp_s = ep_s = 0.0
    full = layout.recompute == Recompute.full
    if overlapped is None:
        overlapped = overlap_allowed(job, layout)
    rerun = [n if full else 0 for _, n in mix] if recomputed is None or not full else list(recomputed)
    layers = [(lt, n, r) for (lt, n), r in zip(mix, rerun, strict=True)]
    if last and mtp is not None and model.mtp_layers:
        layers.append((mtp, model.mtp_layers, model.mtp_layers if full else 0))
    selective = layout.selective_modules if layout.recompute == Recompute.selective else None
    elementwise_ratio, tp_exposed = params.backward_elementwise_ratio, tp_exposed_share(layout, params)
    cp_degree, held = layout.cp, held_sm_share(job, gpu, params) if overlapped else 0.0
    for lt, count, rerun_count in layers:
        fwd = lt.gemm_fwd_s + lt.attention_fwd_s + lt.elementwise_fwd_s + lt.cp_merge_fwd_s  # `forward_compute_s`
        bwd = 2 * lt.gemm_fwd_s + lt.attention_bwd_s
        bwd += elementwise_ratio * lt.elementwise_fwd_s + lt.cp_merge_bwd_s
        ep_comm = lt.ep_comm_fwd_s + lt.ep_comm_bwd_s
        if selective is not None:  # the modules' forwards again, their collectives and exchange
            compute_again_s, tp_again_s, ep_again_s = lt.recomputed(selective)
            bwd += compute_again_s
            ep_comm += ep_again_s
        else:
            tp_again_s = 0.0
        # full recomputation re-runs the forward of `rerun_count` layers: its compute, its TP collectives, and
        # the MoE token exchange (the recomputed forward dispatches and combines again)
        share = rerun_count / count if count else 0.0
        bwd += share * fwd
        ep_comm += share * lt.ep_comm_fwd_s
        tp = tp_exposed * (lt.tp_comm_fwd_s * (2.0 + share) + tp_again_s)  # fwd, bwd, recomputed
        # Ring attention hides each step's K/V exchange under the attention of the chunk already received, step
        # by step: cp steps of equal work (load-balanced causal split), cp - 1 exchanges; the backward sends K/V
        # and their gradients.
        cp = 0.0
        if cp_degree > 1:
            exchange, step = lt.cp_comm_fwd_s / (cp_degree - 1), lt.attention_fwd_s / cp_degree
            cp = (cp_degree - 1) * (max(0.0, exchange - step) + max(0.0, 2 * exchange - lt.attention_bwd_s / cp_degree))
        fwd_s += count * fwd
        bwd_s += count * bwd
        tp_s += count * tp
        cp_s += count * cp
        ep_s += count * exposed_comm_s(ep_comm, fwd + bwd, overlapped, held)
    if last:
        head_fwd_s, head_bwd_s = _output_head_s(model, job, layout, gpu, params, memo)
        fwd_s += head_fwd_s
        bwd_s += head_bwd_s
    return StageTimes(fwd_s, bwd_s, tp_s, cp_s, ep_s)


def _output_head_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
) -> tuple[float, float]:
    """(forward, backward) seconds of the output layer and loss of one micro-batch on the last stage, and there of
    the multi-token-prediction modules' heads and projections; through the memo under (tp, cp, micro-batch)."""
    key = ("output_head", layout.tp, layout.cp, layout.micro_batch)
    found: tuple[float, float] | None = memo.get(key) if memo is not None else None
    if found is None:
        tokens = job.seq_len * layout.micro_batch / layout.cp
        gemm_rate = gpu.peak_flops_for(job.precision) * params.gemm_peak_fraction(job.precision)
        logits = gemm_s(tokens, model.vocab / layout.tp, model.hidden, gemm_rate, gpu, params)
        loss = (
            tokens
            * model.vocab
            / layout.tp
            * params.loss_bytes_per_logit
            / (gpu.hbm_bandwidth_Bps * params.hbm_efficiency)
        )
        heads = 1 + model.mtp_layers  # each MTP module passes through the shared output head and its own loss
        # and projects [embedding; hidden] (2h) back to h first
        project = 0.0
        if model.mtp_layers:
            project = gemm_s(tokens, model.hidden, 2 * model.hidden / layout.tp, gemm_rate, gpu, params)
        found = (
            heads * (logits + loss / 2) + model.mtp_layers * project,
            heads * (2 * logits + loss / 2) + (model.mtp_layers * 2 * project),
        )
        if memo is not None:
            memo[key] = found
    return found


def step_time(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    param_count_on_gpu: float,
    memo: dict[tuple[object, ...], Any] | None = None,
    expert_param_count_on_gpu: float = 0.0,
) -> TimeBreakdown:
    """Compose one optimizer step on the slowest stage. `param_count_on_gpu` is what one GPU of the fullest stage
    holds, `expert_param_count_on_gpu` the routed experts among them (reduced and sharded over expert-DP).

    `memo` (optional, owned by the caller for one model, job, GPU, topology and params) reuses the layer and
    stage times that many layouts share: they depend only on (tp, cp, micro_batch, sequence_parallel, ep, etp),
    the layer kind, and the recomputation and stage shape.
    """
    slowest, slowest_layers = _slowest_stage(model, job, layout, gpu, links, params, memo)
    m, p, v = layout.grad_accum, layout.pp, layout.vp
    pp_comm = _pipeline_comm_s(model, job, layout, links, params, slowest, memo)

    # Data parallel, in Megatron's buckets (one collective each; FSDP: one per layer): the dense parameters over
    # dp x cp, the routed experts over expert-DP, both under the same compute.
    traffic = _memo_dp_traffic(job, layout, links, params, param_count_on_gpu, expert_param_count_on_gpu,
                               slowest_layers, memo)  # fmt: skip
    dp_comm = _dp_exposed_s(layout, params, traffic, slowest.compute_fwd_s, slowest.compute_bwd_s, slowest_layers)
    optimizer = optimizer_s(layout, gpu, links, params, param_count_on_gpu, expert_param_count_on_gpu)
    compute = m * (slowest.compute_fwd_s + slowest.compute_bwd_s)
    return TimeBreakdown(
        compute_s=compute,
        tp_comm_s=m * slowest.tp_exposed_s,
        cp_comm_s=m * slowest.cp_exposed_s,
        ep_comm_s=m * slowest.ep_exposed_s,
        pp_comm_s=pp_comm,
        bubble_s=(p - 1) / v * slowest.total_s,
        dp_comm_s=dp_comm,
        optimizer_s=optimizer,
        overhead_s=params.step_overhead_s,
    )


def _pipeline_comm_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    links: comm.GroupLinks,
    params: CostParams,
    slowest: StageTimes,
    memo: dict[tuple[object, ...], Any] | None,
) -> float:
    """The exposed pipeline send/receive of one step, the slowest stage's compute (`slowest`) hiding what it can."""
    m, p, v = layout.grad_accum, layout.pp, layout.vp
    eff = params.collective_efficiency
    # Pipeline: one activation (sequence-sharded with SP) forward and one gradient backward per chunk boundary.
    # Warm-up and cool-down: the first forward and the last backward cross each of the p-1 boundaries once, on
    # its own link, exposed. Steady state, paced by the slowest boundary: interleaved (v > 1), Megatron sends and
    # receives asynchronously under the next chunk's compute (overlap_p2p_comm, on by default), so a message costs
    # only what a chunk's forward or backward cannot cover; 1F1B (v = 1) exchanges block (Megatron turns the
    # overlap off for it): a forward and a backward exchange per micro-batch on the critical path.
    if p == 1:
        return 0.0
    # the links are the topology's for the layout's rank grids, the message the micro-batch's
    fkey = ("pp_fill", layout.tp, p, layout.cp, layout.dp, layout.ep, layout.etp, v > 1, layout.micro_batch,
            layout.sequence_parallel)  # fmt: skip
    sends: tuple[float, float] | None = memo.get(fkey) if memo is not None else None
    if sends is None:
        tokens = job.seq_len * layout.micro_batch / layout.cp
        msg = 2.0 * tokens * model.hidden / (layout.tp if layout.sequence_parallel else 1)
        fill = sum(2 * comm.p2p_s(msg, b, eff) for b in links.pp_fill or (links.pp,) * (p - 1))
        sends = fill, comm.p2p_s(msg, links.pp, eff)
        if memo is not None:
            memo[fkey] = sends
    fill, send = sends
    if v > 1:
        f_chunk, b_chunk = slowest.compute_fwd_s / v, slowest.compute_bwd_s / v
        steady = m * v * (max(0.0, send - f_chunk) + max(0.0, send - b_chunk))
    else:
        steady = m * 2 * send
    return steady + fill


def sharding_free_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """The terms of `step_time` no sharding changes, summed: compute, exposed TP/CP/EP time, bubble, pipeline
    send/receive and the fixed overhead (`step_time` less `dp_comm_s` and `optimizer_s`)."""
    slowest = _slowest_stage(model, job, layout, gpu, links, params, memo)[0]
    m, p, v = layout.grad_accum, layout.pp, layout.vp
    pp_comm = _pipeline_comm_s(model, job, layout, links, params, slowest, memo)
    exposed_s = m * slowest.tp_exposed_s + m * slowest.cp_exposed_s + m * slowest.ep_exposed_s
    compute_s = m * (slowest.compute_fwd_s + slowest.compute_bwd_s)
    return compute_s + exposed_s + (p - 1) / v * slowest.total_s + pp_comm + params.step_overhead_s


def _memo_dp_traffic(
    job: JobSpec,
    layout: Layout,
    links: comm.GroupLinks,
    params: CostParams,
    param_count_on_gpu: float,
    expert_param_count_on_gpu: float,
    layers: int,
    memo: dict[tuple[object, ...], Any] | None,
) -> tuple[float, float]:
    """`_dp_traffic` through the memo: the parameter counts, the rank grids' links and the sharding decide it (and
    FSDP's per-layer collectives the stage's `layers`)."""
    fsdp = layout.sharding == Sharding.fsdp
    key = ("dp_traffic", layout.sharding, param_count_on_gpu, expert_param_count_on_gpu, layers if fsdp else 0,
           layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.etp, layout.vp > 1)  # fmt: skip
    traffic: tuple[float, float] | None = memo.get(key) if memo is not None else None
    if traffic is None:
        dense = param_count_on_gpu - expert_param_count_on_gpu
        traffic = _dp_traffic(job, layout, links, params, dense, expert_param_count_on_gpu, layers)
        if memo is not None:
            memo[key] = traffic
    return traffic


def _dp_exposed_s(
    layout: Layout, params: CostParams, traffic: tuple[float, float], fwd_s: float, bwd_s: float, layers: int
) -> float:
    """The exposed data-parallel time of one step: its collectives (`_dp_traffic`) less what the slowest stage's
    compute per micro-batch (`fwd_s`, `bwd_s`, over its `layers`) hides of them. It never rises as that compute
    grows (each term is max(0, collective - overlap x compute))."""
    overlap, m = params.dp_comm_overlap, layout.grad_accum
    if layout.sharding == Sharding.fsdp:
        # Per layer, per micro-batch: the next layer's weights are gathered under this layer's compute, forward
        # and backward, and its gradients reduce-scattered under the backward; what a layer's compute cannot
        # cover is exposed, and so are the first gather of each pass and the last reduce-scatter.
        ag, rs = traffic
        fwd_layer, bwd_layer = fwd_s / layers, bwd_s / layers
        per_mb = 2 * ag + rs + (layers - 1) * (max(0.0, ag - overlap * fwd_layer)
                                               + max(0.0, ag + rs - overlap * bwd_layer))  # fmt: skip
        return m * per_mb
    if layout.sharding == Sharding.zero2:  # the gradients reduce-scattered every micro-batch
        per_mb, gather = traffic
        return m * max(0.0, per_mb - overlap * bwd_s) + max(0.0, gather - overlap * fwd_s)
    if layout.sharding == Sharding.zero1:
        reduce, gather = traffic
        return max(0.0, reduce - overlap * bwd_s) + max(0.0, gather - overlap * fwd_s)
    return max(0.0, traffic[0] - overlap * bwd_s)


def optimizer_s(
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    param_count_on_gpu: float,
    expert_param_count_on_gpu: float = 0.0,
) -> float:
    """The optimizer step on one GPU of the fullest stage: its share of the parameters (sharded over dp x cp, the
    routed experts over expert-DP, with any sharding) through HBM, and its kernels' launches. Recomputation and
    sequence parallelism change none of it."""
    dense_param_count = param_count_on_gpu - expert_param_count_on_gpu
    sharded = layout.sharding != Sharding.none
    local_param_count = dense_param_count / (links.dp_cp.size if sharded else 1)
    local_param_count += expert_param_count_on_gpu / (links.edp.size if sharded else 1)
    return (
        local_param_count * params.optimizer_bytes_moved_per_param / (gpu.hbm_bandwidth_Bps * params.hbm_efficiency)
        + 20 * params.kernel_overhead_s
    )


def dp_comm_floor_s(
    model: ModelSpec,
    job: JobSpec,
    heaviest: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    param_count_on_gpu: float,
    memo: dict[tuple[object, ...], Any] | None = None,
    expert_param_count_on_gpu: float = 0.0,
) -> float:
    """At most the exposed data-parallel time (`step_time`'s `dp_comm_s`) of every layout of `heaviest`'s degrees,
    split and sharding whose every stage runs no more forward and no more backward compute per micro-batch than the
    same stage of `heaviest`: that time never rises with the slowest stage's compute (`_dp_exposed_s`), so it is at
    least its value at the largest forward and the largest backward of any of `heaviest`'s stages, at the layer
    count of one of them (the least over those). The parameter counts are `step_time`'s."""
    key = ("dp_floor_compute", heaviest.tp, heaviest.cp, heaviest.micro_batch, heaviest.sequence_parallel,
           heaviest.ep, heaviest.etp, heaviest.recompute, heaviest.recompute_modules, heaviest.recompute_layers,
           heaviest.pp, heaviest.vp, heaviest.first_stage_layers, heaviest.last_stage_layers)  # fmt: skip
    found: tuple[float, float, tuple[int, ...]] | None = memo.get(key) if memo is not None else None
    if found is None:
        overlapped, shapes = overlap_allowed(job, heaviest), _stage_shapes(model, heaviest, memo)
        stages = [_stage(model, job, heaviest, gpu, links, params, memo, mix, last, overlapped, r)
                  for mix, last, r, _ in shapes]  # fmt: skip
        found = (max(st.compute_fwd_s for st in stages), max(st.compute_bwd_s for st in stages),
                 tuple(sorted({n for *_, n in shapes})))  # fmt: skip
        if memo is not None:
            memo[key] = found
    fwd_s, bwd_s, layer_counts = found
    if heaviest.sharding != Sharding.fsdp:
        layer_counts = layer_counts[:1]  # the collectives and their exposure do not depend on it
    return min(
        _dp_exposed_s(heaviest, params, _memo_dp_traffic(job, heaviest, links, params, param_count_on_gpu,
                                                         expert_param_count_on_gpu, n, memo), fwd_s, bwd_s, n)
        for n in layer_counts
    )  # fmt: skip


def _dp_traffic(
    job: JobSpec,
    layout: Layout,
    links: comm.GroupLinks,
    params: CostParams,
    dense_param_count: float,
    expert_param_count: float,
    layers: int,
) -> tuple[float, float]:
    """The data-parallel collectives of one step, before overlap, in Megatron's buckets (one collective each; FSDP:
    one per layer): the dense parameters over dp x cp, the routed experts over expert-DP. FSDP: (one layer's
    all-gather, its reduce-scatter); ZeRO-1/2: (the gradients' reduce-scatter, the weights' all-gather); none:
    (the gradients' all-reduce, 0)."""
    eff = params.collective_efficiency
    sets = [(dense_param_count, links.dp_cp)]
    if expert_param_count:
        sets.append((expert_param_count, links.edp))

    def bucketed(collective: Callable[[float, comm.Link, float, CostParams], float], bytes_per_param: float) -> float:
        total = 0.0
        for count, link in sets:
            bucket = max(params.dp_bucket_param_count, params.dp_bucket_param_count_per_rank * link.size)
            buckets = max(1, math.ceil(count / bucket))
            total += buckets * collective(count * bytes_per_param / buckets, link, eff, params)
        return total

    grad_bytes, weight_bytes = job.grad_bytes_per_param, job.param_gather_bytes_per_param
    if layout.sharding == Sharding.fsdp:
        ag = sum(comm.all_gather_s(c * weight_bytes / layers, link, eff, params) for c, link in sets)
        rs = sum(comm.reduce_scatter_s(c * grad_bytes / layers, link, eff, params) for c, link in sets)
        return ag, rs
    if layout.sharding in (Sharding.zero1, Sharding.zero2):
        return bucketed(comm.reduce_scatter_s, grad_bytes), bucketed(comm.all_gather_s, weight_bytes)
    return bucketed(comm.all_reduce_s, grad_bytes), 0.0


def _slowest_stage(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
) -> tuple[StageTimes, int]:
    """The slowest stage's times per micro-batch and the layers it holds, through the memo: they depend on the
    layer-times key, the recomputation and the stage split only (not on dp, accumulation or sharding)."""
    key = ("slowest", layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, layout.ep, layout.etp,
           layout.recompute, layout.recompute_modules, layout.recompute_layers, layout.pp, layout.vp,
           layout.first_stage_layers, layout.last_stage_layers)  # fmt: skip
    found: tuple[StageTimes, int] | None = memo.get(key) if memo is not None else None
    if found is None:
        overlapped = overlap_allowed(job, layout)
        stages = [(_stage(model, job, layout, gpu, links, params, memo, mix, last, overlapped, r), layers)
                  for mix, last, r, layers in _stage_shapes(model, layout, memo)]  # fmt: skip
        found = max(stages, key=lambda stage: stage[0].total_s)
        if memo is not None:
            memo[key] = found
    return found


def _stage_shapes(
    model: ModelSpec, layout: Layout, memo: dict[tuple[object, ...], Any] | None
) -> list[tuple[tuple[tuple[LayerKind, int], ...], bool, tuple[tuple[LayerKind, int], ...] | None, int]]:
    """The distinct stages of the layout's split (stages alike cost alike), in a fixed order: (the layers of each
    kind it holds, whether it is the last, the layers of each kind full recomputation re-runs (None: all), its
    layer count); through the memo under the split and the recomputed layer count alone."""
    partial = layout.recompute_layers if layout.recompute == Recompute.full else None
    key = ("stage_shapes", layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers, partial)
    found = memo.get(key) if memo is not None else None
    if found is None:
        held = rank_kinds(model.layer_kinds, layout)
        rerun = _recomputed_mixes(model, layout)
        shapes = {(mix, i == layout.pp - 1, rerun[i]) for i, mix in enumerate(held)}
        found = [(mix, last, r, sum(n for _, n in mix)) for mix, last, r in sorted(shapes)]
        if memo is not None:
            memo[key] = found
    return found


def _recomputed_mixes(model: ModelSpec, layout: Layout) -> tuple[tuple[tuple[LayerKind, int], ...] | None, ...]:
    """Per pipeline rank, the layers of each kind full recomputation re-runs; None where it re-runs them all."""
    if layout.recompute != Recompute.full or layout.recompute_layers is None:
        return (None,) * layout.pp
    return rank_recomputed_kinds(model.layer_kinds, layout)


def whole_model_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """One micro-batch through every layer and the output, as if on one stage, with EP overlap wherever the job
    asks for it: the sum over the stages of their per-micro-batch times, or less, for any pp and vp."""
    overlapped = overlap_allowed(job, layout, any_pipeline=True)
    whole_rerun = None  # the layers of each kind full recomputation re-runs over all the stages
    if (per_rank := _recomputed_mixes(model, layout))[0] is not None:
        whole_rerun = tuple(sorted(sum((Counter(dict(mix)) for mix in per_rank if mix), Counter()).items()))
    return _stage(model, job, layout, gpu, links, params, memo, _whole_mix(model.layer_kinds), True,
                  overlapped, whole_rerun).total_s  # fmt: skip


def whole_model_floor_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """At most `whole_model_s` of every layout without recomputation sharing `layout`'s tp, cp, micro-batch and
    sequence parallelism (what a layer's attention, dense FFN or shared experts and their TP and CP exchanges depend
    on), whatever its ep and etp: the same layers and output, each MoE layer's routed experts at
    `routed_gemm_floor_s` alone (no routed elementwise work, no token exchange). Without recomputation every term of
    `stage_times` only rises with a layer's GEMM and elementwise times and its token exchange, all that the routed
    experts add."""
    assert layout.recompute == Recompute.none

    def floor(kind: LayerKind) -> LayerTimes:
        b = _memo_layer_base(model, job, layout, gpu, links, params, kind, memo)
        if not kind.moe:
            return b
        return LayerTimes(b.gemm_fwd_s + routed_gemm_floor_s(model, job, layout, gpu, params), b.attention_fwd_s,
                          b.attention_bwd_s, b.elementwise_fwd_s, b.tp_comm_fwd_s, b.cp_comm_fwd_s,
                          cp_merge_fwd_s=b.cp_merge_fwd_s, cp_merge_bwd_s=b.cp_merge_bwd_s)  # fmt: skip

    mix = tuple([(floor(kind), n) for kind, n in _whole_mix(model.layer_kinds)])
    mtp = floor(mtp_kind(model)) if model.mtp_layers else None
    return stage_times(model, job, layout, gpu, params, mix, True, mtp, False, None, memo).total_s


@lru_cache(maxsize=256)
def _whole_mix(kinds: tuple[LayerKind, ...]) -> tuple[tuple[LayerKind, int], ...]:
    return tuple(sorted(Counter(kinds).items()))


def _stage(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
    mix: tuple[tuple[LayerKind, int], ...],
    last: bool,
    overlapped: bool,
    recomputed: tuple[tuple[LayerKind, int], ...] | None,
) -> StageTimes:
    """A stage holding `mix` layers of each kind, through the memo (`overlapped`, `recomputed` (the layers of each
    kind full recomputation re-runs): see `stage_times`)."""
    lkey = (layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, layout.ep, layout.etp)
    skey = (*lkey, layout.recompute, layout.recompute_modules, overlapped, mix, last, recomputed)
    st = memo.get(skey) if memo is not None else None
    if st is None:
        mtp = _memo_layer_times(model, job, layout, gpu, links, params, memo, lkey, mtp_kind(model)) if (
            last and model.mtp_layers) else None  # fmt: skip
        rerun = None
        if recomputed is not None:
            again = dict(recomputed)
            rerun = tuple([again.get(k, 0) for k, _ in mix])
        held = tuple([(_memo_layer_times(model, job, layout, gpu, links, params, memo, lkey, k), n) for k, n in mix])
        st = stage_times(model, job, layout, gpu, params, held, last, mtp, overlapped, rerun, memo)
        if memo is not None:
            memo[skey] = st
    return st


def _memo_layer_times(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None,
    lkey: tuple[object, ...],
    kind: LayerKind,
) -> LayerTimes:
    """`layer_times` of `kind` through the memo, under the layer-times key `lkey` (see `_stage`)."""
    key = (*lkey, kind)
    lt: LayerTimes | None = memo.get(key) if memo is not None else None
    if lt is None:
        lt = layer_times(model, job, layout, gpu, links, params, kind, memo)
        if memo is not None:
            memo[key] = lt
    return lt


def step_floor_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """The step's compute, exposed TP/CP/EP time and bubble (`step_time` less pipeline sends, data-parallel
    traffic, optimizer and overhead): a lower bound on its step time that needs no parameter counts."""
    total = _slowest_stage(model, job, layout, gpu, links, params, memo)[0].total_s
    return (layout.grad_accum + (layout.pp - 1) / layout.vp) * total
