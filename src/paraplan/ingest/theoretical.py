"""Megatron's theoretical-memory block (reference §3): ``report_theoretical_memory`` and the
verbose lines of ``compute_weight_and_optimizer_memory`` / ``compute_activation_memory[_without_sp]``
in ``megatron/training/theoretical_memory_usage.py``, and Megatron-Bridge's component-wise summary.

HEAD block (rank 0, order varies a little by version; the summary line comes last)::

    compute_activation_memory_without_sp
    Number of parameters in transformer block in billions:  64.43
    Number of active parameters in transformer block in billions:  64.43
    Number of parameters in embedding layers in billions: 0.26
    Total number of parameters in billions: 64.69
    Number of parameters in most loaded shard in billions: 2.0794
    Activation memory footprint per transformer layer (precise, without SP): 1024.0 MB
    Number of in-flight microbatches: 8
    Theoretical memory footprints: weight and optimizer=35695.42 MB, activation=86554.12 MB, total=...

``parse_theoretical`` reads one cleaned line into a ``TheoreticalMemoryRecord`` that carries only
that line's numbers; ``RunLogBuilder`` merges the lines of a block (``TheoreticalMemoryRecord.
combine``). Billions are 10**9 parameters; MB is MiB (2**20). Pure, never raises.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from paraplan.ingest.records import TheoreticalMemoryRecord
from paraplan.units import MIB

# Linear-time patterns (possessive quantifiers; the summary split at commas), see megatron.py.
_NUM = r"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+"
_BILLION = 10**9

_PARAM_FIELDS = {
    "number of parameters in transformer block": "transformer_params",
    "number of parameters in transformer layers": "transformer_params",  # wording before 2025-04
    "number of active parameters in transformer block": "active_transformer_params",  # 2026-03+
    "number of parameters in mtp block": "mtp_params",
    "number of parameters in embedding layers": "embedding_params",
    "total number of parameters": "total_params",
    "total number of active parameters": "total_active_params",  # 2026-03+
    "number of parameters in most loaded shard": "most_loaded_shard_params",
    "number of parameters in other shards": "other_shards_params",  # PP > 1
}
"""``<label> in billions: X`` (lower case) -> field; other ``number of ...`` labels go to ``extra``."""

_BILLIONS = re.compile(rf"^((?:total )?number of [^:]+?) in billions:\s*+({_NUM})$", re.IGNORECASE)
_PER_LAYER = re.compile(
    rf"^Activation memory footprint per transformer layer(?:\s*+\(([^)]*+)\))?:\s*+({_NUM})\s*+MB$")
_PENALTY = re.compile(rf"^Memory penalty from interleaved schedule:\s*+({_NUM})$")
_IN_FLIGHT = re.compile(r"^Number of in-flight microbatches:\s*+(\d{1,12}+)$")  # int() of at most 12 digits
_MARKER = re.compile(r"^compute_activation_memory[ _](with(?:out)?)[ _]sp$", re.IGNORECASE)
_UNSUPPORTED = re.compile(r"^Theoretical memory footprints not yet supported for (.+?)\.?$")
_SUMMARY = re.compile(r"Theoretical memory footprints:\s*+(.*)$")
_NAME = re.compile(r"(?<![\w ./()-])[ ./()-]*+(\w[\w ./()-]*+)\s*+\Z")
_MB = re.compile(rf"=\s*+({_NUM})\s*+MB")


def summary_pairs(text: str) -> tuple[list[tuple[str, float]], bool]:
    """``name=X MB`` pairs of the summary (after ``footprints:``), X in MiB, as ``re.findall`` of
    ``(\\w[\\w ./()-]*?)\\s*=\\s*(X)\\s*MB`` would find them, but in linear time: each ``=`` is tried once, its name
    read back to the start of the run of name characters before it; flag: text other than pairs, spaces and commas."""
    pairs: list[tuple[str, float]] = []
    pos = done = 0  # where to look for the next '=', where the last pair ended
    partial = False
    while (eq := text.find("=", pos)) >= 0:
        name = _NAME.search(text[pos:eq])  # a slice: a name may start right where the last pair ended
        value = _MB.match(text, eq) if name else None
        if name is None or value is None:
            pos = eq + 1
            continue
        partial = partial or bool(text[done : pos + name.start(1)].strip(" ,"))
        pairs.append((name.group(1).rstrip(), float(value.group(1)) * MIB))
        pos = done = value.end()
    return pairs, partial or bool(text[done:].strip(" ,"))


def billions_to_count(text: str) -> int | None:
    """``"64.43"`` (billions, as printed) -> ``64_430_000_000``; exact decimal arithmetic."""
    try:
        value = Decimal(text) * _BILLION
    except InvalidOperation:
        return None
    return int(value) if value.is_finite() else None


def parse_summary(text: str, line: int | None = None) -> TheoreticalMemoryRecord | None:
    """``Theoretical memory footprints: weight and optimizer=X MB[, activation=Y MB, total=Z MB]``
    (full form; weight-only form 2024-04..2025-08 and in Bridge without SP+selective) and Bridge's
    ``format_training_memory_estimate`` ``<component>=X MB, ..., total=X MB``. MB = MiB."""
    m = _SUMMARY.search(text)
    comps, partial = summary_pairs(m.group(1)) if m else ([], False)
    if not comps:
        return None
    d = dict(comps)
    return TheoreticalMemoryRecord(
        weight_and_optimizer_bytes=d.get("weight and optimizer"), total_bytes=d.get("total"),
        activation_bytes=d.get("activation"), components=tuple(comps), raw=text, line=line, partial=partial,
    )  # fmt: skip


def _verbose_fields(text: str) -> dict[str, Any] | None:
    """Field values of one verbose line of the block, ``None`` if it is not one."""
    if m := _BILLIONS.match(text):
        label, count = " ".join(m.group(1).lower().split()), billions_to_count(m.group(2))
        if count is None:
            return None
        if label in _PARAM_FIELDS:
            return {_PARAM_FIELDS[label]: count}
        return {"extra": ((m.group(1), float(count)),)}
    if m := _PER_LAYER.match(text):
        formula = "without_sp" if "without" in (m.group(1) or "").lower() else "with_sp"
        return {"activation_per_layer_bytes": float(m.group(2)) * MIB, "activation_formula": formula}
    if m := _PENALTY.match(text):
        return {"interleaved_penalty": float(m.group(1))}
    if m := _IN_FLIGHT.match(text):
        return {"in_flight_microbatches": int(m.group(1))}
    if m := _MARKER.match(text):
        return {"activation_formula": f"{m.group(1).lower()}_sp"}
    if m := _UNSUPPORTED.match(text):
        return {"unsupported": m.group(1)}
    return None


def parse_theoretical(text: str, line: int | None = None) -> TheoreticalMemoryRecord | None:
    """Any line of the theoretical-memory block (§3), cleaned of launcher prefixes: the summary
    line, a verbose line (parameter counts, per-layer activation, interleave penalty, in-flight
    microbatches, ``compute_activation_memory...`` marker) or the hybrid-Mamba ``not yet
    supported`` line. The record holds only that line's numbers (merge with ``combine``)."""
    if (summary := parse_summary(text, line)) is not None:
        return summary
    values = _verbose_fields(text.strip())
    if values is None:
        return None
    return TheoreticalMemoryRecord(raw=text, line=line, **values)
