"""Budget sweep: counts, deadline logic, scaling marks, GBS range, recommendation, parsing."""

from __future__ import annotations

import itertools
import math

import pytest

from paraplan.budget import (
    EFFICIENCY_FLOOR,
    BudgetResult,
    BudgetRow,
    budget,
    default_gbs,
    parse_prices,
    parse_token_count,
    sweep_counts,
)
from paraplan.errors import SpecError
from paraplan.search import SearchSpace
from paraplan.specs.load import load_gpu, load_model
from paraplan.units import SECONDS_PER_DAY, SECONDS_PER_HOUR

H100, B200 = load_gpu("h100-80gb"), load_gpu("b200")


@pytest.fixture(scope="module")
def sweep_8b() -> BudgetResult:
    return budget(load_model("llama3-8b"), [H100, B200], tokens=15e12, seq_len=4096, max_gpus=4096,
                  prices={"h100-80gb": 2.5, "b200": 4.0})


def feasible(res: BudgetResult, gpu: str) -> list[BudgetRow]:
    return [r for r in res.rows if r.gpu == gpu and r.feasible]


def test_token_counts_accept_suffixes() -> None:
    assert parse_token_count("15T") == 15e12
    assert parse_token_count("300b") == 300e9
    assert parse_token_count("2.5e12") == 2.5e12
    assert parse_token_count("500K") == 5e5
    assert parse_token_count("1_000M") == 1e9
    assert parse_token_count(" 2G ") == 2e9


@pytest.mark.parametrize("bad", ["", "T", "-5T", "0", "abc", "nan", "inf", "15Q", "1.2.3B"])
def test_bad_token_counts_name_the_flag(bad: str) -> None:
    with pytest.raises(SpecError, match="--tokens"):
        parse_token_count(bad)


def test_prices_per_gpu_or_for_all() -> None:
    names = ["h100-80gb", "b200"]
    assert parse_prices("h100-80gb=2.5, b200=4", names) == {"h100-80gb": 2.5, "b200": 4.0}
    assert parse_prices("3", names) == {"h100-80gb": 3.0, "b200": 3.0}
    assert parse_prices("3,b200=5", names) == {"h100-80gb": 3.0, "b200": 5.0}
    assert parse_prices(None, names) == {} and parse_prices("", names) == {}
    assert parse_prices("b200=4,a100-80gb=1.5", names, known=["a100-80gb"]) == {"b200": 4.0, "a100-80gb": 1.5}


@pytest.mark.parametrize(("text", "pattern"), [
    ("v100=2", "'v100' is not one of the GPUs swept"), ("h100-80gb=abc", "positive price"),
    ("h100-80gb=-1", "positive price"), ("h100-80gb=", "positive price"), ("b200=nan", "positive price"),
])
def test_bad_prices_name_the_flag(text: str, pattern: str) -> None:
    with pytest.raises(SpecError, match=rf"--price-per-gpu-hour: .*{pattern}"):
        parse_prices(text, ["h100-80gb", "b200"])


def test_counts_are_powers_of_two_times_the_node() -> None:
    assert sweep_counts(8, 64) == [8, 16, 32, 64]
    assert sweep_counts(4, 20) == [4, 8, 16]
    assert sweep_counts(8, 2) == [8]
    assert default_gbs(4096) == 1024 and default_gbs(8192) == 512 and default_gbs(10**8) == 1


def test_rows_are_consistent(sweep_8b: BudgetResult) -> None:
    for r in sweep_8b.rows:
        assert r.feasible
        assert r.tokens_per_s_per_gpu is not None and r.days is not None and r.gpu_hours is not None
        assert r.days * SECONDS_PER_DAY * r.num_gpus * r.tokens_per_s_per_gpu == pytest.approx(15e12)
        assert r.gpu_hours == pytest.approx(r.days * 24 * r.num_gpus)
        assert r.gpu_hours == pytest.approx(15e12 / r.tokens_per_s_per_gpu / SECONDS_PER_HOUR)
        price = {"h100-80gb": 2.5, "b200": 4.0}[r.gpu]
        assert r.goodput is not None and 0 < r.goodput <= 1
        assert r.effective_days == pytest.approx(r.days / r.goodput)
        assert r.cost_usd == pytest.approx(price * r.gpu_hours / r.goodput)  # paid on wall (effective) time
        assert r.meets_deadline is None
        assert r.config is not None and r.config["gbs"] == r.gbs == 1024
        assert r.num_gpus == r.config["tp"] * r.config["pp"] * r.config["cp"] * r.config["dp"]
    assert [r.num_gpus for r in sweep_8b.rows if r.gpu == "h100-80gb"][:3] == [8, 16, 32]
    assert sweep_8b.layouts_evaluated == sum(r.layouts_evaluated for r in sweep_8b.rows) > 0


def test_more_gpus_do_not_slow_training_while_per_gpu_throughput_holds(sweep_8b: BudgetResult) -> None:
    for gpu in ("h100-80gb", "b200"):
        rows = feasible(sweep_8b, gpu)
        for a, b in itertools.pairwise(rows):
            assert a.tokens_per_s_per_gpu is not None and b.tokens_per_s_per_gpu is not None
            assert a.days is not None and b.days is not None
            if b.tokens_per_s_per_gpu >= 0.95 * a.tokens_per_s_per_gpu:
                assert b.days <= a.days


def test_efficiency_marks_where_scaling_stops_paying(sweep_8b: BudgetResult) -> None:
    for gpu in ("h100-80gb", "b200"):
        rows = feasible(sweep_8b, gpu)
        assert rows[0].efficiency == 1.0
        best = 0.0
        for r in rows:
            assert r.tokens_per_s_per_gpu is not None and r.efficiency is not None
            best = max(best, r.tokens_per_s_per_gpu)
            assert r.efficiency == pytest.approx(r.tokens_per_s_per_gpu / best)
            codes = {c for c, _ in r.flags}
            assert ("LOW_EFFICIENCY" in codes) == (r.efficiency < EFFICIENCY_FLOOR)
            assert r.config is not None
            assert ("MICROBATCHES_LT_PP" in codes) == (r.config["num_microbatches"] < r.config["pp"])
            assert r.scaling_pays == (not codes & {"LOW_EFFICIENCY", "MICROBATCHES_LT_PP", "NO_PROGRESS"})
    assert any(not r.scaling_pays for r in sweep_8b.rows)  # 8B at 4,096 GPUs with a 4M-token batch


def test_recommendation_without_deadline_is_the_largest_count_that_pays(sweep_8b: BudgetResult) -> None:
    rec = sweep_8b.recommendation
    for gpu in ("h100-80gb", "b200"):
        paying = [r for r in feasible(sweep_8b, gpu) if r.scaling_pays]
        assert rec["per_gpu"][gpu]["num_gpus"] == paying[-1].num_gpus
    assert rec["basis"] == "cheapest"
    picks = list(rec["per_gpu"].values())
    assert rec["overall"]["cost_usd"] == min(p["cost_usd"] for p in picks)


def test_deadline_picks_the_smallest_count_meeting_it() -> None:
    res = budget(load_model("llama3-8b"), [H100], tokens=15e12, seq_len=4096, days=60.0)
    rows = [r for r in res.rows if r.feasible]
    assert all(r.meets_deadline == (r.effective_days is not None and r.effective_days <= 60.0) for r in rows)
    first = next(r for r in rows if r.meets_deadline)
    assert res.recommendation["per_gpu"]["h100-80gb"]["num_gpus"] == first.num_gpus
    assert all(not r.meets_deadline for r in rows if r.num_gpus < first.num_gpus)
    assert res.rows[-1].num_gpus <= 2 * first.num_gpus  # the sweep stops one count past the deadline
    assert res.recommendation["basis"] == "fastest"  # no prices
    assert res.recommendation["overall"]["num_gpus"] == first.num_gpus


def test_impossible_deadline_falls_back_to_the_fastest() -> None:
    res = budget(load_model("llama3-8b"), [H100], tokens=15e12, seq_len=4096, days=1.0, max_gpus=64)
    assert not any(r.meets_deadline for r in res.rows)
    rec = res.recommendation
    assert rec["per_gpu"]["h100-80gb"] is None
    fastest = min((r for r in res.rows if r.feasible), key=lambda r: r.effective_days or math.inf)
    assert rec["overall"]["num_gpus"] == fastest.num_gpus and "no count meets the deadline" in rec["note"]


def test_fixed_count_gives_one_row_per_gpu_type() -> None:
    res = budget(load_model("llama3-70b"), [H100, B200], tokens=2e12, seq_len=4096, num_gpus=64, days=365.0)
    assert [(r.gpu, r.num_gpus) for r in res.rows] == [("h100-80gb", 64), ("b200", 64)]
    assert all(r.feasible and r.efficiency == 1.0 for r in res.rows)


def test_memory_and_batch_limits_are_infeasible_rows_with_reasons() -> None:
    # CP/EP kept inside the node so that the batch, not a cross-node CP group, is what runs out
    res = budget(load_model("llama3.1-405b"), [H100], tokens=15e12, seq_len=8192, gbs=32, max_gpus=8192,
                 space=SearchSpace(allow_cross_node=False, max_pp=8))
    first = res.rows[0]
    assert not first.feasible and first.reason_code == "OOM" and "out of memory" in (first.reason or "")
    last = res.rows[-1]
    # the batch limit shows up either as an infeasible row or as a flag on the last feasible one
    gbs_row = not last.feasible and last.reason_code == "GBS_NOT_DIVISIBLE" and "GBS 32" in (last.reason or "")
    # (one micro-batch per DP rank, or fewer micro-batches than pipeline stages)
    batch_limited = gbs_row or any(code in ("SMALL_BATCH_PER_DP", "MICROBATCHES_LT_PP") for code, _ in last.flags)
    assert batch_limited, last
    assert last.num_gpus < 8192  # the sweep stops once the batch cannot be split further
    assert any(r.feasible for r in res.rows)


def test_gbs_may_grow_with_dp_up_to_the_bound() -> None:
    res = budget(load_model("llama3-8b"), [H100], tokens=15e12, seq_len=4096, gbs=256, max_gbs=1024,
                 max_gpus=1024)
    assert {r.gbs for r in res.rows} <= {256, 512, 1024}
    fixed = budget(load_model("llama3-8b"), [H100], tokens=15e12, seq_len=4096, gbs=256, max_gpus=1024)
    for grown, base in zip(res.rows, fixed.rows, strict=True):  # never worse than the fixed batch (2% tolerance)
        assert grown.tokens_per_s_per_gpu is not None and base.tokens_per_s_per_gpu is not None
        assert grown.tokens_per_s_per_gpu >= 0.98 * base.tokens_per_s_per_gpu
    assert res.rows[-1].tokens_per_s_per_gpu > fixed.rows[-1].tokens_per_s_per_gpu  # type: ignore[operator]
    raised = [r for r in res.rows if r.gbs > 256]
    assert raised and all("GBS_RAISED" in {c for c, _ in r.flags} for r in raised)
    assert any("convergence trade-off" in n and "critical batch" in n for n in res.notes)
    assert not any("convergence" in n for n in fixed.notes)


def test_fp8_on_a_gpu_without_fp8_is_one_infeasible_row() -> None:
    res = budget(load_model("llama3-8b"), [load_gpu("a100-80gb"), H100], tokens=1e12, precision="fp8",
                 num_gpus=8)
    assert res.rows[0].reason_code == "PRECISION" and "fp8" in (res.rows[0].reason or "")
    assert res.rows[1].feasible


def test_progress_reaches_the_total() -> None:
    seen: list[tuple[int, int]] = []
    budget(load_model("llama3-8b"), [H100, B200], tokens=1e12, days=30.0, max_gpus=1024,
           progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] == 2 * len(sweep_counts(8, 1024))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize(("kw", "pattern"), [
    ({"tokens": 0.0}, "tokens must be > 0"), ({"tokens": 1e12, "days": 0.0}, "days must be > 0"),
    ({"tokens": 1e12, "num_gpus": 0}, "num_gpus"), ({"tokens": 1e12, "gbs": 512, "max_gbs": 256}, "max_gbs"),
    ({"tokens": 1e12, "gbs": 0}, "global_batch_size"),
])
def test_bad_arguments(kw: dict[str, object], pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        budget(load_model("llama3-8b"), [H100], **kw)  # type: ignore[arg-type]


def test_json_dict_has_the_stable_keys(sweep_8b: BudgetResult) -> None:
    d = sweep_8b.to_dict()
    assert set(d) >= {"rows", "recommendation", "notes", "layouts_evaluated"}
    assert set(d["rows"][0]) >= {"gpu", "num_gpus", "config", "tokens_per_s_per_gpu", "days", "gpu_hours",
                                 "cost_usd", "meets_deadline", "mfu", "efficiency", "flags", "scaling_pays"}
    assert set(d["recommendation"]) >= {"per_gpu", "overall", "basis"}
