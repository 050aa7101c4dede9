"""Rich rendering of estimates and plans (human units: GiB, ms, TFLOP/s). Only the CLI prints."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING, Any, cast

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paraplan.cli._app import plain
from paraplan.errors import PlannerError, SpecError
from paraplan.units import GIB, format_count, format_seconds

if TYPE_CHECKING:
    from paraplan.errors import NoFeasiblePlanError
    from paraplan.estimator import Estimate
    from paraplan.search import FitTip
    from paraplan.specs.training import TrainingSpec


def fit_tip_flags(tip: FitTip) -> str:
    """A search's fit advice (``paraplan.search.FitTip``) worded with the CLI's flags."""
    if tip.knob == "search_space":
        return "relax the search flags (--tp/--pp/--cp/--mbs/--max-pp) or change GBS"
    if tip.knob == "num_gpus":
        return f"--num-gpus {tip.value:.0f} ({tip.count_text()})"
    if tip.knob == "no_gpu_count":
        return tip.count_text("--num-gpus")
    if tip.knob == "headroom":
        return (f"a smaller margin (--headroom; the smallest layout fits only inside the "
                f"{(tip.value or 0.0) / GIB:.1f} GiB margin, --headroom 0 accepts it at the memory model's own risk)")
    if tip.knob == "recompute":
        return "allow full recompute (--recompute none,selective,full)"
    if tip.knob == "pipeline":
        return "allow more pipeline stages (--max-pp/--pp)"
    if tip.knob == "mbs":
        return f"micro-batch {tip.value:.0f} (--mbs {tip.value:.0f})"
    if tip.knob == "knob_rule":
        from paraplan.api import KNOB_FLAGS

        # plan's knobs come from --knob, its precision from --precision: the flag named is the one that set it
        change = tip.change_text(lambda k: "--precision" if k == "precision" else f"--knob {KNOB_FLAGS[k][2:]}")
        whose = "rules'" if tip.rule_knobs else "rule's"
        return f"{tip.rules_text()}: change {change}, or what the {whose} words ask for"
    return tip.describe()  # a GPU with more memory: no flag to name


FIELD_FLAGS = {"tp": "--tp", "pp": "--pp", "cp": "--cp", "ep": "--ep", "etp": "--etp", "vp": "--vp", "mbs": "--mbs",
               "max_pp": "--max-pp", "recompute_modules": "--recompute-modules", "schedule": "--schedule",
               "num_gpus": "--num-gpus", "global_batch_size": "--gbs", "space": "the search flags"}
"""The CLI's words for the input fields a library message names (``SpecError.naming``): its flags."""


def error_line(err: PlannerError) -> str:
    """A library error's message for the terminal: the fields it names worded as the CLI's flags."""
    return err.worded(FIELD_FLAGS) if isinstance(err, SpecError) else str(err)


def no_fit_line(err: NoFeasiblePlanError) -> str:
    """The one line ``paraplan`` prints when no layout fits: the search's summary and its advice in flags."""
    if not err.advice:
        return str(err)
    from paraplan.api import advice_text

    return f"{err.summary}; {advice_text(cast('tuple[FitTip, ...]', err.advice), fit_tip_flags)}"


def console() -> Console:
    """A console that respects NO_COLOR and narrow terminals."""
    return Console(highlight=False)


def safe(text: object) -> str:
    """``text`` for a rich markup string: markup escaped (``[link=...]`` prints as written) and control
    characters as visible escapes (no ESC byte from a name reaches the terminal)."""
    return escape(plain(text))


def fit_table(title: str, columns: list[tuple[str, str]], rows: list[list[str]], width: int,
              drop_order: tuple[str, ...] = ()) -> Table:
    """A table whose cells never wrap and that fits ``width``: below 100 columns it loses its side borders and
    uses one space between columns, then drops the columns named in ``drop_order`` (first the least needed)
    until it fits. ``columns`` are (header, justify); cells are rich markup."""
    from rich.text import Text

    def cell_width(text: str) -> int:
        return max(Text.from_markup(line).cell_len for line in text.split("\n"))

    compact = width < 100
    keep = list(range(len(columns)))
    widths = [max(cell_width(columns[i][0]), *(cell_width(r[i]) for r in rows)) for i in keep]

    def total(idx: list[int]) -> int:
        return sum(widths[i] for i in idx) + (2 * (len(idx) - 1) if compact else 3 * len(idx) + 1)

    for name in drop_order:
        if total(keep) <= width:
            break
        keep = [i for i in keep if columns[i][0] != name]
    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, show_edge=not compact,
                  pad_edge=not compact, padding=(0, 1, 0, 0) if compact else (0, 1))
    # still too wide with every droppable column gone: text (left-justified) columns wrap, numbers keep
    # their full width (rich would otherwise cut every column to '…')
    squeeze = total(keep) > width
    for i in keep:
        text_column = squeeze and columns[i][1] == "left"
        table.add_column(columns[i][0], justify=columns[i][1], no_wrap=not text_column,  # type: ignore[arg-type]
                         overflow="fold" if text_column else "ellipsis",
                         min_width=None if text_column else widths[i])
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    return table


def _is_named_cfg(value: str) -> bool:
    """A ``tp_comm_overlap_cfg`` that is one of Megatron-Bridge's named configs, not a YAML file's path."""
    from paraplan.api import ub_configs

    return value in ub_configs()


def knob_words(training: TrainingSpec, time_only: bool | None = None) -> str:
    """The knobs away from Megatron's defaults, as the Megatron flags that set them, written as Megatron
    takes them: a list as its words (``--cuda-graph-modules attn moe_router``), a store-false flag bare
    (``--no-gradient-accumulation-fusion``). ``time_only`` True: only the knobs that move time only
    (``specs.training.TIME_ONLY_KNOBS``); False: only those that move memory; None: all."""
    from paraplan.api import KNOB_FLAGS, TIME_ONLY_KNOBS, memory_knobs_of

    words = []
    for key, value in memory_knobs_of(training).items():
        if time_only is not None and (key in TIME_ONLY_KNOBS) != time_only:
            continue
        flag = KNOB_FLAGS.get(key)
        if flag is None:  # a TransformerConfig / Bridge field without a Megatron-LM flag (fp8_dot_product_attention)
            words.append(f"{key}={value} (no Megatron-LM flag)")
        elif key == "tp_comm_overlap_cfg" and _is_named_cfg(str(value)):
            words.append(f"tp_comm_overlap_cfg={value} (a Megatron-Bridge config; Megatron-LM takes a YAML file)")
        elif value is True or (value is False and flag.startswith("--no-")):
            words.append(flag)
        elif isinstance(value, (tuple, list)):
            words.append(" ".join([flag, *(str(v) for v in value)]))
        else:
            words.append(f"{flag} {value}")
    return " ".join(words)


def render_estimate(est: Estimate) -> None:
    """Per-stage memory table, time breakdown and throughput."""
    con = console()
    lay = est.layout
    con.print(f"[bold]{safe(est.model.name)}[/] on {est.cluster.num_gpus} x {safe(est.cluster.gpu.name)} "
              f"({est.cluster.gpus_per_node}/node, NVLink domain {est.cluster.nvlink_domain_size}) | "
              f"seq {est.training.seq_len}, GBS {est.training.global_batch_size}, {est.training.precision}")
    for head, time_only in (("memory knobs", False), ("time-only knobs", True)):
        if knobs := knob_words(est.training, time_only):
            con.print(f"{head}: {safe(knobs)}")
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
    colour = "green" if est.fits_with_margin else ("yellow" if est.fits else "red")
    verdict = f"[{colour}]{'fits' if est.fits else 'does NOT fit'}[/]"
    con.print(f"peak {est.peak_bytes / GIB:.1f} GiB (stage {est.peak_stage}) of "
              f"{est.usable_bytes / GIB:.1f} GiB usable ({est.cluster.gpu.hbm_bytes / GIB:.1f} GiB HBM): {verdict}")
    con.print(f"[{colour}]{'warning: ' if not est.fits_with_margin else ''}{safe(est.fit_text)}[/]")
    lo, hi = est.peak_bytes_range
    con.print(f"peak memory range {lo / GIB:.1f} - {hi / GIB:.1f} GiB (measured error band "
              f"{safe(est.memory_band.describe())})")
    t = est.time
    tt = Table(title="step time")
    tt.add_column("term")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    terms = [("compute", t.compute_s)]
    if float(t.host_bound_s) > 0:  # inside compute: the GPU waits for the host after an MoE dispatcher sync
        terms.append(("  of which host-bound (MoE)", t.host_bound_s))
    terms += [("recompute", t.recompute_s), ("bubble", t.bubble_s)]
    terms += [(f"exposed {k.upper()} comm", v) for k, v in t.exposed_comm_s.items()]
    terms += [("optimizer", t.optimizer_s), ("overhead", t.overhead_s)]
    for name, value in terms:
        tt.add_row(name, format_seconds(float(value)), f"{100 * float(value) / float(t.step_s):.1f}%")
    tt.add_row("[bold]step[/]", f"[bold]{format_seconds(float(t.step_s))}[/]", "100%")
    s_lo, s_hi = est.step_s_range
    tt.add_row("step range", f"{format_seconds(s_lo)} - {format_seconds(s_hi)}", "")
    con.print(tt)
    th = est.throughput
    con.print(f"throughput: {float(th.tokens_per_s_per_gpu):,.0f} tokens/s/GPU | "
              f"{float(th.model_tflops_per_gpu):.1f} model TFLOP/s/GPU | MFU {100 * float(th.mfu):.1f}% | "
              f"HFU {100 * float(th.hfu):.1f}% (vs dense {th.mfu_peak} peak)")
    k_lo, k_hi = est.tokens_per_s_per_gpu_range
    con.print(f"throughput range {k_lo:,.0f} - {k_hi:,.0f} tokens/s/GPU (cross-validated step-time band "
              f"{safe(est.step_band.describe())})")
    for note in est.notes:
        con.print(f"[yellow]note:[/] {safe(note)}")


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
    cfg = {k: json.dumps(v, sort_keys=True, allow_nan=False) if isinstance(v, dict) else v  # JSON text, no repr
           for k, v in d["config"].items() if not isinstance(v, list)}
    step = {"step_s": d["time"]["step_s"], "tokens_per_s_per_gpu": d["throughput"]["tokens_per_s_per_gpu"],
            "mfu": d["throughput"]["mfu"], "fits": d["memory"]["fits"]}
    rows = [{**cfg, **{k: v for k, v in s.items() if k != "other_parts"},
             **{f"other_parts.{k}": v for k, v in s["other_parts"].items()},  # flat cells, no dict repr
             "params_per_rank": d["params"]["per_stage_per_rank"][i], **step}
            for i, s in enumerate(d["memory"]["per_stage"])]
    return rows_csv(rows)
