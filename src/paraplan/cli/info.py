"""``paraplan models`` and ``paraplan gpus``: the built-in presets.

Both start fast: they print the rows of the packaged preset index (``paraplan.specs.presets.index``, read
with json), so neither imports pydantic, numpy or yaml, and ``paraplan.cli.main`` runs them without building
typer's command for the plain invocations (``FAST_COMMANDS``; ``benchmarks/startup.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from paraplan.cli._app import app
from paraplan.cli.render import rows_csv, safe


class ListFormat(StrEnum):
    """Output formats of models and gpus."""

    table = "table"
    json = "json"
    csv = "csv"


_FORMAT = typer.Option(ListFormat.table, "--format", "-f", help="Output format.")
_SOURCE_MIN_WIDTH = 24
"""Fewest columns the source column gets; a narrower terminal leaves it out (``--format json`` has it)."""


def preset_table(title: str, columns: list[tuple[str, bool]], rows: list[list[str]], width: int,
                 optional_last: bool = False) -> Table:
    """A table of presets that fits ``width``: numbers and names never wrap, narrow terminals get a table
    without side borders, and an optional last (free-text) column is dropped when it would get fewer than
    _SOURCE_MIN_WIDTH columns."""
    compact = width < 100
    widths = [max(len(h) if not h.count("\n") else max(map(len, h.split("\n"))), *(len(r[i]) for r in rows))
              for i, (h, _) in enumerate(columns)]
    keep = len(columns)
    if optional_last:
        fixed = sum(widths[:-1]) + (3 * (len(columns) - 1) - 1 if compact else 3 * len(columns) + 1)
        if width - fixed < _SOURCE_MIN_WIDTH:
            keep -= 1
    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, show_edge=not compact,
                  pad_edge=not compact)
    for header, numeric in columns[:keep]:
        wrap = optional_last and header == columns[-1][0]
        table.add_column(header, justify="right" if numeric else "left", no_wrap=not wrap)
    for r in rows:
        table.add_row(*r[:keep])
    return table


def printed_as_data(rows: list[dict[str, Any]], fmt: ListFormat) -> bool:
    """Print ``rows`` as JSON or CSV when ``fmt`` asks for it (True); False for the table."""
    if fmt == ListFormat.json:
        print(json.dumps(rows, indent=1, allow_nan=False))
    elif fmt == ListFormat.csv:
        print(rows_csv(rows), end="")
    return fmt != ListFormat.table


@app.command("models")
def models(fmt: ListFormat = _FORMAT) -> None:
    """List the built-in model presets with their sizes and sources.

    Example: paraplan models --format json
    """
    from paraplan.api import preset_rows
    from paraplan.units import format_count

    rows = preset_rows("models")
    if printed_as_data(rows, fmt):
        return
    con = Console(highlight=False)
    cells = [[safe(r["name"]), str(r["layers"]), str(r["hidden"]), str(r["heads"]), str(r["kv_heads"]),
              f"{r['experts']}x top{r['topk']}" if r["experts"] else "-",
              format_count(r["params"]), format_count(r["active_params"]), safe(r["source"])] for r in rows]
    columns = [("name", False), ("layers", True), ("hidden", True), ("heads", True), ("kv", True),
               ("experts", True), ("params", True), ("active", True), ("source", False)]
    table = preset_table("paraplan model presets", columns, cells, con.width, optional_last=True)
    con.print(table)
    if len(table.columns) < len(columns):
        con.print("[dim]sources: paraplan models --format json (or a wider terminal)[/]")


@app.command("gpus")
def gpus(fmt: ListFormat = _FORMAT) -> None:
    """List the built-in GPU presets (dense peaks, memory, NVLink and network per GPU).

    Example: paraplan gpus
    """
    from paraplan.api import preset_rows

    rows = preset_rows("gpus")
    if printed_as_data(rows, fmt):
        return
    con = Console(highlight=False)
    cells = [[safe(r["name"]), f"{r['hbm_gib']:.1f}", f"{r['hbm_tbyte_per_s']:.2f}", f"{r['bf16_tflops']:.0f}",
              "-" if r["fp8_tflops"] is None else f"{r['fp8_tflops']:.0f}", f"{r['nvlink_gbyte_per_s']:.0f}",
              f"{r['network_gbyte_per_s']:.0f}", str(r["gpus_per_node"]), str(r["nvlink_domain_size"])]
             for r in rows]
    columns = [("name", False), ("HBM\nGiB", True), ("HBM\nTB/s", True), ("BF16\nTFLOP/s", True),
               ("FP8\nTFLOP/s", True), ("NVLink\nGB/s", True), ("net\nGB/s", True), ("GPUs/\nnode", True),
               ("NVLink\ndomain", True)]
    con.print(preset_table("paraplan GPU presets (dense peaks, per-direction bandwidth)", columns, cells,
                           con.width))


FAST_COMMANDS: dict[str, Callable[[ListFormat], None]] = {"models": models, "gpus": gpus}
"""The commands ``paraplan.cli.main`` calls directly for ``<command> [--format table|json|csv]``."""
