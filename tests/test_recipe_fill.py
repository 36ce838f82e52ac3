"""The recomputation and sharding of NVIDIA's published recipes filled into run records that leave them unpublished
(`runs.records.RECIPE_FILL`): exactly the setups it names, what the recipe files say, never over a published value,
never where the recipe uses what the layout cannot express (`RECIPE_LEFT_ALONE`). The fixture holds fourteen records
copied from ../shared/data/calibration_runs.jsonl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optlayout.layout.model import Recompute, Sharding
from optlayout.layout.recompute import RecomputeModule
from optlayout.runs.predict import predict_run
from optlayout.runs.records import (
    RECIPE_FILL,
    RECIPE_LEFT_ALONE,
    RecipeRecompute,
    RecipeSharding,
    RunLayout,
    RunRecord,
    read_runs,
)

FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "nvidia_recipes.jsonl"

# Hand-read from the recipe files (runs.records names tag and lines): what each release's recipe recomputes, and how
# it shards the training state where the record leaves that unpublished.
FILLED = {
    # @v0.1.0rc3 llama3_8b_llm_pretrain.yaml h100 fp8_cs (lines 73-77): FSDP (published), no recompute key
    "mb-25.09-pretrain-h100-llama38b-fp8-8g-main": {"recompute": "none"},
    # @v0.4.0 llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 (lines 219-223): PP 4, VP 5;
    # recipes/llama/llama3.py lines 730-731: the distributed optimizer, no Megatron FSDP
    "mb-26.04-pretrain-gb300-llama370b-mxfp8-64g-main": {"recompute": "none", "sharding": "zero1"},
    # ... H100_FP8_CS_V2 (lines 339-344): TP 4, PP 8, VP 5
    "mb-26.04-pretrain-h100-llama370b-fp8-64g-main": {"recompute": "none", "sharding": "zero1"},
    # dgxc-benchmarking @v24.11.1 nemotron/nemotron4-340b-synth.yaml line 138: granularity selective, method null;
    # line 146 fsdp False, lines 183-189 distributed_fused_adam with contiguous_grad_buffer: ZeRO-1
    "dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec": {"recompute": "selective", "sharding": "zero1"},
    # @v25.02 llama3.1/llama3.1_70b.yaml line 112: activations_checkpoint_granularity null; 145-154 as above
    "dgxc-v25.02-llama3170b-fp8-64g-8f5cbb3": {"recompute": "none", "sharding": "zero1"},
}
# Left to the solver: the recipe offloads activations to the CPU (GB200 FP8-CS 70B: 40 layers, llama3_workload_base_
# configs.py @v0.4.0 lines 241-246), the record's MBS is not the recipe's (Bridge 25.09 GB200 FP8-MX: 2 against 1;
# 25.11 GB300 8B: 2 against 4; 26.02.01 GB300 MXFP8: MBS 2 without VP against MBS 1 with VP 5), the recipe runs DDP
# with 5 layers recomputed where the run ran FSDP (25.11 H100 8B)
LEFT_ALONE = {
    "mb-26.04-pretrain-gb200-llama370b-fp8-64g-main",
    "mb-25.09-pretrain-gb200-llama370b-fp8blockwisemx-64g-alt",
    "mb-25.11-pretrain-gb300-llama38b-fp8-8g-main",
    "mb-25.11-pretrain-h100-llama38b-fp8-8g-main",
    "mb-26.02.01-pretrain-gb300-llama370b-mxfp8-64g-main",
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


def _key(record: RunRecord) -> tuple[object, ...]:
    return (record.release(), record.model.name, record.cluster.gpu, record.job.precision, record.job.fp8_recipe)


def test_the_rule_fills_exactly_the_setups_it_names(records) -> None:
    fills = {i: r.recipe_fills() for i, r in records.items()}
    assert {i: {k: p.text() for k, p in f.items()} for i, f in fills.items() if f} == FILLED
    # left to the solver besides those listed: JAX rematerialisation policies (MaxText, Paxml), a table naming no
    # recipe (NeMo 24.07; its Nemotron-4 340B has only its optimizer state filled)
    assert {i for i, f in fills.items() if not f} == LEFT_ALONE | {
        "dgxc-v24.11.1-llama270bmaxtext-bf16-64g-35a9aec",
        "dgxc-v24.11.1-gpt35bpaxml-bf16-16g-35a9aec",
        "nemo2407-llama370b-64g",
        "nemo2407-nemotron340b-128g",
    }
    assert {i for i, r in records.items() if _key(r) in RECIPE_LEFT_ALONE} == LEFT_ALONE
    assert all(records[i].layout.recompute is None for i in fills)  # every fixture record leaves it unpublished


def test_a_recipe_offloading_activations_is_left_alone_and_says_where() -> None:
    # Megatron-Bridge's GB200/GB300 FP8-CS Llama 3 70B presets (FSDP, MBS 2) offload 40 / 20 layers' activations
    offloading = {k: why for k, why in RECIPE_LEFT_ALONE.items() if "cpu_offloading_num_layers" in why}
    releases = ("mb-25.11", "mb-26.02", "mb-26.02.01", "mb-26.04", "mb-26.04.01")
    assert {(k[0], k[2]) for k in offloading} == {
        ("mb-25.09", "gb200"),
        *((r, g) for r in releases for g in ("gb200", "gb300")),
    }
    assert all(re.search(r"@v[\d.]+\w* .*lines \d+-\d+", why) for why in offloading.values())
    assert not set(RECIPE_FILL) & set(RECIPE_LEFT_ALONE)


def test_the_release_comes_from_the_id(records) -> None:
    assert records["mb-26.04-pretrain-h100-llama370b-fp8-64g-main"].release() == "mb-26.04"
    assert records["mb-25.09-pretrain-gb200-llama370b-fp8blockwisemx-64g-alt"].release() == "mb-25.09"
    assert records["dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec"].release() == "dgxc-v24.11.1"
    assert records["nemo2407-llama370b-64g"].release() == "nemo2407"
    assert _changed(records["nemo2407-llama370b-64g"], id="nemo-llama370b-64g").release() is None


def test_another_release_gpu_or_recipe_is_not_filled(records) -> None:
    h100 = records["mb-26.04-pretrain-h100-llama370b-fp8-64g-main"]
    assert _changed(h100, cluster={"gpu": "b200"}).recipe_fills() == {}  # no B200 70B run in the table
    assert _changed(h100, job={"fp8_recipe": "mxfp8"}).recipe_fills() == {}  # another FP8 recipe
    assert _changed(h100, id="mb-26.06-pretrain-h100-llama370b-fp8-64g-main").recipe_fills() == {}  # newer
    assert _changed(h100, id="h100-llama370b-fp8-64g").recipe_fills() == {}  # no release named


def test_a_published_recompute_or_sharding_is_never_overridden(records) -> None:
    for i, fill in FILLED.items():
        published = _changed(records[i], layout={"recompute": "full", "recompute_layers": 2})
        assert "recompute" not in published.recipe_fills()
        assert "recompute" in published.layout.known() and published.layout.recompute == Recompute.full
        assert ("sharding" in published.recipe_fills()) == ("sharding" in fill)
        fsdp = _changed(records[i], layout={"sharding": "fsdp"})
        assert "sharding" not in fsdp.recipe_fills() and fsdp.layout.known()["sharding"] == Sharding.fsdp
        # a layer count or a module list published without `recompute` is the record's recomputation too
        counted = _changed(records[i], layout={"recompute_layers": 2})
        assert "recompute" not in counted.recipe_fills()
        listed = _changed(records[i], layout={"recompute_modules": ["core_attn"]})
        assert "recompute" not in listed.recipe_fills()


def test_each_fill_cites_a_recipe_file_with_its_tag_and_lines() -> None:
    parts = {p for fill in RECIPE_FILL.values() for p in (fill.recompute, fill.sharding, fill.state) if p is not None}
    for recipe in parts:
        assert re.search(r"\.(yaml|py)\b", recipe.source), recipe.source  # a file
        assert re.search(r"@v?\d+\.\d+", recipe.source), recipe.source  # its tag (v0.2.0, v24.11.1, 24.07)
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
    # the same YAML pins the distributed optimizer (fsdp False, distributed_fused_adam): ZeRO-1, never FSDP
    assert nemotron.layout.sharding == Sharding.zero1 and "sharding" not in nemotron.filled_fields
    assert nemotron.assumed["layout.sharding"]["value"] == "zero1"
    assert "182-189" in nemotron.assumed["layout.sharding"]["why"]
    assert h100.layout.sharding == Sharding.zero1 and "llama3.py @v0.3.1" in h100.assumed["layout.sharding"]["why"]


def test_an_unfilled_record_keeps_the_solvers_fill(records) -> None:
    for i in ("mb-25.11-pretrain-h100-llama38b-fp8-8g-main", "mb-26.04-pretrain-gb200-llama370b-fp8-64g-main"):
        run = predict_run(records[i])
        assert "layout.recompute" not in run.assumed and "recompute" in run.filled_fields


def test_a_recipe_sharding_reads_as_the_layout_text_and_pins_it() -> None:
    zero1 = RecipeSharding(Sharding.zero1, "a recipe")
    assert zero1.text() == "zero1" and zero1.pins() == {"sharding": Sharding.zero1}


def test_a_recipe_fill_reads_as_the_layout_text_and_pins_its_fields() -> None:
    # Megatron-Bridge's block method (perf scripts' recompute_num_layers=5: granularity full, method block, 5 layers)
    block = RecipeRecompute(Recompute.full, "a recipe", recompute_layers=5)
    assert block.text() == "full,rl=5" and block.pins() == {"recompute": Recompute.full, "recompute_layers": 5}
    modules = (RecomputeModule.layernorm, RecomputeModule.moe_act)
    selective = RecipeRecompute(Recompute.selective, "a recipe", recompute_modules=modules)
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


def test_a_record_whose_degrees_are_not_the_recipes_is_not_filled_and_says_why(records) -> None:
    """The recipe's degrees, hand-read: Llama 3 70B GB300 FP8-MX V2 TP 1, PP 4, VP 5, MBS 1 (Megatron-Bridge
    llama3_workload_base_configs.py @v0.4.0 lines 219-223); Nemotron-4 340B TP 8, PP 8, VP 12, MBS 1 (dgxc
    nemotron/configure.sh @v24.11.1 lines 63-70), CP 2 in BF16 at v25.02 (lines 68-80)."""
    gb300 = records["mb-26.04-pretrain-gb300-llama370b-mxfp8-64g-main"]
    assert gb300.recipe() is not None and gb300.recipe_mismatch() is None
    for field, value, why in (("tp", 2, "tp 2 is not the recipe's 1"), ("micro_batch", 2, "micro_batch 2 is not"),
                              ("vp", 1, "vp 1 is not the recipe's 5")):  # fmt: skip
        other = _changed(gb300, layout={field: value})
        assert other.recipe() is None and other.recipe_fills() == {}
        mismatch = other.recipe_mismatch()
        assert mismatch is not None and why in mismatch and "lines 219-223" in mismatch
        assert mismatch in other.notes()
    nemotron = records["dgxc-v24.11.1-nemotron4340b-bf16-128g-35a9aec"]
    assert nemotron.recipe_mismatch() is None and nemotron.optimizer_state()[1] is not None
    no_vp = _changed(nemotron, layout={"vp": 1})
    assert no_vp.recipe_fills() == {} and no_vp.optimizer_state() == ({}, None)  # the state comes with the recipe
    v25 = nemotron.model_copy(update={"id": nemotron.id.replace("dgxc-v24.11.1", "dgxc-v25.02")})
    mismatch = v25.recipe_mismatch()
    assert mismatch is not None and "cp 1 is not the recipe's 2" in mismatch


def test_nemo_2407_nemotron_340b_has_only_its_launcher_configs_optimizer_state_filled(records) -> None:
    """NeMo-Framework-Launcher @24.07 nemotron/nemotron_340b.yaml lines 158-162: distributed_fused_adam, dtype bf16
    (hand-read); its degrees (PP 12, VP 8, lines 60-62) are not the table's (PP 8, VP 12), so nothing else is filled."""
    record = records["nemo2407-nemotron340b-128g"]
    dtypes, why = record.optimizer_state()
    assert dtypes == {"main_params_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert why is not None and "nemotron_340b.yaml @24.07 lines 158-162" in why
    assert record.recipe_fills() == {} and record.recipe_mismatch() is None
    assert record.job_spec().optimizer_bytes_per_param == 6
    run = predict_run(record)
    assert {"recompute", "sharding"} <= set(run.filled_fields)  # the solver's, as for the table's other runs
    assert "layout.recompute" not in run.assumed and run.assumed["exp_avg_dtype"]["value"] == "bf16"
    # the state does not depend on the degrees: the launcher config's own PP 12, VP 8 keeps it
    assert _changed(record, layout={"pp": 12, "vp": 8}).optimizer_state()[0] == dtypes
    # the table's other models' launcher configs set no dtype: fp32, nothing assumed
    assert records["nemo2407-llama370b-64g"].optimizer_state() == ({}, None)
    assert _changed(record, id="nemo2403-nemotron340b-128g").optimizer_state() == ({}, None)  # another release
