"""Estimate one layout: validate it against Megatron's rules, then memory per pipeline stage,
parameters per rank, and (``paraplan.estimate.step_time``) step time and throughput.

This is the scalar path of the model: the same formula functions the vectorised search uses,
called with Python numbers, with all stages evaluated (not only the representative ones).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from paraplan.bands import Band, band_for, family_of, value_range
from paraplan.estimate.memory import MemoryOptions, StageMemory, layer_activations, stage_memory
from paraplan.estimate.params import ModelParamCounts, StageLayers, model_param_counts
from paraplan.estimate.positions import max_positions_for as max_positions_for  # re-exported
from paraplan.estimate.stages import all_stage_layers, bf16_layers_of
from paraplan.estimate.step_time import StageTime, StepTime, Throughput, stage_terms, stage_time, step_time, throughput
from paraplan.estimate.time import fsdp
from paraplan.headroom import DEFAULT_HEADROOM, Headroom, fit_text
from paraplan.layout import ParallelLayout
from paraplan.rules import check_layout
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True, slots=True)
class Estimate:
    """Everything paraplan predicts for one layout."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: ParallelLayout
    num_microbatches: int
    stages: tuple[StageMemory, ...]
    params: ModelParamCounts
    usable_bytes: float
    time: StepTime
    throughput: Throughput
    stage_times: tuple[StageTime, ...] = field(default=())
    """One micro-batch (forward + backward) on every pipeline rank: the per-stage times the step time is made
    of (the report draws the pipeline schedule from them)."""
    notes: tuple[str, ...] = field(default=())
    headroom: Headroom = DEFAULT_HEADROOM
    """The memory margin ``fits_with_margin`` keeps free (``paraplan.headroom``)."""

    @property
    def peak_bytes(self) -> float:
        """Largest per-GPU total over the pipeline stages."""
        return max(float(s.memory.total_bytes) for s in self.stages)

    @property
    def peak_stage(self) -> int:
        """Index of the stage with the largest total."""
        totals = [float(s.memory.total_bytes) for s in self.stages]
        return totals.index(max(totals))

    @property
    def fits(self) -> bool:
        """Peak memory within the GPU's usable capacity."""
        return self.peak_bytes <= self.usable_bytes

    @property
    def free_bytes(self) -> float:
        """Usable memory the peak leaves free (negative when it does not fit)."""
        return self.usable_bytes - self.peak_bytes

    @property
    def fits_with_margin(self) -> bool:
        """Peak plus the headroom margin within usable memory (what plan counts as fitting)."""
        return self.peak_bytes + self.headroom.margin_bytes(self.usable_bytes) <= self.usable_bytes

    @property
    def memory_band(self) -> Band:
        """The measured error band of peak memory for this model's family (``paraplan.bands``)."""
        return band_for("peak_bytes", family_of(self.model.is_moe))

    @property
    def step_band(self) -> Band:
        """The measured (cross-validated) error band of step time for this model's family."""
        return band_for("step_s", family_of(self.model.is_moe))

    @property
    def peak_bytes_range(self) -> tuple[float, float]:
        """Where the measured peak lay for 80% of held-out rows: the memory band around ``peak_bytes``."""
        return value_range(self.peak_bytes, self.memory_band)

    @property
    def step_s_range(self) -> tuple[float, float]:
        """The step-time band around the predicted step time."""
        return value_range(float(self.time.step_s), self.step_band)

    @property
    def tokens_per_s_per_gpu_range(self) -> tuple[float, float]:
        """Throughput's range: the step-time band inverted (tokens per step are fixed)."""
        return value_range(float(self.throughput.tokens_per_s_per_gpu), self.step_band, inverse=True)

    @property
    def fit_text(self) -> str:
        """``fits with X GiB free (margin ...)``, ``inside the margin: ...`` or ``does not fit: ...``."""
        return fit_text(self.peak_bytes, self.usable_bytes, self.headroom)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the stable keys other tools read (config, memory, params, time, throughput)."""
        lay = self.layout
        return {
            "config": config_dict(lay, self.training, self.num_microbatches),
            "cluster": {
                "gpu": self.cluster.gpu.name, "num_gpus": self.cluster.num_gpus,
                "gpus_per_node": self.cluster.gpus_per_node,
                "nvlink_domain_size": self.cluster.nvlink_domain_size,
                "efficiency": asdict(self.cluster.gpu.efficiency),
            },
            "placement": placement_dict(self.layout, self.cluster),
            "model": {"name": self.model.name, "num_layers": self.model.num_layers,
                      "hidden_size": self.model.hidden_size, "moe": self.model.is_moe},
            "memory": {
                "peak_bytes": self.peak_bytes,
                "peak_stage": self.peak_stage,
                "capacity_bytes": float(self.cluster.gpu.hbm_bytes),
                "usable_bytes": self.usable_bytes,
                "fits": self.fits,
                "free_bytes": self.free_bytes,
                "fits_with_margin": self.fits_with_margin,
                "headroom": self.headroom.as_dict(self.usable_bytes),
                "fit_text": self.fit_text,
                "peak_bytes_range": list(self.peak_bytes_range),
                "peak_bytes_band": self.memory_band.as_dict(),
                "per_stage": [
                    {"stage": i, **s.memory.as_dict(), "other_parts": s.other.as_dict(),
                     "in_flight_microbatches": float(s.in_flight)}
                    for i, s in enumerate(self.stages)
                ],
            },
            "params": {
                "total": self.params.total,
                "active_per_token": self.params.active_per_token,
                "mtp": self.params.mtp,
                "per_stage_per_rank": [round(float(s.params.total)) for s in self.stages],
                "per_stage_breakdown": [s.params.as_dict() for s in self.stages],
            },
            "time": {**self.time.as_dict(), "step_s_range": list(self.step_s_range),
                     "step_s_band": self.step_band.as_dict()},
            "throughput": {**self.throughput.as_dict(),
                           "tokens_per_s_per_gpu_range": list(self.tokens_per_s_per_gpu_range)},
            "notes": list(self.notes),
        }


def placement_dict(layout: ParallelLayout, cluster: ClusterSpec) -> dict[str, Any]:
    """Which parallel groups stay inside one NVLink domain (rank order tp-cp-ep-dp-pp): a group
    spaced ``stride`` ranks apart spans stride x size ranks; outside the domain it runs on the
    network and is costed there."""
    from paraplan.specs.grid import RANK_ORDER, Grid
    from paraplan.specs.topology import span_in_domain

    grid = Grid.of(layout)
    # dp_cp: the gradient reduce-scatter / all-gather group, DP x CP ranks (the distributed
    # optimizer shards over it); config.dp is DP alone
    groups = {"tp": grid.tp_group, "cp": grid.cp_group, "ep": grid.ep_group, "dp_cp": grid.dp_cp_group,
              "pp": grid.pp_group}
    spans = {axis: g.span for axis, g in groups.items()}
    sizes = {axis: g.size for axis, g in groups.items()}
    return {
        "rank_order": RANK_ORDER,
        "nvlink_domain_size": cluster.nvlink_domain_size,
        "groups": {axis: {"size": sizes[axis], "span_ranks": spans[axis],
                          "in_nvlink_domain": bool(sizes[axis] == 1 or span_in_domain(
                              spans[axis], cluster.nvlink_block_gpus))}
                   for axis in spans},
    }


def config_dict(layout: ParallelLayout, training: TrainingSpec, num_microbatches: int) -> dict[str, Any]:
    """The ``config`` block of the JSON output (``schedule`` and ``schedule_note`` only when a schedule
    was chosen: without them Megatron picks 1F1B or interleaved from VP)."""
    return {
        "tp": layout.tp, "pp": layout.pp, "vp": layout.vp, "cp": layout.cp, "ep": layout.ep,
        "etp": layout.etp, "dp": layout.dp, "edp": layout.edp, "mbs": layout.mbs,
        "gbs": training.global_batch_size, "num_microbatches": num_microbatches,
        "seq_len": training.seq_len, "recompute": layout.recompute,
        "recompute_modules": list(layout.recompute_modules),
        # full recompute's group size and method, where they differ from Megatron's usual 1 / uniform
        **({"recompute_num_layers": layout.recompute_num_layers, "recompute_method": layout.recompute_method}
           if layout.recompute == "full" and (layout.recompute_num_layers, layout.recompute_method) != (1, "uniform")
           else {}),
        "sequence_parallel": layout.sp, "distributed_optimizer": layout.distributed_optimizer,
        "fsdp": layout.fsdp, "overlap_grad_reduce": layout.overlap_grad_reduce,
        "overlap_param_gather": layout.overlap_param_gather, "tp_comm_overlap": layout.tp_comm_overlap,
        "first_stage_layers": layout.first_stage_layers, "last_stage_layers": layout.last_stage_layers,
        "pipeline_layout": list(layout.pipeline_layout),
        "precision": training.precision,
        **_schedule_keys(layout),
        **({"memory_knobs": knobs} if (knobs := memory_knobs_of(training)) else {}),
        **({"time_only_knobs": time} if (time := time_only_knobs_of(training)) else {}),
    }


def memory_knobs_of(training: TrainingSpec) -> dict[str, Any]:
    """The TrainingSpec memory knobs away from Megatron's defaults (the JSON's ``config.memory_knobs``, absent
    when empty)."""
    from paraplan.specs.training import training_dict

    plain = TrainingSpec(seq_len=training.seq_len, global_batch_size=training.global_batch_size,
                         precision=training.precision, attention_backend=training.attention_backend)
    return {k: v for k, v in training_dict(training).items() if k not in training_dict(plain)}


def time_only_knobs_of(training: TrainingSpec) -> list[str]:
    """The knobs of ``memory_knobs_of`` that move step time only (``specs.training.TIME_ONLY_KNOBS``; the JSON's
    ``config.time_only_knobs``, absent when empty), in ``memory_knobs_of``'s order."""
    from paraplan.specs.training import TIME_ONLY_KNOBS

    return [k for k in memory_knobs_of(training) if k in TIME_ONLY_KNOBS]


def _schedule_keys(layout: ParallelLayout) -> dict[str, str]:
    """``schedule`` (and ``schedule_note`` "not in Megatron-LM" for a what-if) of a chosen schedule."""
    if not layout.schedule:
        return {}
    from paraplan.schedules import NOT_IN_MEGATRON, schedule_named

    keys = {"schedule": layout.schedule}
    if not schedule_named(layout.schedule).megatron:
        keys["schedule_note"] = f"{schedule_named(layout.schedule).title}: {NOT_IN_MEGATRON} (what-if)"
    return keys


def layout_notes(model: ModelSpec, layout: ParallelLayout, cluster: ClusterSpec) -> list[str]:
    """Warnings Megatron prints (not errors) and placement facts."""
    notes: list[str] = []
    if layout.sequence_parallel and layout.tp == 1:
        notes.append("sequence parallel is off at TP = 1 (Megatron: 'Disabling sequence parallelism "
                     "because tensor model parallelism is disabled')")
    if model.is_moe and layout.ep > 1 and layout.tp > 1 and not layout.sp:
        notes.append("When using expert parallelism and tensor parallelism for training, sequence "
                     "parallelism must be used (Megatron warning)")
    from paraplan.specs.grid import Grid

    grid = Grid.of(layout)
    if grid.cp_group.span > cluster.nvlink_domain_size:
        notes.append(f"TP x CP = {grid.cp_group.span} spans more than one NVLink domain "
                     f"({cluster.nvlink_domain_size} GPUs): CP traffic crosses the network")
    if grid.ep_group.span > cluster.nvlink_domain_size:
        notes.append(f"EP x ETP = {grid.ep_group.span} spans more than one NVLink domain: "
                     "expert all-to-all crosses the network")
    fsdp_overlap = fsdp.overlap_note(bool(layout.fsdp), bool(layout.overlap_grad_reduce),
                                     bool(layout.overlap_param_gather))
    if fsdp_overlap:
        notes.append(fsdp_overlap)
    return notes


def _stage_memories(model: ModelSpec, training: TrainingSpec, layout: ParallelLayout, stages: list[StageLayers], *,
                    num_microbatches: int, max_positions: int,
                    options: MemoryOptions | None, arch: str = "hopper") -> tuple[StageMemory, ...]:
    """``stage_memory`` of every rank, evaluated as one array over the ranks and split back: the
    same element-wise formulas, one pass instead of one per rank."""
    def col(name: str) -> NDArray[Any]:
        return np.array([getattr(st, name) for st in stages])

    ranks = StageLayers(num_dense_layers=col("num_dense_layers"), num_moe_layers=col("num_moe_layers"),
                        has_embedding=col("has_embedding"), has_output=col("has_output"),
                        num_mtp_layers=col("num_mtp_layers"), num_bf16_start_layers=col("num_bf16_start_layers"),
                        num_bf16_end_layers=col("num_bf16_end_layers"))
    mem = stage_memory(model, training, layout, ranks, rank=np.arange(len(stages)), num_microbatches=num_microbatches,
                       max_positions=max_positions, options=options,
                       per_layer=layer_activations(model, training, layout), arch=arch)

    def at(obj: Any, r: int) -> Any:
        return type(obj)(**{f.name: (v if np.ndim(v := getattr(obj, f.name)) == 0 else v[r]) for f in fields(obj)})

    return tuple(StageMemory(memory=at(mem.memory, r), params=at(mem.params, r), in_flight=np.asarray(mem.in_flight)[r],
                             other=at(mem.other, r)) for r in range(len(stages)))


def _stage_times(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: ParallelLayout,
                 ranks: list[StageLayers]) -> tuple[StageTime, ...]:
    """``stage_time`` of every rank; ranks holding the same layers share one evaluation."""
    terms = stage_terms(model, cluster, training, layout)
    kinds: dict[StageLayers, StageTime] = {}
    for st in ranks:
        if st not in kinds:
            kinds[st] = stage_time(model, cluster, training, layout, st, terms)
    return tuple(kinds[st] for st in ranks)


def estimate(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: ParallelLayout, *,
    memory_options: MemoryOptions | None = None, mfu_peak: str = "bf16",
    extra_notes: list[str] | None = None, headroom: Headroom | None = None,
) -> Estimate:
    """Validate ``layout`` (LayoutError on the first broken rule) and estimate it (``headroom``: the
    margin ``fits_with_margin`` keeps; None = the memory model's error band)."""
    if headroom is not None:
        headroom.check_range(cluster.gpu.usable_bytes, cluster.gpu.name)
    check_layout(model, training, cluster, layout)
    cluster.gpu.peak_flops_per_s(training.precision)  # fp8 on a GPU without FP8 -> SpecError
    max_positions, notes = max_positions_for(model, training)
    notes += layout_notes(model, layout, cluster) + list(extra_notes or [])
    if not cluster.gpu.efficiency_calibrated:
        notes.append(f"{cluster.gpu.name}: the performance model's efficiencies are not calibrated on this GPU "
                     "(no measured runs; defaults): step time, MFU and tokens/s are indicative, memory is not "
                     "affected (`paraplan calibrate` fits them to your runs)")
    m = layout.num_microbatches(training.global_batch_size)
    ranks = all_stage_layers(model, layout, bf16_layers_of(training))
    stages = _stage_memories(model, training, layout, ranks, num_microbatches=m,
                             max_positions=max_positions, options=memory_options, arch=cluster.gpu.arch)
    t = step_time(model, cluster, training, layout, num_microbatches=m)
    return Estimate(
        model=model, cluster=cluster, training=training, layout=layout, num_microbatches=m,
        stages=stages, params=model_param_counts(model, max_positions=max_positions),
        usable_bytes=cluster.gpu.usable_bytes,
        time=t, throughput=throughput(model, cluster, training, layout, t, mfu_peak=mfu_peak),
        stage_times=_stage_times(model, cluster, training, layout, ranks),
        notes=tuple(notes), headroom=(headroom if headroom is not None else DEFAULT_HEADROOM).for_model(model.is_moe),
    )
