"""Memory headroom: how far below usable memory a layout's predicted peak must stay to count as fitting.

A layout fits when ``peak + margin <= usable``. The default margin is the memory model's measured
one-sided error band: the 80th percentile of ``measured / predicted - 1`` over the Megatron-LM CI golden
rows that ``benchmarks/memory.py`` scores (a layout whose peak is under-predicted by that much still fits,
because ``usable x (1 - e) <= usable / (1 + e)``). ``--headroom 5GiB``, ``--headroom 10%`` or
``--headroom 0`` (today's fit test, no margin) override it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from paraplan.errors import SpecError
from paraplan.units import GIB

MEMORY_UNDER_PREDICTION_QUANTILE = 0.8
"""The quantile of the signed memory error the default margin is (one-sided: the model's peak is at most
that far below the measured one for 80% of the rows)."""

MEMORY_UNDER_PREDICTION_P80 = 0.073
"""``measured / predicted - 1`` at the 80th percentile over the 567 Megatron-LM CI golden rows (437 dense,
130 MoE; shared/calibration/megatron_golden.csv at Megatron-LM d98e8a6) that benchmarks/memory.py scores
(torch max allocated against the predicted live bytes, i.e. without the fragmentation allowance, which the
fit check adds on top of this margin; session 6: was 0.194 when the allowance was counted as live).
Regenerate with ``python benchmarks/memory.py --headroom`` (it prints this value and its 5-fold
cross-validated held-out coverage); tests/unit/test_headroom.py checks the two agree."""

DEFAULT_SOURCE = "memory model p80 under-prediction, benchmarks/memory.py"

MAX_HEADROOM_FRAC = 0.9
"""Largest margin as a fraction of usable memory (1.0 or more would leave nothing to fit in)."""
MAX_HEADROOM_GIB = 1024.0
"""Largest margin in GiB (more than any GPU's memory)."""

_SPEC = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(gib|%)?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Headroom:
    """A memory margin: a fraction of usable memory, or a fixed size in bytes (exactly one is non-zero
    or both are zero: no margin)."""

    frac: float = 0.0
    """Margin as a fraction of usable memory."""
    bytes_: float = 0.0
    """Margin in bytes."""
    source: str = "--headroom"

    def margin_bytes(self, usable_bytes: float) -> float:
        """The margin on a GPU with ``usable_bytes`` of usable memory."""
        return self.bytes_ if self.bytes_ else self.frac * usable_bytes

    def describe(self, usable_bytes: float) -> str:
        """``margin 15.2 GiB = 19.4% of usable (memory model p80 under-prediction, ...)`` for the output."""
        margin = self.margin_bytes(usable_bytes)
        if margin == 0:
            return f"no memory margin ({self.source})"
        share = f" = {100 * self.frac:.1f}% of usable" if self.frac else ""
        return f"margin {margin / GIB:.1f} GiB{share} ({self.source})"

    def as_dict(self, usable_bytes: float) -> dict[str, float | str]:
        """JSON: the margin in bytes, as a fraction of usable memory, and where it comes from."""
        margin = self.margin_bytes(usable_bytes)
        return {"margin_bytes": margin, "margin_frac_of_usable": margin / usable_bytes if usable_bytes else 0.0,
                "fit_limit_bytes": usable_bytes - margin, "source": self.source,
                "text": self.describe(usable_bytes)}


DEFAULT_HEADROOM = Headroom(frac=MEMORY_UNDER_PREDICTION_P80, source=DEFAULT_SOURCE)
NO_HEADROOM = Headroom(source="--headroom 0")


def parse_headroom(text: str | None) -> Headroom:
    """``--headroom``: ``5GiB``, ``10%`` or ``0``; None is the default (the memory model's error band)."""
    if text is None:
        return DEFAULT_HEADROOM
    m = _SPEC.match(text)
    if m is None:
        raise SpecError(f"--headroom: expected GIB (e.g. 5GiB), PCT (e.g. 10%) or 0, got {text!r}")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if not math.isfinite(value):
        raise SpecError(f"--headroom: expected a finite size, got {text!r}")
    if value == 0:
        return NO_HEADROOM
    if unit == "%":
        if value / 100 > MAX_HEADROOM_FRAC:
            raise SpecError(f"--headroom: at most {100 * MAX_HEADROOM_FRAC:.0f}% of usable memory, got {text.strip()}")
        return Headroom(frac=value / 100, source=f"--headroom {value:g}%")
    if unit != "gib":
        raise SpecError(f"--headroom: give a unit, GiB or % (e.g. 5GiB or 10%), or 0; got {text!r}")
    if value > MAX_HEADROOM_GIB:
        raise SpecError(f"--headroom: at most {MAX_HEADROOM_GIB:.0f} GiB, got {text.strip()}")
    return Headroom(bytes_=value * GIB, source=f"--headroom {value:g}GiB")


def fit_text(peak_bytes: float, usable_bytes: float, headroom: Headroom) -> str:
    """``fits with 12.3 GiB free; margin 15.2 GiB ...``, ``inside the margin: ...`` or ``does not fit: ...``."""
    free = usable_bytes - peak_bytes
    margin = headroom.margin_bytes(usable_bytes)
    if free < 0:
        return f"does not fit: {-free / GIB:.1f} GiB over usable memory"
    if free < margin:
        return f"inside the margin: {free / GIB:.1f} GiB free, less than the {headroom.describe(usable_bytes)}"
    return f"fits with {free / GIB:.1f} GiB free; {headroom.describe(usable_bytes)}"
