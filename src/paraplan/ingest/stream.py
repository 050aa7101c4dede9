"""Read a whole log, one physical line at a time: the multi-line timer blocks (reference §4.2), the line counts,
the run's sizes line and argument dump, into a ``RunLog``.

``LogParser`` keeps only the records (and the state of the open timer block): it is fed lines, so a log file is
streamed (``source.log_lines``) and never held whole; its time is linear in the log's size (every pattern in
``megatron.py``, ``primus.py``, ``theoretical.py`` and ``run_config.py`` is linear in the line length). The records
kept are what Megatron prints (an iteration line per log interval, a timer block, memory reports), at most
``max_records`` of them. ``parse_text`` is the same for a text already in memory.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from paraplan.errors import IngestError
from paraplan.ingest import records as rec
from paraplan.ingest.megatron import _MS_IN_S, NUM, parse_segment, parse_timer_body, segments
from paraplan.ingest.records import RunLog, TimerRecord
from paraplan.ingest.run_config import RunConfigReader

MAX_RECORDS = 5_000_000
"""Records one ``read_log``/``read_logs`` call keeps (about 200-700 bytes each): a run of 10**6 iterations logged
every iteration with 4 timers. Beyond it the log is refused with a line saying so (ingest a part of it)."""

_HEADER = re.compile(r"^(\(min, max\) time|max time|times) across ranks \(ms\):$")
_ALL_NAME = re.compile(r"^(\S[^:]*+):$")
_ALL_RANK = re.compile(rf"^rank\s++(\d++):\s*+({NUM})$")
_NOISE = re.compile(r"^(?:-{10,}+|Theoretical memory footprints not yet supported.*)$")


class _TimerBlock:
    """State of a multi-line timer block (§4.2, ``Timers.log``): the ``max`` body and the ``all``
    form (``  name:`` then ``     rank  N: value`` lines); minmax bodies are stateless."""

    def __init__(self, out: rec.RunLogBuilder) -> None:
        self.out, self.kind, self.name, self.line = out, "", "", 0
        self.ranks: list[tuple[str, float]] = []

    def feed(self, text: str, line: int) -> bool:
        """True if the segment belongs to the block; any other segment ends the block."""
        if header := _HEADER.match(text):
            self.close()
            self.kind = {"(min, max) time": "minmax", "max time": "max"}.get(header.group(1), "all")
            return True
        if self.kind == "max" and (rec_ := parse_timer_body(text, line, "max")) is not None:
            self.out.add(rec_)
            return True
        if self.kind == "all":
            if self.name and (rank := _ALL_RANK.match(text)):
                self.ranks.append((rank.group(1), float(rank.group(2)) / _MS_IN_S))
                return True
            if name := _ALL_NAME.match(text):
                self._flush()
                self.name, self.line = name.group(1), line
                return True
        self.close()
        return False

    def _flush(self) -> None:
        if self.name and self.ranks:
            lo, hi = min(v for _, v in self.ranks), max(v for _, v in self.ranks)
            self.out.add(TimerRecord(name=self.name, value_s=hi, min_s=lo, max_s=hi, kind="all",
                                     per_rank=tuple(self.ranks), line=self.line))
        self.name, self.ranks = "", []

    def close(self) -> None:
        """Emit a pending ``all`` timer and leave the block."""
        self._flush()
        self.kind = ""


def _feed(text: str, line: int, out: rec.RunLogBuilder, block: _TimerBlock) -> tuple[bool, bool]:
    if block.feed(text, line):
        return True, False
    records = parse_segment(text, line)
    for record in records:
        out.add(record)
    return bool(records) or bool(_NOISE.match(text)), any(r.partial for r in records)


class LogParser:
    """Parse a log fed as physical lines (``feed``), then ``finish`` into a ``RunLog``. A line is unparsed when
    none of its pieces was recognised, partial when a record was truncated or a glued piece next to a record was
    unreadable. A line may be fed in several pieces with one line number (``source.log_lines`` cuts over-long
    lines at ``\\r``); it is counted once."""

    def __init__(self, source: str = "<text>", *, max_records: int | None = None) -> None:
        self.source, self.max_records = source, max_records
        self.out = rec.RunLogBuilder()
        self.block = _TimerBlock(self.out)
        self.config = RunConfigReader()
        self.line_no, self.bad = 0, False
        self.known: list[bool] = []

    def _count(self) -> None:
        if self.known:
            self.out.count_line(recognized=any(self.known), partial=self.bad or not all(self.known))
        self.known, self.bad = [], False

    def feed(self, physical: str, line_no: int) -> None:
        """One physical line (or a piece of one) without its newline; ``IngestError`` past ``max_records``."""
        if line_no != self.line_no:
            self._count()
            self.line_no = line_no
        for piece in segments(physical):
            ok, bad = _feed(piece, line_no, self.out, self.block)
            self.known.append(ok)
            self.bad = self.bad or bad
        self.config.feed(physical)
        if self.max_records is not None and self.out.num_records > self.max_records:
            raise IngestError(f"{self.source}: more than {self.max_records:,} records by line {line_no:,} (MAX_RECORDS "
                              f"{MAX_RECORDS:,} for all the logs read together, each iteration, timer and memory "
                              "line kept in memory); ingest a part of the log (e.g. split -l)")

    def finish(self, *, long_lines: int = 0) -> RunLog:
        """The ``RunLog`` of the lines fed (``long_lines``: pieces the reader skipped as too long)."""
        self._count()
        self.block.close()
        log = dataclasses.replace(self.out.build(self.source), long_lines=long_lines)
        config = self.config.result(self.source)
        return log if config is None else dataclasses.replace(log, run_config=config)


def parse_lines(lines: Iterable[tuple[int, str]], source: str = "<text>", *, max_records: int | None = None) -> (
    RunLog
):
    """Parse ``(line number, text)`` physical lines (any mix of the formats in ``megatron.py``) into a ``RunLog``."""
    parser = LogParser(source, max_records=max_records)
    for line_no, text in lines:
        parser.feed(text, line_no)
    return parser.finish()


def parse_text(text: str, source: str = "<text>") -> RunLog:
    """Parse a whole log held in memory into a ``RunLog``; never raises."""
    return parse_lines(enumerate(text.split("\n"), start=1), source)
