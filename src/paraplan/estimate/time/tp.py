"""Tensor-parallel communication: the all-gathers and reduce-scatters around every attention and
MLP block, and around the output layer (Korthikanti et al. 2022, arXiv:2205.05198, section 4.2.2:
with sequence parallelism, g is an all-gather forward and a reduce-scatter backward, g-bar the
reverse; without it both are all-reduces, which cost the same two ring passes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import LayerLayout
from paraplan.estimate.time.compute import gemm_s, sm_count_of
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
    """Share of the TP communication hidden outside the userbuffers pairs (``block_exposure``): ``tp_overlap_frac``
    (the output layer's all-gather / reduce-scatter, and every block without --tp-comm-overlap)."""
    return np.zeros_like(np.asarray(layout.tp, dtype=float)) + eff.tp_overlap_frac


# --- userbuffers (--tp-comm-overlap): Transformer Engine's GEMM / collective pairs, per GEMM -----------------
UB_COMM_SMS: Final = 16
"""SMs a pipelined or bulk userbuffers kernel takes (TE transformer_engine/pytorch/module/base.py
``initialize_ub`` ``get_default_config``: ``num_sm`` 16 for "pipeline" and "bulk", 1 for "ring_exchange", which
moves its chunks with the copy engine); what Megatron-LM's ``--tp-comm-overlap`` without ``--tp-comm-overlap-cfg``
runs."""
UB_PIPELINE_SPLITS: Final = 4
"""Chunks of a pipelined GEMM + reduce-scatter (``get_default_config``: ``num_splits`` 4 for "pipeline"; a ring
exchange splits into TP chunks)."""
CHUNKED_AT_WHOLE_RATE: Final = True
"""The chunks a ring exchange (m / TP rows) or a pipeline (m / ``UB_PIPELINE_SPLITS``) splits a GEMM into are costed
at the whole GEMM's rate: ``compute.gemm_efficiency``'s shape is fitted on whole layers (its ``gemm_half_dim`` is
600 on Hopper, its bound), and applied to 256-row chunks it would more than double their time, far beyond what
cuBLAS loses on m = 256 with n, k in the thousands. Documentation of a choice, not read as a switch."""
FP8_AG_BYTES_PER_ELEMENT: Final = 1.0
"""Under FP8, TE's all-gather userbuffers hold FP8 (``initialize_ub``: ``fp8_buf`` for every name in
``layers_all_gather_overlap``: qkv/fc1 fprop and dgrad, proj/fc2 dgrad and wgrad): 1 byte per element; the
reduce-scatters stay in BF16 (``ACTIVATION_BYTES_PER_ELEMENT``). NVFP4 is taken at BF16 (not in TE's list)."""

UB_ALL_GATHERS_PER_BLOCK: Final = 3
"""All-gathers of one block under userbuffers (``ub_block_exposure``): the input forward, the output gradient and
the input again (for the column GEMM's wgrad) backward."""
UB_REDUCE_SCATTERS_PER_BLOCK: Final = 2
"""Reduce-scatters of one block under userbuffers: the output forward, the input gradient backward."""
FWD_SHARE: Final = 0.5
"""Share of a block's exposed TP time in its forward without userbuffers (half of ``TP_COLLECTIVES_PER_BLOCK``)."""


def comm_sm_share(cluster: ClusterSpec) -> float:
    """Share of the GPU's SMs one pipelined or bulk userbuffers kernel takes: ``UB_COMM_SMS`` / SMs."""
    return UB_COMM_SMS / sm_count_of(cluster)


def ring_exchange_exposed_s(comm_s: Num, gemm_s_: Num, chunked_gemm_s: Num, tp: Num) -> Num:
    """Exposed time of a ring-exchange overlap (TE ``CommOverlapP2PBase``: ``split_overlap_ag_p2p`` /
    ``split_overlap_rs_p2p``): the GEMM runs as ``tp`` chunks of m / tp rows; while chunk i computes, the next chunk
    moves one hop round the ring (copy engine), so each of the tp - 1 hops shows only where it is longer than a
    chunk's GEMM:

        exposed = (tp - 1) max(0, comm / (tp - 1) - chunked / tp) + (chunked - gemm)

    ``comm``: the whole collective (``comm.all_gather_s``); ``chunked``: tp GEMMs of m / tp rows (their lower
    efficiency on skinnier shapes is the overlap's own cost). 0 for TP 1."""
    hops = np.maximum(tp - 1, 1)
    out = (tp - 1) * np.maximum(0.0, comm_s / hops - chunked_gemm_s / tp) + (chunked_gemm_s - gemm_s_)
    return np.where(tp > 1, out, 0.0)


def pipeline_rs_exposed_s(comm_s: Num, gemm_s_: Num, chunked_gemm_s: Num, sm_share: float, tp: Num) -> Num:
    """Exposed time of a pipelined GEMM + reduce-scatter (TE ``CommOverlapBase::split_overlap_rs``, method
    "pipeline"): ``UB_PIPELINE_SPLITS`` chunks; chunk i's reduce-scatter runs on ``UB_COMM_SMS`` SMs while chunk
    i + 1 computes, the last chunk's cannot hide; with ``set_sm_margin`` (TE's default for "pipeline") the GEMM
    runs on the other SMs, 1 / (1 - share) slower:

        g' = chunked / (1 - share)
        exposed = comm / s + (s - 1) max(0, comm / s - g' / s) + (g' - gemm)        (s = UB_PIPELINE_SPLITS)

    0 for TP 1."""
    s = UB_PIPELINE_SPLITS
    slowed = chunked_gemm_s / (1.0 - sm_share)
    out = comm_s / s + (s - 1) * np.maximum(0.0, (comm_s - slowed) / s) + (slowed - gemm_s_)
    return np.where(tp > 1, out, 0.0)


def bulk_exposed_s(comm_s: Num, gemm_s_: Num, sm_share: float) -> Num:
    """Exposed time of a bulk overlap (TE ``CommOverlapBase::bulk_overlap``, method "bulk"): the whole collective
    runs on ``UB_COMM_SMS`` SMs beside the whole GEMM (no SM margin: while both run, the GEMM loses the comm
    kernel's share of the SMs):

        exposed = max(0, comm - gemm) + share x min(comm, gemm)"""
    return np.maximum(0.0, comm_s - gemm_s_) + sm_share * np.minimum(comm_s, gemm_s_)


@dataclass(frozen=True, slots=True)
class BlockExposure:
    """Exposed TP time of one attention or MLP block per micro-batch (forward + backward, and the forward's part)."""

    link_s: Num
    exposed_s: Num
    fwd_exposed_s: Num


def ub_block_exposure(cluster: ClusterSpec, group: Group, fp8: str, tokens: Num, hidden: int,
                      column: list[tuple[Num, Num, Num]], row: tuple[Num, Num, Num]) -> BlockExposure:
    """TP time of one block (attention: ``column`` = the QKV GEMM(s), ``row`` = proj; MLP: fc1, fc2) under
    userbuffers, with sequence parallelism, per GEMM pair as TE's ``initialize_ub`` defaults pair them (methods
    dict: ring_exchange for qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline for proj_fprop, fc2_fprop; bulk
    for qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad; Megatron-Bridge's ``TransformerLayerTPOverlapCfg`` names the
    same ten pairs):

        forward   all-gather of the input behind the column GEMM            ring_exchange_exposed_s
                  reduce-scatter of the output behind the row GEMM          pipeline_rs_exposed_s
        backward  all-gather of the output gradient behind the row dgrad    ring_exchange_exposed_s
                  all-gather of the input (for wgrad) behind the column dgrad   bulk_exposed_s
                  reduce-scatter of the input gradient behind the column wgrad  bulk_exposed_s

    Every collective moves the full T x h activation (T = tokens per rank); all-gathers in FP8 under FP8
    (``FP8_AG_BYTES_PER_ELEMENT``). The row GEMM's wgrad ("external" in TE) hides nothing here. dgrad and wgrad
    GEMMs take the forward GEMM's time (same FLOPs)."""
    busbw = comm.ring_busbw(cluster, group.size, group.stride)
    alpha = comm.tier_latency_s(cluster, group.span)
    t = group.size
    ag_bytes = FP8_AG_BYTES_PER_ELEMENT if fp8 == "fp8" else ACTIVATION_BYTES_PER_ELEMENT
    ag = comm.all_gather_s(ag_bytes * tokens * hidden, t, busbw, alpha)
    rs = comm.reduce_scatter_s(ACTIVATION_BYTES_PER_ELEMENT * tokens * hidden, t, busbw, alpha)
    share = comm_sm_share(cluster)
    g_col: Num = sum(gemm_s(cluster, fp8, *s) for s in column)
    g_row = gemm_s(cluster, fp8, *row)
    m, n, k = row
    g_row_dgrad = gemm_s(cluster, fp8, m, k, n)
    # chunks are costed at the whole GEMM's rate (CHUNKED_AT_WHOLE_RATE)
    fwd = ring_exchange_exposed_s(ag, g_col, g_col, t) + pipeline_rs_exposed_s(rs, g_row, g_row, share, t)
    bwd = (ring_exchange_exposed_s(ag, g_row_dgrad, g_row_dgrad, t)
           + bulk_exposed_s(ag, g_col, share) + bulk_exposed_s(rs, g_col, share))
    return BlockExposure(link_s=UB_ALL_GATHERS_PER_BLOCK * ag + UB_REDUCE_SCATTERS_PER_BLOCK * rs,
                         exposed_s=fwd + bwd, fwd_exposed_s=fwd)


def block_exposure(cluster: ClusterSpec, group: Group, layout: LayerLayout, eff: EfficiencySpec, fp8: str,
                   tokens: Num, hidden: int, column: list[tuple[Num, Num, Num]],
                   row: tuple[Num, Num, Num]) -> BlockExposure:
    """TP time of one block: ``ub_block_exposure`` with --tp-comm-overlap and sequence parallelism, else
    ``block_link_s`` of which ``1 - tp_overlap_frac`` shows (half of it in the forward)."""
    link = block_link_s(cluster, group, tokens, hidden)
    plain = (1.0 - eff.tp_overlap_frac) * link
    ub_on = layout.tp_comm_overlap & layout.sp
    if not np.any(ub_on):
        return BlockExposure(link_s=link, exposed_s=plain, fwd_exposed_s=plain * FWD_SHARE)
    ub = ub_block_exposure(cluster, group, fp8, tokens, hidden, column, row)
    return BlockExposure(link_s=np.where(ub_on, ub.link_s, link), exposed_s=np.where(ub_on, ub.exposed_s, plain),
                         fwd_exposed_s=np.where(ub_on, ub.fwd_exposed_s, plain * FWD_SHARE))
