"""Pipeline schedule simulation: Megatron's order, counts, dependencies, length and the bubble."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.estimate.pipeline import bubble_frac, in_flight_units
from paraplan.report.schedule import Schedule, ideal_length, rank_order, schedule_table, simulate, warmup_count


def equal(p: int, v: int, m: int, f: float = 1 / 3, b: float = 2 / 3) -> Schedule:
    return simulate(pp=p, vp=v, num_microbatches=m, forward=[f] * p, backward=[b] * p)


@pytest.mark.parametrize(("p", "m", "expected"), [(4, 8, [3, 2, 1, 0]), (4, 2, [2, 2, 1, 0]), (1, 5, [0])])
def test_1f1b_warmup_is_p_minus_r_minus_1(p: int, m: int, expected: list[int]) -> None:
    assert [warmup_count(rank=r, pp=p, vp=1, num_microbatches=m) for r in range(p)] == expected


def test_interleaved_warmup_matches_megatron() -> None:
    # get_pp_rank_microbatches: 2(p - r - 1) + (v - 1) * p, capped at m * v
    assert [warmup_count(rank=r, pp=4, vp=2, num_microbatches=8) for r in range(4)] == [10, 8, 6, 4]
    assert warmup_count(rank=0, pp=4, vp=3, num_microbatches=4) == 12  # capped: everything is warm-up
    assert warmup_count(rank=0, pp=4, vp=2, num_microbatches=8, group=2) == 8


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 16), (8, 1, 32), (4, 2, 16), (4, 4, 8), (2, 8, 16)])
def test_warmup_plus_one_is_the_in_flight_count_of_the_memory_model(p: int, v: int, m: int) -> None:
    for r in range(p):
        assert warmup_count(rank=r, pp=p, vp=v, num_microbatches=m) + 1 == int(
            in_flight_units(rank=r, pp=p, vp=v, num_microbatches=m))


def test_rank_order_starts_with_the_warmup_then_alternates() -> None:
    ops = rank_order(rank=1, pp=4, vp=1, num_microbatches=6)
    assert [k for k, _, _ in ops] == ["F", "F", "F", "B", "F", "B", "F", "B", "F", "B", "B", "B"]
    assert [mb for k, mb, _ in ops if k == "F"] == list(range(6))
    assert [mb for k, mb, _ in ops if k == "B"] == list(range(6))


def test_interleaved_order_follows_the_schedule_table() -> None:
    assert schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    ops = rank_order(rank=0, pp=2, vp=2, num_microbatches=4)
    fwd = [(mb, c) for k, mb, c in ops if k == "F"]
    bwd = [(mb, c) for k, mb, c in ops if k == "B"]
    assert fwd == schedule_table(4, 2, 2)
    assert bwd[:2] == [(0, 1), (1, 1)]  # backward runs the last chunk first


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), v=st.integers(1, 4), k=st.integers(1, 4), fb=st.sampled_from([(1, 2), (1, 1), (1, 3)]))
def test_equal_stages_take_m_plus_p_minus_1_over_v(p: int, v: int, k: int, fb: tuple[int, int]) -> None:
    if p == 1:
        v = 1
    m = k * p if v > 1 else k + p // 2
    t = 1.0
    f, b = t * fb[0] / sum(fb), t * fb[1] / sum(fb)
    s = equal(p, v, m, f, b)
    assert s.makespan == pytest.approx(ideal_length(pp=p, vp=v, num_microbatches=m, t=t))
    assert s.makespan == pytest.approx((m + (p - 1) / v) * t)
    assert s.bubble_frac == pytest.approx(float(bubble_frac(pp=p, vp=v, num_microbatches=m)))


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 2, 8), (3, 3, 6), (8, 2, 16), (2, 1, 1)])
def test_every_stage_runs_every_chunk_of_every_microbatch_once(p: int, v: int, m: int) -> None:
    s = equal(p, v, m)
    assert len(s.blocks) == 2 * p * v * m
    for r in range(p):
        assert s.count(r, "F") == s.count(r, "B") == m * v
        keys = {(b.kind, b.microbatch, b.chunk) for b in s.blocks if b.stage == r}
        assert len(keys) == 2 * m * v


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 2, 8), (8, 4, 16)])
def test_blocks_never_overlap_and_respect_dependencies(p: int, v: int, m: int) -> None:
    s = equal(p, v, m)
    end = {(b.kind, b.microbatch, b.chunk * p + b.stage): b.end for b in s.blocks}
    for r in range(p):
        mine = [b for b in s.blocks if b.stage == r]
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(mine))
    for b in s.blocks:
        vs = b.chunk * p + b.stage
        if b.kind == "F" and vs > 0:
            assert b.start >= end[("F", b.microbatch, vs - 1)] - 1e-12
        if b.kind == "B":
            assert b.start >= end[("F", b.microbatch, vs)] - 1e-12
            if vs < p * v - 1:
                assert b.start >= end[("B", b.microbatch, vs + 1)] - 1e-12


def test_the_bubble_is_visible_as_idle_time_at_the_ends() -> None:
    s = equal(4, 1, 8)
    first = {r: min(b.start for b in s.blocks if b.stage == r) for r in range(4)}
    last = {r: max(b.end for b in s.blocks if b.stage == r) for r in range(4)}
    assert first == pytest.approx({0: 0.0, 1: 1 / 3, 2: 2 / 3, 3: 1.0})  # warm-up staircase
    assert last[0] == pytest.approx(s.makespan) and last[3] < s.makespan  # cool-down staircase
    idle = s.makespan - 8 * 1.0
    assert idle == pytest.approx(3.0)  # (p - 1) micro-batch times
    assert s.bubble_frac == pytest.approx(3 / 8)


def test_interleaving_shrinks_the_bubble() -> None:
    assert equal(4, 2, 8).makespan < equal(4, 1, 8).makespan
    assert equal(4, 2, 8).bubble_frac == pytest.approx(equal(4, 1, 8).bubble_frac / 2)


def test_a_slow_stage_sets_the_pace() -> None:
    s = simulate(pp=3, vp=1, num_microbatches=6, forward=[0.2, 0.5, 0.2], backward=[0.4, 1.0, 0.4])
    assert s.makespan >= 6 * 1.5
    assert s.busy == pytest.approx((3.6, 9.0, 3.6))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="per stage"):
        simulate(pp=2, vp=1, num_microbatches=2, forward=[1.0], backward=[1.0, 1.0])
    with pytest.raises(ValueError, match=">= 1"):
        simulate(pp=0, vp=1, num_microbatches=2, forward=[], backward=[])
