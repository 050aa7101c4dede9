"""gpt-oss in the recipe library, the Bridge target and the calibration join (review FIXC 1)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from paraplan.errors import LayoutError, NoFeasiblePlanError
from paraplan.launch.bridge import choose_recipe
from paraplan.launch.megatron import argv, flag_pairs, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes, find_recipe
from paraplan.recipes.knobs import estimate_recipe, recipe_run, training_knobs
from paraplan.rules import check_layout
from paraplan.search import SearchSpace, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

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


# --- context parallelism with a learnable softmax (review FIXC 2) ---------------------------------------------
OSS = load_model("gpt-oss-20b")
CP2 = ParallelLayout(cp=2, ep=4, etp=1, dp=4, recompute="none")


def _t(**kw: Any) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=64, **kw)


def test_cp_with_sinks_needs_a2a() -> None:
    """TE get_attention_backend: no FlashAttention for softmax_type learnable, no FusedAttention for CP unless
    cp_comm_type a2a, no unfused attention with CP; a2a (Bridge's gpt-oss recipes) leaves FusedAttention."""
    def broken(model: Any, layout: ParallelLayout, training: TrainingSpec) -> str | None:
        try:
            check_layout(model, training, make_cluster(load_gpu("b300"), 8), layout)
        except LayoutError as err:
            return f"{err.reason}: {err}"
        return None

    found = broken(OSS, CP2, _t())
    assert found is not None and found.startswith("CP_SOFTMAX_NEEDS_A2A") and "--cp-comm-type a2a" in found
    assert "\n" not in found
    assert str(broken(OSS, CP2, _t(cp_comm_type="all_gather"))).startswith("CP_SOFTMAX_NEEDS_A2A")
    assert broken(OSS, CP2, _t(cp_comm_type="a2a")) is None
    assert broken(OSS, replace(CP2, cp=1, dp=8), _t()) is None
    assert broken(replace(OSS, softmax_type="vanilla"), CP2, _t()) is None
    pairs = dict(flag_pairs(megatron_args(OSS, CP2, _t(cp_comm_type="a2a"))))
    assert pairs["--cp-comm-type"] == "a2a" and pairs["--context-parallel-size"] == "2"


def test_plan_counts_the_rule_and_keeps_cp_with_a2a() -> None:
    cluster = make_cluster(load_gpu("b300"), 8)
    space = SearchSpace(cp=(2,), tp=(1,), pp=(1,), ep=(4,))
    with pytest.raises(NoFeasiblePlanError) as err:
        plan(OSS, cluster, _t(), space=space)
    assert err.value.rejections.get("CP_SOFTMAX_NEEDS_A2A", 0) > 0
    best = plan(OSS, cluster, _t(cp_comm_type="a2a"), space=space).candidates[0]
    assert best.layout.cp == 2


def test_gpt_oss_recipes_run_a2a() -> None:
    """recipes/gpt_oss/h100/gpt_oss.py: cfg.model.cp_comm_type = "a2a" (the base of every gpt-oss perf recipe)."""
    r = find_recipe("gpt-oss-20b-b300-nvfp4-8", bridge_recipes())
    assert r.get("cp") == 2 and training_knobs(r, "fp4")["cp_comm_type"] == "a2a"
    estimate_recipe(r)  # estimated, not refused


def test_check_reports_a_p2p_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import paraplan.cli.check  # noqa: F401  (registers the command)
    from paraplan.cli import main

    words = argv(megatron_args(OSS, CP2, _t(cp_comm_type="a2a")), resolve=True)
    script = tmp_path / "run.sh"
    for comm, broken in (("a2a", False), ("p2p", True)):
        line = " ".join(words).replace("--cp-comm-type a2a", f"--cp-comm-type {comm}")
        script.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {line}\n", encoding="utf-8")
        main(["check", str(script), "--gpu", "b300", "--format", "json"])
        out, _ = capsys.readouterr()
        codes = {v["code"] for v in json.loads(out)["violations"]}
        assert ("CP_SOFTMAX_NEEDS_A2A" in codes) is broken, codes
