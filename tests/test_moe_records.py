"""MoE run records (`model.moe`, `model.attention`, `layout.ep`, `job.moe_routing`) read into the specs and priced;
the launchers refuse an MoE shape in one line (their MoE flags are not written yet)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optlayout.cost import DEFAULT_PARAMS, evaluate
from optlayout.emit import emit
from optlayout.errors import OptlayoutError, UnsupportedError
from optlayout.layout import check_layout
from optlayout.presets import gpu_preset, model_preset
from optlayout.runs.records import read_runs
from optlayout.specs import ClusterSpec, JobSpec, Layout, ModelSpec
from optlayout.topology import topology_from_cluster
from tests.test_runs import _one_line_error

RUNS = Path(__file__).parent / "fixtures" / "runs"
MOE_RUNS = RUNS / "moe_runs.jsonl"  # six records copied from ../shared/data/calibration_runs_moe.jsonl


def test_moe_records_read_into_the_specs() -> None:
    records = {r.id: r for r in read_runs(MOE_RUNS)}
    assert len(records) == 6
    grok = records["dgxc-v24.11.1-grok1314b-bf16-512g-35a9aec"]
    assert grok.model.moe.experts == 8 and grok.model.moe.top_k == 2 and grok.model.tied_embeddings
    assert (grok.layout.tp, grok.layout.ep, grok.layout.etp) == (4, 8, 4)  # NeMo's expert TP defaults to TP
    assert grok.job_spec().moe_routing is None  # dgxc does not say: real routing
    proxy = records["dgxc-v24.11.1-grok1314b-fp8-8g-35a9aec"]
    assert proxy.model.layers == 2 and proxy.model.moe_layer_count == 2  # the shortened proxy of the source
    gpt = records["mb-26.08-pretrain-gb200-gptoss120b-mxfp8-64g-main"]
    norm_biases = (2 * 36 + 1) * 2880  # the record states no norm: with biases it is a LayerNorm (the preset RMSNorm)
    assert gpt.model.norm_kind == "layernorm" and model_preset("gpt-oss-120b").norm_kind == "rmsnorm"
    assert gpt.model.param_count == model_preset("gpt-oss-120b").param_count + norm_biases
    assert gpt.model.attention.sinks and sum(gpt.model.sliding_window_flags) == 18 and gpt.model.bias
    job = gpt.job_spec()
    assert (job.moe_routing, job.optimizer, job.precision, job.seq_len) == ("balanced", "adam", "fp8", 4096)
    qwen = records["mb-26.02.01-pretrain-h100-qwen330ba3b-fp8-16g-main"]
    preset = model_preset("qwen3-30b-a3b")
    norms = preset.layers * 2 * preset.head_size  # the record format states no q/k norms: none are guessed in
    assert not qwen.model.attention.qk_norm and qwen.model.active_param_count == preset.active_param_count - norms
    assert (qwen.layout.pp, qwen.layout.vp, qwen.layout.ep) == (2, 12, 8)


def test_expert_degrees_are_layout_fields_of_moe_records_only() -> None:
    records = read_runs(MOE_RUNS)
    gpt = next(r for r in records if r.id.startswith("mb-26.08"))
    assert gpt.layout.known()["ep"] == 64 and gpt.layout.known()["etp"] == 1
    assert gpt.unknown_layout_fields() == ["vp", "sharding", "recompute", "recompute_layers", "sequence_parallel"]
    unstated = gpt.model_copy(update={"layout": gpt.layout.model_copy(update={"etp": None})})
    assert unstated.unknown_layout_fields() == ["vp", "etp", "sharding", "recompute", "recompute_layers",
                                                "sequence_parallel"]  # fmt: skip
    dense = read_runs(RUNS / "runs.jsonl")[0]  # a dense record states no expert degrees: they are 1, not unknown
    assert dense.layout.ep is None and not {"ep", "etp"} & set(dense.unknown_layout_fields())


def test_all_megatron_bridge_moe_records_load() -> None:
    records = read_runs(RUNS / "megatron_bridge_moe.jsonl")
    assert len(records) == 57 and all(r.job_spec().moe_routing == "balanced" for r in records)


def test_record_optimizer_muon(tmp_path) -> None:
    raw = json.loads(MOE_RUNS.read_text().splitlines()[0])
    raw["job"]["optimizer"] = "muon"
    path = tmp_path / "muon.jsonl"
    path.write_text(json.dumps(raw) + "\n")
    assert read_runs(path)[0].job_spec().optimizer_bytes_per_param == 8.0


def test_record_states_ep_overlap(tmp_path) -> None:
    # GPT-OSS 120B on 64 GB300 at ep 16, no pipeline: Megatron allows the overlap there, and the record's flag
    # reaches the job; unstated, it is off and said so
    from optlayout.runs.predict import assumed_fields, predict_run

    raw = json.loads((RUNS / "megatron_bridge_moe.jsonl").read_text().splitlines()[0])
    assert "moe_ep_overlap" not in raw["job"]
    path = tmp_path / "overlap.jsonl"
    stated = raw | {"id": "on", "job": raw["job"] | {"moe_ep_overlap": True}}
    path.write_text(json.dumps(raw) + "\n" + json.dumps(stated) + "\n")
    off, on = read_runs(path)
    assert (off.job_spec().moe_ep_overlap, on.job_spec().moe_ep_overlap) == (False, True)
    assert "moe_ep_overlap" in assumed_fields(off) and "moe_ep_overlap" not in assumed_fields(on)
    assert off.group_key != on.group_key  # never ranked in one space built from the other's job
    fast, slow = (predict_run(r).prediction.tokens_per_s_per_gpu for r in (on, off))
    assert fast > slow


def test_a_bad_moe_record_names_the_field(tmp_path) -> None:
    raw = json.loads(MOE_RUNS.read_text().splitlines()[0])
    raw["model"]["moe"]["top_k"] = 9
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(raw) + "\n")
    with pytest.raises(OptlayoutError, match=r"bad.jsonl line 1: model.moe: top_k \(9\) exceeds experts \(8\)"):
        read_runs(path)


# --- the cost model prices MoE; the launchers still refuse it ---------------------------------------------


def test_compare_reads_moe_records(cli) -> None:
    proc = cli("compare", str(MOE_RUNS), "--no-rank", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {row["id"]: row for row in json.loads(proc.stdout)["runs"]}
    assert len(rows) == 6 and all(row["predicted_tokens_per_s_per_gpu"] > 0 for row in rows.values())
    grok = rows["dgxc-v24.11.1-grok1314b-bf16-512g-35a9aec"]
    assert (grok["layout"]["ep"], grok["layout"]["etp"]) == (8, 4)  # published degrees kept


def test_solve_and_estimate_price_moe_and_emit_refuses_sliding_windows_in_one_line(cli) -> None:
    solve = cli("solve", "--model", "qwen3-30b-a3b", "--cluster", "gpu=h100-sxm,gpus=16", "--seq-len", "4096",
                "--global-batch", "1024", "--json")  # fmt: skip
    assert solve.returncode == 0, solve.stderr
    best = json.loads(solve.stdout)["layouts"][0]["layout"]
    assert best["ep"] > 1 and 128 % best["ep"] == 0
    estimate = cli("estimate", "--model", "deepseek-v3", "--cluster", "gpu=h100-sxm,gpus=256", "--layout",
                   "tp=1,pp=16,dp=16,ep=16,ga=16", "--seq-len", "4096", "--global-batch", "256", "--json")  # fmt: skip
    assert estimate.returncode == 0, estimate.stderr
    assert json.loads(estimate.stdout)["prediction"]["time"]["ep_comm_s"] > 0
    emitted = cli("emit", "-f", "megatron", "--model", "gpt-oss-120b", "--layout", "tp=1,dp=8,ep=8", "--seq-len",
                  "4096")  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    assert "--window-size 127,0" in emitted.stdout and "--softmax-type learnable" in emitted.stdout
    refused = cli("emit", "-f", "deepspeed", "--model", "gpt-oss-120b", "--layout", "tp=1,dp=8", "--seq-len", "4096")
    _one_line_error(refused, "emit deepspeed: GPT-OSS 120B", "sliding-window attention (window 128 < sequence 4096)")


def test_the_library_prices_and_the_launchers_refuse() -> None:
    model, job = model_preset("mixtral-8x7b"), JobSpec(seq_len=4096, global_batch=64)
    layout = Layout(tp=8, dp=8, ep=8, grad_accum=8, sequence_parallel=True)
    topology = topology_from_cluster(ClusterSpec(gpu="h100-sxm", gpus=64))
    check_layout(model, job, layout, 64)
    assert evaluate(model, job, layout, gpu_preset("h100-sxm"), topology, DEFAULT_PARAMS).tokens_per_s_per_gpu > 0
    with pytest.raises(UnsupportedError, match="Mixtral 8x7B: not yet supported: expert parallelism"):
        emit("accelerate", model, job, layout)
    with pytest.raises(UnsupportedError, match="Mixtral 8x7B is none of the Qwen3 MoE models"):
        emit("torchtitan", model, job, layout)  # torchtitan builds only the MoE models it registers


def test_a_window_longer_than_the_sequence_is_plain_causal_attention() -> None:
    model = ModelSpec(**(model_preset("llama3-8b").model_dump() | {"attention": {"sliding_window": 4096}}))
    assert model.beyond_dense(4096) == []
    assert model.beyond_dense(8192) == ["sliding-window attention (window 4096 < sequence 8192)"]
    check_layout(model, JobSpec(seq_len=4096, global_batch=8), Layout(tp=8, grad_accum=8), 8)  # costed as before


def test_calibrate_fits_moe_constants_on_moe_runs_only_and_keeps_the_dense_ones(tmp_path) -> None:
    from optlayout.runs.calibrate import (
        MOE_FITTED,
        calibrate,
        calibrate_moe,
        load_calibration,
        shipped_calibration_path,
    )

    records = read_runs(MOE_RUNS)
    shipped = load_calibration(shipped_calibration_path())
    fitted = calibrate(records, fitted_on="moe fixture")
    assert fitted.default == shipped.default and fitted.entries == shipped.entries  # the dense constants stay
    report = fitted.report["moe"]
    assert set(report["cross_validated_by_model"]["per_model"]) == {"Grok-1 314B", "GPT-OSS 120B", "Qwen3-30B-A3B"}
    # the fitted MoE constants are kept only if they predict the held-out models better than the sourced ones
    better = report["cross_validated_by_model"]["mape"] < report["uncalibrated"]["mape"]
    assert report["kept"] == ("fitted" if better else "sourced")
    assert set(fitted.moe) == (set(MOE_FITTED) if better else set())
    values, _, _ = calibrate_moe(records, shipped, lambda _m: None)
    assert set(values) == set(MOE_FITTED) and all(MOE_FITTED[k][0] <= v <= MOE_FITTED[k][1] for k, v in values.items())
    forced = fitted.model_copy(update={"moe": values})
    forced.save(tmp_path / "cal.yaml")
    params = load_calibration(tmp_path / "cal.yaml").params_for("h100-sxm", "bf16")
    assert params.all_to_all_efficiency == values["all_to_all_efficiency"]
    assert params.gemm_efficiency == shipped.params_for("h100-sxm", "bf16").gemm_efficiency


def test_moe_runs_give_moe_predictions_their_own_interval() -> None:
    """The MoE runs' held-out log errors (under the kept constants, the run's model held out) become the `moe`
    regime of the calibration's uncertainty, next to the dense runs' distributions, which stay the shipped ones."""
    from optlayout.runs.calibrate import calibrate, load_calibration, shipped_calibration_path
    from optlayout.runs.uncertainty import bounds, quantiles

    records = read_runs(MOE_RUNS)
    shipped = load_calibration(shipped_calibration_path()).uncertainty
    fitted = calibrate(records, fitted_on="moe fixture")
    u, report = fitted.uncertainty, fitted.report["moe"]
    assert u is not None and shipped is not None
    assert u.overall == shipped.overall and u.support == shipped.support  # MoE rows join no dense distribution
    rows = [row for row in fitted._heldout if row.model is not None]
    assert sorted(row.id for row in rows) == sorted(r.id for r in records)
    # a row's error, in log form, is its error under the kept constants: the sourced ones (uncalibrated), or the
    # ones fitted on the other models (cross-validated); this fixture keeps the fitted ones
    assert report["kept"] == "fitted"
    mape = sum(abs(math.expm1(row.log_error)) for row in rows) / len(rows)
    assert mape == pytest.approx(report["cross_validated_by_model"]["mape"], abs=1e-5)
    assert mape != pytest.approx(report["uncalibrated"]["mape"], abs=1e-3)
    assert u.regime_runs["moe"] == len(records) and u.regimes["moe"] == quantiles([row.log_error for row in rows])
    gptoss = next(row for row in rows if row.model == "GPT-OSS 120B")
    b = bounds(u, gptoss.regimes)
    assert not any(s.startswith("moe") for s in b.unsupported)  # no longer "moe (0 runs)"
    assert b.high >= u.regimes["moe"].high and b.low <= u.regimes["moe"].low
    # held out by model: each model's rows are judged against the other models' (4 rows here: too few to trust)
    cov = u.coverage["moe"]
    assert cov["runs"] == len(records) and set(cov["per_model"]) == {row.model for row in rows}


def test_the_dispatcher_of_a_bridge_record_is_assumed_from_its_recipes_and_said() -> None:
    from optlayout.runs.predict import assumed_fields

    records = {r.id: r for r in read_runs(MOE_RUNS)}
    gb200 = records["mb-26.08-pretrain-gb200-gptoss120b-mxfp8-64g-main"]
    assert gb200.job_spec().moe_dispatcher == "flex" and "HybridEP" in assumed_fields(gb200)["moe_dispatcher"]["why"]
    # Qwen3-30B-A3B's recipe sets the flex dispatcher on H100 (DeepEP, Bridge v0.3.0); GPT-OSS 120B's does not
    qwen = records["mb-26.02.01-pretrain-h100-qwen330ba3b-fp8-16g-main"]
    assert qwen.job_spec().moe_dispatcher == "flex" and "DeepEP" in assumed_fields(qwen)["moe_dispatcher"]["why"]
    gptoss = records["mb-26.04.01-pretrain-h100-gptoss120b-bf16-64g-main"]
    assert gptoss.job_spec().moe_dispatcher == "alltoall"


def test_calibrate_reads_several_run_files_and_says_how_moe_intervals_cover(cli, tmp_path) -> None:
    """The MoE runs split over two files calibrate as one: the dense constants, report and distributions are the
    shipped calibration's, and the MoE runs' own coverage is said."""
    from optlayout.runs.calibrate import load_calibration, shipped_calibration_path

    lines = MOE_RUNS.read_text().splitlines()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(lines[:3]) + "\n")
    second.write_text("\n".join(lines[3:]) + "\n")
    out = tmp_path / "cal.yaml"
    proc = cli("calibrate", str(first), str(second), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())  # the console may wrap a line
    assert f"{len(lines)} MoE runs: MAPE" in said and f"of {len(lines)} MoE runs with their model held out" in said
    fitted, shipped = load_calibration(out), load_calibration(shipped_calibration_path())
    assert fitted.fitted_on.startswith(f"a.jsonl + b.jsonl ({len(lines)} runs); dense constants from ")
    assert fitted.report["runs"] == shipped.report["runs"] and fitted.report["moe"]["runs"] == len(lines)
    assert fitted.uncertainty is not None and fitted.uncertainty.regime_runs["moe"] == len(lines)


def test_a_moe_only_calibration_names_where_its_dense_constants_come_from_once() -> None:
    """Refitting the MoE constants on a calibration that already has them (the README's command on the shipped
    file) keeps naming the dense fit the constants come from, not the MoE-only calibration that passed them on."""
    from optlayout.runs.calibrate import calibrate, load_calibration, shipped_calibration_path

    records = read_runs(MOE_RUNS)
    shipped = load_calibration(shipped_calibration_path())
    once = calibrate(records, fitted_on="moe fixture")
    assert "calibration_runs.jsonl" in shipped.fitted_on and "; dense constants from" not in shipped.fitted_on
    assert once.fitted_on == f"moe fixture; dense constants from {shipped.fitted_on}"  # the shipped dense fit
    assert calibrate(records, fitted_on="moe fixture", shared=once).fitted_on == once.fitted_on
