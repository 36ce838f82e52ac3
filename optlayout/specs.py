"""The inputs of every decision: model shape, GPU, cluster shorthand and job (pydantic v2); the layout is
`optlayout.layout`'s (re-exported here).

Validation messages name the field; SI units inside (bytes, FLOP/s, bytes/s, seconds).
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from optlayout.errors import UnsupportedError
from optlayout.inputs import limits
from optlayout.inputs.limits import MAX_GPUS
from optlayout.inputs.numbers import Count, NonNegativeCount, Real
from optlayout.layout.model import Layout, Recompute, Sharding
from optlayout.model import AttentionSpec, LayerKind, MoeSpec

__all__ = ["ClusterSpec", "Fp8Recipe", "GpuSpec", "JobSpec", "Layout", "ModelSpec", "Recompute", "Sharding"]

MlpKind = Literal["swiglu", "gelu", "relu2"]
NormKind = Literal["rmsnorm", "layernorm"]
Precision = Literal["bf16", "fp16", "fp8"]
Fp8Recipe = Literal["tensorwise", "rowwise", "blockwise", "mxfp8"]
"""FP8 scaling: tensorwise (one scale per tensor, delayed or current), rowwise (one per row, torchao), blockwise
(1x128 activation and 128x128 weight tiles, DeepSeek-V3), mxfp8 (32-element microscaling blocks, Blackwell)."""
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
PRICED_FP8_RECIPE: Fp8Recipe = "tensorwise"
"""The recipe the calibrated FP8 constants stand for: per-tensor scaling, that of most FP8 calibration runs (stated,
or their framework's default: Megatron-LM/NeMo delayed, Megatron-Bridge current). The cost model prices every
recipe as this one."""
GpuArch = Literal["volta", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "other"]
AttentionKernel = Literal["flash", "flash2", "triton", "naive"]
Optimizer = Literal["adam", "muon"]
MoeRouting = Literal["balanced"]
MoeDispatcher = Literal["alltoall", "flex"]
StateDtype = Literal["fp32", "bf16", "fp16", "fp8"]
"""The dtype an optimizer keeps one of its per-parameter states in (master weights, Adam's moments)."""
MainParamsDtype = Literal["fp32", "bf16", "fp16"]
STATE_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
HOPPER_OR_NEWER: frozenset[str] = frozenset({"hopper", "blackwell"})


def recipe_needs_fp8(recipe: str | None, info: ValidationInfo) -> str | None:
    """An FP8 recipe goes with precision fp8 only (a field validator's check; precision is validated first)."""
    precision = info.data.get("precision")
    if recipe is not None and precision is not None and precision != "fp8":
        raise ValueError(f"needs precision fp8 (precision is {precision})")
    return recipe


def gather_needs_fp8(fp8_param_gather: bool | None, precision: str) -> None:
    """FP8 primary weights go with precision fp8 only (a job's and a run record's check)."""
    if fp8_param_gather and precision != "fp8":
        raise ValueError(f"fp8_param_gather needs precision fp8 (precision is {precision})")


def fp8_pricing_note(recipe: str | None) -> str | None:
    """What a user must know of a recipe other than the priced one: the step time does not tell them apart
    (benchmarks/RESULTS.md, FP8 recipes); the memory does, by the saved inputs' bytes."""
    if recipe is None or recipe == PRICED_FP8_RECIPE:
        return None
    return (f"fp8_recipe {recipe}: the step time prices all FP8 recipes alike (as {PRICED_FP8_RECIPE}); the memory "
            "counts the recipe's saved FP8 inputs, see RESULTS")  # fmt: skip


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
    """A decoder-only transformer, by shape: dense, or mixture-of-experts (`moe`) with GQA or multi-latent
    attention (`attention`) and multi-token-prediction modules (`mtp_layers`). Parameter counts are derived,
    never given.

    The position and norm fields (`rope_theta`, `rope_scaling`, `alibi`, `norm_eps`) change no count; the
    launcher emitters write them, so that a launched run trains this model and not a launcher default.
    """

    name: str = "custom"
    layers: Count = Field(le=limits.MAX_LAYERS)
    hidden: Count = Field(le=limits.MAX_HIDDEN)
    ffn: Count = Field(le=limits.MAX_FFN, description="FFN width of a dense layer (an MoE model's dense layers if any)")
    heads: Count = Field(le=limits.MAX_HEADS)
    kv_heads: Count = Field(le=limits.MAX_HEADS)
    vocab: Count = Field(le=limits.MAX_VOCAB)
    mlp: MlpKind = "swiglu"
    tied_embeddings: bool = False
    head_dim: Count | None = Field(None, le=limits.MAX_HEAD_DIM)
    bias: bool = Field(False, description="linear layers and layer norms carry biases (GPT-2/3 style; GPT-OSS)")
    position_embeddings: NonNegativeCount = Field(
        0, le=limits.MAX_POSITIONS, description="learned absolute positions (0 = rotary)"
    )
    attention: AttentionSpec = AttentionSpec()
    moe: MoeSpec | None = Field(None, description="mixture-of-experts layers; None: a dense model")
    mtp_layers: NonNegativeCount = Field(
        0, le=limits.MAX_LAYERS, description="multi-token-prediction modules after the last layer"
    )
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base (Llama 3: 500000); unused with learned positions")
    rope_scaling: RopeScaling | None = Field(None, description="Llama 3.1 RoPE scaling; None = plain RoPE")
    alibi: bool = Field(False, description="ALiBi attention biases instead of positions (MPT, BLOOM)")
    norm: NormKind | None = Field(
        None,
        description="rmsnorm or layernorm; None: LayerNorm when the linear layers carry biases (GPT-style), "
        "RMSNorm otherwise. A LayerNorm has a bias when the linear layers do (`bias`)",
    )
    norm_eps: float = Field(1e-5, gt=0, description="RMSNorm/LayerNorm epsilon")

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        mla = self.attention.kind == "mla"
        if self.head_dim is None and self.hidden % self.heads and not mla:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) unless head_dim is given"
            )
        if mla:
            self._check_mla()
        windows = self.attention.sliding_window_layers
        if isinstance(windows, tuple) and len(windows) != self.layers:
            raise ValueError(f"attention.sliding_window_layers has {len(windows)} flags for {self.layers} layers")
        if self.moe is not None:
            self._check_moe(self.moe)
        return self

    def _check_mla(self) -> None:
        att = self.attention
        if self.head_dim is not None:
            raise ValueError("head_dim: not used with multi-latent attention (give attention.qk_head_dim, "
                             "qk_rope_head_dim, v_head_dim)")  # fmt: skip
        if self.kv_heads != self.heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must equal heads ({self.heads}) with multi-latent attention")
        if self.bias:
            raise ValueError("bias: not supported with multi-latent attention")
        for field in ("q_lora_rank", "kv_lora_rank"):
            rank = getattr(att, field)
            if rank is not None and rank >= self.hidden:
                raise ValueError(f"attention.{field} ({rank}) must be below hidden ({self.hidden}): a compression")

    def _check_moe(self, moe: MoeSpec) -> None:
        if isinstance(moe.layer_freq, tuple):
            if len(moe.layer_freq) != self.layers:
                raise ValueError(f"moe.layer_freq has {len(moe.layer_freq)} flags for {self.layers} layers")
        elif moe.dense_layers >= self.layers:
            raise ValueError(f"moe.dense_layers ({moe.dense_layers}) leaves no MoE layer of {self.layers}")
        if not any(moe.layer_flags(self.layers)):
            raise ValueError("moe: no layer is an MoE layer")

    @cached_property
    def head_size(self) -> int:
        """Per-head query/key size (MLA: the no-position part plus the rotary part)."""
        att = self.attention
        if att.kind == "mla":
            return att.qk_head_dim + att.qk_rope_head_dim  # type: ignore[operator]  # set for mla
        return self.head_dim or self.hidden // self.heads

    @cached_property
    def q_width(self) -> int:
        """Width of the query projection (heads x head size)."""
        return self.heads * self.head_size

    @cached_property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_size

    @cached_property
    def value_width(self) -> int:
        """Width of the attention's value output fed to the output projection (MLA: heads x v_head_dim)."""
        if self.attention.kind == "mla":
            return self.heads * self.attention.v_head_dim  # type: ignore[operator]  # set for mla
        return self.q_width

    @property
    def norm_kind(self) -> NormKind:
        """The norm the layers use: `norm`, or derived from `bias` when not given."""
        return self.norm or ("layernorm" if self.bias else "rmsnorm")

    @cached_property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @cached_property
    def attention_param_count(self) -> int:
        """Parameters of one attention block (projections, their biases, MLA's latent norms, sinks, QK norms)."""
        att = self.attention
        if att.kind == "mla":
            return self._mla_matmul_param_count + (att.q_lora_rank or 0) + att.kv_lora_rank  # type: ignore[operator]
        qk_norms = 2 * self.head_size if att.qk_norm else 0  # one weight vector for queries, one for keys
        return self.attention_matmul_param_count + (self.heads if att.sinks else 0) + qk_norms

    @cached_property
    def _mla_matmul_param_count(self) -> int:
        """MLA's projection matrices (DeepSeek-V3; Megatron's multi_latent_attention.py)."""
        h, att, n = self.hidden, self.attention, self.heads
        qk, rope, v, kv_rank = att.qk_head_dim, att.qk_rope_head_dim, att.v_head_dim, att.kv_lora_rank
        q_rank = att.q_lora_rank
        query = h * q_rank + q_rank * n * (qk + rope) if q_rank else h * n * (qk + rope)  # type: ignore[operator]
        return query + h * (kv_rank + rope) + kv_rank * n * (qk + v) + n * v * h  # type: ignore[operator]

    @cached_property
    def attention_matmul_param_count(self) -> int:
        """Parameters of one attention block that take part in a matrix multiply (no norms, no sinks)."""
        if self.attention.kind == "mla":
            return self._mla_matmul_param_count
        h = self.hidden
        weights = h * self.q_width * 2 + h * self.kv_width * 2  # q, o, k, v
        biases = (self.q_width + 2 * self.kv_width + h) if self.bias else 0
        return weights + biases

    def _ffn_param_count(self, width: int) -> int:
        weights = self.mlp_matrices * self.hidden * width
        biases = (width * (self.mlp_matrices - 1) + self.hidden) if self.bias else 0
        return weights + biases

    @cached_property
    def mlp_param_count(self) -> int:
        """Parameters of one dense FFN (width `ffn`)."""
        return self._ffn_param_count(self.ffn)

    @cached_property
    def expert_param_count(self) -> int:
        """Parameters of one routed expert (0 for a dense model)."""
        return self._ffn_param_count(self.moe.expert_ffn) if self.moe else 0

    @cached_property
    def shared_expert_param_count(self) -> int:
        """Parameters of all shared experts of one MoE layer."""
        return self.moe.shared_experts * self._ffn_param_count(self.moe.shared_width) if self.moe else 0

    @cached_property
    def router_param_count(self) -> int:
        """The router of one MoE layer: hidden x experts, plus a bias per expert."""
        if self.moe is None:
            return 0
        bias = self.bias if self.moe.router_bias is None else self.moe.router_bias
        return self.hidden * self.moe.experts + (self.moe.experts if bias else 0)

    @cached_property
    def norm_param_count_per_layer(self) -> int:
        return 2 * self.norm_param_count

    @property
    def norm_param_count(self) -> int:
        """One norm's parameters: its scale, and a bias for a LayerNorm of a model with biases."""
        return self.hidden * (2 if self.bias and self.norm_kind == "layernorm" else 1)

    @cached_property
    def layer_param_count(self) -> int:
        """Parameters of one dense transformer block."""
        return self.attention_param_count + self.mlp_param_count + self.norm_param_count_per_layer

    @cached_property
    def moe_layer_param_count(self) -> int:
        """Parameters of one MoE transformer block (all experts; 0 for a dense model)."""
        if self.moe is None:
            return 0
        experts = self.moe.experts * self.expert_param_count + self.shared_expert_param_count + self.router_param_count
        return self.attention_param_count + experts + self.norm_param_count_per_layer

    @cached_property
    def active_moe_layer_param_count(self) -> int:
        """Parameters of one MoE block a token uses: top_k routed experts, the shared ones, router, attention."""
        if self.moe is None:
            return 0
        return self.moe_layer_param_count - (self.moe.experts - self.moe.top_k) * self.expert_param_count

    @cached_property
    def moe_layer_flags(self) -> tuple[bool, ...]:
        """For each layer (0-based), whether it is an MoE layer."""
        return self.moe.layer_flags(self.layers) if self.moe else (False,) * self.layers

    @cached_property
    def moe_layer_count(self) -> int:
        return sum(self.moe_layer_flags)

    @cached_property
    def dense_layer_count(self) -> int:
        return self.layers - self.moe_layer_count

    @cached_property
    def embedding_param_count(self) -> int:
        """Input token (and position) embedding table."""
        return self.vocab * self.hidden + self.position_embeddings * self.hidden

    @cached_property
    def output_param_count(self) -> int:
        """Output projection (0 when tied to the input embedding) plus the final norm."""
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + self.norm_param_count

    @cached_property
    def mtp_block_is_moe(self) -> bool:
        """An MTP module repeats the last layer's kind (Megatron's FLOPs count and DeepSeek-V3)."""
        return self.moe_layer_flags[-1]

    @cached_property
    def mtp_param_count(self) -> int:
        """Parameters of the multi-token-prediction modules, which share the embedding and output head: per
        module a transformer block, the 2h -> h projection and three norms (DeepSeek-V3 README_WEIGHTS.md)."""
        block = self.moe_layer_param_count if self.mtp_block_is_moe else self.layer_param_count
        norms = 3 * self.norm_param_count
        return self.mtp_layers * (block + 2 * self.hidden * self.hidden + norms)

    @cached_property
    def param_count(self) -> int:
        """Total parameter count: everything trained and stored, MTP modules included."""
        blocks = self.dense_layer_count * self.layer_param_count + self.moe_layer_count * self.moe_layer_param_count
        return blocks + self.embedding_param_count + self.output_param_count + self.mtp_param_count

    @cached_property
    def active_param_count(self) -> int:
        """Parameters one token uses in the model's forward pass: every dense parameter (embedding table, attention,
        norms, routers, dense FFNs, shared experts, output head) and top_k routed experts per MoE layer; the MTP
        modules, a training-time extra, are left out (as in every published count). Dense models: `param_count`."""
        moe_blocks = self.moe_layer_count * self.active_moe_layer_param_count
        blocks = self.dense_layer_count * self.layer_param_count + moe_blocks
        return blocks + self.embedding_param_count + self.output_param_count

    @cached_property
    def output_matmul_param_count(self) -> int:
        """Output-head parameters multiplied per token: once, and once more per MTP module (a shared head)."""
        return self.vocab * self.hidden * (1 + self.mtp_layers)

    @cached_property
    def matmul_param_count(self) -> int:
        """Parameters that take part in a matrix multiply per token (the N of 6N): all but lookups, norms, sinks and
        the MoE router (Megatron leaves the router out); of the experts only the top_k routed and the shared ones;
        MTP modules with their 2h -> h projection and their pass through the shared output head."""
        moe_ffn = self.moe.top_k * self.expert_param_count + self.shared_expert_param_count if self.moe else 0
        attention = self.attention_matmul_param_count
        dense_block, moe_block = attention + self.mlp_param_count, attention + moe_ffn
        blocks = self.dense_layer_count * dense_block + self.moe_layer_count * moe_block
        mtp = self.mtp_layers * ((moe_block if self.mtp_block_is_moe else dense_block) + 2 * self.hidden * self.hidden)
        return blocks + mtp + self.output_matmul_param_count

    @cached_property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Every layer's kind (MoE or dense FFN, windowed attention or not), in model order."""
        return tuple(LayerKind(m, w) for m, w in zip(self.moe_layer_flags, self.sliding_window_flags, strict=True))

    @cached_property
    def sliding_window_flags(self) -> tuple[bool, ...]:
        """For each layer (0-based), whether it attends through a sliding window."""
        return self.attention.sliding_flags(self.layers)

    def beyond_dense(self, seq_len: int | None = None, allow: frozenset[str] = frozenset()) -> list[str]:
        """What this shape has that a dense-transformer code path (a launcher) does not handle (empty: nothing);
        `allow` names what the caller handles: "moe", "mla", "mtp", "window" (sliding windows and attention sinks).
        A sliding window counts when shorter than `seq_len` (None: always)."""
        found = []
        if self.moe is not None and "moe" not in allow:
            found.append("expert parallelism (mixture-of-experts layers)")
        if self.attention.kind == "mla" and "mla" not in allow:
            found.append("multi-latent attention")
        if self.mtp_layers and "mtp" not in allow:
            found.append("multi-token prediction")
        window = self.attention.sliding_window
        if window is not None and (seq_len is None or window < seq_len) and "window" not in allow:
            shorter = f" < sequence {seq_len}" if seq_len else ""
            found.append(f"sliding-window attention (window {window}{shorter})")
        if self.attention.sinks and "window" not in allow:
            found.append("attention sinks")
        return found

    def require_dense(self, what: str, seq_len: int | None = None, allow: frozenset[str] = frozenset()) -> None:
        """Refuse, in one line naming `what`, a shape the dense code paths would silently mishandle."""
        found = self.beyond_dense(seq_len, allow)
        if found:
            raise UnsupportedError(f"{what}: {self.name}: not yet supported: {', '.join(found)}")


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
    sfu_exp_per_s: Real | None = Field(
        None,
        gt=0,
        le=limits.MAX_PEAK_FLOPS,
        description="exponentials per second of the special function units (MUFU.EX2), the softmax's rate in the "
        "attention kernel; None: unknown, no exponential bound",
    )
    sm_count: int | None = Field(
        None,
        gt=0,
        le=limits.MAX_GPU_SMS,
        description="streaming multiprocessors (compute units); what a communication kernel holding a fixed count of "
        "them leaves the compute beside it. None: unknown, no such share priced",
    )
    source: str = ""

    def peak_flops_for(self, precision: str) -> float:
        if precision not in self.peak_flops or self.peak_flops[precision] <= 0:
            known = ", ".join(sorted(self.peak_flops))
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


# The JobSpec fields naming the optimizer's per-parameter states: master weights and Adam's two moments.
STATE_DTYPE_FIELDS = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def _state_dtype_fields(muon: bool) -> tuple[str, ...]:
    """The state fields the optimizer keeps: all three, or muon's master weights and one momentum buffer."""
    return STATE_DTYPE_FIELDS[:2] if muon else STATE_DTYPE_FIELDS


class JobSpec(_Spec):
    """What is trained: sequence length, batch and numerics."""

    seq_len: Count = Field(le=limits.MAX_SEQ_LEN)
    global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    global_batch_tokens: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH_TOKENS)
    min_global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH)
    max_global_batch: Count | None = Field(None, le=limits.MAX_GLOBAL_BATCH)
    precision: Precision = "bf16"
    fp8_recipe: Fp8Recipe | None = Field(
        None,
        description="FP8 scaling, precision fp8 only: tensorwise | rowwise | blockwise | mxfp8 (Fp8Recipe); None: "
        "not stated (the launcher's default). Recorded and emitted; the step time prices every recipe alike, the "
        "memory counts its scales on the saved FP8 inputs (`cost.attention.gemm_input_bytes`)",
    )
    fp8_param_gather: bool = Field(
        False,
        description="FP8 primary weights (Megatron --fp8-param-gather, NeMo fp8_params; precision fp8 only): the "
        "data-parallel weight all-gather moves 1 byte per parameter, MXFP8's 2 (`param_gather_bytes_per_param`)",
    )
    fp8_weights_transpose_free: bool = Field(
        False,
        description="the GPU runs FP8 GEMMs in any layout, so per-tensor FP8 primary weights keep no transpose "
        "(`resident_weight_bytes_per_param`); set where the job meets its GPU (`on_gpu`), not by hand",
    )
    optimizer: Optimizer = Field("adam", description="adam: two moments; muon: one momentum buffer")
    main_params_dtype: MainParamsDtype = Field("fp32", description="the optimizer's master copy of the weights")
    exp_avg_dtype: StateDtype = Field("fp32", description="Adam's first moment (muon: its momentum buffer)")
    exp_avg_sq_dtype: StateDtype = Field("fp32", description="Adam's second moment (muon keeps none)")
    optimizer_bytes_per_param: Real = Field(
        12.0,
        ge=0,
        le=limits.MAX_BYTES_PER_PARAM,
        description="master weights and moments: by default the sum of the three state dtypes' bytes (Adam 4 + 4 + 4, "
        "muon 4 + 4)",
    )
    weight_bytes_per_param: Real = Field(2.0, gt=0, le=limits.MAX_BYTES_PER_PARAM, description="bf16 working weights")
    grad_bytes_per_param: Real = Field(2.0, gt=0, le=limits.MAX_BYTES_PER_PARAM, description="bf16 gradients")
    memory_headroom: Real = Field(0.05, ge=0, lt=1, description="fraction of GPU memory kept free")
    causal: bool = True
    dropout: bool = Field(False, description="dropout layers active (they store 1-byte masks for backward)")
    attention_kernel: AttentionKernel = Field(
        "flash",
        description="flash: the GPU generation's own IO-aware kernel (FlashAttention-2 on Ampere, cuDNN/"
        "FlashAttention-3 on Hopper and newer); flash2: FlashAttention-2 on any GPU; triton: FlashAttention "
        "in pre-MLIR Triton (llm-foundry's attn_impl triton); naive: softmax materialized",
    )
    moe_routing: MoeRouting | None = Field(
        None, description="balanced: tokens forced uniform over the experts, dropless (benchmarks); None: real routing"
    )
    moe_dispatcher: MoeDispatcher = Field(
        "alltoall",
        description="alltoall: Megatron's all-to-all token dispatcher (every routed copy of a token moves, 16-bit); "
        "flex: DeepEP/HybridEP (a token moves once per destination rank; FP8 dispatch in FP8 jobs)",
    )
    moe_ep_overlap: bool = Field(
        False,
        description="Megatron --overlap-moe-expert-parallel-comm: the expert all-to-all hides under another "
        "micro-batch's compute where Megatron allows it (ep > 1, vp > 1 when pp > 1, no full recompute); the flex "
        "dispatcher's kernels hold some of the SMs that compute runs on meanwhile (CostParams.flex_dispatch_sms)",
    )

    @model_validator(mode="before")
    @classmethod
    def _optimizer_state(cls, data: object) -> object:
        """The optimizer state's bytes per parameter from its dtypes unless the bytes are given: master weights +
        Adam's two moments (12 in fp32), or muon's one momentum buffer (github.com/KellerJordan/Muon; DeepSpeed's
        Muon post on pytorch.org: fp32 master + momentum = 8; muon updates the hidden 2-D weights, the embedding,
        head and norms keep Adam in practice, not modelled: 8 is a floor). Bytes given beside a 16- or 8-bit state
        dtype must be those the dtypes hold."""
        if not isinstance(data, dict):
            return data
        muon = data.get("optimizer") == "muon"
        if muon and data.get("exp_avg_sq_dtype", "fp32") != "fp32":
            raise ValueError("exp_avg_sq_dtype: muon keeps no second moment")
        names = _state_dtype_fields(muon)
        dtypes = [data.get(name, "fp32") for name in names]
        if not all(isinstance(d, str) and d in STATE_DTYPE_BYTES for d in dtypes):
            return data  # the field validators name the bad dtype
        derived = sum(STATE_DTYPE_BYTES[d] for d in dtypes)
        given = data.get("optimizer_bytes_per_param")
        if given is None:
            return data | {"optimizer_bytes_per_param": derived}
        reduced = any(data.get(name, "fp32") != "fp32" for name in names)
        if reduced and given != derived:
            raise ValueError(f"optimizer_bytes_per_param ({given}) contradicts the state dtypes ({derived:g} bytes)")
        return data

    _recipe_needs_fp8 = field_validator("fp8_recipe")(recipe_needs_fp8)

    @model_validator(mode="after")
    def _check_batch(self) -> JobSpec:
        gather_needs_fp8(self.fp8_param_gather, self.precision)
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
    def numerics(self) -> str:
        """The precision as shown: `bf16`, or `fp8 (mxfp8)` with a stated FP8 recipe."""
        return f"{self.precision} ({self.fp8_recipe})" if self.fp8_recipe else self.precision

    @property
    def reduced_optimizer_state(self) -> dict[str, str]:
        """The optimizer-state dtypes that are not fp32, by field name (empty: fp32 master weights and moments)."""
        names = _state_dtype_fields(self.optimizer == "muon")
        return {name: getattr(self, name) for name in names if getattr(self, name) != "fp32"}

    @property
    def optimizer_bytes_match_dtypes(self) -> bool:
        """Whether `optimizer_bytes_per_param` is what the state dtypes hold (False: bytes given by hand)."""
        names = _state_dtype_fields(self.optimizer == "muon")
        return self.optimizer_bytes_per_param == sum(STATE_DTYPE_BYTES[getattr(self, name)] for name in names)

    @property
    def param_gather_bytes_per_param(self) -> float:
        """Bytes per parameter the data-parallel weight all-gather (ZeRO-1/2's after the step, FSDP's per layer)
        moves. FP8 primary weights gather their 1-byte data (Megatron-Core's param buffer is uint8 for them,
        megatron/core/distributed/distributed_data_parallel.py lines 142-146 at d7288711, the Megatron-LM of
        Megatron-Bridge v0.4.0; NeMo's distributed Adam syncs them as uint8, nemo/core/optim/distributed_adam.py
        @v2.0.0 lines 238, 295, 386), except MXFP8's: Megatron gathers those in bf16 through the gradient buffer and
        quantizes after (reuse_grad_buf_for_mxfp8_param_ag, which MXFP8 param gather requires:
        core/optimizer/optimizer_config.py lines 384-388, distributed/param_and_grad_buffer.py lines 975-993 and
        469-491 at d7288711). The embedding, output layer and norms stay 16-bit (3% of Llama 3 70B's parameters):
        counted at 1 byte too.

        What FP8 primary weights hold on a GPU is `resident_weight_bytes_per_param`: Transformer Engine stores an FP8
        weight row- and column-wise for training (quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled()),
        module/base.py @v2.10 line 1265): MXFP8 2 + 2/32 scale bytes (tensor/mxfp8_tensor.py @v2.10 lines 120-145),
        per-tensor FP8 on Hopper data + transpose, 2, on Blackwell the data alone, 1."""
        if self.fp8_param_gather and self.fp8_recipe != "mxfp8":
            return 1.0
        return self.weight_bytes_per_param

    @property
    def resident_weight_bytes_per_param(self) -> float:
        """Bytes per parameter the working weights hold on a GPU: `weight_bytes_per_param`, except per-tensor FP8
        primary weights (fp8_param_gather with the tensorwise recipe, or the launcher's default, Megatron's
        per-tensor delayed scaling) on a GPU that runs FP8 GEMMs in any layout (`fp8_weights_transpose_free`):
        Transformer Engine's per-tensor quantizers then keep the FP8 data only and no transpose, 1 byte
        (transformer_engine/pytorch/csrc/quantizer.cpp @v2.10 lines 126 and 137, Float8Quantizer; 331 and 340,
        Float8CurrentScalingQuantizer: with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()),
        where Hopper keeps data and transpose, 2. The 16-bit embedding, output layer and norms are counted at 1
        byte too, as `param_gather_bytes_per_param` counts them. MXFP8 and blockwise weights keep their two
        directions' blocks on every GPU: `weight_bytes_per_param`."""
        per_tensor = self.fp8_recipe in (None, "tensorwise")
        if self.fp8_param_gather and per_tensor and self.fp8_weights_transpose_free:
            return 1.0
        return self.weight_bytes_per_param

    def on_gpu(self, gpu: GpuSpec) -> JobSpec:
        """This job as it runs on `gpu`: `fp8_weights_transpose_free` where Transformer Engine's
        is_non_tn_fp8_gemm_supported holds (compute capability 10.x and 11.x, or 13 and later, utils.py @v2.10
        lines 491-496): the datacenter Blackwell GPUs, arch blackwell here (the B200, GB200 and GB300 presets; a
        hand-built GPU of the 12.x consumer Blackwell parts is to be given another arch). The cost model prices a
        job on its GPU through this (`evaluate`, the solver's cost table); the job itself is what plans save."""
        transpose_free = gpu.arch == "blackwell"
        if not self.fp8_param_gather or self.fp8_weights_transpose_free == transpose_free:
            return self
        return self.model_copy(update={"fp8_weights_transpose_free": transpose_free})

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
