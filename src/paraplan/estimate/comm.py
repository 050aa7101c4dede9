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

Placement follows Megatron-Core's default rank order ``tp-cp-ep-dp-pp`` (TP fastest): a group
whose members are spaced ``stride`` ranks apart spans ``stride * size`` consecutive ranks.
All functions are vectorised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paraplan.specs.cluster import ClusterSpec

Num = Any


def span_in_domain(span: Num, block: int) -> Num:
    """True where a group spanning ``span`` consecutive ranks stays inside one NVLink domain: the
    span divides ``block``, the consecutive ranks known to share a domain
    (``ClusterSpec.nvlink_block_gpus``: the HGX node; the job inside one NVL72 rack; a 64-GPU rack
    segment of a multi-rack job, as NeMo's ``--segment`` placement makes it; else a 72-GPU rack).
    Groups tile the rank space, so a span dividing the block never straddles it.
    """
    span = np.asarray(span)
    return (span <= 1) | ((span <= block) & (block % np.maximum(span, 1) == 0))


def tier_rates(cluster: ClusterSpec) -> tuple[float, float]:
    """(NVLink, network) bus bandwidth per GPU in bytes/s: line rate x NCCL bus fraction."""
    eff = cluster.gpu.efficiency
    return (cluster.gpu.nvlink_bytes_per_s * eff.nvlink_bus_frac,
            cluster.gpu.network_bytes_per_s * eff.network_bus_frac)


def tier_busbw(cluster: ClusterSpec, span: Num) -> Num:
    """Per-GPU bus bandwidth (bytes/s) of a group spanning ``span`` consecutive ranks."""
    nvlink, network = tier_rates(cluster)
    return np.where(span_in_domain(span, cluster.nvlink_block_gpus), nvlink, network)


def ring_busbw(cluster: ClusterSpec, n: Num, stride: Num) -> Num:
    """Per-GPU bus bandwidth (bytes/s) of a ring collective (all-reduce, reduce-scatter,
    all-gather) over ``n`` ranks spaced ``stride`` apart.

    Inside one NVLink domain (``span_in_domain``): the NVLink bus bandwidth. Across domains, NCCL
    gives each ring channel its own NIC, so the edges that leave a domain together carry the NICs
    of every group member in it: busbw = min(NVLink busbw, n_local x NIC busbw), n_local =
    min(n, domain // stride) members per domain (ecosystem.md 4.3: multi-node H100 ring
    all-reduce ~8 x 46-48 GB/s per node; nccl-tests#119: 4 HDR NICs per 8 GPUs, 100 GB/s
    theoretical, 85-96 GB/s measured). A group with one member per domain (e.g. DP under TP 8)
    gets one NIC.
    """
    nvlink, network = tier_rates(cluster)
    n, stride = np.asarray(n), np.asarray(stride)
    block = cluster.nvlink_block_gpus
    n_local = np.clip(np.minimum(n, block // np.maximum(stride, 1)), 1, None)
    inside = span_in_domain(n * stride, block)
    return np.where(inside, nvlink, np.minimum(nvlink, n_local * network))


def all_reduce_s(size_bytes: Num, n: Num, busbw: Num, alpha_s: float) -> Num:
    """Ring all-reduce time; 0 for a group of one."""
    n = np.asarray(n)
    t = 2.0 * (n - 1) / np.maximum(n, 1) * size_bytes / busbw + 2.0 * np.log2(np.maximum(n, 1)) * alpha_s
    return np.where(n > 1, t, 0.0)


def all_gather_s(size_bytes: Num, n: Num, busbw: Num, alpha_s: float) -> Num:
    """Ring all-gather (or reduce-scatter) time of an S-byte full buffer; 0 for a group of one."""
    n = np.asarray(n)
    t = (n - 1) / np.maximum(n, 1) * size_bytes / busbw + np.log2(np.maximum(n, 1)) * alpha_s
    return np.where(n > 1, t, 0.0)


reduce_scatter_s = all_gather_s


def all_to_all_s(
    cluster: ClusterSpec, size_bytes: Num, n: Num, stride: Num, alpha_s: float
) -> Num:
    """All-to-all of S bytes per rank over a group of n ranks spaced ``stride`` apart.

    Peers inside the same NVLink domain are reached over NVLink, the rest over the network
    (placement as ``span_in_domain``; a group that does not tile the domain is costed for its
    straddling member, at most half of its peers on NVLink):
    t = S*(n_intra/n)/bw_nvlink + S*(n_inter/n)/bw_network + log2(n)*alpha (the n-1 sends are
    issued concurrently, so latency does not add up per peer).
    """
    nvlink, network = tier_rates(cluster)
    n = np.asarray(n)
    per_domain = np.clip(cluster.nvlink_block_gpus // np.maximum(stride, 1), 1, None)
    # a group whose span does not tile the domain straddles two domains somewhere; the slowest
    # (straddling) group sets the pace, and it has at most half its peers on NVLink (even split)
    tiles = span_in_domain(n * stride, cluster.nvlink_block_gpus)
    intra = np.where(tiles, n, np.minimum(np.minimum(n, per_domain), np.ceil(n / 2))) - 1
    inter = n - 1 - intra
    t = size_bytes * (intra / np.maximum(n, 1) / nvlink + inter / np.maximum(n, 1) / network)
    return np.where(n > 1, t + np.log2(np.maximum(n, 1)) * alpha_s, 0.0)


def p2p_s(size_bytes: Num, bw: Num, alpha_s: float) -> Num:
    """Point-to-point send (or receive) time."""
    return size_bytes / bw + alpha_s
