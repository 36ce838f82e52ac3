"""Checkpoint interval, goodput and straggler figures, each derived by hand in the comments."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from optlayout.conditions import reliability as rel
from optlayout.conditions import stragglers
from optlayout.errors import OptlayoutError
from tests.conftest import run_main

MIN, HOUR, DAY = 60.0, 3600.0, 86400.0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m optlayout.cli ARGS` (which calls `main()`, as the `optlayout` script does) in a fresh process."""
    return subprocess.run([sys.executable, "-m", "optlayout.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def cli_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """`optlayout checkpoint ARGS --json`, parsed; ARGS is split on spaces."""

    def run(args: str) -> dict:
        code, out, err = run_main(capsys, monkeypatch, "checkpoint", *args.split(), "--json")
        assert code == 0, err
        return json.loads(out)

    return run


# --- MTBF ---------------------------------------------------------------------------------------------


def test_mtbf_from_llama3_failures():
    # 54 days x 24 h / 419 failures = 1296 / 419 = 3.0931 h
    assert rel.mtbf_from_failures_s(419, 54 * DAY) / HOUR == pytest.approx(3.0931, abs=1e-4)


def test_cluster_mtbf_halves_when_gpus_double():
    # 1e-5 failures per GPU-hour: 8192 GPUs -> 1 / 0.08192 = 12.207 h; 16384 GPUs -> 6.1035 h
    rate = 1e-5 / HOUR
    m8k = rel.cluster_mtbf_s(8192, gpu_failure_rate_per_s=rate)
    m16k = rel.cluster_mtbf_s(16384, gpu_failure_rate_per_s=rate)
    assert m8k / HOUR == pytest.approx(12.207, abs=1e-3)
    assert m16k / HOUR == pytest.approx(6.1035, abs=1e-3)
    assert m16k == pytest.approx(m8k / 2)
    # Per-GPU MTBF form: 100,000 h per GPU / 16384 GPUs = 6.1035 h (same rate, inverted)
    assert rel.cluster_mtbf_s(16384, gpu_mtbf_s=1e5 * HOUR) == pytest.approx(m16k)


def test_cluster_mtbf_needs_exactly_one_rate():
    with pytest.raises(OptlayoutError):
        rel.cluster_mtbf_s(8, gpu_failure_rate_per_s=1e-9, gpu_mtbf_s=1e9)
    with pytest.raises(OptlayoutError):
        rel.cluster_mtbf_s(8)


# --- intervals ----------------------------------------------------------------------------------------


def test_young_interval_design_figure():
    # sqrt(2 x 5 min x 186 min) = sqrt(1860) = 43.13 min
    assert rel.young_interval_s(5 * MIN, 3.1 * HOUR) / MIN == pytest.approx(43.13, abs=0.01)


@pytest.mark.parametrize(
    ("mtbf_min", "expected_min"),
    # Daly 2006, figs. 3-5 (R = 10 min, delta = 5 min): 117, 57 and 9.1 min. By hand for M = 24 h:
    # x = 5/2880 = 0.001736; sqrt(2 x 5 x 1440) = 120; 120 x (1 + 0.04167/3 + 0.001736/9) - 5 = 116.7
    [(24 * 60, 117.0), (6 * 60, 57.0), (15, 9.1)],
)
def test_daly_interval_matches_paper(mtbf_min, expected_min):
    assert rel.daly_interval_s(5 * MIN, mtbf_min * MIN) / MIN == pytest.approx(expected_min, abs=0.5)


def test_daly_interval_is_mtbf_beyond_two_mtbf():
    assert rel.daly_interval_s(3 * HOUR, 1 * HOUR) == 1 * HOUR


@settings(max_examples=60, deadline=None)
@given(ratio=st.floats(1e-6, 0.05), restart_ratio=st.floats(0.0, 0.5))
def test_daly_near_renewal_optimum(ratio, restart_ratio):
    # Daly's interval is a perturbation estimate of the renewal model's optimum; R drops out of it.
    m = 10 * HOUR
    c, r = ratio * m, restart_ratio * m
    res = optimize.minimize_scalar(
        lambda tau: -rel.effective_fraction_renewal(tau, c, r, m),
        bounds=(c * 1e-3, 5 * m),
        method="bounded",
        options={"xatol": 1e-6 * m},
    )
    daly = rel.daly_interval_s(c, m)
    assert daly == pytest.approx(res.x, rel=2e-3)
    # And the fraction there is as good as the numerical optimum's to 1e-6.
    assert rel.effective_fraction_renewal(daly, c, r, m) == pytest.approx(-res.fun, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(ratio=st.floats(1e-6, 0.2), restart_ratio=st.floats(0.0, 0.1), eps=st.floats(0.01, 0.5))
def test_young_maximizes_first_order_fraction(ratio, restart_ratio, eps):
    m = 5 * HOUR
    c, r = ratio * m, restart_ratio * m
    tau = rel.young_interval_s(c, m)
    best = rel.effective_fraction_first_order(tau, c, r, m)
    for other in (tau * (1 + eps), tau * (1 - eps)):
        assert rel.effective_fraction_first_order(other, c, r, m) <= best + 1e-12


@settings(max_examples=40, deadline=None)
@given(ratio=st.floats(1e-7, 1e-4), restart_ratio=st.floats(0.0, 1e-3))
def test_models_agree_to_first_order(ratio, restart_ratio):
    # Expanding the renewal expression gives 1 - C/tau - ((tau + C)/2 + R)/M + O((tau/M)^2): the two
    # models differ by C/(2M) and second-order terms, negligible when C, R << M.
    m = 24 * HOUR
    c, r = ratio * m, restart_ratio * m
    tau = rel.young_interval_s(c, m)
    assert rel.effective_fraction_renewal(tau, c, r, m) == pytest.approx(
        rel.effective_fraction_first_order(tau, c, r, m), abs=5 * (tau / m) ** 2 + c / m
    )


# --- loss and effective fraction ----------------------------------------------------------------------


def test_design_example_young():
    # M = 186 min, C = 5, R = 10: tau = 43.128; lost = 43.128/2 + 10 = 31.564 min;
    # fraction = 1 - 5/43.128 - 31.564/186 = 1 - 0.11593 - 0.16970 = 0.71437
    # (= 1 - sqrt(2 x 5/186) - 10/186 = 1 - 0.23187 - 0.05376).
    plan = rel.plan_checkpointing(3.1 * HOUR, 5 * MIN, 10 * MIN)
    assert plan.interval_s / MIN == pytest.approx(43.128, abs=1e-3)
    assert plan.lost_per_failure_s / MIN == pytest.approx(31.564, abs=1e-3)
    assert plan.effective_time_fraction == pytest.approx(0.71437, abs=1e-4)
    assert rel.goodput_fraction(3.1 * HOUR, 5 * MIN, 10 * MIN) == plan.effective_time_fraction


def test_renewal_lost_per_failure_by_hand():
    # M = 186, tau = 40, C = 5, R = 10 (min): L = 45; e^{0.241935} - 1 = 0.273711; e^{0.053763} = 1.055235;
    # expected failures per segment = 1.055235 x 0.273711 = 0.288830; lost = 186 - 45/0.288830 = 30.199 min
    lost = rel.lost_per_failure_s(40 * MIN, 5 * MIN, 10 * MIN, 186 * MIN, "daly")
    assert lost / MIN == pytest.approx(30.199, abs=2e-3)
    # fraction = tau / (M x failures per segment) = 40 / (186 x 0.288830) = 0.74457
    assert rel.effective_fraction_renewal(40 * MIN, 5 * MIN, 10 * MIN, 186 * MIN) == pytest.approx(0.74457, abs=1e-4)


def test_renewal_model_against_simulation():
    # Monte Carlo of the renewal model: exponential failures, segment tau + C, restart R after each failure.
    rng = np.random.default_rng(7)
    m, tau, c, r = 100.0, 20.0, 2.0, 5.0
    segments, wall, failures = 20000, 0.0, 0
    for _ in range(segments):
        need = tau + c
        while True:
            t = rng.exponential(m)
            if t >= need:
                wall += need
                break
            wall += t
            failures += 1
            need = r + tau + c
    assert segments * tau / wall == pytest.approx(rel.effective_fraction_renewal(tau, c, r, m), rel=0.01)
    lost = (wall - segments * (tau + c)) / failures
    assert lost == pytest.approx(rel.lost_per_failure_s(tau, c, r, m, "daly"), rel=0.02)


def test_fraction_clipped_at_zero():
    # C = 0.9 M, R = M: 1 - sqrt(1.8) - 1 < 0 -> 0
    assert rel.goodput_fraction(1 * HOUR, 0.9 * HOUR, 1 * HOUR) == 0.0


def test_first_order_out_of_range_is_said(cli_json):
    # C = 100 min, M = 186 min: Young's sqrt(2CM) = 193 min >= M, where the first order assumes one failure per
    # interval at most; the clipped 0% is flagged, the renewal model (Daly) still answers
    young = cli_json("--mtbf-hours 3.1 --checkpoint-minutes 100")
    assert young["interval_minutes"] == pytest.approx(192.9, abs=0.1) and young["effective_time_fraction"] == 0.0
    assert not young["model_holds"] and "--method daly" in young["warning"] and "not shorter than the MTBF" in young[
        "warning"]  # fmt: skip
    assert [row["model_holds"] for row in young["table"]] == [False, True, True, True, True]  # 100, 50, ... 1 min
    daly = cli_json("--mtbf-hours 3.1 --checkpoint-minutes 100 --method daly")
    assert daly["model_holds"] and daly["warning"] is None and 0 < daly["effective_time_fraction"] < 1
    # R = 500 min > M: 1 - C/tau - (tau/2 + R)/M < 0 at any interval
    restart = cli_json("--mtbf-hours 3.1 --checkpoint-minutes 5 --restart-minutes 500")
    assert not restart["model_holds"] and "restart" in restart["warning"]
    assert cli_json("--mtbf-hours 24 --checkpoint-minutes 5")["warning"] is None


def test_checkpoint_not_shorter_than_mtbf_is_an_error():
    with pytest.raises(OptlayoutError, match="no useful checkpoint interval"):
        rel.goodput_fraction(3 * MIN, 5 * MIN, 10 * MIN)


def test_faster_checkpoint_table_is_monotone():
    table = rel.checkpoint_cost_table(3.1 * HOUR, rel.table_costs_s(5 * MIN), 10 * MIN)
    assert [p.checkpoint_s / MIN for p in table] == pytest.approx([10, 5, 2.5, 1, 0.5, 0.05])
    fractions = [p.effective_time_fraction for p in table]
    assert fractions == sorted(fractions)


# --- checkpoint cost ----------------------------------------------------------------------------------


def test_checkpoint_write_time_takes_the_slower_bandwidth():
    # 1e12 B at 100 GB/s = 10 s; nodes cap it at 1 GB/s x 50 = 50 GB/s -> 20 s
    assert rel.checkpoint_write_s(1e12, 100e9) == pytest.approx(10.0)
    assert rel.checkpoint_write_s(1e12, 100e9, per_node_Bps=1e9, nodes=50) == pytest.approx(20.0)
    assert rel.checkpoint_write_s(1e12, 100e9, per_node_Bps=10e9, nodes=50) == pytest.approx(10.0)


def test_async_checkpoint_blocks_only_for_the_copy():
    # 6.48e12 B over 16384 GPUs = 395.5 MB each, at 25 GB/s -> 15.82 ms blocking; the write 6.48e12 / 2e12 = 3.24 s
    cost = rel.checkpoint_cost(6.48e12, 2e12, asynchronous=True, ranks=16384, d2h_Bps=25e9)
    assert cost.blocking_s == pytest.approx(0.015820, rel=1e-3)
    assert cost.durability_lag_s == pytest.approx(3.24)
    sync = rel.checkpoint_cost(6.48e12, 2e12)
    assert sync.blocking_s == sync.write_s == pytest.approx(3.24)
    assert sync.durability_lag_s == 0.0


def test_async_lag_adds_to_loss_and_bounds_the_interval():
    # C = 1 s, M = 1 h: Young tau = sqrt(7200) = 84.85 s; lag 60 s adds 60 s per failure.
    plan = rel.plan_checkpointing(HOUR, 1.0, 600.0, durability_lag_s=60.0)
    assert plan.interval_s == pytest.approx(84.853, abs=1e-3)
    assert plan.lost_per_failure_s == pytest.approx(84.853 / 2 + 600 + 60, abs=1e-3)
    # A 120 s background write forces the interval up to 120 s.
    plan = rel.plan_checkpointing(HOUR, 1.0, 600.0, durability_lag_s=120.0)
    assert plan.interval_s == 120.0 and plan.interval_raised_to_lag


# --- Llama 3 ------------------------------------------------------------------------------------------


def test_llama3_effective_training_time_over_90_percent():
    # 419 failures / 54 days -> M = 3.0931 h = 11135 s. 405B x 16 B = 6.48e12 B at Tectonic's sustained
    # 2 TB/s -> C = 3.24 s. Young: tau = sqrt(2 x 3.24 x 11135) = 268.6 s = 4.48 min;
    # fraction = 1 - 2 x 3.24/268.6 - 600/11135 = 1 - 0.0241 - 0.0539 = 0.922 (R = 10 min).
    m = rel.mtbf_from_failures_s(419, 54 * DAY)
    c = rel.checkpoint_write_s(6.48e12, 2e12)
    young = rel.plan_checkpointing(m, c, 10 * MIN)
    assert young.interval_s / MIN == pytest.approx(4.477, abs=1e-2)
    assert young.effective_time_fraction == pytest.approx(0.922, abs=1e-3)
    assert rel.goodput_fraction(m, c, 10 * MIN, "daly") > 0.9
    # Per-GPU view: 419 / (54 x 24 x 16384) = 1.9733e-5 failures per GPU-hour gives the same MTBF.
    per_gpu = rel.cluster_mtbf_s(16384, gpu_failure_rate_per_s=419 / (54 * 24 * 16384) / HOUR)
    assert per_gpu == pytest.approx(m)
    # A checkpoint of minutes cannot reach 90% at this failure rate: C = 1 min -> 1 - sqrt(2/185.6) - 10/185.6
    # = 1 - 0.1038 - 0.0539 = 0.842; with R = 20 min, R/M = 0.108 alone exceeds 10%.
    assert rel.goodput_fraction(m, 1 * MIN, 10 * MIN) == pytest.approx(0.842, abs=1e-3)
    assert rel.goodput_fraction(m, 1.0, 20 * MIN) < 0.9


# --- stragglers ---------------------------------------------------------------------------------------


def test_straggler_step_time():
    assert stragglers.straggler_step_time_s(2.0, 1.25) == pytest.approx(2.5)
    assert stragglers.straggler_step_time_s(2.0, [1.0, 1.05, 1.3]) == pytest.approx(2.6)
    with pytest.raises(OptlayoutError):
        stragglers.straggler_step_time_s(2.0, 0.9)


def test_expected_max_of_normals():
    # Known closed forms: n = 2 -> 1/sqrt(pi) = 0.56419; n = 3 -> 3/(2 sqrt(pi)) = 0.84628
    assert stragglers.expected_max_standard_normal(1) == 0.0
    assert stragglers.expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-7)
    assert stragglers.expected_max_standard_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-7)
    # 16384 ranks: Monte Carlo of 2000 draws gives 3.975 +- 0.01
    assert stragglers.expected_max_standard_normal(16384) == pytest.approx(3.97, abs=0.02)
    # sigma = 5% jitter on 2 ranks: 1 + 0.05 x 0.56419 = 1.02821
    assert stragglers.expected_max_slowdown(2, 0.05) == pytest.approx(1.02821, abs=1e-5)
    values = [stragglers.expected_max_slowdown(n, 0.02) for n in (1, 8, 64, 1024, 16384)]
    assert values == sorted(values)


def test_bernoulli_stragglers():
    # p = 0.001, 1000 ranks, 1.5x: 1 + 0.5 x (1 - 0.999^1000) = 1 + 0.5 x 0.63230 = 1.31615
    assert stragglers.expected_max_slowdown_bernoulli(1000, 0.001, 1.5) == pytest.approx(1.31615, abs=1e-5)
    assert stragglers.expected_max_slowdown_bernoulli(10, 1.0, 1.5) == 1.5
    assert stragglers.expected_max_slowdown_bernoulli(10, 0.0, 1.5) == 1.0


# --- CLI ----------------------------------------------------------------------------------------------


def test_cli_design_example():
    # End to end in a fresh process, as users run it.
    proc = run_cli("checkpoint", "--mtbf-hours", "3.1", "--checkpoint-minutes", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["interval_minutes"] == pytest.approx(43.13, abs=0.01)  # sqrt(2 x 5 x 186)
    assert out["restart_minutes"] == 10.0  # the default
    assert out["lost_minutes_per_failure"] == pytest.approx(43.13 / 2 + 10, abs=0.01)  # 21.56 + restart
    assert out["effective_time_fraction"] == pytest.approx(0.7144, abs=1e-4)
    assert out["mtbf_hours"] == pytest.approx(3.1)
    assert out["checkpoint_minutes"] == 5.0
    assert [row["current"] for row in out["table"]].count(True) == 1
    assert {"checkpoint_minutes", "interval_minutes", "effective_time_fraction"} <= set(out["table"][0])


def test_cli_same_mtbf_from_failures(cli_json):
    out = cli_json("--failures 419 --days 54 --checkpoint-minutes 5")
    assert out["mtbf_hours"] == pytest.approx(3.0931, abs=1e-4)  # 1296 / 419
    assert out["interval_minutes"] == pytest.approx(math.sqrt(10 * 1296 / 419 * 60), abs=1e-3)  # 43.08


def test_cli_per_gpu_rate_doubles_gpus_halves_mtbf(cli_json):
    a = cli_json("--gpu-failure-rate-per-hour 1e-5 --gpus 8192 --checkpoint-minutes 1")
    b = cli_json("--gpu-failure-rate-per-hour 1e-5 --gpus 16384 --checkpoint-minutes 1")
    assert a["mtbf_hours"] == pytest.approx(12.207, abs=1e-3)
    assert b["mtbf_hours"] == pytest.approx(a["mtbf_hours"] / 2, rel=1e-5)  # JSON keeps 6 significant digits
    c = cli_json("--gpu-mtbf-hours 100000 --gpus 16384 --checkpoint-minutes 1")
    assert c["mtbf_hours"] == pytest.approx(b["mtbf_hours"], rel=1e-5)


def test_cli_llama3_example(cli_json):
    out = cli_json("--failures 419 --days 54 --state-bytes 6.48e12 --storage-gbytes-per-s 2000")
    assert out["checkpoint_minutes"] == pytest.approx(3.24 / 60, rel=1e-4)
    assert out["effective_time_fraction"] == pytest.approx(0.922, abs=1e-3)
    daly = cli_json("--failures 419 --days 54 --state-bytes 6.48e12 --storage-gbytes-per-s 2000 --method daly")
    assert daly["effective_time_fraction"] > 0.9


def test_cli_derived_cost_with_node_cap_and_async(cli_json):
    out = cli_json("--mtbf-hours 3 --state-bytes 1e12 --storage-gbytes-per-s 100 --per-node-gbytes-per-s 1 --nodes 50")
    assert out["checkpoint_minutes"] == pytest.approx(20 / 60, rel=1e-5)  # 1e12 / 50 GB/s = 20 s
    out = cli_json(
        "--mtbf-hours 3 --state-bytes 1e12 --storage-gbytes-per-s 100 --async --gpus 400 --d2h-gbytes-per-s 25"
    )
    # 1e12 / 400 = 2.5 GB per GPU at 25 GB/s = 0.1 s blocking; 10 s background write
    assert out["asynchronous"] is True
    assert out["checkpoint_minutes"] == pytest.approx(0.1 / 60, rel=1e-5)
    assert out["write_minutes"] == pytest.approx(10 / 60, rel=1e-5)


def test_cli_rich_output():
    proc = run_cli("checkpoint", "--mtbf-hours", "3.1", "--checkpoint-minutes", "5")
    assert proc.returncode == 0, proc.stderr
    assert "effective training time" in proc.stdout and "71.4%" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mtbf-hours", "0", "--checkpoint-minutes", "5"], "--mtbf-hours"),
        (["--mtbf-hours", "-3", "--checkpoint-minutes", "5"], "--mtbf-hours"),
        (["--mtbf-hours", "nan", "--checkpoint-minutes", "5"], "--mtbf-hours"),
        (["--mtbf-hours", "3", "--checkpoint-minutes", "0"], "--checkpoint-minutes"),
        (["--mtbf-hours", "3", "--checkpoint-minutes", "-1"], "--checkpoint-minutes"),
        (["--failures", "0", "--days", "54", "--checkpoint-minutes", "5"], "--failures"),
        (["--failures", "419", "--days", "-54", "--checkpoint-minutes", "5"], "--days"),
        (["--failures", "419", "--checkpoint-minutes", "5"], "--days"),
        (["--gpu-failure-rate-per-hour", "1e-5", "--gpus", "0", "--checkpoint-minutes", "5"], "--gpus"),
        (["--gpu-failure-rate-per-hour", "1e-5", "--checkpoint-minutes", "5"], "--gpus"),
        (["--mtbf-hours", "3", "--failures", "419", "--days", "54", "--checkpoint-minutes", "5"], "one MTBF"),
        (["--checkpoint-minutes", "5"], "no MTBF"),
        (["--mtbf-hours", "0.05", "--checkpoint-minutes", "5"], "no useful checkpoint interval"),
        (["--mtbf-hours", "3"], "no checkpoint cost"),
        (["--mtbf-hours", "3", "--checkpoint-minutes", "5", "--state-bytes", "1e12"], "one checkpoint cost"),
        (["--mtbf-hours", "3", "--state-bytes", "1e12"], "--storage-gbytes-per-s"),
        (["--mtbf-hours", "3", "--state-bytes", "1e12", "--storage-gbytes-per-s", "0"], "--storage-gbytes-per-s"),
        (["--mtbf-hours", "3", "--state-bytes", "1e12", "--storage-gbytes-per-s", "9", "--nodes", "4"], "--nodes"),
        (["--mtbf-hours", "3", "--state-bytes", "1e12", "--storage-gbytes-per-s", "9", "--async"], "--gpus"),
        (["--mtbf-hours", "3", "--checkpoint-minutes", "5", "--restart-minutes", "-1"], "--restart-minutes"),
        (["--mtbf-hours", "3", "--checkpoint-minutes", "5", "--method", "exact"], "--method"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, needle, capsys, monkeypatch):
    code, out, err = run_main(capsys, monkeypatch, "checkpoint", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]
    assert out == ""


def test_cli_bad_input_in_a_fresh_process():
    # The same path end to end: MTBF (3 min) shorter than the checkpoint (5 min).
    proc = run_cli("checkpoint", "--mtbf-hours", "0.05", "--checkpoint-minutes", "5")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: MTBF 3 min is not longer than the checkpoint cost 5 min: no useful checkpoint interval exists"
    ]
