"""Bubble and in-flight formulas (Narayanan et al. 2021 section 2.2; Megatron schedules.py)."""

from __future__ import annotations

import pytest

from paraplan.errors import LayoutError
from paraplan.estimate.pipeline import (
    balanced_uneven_split,
    bubble_frac,
    in_flight_units,
    stage_assignment,
)
from paraplan.layout import ParallelLayout


@pytest.mark.parametrize(("p", "v", "m", "expected"), [(4, 1, 8, 3 / 8), (8, 1, 64, 7 / 64), (4, 2, 8, 3 / 16),
                                                        (1, 1, 32, 0.0), (16, 4, 128, 15 / 512)])
def test_bubble_fraction(p: int, v: int, m: int, expected: float) -> None:
    assert bubble_frac(pp=p, vp=v, num_microbatches=m) == pytest.approx(expected, rel=1e-12)


def test_1f1b_stage_i_holds_min_p_minus_i_and_m() -> None:
    assert [int(in_flight_units(rank=r, pp=4, vp=1, num_microbatches=8)) for r in range(4)] == [4, 3, 2, 1]
    assert [int(in_flight_units(rank=r, pp=4, vp=1, num_microbatches=2)) for r in range(4)] == [2, 2, 2, 1]


def test_interleaved_warmup_matches_megatron() -> None:
    # rank 0 of p=4, v=2: warm-up 2(p-1) + (v-1)p = 10, plus one -> 11 chunk-micro-batches
    assert int(in_flight_units(rank=0, pp=4, vp=2, num_microbatches=16)) == 11
    assert int(in_flight_units(rank=3, pp=4, vp=2, num_microbatches=16)) == 5
    assert int(in_flight_units(rank=0, pp=4, vp=2, num_microbatches=4)) == 8  # capped at m*v


def test_interleaved_assignment_is_round_robin() -> None:
    st = stage_assignment(8, ParallelLayout(pp=2, vp=2))
    assert st[0].chunks == ((0, 1), (4, 5)) and st[1].chunks == ((2, 3), (6, 7))


def test_uneven_first_last() -> None:
    st = stage_assignment(61, ParallelLayout(pp=16, first_stage_layers=3, last_stage_layers=2))
    assert [len(s.layers) for s in st] == [3] + [4] * 14 + [2]


def test_uneven_mismatch_uses_megatron_wording() -> None:
    with pytest.raises(LayoutError, match="middle pipeline model parallel size"):
        stage_assignment(61, ParallelLayout(pp=16, first_stage_layers=4, last_stage_layers=2))


def test_balanced_split_for_deepseek_v3() -> None:
    assert balanced_uneven_split(61, 8) == (6, 7)  # DeepSeek-R1 script comment: first 6, last 7
    first, last = balanced_uneven_split(61, 16) or (0, 0)
    assert (61 - first - last) % 14 == 0
