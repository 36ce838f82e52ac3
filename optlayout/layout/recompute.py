"""Selective recomputation's module set (Megatron-Core `--recompute-granularity selective --recompute-modules`):
the names, their text form and their rules against the model, in one home.

Megatron-Core (megatron/core/transformer/transformer_config.py, `recompute_modules`; default `["core_attn"]`):
  core_attn       the attention core (checkpointed module; attention.py)
  layernorm       input_layernorm and pre_mlp_layernorm: their outputs discarded, recomputed from the inputs
                  (output-discarding checkpoint; transformer_layer.py)
  mlp             the dense MLP of non-MoE layers (checkpointed module; transformer_layer.py, a no-op on MoE layers)
  moe_act         the routed experts' activation function (output-discarding checkpoint; moe/experts.py; needs
                  the grouped GEMM)
  moe             the whole MoE layer (checkpointed module; moe/moe_layer.py)
  shared_experts  the shared experts (checkpointed module; moe/moe_layer.py; not with shared-expert overlap)
  mla_up_proj     MLA's up projections and RoPE (output-discarding checkpoint; multi_latent_attention.py)
Megatron's other modules (gdn_norm_out, gdp_*, mhc) belong to attention variants optlayout does not model.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optlayout.specs import ModelSpec


class RecomputeModule(StrEnum):
    """A module selective recomputation re-runs (Megatron-Core's `recompute_modules` names)."""

    core_attn = "core_attn"
    layernorm = "layernorm"
    mlp = "mlp"
    moe_act = "moe_act"
    moe = "moe"
    shared_experts = "shared_experts"
    mla_up_proj = "mla_up_proj"


DEFAULT_MODULES = (RecomputeModule.core_attn,)
"""What `recompute=selective` without a module list recomputes (Megatron-Core's default)."""
MODULE_SEPARATOR = "+"


def parse_modules(raw: object) -> tuple[RecomputeModule, ...]:
    """A module set from text (`core_attn+moe_act`) or a sequence of names, sorted and without repeats; ValueError
    naming the bad name otherwise."""
    if isinstance(raw, str):
        names: list[object] = list(raw.split(MODULE_SEPARATOR))
    elif isinstance(raw, list | tuple | set | frozenset):
        names = list(raw)
    else:
        raise ValueError("must be module names joined by '+'")
    out = set()
    for name in names:
        text = str(name).strip().lower()
        try:
            out.add(RecomputeModule(text))
        except ValueError:
            raise ValueError(f"unknown module {text!r} (known: {', '.join(RecomputeModule)})") from None
    if not out:
        raise ValueError("needs at least one module (no module recomputed is recompute=none)")
    return canonical_modules(out)


def canonical_modules(modules: object) -> tuple[RecomputeModule, ...]:
    """The sorted, repeat-free tuple of a module collection (the form a Layout holds)."""
    return tuple(sorted({RecomputeModule(m) for m in modules}))  # type: ignore[attr-defined]


def format_modules(modules: tuple[RecomputeModule, ...]) -> str:
    return MODULE_SEPARATOR.join(m.value for m in modules)


def module_problems(model: ModelSpec, modules: tuple[RecomputeModule, ...]) -> list[str]:
    """Megatron-Core's rules for the modules against the model (transformer_config.py `__post_init__`), and the
    modules that have nothing to re-run in it."""
    problems = []
    moe_only = [m.value for m in modules if m in (RecomputeModule.moe_act, RecomputeModule.moe,
                                                   RecomputeModule.shared_experts)]  # fmt: skip
    if moe_only and model.moe is None:
        verb = "need" if len(moe_only) > 1 else "needs"
        problems.append(f"recompute_modules {'+'.join(moe_only)} {verb} a mixture-of-experts model")
    elif RecomputeModule.shared_experts in modules and model.moe is not None and not model.moe.shared_experts:
        problems.append("recompute_modules shared_experts: the model has no shared experts")
    if RecomputeModule.mla_up_proj in modules and model.attention.kind != "mla":
        problems.append("recompute_modules mla_up_proj needs multi-latent attention (Megatron: only with MLA)")
    return problems
