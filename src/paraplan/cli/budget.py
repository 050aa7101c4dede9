"""``paraplan budget``: how many GPUs of which kind, how long and how much to train on T tokens."""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.api import (
    BudgetResult,
    BudgetRow,
    GpuSpec,
    SearchSpace,
    budget,
    dumps_json,
    format_decimal_bytes,
    gpu_preset_names,
    load_gpu,
    load_model,
    load_site,
    parse_prices,
    parse_token_count,
)
from paraplan.cli._app import app
from paraplan.cli.options import MODEL_HELP, ForceOpt, HeadroomOpt, PrecisionChoice, PrecisionOpt, positive
from paraplan.cli.render import console, safe
from paraplan.errors import SpecError
from paraplan.units import format_count

DEFAULT_GPUS = "h100-80gb,h200-141gb,b200"


class BudgetFormat(StrEnum):
    """Output formats of budget."""

    table = "table"
    json = "json"
    csv = "csv"


def load_gpus(text: str) -> list[GpuSpec]:
    """Comma-separated GPU presets (or YAML files), duplicates dropped, order kept."""
    refs = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not refs:
        raise SpecError(f"--gpu: expected comma-separated GPU presets (e.g. {DEFAULT_GPUS}), got '{text}'")
    return [load_gpu(r) for r in refs]


def parse_gpus_per_node(text: str | None, gpu_names: list[str]) -> dict[str, int]:
    """'4' (every GPU) or 'h100-80gb=4,b200=8' -> {gpu: GPUs per node}."""
    if not text or not text.strip():
        return {}
    out: dict[str, int] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, raw = item.rpartition("=")
        if name and name not in gpu_names:
            raise SpecError(f"--gpus-per-node: '{name}' is not one of the GPUs swept ({', '.join(gpu_names)})")
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise SpecError(f"--gpus-per-node: expected a positive integer or GPU=N, got '{item}'")
        out.update({name: value} if name else dict.fromkeys(gpu_names, value))
    return out


def _money(usd: float | None) -> str:
    return "-" if usd is None else f"${format_count(usd)}"


SHORT_FLAGS = {"LOW_EFFICIENCY": "eff<70%", "MICROBATCHES_LT_PP": "m<PP", "SMALL_BATCH_PER_DP": "m=1",
               "GBS_RAISED": "GBS+", "HOST_RAM": "RAM", "CKPT_SLOW": "ckpt>5%", "NO_PROGRESS": "fail"}
LEGEND = ("eff<70% per-GPU throughput below 70% of the best at fewer GPUs (scaling stops paying); m<PP fewer "
          "micro-batches than pipeline stages; m=1 one micro-batch per DP rank (DP cannot grow at this GBS); "
          "GBS+ GBS raised above the base (convergence trade-off); RAM async-save staging exceeds host RAM "
          "(synchronous save); ckpt>5% saves block more than 5% of training (storage too slow); fail failures "
          "outpace progress")
SHORT_REASONS = {"OOM": "does not fit in memory", "GBS_NOT_DIVISIBLE": "GBS too small to split over DP"}


COLUMNS = ("GPU", "GPUs", "layout", "GBS", "tok/s/GPU", "MFU", "eff.", "days", "goodput", "eff. days", "ckpt",
           "save", "every", "GPU-h", "cost", "met", "notes")


def _cells(r: BudgetRow) -> list[str]:
    if not r.feasible:
        why = SHORT_REASONS.get(r.reason_code or "", r.reason or "")
        return [safe(r.gpu), f"{r.num_gpus:,}", f"[red]{r.reason_code}[/]", str(r.gbs)] + ["-"] * 12 + [safe(why)]
    assert r.tokens_per_s_per_gpu is not None and r.mfu is not None and r.days is not None
    assert r.gpu_hours is not None and r.efficiency is not None
    deadline = {None: "-", True: "[green]yes[/]", False: "[red]no[/]"}[r.meets_deadline]
    eff = f"{r.efficiency:.0%}" if r.scaling_pays else f"[yellow]{r.efficiency:.0%}[/]"
    notes = " ".join(SHORT_FLAGS.get(c, c) for c, _ in r.flags)
    assert r.goodput is not None and r.checkpoint_bytes is not None and r.checkpoint_save_s is not None
    return [safe(r.gpu), f"{r.num_gpus:,}", r.layout or "", str(r.gbs), f"{r.tokens_per_s_per_gpu:,.0f}",
            f"{r.mfu:.0%}", eff, _days(r.days), f"{r.goodput:.0%}", _days(r.effective_days),
            format_decimal_bytes(r.checkpoint_bytes), _secs(r.checkpoint_save_s), f"{r.save_interval_iters:,}",
            format_count(r.gpu_hours), _money(r.cost_usd), deadline, notes]


def _secs(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _days(days: float | None) -> str:
    if days is None:
        return "-"
    return f"{days:,.0f}" if days >= 100 else f"{days:.1f}"


def _columns(res: BudgetResult, width: int) -> list[str]:
    """Columns that carry information (and fit: narrow terminals lose GPU-hours or cost, and efficiency)."""
    priced = any(r.cost_usd is not None for r in res.rows)
    drop = {"GBS"} if res.max_gbs is None else set()
    drop |= {"met"} if res.deadline_days is None else set()
    drop |= set() if priced else {"cost"}
    if width < 110:
        drop |= {"eff.", "tok/s/GPU", "GBS", "GPU-h" if priced else ""}
    if width < 150:
        drop |= {"ckpt", "save", "every"}  # the recommendation lines give them
    return [c for c in COLUMNS if c not in drop]


def _pick_line(r: dict[str, object] | None) -> str:
    if r is None:
        return "none"
    eff = "-" if r["effective_days"] is None else f"{r['effective_days']:,.1f}"
    ck: dict[str, Any] = r["checkpoint"]  # type: ignore[assignment]
    save = "async save" if ck["async_save"] else "save"
    return (f"{r['num_gpus']:,} x {safe(r['gpu'])} ({r['layout']}, GBS {r['gbs']}): "
            f"{r['days']:,.1f} days at step time, "
            f"goodput {r['goodput']:.1%} -> {eff} days, {format_count(float(r['gpu_hours']))} GPU-hours, "  # type: ignore[arg-type]
            f"cost {_money(r['cost_usd'])}; checkpoint {format_decimal_bytes(float(r['checkpoint_bytes']))} "  # type: ignore[arg-type]
            f"({ck['ckpt_format']}), {save} {float(r['checkpoint_save_s']):,.1f} s every "  # type: ignore[arg-type]
            f"{r['save_interval_iters']:,} iterations, {ck['failures_per_day']:.1f} failures/day, "
            f"host RAM {format_decimal_bytes(float(r['host_ram_bytes_per_node']))}/node for async save")  # type: ignore[arg-type]


def render_budget(res: BudgetResult, con: Console | None = None) -> None:
    """Rows grouped by GPU type, then the recommendation and notes."""
    con = con or console()
    deadline = f", deadline {res.deadline_days:g} days" if res.deadline_days is not None else ""
    con.print(f"[bold]{safe(res.model)}[/] | {format_count(res.tokens)} tokens, seq {res.seq_len}, GBS {res.gbs}"
              + (f"..{res.max_gbs}" if res.max_gbs else "") + f"{deadline} | {res.layouts_evaluated:,} layouts")
    table = Table(title="time and cost to train (best layout per GPU count)", show_edge=con.width >= 110)
    cols = _columns(res, con.width)
    for col in cols:
        wrap = col in ("layout", "notes")
        table.add_column(col, justify="left" if col in ("GPU", "layout", "notes") else "right", no_wrap=not wrap,
                         min_width={"layout": 12, "notes": 6}.get(col))
    prev = None
    for r in res.rows:
        if prev is not None and r.gpu != prev:
            table.add_section()
        prev = r.gpu
        cells = dict(zip(COLUMNS, _cells(r), strict=True))
        table.add_row(*(cells[c] for c in cols))
    con.print(table)
    if any(r.flags for r in res.rows):
        con.print(f"[dim]{LEGEND}[/]")
    rec = res.recommendation
    con.print(f"[bold]recommendation[/] per GPU ({rec['per_gpu_rule']}):")
    for name, pick in rec["per_gpu"].items():
        con.print(f"  {safe(name)}: {_pick_line(pick)}")
    con.print(f"[bold]overall ({rec['basis']})[/]: {_pick_line(rec['overall'])}"
              + (f" [yellow]({rec['note']})[/]" if rec["note"] else ""))
    for note in res.notes:
        con.print(f"[yellow]note:[/] {safe(note)}")


CSV_COLUMNS = ("gpu", "num_gpus", "num_nodes", "gbs", "feasible", "layout", "tp", "pp", "vp", "cp", "ep", "dp",
               "mbs", "recompute", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "days", "gpu_hours",
               "cost_usd", "meets_deadline", "efficiency", "scaling_pays", "closed_form_days", "goodput",
               "effective_days", "checkpoint_bytes", "checkpoint_save_s", "save_interval_iters",
               "host_ram_bytes_per_node", "flags", "reason")


def to_csv(res: BudgetResult) -> str:
    """One line per row; layout axes flattened, flags as codes joined by '|'."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in res.rows:
        d = r.to_dict()
        cfg = d["config"] or {}
        d.update({k: cfg.get(k) for k in ("tp", "pp", "vp", "cp", "ep", "dp", "mbs", "recompute")})
        d["flags"] = "|".join(f["code"] for f in d["flags"])
        w.writerow(["" if d[c] is None else (f"{d[c]:.6g}" if isinstance(d[c], float) else d[c])
                    for c in CSV_COLUMNS])
    return buf.getvalue()


def budget_figure(res: BudgetResult) -> Any:
    """Plotly figure: effective days to train next to the ideal (step-time days), and cost (GPU-hours without
    prices) vs GPU count, one line per GPU type."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    priced = any(r.cost_usd is not None for r in res.rows)
    right = "cost (USD)" if priced else "GPU-hours"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("effective days to train (dotted: step time only)", right))
    for i, name in enumerate(dict.fromkeys(r.gpu for r in res.rows)):
        rows = [r for r in res.rows if r.gpu == name and r.feasible]
        x = [r.num_gpus for r in rows]
        text = [f"{r.layout}, GBS {r.gbs}, MFU {r.mfu or 0:.1%}" for r in rows]
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        style = {"legendgroup": name, "mode": "lines+markers", "text": text, "line": {"color": color}}
        fig.add_scatter(x=x, y=[r.effective_days for r in rows], name=name, row=1, col=1, **style)
        fig.add_scatter(x=x, y=[r.days for r in rows], name=f"{name} ideal (no failures, no saves)", row=1, col=1,
                        legendgroup=name, mode="lines", line={"color": color, "dash": "dot"})
        fig.add_scatter(x=x, y=[r.cost_usd if priced else r.gpu_hours for r in rows], name=name, showlegend=False,
                        row=1, col=2, **style)
    if res.deadline_days is not None:
        fig.add_hline(y=res.deadline_days, line_dash="dash", annotation_text="deadline", row=1, col=1)
    fig.update_xaxes(type="log", title_text="GPUs")
    fig.update_yaxes(type="log")
    fig.update_layout(title=f"{res.model}: {format_count(res.tokens)} tokens, seq {res.seq_len}")
    return fig


BUDGET_DIV_ID = "paraplan-budget"
"""The plot's element id: fixed, so the same inputs give the same bytes (plotly's default is a random uuid)."""


def budget_html(res: BudgetResult) -> str:
    """The --html page: self-contained (plotly.js embedded, opens offline, like `paraplan report`), same bytes
    for the same inputs."""
    html: str = budget_figure(res).to_html(include_plotlyjs=True, full_html=True, div_id=BUDGET_DIV_ID)
    return html


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None] | None]:
    """A transient rich progress bar on stderr (only on a terminal)."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("sweeping GPU counts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("sweep", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command("budget")
def budget_cmd(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    tokens: str = typer.Option(..., "--tokens", "-t", help="Tokens to train on: 15T, 300B, 2.5e12."),
    days: float | None = typer.Option(None, "--days", "-d", help="Deadline in days (smallest count meeting it)."),
    gpus: int | None = typer.Option(None, "--gpus", "--num-gpus", "-n", help="Only this GPU count (no sweep)."),
    gpu: str = typer.Option(DEFAULT_GPUS, "--gpu", "-g", help="GPU presets to compare, comma-separated."),
    price: str | None = typer.Option(None, "--price-per-gpu-hour",
                                     help="USD per GPU-hour: GPU=USD,... or one number for all."),
    seq_len: int = typer.Option(4096, "--seq-len", "-s", help="Sequence length (tokens)."),
    gbs: int | None = typer.Option(None, "--gbs", help="Global batch size in sequences (default: ~4M tokens)."),
    max_gbs: int | None = typer.Option(None, "--max-gbs", help="Let GBS grow with DP (x2 steps) up to this "
                                       "(convergence trade-off)."),
    gpus_per_node: str | None = typer.Option(None, "--gpus-per-node", help="GPUs per node: N or GPU=N,..."),
    max_gpus: int = typer.Option(65_536, "--max-gpus", help="Largest count swept."),
    precision: PrecisionChoice = PrecisionOpt,
    allow_cross_node: bool = typer.Option(True, "--allow-cross-node/--nvlink-only",
                                          help="CP and EP groups may span NVLink domains (large MoE runs do)."),
    fmt: BudgetFormat = typer.Option(BudgetFormat.table, "--format", "-f", help="Output format."),
    html: str | None = typer.Option(None, "--html", help="Also write the time/cost plot (plotly HTML) here."),
    site: str | None = typer.Option(None, "--site", help="Site profile YAML: storage_gbps, storage_gbps_per_node, "
                                    "host_memory_gb_per_node, failure_rate_per_gpu_hour, requeue_s, ..."),
    force: bool = ForceOpt,
    headroom: str | None = HeadroomOpt,
) -> None:
    """Sweep GPU counts per GPU type (best layout each): time to train, GPU-hours, cost, MFU; recommend.

    Example: paraplan budget --model llama3-70b --tokens 15T --days 60 --gpu h100-80gb,b200
    --price-per-gpu-hour h100-80gb=2.5,b200=4.5
    """
    from paraplan.api import parse_headroom

    margin = parse_headroom(headroom)
    n_tokens = parse_token_count(tokens, "--tokens")
    for name, value in (("gpus", gpus), ("seq-len", seq_len), ("gbs", gbs), ("max-gbs", max_gbs),
                        ("max-gpus", max_gpus)):
        positive(name, value)
    if days is not None and not days > 0:
        raise SpecError(f"--days must be > 0, got {days}")
    if max_gbs is not None and gbs is not None and max_gbs < gbs:
        raise SpecError(f"--max-gbs ({max_gbs}) must be >= --gbs ({gbs})")
    site_profile = load_site(site)
    model_spec = load_model(model)
    if html is not None:
        from paraplan.api import check_output_file

        check_output_file(html, "--html", force=force)
    gpu_specs = load_gpus(gpu)
    names = [g.name for g in gpu_specs]
    prices = parse_prices(price, names, "--price-per-gpu-hour", known=gpu_preset_names())
    per_node = parse_gpus_per_node(gpus_per_node, names)
    with _progress() as progress:
        res = budget(model_spec, gpu_specs, tokens=n_tokens, seq_len=seq_len, gbs=gbs, max_gbs=max_gbs, days=days,
                     num_gpus=gpus, prices=prices, gpus_per_node=per_node, precision=precision.value,
                     max_gpus=max_gpus, progress=progress,
                     space=SearchSpace(allow_cross_node=allow_cross_node), storage=site_profile.storage(),
                     failures=site_profile.failures(), headroom=margin)
    if html:
        from paraplan.api import write_text_atomic

        write_text_atomic(html, budget_html(res), option="--html", force=force)
    if fmt == BudgetFormat.json:
        print(dumps_json(res.to_dict()))
    elif fmt == BudgetFormat.csv:
        sys.stdout.write(to_csv(res))
    else:
        render_budget(res)
        unpriced = [n for n in names if n not in prices]
        if prices and unpriced:
            console().print(f"note: no --price-per-gpu-hour for {', '.join(unpriced)}: no cost shown for it",
                            soft_wrap=True)
        if html:
            console().print(f"wrote {html}")
