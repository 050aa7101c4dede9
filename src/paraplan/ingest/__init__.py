"""Read Megatron-LM training output: text logs (all versions and derived frameworks documented in
``shared/reference/megatron-logs.md``) and TensorBoard event files, into records and a summary.

    >>> from paraplan.ingest import parse_text
    >>> log = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 812.5 |")
    >>> log.iterations[0].step_time_s
    0.8125

Units are seconds and bytes; values a log did not carry are ``None``.
"""

from __future__ import annotations

from pathlib import Path

from paraplan.errors import IngestError
from paraplan.ingest.megatron import parse_line, parse_segment
from paraplan.ingest.records import (
    IterationRecord,
    MemoryRecord,
    Record,
    RunLog,
    StepReport,
    TheoreticalMemory,
    TimerRecord,
    ValidationRecord,
    merge,
)
from paraplan.ingest.source import GZIP_MAGIC, LineStats, log_lines
from paraplan.ingest.stream import MAX_RECORDS, LogParser, parse_lines, parse_text
from paraplan.ingest.summary import quantile, summarize
from paraplan.ingest.tensorboard import read_tensorboard, runlog_from_scalars


def is_tensorboard(path: Path) -> bool:
    """True for a TensorBoard event file (``events.out.tfevents.*``) or a directory."""
    return path.is_dir() or "tfevents" in path.name


def read_log(path: str | Path, *, max_records: int = MAX_RECORDS) -> RunLog:
    """Read one text log (plain or gzip, streamed line by line: ``source.log_lines`` has the limits) or a
    TensorBoard event file/directory; ``IngestError`` in one line if unreadable or over a limit."""
    if isinstance(path, str) and not path:  # Path("") is the current folder
        raise IngestError("an empty log file name (give a log file or a TensorBoard directory)")
    path = Path(path)
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if is_tensorboard(path):
        return read_tensorboard(path)
    stats = LineStats()
    parser = LogParser(str(path), max_records=max_records)
    for line_no, text in log_lines(path, stats):
        parser.feed(text, line_no)
    return parser.finish(long_lines=stats.long_lines)


def read_logs(paths: list[str] | list[Path]) -> RunLog:
    """Read several logs (e.g. one per job of a resumed run) into one RunLog, one segment each."""
    if not paths:
        raise IngestError("no log files given")
    logs: list[RunLog] = []
    for p in paths:  # the record limit holds for all the logs together
        logs.append(read_log(p, max_records=MAX_RECORDS - sum(x.num_records for x in logs)))
    log = merge(logs)
    if not (log.iterations or log.memory or log.timers or log.step_reports or log.validation or log.theoretical):
        names = ", ".join(str(p) for p in paths)
        skipped = f", {log.long_lines} over-long line(s) skipped" if log.long_lines else ""
        raise IngestError(f"{names}: no Megatron training output found ({log.lines} lines read{skipped}: no iteration "
                          "line, memory report or timer block)")
    return log


__all__ = [
    "GZIP_MAGIC",
    "MAX_RECORDS",
    "IngestError",
    "IterationRecord",
    "MemoryRecord",
    "Record",
    "RunLog",
    "StepReport",
    "TheoreticalMemory",
    "TimerRecord",
    "ValidationRecord",
    "is_tensorboard",
    "log_lines",
    "merge",
    "parse_line",
    "parse_lines",
    "parse_segment",
    "parse_text",
    "quantile",
    "read_log",
    "read_logs",
    "read_tensorboard",
    "runlog_from_scalars",
    "summarize",
]
