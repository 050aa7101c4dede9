"""benchmarks/published_cases.py: which Megatron-Bridge rows run with their recipe's MoE knobs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
published_cases = pytest.importorskip("published_cases")

NEEDS_SHARED = pytest.mark.skipif(not (published_cases.SHARED / "published_runs.csv").is_file(),
                                  reason="../shared/calibration is absent")


def test_row_container_reads_the_notes() -> None:
    assert published_cases.row_container("container NeMo 26.06.01; task=Pre-Training Performance") == "26.06.01"
    assert published_cases.row_container("container NeMo 26.08; GB300 NVL72") == "26.08"
    assert published_cases.row_container("Megatron-LM README table") is None


@NEEDS_SHARED
def test_recipe_knobs_only_for_moe_rows_of_the_library_containers() -> None:
    import csv

    from paraplan.specs.training import TrainingSpec

    with open(published_cases.SHARED / "published_runs.csv", newline="") as f:
        notes = [r["notes"] for r in csv.DictReader(f)]
    cases, _ = published_cases.load_cases("published")
    with_knobs = [c for c in cases if c.knobs]
    assert with_knobs, "no Bridge MoE row of a recipe container was matched"
    for c in cases:
        row = int(c.id.split(":")[1])
        if c.knobs:
            assert c.moe and c.source == "Megatron-Bridge"
            assert published_cases.row_container(notes[row]) in published_cases.RECIPE_CONTAINERS
            TrainingSpec(seq_len=c.seq_len, global_batch_size=c.gbs, precision=c.precision, **c.knobs)  # valid
        elif c.source == "Megatron-Bridge" and published_cases.row_container(notes[row]) not in \
                published_cases.RECIPE_CONTAINERS:
            assert "schedule" not in c.layout


@NEEDS_SHARED
def test_deepseek_gb300_mxfp8_runs_hybridep_with_the_overlap_schedule() -> None:
    # bridge_perf_recipes.csv deepseek_v3 gb300 256 fp8_mx (tp1 pp2 vp8 ep32): flex, hybridep, moe_a2a_overlap True,
    # delay_wgrad_compute True; the 26.08 summary's first row is that job
    cases, _ = published_cases.load_cases("published")
    c = next(c for c in cases if c.id == "published:0000")
    assert (c.label, c.gpu, c.layout["pp"], c.layout["vp"], c.layout["ep"]) == ("DeepSeek-V3", "gb300", 2, 8, 32)
    assert c.knobs["moe_token_dispatcher_type"] == "flex"
    assert c.knobs["moe_flex_dispatcher_backend"] == "hybridep"
    assert c.knobs["delay_wgrad_compute"] is True
    assert c.knobs["cuda_graph_impl"] == "full_iteration"  # cuda_graph_impl full_iteration in the recipe
    assert c.layout["schedule"] == "combined_1f1b"


@NEEDS_SHARED
def test_same_job_in_an_older_container_keeps_megatron_defaults() -> None:
    # row 77: Qwen3-30B-A3B GB200 x8 ep8 mbs4 in NeMo 26.04, the job of a library recipe (26.04 shipped Bridge v0.4.x,
    # whose config set no moe_a2a_overlap); row 15: the same job in 26.06.01 runs the recipe's knobs
    cases, _ = published_cases.load_cases("published")
    old = next(c for c in cases if c.id == "published:0077")
    new = next(c for c in cases if c.id == "published:0015")
    assert (old.label, old.gpu, old.layout["ep"], old.layout["mbs"]) == (new.label, new.gpu, 8, 4)
    matched = {m.row for m in published_cases.bridge_recipe_matches() if m.recipe is not None}
    assert {15, 77} <= matched
    assert old.knobs == {} and "schedule" not in old.layout
    assert new.knobs["moe_token_dispatcher_type"] == "flex" and new.layout["schedule"] == "combined_1f1b"
