"""What a Megatron-Core release runs (`optlayout.layout.megatron_core`): the flag table against Megatron's own
arguments.py, the space kept to a release against the emitter for it, the solver against the oracle there, and the
CLI and plan round trip."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optlayout.cost import DEFAULT_PARAMS, usable_memory_bytes
from optlayout.emit import emit, megatron_args
from optlayout.emit.megatron import megatron_fsdp_impl, release_problems
from optlayout.errors import InputError, OptlayoutError
from optlayout.layout import parse_layout
from optlayout.layout.megatron_core import (
    FLAG_SINCE,
    NEMO_CONTAINERS,
    OLDEST,
    VALUE_SINCE,
    flag_problems,
    parse_megatron_core,
)
from optlayout.planning import solve
from optlayout.presets import model_preset
from optlayout.solver.candidates import CostTable
from optlayout.solver.cpsat import Limits
from optlayout.solver.oracle import oracle_ranking
from optlayout.solver.space import SpaceOptions, enumerate_layouts
from optlayout.specs import ClusterSpec, JobSpec, Sharding
from optlayout.topology import topology_from_cluster
from tests.test_solver import NO_RESERVE, problems

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "megatron_flag_releases.json").read_text())
RELEASES = [tuple(int(n) for n in r.split(".")) for r in FIXTURE["tags"]]


def _release(text: str) -> tuple[int, int, int]:
    return parse_megatron_core(text)


def test_flag_table_matches_megatron_arguments_py_at_every_release():
    """Each flag's first release in `FLAG_SINCE` (0.6.0 for the flags it omits) is the first tag whose
    arguments.py defines it (benchmarks/megatron_flag_releases.py read the tags), and none is removed up to 0.15.0."""
    for flag, releases in FIXTURE["releases"].items():
        assert releases, f"{flag} is in no release from 0.6.0 to 0.15.0"
        first = _release(releases[0])
        assert FLAG_SINCE.get(flag, OLDEST) == first, flag
        assert releases == [r for r in FIXTURE["tags"] if _release(r) >= first], f"{flag} removed in between"
    assert set(FLAG_SINCE) <= set(FIXTURE["releases"])


def test_every_flag_the_emitter_writes_is_in_the_table():
    """The fixture lists the flags the emitter source names; the flags emitted for varied plans are among them."""
    rng = random.Random(0)
    seen: set[str] = set()
    for name, seq, gpus in (("llama3.1-405b", 8192, 1024), ("deepseek-v3", 4096, 256), ("gpt-oss-120b", 4096, 64),
                            ("qwen3-30b-a3b", 4096, 64), ("gpt3-175b", 2048, 512)):  # fmt: skip
        model = model_preset(name)
        for precision in ("bf16", "fp8"):
            job = JobSpec(seq_len=seq, global_batch=gpus // 2, precision=precision)
            layouts = list(enumerate_layouts(model, job, gpus, 8, SpaceOptions(max_micro_batch=2, max_vp=4)))
            for layout in rng.sample(layouts, min(60, len(layouts))):
                for impl in ("megatron", "torch"):
                    try:
                        args = megatron_args(model, job, layout, fsdp_impl=impl)
                    except OptlayoutError:
                        continue
                    seen |= {t for t in args if t.startswith("--")}
    assert len(seen) > 60
    assert seen <= set(FIXTURE["releases"]), seen - set(FIXTURE["releases"])


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.9.0", (0, 9, 0)), ("0.12", (0, 12, 0)), ("core_v0.13.1", (0, 13, 1)), ("core_r0.9.0", (0, 9, 0)),
     ("nemo:24.09", (0, 9, 0)), ("nemo:24.05", (0, 7, 0))],
)  # fmt: skip
def test_release_text(text, version):
    assert parse_megatron_core(text) == version


@pytest.mark.parametrize(
    ("text", "needle"),
    [("0.5.0", "older than the oldest release checked (0.6.0)"), ("latest", "not a release"),
     ("nemo:24.12", "NeMo container '24.12' has no Megatron-Core on record"), ("0.9.0.1", "not a release")],
)  # fmt: skip
def test_release_text_refused(text, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_megatron_core(text)


def test_nemo_containers_follow_nemos_component_table():
    # NeMo user guide 24.09, "Software Component Versions": 24.05 -> 0.7.0, 24.07 -> 0.8, 24.09 -> 0.9.0
    assert NEMO_CONTAINERS == {"24.05": (0, 7, 0), "24.07": (0, 8, 0), "24.09": (0, 9, 0)}


def test_flag_problems_name_flag_value_and_release():
    tokens = ["--use-torch-fsdp2", "--moe-token-dispatcher-type", "flex", "--recompute-modules", "core_attn"]
    assert flag_problems(tokens, (0, 9, 0)) == [
        "megatron-core 0.9.0 has no --use-torch-fsdp2 (from 0.10.0)",
        "megatron-core 0.9.0 has no --moe-token-dispatcher-type flex (from 0.12.0)",
        "megatron-core 0.9.0 has no --recompute-modules (from 0.12.0)",
    ]
    assert flag_problems(tokens, (0, 12, 0)) == []
    assert VALUE_SINCE[("--moe-token-dispatcher-type", "flex")] == (0, 12, 0)


def test_release_problems_refuse_what_no_layout_fixes():
    bf16 = JobSpec(seq_len=4096, global_batch=64)
    fp32_grads = JobSpec(seq_len=4096, global_batch=64, grad_bytes_per_param=4)
    # before 0.12.0, --bf16 forces fp32 gradient buffers: 2-byte gradients cannot be run there
    assert [p.split(" (")[0] for p in release_problems(model_preset("gpt3-175b"), bf16, (0, 9, 0))] == [
        "megatron-core 0.9.0 has no --grad-reduce-in-bf16"
    ]
    assert release_problems(model_preset("gpt3-175b"), fp32_grads, (0, 9, 0)) == []
    # Llama 3.1's RoPE scaling from 0.10.0; the expert grid (expert TP, expert width) from 0.10.0; MTP from 0.12.0
    assert "--use-rope-scaling" in " ".join(release_problems(model_preset("llama3.1-8b"), fp32_grads, (0, 9, 0)))
    moe = " ".join(release_problems(model_preset("qwen3-30b-a3b"), fp32_grads, (0, 9, 0)))
    assert "--expert-tensor-parallel-size" in moe and "--moe-ffn-hidden-size" in moe
    assert "--mtp-num-layers (from 0.12.0)" in " ".join(release_problems(model_preset("deepseek-v3"), bf16, (0, 11, 0)))


SPACE_CASES = (("llama3.1-405b", 8192, 512, 128), ("llama3.1-8b", 8192, 64, 64), ("gpt3-175b", 2048, 256, 128),
               ("qwen2.5-72b", 4096, 64, 64), ("deepseek-v3", 4096, 256, 128), ("mixtral-8x7b", 4096, 64, 64),
               ("qwen3-30b-a3b", 4096, 32, 64))  # fmt: skip


@pytest.mark.parametrize("release", [(0, 8, 0), (0, 9, 0), (0, 10, 0), (0, 11, 0), (0, 12, 0), (0, 13, 0),
                                     (0, 14, 0)])  # fmt: skip
def test_what_the_space_offers_for_a_release_the_emitter_emits_for_it(release):
    """Kept to a release, the space is a subset of the full one, and every layout in it is emitted for that release
    (torch FSDP2 where Megatron FSDP is younger) without a refused rule or a missing flag."""
    rng = random.Random(1)
    checked = 0
    for name, seq, gpus, batch in SPACE_CASES:
        model = model_preset(name)
        job = JobSpec(seq_len=seq, global_batch=batch, grad_bytes_per_param=4 if release < (0, 12, 0) else 2)
        if release_problems(model, job, release):
            continue
        options = SpaceOptions(max_micro_batch=2, max_vp=4, megatron_core=release)
        kept = list(enumerate_layouts(model, job, gpus, 8, options))
        full = set(enumerate_layouts(model, job, gpus, 8, SpaceOptions(max_micro_batch=2, max_vp=4)))
        assert kept and set(kept) <= full
        if release < (0, 10, 0):
            assert all(lay.sharding not in (Sharding.fsdp, Sharding.zero2) for lay in kept)
        if release < (0, 9, 0):
            assert all(lay.first_stage_layers is None for lay in kept)
        for layout in rng.sample(kept, min(40, len(kept))):
            impl = megatron_fsdp_impl("megatron", release)
            megatron_args(model, job, layout, fsdp_impl=impl, megatron_core=release)  # raises on a problem
            checked += 1
    assert checked >= 80  # at 0.8.0 GPT-3 and Qwen2.5 alone (no RoPE scaling, no experts)


def test_a_layout_the_release_lacks_is_left_out_and_refused_by_name():
    model, job = model_preset("llama3.1-405b"), JobSpec(seq_len=8192, global_batch=20, grad_bytes_per_param=4)
    # 126 layers on 5 stages are 24, 26, 26, 26, 24: with vp 2, virtual stages per rank (0.11.0) name the split
    layout = parse_layout("tp=1,pp=5,vp=2,cp=2,dp=4,mb=1,ga=5,sharding=zero1,recompute=full,first=24,last=24")
    kept = {lay.short() for lay in enumerate_layouts(model, job, 40, 8, SpaceOptions(megatron_core=(0, 10, 0)))}
    later = {lay.short() for lay in enumerate_layouts(model, job, 40, 8, SpaceOptions(megatron_core=(0, 11, 0)))}
    assert layout.short() not in kept and layout.short() in later
    with pytest.raises(OptlayoutError, match=r"has no --num-virtual-stages-per-pipeline-rank \(from 0.11.0\)"):
        megatron_args(model, job, layout, megatron_core=(0, 10, 0))
    assert "--num-virtual-stages-per-pipeline-rank" in megatron_args(model, job, layout, megatron_core=(0, 11, 0))
    # MTP with context parallelism, before 0.14.0 (arguments.py @core_v0.13.0 L1075)
    dsv3 = model_preset("deepseek-v3")
    mtp_cp = parse_layout("tp=2,pp=8,cp=2,dp=16,ep=16,mb=1,ga=16,sharding=zero1,recompute=full,sp,first=7,last=5")
    with pytest.raises(OptlayoutError, match="Multi-Token Prediction"):
        megatron_args(dsv3, JobSpec(seq_len=4096, global_batch=256), mtp_cp, megatron_core=(0, 13, 0))


def test_torch_fsdp2_refuses_expert_parallelism():
    # arguments.py @core_v0.10.0 to @core_v0.16.0: '--use-torch-fsdp2 is not supported with expert parallelism'
    layout = parse_layout("tp=1,pp=1,dp=8,ep=8,mb=1,ga=8,sharding=fsdp")
    with pytest.raises(OptlayoutError, match=r"not supported with expert parallelism \(.*\) broken: ep=8"):
        megatron_args(model_preset("qwen3-30b-a3b"), JobSpec(seq_len=4096, global_batch=64), layout,
                      fsdp_impl="torch")  # fmt: skip


def test_rope_factor_8_is_dropped_for_the_release_that_fixed_it():
    # @core_v0.10.0 rotary_pos_embedding.py applies Llama 3.1's scaling with factor 8; --rope-scaling-factor is 0.11.0's
    model, job = model_preset("llama3.1-8b"), JobSpec(seq_len=8192, global_batch=64, grad_bytes_per_param=4)
    layout = parse_layout("tp=1,pp=1,dp=8,mb=1,ga=8,sharding=zero1")
    old = megatron_args(model, job, layout, megatron_core=(0, 10, 0))
    assert "--use-rope-scaling" in old and "--rope-scaling-factor" not in old
    assert megatron_args(model, job, layout, megatron_core=(0, 11, 0)) == megatron_args(model, job, layout)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([(0, 8, 0), (0, 9, 0), (0, 10, 0), (0, 12, 0), (0, 13, 0)]))
def test_solver_equals_oracle_in_a_release_space(problem, release) -> None:
    model, cluster, job, k = problem
    job = job.model_copy(update={"grad_bytes_per_param": 4})
    topo = topology_from_cluster(cluster)
    options = SpaceOptions(max_micro_batch=4, max_vp=4, max_cp=8, megatron_core=release)
    plan = solve(model, topo, job, top=k, params=NO_RESERVE, max_micro_batch=4, max_vp=4, max_cp=8,
                 megatron_core=release)  # fmt: skip
    table = CostTable(model, job, topo.gpu, topo, NO_RESERVE)
    limits = Limits(usable_memory_bytes(topo.gpu.memory_bytes, job), job.min_global_batch, job.max_global_batch)
    truth = oracle_ranking(model, job, topo.num_gpus, topo.domain_size, table, options, limits)
    assert [p.layout for p in plan.layouts] == [c.layout for c in truth[:k]]


def test_solve_keeps_the_release_through_the_plan(tmp_path, cli):
    saved = tmp_path / "plan.json"
    out = cli("solve", "--model", "llama3-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "512", "--grad-bytes", "4", "--megatron-core", "nemo:24.09", "--top", "3",
              "--save", str(saved), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["megatron_core"] == "0.9.0"
    assert all(row["layout"]["sharding"] in ("none", "zero1") for row in payload["layouts"])
    emitted = cli("emit", "--format", "megatron", "--plan", str(saved))
    assert emitted.returncode == 0, emitted.stderr
    assert "megatron-core 0.9.0 (flags checked against its arguments.py)" in emitted.stderr
    replanned = cli("solve", "--from-plan", str(saved), "--gpus", "32", "--json")
    assert replanned.returncode == 0, replanned.stderr
    assert json.loads(replanned.stdout)["megatron_core"] == "0.9.0"


def test_cli_refuses_what_the_release_lacks_in_one_line(cli):
    out = cli("solve", "--model", "qwen3-30b-a3b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "512", "--megatron-core", "0.9")  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "megatron-core 0.9.0 has no --expert-tensor-parallel-size (from 0.10.0)" in out.stderr
    bad = cli("solve", "--model", "llama3-8b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
              "--global-batch", "512", "--megatron-core", "newest")  # fmt: skip
    assert bad.returncode == 2 and "megatron-core: 'newest' is not a release" in bad.stderr
    layout = "tp=1,pp=1,dp=8,mb=1,ga=8,sharding=fsdp"
    emitted = cli("emit", "--format", "megatron", "--model", "llama3.1-8b", "--seq-len", "2048", "--layout", layout,
                  "--grad-bytes", "4", "--megatron-core", "0.9.0")  # fmt: skip
    assert emitted.returncode == 2 and "has no --use-torch-fsdp2 (from 0.10.0)" in emitted.stderr


def test_emit_for_a_release_before_megatron_fsdp_writes_torch_fsdp2():
    model, job = model_preset("llama3.1-8b"), JobSpec(seq_len=8192, global_batch=64, grad_bytes_per_param=4)
    layout = parse_layout("tp=1,pp=1,dp=8,mb=1,ga=8,sharding=fsdp")
    text = emit("megatron", model, job, layout, megatron_core=(0, 10, 0))
    assert "--use-torch-fsdp2" in text and "--use-megatron-fsdp" not in text
    assert "--use-megatron-fsdp" in emit("megatron", model, job, layout)


def test_the_release_diagnosis_says_what_it_left_out():
    # 405B's 16 B/param of state over 64 H100 needs more than tp 8 x pp 8 can shard
    plan = solve("llama3.1-405b", ClusterSpec(gpu="h100-sxm", gpus=64), JobSpec(seq_len=8192, global_batch=64,
                 grad_bytes_per_param=4), megatron_core=(0, 10, 0))  # fmt: skip
    assert plan.status == "infeasible"
    assert "with what Megatron-Core 0.10.0 runs: no ZeRO-2 (from 0.13.0), no uneven stages with virtual stages " \
        "(from 0.11.0)" in plan.diagnosis


def test_nemo_records_name_their_containers_megatron_core():
    from optlayout.runs.records import read_runs

    fixtures = Path(__file__).parent / "fixtures" / "runs"
    by_id = {r.id: r for name in ("runs.jsonl", "gpt3_175b_nemo_vs_paxml.jsonl") for r in read_runs(fixtures / name)}
    nemo = ("dgxc-", "nemo24")  # runs.jsonl predates the records' `framework` field: NeMo's as ../shared/data gives it
    by_id = {k: r.model_copy(update={"framework": "nemo"}) if r.framework is None and k.startswith(nemo)
             and "paxml" not in k else r for k, r in by_id.items()}  # fmt: skip
    # dgxc-benchmarking v24.11.1: llama3.1/ and nemotron/setup.sh pull nemo:24.09 (0.9.0), nemo_megatron/ (GPT-3)
    # nemo:24.05 (0.7.0); v25.02 nemo:24.12 (at most 0.10.0); the NeMo 24.07 table 0.8, 24.03 at most 24.05's 0.7.0
    assert by_id["dgxc-v24.11.1-llama318b-bf16-8g-35a9aec"].megatron_core() == (0, 9, 0)
    assert by_id["dgxc-v24.11.1-nemotron415b-bf16-16g-35a9aec"].megatron_core() == (0, 9, 0)
    assert by_id["dgxc-v24.11.1-gpt3175bnemomegatron-fp8-128g-35a9aec"].megatron_core() == (0, 7, 0)
    assert by_id["dgxc-v25.02-llama318b-bf16-8g-8f5cbb3"].megatron_core() == (0, 10, 0)
    assert by_id["nemo2407-llama27b-8g"].megatron_core() == (0, 8, 0)
    assert by_id["nemo2403-longseq-llama2-7b-4k"].megatron_core() == (0, 7, 0)
    assert by_id["dgxc-v24.11.1-gpt3175bpaxml-fp8-128g-35a9aec"].megatron_core() is None  # JAX
    assert by_id["mosaic-h100-bf16-mpt7b-s8192-8g-b128"].megatron_core() is None


def test_compare_ranks_a_nemo_run_in_its_releases_space():
    """`compare` ranks a NeMo run among the layouts its container's Megatron-Core runs (0.9.0 here: no FSDP, no
    ZeRO-2), as `solve --megatron-core` would offer them, and says so; the count is the exhaustive ranking's there,
    which is smaller than the current release's."""
    from optlayout.runs.compare import GroupRanking, compare_runs
    from optlayout.runs.predict import run_job
    from optlayout.runs.records import read_runs
    from optlayout.solver.oracle import rank_problem
    from optlayout.solver.problem import Problem
    from optlayout.topology import topology_from_cluster

    fixtures = Path(__file__).parent / "fixtures" / "runs"
    record = next(r for r in read_runs(fixtures / "runs.jsonl") if r.id == "dgxc-v24.11.1-llama318b-bf16-8g-35a9aec")
    record = record.model_copy(update={"framework": "nemo"})
    row = compare_runs([record], lambda gpu, precision: DEFAULT_PARAMS, workers=1)["runs"][0]
    assert row["ranked_in_megatron_core"] == "0.9.0"
    topo = topology_from_cluster(record.cluster)

    def ranking(options: SpaceOptions) -> GroupRanking:
        return GroupRanking.of(rank_problem(Problem(record.model, run_job(record), topo, DEFAULT_PARAMS, options)))

    release, current = ranking(SpaceOptions(megatron_core=(0, 9, 0))), ranking(SpaceOptions())
    assert row["legal_layouts"] == release.count < current.count
    assert release.best is not None and row["solver_pick"] == release.best[0].model_dump(mode="json")
    assert row["solver_pick"]["sharding"] not in ("fsdp", "zero2")
    plain = compare_runs([record.model_copy(update={"framework": None})], lambda gpu, precision: DEFAULT_PARAMS,
                         workers=1)["runs"][0]  # fmt: skip
    assert plain["ranked_in_megatron_core"] is None and plain["legal_layouts"] == current.count
