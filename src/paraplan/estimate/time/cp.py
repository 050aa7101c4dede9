"""Context-parallel attention: the exchange of K and V (or Q, K, V, O) around attention, step by step,
as Transformer Engine runs it for Megatron's ``--cp-comm-type`` (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py).

- ``p2p`` (default, ``AttnFuncWithCPAndKVP2P``): causal load balancing gives each of the c ranks two of
  the 2c sequence chunks (i and 2c-1-i). Attention runs in c steps: step 0 is causal over the two local
  chunks (the "diagonal"), every other step a full block of half the size (the "lower-triangle" steps:
  both local query chunks against the first received K,V chunk; the "upper-triangle" ones: the second
  query chunk against both received K,V chunks). Each step has the same FLOPs, 1/c of the layer's causal
  attention. At step i the ring sends the K,V block the next step needs (c - 1 sends forward) on a side
  stream, while step i computes: per step, only max(0, send - hidden) is exposed. The backward runs the
  steps in reverse and sends K,V together with the dK,dV accumulated so far: the first step sends K,V
  only, the last dK,dV only, the c - 2 between both (2x the bytes). Each step's partial output (forward)
  and dQ, dK, dV (backward) is merged into the running result by element-wise kernels at HBM speed.
- ``a2a`` (Ulysses, ``AttnFuncWithCPAndQKVOA2A``): all-to-alls of Q, K, V before attention and of O after
  it (backward: dO before, dQ, dK, dV after) turn the sequence shard into a head shard; attention then runs
  as one kernel over the whole sequence on heads/c heads. Nothing hides the all-to-alls.
- ``all_gather`` (``AttnFuncWithCPAndKVAllGather``): an all-gather of K and V before attention (again in
  the backward) and a reduce-scatter of dK, dV after the backward; nothing hides them.
``a2a+p2p`` (hierarchical CP, ``--hierarchical-context-parallel-sizes``) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.time.compute import ATTENTION_BWD_FACTOR, hbm_rate
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Group
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num

KV_TENSORS: Final = 2
"""K and V."""
CP_COMM_TYPES: Final = ("p2p", "a2a", "all_gather")
"""The ``--cp-comm-type`` values paraplan models (Megatron-LM also takes ``a2a+p2p`` and a list per layer)."""
P2P_BWD_BOTH_FACTOR: Final = 2.0
"""Backward ring steps 1 .. c-2 send K,V and the dK,dV accumulated so far in one buffer of twice the K,V
block (``AttnFuncWithCPAndKVP2P.backward``: ``p2p_comm_buffers`` of shape (2, *kv.shape), kv.dtype)."""
P2P_BWD_SINGLE_SENDS: Final = 2
"""Backward ring steps that send one block: step 0 (K,V only) and step c-1 (dK,dV only)."""
MERGE_BYTES_PER_ELEMENT: Final = 4.5
"""HBM bytes per element of a step's partial result merged into the running one, per ring step after the
first: read the running bf16 tensor and the step's, write the running one (6 B) on the whole local block in
the "lower-triangle" steps and on its half in the "upper-triangle" ones (``flash_attn_fwd_out_correction`` /
``..._second_half_out_correction`` forward, ``dq.add_`` / ``dk.add_`` / ``dv.add_`` backward); each
happens on half of the steps averaged over the CP ranks: (6 + 3) / 2."""
MERGE_FIRST_BYTES_PER_ELEMENT: Final = 4.0
"""The first step's copy into the running result: read the step's bf16 tensor, write it (2 + 2 B)
(``flash_attn_fwd_out_correction_init``; ``dq.copy_`` / ``dk.copy_`` / ``dv.copy_`` backward)."""
FWD_BWD_SAME_BYTES: Final = 2.0
"""Forward + backward over forward bytes of the Ulysses all-to-alls: the forward moves Q, K, V before
attention and O after it, the backward dO before and dQ, dK, dV after, the same bytes."""
AG_BWD_PASSES: Final = 2.0
"""Backward collectives of the all-gather path per forward one: K, V gathered again and dK, dV reduce-scattered."""


@dataclass(frozen=True, slots=True)
class CpTimes:
    """CP terms of one layer's attention per micro-batch, forward + backward (fields may be arrays)."""

    link_s: Num
    """All CP communication time (as if nothing were hidden)."""
    exposed_s: Num
    """The part not hidden behind attention."""
    merge_s: Num
    """HBM time of merging the per-step partial results (p2p only)."""
    fwd_exposed_s: Num = 0.0
    """The forward's part of ``exposed_s``: run again when the attention forward is recomputed (full
    recompute, or selective ``core_attn``, which re-runs the whole CP attention function)."""


def kv_block_bytes(model: ModelSpec, tokens: Num, tp: Int, kv_width: Num) -> Num:
    """Bytes of the local K,V block one CP step sends: bf16 K and V over T tokens, ``kv_width``
    (heads x head dim, query groups replicated up to TP) divided by TP; MLA sends its
    decompressed per-head K (qk + rope dims) and V."""
    if model.multi_latent_attention:
        a = model.num_attention_heads
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        return ACTIVATION_BYTES_PER_ELEMENT * tokens * a * (dq + model.v_head_dim) / tp
    return KV_TENSORS * ACTIVATION_BYTES_PER_ELEMENT * tokens * kv_width / tp


def q_block_bytes(model: ModelSpec, tokens: Num, tp: Int) -> Num:
    """Bytes of the local bf16 Q (and dQ) over T tokens on one TP rank (MLA: qk + rope head dims)."""
    a = model.num_attention_heads
    if model.multi_latent_attention:
        return ACTIVATION_BYTES_PER_ELEMENT * tokens * a * (model.qk_head_dim + model.qk_pos_emb_head_dim) / tp
    return ACTIVATION_BYTES_PER_ELEMENT * tokens * model.query_width / tp


def o_block_bytes(model: ModelSpec, tokens: Num, tp: Int) -> Num:
    """Bytes of the local bf16 attention output O (and dO) over T tokens on one TP rank."""
    if model.multi_latent_attention:
        return ACTIVATION_BYTES_PER_ELEMENT * tokens * model.num_attention_heads * model.v_head_dim / tp
    return ACTIVATION_BYTES_PER_ELEMENT * tokens * model.query_width / tp


def p2p_ring_steps(c: Int) -> Int:
    """Attention steps per layer and pass under the p2p ring: c (one per K,V block; 1 without CP)."""
    return c


def ring_step_exposed_s(send_s: Num, step_s: Num, eff: EfficiencySpec) -> Num:
    """One ring step: the send of the next step's block runs beside this step's attention, which hides
    ``cp_overlap_frac`` of its own time: exposed = max(0, send - cp_overlap_frac x step)."""
    return np.maximum(send_s - eff.cp_overlap_frac * step_s, 0.0)


def p2p_times(cluster: ClusterSpec, group: Group, kv_bytes: Num, q_bytes: Num, o_bytes: Num,
              attn_fwd_s: Num) -> CpTimes:
    """The p2p ring (``AttnFuncWithCPAndKVP2P``) of one layer per micro-batch, c = CP size >= 2:

        step forward  a_f = attention forward / c,  backward a_b = ``ATTENTION_BWD_FACTOR`` x a_f
        send          x1 = p2p(K,V block), x2 = p2p(2 x K,V block) on the tier the CP group spans
        exposed       (c-1) max(0, x1 - f a_f) + 2 max(0, x1 - f a_b) + (c-2) max(0, x2 - f a_b)
        link          (c-1) x1 + 2 x1 + (c-2) x2
        merge         [(c-1) ``MERGE_BYTES_PER_ELEMENT`` + ``MERGE_FIRST_BYTES_PER_ELEMENT``]
                      x (elements of O + dQ + dK + dV) at ``hbm_rate``

    (f = ``cp_overlap_frac``; all 0 without CP)."""
    eff = cluster.gpu.efficiency
    c = np.asarray(group.size)
    bw = comm.tier_busbw(cluster, group.span)
    alpha = comm.tier_latency_s(cluster, group.span)
    x1 = comm.p2p_s(kv_bytes, bw, alpha)
    x2 = comm.p2p_s(P2P_BWD_BOTH_FACTOR * kv_bytes, bw, alpha)
    steps = np.maximum(p2p_ring_steps(c), 1)
    a_f = attn_fwd_s / steps
    a_b = ATTENTION_BWD_FACTOR * a_f
    middle = np.maximum(c - P2P_BWD_SINGLE_SENDS, 0)
    fwd = (c - 1) * ring_step_exposed_s(x1, a_f, eff)
    bwd = P2P_BWD_SINGLE_SENDS * ring_step_exposed_s(x1, a_b, eff) + middle * ring_step_exposed_s(x2, a_b, eff)
    exposed = fwd + bwd
    link = (c - 1) * x1 + P2P_BWD_SINGLE_SENDS * x1 + middle * x2
    merged = (o_bytes + q_bytes + kv_bytes) / ACTIVATION_BYTES_PER_ELEMENT
    merge = ((c - 1) * MERGE_BYTES_PER_ELEMENT + MERGE_FIRST_BYTES_PER_ELEMENT) * merged / hbm_rate(cluster)
    on = c > 1
    return CpTimes(link_s=np.where(on, link, 0.0), exposed_s=np.where(on, exposed, 0.0),
                   merge_s=np.where(on, merge, 0.0), fwd_exposed_s=np.where(on, fwd, 0.0))


def a2a_times(cluster: ClusterSpec, group: Group, kv_bytes: Num, q_bytes: Num, o_bytes: Num) -> CpTimes:
    """The Ulysses all-to-alls (``AttnFuncWithCPAndQKVOA2A``) of one layer per micro-batch: forward
    all-to-all(Q, K, V) + all-to-all(O), backward all-to-all(dO) + all-to-all(dQ, dK, dV), each on the
    tiers its peers share (``comm.all_to_all_s``); all exposed (attention waits for Q, K, V; the next
    GEMM for O)."""
    alpha = comm.tier_latency_s(cluster, group.span)
    fwd = (comm.all_to_all_s(cluster, q_bytes + kv_bytes, group.size, group.stride, alpha)
           + comm.all_to_all_s(cluster, o_bytes, group.size, group.stride, alpha))
    link = FWD_BWD_SAME_BYTES * fwd
    return CpTimes(link_s=link, exposed_s=link, merge_s=0.0, fwd_exposed_s=fwd)


def allgather_times(cluster: ClusterSpec, group: Group, kv_bytes: Num) -> CpTimes:
    """The all-gather path (``AttnFuncWithCPAndKVAllGather``) of one layer per micro-batch: all-gather of the
    c K,V blocks forward, again backward, and a reduce-scatter of dK, dV (``AG_BWD_PASSES``); ring
    collectives of c x the K,V block (``comm.ring_busbw``), all exposed."""
    busbw = comm.ring_busbw(cluster, group.size, group.stride)
    alpha = comm.tier_latency_s(cluster, group.span)
    ag = comm.all_gather_s(group.size * kv_bytes, group.size, busbw, alpha)
    link = (1.0 + AG_BWD_PASSES) * ag
    return CpTimes(link_s=link, exposed_s=link, merge_s=0.0, fwd_exposed_s=ag)


def cp_times(cluster: ClusterSpec, group: Group, comm_type: str, model: ModelSpec, tokens: Num, tp: Int,
             kv_width: Num, attn_fwd_s: Num) -> CpTimes:
    """CP terms of one layer per micro-batch for ``--cp-comm-type`` ``comm_type`` (0 without CP)."""
    kv = kv_block_bytes(model, tokens, tp, kv_width)
    q, o = q_block_bytes(model, tokens, tp), o_block_bytes(model, tokens, tp)
    if comm_type == "a2a":
        return a2a_times(cluster, group, kv, q, o)
    if comm_type == "all_gather":
        return allgather_times(cluster, group, kv)
    return p2p_times(cluster, group, kv, q, o, attn_fwd_s)
