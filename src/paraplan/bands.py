"""Measured error bands: how far the measured value of a quantity lay from paraplan's prediction on held-out runs.

A :class:`Band` says: for ``coverage`` of the held-out rows of its family (dense or MoE), the measured value
lay within ``[predicted x lo_ratio - lo_offset, predicted x hi_ratio + hi_offset]``. The ratios are
``measured / predicted``; the offsets are in the quantity's unit (bytes for ``peak_bytes``, seconds for
``step_s``) and are zero for a purely relative band. The numbers are packaged data (``bands.json`` next to this
module), written from ../shared/calibration by ``python benchmarks/bands.py`` (method, row counts and the date
are in the file; ``tests/unit/test_bands.py`` fails when the file is stale). The file is read once, on first use.

A :class:`TierBand` (the file's ``tiers``) is the within-job band of two layouts' error ratio that
``paraplan.ranking.tier_tolerance`` uses: how far apart two layouts of one job must be predicted for the model's order
to hold in 80% of held-out pairs. Files written before it have no ``tiers``: ``tier_band_for`` then returns None.

Throughput is inversely proportional to step time (tokens per step are fixed), so its range is step time's
range inverted: ``value_range(tokens_per_s, band_for("step_s", family), inverse=True)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal, get_args

from paraplan.units import GIB

Quantity = Literal["peak_bytes", "step_s"]
Family = Literal["dense", "moe"]
QUANTITIES: tuple[str, ...] = get_args(Quantity)
FAMILIES: tuple[str, ...] = get_args(Family)
PACKAGED_NAME = "bands.json"
REGENERATE = "python benchmarks/bands.py"


@dataclass(frozen=True, slots=True)
class Band:
    """The interval of ``measured / predicted`` that held for ``coverage`` of ``rows`` held-out rows."""

    quantity: str
    """``peak_bytes`` (peak memory per GPU) or ``step_s`` (step time)."""
    family: str
    """``dense`` or ``moe``."""
    lo_ratio: float
    """Lower end of measured / predicted (<= 1 when the model can over-predict)."""
    hi_ratio: float
    """Upper end of measured / predicted."""
    coverage: float
    """Share of held-out rows whose measured value lay inside the band (each row judged by a band built
    without it)."""
    rows: int
    """Held-out rows the band and its coverage were measured on."""
    method: str
    """How the band was made (cross-validation scheme, data, quantile), one line."""
    lo_offset: float = 0.0
    """Constant subtracted from the lower end, in the quantity's unit (bytes or seconds); 0 for a relative band."""
    hi_offset: float = 0.0
    """Constant added to the upper end, in the quantity's unit; 0 for a relative band."""

    def as_dict(self) -> dict[str, Any]:
        """JSON: every field."""
        return {"quantity": self.quantity, "family": self.family, "lo_ratio": self.lo_ratio,
                "hi_ratio": self.hi_ratio, "lo_offset": self.lo_offset, "hi_offset": self.hi_offset,
                "coverage": self.coverage, "rows": self.rows, "method": self.method}

    def describe(self) -> str:
        """``-8% / +19% (80% of 567 held-out rows)`` for the output; an offset goes with its end, a zero one is left
        out: ``-7% - 0.033 GiB / +8% + 0.26 GiB (...)``."""
        lo, hi = 100 * (self.lo_ratio - 1), 100 * (self.hi_ratio - 1)
        unit, scale = ("GiB", GIB) if self.quantity == "peak_bytes" else ("s", 1.0)
        lo_text = f"{lo:+.0f}%" + (f" - {self.lo_offset / scale:.2g} {unit}" if self.lo_offset else "")
        hi_text = f"{hi:+.0f}%" + (f" + {self.hi_offset / scale:.2g} {unit}" if self.hi_offset else "")
        return f"{lo_text} / {hi_text} ({100 * self.coverage:.0f}% of {self.rows} held-out rows)"


def value_range(value: float, band: Band, *, inverse: bool = False) -> tuple[float, float]:
    """``(lo, hi)`` around a predicted ``value``: ``value x lo_ratio - lo_offset`` to ``value x hi_ratio + hi_offset``
    (the low end at least 0).

    ``inverse=True`` is for a quantity inversely proportional to the band's (throughput = tokens per step /
    step time): ``value / hi_ratio`` to ``value / lo_ratio``. The band must then be purely relative (offsets 0),
    since the step time an offset would apply to is not known from ``value``.
    """
    if inverse:
        if band.lo_offset or band.hi_offset:
            raise ValueError("value_range(inverse=True) needs a purely relative band (offsets 0)")
        return value / band.hi_ratio, (value / band.lo_ratio if band.lo_ratio > 0 else float("inf"))
    return max(0.0, value * band.lo_ratio - band.lo_offset), value * band.hi_ratio + band.hi_offset


@cache
def packaged() -> dict[str, Any]:
    """The packaged band file (read on first use)."""
    text = resources.files("paraplan").joinpath(PACKAGED_NAME).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@cache
def band_for(quantity: Quantity, family: Family) -> Band:
    """The packaged band of ``quantity`` (``peak_bytes`` or ``step_s``) for a ``dense`` or ``moe`` model."""
    if quantity not in QUANTITIES or family not in FAMILIES:
        raise ValueError(f"band_for: quantity must be one of {', '.join(QUANTITIES)} and family one of "
                         f"{', '.join(FAMILIES)}; got {quantity!r}, {family!r}")
    for b in packaged()["bands"]:
        if b["quantity"] == quantity and b["family"] == family:
            return Band(quantity=quantity, family=family, lo_ratio=float(b["lo_ratio"]),
                        hi_ratio=float(b["hi_ratio"]), coverage=float(b["coverage"]), rows=int(b["rows"]),
                        method=str(b["method"]), lo_offset=float(b.get("lo_offset", 0.0)),
                        hi_offset=float(b.get("hi_offset", 0.0)))
    raise ValueError(f"{PACKAGED_NAME} has no band for {quantity}/{family}: regenerate it with {REGENERATE}")


@dataclass(frozen=True, slots=True)
class TierBand:
    """The within-job band of a family: for ``coverage`` of held-out pairs of layouts of one job, the ratio of their
    error ratios (predicted / measured step of b over that of a) was at most ``1 + tolerance`` (benchmarks/bands.py
    ``tier_band``)."""

    family: str
    tolerance: float
    """Relative step-time difference the model cannot order at 80%: the one-sided 80% bound of the ratio, minus 1."""
    pairs: int
    """Pairs of held-out rows the bound was taken from."""
    jobs: int
    """Jobs (model, GPU, count, sequence, GBS, precision, source) those pairs come from."""
    pooled: bool
    """True when the family had pairs of too few jobs and all families' pairs were used."""
    coverage: float
    """Leave-one-job-out coverage of the bound."""

    def describe(self) -> str:
        """``the within-job band measured on 411 held-out pairs of 20 jobs``, for the output."""
        pooled = f" (no {self.family} pairs of its own: all families')" if self.pooled else ""
        return f"the within-job band measured on {self.pairs} held-out pairs of {self.jobs} jobs{pooled}"


@cache
def tier_band_for(family: Family) -> TierBand | None:
    """The packaged within-job band of a ``dense`` or ``moe`` model; None when the file has none (written before it)."""
    if family not in FAMILIES:
        raise ValueError(f"tier_band_for: family must be one of {', '.join(FAMILIES)}; got {family!r}")
    t = packaged().get("tiers", {}).get(family)
    if not isinstance(t, dict) or not 0 <= float(t.get("tolerance", -1)) < 1:
        return None
    return TierBand(family=family, tolerance=float(t["tolerance"]), pairs=int(t["pairs"]), jobs=int(t["jobs"]),
                    pooled=bool(t["pooled"]), coverage=float(t["coverage"]))


def family_of(is_moe: bool) -> Family:
    """``moe`` for a mixture-of-experts model, else ``dense``."""
    return "moe" if is_moe else "dense"
