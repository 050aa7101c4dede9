"""Zero-bubble ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241,
section 3.1) -- a what-if: not in Megatron-LM (torch.distributed.pipelining ships
``ScheduleInterleavedZeroBubble`` / ``ScheduleZBVZeroBubble``, which torchtitan uses).

The backward splits into B (input gradient, on the critical path) and W (weight gradient, needed
only by the optimizer). ZB-H1 keeps 1F1B's order and warm-up but defers each rank's W passes into
the slots where 1F1B would wait, so the fill / drain hop costs F + B - W instead of F + B + W:

    bubble = (p - 1) (T_F + T_B - T_W)                 (Qi et al. 2024, section 3.1)
           = (p - 1) (F + B - 2W)                      (DeepSeek-V3 report / DualPipe README notation,
                                                        B = the whole backward, B_input + W)

Relative to the ideal m (F + B) with F = 1/3, B = 2/3, W = B / 2 = 1/3 of a micro-batch's
forward + backward (``FORWARD_SHARE``, ``WGRAD_SHARE_OF_BACKWARD``): (p - 1) / (3 m), a third
of 1F1B's. Peak activations: Qi et al. give ZB-H1 "the same peak memory as 1F1B", p M_B, the peak over
ranks. Per rank it is higher than 1F1B's p - r: rank r defers r weight-gradient passes, whose
saved inputs stay until W runs, so every rank holds min(p, m) micro-batches (``zb_h1_order``).

VP = 1 (ZB-H1 is a 1F1B variant; the V-shaped zero-bubble schedules are ``dualpipe-v``'s family),
PP > 1 and m >= PP (the formula's steady state).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.schedules.base import (
    BACKWARD_SHARE,
    FORWARD_SHARE,
    WGRAD_SHARE,
    Count,
    Frac,
    MegatronChunks,
    Op,
    ScheduleRule,
    needs_vp,
    pp_rules,
)

_B: Final = BACKWARD_SHARE
_W: Final = WGRAD_SHARE
HOP_SHARE: Final = FORWARD_SHARE + _B - 2.0 * _W
"""(F + B - 2W) / (F + B): one fill / drain hop of ZB-H1 relative to a micro-batch's time (1/3)."""


class ZeroBubbleH1(MegatronChunks):
    """ZB-H1: 1F1B with the weight-gradient passes deferred into the bubbles (what-if)."""

    name: Final = "zb-h1"
    title: Final = "zero-bubble ZB-H1"
    megatron: Final = False
    launch_flags: Final[tuple[str, ...]] = ()
    rules: Final[tuple[ScheduleRule, ...]] = (
        needs_vp("zb-h1", "VP 1 (ZB-H1 is a 1F1B variant)", lambda vp: vp != 1),
        *pp_rules("zb-h1", min_microbatches_per_rank=1),
    )

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (VP 1)."""
        return vp == 1

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1) (F + B - 2W) / (m (F + B)) = (p - 1) / (3 m)."""
        return (pp - 1) * HOP_SHARE / num_microbatches

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(p, m) on every rank (1F1B's p - r plus the r deferred W passes)."""
        return np.minimum(pp + 0 * rank, num_microbatches)

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(p, m)."""
        return np.minimum(pp, num_microbatches)

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """As 1F1B."""
        return 0.5

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """1F1B's warm-up and steady state with B split into I (input gradient) and W (weight gradient)."""
        return zb_h1_order(rank=rank, pp=pp, num_microbatches=num_microbatches)


def zb_h1_order(*, rank: int, pp: int, num_microbatches: int) -> list[Op]:
    """ZB-H1 on rank r: warm-up min(p - r - 1, m) forwards; steady F, I, and the oldest pending W
    once more than r W are pending (rank r holds p - r micro-batches in 1F1B, so deferring r keeps
    the peak at p); cool-down I then W while pending; the last W at the end."""
    m = num_microbatches
    warm = min(pp - rank - 1, m)
    defer = rank
    ops: list[Op] = [("F", k, 0) for k in range(warm)]
    pending: list[int] = []
    for k in range(m - warm):
        ops.append(("F", warm + k, 0))
        ops.append(("I", k, 0))
        pending.append(k)
        if len(pending) > defer:
            ops.append(("W", pending.pop(0), 0))
    for k in range(m - warm, m):
        ops.append(("I", k, 0))
        pending.append(k)
        if len(pending) > defer:
            ops.append(("W", pending.pop(0), 0))
    ops += [("W", k, 0) for k in pending]
    return ops
