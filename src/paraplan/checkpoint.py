"""Checkpoint size, save/load time and host-memory staging per layout (Megatron distributed checkpoints).

What one save writes (Megatron-LM main @ d98e8a6; megatron-core 0.16.1 has the same code):

* ``--ckpt-format torch_dist`` (the default; ``megatron/training/checkpointing.py`` ``save_checkpoint`` calls
  ``dist_checkpointing.save`` with a ``FullyParallelSaveStrategyWrapper`` over the DP x CP group, since
  ``--ckpt-fully-parallel-save`` is on by default): the model's ``sharded_state_dict`` holds each rank's
  bf16/fp16 weight shards (2 B/param), replicated over DP x CP for dense parameters (``replica_id`` = the DP-with-CP
  rank) and over expert-DP for experts; the fully parallel wrapper spreads the replicas' writes evenly over that
  group, so each rank writes 2 B x its params / (DP x CP) (experts: / expert-DP). The distributed optimizer's
  ``sharded_state_dict`` (``megatron/core/optimizer/distrib_optimizer.py``; ``distrib_optim_sharding_type``
  ``dp_reshardable``, set by ``_build_sharded_state_dict_metadata`` in checkpointing.py) adds each rank's own
  shard of ``param`` (the fp32 master weight, 4 B) and the Adam moments ``exp_avg``, ``exp_avg_sq`` (4 B each):
  12 B/param / (DP x CP). Without the distributed optimizer the optimizer state is replicated with the model's
  replica ids and the fully parallel wrapper spreads it the same way, so the bytes per rank are the same.
  Parameters every TP rank holds whole (norms, router, row-parallel biases, learned positions) carry the TP rank
  in their ``replica_id`` (``make_sharded_tensors_for_checkpoint``), so only TP rank 0's DP x CP group writes them;
  their optimizer state, part of each TP rank's own buffer (key ``dp_group_idx_<i>``), is written by every TP rank.
  A tied output layer on the last stage (PP > 1) is saved as a replica of the first stage's embedding
  (``LanguageModule.sharded_state_dict``, ``megatron/core/models/common/language_module/language_module.py``):
  its weight is not written twice, its optimizer shard is. (An MTP block's embedding copy is counted in full.)
* ``--ckpt-format fsdp_dtensor`` (Megatron-FSDP, which asserts this format): the model's parameters are
  replaced by the optimizer's DTensor parameters before the state dict is taken
  (``megatron_fsdp.py`` ``_replace_param_with_distributed_if_needed`` -> ``optimizer_named_parameters``, built
  from ``dist_main_weight`` in ``param_and_grad_buffer.py``): the fp32 main-weight shards (4 B/param), plus the
  optimizer ``state`` (``sharded_param_state_fsdp_dtensor``: exp_avg, exp_avg_sq, 8 B); no separate bf16 copy.
  Everything is sharded over DP x CP (experts: expert-DP); torch DCP's save planner drops duplicate chunks, so
  TP-replicated parameters are written once.
* ``--no-save-optim`` drops the optimizer part: torch_dist writes 2 B/param, fsdp_dtensor 4 B/param.

Small entries (RNG states, the optimizer step, args, ``common.pt``) are left out (kilobytes).

Save time = max(total bytes / aggregate storage bandwidth, busiest node's bytes / per-node bandwidth); load time
the same at read time. ``--async-save`` stages every rank's shard in host memory before writing
(``FileSystemWriterAsync.preload_tensors`` in ``dist_checkpointing/strategies/filesystem_async.py`` copies all
write buckets to CPU), so a node needs GPUs per node x the largest per-rank bytes of host RAM; training
blocks for the part of the save that does not overlap (1 - ``async_overlap_frac``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from paraplan.errors import SpecError
from paraplan.estimate.params import StageLayers, dense_layer_params, moe_layer_params, padded_vocab
from paraplan.estimate.stages import all_stage_layers
from paraplan.estimator import Estimate, max_positions_for
from paraplan.goodput import FailureSpec, GoodputPlan, plan_checkpoints
from paraplan.layout import ParallelLayout
from paraplan.specs.model import ModelSpec
from paraplan.units import GB, SECONDS_PER_HOUR

CkptFormat = Literal["torch_dist", "fsdp_dtensor"]
CKPT_FORMATS: Final[tuple[str, ...]] = ("torch_dist", "fsdp_dtensor")

MODEL_WEIGHT_BYTES: Final = 2.0
"""bf16/fp16 model weight per parameter (torch_dist's model state dict)."""
MAIN_WEIGHT_BYTES: Final = 4.0
"""fp32 master weight per parameter (the distributed optimizer's ``param``; FSDP's main weight)."""
ADAM_MOMENTS_BYTES: Final = 8.0
"""fp32 ``exp_avg`` + ``exp_avg_sq`` per parameter."""

LLAMA3_STORAGE_BYTES_PER_S: Final = 2e12
"""Meta's Tectonic storage for Llama 3 pre-training "sustains throughput of 2 TB/s" (peak 7 TB/s) for 16,384
H100 (Dubey et al. 2024, The Llama 3 Herd of Models, section 3.3.1)."""
LLAMA3_NUM_GPUS: Final = 16_384
DEFAULT_STORAGE_BYTES_PER_S_PER_GPU: Final = LLAMA3_STORAGE_BYTES_PER_S / LLAMA3_NUM_GPUS
"""Default storage: Meta's sustained 2 TB/s shared over its 16,384 GPUs, ~0.122 GB/s per GPU, scaled with the
job's GPU count (an input, not a measurement of any other cluster: set ``storage_gbps`` and
``storage_gbps_per_node`` in the site file)."""
DEFAULT_ASYNC_OVERLAP_FRAC: Final = 0.9
"""Share of an ``--async-save`` that overlaps training (an assumption, not measured here: the device-to-host
copy blocks, the write does not); ``async_save_overlap`` in the site file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageSpec:
    """Checkpoint storage and host memory of a site (site file keys in parentheses)."""

    aggregate_bytes_per_s: float | None = None
    """Storage bandwidth the whole job gets (``storage_gbps``); None: the default per-GPU share."""
    per_node_bytes_per_s: float | None = None
    """What one node can write (``storage_gbps_per_node``); None: no per-node limit."""
    host_memory_bytes_per_node: float | None = None
    """Host RAM per node (``host_memory_gb_per_node``); None: unknown (async save is then not recommended)."""
    async_overlap_frac: float = DEFAULT_ASYNC_OVERLAP_FRAC
    """Share of an async save hidden behind training (``async_save_overlap``)."""

    def __post_init__(self) -> None:
        for name in ("aggregate_bytes_per_s", "per_node_bytes_per_s", "host_memory_bytes_per_node"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SpecError(f"storage.{name} must be > 0, got {value}")
        if not 0.0 <= self.async_overlap_frac <= 1.0:
            raise SpecError(f"storage.async_overlap_frac must be in [0, 1], got {self.async_overlap_frac}")

    def bandwidth_bytes_per_s(self, num_gpus: int) -> float:
        """Aggregate bandwidth for a job of ``num_gpus`` GPUs."""
        if self.aggregate_bytes_per_s is not None:
            return self.aggregate_bytes_per_s
        return DEFAULT_STORAGE_BYTES_PER_S_PER_GPU * num_gpus


@dataclass(frozen=True, slots=True)
class CheckpointSize:
    """Bytes one save writes for one layout."""

    ckpt_format: str
    with_optimizer: bool
    bytes_per_rank: tuple[float, ...]
    """Per rank of each pipeline stage: TP rank 0, which also writes the TP-replicated weights (the fully parallel
    save balances the weights over DP x CP tensor by tensor, so a rank may write up to one tensor more)."""
    weights_bytes_per_rank: tuple[float, ...]
    """The model-weight part of ``bytes_per_rank``."""
    optimizer_bytes_per_rank: tuple[float, ...]
    """Master weights and moments per rank of each stage (every rank writes its own distributed-optimizer shard)."""
    total_bytes: float
    weights_bytes: float
    """Model weights in the checkpoint (bf16 for torch_dist; none for fsdp_dtensor, whose weights are fp32)."""
    main_weights_bytes: float
    """fp32 master/main weights."""
    moments_bytes: float
    """Adam moments."""
    gpus_per_node: int

    @property
    def max_bytes_per_rank(self) -> float:
        """The busiest rank (first or last stage with embeddings)."""
        return max(self.bytes_per_rank)

    @property
    def max_bytes_per_node(self) -> float:
        """GPUs per node x the busiest rank: the busiest node's write (and async staging in host RAM)."""
        return self.gpus_per_node * self.max_bytes_per_rank

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"ckpt_format": self.ckpt_format, "with_optimizer": self.with_optimizer,
                "total_bytes": self.total_bytes, "max_bytes_per_rank": self.max_bytes_per_rank,
                "bytes_per_rank_per_stage": list(self.bytes_per_rank), "weights_bytes": self.weights_bytes,
                "main_weights_bytes": self.main_weights_bytes, "moments_bytes": self.moments_bytes,
                "host_ram_bytes_per_node": self.max_bytes_per_node}


def tp_replicated_params(model: ModelSpec, layers: StageLayers, layout: ParallelLayout, max_positions: int) -> float:
    """Parameters of one stage that every TP rank holds whole: per layer the norms, router, replicated biases
    and MLA down projections (``LayerParams.replicated``), the final norm on the last stage, learned position
    embeddings on the first, and per MTP block its three norms and its layer's replicated part."""
    tp, nu, h = layout.tp, model.norm_params, model.hidden_size
    rep = float(layers.num_dense_layers) * float(dense_layer_params(model, tp=tp).replicated)
    if model.is_moe:
        moe = moe_layer_params(model, tp=tp, ep=layout.ep, etp=layout.etp)
        rep += float(layers.num_moe_layers) * float(moe.replicated)
    if layers.has_output:
        rep += nu * h
    if layers.has_embedding and model.position_embedding_type == "learned_absolute":
        rep += max_positions * h
    if layers.num_mtp_layers:
        mtp_layer = (moe_layer_params(model, tp=tp, ep=layout.ep, etp=layout.etp) if model.mtp_layer_is_moe
                     else dense_layer_params(model, tp=tp))
        rep += float(layers.num_mtp_layers) * (3 * nu * h + float(mtp_layer.replicated))
    return rep


def ckpt_format_for(est: Estimate) -> str:
    """The format Megatron requires or defaults to: fsdp_dtensor under Megatron-FSDP, else torch_dist."""
    return "fsdp_dtensor" if est.layout.fsdp else "torch_dist"


def checkpoint_size(est: Estimate, *, ckpt_format: str | None = None, with_optimizer: bool = True) -> CheckpointSize:
    """Bytes per rank and in total that one save of ``est``'s layout writes (see the module docstring).

    per rank (TP rank 0, the busiest) = b_w x (P_dense - tied copy) / (DP x CP) + b_w x P_expert / EDP
    + b_o x (P_dense / (DP x CP) + P_expert / EDP); torch_dist: b_w = 2, b_o = 12; fsdp_dtensor: b_w = 0,
    b_o = 12 (4 main + 8 moments); without the optimizer b_o = 0 and fsdp_dtensor keeps its 4 B main weights.
    Totals count TP-replicated parameters P_rep once in the weights (and, for fsdp_dtensor, in everything):
    the other TP ranks write (P_dense - P_rep) instead of P_dense.
    """
    fmt = ckpt_format or ckpt_format_for(est)
    if fmt not in CKPT_FORMATS:
        raise SpecError(f"ckpt_format: expected one of {', '.join(CKPT_FORMATS)}, got '{fmt}'")
    if fmt == "fsdp_dtensor" and not est.layout.fsdp:
        raise SpecError("ckpt_format: fsdp_dtensor needs Megatron-FSDP (Megatron: '--ckpt-format fsdp_dtensor is "
                        "only tested with Megatron FSDP')")
    lay, model = est.layout, est.model
    if fmt == "torch_dist":
        weight_b, main_b, moment_b = MODEL_WEIGHT_BYTES, MAIN_WEIGHT_BYTES * with_optimizer, \
            ADAM_MOMENTS_BYTES * with_optimizer
    else:
        weight_b, main_b, moment_b = 0.0, MAIN_WEIGHT_BYTES, ADAM_MOMENTS_BYTES * with_optimizer
    dense_group, expert_group = lay.dp * lay.cp, lay.edp
    ranks_per_stage = lay.world_size // lay.pp
    tied_copy = 0.0
    if not model.untie_embeddings_and_output_weights and lay.pp > 1:
        tied_copy = float(padded_vocab(model, lay.tp)) * model.hidden_size / lay.tp
    per_rank: list[float] = []
    weights_rank: list[float] = []
    optimizer_rank: list[float] = []
    totals = {"w": 0.0, "m": 0.0, "o": 0.0}
    other_tp = (lay.tp - 1) / lay.tp  # share of a stage's ranks that are not TP rank 0
    for stage, layers in zip(est.stages, all_stage_layers(model, lay), strict=True):
        p = stage.params
        dense, expert = float(p.dense), float(p.expert)
        saved_dense = dense - (tied_copy if float(p.output_layer) > 0 else 0.0)
        rep = tp_replicated_params(model, layers, lay, max_positions_for(model, est.training)[0])
        shard = dense / dense_group + expert / expert_group
        w = weight_b * (saved_dense / dense_group + expert / expert_group)
        m, o = main_b * shard, moment_b * shard
        per_rank.append(w + m + o)
        weights_rank.append(w)
        optimizer_rank.append(m + o)
        rep_shard = rep / dense_group * other_tp  # what the average rank does not write
        totals["w"] += (w - weight_b * rep_shard) * ranks_per_stage
        dedup = rep_shard if fmt == "fsdp_dtensor" else 0.0
        totals["m"] += (m - main_b * dedup) * ranks_per_stage
        totals["o"] += (o - moment_b * dedup) * ranks_per_stage
    return CheckpointSize(ckpt_format=fmt, with_optimizer=with_optimizer, bytes_per_rank=tuple(per_rank),
                          weights_bytes_per_rank=tuple(weights_rank), optimizer_bytes_per_rank=tuple(optimizer_rank),
                          total_bytes=sum(totals.values()), weights_bytes=totals["w"], main_weights_bytes=totals["m"],
                          moments_bytes=totals["o"], gpus_per_node=min(est.cluster.gpus_per_node,
                                                                        est.cluster.num_gpus))


@dataclass(frozen=True, slots=True)
class CheckpointTiming:
    """Save and load times of one checkpoint on a site's storage, and whether async staging fits."""

    save_s: float
    load_s: float
    bandwidth_bytes_per_s: float
    """The bandwidth the save runs at (aggregate, or the per-node limit when that binds)."""
    storage_bound: str
    """"aggregate" or "per_node": which limit sets the time."""
    host_ram_bytes_per_node: float
    host_ram_fits: bool | None
    """None when the site's host RAM is unknown."""
    async_save: bool
    """Recommended: host RAM is known and the staging fits."""
    blocking_save_s: float
    """Training time one save costs: save_s, or (1 - overlap) x save_s with async save."""


def save_time_s(total_bytes: float, max_bytes_per_node: float, num_nodes: int, storage: StorageSpec,
                num_gpus: int) -> tuple[float, str]:
    """max(total / aggregate bandwidth, busiest node's bytes / per-node bandwidth) and the binding limit."""
    aggregate = total_bytes / storage.bandwidth_bytes_per_s(num_gpus)
    if storage.per_node_bytes_per_s is None:
        return aggregate, "aggregate"
    node = max_bytes_per_node / storage.per_node_bytes_per_s
    return (node, "per_node") if node > aggregate else (aggregate, "aggregate")


def checkpoint_timing(size: CheckpointSize, num_gpus: int, storage: StorageSpec) -> CheckpointTiming:
    """Save/load time on ``storage`` and the async-save decision (host RAM staging must fit)."""
    nodes = max(1, num_gpus // size.gpus_per_node)
    save_s, bound = save_time_s(size.total_bytes, size.max_bytes_per_node, nodes, storage, num_gpus)
    host = size.max_bytes_per_node
    fits = None if storage.host_memory_bytes_per_node is None else host <= storage.host_memory_bytes_per_node
    async_save = bool(fits)
    blocking = save_s * (1.0 - storage.async_overlap_frac) if async_save else save_s
    bw = size.total_bytes / save_s if save_s > 0 else storage.bandwidth_bytes_per_s(num_gpus)
    return CheckpointTiming(save_s=save_s, load_s=save_s, bandwidth_bytes_per_s=bw, storage_bound=bound,
                            host_ram_bytes_per_node=host, host_ram_fits=fits, async_save=async_save,
                            blocking_save_s=blocking)


def format_decimal_bytes(num_bytes: float) -> str:
    """Storage sizes as decimal TB/GB (as storage is sold): '5.68 TB', '912 GB'."""
    if num_bytes >= 1e12:
        return f"{num_bytes / 1e12:.2f} TB"
    return f"{num_bytes / GB:.1f} GB" if num_bytes >= GB else f"{num_bytes / 1e6:.1f} MB"


@dataclass(frozen=True, slots=True)
class CheckpointAdvice:
    """Size, timing, interval and goodput of one layout's checkpoints: what ``launch`` writes and ``plan`` shows."""

    size: CheckpointSize
    timing: CheckpointTiming
    goodput: GoodputPlan

    @property
    def save_interval_iters(self) -> int:
        """Recommended ``--save-interval``."""
        return self.goodput.save_interval_iters

    def reason(self) -> str:
        """One line: why this interval, format and save mode."""
        g, t = self.goodput, self.timing
        mtbf = "no failures" if math.isinf(g.mtbf_s) else f"MTBF {g.mtbf_s / SECONDS_PER_HOUR:,.1f} h"
        if t.async_save:
            mode = (f"--async-save: staging {format_decimal_bytes(t.host_ram_bytes_per_node)}/node fits host RAM, "
                    f"{t.blocking_save_s:.1f} s blocking")
        elif t.host_ram_fits is False:
            mode = f"synchronous save: async staging {format_decimal_bytes(t.host_ram_bytes_per_node)}/node > host RAM"
        else:
            mode = "synchronous save: host RAM per node unknown (site host_memory_gb_per_node)"
        return (f"{self.size.ckpt_format} {format_decimal_bytes(self.size.total_bytes)}, save {t.save_s:,.1f} s; "
                f"Daly interval ({g.save_blocking_s:,.1f} s blocking, {mtbf}) -> every {g.save_interval_iters} "
                f"iterations ({g.interval_s:,.0f} s); goodput {g.goodput:.1%}; {mode}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**self.size.as_dict(), "save_s": self.timing.save_s, "load_s": self.timing.load_s,
                "storage_bound": self.timing.storage_bound, "async_save": self.timing.async_save,
                "host_ram_fits": self.timing.host_ram_fits, **self.goodput.as_dict()}


def advise(est: Estimate, storage: StorageSpec | None = None, failures: FailureSpec | None = None,
           train_iters: int | None = None) -> CheckpointAdvice:
    """Checkpoint size and save time of ``est``'s layout, the Young/Daly ``--save-interval`` and its goodput."""
    size = checkpoint_size(est)
    timing = checkpoint_timing(size, est.cluster.num_gpus, storage or StorageSpec())
    gp = plan_checkpoints(step_s=float(est.time.step_s), num_gpus=est.cluster.num_gpus,
                          save_blocking_s=timing.blocking_save_s, save_s=timing.save_s, load_s=timing.load_s,
                          failures=failures or FailureSpec(), train_iters=train_iters)
    return CheckpointAdvice(size=size, timing=timing, goodput=gp)
