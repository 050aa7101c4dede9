"""benchmarks/recipes.py: its counts on hand-made rows, and one recipe compared for real."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = pytest.importorskip("recipes")


def test_summary_counts() -> None:
    rows = [bench.Row("a", True, True, 0.5, "x"), bench.Row("b", True, False, 0.95, "x"),
            bench.Row("c", False, False, 1.2, "x"), bench.Row("d", True, False, 0.85, "x")]
    line = bench.summary(rows, Counter({"no layout fits the job": 2}))
    assert line == ("recipes: 4 compared (2 skipped); fit 3/4; top tier 1/4; within 10% 2/4; top tier or within "
                    "10% 3/4 (75%); fit and top tier or within 10% 2/4")


def test_one_recipe_against_its_plan() -> None:
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import estimate_recipe

    r = find_recipe("llama3-8b-h100-bf16-8", bridge_recipes())
    row = bench.compare(r)
    assert isinstance(row, bench.Row)
    est = estimate_recipe(r)
    assert row.fits == est.fits and 0 < row.ratio
    rejected = next(x for x in bridge_recipes() if x.runnable and "does not divide num_gpus" in str(x.get("notes")))
    assert bench.compare(rejected) == "recipe rejected (EXPERT_GRID)"


def test_a_coded_layout_that_cannot_fit_counts_as_not_fitting_and_names_the_docstring_layout() -> None:
    """Llama-3.1-405B on 128 B200, coded tp4 pp16 vp8: rank 1 of Megatron's interleaved schedule keeps
    2(p - r - 1) + (v - 1) p + 1 = 2 x 14 + 7 x 16 + 1 = 141 one-layer chunk micro-batches; the CSV notes say the
    docstring's layout is PP 8, CP 2, which fits. It stays in the counts as not fitting (flagged)."""
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import estimate_recipe

    r = find_recipe("llama3.1-405b-b200-bf16-128", bridge_recipes())
    assert bench.docstring_layout(r) == {"pp": 8, "cp": 2}
    est = estimate_recipe(r)
    assert not est.fits and est.stages[1].in_flight == 2 * 14 + 7 * 16 + 1
    row = bench.compare(r)
    assert isinstance(row, bench.Row) and not row.fits and row.docstring_fits
    line = bench.summary([row], bench.Counter())
    assert "fit 0/1" in line
    assert line.endswith(f"not fit: 1, of them 1 {bench.DERIVED}, 1 whose {bench.CODED_LAYOUT_OOM}")
    assert row.derivation.startswith(bench.DERIVED) and "docstring says TP=4 PP=8 CP=2" in row.derivation
    physics = bench.oom_physics(r, est)
    assert physics.startswith("stage 1: 141 chunk micro-batches in flight x ")
    assert "tp4 pp8 vp8 cp2 dp2 mbs1 none" in physics and physics.endswith("fits")
    # no docstring note: predicted not to fit, compared, with its physics
    no_note = find_recipe("llama3.1-405b-gb200-fp8cs-128", bridge_recipes())
    assert bench.docstring_layout(no_note) == {}
    row = bench.compare(no_note)
    assert isinstance(row, bench.Row) and not row.fits and row.physics.startswith("stage 1: 77 chunk")
    assert not row.docstring_fits


def test_a_peft_recipe_is_planned_as_peft() -> None:
    """The job plan carries the recipe's task: with frozen base weights (no grads, no optimizer state) a layout of
    Llama-3-70B fits on 8 H100, as the recipe's does; planned as pretraining, none did."""
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe

    row = bench.compare(find_recipe("llama3-70b-h100-bf16-8-peft", bridge_recipes()))
    assert isinstance(row, bench.Row) and row.fits


def test_the_oom_physics_line_adds_up() -> None:
    """Llama-3-70B on 32 GB200 (the 64-GPU FSDP recipe at GBS 128, 40 of 80 layers offloaded): activations + model
    state + other = the peak, the model state and other parts named, and the excess over usable memory."""
    import re

    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import estimate_recipe
    from paraplan.units import GIB

    r = find_recipe("llama3-70b-gb200-fp8cs-32", bridge_recipes())
    est = estimate_recipe(r)
    assert not est.fits
    text = bench.oom_physics(r, est)
    act, state, other, peak, usable, over = (float(x) for x in re.search(
        r"= ([\d.]+) GiB activations \+ ([\d.]+) GiB weights, grads, optimizer \(.*?\) \+ ([\d.]+) GiB other \(.*?\) "
        r"= ([\d.]+) of ([\d.]+) GiB usable, ([\d.]+) GiB over", text).groups())  # type: ignore[union-attr]
    assert act + state + other == pytest.approx(peak, abs=0.15)
    assert peak == pytest.approx(est.peak_bytes / GIB, abs=0.05)
    assert usable == pytest.approx(est.usable_bytes / GIB, abs=0.05)
    assert over == pytest.approx((est.peak_bytes - est.usable_bytes) / GIB, abs=0.05)
    assert "fragmentation" in text and "40 of 80 layers' activations stay" in text


def test_a_recipe_at_another_scale_is_named_with_its_model_state() -> None:
    """The 32-GPU Llama-3-70B recipes are the 64-GPU ones at GBS 128 (Bridge ``_with_global_batch_size``): the OOM
    line names the 64-GPU recipe, which fits, and its model state, half of this one's (FSDP shards over 64, not 32)."""
    import re

    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import estimate_recipe

    r = find_recipe("llama3-70b-gb200-fp8cs-32", bridge_recipes())
    sib = bench.other_scale(r)
    assert sib is not None and sib.alias == "llama3-70b-gb200-fp8cs-64"
    assert bench.other_scale(find_recipe("llama3.1-405b-b200-bf16-128", bridge_recipes())) is None  # no B200 256
    other = bench.other_scale(find_recipe("llama3.1-405b-gb200-fp8cs-128", bridge_recipes()))
    assert other is not None and other.alias == "llama3.1-405b-gb200-fp8cs-256"
    text = bench.oom_physics(r, estimate_recipe(r))
    m = re.search(r"llama3-70b-gb200-fp8cs-64, .*?: peak [\d.]+ GiB, fits, weights, grads, optimizer ([\d.]+) GiB "
                  r"against ([\d.]+) here", text)
    assert m is not None
    assert float(m.group(1)) == pytest.approx(float(m.group(2)) / 2, abs=0.1)


def test_derived_recipes_are_counted_apart_and_the_rest_are_not() -> None:
    """A recipe NVIDIA derived by weak scaling is named on the last line when it does not fit; a fitting one, or one
    without a derivation, adds nothing there (the count is of the recipes that do not fit)."""
    derived = bench.Row("a", False, True, 1.1, "x", derivation=bench.DERIVED + ": why")
    plain = bench.Row("b", False, True, 1.1, "x")
    fitting = bench.Row("c", True, True, 1.1, "x", derivation=bench.DERIVED + ": why")
    assert bench.summary([derived, plain, fitting], Counter()).endswith(f"not fit: 2, of them 1 {bench.DERIVED}")
    assert "not fit" not in bench.summary([plain, fitting], Counter())
