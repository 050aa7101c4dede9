"""``paraplan ingest LOG...``: read Megatron-LM training logs / TensorBoard event files and report
step time, throughput, memory per rank and timers (``paraplan.ingest``)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.api import MAX_LINE_BYTES, RunLog, read_logs
from paraplan.cli._app import app
from paraplan.cli.render import safe
from paraplan.units import GIB, MIB, MS

_MAX_RANK_ROWS = 16


class IngestFormat(StrEnum):
    """Output formats of ``paraplan ingest``."""

    table = "table"
    json = "json"


def _digits(text: str) -> bool:
    """``text`` is an ASCII decimal number (``str.isdigit`` alone is true for '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _finite(obj: Any) -> Any:
    """Replace NaN/inf anywhere in a JSON-ready object by ``None`` (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def json_chunks(value: Any, indent: str = "") -> Iterator[str]:
    """The text of ``json.dumps(value, indent=1, allow_nan=False)`` (NaN/inf as null) in pieces: an iterator in
    ``value`` is written as a list one item at a time, each item whole (``RunLog.json_sections``: the document of a
    large log is never in memory at once, about 3 KB per record)."""
    if isinstance(value, dict) and any(isinstance(v, Iterator | dict) for v in value.values()):
        for i, (key, item) in enumerate(value.items()):
            yield ("{\n" if i == 0 else ",\n") + f"{indent} {json.dumps(key)}: "
            yield from json_chunks(item, indent + " ")
        yield f"\n{indent}}}"
    elif isinstance(value, Iterator):
        empty = True
        for item in value:
            yield ("[\n" if empty else ",\n") + indent + " " + _json_text(item, indent + " ")
            empty = False
        yield "[]" if empty else f"\n{indent}]"
    else:
        yield _json_text(value, indent)


def _json_text(value: Any, indent: str) -> str:
    return json.dumps(_finite(value), indent=1, allow_nan=False).replace("\n", "\n" + indent)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds / MS
    return f"{ms:,.1f} ms" if abs(ms) >= 10 else f"{ms:.2f} ms"


def _gib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / GIB:.2f} GiB"


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} TFLOP/s/GPU"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _summary_table(log: RunLog, s: dict[str, Any]) -> Table:
    table = Table(title="run summary (warm-up excluded)", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("iteration records", f"{s['iteration_records']} ({s['warmup_records_skipped']} "
                  f"warm-up skipped, {s['segments']} segment(s))")
    table.add_row("step time median / p90",
                  f"{_ms(s['step_time_s']['median'])} / {_ms(s['step_time_s']['p90'])}")
    tf = s["tflops_per_gpu"]
    table.add_row("throughput median / p90", f"{_tflops(tf['median'])} / {_tflops(tf['p90'])}")
    rank = s["max_allocated_rank"]
    table.add_row("peak allocated (max over ranks)",
                  _gib(s["max_allocated_bytes"]) + (f" (rank {rank})" if rank is not None else ""))
    table.add_row("peak reserved", _gib(s["max_reserved_bytes"]))
    if s["max_device_used_bytes"] is not None:
        table.add_row("peak device memory used", _gib(s["max_device_used_bytes"]))
    if log.theoretical is not None:
        table.add_row("theoretical weight+optimizer / total",
                      f"{_gib(s['theoretical_weight_and_optimizer_bytes'])} / "
                      f"{_gib(s['theoretical_total_bytes'])}")
    table.add_row("skipped / NaN iterations",
                  f"{_count(s['skipped_iterations'])} / {_count(s['nan_iterations'])}")
    if s["loss_missing_iterations"]:  # Megatron drops a NaN loss from the line (reference §1.1)
        first = next((r.iteration for r in log.iterations if not r.losses), None)
        table.add_row("records without a loss (a NaN loss is dropped)",
                      f"{s['loss_missing_iterations']}" + (f" (first: iteration {first})" if first is not None else ""))
    table.add_row("lines read / unparsed / partial",
                  f"{s['lines']} / {s['unparsed_lines']} / {s['partial_lines']}")
    if s["long_lines_skipped"]:
        table.add_row(f"over-long lines skipped (> {MAX_LINE_BYTES // MIB} MiB)", str(s["long_lines_skipped"]))
    return table


def _memory_table(log: RunLog) -> Table | None:
    """Per rank: the largest values reported (all reports of that rank)."""
    peaks: dict[str, list[float | None]] = {}
    for m in log.memory:
        key = "?" if m.rank is None else str(m.rank)
        row = peaks.setdefault(key, [None] * 4)
        values = (m.allocated_bytes, m.max_allocated_bytes, m.reserved_bytes, m.max_reserved_bytes)
        for i, v in enumerate(values):
            if v is not None and (row[i] is None or v > (row[i] or 0.0)):
                row[i] = v
    if not peaks:
        return None
    table = Table(title=f"memory per rank ({len(peaks)} rank(s), largest report)")
    for col in ("rank", "allocated", "max allocated", "reserved", "max reserved"):
        table.add_column(col, justify="right")
    ordered = sorted(peaks.items(), key=lambda kv: (not _digits(kv[0]), int(kv[0])
                                                    if _digits(kv[0]) else 0))
    for key, row in ordered[:_MAX_RANK_ROWS]:
        table.add_row(key, *(_gib(v) for v in row))
    if len(ordered) > _MAX_RANK_ROWS:
        table.add_row(f"... {len(ordered) - _MAX_RANK_ROWS} more", "", "", "", "")
    return table


def _theoretical_table(log: RunLog) -> Table | None:
    """Megatron's own estimate (rank 0, most loaded shard): every line of the block that was read."""
    t = log.theoretical
    if t is None:
        return None
    table = Table(title="Megatron theoretical memory (most loaded shard)", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    params = (("transformer block", t.transformer_params), ("transformer block, active", t.active_transformer_params),
              ("MTP block", t.mtp_params), ("embedding layers", t.embedding_params),
              ("total", t.total_params), ("total, active", t.total_active_params),
              ("most loaded shard", t.most_loaded_shard_params), ("other shards", t.other_shards_params),
              *((name, int(v)) for name, v in t.extra))
    for name, count in params:
        if count is not None:
            table.add_row(f"parameters: {name}", f"{count / 10**9:g} B")  # as printed: billions
    if t.activation_per_layer_bytes is not None:
        table.add_row(f"activation per layer ({t.activation_formula or '?'})",
                      f"{t.activation_per_layer_bytes / MIB:,.1f} MiB")
    if t.interleaved_penalty is not None:
        table.add_row("interleaved-schedule penalty", f"{t.interleaved_penalty:.2f}")
    if t.in_flight_microbatches is not None:
        table.add_row("in-flight microbatches", str(t.in_flight_microbatches))
    for name, value in t.components:
        table.add_row(name, _gib(value))
    if t.unsupported is not None:
        table.add_row("not supported", t.unsupported)
    return table


def _timer_table(s: dict[str, Any]) -> Table | None:
    timers: dict[str, dict[str, float | None]] = s["timers_s"]
    setup: dict[str, float] = s["setup_timers_s"]
    if not timers and not setup:
        return None
    table = Table(title="timers per iteration (max over ranks where known)")
    for col in ("timer", "median", "p90"):
        table.add_column(col, justify="right" if col != "timer" else "left")
    for name, stats in timers.items():
        table.add_row(name, _ms(stats["median"]), _ms(stats["p90"]))
    for name, value in setup.items():
        table.add_row(f"{name} (once)", _ms(value), "")
    return table


def render_runlog(log: RunLog, skip_warmup: int) -> None:
    """Rich tables: summary, memory per rank, timers."""
    con = Console(highlight=False)
    con.print(f"[bold]{safe(', '.join(log.sources))}[/]")
    summary = log.summary(skip_warmup)
    con.print(_summary_table(log, summary))
    for table in (_memory_table(log), _theoretical_table(log), _timer_table(summary)):
        if table is not None:
            con.print(table)


_LOGS = typer.Argument(..., show_default=False,
                       help="Megatron-LM text logs, or TensorBoard event files / directories.")
_FORMAT = typer.Option(IngestFormat.table, "--format", "-f", help="Output format.")
_SKIP = typer.Option(1, "--skip-warmup", min=0,
                     help="Iteration records to drop at the start of each log/restart (warm-up).")


@app.command("ingest")
def ingest(logs: list[str] = _LOGS, fmt: IngestFormat = _FORMAT, skip_warmup: int = _SKIP) -> None:
    r"""Read Megatron-LM training output: step time, TFLOP/s/GPU, memory per rank, timers.

    Text logs of Megatron-LM (2020-2026), Megatron-Bridge, Megatron-DeepSpeed and NeMo.

    TensorBoard event files (or their directory) need: pip install paraplan\[tensorboard].

    Example: paraplan ingest train.log --format json
    """
    log = read_logs(list(logs))
    if fmt == IngestFormat.json:
        sys.stdout.writelines(json_chunks(dict(log.json_sections(skip_warmup))))
        sys.stdout.write("\n")
        return
    render_runlog(log, skip_warmup)
