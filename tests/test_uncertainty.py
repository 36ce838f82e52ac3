"""Prediction intervals from held-out errors, the support flag, and `solve --robust`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from optlayout.layout.model import Layout, Sharding
from optlayout.runs.calibrate import load_calibration, shipped_calibration_path
from optlayout.runs.uncertainty import (
    HeldOut,
    Quantiles,
    Regimes,
    Support,
    Uncertainty,
    bounds,
    build_uncertainty,
    coverage,
    describe,
    moe_coverage,
    quantiles,
    with_moe,
)
from optlayout.specs import JobSpec, ModelSpec

HELDOUT = Path(__file__).parent / "fixtures" / "heldout_errors.jsonl"
PLAIN = Regimes(categories={"gpu": "h100-sxm/bf16"}, numbers={"pp": 4})


def test_regimes_of_a_layout() -> None:
    model = ModelSpec(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256)
    job = JobSpec(seq_len=8192, global_batch=512, precision="fp8")
    layout = Layout(tp=2, pp=4, vp=4, cp=2, dp=8, micro_batch=1, grad_accum=64, sharding=Sharding.fsdp)
    r = describe(model, job, layout, "h100-sxm/fp8")
    # 32 layers over 4 x 4 model chunks: 2 a chunk; 8192 / cp 2 = 4096-token chunks; FSDP over 16 ranks: not large
    assert r.flags == ["cp_short_chunks", "thin_stages", "interleaved", "fp8"]
    assert r.categories == {"gpu": "h100-sxm/fp8", "fp8_recipe": "unstated"}
    assert r.numbers == {"seq_len": 8192, "tp": 2, "pp": 4, "vp": 4, "cp": 2, "dp": 8, "cp_chunk_tokens": 4096,
                         "layers_per_chunk": 2, "fsdp_shards": 16}  # fmt: skip


def test_quantiles_follow_the_linear_rule() -> None:
    # sorted -0.1, 0.2, 0.3, 0.5: the 10th percentile sits 0.3 of the way from the first to the second value
    q = quantiles([0.2, 0.3, -0.1, 0.5])
    assert (q.runs, q.low, q.median, q.high) == (4, pytest.approx(-0.01), pytest.approx(0.25), pytest.approx(0.44))


U = Uncertainty(
    overall=Quantiles(runs=100, low=-0.1, median=0.0, high=0.1),
    unmeasured_gpu=Quantiles(runs=100, low=-0.4, median=0.05, high=0.5),
    regime_runs={"interleaved": 6, "thin_stages": 2},
    regimes={"interleaved": Quantiles(runs=6, low=-0.05, median=0.1, high=0.3)},
    support=Support(categories={"gpu": ["h100-sxm/bf16"]}, ranges={"pp": [1, 8]}),
)


def test_the_interval_takes_the_widest_of_the_layouts_distributions() -> None:
    b = bounds(U, PLAIN)
    assert (b.low, b.high, b.unsupported) == (-0.1, 0.1, [])
    low_tps, high_tps = b.tokens_per_s(1000.0)  # measured = predicted / exp(log error)
    assert (low_tps, high_tps) == (pytest.approx(1000 * math.exp(-0.1)), pytest.approx(1000 * math.exp(0.1)))
    b = bounds(U, PLAIN.model_copy(update={"flags": ["interleaved"]}))
    assert (b.low, b.high, b.unsupported) == (-0.1, 0.3, [])


def test_an_unmeasured_gpu_takes_the_leave_one_gpu_out_distribution() -> None:
    b = bounds(U, PLAIN.model_copy(update={"categories": {"gpu": "b200/bf16"}}))
    assert (b.low, b.high, b.unsupported) == (-0.4, 0.5, ["gpu b200/bf16 (not measured)"])


def test_unsupported_regimes_widen_to_the_widest_quantiles() -> None:
    b = bounds(U, PLAIN.model_copy(update={"flags": ["thin_stages"]}))  # 2 runs: too few to trust
    assert (b.low, b.high, b.unsupported) == (-0.4, 0.5, ["thin_stages (2 runs)"])
    b = bounds(U, PLAIN.model_copy(update={"numbers": {"pp": 16, "cp_chunk_tokens": 1024}}))
    assert (b.low, b.high) == (-0.4, 0.5)
    assert b.unsupported == ["pp 16 (measured 1-8)", "tokens per cp chunk 1024 (not measured)"]


def _row(source: str, i: int, log_error: float) -> HeldOut:
    return HeldOut(id=f"{source}{i}", source=source, log_error=log_error, regimes=PLAIN)


def test_coverage_holds_each_source_out_by_hand() -> None:
    rows = [_row(s, i, e) for s, errors in (("A", (0.0, 0.1)), ("B", (0.2, 0.3)), ("C", (-0.1, 0.5)))
            for i, e in enumerate(errors)]  # fmt: skip
    # A out: B and C give [-0.01, 0.44] (sorted -0.1 0.2 0.3 0.5): 0.0 and 0.1 inside
    # B out: A and C give [-0.07, 0.38] (sorted -0.1 0 0.1 0.5): 0.2 and 0.3 inside
    # C out: A and B give [0.03, 0.27] (sorted 0 0.1 0.2 0.3): -0.1 and 0.5 outside
    cov = coverage(rows)
    assert cov["per_source"] == {"A": 1.0, "B": 1.0, "C": 0.0}
    assert cov["covered"] == round(4 / 6, 4) and cov["runs"] == 6 and cov["nominal"] == 0.8


def _moe_row(model: str, i: int, log_error: float) -> HeldOut:
    return HeldOut(id=f"{model}{i}", source="s", model=model, log_error=log_error,
                   regimes=PLAIN.model_copy(update={"flags": ["moe"]}))  # fmt: skip


def test_moe_rows_make_the_moe_regime_held_out_by_model_by_hand() -> None:
    rows = [_moe_row(m, i, e) for m, errors in (("A", (0.0, 0.1, 0.2)), ("B", (0.3, 0.4, 0.5)), ("C", (-0.5, 0.6)))
            for i, e in enumerate(errors)]  # fmt: skip
    u = with_moe(U, rows)
    # all 8 rows, sorted -0.5 0 0.1 0.2 0.3 0.4 0.5 0.6: p10 0.7 of the way from -0.5 to 0, p90 0.3 from 0.5 to 0.6
    assert u.regime_runs["moe"] == 8 and u.regimes["moe"] == Quantiles(runs=8, low=-0.15, median=0.25, high=0.53)
    assert u.overall == U.overall and u.regimes["interleaved"] == U.regimes["interleaved"]
    b = bounds(u, rows[0].regimes)
    assert (b.low, b.high, b.unsupported) == (-0.15, 0.53, [])
    # a dense prediction outside the support widens to the dense quantiles only, an MoE one to the MoE ones too
    far = {"numbers": {"pp": 16}}
    assert (bounds(u, PLAIN.model_copy(update=far)).low, bounds(u, PLAIN.model_copy(update=far)).high) == (-0.4, 0.5)
    assert bounds(u, rows[0].regimes.model_copy(update=far)).high == 0.53
    # A out: B and C (-0.5 0.3 0.4 0.5 0.6) give [-0.18, 0.56]: 0, 0.1, 0.2 inside
    # B out: A and C (-0.5 0 0.1 0.2 0.6) give [-0.3, 0.44]: 0.3, 0.4 inside, 0.5 outside
    # C out: A and B give [0.05, 0.45]: the overall [-0.1, 0.1] widens the low end to -0.1; -0.5 and 0.6 outside
    cov = moe_coverage(U, rows)
    assert cov["per_model"] == {"A": 1.0, "B": round(2 / 3, 4), "C": 0.0}
    assert cov["runs"] == 8 and cov["covered"] == round(5 / 8, 4) and u.coverage["moe"] == cov
    assert cov["covered_by_moe_quantiles_only"] == round(5 / 8, 4)  # the same runs: the widening changed no verdict


def test_coverage_on_a_fixture_of_calibration_runs() -> None:
    """Held-out rows of the shipped calibration (`optlayout calibrate --heldout`, one run in four of each source,
    tests/fixtures/heldout_errors.jsonl). The interval's rule, applied with each source held out, covers the held-out
    runs about as often as it says: within 15 points of 80% (a binomial 2-sigma band for 108 runs is ~8)."""
    rows = [HeldOut.model_validate_json(line) for line in HELDOUT.read_text().splitlines()]
    assert len({r.source for r in rows}) >= 3
    cov = coverage(rows)
    assert cov["runs"] == len(rows)
    assert abs(cov["covered"] - 0.8) <= 0.15
    # the rule's widening does not cover less than the overall quantiles alone
    assert cov["covered"] >= cov["covered_by_overall_quantiles_only"]


def test_the_shipped_calibration_carries_its_uncertainty() -> None:
    u = load_calibration(shipped_calibration_path()).uncertainty
    assert u is not None and u.overall.low < u.overall.median < u.overall.high
    assert "h100-sxm/bf16" in u.support.categories["gpu"]
    assert 0 < u.coverage["covered"] <= 1


def test_build_uncertainty_counts_regimes_and_support() -> None:
    rows = [HeldOut(id=str(i), source="s", log_error=0.01 * i, log_error_gpu_out=0.02 * i,
                    regimes=Regimes(flags=["interleaved"] if i < 5 else [], categories={"gpu": f"g{i % 2}/bf16"},
                                    numbers={"pp": float(i + 1)}))
            for i in range(7)]  # fmt: skip
    u = build_uncertainty(rows)
    assert u.regime_runs == {"interleaved": 5} and list(u.regimes) == ["interleaved"]
    assert u.support.categories == {"gpu": ["g0/bf16", "g1/bf16"]} and u.support.ranges == {"pp": [1, 7]}
    assert u.unmeasured_gpu is not None and u.unmeasured_gpu.high == pytest.approx(0.02 * 5.4)


# --- the CLI ------------------------------------------------------------------------------------------------

SOLVE = ("solve", "--model", "llama3-8b", "--cluster", "gpu=h100-sxm,gpus=64", "--seq-len", "8192",
         "--global-batch", "256", "--top", "5", "--json")  # fmt: skip


def test_solve_shows_each_layouts_interval_and_support(cli) -> None:
    proc = cli(*SOLVE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["robust"] is False
    for row in out["layouts"]:
        s = row["support"]
        assert 0 < s["tokens_per_s_per_gpu_low"] < s["tokens_per_s_per_gpu_high"]
        assert isinstance(s["unsupported"], list)
    assert cli(*SOLVE).stdout == proc.stdout  # deterministic


def test_solve_robust_ranks_by_the_intervals_low_end(cli) -> None:
    proc = cli(*SOLVE, "--robust")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["robust"] is True
    conservative = [r["support"]["tokens_per_s_per_gpu_low"] * out["gpus"] for r in out["layouts"]]
    assert conservative == sorted(conservative, reverse=True)


def test_robust_needs_held_out_errors(cli, tmp_path) -> None:
    proc = cli(*SOLVE, "--robust", "--calibration", "none")
    assert proc.returncode == 2 and "--robust" in proc.stderr and "Traceback" not in proc.stderr
    old = yaml.safe_load(shipped_calibration_path().read_text())
    old["schema_version"] = 1
    del old["uncertainty"]
    path = tmp_path / "v1.yaml"
    path.write_text(yaml.safe_dump(old))
    proc = cli(*SOLVE, "--calibration", str(path))  # an older file still loads, and says what it lacks
    assert proc.returncode == 0, proc.stderr
    assert "no held-out errors" in proc.stderr
    assert all("support" not in row for row in json.loads(proc.stdout)["layouts"])
    proc = cli(*SOLVE, "--robust", "--calibration", str(path))
    assert proc.returncode == 2 and "no held-out errors" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_robust_plan_is_replanned_robust_with_the_calibrations_intervals(cli, tmp_path) -> None:
    plan = tmp_path / "robust.json"
    assert cli(*SOLVE, "--robust", "--save", str(plan)).returncode == 0
    replanned = cli("solve", "--from-plan", str(plan), "--gpus", "16", "--top", "5", "--json")
    assert replanned.returncode == 0, replanned.stderr
    out = json.loads(replanned.stdout)
    fresh = json.loads(cli(*SOLVE[:4], "gpu=h100-sxm,gpus=16", *SOLVE[5:], "--robust").stdout)
    # the same order and figures as a robust solve of the new cluster (the plan's job kept)
    assert out["robust"] is True and out["replanned_from"]["gpus"] == 64
    assert [r["layout"] for r in out["layouts"]] == [r["layout"] for r in fresh["layouts"]]
    assert [r["support"] for r in out["layouts"]] == [r["support"] for r in fresh["layouts"]]
    plain = json.loads(cli("solve", "--from-plan", str(plan), "--gpus", "16", "--top", "5", "--json",
                           "--no-robust").stdout)  # fmt: skip
    assert plain["robust"] is False and all("support" in r for r in plain["layouts"])
    proc = cli("solve", "--from-plan", str(plan), "--gpus", "16", "--calibration", "none")
    assert proc.returncode == 2 and "ranked with --robust" in proc.stderr and "--no-robust" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_replan_needs_the_intervals_a_robust_plan_was_ranked_by() -> None:
    from optlayout.errors import InputError
    from optlayout.planning import replan, solve

    u = load_calibration(shipped_calibration_path()).uncertainty
    job = JobSpec(seq_len=8192, global_batch=256)
    plan = solve("llama3-8b", "gpu=h100-sxm,gpus=64", job, uncertainty=u, robust=True)
    with pytest.raises(InputError, match="the plan was ranked robust"):
        replan(plan, 16)
    again = replan(plan, 16, uncertainty=u)
    assert again.robust and again.best.layout == solve("llama3-8b", "gpu=h100-sxm,gpus=16", job, uncertainty=u,
                                                       robust=True).best.layout  # fmt: skip
    assert not replan(plan, 16, robust=False).robust


def test_a_calibration_with_other_quantile_levels_is_refused_naming_the_field(cli, tmp_path) -> None:
    doc = yaml.safe_load(shipped_calibration_path().read_text())
    doc["uncertainty"]["levels"] = [0.05, 0.5, 0.95]
    path = tmp_path / "levels.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = cli(*SOLVE, "--calibration", str(path))
    assert proc.returncode == 2 and "levels" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
