"""Pipeline-parallel communication: activations forward and gradients backward at every chunk
boundary (Megatron-Core ``p2p_communication``), on the tier the pipeline group spans. How many
sends, how many lie on the critical path and how much is overlapped, like the bubble, is the
schedule's (``paraplan.schedules``)."""

from __future__ import annotations

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.grid import Group
from paraplan.specs.num import Int, Num


def p2p_bytes(seq_len: int, mbs: Int, cp: Int, hidden: int, sp_shard: Num) -> Num:
    """Bytes of one send: the bf16 activation of s b / c tokens x h, sharded by sequence parallelism."""
    return ACTIVATION_BYTES_PER_ELEMENT * seq_len * mbs / cp * hidden / sp_shard


def p2p_time_s(cluster: ClusterSpec, group: Group, size_bytes: Num) -> Num:
    """One send on the tier the pipeline group spans (``comm.p2p_s``)."""
    return comm.p2p_s(size_bytes, comm.tier_busbw(cluster, group.span), comm.tier_latency_s(cluster, group.span))


def link_s(pp: Int, transfers: Int, p2p_s: Num) -> Num:
    """Pipeline link time per step: the schedule's sends (``Schedule.p2p_transfers``: 2 v m for
    Megatron's schedules) x one send's time (0 without PP)."""
    return np.where(pp > 1, 1.0 * transfers * p2p_s, 0.0)


def exposed_s(pp: Int, exposed_transfers: Int, p2p_s: Num, overlap: Num) -> Num:
    """Exposed pipeline communication per step: the sends on the critical path
    (``Schedule.p2p_exposed_transfers``: 2 (v m + p - 1) for Megatron's) x one send's time x
    (1 - overlap), overlap = ``pp_overlap_frac`` x ``Schedule.p2p_overlap_scale``."""
    return np.where(pp > 1, exposed_transfers * p2p_s * (1.0 - overlap), 0.0)
