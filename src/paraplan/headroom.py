"""Memory headroom: how far below usable memory a layout's predicted peak must stay to count as fitting.

A layout fits when ``peak + margin <= usable``. The default margin comes from the memory model's measured error
band for the model's family (``paraplan.bands``, dense or MoE): the measured peak stayed at most
``predicted x hi_ratio + hi_offset`` for 80% of held-out rows, so a layout fits when that upper end is within
usable memory::

    peak x hi_ratio + hi_offset <= usable   <=>   peak <= usable - margin,
    margin = usable x (1 - 1 / hi_ratio) + hi_offset / hi_ratio

``--headroom 5GiB``, ``--headroom 10%`` or ``--headroom 0`` (no margin) override it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

from paraplan.errors import SpecError
from paraplan.units import GIB, MIB

MEMORY_UNDER_PREDICTION_QUANTILE = 0.8
"""The quantile of the signed memory error the session-5 margin was (one-sided)."""

MEMORY_UNDER_PREDICTION_P80 = 0.073
"""The session-5 default margin (0.194 then), no longer used by the planner: ``measured / predicted - 1`` at the 80th
percentile over the 567 Megatron-LM CI golden rows, as a share of usable memory (session 6: max allocated against the
predicted live bytes, without the fragmentation allowance). Most of those rows use under 5 GiB, where the
error is a constant, so a share of an 80 GB GPU overstated it; the band (``paraplan.bands``) separates the two.
``python benchmarks/memory.py --headroom`` still prints it; tests/unit/test_headroom.py checks the two agree."""

DEFAULT_SOURCE = "memory error band, paraplan.bands"

MAX_HEADROOM_FRAC = 0.9
"""Largest margin as a fraction of usable memory (1.0 or more would leave nothing to fit in)."""

_SPEC = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*(gib|%)?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Headroom:
    """A memory margin: a fraction of usable memory plus a fixed size in bytes (both zero: no margin).

    ``is_default``: the memory band's margin of the model's family, resolved by ``for_model``; unresolved (the
    family is not known), it is the larger of the families' margins."""

    frac: float = 0.0
    """Margin as a fraction of usable memory."""
    bytes_: float = 0.0
    """Margin in bytes (added to ``frac`` x usable)."""
    source: str = "--headroom"
    is_default: bool = False
    from_band: bool = False
    """The memory band's margin of a family (``band_headroom``): not a user's value, never range-checked."""

    def for_model(self, is_moe: bool) -> Headroom:
        """The margin for a dense or MoE model: the family's band margin when this is the default, else itself."""
        return band_headroom("moe" if is_moe else "dense") if self.is_default else self

    def margin_bytes(self, usable_bytes: float) -> float:
        """The margin on a GPU with ``usable_bytes`` of usable memory."""
        if self.is_default:
            return max(band_headroom(f).margin_bytes(usable_bytes) for f in ("dense", "moe"))
        return self.frac * usable_bytes + self.bytes_

    def describe(self, usable_bytes: float) -> str:
        """``margin 6.4 GiB = 7.4% of usable + 0.55 GiB (dense memory error band ...)`` for the output."""
        if self.is_default:
            return max((band_headroom(f) for f in ("dense", "moe")), key=lambda h: h.margin_bytes(usable_bytes)
                       ).describe(usable_bytes)
        margin = self.margin_bytes(usable_bytes)
        if margin == 0:
            return f"no memory margin ({self.source})"
        parts = [f"{100 * self.frac:.1f}% of usable"] if self.frac else []
        if self.frac and self.bytes_:
            parts.append(f"{self.bytes_ / GIB:.2f} GiB")
        share = f" = {' + '.join(parts)}" if parts else ""
        return f"margin {margin / GIB:.1f} GiB{share} ({self.source})"

    def check_range(self, usable_bytes: float, gpu_name: str) -> None:
        """SpecError (one line, the allowed range in GiB and % for this GPU) when the margin is over
        ``MAX_HEADROOM_FRAC`` of usable memory: nothing could fit in what is left. The memory band's margin is not
        checked (it is not the user's: on a GPU with almost no usable memory nothing fits, and the search says so)."""
        if self.is_default or self.from_band:
            return
        limit = MAX_HEADROOM_FRAC * usable_bytes
        if self.frac < 0 or self.bytes_ < 0 or not math.isfinite(self.frac + self.bytes_) \
                or self.margin_bytes(usable_bytes) > limit:
            given = self.source.removeprefix("--headroom").strip() or self.describe(usable_bytes)
            limit_gib = math.floor(100 * limit / GIB) / 100  # rounded down: a value up to the one shown is accepted
            raise SpecError(f"--headroom: allowed 0-{100 * MAX_HEADROOM_FRAC:.0f}% or 0-{limit_gib:.2f} GiB on "
                            f"{gpu_name} ({100 * MAX_HEADROOM_FRAC:.0f}% of its {usable_bytes / GIB:.2f} GiB usable "
                            f"memory), got {given!r}")

    def as_dict(self, usable_bytes: float) -> dict[str, float | str]:
        """JSON: the margin in bytes, as a fraction of usable memory, and where it comes from."""
        margin = self.margin_bytes(usable_bytes)
        return {"margin_bytes": margin, "margin_frac_of_usable": margin / usable_bytes if usable_bytes else 0.0,
                "fit_limit_bytes": usable_bytes - margin, "source": self.source,
                "text": self.describe(usable_bytes)}


@cache
def band_headroom(family: str) -> Headroom:
    """The default margin of a family: the upper end of its measured memory band (``paraplan.bands``)."""
    from paraplan.bands import band_for

    b = band_for("peak_bytes", "moe" if family == "moe" else "dense")
    hi = max(b.hi_ratio, 1.0)
    return Headroom(frac=1 - 1 / hi, bytes_=b.hi_offset / hi,
                    source=f"{b.family} memory error band: measured peak <= predicted x {b.hi_ratio:.3f} + "
                           f"{b.hi_offset / GIB:.2f} GiB for {100 * b.coverage:.0f}% of {b.rows} held-out rows, "
                           "paraplan.bands", from_band=True)


DEFAULT_HEADROOM = Headroom(source=DEFAULT_SOURCE, is_default=True)
NO_HEADROOM = Headroom(source="--headroom 0")


def parse_headroom(text: str | None) -> Headroom:
    """``--headroom``: ``5GiB``, ``10%`` or ``0``; None is the default (the memory model's error band). The range
    (at most ``MAX_HEADROOM_FRAC`` of usable memory) depends on the GPU: ``Headroom.check_range``, which ``plan`` and
    ``estimate`` call, checks it."""
    if text is None:
        return DEFAULT_HEADROOM
    m = _SPEC.match(text)
    if m is None:
        raise SpecError(f"--headroom: expected GIB (e.g. 5GiB), PCT (e.g. 10%) or 0, got {text!r}")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if not math.isfinite(value):
        raise SpecError(f"--headroom: expected a finite size, got {text!r}")
    if value == 0:
        return Headroom(source=f"--headroom {text.strip()}")  # no margin, named as typed (0, 0%, 0GiB)
    if unit == "%":
        return Headroom(frac=value / 100, source=f"--headroom {text.strip()}")  # as given (it matched _SPEC)
    if unit != "gib":
        raise SpecError(f"--headroom: give a unit, GiB or % (e.g. 5GiB or 10%), or 0; got {text!r}")
    return Headroom(bytes_=value * GIB, source=f"--headroom {text.strip()}")


def fit_text(peak_bytes: float, usable_bytes: float, headroom: Headroom) -> str:
    """``fits with 12.3 GiB free; margin 15.2 GiB ...``, ``inside the margin: ...`` or ``does not fit: ...``."""
    free = usable_bytes - peak_bytes
    margin = headroom.margin_bytes(usable_bytes)
    if free < 0:
        return f"does not fit: {_size(-free)} over usable memory"
    if free < margin:
        return f"inside the margin: {_size(free)} free, less than the {headroom.describe(usable_bytes)}"
    return f"fits with {_size(free)} free; {headroom.describe(usable_bytes)}"


def _size(num_bytes: float) -> str:
    """GiB to one decimal; MiB under 0.05 GiB (which would print as 0.0 GiB)."""
    return f"{num_bytes / MIB:.0f} MiB" if num_bytes < 0.05 * GIB else f"{num_bytes / GIB:.1f} GiB"
