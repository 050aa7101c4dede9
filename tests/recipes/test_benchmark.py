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
