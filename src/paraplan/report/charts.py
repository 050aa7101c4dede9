"""ReportContext -> plotly figures. Drawing only: every number comes from ``paraplan.report.build``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from paraplan.report.build import MEMORY_TERMS, TIME_TERMS, ReportContext, ScheduleView
from paraplan.schedules import schedule_label, schedule_named

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D", "#BAB0AC",
           "#EECA3B")
MEMORY_COLOURS = dict(zip(MEMORY_TERMS, ("#4C78A8", "#72B7B2", "#54A24B", "#F58518", "#BAB0AC"), strict=True))
TIME_COLOURS = dict(zip(TIME_TERMS, ("#4C78A8", "#9ECAE9", "#F58518", "#FFBF79", "#B279A2", "#E45756", "#72B7B2",
                                     "#BAB0AC", "#54A24B", "#79706E"), strict=True))
FORWARD_RANGE = ("#9CC3E6", "#1F4E79")
BACKWARD_RANGE = ("#FDC086", "#A0440C")
WGRAD_RANGE = ("#B8E0B0", "#2E6B30")
MAX_LABELLED_BLOCKS = 400
LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1.0, "xanchor": "right"}
FONT = "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"


@dataclass(frozen=True, slots=True)
class Chart:
    """One figure of the report, with its element id and caption."""

    id: str
    title: str
    caption: str
    figure: Any

    @property
    def height(self) -> int:
        """Height of the figure in pixels (the page reserves it before plotly draws)."""
        return int(self.figure.layout.height or 450)


def _layout(fig: Any, *, title: str, height: int, **kw: Any) -> Any:
    """Common look: title on the first row, legend on the second, then the plot."""
    base: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": 1.0, "yanchor": "top", "yref": "container",
                  "pad": {"t": 10}, "font": {"size": 15}},
        "template": "plotly_white", "height": height, "margin": {"l": 70, "r": 30, "t": 90, "b": 55},
        "font": {"family": FONT, "size": 12},
        "legend": dict(LEGEND)}
    base.update(kw)
    fig.update_layout(**base)
    return fig


def _star_labels(ctx: ReportContext, tolerance: float = 0.03) -> list[str]:
    """``#k`` labels of the top layouts; stars closer than ``tolerance`` of the axis spans share one label."""
    land, top = ctx.landscape, ctx.top
    xs = [*land.peak_gib, *(t.peak_gib for t in top)]
    ys = [*land.tokens_per_s_per_gpu, *(t.tokens_per_s_per_gpu for t in top)]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    heads: list[int] = []
    labels = ["" for _ in top]
    for i, t in enumerate(top):
        near = next((h for h in heads if abs(top[h].peak_gib - t.peak_gib) <= tolerance * dx
                     and abs(top[h].tokens_per_s_per_gpu - t.tokens_per_s_per_gpu) <= tolerance * dy), None)
        if near is None:
            heads.append(i)
            labels[i] = f"#{t.rank}"
        else:
            labels[near] += f" #{t.rank}"
    return labels


def landscape_figure(ctx: ReportContext) -> Any:
    """Tokens/s/GPU vs peak memory of every feasible layout, coloured by PP (or TP), top K starred."""
    land = ctx.landscape
    fig = go.Figure()
    hover = ("%{customdata[0]}<br>peak %{x:.1f} GiB<br>%{y:,.0f} tokens/s/GPU<br>step %{customdata[1]:.3f} s"
             "<extra>%{fullData.name}</extra>")
    groups = {"PP": land.pp, "TP": land.tp}
    visibility: dict[str, list[bool]] = {}
    for axis, column in groups.items():
        for j, value in enumerate(sorted(set(column))):
            idx = [i for i, v in enumerate(column) if v == value]
            fig.add_trace(go.Scatter(
                x=[land.peak_gib[i] for i in idx], y=[land.tokens_per_s_per_gpu[i] for i in idx], mode="markers",
                name=f"{axis} {value}", visible=axis == "PP", legendgroup=axis,
                marker={"size": 6, "opacity": 0.7, "color": PALETTE[j % len(PALETTE)]},
                customdata=[[land.labels[i], land.step_s[i]] for i in idx], hovertemplate=hover))
            for key in groups:
                visibility.setdefault(key, []).append(axis == key)
    top = ctx.top
    fig.add_trace(go.Scatter(
        x=[t.peak_gib for t in top], y=[t.tokens_per_s_per_gpu for t in top], mode="markers+text",
        name=f"top {len(top)}", textposition="top center", text=_star_labels(ctx),
        marker={"symbol": "star", "size": 15, "color": "#E45756", "line": {"width": 1, "color": "#000"}},
        customdata=[[t.label, t.step_s] for t in top], hovertemplate=hover))
    for key in groups:
        visibility[key].append(True)
    fig.add_vline(x=land.usable_gib, line={"dash": "dash", "color": "#E45756", "width": 1},
                  annotation_text=f"usable {land.usable_gib:.1f} GiB", annotation_position="bottom left")
    buttons = [{"label": f"colour by {key}", "method": "restyle", "args": [{"visible": vis}]}
               for key, vis in visibility.items()]
    return _layout(fig, title=f"candidate landscape: {len(land.labels):,} of {land.total:,} feasible layouts",
                   height=520, xaxis_title="peak memory per GPU (GiB)", yaxis_title="tokens/s/GPU",
                   legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1.0, "yanchor": "top"},
                   margin={"l": 70, "r": 30, "t": 90, "b": 55},
                   updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0.0, "y": 1.02,
                                 "xanchor": "left", "yanchor": "bottom", "showactive": True}])


def rejections_figure(ctx: ReportContext) -> Any:
    """Counts of layouts by outcome: fits, or the first rule it broke."""
    names = ["fits", *(r[0] for r in ctx.rejections)]
    counts = [ctx.num_feasible, *(r[1] for r in ctx.rejections)]
    examples = ["feasible layouts", *(r[2] or r[0] for r in ctx.rejections)]
    fig = go.Figure(go.Bar(
        x=counts, y=names, orientation="h", text=[f"{c:,}" for c in counts], textposition="auto",
        marker={"color": ["#54A24B", *(["#E45756"] * len(ctx.rejections))]}, customdata=examples,
        hovertemplate="%{y}: %{x:,} layouts<br>%{customdata}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", automargin=True)
    return _layout(fig, title=f"{ctx.num_evaluated:,} layouts evaluated: fits or first reason rejected",
                   height=120 + 28 * len(names), xaxis_title="layouts", showlegend=False)


def memory_figure(ctx: ReportContext) -> Any:
    """Memory per pipeline stage (stacked terms) of the top layouts against the GPU's capacity."""
    fig = go.Figure()
    xs = [[f"#{t.rank}" for t in ctx.top for _ in t.memory], [f"s{r.stage}" for t in ctx.top for r in t.memory]]
    labels = [[t.label, r.total_gib] for t in ctx.top for r in t.memory]
    for term in MEMORY_TERMS:
        fig.add_trace(go.Bar(
            x=xs, y=[r.gib[term] for t in ctx.top for r in t.memory], name=term,
            marker={"color": MEMORY_COLOURS[term]}, customdata=labels,
            hovertemplate=f"%{{customdata[0]}}, stage %{{x}}<br>{term} %{{y:.2f}} GiB"
                          "<br>total %{customdata[1]:.2f} GiB<extra></extra>"))
    if ctx.top:
        t0 = ctx.top[0]
        fig.add_hline(y=t0.usable_gib, line={"dash": "dash", "color": "#E45756", "width": 1.5},
                      annotation_text=f"usable {t0.usable_gib:.1f} GiB", annotation_position="bottom left")
        fig.add_hline(y=t0.capacity_gib, line={"dash": "dot", "color": "#555", "width": 1},
                      annotation_text=f"HBM {t0.capacity_gib:.1f} GiB", annotation_position="top right")
    return _layout(fig, title="memory per GPU by pipeline stage (top layouts)", height=460, barmode="stack",
                   yaxis_title="GiB", bargap=0.15, legend={**LEGEND, "traceorder": "normal"})


def time_figure(ctx: ReportContext) -> Any:
    """Step-time breakdown of the top layouts (stacked horizontal bars)."""
    fig = go.Figure()
    ys = [t.label for t in ctx.top]
    for term in TIME_TERMS:
        values = [dict(t.time_s)[term] for t in ctx.top]
        if not any(v > 0 for v in values):
            continue
        shares = [100 * v / t.step_s if t.step_s else 0.0 for v, t in zip(values, ctx.top, strict=True)]
        fig.add_trace(go.Bar(x=values, y=ys, orientation="h", name=term, marker={"color": TIME_COLOURS[term]},
                             customdata=shares, hovertemplate=f"%{{y}}<br>{term} %{{x:.3f}} s "
                                                              "(%{customdata:.1f}%)<extra></extra>"))
    fig.update_yaxes(autorange="reversed", automargin=True)
    return _layout(fig, title="step-time breakdown (exposed communication per axis)", height=140 + 44 * len(ys),
                   barmode="stack", xaxis_title="seconds per step", legend={**LEGEND, "traceorder": "normal"})


def _shades(light: str, dark: str, n: int) -> list[str]:
    """n colours from ``light`` to ``dark`` (one per model chunk; a single chunk gets the middle)."""
    a = [int(light[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(dark[i:i + 2], 16) for i in (1, 3, 5)]
    fracs = [0.6] if n == 1 else [i / (n - 1) for i in range(n)]
    return ["#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True)) for f in fracs]


def _window(view: ScheduleView) -> float:
    """Length of the warm-up / cool-down views: the staircase plus a few steady micro-batches."""
    return min(view.makespan, 3.0 * (view.pp - 1) / view.vp + 4.0)


def schedule_figure(view: ScheduleView) -> Any:
    """Pipeline timeline: one row per stage, forward and backward blocks per micro-batch."""
    fig = go.Figure()
    label = len(view.blocks) <= MAX_LABELLED_BLOCKS
    thin = len(view.blocks) > 4 * MAX_LABELLED_BLOCKS
    passes = [(("F",), FORWARD_RANGE, "forward"), (("B", "I"), BACKWARD_RANGE, "backward")]
    if any(b.kind == "W" for b in view.blocks):  # zero-bubble schedules split the weight gradient off
        passes.append((("W",), WGRAD_RANGE, "weight gradient"))
    for kinds, (light, dark), word in passes:
        shades = _shades(light, dark, view.vp)
        blocks = [b for b in view.blocks if b.kind in kinds]
        fig.add_trace(go.Bar(
            x=[round(b.end - b.start, 5) for b in blocks], base=[round(b.start, 5) for b in blocks],
            y=[b.stage for b in blocks], orientation="h", name=word, width=0.8,
            marker={"color": [shades[b.chunk] for b in blocks],
                    "line": {"width": 0 if thin else 0.5, "color": "#fff"}},
            text=[str(b.microbatch) for b in blocks] if label else None, textposition="inside",
            insidetextanchor="middle", textfont={"size": 9}, customdata=[[b.microbatch, b.chunk] for b in blocks],
            hovertemplate=f"stage %{{y}}: {word} of micro-batch %{{customdata[0]}}, chunk %{{customdata[1]}}<br>"
                          "start %{base:.2f}, length %{x:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(view.pp)),
                     ticktext=[f"stage {r}" for r in range(view.pp)], title_text="pipeline rank")
    kind = schedule_label(view.schedule, view.vp)
    title = (f"{kind}, PP {view.pp}, {view.num_microbatches} micro-batches: bubble "
             f"{100 * view.estimated_bubble_frac:.1f}% of compute")
    window = _window(view)
    long_step = view.makespan > 2.5 * window
    views = (("whole step", [0.0, view.makespan]), ("warm-up", [0.0, window]),
             ("cool-down", [view.makespan - window, view.makespan]))
    menus = [{"type": "buttons", "direction": "right", "x": 0.0, "y": 1.02, "xanchor": "left", "yanchor": "bottom",
              "active": 1, "buttons": [{"label": lab, "method": "relayout", "args": [{"xaxis.range": rng}]}
                                       for lab, rng in views]}] if long_step else []
    return _layout(fig, title=title, height=170 + 30 * view.pp, barmode="overlay", updatemenus=menus,
                   xaxis={"title": {"text": "time in micro-batch units (1 unit = forward + backward of one "
                                            f"micro-batch on the slowest stage = {1e3 * view.unit_s:.1f} ms)"},
                          "range": views[1][1] if long_step else views[0][1]})


def schedule_caption(view: ScheduleView) -> str:
    """What the schedule figure shows, in words and numbers."""
    whose = ("Megatron's order" if schedule_named(view.schedule).megatron else
             f"The order of {schedule_label(view.schedule, view.vp)}")
    text = (f"{whose} of forward (blue) and backward (orange) passes on each pipeline rank"
            + ("; weight-gradient passes (green) are split off" if any(b.kind == "W" for b in view.blocks) else "")
            + "; white gaps are the bubble." + (" Darker shades are later model chunks." if view.vp > 1 else "")
            + (" Numbers are micro-batches." if len(view.blocks) <= MAX_LABELLED_BLOCKS else " Zoom in to see blocks.")
            + (" The step is long, so the view starts on the warm-up; the buttons show the whole step or the "
               "cool-down." if view.makespan > 2.5 * _window(view) else ""))
    if view.drawn_microbatches != view.num_microbatches:
        text += (f" Drawn with {view.drawn_microbatches} of the {view.num_microbatches} micro-batches (idle "
                 f"{100 * view.bubble_frac:.1f}% as drawn).")
    else:
        text += f" Idle time of the busiest stage: {100 * view.bubble_frac:.1f}% of its busy time."
    if not view.in_top:
        text += " No top layout uses a pipeline; this is the best layout that does."
    return text


MEASURED_PANELS = (("step_time_s", "step time (s)"), ("tokens_per_s_per_gpu", "tokens/s/GPU"), ("mfu", "MFU (%)"))
"""Predicted vs measured panels: (``Measured.metric`` key, subplot title), then memory per stage."""


def measured_figure(ctx: ReportContext) -> Any:
    """Predicted vs measured: step time, tokens/s/GPU, MFU, and memory per stage when the log has it."""
    cmp = ctx.measured
    assert cmp is not None
    memory = cmp.has_stage_memory
    titles = [t for _, t in MEASURED_PANELS] + (["memory per stage (GiB)"] if memory else [])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles,
                        column_widths=[0.16, 0.16, 0.16, 0.52] if memory else None)
    for col, (key, _) in enumerate(MEASURED_PANELS, start=1):
        mt = cmp.metric(key)
        fig.add_trace(go.Bar(x=["predicted"], y=[mt.predicted], marker={"color": "#4C78A8"}, name="predicted",
                             legendgroup="p", showlegend=col == 1, hovertemplate="predicted %{y:.4g}<extra></extra>"),
                      row=1, col=col)
        err = None if mt.measured is None or mt.measured_p90 is None else {
            "type": "data", "symmetric": False, "array": [max(mt.measured_p90 - mt.measured, 0.0)],
            "arrayminus": [0.0]}
        fig.add_trace(go.Bar(x=["measured"], y=[mt.measured], error_y=err, marker={"color": "#F58518"},
                             name="measured (median, p90 of the step time)", legendgroup="m", showlegend=col == 1,
                             hovertemplate="measured median %{y:.4g}<extra></extra>"), row=1, col=col)
    if memory:
        col = len(titles)
        stages = [f"s{s.stage}" for s in cmp.stages]
        fig.add_trace(go.Bar(x=stages, y=[s.predicted_gib for s in cmp.stages], marker={"color": "#4C78A8"},
                             name="predicted", legendgroup="p", showlegend=False,
                             hovertemplate="stage %{x}: predicted %{y:.2f} GiB<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Bar(x=stages, y=[s.measured_gib for s in cmp.stages], marker={"color": "#F58518"},
                             name="measured", legendgroup="m", showlegend=False,
                             customdata=[", ".join(map(str, s.ranks)) or "-" for s in cmp.stages],
                             hovertemplate="stage %{x}: max allocated %{y:.2f} GiB (ranks %{customdata})"
                                           "<extra></extra>"), row=1, col=col)
        if ctx.top:
            fig.add_hline(y=ctx.top[0].usable_gib, line={"dash": "dash", "color": "#E45756", "width": 1},
                          annotation_text="usable", annotation_position="bottom right", row=1, col=col)
    fig.update_annotations(yshift=4)
    runs = f"{cmp.iterations} " + ("warm-up iterations only" if cmp.warmup_only else "iterations after warm-up")
    return _layout(fig, title=f"predicted ({cmp.layout_label}) vs measured ({runs})", height=440, barmode="group",
                   margin={"l": 70, "r": 30, "t": 110, "b": 40},
                   legend={"orientation": "h", "yanchor": "bottom", "y": 1.09, "x": 1.0, "xanchor": "right"})


def measured_caption(ctx: ReportContext) -> str:
    """What the predicted-vs-measured figure shows."""
    cmp = ctx.measured
    assert cmp is not None
    text = ("The prediction for the layout the run used against the run logs (median, error bar to the p90 of the "
            "step time).")
    if cmp.has_stage_memory:
        return text + " Memory is the max allocated over each pipeline stage's ranks (rank // (TP x CP x DP))."
    return text + " The logs have no per-rank memory report, so memory per stage is not drawn."


def charts(ctx: ReportContext) -> list[Chart]:
    """Every figure of the report, in page order."""
    out = [
        Chart("chart-landscape", "Candidate landscape",
              "Every feasible layout; the buttons switch the colouring between PP and TP; stars are the top "
              "layouts. Hover a point for its layout.", landscape_figure(ctx)),
        Chart("chart-rejections", "Why layouts were rejected",
              "Each layout is counted once, under the first rule it breaks (hover for an example).",
              rejections_figure(ctx)),
        Chart("chart-memory", "Memory per pipeline stage",
              "Per-GPU memory of every pipeline stage of the top layouts against the usable capacity.",
              memory_figure(ctx)),
        Chart("chart-time", "Step-time breakdown",
              "Where a step goes: compute, recompute, exposed communication per axis, pipeline bubble, optimizer.",
              time_figure(ctx)),
    ]
    for i, view in enumerate(ctx.schedules):
        out.append(Chart(f"chart-schedule-{i}", f"Pipeline schedule: {view.layout_label}", schedule_caption(view),
                         schedule_figure(view)))
    if ctx.measured is not None:
        out.append(Chart("chart-measured", "Predicted vs measured", measured_caption(ctx), measured_figure(ctx)))
    return out
