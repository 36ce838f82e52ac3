"""Megatron flags for mixture-of-experts, multi-latent-attention and multi-token-prediction plans, read back by
megatron-core 0.16's own config classes (TransformerConfig / MLATransformerConfig and their __post_init__ rules,
the pipeline layout parser) and checked against Megatron's argument rules (moe.md 1.2-1.4); the expert rank
grid against megatron-core's RankGenerator."""

from __future__ import annotations

import json
import shlex

import pytest

from optlayout.cli.common import params_arg
from optlayout.cost import evaluate
from optlayout.emit import emit, emit_notes, megatron_problems
from optlayout.emit.megatron import layer_pattern, megatron_args, moe_layer_freq
from optlayout.errors import UnsupportedError
from optlayout.layout import parse_layout
from optlayout.layout.ranks import expert_grid, grid
from optlayout.layout.stages import chunk_layer_counts, stage_layer_counts
from optlayout.presets import model_preset
from optlayout.specs import ClusterSpec, JobSpec
from optlayout.topology import topology_from_cluster
from tests.conftest import FIXTURES, require
from tests.launcher_plans import MOE_PLANS, MoePlan

PLANS = MOE_PLANS
IDS = [f"{p.model}-{p.layout}" for p in PLANS]


def _args(plan: MoePlan) -> list[str]:
    """The flags file read back as `$(cat file)` would split it, then the arguments the launch command adds."""
    model, lay = model_preset(plan.model), parse_layout(plan.layout)
    text = emit("megatron", model, plan.job, lay)
    command = next(n for n in emit_notes("megatron", model, plan.job, lay) if n.startswith("torchrun"))
    quoted = shlex.split(command.split("$(cat megatron_flags.txt)", 1)[1].split("<", 1)[0])
    return text.split() + quoted


def _values(args: list[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    for token in args:
        if token.startswith("--"):
            key = token
            flags[key] = []
        else:
            flags[key].append(token)
    return flags


def test_moe_layer_freq_is_the_list_expression_megatron_evaluates() -> None:
    deepseek, maverick = model_preset("deepseek-v3"), model_preset("llama4-maverick")
    assert moe_layer_freq(deepseek.moe_layer_flags) == "([0]*3+[1]*58)"  # Megatron's own DeepSeek-R1.sh example
    assert moe_layer_freq(maverick.moe_layer_flags) == "([0,1]*24)"
    assert moe_layer_freq(model_preset("qwen3-30b-a3b").moe_layer_flags) == "1"
    assert layer_pattern(model_preset("gpt-oss-120b").sliding_window_flags) == "([1,0]*18)"  # windowed from layer 0
    for model in (deepseek, maverick):  # arguments.py's moe_freq_type evaluates the string as a Python list
        assert [bool(f) for f in eval(moe_layer_freq(model.moe_layer_flags))] == list(model.moe_layer_flags)


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_moe_flags_build_megatron_core_configs(plan: MoePlan) -> None:
    torch = require("torch")
    tc = require("megatron.core.transformer.transformer_config")
    is_layer_window_attention = require("megatron.core.transformer.utils").is_layer_window_attention
    model, lay = model_preset(plan.model), parse_layout(plan.layout)
    flags = _values(_args(plan))
    one = {k: v[0] for k, v in flags.items() if v}
    fields = set(tc.MLATransformerConfig.__dataclass_fields__)
    handwritten = {"--num-experts": "num_moe_experts", "--moe-layer-freq": "moe_layer_freq"}  # arguments.py
    moe_flags = [f for f in flags if f.startswith(("--moe", "--expert", "--num-experts", "--mtp", "--q-lora",
                                                   "--kv-lora", "--qk-", "--v-head", "--multi-latent"))]  # fmt: skip
    for flag in moe_flags:  # every one a megatron-core field (argument_utils derives the flag from it) or mapped
        assert flag in handwritten or flag[2:].replace("-", "_") in fields, flag
    kw: dict[str, object] = {
        "num_layers": int(one["--num-layers"]),
        "hidden_size": int(one["--hidden-size"]),
        "ffn_hidden_size": int(one["--ffn-hidden-size"]),
        "num_attention_heads": int(one["--num-attention-heads"]),
        "num_query_groups": int(one.get("--num-query-groups", one["--num-attention-heads"])),
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "sequence_parallel": "--sequence-parallel" in flags,
        "pipeline_model_parallel_layout": one.get("--pipeline-model-parallel-layout"),
        "num_layers_in_first_pipeline_stage": int(one.get("--decoder-first-pipeline-num-layers", 0)) or None,
        "num_layers_in_last_pipeline_stage": int(one.get("--decoder-last-pipeline-num-layers", 0)) or None,
        "add_bias_linear": "--disable-bias-linear" not in flags,
        "gated_linear_unit": "--swiglu" in flags,
        "normalization": one.get("--normalization", "LayerNorm"),
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
        "num_moe_experts": int(one["--num-experts"]),
        "moe_layer_freq": eval(one["--moe-layer-freq"]),  # arguments.py's moe_freq_type evaluates it
        "moe_router_topk": int(one["--moe-router-topk"]),
        "moe_ffn_hidden_size": int(one["--moe-ffn-hidden-size"]),
        "moe_shared_expert_intermediate_size": int(one.get("--moe-shared-expert-intermediate-size", 0)) or None,
        "expert_model_parallel_size": int(one["--expert-model-parallel-size"]),
        "expert_tensor_parallel_size": int(one["--expert-tensor-parallel-size"]),
        "moe_grouped_gemm": "--moe-grouped-gemm" in flags,
        "moe_token_dispatcher_type": one["--moe-token-dispatcher-type"],
        "moe_router_pre_softmax": "--moe-router-pre-softmax" in flags,
        "moe_router_score_function": one.get("--moe-router-score-function", "softmax"),
        "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias" in flags,
        "moe_router_num_groups": int(one.get("--moe-router-num-groups", 0)) or None,
        "moe_router_group_topk": int(one.get("--moe-router-group-topk", 0)) or None,
        "moe_router_topk_scaling_factor": float(one.get("--moe-router-topk-scaling-factor", 0)) or None,
        "moe_router_dtype": one.get("--moe-router-dtype"),
        "mtp_num_layers": int(one.get("--mtp-num-layers", 0)) or None,
        "window_size": tuple(map(int, one["--window-size"].split(","))) if "--window-size" in one else None,
        "window_attn_skip_freq": eval(one["--window-attn-skip-freq"]) if "--window-attn-skip-freq" in one else None,
        "softmax_type": one.get("--softmax-type", "vanilla"),
        "qk_layernorm": "--qk-layernorm" in flags,
        "recompute_granularity": one.get("--recompute-granularity"),
        "recompute_modules": flags.get("--recompute-modules"),  # moe_act: only with the grouped GEMM
    }
    if lay.vp > 1 and "--pipeline-model-parallel-layout" not in one:
        kw["virtual_pipeline_model_parallel_size"] = lay.vp
    mla = "--multi-latent-attention" in flags
    if mla:
        ranks = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        kw |= {"multi_latent_attention": True} | {f: int(one["--" + f.replace("_", "-")]) for f in ranks}
        assert "--group-query-attention" not in flags  # arguments.py: MLA and GQA exclude each other
    config = (tc.MLATransformerConfig if mla else tc.TransformerConfig)(**kw)  # __post_init__: its own rules
    moe = model.moe
    assert moe is not None
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (
        moe.experts, moe.top_k, moe.expert_ffn)  # fmt: skip
    freq = config.moe_layer_freq  # training.py: layer i is MoE iff i % N == 0, or the list's flag
    is_moe = [i % freq == 0 for i in range(model.layers)] if isinstance(freq, int) else [bool(f) for f in freq]
    assert is_moe == list(model.moe_layer_flags)
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (lay.ep, lay.etp)
    if lay.recompute_modules:
        assert config.recompute_modules == [m.value for m in lay.recompute_modules]
    assert config.moe_router_score_function == moe.router_score
    assert config.moe_router_enable_expert_bias == (moe.router_score == "sigmoid" and bool(moe.router_bias))
    assert (config.moe_router_num_groups, config.moe_router_group_topk) == (moe.router_groups, moe.router_group_top_k)
    assert config.moe_router_topk_scaling_factor == moe.router_scaling
    assert (config.moe_shared_expert_intermediate_size or 0) == moe.shared_experts * moe.shared_width
    assert moe.experts % config.expert_model_parallel_size == 0  # arguments.py L1654-1658
    assert lay.tp == 1 or config.sequence_parallel  # moe_layer.py L636-640
    if model.mtp_layers:
        assert config.mtp_num_layers == model.mtp_layers
    windowed = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n)
                for n in range(1, model.layers + 1)]  # fmt: skip
    assert windowed == list(model.sliding_window_flags)  # megatron-core's own rule, layer numbers 1-based
    if config.window_size is not None:  # TE's (left, right): the query and the window - 1 keys before it
        assert config.window_size == (model.attention.sliding_window - 1, 0)
    assert (config.softmax_type == "learnable") == model.attention.sinks
    assert config.qk_layernorm == model.attention.qk_norm
    if config.pipeline_model_parallel_layout is not None:  # megatron-core parsed it: layers and MTP as planned
        stages = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual chunk] -> layer types
        order = [stages[s % lay.pp][s // lay.pp] for s in range(lay.pp * lay.vp)]
        decoders = [sum(t.name == "decoder" for t in chunk) for chunk in order]
        counts = stage_layer_counts(model.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)
        assert decoders == chunk_layer_counts(counts, lay.vp)
        assert sum(t.name == "mtp" for t in order[-1]) == model.mtp_layers  # in the last stage


@pytest.mark.parametrize(
    ("model", "layout", "job", "rule"),
    [
        ("qwen3-30b-a3b", "dp=12,ep=3,ga=4", {}, "num_experts % expert_model_parallel_size == 0"),
        ("mixtral-8x7b", "tp=2,dp=4,ep=4,ga=8", {}, "needs --sequence-parallel"),
        ("gpt-oss-120b", "tp=2,dp=4,ep=4,etp=2,ga=8,sp", {}, "Bias in Moe is only supported when ETP==1"),
        ("qwen3-30b-a3b", "dp=8,ga=8", {"moe_dispatcher": "flex"}, "the flex token dispatcher needs"),
        ("qwen3-30b-a3b", "pp=2,dp=4,ep=4,ga=8", {"moe_ep_overlap": True}, "--overlap-moe-expert-parallel-comm"),
        ("llama3.1-8b", "dp=8,ep=2,ga=8", {}, "expert parallelism needs --num-experts"),
    ],
)
def test_megatron_moe_rules_are_named(model: str, layout: str, job: dict, rule: str) -> None:
    lay = parse_layout(layout)
    spec = JobSpec(seq_len=4096, global_batch=lay.micro_batch * lay.grad_accum * lay.dp, **job)
    problems = megatron_problems(model_preset(model), spec, lay)
    assert any(rule in p for p in problems), problems
    with pytest.raises(UnsupportedError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        megatron_args(model_preset(model), spec, lay)


def test_the_other_launchers_still_refuse_moe_in_one_line() -> None:
    plan = PLANS[0]
    model, lay = model_preset(plan.model), parse_layout(plan.layout)
    with pytest.raises(UnsupportedError, match="emit accelerate: Qwen3-30B-A3B: not yet supported: expert paral"):
        emit("accelerate", model, plan.job, lay)
    with pytest.raises(UnsupportedError, match="deepspeed: Qwen3-30B-A3B: DeepSpeed-MoE's expert parallelism lives in"):
        emit("deepspeed", model, plan.job, lay)
    deepseek = model_preset("deepseek-v3")  # torchtitan, Bridge and the mesh take experts (their own tests)
    for fmt in ("torchtitan", "megatron-bridge", "mesh"):
        with pytest.raises(UnsupportedError, match=f"emit {fmt}: DeepSeek-V3: not yet supported: multi-latent"):
            emit(fmt, deepseek, plan.job, lay)


@pytest.mark.parametrize(
    "layout",
    [
        "tp=2,cp=2,dp=2,pp=2,ep=8,sp",
        "tp=2,cp=2,dp=2,pp=2,ep=4,etp=2,sp",
        "tp=4,dp=4,pp=2,ep=2,etp=2,sp",
        "tp=8,dp=8,pp=4,ep=32,sp",
        "dp=64,ep=16",
    ],
)
def test_expert_grid_is_megatron_cores_rank_generator(layout: str) -> None:
    ps = require("megatron.core.parallel_state")
    lay = parse_layout(layout)
    order = "tp-cp-ep-dp-pp"  # parallel_state.initialize_model_parallel's default
    experts = ps.RankGenerator(tp=lay.etp, ep=lay.ep, dp=lay.edp, pp=lay.pp, cp=1, order=order)
    dense = ps.RankGenerator(tp=lay.tp, ep=1, dp=lay.dp, pp=lay.pp, cp=lay.cp, order=order)
    ours, ours_dense = expert_grid(lay), grid(lay)
    for token, dims in (("tp", "tp"), ("ep", "ep"), ("dp", "dp"), ("pp", "pp"), ("tp-ep", ("tp", "ep")),
                        ("tp-ep-pp", ("tp", "ep", "pp"))):  # fmt: skip
        assert ours.groups(dims) == experts.get_ranks(token), token
    for token in ("tp", "cp", "dp", "pp"):
        assert ours_dense.groups(token) == dense.get_ranks(token), token
    assert ours.groups("pp") == ours_dense.groups("pp")  # parallel_state.py L904-907: the same PP groups


def test_the_jobs_moe_choices_become_megatron_core_fields() -> None:
    tc = require("megatron.core.transformer.transformer_config")
    torch = require("torch")
    model, lay = model_preset("qwen3-30b-a3b"), parse_layout("dp=8,ep=8,ga=8")
    job = JobSpec(seq_len=4096, global_batch=64, moe_routing="balanced", moe_dispatcher="flex", moe_ep_overlap=True)
    args = megatron_args(model, job, lay)
    flags = {a[2:].replace("-", "_") for a in args if a.startswith("--")}
    assert {"moe_router_force_load_balancing", "overlap_moe_expert_parallel_comm"} <= flags
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    tc.TransformerConfig(num_layers=model.layers, hidden_size=model.hidden, num_attention_heads=model.heads,
                         num_moe_experts=model.moe.experts, moe_router_topk=model.moe.top_k, add_bias_linear=False,
                         moe_ffn_hidden_size=model.moe.expert_ffn, expert_model_parallel_size=8, bf16=True,
                         params_dtype=torch.bfloat16, moe_token_dispatcher_type="flex",
                         moe_router_force_load_balancing=True)  # fmt: skip


def test_the_rank_map_lists_the_expert_groups_megatron_builds() -> None:
    ps = require("megatron.core.parallel_state")
    model, lay = model_preset("qwen3-30b-a3b"), parse_layout("tp=2,dp=8,ep=4,etp=2,ga=8,sp")
    text = emit("ranks", model, JobSpec(seq_len=4096, global_batch=64), lay)
    experts = ps.RankGenerator(tp=lay.etp, ep=lay.ep, dp=lay.edp, pp=lay.pp, cp=1, order="tp-cp-ep-dp-pp")
    for token in ("tp", "ep", "dp", "tp-ep"):
        block = text.split(f"# expert {token} groups\n", 1)[1].split("#", 1)[0]
        assert [json.loads(line) for line in block.splitlines()] == experts.get_ranks(token), token


# ---------------------------------------------------------------- Megatron-Bridge 0.3.1, Qwen3 MoE recipes

BRIDGE_PLANS = [
    ("qwen3-30b-a3b", "dp=16,ep=16,ga=64,sharding=zero1", {"moe_routing": "balanced"}),
    ("qwen3-30b-a3b", "tp=2,pp=2,dp=4,ep=8,ga=8,sharding=zero1,recompute=full,sp", {}),
    ("qwen3-30b-a3b", "tp=2,dp=8,ep=4,etp=2,ga=8,sharding=zero1,sp", {"moe_dispatcher": "flex"}),
    ("qwen3-235b-a22b", "tp=4,pp=16,cp=2,dp=2,ep=8,ga=8,sharding=zero1,sp", {}),
]
# what a recipe sets that decides the layout, the dispatcher or the memory the plan counted: the overrides must set
# each again (Hydra applies them after the recipe, and after its apply_flex_dispatcher_backend)
_LAYOUT_FIELDS = {
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "sequence_parallel", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "moe_token_dispatcher_type", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
}  # fmt: skip


@pytest.mark.parametrize(("model", "layout", "job"), BRIDGE_PLANS, ids=[f"{m}-{lay}" for m, lay, _ in BRIDGE_PLANS])
def test_bridge_moe_overrides_parse_and_build(model: str, layout: str, job: dict) -> None:
    """The overrides parse with Hydra (Bridge's parser), name only fields of megatron-core's TransformerConfig or of
    Bridge 0.3.1's containers, override everything the named recipe (read from v0.3.1's source) sets that decides
    the layout, and build a TransformerConfig (its MoE rules) with the expert degrees planned."""
    hydra = require("hydra.core.override_parser.overrides_parser")
    torch = require("torch")
    tc = require("megatron.core.transformer.transformer_config")
    fixtures = FIXTURES / "launchers"
    bridge = json.loads((fixtures / "megatron_bridge_0.3.1_fields.json").read_text())
    recipes = json.loads((fixtures / "megatron_bridge_0.3.1_qwen3_moe_recipes.json").read_text())["recipes"]
    spec, lay = model_preset(model), parse_layout(layout)
    jobspec = JobSpec(seq_len=4096, global_batch=lay.global_batch, grad_bytes_per_param=4, **job)
    text = emit("megatron-bridge", spec, jobspec, lay)
    command = next(n for n in emit_notes("megatron-bridge", spec, jobspec, lay) if n.startswith("torchrun"))
    recipe = recipes[command.split("--recipe ")[1].split()[0]]
    values: dict[str, dict] = {}
    for override in hydra.OverridesParser.create().parse_overrides(overrides=text.splitlines()):
        section, _, key = override.key_or_group.partition(".")
        known = set(bridge[section]["fields"]) if section in bridge else set()
        if section == "model":
            known |= set(tc.TransformerConfig.__dataclass_fields__)
        assert key in known or section in ("ddp", "optimizer", "dataset"), override.key_or_group
        values.setdefault(section, {})[key] = override.value()
    for key in recipe["sets"]:
        section, _, field = key.partition(".")
        if section == "model" and field in _LAYOUT_FIELDS:
            assert field in values["model"], f"the recipe's {key} is left as the recipe set it"
    assert "apply_flex_dispatcher_backend" in recipe["calls"] and "moe_token_dispatcher_type" in values["model"]
    assert "mixed_precision.fp8" not in recipe["sets"] and "mixed_precision" not in values  # bf16_mixed, fp32 grads
    moe = spec.moe
    assert moe is not None
    shape = {
        "num_layers": spec.layers,
        "hidden_size": spec.hidden,
        "num_attention_heads": spec.heads,
        "num_query_groups": spec.kv_heads,
        "kv_channels": spec.head_dim,
        "ffn_hidden_size": spec.ffn,
        "num_moe_experts": moe.experts,
        "moe_router_topk": moe.top_k,
        "moe_ffn_hidden_size": moe.expert_ffn,
        "moe_grouped_gemm": True,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
    }  # fmt: skip  (what the recipe's Hugging Face config gives)
    core = {k: v for k, v in values["model"].items() if k in tc.TransformerConfig.__dataclass_fields__}
    config = tc.TransformerConfig(**shape | core)
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (lay.ep, lay.etp)
    assert config.moe_token_dispatcher_type == jobspec.moe_dispatcher
    assert config.moe_router_force_load_balancing == (jobspec.moe_routing == "balanced")
    assert not config.account_for_embedding_in_pipeline_split and not config.account_for_loss_in_pipeline_split
    counts = stage_layer_counts(spec.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)
    if len(set(counts)) > 1:
        assert (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage) == (
            counts[0], counts[-1])  # fmt: skip


@pytest.mark.parametrize(
    ("model", "layout", "grad_bytes", "rule"),
    [
        ("qwen3-30b-a3b", "dp=16,ep=16,ga=64,sharding=zero1", 2.0, "names its mixed precision 'bf16_mixed'"),
        ("deepseek-v3", "pp=16,dp=16,ep=16,ga=16", 4.0, "not yet supported: multi-latent"),
        ("mixtral-8x7b", "tp=2,dp=8,ep=4,etp=2,ga=8,sp", 4.0, "none of the Qwen3 MoE models"),
        ("qwen3-30b-a3b", "dp=12,ep=3,ga=4", 4.0, "num_experts % expert_model_parallel_size == 0"),
    ],
)
def test_bridge_moe_refusals_name_the_rule(model: str, layout: str, grad_bytes: float, rule: str) -> None:
    lay = parse_layout(layout)
    job = JobSpec(seq_len=4096, global_batch=lay.global_batch, grad_bytes_per_param=grad_bytes)
    with pytest.raises(UnsupportedError) as info:
        emit("megatron-bridge", model_preset(model), job, lay)
    assert rule in str(info.value) and "\n" not in str(info.value)


QWEN_CLI = ["--model", "qwen3-30b-a3b", "--seq-len", "4096", "--global-batch", "512"]
MOE_FLAGS = ["--moe-dispatcher", "flex", "--moe-ep-overlap", "--moe-routing", "balanced"]


def test_the_cli_takes_the_jobs_moe_choices(cli, tmp_path) -> None:
    """--moe-dispatcher, --moe-ep-overlap and --moe-routing reach the job: estimate prices them as the library does
    (the exchange hidden under compute is shorter than the exposed one), emit turns them into Megatron's flags, a
    saved plan carries them to `emit --plan`, which refuses them given again."""
    cluster, layout = ["--cluster", "gpu=h100-sxm,gpus=16"], ["--layout", "dp=16,ep=16,ga=32"]
    plain = cli("estimate", *QWEN_CLI, *cluster, *layout, "--moe-routing", "balanced", "--json")
    hidden = cli("estimate", *QWEN_CLI, *cluster, *layout, *MOE_FLAGS, "--json")
    assert plain.returncode == hidden.returncode == 0, plain.stderr + hidden.stderr
    model, job = model_preset("qwen3-30b-a3b"), JobSpec(seq_len=4096, global_batch=512, moe_dispatcher="flex",
                                                        moe_ep_overlap=True, moe_routing="balanced")  # fmt: skip
    topo = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=16))
    params = params_arg(None, "h100-sxm", "bf16")  # the shipped calibration, as the CLI takes it
    expected = evaluate(model, job, parse_layout("dp=16,ep=16,ga=32"), topo.gpu, topo, params).times.ep_comm_s
    got = json.loads(hidden.stdout)["prediction"]["time"]["ep_comm_s"]
    assert got == pytest.approx(expected, rel=1e-9)
    assert got < json.loads(plain.stdout)["prediction"]["time"]["ep_comm_s"]
    emitted = cli("emit", "-f", "megatron", *QWEN_CLI, *layout, *MOE_FLAGS)
    assert emitted.returncode == 0, emitted.stderr
    args = emitted.stdout.split()
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert {"--overlap-moe-expert-parallel-comm", "--moe-router-force-load-balancing"} <= set(args)
    plan = tmp_path / "plan.json"
    solved = cli("solve", *QWEN_CLI, *cluster, *MOE_FLAGS, "--top", "1", "--save", str(plan))
    assert solved.returncode == 0, solved.stderr
    from_plan = cli("emit", "-f", "megatron", "--plan", str(plan)).stdout.split()
    assert from_plan[from_plan.index("--moe-token-dispatcher-type") + 1] == "flex"
    again = cli("emit", "-f", "megatron", "--plan", str(plan), "--moe-ep-overlap")
    assert again.returncode != 0 and "--moe-ep-overlap" in again.stderr


@pytest.mark.parametrize("command", ["estimate", "explain", "solve", "emit"])
def test_moe_choices_on_a_dense_model_are_refused_naming_the_field(cli, command) -> None:
    args = ["--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--moe-dispatcher", "flex"]
    if command != "emit":
        args += ["--cluster", "gpu=h100-sxm,gpus=8"]
    if command != "solve":
        args += ["--layout", "dp=8,ga=8"]
    out = cli(command, *(["-f", "megatron"] if command == "emit" else []), *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "moe_dispatcher: for mixture-of-experts models; Llama 3 8B has no routed experts" in out.stderr


def test_memory_takes_the_expert_axes(cli) -> None:
    """`memory --ep 8` on Qwen3-30B-A3B (48 layers x 128 experts of 3 x 2048 x 768 SwiGLU weights = 28.99B routed of
    30.53B): each GPU holds the dense 1.54B and an eighth of the experts, at 2 + 2 + 12 bytes each without sharding;
    --moe-routing balanced lowers the routed activations; ep with --params or on a dense model is refused."""
    out = cli("memory", "--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--json")
    assert out.returncode == 0, out.stderr
    routed, total = 48 * 128 * 3 * 2048 * 768, 30_532_122_624
    assert json.loads(out.stdout)["state_per_gpu_bytes"] == pytest.approx(16 * (total - routed + routed / 8))
    acts = {}
    for routing in ([], ["--moe-routing", "balanced"]):
        run = cli("memory", "--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--seq-len", "4096", "--json",
                  *routing)  # fmt: skip
        acts[bool(routing)] = json.loads(run.stdout)["activations_per_gpu_bytes"]
    assert acts[True] < acts[False]
    for args, message in ((["--params", "7e9"], "ep: the expert axes need a mixture-of-experts model shape"),
                          (["--model", "llama3-8b"], "ep/etp > 1 need a mixture-of-experts model")):  # fmt: skip
        refused = cli("memory", *args, "--gpus", "8", "--ep", "8")
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr


def test_the_moe_choices_left_out_are_said_assumed(cli) -> None:
    """An MoE job's dispatcher, EP overlap and routing, when not given, are listed as assumed (JSON and text); given,
    they are not; a dense model's job lists none."""
    cluster, layout = ["--cluster", "gpu=h100-sxm,gpus=16"], ["--layout", "dp=16,ep=16,ga=32"]
    left = json.loads(cli("estimate", *QWEN_CLI, *cluster, *layout, "--json").stdout)["assumed"]
    assert {k: left[k]["value"] for k in ("moe_dispatcher", "moe_ep_overlap", "moe_routing")} == {
        "moe_dispatcher": "alltoall", "moe_ep_overlap": False, "moe_routing": "real"}  # fmt: skip
    given = json.loads(cli("estimate", *QWEN_CLI, *cluster, *layout, *MOE_FLAGS, "--json").stdout)["assumed"]
    assert not {"moe_dispatcher", "moe_ep_overlap", "moe_routing"} & set(given)
    solved = cli("solve", *QWEN_CLI, *cluster, "--top", "1")
    text = solved.stdout + solved.stderr
    assert "assumed moe_routing=real (not given: trained routing" in text
    dense = cli("estimate", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--cluster",
                "gpu=h100-sxm,gpus=8", "--layout", "dp=8,ga=8", "--json")  # fmt: skip
    assert not any(k.startswith("moe_") for k in json.loads(dense.stdout)["assumed"])


SM_NOTE = ("moe_ep_overlap with the flex dispatcher on h20: its SM count is not known, so the SMs the dispatcher's "
           "kernels hold under the overlap are not priced")  # fmt: skip


def test_overlap_on_a_gpu_of_no_known_sm_count_is_noted(cli) -> None:
    """The flex dispatcher's held SMs need the GPU's SM count (the H20 preset states none): there the share goes
    unpriced, and estimate, explain, solve and compare say so; on the H100 (132 SMs), or without the overlap, no
    note."""
    layout = ["--layout", "dp=16,ep=16,ga=32"]
    h20, h100 = ["--cluster", "gpu=h20,gpus=16"], ["--cluster", "gpu=h100-sxm,gpus=16"]
    for command, args in (("estimate", layout), ("explain", layout), ("solve", ["--top", "1"])):
        noted = cli(command, *QWEN_CLI, *h20, *args, *MOE_FLAGS, "--json")
        assert noted.returncode == 0, noted.stderr
        notes = json.loads(noted.stdout)["notes"]
        assert len(notes) == 1 and notes[0].startswith(SM_NOTE), notes
        for quiet in (cli(command, *QWEN_CLI, *h100, *args, *MOE_FLAGS, "--json"),
                      cli(command, *QWEN_CLI, *h20, *args, "--moe-dispatcher", "flex", "--json")):  # fmt: skip
            assert quiet.returncode == 0 and "notes" not in json.loads(quiet.stdout), quiet.stderr
    text = cli("estimate", *QWEN_CLI, *h20, *layout, *MOE_FLAGS)
    assert f"note: {SM_NOTE}" in " ".join(text.stdout.split())
    record = json.loads((FIXTURES / "runs" / "moe_runs.jsonl").read_text().splitlines()[0])
    record["job"] |= {"moe_dispatcher": "flex", "moe_ep_overlap": True}
    from optlayout.runs.records import RunRecord

    assert RunRecord.model_validate(record).notes() == []  # on H100s
    record["cluster"]["gpu"] = "h20"
    (note,) = RunRecord.model_validate(record).notes()
    assert note.startswith(SM_NOTE)
