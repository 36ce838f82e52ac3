"""The mixture-of-experts FFN block of one layer: its step time and the bytes it keeps, on one GPU.

The block as Megatron-Core's `MoELayer` runs it with the `alltoall` dispatcher (moe.md sections 1.5, 5.3): the
layer input is the sequence-parallel shard, T_loc = s x b / (tp x cp) tokens; the router (h x E GEMM, softmax,
top-k) picks k experts per token; the k copies are permuted, dispatched over the EP group (all-to-all), gathered
over the expert-TP group (each member then holds etp x T_loc x k rows), sorted by local expert, run through the
E / ep local experts' grouped GEMMs (each expert's FFN split over etp), sorted back, reduce-scattered over
expert-TP, combined (all-to-all back) and un-permuted. The backward moves the same tensors the other way, in 16
bits. Shared experts run as a dense MLP of their total width, tensor-parallel like the attention. With the `flex`
dispatcher (DeepEP/HybridEP) a token moves once per destination rank, r = ep (1 - C(E - E/ep, k) / C(E, k))
expected under uniform routing (across scale-up domains once per destination domain: `flex_copies`), and is
dispatched in FP8 in FP8 jobs (moe.md 5.3).

Load: balanced routing (forced, benchmarks) gives each expert T_loc x k x ep / E rows per rank; real routing
multiplies the busiest rank's rows by `CostParams.real_routing_imbalance` (GEMMs, received all-to-all bytes,
routed activations). Activations follow the Megatron-MoE-ModelZoo estimator (moe.md 5.7): router probabilities and
the routing map over E per token, the permuted tokens, the experts' FFN internals, the combine output; not divided
by ep (EP exchanges tokens, it does not remove them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optlayout.cost import comm
from optlayout.cost.attention import ACT_BYTES, gemm_input_bytes
from optlayout.cost.params import CostParams
from optlayout.frozen import fast_init
from optlayout.layout.recompute import RecomputeModule
from optlayout.specs import GpuSpec, JobSpec, Layout, ModelSpec, Recompute

MLP_SAVED_VALUES = {"swiglu": 3, "gelu": 2, "relu2": 2}  # FFN internals kept per unit of width (fused SwiGLU: 3)


def mlp_saved_bytes_per_width(model: ModelSpec, job: JobSpec) -> float:
    """Bytes a (dense or shared-expert) MLP keeps per token and unit of its width: the activation's inputs at 16
    bits (SwiGLU: gate and up, FC1's output; GeLU and squared ReLU: one) and FC2's input, the activation's
    output, at `gemm_input_bytes` (FP8 jobs save it quantized; the activation function keeps its input only)."""
    return ACT_BYTES * (MLP_SAVED_VALUES[model.mlp] - 1) + gemm_input_bytes(job)


def imbalance(job: JobSpec, params: CostParams) -> float:
    """Busiest rank's routed load / the mean: 1 when the benchmark forces balance, else the real-routing figure."""
    return 1.0 if job.moe_routing == "balanced" else params.real_routing_imbalance


def distinct_ranks(experts: int, ep: int, top_k: int) -> float:
    """Expected distinct EP ranks a token's top_k experts fall on under uniform routing (moe.md 5.3)."""
    local = experts // ep
    miss = 1.0
    for i in range(top_k):  # C(E - E/ep, k) / C(E, k), one factor at a time
        miss *= max(experts - local - i, 0) / (experts - i)
    return ep * (1.0 - miss)


def flex_copies(experts: int, ep: int, top_k: int, domains: int) -> float:
    """Copies of a token the flex dispatcher (DeepEP, HybridEP) moves at the EP group's all-to-all rate: one per
    destination rank inside one scale-up domain; across domains, one per destination domain, the all-to-all being
    bound by the network share: DeepEP's internode dispatch sends a token once over RDMA to each destination node,
    with a mask of its NVLink ranks there, and forwards it over NVLink (deepseek-ai/DeepEP csrc/kernels/internode.cu,
    SourceMeta.is_token_in_nvl_rank_bits; the combine reduces inside the node before sending back; HybridEP is
    hierarchical alike, docs/README_Hybrid-EP.md; moe.md 5.3). `domains`: those the EP group spans, evenly."""
    if domains > 1:
        return distinct_ranks(experts, domains, top_k)
    return distinct_ranks(experts, ep, top_k)


def local_tokens(job: JobSpec, layout: Layout) -> float:
    """Tokens of one micro-batch entering an MoE layer on one GPU: the sequence-parallel shard (SP is mandatory
    with tp > 1 on MoE)."""
    return job.seq_len * layout.micro_batch / (layout.cp * layout.tp)


@fast_init
@dataclass(frozen=True)
class MoeTimes:
    """The MoE FFN block of one layer, one micro-batch, one GPU, forward (seconds; the backward from these)."""

    gemm_s: float  # router, routed experts (grouped)
    elementwise_s: float  # expert activations, (un)permutation, router softmax/top-k, FP8 casts
    comm_fwd_s: float  # dispatch and combine all-to-all, expert-TP gather and reduce-scatter
    comm_bwd_s: float
    activation_s: float = 0.0  # the routed experts' activation function alone (what `moe_act` recomputes)


def grouped_gemm_s(
    groups: int, m: float, n: float, k: float, flops_per_s: float, gpu: GpuSpec, params: CostParams
) -> float:
    """One grouped GEMM over `groups` experts of m x k @ k x n each: per expert the dense GEMM model (its own tile
    padding of m, its weights' bytes, its launch) at the grouped rate. Transformer Engine's GroupedLinear (and the
    legacy grouped_gemm path) issues one cuBLAS GEMM per local expert, round-robin over 4 compute streams
    (TransformerEngine transformer_engine/common/gemm/cublaslt_gemm.cu: nvte_multi_tensor_gemm falls back to
    multi_stream_cublas_gemm, a loop over num_gemms, except on Hopper with NVTE_USE_CUTLASS_GROUPED_GEMM=1 in BF16,
    default off), so each expert pays `kernel_overhead_s`: a fixed cost per local expert, layer and micro-batch."""
    from optlayout.cost.step import gemm_s

    if groups <= 0 or m <= 0:
        return 0.0
    return groups * gemm_s(m, n, k, flops_per_s * params.grouped_gemm_efficiency_ratio, gpu, params)


def routed_times(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    gpu: GpuSpec,
    links: comm.GroupLinks,
    params: CostParams,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> MoeTimes:
    """The router and routed experts of one MoE layer; `memo` (the step model's) keeps them by what they depend on,
    the tokens per GPU and the expert degrees (the EP group's link follows from ep and etp)."""
    from optlayout.cost.step import gemm_s

    t_loc = local_tokens(job, layout)
    key = ("routed", t_loc, layout.ep, layout.etp)
    cached: MoeTimes | None = memo.get(key) if memo is not None else None
    if cached is not None:
        return cached
    moe = model.moe
    assert moe is not None
    h, k, experts = model.hidden, moe.top_k, moe.experts
    load = imbalance(job, params)
    rows = t_loc * k * layout.etp * load  # routed rows this rank's experts run (after the expert-TP gather)
    local_experts = experts // layout.ep
    width = moe.expert_ffn / layout.etp
    gemm_rate = gpu.peak_flops_for(job.precision) * params.gemm_peak_fraction(job.precision)
    up = model.mlp_matrices - 1
    per_expert = rows / local_experts
    gemms = gemm_s(t_loc, experts, h, gemm_rate, gpu, params)  # the router
    gemms += grouped_gemm_s(local_experts, per_expert, up * width, h, gemm_rate, gpu, params)
    gemms += grouped_gemm_s(local_experts, per_expert, h, width, gemm_rate, gpu, params)
    passes = 2 if local_experts > 1 else 1  # the sort by local expert vanishes when ep = experts
    permute = params.moe_permute_bytes_per_element * h * (t_loc * k + (passes - 1) * rows) * 2  # there and back
    router = 8.0 * t_loc * experts  # softmax/sigmoid and top-k over fp32 logits: read and write 4 B
    ffn_bytes = params.elementwise_bytes_per_token_ffn * rows * width
    casts = params.fp8_cast_bytes_per_element * rows * (h + width) if job.precision == "fp8" else 0.0
    elementwise = (permute + router + ffn_bytes + casts) / (gpu.hbm_bandwidth_Bps * params.hbm_efficiency)
    fwd, bwd = _comm_s(model, job, layout, links, params, t_loc, load)
    hbm = gpu.hbm_bandwidth_Bps * params.hbm_efficiency
    routed = MoeTimes(gemms, elementwise + 6 * params.kernel_overhead_s, fwd, bwd,
                      ffn_bytes / hbm + params.kernel_overhead_s)  # fmt: skip
    if memo is not None:
        memo[key] = routed
    return routed


def routed_gemm_floor_s(model: ModelSpec, job: JobSpec, layout: Layout, gpu: GpuSpec, params: CostParams) -> float:
    """At most `routed_times(...).gemm_s` of every layout with `layout`'s tokens per GPU (`local_tokens`), whatever
    its ep and etp: the router GEMM (which neither changes) and the routed experts' unpadded FLOPs at the grouped
    rate. A rank runs T_loc x k x etp x load rows through experts of width expert_ffn / etp, so the FLOPs of its
    grouped GEMMs, 2 x rows x width x h x mlp_matrices, do not depend on ep or etp; `gemm_s` takes at least the
    (tile-padded) FLOPs at the rate, and more: the output store and the launches, dropped here."""
    from optlayout.cost.step import gemm_s

    moe = model.moe
    assert moe is not None
    t_loc = local_tokens(job, layout)
    gemm_rate = gpu.peak_flops_for(job.precision) * params.gemm_peak_fraction(job.precision)
    router = gemm_s(t_loc, moe.experts, model.hidden, gemm_rate, gpu, params)
    flops = 2.0 * t_loc * moe.top_k * imbalance(job, params) * moe.expert_ffn * model.hidden * model.mlp_matrices
    return router + flops / (gemm_rate * params.grouped_gemm_efficiency_ratio)


def _comm_s(
    model: ModelSpec,
    job: JobSpec,
    layout: Layout,
    links: comm.GroupLinks,
    params: CostParams,
    t_loc: float,
    load: float,
) -> tuple[float, float]:
    """(forward, backward) seconds of the block's token exchange: two all-to-alls each way over the EP group, and
    the expert-TP all-gather and reduce-scatter of the routed rows (the busiest rank receives `load` x the mean)."""
    moe = model.moe
    assert moe is not None
    h, k = model.hidden, moe.top_k
    eff, a2a_eff = params.collective_efficiency, params.all_to_all_efficiency
    flex = job.moe_dispatcher == "flex"
    copies = flex_copies(moe.experts, layout.ep, k, links.ep.domains) * layout.etp if flex else k  # every ETP rank
    dispatch_bytes = 1.0 if flex and job.precision == "fp8" else float(ACT_BYTES)
    moved = t_loc * copies * h * load

    def a2a(bytes_per_element: float) -> float:
        return comm.all_to_all_s(moved * bytes_per_element, links.ep, a2a_eff)

    etp_gather = layout.etp * t_loc * k * h * load
    if flex:  # the fused dispatcher reaches every expert-TP rank itself: no separate gather
        etp_fwd = etp_bwd = 0.0
    else:
        etp_fwd = comm.all_gather_s(etp_gather * ACT_BYTES, links.etp, eff)
        etp_fwd += comm.reduce_scatter_s(etp_gather * ACT_BYTES, links.etp, eff)
        etp_bwd = etp_fwd
    forward = a2a(dispatch_bytes) + a2a(ACT_BYTES) + etp_fwd
    backward = 2 * a2a(ACT_BYTES) + etp_bwd
    return forward, backward


def overlap_allowed(job: JobSpec, layout: Layout, any_pipeline: bool = False) -> bool:
    """Megatron's --overlap-moe-expert-parallel-comm applies: asked for, ep > 1, vp > 1 when pp > 1, no full
    recomputation and no `moe` among the recomputed modules (transformer_config.py L3002-3046, moe.md 1.3);
    `any_pipeline` drops the pipeline rule (for a bound over every pp and vp)."""
    pipeline_ok = any_pipeline or layout.pp == 1 or layout.vp > 1
    return (job.moe_ep_overlap and layout.ep > 1 and pipeline_ok and layout.recompute != Recompute.full
            and RecomputeModule.moe not in layout.selective_modules)  # fmt: skip


def held_sm_share(job: JobSpec, gpu: GpuSpec, params: CostParams) -> float:
    """The share of the GPU's SMs the token exchange's kernels hold while they run: the flex dispatcher's
    `CostParams.flex_dispatch_sms` of `GpuSpec.sm_count`; 0 for the alltoall dispatcher or an unknown SM count."""
    if job.moe_dispatcher != "flex" or gpu.sm_count is None:
        return 0.0
    return min(1.0, params.flex_dispatch_sms / gpu.sm_count)


def unpriced_sm_share_note(dispatcher: str, ep_overlap: bool, gpu: GpuSpec) -> str | None:
    """What a user must know of EP overlap with the flex dispatcher on a GPU of no known SM count: the SMs its
    kernels hold while the exchange runs (`held_sm_share`) go unpriced there, which is optimistic."""
    if dispatcher != "flex" or not ep_overlap or gpu.sm_count is not None:
        return None
    return (f"moe_ep_overlap with the flex dispatcher on {gpu.name}: its SM count is not known, so the SMs the "
            "dispatcher's kernels hold under the overlap are not priced (the exposed exchange is max(0, exchange - "
            "compute): optimistic); give sm_count in a GPU file (OPTLAYOUT_GPU_FILE)")  # fmt: skip


def exposed_comm_s(comm_s: float, compute_s: float, overlapped: bool, held_share: float = 0.0) -> float:
    """The token exchange left exposed: all of it, or with EP overlap what another micro-batch's compute of the
    same layer cannot hide (the 1F1B all-to-all overlap pairs one micro-batch's forward with another's backward).
    While the exchange runs its kernels hold `held_share` of the SMs (`held_sm_share`), so the compute under it
    runs at 1 - that share: the layer takes max(compute + share x exchange, exchange), which leaves
    max(share x exchange, exchange - compute) exposed."""
    return max(held_share * comm_s, comm_s - compute_s) if overlapped else comm_s


def moe_activation_bytes(model: ModelSpec, job: JobSpec, layout: Layout, params: CostParams) -> tuple[float, float]:
    """(split over TP, per GPU) bytes the MoE FFN block keeps for backward per micro-batch: the shared experts'
    internals split over TP like a dense MLP; the router's outputs, the permuted tokens, the routed experts'
    internals (expert width over etp) and the combine output per GPU (ModelZoo's estimator, moe.md 5.7).
    Selective recomputation's modules drop what they re-run: `moe` the whole block (only its input, the pre-MLP
    norm's output, stays), `shared_experts` the shared experts' internals, `moe_act` the routed activation's
    output (fc2's input)."""
    moe = model.moe
    assert moe is not None
    h, k, experts = model.hidden, moe.top_k, moe.experts
    tokens = job.seq_len * layout.micro_batch / layout.cp
    t_loc = local_tokens(job, layout)
    rows = t_loc * k * layout.etp * imbalance(job, params)
    values = MLP_SAVED_VALUES[model.mlp]
    modules = layout.selective_modules
    if RecomputeModule.moe in modules:
        return 0.0, 0.0
    shared = tokens * moe.shared_experts * moe.shared_width * mlp_saved_bytes_per_width(model, job)
    if RecomputeModule.shared_experts in modules:
        shared = 0.0
    router = t_loc * experts * (ACT_BYTES + 8)  # probabilities (16-bit) and the int64 routing map
    width = moe.expert_ffn / layout.etp
    # the grouped GEMMs' inputs (permuted tokens, activation output) are kept in FP8 by FP8 jobs (Megatron MoE
    # README "FP8 Training": FP8 storage of linear inputs, "50% activation reduction"); fc1's output in 16 bits
    gemm_input = gemm_input_bytes(job)
    act_out = 0.0 if RecomputeModule.moe_act in modules else gemm_input * width  # the activation's output
    routed = rows * (gemm_input * h + act_out + ACT_BYTES * width * (values - 1))
    combine = ACT_BYTES * t_loc * k * h
    return shared, router + routed + combine


def expert_params_per_gpu(model: ModelSpec, layout: Layout, moe_layers: int) -> float:
    """Routed-expert parameters one GPU holds for `moe_layers` MoE layers: all experts over etp x ep."""
    if model.moe is None or moe_layers <= 0:
        return 0.0
    return moe_layers * model.moe.experts * model.expert_param_count / (layout.etp * layout.ep)


def dense_moe_params_per_rank(model: ModelSpec, tp: int) -> float:
    """The non-routed FFN parameters of one MoE layer on one TP rank: shared experts (TP-split) and the router
    (replicated)."""
    return model.shared_expert_param_count / tp + model.router_param_count
