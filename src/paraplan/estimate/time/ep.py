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
  The row copies each dispatcher makes outside its communication kernels: ``estimate.time.permute``.

Every dispatcher makes ``EP_ALL_TO_ALLS_PER_LAYER`` passes of the same size per MoE layer and micro-batch.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import StepLayout
from paraplan.estimate.time import tp
from paraplan.estimate.time.compute import GEMM_FWD_BWD_FACTOR, compute_share_beside, slowed_end, sm_count_of
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


FLEX_DEFAULT_SMS: Final = {"deepep": (20, 20), "hybridep": (24, 8)}
"""SMs the flex dispatcher's dispatch / combine kernels hold without ``--moe-flex-dispatcher-num-sms``, per backend:
(EP group inside one NVLink domain, EP group over several). DeepEP: 20 (Megatron ``_DeepepManager.__init__``,
token_dispatcher.py: ``set_deepep_num_sms(config.moe_flex_dispatcher_num_sms if ... is not None else 20)``, "DeepEP's
historical mcore default"). HybridEP: ``num_sms_dispatch_api.value_or((num_of_nodes == 1) ? 24 : 8)`` and the same
for combine (DeepEP hybrid-ep branch, csrc/hybrid_ep/config.cuh ``Configurer``; ``num_of_nodes`` = EP ranks / ranks
per NVLink domain, hybrid_ep_buffer.py)."""


def flex_comm_sms(training: TrainingSpec, ep_size: Num, ranks_per_domain: Num) -> Num:
    """SMs one flex dispatch or combine kernel holds while it runs: ``moe_hybridep_num_sms``
    (``--moe-flex-dispatcher-num-sms``, passed to both backends: ``set_deepep_num_sms`` and HybridEP's
    ``num_sms_dispatch_api`` / ``num_sms_combine_api``), else ``FLEX_DEFAULT_SMS`` of the backend, its multi-domain
    figure when the EP group of ``ep_size`` ranks spans more than ``ranks_per_domain`` (one NVLink domain)."""
    if training.moe_hybridep_num_sms is not None:
        return float(training.moe_hybridep_num_sms)
    one, several = FLEX_DEFAULT_SMS[training.moe_flex_dispatcher_backend]
    out: Num = np.where(np.asarray(ep_size) > np.asarray(ranks_per_domain), float(several), float(one))
    return out


def ep_compute_share(cluster: ClusterSpec, training: TrainingSpec, ep_group: Group) -> Num:
    """Share of the GPU left to the compute an EP dispatch / combine hides behind (``compute_share_beside``): the
    flex dispatcher's ``flex_comm_sms`` on a GPU whose ``sm_count`` is known; 1 (no slowdown) for the alltoall and
    allgather dispatchers (NCCL's kernels run one CTA per channel, ``comm->p2pnChannels``: graph/paths.cc
    ``ncclTopoComputeP2pChannels`` takes it from the topology search's channel count, which this model does not
    derive). SMs: ``compute.sm_count_of``."""
    if training.moe_token_dispatcher_type != "flex":
        return 1.0
    per_domain = cluster.topology.peers_within(ep_group.size, ep_group.stride, cluster.topology.nvlink)
    return compute_share_beside(sm_count_of(cluster), flex_comm_sms(training, ep_group.size, per_domain),
                                "--moe-flex-dispatcher-num-sms")


def unpaired_exposed_s(ep_s: Num, shared_fwd_s: Num, *, shared_overlap: bool, compute_share: Num = 1.0) -> Num:
    """EP time a MoE layer leaves exposed per micro-batch when no other micro-batch runs beside it: all of it,
    unless ``--moe-shared-expert-overlap`` runs the shared expert on a side stream (``shared_experts.py``:
    fc1 beside the dispatch, fc2 beside the combine forward, twice as long backward), so each pass a = ep_s / 4
    hides behind its share w: 2 (max(a, e(S / 2)) - S / 2) + 2 (max(a, e(2 S / 2)) - 2 S / 2), S = the shared
    expert's forward GEMMs (``SHARED_FC1_SHARE`` of S beside each forward pass, ``BWD_OVER_FWD`` x that beside each
    backward one), e(w) = ``slowed_end`` of w beside the pass at ``compute_share`` (``ep_compute_share``): the SMs the
    pass holds slow what it hides behind; e(w) = w at a share of 1 (max(a - w, 0))."""
    if not shared_overlap:
        return ep_s
    a = np.asarray(ep_s, dtype=float) / EP_ALL_TO_ALLS_PER_LAYER
    fwd = SHARED_FC1_SHARE * np.asarray(shared_fwd_s, dtype=float)

    def exposed(work: Num) -> Num:
        """One pass beside ``work`` seconds of shared-expert GEMMs, both starting together."""
        # never below 0: the end is at least ``work`` (rounding of slowed_end's intervals aside)
        out: Num = np.maximum(np.maximum(a, slowed_end(0.0, work, [(0.0, a)], compute_share)) - work, 0.0)
        return out

    return DISPATCH_PASSES_PER_DIRECTION * exposed(fwd) + DISPATCH_PASSES_PER_DIRECTION * exposed(BWD_OVER_FWD * fwd)


PAIRED_STEADY_LAYERS: Final = 4
"""Layers after which ``paired_exposed_s`` reads the steady period (that of the next as many layers)."""
PAIRED_SIMULATED_LAYERS: Final = 2 * PAIRED_STEADY_LAYERS
"""Layers ``paired_exposed_s`` simulates: the warm-up ``PAIRED_STEADY_LAYERS``, then as many timed ones."""


def _paired_layers(ep_s: Num, compute_s: Num, mlp_fwd_s: Num, *, delay_wgrad: bool, compute_share: Num,
                   layers: int) -> tuple[list[Num], Num, Num]:
    """The two-stream simulation of ``paired_exposed_s`` over ``layers`` layers of one chunk pair, both streams
    free at 0: (the end of each layer with the next layer's combine backward issued beside its attention wgrad,
    the end of the chunk pair when layer ``layers`` is its last (no next combine backward: the streams join),
    the layer's whole compute 3 (A + M))."""
    a = np.asarray(ep_s, dtype=float) / EP_ALL_TO_ALLS_PER_LAYER
    m = np.asarray(mlp_fwd_s, dtype=float)
    att = np.maximum(np.asarray(compute_s, dtype=float) - GEMM_FWD_BWD_FACTOR * m, 0.0) / GEMM_FWD_BWD_FACTOR
    r = compute_share
    zero = np.zeros(np.broadcast(a, m, att, r).shape)
    comp: Num = zero
    fwd_ready: Num = zero
    k1 = (zero, zero + a)                                           # the first combine backward
    ends: list[Num] = []
    last: Num = zero
    for _ in range(layers):
        c1 = slowed_end(np.maximum(comp, fwd_ready), att, [k1], r)  # attention forward
        k2 = (np.maximum(k1[1], c1), np.maximum(k1[1], c1) + a)      # dispatch forward
        dgrad = slowed_end(np.maximum(c1, k1[1]), m if delay_wgrad else BWD_OVER_FWD * m, [k2], r)
        k3 = (np.maximum(k2[1], dgrad), np.maximum(k2[1], dgrad) + a)  # dispatch backward
        wgrad = slowed_end(dgrad, m, [k2, k3], r) if delay_wgrad else dgrad  # [MLP wgrad]
        c3 = slowed_end(np.maximum(wgrad, k2[1]), m, [k3], r)       # MLP forward
        k4 = (np.maximum(k3[1], c3), np.maximum(k3[1], c3) + a)      # combine forward
        c4 = slowed_end(np.maximum(c3, k3[1]), att if delay_wgrad else BWD_OVER_FWD * att, [k4], r)  # attention dgrad
        # the chunk's last layer: its attention wgrad beside the combine forward only, then both streams join
        last = np.maximum(slowed_end(c4, att, [k4], r) if delay_wgrad else c4, k4[1])
        k1 = (np.maximum(k4[1], c4), np.maximum(k4[1], c4) + a)      # the next layer's combine backward
        comp = slowed_end(c4, att, [k4, k1], r) if delay_wgrad else c4  # [attention wgrad]
        fwd_ready = k4[1]
        ends.append(np.maximum(comp, k4[1]))
    work: Num = GEMM_FWD_BWD_FACTOR * (att + m)
    return ends, last, work


def paired_exposed_s(ep_s: Num, compute_s: Num, mlp_fwd_s: Num, *, delay_wgrad: bool,
                     compute_share: Num = 1.0) -> Num:
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
    ``GEMM_FWD_BWD_FACTOR``). Each compute kernel runs at ``compute_share`` of the GPU while a pass runs beside it
    (``slowed_end``, ``ep_compute_share``: the SMs the dispatch / combine kernels hold), at full rate otherwise.
    Exposed = the steady per-layer period (``PAIRED_STEADY_LAYERS``) - 3 (A + M): what the passes cost, in link time
    left uncovered and in compute slowed beside them. The start and end of each chunk pair: ``paired_chunk_s``."""
    ends, _, work = _paired_layers(ep_s, compute_s, mlp_fwd_s, delay_wgrad=delay_wgrad, compute_share=compute_share,
                                   layers=PAIRED_SIMULATED_LAYERS)
    period = (ends[-1] - ends[PAIRED_STEADY_LAYERS - 1]) / PAIRED_STEADY_LAYERS
    out: Num = np.maximum(period - work, 0.0)
    return out


def paired_chunk_s(ep_s: Num, compute_s: Num, mlp_fwd_s: Num, *, delay_wgrad: bool,
                   compute_share: Num = 1.0) -> Num:
    """EP time a combined chunk pair exposes once, beyond its layers' steady ``paired_exposed_s``: Megatron runs
    each (forward chunk, backward chunk) pair as one ``TransformerModelChunkSchedulePlan.run``
    (model_chunk_schedule_plan.py), which starts its first layer with both streams free (the chunk's
    ``record_current_stream`` / ``pre_forward`` / ``pre_backward`` on the compute stream; the first combine
    backward waits on them) and ends with ``f_schedule_plan.wait_current_stream()`` and
    ``b_schedule_plan.wait_current_stream()``: the compute stream waits for the last combine forward. So the
    communication stream starts empty (the first combine backward has only the first attention forward beside it)
    and the last layer's passes are not hidden behind a next layer. With L = ``PAIRED_STEADY_LAYERS`` layers
    simulated from a cold start to that join (``_paired_layers``), end_L - L (3 (A + M) + steady exposure),
    >= 0. Each stage runs VP chunk pairs per micro-batch (``step_time.stage_time``)."""
    _, last, work = _paired_layers(ep_s, compute_s, mlp_fwd_s, delay_wgrad=delay_wgrad, compute_share=compute_share,
                                   layers=PAIRED_STEADY_LAYERS)
    steady = paired_exposed_s(ep_s, compute_s, mlp_fwd_s, delay_wgrad=delay_wgrad, compute_share=compute_share)
    out: Num = np.maximum(last - PAIRED_STEADY_LAYERS * (work + steady), 0.0)
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
