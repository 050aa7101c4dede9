"""gpt-oss in the recipe library, the Bridge target and the calibration join (review FIXC 1)."""

from __future__ import annotations

import pytest

from paraplan.launch.bridge import choose_recipe
from paraplan.recipes.catalogue import bridge_recipes, find_recipe
from paraplan.recipes.knobs import recipe_run
from paraplan.specs.load import load_model

from .matrix import _spec


def test_every_gpt_oss_recipe_has_its_presets() -> None:
    rows = [r for r in bridge_recipes() if str(r.get("model")).startswith("gpt_oss")]
    assert len(rows) == 25
    assert all(r.runnable for r in rows if r.gpu_preset is not None), [r.reason for r in rows if not r.runnable]
    assert {r.model_preset for r in rows} == {"gpt-oss-120b", "gpt-oss-20b"}


def test_20b_perf_recipes_run_the_model_they_build() -> None:
    """perf_recipes/gpt_oss/common.py _apply_gpt_oss_20b_common_configs: vocab 128256, plain RoPE."""
    run = recipe_run(find_recipe("gpt-oss-20b-gb200-nvfp4-72", bridge_recipes()))
    assert (run.model.vocab_size, run.model.position_embedding_type) == (128256, "rope")
    assert load_model("gpt-oss-20b").vocab_size == 201088
    big = recipe_run(find_recipe("gpt-oss-120b-h100-bf16-64", bridge_recipes()))
    assert big.model == load_model("gpt-oss-120b")


@pytest.mark.parametrize(("model", "module", "function"), [
    ("gpt-oss-120b", "megatron.bridge.perf_recipes.gpt_oss.h100.gpt_oss",
     "gpt_oss_120b_pretrain_64gpu_h100_bf16_config"),
    # the 20b perf recipes change vocab and RoPE: the base recipe builds the HF model
    ("gpt-oss-20b", "megatron.bridge.recipes.gpt_oss", "gpt_oss_20b_pretrain_config"),
])
def test_bridge_target_names_a_gpt_oss_recipe(model: str, module: str, function: str) -> None:
    spec = _spec(load_model(model), "h100-80gb", 64, {"pp": 4, "ep": 8},
                 {"seq_len": 4096, "global_batch_size": 1280})
    recipe = choose_recipe(spec)
    assert (recipe.module, recipe.function) == (module, function)
