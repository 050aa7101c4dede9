"""Rich rendering of estimates and plans (human units: GiB, ms, TFLOP/s). Only the CLI prints."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from paraplan.estimator import Estimate
from paraplan.units import GIB, format_bytes_binary, format_count, format_seconds


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
    table = Table(title="memory per GPU by pipeline stage")
    for col in ("stage", "params/GPU", "weights", "grads", "optimizer", "activations", "other", "total", "in flight"):
        table.add_column(col, justify="right")
    for i, st in enumerate(est.stages):
        m = st.memory
        mark = " *" if i == est.peak_stage else ""
        table.add_row(f"{i}{mark}", format_count(float(st.params.total)),
                      format_bytes_binary(float(m.weights_bytes)), format_bytes_binary(float(m.grads_bytes)),
                      format_bytes_binary(float(m.optimizer_bytes)),
                      format_bytes_binary(float(m.activations_bytes)),
                      format_bytes_binary(float(m.other_bytes)), format_bytes_binary(float(m.total_bytes)),
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
