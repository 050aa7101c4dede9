"""Parse Megatron-LM (and derived frameworks') training output into records.

Formats: ``shared/reference/megatron-logs.md`` (§ numbers below), read from Megatron-LM
``training.py`` (``training_log``), ``utils/common_utils.py`` (``report_memory``),
``core/timers.py`` (``Timers.log``), ``theoretical_memory_usage.py``, Bridge ``train_utils.py``.
Each ``parse_*`` reads one format from one cleaned segment (record or ``None``); ``parse_line``
cleans and splits a physical line; ``stream.py`` reads whole logs (timer-block state). Never raises on bad text.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from paraplan.ingest import records as rec
from paraplan.ingest.primus import with_primus
from paraplan.ingest.records import IterationRecord, MemoryRecord, Record, TimerRecord
from paraplan.ingest.theoretical import parse_theoretical
from paraplan.units import GB, GIB, MIB, MS

# Linear-time patterns (issue 17): possessive quantifiers (``*+``, ``++``) where giving characters back can never
# help, ``(?<!...)`` where a search would otherwise restart inside the run it just scanned, and no lazy group before
# ``\s*$`` (split, then strip). tests/ingest/test_hostile_patterns.py times each on 100 KB lines.
NUM = r"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+|[-+]?+(?:nan|inf(?:inity)?+)"
"""A printed number: ``12``, ``1.5``, ``.5``, ``1.0E-05``, ``nan``, ``inf`` (wrap it in a group)."""
_VALUE = re.compile(rf"\s*+({NUM})(?:\s*+/\s*+(?:{NUM}))*+\s*+", re.IGNORECASE)

# §9.1: launcher / logging prefixes (srun -l, torchrun [rankN]:, python logging, ALCF fork).
_PREFIX = re.compile(
    r"^(?:\s*+(?:\d++:\s|\[rank\d++\]:\s?+|(?:INFO|WARNING|DEBUG|ERROR|CRITICAL):[\w.]++:"
    r"|\[[^\]]*+\]\[(?:INFO|WARNING|DEBUG|ERROR)\s*+\]\[[^\]]*+\]\s*+-\s))++"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*+[A-Za-z]")
# §9.1: glued records (ranks writing to one stream without a newline); the leading lookahead
# on the first characters only makes the split fast.
_GLUE = re.compile(
    r"(?=[\[ i(T])(?:(?=\[Rank \d+\] \()|(?= ?\[\d{4}-\d\d-\d\d [\d:.]+\] iteration\s)"
    r"|(?<=[^\s,:\]])(?= ?iteration\s+\d+\s*/)|(?<=[\d|])(?=\(min, max\) time across)"
    r"|(?<=\S)(?=Training epoch \d+, iteration ))")
# Integer captures (ranks, iterations, steps) hold at most 12 digits (``_INT``): a line with a longer
# number is not a record, so int() never meets a number past Python's 4,300-digit limit.
_INT = r"\d{1,12}+(?!\d)"
_ITER = re.compile(rf"iteration\s*+(?:[=:]\s*+)?({_INT})\s*+/\s*+({_INT})")
_STAMP = re.compile(r"\[(\d{4}-?\d\d-?\d\d[ T][\d:.]++)\]")
_KV_SEP = re.compile(r"[:=]")

_MS_IN_S = round(1 / MS)  # divide (not * 1e-3): 7624.3 ms -> 7.6243 s, not 7.624300000000001
# §1 / §8: normalised field name -> (IterationRecord attribute, divisor to SI).
_ITER_FIELDS: dict[str, tuple[str, float]] = {
    "elapsed time per iteration ms": ("step_time_s", _MS_IN_S), "lr": ("learning_rate", 1.0),
    "train step timing in s": ("step_time_s", 1.0), "learning rate": ("learning_rate", 1.0),
    "throughput per gpu tflop/s/gpu": ("tflops_per_gpu", 1.0), "grad norm": ("grad_norm", 1.0),
    "tflops per gpu": ("tflops_per_gpu", 1.0), "tflops": ("tflops_per_gpu", 1.0),
    "[lm]tflops": ("tflops_per_gpu", 1.0), "loss scale": ("loss_scale", 1.0),
    "global batch size": ("global_batch_size", 1.0), "consumed samples": ("consumed_samples", 1.0),
    "number of skipped iterations": ("skipped_iterations", 1.0),
    "number of nan iterations": ("nan_iterations", 1.0),
}  # fmt: skip
_INT_ATTRS = {"global_batch_size", "consumed_samples", "skipped_iterations", "nan_iterations"}


def number(text: str) -> float | None:
    """A printed number (``12.5``, ``1.0E-05``, ``   8``, ``nan``); ``a/b`` pairs give ``a``."""
    m = _VALUE.fullmatch(text)
    return float(m.group(1)) if m else None


def _int(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


@functools.lru_cache(maxsize=4096)
def _norm(key: str) -> str:
    key = key.strip().lower().replace("_", " ").replace("(", "").replace(")", "")
    return " ".join(key.split())


def key_value(piece: str) -> tuple[str, str] | None:
    """``" key : value "`` (or ``key=value``) -> ``("key", "value")``, split at the first ``:`` or ``=``, both
    stripped; ``None`` without a separator after the first character."""
    sep = _KV_SEP.search(piece)
    if sep is None or sep.start() == 0:
        return None
    return piece[: sep.start()].strip(), piece[sep.end() :].strip()


def _fields(text: str) -> tuple[list[tuple[str, str]], bool]:
    """Split ``| key: value | key=value |`` into pairs; the flag is True if a piece was garbage."""
    found = [key_value(piece) for piece in text.split("|") if piece.strip()]
    return [kv for kv in found if kv], not all(found)


def _numbers(pairs: list[tuple[str, str]]) -> list[tuple[str, float]]:
    return [(sys.intern(k.strip()), v) for k, raw in pairs if (v := number(raw)) is not None]


def _is_loss(key: str) -> bool:
    k = _norm(key)
    return "loss" in k and "loss scale" not in k and not k.startswith("val")


def _dialect(head: str, anchor: str, keys: set[str]) -> str:
    if "Training epoch" in head or "=" in anchor:
        return "nemo2" if "Training epoch" in head else "alcf"
    return "megatron-deepspeed" if {"tflops", "samples per second"} & keys else "megatron"


def _collect(pairs: list[tuple[str, str]]) -> tuple[dict[str, Any], bool]:
    """IterationRecord keyword arguments from ``(key, raw value)`` pairs; flag: unreadable value."""
    kw: dict[str, Any] = {}
    losses: list[tuple[str, float]] = []
    extra: list[tuple[str, float]] = []
    bad = False
    for key, raw in pairs:
        value = number(raw)
        attr, scale = _ITER_FIELDS.get(_norm(key), ("", 1.0))
        if value is None:
            bad = bad or bool(attr) or not raw
        elif attr:
            kw.setdefault(attr, _int(value) if attr in _INT_ATTRS else value / scale)
        else:
            (losses if _is_loss(key) else extra).append((sys.intern(key.strip()), value))
    kw["losses"], kw["extra"] = tuple(losses), tuple(extra)
    return kw, bad


def parse_iteration(text: str, line: int | None = None) -> IterationRecord | None:
    """Iteration line (§1.1, §1.2, §8): Megatron-LM/Bridge, Megatron-DeepSpeed, ALCF ``key=value``,
    NeMo 2 ``Training epoch E, iteration I/N | ...`` (I 0-based, as printed), Primus ``cur/avg``.
    Anchor ``iteration N/M`` (§9.2), then pairs in any order; unknown numbers go to ``extra``."""
    m = _ITER.search(text)
    if m is None:
        return None
    head = text[: m.start()]
    pairs, partial = _fields(text[m.end() :])
    kw, bad = _collect(pairs)
    stamp = _STAMP.findall(head)
    return IterationRecord(
        iteration=int(m.group(1)), train_iters=int(m.group(2)),
        timestamp=stamp[-1] if stamp else None, line=line, partial=partial or bad,
        fmt=_dialect(head, m.group(0), {_norm(k) for k, _ in pairs}), **kw,
    )  # fmt: skip


_NEMO1 = re.compile(rf"Epoch ({_INT}):\s*+\d++%\|(?:[^|]*+\|)?\s*+({_INT})/({_INT})\s*+\[([^\]]*+)(\]?)")
_RATE = re.compile(rf"(?<![\d.])({NUM})\s*+(s/it|it/s)")  # no restart inside a number


def parse_nemo1(text: str, line: int | None = None) -> IterationRecord | None:
    """NeMo 1.x tqdm bar (§8): ``Epoch 0:   1%| 795/77225 [9:07:58<878:01:48, 41.36s/it,
    loss=3.1, reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]``;
    iteration = ``global_step`` if printed, else the bar count; step time from the tqdm rate."""
    m = _NEMO1.search(text)
    if m is None:
        return None
    parts = m.group(4).split(",")
    kw, bad = _collect([(k, v) for k, _, v in (p.partition("=") for p in parts[2:]) if v])
    rate = _RATE.search(parts[1]) if len(parts) > 1 else None
    if rate and float(rate.group(1)) > 0:
        r = float(rate.group(1))
        kw["step_time_s"] = r if rate.group(2) == "s/it" else 1.0 / r
    step = _int(dict(kw["extra"]).get("global_step", math.nan))
    iteration = int(m.group(2)) if step is None else step
    return IterationRecord(iteration=iteration, fmt="nemo1", line=line,
                           partial=bad or not m.group(5), **kw)


_MEM = re.compile(rf"^(?:\[Rank ({_INT})\]\s*+)?(?:\(([^)]*+)\)\s*+)?memory \((MB|GB)\)\s*+\|(.*)$")
_MEM_CTX = re.compile(rf"(?<!\d)({_INT}) iterations|iteration ({_INT})")
_MEM_ATTRS = {
    "allocated": "allocated_bytes", "max allocated": "max_allocated_bytes",
    "reserved": "reserved_bytes", "max reserved": "max_reserved_bytes",
    "cached": "reserved_bytes", "max cached": "max_reserved_bytes",  # v1.0
    "total device memory used": "device_used_bytes",
}  # fmt: skip


def parse_memory(text: str, line: int | None = None) -> MemoryRecord | None:
    """``[Rank N] (after I iterations) memory (MB) | allocated: X | max allocated: X | reserved: X |
    max reserved: X[ | total device memory used: X]`` (§2, ``report_memory``; MB = MiB, 2**20),
    v1.0 ``cached``, and the Bridge ``memory (GB) | mem-<name>-gigabytes: X`` line (GB = 1e9)."""
    m = _MEM.match(text)
    if m is None:
        return None
    pairs, partial = _fields(m.group(4))
    kw: dict[str, Any] = {}
    extra: list[tuple[str, float]] = []
    for key, raw in pairs:
        value = number(raw)
        if value is None:
            partial = True
            continue
        k = _norm(key.removeprefix("mem-").replace("-", " "))
        if m.group(3) == "MB":
            value *= MIB
        elif k.endswith(" gigabytes"):
            k, value = k.removesuffix(" gigabytes"), value * GB
        if k in _MEM_ATTRS:
            kw.setdefault(_MEM_ATTRS[k], value)
        else:
            extra.append((k, value))
    ctx = m.group(2)
    it = _MEM_CTX.search(ctx or "")
    return MemoryRecord(
        rank=int(m.group(1)) if m.group(1) else None, context=ctx,
        iteration=int(it.group(1) or it.group(2)) if it else None, extra=tuple(extra),
        fmt="megatron" if m.group(3) == "MB" else "bridge", line=line, partial=partial, **kw,
    )  # fmt: skip


_DS_STEP = re.compile(rf"global_step=({_INT})")
_DS_MEM = re.compile(rf"MemAllocated=({NUM})GB, MaxMemAllocated=({NUM})GB")


def parse_deepspeed_memory(text: str, line: int | None = None) -> MemoryRecord | None:
    """DeepSpeed ``ThroughputTimer`` (§8): ``epoch=0/micro_step=10/global_step=10, ...,
    MemAllocated=1.2GB, MaxMemAllocated=3.4GB``; ``deepspeed/utils/timer.py`` divides by 1024**3."""
    step = _DS_STEP.search(text)
    m = _DS_MEM.search(text, step.end()) if step else None
    if step is None or m is None:
        return None
    return MemoryRecord(
        iteration=int(step.group(1)), context=f"global_step={step.group(1)}",
        allocated_bytes=float(m.group(1)) * GIB, max_allocated_bytes=float(m.group(2)) * GIB,
        fmt="deepspeed", line=line,
    )  # fmt: skip


_LEGACY_TIMERS = re.compile(rf"^(?:\[Rank ({_INT})\]\s*+)?time \(ms\)\s*+\|(.*)$")


def parse_legacy_timers(text: str, line: int | None = None) -> list[TimerRecord]:
    """Pre-2022-08 one-line timers (§4.2): ``time (ms) | forward-compute: 58.16 | ...`` (one rank's
    value, ms per iteration), and DeepSpeed's ``[Rank 0] time (ms) | fwd: ... | step: ...``."""
    m = _LEGACY_TIMERS.match(text)
    if m is None:
        return []
    pairs, partial = _fields(m.group(2))
    rank = int(m.group(1)) if m.group(1) else None
    values = _numbers(pairs)
    partial = partial or len(values) < len(pairs)
    return [
        TimerRecord(name=k, value_s=v / _MS_IN_S, kind="single", rank=rank, line=line,
                    partial=partial and i == len(values) - 1)
        for i, (k, v) in enumerate(values)
    ]


_MINMAX = re.compile(rf"^\s*+(\S.*?) \.*+: \(\s*+({NUM}),\s*+({NUM})\)\s*+$")
_MAXBODY = re.compile(rf"^\s*+(\S.*?) \.*+: ({NUM})\s*+$")


def parse_timer_body(text: str, line: int | None = None, kind: str = "minmax") -> (
    TimerRecord | None
):
    """Body line of a ``(min, max) time across ranks (ms):`` / ``max time ...`` block (§4.2):
    4 spaces + ``(name + ' ').ljust(48, '.')`` + ``: ({min:.2f}, {max:.2f})`` or ``: {max:.2f}``."""
    m = (_MINMAX if kind == "minmax" else _MAXBODY).match(text)
    if m is None:
        return None
    hi = float(m.groups()[-1]) / _MS_IN_S
    lo = float(m.group(2)) / _MS_IN_S if kind == "minmax" else None
    return TimerRecord(name=sys.intern(m.group(1)), value_s=hi, min_s=lo, max_s=hi, kind=kind, line=line)


_VALID = re.compile(rf"^(validation(?:-\d+)? loss at (?:iteration ({_INT})|the end of training for "
                    r"\w+ data))\s*\|(.*)$")


def parse_validation(text: str, line: int | None = None) -> rec.ValidationRecord | None:
    """``validation loss at iteration 1000 | lm loss value: X | lm loss PPL: Y |`` (§1.3)."""
    m = _VALID.match(text)
    if m is None:
        return None
    pairs, partial = _fields(m.group(3))
    values = _numbers(pairs)
    return rec.ValidationRecord(
        label=m.group(1), iteration=int(m.group(2)) if m.group(2) else None,
        values=tuple(values), line=line, partial=partial or len(values) < len(pairs),
    )  # fmt: skip


_STEP = re.compile(rf"Step Time\s*+:\s*+({NUM})\s*+s\s++GPU utilization:\s*+({NUM})\s*+(?:MODEL_)?TFLOP")


def parse_bridge_step(text: str, line: int | None = None) -> rec.StepReport | None:
    """Megatron-Bridge rank-0 ``Step Time : 3.90s GPU utilization: 209.5MODEL_TFLOP/s/GPU`` (§6)."""
    m = _STEP.search(text)
    if m is None:
        return None
    return rec.StepReport(step_time_s=float(m.group(1)), tflops_per_gpu=float(m.group(2)),
                          line=line)


_Parser = Callable[[str, "int | None"], "Record | list[TimerRecord] | list[Record] | None"]
PARSERS: tuple[_Parser, ...] = (
    parse_memory, parse_legacy_timers, parse_timer_body, parse_validation, with_primus(parse_iteration),
    parse_nemo1, parse_deepspeed_memory, parse_theoretical, parse_bridge_step,
)  # fmt: skip
"""Tried in this order on each segment; the first that returns something wins."""


def parse_segment(text: str, line: int | None = None) -> list[Record]:
    """Records in one cleaned segment (``[]`` when no format matches)."""
    for parser in PARSERS:
        found = parser(text, line)
        if found:
            return list(found) if isinstance(found, list) else [found]
    return []


def clean(text: str) -> str:
    """Remove ANSI escapes and launcher/logging prefixes (§9.1), and surrounding whitespace."""
    return _PREFIX.sub("", _ANSI.sub("", text)).strip()


def segments(physical_line: str) -> list[str]:
    """Cleaned pieces of a physical line: split on ``\\r`` (tqdm redraws) and glued records."""
    pieces = (clean(p) for sub in physical_line.split("\r") for p in _GLUE.split(clean(sub)))
    return [p for p in pieces if p]


def parse_line(physical_line: str, line: int | None = None) -> list[Record]:
    """All records of a physical line, stateless (``max``/``all`` timer bodies need parse_text)."""
    return [r for piece in segments(physical_line) for r in parse_segment(piece, line)]
