"""Plan (and optionally measured runs) -> ``ReportContext``: plain numbers and labels, no plotting.

Everything the HTML shows is decided here; ``paraplan.report.charts`` only draws it. Nothing here
depends on the clock or on random ids, so the same inputs give the same context (and bytes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from paraplan import __version__
from paraplan.estimate.stages import all_stage_layers
from paraplan.estimate.step_time import stage_time
from paraplan.estimator import Estimate, estimate
from paraplan.explain import Finding, explain
from paraplan.ingest import RunLog
from paraplan.report.schedule import Block, simulate
from paraplan.search import Plan, rank_order
from paraplan.units import GIB, TFLOP

MEMORY_TERMS = ("weights", "grads", "optimizer", "activations", "other")
TIME_TERMS = ("compute", "recompute", "tp comm", "cp comm", "ep comm", "pp comm", "dp comm", "bubble",
              "optimizer", "overhead")
FORWARD_SHARE = 1.0 / 3.0
"""Share of a micro-batch's compute and exposed TP/CP/EP time spent in the forward pass (backward
is dgrad + wgrad, twice the forward GEMMs); recompute runs in the backward."""
MAX_POINTS = 5000
"""Largest number of landscape points drawn (the Pareto front is always kept)."""
MAX_BLOCKS = 20000
"""Largest number of schedule blocks drawn; beyond it the timeline is drawn with fewer micro-batches."""
MAX_SCHEDULES = 2


@dataclass(frozen=True, slots=True)
class StageMemoryRow:
    """Memory of one pipeline stage in GiB."""

    stage: int
    gib: dict[str, float]
    total_gib: float
    in_flight: float


@dataclass(frozen=True, slots=True)
class TopLayout:
    """One of the top K layouts."""

    rank: int
    label: str
    short: str
    config: dict[str, Any]
    num_microbatches: int
    peak_gib: float
    peak_stage: int
    usable_gib: float
    capacity_gib: float
    step_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    memory: tuple[StageMemoryRow, ...]
    time_s: tuple[tuple[str, float], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Landscape:
    """Feasible layouts (possibly a deterministic subset of them) as columns."""

    tokens_per_s_per_gpu: tuple[float, ...]
    peak_gib: tuple[float, ...]
    step_s: tuple[float, ...]
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    labels: tuple[str, ...]
    total: int
    usable_gib: float


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A pipeline schedule to draw; times in units of the slowest stage's micro-batch time."""

    layout_label: str
    pp: int
    vp: int
    num_microbatches: int
    drawn_microbatches: int
    unit_s: float
    blocks: tuple[Block, ...]
    makespan: float
    bubble_frac: float
    estimated_bubble_frac: float
    in_top: bool


@dataclass(frozen=True, slots=True)
class Metric:
    """Predicted vs measured value of one quantity."""

    name: str
    unit: str
    predicted: float
    measured: float | None
    measured_p90: float | None = None

    @property
    def ratio(self) -> float | None:
        """measured / predicted."""
        return None if self.measured is None or self.predicted == 0 else self.measured / self.predicted


@dataclass(frozen=True, slots=True)
class Comparison:
    """Predicted (one top layout) vs measured (run logs)."""

    sources: tuple[str, ...]
    layout_label: str
    iterations: int
    metrics: tuple[Metric, ...]
    stage_memory: tuple[tuple[int, float, float | None], ...]
    diagnosis: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReportContext:
    """Everything the report shows, as plain numbers and labels."""

    title: str
    subtitle: str
    version: str
    objective: str
    inputs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    inputs_json: str
    top: tuple[TopLayout, ...]
    landscape: Landscape
    num_evaluated: int
    num_feasible: int
    rejections: tuple[tuple[str, int, str], ...]
    findings: tuple[tuple[str, str], ...]
    schedules: tuple[ScheduleView, ...]
    measured: Comparison | None
    notes: tuple[str, ...]


def time_terms(est: Estimate) -> tuple[tuple[str, float], ...]:
    """Step-time terms in TIME_TERMS order (seconds)."""
    t = est.time
    values = {"compute": t.compute_s, "recompute": t.recompute_s, "bubble": t.bubble_s,
              "optimizer": t.optimizer_s, "overhead": t.overhead_s}
    values.update({f"{k} comm": v for k, v in t.exposed_comm_s.items()})
    return tuple((k, float(values.get(k, 0.0))) for k in TIME_TERMS)


def top_layout(rank: int, est: Estimate) -> TopLayout:
    """A TopLayout from an Estimate."""
    d = est.to_dict()
    rows = tuple(
        StageMemoryRow(stage=i, gib={k: float(getattr(s.memory, f"{k}_bytes")) / GIB for k in MEMORY_TERMS},
                       total_gib=float(s.memory.total_bytes) / GIB, in_flight=float(s.in_flight))
        for i, s in enumerate(est.stages))
    return TopLayout(
        rank=rank, label=f"#{rank} {est.layout.short()}", short=est.layout.short(), config=d["config"],
        num_microbatches=est.num_microbatches,
        peak_gib=est.peak_bytes / GIB, peak_stage=est.peak_stage, usable_gib=est.usable_bytes / GIB,
        capacity_gib=float(est.cluster.gpu.hbm_bytes) / GIB, step_s=float(est.time.step_s),
        tokens_per_s_per_gpu=float(est.throughput.tokens_per_s_per_gpu),
        model_tflops_per_gpu=float(est.throughput.model_tflops_per_gpu), mfu=float(est.throughput.mfu),
        memory=rows, time_s=time_terms(est), notes=est.notes)


def _pareto(peak: np.ndarray[Any, Any], tok: np.ndarray[Any, Any]) -> list[int]:
    """Indices not dominated (less memory and more throughput) by another point."""
    order = np.lexsort((-tok, peak))
    best, keep = -np.inf, []
    for i in order:
        if tok[i] > best:
            keep.append(int(i))
            best = float(tok[i])
    return keep


def landscape(plan: Plan, max_points: int = MAX_POINTS) -> Landscape:
    """The feasible layouts (all of them up to ``max_points``: the Pareto front plus an even sample)."""
    usable = (plan.cluster.gpu.hbm_bytes - plan.cluster.gpu.reserved_bytes) / GIB
    ev = plan.feasible
    if ev is None or len(ev.table) == 0:
        return Landscape((), (), (), (), (), (), 0, usable)
    n = len(ev.table)
    if n > max_points:
        front = _pareto(ev.peak_bytes, ev.tokens_per_s_per_gpu)
        sample = np.linspace(0, n - 1, max(max_points - len(front), 0)).round().astype(int).tolist()
        idx = sorted(set(front) | set(sample))
    else:
        idx = list(range(n))
    tab = ev.table
    return Landscape(
        tokens_per_s_per_gpu=tuple(float(ev.tokens_per_s_per_gpu[i]) for i in idx),
        peak_gib=tuple(float(ev.peak_bytes[i]) / GIB for i in idx),
        step_s=tuple(float(ev.step_s[i]) for i in idx),
        tp=tuple(int(tab.tp[i]) for i in idx), pp=tuple(int(tab.pp[i]) for i in idx),
        labels=tuple(tab.row(i).short() for i in idx), total=n, usable_gib=usable)


def stage_times(est: Estimate) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of one micro-batch on every pipeline stage."""
    fwd, bwd = [], []
    for st in all_stage_layers(est.model, est.layout):
        t = stage_time(est.model, est.cluster, est.training, est.layout, st)
        work = float(t.compute_s) + sum(float(t.exposed_s[k]) for k in ("tp", "cp", "ep"))
        fwd.append(FORWARD_SHARE * work)
        bwd.append((1.0 - FORWARD_SHARE) * work + float(t.recompute_s))
    return fwd, bwd


def drawn_microbatches(pp: int, vp: int, m: int, max_blocks: int = MAX_BLOCKS) -> int:
    """Micro-batches to draw: all of them unless the timeline would exceed ``max_blocks`` blocks."""
    if 2 * m * vp * pp <= max_blocks:
        return m
    cap = max(max_blocks // (2 * vp * pp), 1)
    return max(cap - cap % pp, pp) if vp > 1 else cap


def schedule_view(est: Estimate, label: str, *, in_top: bool, max_blocks: int = MAX_BLOCKS) -> ScheduleView:
    """Simulate the schedule of one layout from its per-stage times."""
    lay = est.layout
    fwd, bwd = stage_times(est)
    unit = max(f + b for f, b in zip(fwd, bwd, strict=True)) or 1.0
    m = est.num_microbatches
    drawn = drawn_microbatches(lay.pp, lay.vp, m, max_blocks)
    sched = simulate(pp=lay.pp, vp=lay.vp, num_microbatches=drawn, forward=[f / unit for f in fwd],
                     backward=[b / unit for b in bwd])
    return ScheduleView(layout_label=label, pp=lay.pp, vp=lay.vp, num_microbatches=m, drawn_microbatches=drawn,
                        unit_s=unit, blocks=sched.blocks, makespan=sched.makespan, bubble_frac=sched.bubble_frac,
                        estimated_bubble_frac=float(est.time.bubble_frac), in_top=in_top)


def schedules(plan: Plan, top: Sequence[Estimate], max_blocks: int = MAX_BLOCKS) -> tuple[ScheduleView, ...]:
    """Timelines of the first top layouts with distinct (PP, VP, m), or of the best PP > 1 layout."""
    views: list[ScheduleView] = []
    seen: set[tuple[int, int, int]] = set()
    for i, est in enumerate(top):
        key = (est.layout.pp, est.layout.vp, est.num_microbatches)
        if est.layout.pp > 1 and key not in seen and len(views) < MAX_SCHEDULES:
            seen.add(key)
            views.append(schedule_view(est, f"#{i + 1} {est.layout.short()}", in_top=True, max_blocks=max_blocks))
    ev = plan.feasible
    if not views and ev is not None and (ev.table.pp > 1).any():
        order = rank_order(ev, plan.objective, plan.cluster)
        j = next(int(i) for i in order if ev.table.pp[int(i)] > 1)
        est = estimate(plan.model, plan.cluster, plan.training, ev.table.row(j))
        views.append(schedule_view(est, f"best with PP > 1: {est.layout.short()}", in_top=False,
                                   max_blocks=max_blocks))
    return tuple(views)


def inputs_text(plan: Plan) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """The inputs as (section, ((label, value), ...))."""
    m, c, t = plan.model, plan.cluster, plan.training
    params = plan.candidates[0].params if plan.candidates else None
    model = [("name", m.name), ("layers", str(m.num_layers)), ("hidden size", str(m.hidden_size)),
             ("attention heads / query groups", f"{m.num_attention_heads} / {m.query_groups}"),
             ("FFN hidden size", str(m.ffn)), ("vocabulary", str(m.vocab_size))]
    if m.is_moe:
        model.append(("experts / top-k / expert FFN", f"{m.num_experts} / {m.moe_router_topk} / {m.moe_ffn}"))
    if params is not None:
        model.append(("parameters (active per token)",
                      f"{params.total / 1e9:.2f} B ({params.active_per_token / 1e9:.2f} B)"))
    g = c.gpu
    cluster = [("GPU", g.name), ("GPUs", f"{c.num_gpus} ({c.gpus_per_node} per node, {c.num_nodes} nodes)"),
               ("NVLink domain", f"{c.nvlink_domain_size} GPUs"),
               ("HBM / usable", f"{g.hbm_bytes / GIB:.1f} / {(g.hbm_bytes - g.reserved_bytes) / GIB:.1f} GiB"),
               ("dense BF16 peak", f"{g.peak_bf16_flops_per_s / TFLOP:.0f} TFLOP/s"),
               ("NVLink / network per GPU",
                f"{g.nvlink_bytes_per_s / 1e9:.0f} / {g.network_bytes_per_s / 1e9:.1f} GB/s per direction")]
    training = [("sequence length", str(t.seq_len)), ("global batch size", str(t.global_batch_size)),
                ("tokens per step", f"{t.tokens_per_step:,}"), ("precision", t.precision),
                ("objective", plan.objective)]
    return (("model", tuple(model)), ("cluster", tuple(cluster)), ("training", tuple(training)))


def _stage_of_rank(rank: int, world: int, pp: int) -> int:
    """Pipeline stage of a global rank (Megatron order tp-cp-ep-dp-pp: PP outermost)."""
    return min(rank // max(world // pp, 1), pp - 1)


def _diagnosis(metrics: Sequence[Metric], est: Estimate, log_gbs: int | None) -> list[str]:
    out = []
    for mt in metrics:
        r = mt.ratio
        if r is None:
            out.append(f"{mt.name}: not in the log")
        elif abs(r - 1.0) <= 0.10:
            out.append(f"{mt.name}: measured within {100 * abs(r - 1):.0f}% of the prediction")
        else:
            out.append(f"{mt.name}: measured is {100 * (r - 1):+.0f}% vs predicted ({mt.measured:.4g} vs "
                       f"{mt.predicted:.4g} {mt.unit})")
    step = next((x for x in metrics if x.name == "step time"), None)
    if step is not None and step.ratio is not None and step.ratio > 1.10:
        out.append("slower than predicted: calibrate the efficiencies on this cluster (paraplan calibrate / "
                   "--profile), check that communication overlap flags match the layout")
    if log_gbs is not None and log_gbs != est.training.global_batch_size:
        out.append(f"the log's global batch size {log_gbs} differs from the plan's {est.training.global_batch_size}")
    return out


def comparison(est: Estimate, label: str, log: RunLog, skip_warmup: int = 1) -> Comparison:
    """Predicted (``est``) vs measured (``log``): step time, throughput, peak memory, memory per stage."""
    s = log.summary(skip_warmup)
    step, tf = s["step_time_s"], s["tflops_per_gpu"]
    n = est.cluster.num_gpus
    tokens = est.training.tokens_per_step
    metrics = (
        Metric("step time", "s", float(est.time.step_s), step["median"], step["p90"]),
        Metric("throughput", "TFLOP/s/GPU", float(est.throughput.model_tflops_per_gpu), tf["median"], tf["p90"]),
        Metric("tokens/s/GPU", "tokens/s", float(est.throughput.tokens_per_s_per_gpu),
               None if not step["median"] else tokens / (step["median"] * n)),
        Metric("peak memory", "GiB", est.peak_bytes / GIB,
               None if s["max_allocated_bytes"] is None else s["max_allocated_bytes"] / GIB),
    )
    measured: dict[int, float] = {}
    for rec in log.memory:
        if rec.rank is not None and rec.max_allocated_bytes is not None:
            st = _stage_of_rank(rec.rank, n, est.layout.pp)
            measured[st] = max(measured.get(st, 0.0), rec.max_allocated_bytes / GIB)
    stages = tuple((i, float(sm.memory.total_bytes) / GIB, measured.get(i)) for i, sm in enumerate(est.stages))
    gbs = next((r.global_batch_size for r in log.iterations if r.global_batch_size is not None), None)
    return Comparison(sources=log.sources, layout_label=label, iterations=int(s["iterations"]), metrics=metrics,
                      stage_memory=stages, diagnosis=tuple(_diagnosis(metrics, est, gbs)))


def build_context(plan: Plan, *, findings: Sequence[Finding] | None = None, log: RunLog | None = None,
                  compare_rank: int = 1, skip_warmup: int = 1, max_points: int = MAX_POINTS,
                  max_blocks: int = MAX_BLOCKS, title: str | None = None) -> ReportContext:
    """The report context of a plan (``plan.candidates`` are the top layouts, best first)."""
    if not plan.candidates:
        raise ValueError("the plan has no candidates")
    found = list(explain(plan) if findings is None else findings)
    top = tuple(top_layout(i + 1, est) for i, est in enumerate(plan.candidates))
    notes: list[str] = list(plan.notes)
    measured = None
    if log is not None:
        k = min(max(compare_rank, 1), len(plan.candidates))
        measured = comparison(plan.candidates[k - 1], top[k - 1].label, log, skip_warmup)
    land = landscape(plan, max_points)
    if land.total > len(land.labels):
        notes.append(f"the landscape shows {len(land.labels)} of {land.total} feasible layouts "
                     "(the Pareto front and an even sample)")
    views = schedules(plan, plan.candidates, max_blocks)
    if not views:
        notes.append("no feasible layout uses a pipeline (PP = 1 everywhere), so there is no schedule to draw")
    from paraplan.serialize import inputs_dict

    rej = tuple((k, v, plan.rejection_examples.get(k, ""))
                for k, v in sorted(plan.rejections.items(), key=lambda kv: (-kv[1], kv[0])))
    c = plan.cluster
    return ReportContext(
        title=title or f"paraplan report: {plan.model.name} on {c.num_gpus} x {c.gpu.name}",
        subtitle=(f"seq {plan.training.seq_len}, GBS {plan.training.global_batch_size}, {plan.training.precision}"
                  f" | {plan.num_evaluated} layouts evaluated, {plan.num_feasible} fit | objective {plan.objective}"),
        version=__version__, objective=plan.objective, inputs=inputs_text(plan),
        inputs_json=json.dumps(inputs_dict(plan.model, plan.cluster, plan.training), indent=1, sort_keys=True),
        top=top, landscape=land, num_evaluated=plan.num_evaluated, num_feasible=plan.num_feasible,
        rejections=rej, findings=tuple((f.code, f.text) for f in found),
        schedules=views, measured=measured, notes=tuple(notes))


def context_dict(ctx: ReportContext) -> dict[str, Any]:
    """The context as plain JSON-ready data (for tests and debugging)."""
    return asdict(ctx)
