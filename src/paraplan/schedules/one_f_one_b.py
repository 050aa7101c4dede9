"""Megatron's 1F1B (``forward_backward_pipelining_without_interleaving``,
``megatron/core/pipeline_parallel/schedules.py``), VP = 1.

Rank r of p, m micro-batches: warm-up min(p - r - 1, m) forwards, then one forward / one backward,
then the remaining backwards (``get_pp_rank_microbatches``).

- bubble: (p - 1) / m of the ideal time m * t (Narayanan et al. 2021, arXiv:2104.04473, section 2.2:
  the first rank waits (p - 1) forwards at the start and (p - 1) backwards at the end);
- in flight on rank r: min(p - r, m) micro-batches (warm-up, plus the one in progress); the embedding
  of rank 0: min(p, m);
- p2p: one activation send and one gradient send per micro-batch, 2m per step; m + p - 1 of each on
  the critical path.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.schedules.base import (
    Count,
    Frac,
    MegatronChunks,
    Op,
    ScheduleRule,
    needs_vp,
    one_f_one_b_order,
)


class OneFOneB(MegatronChunks):
    """Megatron's non-interleaved 1F1B."""

    name: Final = "1f1b"
    title: Final = "1F1B"
    megatron: Final = True
    launch_flags: Final[tuple[str, ...]] = ()
    rules: Final[tuple[ScheduleRule, ...]] = (needs_vp("1f1b", "VP 1 (no interleaving)", lambda vp: vp != 1),)

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (VP 1)."""
        return vp == 1

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1) / m."""
        return (pp - 1) / num_microbatches

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(p - r, m)."""
        return np.minimum(pp - rank, num_microbatches)

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(p, m)."""
        return np.minimum(pp, num_microbatches)

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """Half the interleaved schedule's hidden share (warm-up and cool-down sends block)."""
        return 0.5

    def warmup(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> int:
        """Forwards before the first backward: min(p - r - 1, m)."""
        return min(pp - rank - 1, num_microbatches)

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """Warm-up forwards, 1F1B, cool-down backwards."""
        fwd = [(mb, 0) for mb in range(num_microbatches)]
        return one_f_one_b_order(warmup=self.warmup(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches),
                                 forwards=fwd, backwards=fwd)
