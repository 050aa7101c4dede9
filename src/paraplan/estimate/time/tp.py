"""Tensor-parallel communication: the all-gathers and reduce-scatters around every attention and
MLP block, and around the output layer (Korthikanti et al. 2022, arXiv:2205.05198, section 4.2.2:
with sequence parallelism, g is an all-gather forward and a reduce-scatter backward, g-bar the
reverse; without it both are all-reduces, which cost the same two ring passes)."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import LayerLayout
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Group
from paraplan.specs.num import Num

ACTIVATION_BYTES_PER_ELEMENT: Final = 2.0
"""Activations, their gradients and the weights cross the wire in bf16 (2 bytes)."""
TP_COLLECTIVES_PER_BLOCK: Final = 4.0
"""Ring passes per attention or MLP block per micro-batch: g and g-bar forward, and again backward
(all-gather + reduce-scatter each way with SP; Korthikanti et al. 2022, figure 5)."""
OUTPUT_TP_COLLECTIVES: Final = 2.0
"""Around the output layer: the final hidden states gathered forward, their gradient scattered back."""


def collective_s(cluster: ClusterSpec, group: Group, tokens: Num, hidden: int, count: float) -> Num:
    """``count`` ring all-gathers (or reduce-scatters, the same cost) of the full bf16 activation
    tokens x h over ``group`` (``comm.all_gather_s`` at the group's ring bus bandwidth)."""
    busbw = comm.ring_busbw(cluster, group.size, group.stride)
    return count * comm.all_gather_s(ACTIVATION_BYTES_PER_ELEMENT * tokens * hidden, group.size, busbw,
                                     comm.tier_latency_s(cluster, group.span))


def block_link_s(cluster: ClusterSpec, group: Group, tokens: Num, hidden: int) -> Num:
    """TP link time of one attention or MLP block per micro-batch: ``TP_COLLECTIVES_PER_BLOCK``
    passes of 2 T h bytes (T = tokens per rank)."""
    return collective_s(cluster, group, tokens, hidden, TP_COLLECTIVES_PER_BLOCK)


def output_link_s(cluster: ClusterSpec, group: Group, tokens: Num, hidden: int) -> Num:
    """TP link time around the output layer per micro-batch: ``OUTPUT_TP_COLLECTIVES`` passes."""
    return collective_s(cluster, group, tokens, hidden, OUTPUT_TP_COLLECTIVES)


def overlap_frac(layout: LayerLayout, eff: EfficiencySpec) -> Num:
    """Share of TP communication hidden: ``tp_comm_overlap_frac`` with --tp-comm-overlap (which
    needs sequence parallelism: userbuffers overlap the SP all-gather/reduce-scatter with the
    GEMMs), else ``tp_overlap_frac``."""
    return np.where(layout.tp_comm_overlap & layout.sp, eff.tp_comm_overlap_frac, eff.tp_overlap_frac)
