"""The inputs of every decision: model shape, GPU, cluster shorthand and job (pydantic v2); the layout is
`optlayout.layout`'s (re-exported here).

Validation messages name the field; SI units inside (bytes, FLOP/s, bytes/s, seconds).
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from optlayout.inputs import limits
from optlayout.inputs.limits import MAX_GPUS
from optlayout.inputs.numbers import Count, NonNegativeCount, Real
from optlayout.layout.model import Layout, Recompute, Sharding

__all__ = ["ClusterSpec", "GpuSpec", "JobSpec", "Layout", "ModelSpec", "Recompute", "Sharding"]

MlpKind = Literal["swiglu", "gelu", "relu2"]
Precision = Literal["bf16", "fp16", "fp8"]
GpuArch = Literal["volta", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "other"]
AttentionKernel = Literal["flash", "flash2", "naive"]
HOPPER_OR_NEWER: frozenset[str] = frozenset({"hopper", "blackwell"})


class _Spec(BaseModel):
    # strict: a count given as "4096", 4096.0 or true is refused, never converted; NaN and infinity are refused.
    # Every size is bounded (optlayout.inputs.limits) so the space, the graph and the cost model stay bounded.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class RopeScaling(_Spec):
    """Llama 3.1's RoPE frequency scaling (`rope_type: llama3` in a Hugging Face config)."""

    factor: float = Field(8.0, gt=0)
    low_freq_factor: float = Field(1.0, gt=0)
    high_freq_factor: float = Field(4.0, gt=0)
    original_max_position: Count = Field(8192, le=limits.MAX_POSITIONS)


class ModelSpec(_Spec):
    """A dense decoder-only transformer, by shape. Parameter count is derived, never given.

    The position and norm fields (`rope_theta`, `rope_scaling`, `alibi`, `norm_eps`) change no count; the
    launcher emitters write them, so that a launched run trains this model and not a launcher default.
    """

    name: str = "custom"
    layers: Count = Field(le=limits.MAX_LAYERS)
    hidden: Count = Field(le=limits.MAX_HIDDEN)
    ffn: Count = Field(le=limits.MAX_FFN)
    heads: Count = Field(le=limits.MAX_HEADS)
    kv_heads: Count = Field(le=limits.MAX_HEADS)
    vocab: Count = Field(le=limits.MAX_VOCAB)
    mlp: MlpKind = "swiglu"
    tied_embeddings: bool = False
    head_dim: Count | None = Field(None, le=limits.MAX_HEAD_DIM)
    bias: bool = Field(False, description="linear layers and layer norms carry biases (GPT-2/3 style)")
    position_embeddings: NonNegativeCount = Field(
        0, le=limits.MAX_POSITIONS, description="learned absolute positions (0 = rotary)"
    )
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base (Llama 3: 500000); unused with learned positions")
    rope_scaling: RopeScaling | None = Field(None, description="Llama 3.1 RoPE scaling; None = plain RoPE")
    alibi: bool = Field(False, description="ALiBi attention biases instead of positions (MPT, BLOOM)")
    norm_eps: float = Field(1e-5, gt=0, description="RMSNorm/LayerNorm epsilon")

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) unless head_dim is given"
            )
        return self

    @cached_property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @cached_property
    def q_width(self) -> int:
        """Width of the query projection (heads x head size)."""
        return self.heads * self.head_size

    @cached_property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_size

    @cached_property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @cached_property
    def attention_param_count(self) -> int:
        h = self.hidden
        weights = h * self.q_width * 2 + h * self.kv_width * 2  # q, o, k, v
        biases = (self.q_width + 2 * self.kv_width + h) if self.bias else 0
        return weights + biases

    @cached_property
    def mlp_param_count(self) -> int:
        weights = self.mlp_matrices * self.hidden * self.ffn
        biases = (self.ffn * (self.mlp_matrices - 1) + self.hidden) if self.bias else 0
        return weights + biases

    @cached_property
    def norm_param_count_per_layer(self) -> int:
        return 2 * self.hidden * (2 if self.bias else 1)

    @cached_property
    def layer_param_count(self) -> int:
        """Parameters of one transformer block."""
        return self.attention_param_count + self.mlp_param_count + self.norm_param_count_per_layer

    @cached_property
    def embedding_param_count(self) -> int:
        """Input token (and position) embedding table."""
        return self.vocab * self.hidden + self.position_embeddings * self.hidden

    @cached_property
    def output_param_count(self) -> int:
        """Output projection (0 when tied to the input embedding) plus the final norm."""
        final_norm = self.hidden * (2 if self.bias else 1)
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + final_norm

    @cached_property
    def param_count(self) -> int:
        """Total parameter count."""
        return self.layers * self.layer_param_count + self.embedding_param_count + self.output_param_count

    @cached_property
    def matmul_param_count(self) -> int:
        """Parameters that take part in a matrix multiply per token (the N of 6N): all but lookups and norms."""
        blocks = self.layers * (self.attention_param_count + self.mlp_param_count)
        return blocks + self.vocab * self.hidden


class GpuSpec(_Spec):
    """One accelerator. Peak FLOP/s are dense (non-sparse) datasheet figures."""

    name: str
    arch: GpuArch = Field(
        "other",
        description="tensor-core generation; on hopper and blackwell, Ampere-era kernels (FlashAttention-2) run "
        "slower. 'other' (the default for a GPU built by hand) applies no such penalty",
    )
    memory_bytes: Real = Field(gt=0, le=limits.MAX_GPU_MEMORY_BYTES)
    peak_flops: dict[Precision, Annotated[Real, Field(ge=0, le=limits.MAX_PEAK_FLOPS)]] = Field(
        description="dense peak FLOP/s per matrix precision"
    )
    hbm_bandwidth_Bps: Real = Field(gt=0, le=limits.MAX_MEMORY_BANDWIDTH_BYTES_PER_S)
    scale_up_bandwidth_Bps: Real = Field(
        ge=0, le=limits.MAX_LINK_BYTES_PER_S, description="NVLink/Infinity Fabric per GPU, per direction"
    )
    source: str = ""

    def peak_flops_for(self, precision: str) -> float:
        if precision not in self.peak_flops or self.peak_flops[precision] <= 0:
            known = ", ".join(sorted(self.peak_flops))
            from optlayout.errors import UnsupportedError

            raise UnsupportedError(f"precision: {self.name} has no dense {precision} peak (known: {known})")
        return self.peak_flops[precision]


class ClusterSpec(_Spec):
    """The shorthand cluster of the run records; expands to the standard topology graph."""

    gpu: str
    gpus: Count = Field(le=MAX_GPUS)
    gpus_per_node: Count = Field(8, le=limits.MAX_GPUS_PER_SERVER)
    nvlink_domain: Count | None = Field(None, le=MAX_GPUS)
    inter_node_gbps_per_gpu: Real = Field(
        400.0, ge=limits.MIN_LINK_BYTES_PER_S * 8 / 1e9, le=limits.MAX_LINK_BYTES_PER_S * 8 / 1e9
    )
    oversubscription: Real = Field(
        1.0, ge=1.0, le=limits.MAX_OVERSUBSCRIPTION, description="leaf-to-spine oversubscription ratio"
    )

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        domain = self.nvlink_domain or self.gpus_per_node
        if self.gpus % self.gpus_per_node and self.gpus > self.gpus_per_node:
            raise ValueError(f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})")
        if domain % self.gpus_per_node and self.gpus_per_node % domain:
            raise ValueError(
                f"nvlink_domain ({domain}) must divide or be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        return self

    @property
    def domain_size(self) -> int:
        return min(self.nvlink_domain or self.gpus_per_node, self.gpus)


class JobSpec(_Spec):
    """What is trained: sequence length, batch and numerics."""

    seq_len: Count = Field(le=limits.MAX_SEQ_LEN)
    global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    global_batch_tokens: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH_TOKENS)
    min_global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH)
    max_global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH)
    precision: Precision = "bf16"
    optimizer_bytes_per_param: Real = Field(
        12.0,
        ge=0,
        le=limits.MAX_BYTES_PER_PARAM,
        description="fp32 master weights, momentum, variance (mixed-precision Adam)",
    )
    weight_bytes_per_param: Real = Field(2.0, gt=0, le=limits.MAX_BYTES_PER_PARAM, description="bf16 working weights")
    grad_bytes_per_param: Real = Field(2.0, gt=0, le=limits.MAX_BYTES_PER_PARAM, description="bf16 gradients")
    memory_headroom: Real = Field(0.05, ge=0, lt=1, description="fraction of GPU memory kept free")
    causal: bool = True
    dropout: bool = Field(False, description="dropout layers active (they store 1-byte masks for backward)")
    attention_kernel: AttentionKernel = Field(
        "flash",
        description="flash: the GPU generation's own IO-aware kernel (FlashAttention-2 on Ampere, cuDNN/"
        "FlashAttention-3 on Hopper and newer); flash2: FlashAttention-2 (or an Ampere-era Triton kernel) on any GPU; "
        "naive: softmax materialized",
    )

    @model_validator(mode="after")
    def _check_batch(self) -> JobSpec:
        if self.global_batch is not None and self.global_batch_tokens is not None:
            raise ValueError("give global_batch or global_batch_tokens, not both")
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            raise ValueError(
                f"global_batch_tokens ({self.global_batch_tokens}) is not a multiple of seq_len ({self.seq_len})"
            )
        lo, hi = self.min_global_batch, self.max_global_batch
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_global_batch ({lo}) exceeds max_global_batch ({hi})")
        return self

    @property
    def state_bytes_per_param(self) -> float:
        """Weights + gradients + optimizer state: 16 for mixed-precision Adam."""
        return self.weight_bytes_per_param + self.grad_bytes_per_param + self.optimizer_bytes_per_param

    @property
    def sequences_per_step(self) -> int | None:
        if self.global_batch is not None:
            return self.global_batch
        if self.global_batch_tokens is not None:
            return self.global_batch_tokens // self.seq_len
        return None
