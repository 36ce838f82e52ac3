"""What a Megatron-Core release accepts of what optlayout plans and emits, in one home.

A user on an older stack (a NeMo container pins its Megatron-Core) can only run the layouts whose flags that release
has: `solve --megatron-core 0.9.0` (or `nemo:24.09`) searches only those (`SpaceOptions.megatron_core`, through
`sharding_offered`, `split_offered`, `cp_offered` and `torch_fsdp2_runs`; a model or job it cannot run at all is
refused, `emit.megatron.release_problems`), and `emit --format megatron --megatron-core` refuses a flag the release
lacks (`flag_problems`).

`FLAG_SINCE`: every flag the Megatron emitter writes that is younger than `OLDEST`, with the first release whose
`megatron/training/arguments.py` defines it (NVIDIA/Megatron-LM tags core_r0.6.0 ... core_v0.16.0; the whole table
is checked against those files in tests/test_megatron_core.py, from tests/fixtures/megatron_flag_releases.json,
which `benchmarks/megatron_flag_releases.py` writes from a Megatron-LM clone). `VALUE_SINCE`: values of older flags
that came later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from optlayout.errors import InputError
from optlayout.layout.model import Sharding

if TYPE_CHECKING:
    from optlayout.specs import JobSpec, ModelSpec

Version = tuple[int, int, int]
OLDEST: Final[Version] = (0, 6, 0)
"""The oldest release checked: every emitted flag not in `FLAG_SINCE` is in its arguments.py (core_r0.6.0)."""

FLAG_SINCE: Final[dict[str, Version]] = {
    "--use-tp-pp-dp-mapping": (0, 7, 0),
    "--moe-router-pre-softmax": (0, 8, 0),
    "--rotary-base": (0, 8, 0),
    "--ckpt-format": (0, 9, 0),
    "--decoder-first-pipeline-num-layers": (0, 9, 0),
    "--decoder-last-pipeline-num-layers": (0, 9, 0),
    "--fp8-param-gather": (0, 9, 0),
    "--expert-tensor-parallel-size": (0, 10, 0),
    "--kv-lora-rank": (0, 10, 0),
    "--moe-ffn-hidden-size": (0, 10, 0),
    "--moe-layer-freq": (0, 10, 0),
    "--moe-shared-expert-intermediate-size": (0, 10, 0),
    "--multi-latent-attention": (0, 10, 0),
    "--q-lora-rank": (0, 10, 0),
    "--qk-head-dim": (0, 10, 0),
    "--qk-pos-emb-head-dim": (0, 10, 0),
    "--use-rope-scaling": (0, 10, 0),
    "--use-torch-fsdp2": (0, 10, 0),
    "--v-head-dim": (0, 10, 0),
    "--exp-avg-dtype": (0, 11, 0),
    "--exp-avg-sq-dtype": (0, 11, 0),
    "--main-params-dtype": (0, 11, 0),
    "--moe-router-enable-expert-bias": (0, 11, 0),
    "--moe-router-group-topk": (0, 11, 0),
    "--moe-router-num-groups": (0, 11, 0),
    "--moe-router-score-function": (0, 11, 0),
    "--moe-router-topk-scaling-factor": (0, 11, 0),
    "--num-virtual-stages-per-pipeline-rank": (0, 11, 0),
    "--rope-scaling-factor": (0, 11, 0),
    "--use-precision-aware-optimizer": (0, 11, 0),
    "--data-parallel-sharding-strategy": (0, 12, 0),
    "--fp8-recipe": (0, 12, 0),
    "--grad-reduce-in-bf16": (0, 12, 0),
    "--moe-router-dtype": (0, 12, 0),
    "--mtp-num-layers": (0, 12, 0),
    "--recompute-modules": (0, 12, 0),
    "--moe-router-force-load-balancing": (0, 13, 0),
    "--pipeline-model-parallel-layout": (0, 13, 0),
    "--reuse-grad-buf-for-mxfp8-param-ag": (0, 13, 0),
    "--torch-fsdp2-no-reshard-after-forward": (0, 13, 0),
    "--overlap-moe-expert-parallel-comm": (0, 14, 0),
    "--use-megatron-fsdp": (0, 14, 0),
    "--softmax-type": (0, 15, 0),
    "--window-attn-skip-freq": (0, 15, 0),
    "--window-size": (0, 15, 0),
}  # fmt: skip

VALUE_SINCE: Final[dict[tuple[str, str], Version]] = {
    ("--moe-token-dispatcher-type", "flex"): (0, 12, 0),  # choices gain "flex" (arguments.py @core_v0.12.0)
    ("--fp8-recipe", "blockwise"): (0, 13, 0),  # choices gain "blockwise" (@core_v0.13.0)
    ("--recompute-modules", "shared_experts"): (0, 14, 0),  # the modules gain it (@core_v0.14.0)
}

FIXED_BEFORE: Final[dict[tuple[str, str], Version]] = {
    ("--rope-scaling-factor", "8"): (0, 11, 0),  # @core_v0.10.0 rotary_pos_embedding.py: _apply_scaling(factor=8)
}
"""Flag values that an older release has as its fixed behaviour: dropped for it (`for_release`) rather than
refused."""

NEMO_CONTAINERS: Final[dict[str, Version]] = {"24.05": (0, 7, 0), "24.07": (0, 8, 0), "24.09": (0, 9, 0)}
"""The Megatron-Core of each NeMo container, from NeMo's "Software Component Versions" (user guide 24.09). Later
containers: give `--megatron-core` the version itself."""

_VERSION = re.compile(r"^(?:core_[rv])?(\d+)\.(\d+)(?:\.(\d+))?$")


def parse_megatron_core(text: str) -> Version:
    """`0.9.0`, `0.12`, `core_v0.12.0` or a NeMo container `nemo:24.09`, as (major, minor, patch); one-line error
    otherwise."""
    value = text.strip()
    if value.startswith("nemo:"):
        container = value.removeprefix("nemo:")
        if container not in NEMO_CONTAINERS:
            known = ", ".join(NEMO_CONTAINERS)
            raise InputError(f"megatron-core: NeMo container {container!r} has no Megatron-Core on record (known: "
                             f"{known}); give the version itself, e.g. 0.12.0")  # fmt: skip
        return NEMO_CONTAINERS[container]
    found = _VERSION.match(value)
    if found is None:
        raise InputError(f"megatron-core: {text!r} is not a release (e.g. 0.12.0, core_v0.12.0 or nemo:24.09)")
    version = (int(found.group(1)), int(found.group(2)), int(found.group(3) or 0))
    if version < OLDEST:
        raise InputError(f"megatron-core: {version_text(version)} is older than the oldest release checked "
                         f"({version_text(OLDEST)})")  # fmt: skip
    return version


def version_text(version: Version) -> str:
    return ".".join(str(n) for n in version)


HINTS: Final = {
    "--grad-reduce-in-bf16": "before it bf16 forces fp32 gradient buffers (arguments.py @core_r0.9.0 L335): plan "
    "with --grad-bytes 4",
}


def _lacks(flag: str, version: Version) -> str | None:
    since = FLAG_SINCE.get(flag, OLDEST)
    hint = f"; {HINTS[flag]}" if flag in HINTS else ""
    return f"{flag} (from {version_text(since)}{hint})" if version < since else None


def for_release(flags: Iterable[tuple[str, ...]], version: Version | None) -> list[str]:
    """The tokens of emitted flags (each a flag and its values) without those whose value is `version`'s fixed
    behaviour (`FIXED_BEFORE`); all of them for the current release (None)."""

    def fixed(flag: tuple[str, ...]) -> bool:
        since = FIXED_BEFORE.get((flag[0], flag[1])) if len(flag) == 2 else None
        return version is not None and since is not None and version < since

    return [token for flag in flags if not fixed(flag) for token in flag]


def flag_problems(tokens: Iterable[str], version: Version) -> list[str]:
    """What of an emitted Megatron command line (`megatron_args`' tokens) `version` lacks, one line each."""
    problems, flag = [], ""
    for token in tokens:
        if token.startswith("--"):
            flag = token
            missing = _lacks(token, version)
        else:
            since = VALUE_SINCE.get((flag, token))
            missing = f"{flag} {token} (from {version_text(since)})" if since and version < since else None
        if missing:
            problems.append(f"megatron-core {version_text(version)} has no {missing}")
    return problems


FSDP_SHARDINGS: Final = frozenset({Sharding.zero2, Sharding.fsdp})
"""The shardings optlayout emits as FSDP (Megatron FSDP, or torch FSDP2 without or with resharding)."""
FSDP_SINCE: Final = min(FLAG_SINCE["--use-torch-fsdp2"], FLAG_SINCE["--use-megatron-fsdp"])
"""FSDP as optlayout emits it: `--use-torch-fsdp2`, or `--use-megatron-fsdp`."""
ZERO2_SINCE: Final = min(FLAG_SINCE["--torch-fsdp2-no-reshard-after-forward"], FLAG_SINCE["--use-megatron-fsdp"])
"""ZeRO-2 as optlayout emits it: FSDP2 without resharding after forward, or Megatron FSDP's optim_grads."""


def sharding_offered(version: Version, sharding: Sharding) -> bool:
    """Whether optlayout emits `sharding` for `version` (`FSDP_SINCE`, `ZERO2_SINCE`)."""
    return version >= {Sharding.fsdp: FSDP_SINCE, Sharding.zero2: ZERO2_SINCE}.get(sharding, OLDEST)


FSDP_CONNECTIONS_SINCE: Final[Version] = (0, 12, 0)
"""From it FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS > 1 (arguments.py @core_v0.12.0 L527); before it sequence
parallelism and TP's async all-reduce require 1 even under FSDP2 (@core_v0.10.0 L604-612; FSDP2 only warned)."""
MTP_WITH_CP_SINCE: Final[Version] = (0, 14, 0)
"""Before it MTP asserts context_parallel_size == 1 (arguments.py @core_v0.12.0 L963, @core_v0.13.0 L1075)."""


def cp_offered(version: Version, model: ModelSpec, cp: int) -> bool:
    """Whether `version` runs the model's MTP layers with context parallelism `cp`."""
    return cp == 1 or not model.mtp_layers or version >= MTP_WITH_CP_SINCE


def torch_fsdp2_only(version: Version) -> bool:
    """Whether FSDP and ZeRO-2 are torch FSDP2's alone on `version` (Megatron FSDP is younger)."""
    return version < FLAG_SINCE["--use-megatron-fsdp"]


def torch_fsdp2_runs(model: ModelSpec, job: JobSpec, pp: int, ep: int) -> bool:
    """torch FSDP2's own rules (arguments.py @core_v0.10.0 to @core_v0.16.0; the Megatron emitter names each):
    no pipeline or expert parallelism, no fp16, untied embeddings."""
    return pp == 1 and ep == 1 and job.precision != "fp16" and not model.tied_embeddings


def space_limits(version: Version) -> list[str]:
    """What a space kept to `version` leaves out, one phrase each (empty for a current release)."""
    rules = (
        ("FSDP", FSDP_SINCE),
        ("ZeRO-2", ZERO2_SINCE),
        ("uneven pipeline stages", FLAG_SINCE["--decoder-first-pipeline-num-layers"]),
        ("uneven stages with virtual stages", FLAG_SINCE["--num-virtual-stages-per-pipeline-rank"]),
        ("uneven stages of unequal virtual chunks", FLAG_SINCE["--pipeline-model-parallel-layout"]),
        ("MTP with context parallelism", MTP_WITH_CP_SINCE),
        ("FSDP or ZeRO-2 with pipeline or expert parallelism", FLAG_SINCE["--use-megatron-fsdp"]),
    )
    return [f"no {what} (from {version_text(since)})" for what, since in rules if version < since]


def split_flags(counts: list[int], vp: int) -> tuple[str, ...]:
    """The flags that give Megatron a stage split (`counts` layers per stage) with `vp` chunks per stage, as the
    emitter writes them: uneven stages by first/last counts and virtual stages per rank, or the layout string
    when an uneven stage does not divide into its chunks."""
    if len(set(counts)) == 1:
        return ("--num-layers-per-virtual-pipeline-stage",) if vp > 1 else ()
    if vp > 1 and any(n % vp for n in counts):
        return ("--pipeline-model-parallel-layout",)
    first_last = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
    return (*(("--num-virtual-stages-per-pipeline-rank",) if vp > 1 else ()), *first_last)


def split_offered(version: Version, counts: list[int], vp: int) -> bool:
    """Whether `version` takes the flags of that stage split (`split_flags`)."""
    return not any(_lacks(flag, version) for flag in split_flags(counts, vp))
