"""Robust ranking (issue 14 item 2): step-time tiers, the rules inside a tier, which rule decided, and an order
that does not depend on how the candidates were enumerated."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import ranking, search
from paraplan.layout import LayoutTable, ParallelLayout
from paraplan.ranking import RankContext, tier_uppers, tiers_of
from paraplan.search import Evaluated, SearchSpace, plan, rank_order, ranking_of
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec
from paraplan.units import GIB

H100 = load_gpu("h100-80gb")


def test_tiers_are_greedy_from_the_fastest() -> None:
    """tier 1 = steps <= best x 1.05; tier 2 starts at the fastest step above that, and so on."""
    step = np.array([10.0, 10.4, 10.5, 10.51, 11.0, 11.03, 11.6, 20.0])
    uppers = tier_uppers(step, 0.05)
    assert uppers.tolist() == pytest.approx([10.5, 10.51 * 1.05, 11.6 * 1.05, 21.0])
    assert tiers_of(step, uppers).tolist() == [1, 1, 1, 2, 2, 2, 3, 4]
    assert tier_uppers(step, 0.05, min_rows=4).tolist() == pytest.approx([10.5, 10.51 * 1.05])  # 3 rows, then 6


def test_band_tolerance_is_half_the_band() -> None:
    assert ranking.band_tolerance(0.9, 1.2) == pytest.approx(0.15)
    assert ranking.band_tolerance(1.1, 1.0) == 0.0


def _ev(layouts: list[ParallelLayout], peak_gib: list[float], step_s: list[float]) -> Evaluated:
    table = LayoutTable.from_layouts(layouts)
    table.etp = np.where(table.etp == 0, table.tp, table.etp)  # 0 = TP, as the search's columns hold it
    custom = {(lay.pp, lay.vp): lay.pipeline_layout for lay in layouts if lay.pipeline_layout}
    table.pipeline_layouts = custom
    step = np.array(step_s)
    return Evaluated(table=table, peak_bytes=np.array(peak_gib) * GIB, step_s=step,
                     tokens_per_s_per_gpu=1.0 / step, fits=np.ones(len(step), dtype=bool))


def _decided(ev: Evaluated, ctx: RankContext, cluster_gpus: int = 64) -> tuple[list[ParallelLayout], tuple[str, ...]]:
    cluster = make_cluster(H100, cluster_gpus)
    order = [int(i) for i in rank_order(ev, "throughput", cluster, ctx)]
    _, decided = ranking_of(ev, order, "throughput", cluster, ctx)
    return [ev.table.row(i) for i in order], decided


CTX = RankContext(tier_tolerance=0.05, memory_step_bytes=4 * GIB)


def lay(**kw: int | bool | tuple[int, ...]) -> ParallelLayout:
    base: dict[str, object] = {"tp": 1, "pp": 1, "cp": 1, "dp": 64, "mbs": 1, "recompute": "none"}
    base.update(kw)
    return ParallelLayout(**base)  # type: ignore[arg-type]


def test_a_faster_tier_wins_over_free_memory() -> None:
    a, b = lay(tp=2, dp=32), lay(tp=4, dp=16)
    order, decided = _decided(_ev([a, b], [70.0, 20.0], [10.0, 10.6]), CTX)  # 6% slower: tier 2
    assert order == [a, b] and decided[0] == "tier"


USABLE_GIB = make_cluster(H100, 64).gpu.usable_bytes / GIB


def _peaks(*free_gib: float) -> list[float]:
    return [USABLE_GIB - f for f in free_gib]


def test_free_memory_counts_whole_memory_bands_up_to_three() -> None:
    """Bands of 4 GiB: 5 GiB free is one band, 9 two, 12.5 three, 30 seven; three or more all tie."""
    assert ranking.FREE_MEMORY_BANDS == 3
    key = ranking.free_memory_key(np.array([0.5, 5.0, 9.0, 12.5, 30.0]) * GIB, 4 * GIB)
    assert key.tolist() == [3, 2, 1, 0, 0]
    a, b, c, d = lay(tp=2, dp=32), lay(tp=4, dp=16), lay(tp=8, dp=8), lay(tp=8, dp=8, mbs=2)
    order, decided = _decided(_ev([a, b, c, d], _peaks(5.0, 9.0, 12.5, 30.0), [10.0, 10.1, 10.2, 10.3]), CTX)
    # c and d both have three bands or more: the faster goes first, d's extra 17.5 GiB buys nothing
    assert order == [c, d, b, a]
    assert decided == ("step_time", "free_memory", "free_memory", "")


def test_free_memory_inside_one_band_is_a_tie_whatever_else_is_in_the_tier() -> None:
    """x (9.5 GiB free) and y (10.5 GiB) both have two bands: a tie, the faster x first. A third layout with more free
    memory does not split them (counting from the tier's most free layout, 13.7 GiB, put y one step ahead)."""
    x, y, z = lay(tp=2, dp=32), lay(tp=4, dp=16), lay(tp=8, dp=8)
    alone, decided = _decided(_ev([y, x], _peaks(10.5, 9.5), [10.1, 10.0]), CTX)
    assert alone == [x, y] and decided[0] == "step_time"
    order, _ = _decided(_ev([y, x, z], _peaks(10.5, 9.5, 13.7), [10.1, 10.0, 10.2]), CTX)
    assert order == [z, x, y]


def test_the_distributed_optimizer_goes_before_fsdp_unless_model_state_binds() -> None:
    d = lay(tp=2, dp=32, distributed_optimizer=True)
    f = lay(tp=2, dp=32, fsdp=True)
    ev = _ev([f, d], [50.0, 50.5], [10.0, 10.1])
    order, decided = _decided(ev, CTX)
    assert order == [d, f] and decided[0] == "distributed_optimizer"
    order, decided = _decided(ev, RankContext(tier_tolerance=0.05, memory_step_bytes=4 * GIB, prefer_fsdp=True))
    assert order == [f, d] and decided[0] == "megatron_fsdp"


def test_tp_and_cp_inside_the_nvlink_domain_go_first() -> None:
    inside = lay(tp=4, cp=2, dp=8)  # TP x CP = 8: one H100 node
    outside = lay(tp=8, cp=2, dp=4)  # the CP group spans 16 ranks: two nodes
    order, decided = _decided(_ev([outside, inside], [40.0, 40.0], [10.0, 10.3]), CTX)
    assert order == [inside, outside] and decided[0] == "nvlink_domain"


def test_an_even_pipeline_split_goes_before_a_custom_layout() -> None:
    """The issue's case: vp6 on 80 layers needs a hand-written --pipeline-model-parallel-layout; an even vp8 that is
    0.004 s slower is one tier with it and goes first."""
    custom = lay(pp=4, vp=6, dp=16, pipeline_layout=(4,) * 8 + (3,) * 16)
    even = lay(pp=4, vp=8, dp=16)
    order, decided = _decided(_ev([custom, even], [50.0, 50.2], [54.300, 54.304]), CTX)
    assert order == [even, custom] and decided[0] == "even_pipeline_split"


def test_fewer_parallel_dimensions_then_the_recipe_then_step_time() -> None:
    a = lay(tp=2, dp=32)
    b = lay(tp=2, cp=2, dp=16)
    order, decided = _decided(_ev([b, a], [40.0, 40.0], [10.0, 10.2]), CTX)
    assert order == [a, b] and decided[0] == "fewer_parallel_dims"
    c, d = lay(tp=2, dp=32, mbs=2), lay(tp=4, dp=16, mbs=1)
    recipe = (4, 1, 1, 1, 1, 4, 1, 0)  # tp4 pp1 vp1 cp1 ep1 etp4 mbs1 no recompute
    ctx = RankContext(tier_tolerance=0.05, memory_step_bytes=4 * GIB, recipe_layouts=(recipe,))
    order, decided = _decided(_ev([c, d], [40.0, 40.0], [10.0, 10.2]), ctx)
    assert order == [d, c] and decided[0] == "nvidia_recipe"
    order, decided = _decided(_ev([c, d], [40.0, 40.0], [10.0, 10.2]), CTX)
    assert order == [c, d] and decided[0] == "step_time"


def test_the_issue_case_of_a_larger_micro_batch_for_0_07_percent() -> None:
    """Llama-3.2-1B-like: mbs 8 at 72.6 GiB was ranked over mbs 4 at 40.7 GiB for +0.07%: one tier, more free
    memory decides."""
    m8, m4 = lay(dp=64, mbs=8), lay(dp=64, mbs=4)
    order, decided = _decided(_ev([m8, m4], [72.6, 40.7], [10.0, 10.007]), CTX)
    assert order == [m4, m8] and decided[0] == "free_memory"
    assert ranking.free_memory_key(np.array([USABLE_GIB - 72.6, USABLE_GIB - 40.7]) * GIB, 4 * GIB).tolist() == [2, 0]


def _space_plan(*variants: str) -> search.Plan:
    return plan(load_model("llama3-8b"), make_cluster(H100, 32), TrainingSpec(seq_len=4096, global_batch_size=128),
                top_k=10, space=SearchSpace(dp_variants=variants or ("distopt", "fsdp")))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefer_fsdp=st.booleans(), tol=st.sampled_from([0.0, 0.02, 0.05, 0.2]))
def test_ranking_does_not_depend_on_the_order_of_the_candidates(seed: int, prefer_fsdp: bool, tol: float) -> None:
    p = _PLAN_ALL  # with plain DDP too: rows that differ only in the data-parallel variant
    ev = p.feasible
    assert ev is not None
    recipe = tuple(int(getattr(ev.table, f)[7]) for f in ranking.RECIPE_FIELDS)
    ctx = RankContext(tier_tolerance=tol, memory_step_bytes=4 * GIB, prefer_fsdp=prefer_fsdp, recipe_layouts=(recipe,))
    perm = np.random.default_rng(seed).permutation(len(ev.step_s))
    shuffled = Evaluated(table=ev.table.take(perm), peak_bytes=ev.peak_bytes[perm], step_s=ev.step_s[perm],
                         tokens_per_s_per_gpu=ev.tokens_per_s_per_gpu[perm], fits=ev.fits[perm])
    for objective in ("throughput", "memory-headroom"):
        first, _ = search.distinct_top(ev, rank_order(ev, objective, p.cluster, ctx), 10)
        second, _ = search.distinct_top(shuffled, rank_order(shuffled, objective, p.cluster, ctx), 10)
        assert [ev.table.row(i) for i in first] == [shuffled.table.row(i) for i in second]
        fast, _ = search._ranked_top(shuffled, objective, p.cluster, 10, ctx)
        assert fast == second


_PLAN = _space_plan()
_PLAN_ALL = _space_plan("distopt", "fsdp", "ddp")


def test_plan_json_says_the_tier_and_the_rule_of_every_layout() -> None:
    p = _PLAN
    doc = json.loads(json.dumps(p.to_dict()))
    cands = doc["candidates"]
    assert [c["tier"] for c in cands] == list(p.tiers) and cands[0]["tier"] == 1
    codes = {c for c, _ in ranking.RULES} | {"megatron_fsdp", "exact_tie", ""}
    assert all(c["decided_by"] in codes for c in cands)
    assert doc["ranking"]["tier_tolerance"] == ranking.tier_tolerance(p.model)
    assert doc["ranking"]["rules"][0] == "tier"
    tol = ranking.tier_tolerance(p.model)
    assert doc["ranking"]["tier_tolerance_source"] == ranking.tier_tolerance_source(p.model)
    assert any(n.startswith(f"ranking: layouts within {100 * tol:.1f}%") for n in p.notes)
    ev = p.feasible
    assert ev is not None
    best = float(ev.step_s.min())
    for c, tier in zip(p.candidates, p.tiers, strict=True):  # tier 1 means within the band of the fastest
        assert (float(c.time.step_s) <= best * (1 + tol) * (1 + 1e-12)) == (tier == 1)


def test_the_pick_is_the_first_of_the_full_ranking() -> None:
    p = _PLAN
    ev, ctx = p.feasible, p.ranking
    assert ev is not None and ctx is not None
    order = rank_order(ev, "throughput", p.cluster, ctx)
    assert ev.table.row(int(order[0])) == p.candidates[0].layout


def test_model_state_binding_is_judged_on_the_fastest_distributed_optimizer_layout() -> None:
    """Llama-3-70B on 64 H100: both variants in tier 1; the fastest distributed-optimizer layout keeps model state
    below three quarters of its peak, so the distributed optimizer is preferred."""
    p = plan(load_model("llama3-70b"), make_cluster(H100, 64), TrainingSpec(seq_len=8192, global_batch_size=512),
             top_k=3, space=SearchSpace(dp_variants=("distopt", "fsdp")))
    ctx = p.ranking
    assert ctx is not None and ctx.model_state_frac is not None
    assert ctx.prefer_fsdp == (ctx.model_state_frac >= ranking.MODEL_STATE_BINDS_FRAC)
    assert not ctx.prefer_fsdp
    ev = p.feasible
    assert ev is not None
    dist = ev.table.distributed_optimizer & ~ev.table.fsdp & (ev.step_s <= ev.step_s.min() * (1 + ctx.tier_tolerance))
    i = int(np.flatnonzero(dist)[np.argmin(ev.step_s[dist])])
    est = search.estimate(p.model, p.cluster, p.training, ev.table.row(i))
    mem = est.stages[est.peak_stage].memory
    frac = float(mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes) / float(mem.total_bytes)
    assert ctx.model_state_frac == pytest.approx(frac, rel=1e-6)



def test_rank_keys_of_a_listed_layout_reproduce_the_plans_decisions() -> None:
    """``rank_keys`` (what explain uses for a recipe's layout) computes the keys the search ranked with."""
    p = _PLAN
    keys = [search.rank_keys(p, c.layout, c.peak_bytes, float(c.time.step_s)) for c in p.candidates]
    assert all(k is not None for k in keys)
    assert [k.tier for k in keys if k is not None] == list(p.tiers)
    for i in range(len(keys) - 1):
        a, b = keys[i], keys[i + 1]
        assert a is not None and b is not None
        assert search.first_rule(p, a, b) == p.decided_by[i]
        assert search.first_rule(p, b, a) == ""  # b does not come first


def test_a_layout_in_the_picks_tier_is_called_equivalent_with_the_rule_that_put_the_pick_first() -> None:
    from paraplan.recipes.compare import _tier_text

    p = _PLAN
    assert p.tiers[1] == 1
    nums: dict[str, object] = {}
    text = _tier_text(p, p.candidates[1], p.candidates[0], nums)
    assert nums["in_tier"] is True and nums["decided_by"] == p.decided_by[0]
    assert p.ranking is not None
    assert f"equivalent within the {100 * p.ranking.tier_tolerance:.1f}% step-time band" in text
    assert ranking.rule_words(p.decided_by[0]) in text
    worse = [i for i, t in enumerate(p.tiers) if t > 1]
    if worse:
        nums = {}
        assert f"tier {p.tiers[worse[0]]}" in _tier_text(p, p.candidates[worse[0]], p.candidates[0], nums)
        assert nums["in_tier"] is False


def test_the_band_tolerance_comes_from_the_packaged_step_band() -> None:
    from paraplan.bands import band_for

    for name, family in (("llama3-8b", "dense"), ("deepseek-v3", "moe")):
        band = band_for("step_s", family)  # type: ignore[arg-type]
        assert ranking.band_tier_tolerance(load_model(name)) == pytest.approx((band.hi_ratio - band.lo_ratio) / 2)


def test_the_tier_tolerance_is_the_packaged_within_job_band_per_family() -> None:
    from paraplan.bands import packaged

    tiers = packaged()["tiers"]
    for name, family in (("llama3-8b", "dense"), ("deepseek-v3", "moe")):
        t = tiers[family]
        assert ranking.tier_tolerance(load_model(name)) == t["tolerance"] == pytest.approx(t["hi_ratio"] - 1)
        words = ranking.tier_tolerance_source(load_model(name))
        assert "within-job band" in words and f"{t['pairs']} held-out pairs of {t['jobs']} jobs" in words
        assert ("no moe pairs of its own" in words) == (family == "moe" and t["pooled"])
        assert 0 < t["tolerance"] < 1 and t["coverage"] >= 0.8 and t["pairs"] > 0


def test_the_tier_tolerance_falls_back_when_the_file_has_no_within_job_band(monkeypatch: pytest.MonkeyPatch) -> None:
    from paraplan import bands

    old = {k: v for k, v in bands.packaged().items() if k != "tiers"}  # a file written before the within-job band
    monkeypatch.setattr(bands, "packaged", lambda: old)
    bands.tier_band_for.cache_clear()
    try:
        assert bands.tier_band_for("dense") is None
        assert ranking.tier_tolerance(load_model("llama3-8b")) == ranking.PROVISIONAL_TIER_TOLERANCE
        assert ranking.tier_tolerance_source(load_model("llama3-8b")) == ranking.PROVISIONAL_SOURCE
    finally:
        bands.tier_band_for.cache_clear()


def test_explain_states_the_tolerance_and_where_it_comes_from() -> None:
    from paraplan.explain import ranking_findings

    (f,) = ranking_findings(_PLAN)
    tol = ranking.tier_tolerance(_PLAN.model)
    assert f"one tier: within {100 * tol:.1f}%, the within-job band measured on" in f.text
    assert f.numbers["tier_tolerance"] == tol
    assert f.numbers["tier_tolerance_source"] == ranking.tier_tolerance_source(_PLAN.model)
