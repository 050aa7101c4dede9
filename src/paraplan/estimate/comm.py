"""Collective communication times (alpha-beta model) and which network tier each group uses.

Alpha-beta costs of ring collectives (Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)), with
NCCL's bus-bandwidth convention (nccl-tests ``doc/PERFORMANCE.md``; ecosystem.md section 4.3):
    all-reduce      t = 2(n-1)/n * S / busbw + 2 * log2(n) * alpha
    all-gather,
    reduce-scatter  t =  (n-1)/n * S / busbw +     log2(n) * alpha
    all-to-all      t =  (n-1)/n * S / busbw +     log2(n) * alpha     (S = bytes each rank holds)
    send/recv       t =            S / bw    +               alpha
The bandwidth term is the ring's; the latency term is a tree's (NCCL switches to tree/NVLS
algorithms when latency dominates, so a ring's (n-1)*alpha over-states large groups).
S is the full (unsharded) buffer size, busbw the per-GPU bus bandwidth of the tier the group
runs on: NVLink when the group's ranks lie in one NVLink domain, else the network.

Placement follows Megatron-Core's rank order (``paraplan.specs.grid``): a group whose members are
spaced ``stride`` ranks apart spans ``stride * size`` consecutive ranks, and runs on the
innermost tier of the job's ``Topology`` (``paraplan.specs.topology``) whose domain holds that
span. All functions are vectorised.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.num import Num
from paraplan.specs.topology import span_in_domain

__all__ = ["all_gather_s", "all_reduce_s", "all_to_all_s", "p2p_s", "reduce_scatter_s", "ring_busbw",
           "span_in_domain", "tier_busbw", "tier_latency_s", "tier_rates"]


ALL_REDUCE_PASSES: Final = 2.0
"""A ring all-reduce is a reduce-scatter then an all-gather (Thakur et al. 2005): twice the bytes
and latency steps of either."""


def tier_rates(cluster: ClusterSpec) -> tuple[float, ...]:
    """Bus bandwidth per GPU in bytes/s of each tier, NVLink first: line rate x NCCL bus fraction
    / oversubscription (two tiers, NVLink and network, unless the GPU lists more)."""
    return tuple(t.busbw_bytes_per_s for t in cluster.topology.tiers)


def tier_busbw(cluster: ClusterSpec, span: Num) -> Num:
    """Per-GPU bus bandwidth (bytes/s) of a group spanning ``span`` consecutive ranks: the
    innermost tier whose domain holds the span."""
    return cluster.topology.busbw(span)


def tier_latency_s(cluster: ClusterSpec, span: Num) -> Num:
    """Latency per collective step (alpha) of the tier a group spanning ``span`` ranks runs on."""
    return cluster.topology.latency_s(span)


def ring_busbw(cluster: ClusterSpec, n: Num, stride: Num) -> Num:
    """Per-GPU bus bandwidth (bytes/s) of a ring collective (all-reduce, reduce-scatter,
    all-gather) over ``n`` ranks spaced ``stride`` apart.

    Inside one NVLink domain: the NVLink bus bandwidth. Across domains, NCCL gives each ring
    channel its own NIC, so the edges that leave a domain together carry the NICs of every group
    member in it: busbw = min(NVLink busbw, n_local x busbw of the outermost tier crossed),
    n_local = min(n, domain // stride) members per NVLink domain (ecosystem.md 4.3: multi-node
    H100 ring all-reduce ~8 x 46-48 GB/s per node; nccl-tests#119: 4 HDR NICs per 8 GPUs, 100 GB/s
    theoretical, 85-96 GB/s measured). A group with one member per domain (e.g. DP under TP 8)
    gets one NIC; behind an oversubscribed spine each NIC gets its share of the uplinks.
    """
    topo = cluster.topology
    nvlink = topo.nvlink.busbw_bytes_per_s
    n_arr, stride_arr = np.asarray(n), np.asarray(stride)
    block = topo.nvlink.block_gpus
    span = n_arr * stride_arr
    n_local = np.clip(np.minimum(n_arr, block // np.maximum(stride_arr, 1)), 1, None)
    inside = span_in_domain(span, block)
    return np.where(inside, nvlink, np.minimum(nvlink, n_local * topo.busbw(span, start=1)))


def all_reduce_s(size_bytes: Num, n: Num, busbw: Num, alpha_s: Num) -> Num:
    """Ring all-reduce time; 0 for a group of one."""
    n = np.asarray(n)
    t = (ALL_REDUCE_PASSES * (n - 1) / np.maximum(n, 1) * size_bytes / busbw
         + ALL_REDUCE_PASSES * np.log2(np.maximum(n, 1)) * alpha_s)
    return np.where(n > 1, t, 0.0)


def all_gather_s(size_bytes: Num, n: Num, busbw: Num, alpha_s: Num) -> Num:
    """Ring all-gather (or reduce-scatter) time of an S-byte full buffer; 0 for a group of one."""
    n = np.asarray(n)
    t = (n - 1) / np.maximum(n, 1) * size_bytes / busbw + np.log2(np.maximum(n, 1)) * alpha_s
    return np.where(n > 1, t, 0.0)


reduce_scatter_s = all_gather_s


def all_to_all_s(
    cluster: ClusterSpec, size_bytes: Num, n: Num, stride: Num, alpha_s: Num
) -> Num:
    """All-to-all of S bytes per rank over a group of n ranks spaced ``stride`` apart.

    Each peer is reached on the innermost tier whose domain it shares with the sender
    (``Topology.peers_within``: a group that does not tile a domain is costed for its straddling
    member, at most half of its peers inside): with c_k the peers first reached on tier k,
    t = S * sum_k (c_k/n)/busbw_k + log2(n)*alpha (the n-1 sends are issued concurrently, so
    latency does not add up per peer).
    """
    topo = cluster.topology
    n_arr = np.asarray(n)
    n1 = np.maximum(n_arr, 1)
    seen = np.asarray(0.0)
    per_byte: Num = 0.0
    for tier in topo.tiers[:-1]:
        within = np.maximum(topo.peers_within(n_arr, stride, tier) - 1, seen)
        per_byte = per_byte + (within - seen) / n1 / tier.busbw_bytes_per_s
        seen = within
    per_byte = per_byte + (n_arr - 1 - seen) / n1 / topo.tiers[-1].busbw_bytes_per_s
    t = size_bytes * per_byte
    return np.where(n_arr > 1, t + np.log2(n1) * alpha_s, 0.0)


def p2p_s(size_bytes: Num, bw: Num, alpha_s: Num) -> Num:
    """Point-to-point send (or receive) time."""
    return size_bytes / bw + alpha_s
