"""Rich rendering of estimates and plans (human units: GiB, ms, TFLOP/s). Only the CLI prints."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Console
from rich.table import Table

from paraplan.estimator import Estimate
from paraplan.units import GIB, format_count, format_seconds


def console() -> Console:
    """A console that respects NO_COLOR and narrow terminals."""
    return Console(highlight=False)


def render_estimate(est: Estimate) -> None:
    """Per-stage memory table, time breakdown and throughput."""
    con = console()
    lay = est.layout
    con.print(f"[bold]{est.model.name}[/] on {est.cluster.num_gpus} x {est.cluster.gpu.name} "
              f"({est.cluster.gpus_per_node}/node, NVLink domain {est.cluster.nvlink_domain_size}) | "
              f"seq {est.training.seq_len}, GBS {est.training.global_batch_size}, {est.training.precision}")
    con.print(f"layout: {lay.short()} | micro-batches {est.num_microbatches} | "
              f"params {format_count(est.params.total)} (active {format_count(est.params.active_per_token)})")
    table = Table(title="memory per GPU by pipeline stage (GiB)")
    for col in ("stage", "params", "weights", "grads", "optim", "activ", "other", "total", "in flight"):
        table.add_column(col, justify="right", no_wrap=True)
    usable = est.usable_bytes
    for i, st in enumerate(est.stages):
        m = st.memory
        total = float(m.total_bytes)
        style = "red" if total > usable else ("yellow" if total > 0.9 * usable else "")
        mark = " *" if i == est.peak_stage else ""
        table.add_row(f"{i}{mark}", format_count(float(st.params.total)),
                      *(f"{float(v) / GIB:.1f}" for v in (m.weights_bytes, m.grads_bytes, m.optimizer_bytes,
                                                          m.activations_bytes, m.other_bytes)),
                      f"[{style}]{total / GIB:.1f}[/]" if style else f"{total / GIB:.1f}",
                      f"{float(st.in_flight):.0f}")
    con.print(table)
    verdict = "[green]fits[/]" if est.fits else "[red]does NOT fit[/]"
    con.print(f"peak {est.peak_bytes / GIB:.1f} GiB (stage {est.peak_stage}) of "
              f"{est.usable_bytes / GIB:.1f} GiB usable ({est.cluster.gpu.hbm_bytes / GIB:.1f} GiB HBM): {verdict}")
    t = est.time
    tt = Table(title="step time")
    tt.add_column("term")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    terms = [("compute", t.compute_s), ("recompute", t.recompute_s), ("bubble", t.bubble_s)]
    terms += [(f"exposed {k.upper()} comm", v) for k, v in t.exposed_comm_s.items()]
    terms += [("optimizer", t.optimizer_s), ("overhead", t.overhead_s)]
    for name, value in terms:
        tt.add_row(name, format_seconds(float(value)), f"{100 * float(value) / float(t.step_s):.1f}%")
    tt.add_row("[bold]step[/]", f"[bold]{format_seconds(float(t.step_s))}[/]", "100%")
    con.print(tt)
    th = est.throughput
    con.print(f"throughput: {float(th.tokens_per_s_per_gpu):,.0f} tokens/s/GPU | "
              f"{float(th.model_tflops_per_gpu):.1f} model TFLOP/s/GPU | MFU {100 * float(th.mfu):.1f}% | "
              f"HFU {100 * float(th.hfu):.1f}% (vs dense {th.mfu_peak} peak)")
    for note in est.notes:
        con.print(f"[yellow]note:[/] {note}")


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """A list of flat dicts as CSV text (header from the first row)."""
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def estimate_csv(est: Estimate) -> str:
    """One row per pipeline stage: the layout, the memory terms and the step-level time/throughput."""
    d = est.to_dict()
    cfg = {k: v for k, v in d["config"].items() if not isinstance(v, list)}
    step = {"step_s": d["time"]["step_s"], "tokens_per_s_per_gpu": d["throughput"]["tokens_per_s_per_gpu"],
            "mfu": d["throughput"]["mfu"], "fits": d["memory"]["fits"]}
    rows = [{**cfg, **{k: v for k, v in s.items()}, "params_per_rank": d["params"]["per_stage_per_rank"][i], **step}
            for i, s in enumerate(d["memory"]["per_stage"])]
    return rows_csv(rows)
