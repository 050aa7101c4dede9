"""``paraplan models`` and ``paraplan gpus``: the built-in presets.

Both start fast: the spec loaders (and numpy, for the parameter counts) are imported inside the commands,
so this module costs only typer and rich (``benchmarks/startup.py``)."""

from __future__ import annotations

import json
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


@app.command("models")
def models(fmt: ListFormat = _FORMAT) -> None:
    """List the built-in model presets with their sizes and sources.

    Example: paraplan models --format json
    """
    from paraplan.estimate.params import model_param_counts
    from paraplan.specs.load import load_model_preset, model_preset_names
    from paraplan.units import format_count

    rows: list[dict[str, Any]] = []
    for name in model_preset_names():
        m = load_model_preset(name)
        counts = model_param_counts(m, max_positions=m.max_position_embeddings or 4096)
        rows.append({"name": name, "layers": m.num_layers, "hidden": m.hidden_size,
                     "heads": m.num_attention_heads, "kv_heads": m.query_groups,
                     "experts": m.num_experts, "topk": m.moe_router_topk if m.is_moe else None,
                     "params": counts.total, "active_params": counts.active_per_token,
                     "source": m.source})
    if fmt == ListFormat.json:
        print(json.dumps(rows, indent=1))
        return
    if fmt == ListFormat.csv:
        print(rows_csv(rows), end="")
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
    from paraplan.specs.load import gpu_preset_names, load_gpu
    from paraplan.units import GIB, TB, TFLOP

    rows: list[dict[str, Any]] = []
    for name in gpu_preset_names():
        g = load_gpu(name)
        rows.append({"name": name, "hbm_gib": g.hbm_bytes / GIB, "hbm_tbyte_per_s": g.hbm_bytes_per_s / TB,
                     "bf16_tflops": g.peak_bf16_flops_per_s / TFLOP,
                     "fp8_tflops": None if g.peak_fp8_flops_per_s is None else g.peak_fp8_flops_per_s / TFLOP,
                     "nvlink_gbyte_per_s": g.nvlink_bytes_per_s / 1e9,
                     "network_gbyte_per_s": g.network_bytes_per_s / 1e9,
                     "gpus_per_node": g.gpus_per_node, "nvlink_domain_size": g.nvlink_domain_size,
                     "source": g.source})
    if fmt == ListFormat.json:
        print(json.dumps(rows, indent=1))
        return
    if fmt == ListFormat.csv:
        print(rows_csv(rows), end="")
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
