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
