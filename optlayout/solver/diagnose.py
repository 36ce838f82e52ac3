"""Why a request is infeasible, by how much, and what would fix it."""

from __future__ import annotations

import math

from optlayout.layout.rules import cp_fits_sequence, expert_degree_problems, pp_fits_layers
from optlayout.solver.candidates import Candidate
from optlayout.solver.space import SpaceOptions, allowed, batch_targets, tp_choices
from optlayout.specs import JobSpec, ModelSpec, Recompute, Sharding

_GB = 1e9


def diagnose_empty_space(model: ModelSpec, job: JobSpec, gpus: int, domain_size: int, options: SpaceOptions) -> str:
    """No layout is legal before memory is even considered: say which rule excludes them."""
    cp = options.pins.get("cp")
    if isinstance(cp, int) and not cp_fits_sequence(job.seq_len, cp):
        return f"cp: seq_len ({job.seq_len}) must split into 2 x cp = {2 * cp} equal chunks for load-balanced CP"
    pp = options.pins.get("pp")
    if isinstance(pp, int) and not pp_fits_layers(model.layers, pp):
        return f"pp: {pp} pipeline stages exceed the model's {model.layers} layers"
    expert = _expert_pins_problem(model, gpus, options)
    if expert:
        return expert
    choices = _choices_problem(model, options)
    if choices:
        return choices
    tps = tp_choices(model, gpus, domain_size, options)
    if not tps:
        return (
            f"no tensor-parallel degree is legal: tp must divide heads ({model.heads}), match kv_heads "
            f"({model.kv_heads}) and fit the NVLink domain ({domain_size}) and your pins"
        )
    lo, hi = batch_targets(job)
    max_model_parallel = max(tps) * min(options.max_cp, gpus) * min(model.layers, gpus)
    min_dp = math.ceil(gpus / max_model_parallel)
    if min_dp > hi:
        return (
            f"global batch: at most {hi} sequences per step, but {gpus} GPUs need dp >= {min_dp} "
            f"(tp <= {max(tps)}, cp <= {options.max_cp}, pp <= {model.layers}); raise the batch to >= {min_dp} "
            "or use fewer GPUs (--allow-idle)"
        )
    return (
        f"global batch: no combination of tp, cp, pp and dp with micro_batch x grad_accum x dp in [{lo}, {hi}] "
        f"uses exactly {gpus} GPUs under your pins; widen the batch bounds, relax pins, or allow idle GPUs"
    )


def _choices_problem(model: ModelSpec, options: SpaceOptions) -> str | None:
    """The rule that pins and exclusions of the sharding, the recomputation and its layer count break, if any."""
    if not any(allowed(options, "sharding", s) for s in Sharding):
        return f"sharding: your pins and exclusions forbid every value ({', '.join(s.value for s in Sharding)})"
    if not any(allowed(options, "recompute", r) for r in Recompute):
        return f"recompute: your pins and exclusions forbid every value ({', '.join(r.value for r in Recompute)})"
    layers = options.pins.get("recompute_layers")
    if not isinstance(layers, int):
        return None
    if not allowed(options, "recompute", Recompute.full):
        return f"recompute_layers: a layer count ({layers}) is full recomputation's, but recompute=full is excluded"
    pp, vp = options.pins.get("pp", 1), options.pins.get("vp", 1)
    chunks = (pp if isinstance(pp, int) else 1) * (vp if isinstance(vp, int) else 1)
    largest = math.ceil(model.layers / chunks)  # the largest model chunk at its smallest split
    if layers > largest:
        split = f"the model's {model.layers} layers" + (f" over pp x vp = {chunks} chunks" if chunks > 1 else "")
        return (f"recompute_layers: {layers} layers recomputed per model chunk, but a chunk has at most {largest} "
                f"({split}); pin at most {largest}, or leave it out to recompute every layer")  # fmt: skip
    return None


def _expert_pins_problem(model: ModelSpec, gpus: int, options: SpaceOptions) -> str | None:
    """The expert-parallel rule that pinned ep/etp break, if any (moe.md section 1.3)."""
    ep, etp = options.pins.get("ep", 1), options.pins.get("etp", 1)
    if not isinstance(ep, int) or not isinstance(etp, int):
        return None
    problems = expert_degree_problems(model, ep, etp)
    if problems:
        return "expert degrees: " + "; ".join(problems)
    if gpus % (ep * etp):
        return (f"expert grid: the EP group does not fit: etp x ep = {ep * etp} must divide the GPUs ({gpus}) "
                "(Megatron's expert grid: etp*ep*pp divides the GPUs)")  # fmt: skip
    return None


def diagnose_no_fit(least: Candidate, capacity_bytes: float, gpus: int) -> str:
    """Every legal layout overflows memory (or a limit): report the closest one, `least` (the legal layout
    needing the least memory, the first of them in the space's order), and the shortfall."""
    mem = least.prediction.memory
    state = mem["weights_bytes"] + mem["gradients_bytes"] + mem["optimizer_bytes"]
    need = least.prediction.memory_per_gpu_bytes
    if need <= capacity_bytes:
        return (
            "every layout that fits memory breaks a batch or bubble limit; "
            f"e.g. {least.layout.short()} fits ({need / _GB:.1f} GB) but was excluded by the limits"
        )
    lay = least.layout
    head = (
        f"memory: the least any legal layout needs is {need / _GB:.1f} GB per GPU ({lay.short()}: state "
        f"{state / _GB:.1f} GB, activations {mem['activations_bytes'] / _GB:.1f} GB, reserve "
        f"{mem['reserve_bytes'] / _GB:.1f} GB); the GPU has {capacity_bytes / _GB:.1f} GB usable"
    )
    if state + mem["reserve_bytes"] > capacity_bytes:
        factor = (state + mem["reserve_bytes"]) / capacity_bytes
        more = math.ceil(gpus * factor)
        head += (
            f". The training state alone is over capacity at the largest legal sharding (tp x pp = "
            f"{lay.tp * lay.pp}); it needs about {factor:.1f}x the GPUs (>= {more}), GPUs with more memory, or "
            "fewer optimizer bytes per parameter"
        )
    else:
        head += ". Activations are what overflow: try recompute=full, a smaller micro-batch, or more cp/tp"
    return head
