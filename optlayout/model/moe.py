"""Mixture-of-experts layers: routed and shared experts, top-k routing, and which layers are MoE.

Which layers are MoE follows Megatron's `--moe-layer-freq` (megatron/training/arguments.py, used in
training.py's FLOPs count): an integer N makes layer i (0-based) MoE when i % N == 0; a list gives one 0/1
flag per layer, e.g. DeepSeek-V3's `[0]*3+[1]*58`. `dense_layers` is the record format's shorthand for
"the first k layers are dense" (DeepSeek's `first_k_dense_replace`).
"""

from __future__ import annotations

import ast
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from optlayout.inputs.limits import MAX_EXPERTS, MAX_FFN, MAX_LAYERS
from optlayout.inputs.numbers import Count, NonNegativeCount

LayerFlags = tuple[Literal[0, 1], ...]


def parse_layer_freq(text: str) -> int | tuple[int, ...]:
    """Megatron's `--moe-layer-freq` text: an integer, or a list expression of 0/1 such as `([0]*3+[1]*58)`."""
    try:
        value = _evaluate(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"{text!r} is not an integer or a list expression of 0/1 like [0]*3+[1]*58 ({exc})") from None
    return tuple(value) if isinstance(value, list) else value


def _check_length(length: int) -> None:
    """Refuse more flags than any model has layers (`MAX_LAYERS`): `[0]*10000000000` is refused, not built."""
    if length > MAX_LAYERS:
        raise ValueError(f"{length} layer flags, more than {MAX_LAYERS}")


def _evaluate(node: ast.AST) -> int | list[int]:
    """Integers, lists of integers, `+` of lists and `*` of a list by an integer; nothing else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_evaluate(e) for e in node.elts]
        if not all(isinstance(i, int) for i in items):
            raise ValueError("nested lists")
        return items  # type: ignore[return-value]  # checked above: a list of int
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            _check_length(len(left) + len(right))
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int):
            _check_length(len(left) * right)  # before the list is built
            return left * right
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, list):
            _check_length(left * len(right))
            return left * right
    raise ValueError(f"unsupported {type(node).__name__}")


class MoeSpec(BaseModel):
    """The expert layers of a mixture-of-experts transformer (routed experts are SwiGLU/GELU like `mlp`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experts: Count = Field(le=MAX_EXPERTS, description="routed experts per MoE layer")
    top_k: Count = Field(le=MAX_EXPERTS, description="routed experts each token is sent to")
    expert_ffn: Count = Field(le=MAX_FFN, description="FFN width of one routed expert")
    shared_experts: NonNegativeCount = Field(
        0, le=MAX_EXPERTS, description="experts every token goes through (DeepSeek, Llama 4)"
    )
    shared_expert_ffn: Count | None = Field(None, le=MAX_FFN, description="FFN width of one shared expert (expert_ffn)")
    dense_layers: NonNegativeCount = Field(
        0, le=MAX_LAYERS, description="the first layers keep a dense FFN of width `ffn`"
    )
    layer_freq: Annotated[Count, Field(le=MAX_LAYERS)] | Annotated[LayerFlags, Field(max_length=MAX_LAYERS)] = Field(
        1, description="Megatron --moe-layer-freq: N (layer i is MoE when i % N == 0) or one 0/1 flag per layer"
    )
    router_bias: bool | None = Field(
        None,
        description="a per-expert bias on the router (GPT-OSS's linear bias, DeepSeek-V3's load-balancing "
        "correction); default: the model's `bias`",
    )
    router_score: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="the router's score function (DeepSeek-V3, Kimi K2: sigmoid)"
    )
    router_groups: Count | None = Field(
        None, le=MAX_EXPERTS, description="group-limited routing: the experts form this many groups (DeepSeek-V3: 8)"
    )
    router_group_top_k: Count | None = Field(
        None, le=MAX_EXPERTS, description="groups a token's experts may come from (DeepSeek-V3: 4)"
    )
    router_scaling: float | None = Field(
        None, gt=0, le=1e3, description="factor on the routed experts' combined output (DeepSeek-V3: 2.5)"
    )

    @field_validator("layer_freq", mode="before")
    @classmethod
    def _parse_text(cls, value: object) -> object:
        return parse_layer_freq(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> MoeSpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        if self.shared_expert_ffn is not None and self.shared_experts == 0:
            raise ValueError("shared_expert_ffn is given but shared_experts is 0")
        if (self.router_groups is None) != (self.router_group_top_k is None):
            raise ValueError("router_groups and router_group_top_k go together (group-limited routing)")
        if self.router_groups is not None and self.router_group_top_k is not None:
            if self.experts % self.router_groups:
                raise ValueError(f"experts ({self.experts}) not divisible by router_groups ({self.router_groups})")
            if self.router_group_top_k > self.router_groups:
                raise ValueError(f"router_group_top_k ({self.router_group_top_k}) exceeds router_groups "
                                 f"({self.router_groups})")  # fmt: skip
        if isinstance(self.layer_freq, tuple):
            if not self.layer_freq:
                raise ValueError("layer_freq: an empty list")
            if self.dense_layers:
                raise ValueError("give dense_layers or a layer_freq list, not both")
        return self

    @property
    def shared_width(self) -> int:
        """FFN width of one shared expert."""
        return self.shared_expert_ffn or self.expert_ffn

    def layer_flags(self, layers: int) -> tuple[bool, ...]:
        """For each of `layers` layers (0-based), whether it is an MoE layer."""
        if isinstance(self.layer_freq, tuple):
            return tuple(bool(f) for f in self.layer_freq)
        return tuple(i >= self.dense_layers and i % self.layer_freq == 0 for i in range(layers))
