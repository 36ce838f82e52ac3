"""Activation bytes a real PyTorch block saves for backward, against optlayout's `activation_bytes_per_layer`.

Reproduce:  python benchmarks/memory_vs_torch.py        (CPU, bfloat16, deterministic, well under 60 s)

What is measured: one transformer block's forward runs under `torch.autograd.graph.saved_tensors_hooks`; every
tensor autograd saves for backward is recorded and counted once per storage (`untyped_storage().data_ptr()`,
full storage bytes, so a view keeps its whole base alive as it does in reality). Storages shared with the block's
parameters (weights, `W.t()` views) or its buffers (the causal mask, the rotary cos/sin tables: constants, not
activations) are excluded. `torch.utils.checkpoint(use_reentrant=False)` saves the wrapped function's tensor inputs
through the same hooks (`_NoopSaveInputs`), so it is measured the same way; the CPU RNG state it also keeps
(a few KiB, a Python attribute, not an activation) is not counted.

Blocks:
  llama  RMSNorm, GQA attention (separate q/k/v projections, rotary optional), SwiGLU MLP, no dropout, no biases.
  gpt    LayerNorm with bias, MHA (one fused qkv projection), GeLU 4h MLP, biases, dropout p=0.1 on the attention
         probabilities and after both residual branches.
Kernels:
  eager  what plain PyTorch saves: `F.rms_norm` (CPU: decomposed, fp32), `silu(gate) * up`, `F.dropout`
         (CPU: a bf16 scaled-noise mask).
  fused  custom ops that save what Megatron's fused GPU kernels save: RMSNorm keeps its input (+ fp32 rstd, as
         Apex/TE do), SwiGLU keeps gate and up (Megatron's bias_swiglu), dropout keeps a bool mask
         (`torch.native_dropout`, as CUDA's fused dropout does). LayerNorm is `F.layer_norm` in both.
Attention core:
  naive  explicit softmax(QK^T/sqrt(d)) @ V (K/V `repeat_interleave`d to every head for GQA, as Megatron's
         unfused DotProductAttention does) = the formula's attention_kernel="naive".
  sdpa   `F.scaled_dot_product_attention`; the CPU path it took is detected from what it saves: a fp32
         (b, heads, s) log-sum-exp and no s x s tensor = the CPU flash kernel; an (.., s, s) tensor = the math path
         (on the CPU it upcasts bf16 to fp32). It is compared with attention_kernel="flash", the fused GPU kernel.
Recompute: none; selective = checkpoint around the attention core only; full = checkpoint around the whole block.

Columns: `formula` is optlayout's number for the fused kernels (tp=1, cp=1, micro_batch=b); `eager-eq` is that
number plus the hand-derived differences listed in `note` (see `eager_equivalent`), i.e. what the CPU path this row
actually ran should save; `err` = measured vs formula, `resid` = measured vs eager-eq (0 means every difference is
accounted for).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optlayout.cost.memory import activation_bytes_per_layer
from optlayout.specs import JobSpec, Layout, ModelSpec

DTYPE = torch.bfloat16
DROPOUT_P = 0.1

BlockKind = Literal["llama", "gpt"]
AttnImpl = Literal["naive", "sdpa"]
RecomputeKind = Literal["none", "selective", "full"]
Kernels = Literal["eager", "fused"]


@dataclass(frozen=True)
class Case:
    kind: BlockKind
    b: int
    s: int
    h: int
    heads: int
    kv_heads: int
    ffn: int
    attn: AttnImpl = "naive"
    recompute: RecomputeKind = "none"
    kernels: Kernels = "fused"
    rotary: bool = False

    @property
    def head_dim(self) -> int:
        return self.h // self.heads

    @property
    def dropout(self) -> bool:
        return self.kind == "gpt"


# -- fused-kernel stand-ins: custom autograd Functions that save exactly what the fused GPU kernels save ----------


def _acc(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (the kernels' accumulation type); fp64 stays fp64 for the gradient check."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class FusedRMSNormFn(torch.autograd.Function):
    """RMSNorm that saves its input and the fp32 1/rms per token (Apex/TE fused RMSNorm), nothing else."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(_acc(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (_acc(x) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = _acc(x) * rstd
        gw = (_acc(grad) * xhat).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype)
        gxhat = _acc(grad) * _acc(weight)
        gx = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


class FusedSwiGLUFn(torch.autograd.Function):
    """silu(gate) * up that saves gate and up only (Megatron's fused bias_swiglu); silu is recomputed in backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        g = _acc(gate)
        sig = torch.sigmoid(g)
        silu = g * sig
        d_gate = _acc(grad) * _acc(up) * sig * (1 + g * (1 - sig))
        return d_gate.to(gate.dtype), (_acc(grad) * silu).to(up.dtype)


class RMSNorm(nn.Module):
    def __init__(self, h: int, fused: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h, dtype=DTYPE))
        self.fused, self.eps = fused, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return FusedRMSNormFn.apply(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def dropout(x: torch.Tensor, fused: bool) -> torch.Tensor:
    """Eager `F.dropout` (on the CPU: a bf16 scaled-noise mask) or the fused kernel's bool mask."""
    if fused:
        return torch.native_dropout(x, DROPOUT_P, True)[0]
    return F.dropout(x, DROPOUT_P, training=True)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    """One pre-norm transformer block, Llama- or GPT-style, in bf16."""

    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = c = case
        fused = c.kernels == "fused"
        d, dq, dkv = c.head_dim, c.heads * c.head_dim, c.kv_heads * c.head_dim
        if c.kind == "llama":
            self.norm1, self.norm2 = RMSNorm(c.h, fused), RMSNorm(c.h, fused)
            self.q = nn.Linear(c.h, dq, bias=False, dtype=DTYPE)
            self.k = nn.Linear(c.h, dkv, bias=False, dtype=DTYPE)
            self.v = nn.Linear(c.h, dkv, bias=False, dtype=DTYPE)
            self.o = nn.Linear(dq, c.h, bias=False, dtype=DTYPE)
            self.gate = nn.Linear(c.h, c.ffn, bias=False, dtype=DTYPE)
            self.up = nn.Linear(c.h, c.ffn, bias=False, dtype=DTYPE)
            self.down = nn.Linear(c.ffn, c.h, bias=False, dtype=DTYPE)
        else:
            assert c.heads == c.kv_heads, "the GPT block is MHA"
            self.norm1, self.norm2 = nn.LayerNorm(c.h, dtype=DTYPE), nn.LayerNorm(c.h, dtype=DTYPE)
            self.qkv = nn.Linear(c.h, 3 * dq, dtype=DTYPE)
            self.o = nn.Linear(dq, c.h, dtype=DTYPE)
            self.fc1 = nn.Linear(c.h, c.ffn, dtype=DTYPE)
            self.fc2 = nn.Linear(c.ffn, c.h, dtype=DTYPE)
        self.register_buffer("causal", torch.ones(c.s, c.s, dtype=torch.bool).triu(1), persistent=False)
        if c.rotary:
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            ang = torch.outer(torch.arange(c.s, dtype=torch.float32), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().to(DTYPE), persistent=False)
            self.register_buffer("sin", ang.sin().to(DTYPE), persistent=False)

    # attention core: (b, heads, s, d), (b, kv, s, d) x2 -> (b, heads, s, d)
    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.case
        p = DROPOUT_P if c.dropout else 0.0
        rep = c.heads // c.kv_heads
        if c.attn == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=rep > 1)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(c.head_dim))
        scores = scores.masked_fill(self.causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if p:
            probs = dropout(probs, c.kernels == "fused")
        return torch.matmul(probs, v)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        c = self.case
        b, s, d = x.shape[0], x.shape[1], c.head_dim
        if c.kind == "llama":
            q = self.q(x).view(b, s, c.heads, d).transpose(1, 2)
            k = self.k(x).view(b, s, c.kv_heads, d).transpose(1, 2)
            v = self.v(x).view(b, s, c.kv_heads, d).transpose(1, 2)
        else:
            q, k, v = (t.view(b, s, c.heads, d).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if c.rotary:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        core = (lambda *t: checkpoint(self.core, *t, use_reentrant=False)) if c.recompute == "selective" else self.core
        ctx = core(q, k, v)
        return self.o(ctx.transpose(1, 2).reshape(b, s, c.heads * d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        c = self.case
        if c.kind == "llama":
            gate, up = self.gate(x), self.up(x)
            act = FusedSwiGLUFn.apply(gate, up) if c.kernels == "fused" else F.silu(gate) * up
            return self.down(act)
        return self.fc2(F.gelu(self.fc1(x)))

    def layer(self, x: torch.Tensor) -> torch.Tensor:
        c = self.case
        a = self.attention(self.norm1(x))
        if c.dropout:
            a = dropout(a, c.kernels == "fused")
        x = x + a
        m = self.mlp(self.norm2(x))
        if c.dropout:
            m = dropout(m, c.kernels == "fused")
        return x + m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.case.recompute == "full":
            return checkpoint(self.layer, x, use_reentrant=False)
        return self.layer(x)


# -- measurement --------------------------------------------------------------------------------------------------


def saved_tensors(fn, *args) -> list[torch.Tensor]:
    """Every tensor autograd saves for backward while `fn(*args)` runs (kept alive in the list)."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return saved  # the list keeps every saved tensor alive after the graph is dropped


def unique_storage_bytes(tensors: list[torch.Tensor], exclude: set[int]) -> int:
    """Bytes of the distinct storages behind `tensors`, skipping storages whose data_ptr is in `exclude`."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if st.nbytes() and ptr not in exclude:
            seen[ptr] = st.nbytes()
    return sum(seen.values())


def measure(case: Case, seed: int = 0) -> int:
    """Activation bytes one block of `case` saves for backward (parameters and buffers excluded)."""
    torch.manual_seed(seed)
    block = Block(case).train()
    exclude = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    x = torch.randn(case.b, case.s, case.h, dtype=DTYPE, requires_grad=True)
    return unique_storage_bytes(saved_tensors(block, x), exclude)


def sdpa_path(case: Case) -> str:
    """Which CPU path F.scaled_dot_product_attention takes for `case`, judged by what it saves."""
    c = case
    q = torch.randn(c.b, c.heads, c.s, c.head_dim, dtype=DTYPE, requires_grad=True)
    k = torch.randn(c.b, c.kv_heads, c.s, c.head_dim, dtype=DTYPE, requires_grad=True)
    p = DROPOUT_P if c.dropout else 0.0
    saved = saved_tensors(
        lambda: F.scaled_dot_product_attention(q, k, k, dropout_p=p, is_causal=True, enable_gqa=c.heads > c.kv_heads)
    )
    if any(t.dim() >= 2 and t.shape[-2:] == (c.s, c.s) for t in saved):
        return "math"
    if any(t.dtype == torch.float32 and tuple(t.shape) == (c.b, c.heads, c.s) for t in saved):
        return "flash"
    return "unknown"


# -- the formula and the hand accounting of eager differences ------------------------------------------------------


def specs(case: Case) -> tuple[ModelSpec, JobSpec, Layout]:
    c = case
    model = ModelSpec(
        layers=1,
        hidden=c.h,
        ffn=c.ffn,
        heads=c.heads,
        kv_heads=c.kv_heads,
        vocab=1000,
        mlp="swiglu" if c.kind == "llama" else "gelu",
        bias=c.kind == "gpt",
    )
    job = JobSpec(
        seq_len=c.s, global_batch=c.b, dropout=c.dropout, attention_kernel="naive" if c.attn == "naive" else "flash"
    )
    return model, job, Layout(micro_batch=c.b, recompute=c.recompute)


def formula_bytes(case: Case) -> float:
    return activation_bytes_per_layer(*specs(case))


# Each documented difference between what the formula assumes (fused GPU kernels) and what a CPU path saves.
LEGEND = {
    "LN stats": "LayerNorm also saves its mean and rstd per token, in the input dtype on the CPU (2 B each; "
    "CUDA keeps them in fp32); not in the formula: +8 B/token for the 2 norms",
    "RMSNorm rstd": "the fused RMSNorm (Apex/TE) also saves a fp32 1/rms per token: +8 B/token for the 2 norms",
    "F.rms_norm fp32": "eager F.rms_norm on the CPU is decomposed in fp32: it saves x.float() (4h B), rsqrt (4 B) and "
    "x*rstd in fp32 (4h B, for the weight's gradient) but not the bf16 input (2h B): +(6h+4) B/token per norm",
    "unfused SwiGLU": "eager silu(gate) * up saves gate (silu), silu(gate) and up (mul): one more f-wide bf16 value "
    "than the fused kernel's gate + up: +2f B/token",
    "F.dropout bf16 mask": "on the CPU F.dropout is bernoulli noise scaled by 1/(1-p) in the input dtype (ATen "
    "_dropout_impl; the fused native_dropout is taken only on CUDA/XPU), so each mask is 2 B/element, not a 1 B bool: "
    "+h B/token per residual dropout, and +1 B per attention score",
    "SDPA math fp32": "SDPA took the CPU math path (the CPU flash kernel rejects dropout_p > 0): it upcasts Q, K, V to "
    "fp32 (K/V repeated to every head) and saves fp32 softmax output, dropout mask and dropped probabilities (12 B "
    "per score, 4 B without dropout) instead of the flash kernel's 4 B/head log-sum-exp",
}


def eager_equivalent(case: Case, sdpa: str | None = None) -> tuple[float, list[tuple[str, float]]]:
    """The formula's bytes plus each documented difference (keys of LEGEND) between the fused-kernel assumption and
    what this CPU path saves, derived by hand: (total, [(difference, bytes)])."""
    c = case
    T = c.b * c.s  # tokens
    h, f, a = c.h, c.ffn, c.heads
    dq, dkv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    eager = c.kernels == "eager"
    diffs: list[tuple[str, float]] = []
    if c.recompute == "full":
        return formula_bytes(case), diffs  # only the block input: 2sbh on every path
    if c.kind == "gpt":
        diffs.append(("LN stats", 2 * 2 * 2 * T))
    elif eager:
        diffs.append(("F.rms_norm fp32", 2 * (6 * h + 4) * T))
    else:
        diffs.append(("RMSNorm rstd", 2 * 4 * T))
    if c.kind == "llama" and eager:
        diffs.append(("unfused SwiGLU", 2 * f * T))
    if c.kind == "gpt" and eager:
        masks = 2 * h * T
        if c.attn == "naive" and c.recompute == "none":
            masks += a * c.s * T
        diffs.append(("F.dropout bf16 mask", masks))
    if c.attn == "sdpa" and c.recompute == "none" and sdpa == "math":
        qkv = 4 * 3 * dq - 2 * (dq + 2 * dkv)  # fp32 Q and repeated K, V instead of bf16 Q, K, V
        per_score = 12 if c.dropout else 4
        diffs.append(("SDPA math fp32", (qkv + a * (per_score * c.s - 4)) * T))
    return formula_bytes(case) + sum(d for _, d in diffs), diffs


# -- the grid -----------------------------------------------------------------------------------------------------

SHAPES: list[Case] = [
    Case("llama", b=1, s=256, h=256, heads=8, kv_heads=2, ffn=704, rotary=True),
    Case("llama", b=2, s=128, h=128, heads=4, kv_heads=4, ffn=352),
    Case("gpt", b=2, s=128, h=128, heads=4, kv_heads=4, ffn=512),
    Case("gpt", b=1, s=256, h=256, heads=8, kv_heads=8, ffn=1024),
]


def grid() -> list[Case]:
    cases = []
    for shape in SHAPES:
        for kernels in ("fused", "eager"):
            for attn in ("naive", "sdpa"):
                for rc in ("none", "selective"):
                    cases.append(replace(shape, kernels=kernels, attn=attn, recompute=rc))
        cases.append(replace(shape, kernels="eager", attn="naive", recompute="full"))
    return cases


@dataclass
class Row:
    case: Case
    measured: int
    formula: float
    eager_eq: float
    diffs: list[tuple[str, float]]
    sdpa: str | None

    @property
    def err(self) -> float:
        return (self.measured - self.formula) / self.formula

    @property
    def resid(self) -> float:
        return (self.measured - self.eager_eq) / self.eager_eq


def run_case(case: Case) -> Row:
    sdpa = sdpa_path(case) if case.attn == "sdpa" else None
    eq, diffs = eager_equivalent(case, sdpa)
    return Row(case, measure(case), formula_bytes(case), eq, diffs, sdpa)


def table(rows: list[Row]) -> str:
    head = (
        "| block | b | s | h | heads | kv | ffn | attention | kernels | recompute | measured B | formula B | err | "
        "eager-eq B | resid | note |"
    )
    lines = [head, "|" + "---|" * 6 + "---:|" + "---|" * 3 + "---:|" * 5 + "---|"]
    for r in rows:
        c = r.case
        attn = c.attn + ("+rope" if c.rotary else "") + (f" ({r.sdpa})" if r.sdpa else "")
        note = ", ".join(f"{what} {d / 1024:+,.0f} KiB" for what, d in r.diffs) or "kernels match"
        lines.append(
            f"| {c.kind} | {c.b} | {c.s} | {c.h} | {c.heads} | {c.kv_heads} | {c.ffn} | {attn} | {c.kernels} | "
            f"{c.recompute} | {r.measured:,} | {r.formula:,.0f} | {100 * r.err:+.1f}% | {r.eager_eq:,.0f} | "
            f"{100 * r.resid:+.2f}% | {note} |"
        )
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.perf_counter()
    rows = [run_case(c) for c in grid()]
    print(table(rows))
    print()
    for key, text in LEGEND.items():
        print(f"- {key}: {text}.")
    print(f"\n{len(rows)} cases, torch {torch.__version__}, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
