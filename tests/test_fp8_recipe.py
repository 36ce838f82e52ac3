"""The FP8 recipe (`job.fp8_recipe`): validated, read from run records and Megatron logs, stated on the CLI, shown
with the note that the step time prices every recipe alike (the memory counts its saved inputs' scales), and emitted
(tests/test_emit.py, test_launchers.py)."""

from __future__ import annotations

import json

import pytest

from optlayout.errors import InputError
from optlayout.runs.records import RunRecord, read_runs
from optlayout.specs import FP8_RECIPES, PRICED_FP8_RECIPE, JobSpec
from tests.conftest import FIXTURES, run_main

NOT_PRICED = (
    "the step time prices all FP8 recipes alike (as tensorwise); the memory counts the recipe's saved FP8 inputs, "
    "see RESULTS"
)


def _record(job: dict[str, object]) -> dict[str, object]:
    return {
        "id": "r", "source": "test", "framework": "megatron-bridge",
        "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn": 4096, "heads": 8, "kv_heads": 8, "vocab": 32000},
        "cluster": {"gpu": "b200", "gpus": 8}, "job": {"seq_len": 2048, "global_batch": 32} | job,
        "layout": {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "micro_batch": 1}, "measured": {"tokens_per_s_per_gpu": 1e5},
    }  # fmt: skip


def test_the_recipe_goes_with_fp8_only() -> None:
    assert FP8_RECIPES == ("tensorwise", "rowwise", "blockwise", "mxfp8") and PRICED_FP8_RECIPE in FP8_RECIPES
    assert JobSpec(seq_len=8, precision="fp8").fp8_recipe is None  # not stated: the launcher's default
    assert JobSpec(seq_len=8, precision="fp8", fp8_recipe="mxfp8").numerics == "fp8 (mxfp8)"
    assert JobSpec(seq_len=8).numerics == "bf16"
    with pytest.raises(ValueError, match="needs precision fp8"):
        JobSpec(seq_len=8, fp8_recipe="rowwise")


def test_run_records_carry_the_recipe(tmp_path) -> None:
    rec = RunRecord.model_validate(_record({"precision": "fp8", "fp8_recipe": "mxfp8"}))
    assert rec.job_spec().fp8_recipe == "mxfp8" and rec.notes() == [f"fp8_recipe mxfp8: {NOT_PRICED}"]
    for job in ({"precision": "fp8", "fp8_recipe": "tensorwise"}, {"precision": "fp8"}, {}):
        assert RunRecord.model_validate(_record(job)).notes() == []  # the priced recipe, unstated, bf16
    assert RunRecord.model_validate(_record({"precision": "fp8"})).job_spec().fp8_recipe is None
    for job, message in (({"precision": "bf16", "fp8_recipe": "mxfp8"}, "job.fp8_recipe: needs precision fp8"),
                         ({"precision": "fp8", "fp8_recipe": "nvfp4"}, "job.fp8_recipe: Input should be")):  # fmt: skip
        path = tmp_path / "runs.jsonl"
        path.write_text(json.dumps(_record(job)) + "\n")
        with pytest.raises(InputError, match=message):
            read_runs(path)


def test_compare_notes_a_recipe_it_does_not_price(capsys, monkeypatch, tmp_path) -> None:
    path = tmp_path / "runs.jsonl"
    jobs = ({"precision": "fp8", "fp8_recipe": "blockwise"}, {"precision": "fp8"})
    path.write_text("".join(json.dumps(_record(job) | {"id": f"r{i}"}) + "\n" for i, job in enumerate(jobs)))
    code, out, _ = run_main(capsys, monkeypatch, "compare", str(path), "--no-rank", "--json")
    assert code == 0
    rows = json.loads(out)["runs"]
    assert [row["notes"] for row in rows] == [[f"fp8_recipe blockwise: {NOT_PRICED}"], []]
    assert rows[0]["predicted_tokens_per_s_per_gpu"] == rows[1]["predicted_tokens_per_s_per_gpu"]
    code, out, _ = run_main(capsys, monkeypatch, "compare", str(path), "--no-rank")
    assert f"note for 1 run: fp8_recipe blockwise: {NOT_PRICED}" in " ".join(out.split())


ESTIMATE = ("estimate", "--model", "llama3.1-8b", "--cluster", "gpu=b200,gpus=8", "--seq-len", "8192",
            "--global-batch", "64", "--layout", "tp=1,pp=1,dp=8,mb=1,ga=8", "--calibration", "none")  # fmt: skip


def test_cli_states_the_recipe_and_prices_every_one_alike(capsys, monkeypatch) -> None:
    seen = {}
    for recipe in (None, *FP8_RECIPES):
        given = ("--fp8-recipe", recipe) if recipe else ()
        code, out, _ = run_main(capsys, monkeypatch, *ESTIMATE, "--json", "--precision", "fp8", *given)
        assert code == 0
        doc = json.loads(out)
        priced = recipe in (None, PRICED_FP8_RECIPE)
        assert doc["fp8_recipe"] == recipe and doc["notes"] == (
            [] if priced else [f"fp8_recipe {recipe}: {NOT_PRICED}"]
        )
        seen[recipe] = doc["prediction"]
    # the step time alike; the memory by the saved inputs' bytes (tensorwise = not stated; rowwise saves 16-bit)
    assert all(p["step_time_s"] == seen[None]["step_time_s"] for p in seen.values())
    mem = {r: p["memory_per_gpu_bytes"] for r, p in seen.items()}
    assert mem["tensorwise"] == mem[None] < mem["mxfp8"] == mem["blockwise"] < mem["rowwise"]
    code, out, _ = run_main(capsys, monkeypatch, *ESTIMATE, "--precision", "fp8", "--fp8-recipe", "rowwise")
    assert code == 0 and f"note: fp8_recipe rowwise: {NOT_PRICED}" in " ".join(out.split())
    code, out, _ = run_main(capsys, monkeypatch, *ESTIMATE, "--json")
    assert code == 0 and "fp8_recipe" not in json.loads(out)  # bf16: no FP8 keys
    refusals = ((("--fp8-recipe", "mxfp8"), "job: fp8_recipe: needs precision fp8 (precision is bf16)"),
                (("--precision", "fp8", "--fp8-recipe", "nvfp4"), "job: fp8_recipe: Input should be"))  # fmt: skip
    for args, message in refusals:
        code, _, err = run_main(capsys, monkeypatch, *ESTIMATE, *args)
        assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err


def test_megatron_log_states_the_recipe() -> None:
    """A Megatron-LM argument dump with fp8 hybrid: its fp8_recipe is read (delayed scaling is per-tensor)."""
    from optlayout.runs.logs import megatron_facts

    log = (FIXTURES / "runs" / "megatron_llama31_8b.log").read_text()
    dump = "  fp8 ............................................. hybrid\n"
    for recipe, read in (("mxfp8", "mxfp8"), ("delayed", "tensorwise"), ("blockwise", "blockwise"), ("None", None)):
        line = f"  fp8_recipe ...................................... {recipe}\n"
        facts = megatron_facts(log.replace("  bf16 ....", dump + line + "  bf16 ....", 1))
        assert (facts.precision, facts.fp8_recipe) == ("fp8", read)
    assert megatron_facts(log).fp8_recipe is None


def test_explain_and_emit_show_the_recipe(capsys, monkeypatch) -> None:
    args = ("--model", "llama3.1-8b", "--seq-len", "8192", "--layout", "tp=1,pp=1,dp=8,mb=1,ga=8", "--precision",
            "fp8", "--fp8-recipe", "mxfp8")  # fmt: skip
    explain = ("explain", "--cluster", "gpu=b200,gpus=8", "--global-batch", "64", "--calibration", "none", *args)
    code, out, _ = run_main(capsys, monkeypatch, *explain)
    text = " ".join(out.split())
    assert code == 0 and "(fp8 (mxfp8))" in text and f"note: fp8_recipe mxfp8: {NOT_PRICED}" in text
    code, out, _ = run_main(capsys, monkeypatch, *explain, "--json")
    assert code == 0 and json.loads(out)["notes"] == [f"fp8_recipe mxfp8: {NOT_PRICED}"]
    code, out, _ = run_main(capsys, monkeypatch, "emit", "--format", "megatron", *args)
    assert code == 0 and "--fp8-format e4m3" in out and "--fp8-recipe mxfp8" in out
