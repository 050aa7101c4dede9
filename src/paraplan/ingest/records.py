"""Records read from Megatron-LM training output (see ``shared/reference/megatron-logs.md``).

Units are SI: seconds and bytes. Every field that a log line did not carry is ``None`` (never -1).
``line`` is the 1-based physical line number in the source text (``None`` for TensorBoard).
``partial`` marks a record read from a truncated or partly unreadable line.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from paraplan.ingest.run_config import RunConfig
from paraplan.ingest.summary import json_float, summarize

Pairs = tuple[tuple[str, float], ...]
"""Ordered ``(name, value)`` pairs (kept as tuples so that records stay immutable)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationRecord:
    """One per-interval iteration line (reference §1, ``training_log`` in ``training.py``).

    ``step_time_s`` is Megatron's ``elapsed time per iteration (ms)`` / 1000 (an average over the
    log interval); ``tflops_per_gpu`` is the model-FLOPs throughput (reference §6). ``losses`` holds
    every printed loss key (``lm loss``, ``mtp_1 loss``, ...); ``extra`` every other numeric field.
    ``fmt`` is the dialect: megatron, megatron-deepspeed, alcf, nemo1, nemo2 or tensorboard.
    """

    iteration: int
    train_iters: int | None = None
    timestamp: str | None = None
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    learning_rate: float | None = None
    global_batch_size: int | None = None
    consumed_samples: int | None = None
    losses: Pairs = ()
    loss_scale: float | None = None
    grad_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    extra: Pairs = ()
    fmt: str = "megatron"
    line: int | None = None
    partial: bool = False

    @property
    def loss(self) -> float | None:
        """``lm loss`` if printed, else the first loss key (``None`` when no loss was printed)."""
        values = dict(self.losses)
        return values.get("lm loss", self.losses[0][1] if self.losses else None)

    @property
    def has_nonfinite_loss(self) -> bool:
        """True when a printed loss is NaN/inf (Megatron itself drops NaN averages, §1.1)."""
        return any(not math.isfinite(v) for _, v in self.losses)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRecord:
    """One ``[Rank N] (after I iterations) memory (MB|GB) | ...`` report (reference §2).

    ``context`` is the text in parentheses (``after 1 iterations``, ``before save_checkpoint for
    iteration 200``); ``rank`` is ``None`` when the line did not say (v1.0, DeepSpeed, TensorBoard,
    which is the last rank only). ``extra`` keeps other keys (Bridge ``mem-active``, counts).
    """

    rank: int | None = None
    iteration: int | None = None
    context: str | None = None
    allocated_bytes: float | None = None
    max_allocated_bytes: float | None = None
    reserved_bytes: float | None = None
    max_reserved_bytes: float | None = None
    device_used_bytes: float | None = None
    extra: Pairs = ()
    fmt: str = "megatron"
    line: int | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerRecord:
    """One timer value per log interval in seconds per iteration (reference §4, ``timers.py``).

    ``kind``: ``minmax`` / ``max`` / ``all`` (new block formats), ``single`` (pre-2022-08 one-line
    ``time (ms) | name: v`` — one rank's value, no min/max), ``tensorboard`` (``<name>-time``, max).
    ``value_s`` is the representative value: the max across ranks when known, else the single one.
    ``iteration`` is the last iteration line seen before the block (``None`` for setup timers).
    """

    name: str
    value_s: float
    min_s: float | None = None
    max_s: float | None = None
    kind: str = "minmax"
    iteration: int | None = None
    rank: int | None = None
    per_rank: Pairs = ()
    line: int | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRecord:
    """``validation loss at iteration N | lm loss value: X | lm loss PPL: Y |`` (reference §1.3)."""

    label: str
    iteration: int | None = None
    values: Pairs = ()
    line: int | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """Megatron-Bridge rank-0 ``Step Time : 3.90s GPU utilization: 209.5MODEL_TFLOP/s/GPU`` (§6)."""

    step_time_s: float
    tflops_per_gpu: float | None = None
    line: int | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TheoreticalMemoryRecord:
    """Megatron's own memory estimate (reference §3, ``theoretical_memory_usage.py``, rank 0 only):
    the verbose lines and the ``Theoretical memory footprints: ...`` summary line, one block.

    Each line of the block parses to a record with its own numbers set (``paraplan.ingest.
    theoretical``); ``combine`` merges them. Parameter counts are counts (printed in billions, so
    exact only to the printed 2 or 4 decimals); bytes from ``MB`` = MiB (2**20). The estimate is for
    the most loaded shard (first pipeline stage); ``other_shards_params`` only when PP > 1.
    ``activation_formula``: ``without_sp`` (``compute_activation_memory_without_sp`` / ``(precise,
    without SP)``, 2025-08+) or ``with_sp`` (Korthikanti Table 2, SP + selective recompute).
    ``components`` keeps every ``name=X MB`` pair of the summary line (Bridge: per component);
    ``unsupported`` is set by ``Theoretical memory footprints not yet supported for <what>.``
    ``extra``: other ``Number of ... in billions:`` lines (label, count). ``raw``: the text of each
    line read, newline-separated; ``line``: the block's first line number.
    """

    weight_and_optimizer_bytes: float | None = None
    activation_bytes: float | None = None
    total_bytes: float | None = None
    components: Pairs = ()
    transformer_params: int | None = None
    active_transformer_params: int | None = None
    mtp_params: int | None = None
    embedding_params: int | None = None
    total_params: int | None = None
    total_active_params: int | None = None
    most_loaded_shard_params: int | None = None
    other_shards_params: int | None = None
    activation_per_layer_bytes: float | None = None
    activation_formula: str | None = None
    interleaved_penalty: float | None = None
    in_flight_microbatches: int | None = None
    unsupported: str | None = None
    extra: Pairs = ()
    raw: str = ""
    line: int | None = None
    partial: bool = False

    @property
    def complete(self) -> bool:
        """True once the summary line (or the ``not yet supported`` line) closed the block."""
        return bool(self.components) or self.unsupported is not None

    def combine(self, other: TheoreticalMemoryRecord) -> TheoreticalMemoryRecord:
        """This block plus a later line of it: fields this one lacks come from ``other``. A
        complete block ignores later lines (the first block of a log wins, as in ``merge``)."""
        if self.complete:
            return self
        merged: dict[str, Any] = {}
        for f in fields(self):
            mine = getattr(self, f.name)
            merged[f.name] = getattr(other, f.name) if mine is None or mine == () else mine
        merged["extra"] = self.extra + other.extra
        merged["raw"] = "\n".join(r for r in (self.raw, other.raw) if r)
        merged["partial"] = self.partial or other.partial
        return TheoreticalMemoryRecord(**merged)


TheoreticalMemory = TheoreticalMemoryRecord
"""Former name (summary line only), kept for ``paraplan.ingest`` importers."""


Record = (
    IterationRecord
    | MemoryRecord
    | TimerRecord
    | ValidationRecord
    | StepReport
    | TheoreticalMemoryRecord
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """Everything read from one or more logs, in source order.

    ``segment_starts`` are indices into ``iterations`` where a run segment starts (a new file or a
    restart: the iteration number went down); warm-up records are skipped per segment.
    Line counters: ``lines`` non-blank physical lines; ``unparsed_lines`` yielded nothing;
    ``partial_lines`` yielded a record but had unreadable parts (truncated, garbage); ``long_lines`` pieces of
    lines longer than ``source.MAX_LINE_BYTES`` that were skipped, not read (binary junk, a dumped tensor).
    """

    iterations: tuple[IterationRecord, ...] = ()
    memory: tuple[MemoryRecord, ...] = ()
    timers: tuple[TimerRecord, ...] = ()
    validation: tuple[ValidationRecord, ...] = ()
    step_reports: tuple[StepReport, ...] = ()
    theoretical: TheoreticalMemoryRecord | None = None
    run_config: RunConfig | None = None
    """The sizes line and argument dump the run printed at start-up (ingest/run_config.py)."""
    segment_starts: tuple[int, ...] = ()
    lines: int = 0
    unparsed_lines: int = 0
    partial_lines: int = 0
    long_lines: int = 0
    sources: tuple[str, ...] = ()

    @property
    def num_records(self) -> int:
        """Records kept (what ``stream.MAX_RECORDS`` counts; the theoretical block is not one)."""
        return (len(self.iterations) + len(self.memory) + len(self.timers) + len(self.validation)
                + len(self.step_reports))

    def summary(self, skip_warmup: int = 1) -> dict[str, Any]:
        """The run summary (see ``paraplan.ingest.summary.summarize``)."""
        return summarize(self, skip_warmup=skip_warmup)

    def to_dict(self, skip_warmup: int = 1) -> dict[str, Any]:
        """JSON-ready dict: records, timers grouped by name, and the summary."""
        return {key: _listed(value) for key, value in self.json_sections(skip_warmup)}

    def json_sections(self, skip_warmup: int = 1) -> Iterator[tuple[str, Any]]:
        """``to_dict``'s items in order, each record list as an iterator of record dicts (the timers: name ->
        iterator), so that a writer can stream a large log record by record."""
        timers: dict[str, list[TimerRecord]] = {}
        for t in self.timers:
            timers.setdefault(t.name, []).append(t)
        yield "sources", list(self.sources)
        yield "iterations", map(record_to_dict, self.iterations)
        yield "memory", map(record_to_dict, self.memory)
        yield "timers", {name: map(record_to_dict, group) for name, group in timers.items()}
        yield "validation", map(record_to_dict, self.validation)
        yield "step_reports", map(record_to_dict, self.step_reports)
        yield "theoretical", record_to_dict(self.theoretical) if self.theoretical else None
        yield "run_config", None if self.run_config is None else {
            "sizes": dict(self.run_config.sizes), "arguments": dict(self.run_config.arguments)}
        yield "summary", self.summary(skip_warmup)


def _listed(value: Any) -> Any:
    """A ``json_sections`` value with its iterators turned into lists."""
    if isinstance(value, Iterator):
        return list(value)
    return {k: _listed(v) for k, v in value.items()} if isinstance(value, dict) else value


def merge(logs: Sequence[RunLog]) -> RunLog:
    """Concatenate logs (e.g. one file per job of a resumed run); each starts a new segment."""
    starts: list[int] = []
    n_iter = 0
    for log in logs:
        starts.extend(n_iter + s for s in log.segment_starts)
        n_iter += len(log.iterations)
    theo = next((log.theoretical for log in logs if log.theoretical is not None), None)
    config = next((log.run_config for log in logs if log.run_config is not None), None)
    return RunLog(
        iterations=tuple(r for log in logs for r in log.iterations),
        memory=tuple(r for log in logs for r in log.memory),
        timers=tuple(r for log in logs for r in log.timers),
        validation=tuple(r for log in logs for r in log.validation),
        step_reports=tuple(r for log in logs for r in log.step_reports),
        theoretical=theo,
        run_config=config,
        segment_starts=tuple(starts),
        lines=sum(log.lines for log in logs),
        unparsed_lines=sum(log.unparsed_lines for log in logs),
        partial_lines=sum(log.partial_lines for log in logs),
        long_lines=sum(log.long_lines for log in logs),
        sources=tuple(s for log in logs for s in log.sources),
    )


MAX_THEORETICAL_LINES = 100
"""Lines of the theoretical-memory block that are merged (the block has about 12; see ``RunLogBuilder``)."""


@dataclass(slots=True)
class RunLogBuilder:
    """Collects records in source order and counts lines; ``build`` freezes them into a RunLog.

    A new segment starts at the first iteration record and wherever the iteration number does not
    increase (a restart); consecutive NeMo 1 tqdm redraws of the same step collapse to the last.
    Timer records without an iteration get the last iteration seen before them. The theoretical-memory
    block takes its first ``MAX_THEORETICAL_LINES`` lines (Megatron prints about 12; merging is not free).
    """

    iterations: list[IterationRecord] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    timers: list[TimerRecord] = field(default_factory=list)
    validation: list[ValidationRecord] = field(default_factory=list)
    step_reports: list[StepReport] = field(default_factory=list)
    theoretical: TheoreticalMemoryRecord | None = None
    segment_starts: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=lambda: [0, 0, 0])  # lines, unparsed, partial
    theoretical_lines: int = 0

    @property
    def num_records(self) -> int:
        """Records kept so far (the theoretical block is one)."""
        return (len(self.iterations) + len(self.memory) + len(self.timers) + len(self.validation)
                + len(self.step_reports))

    def add(self, record: Record) -> None:
        """Append one record to its list."""
        if isinstance(record, IterationRecord):
            self._add_iteration(record)
        elif isinstance(record, MemoryRecord):
            self.memory.append(record)
        elif isinstance(record, TimerRecord):
            last = self.iterations[-1].iteration if self.iterations else None
            self.timers.append(record if record.iteration is not None
                               else replace(record, iteration=last))
        elif isinstance(record, ValidationRecord):
            self.validation.append(record)
        elif isinstance(record, StepReport):
            self.step_reports.append(record)
        elif self.theoretical_lines < MAX_THEORETICAL_LINES:
            self.theoretical_lines += 1
            self.theoretical = record if self.theoretical is None else self.theoretical.combine(record)

    def _add_iteration(self, record: IterationRecord) -> None:
        prev = self.iterations[-1] if self.iterations else None
        if prev is not None and prev.fmt == record.fmt == "nemo1":
            if prev.iteration == record.iteration:
                self.iterations[-1] = record
                return
        if prev is None or record.iteration <= prev.iteration:
            self.segment_starts.append(len(self.iterations))
        self.iterations.append(record)

    def count_line(self, *, recognized: bool, partial: bool) -> None:
        """Count one non-blank physical line."""
        self.counts[0] += 1
        self.counts[1] += not recognized
        self.counts[2] += recognized and partial

    def build(self, source: str) -> RunLog:
        """The frozen RunLog."""
        return RunLog(
            iterations=tuple(self.iterations), memory=tuple(self.memory),
            timers=tuple(self.timers), validation=tuple(self.validation),
            step_reports=tuple(self.step_reports), theoretical=self.theoretical,
            segment_starts=tuple(self.segment_starts),
            lines=self.counts[0], unparsed_lines=self.counts[1], partial_lines=self.counts[2],
            sources=(source,),
        )  # fmt: skip


def record_to_dict(record: Record) -> dict[str, Any]:
    """A record as a JSON-ready dict; ``Pairs`` become objects, NaN/inf become ``None``.

    Names of fields whose value was NaN/inf are listed under ``nonfinite``.
    """
    out: dict[str, Any] = {}
    nonfinite: list[str] = []
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, tuple):
            nonfinite += [k for k, v in value if not math.isfinite(v)]
            out[f.name] = {k: json_float(v) for k, v in value}
        elif isinstance(value, float) and not math.isfinite(value):
            nonfinite.append(f.name)
            out[f.name] = None
        else:
            out[f.name] = value
    out["nonfinite"] = nonfinite
    return out
