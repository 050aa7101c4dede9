"""Expert-parallel communication: the MoE token dispatcher's dispatch and combine (each mirrored in
backward), the ETP collectives of the expert MLP, and what overlap hides of them.

Three dispatchers (``--moe-token-dispatcher-type``, ``megatron/core/transformer/moe/token_dispatcher.py``):

- ``alltoall`` (``MoEAlltoAllTokenDispatcher``): the tokens are permuted by expert and every routed copy
  (T k of them) goes to its expert's rank in one NCCL all-to-all, each peer on the tier it shares with
  the sender (``comm.all_to_all_s``); combine sends them back.
- ``allgather`` (``MoEAllGatherTokenDispatcher``): every rank all-gathers the hidden states of the whole
  expert-TP x EP group (``gather_from_sequence_parallel_region(..., group=tp_ep_group)``) and
  reduce-scatters the expert outputs back, in the router probabilities' dtype (``token_combine``:
  ``hidden_states.to(self.local_probs.dtype)``).
- ``flex`` with DeepEP or HybridEP (``MoEFlexTokenDispatcher``, ``_DeepepManager``, ``_HybridEPManager``,
  ``fused_a2a.py``): one kernel moves a token once per destination NVLink domain over RDMA and once per
  destination rank over NVLink (the two run at once), instead of once per routed expert; HybridEP also
  permutes the tokens for the experts inside the kernel with ``--moe-permute-fusion-into-hybridep``
  (``fused=config.moe_permute_fusion_into_hybridep``; ``--moe-permute-fusion`` is TE's separate permute kernel).

Every dispatcher makes ``EP_ALL_TO_ALLS_PER_LAYER`` passes of the same size per MoE layer and micro-batch.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import StepLayout
from paraplan.estimate.time import tp
from paraplan.estimate.time.compute import GEMM_FWD_BWD_FACTOR
from paraplan.estimate.time.tp import ACTIVATION_BYTES_PER_ELEMENT
from paraplan.schedules import Schedule
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.grid import Group
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num
from paraplan.specs.training import TrainingSpec

EP_ALL_TO_ALLS_PER_LAYER: Final = 4.0
"""Dispatch and combine, forward and backward."""
DISPATCH_PASSES_PER_DIRECTION: Final = 2.0
"""Dispatch and combine in each of forward and backward (``EP_ALL_TO_ALLS_PER_LAYER`` / 2)."""
PERMUTE_COPIES: Final = 2.0
"""Row copies of the routed tokens outside the communication kernel, per direction: ``moe_utils.permute``
before the dispatch and ``moe_utils.unpermute`` after the combine (alltoall, allgather, DeepEP)."""
HYBRIDEP_FUSED_PERMUTE_COPIES: Final = 0.0
"""HybridEP with ``--moe-permute-fusion-into-hybridep`` permutes inside its dispatch / combine kernels
(``_HybridEPManager``: ``hybrid_ep_dispatch(..., fused=self.config.moe_permute_fusion_into_hybridep)`` and the
same in ``hybrid_ep_combine``, token_dispatcher.py; TransformerConfig: "Fuse token rearrangement ops during token
dispatching for HybridEP", default False)."""
SHARED_FC1_SHARE: Final = 0.5
"""Share of the shared expert's forward GEMMs in its fc1 (beside the dispatch) and in its fc2 (beside the
combine): fc1 (T x h)(h x g f) and fc2 (T x f)(f x h) have equal FLOPs at g = 1; an even split is taken."""
ROUTER_PROBS_DEFAULT_BYTES: Final = 2.0
"""Router probabilities without ``--moe-router-dtype``: the parameters' dtype (bf16)."""
BWD_OVER_FWD: Final = GEMM_FWD_BWD_FACTOR - 1.0
"""A backward (dgrad + wgrad) over its forward: 2 (``GEMM_FWD_BWD_FACTOR`` - 1)."""
ROUTER_PROBS_BYTES: Final = {"fp32": 4.0, "fp64": 8.0}
"""Router probabilities with ``--moe-router-dtype`` (``router.py``: the logits are computed in that dtype)."""


def domain_miss_prob(num_experts: int, topk: int, bin_experts: Num) -> Num:
    """Probability that none of a token's k experts lies in a given set of B experts, routing uniform
    over E experts (what ``--moe-router-force-load-balancing``, set by every NVIDIA benchmark recipe,
    draws; balanced routing in expectation otherwise): C(E - B, k) / C(E, k) = prod_i (E - B - i) / (E - i)."""
    b = np.asarray(bin_experts, dtype=float)
    p: Num = np.ones_like(b)
    for i in range(topk):
        p = p * np.clip((num_experts - b - i) / (num_experts - i), 0.0, 1.0)
    return p


def group_miss_prob(num_groups: int, group_topk: int, groups_in_bin: Num) -> Num:
    """Node-limited routing (``--moe-router-num-groups`` G, ``--moe-router-group-topk`` g, ``moe_utils.
    group_limited_topk``): a token's experts lie in g of G groups; a set holding q whole groups is missed
    with probability C(G - q, g) / C(G, g)."""
    q = np.asarray(groups_in_bin, dtype=float)
    p: Num = np.ones_like(q)
    for i in range(group_topk):
        p = p * np.clip((num_groups - q - i) / (num_groups - i), 0.0, 1.0)
    return p


def flex_copies_per_token(model: ModelSpec, n: Num, per_domain: Num) -> tuple[Num, Num]:
    """(RDMA copies, NVLink copies) per source token of the DeepEP / HybridEP dispatch over an EP group of n
    ranks, ``per_domain`` of them in each NVLink domain: a token goes once to each remote domain holding one
    of its experts (D = (n / g - 1)(1 - P_miss(domain)), node-limited routing when the domain holds whole
    router groups) and once to each rank holding one (R = n (1 - P_miss(rank))) (DeepEP ``internode``
    dispatch, HybridEP's hierarchical dispatch: RDMA to the peer of the same local rank, NVLink onwards)."""
    assert model.num_experts is not None
    e, k = model.num_experts, model.moe_router_topk
    n_arr = np.asarray(n, dtype=float)
    g = np.minimum(np.asarray(per_domain, dtype=float), n_arr)
    domain_experts = e * g / n_arr
    miss = domain_miss_prob(e, k, domain_experts)
    groups, group_topk = model.moe_router_num_groups, model.moe_router_group_topk
    if groups is not None and group_topk is not None:
        q = domain_experts * groups / e
        whole = np.isclose(q, np.round(q)) & (q >= 1)
        miss = np.where(whole, group_miss_prob(groups, group_topk, np.round(q)), miss)
    rdma = (n_arr / g - 1.0) * (1.0 - miss)
    nvlink = n_arr * (1.0 - domain_miss_prob(e, k, e / n_arr))
    return rdma, nvlink


def all_to_all_link_s(cluster: ClusterSpec, group: Group, routed_tokens: Num, hidden: int) -> Num:
    """EP link time of one MoE layer per micro-batch, alltoall dispatcher: ``EP_ALL_TO_ALLS_PER_LAYER``
    all-to-alls of the bf16 routed token copies (T k ETP/TP of them per rank) over the EP group
    (``comm.all_to_all_s``: each peer on the tier it shares with the sender)."""
    return EP_ALL_TO_ALLS_PER_LAYER * comm.all_to_all_s(
        cluster, ACTIVATION_BYTES_PER_ELEMENT * routed_tokens * hidden, group.size, group.stride,
        comm.tier_latency_s(cluster, group.span))


def all_gather_link_s(cluster: ClusterSpec, group: Group, tokens: Num, hidden: int, probs_bytes: float) -> Num:
    """EP link time of one MoE layer per micro-batch, allgather dispatcher, over the ETP x EP group of n ranks
    (``group``): forward all-gathers the bf16 hidden states of all n ranks (n T h 2 bytes, ring) and
    reduce-scatters the outputs in the probabilities' dtype; backward mirrors both (a reduce-scatter of bf16
    gradients, an all-gather in the probabilities' dtype)."""
    n = group.size
    busbw = comm.ring_busbw(cluster, n, group.stride)
    alpha = comm.tier_latency_s(cluster, group.span)
    full = n * tokens * hidden
    return DISPATCH_PASSES_PER_DIRECTION * (comm.all_gather_s(ACTIVATION_BYTES_PER_ELEMENT * full, n, busbw, alpha)
                                            + comm.all_gather_s(probs_bytes * full, n, busbw, alpha))


def flex_link_s(cluster: ClusterSpec, model: ModelSpec, group: Group, tokens: Num, hidden: int) -> Num:
    """EP link time of one MoE layer per micro-batch, flex dispatcher (DeepEP / HybridEP):
    ``EP_ALL_TO_ALLS_PER_LAYER`` passes of max(RDMA bytes / network busbw, NVLink bytes / NVLink busbw)
    + log2(n) alpha, with the copies of ``flex_copies_per_token`` (bf16 rows of h) for T source tokens per
    rank. Inside one NVLink domain only the NVLink term is left."""
    topo = cluster.topology
    nvl = topo.nvlink
    per_domain = topo.peers_within(group.size, group.stride, nvl)
    rdma, nvlink = flex_copies_per_token(model, group.size, per_domain)
    row = ACTIVATION_BYTES_PER_ELEMENT * tokens * hidden
    outer = topo.busbw(group.span, start=1)
    t = (np.maximum(rdma * row / outer, nvlink * row / nvl.busbw_bytes_per_s)
         + np.log2(np.maximum(group.size, 1)) * comm.tier_latency_s(cluster, group.span))
    return np.where(group.size > 1, EP_ALL_TO_ALLS_PER_LAYER * t, 0.0)


def dispatcher_link_s(cluster: ClusterSpec, model: ModelSpec, training: TrainingSpec, ep_group: Group,
                      tp_ep_group: Group, routed_tokens: Num, hidden: int) -> Num:
    """EP link time of one MoE layer per micro-batch for the training spec's ``moe_token_dispatcher_type``
    (``routed_tokens``: T k ETP / TP routed copies per rank, T k ETP / TP / k source tokens)."""
    kind = training.moe_token_dispatcher_type
    tokens = routed_tokens / model.moe_router_topk
    if kind == "allgather":
        probs = ROUTER_PROBS_BYTES.get(model.moe_router_dtype or "", ROUTER_PROBS_DEFAULT_BYTES)
        out: Num = np.where(tp_ep_group.size > 1, all_gather_link_s(cluster, tp_ep_group, tokens, hidden, probs), 0.0)
        return out
    if kind == "flex":
        return flex_link_s(cluster, model, ep_group, tokens, hidden)
    return all_to_all_link_s(cluster, ep_group, routed_tokens, hidden)


def permute_copies(training: TrainingSpec) -> float:
    """Row copies of the routed tokens per direction outside the dispatch kernel: ``PERMUTE_COPIES``, none with
    HybridEP and ``--moe-permute-fusion-into-hybridep`` (``HYBRIDEP_FUSED_PERMUTE_COPIES``; ``--moe-permute-fusion``
    alone keeps them: TE's fused permute is still a copy outside the dispatch kernel)."""
    if training.moe_token_dispatcher_type == "flex" and training.moe_flex_dispatcher_backend == "hybridep" \
            and training.moe_permute_fusion_into_hybridep:
        return HYBRIDEP_FUSED_PERMUTE_COPIES
    return PERMUTE_COPIES


def routed_load_factor(training: TrainingSpec) -> float:
    """Routed token copies computed and sent, over the dropless T k: capacity c = c_f T k / E per expert
    (``moe_utils.get_capacity``) under balanced routing: c_f with ``--moe-pad-expert-input-to-capacity``
    (every expert runs exactly its capacity), min(1, c_f) without (only the tokens over capacity are
    dropped), 1 dropless."""
    cf = training.moe_expert_capacity_factor
    if cf is None:
        return 1.0
    return float(cf) if training.moe_pad_expert_input_to_capacity else min(1.0, float(cf))


def etp_link_s(cluster: ClusterSpec, group: Group, routed_tokens: Num, hidden: int) -> Num:
    """ETP link time of the expert MLP per micro-batch: the TP block collectives over the routed
    tokens and the ETP group (``tp.block_link_s``); 0 at ETP = 1."""
    return np.where(group.size > 1, tp.block_link_s(cluster, group, routed_tokens, hidden), 0.0)


def unpaired_exposed_s(ep_s: Num, shared_fwd_s: Num, *, shared_overlap: bool) -> Num:
    """EP time a MoE layer leaves exposed per micro-batch when no other micro-batch runs beside it: all of it,
    unless ``--moe-shared-expert-overlap`` runs the shared expert on a side stream (``shared_experts.py``:
    fc1 beside the dispatch, fc2 beside the combine forward, twice as long backward), so each pass a = ep_s / 4
    hides behind its share: 2 max(a - S / 2, 0) + 2 max(a - S, 0), S = the shared expert's forward GEMMs
    (``SHARED_FC1_SHARE`` of S beside each forward pass, ``BWD_OVER_FWD`` x that beside each backward one)."""
    if not shared_overlap:
        return ep_s
    a = ep_s / EP_ALL_TO_ALLS_PER_LAYER
    fwd = SHARED_FC1_SHARE * shared_fwd_s
    return (DISPATCH_PASSES_PER_DIRECTION * np.maximum(a - fwd, 0.0)
            + DISPATCH_PASSES_PER_DIRECTION * np.maximum(a - BWD_OVER_FWD * fwd, 0.0))


PAIRED_STEADY_LAYERS: Final = 4
"""Layers after which ``paired_exposed_s`` reads the steady period (that of the next as many layers)."""
PAIRED_SIMULATED_LAYERS: Final = 2 * PAIRED_STEADY_LAYERS
"""Layers ``paired_exposed_s`` simulates: the warm-up ``PAIRED_STEADY_LAYERS``, then as many timed ones."""


def paired_exposed_s(ep_s: Num, compute_s: Num, mlp_fwd_s: Num, *, delay_wgrad: bool) -> Num:
    """EP time a MoE layer leaves exposed per micro-batch when its forward runs paired with another
    micro-batch's backward (``model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run``): a compute
    stream and a communication stream, each in program order, with the data dependencies of the layer,

        comm:    combine bwd(b)   dispatch fwd(f)   dispatch bwd(b)          combine fwd(f)
        compute: attention fwd(f) MLP bwd(b)        [MLP wgrad(b)] MLP fwd(f) attention bwd(b) [attention wgrad(b)]

    dispatch fwd after the attention forward, the MLP backward after the combine backward, the dispatch
    backward after the MLP dgrad, the MLP forward after the dispatch forward, the combine forward after the
    MLP forward, the attention backward after the dispatch backward; the next layer's combine backward after
    this attention dgrad and its attention forward after this combine forward. ``--delay-wgrad-compute``
    splits the weight gradients off (``backward_dw``), so the dispatch backward starts after the MLP dgrad
    and the attention wgrad runs beside the next combine backward. Each pass takes a = ep_s / 4; M = the MLP
    forward GEMMs, A = (compute - 3 M) / 3 the attention half's forward (backward = 2x,
    ``GEMM_FWD_BWD_FACTOR``). Exposed = the steady per-layer period (``PAIRED_STEADY_LAYERS``) - 3 (A + M)."""
    a = np.asarray(ep_s, dtype=float) / EP_ALL_TO_ALLS_PER_LAYER
    m = np.asarray(mlp_fwd_s, dtype=float)
    att = np.maximum(np.asarray(compute_s, dtype=float) - GEMM_FWD_BWD_FACTOR * m, 0.0) / GEMM_FWD_BWD_FACTOR
    comp = comm = grad_ready = fwd_ready = np.zeros(np.broadcast(a, m, att).shape)
    ends = []
    for _ in range(PAIRED_SIMULATED_LAYERS):
        k1 = np.maximum(comm, grad_ready) + a                       # combine backward
        c1 = np.maximum(comp, fwd_ready) + att                      # attention forward
        k2 = np.maximum(k1, c1) + a                                 # dispatch forward
        dgrad = np.maximum(c1, k1) + (m if delay_wgrad else BWD_OVER_FWD * m)
        k3 = np.maximum(k2, dgrad) + a                              # dispatch backward
        c3 = np.maximum(dgrad + (m if delay_wgrad else 0.0), k2) + m  # [MLP wgrad], MLP forward
        k4 = np.maximum(k3, c3) + a                                 # combine forward
        c4 = np.maximum(c3, k3) + (att if delay_wgrad else BWD_OVER_FWD * att)  # attention dgrad [+ wgrad]
        comp, comm, grad_ready, fwd_ready = c4 + (att if delay_wgrad else 0.0), k4, c4, k4
        ends.append(np.maximum(comp, comm))
    period = (ends[-1] - ends[PAIRED_STEADY_LAYERS - 1]) / PAIRED_STEADY_LAYERS
    out: Num = np.maximum(period - GEMM_FWD_BWD_FACTOR * (att + m), 0.0)
    return out


def exposed_s(sched: Schedule, layout: StepLayout, m: Int, unpaired_s: Num, paired_s: Num) -> Num:
    """Exposed expert-parallel communication of a step: m x the unpaired exposure per micro-batch, unless the
    schedule pairs one micro-batch's forward with another's backward (combined 1F1B, DualPipe-V): then a share
    ``f = Schedule.ep_exposed_frac`` of the passes (the unpaired ones) keeps it and the paired ones expose
    ``paired_exposed_s``: m (f u + (1 - f) p)."""
    frac = sched.ep_exposed_frac(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    if isinstance(frac, float) and frac == 1.0:
        unpaired: Num = m * unpaired_s
        return unpaired
    mixed: Num = m * (frac * unpaired_s + (1.0 - frac) * paired_s)
    return mixed
