"""The training state as it ran: the optimizer-state dtypes (master weights, Adam's moments) and FP8 primary weights
(`JobSpec.main_params_dtype`, `exp_avg_dtype`, `exp_avg_sq_dtype`, `fp8_param_gather`), filled for NVIDIA's records
from their recipes (`runs.records`), counted by the memory model, moved by the DP all-gather, emitted as launcher
flags. Figures by hand; the records are the fixture's (copied from ../shared/data/calibration_runs.jsonl)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlayout.cost import DEFAULT_PARAMS, group_links
from optlayout.cost.memory import memory_per_gpu, state_bytes_per_gpu
from optlayout.cost.step import _dp_traffic
from optlayout.emit.deepspeed import deepspeed_config
from optlayout.emit.megatron import megatron_args, megatron_notes
from optlayout.emit.megatron_bridge import bridge_overrides
from optlayout.errors import UnsupportedError
from optlayout.layout.text import parse_layout
from optlayout.presets import model_preset
from optlayout.runs.predict import assumed_fields, predict_run
from optlayout.runs.records import RunRecord, read_runs
from optlayout.specs import JobSpec, Sharding
from optlayout.topology import parse_cluster_shorthand, topology_from_cluster

FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "nvidia_recipes.jsonl"
NEMOTRON_340B_128 = "dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec"
GIB = 2**30


@pytest.fixture(scope="module")
def records() -> dict[str, RunRecord]:
    return {r.id: r for r in read_runs(FIXTURE)}


def test_the_optimizer_bytes_are_the_state_dtypes_unless_given() -> None:
    assert JobSpec(seq_len=8).optimizer_bytes_per_param == 4 + 4 + 4
    bf16 = JobSpec(seq_len=8, main_params_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert bf16.optimizer_bytes_per_param == 2 + 2 + 2
    assert bf16.reduced_optimizer_state == {name: "bf16" for name in ("main_params_dtype", "exp_avg_dtype",
                                                                      "exp_avg_sq_dtype")}  # fmt: skip
    assert JobSpec(seq_len=8, exp_avg_dtype="fp8", exp_avg_sq_dtype="fp16").optimizer_bytes_per_param == 4 + 1 + 2
    assert JobSpec(seq_len=8, optimizer="muon", main_params_dtype="fp16").optimizer_bytes_per_param == 2 + 4
    assert JobSpec(seq_len=8, optimizer_bytes_per_param=7).optimizer_bytes_per_param == 7  # fp32 dtypes: bytes win
    assert not JobSpec(seq_len=8, optimizer_bytes_per_param=7).optimizer_bytes_match_dtypes


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"exp_avg_dtype": "bf16", "optimizer_bytes_per_param": 12}, r"contradicts the state dtypes \(10 bytes\)"),
        ({"optimizer": "muon", "exp_avg_sq_dtype": "bf16"}, "muon keeps no second moment"),
        ({"main_params_dtype": "fp8"}, "main_params_dtype"),
        ({"fp8_param_gather": True}, "fp8_param_gather needs precision fp8"),
    ],
)
def test_a_contradictory_state_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobSpec(seq_len=8, **fields)  # type: ignore[arg-type]


def test_nemotron_340b_keeps_its_recipes_bf16_state_and_fits(records) -> None:
    record = records[NEMOTRON_340B_128]
    dtypes, why = record.optimizer_state()
    assert dtypes == {"main_params_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert why is not None and "nemotron4-340b-synth.yaml" in why and "183-186" in why
    job = record.job_spec()
    assert job.optimizer_bytes_per_param == 6
    run = predict_run(record)
    assert (run.layout.tp, run.layout.pp, run.layout.vp, run.layout.dp) == (8, 8, 12, 2)
    # by hand: stage 0 holds 96 / (8 x 12) = 1 layer per chunk x 12 chunks and the embedding, TP 8. One layer:
    # Q and output 2 h^2, K and V 2 h (8 x 192), ReLU^2 MLP 2 h f; two norms' weights 2 h (a bias-free model)
    h, f, vocab = 18432, 73728, 256000
    layer = 2 * h * h + 2 * h * 8 * 192 + 2 * h * f + 2 * h
    on_gpu = (12 * layer + vocab * h) / 8
    mem = memory_per_gpu(record.model, job, run.layout, DEFAULT_PARAMS)
    assert mem.stage == 0
    assert mem.param_count_on_gpu == pytest.approx(on_gpu, rel=1e-9)
    assert mem.optimizer_bytes == pytest.approx(on_gpu * 6 / 2, rel=1e-9)  # bf16 x 3, ZeRO-1 over DP 2
    assert mem.weights_bytes == pytest.approx(on_gpu * 2, rel=1e-9)
    assert mem.gradients_bytes == pytest.approx(on_gpu * 2, rel=1e-9)  # grad_sync_dtype bf16: 2-byte buffers
    assert not run.memory_model_miss
    assert assumed_fields(record)["exp_avg_sq_dtype"]["value"] == "bf16"
    # the same run with fp32 state (12 bytes) is a memory-model miss: 17.3 GB more on a GPU of 80 GiB
    state = {"main_params_dtype": "fp32", "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"}
    fp32 = record.model_copy(update={"job": record.job.model_copy(update=state)})
    assert fp32.optimizer_state() == (state, None)  # stated: the record's own
    assert fp32.job_spec().optimizer_bytes_per_param == 12
    assert predict_run(fp32).memory_model_miss
    # one dtype stated: the recipe's fill the other two, and say so
    part = record.model_copy(update={"job": record.job.model_copy(update={"main_params_dtype": "fp32"})})
    dtypes, why = part.optimizer_state()
    assert dtypes == {"main_params_dtype": "fp32", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert why is not None and "exp_avg_dtype, exp_avg_sq_dtype" in why
    assert part.job_spec().optimizer_bytes_per_param == 4 + 2 + 2


def test_fp8_primary_weights_come_from_the_framework_and_release(records) -> None:
    for rid in ("mb-26.04-pretrain-gb300-llama370b-mxfp8-64g-main", "mb-25.09-pretrain-h100-llama38b-fp8-8g-main"):
        on, why = records[rid].fp8_param_gather()
        assert on and why is not None and "mixed_precision.py" in why
    on, why = records["mb-25.09-pretrain-gb200-llama370b-fp8blockwisemx-64g-alt"].fp8_param_gather()
    assert not on and why is not None and "off" in why  # Bridge's subchannel (blockwise) configs do not set it
    on, why = records["dgxc-v25.02-llama3170b-fp8-64g-8f5cbb3"].fp8_param_gather()
    assert on and why is not None and "fp8_params" in why
    on, why = records["nemo2407-llama370b-64g"].fp8_param_gather()  # no NeMo 24.07 recipe known to keep them
    assert not on and why is not None and "off" in why
    assert records[NEMOTRON_340B_128].fp8_param_gather() == (False, None)  # bf16: nothing to assume
    stated = records["dgxc-v25.02-llama3170b-fp8-64g-8f5cbb3"]
    stated = stated.model_copy(update={"job": stated.job.model_copy(update={"fp8_param_gather": False})})
    assert stated.fp8_param_gather() == (False, None) and not stated.job_spec().fp8_param_gather


def test_the_dp_all_gather_moves_fp8_weights_in_one_byte_and_mxfp8_in_two() -> None:
    fp8 = {"seq_len": 4096, "global_batch": 64, "precision": "fp8"}
    tensorwise = JobSpec(**fp8, fp8_recipe="tensorwise", fp8_param_gather=True)  # type: ignore[arg-type]
    mxfp8 = JobSpec(**fp8, fp8_recipe="mxfp8", fp8_param_gather=True)  # type: ignore[arg-type]
    assert (tensorwise.param_gather_bytes_per_param, mxfp8.param_gather_bytes_per_param) == (1.0, 2.0)
    assert JobSpec(**fp8).param_gather_bytes_per_param == 2.0  # type: ignore[arg-type]
    layout = parse_layout("tp=8,dp=8,sharding=zero1,ga=1")
    links = group_links(topology_from_cluster(parse_cluster_shorthand("gpu=h100-sxm,gpus=64")), layout)

    def traffic(job: JobSpec) -> tuple[float, float]:
        return _dp_traffic(job, layout, links, DEFAULT_PARAMS, 1e9, 0.0, 32)

    one_byte = JobSpec(**fp8, weight_bytes_per_param=1.0)  # type: ignore[arg-type]
    assert traffic(tensorwise) == traffic(one_byte)  # the reduce-scatter unchanged, the all-gather at 1 byte
    assert traffic(mxfp8) == traffic(JobSpec(**fp8))  # type: ignore[arg-type]
    assert traffic(tensorwise)[1] < traffic(mxfp8)[1]


LLAMA70B = model_preset("llama3.1-70b")
ZERO1 = parse_layout("tp=4,pp=2,dp=2,sharding=zero1,ga=32")


def test_megatron_writes_the_state_as_planned() -> None:
    job = JobSpec(seq_len=8192, global_batch=64, precision="fp8", fp8_recipe="mxfp8", fp8_param_gather=True,
                  exp_avg_dtype="bf16", exp_avg_sq_dtype="fp8")  # fmt: skip
    args = megatron_args(LLAMA70B, job, ZERO1)
    assert args[args.index("--fp8-param-gather") + 1] == "--reuse-grad-buf-for-mxfp8-param-ag"
    tail = args[args.index("--use-precision-aware-optimizer") :]
    assert tail == ["--use-precision-aware-optimizer", "--main-params-dtype", "fp32", "--exp-avg-dtype", "bf16",
                    "--exp-avg-sq-dtype", "fp8"]  # fmt: skip
    assert "store_param_remainders" in megatron_notes(LLAMA70B, job, ZERO1)[-1]
    plain = megatron_args(LLAMA70B, JobSpec(seq_len=8192, global_batch=64, precision="fp8"), ZERO1)
    assert "--fp8-param-gather" not in plain and "--use-precision-aware-optimizer" not in plain


@pytest.mark.parametrize(
    ("fields", "layout", "message"),
    [
        ({"main_params_dtype": "bf16"}, ZERO1, "--main-params-dtype takes fp32 or fp16"),
        ({"optimizer": "muon", "exp_avg_dtype": "bf16"}, ZERO1, "Adam's only"),
        ({"optimizer": "muon"}, ZERO1, "optimizer muon: the emitted configs are Adam's only"),
        ({"precision": "fp8", "fp8_param_gather": True}, parse_layout("tp=4,pp=2,dp=2,ga=32"), "sharding none"),
        ({"exp_avg_dtype": "bf16"}, parse_layout("tp=4,pp=2,dp=2,ga=32"), "precision-aware-optimizer needs the "
         "distributed optimizer"),
    ],
)
def test_megatron_refuses_a_state_it_cannot_keep(fields: dict[str, object], layout, message: str) -> None:
    job = JobSpec(seq_len=8192, global_batch=64, **fields)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match=message):
        megatron_args(LLAMA70B, job, layout)


def test_other_launchers_refuse_a_reduced_state_and_bridge_writes_fp8_weights() -> None:
    reduced = JobSpec(seq_len=8192, global_batch=64, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    with pytest.raises(UnsupportedError, match="exp_avg_dtype bf16, exp_avg_sq_dtype bf16"):
        deepspeed_config(LLAMA70B, reduced, parse_layout("dp=8,sharding=zero1,ga=8"))
    with pytest.raises(UnsupportedError, match="use-precision-aware-optimizer"):
        bridge_overrides(LLAMA70B, reduced, ZERO1)
    mx = JobSpec(seq_len=8192, global_batch=64, precision="fp8", fp8_recipe="mxfp8", fp8_param_gather=True)
    out = bridge_overrides(LLAMA70B, mx, ZERO1)
    wanted = {"mixed_precision.fp8_param_gather=true", "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=true"}
    assert wanted <= set(out)


def test_state_bytes_shard_as_the_sharding_says() -> None:
    bf16 = JobSpec(seq_len=8, main_params_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert state_bytes_per_gpu(1e9, bf16, Sharding.zero1, 4) == (2e9, 2e9, 6e9 / 4)
    assert state_bytes_per_gpu(1e9, bf16, Sharding.none, 4) == (2e9, 2e9, 6e9)


def test_runs_differing_in_fp8_recipe_or_state_are_ranked_apart(records) -> None:
    """The job as predicted keys a ranking group: a GB300 70B MXFP8 run and the same run in per-tensor FP8 (FP8
    weight gathers of 2 and 1 bytes) are not ranked in one space, nor one with bf16 moments."""
    mx = records["mb-26.04-pretrain-gb300-llama370b-mxfp8-64g-main"]
    cs = mx.model_copy(update={"job": mx.job.model_copy(update={"fp8_recipe": "tensorwise"})})
    assert cs.group_key[:5] == mx.group_key[:5] and cs.group_key != mx.group_key
    bf16_state = cs.model_copy(update={"job": cs.job.model_copy(update={"exp_avg_dtype": "bf16"})})
    assert bf16_state.group_key != cs.group_key
