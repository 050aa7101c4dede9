"""The public API: ``paraplan.estimate`` (one layout) and ``paraplan.plan`` (search and rank), re-exported by
``paraplan/__init__.py`` with the spec and result types (docs/api.md).

Both take the model and the GPU as names (presets, or files as the CLI reads them) or as spec objects, and
return the library's own result types (``Estimate``, ``Plan``). The CLI's ``estimate`` and ``plan`` commands
call these two functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, Literal

from paraplan.errors import SpecError
from paraplan.estimate.memory import MemoryOptions
from paraplan.estimator import Estimate
from paraplan.estimator import estimate as _estimate_layout
from paraplan.headroom import Headroom
from paraplan.layout import ParallelLayout, layout_for_world
from paraplan.search import Objective, Plan, SearchSpace
from paraplan.search import plan as _search
from paraplan.specs.cluster import ClusterSpec, GpuSpec, make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec
from paraplan.specs.validate import validate_fields

ModelRef = str | ModelSpec
"""A model preset name, a config.json / Megatron-args file / Megatron log path, or a ``ModelSpec``."""
GpuRef = str | GpuSpec | ClusterSpec
"""A GPU preset name or YAML path, a ``GpuSpec``, or a whole ``ClusterSpec`` (then ``num_gpus`` may be left out)."""
TrainingRef = TrainingSpec | Mapping[str, Any]
"""A ``TrainingSpec`` or its fields as a mapping, e.g. ``{"seq_len": 8192, "global_batch_size": 512}``."""
LayoutRef = ParallelLayout | Mapping[str, Any]
"""A ``ParallelLayout`` or its fields without ``dp``, e.g. ``{"tp": 8, "pp": 4}`` (DP = GPUs / (TP x PP x CP))."""
SpaceRef = SearchSpace | Mapping[str, Any]
"""A ``SearchSpace`` or its fields as a mapping, e.g. ``{"tp": (4, 8), "pp": (1, 2, 4)}``."""


def resolve_model(model: ModelRef) -> ModelSpec:
    """``model`` as a ``ModelSpec`` (a name or path is loaded as ``paraplan plan --model`` loads it)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    raise SpecError(f"model: expected a preset name, a file path or a ModelSpec, got {type(model).__name__}")


def resolve_cluster(gpu: GpuRef, num_gpus: int | None, gpus_per_node: int | None = None) -> ClusterSpec:
    """The cluster of ``num_gpus`` GPUs of ``gpu`` (a ``ClusterSpec`` is taken as it is; ``num_gpus``, when
    given, must be its world size, and ``gpus_per_node`` must be left out)."""
    if isinstance(gpu, ClusterSpec):
        if num_gpus is not None and num_gpus != gpu.num_gpus:
            raise SpecError(f"num_gpus: {num_gpus} differs from the ClusterSpec's {gpu.num_gpus} (leave it out)")
        if gpus_per_node is not None:
            raise SpecError("gpus_per_node: a ClusterSpec has its own (leave it out)")
        return gpu
    if num_gpus is None:
        raise SpecError("num_gpus: required unless gpu is a ClusterSpec")
    for name, value in (("num_gpus", num_gpus), ("gpus_per_node", gpus_per_node)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(gpu, str):
        gpu = load_gpu(gpu)
    if not isinstance(gpu, GpuSpec):
        raise SpecError(f"gpu: expected a preset name, a YAML path, a GpuSpec or a ClusterSpec, "
                        f"got {type(gpu).__name__}")
    return make_cluster(gpu, num_gpus, gpus_per_node)


def resolve_training(training: TrainingRef) -> TrainingSpec:
    """``training`` as a ``TrainingSpec`` (a mapping is checked field by field)."""
    if isinstance(training, TrainingSpec):
        return training
    if isinstance(training, Mapping):
        return validate_fields(TrainingSpec, dict(training), "training.")  # type: ignore[no-any-return]
    raise SpecError(f"training: expected a TrainingSpec or a mapping of its fields, got {type(training).__name__}")


def resolve_layout(layout: LayoutRef, num_gpus: int) -> ParallelLayout:
    """``layout`` as a ``ParallelLayout`` on ``num_gpus`` GPUs (a mapping gets DP = GPUs / (TP x PP x CP))."""
    if isinstance(layout, ParallelLayout):
        return layout
    if not isinstance(layout, Mapping):
        raise SpecError(f"layout: expected a ParallelLayout or a mapping of its fields, got {type(layout).__name__}")
    allowed = sorted(f.name for f in fields(ParallelLayout) if f.name != "dp")
    unknown = sorted(str(k) for k in layout if k not in allowed)
    if unknown:
        raise SpecError(f"layout.{unknown[0]}: unknown field (allowed: {', '.join(allowed)}; DP is derived)")
    return layout_for_world(num_gpus, **layout)


def resolve_space(space: SpaceRef | None) -> SearchSpace:
    """``space`` as a ``SearchSpace`` (None: everything Megatron allows)."""
    if space is None:
        return SearchSpace()
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, Mapping):
        allowed = sorted(f.name for f in fields(SearchSpace))
        unknown = sorted(str(k) for k in space if k not in allowed)
        if unknown:
            raise SpecError(f"space.{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in space.items()}
        return SearchSpace(**values)
    raise SpecError(f"space: expected a SearchSpace or a mapping of its fields, got {type(space).__name__}")


def estimate(model: ModelRef, gpu: GpuRef, num_gpus: int | None = None, *, layout: LayoutRef,
             training: TrainingRef, gpus_per_node: int | None = None, memory_options: MemoryOptions | None = None,
             mfu_peak: Literal["bf16", "fp8", "fp16"] = "bf16", notes: Sequence[str] = (),
             headroom: Headroom | None = None) -> Estimate:
    """Memory per pipeline stage, step time and throughput of one layout.

    ``mfu_peak``: the dense peak MFU and HFU divide by; ``notes``: the caller's own notes, kept after the
    estimate's in ``Estimate.notes``; ``headroom``: the memory margin of ``Estimate.fits_with_margin`` (None:
    the memory model's error band). Raises ``LayoutError`` (a ``SpecError``) naming the first Megatron rule
    the layout breaks, ``SpecError`` for a bad input.
    """
    if mfu_peak not in ("bf16", "fp8", "fp16"):
        raise SpecError(f"mfu_peak must be bf16, fp8 or fp16, got {mfu_peak!r}")
    if isinstance(notes, str):
        raise SpecError("notes: expected a sequence of strings, got one string")
    cluster = resolve_cluster(gpu, num_gpus, gpus_per_node)
    return _estimate_layout(resolve_model(model), cluster, resolve_training(training),
                            resolve_layout(layout, cluster.num_gpus), memory_options=memory_options,
                            mfu_peak=mfu_peak, extra_notes=[str(n) for n in notes], headroom=headroom)


def plan(model: ModelRef, gpu: GpuRef, num_gpus: int | None = None, *, training: TrainingRef,
         space: SpaceRef | None = None, objective: Objective = "throughput", top_k: int = 5,
         gpus_per_node: int | None = None, memory_options: MemoryOptions | None = None,
         headroom: Headroom | None = None) -> Plan:
    """Search every valid layout of ``space`` and rank the ones that fit by ``objective``; the best
    ``top_k`` are full estimates (``Plan.candidates``). A layout fits when its peak plus the ``headroom``
    margin stays within usable memory (None: the memory model's error band, ``paraplan.headroom``).

    Raises ``NoFeasiblePlanError`` (with rejection counts) when nothing fits, ``SpecError`` for a bad input.
    """
    if objective not in ("throughput", "memory-headroom"):
        raise SpecError(f"objective must be throughput or memory-headroom, got {objective!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise SpecError(f"top_k must be a positive integer, got {top_k!r}")
    cluster = resolve_cluster(gpu, num_gpus, gpus_per_node)
    return _search(resolve_model(model), cluster, resolve_training(training), space=resolve_space(space),
                   objective=objective, top_k=top_k, options=memory_options, headroom=headroom)


__all__ = [
    "GpuRef",
    "LayoutRef",
    "ModelRef",
    "SpaceRef",
    "TrainingRef",
    "estimate",
    "plan",
    "resolve_cluster",
    "resolve_layout",
    "resolve_model",
    "resolve_space",
    "resolve_training",
]
