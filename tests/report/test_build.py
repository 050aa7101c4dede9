"""ReportContext: plain numbers that add up, landscape, rejections, schedules, predicted vs measured and the
run's diagnosis (``paraplan.tune``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from paraplan.errors import SpecError
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
from paraplan.tune import compare, diagnose
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
    assert cmp is not None and cmp.sources == ("train.log",) and cmp.iterations == 2 and not cmp.warmup_only
    step = cmp.metric("step_time_s")
    assert step.measured == pytest.approx(5.925) and step.measured_p90 == pytest.approx(5.945)
    assert step.ratio == pytest.approx(5.925 / plan_8b.candidates[0].time.step_s)
    assert cmp.metric("log_tflops_per_gpu").measured == pytest.approx(534.45)  # Megatron main's formula
    assert cmp.metric("log_tflops_per_gpu").measured_p90 == pytest.approx(536.25)
    tokens = cmp.metric("tokens_per_s_per_gpu")
    assert tokens.measured == pytest.approx(256 * 4096 / (5.925 * 16)) and tokens.measured_p90 is None
    mfu = cmp.metric("mfu")  # shown in percent
    assert mfu.unit == "%" and mfu.predicted == pytest.approx(100 * plan_8b.candidates[0].throughput.mfu)
    assert mfu.ratio == pytest.approx(mfu.measured / mfu.predicted)  # type: ignore[operator]
    assert cmp.metric("peak_memory_bytes").measured == pytest.approx(66000 * 2**20 / GIB)
    # world 16, PP 2 (TP 1, CP 1, DP 8): ranks 0-7 are stage 0, ranks 8-15 stage 1
    assert cmp.has_stage_memory
    assert [(s.stage, s.ranks) for s in cmp.stages] == [(0, (0,)), (1, (8,))]
    assert [s.measured_gib for s in cmp.stages] == pytest.approx([66000 / 1024, 61000 / 1024])
    assert [s.reserved_gib for s in cmp.stages] == pytest.approx([70000 / 1024, 65000 / 1024])
    second = build_context(plan_8b, log=log, compare_rank=2).measured
    assert second is not None and second.layout_label.startswith("#2 ")


@pytest.mark.parametrize("rank", [1, 2])
def test_the_diagnosis_is_paraplan_tune_s(plan_8b: Plan, rank: int) -> None:
    log = parse_text(LOG, source="train.log")
    est = plan_8b.candidates[rank - 1]
    expected = [(f.code, f.text) for f in diagnose(compare(est, log))]
    cmp = build_context(plan_8b, log=log, compare_rank=rank).measured
    assert cmp is not None and list(cmp.diagnosis) == expected
    assert cmp.diagnosis[0][0] == "STEP_TIME" and cmp.diagnosis[-1][0] == "NEXT_LAYOUT"
    assert "Launch: paraplan launch --model llama3-8b --gpu h100-80gb" in cmp.diagnosis[-1][1]
    if rank == 2:  # the FSDP layout: the log's 64.5 GiB is well above its prediction
        assert "MEMORY_ABOVE_PREDICTION" in [c for c, _ in cmp.diagnosis]
    refs = build_context(plan_8b, log=log, compare_rank=rank, model_ref="my.yaml", gpu_ref="g.yaml",
                         profile="p.yaml").measured
    assert refs is not None and "--model my.yaml --gpu g.yaml" in refs.diagnosis[-1][1]
    assert "--profile p.yaml" in refs.diagnosis[-1][1]
    quiet = build_context(plan_8b, log=log, compare_rank=rank, search=False).measured
    assert quiet is not None and quiet.diagnosis[-1][1].startswith("no layout search was run")


def test_measured_values_missing_from_the_log_stay_none(plan_8b: Plan) -> None:
    log = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 4125.0 |\n"
                     " iteration 20/100 | elapsed time per iteration (ms): 4000.0 |\n", source="short.log")
    cmp = build_context(plan_8b, log=log).measured
    assert cmp is not None
    assert cmp.metric("log_tflops_per_gpu").measured is None and cmp.metric("log_tflops_per_gpu").ratio is None
    assert cmp.metric("peak_memory_bytes").measured is None
    assert cmp.metric("step_time_s").measured == pytest.approx(4.0)
    assert not cmp.has_stage_memory and all(s.measured_gib is None and not s.ranks for s in cmp.stages)
    assert cmp.diagnosis[0][0] == "STEP_TIME" and cmp.diagnosis[-1][0] == "NEXT_LAYOUT"


def test_notes_of_the_comparison_reach_the_report(plan_8b: Plan) -> None:
    warm = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 9000.0 | global batch size: 256 |\n",
                      source="warm.log")
    cmp = build_context(plan_8b, log=warm, compare_rank=9).measured
    assert cmp is not None and cmp.warmup_only and cmp.iterations == 1
    assert cmp.layout_label.startswith("#3 ")  # the last top layout
    assert cmp.notes[0] == "asked to compare layout #9; the report has 3 top layouts, so the run is compared with #3"
    assert any("only warm-up iterations" in n for n in cmp.notes)
    assert "(warm-up only: includes start-up)" in cmp.diagnosis[0][1]


def test_the_context_is_deterministic(plan_8b: Plan) -> None:
    assert context_dict(build_context(plan_8b)) == context_dict(build_context(plan_8b))
    log = parse_text(LOG, source="train.log")
    one = context_dict(build_context(plan_8b, log=log))
    assert one == context_dict(build_context(plan_8b, log=log))
    json.dumps(one)  # plain data only


def test_a_plan_without_candidates_is_an_error(plan_8b: Plan) -> None:
    with pytest.raises(ValueError, match="no candidates"):
        build_context(dataclasses.replace(plan_8b, candidates=()))


def test_the_log_states_its_layout_and_the_report_compares_with_it(plan_8b: Plan) -> None:
    # top layouts: #1 tp1 pp2 vp8 dp8 mbs2, #2 the same with FSDP, #3 tp1 pp2 vp6 dp8 mbs2
    sizes = ("using world size: 16, data-parallel size: {dp}, context-parallel size: {cp}, hierarchical "
             "context-parallel sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 2\n")
    dump = ("------------------------ arguments ------------------------\n"
            "  micro_batch_size ................................ 2\n"
            "  virtual_pipeline_model_parallel_size ............ {vp}\n"
            "-------------------- end of arguments ---------------------\n")
    vp6 = parse_text(sizes.format(dp=8, cp=1) + dump.format(vp=6) + LOG, source="train.log")
    view = build_context(plan_8b, log=vp6, search=False).measured
    assert view is not None and view.layout_label.startswith("#3 ")
    assert any("the log states its layout" in n for n in view.notes)
    # sizes that do not tell #1 from #2 (FSDP) keep the rank asked for
    same = parse_text(sizes.format(dp=8, cp=1) + dump.format(vp=8) + LOG, source="train.log")
    second = build_context(plan_8b, log=same, compare_rank=2, search=False).measured
    assert second is not None and second.layout_label.startswith("#2 ")
    other = parse_text(sizes.format(dp=4, cp=2) + LOG, source="train.log")
    with pytest.raises(SpecError, match="not among the report's 3 top layouts"):
        build_context(plan_8b, log=other, search=False)
