"""Every calibratable constant of the cost model, in one place, each with its default and source.

`calibrate` (issue "compare and calibrate") fits these per GPU type and precision; everything else in
`optlayout.cost` is physics: FLOPs, bytes and link bandwidths.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

GIB = 2**30


class CostParams(BaseModel):
    """Calibratable constants. Defaults are physically reasoned, not fitted (see `source` of each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_efficiency: float = Field(
        0.78,
        gt=0,
        le=1,
        description="fraction of dense peak a large, well-shaped GEMM reaches. Source: cuBLAS on H100 SXM reaches "
        "~750-800 of 989 TFLOP/s BF16 on 8k x 8k x 8k (NVIDIA Transformer Engine / Lambda GEMM benchmarks); "
        "A100 ~250 of 312.",
    )
    fp8_gemm_efficiency_ratio: float = Field(
        0.80,
        gt=0,
        le=1,
        description="FP8 GEMMs reach a smaller fraction of their (2x) peak than BF16: H100 FP8 cuBLASLt ~1,250-1,400 "
        "of 1,979 TFLOP/s vs ~780 of 989 BF16 (NVIDIA Transformer Engine benchmarks), ratio ~0.8.",
    )
    attention_efficiency: float = Field(
        0.55,
        gt=0,
        le=1,
        description="fraction of its bound the IO-aware attention kernel reaches, forward and backward averaged: "
        "the slower of its tensor-core FLOPs at BF16 peak and its softmax exponentials at the GPU's SFU rate "
        "(`GpuSpec.sfu_exp_per_s`; the units overlap, so one efficiency for the slower). Source: "
        "FlashAttention-2 reaches 50-73% of A100 peak forward, lower backward (Dao 2023); FA2 on H100 ~35-50%, "
        "FA3 ~60-75% (Shah et al. 2024).",
    )
    flash2_speed_on_hopper: float = Field(
        0.57,
        gt=0,
        le=1,
        description="speed of FlashAttention-2 (mma.sync, no TMA/wgmma) on Hopper and newer relative to the native "
        "kernel. Source: FlashAttention-3 is 1.5-2.0x faster than FlashAttention-2 on H100 in BF16 (Shah et al. "
        "2024, abstract; FA2 reaches 35% of H100 peak): 1/1.75. PyTorch SDPA's FA2 backend ran at 329 TFLOP/s against "
        "cuDNN's 631 and FA3's 632 on an H100 (pytorch/pytorch issue #142132, Tritonbench): 0.52.",
    )
    triton_flash_speed: float = Field(
        1 / 1.8,
        gt=0,
        le=1,
        description="speed of FlashAttention in pre-MLIR Triton (llm-foundry's attn_impl triton, copied from "
        "flash-attention's flash_attn_triton.py @eff9fe6) relative to FlashAttention-2 on the same GPU. Source: "
        "FlashAttention-2 is 1.3-2.5x faster than FlashAttention in Triton, forward + backward on an A100 (Dao 2023, "
        "sec. 4.1): the range's geometric mean, 1.8; the Triton file itself: its forward + backward is slightly "
        "slower than FlashAttention-1's CUDA kernel, which FA2 beats by 1.7-3.0x (same section).",
    )
    attention_overhead_keys: float = Field(
        235.0,
        ge=0,
        description="L0 of the IO-aware attention kernel: a call over L keys runs at L / (L + L0) of its "
        "long-sequence speed. Source: FlashAttention-3 on an H100, head dim 128, non-causal, 16K tokens per batch "
        "(Tritonbench, pytorch/benchmark PR #2391): 430, 517, 566, 590, 614, 621 TFLOP/s at 512 ... 16K keys; "
        "1/speed = (1 + L0/L)/speed_inf fits them within 1% with L0 = 235, speed_inf = 630.",
    )
    attention_tile: int = Field(
        128,
        ge=1,
        description="key rows per tile of the attention kernel (a causal query tile also computes its diagonal "
        "tile). Source: FlashAttention-2/3 forward blocks of 128 (FA3 hopper tile_size_fwd: 128 x 128 causal).",
    )
    cp_correction_bytes_per_element: float = Field(
        10.0,
        ge=0,
        description="HBM bytes per output element and ring-attention step to merge that step's partial output "
        "into the running output: read the fp32 output (4 B) and the step's bf16 output (2 B), write the fp32 "
        "output (4 B). Source: Transformer Engine context_parallel.py flash_attn_fwd_out_correction, run once per "
        "step.",
    )
    cp_grad_accumulation_bytes_per_element: float = Field(
        6.0,
        ge=0,
        description="HBM bytes per gradient element and ring-attention step of the backward, which has no output "
        "correction but sums each step's gradients: dq_ into dq, the step's dk, dv into the received dk, dv (read "
        "both, write the sum, bf16). Source: Transformer Engine v1.11 transformer_engine/pytorch/attention.py, "
        "AttnFuncWithCPAndKVP2P.backward: dq = torch.empty_like(q) line 2300, dq.add_(dq_) lines 2736-2769, "
        "dkv.add_(dkv_) lines 2818-2862 (v2.4 dot_product_attention/context_parallel.py: lines 1565, 2167-2290).",
    )
    cp_kv_grad_concat_bytes_per_element: float = Field(
        4.0,
        ge=0,
        description="HBM bytes per key and value gradient element and ring-attention step to pack the fused "
        "(cuDNN) attention's dk and dv into one buffer before the sum (read and write, bf16). Source: Transformer "
        "Engine v1.11 transformer_engine/pytorch/attention.py line 2799, dkv_ = torch.cat((dk_, dv_)) on the fused "
        "attention path, which Transformer Engine prefers on Hopper and newer (v2.4 context_parallel.py keeps the "
        "cat for the thd format only; bshd/sbhd use combine_tensors, a view when dk and dv are adjacent).",
    )
    gemm_tile: int = Field(
        128,
        ge=1,
        description="GEMM tile edge: a dimension is padded up to a multiple of it (wave/tile quantization). Source: "
        "cuBLAS/CUTLASS Hopper tiles are 128x128 or 128x256 (NVIDIA 'Matrix Multiplication Background' guide).",
    )
    kernel_overhead_s: float = Field(
        4e-6,
        ge=0,
        description="fixed launch and tail cost per kernel. Source: CUDA kernel launch latency ~3-5 us "
        "(NVIDIA CUDA C++ Best Practices Guide).",
    )
    hbm_efficiency: float = Field(
        0.80,
        gt=0,
        le=1,
        description="fraction of HBM bandwidth memory-bound kernels reach. Source: STREAM-like copies on H100/A100 "
        "reach 80-90% of datasheet bandwidth (NVIDIA nvbandwidth, Citadel microbenchmarks).",
    )
    elementwise_bytes_per_token_hidden: float = Field(
        24.0,
        ge=0,
        description="bytes moved by norms, residual adds and rotary per token per hidden unit, forward, bf16: "
        "2 norms (read+write 2x2 B), 2 residual adds (read 2 + write 1, x2 B), rotary on q,k (~4 B) = 24 B.",
    )
    elementwise_bytes_per_token_ffn: float = Field(
        6.0,
        ge=0,
        description="bytes moved by the MLP activation per token per FFN unit, forward: read 2, write 1 values of 2 B "
        "(SwiGLU gate/up -> out; GeLU reads its input and writes its output, 4 B, rounded up alike).",
    )
    backward_elementwise_ratio: float = Field(
        2.0,
        gt=0,
        description="backward elementwise bytes / forward. Source: by hand, each elementwise op's backward reads "
        "its saved input and the incoming gradient and writes one gradient: twice the forward's read-and-write.",
    )
    attention_backward_ratio: float = Field(
        2.5, gt=0, description="FLOPs of the attention backward / forward for IO-aware kernels (Dao 2023: 2.5x)"
    )
    loss_bytes_per_logit: float = Field(
        16.0,
        ge=0,
        description="bytes moved per logit by the vocab-parallel cross-entropy (fp32 read/write of logits, softmax "
        "and its gradient: ~4 passes x 4 B). Source: Megatron vocab_parallel_cross_entropy.",
    )
    fp8_cast_bytes_per_element: float = Field(
        3.0,
        ge=0,
        description="bytes moved per GEMM-input element to cast it to FP8 (read 2 B bf16, write 1 B). Source: "
        "Transformer Engine quantizes each Linear input (and output gradient) before the FP8 GEMM.",
    )
    collective_efficiency: float = Field(
        0.85,
        gt=0,
        le=1,
        description="NCCL bus bandwidth reached / link bandwidth for large messages. Source: nccl-tests on DGX H100 "
        "all_reduce busbw ~360-400 GB/s of 450 NVLink; ~45 of 50 GB/s per NDR rail.",
    )
    tp_comm_overlap: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of TP collective time hidden under GEMMs, with sequence parallelism (Megatron-LM's "
        "--tp-comm-overlap, Transformer Engine userbuffers, requires SP; without SP nothing is hidden). Source: the "
        "flag is off by default, and without it the TP collectives block: none hidden; calibrated on NVIDIA's "
        "recipes, which turn it on, and emitted by the Megatron emitters wherever tp > 1 with SP.",
    )
    dp_comm_overlap: float = Field(
        0.9,
        ge=0,
        le=1,
        description="fraction of the backward pass under which data-parallel gradient reduction (and FSDP gathers) "
        "can hide. Source: Megatron --overlap-grad-reduce / PyTorch DDP buckets start reducing as soon as a bucket "
        "is ready (Li et al. 2020, PyTorch Distributed); the last bucket stays exposed.",
    )
    optimizer_bytes_moved_per_param: float = Field(
        30.0,
        ge=0,
        description="HBM bytes an Adam step moves per locally updated parameter: read fp32 master, m, v, grad "
        "(16 B), write master, m, v (12 B) and bf16 weight (2 B).",
    )
    runtime_reserve_bytes: float = Field(
        3.0 * GIB,
        ge=0,
        description="CUDA context, cuBLAS workspaces, NCCL buffers and allocator fragmentation. Source: CUDA context "
        "~0.5 GiB, NCCL ~1 GiB at scale (NCCL_BUFFSIZE 4 MiB x channels x peers), caching-allocator slack.",
    )
    logits_bytes_per_element: float = Field(
        4.0, ge=0, description="the output logits are kept in fp32 for the loss (Megatron cross-entropy in fp32)"
    )
    fsdp_prefetch_layers: int = Field(
        2, ge=1, description="unsharded layers alive at once under FSDP (current + prefetched next; PyTorch FSDP2)"
    )
    step_overhead_s: float = Field(
        0.0,
        ge=0,
        description="fixed per-step host overhead (data loading, logging). Source: none charged by default: "
        "Megatron's and PyTorch's data loaders prefetch the next batches in worker processes while the step runs "
        "(DataLoader num_workers, prefetch_factor); set it from a profile where the host is measured to stall.",
    )
    dp_bucket_param_count: float = Field(
        40e6,
        gt=0,
        description="parameters per gradient bucket (one reduce-scatter / all-gather / all-reduce each), at least; "
        "Source: Megatron-LM DistributedDataParallelConfig.bucket_size default max(40,000,000, 1,000,000 x dp).",
    )
    dp_bucket_param_count_per_rank: float = Field(
        1e6, ge=0, description="bucket parameters per data-parallel rank (the 1,000,000 x dp of the same default)"
    )
    nccl_base_latency_s: float = Field(
        8.4e-6,
        ge=0,
        description="fixed latency of one NCCL ring or tree collective, Simple protocol (large buffers). Source: "
        "NCCL src/graph/tuning.cc (v2.23.4 to v2.30), baseLat[Ring][Simple] = baseLat[Tree][Simple] = 8.4 us.",
    )
    nccl_nvlink_step_latency_s: float = Field(
        3.4e-6,
        ge=0,
        description="latency of one ring step over NVLink, Simple protocol. Source: NCCL src/graph/tuning.cc, "
        "hwLat[NVLink][Ring][Simple] = 3.4 us (a step moves one chunk to the next rank and waits for it).",
    )
    nccl_net_step_latency_s: float = Field(
        14e-6,
        ge=0,
        description="latency of one ring or tree step over the network, Simple protocol. Source: NCCL "
        "src/graph/tuning.cc (v2.23.4 to v2.30), hwLat[Net][Ring][Simple] = hwLat[Net][Tree][Simple] = 14 us.",
    )
    nccl_tree_nvlink_step_latency_s: float = Field(
        4e-6,
        ge=0,
        description="latency of one tree (chain) step over NVLink, Simple protocol. Source: NCCL src/graph/tuning.cc "
        "(v2.23.4 to v2.30), hwLat[NVLink][Tree][Simple] = 4.0 us (28 us, and no base latency, up to v2.22).",
    )
    # --- mixture-of-experts only (cost/moe.py); fitted on MoE runs alone, never from the dense ones ---
    grouped_gemm_efficiency_ratio: float = Field(
        0.95,
        gt=0,
        le=1,
        description="a grouped expert GEMM's rate / a dense GEMM's of the same shape, at large M per expert (tile "
        "padding and operand bytes at small M are priced by the GEMM model itself). Source: DeepGEMM's FP8 grouped "
        "'contiguous' GEMM, 1346 TFLOP/s at M 8192 per group against 1410 dense at M 4096, N 4096, K 7168 on H800 "
        "(deepseek-ai/DeepGEMM README @2e7e5801, moe.md 5.5): 0.95. No TE/cuBLAS BF16 grouped-GEMM table is "
        "published (moe.md 5.5 gap): the same ratio is assumed in BF16.",
    )
    all_to_all_efficiency: float = Field(
        0.85,
        gt=0,
        le=1,
        description="bandwidth the expert dispatch/combine all-to-all reaches / the EP group's link bandwidth. "
        "Source: DeepEP's normal kernels reach 153-158 of ~160 GB/s NVLink intranode and 43-58 GB/s RDMA of a "
        "50 GB/s CX7 NIC internode on H800 (deepseek-ai/DeepEP docs/legacy.md @dd758caf, moe.md 5.4): ~0.85-0.95.",
    )
    flex_dispatch_sms: float = Field(
        20.0,
        ge=0,
        description="SMs the flex dispatcher's dispatch and combine kernels hold while they run: with EP overlap the "
        "compute beside them gets the rest of the GPU's SMs (`GpuSpec.sm_count`). Source: DeepEP's `Buffer.num_sms = "
        "20` (deepseek-ai/DeepEP deep_ep/buffer.py) and Megatron-Core's `moe_deepep_num_sms = 20` (transformer_config"
        ".py), the default backend's; DeepSeek-V3 (arXiv:2412.19437 sec. 3.2.2) dedicates 20 of the H800's 132 SMs to "
        "communication. The alltoall dispatcher's NCCL kernels hold SMs too, but no source gives their count: none "
        "priced there.",
    )
    moe_permute_bytes_per_element: float = Field(
        4.0,
        ge=0,
        description="HBM bytes per element of each token (un)permutation pass: read and write a 16-bit copy. "
        "Megatron's alltoall dispatcher permutes the k copies before the dispatch and sorts them by local expert "
        "after it (and back) (token_dispatcher.py, moe.md 1.5).",
    )
    real_routing_imbalance: float = Field(
        1.2,
        ge=1,
        description="busiest rank's routed tokens / the mean under real (trained, dropless) routing; it scales the "
        "expert GEMMs, the received all-to-all bytes and the routed activations. Force-balanced benchmarks "
        "(job.moe_routing balanced) use 1. Source: an NVIDIA table shows throughput 8-20% lower with real routing "
        "than force-balanced (moe.md 0 item 7, 5.6); with the experts and their all-to-all half to two thirds of an "
        "MoE step, that needs the busiest rank's expert work ~1.15-1.35x the mean: 1.2 [derived, not fitted].",
    )

    def gemm_peak_fraction(self, precision: str) -> float:
        """Fraction of the precision's dense peak a large GEMM reaches."""
        return self.gemm_efficiency * (self.fp8_gemm_efficiency_ratio if precision == "fp8" else 1.0)


DEFAULT_PARAMS = CostParams()
