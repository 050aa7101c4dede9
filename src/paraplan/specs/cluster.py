"""GPU and cluster description: peaks, memory, the NVLink tier and the inter-node tier.

Every preset number lives in ``specs/presets/gpus/*.yaml`` with its source. Rates are stored
per direction and dense (not "with sparsity"); capacities in bytes. The efficiency parameters of
the performance model are part of the GPU spec (``EfficiencySpec``): they are calibrated
against measured runs (``benchmarks/calibration.py``) and can be overridden by a cluster profile
(``paraplan calibrate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Final

from pydantic import ConfigDict

from paraplan.errors import SpecError
from paraplan.fileio import brief
from paraplan.specs.topology import (
    TierSpec,
    Topology,
    check_tiers,
    resolve_topology,
    scale_up_block_gpus,
    scale_up_segment_nodes,
)
from paraplan.units import GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencySpec:
    """Achievable fractions of the datasheet peaks, and fixed overheads (calibrated).

    Defaults are physically plausible starting points; the GPU presets carry calibrated values
    (see docs/model.md, "Calibration").
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    gemm_max_frac: float = 0.80
    """Large-GEMM fraction of the dense peak (cuBLASLt m=n=k=8192: A100 81%, H200 FP8 66%)."""
    gemm_half_dim: float = 256.0
    """GEMM dimension at which efficiency falls to half of ``gemm_max_frac`` (skinny GEMMs)."""
    fp8_gemm_speedup: float = 1.6
    """Speed-up of FP8 GEMMs over BF16 end-to-end (casts, amax, BF16 attention included)."""
    attention_frac: float = 0.55
    """Flash-attention forward fraction of the dense peak (FA2 hdim 128: H200 329/989)."""
    hbm_frac: float = 0.75
    """Achieved fraction of HBM bandwidth for element-wise kernels."""
    elementwise_bytes_per_token_hidden: float = 60.0
    """HBM bytes moved by element-wise kernels per layer per token per hidden unit (fwd+bwd)."""
    nvlink_bus_frac: float = 0.80
    """NCCL bus bandwidth / NVLink line rate (H100: ~370 of 450 GB/s, nccl-tests#212)."""
    network_bus_frac: float = 0.90
    """NCCL bus bandwidth / NIC line rate (NDR 400G: 46-48 of 50 GB/s, nccl-tests#290)."""
    collective_latency_s: float = 20e-6
    """Latency per collective step (alpha of the alpha-beta model)."""
    layer_overhead_s: float = 100e-6
    """Host time to issue one layer's kernels per micro-batch (fwd+bwd), independent of size. The
    GPU runs behind the host, so a layer takes max(GPU time, this): small layers are launch-bound
    (vTrain: time per micro-batch flat from mbs 1 to 4 for h = 1024)."""
    step_overhead_s: float = 0.05
    """Fixed time per iteration (data loader, logging, optimizer launch)."""
    tp_overlap_frac: float = 0.0
    """Share of TP/SP communication hidden without --tp-comm-overlap."""
    tp_comm_overlap_frac: float = 0.6
    """No longer read: --tp-comm-overlap (userbuffers) is modelled per GEMM pair (``estimate.time.tp``
    ``ub_block_exposure``), not as a share. Kept so that GPU presets and cluster profiles that carry it still load."""
    dp_overlap_frac: float = 0.8
    """Share of DP gradient reduce / param gather hidden by --overlap-grad-reduce/-param-gather."""
    cp_overlap_frac: float = 0.8
    """Share of the CP ring exchange hidden behind attention compute."""
    pp_overlap_frac: float = 0.8
    """Share of pipeline send/recv hidden (interleaved schedule; half of it without interleaving)."""
    ep_overlap_frac: float = 0.0
    """Share of the EP all-to-all hidden (0 unless overlap is configured)."""
    moe_overhead_frac: float = 0.25
    """Extra time of MoE layers over their routed GEMM time, as a share of it: the grouped GEMM's imbalance and
    small-m tiles, the router's top-k, softmax and aux-loss kernels, whatever else the fit finds. Fitted per
    architecture. The dispatcher's row copies (permute / unpermute, alltoall's sort by local expert, the experts'
    quantization padding) are not in it: ``estimate.time.permute`` counts their bytes per dispatcher."""
    moe_layer_overhead_s: float = 0.0
    """Retired (issue 18, session 10): no time term reads it. It was a per-sync constant of an MoE dispatcher's host
    sync (Blackwell 1.206 ms, fitted as a per-layer constant before the host-bound term existed), and it charged the
    GPU's wait after the sync a second time beside ``host_op_issue_s``. The wait is now one mechanism: the ops the
    host issues after the sync on the drained GPU (``estimate.time.moe_sync.post_sync_ops`` and
    ``host_bound_ops``) at ``host_op_issue_s`` each. The field stays so that presets and cluster profiles load."""
    host_op_issue_s: float = 0.0
    """Host (CPU) time to issue one op of an MoE layer's code path (a PyTorch operator, a Transformer Engine call, a
    collective, a stream or event call: ``estimate.time.moe_sync.host_issue_ops``) where the host cannot run ahead of
    the GPU: after each dispatcher sync the GPU has drained its queue and waits while the host issues the layer's
    next ops (``moe_sync.host_bound_ops``), so a layer takes max(GPU time, ops x this). Fitted (benchmarks/
    fit_efficiency.py, inside every cross-validation fold), not derived: Python, PyTorch dispatch and TE wrapper cost
    per call depend on the host CPU, so it is fitted per host kind where the rows allow (``host_kind``: Grace or
    x86). 0: host issue never binds (the uncalibrated default)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            lo, lo_open, hi = EFFICIENCY_RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value < lo or (lo_open and value == lo) or value > hi:
                span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
                raise SpecError(f"gpu.efficiency.{f.name} must be in {span}, got {brief(value)}")


EFFICIENCY_RANGES: dict[str, tuple[float, bool, float]] = {
    **{name: (1e-3, False, 1.0) for name in ("gemm_max_frac", "attention_frac", "hbm_frac", "nvlink_bus_frac",
                                             "network_bus_frac")},
    **{name: (0.0, False, 1.0) for name in ("tp_overlap_frac", "tp_comm_overlap_frac", "dp_overlap_frac",
                                            "cp_overlap_frac", "pp_overlap_frac", "ep_overlap_frac")},
    "fp8_gemm_speedup": (0.1, False, 10.0), "moe_overhead_frac": (0.0, False, 100.0),
    "gemm_half_dim": (0.0, False, 2.0**20), "elementwise_bytes_per_token_hidden": (0.0, False, 1e4),
    **{name: (0.0, False, 1.0) for name in ("collective_latency_s", "layer_overhead_s", "moe_layer_overhead_s",
                                            "host_op_issue_s")},
    "step_overhead_s": (0.0, False, 3600.0),
}
"""(lower bound, lower bound excluded, upper bound) of every EfficiencySpec field: physical bounds, so
that no finite input makes a time nan or 100 digits long. Fractions of a peak in [0.001, 1] (1e-320
underflowed the step time to nan), shares hidden in [0, 1], FP8 speed-up in [0.1, 10], latencies and
per-layer overheads at most 1 s, the per-step overhead at most an hour, dimensions at most 2^20."""

GPU_RANGES: dict[str, tuple[float, float, str]] = {
    "hbm_bytes": (1e6, 1e18, "bytes"), "reserved_bytes": (0.0, 1e18, "bytes"),
    **{name: (1e3, 1e18, "bytes/s") for name in ("hbm_bytes_per_s", "nvlink_bytes_per_s", "network_bytes_per_s",
                                                 "host_link_bytes_per_s")},
    **{name: (1e3, 1e18, "FLOP/s") for name in ("peak_bf16_flops_per_s", "peak_fp8_flops_per_s",
                                                 "peak_fp32_simt_flops_per_s", "peak_fp4_flops_per_s")},
    "sfu_exp_per_s": (1e3, 1e18, "exponentials/s"),
}
"""(lowest, highest, unit) of GpuSpec's capacities, bandwidths and peaks: physical bounds, far around
any real GPU (H100: 80 GB, 3.35e12 bytes/s, 9.9e14 FLOP/s), so that times stay finite and readable."""


MAX_SM_COUNT: Final = 1024
"""Largest ``sm_count`` accepted (GPUs have at most a few hundred SMs; H100 SXM5 132)."""


HOST_LINK_DEFAULT_BYTES_PER_S: Final = {"pcie5": 64e9, "pcie4": 32e9, "nvlink_c2c": 450e9}
"""GPU <-> host bandwidth per direction by link (Transformer Engine docs, "CPU Offloading", Hardware Support:
PCIe Gen5 x16 128 GB/s bidirectional, NVLink-C2C on GB200 900 GB/s bidirectional; PCIe Gen4 x16 is half of Gen5)."""


HOST_KINDS: Final = ("grace", "x86")
"""Host CPU kinds of the GPU presets (``host_kind``)."""


def host_kind(name: str) -> str:
    """The host CPU of a GPU preset: "grace" for the Grace superchips (``gb...`` / ``gh...`` presets: GB200 and
    GB300 NVL72 pair each Blackwell GPU with an Arm Neoverse V2 Grace CPU over NVLink-C2C, NVIDIA GB200 NVL72 and
    GB300 NVL72 product pages), "x86" otherwise (DGX/HGX H100, H200, B200 and B300 carry Intel Xeon hosts over
    PCIe: NVIDIA DGX H100 / B200 / B300 user guides; A100 DGX: AMD EPYC). The same split as
    ``host_link_default_bytes_per_s``."""
    return "grace" if name.startswith(("gb", "gh")) else "x86"


def host_link_default_bytes_per_s(name: str, arch: str) -> float:
    """The host link of a GPU preset: NVLink-C2C for the Grace superchips (``gb...`` presets: GB200, GB300),
    PCIe Gen4 for Ampere, PCIe Gen5 otherwise (H100/H200/B200/B300 HGX, MI300X)."""
    if name.startswith(("gb", "gh")):
        return HOST_LINK_DEFAULT_BYTES_PER_S["nvlink_c2c"]
    if arch == "ampere":
        return HOST_LINK_DEFAULT_BYTES_PER_S["pcie4"]
    return HOST_LINK_DEFAULT_BYTES_PER_S["pcie5"]


MAX_GPUS_PER_DOMAIN = 2**16
MAX_NUM_GPUS = 2**40
"""Largest world paraplan takes (about 10^12 GPUs): world-size arithmetic stays far inside int64."""
"""Largest gpus_per_node / nvlink_domain_size accepted (NVL576 is the largest announced domain)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU model, with its node and network (per-GPU) figures."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    """Preset name (e.g. ``h100-80gb``)."""
    hbm_bytes: float
    """HBM capacity as the driver reports it."""
    hbm_bytes_per_s: float
    """HBM bandwidth (datasheet)."""
    peak_bf16_flops_per_s: float
    """Dense BF16 tensor-core peak."""
    peak_fp8_flops_per_s: float | None
    """Dense FP8 tensor-core peak; None where the GPU has no FP8 (A100)."""
    peak_fp32_simt_flops_per_s: float | None = None
    """FP32 peak without tensor cores (CUDA cores): the rate of GEMMs whose dimensions tensor cores
    cannot take; None where the datasheet read for this repo does not give it (then
    ``simt_flops_per_s`` uses peak_bf16 / 16, the A100 ratio 312/19.5)."""
    nvlink_bytes_per_s: float
    """Scale-up (NVLink / Infinity Fabric) bandwidth per GPU per direction."""
    network_bytes_per_s: float
    """Scale-out (InfiniBand / RoCE) bandwidth per GPU per direction."""
    gpus_per_node: int
    """GPUs per server (compute tray for NVL72 systems)."""
    nvlink_domain_size: int
    """GPUs reachable over NVLink (8 on HGX/DGX, 72 on GB200/GB300 NVL72)."""
    host_link_bytes_per_s: float | None = None
    """GPU <-> host (CPU memory) bandwidth per direction, what activation and optimizer offloading move over; None:
    ``HOST_LINK_DEFAULT_BYTES_PER_S`` for the GPU (``host_bytes_per_s``)."""
    reserved_bytes: float = 1.5 * GIB
    """Memory not available to PyTorch's allocator (CUDA context, NCCL, cuBLAS/TE workspaces)."""
    arch: str = ""
    """Architecture family (ampere, hopper, blackwell, cdna3)."""
    source: str = ""
    """Datasheets / measurements the numbers come from."""
    notes: str = ""
    """How numbers were converted (per direction, dense, GiB)."""
    topology: tuple[TierSpec, ...] = ()
    """Network tiers from the NVLink domain outwards (``paraplan.specs.topology``); empty: two
    tiers, NVLink domain and network, from the rates above."""
    peak_fp4_flops_per_s: float | None = None
    """Dense NVFP4 tensor-core peak (Blackwell); None where the GPU has no FP4 tensor cores."""
    sm_count: int | None = None
    """Streaming multiprocessors (SMs) of the GPU as shipped (NVIDIA's architecture whitepapers: A100 108, H100 SXM5
    132): what a communication kernel holding some of them leaves to the compute it overlaps
    (``estimate.time.ep.compute_share_beside``); None where no primary figure was read for this repo (Blackwell,
    MI300X): that slowdown is then not modelled."""
    sfu_exp_per_s: float | None = None
    """Peak rate of the special-function units' base-2 exponential (``MUFU.EX2``, the exponential of flash
    attention's softmax), exponentials per second per GPU: SMs x exponentials per clock per SM (CUDA C++ Programming
    Guide, arithmetic-instruction throughput table) x clock. None where no primary figure was read for this repo:
    attention is then bound by its MMA rate only (``estimate.time.compute.flash_attention_bounds_s``)."""
    efficiency: EfficiencySpec = field(default_factory=EfficiencySpec)
    """Calibrated efficiency parameters of the performance model."""
    efficiency_calibrated: bool = True
    """False when ``efficiency`` is EfficiencySpec's defaults, fitted to no run on this GPU (MI300X):
    time figures are then indicative and estimates say so."""

    @property
    def usable_bytes(self) -> float:
        """What PyTorch's allocator can use: HBM less ``reserved_bytes`` (a layout fits when its peak is at
        most this). The one place that subtracts the two."""
        return self.hbm_bytes - self.reserved_bytes

    @property
    def host_bytes_per_s(self) -> float:
        """GPU <-> host bandwidth per direction: ``host_link_bytes_per_s``, else NVLink-C2C on Grace superchips
        (GB200/GB300), PCIe Gen4 x16 on Ampere and PCIe Gen5 x16 elsewhere (``host_link_default_bytes_per_s``)."""
        if self.host_link_bytes_per_s is not None:
            return self.host_link_bytes_per_s
        return host_link_default_bytes_per_s(self.name, self.arch)

    @property
    def simt_flops_per_s(self) -> float:
        """FP32 CUDA-core peak: the datasheet figure, else peak_bf16 / 16 (A100: 312 / 19.5)."""
        if self.peak_fp32_simt_flops_per_s is not None:
            return self.peak_fp32_simt_flops_per_s
        return self.peak_bf16_flops_per_s / 16.0

    def __post_init__(self) -> None:
        for fname in ("hbm_bytes", "hbm_bytes_per_s", "peak_bf16_flops_per_s", "peak_fp8_flops_per_s",
                      "peak_fp32_simt_flops_per_s", "nvlink_bytes_per_s", "network_bytes_per_s", "reserved_bytes",
                      "host_link_bytes_per_s", "peak_fp4_flops_per_s", "sfu_exp_per_s"):
            value = getattr(self, fname)
            if value is None:
                continue
            if not (math.isfinite(value) and (value >= 0 if fname == "reserved_bytes" else value > 0)):
                raise SpecError(f"gpu.{fname} must be a finite number {'>=' if fname == 'reserved_bytes' else '>'} 0, "
                                f"got {value}")
            lo, hi, unit = GPU_RANGES[fname]
            if not lo <= value <= hi:
                raise SpecError(f"gpu.{fname} must be in [{lo:g}, {hi:g}] {unit}, got {brief(value)}")
        if self.reserved_bytes >= self.hbm_bytes:  # nothing left for the allocator: every layout would be "over"
            raise SpecError(f"reserved_gib ({self.reserved_bytes / GIB:g}) must be less than hbm_gib "
                            f"({self.hbm_bytes / GIB:g}): no usable memory would be left")
        sms = self.sm_count
        if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int) or not 1 <= sms <= MAX_SM_COUNT):
            raise SpecError(f"gpu.sm_count must be an integer from 1 to {MAX_SM_COUNT} or unset, got {brief(sms)}")
        for fname in ("gpus_per_node", "nvlink_domain_size"):
            value = getattr(self, fname)
            if not 1 <= value <= MAX_GPUS_PER_DOMAIN:
                raise SpecError(f"gpu.{fname} must be in [1, {MAX_GPUS_PER_DOMAIN}], got {value}")
        check_tiers(self.topology, self.nvlink_domain_size)

    def peak_flops_per_s(self, precision: str) -> float:
        """Dense peak for a precision ('bf16', 'fp16', 'fp8' or 'fp4').

        FP4 (NVFP4) needs FP4 tensor cores: Transformer Engine's ``check_nvfp4_support`` (quantization.py)
        refuses a device below compute capability 10.0 (Blackwell)."""
        if precision == "fp4":
            if self.peak_fp4_flops_per_s is None:
                raise SpecError(f"precision fp4 (NVFP4) is not supported on {self.name}: Transformer Engine: "
                                "'Device compute capability 10.0 or higher required for NVFP4 execution.' "
                                "(B200, GB200, B300, GB300)")
            return self.peak_fp4_flops_per_s
        if precision == "fp8":  # fp16 tensor cores run at the bf16 rate
            if self.peak_fp8_flops_per_s is None:
                raise SpecError(f"precision fp8 is not supported on {self.name} (no FP8 tensor cores)")
            return self.peak_fp8_flops_per_s
        return self.peak_bf16_flops_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The GPUs a job runs on: GPU model, count, node size and NVLink domain."""

    gpu: GpuSpec
    num_gpus: int
    """World size."""
    gpus_per_node: int
    """GPUs per node (processes per node for torchrun)."""
    nvlink_domain_size: int
    """GPUs per NVLink domain (TP/CP/EP groups should stay inside one)."""

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise SpecError(f"num_gpus must be a positive integer, got {self.num_gpus}")
        if self.num_gpus > MAX_NUM_GPUS:
            raise SpecError(f"num_gpus must be at most {MAX_NUM_GPUS:,} (2^40, the limit), got {self.num_gpus:,}")
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_DOMAIN:
            raise SpecError(f"gpus_per_node must be in [1, {MAX_GPUS_PER_DOMAIN}], got {self.gpus_per_node}")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise SpecError(
                f"num_gpus ({self.num_gpus}) must be a multiple of gpus_per_node "
                f"({self.gpus_per_node}) on more than one node"
            )

    @property
    def num_nodes(self) -> int:
        """Nodes used (at least one)."""
        return max(1, -(-self.num_gpus // self.gpus_per_node))

    @property
    def segment_nodes(self) -> int | None:
        """Nodes per power-of-two segment of a multi-node NVLink domain when the job spans several
        (``topology.scale_up_segment_nodes``); ``paraplan launch`` asks Slurm for these segments
        (``--segment``)."""
        return scale_up_segment_nodes(self.nvlink_domain_size, self.gpus_per_node, self.num_nodes)

    @property
    def nvlink_block_gpus(self) -> int:
        """Consecutive ranks guaranteed to share one NVLink domain (``topology.scale_up_block_gpus``);
        a parallel group stays on NVLink when its rank span divides this block."""
        return scale_up_block_gpus(self.nvlink_domain_size, self.gpus_per_node, self.num_gpus)

    @property
    def topology(self) -> Topology:
        """This job's network tiers, NVLink domain first (``topology.resolve_topology``)."""
        gpu, eff = self.gpu, self.gpu.efficiency
        return resolve_topology(gpu.topology, nvlink_block_gpus=self.nvlink_block_gpus, num_gpus=self.num_gpus,
                                nvlink_bytes_per_s=gpu.nvlink_bytes_per_s, network_bytes_per_s=gpu.network_bytes_per_s,
                                nvlink_bus_frac=eff.nvlink_bus_frac, network_bus_frac=eff.network_bus_frac,
                                collective_latency_s=eff.collective_latency_s)


def make_cluster(gpu: GpuSpec, num_gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """Cluster of ``num_gpus`` GPUs; node size defaults to the GPU preset's.

    The NVLink domain is the preset's when it spans several nodes (NVL72 racks), otherwise
    the node: ``--gpus-per-node 4`` on an HGX H100 gives a 4-GPU NVLink domain.
    """
    per_node = gpus_per_node if gpus_per_node is not None else gpu.gpus_per_node
    if gpu.nvlink_domain_size > gpu.gpus_per_node:
        domain = gpu.nvlink_domain_size
    else:
        domain = per_node
    return ClusterSpec(gpu=gpu, num_gpus=num_gpus, gpus_per_node=per_node, nvlink_domain_size=domain)


def with_efficiency(gpu: GpuSpec, efficiency: EfficiencySpec) -> GpuSpec:
    """The same GPU with other efficiency parameters (a calibrated cluster profile)."""
    return replace(gpu, efficiency=efficiency)
