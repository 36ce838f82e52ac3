"""The emitted Megatron flags fed to Megatron-LM's own `parse_args` + `validate_args` (not a test: it needs a
Megatron-LM checkout, which is not in this repository, nor in the pip package, which ships megatron-core only).

Reproduce:  python benchmarks/megatron_lm_args.py --megatron-lm PATH [--sample 40] [--write]
            python benchmarks/megatron_lm_args.py --megatron-lm GITDIR --megatron-core 0.9.0 [--write]
PATH is a Megatron-LM checkout (or its git directory: `megatron/` of HEAD is exported to a temporary folder).
With `--megatron-core`, the tag of that release (core_r/core_v) is exported instead and the layouts are those a
solve kept to it offers (`SpaceOptions.megatron_core`), emitted for it (`megatron_args(megatron_core=...)`), with
4-byte gradients before 0.12.0 (bf16 forces them there); the models the release cannot run are left out.
The checks run
run in the `launchers` extra's environment (torch, triton, megatron-core's dependencies). Three shims, all
outside Megatron-LM: `typing.override` on Python 3.11 (Megatron-LM main needs 3.12 for that decorator only),
and `get_device_arch_version() = 9`, `torch.cuda.get_device_capability() = (9, 0)` (validate_args asks the GPU;
this answers as an H100).

For the test plans (tests/launcher_plans.py) and a random sample of every model's legal layouts that
`megatron_args` emits, Megatron must accept the flags and its parsed arguments must carry the plan: the
degrees (data-parallel size derived from WORLD_SIZE), virtual stages, batch, model shape, RoPE, dropout and
the gradient accumulation dtype the memory model counted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import random
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

from _results import publish
from megatron_flag_releases import tag_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optlayout.cost.step import tp_overlap_applies  # noqa: E402
from optlayout.emit import megatron_args  # noqa: E402
from optlayout.emit.megatron import max_connections, megatron_fsdp_impl, release_problems  # noqa: E402
from optlayout.errors import OptlayoutError  # noqa: E402
from optlayout.layout import parse_layout  # noqa: E402
from optlayout.layout.megatron_core import FLAG_SINCE, Version, parse_megatron_core, version_text  # noqa: E402
from optlayout.presets import model_preset  # noqa: E402
from optlayout.solver.space import SpaceOptions, enumerate_layouts  # noqa: E402
from optlayout.specs import JobSpec  # noqa: E402
from tests.launcher_plans import MOE_PLANS, PLANS  # noqa: E402

MODELS = (("llama3.1-8b", 8192, 64), ("llama3.1-70b", 8192, 256), ("llama3.1-405b", 8192, 2048),
          ("gpt3-175b", 2048, 1024), ("qwen2.5-72b", 4096, 512), ("qwen3-30b-a3b", 4096, 64),
          ("deepseek-v3", 4096, 256), ("mixtral-8x7b", 4096, 64))  # fmt: skip


def megatron_source(path: Path, ref: str = "HEAD") -> Path:
    """A folder holding `megatron/` of the checkout (exported from `ref` when PATH is a git directory)."""
    if (path / "megatron" / "training" / "arguments.py").is_file():
        return path
    out = Path(tempfile.mkdtemp(prefix="megatron-lm-"))
    archive = subprocess.run(
        ["git", "--git-dir", str(path), "archive", ref, "megatron"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def load_parser(source: Path):
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    sys.path.insert(0, str(source))
    import megatron.training.arguments as arguments

    arguments.get_device_arch_version = lambda: 9
    import torch

    torch.cuda.get_device_capability = lambda *_: (9, 0)  # --moe-grouped-gemm asks for compute capability >= 8
    return arguments


def cases(sample: int, seed: int, release: Version | None = None) -> list[tuple[str, object, JobSpec, object]]:
    out = []
    if release is None:  # the test plans target the current release
        out = [(p.name, p.spec, p.job, p.lay) for p in PLANS if "megatron" not in p.refused]
        for plan in MOE_PLANS:
            out.append((f"{plan.model} {plan.layout}", model_preset(plan.model), plan.job, parse_layout(plan.layout)))
    rng = random.Random(seed)
    grad_bytes = 4 if release is not None and release < FLAG_SINCE["--grad-reduce-in-bf16"] else 2
    for name, seq, gpus in MODELS:
        model = model_preset(name)
        job = JobSpec(seq_len=seq, global_batch=gpus // 2 if gpus > 64 else 128, grad_bytes_per_param=grad_bytes)
        if release is not None and release_problems(model, job, release):
            continue
        emitted = []
        for layout in enumerate_layouts(model, job, gpus, 8, SpaceOptions(megatron_core=release)):
            try:
                emit_args(model, job, layout, release)
            except OptlayoutError:
                continue
            emitted.append(layout)
        for layout in rng.sample(emitted, min(sample, len(emitted))):
            out.append((f"{name} {layout.short()}", model, job, layout))
    return out


def emit_args(model, job, layout, release: Version | None) -> list[str]:
    return megatron_args(model, job, layout, fsdp_impl=megatron_fsdp_impl("megatron", release), megatron_core=release)


def check(arguments, model, job, layout, release: Version | None = None) -> list[str]:
    """Parse and validate; return the fields where Megatron's arguments differ from the plan."""
    args = emit_args(model, job, layout, release)
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(layout.gpus), "0"
    # the environment megatron_notes prescribes: one connection, except under FSDP (which needs more from 0.12.0)
    connections = max_connections(layout, release)
    if connections is None:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    sys.argv = ["pretrain_gpt.py", *args, "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab)]
    with contextlib.redirect_stdout(io.StringIO()):
        parsed = arguments.parse_args()
        arguments.validate_args(parsed)
    want = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "context_parallel_size": layout.cp,
        "data_parallel_size": layout.dp,
        "micro_batch_size": layout.micro_batch,
        "global_batch_size": layout.global_batch,
        "seq_length": job.seq_len,
        "num_layers": model.layers,
        "hidden_size": model.hidden,
        "ffn_hidden_size": model.ffn,
        "num_attention_heads": model.heads,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "accumulate_allreduce_grads_in_fp32": job.grad_bytes_per_param == 4,
        "sequence_parallel": layout.sequence_parallel,
        "tp_comm_overlap": tp_overlap_applies(layout),  # as priced
        # torch FSDP2 shards the optimizer itself: it asserts no distributed optimizer
        "use_distributed_optimizer": layout.sharding.value != "none" and "--use-torch-fsdp2" not in args,
    }
    if not model.position_embeddings:
        want["rotary_base"] = int(model.rope_theta)
        if hasattr(parsed, "use_rope_scaling"):  # from 0.10.0
            want["use_rope_scaling"] = model.rope_scaling is not None
    if "--pipeline-model-parallel-layout" not in args:
        want["virtual_pipeline_model_parallel_size"] = layout.vp if layout.vp > 1 else None
    if model.moe is not None:
        freq = parsed.moe_layer_freq
        want |= {
            "num_experts": model.moe.experts,
            "moe_router_topk": model.moe.top_k,
            "moe_ffn_hidden_size": model.moe.expert_ffn,
            "expert_model_parallel_size": layout.ep,
            "expert_tensor_parallel_size": layout.etp,
            "moe_grouped_gemm": True,
            "moe_shared_expert_intermediate_size": model.moe.shared_experts * model.moe.shared_width or None,
        }
        is_moe = [i % freq == 0 for i in range(model.layers)] if isinstance(freq, int) else [bool(f) for f in freq]
        if is_moe != list(model.moe_layer_flags):
            return [f"moe_layer_freq={freq!r} (plan {model.moe_layer_flags})"]
    if model.attention.kind == "mla":
        att = model.attention
        want |= {"multi_latent_attention": True, "q_lora_rank": att.q_lora_rank, "kv_lora_rank": att.kv_lora_rank,
                 "qk_head_dim": att.qk_head_dim, "qk_pos_emb_head_dim": att.qk_rope_head_dim,
                 "v_head_dim": att.v_head_dim}  # fmt: skip
    if model.mtp_layers:
        want["mtp_num_layers"] = model.mtp_layers
    return [f"{k}={getattr(parsed, k, None)!r} (plan {v!r})" for k, v in want.items() if getattr(parsed, k, None) != v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM checkout or git directory")
    parser.add_argument("--sample", type=int, default=20, help="random emitted layouts per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--megatron-core", help="a release: its tag's parser, the layouts kept to it")
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    opts = parser.parse_args()
    release = parse_megatron_core(opts.megatron_core) if opts.megatron_core else None
    ref = "HEAD" if release is None else tag_of(opts.megatron_lm, version_text(release))
    source = megatron_source(opts.megatron_lm, ref)
    commit = subprocess.run(["git", "--git-dir", str(opts.megatron_lm), "log", "-1", "--format=%h %cs", ref],
                            capture_output=True, text=True).stdout.strip() or "working tree"  # fmt: skip
    arguments = load_parser(source)
    accepted, mismatched, refused = 0, [], []
    todo = cases(opts.sample, opts.seed, release)
    for label, model, job, layout in todo:
        try:
            diff = check(arguments, model, job, layout, release)
        except (AssertionError, SystemExit, ValueError, RuntimeError) as exc:
            refused.append(f"{label}: {type(exc).__name__} {str(exc)[:200]}")
            continue
        if diff:
            mismatched.append(f"{label}: {'; '.join(diff)}")
        else:
            accepted += 1
    import torch

    models = sorted({label.split()[0] for label, *_ in todo} & {m for m, _, _ in MODELS})
    flag = "" if release is None else f" --megatron-core {version_text(release)}"
    what = (f"{len(PLANS)} test plans less those Megatron refuses by rule, {len(MOE_PLANS)} mixture-of-experts plans, "
            "and " if release is None else "")  # fmt: skip
    tag = "" if release is None else f" ({ref.removeprefix('refs/tags/')})"
    lines = [
        f"Megatron-LM {commit}{tag}, `parse_args` + "
        "`validate_args` on CPU (shims: typing.override, GPU arch 9, capability 9.0); "
        f"`python benchmarks/megatron_lm_args.py --megatron-lm PATH --sample {opts.sample} --seed {opts.seed}{flag}`; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}",
        "",
        f"- {len(todo)} emitted flag sets ({what}{opts.sample} random emitted layouts of each of "
        f"{', '.join(models)}; MoE runs also check experts, top-k, widths, the layer pattern, ep/etp, MLA ranks "
        "and MTP)",
        f"- accepted with every checked value equal to the plan: {accepted}",
        f"- accepted with a value differing from the plan: {len(mismatched)}",
        f"- refused by Megatron: {len(refused)}",
        *[f"  - {line}" for line in mismatched + refused],
    ]
    key, title = "megatron_lm_args", "Megatron flags through Megatron-LM's own parser"
    if release is not None:
        key, title = f"{key}_{version_text(release)}", f"{title}, Megatron-Core {version_text(release)}"
    publish(key, title, "\n".join(lines), opts.write)


if __name__ == "__main__":
    main()
