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
        description="fraction of BF16 peak of the IO-aware attention kernel, forward and backward averaged. Source: "
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
        description="backward elementwise bytes / forward (reads "
        "the saved input and the incoming gradient, writes one gradient)",
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
        description="fraction of TP collective time hidden under GEMMs. Megatron without --tp-comm-overlap hides none.",
    )
    dp_comm_overlap: float = Field(
        0.9,
        ge=0,
        le=1,
        description="fraction of the backward pass under which data-parallel gradient reduction (and FSDP gathers) "
        "can hide. Source: Megatron --overlap-grad-reduce / PyTorch DDP buckets start reducing as soon as a bucket "
        "is ready (Li et al. 2020, PyTorch Distributed); the last bucket stays exposed.",
    )
    pp_comm_overlap: float = Field(
        0.5, ge=0, le=1, description="fraction of pipeline send/receive hidden (Megatron overlaps p2p by default)"
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
    step_overhead_s: float = Field(0.0, ge=0, description="fixed per-step host overhead (data loading, logging)")
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
