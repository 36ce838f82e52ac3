"""The recomputation of NVIDIA's published recipes filled into run records that leave it unpublished
(`runs.records.RECIPE_RECOMPUTE`): exactly the setups it names, what the recipe files say, never over a published
value. The fixture holds thirteen records copied from ../shared/data/calibration_runs.jsonl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optlayout.layout.model import Recompute
from optlayout.layout.recompute import RecomputeModule
from optlayout.runs.predict import predict_run
from optlayout.runs.records import RECIPE_RECOMPUTE, RecipeRecompute, RunLayout, RunRecord, read_runs

FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "nvidia_recipes.jsonl"

# Hand-read from the recipe files (runs.records names tag and lines): what each release's recipe recomputes.
FILLED = {
    # Megatron-Bridge @v0.1.0rc3 llama3_70b_llm_pretrain.yaml gb200 fp8_mx (lines 147-152): no recompute key
    "mb-25.09-pretrain-gb200-llama370b-fp8blockwisemx-64g-alt": "none",
    # @v0.1.0rc3 llama3_8b_llm_pretrain.yaml h100 fp8_cs (lines 73-77): FSDP, no recompute key
    "mb-25.09-pretrain-h100-llama38b-fp8-8g-main": "none",
    # @v0.4.0 llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 (lines 219-223): PP 4, VP 5
    "mb-26.04-pretrain-gb300-llama370b-mxfp8-64g-main": "none",
    # ... GB200_FP8_CS_V2 (lines 241-246): MBS 2, FSDP, 40 layers' activations offloaded to the CPU
    "mb-26.04-pretrain-gb200-llama370b-fp8-64g-main": "none",
    # ... H100_FP8_CS_V2 (lines 339-344): TP 4, PP 8, VP 5
    "mb-26.04-pretrain-h100-llama370b-fp8-64g-main": "none",
    # dgxc-benchmarking @v24.11.1 nemotron/nemotron4-340b-synth.yaml line 138: granularity selective, method null
    "dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec": "selective",
    # @v25.02 llama3.1/llama3.1_70b.yaml line 112: activations_checkpoint_granularity null
    "dgxc-v25.02-llama3170b-fp8-64g-8f5cbb3": "none",
}


@pytest.fixture(scope="module")
def records() -> dict[str, RunRecord]:
    return {r.id: r for r in read_runs(FIXTURE)}


def _changed(record: RunRecord, **parts: object) -> RunRecord:
    """The record with some fields replaced (`id="..."`) or updated (`cluster={"gpu": "b200"}`)."""
    raw = json.loads(record.model_dump_json())
    for part, value in parts.items():
        raw[part] = raw[part] | value if isinstance(value, dict) else value
    return RunRecord.model_validate_json(json.dumps(raw))


def test_the_rule_fills_exactly_the_setups_it_names(records) -> None:
    fills = {i: r.recipe_recompute() for i, r in records.items()}
    assert {i: f[0].text() for i, f in fills.items() if f is not None} == FILLED
    # left to the solver: the run differs from its release's recipe (Bridge 25.11 H100 8B: DDP with 5 layers
    # recomputed in the recipe, FSDP published; GB300 8B: MBS 4 against 2; 26.02.01 GB300 MXFP8: MBS 1 with VP 5
    # against MBS 2 without VP), JAX rematerialisation policies (MaxText, Paxml), a table naming no recipe (NeMo 24.07)
    assert {i for i, f in fills.items() if f is None} == {
        "mb-25.11-pretrain-gb300-llama38b-fp8-8g-main",
        "mb-25.11-pretrain-h100-llama38b-fp8-8g-main",
        "mb-26.02.01-pretrain-gb300-llama370b-mxfp8-64g-main",
        "dgxc-v24.11.1-llama270bmaxtext-bf16-64g-35a9aec",
        "dgxc-v24.11.1-gpt35bpaxml-bf16-16g-35a9aec",
        "nemo2407-llama370b-64g",
    }
    assert all(records[i].layout.recompute is None for i in fills)  # every fixture record leaves it unpublished


def test_the_release_comes_from_the_id(records) -> None:
    assert records["mb-26.04-pretrain-h100-llama370b-fp8-64g-main"].release() == "mb-26.04"
    assert records["mb-25.09-pretrain-gb200-llama370b-fp8blockwisemx-64g-alt"].release() == "mb-25.09"
    assert records["dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec"].release() == "dgxc-v24.11.1"
    assert records["nemo2407-llama370b-64g"].release() is None


def test_another_release_gpu_or_recipe_is_not_filled(records) -> None:
    h100 = records["mb-26.04-pretrain-h100-llama370b-fp8-64g-main"]
    assert _changed(h100, cluster={"gpu": "b200"}).recipe_recompute() is None  # no B200 70B run in the table
    assert _changed(h100, job={"fp8_recipe": "mxfp8"}).recipe_recompute() is None  # another FP8 recipe
    assert _changed(h100, id="mb-26.06-pretrain-h100-llama370b-fp8-64g-main").recipe_recompute() is None  # newer
    assert _changed(h100, id="h100-llama370b-fp8-64g").recipe_recompute() is None  # no release named


def test_a_published_recompute_is_never_overridden(records) -> None:
    for i in FILLED:
        published = _changed(records[i], layout={"recompute": "full", "recompute_layers": 2})
        assert published.recipe_recompute() is None
        assert "recompute" in published.layout.known() and published.layout.recompute == Recompute.full


def test_each_fill_cites_a_recipe_file_with_its_tag_and_lines() -> None:
    for recipe in set(RECIPE_RECOMPUTE.values()):
        assert re.search(r"\.(yaml|py)\b", recipe.source) and "@v" in recipe.source, recipe.source  # a file, a tag
        assert re.search(r"\d+-\d+\b", recipe.source), recipe.source  # its lines


def test_the_filled_layout_is_the_recipes_and_compare_names_it_assumed(records) -> None:
    h100 = predict_run(records["mb-26.04-pretrain-h100-llama370b-fp8-64g-main"])
    assert h100.layout.recompute == Recompute.none and "recompute" not in h100.filled_fields
    assert h100.layout.short().startswith("tp=4,pp=8,vp=5")
    assumed = h100.assumed["layout.recompute"]
    assert assumed["value"] == "none" and "llama3_workload_base_configs.py @v0.3.0" in assumed["why"]
    nemotron = predict_run(records["dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec"])
    # NeMo's `selective` is Megatron's selective recomputation of the attention core (its default module set)
    assert nemotron.layout.recompute == Recompute.selective and nemotron.layout.recompute_modules is None
    assert nemotron.assumed["layout.recompute"]["value"] == "selective"
    assert "nemotron4-340b-synth.yaml" in nemotron.assumed["layout.recompute"]["why"]


def test_an_unfilled_record_keeps_the_solvers_fill(records) -> None:
    run = predict_run(records["mb-25.11-pretrain-h100-llama38b-fp8-8g-main"])
    assert "layout.recompute" not in run.assumed and "recompute" in run.filled_fields


def test_a_recipe_the_memory_model_cannot_fit_is_a_reported_miss(records) -> None:
    # GB200 FP8-CS: 70B with FSDP at MBS 2 and no recomputation fits only with 40 layers' activations offloaded to
    # the CPU, which the memory model does not model: the run is predicted with the recipe's layout anyway and
    # marked a memory-model miss (compare lists it), never given recomputation the recipe did not run
    run = predict_run(records["mb-26.04-pretrain-gb200-llama370b-fp8-64g-main"])
    assert run.layout.recompute == Recompute.none and run.layout.micro_batch == 2
    assert run.memory_model_miss and run.prediction.tokens_per_s_per_gpu > 0


def test_a_recipe_fill_reads_as_the_layout_text_and_pins_its_fields() -> None:
    # Megatron-Bridge's block method (perf scripts' recompute_num_layers=5: granularity full, method block, 5 layers)
    block = RecipeRecompute(Recompute.full, "a recipe", layers=5)
    assert block.text() == "full,rl=5" and block.pins() == {"recompute": Recompute.full, "recompute_layers": 5}
    modules = (RecomputeModule.layernorm, RecomputeModule.moe_act)
    selective = RecipeRecompute(Recompute.selective, "a recipe", modules=modules)
    assert selective.text() == "selective:layernorm+moe_act"
    assert selective.pins() == {"recompute": Recompute.selective, "recompute_modules": modules}
    assert RecipeRecompute(Recompute.none, "a recipe").pins() == {"recompute": Recompute.none}


def test_a_records_module_list_is_parsed_once_into_the_layouts_form() -> None:
    layout = RunLayout.model_validate(
        {"recompute": "selective", "recompute_modules": ["moe_act", "layernorm", "moe_act"]}
    )
    assert layout.recompute_modules == (RecomputeModule.layernorm, RecomputeModule.moe_act)
    assert layout.known()["recompute_modules"] is layout.recompute_modules
    assert RunLayout(recompute="selective", recompute_modules=("core_attn",)).recompute_modules == (
        RecomputeModule.core_attn,
    )
