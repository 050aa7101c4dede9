"""Expert-parallel communication: the token all-to-alls of the MoE dispatcher and the ETP
collectives of the expert MLP (Megatron-Core ``MoEAlltoAllTokenDispatcher``: dispatch before the
experts, combine after, each mirrored in backward)."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import StepLayout
from paraplan.estimate.time import tp
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.schedules import Schedule
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.grid import Group
from paraplan.specs.num import Int, Num

EP_ALL_TO_ALLS_PER_LAYER: Final = 4.0
"""Dispatch and combine, forward and backward."""


def all_to_all_link_s(cluster: ClusterSpec, group: Group, routed_tokens: Num, hidden: int) -> Num:
    """EP link time of one MoE layer per micro-batch: ``EP_ALL_TO_ALLS_PER_LAYER`` all-to-alls of
    the bf16 routed token copies (T k ETP/TP of them per rank) over the EP group
    (``comm.all_to_all_s``: each peer on the tier it shares with the sender)."""
    return EP_ALL_TO_ALLS_PER_LAYER * comm.all_to_all_s(
        cluster, ACTIVATION_BYTES_PER_ELEMENT * routed_tokens * hidden, group.size, group.stride,
        comm.tier_latency_s(cluster, group.span))


def etp_link_s(cluster: ClusterSpec, group: Group, routed_tokens: Num, hidden: int) -> Num:
    """ETP link time of the expert MLP per micro-batch: the TP block collectives over the routed
    tokens and the ETP group (``tp.block_link_s``); 0 at ETP = 1."""
    return np.where(group.size > 1, tp.block_link_s(cluster, group, routed_tokens, hidden), 0.0)


def exposed_s(sched: Schedule, layout: StepLayout, m: Int, ep_s: Num, compute_s: Num) -> Num:
    """Exposed expert-parallel all-to-all of a step: m * ep_s per micro-batch, unless the schedule
    overlaps it with another micro-batch's compute (combined 1F1B, DualPipe-V): then a share
    ``f = Schedule.ep_exposed_frac`` of the passes (the unpaired ones) keeps it and the paired ones
    expose only what the other micro-batch's compute does not cover: m (f e + (1 - f) max(e - c, 0))."""
    frac = sched.ep_exposed_frac(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    if isinstance(frac, float) and frac == 1.0:
        unpaired: Num = m * ep_s
        return unpaired
    mixed: Num = m * (frac * ep_s + (1.0 - frac) * np.maximum(ep_s - compute_s, 0.0))
    return mixed
