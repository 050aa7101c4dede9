"""``paraplan models`` and ``paraplan gpus``: the built-in presets."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from paraplan.cli._app import app
from paraplan.cli.options import FormatOpt, OutputFormat
from paraplan.cli.render import rows_csv
from paraplan.estimate.params import model_param_counts
from paraplan.serialize import dumps_json
from paraplan.specs.load import gpu_preset_names, load_gpu, load_model_preset, model_preset_names
from paraplan.units import GIB, TB, TFLOP, format_count


@app.command("models")
def models(fmt: OutputFormat = FormatOpt) -> None:
    """List the built-in model presets with their sizes and sources.

    Example: paraplan models --format json
    """
    rows: list[dict[str, Any]] = []
    for name in model_preset_names():
        m = load_model_preset(name)
        counts = model_param_counts(m, max_positions=m.max_position_embeddings or 4096)
        rows.append({"name": name, "layers": m.num_layers, "hidden": m.hidden_size,
                     "heads": m.num_attention_heads, "kv_heads": m.query_groups,
                     "experts": m.num_experts, "topk": m.moe_router_topk if m.is_moe else None,
                     "params": counts.total, "active_params": counts.active_per_token,
                     "source": m.source})
    if fmt == OutputFormat.json:
        print(dumps_json(rows))
        return
    if fmt == OutputFormat.csv:
        print(rows_csv(rows), end="")
        return
    table = Table(title="paraplan model presets")
    for col in ("name", "layers", "hidden", "heads", "kv", "experts", "params", "active", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["name"], str(r["layers"]), str(r["hidden"]), str(r["heads"]), str(r["kv_heads"]),
                      f"{r['experts']}x top{r['topk']}" if r["experts"] else "-",
                      format_count(r["params"]), format_count(r["active_params"]), str(r["source"])[:60])
    Console().print(table)


@app.command("gpus")
def gpus(fmt: OutputFormat = FormatOpt) -> None:
    """List the built-in GPU presets (dense peaks, memory, NVLink and network per GPU).

    Example: paraplan gpus
    """
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
    if fmt == OutputFormat.json:
        print(dumps_json(rows))
        return
    if fmt == OutputFormat.csv:
        print(rows_csv(rows), end="")
        return
    table = Table(title="paraplan GPU presets (dense peaks, per-direction bandwidth)")
    for col in ("name", "HBM GiB", "HBM TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "NVLink GB/s", "net GB/s",
                "per node", "NVLink domain"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], f"{r['hbm_gib']:.1f}", f"{r['hbm_tbyte_per_s']:.2f}", f"{r['bf16_tflops']:.0f}",
                      "-" if r["fp8_tflops"] is None else f"{r['fp8_tflops']:.0f}",
                      f"{r['nvlink_gbyte_per_s']:.0f}", f"{r['network_gbyte_per_s']:.0f}",
                      str(r["gpus_per_node"]), str(r["nvlink_domain_size"]))
    Console().print(table)



