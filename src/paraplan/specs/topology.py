"""The network as an ordered list of tiers, from the NVLink domain out to the spine.

Each tier is a domain of ``size_gpus`` consecutive ranks whose GPUs reach each other at
``bytes_per_s`` per GPU per direction (line rate), times NCCL's bus fraction, divided by the
tier's oversubscription (a spine with 4:1 oversubscribed uplinks gives each GPU a quarter of its
NIC when every GPU crosses it at once). A parallel group runs on the innermost tier whose domain
holds its rank span (``paraplan.specs.grid``; ``span_in_domain``).

A GPU preset (or file) with only ``nvlink_gbyte_per_s`` / ``network_gbit_per_s`` has two tiers:
the NVLink domain and the network. ``topology:`` in a GPU file (or a calibration profile) lists
them explicitly, and ``--gpu-set topology.<tier>.<field>=value`` changes one field of one tier;
e.g. a rail-optimised leaf of 256 GPUs under a 4:1 spine::

    topology:
      - {name: nvlink}                       # size and rate: the GPU's NVLink domain
      - {name: leaf, size_gpus: 256}         # rate: the GPU's network_gbit_per_s
      - {name: spine, oversubscription: 4}   # the rest of the job

Fields left out inherit: the first tier's size is the NVLink domain and its rate the NVLink rate,
the second tier's rate the network rate, later tiers the rate of the tier inside them; bus
fractions are the efficiency's ``nvlink_bus_frac`` (first tier) and ``network_bus_frac``, latencies
its ``collective_latency_s``.
The last tier reaches every GPU of the job (no ``size_gpus``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict

from paraplan.errors import SpecError
from paraplan.fileio import brief, clip
from paraplan.specs.num import Num

FloatArray = NDArray[np.float64]

TIER_FIELDS: Final = ("name", "size_gpus", "bytes_per_s", "bus_frac", "oversubscription", "latency_s")
"""Fields of a tier in a GPU file (``gbyte_per_s`` / ``gbit_per_s`` may replace bytes_per_s)."""
MAX_TIER_NAME_CHARS: Final = 32
"""Longest tier name (it appears in messages and in plan.json)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TierSpec:
    """One tier as a GPU preset, file or ``--gpu-set`` gives it; None fields inherit (module doc)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: str
    """Tier name (nvlink, leaf, rail, spine, ...)."""
    size_gpus: int | None = None
    """GPUs in one domain of this tier; None: the NVLink domain (first tier), the job (last)."""
    bytes_per_s: float | None = None
    """Line rate per GPU per direction to the other GPUs of the domain."""
    bus_frac: float | None = None
    """NCCL bus bandwidth / line rate on this tier."""
    oversubscription: float = 1.0
    """Downlink : uplink ratio of the switches that join this tier's domains (1 = non-blocking)."""
    latency_s: float | None = None
    """Latency per collective step on this tier (alpha); None: the efficiency's
    ``collective_latency_s``."""

    def __post_init__(self) -> None:
        if not 0 < len(self.name) <= MAX_TIER_NAME_CHARS or not self.name.replace("_", "").replace("-", "").isalnum():
            raise SpecError(f"tier name must be 1 to {MAX_TIER_NAME_CHARS} letters, digits, '-' or '_', "
                            f"got {brief(self.name)}")
        if self.size_gpus is not None and self.size_gpus < 1:
            raise SpecError(f"size_gpus must be >= 1, got {self.size_gpus}")
        if self.bytes_per_s is not None and not 0 < self.bytes_per_s < math.inf:
            raise SpecError(f"bytes_per_s must be a finite number > 0, got {self.bytes_per_s}")
        if self.bus_frac is not None and not 0 < self.bus_frac <= 1:
            raise SpecError(f"bus_frac must be in (0, 1], got {self.bus_frac}")
        if self.latency_s is not None and not 0 <= self.latency_s < math.inf:
            raise SpecError(f"latency_s must be a finite number >= 0, got {self.latency_s}")
        if not 1 <= self.oversubscription < math.inf:
            raise SpecError(f"oversubscription must be a finite number >= 1, got {self.oversubscription}")


def check_tiers(tiers: Sequence[TierSpec], nvlink_domain_size: int) -> None:
    """One-line SpecError unless ``tiers`` nest: >= 2 tiers, unique names, the first the NVLink
    domain, sizes growing by whole multiples, the last without a size."""
    if not tiers:
        return
    if len(tiers) < 2:
        raise SpecError("topology: needs at least 2 tiers (the NVLink domain and the network)")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise SpecError(f"topology: tier names must be unique, got {clip(', '.join(names))}")
    first = tiers[0].size_gpus
    if first is not None and first != nvlink_domain_size:
        raise SpecError(f"topology.{clip(tiers[0].name)}.size_gpus: the first tier is the NVLink domain "
                        f"({nvlink_domain_size} GPUs), got {first}")
    if tiers[-1].size_gpus is not None:
        raise SpecError(f"topology.{clip(tiers[-1].name)}.size_gpus: the last tier reaches the whole job; "
                        "leave size_gpus out")
    inner = nvlink_domain_size
    for t in tiers[1:-1]:
        if t.size_gpus is None:
            raise SpecError(f"topology.{clip(t.name)}.size_gpus is required on a middle tier")
        if t.size_gpus <= inner or t.size_gpus % inner:
            raise SpecError(f"topology.{clip(t.name)}.size_gpus must be a multiple of the tier inside "
                            f"({inner} GPUs) and larger, got {t.size_gpus}")
        inner = t.size_gpus


def span_in_domain(span: Num, block: int) -> NDArray[np.bool_]:
    """True where a group spanning ``span`` consecutive ranks stays inside one domain of ``block``
    consecutive ranks: the span divides the block (groups tile the rank space, so a span dividing
    the block never straddles it)."""
    s = np.asarray(span)
    return np.asarray((s <= 1) | ((s <= block) & (block % np.maximum(s, 1) == 0)))


@dataclass(frozen=True, slots=True)
class Tier:
    """One resolved tier of a job: its domain of ``block_gpus`` consecutive ranks and the NCCL bus
    bandwidth per GPU across it."""

    name: str
    block_gpus: int
    """Consecutive ranks known to share one domain of this tier (the last tier: the world)."""
    busbw_bytes_per_s: float
    """Line rate x bus fraction / oversubscription, per GPU per direction."""
    latency_s: float
    """Latency per collective step (alpha of the alpha-beta model)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """The tiers of one job, innermost (NVLink) first."""

    tiers: tuple[Tier, ...]

    @property
    def nvlink(self) -> Tier:
        """The innermost tier (the NVLink domain)."""
        return self.tiers[0]

    def busbw(self, span: Num, *, start: int = 0) -> FloatArray:
        """Bus bandwidth of the innermost tier (from ``start`` outwards) holding ``span`` ranks."""
        out: FloatArray = np.asarray(np.full(np.shape(span), self.tiers[-1].busbw_bytes_per_s))
        for t in reversed(self.tiers[start:-1]):
            out = np.where(span_in_domain(span, t.block_gpus), t.busbw_bytes_per_s, out)
        return out

    def latency_s(self, span: Num) -> FloatArray:
        """Collective latency of the innermost tier holding ``span`` ranks."""
        out: FloatArray = np.asarray(np.full(np.shape(span), self.tiers[-1].latency_s))
        for t in reversed(self.tiers[:-1]):
            out = np.where(span_in_domain(span, t.block_gpus), t.latency_s, out)
        return out

    def peers_within(self, n: Num, stride: Num, tier: Tier) -> FloatArray:
        """Members of a group of ``n`` ranks spaced ``stride`` apart that share one domain of
        ``tier`` with a given member, itself included, for the slowest member: all of them when
        the group's span tiles the domain; else the group straddles two domains somewhere, and
        its straddling member has at most half of its peers (an even split) there."""
        per_domain = np.clip(tier.block_gpus // np.maximum(stride, 1), 1, None)
        tiles = span_in_domain(np.asarray(n) * np.asarray(stride), tier.block_gpus)
        return np.asarray(np.where(tiles, n, np.minimum(np.minimum(n, per_domain), np.ceil(n / 2))), dtype=float)


def scale_up_segment_nodes(nvlink_domain_size: int, gpus_per_node: int, num_nodes: int) -> int | None:
    """Nodes per power-of-two segment of a multi-node NVLink domain (GB200/GB300 NVL72: 64 GPUs =
    16 trays of 4) when the job spans several such domains; None for one-node domains (HGX) or a
    job inside one domain."""
    domain_nodes = nvlink_domain_size // gpus_per_node
    if domain_nodes <= 1 or num_nodes <= domain_nodes:
        return None
    return max((1 << (nvlink_domain_size.bit_length() - 1)) // gpus_per_node, 1)


def scale_up_block_gpus(nvlink_domain_size: int, gpus_per_node: int, num_gpus: int) -> int:
    """Consecutive ranks guaranteed to share one NVLink domain.

    HGX: the node's domain. A job inside one NVL72 rack: the whole job. A multi-rack job whose
    nodes tile into power-of-two segments: the segment (64 GPUs), which Slurm keeps rack-local
    with ``--segment``. Otherwise the racks are taken in order, 72 ranks each."""
    if nvlink_domain_size <= gpus_per_node:
        return nvlink_domain_size
    if num_gpus <= nvlink_domain_size:
        return num_gpus
    num_nodes = max(1, -(-num_gpus // gpus_per_node))
    seg = scale_up_segment_nodes(nvlink_domain_size, gpus_per_node, num_nodes)
    if seg is not None and num_nodes % seg == 0:
        return seg * gpus_per_node
    return nvlink_domain_size


def resolve_topology(tiers: Sequence[TierSpec], *, nvlink_block_gpus: int, num_gpus: int,
                     nvlink_bytes_per_s: float, network_bytes_per_s: float,
                     nvlink_bus_frac: float, network_bus_frac: float, collective_latency_s: float) -> Topology:
    """The job's tiers: ``tiers`` with inherited fields filled in, or the two tiers (NVLink domain,
    network) of a GPU that lists none. A middle tier's block is its size, or the job when the job
    fits in one of its domains (the scheduler places it there, as in one NVL72 rack)."""
    specs = list(tiers) or [TierSpec(name="nvlink"), TierSpec(name="network")]
    out: list[Tier] = []
    rate = nvlink_bytes_per_s
    for i, t in enumerate(specs):
        rate = t.bytes_per_s if t.bytes_per_s is not None else (network_bytes_per_s if i == 1 else rate)
        frac = t.bus_frac if t.bus_frac is not None else (nvlink_bus_frac if i == 0 else network_bus_frac)
        if i == 0:
            block = nvlink_block_gpus
        elif t.size_gpus is None:
            block = num_gpus
        else:
            block = min(t.size_gpus, num_gpus)
        alpha = t.latency_s if t.latency_s is not None else collective_latency_s
        out.append(Tier(name=t.name, block_gpus=block, busbw_bytes_per_s=rate * frac / t.oversubscription,
                        latency_s=alpha))
    return Topology(tiers=tuple(out))
