"""Measured error bands (issue 18, "Say how sure we are"): paraplan.bands and its packaged file.

The file is written by benchmarks/bands.py from ../shared/calibration; the tests that rebuild it skip without it.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import pytest

from paraplan.bands import FAMILIES, QUANTITIES, Band, band_for, packaged, value_range

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "calibration"
needs_shared = pytest.mark.skipif(not (SHARED / "megatron_golden.csv").exists()
                                  or not (SHARED / "published_runs.csv").exists(),
                                  reason="needs ../shared/calibration")


def _bands_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return pytest.importorskip("bands")


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_band_is_packaged_and_brackets_one(quantity: str, family: str) -> None:
    b = band_for(quantity, family)  # type: ignore[arg-type]
    assert (b.quantity, b.family) == (quantity, family)
    assert 0 < b.lo_ratio <= b.hi_ratio
    assert b.rows > 0 and 0 < b.coverage <= 1 and b.method
    assert b.lo_offset >= 0 and b.hi_offset >= 0


def test_packaged_file_states_method_rows_and_date() -> None:
    data = packaged()
    assert data["generator"] == "python benchmarks/bands.py"
    assert data["built"][:4].isdigit() and data["target_coverage"] == 0.8
    keys = {"quantity", "family", "lo_ratio", "hi_ratio", "lo_offset", "hi_offset", "coverage", "rows", "method"}
    assert all(keys <= set(b) for b in data["bands"])
    assert {(b["quantity"], b["family"]) for b in data["bands"]} == {(q, f) for q in QUANTITIES for f in FAMILIES}
    text = resources.files("paraplan").joinpath("bands.json").read_text(encoding="utf-8")
    assert json.loads(text) == data


def test_value_range_relative_and_inverse() -> None:
    b = Band("step_s", "dense", 0.9, 1.2, 0.8, 10, "test")
    assert value_range(10.0, b) == pytest.approx((9.0, 12.0))
    lo, hi = value_range(1000.0, b, inverse=True)  # throughput: 1000 / 1.2 .. 1000 / 0.9
    assert (lo, hi) == pytest.approx((1000 / 1.2, 1000 / 0.9))
    assert lo <= 1000.0 <= hi


def test_value_range_with_offsets_never_below_zero() -> None:
    b = Band("peak_bytes", "dense", 0.95, 1.05, 0.8, 10, "test", lo_offset=2.0, hi_offset=1.0)
    assert value_range(100.0, b) == pytest.approx((93.0, 106.0))
    assert value_range(1.0, b)[0] == 0.0
    with pytest.raises(ValueError, match="purely relative"):
        value_range(100.0, b, inverse=True)


def test_band_for_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="quantity must be one of"):
        band_for("tokens", "dense")  # type: ignore[arg-type]


def test_conformal_interval_covers_at_least_the_target() -> None:
    bands = _bands_module()
    xs = [float(i) for i in range(1, 100)]  # n = 99: ranks floor(100 x 0.1) = 10 and ceil(100 x 0.9) = 90
    assert bands.conformal_interval(xs, 0.8) == (10.0, 90.0)
    assert sum(10.0 <= x <= 90.0 for x in xs) / len(xs) >= 0.8


def test_folds_are_seeded_and_balanced() -> None:
    bands = _bands_module()
    f = bands.fold_ids(23, 5, 18)
    assert f == bands.fold_ids(23, 5, 18) and f != bands.fold_ids(23, 5, 19)
    sizes = [f.count(k) for k in range(5)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 23


@needs_shared
def test_packaged_file_is_what_the_script_writes() -> None:
    bands = _bands_module()
    fresh = bands.build()
    assert bands.same_but_date(packaged(), fresh), "src/paraplan/bands.json is stale: run python benchmarks/bands.py"


@needs_shared
def test_bands_cover_80_percent_of_held_out_rows() -> None:
    for b in packaged()["bands"]:
        assert b["coverage"] >= 0.8, f"{b['quantity']}/{b['family']}: held-out coverage {b['coverage']:.3f} < 0.8"
