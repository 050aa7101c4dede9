"""Plan (and optionally measured runs) -> ``ReportContext``: plain numbers and labels, no plotting.

A measured run is compared and diagnosed by ``paraplan.tune`` (``compare``, ``diagnose``); this module
only turns the result into display rows.

Everything the HTML shows is decided here; ``paraplan.report.charts`` only draws it. Nothing here
depends on the clock or on random ids, so the same inputs give the same context (and bytes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from paraplan._version import __version__
from paraplan.errors import SpecError
from paraplan.estimator import Estimate, estimate
from paraplan.explain import Finding, explain
from paraplan.ingest import RunLog
from paraplan.report.schedule import Block, simulate
from paraplan.search import Plan, rank_order
from paraplan.tune import Comparison, compare, diagnose, size_mismatches
from paraplan.tune import Metric as TuneMetric
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
    schedule: str = ""
    """``paraplan.schedules`` name ("" = Megatron's choice from VP)."""


@dataclass(frozen=True, slots=True)
class MeasuredMetric:
    """One row of predicted vs measured, in display units (``ratio`` is measured / predicted)."""

    key: str
    name: str
    unit: str
    predicted: float | None
    measured: float | None
    ratio: float | None
    measured_p90: float | None = None


@dataclass(frozen=True, slots=True)
class MeasuredStage:
    """Peak memory of one pipeline stage in GiB: predicted vs max allocated / reserved over its ranks."""

    stage: int
    ranks: tuple[int, ...]
    predicted_gib: float
    measured_gib: float | None
    reserved_gib: float | None
    ratio: float | None


@dataclass(frozen=True, slots=True)
class Measured:
    """A logged run next to the prediction of the layout it used (``paraplan.tune.compare``) and the
    diagnosis of ``paraplan.tune.diagnose`` as (code, text)."""

    sources: tuple[str, ...]
    layout_label: str
    iterations: int
    warmup_only: bool
    metrics: tuple[MeasuredMetric, ...]
    stages: tuple[MeasuredStage, ...]
    notes: tuple[str, ...]
    diagnosis: tuple[tuple[str, str], ...]

    def metric(self, key: str) -> MeasuredMetric:
        """The row of one ``paraplan.tune.Comparison.metrics`` key."""
        return next(m for m in self.metrics if m.key == key)

    @property
    def has_stage_memory(self) -> bool:
        """Whether the log reported memory of ranks in at least one stage."""
        return any(s.measured_gib is not None for s in self.stages)


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
    measured: Measured | None
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
    usable = plan.cluster.gpu.usable_bytes / GIB
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
    """Forward and backward seconds of one micro-batch on every pipeline stage (the estimate's own stage times)."""
    fwd, bwd = [], []
    for t in est.stage_times:
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
    if lay.schedule == "dualpipe-v":  # DualPipeV.step needs 2 PP micro-batches
        drawn = min(max(drawn, 2 * lay.pp), m)
    sched = simulate(pp=lay.pp, vp=lay.vp, num_microbatches=drawn, forward=[f / unit for f in fwd],
                     backward=[b / unit for b in bwd], schedule=lay.schedule)
    return ScheduleView(layout_label=label, pp=lay.pp, vp=lay.vp, num_microbatches=m, drawn_microbatches=drawn,
                        unit_s=unit, blocks=sched.blocks, makespan=sched.makespan, bubble_frac=sched.bubble_frac,
                        estimated_bubble_frac=float(est.time.bubble_frac), in_top=in_top, schedule=lay.schedule)


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
        order = rank_order(ev, plan.objective, plan.cluster, plan.ranking)
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
               ("HBM / usable", f"{g.hbm_bytes / GIB:.1f} / {g.usable_bytes / GIB:.1f} GiB"),
               ("dense BF16 peak", f"{g.peak_bf16_flops_per_s / TFLOP:.0f} TFLOP/s"),
               ("NVLink / network per GPU",
                f"{g.nvlink_bytes_per_s / 1e9:.0f} / {g.network_bytes_per_s / 1e9:.1f} GB/s per direction")]
    training = [("sequence length", str(t.seq_len)), ("global batch size", str(t.global_batch_size)),
                ("tokens per step", f"{t.tokens_per_step:,}"), ("precision", t.precision),
                ("objective", plan.objective)]
    return (("model", tuple(model)), ("cluster", tuple(cluster)), ("training", tuple(training)))


MEASURED_ROWS = (("step_time_s", "step time", "s", 1.0), ("tokens_per_s_per_gpu", "throughput", "tokens/s/GPU", 1.0),
                 ("mfu", "MFU", "%", 100.0), ("model_tflops_per_gpu", "model FLOP rate", "TFLOP/s/GPU", 1.0),
                 ("log_tflops_per_gpu", "FLOP rate in the log (Megatron's formula)", "TFLOP/s/GPU", 1.0),
                 ("peak_memory_bytes", "peak memory (max allocated)", "GiB", 1.0 / GIB),
                 ("bubble_and_pp_s", "bubble + PP wait", "s", 1.0), ("optimizer_s", "optimizer", "s", 1.0))
"""(``paraplan.tune.Comparison.metrics`` key, label, display unit, factor from the tune unit)."""
P90_KEYS = {"step_time_s": "step_time_s", "log_tflops_per_gpu": "tflops_per_gpu"}
"""Rows whose p90 comes straight from the log summary."""


def _row(key: str, name: str, unit: str, scale: float, m: TuneMetric, p90: float | None = None) -> MeasuredMetric:
    def sc(v: float | None) -> float | None:
        return None if v is None else v * scale

    return MeasuredMetric(key=key, name=name, unit=unit, predicted=sc(m.predicted), measured=sc(m.measured),
                          ratio=m.ratio, measured_p90=sc(p90))


def measured_view(cmp: Comparison, log: RunLog, label: str, findings: Sequence[Finding], *,
                  skip_warmup: int = 1, notes: Sequence[str] = ()) -> Measured:
    """The report's view of a ``paraplan.tune`` comparison and its findings (display units, plain numbers)."""
    summary = log.summary(0 if cmp.warmup_only else skip_warmup)
    rows = [_row(key, name, unit, scale, cmp.metrics[key], summary[P90_KEYS[key]]["p90"] if key in P90_KEYS else None)
            for key, name, unit, scale in MEASURED_ROWS]
    rows += [_row(f"comm_{axis}", f"exposed {axis.upper()} communication", "s", 1.0, m)
             for axis, m in cmp.comm.items() if m.predicted or m.measured is not None]
    stages = tuple(MeasuredStage(stage=s.stage, ranks=s.ranks, predicted_gib=s.predicted_bytes / GIB,
                                 measured_gib=None if s.measured_bytes is None else s.measured_bytes / GIB,
                                 reserved_gib=None if s.reserved_bytes is None else s.reserved_bytes / GIB,
                                 ratio=s.ratio) for s in cmp.stages)
    return Measured(sources=log.sources, layout_label=label, iterations=cmp.iterations, warmup_only=cmp.warmup_only,
                    metrics=tuple(rows), stages=stages, notes=(*notes, *cmp.notes),
                    diagnosis=tuple((f.code, f.text) for f in findings))


def log_sizes_text(log: RunLog) -> str:
    """``tp 2, pp 1, ...`` as the log states them."""
    return ", ".join(f"{k} {v}" for k, v in (log.run_config.sizes.items() if log.run_config else ()))


def _rank_the_log_states(plan: Plan, log: RunLog, prefer: int = 1) -> int | None:
    """The top layout (1-based) whose sizes are the ones the log printed (``prefer`` when it matches:
    sizes do not tell FSDP or recompute variants apart), when the log printed some; SpecError when it
    did and none of the top layouts matches."""
    if log.run_config is None:
        return None
    sizes = log.run_config.sizes

    def matches(est: Estimate) -> bool:
        return not size_mismatches(est, sizes)

    if matches(plan.candidates[prefer - 1]):
        return prefer
    for i, est in enumerate(plan.candidates, start=1):
        if matches(est):
            return i
    raise SpecError(f"the log states its layout ({log_sizes_text(log)}), which is not among the report's "
                    f"{len(plan.candidates)} top layouts: raise --top, or compare it with `paraplan tune` and "
                    "its flags")


def build_context(plan: Plan, *, findings: Sequence[Finding] | None = None, log: RunLog | None = None,
                  compare_rank: int = 1, skip_warmup: int = 1, search: bool = True, model_ref: str | None = None,
                  gpu_ref: str | None = None, profile: str | None = None, max_points: int = MAX_POINTS,
                  max_blocks: int = MAX_BLOCKS, title: str | None = None) -> ReportContext:
    """The report context of a plan (``plan.candidates`` are the top layouts, best first).

    With ``log``, the run (which used top layout ``compare_rank``) is put next to its prediction with
    ``paraplan.tune.compare`` and diagnosed with ``paraplan.tune.diagnose``; ``search``, ``model_ref``,
    ``gpu_ref`` and ``profile`` go to ``diagnose`` (the neighbourhood search and the launch command of the
    next layout)."""
    if not plan.candidates:
        raise ValueError("the plan has no candidates")
    found = list(explain(plan) if findings is None else findings)
    top = tuple(top_layout(i + 1, est) for i, est in enumerate(plan.candidates))
    notes: list[str] = list(plan.notes)
    measured = None
    if log is not None:
        k = min(max(compare_rank, 1), len(plan.candidates))
        clamped = ([f"asked to compare layout #{compare_rank}; the report has {len(top)} top layouts, so the run "
                    f"is compared with #{k}"] if k != compare_rank else [])
        stated = _rank_the_log_states(plan, log, prefer=k)
        if stated is not None and stated != k:
            clamped = [f"the log states its layout ({log_sizes_text(log)}): compared with top layout #{stated}, "
                       f"not #{k}"]
            k = stated
        cmp = compare(plan.candidates[k - 1], log, skip_warmup=skip_warmup)
        diag = diagnose(cmp, None, search=search, model_ref=model_ref, gpu_ref=gpu_ref, profile=profile)
        measured = measured_view(cmp, log, top[k - 1].label, diag, skip_warmup=skip_warmup, notes=clamped)
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
