"""Context-parallel communication: the ring exchange of K and V blocks around attention
(Transformer Engine ``AttnFuncWithCPAndKVP2P``, the p2p ring Megatron's ``--cp-comm-type p2p``
selects: each of the c-1 steps sends the local K,V block to the next rank forward, and K,V plus
their gradients backward)."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Group
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num

CP_RING_PASSES: Final = 3.0
"""Ring passes of the K,V block per layer per micro-batch: 1 forward, 2 backward (K,V and dK,dV)."""
KV_TENSORS: Final = 2
"""K and V."""


def kv_block_bytes(model: ModelSpec, tokens: Num, tp: Int, kv_width: Num) -> Num:
    """Bytes of the local K,V block one CP step sends: bf16 K and V over T tokens, ``kv_width``
    (heads x head dim, query groups replicated up to TP) divided by TP; MLA sends its
    decompressed per-head K (qk + rope dims) and V."""
    if model.multi_latent_attention:
        a = model.num_attention_heads
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        return ACTIVATION_BYTES_PER_ELEMENT * tokens * a * (dq + model.v_head_dim) / tp
    return KV_TENSORS * ACTIVATION_BYTES_PER_ELEMENT * tokens * kv_width / tp


def ring_link_s(cluster: ClusterSpec, group: Group, kv_bytes: Num) -> Num:
    """CP link time of one layer per micro-batch: ``CP_RING_PASSES`` x (c - 1) sends of the K,V
    block on the tier the CP group spans (0 without CP)."""
    bw = comm.tier_busbw(cluster, group.span)
    link = CP_RING_PASSES * (group.size - 1) * comm.p2p_s(kv_bytes, bw, comm.tier_latency_s(cluster, group.span))
    return np.where(group.size > 1, link, 0.0)


def exposed_s(link_s: Num, attention_s: Num, eff: EfficiencySpec) -> Num:
    """The ring exchange beyond what attention hides: max(link - ``cp_overlap_frac`` x attention
    forward + backward time, 0)."""
    return np.maximum(link_s - eff.cp_overlap_frac * attention_s, 0.0)
