"""Attention variants: grouped-query (the default) or multi-latent (DeepSeek), sliding windows and sinks (GPT-OSS),
per-head query/key norms (Qwen3).

Multi-latent attention (MLA) as in Megatron's `--multi-latent-attention` and DeepSeek-V3's config: queries go
through a rank-`q_lora_rank` down/up projection (or a plain projection when it is None), keys and values share
one rank-`kv_lora_rank` latent plus a `qk_rope_head_dim` rotary key; each head's query/key has
`qk_head_dim` (Megatron's `--qk-head-dim`, Hugging Face's `qk_nope_head_dim`) + `qk_rope_head_dim` features,
its value `v_head_dim`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from optlayout.inputs.limits import MAX_HEAD_DIM, MAX_HIDDEN, MAX_SEQ_LEN
from optlayout.inputs.numbers import Count

MLA_FIELDS = ("kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim")


class AttentionSpec(BaseModel):
    """How a layer attends; the default is grouped-query attention over the whole causal context."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["gqa", "mla"] = Field("gqa", description="gqa: grouped-query (MHA/MQA too); mla: multi-latent")
    q_lora_rank: Count | None = Field(
        None, le=MAX_HIDDEN, description="MLA query compression rank; None: no compression"
    )
    kv_lora_rank: Count | None = Field(None, le=MAX_HIDDEN, description="MLA key/value latent rank")
    qk_head_dim: Count | None = Field(
        None, le=MAX_HEAD_DIM, description="MLA per-head query/key size without the rotary part"
    )
    qk_rope_head_dim: Count | None = Field(None, le=MAX_HEAD_DIM, description="MLA per-head rotary query/key size")
    v_head_dim: Count | None = Field(None, le=MAX_HEAD_DIM, description="MLA per-head value size")
    sliding_window: Count | None = Field(
        None, le=MAX_SEQ_LEN, description="keys a query sees (itself included) when windowed"
    )
    sliding_window_layers: Literal["all", "every other"] | tuple[Literal[0, 1], ...] = Field(
        "all", description="which layers are windowed: all, every other (0, 2, 4, ... as GPT-OSS), or a 0/1 flag each"
    )
    sinks: bool = Field(False, description="a learned attention-sink logit per head (GPT-OSS)")
    qk_norm: bool = Field(
        False, description="a learned RMSNorm over each head's query and key (Qwen3): head-size weights for each"
    )

    @model_validator(mode="after")
    def _check(self) -> AttentionSpec:
        if self.kind == "mla":
            missing = [f for f in MLA_FIELDS if getattr(self, f) is None]
            if missing:
                raise ValueError(f"kind mla needs {', '.join(missing)}")
            if self.qk_rope_head_dim % 2:  # type: ignore[operator]  # set: checked above
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even (rotary pairs)")
        else:
            given = [f for f in ("q_lora_rank", *MLA_FIELDS) if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only with kind mla")
        if self.qk_norm and self.kind == "mla":
            raise ValueError("qk_norm: only with kind gqa (multi-latent attention normalizes its latents)")
        if self.sliding_window is None and self.sliding_window_layers != "all":
            raise ValueError("sliding_window_layers is given without sliding_window")
        if isinstance(self.sliding_window_layers, tuple) and not any(self.sliding_window_layers):
            raise ValueError("sliding_window_layers: no layer is windowed")
        return self

    def sliding_flags(self, layers: int) -> tuple[bool, ...]:
        """For each of `layers` layers (0-based), whether it attends through the sliding window."""
        if self.sliding_window is None:
            return (False,) * layers
        if isinstance(self.sliding_window_layers, tuple):
            return tuple(bool(f) for f in self.sliding_window_layers)
        return tuple(self.sliding_window_layers == "all" or i % 2 == 0 for i in range(layers))
