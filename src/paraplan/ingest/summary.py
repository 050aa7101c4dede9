"""Run summary: step time and throughput percentiles after warm-up, peak memory, skip/NaN counts.

Warm-up (reference §1.1 and §9.6-7): the first logged interval includes compilation, NCCL set-up
and data-loader spin-up, so the first ``skip_warmup`` iteration records of every segment (each
file, and each restart inside a file) are left out of the step-time, throughput and skip/NaN
figures. Peak memory uses every memory report: Megatron's ``max allocated`` is a peak since
process start, so warm-up cannot be separated from it anyway (§2).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the records are only named here: records.py imports this module, not the other way
    from paraplan.ingest.records import IterationRecord, RunLog, TimerRecord


def json_float(value: float | None) -> float | None:
    """Non-finite floats become ``None`` so that the JSON stays strict (RFC 8259)."""
    return value if value is None or math.isfinite(value) else None


def quantile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default method) of the finite values; ``None`` if
    there are none. ``quantile(v, 0.5)`` is the median."""
    data = sorted(v for v in values if math.isfinite(v))
    if not data:
        return None
    pos = q * (len(data) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def after_warmup(log: RunLog, skip_warmup: int = 1) -> list[IterationRecord]:
    """Iteration records without the first ``skip_warmup`` records of each segment."""
    starts = [*log.segment_starts, len(log.iterations)]
    if not log.segment_starts or log.segment_starts[0] != 0:
        starts.insert(0, 0)
    kept: list[IterationRecord] = []
    for begin, end in itertools.pairwise(starts):
        kept.extend(log.iterations[begin + skip_warmup : end])
    return kept


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {"median": quantile(values, 0.5), "p90": quantile(values, 0.9)}


def _count(values: Iterable[int | None]) -> int | None:
    """Sum of the counts that were printed; ``None`` when no record carried the field."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _nan_count(record: IterationRecord) -> int | None:
    """Megatron's ``number of nan iterations``, at least 1 when a printed loss is NaN/inf."""
    if record.has_nonfinite_loss:
        return max(record.nan_iterations or 0, 1)
    return record.nan_iterations


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _memory(log: RunLog) -> dict[str, Any]:
    peak = [m for m in log.memory if _finite(m.max_allocated_bytes)]
    top = max(peak, key=lambda m: m.max_allocated_bytes or 0.0, default=None)
    reserved = [m.max_reserved_bytes for m in log.memory if _finite(m.max_reserved_bytes)]
    used = [m.device_used_bytes for m in log.memory if _finite(m.device_used_bytes)]
    theo = log.theoretical
    return {
        "max_allocated_bytes": top.max_allocated_bytes if top else None,
        "max_allocated_rank": top.rank if top else None,
        "max_reserved_bytes": max((r for r in reserved if r is not None), default=None),
        "max_device_used_bytes": max((u for u in used if u is not None), default=None),
        "theoretical_total_bytes": json_float(theo.total_bytes) if theo else None,
        "theoretical_weight_and_optimizer_bytes": json_float(theo.weight_and_optimizer_bytes) if theo else None,
        "theoretical_activation_bytes": json_float(theo.activation_bytes) if theo else None,
        "theoretical_total_params": theo.total_params if theo else None,
        "theoretical_most_loaded_shard_params": theo.most_loaded_shard_params if theo else None,
    }


SETUP_TIMERS = frozenset({
    "interval-time", "model-and-optimizer-setup", "train/valid/test-data-iterators-setup",
    "load-checkpoint", "save-checkpoint", "save-checkpoint-non-persistent", "evaluate",
    "eval-time", "gpu-sniff-test",
})  # fmt: skip
"""Level-0 timers printed by dedicated ``timers.log`` calls, not per iteration (reference §4.3)."""


def _timer_blocks(timers: Sequence[TimerRecord]) -> list[list[TimerRecord]]:
    """Per-iteration timer records split into the blocks Megatron prints once per log interval: a
    block ends where the iteration tag changes or a timer name repeats."""
    blocks: list[list[TimerRecord]] = []
    names: set[str] = set()
    for t in timers:
        if not blocks or t.name in names or t.iteration != blocks[-1][0].iteration:
            blocks.append([])
            names = set()
        blocks[-1].append(t)
        names.add(t.name)
    return blocks


def _timers(log: RunLog, skip_warmup: int) -> dict[str, dict[str, float | None]]:
    """Per-iteration timers: median/p90 of ``value_s`` per name over the intervals kept for the
    step time. A timer block belongs to the iteration line before it (reference §9.4, §9.6): the
    first block after a warm-up record's line is left out, and so is any block before the first
    iteration line. A later block with the same tag (its iteration line missing from the log) is
    kept, and a timer that first appears in the second interval is kept. Blocks with no iteration
    line before them (timer-only logs) leave out their first ``skip_warmup`` blocks."""
    blocks = _timer_blocks([t for t in log.timers if t.name not in SETUP_TIMERS])
    untagged = [b for b in blocks if b[0].iteration is None]  # no iteration line before them
    kept = untagged[skip_warmup:]
    warm = {r.iteration for r in log.iterations} - {r.iteration for r in after_warmup(log, skip_warmup)}
    seen: set[int | None] = set()
    for block in blocks:
        tag = block[0].iteration
        if tag is not None and not (tag in warm and tag not in seen):
            kept.append(block)
        seen.add(tag)
    by_name: dict[str, list[float]] = {}
    for block in kept:
        for t in block:
            by_name.setdefault(t.name, []).append(t.value_s)
    return {name: _stats(vs) for name, vs in by_name.items()}


def _setup_timers(log: RunLog) -> dict[str, float]:
    """Setup/checkpoint timers: the largest value seen per name (all occurrences)."""
    out: dict[str, float] = {}
    for t in log.timers:
        if t.name in SETUP_TIMERS and math.isfinite(t.value_s):
            out[t.name] = max(out.get(t.name, t.value_s), t.value_s)
    return out


def summarize(log: RunLog, skip_warmup: int = 1) -> dict[str, Any]:
    """The ``summary`` object of ``paraplan ingest --format json`` (seconds, bytes, TFLOP/s/GPU).

    ``step_time_s`` falls back to Megatron-Bridge ``Step Time`` reports when no iteration line
    carried a step time. ``nan_iterations`` adds intervals whose printed loss is NaN to Megatron's
    own counter (which stays 0 under bf16, §1.1); note that Megatron drops a NaN ``lm loss`` from
    the line entirely, so ``loss_missing_iterations`` counts records without any loss.
    """
    skip = max(0, skip_warmup)
    used = after_warmup(log, skip)
    times = [r.step_time_s for r in used if r.step_time_s is not None]
    if not any(r.step_time_s is not None for r in log.iterations):
        times = [s.step_time_s for s in log.step_reports[skip:]]
    tflops = [r.tflops_per_gpu for r in used if r.tflops_per_gpu is not None]
    if not any(r.tflops_per_gpu is not None for r in log.iterations):
        tflops = [s.tflops_per_gpu for s in log.step_reports[skip:] if s.tflops_per_gpu is not None]
    return {
        "iterations": len(used),
        "iteration_records": len(log.iterations),
        "warmup_records_skipped": len(log.iterations) - len(used),
        "segments": len(log.segment_starts),
        "step_time_s": _stats(times),
        "tflops_per_gpu": _stats(tflops),
        **_memory(log),
        "skipped_iterations": _count(r.skipped_iterations for r in used),
        "nan_iterations": _count(_nan_count(r) for r in used),
        "loss_missing_iterations": sum(1 for r in used if not r.losses),
        "timers_s": _timers(log, skip),
        "setup_timers_s": _setup_timers(log),
        "lines": log.lines,
        "unparsed_lines": log.unparsed_lines,
        "partial_lines": log.partial_lines,
        "long_lines_skipped": log.long_lines,
    }
