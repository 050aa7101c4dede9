"""Pipeline schedules: one class per schedule behind the ``Schedule`` protocol (``base``).

Megatron-LM runs ``1f1b``, ``interleaved`` and ``combined_1f1b``; ``zb-h1`` and ``dualpipe-v`` are
what-ifs, flagged "not in Megatron-LM" wherever they appear. A layout's ``schedule`` field names
one; "" is Megatron's own choice from VP (1F1B at VP 1, interleaved above), ``MegatronChoice``.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.errors import SpecError
from paraplan.schedules.base import (
    LAYERS_NOT_DIVISIBLE_BY_VP,
    MICROBATCHES_VS_PP_INTERLEAVED,
    NOT_IN_MEGATRON,
    VP_WITHOUT_PP,
    Count,
    Frac,
    MegatronChunks,
    Op,
    Schedule,
    ScheduleRule,
)
from paraplan.schedules.combined_1f1b import Combined1F1B
from paraplan.schedules.dualpipe_v import DualPipeV
from paraplan.schedules.interleaved import Interleaved
from paraplan.schedules.one_f_one_b import OneFOneB
from paraplan.schedules.zb_h1 import ZeroBubbleH1

__all__ = [
    "NOT_IN_MEGATRON",
    "SCHEDULES",
    "SCHEDULE_NAMES",
    "Combined1F1B",
    "DualPipeV",
    "Interleaved",
    "MegatronChoice",
    "OneFOneB",
    "Schedule",
    "ScheduleRule",
    "ZeroBubbleH1",
    "schedule_label",
    "schedule_named",
    "schedule_of",
]

_ONE: Final = OneFOneB()
_INTER: Final = Interleaved()


class MegatronChoice(MegatronChunks):
    """What Megatron-LM runs without a schedule flag: 1F1B at VP 1, interleaved 1F1B at VP > 1
    (``get_forward_backward_func``), row by row."""

    name: Final = ""
    title: Final = "1F1B / interleaved 1F1B (from VP)"
    megatron: Final = True
    launch_flags: Final[tuple[str, ...]] = ()
    rules: Final[tuple[ScheduleRule, ...]] = (VP_WITHOUT_PP, LAYERS_NOT_DIVISIBLE_BY_VP, MICROBATCHES_VS_PP_INTERLEAVED)

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (any VP)."""
        return True

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1) / (v m): 1F1B's (p - 1) / m at v = 1."""
        return (pp - 1) / (vp * num_microbatches)

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """1F1B's or interleaved's count, by VP."""
        return np.where(vp > 1, _INTER.in_flight_units(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches),
                        _ONE.in_flight_units(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches))

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """1F1B's min(p, m) or interleaved's min(2p - 1, m), by VP."""
        return np.where(vp > 1, _INTER.first_chunk_in_flight(pp=pp, vp=vp, num_microbatches=num_microbatches),
                        _ONE.first_chunk_in_flight(pp=pp, vp=vp, num_microbatches=num_microbatches))

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """1 interleaved, 0.5 for 1F1B."""
        return np.where(vp > 1, 1.0, 0.5)

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """1F1B's order at VP 1, interleaved's above."""
        sched = _INTER if vp > 1 else _ONE
        return sched.rank_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)


_DEFAULT: Final = MegatronChoice()

SCHEDULES: Final[dict[str, Schedule]] = {
    s.name: s for s in (_ONE, _INTER, Combined1F1B(), ZeroBubbleH1(), DualPipeV())
}
"""Every named schedule, by its CLI name."""

SCHEDULE_NAMES: Final = tuple(SCHEDULES)
"""``plan --schedule`` choices."""


def schedule_named(name: str) -> Schedule:
    """The schedule called ``name`` ("" = Megatron's choice from VP); SpecError for an unknown name."""
    if not name:
        return _DEFAULT
    try:
        return SCHEDULES[name]
    except KeyError:
        raise SpecError(f"schedule: unknown {name!r}; allowed: {', '.join(SCHEDULE_NAMES)}") from None


def schedule_of(layout: object) -> Schedule:
    """The schedule of a layout or layout table (its ``schedule`` field)."""
    return schedule_named(str(getattr(layout, "schedule", "")))


def schedule_label(name: str, vp: int = 1) -> str:
    """How outputs name a schedule: its title, plus "(not in Megatron-LM)" for a what-if."""
    sched = schedule_named(name)
    if not name:
        return "1F1B" if vp == 1 else f"interleaved 1F1B (VP {vp})"
    return sched.title if sched.megatron else f"{sched.title} ({NOT_IN_MEGATRON})"
