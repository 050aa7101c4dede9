"""AMD Primus iteration lines (reference §8), on top of the Megatron iteration parser::

    [20250101 10:00:00][rank-7/8][INFO ] [----trainer.py:2560] : iteration 126/ 5000 |
    elapsed time per iteration (ms): 13372.8/13364.7 | hip mem usage/free/total/usage_ratio:
    153.81GB/38.19GB/192.00GB/80.11% | throughput per GPU (TFLOP/s/GPU): 567.6/568.0 |
    tokens per GPU (tokens/s/GPU): 9801.4/9807.3 | ...

Value pairs are ``current/average``: the Megatron parser keeps the current value in the usual
fields (``step_time_s``, ``tflops_per_gpu``, ``extra``); the average goes to ``extra`` as
``average <key>`` (as printed, e.g. ms). ``hip mem usage/free/total/usage_ratio`` becomes a
``MemoryRecord`` of the printing rank (``[rank-R/W]``; Megatron prints on the last rank): usage is
the device's used memory (``device_used_bytes``, the whole device as HIP sees it, not PyTorch's
allocator), free/total/usage ratio go to ``extra``. GB is taken as GiB (2**30), the usual
``/ 1024**3`` of such loggers; the reference does not say (not checked against Primus source).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from paraplan.ingest.records import IterationRecord, MemoryRecord, Record
from paraplan.units import GIB

# Linear-time patterns (possessive quantifiers; pairs split at ':' then matched), see megatron.py.
_NUM = r"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+"
_RANK = re.compile(r"\[rank-(\d{1,12}+)/(\d{1,12}+)\]")  # at most 12 digits: int() stays cheap
_HIP_KEY = "hip mem usage/free/total/usage_ratio"
_HIP = re.compile(rf"{re.escape(_HIP_KEY)}\s*+:\s*+([^|]*+)")
_HIP_VALUE = re.compile(rf"^\s*+({_NUM})\s*+(GB|GiB|%)\s*+$")
_HIP_NAMES = ("used", "free", "total", "usage ratio")
_PAIR_VALUE = re.compile(rf"\s*+({_NUM})\s*+/\s*+({_NUM})\s*+")

IterationParser = Callable[[str, "int | None"], "IterationRecord | None"]


def is_primus(text: str) -> bool:
    """A Primus line: ``[rank-R/W]`` logger prefix or the ``hip mem usage/...`` field."""
    return _HIP_KEY in text or _RANK.search(text) is not None


def parse_hip_memory(text: str, iteration: int | None = None, line: int | None = None) -> (
    MemoryRecord | None
):
    """``hip mem usage/free/total/usage_ratio: 153.81GB/38.19GB/192.00GB/80.11%`` as a
    MemoryRecord (``partial`` when a value is cut off or unreadable; ``None`` without the usage)."""
    m = _HIP.search(text)
    if m is None:
        return None
    values: list[tuple[str, float]] = []
    pieces = m.group(1).split("/")
    for name, piece in zip(_HIP_NAMES, pieces, strict=False):
        v = _HIP_VALUE.match(piece)
        if v is None or (v.group(2) == "%") != (name == "usage ratio"):
            break
        values.append((name, float(v.group(1)) / 100 if name == "usage ratio" else float(v.group(1)) * GIB))
    if not values:
        return None
    rank = _RANK.search(text)
    return MemoryRecord(
        rank=int(rank.group(1)) if rank else None, iteration=iteration,
        context=f"iteration {iteration}" if iteration is not None else None,
        device_used_bytes=values[0][1], extra=tuple(values[1:]), fmt="primus", line=line,
        partial=len(values) < len(_HIP_NAMES) or len(pieces) != len(_HIP_NAMES),
    )  # fmt: skip


def averages(text: str) -> tuple[tuple[str, float], ...]:
    """``(average <key>, b)`` for every ``key: a/b`` field of the line (key as printed, stripped)."""
    out: list[tuple[str, float]] = []
    for piece in text.split("|"):
        key, sep, value = piece.partition(":")
        if sep and key and (m := _PAIR_VALUE.fullmatch(value)):
            out.append((f"average {key.strip()}", float(m.group(2))))
    return tuple(out)


def with_primus(parse_iteration: IterationParser) -> Callable[[str, int | None], IterationRecord | list[Record] | None]:
    """Wrap the iteration parser: a Primus line gives its IterationRecord (``fmt="primus"``,
    averages in ``extra``) and, when it has ``hip mem usage``, a MemoryRecord; others unchanged."""

    def parse(text: str, line: int | None = None) -> IterationRecord | list[Record] | None:
        record = parse_iteration(text, line)
        if record is None or not is_primus(text):
            return record
        mem = parse_hip_memory(text, record.iteration, line)
        broken = mem is None and _HIP_KEY in text
        record = dataclasses.replace(record, fmt="primus", extra=record.extra + averages(text),
                                     partial=record.partial or broken)
        return [record] if mem is None else [record, mem]

    return parse
