"""Megatron's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``,
``megatron/core/pipeline_parallel/schedules.py``), VP = v > 1 model chunks per rank.

Rank r: warm-up min(2(p - r - 1) + (v - 1) g, m v) chunk-forwards (g = micro-batch group size, p by
default; ``get_pp_rank_microbatches``), then one chunk-forward / one chunk-backward, then the rest.
The k-th chunk-forward runs ``get_schedule_table(m, v, g)[k]`` = (micro-batch, chunk); the k-th
chunk-backward runs the same micro-batch on chunk v - 1 - chunk.

- bubble: (p - 1) / (v m) (Narayanan et al. 2021, arXiv:2104.04473, section 2.2: each fill / drain
  hop now takes a chunk, 1/v of the rank's time);
- in flight on rank r: min(2(p - r - 1) + (v - 1) p + 1, m v) chunk-micro-batches, each 1/v of the
  rank's layers; the embedding of rank 0: the warm-up covers all v chunks of micro-batches 0..p-1 and
  then chunk 0 of the next p - 1, so min(2p - 1, m);
- p2p: 2 v m sends per step, 2 (v m + p - 1) on the critical path.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.schedules.base import (
    LAYERS_NOT_DIVISIBLE_BY_VP,
    MICROBATCHES_VS_PP_INTERLEAVED,
    VP_WITHOUT_PP,
    Count,
    Frac,
    MegatronChunks,
    Op,
    ScheduleRule,
    needs_vp,
    one_f_one_b_order,
)


def schedule_table(num_microbatches: int, vp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's ``get_schedule_table``: (micro-batch, chunk) of the k-th chunk-forward."""
    table: list[tuple[int, int]] = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table.extend((mb, chunk) for chunk in range(vp) for mb in range(lo, hi))
    return table


def interleaved_warmup(*, rank: int, pp: int, vp: int, num_microbatches: int, group: int | None = None,
                       extra: int = 0) -> int:
    """Megatron's warm-up chunk-forwards: min(2(p - r - 1) + (v - 1) g + extra, m v)."""
    g = pp if group is None else group
    return min(2 * (pp - rank - 1) + (vp - 1) * g + extra, num_microbatches * vp)


def interleaved_order(*, rank: int, pp: int, vp: int, num_microbatches: int, group: int | None = None,
                      extra: int = 0) -> list[Op]:
    """The interleaved 1F1B operations of one rank (``extra`` warm-up chunk-forwards: combined 1F1B)."""
    g = pp if group is None else group
    fwd = schedule_table(num_microbatches, vp, g)
    bwd = [(mb, vp - 1 - chunk) for mb, chunk in fwd]
    warm = interleaved_warmup(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches, group=g, extra=extra)
    return one_f_one_b_order(warmup=warm, forwards=fwd, backwards=bwd)


class Interleaved(MegatronChunks):
    """Megatron's interleaved 1F1B."""

    name: Final = "interleaved"
    title: Final = "interleaved 1F1B"
    megatron: Final = True
    launch_flags: Final[tuple[str, ...]] = ()
    rules: Final[tuple[ScheduleRule, ...]] = (
        needs_vp("interleaved", "VP > 1 (--vp 2 or more)", lambda vp: vp < 2),
        VP_WITHOUT_PP, LAYERS_NOT_DIVISIBLE_BY_VP, MICROBATCHES_VS_PP_INTERLEAVED,
    )

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (VP > 1)."""
        return vp > 1

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1) / (v m)."""
        return (pp - 1) / (vp * num_microbatches)

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(2(p - r - 1) + (v - 1) p + 1, m v) chunk-micro-batches."""
        return np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, num_microbatches * vp)

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(2p - 1, m)."""
        return np.minimum(2 * pp - 1, num_microbatches)

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """The cluster's ``pp_overlap_frac`` as calibrated (it describes this schedule)."""
        return 1.0

    def warmup(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> int:
        """Warm-up chunk-forwards (group size p)."""
        return interleaved_warmup(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """Megatron's interleaved order (group size p)."""
        return interleaved_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)
