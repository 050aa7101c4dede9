"""The within-job band behind the tier tolerance (benchmarks/bands.py ``tier_band``; issue 14: "layouts whose step
times differ by less than the step-time error band are one tier")."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "calibration"


def _bands() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return pytest.importorskip("bands")


def _case(i: int, *, tp: int, measured: float, source: str = "SC21 Table 1", moe: bool = False,
          gpus: int = 64) -> Any:
    from published_cases import Case

    layout = {"tp": tp, "pp": 1, "vp": 1, "cp": 1, "ep": 1, "dp": gpus // tp, "mbs": 1}
    return Case(id=f"published:{i:04d}", source=source, label="m", model={"num_layers": 4, "hidden_size": 64},
                gpu="a100-80gb", num_gpus=gpus, gpus_per_node=8, seq_len=2048, gbs=64, layout=layout,
                precision="bf16", target_tokens_per_s_per_gpu=measured, moe=moe)


def _held(case: Any, predicted: float) -> Any:
    from cross_validate import Held

    return Held(case, predicted, "fold 0")


def test_upper_bound_is_the_conformal_rank() -> None:
    bands = _bands()
    xs = [float(i) for i in range(1, 100)]  # n = 99: rank ceil(100 x 0.8) = 80
    assert bands.upper_bound(xs, 0.8) == 80.0
    assert sum(x <= 80.0 for x in xs) / len(xs) >= 0.8
    assert bands.upper_bound([3.0, 1.0], 0.8) == 3.0  # too few values: the largest
    assert math.isnan(bands.upper_bound([], 0.8))


def test_pairs_are_of_one_job_with_different_layouts() -> None:
    """rho = e_b / e_a with e = predicted / measured step = measured / predicted tokens/s; the same layout twice and
    rows of another job make no pair."""
    bands = _bands()
    a, b = _case(0, tp=2, measured=100.0), _case(1, tp=4, measured=90.0)
    again = _case(2, tp=2, measured=95.0)  # a's layout repeated: run-to-run spread, not a layout difference
    other = _case(3, tp=8, measured=50.0, gpus=128)  # another job (GPU count)
    pairs = bands.within_job_pairs([_held(a, 110.0), _held(b, 80.0), _held(again, 110.0), _held(other, 60.0),
                                    _held(_case(4, tp=8, measured=1.0), "refused")])
    assert len(pairs) == 2 and {p.family for p in pairs} == {"dense"}
    # e_a = 100 / 110 (a's step under-predicted), e_b = 90 / 80 (over-predicted): rho = e_b / e_a; (b, again) likewise
    assert sorted(p.rho for p in pairs) == pytest.approx(sorted([(90 / 80) / (100 / 110), (95 / 110) / (90 / 80)]))


@pytest.mark.skipif(not (SHARED / "published_runs.csv").exists(), reason="needs ../shared/calibration")
def test_megatron_bridge_rows_of_different_releases_are_different_jobs() -> None:
    """Two Bridge rows with different layouts pair only within one container release (a release changes the
    software, not the layout)."""
    bands = _bands()
    from published_cases import load_cases

    bridge = [c for c in load_cases("published")[0] if c.source == "Megatron-Bridge"]
    releases = {bands.release_of(c) for c in bridge}
    assert "" not in releases and len(releases) > 1
    c0 = bridge[0]
    c1 = next(c for c in bridge if bands.release_of(c) != bands.release_of(c0))
    b = replace(c1, label=c0.label, model=c0.model, gpu=c0.gpu, num_gpus=c0.num_gpus, gbs=c0.gbs,
                seq_len=c0.seq_len, precision=c0.precision, layout={**c0.layout, "mbs": 2 * c0.layout["mbs"]})
    assert bands.within_job_pairs([_held(c0, 1.0), _held(b, 1.0)]) == []
    assert len(bands.within_job_pairs([_held(c0, 1.0), _held(replace(b, id=c0.id), 1.0)])) == 1


@given(rhos=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=40))
def test_the_tolerance_is_the_one_sided_bound_of_the_symmetric_ratios(rhos: list[float]) -> None:
    """1 + tol bounds at least 80% of rho and 1 / rho together, so it is at least 1 (the sample is symmetric), and a
    pair predicted more than tol apart is ordered as measured in at least 80% of the pairs."""
    bands = _bands()
    pairs = [bands.Pair(("job", i % 6), "dense", r) for i, r in enumerate(rhos)]
    t = bands.tier_band(pairs, "dense")
    sym = [x for r in rhos for x in (r, 1 / r)]
    hi = 1 + t["tolerance"]
    assert t["tolerance"] >= 0
    assert sum(x <= hi + 1e-4 for x in sym) / len(sym) >= 0.8
    assert t["hi_ratio"] == pytest.approx(bands.upper_bound(sym), abs=1e-4)
    # order independence: the pairs' order and which layout is a do not matter
    flipped = [bands.Pair(p.job, p.family, 1 / p.rho) for p in reversed(pairs)]
    assert bands.tier_band(flipped, "dense")["tolerance"] == t["tolerance"]


def test_a_family_with_pairs_of_too_few_jobs_is_pooled() -> None:
    bands = _bands()
    dense = [bands.Pair(("d", j), "dense", 1.0 + 0.02 * j) for j in range(5)]
    assert bands.MIN_PAIR_JOBS == 5
    moe = [bands.Pair(("m", 0), "moe", 3.0)]  # one job: not enough for a band of its own
    t_moe = bands.tier_band(dense + moe, "moe")
    assert t_moe["pooled"] and t_moe["own_pairs"] == 1 and t_moe["pairs"] == len(dense) + 1
    t_dense = bands.tier_band(dense + moe, "dense")
    assert not t_dense["pooled"] and t_dense["pairs"] == len(dense)
    # 1/1.08 .. 1/1.02, 1, 1, 1.02 .. 1.08: rank ceil(11 x 0.8) = 9 of the 10 symmetrized ratios is 1.06
    assert t_dense["tolerance"] == pytest.approx(0.06, abs=1e-4)
