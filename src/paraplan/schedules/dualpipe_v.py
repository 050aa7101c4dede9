"""DualPipe-V (DeepSeek-AI 2024, DeepSeek-V3 technical report arXiv:2412.19437 section 3.2.1, and
the ``dualpipev.py`` "cut-in-half" schedule of github.com/deepseek-ai/DualPipe) -- a what-if:
not in Megatron-LM (torch.distributed.pipelining ships ``ScheduleDualPipeV``).

p ranks hold 2p stages in a V: rank r holds stage r (chunk 0) and stage 2p - 1 - r (chunk 1), so
rank 0 holds the embedding and the output layer / loss. Forward chunks of one micro-batch run
overlapped with backward chunks of another (F&B), and weight gradients (W) fill the bubbles.
The DualPipe README's table, for PP = 2p stages on p devices:

    bubble     = (PP/2 - 1)(F&B + B - 3W)      F, B, W: one chunk's forward, whole backward and
                                               weight-gradient time; F&B: an overlapped pair
    activation = PP + 1 chunk-micro-batches per device

With F&B = F + B (the pair's compute does not shrink; what the overlap hides is the all-to-all,
credited in ``ep_exposed_frac``) and a chunk being half a rank's layers (F = f t / 2, B = b t / 2,
W = w t / 2 with f = 1/3, b = 2/3, w = 1/3 of a micro-batch's time t):

    bubble / (m t) = (p - 1)(f + 2b - 3w) / (2 m) = (p - 1) / (3 m)     (as ZB-H1)
    in flight      = 2p + 1 chunk units on every rank = p + 1/2 micro-batches of the rank's layers
                     (``dualpipev.py`` steps 1-2 run 2(p - r - 1) + 2(r + 1) = 2p chunk-forwards
                     before the first backward; the first overlapped F&B holds one more)

Rules: VP = 2 (the two arms of the V), PP > 1 and m >= 2 PP (``DualPipeV.step`` asserts
``num_chunks >= num_ranks * 2``). Parameters per rank are those of its 2 stages (1F1B's per rank).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.schedules.base import (
    BACKWARD_SHARE,
    FORWARD_SHARE,
    LAYERS_NOT_DIVISIBLE_BY_VP,
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
HOP_SHARE: Final = (FORWARD_SHARE + 2.0 * _B - 3.0 * _W) / 2.0
"""(F&B + B - 3W) of a chunk relative to a micro-batch's time on a rank (1/3)."""


class DualPipeV(MegatronChunks):
    """DualPipe-V: the V-shaped, cut-in-half DualPipe (what-if)."""

    name: Final = "dualpipe-v"
    title: Final = "DualPipe-V"
    megatron: Final = False
    launch_flags: Final[tuple[str, ...]] = ()
    rules: Final[tuple[ScheduleRule, ...]] = (
        needs_vp("dualpipe-v", "VP 2 (the two arms of the V)", lambda vp: vp != 2),
        LAYERS_NOT_DIVISIBLE_BY_VP,
        *pp_rules("dualpipe-v", min_microbatches_per_rank=2),
    )

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (VP 2)."""
        return vp == 2

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1)(F&B + B - 3W) / (m (F + B)) = (p - 1) / (3 m)."""
        return (pp - 1) * HOP_SHARE / num_microbatches

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(2p + 1, 2m) chunk units on every rank."""
        return np.minimum(2 * pp + 1 + 0 * rank, vp * num_microbatches)

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(2p, m): rank 0 runs 2p - 1 chunk-0 forwards in steps 1-2 and one more in the first F&B
        before its first chunk-0 backward."""
        return np.minimum(2 * pp, num_microbatches)

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """As interleaved (DualPipe overlaps sends with the paired chunk)."""
        return 1.0

    def ep_exposed_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """Unpaired chunk passes: of rank 0's 2m chunk-forwards, 2p - 1 (steps 1-2) run before the first F&B
        pair; as many backwards run unpaired at the end: (2p - 1) / (2m)."""
        return np.minimum((2 * pp - 1) / (vp * num_microbatches), 1.0)

    def output_rank(self, pp: Count) -> Count:
        """Rank 0 (its chunk 1 is stage 2p - 1)."""
        return 0 * pp

    def virtual_stage(self, *, rank: int, chunk: int, pp: int) -> int:
        """Chunk 0 of rank r is stage r, chunk 1 is stage 2p - 1 - r."""
        return rank if chunk == 0 else 2 * pp - 1 - rank

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """``DualPipeV.step`` (dualpipev.py), steps 1-8; an F&B pair is F then B (``paired_ops``)."""
        return dualpipe_v_order(rank=rank, pp=pp, num_microbatches=num_microbatches)[0]

    def paired_ops(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> frozenset[int]:
        """Positions i in ``rank_order`` where ops i and i + 1 are an overlapped F&B pair
        (``_forward_backward_chunk``: both inputs are received before either runs)."""
        return dualpipe_v_order(rank=rank, pp=pp, num_microbatches=num_microbatches)[1]


def dualpipe_v_order(*, rank: int, pp: int, num_microbatches: int) -> tuple[list[Op], frozenset[int]]:
    """The operations of ``DualPipeV.step`` on one rank (F/B/I/W with chunk 0 or 1; zero-bubble
    backwards, ``enable_zb``, are I passes whose W is queued first in, first out) and the positions
    of its overlapped F&B pairs."""
    p, r, m = pp, rank, num_microbatches
    ops: list[Op] = []
    pairs: set[int] = set()
    nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}
    queue: list[tuple[int, int]] = []

    def fwd(c: int) -> None:
        ops.append(("F", nxt[("F", c)], c))
        nxt[("F", c)] += 1

    def bwd(c: int, zb: bool = False) -> None:
        mb = nxt[("B", c)]
        nxt[("B", c)] += 1
        ops.append(("I" if zb else "B", mb, c))
        if zb:
            queue.append((mb, c))

    def wgt() -> None:
        mb, c = queue.pop(0)
        ops.append(("W", mb, c))

    for _ in range(2 * (p - r - 1)):  # step 1: nF0
        fwd(0)
    for _ in range(r + 1):  # step 2: nF0F1
        fwd(0)
        fwd(1)
    for _ in range(p - r - 1):  # step 3: nB1W1F1 (zero bubble)
        bwd(1, zb=True)
        wgt()
        fwd(1)
    for i in range(m - 2 * p + r + 1):  # step 4: nF0B1F1B0
        if not (i == 0 and r == p - 1):  # the last rank's first F0 / B1 are not overlapped
            pairs.add(len(ops))
        fwd(0)
        bwd(1)
        pairs.add(len(ops))
        fwd(1)
        bwd(0)
    for _ in range(p - r - 1):  # step 5: nB1F1B0
        bwd(1)
        pairs.add(len(ops))
        fwd(1)
        bwd(0)
    half = (r + 1) // 2
    for i in range(r + 1):  # step 6: nB1B0, the second half zero bubble (odd ranks from B1, even from B0)
        bwd(1, zb=i > half or (i == half and r % 2 == 1))
        bwd(0, zb=i >= half)
    for _ in range(p - r - 1):  # step 7: nWB0 (zero bubble)
        wgt()
        bwd(0, zb=True)
    for _ in range(r + 1):  # step 8: nW
        wgt()
    assert not queue, queue
    return ops, frozenset(pairs)
