"""Stream a log file's lines with bounded memory: plain text or gzip, any size.

``log_lines`` yields ``(line number, text)`` pieces, one physical line (``\\n``-terminated) at a time, decoded as
UTF-8 with ``errors="replace"`` (a stray byte becomes U+FFFD instead of failing the log). Limits, each a one-line
``IngestError`` or a visible count, never a hang or an unbounded read:

* only regular files are opened (``paraplan.fileio.open_regular_file``): a FIFO would block, ``/dev/zero`` never
  ends, a directory or socket cannot be read; the check comes before the open;
* a physical line longer than ``MAX_LINE_BYTES`` is cut at its ``\\r`` (tqdm redraws: NeMo 1 writes a whole run
  as one line of ``\\r``-separated bars), the pieces sharing the line number; a ``\\r``-piece still longer than
  that is skipped and counted in ``LineStats.long_lines`` (Megatron's longest line, an iteration line, is about
  2 KB: such a piece is binary junk or a dumped tensor, and the rest of the log stays readable);
* gzip data may expand at most ``MAX_GZIP_RATIO`` times the compressed bytes read (checked once more than
  ``GZIP_RATIO_FLOOR_BYTES`` came out): deflate reaches about 1000x on runs of one byte (a gzip bomb: 13 MB
  of zeros is 13 GB), while the sample logs compress 2-3x and benchmarks/ingest_scale.py's repetitive 100 MB log
  14x. A file over the limit is refused with a line saying how to avoid it (gunzip it: text has no size limit).

Not here: TensorBoard event files (``tensorboard.py``) and what the lines mean (``megatron.py``).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from paraplan.errors import IngestError
from paraplan.fileio import open_regular_file
from paraplan.units import MIB

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip stream (RFC 1952, section 2.3.1)."""
MAX_LINE_BYTES = 1 * MIB
"""Longest physical line (or ``\\r``-piece of one) that is parsed; longer pieces are skipped and counted."""
MAX_GZIP_RATIO = 100
"""Most uncompressed bytes per compressed byte read that a gzipped log may expand to."""
GZIP_RATIO_FLOOR_BYTES = 64 * MIB
"""Uncompressed bytes a gzipped log may always expand to (small files of one repeated line are fine)."""


class _Reader(Protocol):
    """What ``_pieces`` reads from: a binary file or ``_Gzip``."""

    def readline(self, limit: int, /) -> bytes: ...


@dataclass(slots=True)
class LineStats:
    """What the reader dropped: ``long_lines`` pieces over ``MAX_LINE_BYTES`` (counted, not parsed)."""

    long_lines: int = 0


class _Gzip:
    """A gzip stream that refuses to expand more than ``MAX_GZIP_RATIO`` times the compressed bytes read."""

    def __init__(self, raw: BinaryIO, name: str, max_ratio: int) -> None:
        self.raw, self.name, self.max_ratio = raw, name, max_ratio
        self.stream = gzip.GzipFile(fileobj=raw, mode="rb")
        self.out_bytes = 0

    def readline(self, limit: int) -> bytes:
        try:
            data = self.stream.readline(limit)
        except (OSError, EOFError, zlib.error) as err:
            raise IngestError(f"{self.name}: a damaged gzip file ({err})") from None
        self.out_bytes += len(data)
        if self.out_bytes > GZIP_RATIO_FLOOR_BYTES and self.out_bytes > self.max_ratio * self.raw.tell():
            raise IngestError(
                f"{self.name}: gzip data expands more than {self.max_ratio}x (MAX_GZIP_RATIO; "
                f"{self.out_bytes / MIB:,.0f} MiB out of {self.raw.tell() / MIB:,.1f} MiB read): a gzip bomb? "
                "If it is a real log, gunzip it and give the text file (text logs have no size limit)")
        return data


def _skip_piece(read: _Reader, stats: LineStats, window: int) -> tuple[bytes, bool]:
    """Skip the rest of an over-long piece, up to the next ``\\r`` (what follows it is returned, False) or the end of
    the line (``b""``, True)."""
    stats.long_lines += 1
    while chunk := read.readline(window):
        if (cut := chunk.find(b"\r")) >= 0:
            return chunk[cut + 1 :], False
        if chunk.endswith(b"\n"):
            return b"", True
    return b"", True


def _pieces(read: _Reader, stats: LineStats, max_line_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """``(bytes, ends_line)``: whole lines, or for a line longer than ``max_line_bytes`` its ``\\r``-ended pieces,
    leaving out (and counting) each ``\\r``-piece that is itself longer than that."""
    window = max_line_bytes + 1  # a line of max_line_bytes and its newline
    carry, inside = b"", False  # inside: a long line was started (its end comes as a piece, b"" if need be)
    while True:
        data = carry if carry.endswith(b"\n") else carry + read.readline(window - len(carry))
        carry = b""
        if not data:
            if inside:
                yield b"", True
            return
        if data.endswith(b"\n") or len(data) < window:  # shorter without a newline: the end of the file
            yield data, True
            inside = False
            continue
        cut = data.rfind(b"\r")
        if cut >= 0:  # a long line of tqdm redraws: parse what is before the last \r, go on after it
            yield data[: cut + 1], False
            carry, inside = data[cut + 1 :], True
            continue
        carry, ended = _skip_piece(read, stats, window)
        inside = not ended
        if ended:
            yield b"", True


def log_lines(path: str | Path, stats: LineStats | None = None, *, max_line_bytes: int = MAX_LINE_BYTES,
              max_gzip_ratio: int = MAX_GZIP_RATIO) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text without the newline)`` for every physical line of a text or gzip log; an
    over-long line comes as several ``\\r``-pieces with one number (see the module docstring for the limits)."""
    stats = stats if stats is not None else LineStats()
    with open_regular_file(path, "log", error=IngestError) as raw:
        try:
            gzipped = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
        except OSError as err:
            raise IngestError(f"{path}: cannot read ({err.strerror or err})") from None
        read = _Gzip(raw, str(path), max_gzip_ratio) if gzipped else raw
        line_no = 1
        try:
            for data, ends_line in _pieces(read, stats, max_line_bytes):
                yield line_no, data.decode("utf-8", errors="replace").removesuffix("\n")
                line_no += ends_line
        except OSError as err:
            raise IngestError(f"{path}: cannot read ({err.strerror or err})") from None
