"""Read the TensorBoard scalars Megatron-LM writes (reference §5; ``training_log`` in
``training.py``, ``Timers.write`` in ``megatron/core/timers.py``).

Megatron writes TensorBoard (and W&B) only on the last rank: ``mem-*-bytes`` are the last rank's
numbers, not the max over ranks; ``<timer>-time`` are max over ranks in seconds per iteration;
``iteration-time`` is seconds per iteration averaged over the log interval (v1.0:
``iteration_time``).

The event files are read with the ``tensorboard`` package's ``event_accumulator`` (an optional
dependency, imported lazily: ``pip install paraplan[tensorboard]``). ``runlog_from_scalars`` maps
already-read scalars and needs no TensorBoard.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from paraplan.errors import IngestError
from paraplan.fileio import check_regular_file
from paraplan.ingest.records import IterationRecord, MemoryRecord, RunLog, TimerRecord

Series = Mapping[str, Mapping[int, float]]
"""tag -> step -> value."""

_ITER_TAGS: dict[str, str] = {
    "iteration-time": "step_time_s", "iteration_time": "step_time_s",
    "throughput": "tflops_per_gpu", "throughput/tflops/device": "tflops_per_gpu",
    "learning-rate": "learning_rate", "learning_rate": "learning_rate",
    "batch-size": "global_batch_size", "loss-scale": "loss_scale", "loss_scale": "loss_scale",
    "grad-norm": "grad_norm",
}  # fmt: skip
_INTERVAL_TAGS = ("iteration-time", "iteration_time", "throughput", "throughput/tflops/device")
_EXTRA_TAGS = ("num-zeros", "params-norm", "world-size", "skipped-train-samples",
               "iter-energy/gpu", "power/gpu", "max_attention_logit", "max-attention-logit")
_MEM_TAGS = {
    "mem-allocated-bytes": "allocated_bytes", "mem-max-allocated-bytes": "max_allocated_bytes",
    "mem-reserved-bytes": "reserved_bytes", "mem-max-reserved-bytes": "max_reserved_bytes",
}  # fmt: skip


def _is_loss_tag(tag: str) -> bool:
    return ("loss" in tag and "loss-scale" not in tag and "loss_scale" not in tag
            and "validation" not in tag and "/" not in tag)  # fmt: skip


def _iterations(series: Series) -> list[IterationRecord]:
    """One record per logged interval: the steps of ``iteration-time``/``throughput`` when written
    (``--log-timers-to-tensorboard``), else every step of any per-iteration scalar."""
    interval = {s for t in _INTERVAL_TAGS for s in series.get(t, {})}
    tags = [t for t in series if t in _ITER_TAGS or t in _EXTRA_TAGS or _is_loss_tag(t)]
    steps = sorted(interval or {s for t in tags for s in series[t]})
    out: list[IterationRecord] = []
    for step in steps:
        kw: dict[str, Any] = {}
        for tag, attr in _ITER_TAGS.items():
            if (value := series.get(tag, {}).get(step)) is not None:
                kw.setdefault(attr, value)
        if (gbs := kw.get("global_batch_size")) is not None:
            kw["global_batch_size"] = int(gbs) if math.isfinite(gbs) else None
        losses = tuple((t, series[t][step]) for t in tags if _is_loss_tag(t) and step in series[t])
        extra = tuple((t, series[t][step]) for t in _EXTRA_TAGS if step in series.get(t, {}))
        out.append(IterationRecord(iteration=step, losses=losses, extra=extra, fmt="tensorboard",
                                   **kw))
    return out


def _memory(series: Series) -> list[MemoryRecord]:
    tags = [t for t in series if t.startswith("mem-")]
    out: list[MemoryRecord] = []
    for step in sorted({s for t in tags for s in series[t]}):
        kw: dict[str, Any] = {
            a: series[t][step] for t, a in _MEM_TAGS.items() if step in series.get(t, {})
        }
        extra = tuple((t, series[t][step]) for t in tags
                      if t not in _MEM_TAGS and step in series[t])
        out.append(MemoryRecord(iteration=step, context="tensorboard (last rank)", extra=extra,
                                fmt="tensorboard", **kw))
    return out


def _timers(series: Series) -> list[TimerRecord]:
    out = [
        TimerRecord(name=tag.removesuffix("-time"), value_s=v, max_s=v, kind="tensorboard",
                    iteration=step)
        for tag, values in series.items()
        if tag.endswith("-time") and tag != "iteration-time" and " vs " not in tag
        for step, v in values.items()
    ]
    return sorted(out, key=lambda t: (t.iteration or 0, t.name))


def runlog_from_scalars(series: Series, source: str = "<tensorboard>") -> RunLog:
    """Map Megatron's scalar tags (``... vs samples`` variants ignored) onto records."""
    series = {t: v for t, v in series.items() if not t.endswith(" vs samples")}
    iterations = _iterations(series)
    return RunLog(
        iterations=tuple(iterations), memory=tuple(_memory(series)),
        timers=tuple(_timers(series)), segment_starts=(0,) if iterations else (),
        sources=(source,),
    )  # fmt: skip


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise IngestError(
            "reading TensorBoard event files needs the tensorboard package: "
            "pip install paraplan[tensorboard]"
        ) from err


def _scalar_events(acc: Any, tensor_util: ModuleType) -> dict[str, dict[int, float]]:
    """Scalars written as ``simple_value`` (torch SummaryWriter) and as rank-0 tensors (TF2)."""
    series: dict[str, dict[int, float]] = {}
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        series[tag] = {int(e.step): float(e.value) for e in acc.Scalars(tag)}
    for tag in tags.get("tensors", []):
        for event in acc.Tensors(tag):
            if _elements(event.tensor_proto) != 1:  # only scalars are read; a [2e9] shape would expand
                continue
            array = tensor_util.make_ndarray(event.tensor_proto)
            if array.size == 1 and array.dtype.kind in "fiu":
                series.setdefault(tag, {})[int(event.step)] = float(array.reshape(-1)[0])
    return series


def _elements(proto: Any) -> int:
    """The element count ``proto``'s tensor_shape declares (capped at 2: more is never a scalar),
    read before any array is built (tensorboard's make_ndarray expands one float_val to the shape)."""
    count = 1
    for dim in proto.tensor_shape.dim:
        count *= max(int(dim.size), 0)
        if count > 1:
            return 2
    return count


def read_tensorboard(path: str | Path) -> RunLog:
    """Read an event file, or a directory holding ``events.out.tfevents.*`` files."""
    path = Path(path)
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if path.is_dir() and not any("tfevents" in p.name for p in path.iterdir()):
        raise IngestError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in it")
    if not path.is_dir():
        check_regular_file(path, "log", error=IngestError)  # a FIFO would block the reader
    else:  # every event file the accumulator will open, a FIFO among them too
        for p in sorted(path.iterdir()):
            if "tfevents" in p.name:
                check_regular_file(p, "log", error=IngestError)
    ea = _module("tensorboard.backend.event_processing.event_accumulator")
    tensor_util = _module("tensorboard.util.tensor_util")
    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    try:
        acc.Reload()
        series = _scalar_events(acc, tensor_util)
    except Exception as err:  # corrupt files raise assorted errors from protobuf/tensorboard
        raise IngestError(f"{path}: not a readable TensorBoard event file ({err})") from err
    return runlog_from_scalars(series, source=str(path))
