"""Tensor-parallel communication: the all-gathers and reduce-scatters around every attention and
MLP block, and around the output layer (Korthikanti et al. 2022, arXiv:2205.05198, section 4.2.2:
with sequence parallelism, g is an all-gather forward and a reduce-scatter backward, g-bar the
reverse; without it both are all-reduces, which cost the same two ring passes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import LayerLayout
from paraplan.estimate.time.compute import gemm_s, hbm_rate, sm_count_of
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Group
from paraplan.specs.num import Num
from paraplan.specs.userbuffers import UbGemm, effective

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


def comm_sm_share(cluster: ClusterSpec, num_sm: int = UB_COMM_SMS) -> float:
    """Share of the GPU's SMs one pipelined or bulk userbuffers kernel takes: ``num_sm`` (TE's default
    ``UB_COMM_SMS``, or the config's ``num_sm``) / SMs; at most all SMs but one (TE's ``_math_sms = sm_count -
    num_comm_sm``, which the GEMM then runs on)."""
    sms = sm_count_of(cluster)
    return min(num_sm, sms - 1) / sms


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


def pipeline_rs_exposed_s(comm_s: Num, gemm_s_: Num, chunked_gemm_s: Num, sm_share: float, tp: Num,
                          splits: int = UB_PIPELINE_SPLITS) -> Num:
    """Exposed time of a pipelined GEMM + reduce-scatter (TE ``CommOverlapBase::split_overlap_rs``, method
    "pipeline"): ``UB_PIPELINE_SPLITS`` chunks; chunk i's reduce-scatter runs on ``UB_COMM_SMS`` SMs while chunk
    i + 1 computes, the last chunk's cannot hide; with ``set_sm_margin`` (TE's default for "pipeline") the GEMM
    runs on the other SMs, 1 / (1 - share) slower:

        g' = chunked / (1 - share)
        exposed = comm / s + (s - 1) max(0, comm / s - g' / s) + (g' - gemm)        (s = ``splits``)

    ``splits``: TE's default ``UB_PIPELINE_SPLITS`` or the config's ``num_splits``; 0 for TP 1."""
    s = max(int(splits), 1)
    slowed = chunked_gemm_s / (1.0 - sm_share)
    out = comm_s / s + (s - 1) * np.maximum(0.0, (comm_s - slowed) / s) + (slowed - gemm_s_)
    return np.where(tp > 1, out, 0.0)


AGGREGATE_CHUNKS_PER_STEP: Final = 2.0
"""Chunks an aggregated ring exchange moves and computes per step (TE ``split_overlap_ag``, ``_aggregate``: "Ring
exchange of 2X inputs chunks", ``num_steps = _tp_size / 2``)."""


def ring_exchange_aggregate_exposed_s(comm_s: Num, gemm_s_: Num, chunked_gemm_s: Num, tp: Num) -> Num:
    """Exposed time of an aggregated ring-exchange all-gather (TE ``CommOverlapP2PBase::split_overlap_ag``,
    ``_aggregate``): one first exchange of a 1/tp chunk with the neighbour, not hidden, then tp/2 steps that each
    compute a 2-chunk GEMM while the next 2 chunks move:

        c = comm / (tp - 1)                       (one chunk's transfer)
        exposed = c + (tp/2 - 1) max(0, 2c - 2 chunked / tp) + (chunked - gemm)

    0 for TP 1 (TE needs an even TP for it; an odd one is costed the same)."""
    hops = np.maximum(tp - 1, 1)
    c = comm_s / hops
    k = AGGREGATE_CHUNKS_PER_STEP
    steps = np.maximum(tp / k - 1.0, 0.0)
    out = c + steps * np.maximum(0.0, k * c - k * chunked_gemm_s / tp) + (chunked_gemm_s - gemm_s_)
    return np.where(tp > 1, out, 0.0)


RS_REDUCE_OUT_BYTES_PER_ELEMENT: Final = 2.0
"""The ring-exchange reduce-scatter's output (``reduce_bf16`` / ``reduce_fp8_in_bf16_out``) is BF16."""


def ring_rs_reduce_s(cluster: ClusterSpec, tokens: Num, hidden: int, tp: Num, in_bytes: float) -> Num:
    """The reduction a ring-exchange reduce-scatter runs after its GEMM chunks, on the main stream (TE
    ``CommOverlapP2PBase::split_overlap_rs``: ``reduce_bf16`` or ``reduce_fp8_in_bf16_out`` over the tp received
    chunks of T/tp x h): memory-bound, it reads tp chunks and writes one,

        (tp x in_bytes + 2) x T / tp x h / HBM rate       (``compute.hbm_rate``)

    0 for TP 1."""
    out = (tp * in_bytes + RS_REDUCE_OUT_BYTES_PER_ELEMENT) * tokens / np.maximum(tp, 1) * hidden / hbm_rate(cluster)
    return np.where(tp > 1, out, 0.0)


def bulk_exposed_s(comm_s: Num, gemm_s_: Num, sm_share: float, set_sm_margin: bool = False) -> Num:
    """Exposed time of a bulk overlap (TE ``CommOverlapBase::bulk_overlap``, method "bulk"): the whole collective
    runs on ``num_sm`` SMs (``sm_share`` of them) beside the whole GEMM. With ``set_sm_margin`` (TE's default for
    bulk, ``initialize_ub`` ``"set_sm_margin": not method == "ring_exchange"``) the GEMM is launched on ``_math_sms``
    = SMs - num_sm for its whole run (comm_gemm_overlap.cpp ``bulk_overlap``: ``nvte_cublas_gemm(..., _math_sms,
    ...)``), g' = gemm / (1 - share):

        exposed = max(0, comm - g') + (g' - gemm)

    without it the GEMM takes every SM and loses the comm kernel's share while both run:

        exposed = max(0, comm - gemm) + share x min(comm, gemm)"""
    if set_sm_margin:
        slowed = gemm_s_ / (1.0 - sm_share)
        return np.maximum(0.0, comm_s - slowed) + (slowed - gemm_s_)
    return np.maximum(0.0, comm_s - gemm_s_) + sm_share * np.minimum(comm_s, gemm_s_)


@dataclass(frozen=True, slots=True)
class BlockExposure:
    """Exposed TP time of one attention or MLP block per micro-batch (forward + backward, and the forward's part)."""

    link_s: Num
    exposed_s: Num
    fwd_exposed_s: Num


def ub_block_exposure(cluster: ClusterSpec, group: Group, fp8: str, tokens: Num, hidden: int,
                      column: list[tuple[Num, Num, Num]], row: tuple[Num, Num, Num], *, overlap_ag: bool = True,
                      overlap_rs: bool = True, peft: bool = False, ub: Mapping[str, UbGemm] | None = None,
                      block: str = "mlp", overlap_rs_dgrad: bool = False) -> BlockExposure:
    """TP time of one block (attention, ``block`` "attn": ``column`` = the QKV GEMM(s), ``row`` = proj; MLP, "mlp":
    fc1, fc2) under userbuffers, with sequence parallelism, per GEMM as TE's ``initialize_ub`` builds its
    communicators (``ub``: ``specs.userbuffers.effective`` of the run's ``tp_comm_overlap_cfg``; None = TE's defaults:
    ring_exchange for qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline for proj_fprop, fc2_fprop; bulk for
    qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad). Each GEMM is costed with its method, SMs, splits and SM margin:

        forward   all-gather of the input behind the column GEMM (col_fprop)       ring exchange
                  reduce-scatter of the output behind the row GEMM (row_fprop)     pipeline or ring exchange
        backward  all-gather of the output gradient behind the row dgrad (row_dgrad)   ring exchange
                  all-gather of the input (for wgrad) behind the column dgrad (col_dgrad)   bulk
                  reduce-scatter of the input gradient behind the column wgrad (col_wgrad)  bulk

    ring exchange: ``ring_exchange_exposed_s`` (``ring_exchange_aggregate_exposed_s`` with ``aggregate``), no SMs
    (copy engine) but the GEMM on SMs - ``num_sm`` with ``set_sm_margin``; as a reduce-scatter it adds its final
    reduction (``ring_rs_reduce_s``). pipeline: ``pipeline_rs_exposed_s`` with ``num_splits`` chunks and the GEMM
    slowed by ``num_sm`` / SMs (``set_sm_margin``, or, without it, the comm kernel holding those SMs while it runs).
    bulk: ``bulk_exposed_s`` on ``num_sm`` SMs, with its ``set_sm_margin``. A non-bulk column dgrad
    (``dgrad_reduce_scatter_overlap``, the LoRA configs) reduce-scatters the input gradient behind the dgrad GEMM by
    its method, the wgrad's bulk overlap is unused and the input all-gather for wgrad runs as TE's asynchronous NCCL
    all-gather beside the dgrad GEMM (layernorm_linear.py ``gather_along_first_dim(..., async_op=True)``):
    max(0, comm - dgrad); none under PEFT. That path needs ``overlap_rs_dgrad`` (``--tp-comm-overlap-rs-dgrad``, TE
    ``ub_overlap_rs_dgrad``; Megatron's default False): without it TE keeps ``ub_bulk_dgrad`` / ``ub_bulk_wgrad``
    (layernorm_linear.py ``ub_bulk_dgrad = ub_bulk_dgrad and ... not self.ub_overlap_rs_dgrad``), so the dgrad runs
    its bulk all-gather on that GEMM's communicator (its ``num_sm``, ``set_sm_margin`` and buffer) and the wgrad its
    bulk reduce-scatter (TE's bulk defaults: the config cannot set that wgrad).

    Every collective moves the full T x h activation (T = tokens per rank); a buffer is FP8 under FP8 where TE makes
    it so (``UbGemm.fp8_buf``: the all-gathers, and a config's pipelined reduce-scatters that ask for it), else
    BF16. dgrad and wgrad GEMMs take the forward GEMM's time (same FLOPs); the row GEMM's wgrad ("external") hides
    nothing. Chunks are costed at the whole GEMM's rate (``CHUNKED_AT_WHOLE_RATE``).

    Megatron's pair switches (``overlap_ag``, ``overlap_rs``), as TE applies them
    (megatron/core/extensions/transformer_engine.py ``TELinear`` / ``TELayerNormColumnParallelLinear``:
    ``ub_overlap_ag`` / ``ub_overlap_rs``; TE module/linear.py, layernorm_linear.py ``_forward`` / ``backward``):
    ``overlap_ag`` False (``--no-tp-comm-overlap-ag``) runs the column GEMM's input all-gather forward and the row
    dgrad's output-gradient all-gather as plain collectives before their GEMMs (``gather_along_first_dim``): the
    whole all-gather shows; ``overlap_rs`` False (``--no-tp-comm-overlap-rs``) the row GEMM's output reduce-scatter
    after it (``reduce_scatter_along_first_dim``): the whole reduce-scatter shows.
    ``peft``: the frozen column weights run no wgrad GEMM (layernorm_linear.py ``ctx.requires_wgrad =
    weight.requires_grad``), so the bulk reduce-scatter of the input gradient has nothing to hide behind and shows
    in full."""
    cfg = ub if ub is not None else effective(None)
    col, rowname = ("qkv", "proj") if block == "attn" else ("fc1", "fc2")
    cf, cd, cw = cfg[f"{col}_fprop"], cfg[f"{col}_dgrad"], cfg[f"{col}_wgrad"]
    rf, rd = cfg[f"{rowname}_fprop"], cfg[f"{rowname}_dgrad"]
    busbw = comm.ring_busbw(cluster, group.size, group.stride)
    alpha = comm.tier_latency_s(cluster, group.span)
    t = group.size
    act = ACTIVATION_BYTES_PER_ELEMENT

    def _nbytes(g: UbGemm) -> float:
        return FP8_AG_BYTES_PER_ELEMENT if fp8 == "fp8" and g.fp8_buf else act

    def _ag_s(b: float) -> Num:
        return comm.all_gather_s(b * tokens * hidden, t, busbw, alpha)

    def _rs_s(b: float) -> Num:
        return comm.reduce_scatter_s(b * tokens * hidden, t, busbw, alpha)

    def _ring(g: UbGemm, comm_s: Num, gemm: Num) -> Num:
        slowed = gemm / (1.0 - comm_sm_share(cluster, g.num_sm)) if g.set_sm_margin else gemm
        if g.aggregate:
            return ring_exchange_aggregate_exposed_s(comm_s, gemm, slowed, t)
        return ring_exchange_exposed_s(comm_s, gemm, slowed, t)

    def _scatter(g: UbGemm, gemm: Num) -> Num:
        comm_s = _rs_s(_nbytes(g))
        if g.method == "pipeline":
            return pipeline_rs_exposed_s(comm_s, gemm, gemm, comm_sm_share(cluster, g.num_sm), t, g.num_splits)
        return _ring(g, comm_s, gemm) + ring_rs_reduce_s(cluster, tokens, hidden, t, _nbytes(g))

    g_col: Num = sum(gemm_s(cluster, fp8, *s) for s in column)
    g_row = gemm_s(cluster, fp8, *row)
    m, n, k = row
    g_row_dgrad = gemm_s(cluster, fp8, m, k, n)
    ag_fwd = _ring(cf, _ag_s(_nbytes(cf)), g_col) if overlap_ag else _ag_s(_nbytes(cf))
    rs_fwd = _scatter(rf, g_row) if overlap_rs else _rs_s(act)
    ag_dgrad = _ring(rd, _ag_s(_nbytes(rd)), g_row_dgrad) if overlap_ag else _ag_s(_nbytes(rd))
    if cd.reduce_scatter and overlap_rs_dgrad:  # non-bulk dgrad: the input-gradient reduce-scatter rides the dgrad
        ag_in_link = 0.0 if peft else _ag_s(_nbytes(cd))
        ag_in = 0.0 if peft else np.maximum(0.0, _ag_s(_nbytes(cd)) - g_col)
        rs_bwd_link, rs_bwd = _rs_s(_nbytes(cd)), _scatter(cd, g_col)
    else:
        ag_in_link = _ag_s(_nbytes(cd))
        ag_in = bulk_exposed_s(ag_in_link, g_col, comm_sm_share(cluster, cd.num_sm), cd.set_sm_margin)
        rs_bwd_link = _rs_s(act)
        rs_bwd = rs_bwd_link if peft else bulk_exposed_s(rs_bwd_link, g_col, comm_sm_share(cluster, cw.num_sm),
                                                         cw.set_sm_margin)
    fwd = ag_fwd + rs_fwd
    bwd = ag_dgrad + ag_in + rs_bwd
    link = _ag_s(_nbytes(cf)) + _rs_s(_nbytes(rf)) + _ag_s(_nbytes(rd)) + ag_in_link + rs_bwd_link
    return BlockExposure(link_s=link, exposed_s=fwd + bwd, fwd_exposed_s=fwd)


def block_exposure(cluster: ClusterSpec, group: Group, layout: LayerLayout, eff: EfficiencySpec, fp8: str,
                   tokens: Num, hidden: int, column: list[tuple[Num, Num, Num]],
                   row: tuple[Num, Num, Num], *, overlap_ag: bool = True, overlap_rs: bool = True,
                   peft: bool = False, ub: Mapping[str, UbGemm] | None = None,
                   block: str = "mlp", overlap_rs_dgrad: bool = False) -> BlockExposure:
    """TP time of one block: ``ub_block_exposure`` with --tp-comm-overlap and sequence parallelism (its pair
    switches and ``overlap_rs_dgrad``, ``peft``, the per-GEMM config ``ub`` and the ``block`` passed on), else
    ``block_link_s`` of which ``1 - tp_overlap_frac`` shows (half of it in the forward)."""
    link = block_link_s(cluster, group, tokens, hidden)
    plain = (1.0 - eff.tp_overlap_frac) * link
    ub_on = layout.tp_comm_overlap & layout.sp
    if not np.any(ub_on):
        return BlockExposure(link_s=link, exposed_s=plain, fwd_exposed_s=plain * FWD_SHARE)
    x = ub_block_exposure(cluster, group, fp8, tokens, hidden, column, row, overlap_ag=overlap_ag,
                          overlap_rs=overlap_rs, peft=peft, ub=ub, block=block, overlap_rs_dgrad=overlap_rs_dgrad)
    return BlockExposure(link_s=np.where(ub_on, x.link_s, link), exposed_s=np.where(ub_on, x.exposed_s, plain),
                         fwd_exposed_s=np.where(ub_on, x.fwd_exposed_s, plain * FWD_SHARE))
