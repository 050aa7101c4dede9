"""ReportContext: plain numbers that add up, landscape, rejections, schedules, predicted vs measured."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.ingest import parse_text
from paraplan.report.build import (
    MEMORY_TERMS,
    TIME_TERMS,
    build_context,
    context_dict,
    drawn_microbatches,
    landscape,
    stage_times,
)
from paraplan.search import Plan
from paraplan.units import GIB
from tests.report.conftest import LOG


def test_top_layouts_carry_memory_per_stage_and_time_terms(plan_8b: Plan) -> None:
    ctx = build_context(plan_8b)
    assert len(ctx.top) == len(plan_8b.candidates) == 3
    for top, est in zip(ctx.top, plan_8b.candidates, strict=True):
        assert top.label == f"#{top.rank} {est.layout.short()}"
        assert len(top.memory) == est.layout.pp
        for row in top.memory:
            assert sum(row.gib[k] for k in MEMORY_TERMS) == pytest.approx(row.total_gib)
        assert max(r.total_gib for r in top.memory) == pytest.approx(est.peak_bytes / GIB)
        assert [k for k, _ in top.time_s] == list(TIME_TERMS)
        assert sum(v for _, v in top.time_s) == pytest.approx(top.step_s)
        assert top.usable_gib < top.capacity_gib


def test_landscape_has_every_feasible_layout_and_the_counts_add_up(plan_8b: Plan) -> None:
    ctx = build_context(plan_8b)
    land = ctx.landscape
    assert land.total == plan_8b.num_feasible == len(land.labels) == len(land.peak_gib) == len(land.pp)
    assert max(land.peak_gib) <= land.usable_gib
    assert set(land.pp) <= {2, 4}
    assert sum(c for _, c, _ in ctx.rejections) + ctx.num_feasible == ctx.num_evaluated
    assert all(example for _, _, example in ctx.rejections)
    assert ctx.findings and ctx.findings[0][0] == "BINDING_MEMORY"
    assert [s for s, _ in ctx.inputs] == ["model", "cluster", "training"]
    assert '"seq_len": 4096' in ctx.inputs_json


def test_a_large_landscape_keeps_the_pareto_front(plan_70b: Plan) -> None:
    full = landscape(plan_70b)
    small = landscape(plan_70b, max_points=50)
    assert small.total == full.total and 0 < len(small.labels) < len(full.labels)
    # the best throughput and the smallest footprint are on the front
    assert max(small.tokens_per_s_per_gpu) == max(full.tokens_per_s_per_gpu)
    assert min(small.peak_gib) == min(full.peak_gib)
    ctx = build_context(plan_70b, max_points=50)
    assert any("Pareto" in n for n in ctx.notes)


def test_schedule_of_the_top_layout_follows_the_estimate(plan_70b: Plan) -> None:
    ctx = build_context(plan_70b)
    best = plan_70b.candidates[0]
    view = ctx.schedules[0]
    assert view.in_top and view.pp == best.layout.pp and view.vp == best.layout.vp
    assert view.num_microbatches == best.num_microbatches
    assert 0 < view.drawn_microbatches <= view.num_microbatches  # long schedules are drawn in part
    assert len(view.blocks) == 2 * view.pp * view.vp * view.drawn_microbatches
    # stages differ a little (embedding, loss), so the simulated bubble is close to (p-1)/(v m), not equal
    assert view.bubble_frac == pytest.approx(view.estimated_bubble_frac, rel=0.5, abs=0.01)
    assert view.makespan >= view.drawn_microbatches
    fwd, bwd = stage_times(best)
    assert view.unit_s == pytest.approx(max(f + b for f, b in zip(fwd, bwd, strict=True)))
    assert len({(s.pp, s.vp, s.num_microbatches) for s in ctx.schedules}) == len(ctx.schedules) <= 2


def test_without_a_pipeline_in_the_top_the_best_pipelined_layout_is_drawn(plan_8b: Plan) -> None:
    from paraplan.estimator import estimate
    from paraplan.layout import layout_for_world

    flat = estimate(plan_8b.model, plan_8b.cluster, plan_8b.training,
                    layout_for_world(16, tp=2, pp=1, mbs=2, recompute="none"))
    ctx = build_context(dataclasses.replace(plan_8b, candidates=(flat,)))
    assert len(ctx.schedules) == 1 and not ctx.schedules[0].in_top
    assert ctx.schedules[0].pp > 1


def test_long_schedules_are_drawn_with_fewer_microbatches() -> None:
    assert drawn_microbatches(8, 2, 64) == 64
    assert drawn_microbatches(8, 2, 512, max_blocks=6000) == 184  # multiple of PP for interleaving
    assert drawn_microbatches(8, 1, 10_000, max_blocks=1600) == 100
    assert drawn_microbatches(64, 4, 4096, max_blocks=100) == 64  # never below PP when interleaved


def test_predicted_vs_measured(plan_8b: Plan) -> None:
    log = parse_text(LOG, source="train.log")
    ctx = build_context(plan_8b, log=log)
    cmp = ctx.measured
    assert cmp is not None and cmp.sources == ("train.log",) and cmp.iterations == 2
    metrics = {m.name: m for m in cmp.metrics}
    assert metrics["step time"].measured == pytest.approx(5.925)
    assert metrics["step time"].measured_p90 == pytest.approx(5.945)
    assert metrics["throughput"].measured == pytest.approx(390.5)
    assert metrics["peak memory"].measured == pytest.approx(66000 * 2**20 / GIB)
    ratio = metrics["step time"].ratio
    assert ratio is not None and ratio == pytest.approx(5.925 / plan_8b.candidates[0].time.step_s)
    # world 16, PP 2: ranks 0-7 are stage 0, ranks 8-15 stage 1
    assert [(s, m) for s, _, m in cmp.stage_memory] == [(0, pytest.approx(66000 / 1024)),
                                                        (1, pytest.approx(61000 / 1024))]
    assert any(line.startswith("throughput:") for line in cmp.diagnosis)
    second = build_context(plan_8b, log=log, compare_rank=2).measured
    assert second is not None and second.layout_label.startswith("#2 ")


def test_measured_values_missing_from_the_log_stay_none(plan_8b: Plan) -> None:
    log = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 812.5 |\n"
                     " iteration 20/100 | elapsed time per iteration (ms): 800.0 |\n", source="short.log")
    cmp = build_context(plan_8b, log=log).measured
    assert cmp is not None
    metrics = {m.name: m for m in cmp.metrics}
    assert metrics["throughput"].measured is None and metrics["throughput"].ratio is None
    assert metrics["peak memory"].measured is None
    assert all(m is None for _, _, m in cmp.stage_memory)
    assert "throughput: not in the log" in cmp.diagnosis


def test_the_context_is_deterministic(plan_8b: Plan) -> None:
    assert context_dict(build_context(plan_8b)) == context_dict(build_context(plan_8b))


def test_a_plan_without_candidates_is_an_error(plan_8b: Plan) -> None:
    with pytest.raises(ValueError, match="no candidates"):
        build_context(dataclasses.replace(plan_8b, candidates=()))
