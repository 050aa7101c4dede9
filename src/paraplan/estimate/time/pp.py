"""Pipeline-parallel communication: activations forward and gradients backward at every chunk
boundary (Megatron-Core ``p2p_communication``), on the tier the pipeline group spans. The bubble
is the schedule's (``paraplan.estimate.pipeline``)."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Group
from paraplan.specs.num import Int, Num

SENDS_PER_CHUNK: Final = 2.0
"""Per micro-batch and model chunk: the activation forward and its gradient backward."""
NON_INTERLEAVED_OVERLAP_SHARE: Final = 0.5
"""Without interleaving half of ``pp_overlap_frac`` is hidden (docs/model.md section 4): 1F1B has no
other chunk's compute to hide a send behind. A modelling assumption calibrated together with
``pp_overlap_frac``, not a measured figure."""


def p2p_bytes(seq_len: int, mbs: Int, cp: Int, hidden: int, sp_shard: Num) -> Num:
    """Bytes of one send: the bf16 activation of s b / c tokens x h, sharded by sequence parallelism."""
    return ACTIVATION_BYTES_PER_ELEMENT * seq_len * mbs / cp * hidden / sp_shard


def p2p_time_s(cluster: ClusterSpec, group: Group, size_bytes: Num) -> Num:
    """One send on the tier the pipeline group spans (``comm.p2p_s``)."""
    return comm.p2p_s(size_bytes, comm.tier_busbw(cluster, group.span), comm.tier_latency_s(cluster, group.span))


def link_s(pp: Int, vp: Int, num_microbatches: Num, p2p_s: Num) -> Num:
    """Pipeline link time per step: ``SENDS_PER_CHUNK`` x v x m sends (0 without PP)."""
    return np.where(pp > 1, SENDS_PER_CHUNK * vp * num_microbatches * p2p_s, 0.0)


def exposed_s(pp: Int, vp: Int, num_microbatches: Num, p2p_s: Num, eff: EfficiencySpec) -> Num:
    """Exposed pipeline communication per step: (v m + p - 1) x ``SENDS_PER_CHUNK`` sends (the
    steady state plus the p - 1 warm-up steps) x (1 - overlap), overlap = ``pp_overlap_frac``
    with interleaving, ``NON_INTERLEAVED_OVERLAP_SHARE`` of it without."""
    overlap = np.where(vp > 1, eff.pp_overlap_frac, eff.pp_overlap_frac * NON_INTERLEAVED_OVERLAP_SHARE)
    return np.where(pp > 1, (vp * num_microbatches + pp - 1) * SENDS_PER_CHUNK * p2p_s * (1.0 - overlap), 0.0)
