"""paraplan.recipes.provenance: the recipes NVIDIA derived by weak scaling, as the library carries them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from paraplan.recipes.catalogue import bridge_recipes, find_recipe
from paraplan.recipes.provenance import LEGACY_SCALED_GBS, WEAK_SCALED_V2, derivation_of


def test_every_named_function_is_a_library_recipe() -> None:
    """The provenance tables name functions of the packaged library (a typo would flag nothing)."""
    functions = {r.source.rsplit(":", 1)[-1] for r in bridge_recipes()}
    assert LEGACY_SCALED_GBS <= functions and set(WEAK_SCALED_V2) <= functions
    assert len(LEGACY_SCALED_GBS) == 27 and len(WEAK_SCALED_V2) == 16


def test_the_405b_128_gpu_recipes_carry_the_v2_layout_at_half_the_v2_batch() -> None:
    """Each WEAK_SCALED_V2 recipe runs 128 GPUs at GBS 768, half the V2 config's 1536 on 256 GPUs: the same
    per-GPU batch (weak scaling); the docstring words are kept, and a contradicting one is said to be."""
    for fn, (doc, contradicts) in WEAK_SCALED_V2.items():
        r = next(x for x in bridge_recipes() if x.source.endswith(":" + fn))
        assert r.get("num_gpus") == 128 and r.get("global_batch_size") == 768
        assert (f"docstring says {doc}" in r.derivation) is contradicts
    coded_fsdp = find_recipe("llama3.1-405b-gb200-fp8cs-128", bridge_recipes())
    assert coded_fsdp.get("use_megatron_fsdp") is False and "docstring says FSDP" in coded_fsdp.derivation


def test_legacy_scaled_recipes_are_another_scale_with_the_gbs_scaled() -> None:
    """The 32-GPU Llama-3-70B recipes: the 64-GPU ones at half the GBS (one micro-batch group per GPU kept)."""
    for precision in ("bf16", "fp8cs"):
        r32 = find_recipe(f"llama3-70b-gb300-{precision}-32", bridge_recipes())
        r64 = find_recipe(f"llama3-70b-gb300-{precision}-64", bridge_recipes())
        assert r32.derivation and not r64.derivation
        per_gpu = ("global_batch_size", "num_gpus", "dp")
        assert r32.get("global_batch_size") * 2 == r64.get("global_batch_size")  # type: ignore[operator]
        assert all(r32.get(c) == r64.get(c) for c in ("tp", "pp", "cp", "micro_batch_size", "use_megatron_fsdp",
                                                       "cpu_offloading_num_layers")), per_gpu
    assert derivation_of("no_such_config") == ""


def test_recipes_lists_the_derivation_and_json_carries_it() -> None:
    from paraplan.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["recipes", "--model", "llama3-70b", "--gpu", "gb300", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["alias"]: r for r in json.loads(out.output)}
    assert rows["llama3-70b-gb300-bf16-32"]["derivation"].startswith("derived by NVIDIA by weak scaling")
    assert rows["llama3-70b-gb300-bf16-64"]["derivation"] == ""
    table = runner.invoke(app, ["recipes", "--model", "llama3-70b", "--gpu", "gb300"], env={"COLUMNS": "400"})
    assert table.exit_code == 0
    line = next(x for x in table.output.splitlines() if "legacy-scaled GBS" in x)
    assert "llama3-70b-gb300-bf16-32" in line and "llama3-70b-gb300-bf16-64" not in line


def test_each_legacy_scaled_recipe_names_the_direction_it_was_scaled() -> None:
    """Each legacy-scaled function starts from a library recipe of LEGACY_BASE_GPUS' count (its name with that
    count); the reason says "scaled up" exactly where that count is below the recipe's own (20 of 27)."""
    from paraplan.recipes.provenance import LEGACY_BASE_GPUS

    by_fn = {r.source.rsplit(":", 1)[-1]: r for r in bridge_recipes()}
    assert set(LEGACY_BASE_GPUS) == LEGACY_SCALED_GBS
    ups = 0
    for fn, base in LEGACY_BASE_GPUS.items():
        gpus = by_fn[fn].get("num_gpus")
        assert f"_{gpus}gpu_" in fn and fn.replace(f"_{gpus}gpu_", f"_{base}gpu_") in by_fn
        up = base < gpus  # type: ignore[operator]
        ups += up
        assert (f"scaled up from the {base}-GPU recipe" in derivation_of(fn)) is up
        assert (f"scaled down from the {base}-GPU recipe" in derivation_of(fn)) is not up
    assert ups == 20


def test_the_cited_harness_code_is_the_one_at_aad7d9ce2_parent() -> None:
    """At aad7d9ce2^ set_post_overrides scales the GBS as gbs_scaling_factor * num_gpus; the helper
    _weak_scaled_global_batch_size came later: no reason cites it as the harness's."""
    reasons = {derivation_of(fn) for fn in [*LEGACY_SCALED_GBS, *WEAK_SCALED_V2]}
    assert not any("_weak_scaled_global_batch_size" in reason for reason in reasons)
    assert all("gbs_scaling_factor" in derivation_of(fn) for fn in WEAK_SCALED_V2)


def test_the_64_gpu_deepseek_v3_h100_recipes_are_said_not_to_run() -> None:
    """Their coded layout (EP64 x PP8 with ETP 1: 512 GPUs a replica of the experts) cannot run on 64 GPUs: estimate
    refuses it, and the derivation and `paraplan recipes` say so."""
    from paraplan.cli import app, main

    runner = CliRunner()
    for alias in ("deepseek-v3-h100-bf16-64", "deepseek-v3-h100-fp8cs-64"):
        r = find_recipe(alias, bridge_recipes())
        ep, pp = r.get("ep"), r.get("pp")
        assert isinstance(ep, int) and isinstance(pp, int) and r.get("num_gpus") == 64 and 64 % (ep * pp)
        assert r.derivation.startswith("the coded layout cannot run: ")
        assert main(["estimate", "--recipe", alias]) == 1
    table = runner.invoke(app, ["recipes", "--model", "deepseek-v3", "--gpu", "h100"], env={"COLUMNS": "400"})
    assert table.exit_code == 0, table.output
    line = next(x for x in table.output.splitlines() if "cannot run" in x)
    assert "deepseek-v3-h100-bf16-64" in line


def test_recipes_csv_and_plan_json_carry_the_derivation() -> None:
    import csv
    import io

    from paraplan.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["recipes", "--model", "llama3-70b", "--gpu", "gb300", "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = {r["alias"]: r for r in csv.DictReader(io.StringIO(out.output))}
    assert rows["llama3-70b-gb300-bf16-32"]["derivation"] == derivation_of(
        "llama3_70b_pretrain_32gpu_gb300_bf16_config") != ""
    assert rows["llama3-70b-gb300-bf16-64"]["derivation"] == ""


def test_plan_recipe_block_and_line_flag_a_derived_recipe() -> None:
    from paraplan.cli.plan import recipe_line
    from paraplan.recipes.compare import RecipeComparison

    for alias, derived in (("llama3-70b-gb300-bf16-32", True), ("llama3-70b-gb300-bf16-64", False)):
        cmp = RecipeComparison(recipe=find_recipe(alias, bridge_recipes()), at="its own job", error="x")
        assert cmp.as_dict()["derivation"] == cmp.recipe.derivation and bool(cmp.recipe.derivation) is derived
        assert ("derived by NVIDIA, no published run" in recipe_line(cmp, None)) is derived  # type: ignore[arg-type]



def test_every_recipe_whose_pipeline_layout_conflicts_with_its_vp_is_marked_cannot_run() -> None:
    """A layout whose stage count is not PP x VP is refused by Megatron-Core's TransformerConfig (VP conflict):
    every such packaged recipe's derivation says it cannot run (the two DeepSeek-V3 partial_cg_dev at 067f987)."""
    from paraplan.recipes.catalogue import bridge_recipes
    from paraplan.specs.megatron_flags import layout_stage_counts

    conflicting = []
    for r in bridge_recipes():
        layout = r.fields.get("pipeline_model_parallel_layout")
        stages = layout_stage_counts(str(layout)) if isinstance(layout, str) and layout else None
        if stages is not None and len(stages) != int(r.fields["pp"] or 1) * int(r.fields.get("vp") or 1):
            conflicting.append(r.alias)
            assert r.derivation.startswith("the coded layout cannot run"), r.alias
    assert sorted(conflicting) == ["deepseek-v3-gb200-fp8mx-256-partial-cg-dev",
                                   "deepseek-v3-gb300-fp8mx-256-partial-cg-dev"]
