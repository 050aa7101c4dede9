"""Read Megatron-LM training output: text logs (all versions and derived frameworks documented in
``shared/reference/megatron-logs.md``) and TensorBoard event files, into records and a summary.

    >>> from paraplan.ingest import parse_text
    >>> log = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 812.5 |")
    >>> log.iterations[0].step_time_s
    0.8125

Units are seconds and bytes; values a log did not carry are ``None``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from paraplan.errors import IngestError
from paraplan.ingest.megatron import parse_line, parse_segment, parse_text
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
from paraplan.ingest.summary import quantile, summarize
from paraplan.ingest.tensorboard import read_tensorboard, runlog_from_scalars


def is_tensorboard(path: Path) -> bool:
    """True for a TensorBoard event file (``events.out.tfevents.*``) or a directory."""
    return path.is_dir() or "tfevents" in path.name


def read_log(path: str | Path) -> RunLog:
    """Read one text log or TensorBoard event file/directory; ``IngestError`` if unreadable."""
    path = Path(path)
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if is_tensorboard(path):
        return read_tensorboard(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise IngestError(f"{path}: cannot read ({err.strerror or err})") from err
    if data[:2] == GZIP_MAGIC:  # logs are often kept gzipped
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise IngestError(f"{path}: a damaged gzip file ({err})") from None
    return parse_text(data.decode("utf-8", errors="replace"), source=str(path))


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip stream (RFC 1952, section 2.3.1)."""


def read_logs(paths: list[str] | list[Path]) -> RunLog:
    """Read several logs (e.g. one per job of a resumed run) into one RunLog, one segment each."""
    if not paths:
        raise IngestError("no log files given")
    log = merge([read_log(p) for p in paths])
    if not (log.iterations or log.memory or log.timers or log.step_reports or log.validation or log.theoretical):
        names = ", ".join(str(p) for p in paths)
        raise IngestError(f"{names}: no Megatron training output found ({log.lines} lines read: no iteration line, "
                          "memory report or timer block)")
    return log


__all__ = [
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
    "merge",
    "parse_line",
    "parse_segment",
    "parse_text",
    "quantile",
    "read_log",
    "read_logs",
    "read_tensorboard",
    "runlog_from_scalars",
    "summarize",
]
