"""Close the loop: put a measured run next to its prediction, and say what to change next.

``compare(estimate, run_log)`` lines up step time, tokens/s/GPU, MFU, peak memory per pipeline
stage (ranks mapped to stages with Megatron's default rank order tp-cp-ep-dp-pp: stage =
rank // (TP x CP x DP)), exposed DP communication and the bubble where timers give them
(megatron-logs.md section 4: bubble + p2p wait ~ forward-backward - forward-compute -
backward-compute - all-grads-sync). ``diagnose`` applies the measure-then-iterate rules of
tuning-method.md 7 with the numbers that triggered each finding, and ends with the next layout to
try (best of a search restricted around the current layout), its predicted gain and launch command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from paraplan.errors import NoFeasiblePlanError, SpecError
from paraplan.estimator import Estimate, config_dict, estimate
from paraplan.explain import Finding
from paraplan.ingest import RunLog
from paraplan.layout import ParallelLayout
from paraplan.schedules import schedule_label
from paraplan.search import Plan, SearchSpace, plan
from paraplan.specs.grid import Grid
from paraplan.units import GIB, TFLOP

# Thresholds of the rules (tuning-method.md 7 names no numbers; these are the usual rules of thumb).
LOW_MFU = 0.40  # MFU below which a run counts as slow (well-tuned Megatron dense runs reach 40-55%)
VISIBLE_BUBBLE = 0.05  # bubble share of the step that counts as visible
SLOW_RATIO = 1.10  # measured / predicted step above which the run is slower than the model says
LARGE_HEADROOM = 0.25  # share of usable memory left free that makes lowering TP or PP worth a try
MEMORY_GAP = 1.10  # measured / predicted peak memory above which the gap is explained
COMM_SHARE = 0.10  # exposed TP communication share of the step that counts as concentrated
DP_SHARE = 0.05  # exposed DP gradient sync share of the step that counts as exposed
DP_TIMERS = ("all-grads-sync", "grads-reduce-scatter", "grads-all-reduce", "backward-params-all-reduce")


@dataclass(frozen=True, slots=True)
class Metric:
    """One quantity predicted and (where the log gives it) measured."""

    predicted: float | None
    measured: float | None
    unit: str

    @property
    def ratio(self) -> float | None:  # measured / predicted, when both are known
        return self.measured / self.predicted if self.predicted and self.measured is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"predicted": self.predicted, "measured": self.measured, "ratio": self.ratio, "unit": self.unit}


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of one pipeline stage: predicted total vs measured max allocated over its ranks."""

    stage: int
    predicted_bytes: float
    measured_bytes: float | None
    reserved_bytes: float | None
    ranks: tuple[int, ...]

    @property
    def ratio(self) -> float | None:  # measured / predicted
        return None if self.measured_bytes is None else self.measured_bytes / self.predicted_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "predicted_bytes": self.predicted_bytes, "measured_bytes": self.measured_bytes,
                "max_reserved_bytes": self.reserved_bytes, "ranks": list(self.ranks), "ratio": self.ratio}


@dataclass(frozen=True, slots=True)
class Comparison:
    """A measured run next to its prediction."""

    estimate: Estimate
    metrics: dict[str, Metric]
    stages: tuple[StageMemory, ...]
    comm: dict[str, Metric]
    iterations: int
    warmup_only: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def step_ratio(self) -> float:  # measured / predicted step (1.0 when the log has none or only warm-up)
        return 1.0 if self.warmup_only else self.metrics["step_time_s"].ratio or 1.0

    @property
    def memory_ratio(self) -> float:  # measured / predicted peak memory, >= 1: scales other layouts' memory
        return max(1.0, self.metrics["peak_memory_bytes"].ratio or 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"config": config_dict(self.estimate.layout, self.estimate.training, self.estimate.num_microbatches),
                "iterations": self.iterations, "warmup_only": self.warmup_only,
                "metrics": {k: m.as_dict() for k, m in self.metrics.items()},
                "memory_per_stage": [s.as_dict() for s in self.stages],
                "exposed_comm_s": {k: m.as_dict() for k, m in self.comm.items()}, "notes": list(self.notes)}


def _stage_memory(est: Estimate, log: RunLog, notes: list[str]) -> tuple[StageMemory, ...]:
    lay = est.layout
    per_stage, world = int(Grid.of(lay).pp_group.stride), lay.world_size  # ranks of one pipeline stage
    by_stage: dict[int, list[tuple[int, float, float | None]]] = {}
    for m in log.memory:
        rank = m.rank if m.rank is not None else (world - 1 if m.fmt == "tensorboard" else None)
        if rank is not None and m.max_allocated_bytes is not None:
            by_stage.setdefault(rank // per_stage, []).append((rank, m.max_allocated_bytes, m.max_reserved_bytes))
    outside = sorted({r for s, rs in by_stage.items() if s >= lay.pp for r, _, _ in rs})
    if outside:
        notes.append(f"memory reports of ranks {outside} are outside the world of {world} GPUs: wrong layout?")
    out = []
    for i, st in enumerate(est.stages):
        rows = by_stage.get(i, [])
        res = [r for _, _, r in rows if r is not None]
        out.append(StageMemory(stage=i, predicted_bytes=float(st.memory.total_bytes),
                               measured_bytes=max((a for _, a, _ in rows), default=None),
                               reserved_bytes=max(res, default=None), ranks=tuple(sorted({r for r, _, _ in rows}))))
    return tuple(out)


def _timer(timers: dict[str, Any], *names: str) -> float | None:
    return next((float(v) for n in names if (v := timers.get(n, {}).get("median")) is not None), None)


def size_mismatches(est: Estimate, sizes: dict[str, int]) -> list[str]:
    """``k v (log) vs ours`` for every size a log states (tp, pp, cp, dp, vp, ep, world, mbs, gbs,
    seq_len) that differs from the estimate's layout; EP only for MoE models."""
    lay, tr = est.layout, est.training
    ours = {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vp": lay.vp, "world": est.cluster.num_gpus,
            "mbs": lay.mbs, "gbs": tr.global_batch_size, "seq_len": tr.seq_len}
    if est.model.is_moe:
        ours["ep"] = lay.ep
    return [f"{k} {v} (log) vs {ours[k]}" for k, v in sizes.items() if k in ours and v != ours[k]]


def _check_run_config(est: Estimate, log: RunLog) -> None:
    """SpecError when the sizes the run printed (sizes line, argument dump) are not the predicted
    layout's: the log is another run, and a comparison would be wrong in every number."""
    differ = size_mismatches(est, log.run_config.sizes) if log.run_config is not None else []
    if differ:
        raise SpecError(f"the log's run is not the predicted layout: {', '.join(differ)} (predicted); give the "
                        "manifest, plan rank or flags of the run that wrote it")


FLOP_FORMULA_TOLERANCE = 0.10
"""The log's TFLOP/s and Megatron main's formula at the log's step time may differ by rounding and
padding; beyond 10% the log used another formula version (MoE, SwiGLU, causal halving)."""


def compare(est: Estimate, log: RunLog, *, skip_warmup: int = 1) -> Comparison:
    """Predicted vs measured step time, throughput, MFU, memory per stage, DP sync and bubble."""
    notes: list[str] = []
    summary = log.summary(skip_warmup)
    step = summary["step_time_s"]["median"]
    warmup_only = False
    if step is None and log.summary(0)["step_time_s"]["median"] is not None:
        summary, warmup_only = log.summary(0), True
        step = summary["step_time_s"]["median"]
        notes.append("only warm-up iterations in the log: the measured step includes start-up and compilation")
    if step is None:
        notes.append("the log has no step time (no iteration line with elapsed time)")
    n, tr, t = est.cluster.num_gpus, est.training, est.time
    _check_run_config(est, log)
    gbs_seen = {r.global_batch_size for r in log.iterations if r.global_batch_size}
    if gbs_seen and tr.global_batch_size not in gbs_seen:
        raise SpecError(f"the log's global batch size {', '.join(map(str, sorted(gbs_seen)))} differs from the "
                        f"prediction's {tr.global_batch_size}: the log is not a run of this layout (give the "
                        "manifest or the flags of the run that wrote it)")
    peak_flops = est.cluster.gpu.peak_flops_per_s(est.throughput.mfu_peak)
    rate = None if step is None else float(est.throughput.model_flops_per_step) / (step * n)
    if rate is not None and rate > peak_flops:
        raise SpecError(f"the log's step time ({step:.3g} s) would mean {100 * rate / peak_flops:.0f}% MFU for this "
                        f"model on {n} GPUs: the log is not a run of this prediction (model, GPU count or batch)")
    stages = _stage_memory(est, log, notes)
    timers = summary["timers_s"]
    fb, fc, bc = (_timer(timers, k) for k in ("forward-backward", "forward-compute", "backward-compute"))
    dp, gather = _timer(timers, *DP_TIMERS), _timer(timers, "params-all-gather")
    dp_meas = None if dp is None else dp + (gather or 0.0)
    bubble = None if None in (fb, fc, bc) else max(0.0, fb - fc - bc - (dp or 0.0))  # type: ignore[operator]
    metrics = {
        "step_time_s": Metric(float(t.step_s), step, "s"),
        "tokens_per_s_per_gpu": Metric(float(est.throughput.tokens_per_s_per_gpu),
                                       None if step is None else tr.tokens_per_step / (step * n), "tokens/s/GPU"),
        "mfu": Metric(float(est.throughput.mfu), None if rate is None else rate / peak_flops, "fraction"),
        "model_tflops_per_gpu": Metric(float(est.throughput.model_tflops_per_gpu),
                                       None if rate is None else rate / TFLOP, "TFLOP/s/GPU"),
        "log_tflops_per_gpu": Metric(float(est.throughput.model_tflops_per_gpu), summary["tflops_per_gpu"]["median"],
                                     "TFLOP/s/GPU (Megatron's formula)"),
        "peak_memory_bytes": Metric(est.peak_bytes, summary["max_allocated_bytes"], "bytes"),
        "bubble_and_pp_s": Metric(float(t.bubble_s) + float(t.exposed_comm_s["pp"]), bubble, "s"),
        "optimizer_s": Metric(float(t.optimizer_s), _timer(timers, "optimizer"), "s"),
    }
    log_tflops = summary["tflops_per_gpu"]["median"]
    if log_tflops and rate and abs(log_tflops / (rate / TFLOP) - 1.0) > FLOP_FORMULA_TOLERANCE:
        notes.append(f"the log's {log_tflops:.0f} TFLOP/s/GPU counts FLOPs differently from Megatron main's formula "
                     f"({rate / TFLOP:.0f} TFLOP/s/GPU at the log's step time): another Megatron version's formula "
                     "(megatron-logs.md section 6); compare on step time and tokens/s, not on the log's TFLOP/s")
    comm = {k: Metric(float(v), dp_meas if k == "dp" else None, "s") for k, v in t.exposed_comm_s.items()}
    return Comparison(estimate=est, metrics=metrics, stages=stages, comm=comm, iterations=int(summary["iterations"]),
                      warmup_only=warmup_only, notes=tuple(notes))


# Diagnosis ---------------------------------------------------------------------------------
def variant(est: Estimate, **changes: Any) -> Estimate | str:
    """The estimate of the current layout with some fields changed (DP re-derived), or why it is invalid."""
    lay = est.layout
    kw: dict[str, Any] = dict(changes)
    if {"tp", "pp", "cp"} & set(kw):
        tp, pp, cp = kw.get("tp", lay.tp), kw.get("pp", lay.pp), kw.get("cp", lay.cp)
        if est.cluster.num_gpus % (tp * pp * cp):
            return f"{est.cluster.num_gpus} GPUs do not divide into TP {tp} x PP {pp} x CP {cp}"
        kw["dp"] = est.cluster.num_gpus // (tp * pp * cp)
        kw.setdefault("etp", 0 if lay.etp == lay.tp else lay.etp)
        kw.update(first_stage_layers=0, last_stage_layers=0)
    try:
        return estimate(est.model, est.cluster, est.training, replace(lay, **kw))
    except SpecError as err:
        return str(err).splitlines()[0]


def _gain(cur: Estimate, new: Estimate) -> float:  # throughput gain of new over cur (0.1 = 10% faster)
    return float(cur.time.step_s) / float(new.time.step_s) - 1.0


def _fits(cmp: Comparison, est: Estimate) -> bool:
    return est.peak_bytes * cmp.memory_ratio <= est.usable_bytes


def _describe(cmp: Comparison, label: str, var: Estimate | str) -> tuple[str, dict[str, Any]]:
    if isinstance(var, str):
        return f"{label}: not possible ({var})", {"label": label, "error": var}
    scaled = var.peak_bytes * cmp.memory_ratio
    text = (f"{label} ({var.layout.short()}): step {float(var.time.step_s):.3g} s predicted "
            f"({100 * _gain(cmp.estimate, var):+.1f}% throughput), peak {scaled / GIB:.1f} GiB"
            + (" with the measured memory ratio" if cmp.memory_ratio > 1.0 else "")
            + ("" if _fits(cmp, var) else " (does NOT fit)"))
    return text, {"label": label, "layout": var.layout.short(), "step_s": float(var.time.step_s),
                  "gain": _gain(cmp.estimate, var), "peak_bytes": scaled, "fits": _fits(cmp, var)}


def _step_finding(cmp: Comparison) -> Finding:
    s, mfu, tok = cmp.metrics["step_time_s"], cmp.metrics["mfu"], cmp.metrics["tokens_per_s_per_gpu"]
    if s.measured is None:
        return Finding("STEP_TIME", f"no measured step time; predicted {s.predicted:.3g} s",
                       {"predicted_s": s.predicted})
    r = s.ratio or 1.0
    text = (f"measured step {s.measured:.3g} s vs predicted {s.predicted:.3g} s (x{r:.2f}); "
            f"{tok.measured:,.0f} vs {tok.predicted:,.0f} tokens/s/GPU; MFU {100 * (mfu.measured or 0):.1f}% "
            f"vs {100 * (mfu.predicted or 0):.1f}%" + (" (warm-up only: includes start-up)" if cmp.warmup_only else ""))
    if abs(r - 1.0) > 0.15 and not cmp.warmup_only:
        text += "; run `paraplan calibrate` with this run to move predictions toward this cluster"
    return Finding("STEP_TIME", text, {"measured_s": s.measured, "predicted_s": s.predicted, "ratio": r,
                                       "mfu_measured": mfu.measured, "mfu_predicted": mfu.predicted})


def _memory_gap(cmp: Comparison) -> list[Finding]:
    over = [s for s in cmp.stages if s.ratio is not None and s.ratio > MEMORY_GAP]
    if not over:
        return []
    worst = max(over, key=lambda s: s.ratio or 0.0)
    meas = worst.measured_bytes or 0.0
    frag = (worst.reserved_bytes or meas) - meas
    text = (f"stage {worst.stage} measured {meas / GIB:.1f} GiB max allocated vs {worst.predicted_bytes / GIB:.1f} GiB "
            f"predicted (x{worst.ratio:.2f}): the gap is in live tensors paraplan does not model (NCCL/TE "
            f"workspaces, CUDA graphs, temporary buffers); allocator fragmentation comes on top of it "
            f"(reserved - allocated = {frag / GIB:.1f} GiB"
            + ("; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces it" if frag > 1.0 * GIB else "")
            + f"). Next layouts are checked with peaks scaled by x{cmp.memory_ratio:.2f}")
    return [Finding("MEMORY_ABOVE_PREDICTION", text, {"stage": worst.stage, "measured_bytes": meas,
                    "predicted_bytes": worst.predicted_bytes, "ratio": worst.ratio, "fragmentation_bytes": frag})]


def _headroom(cmp: Comparison) -> list[Finding]:
    est, lay = cmp.estimate, cmp.estimate.layout
    peak = cmp.metrics["peak_memory_bytes"].measured or est.peak_bytes
    free = 1.0 - peak / est.usable_bytes
    if free < LARGE_HEADROOM or (lay.tp == 1 and lay.pp == 1):
        return []
    # the distributed optimizer thins the states, and the memory it frees buys a smaller TP or PP (method 1)
    opt, sfx = ({}, "") if lay.dist_opt else ({"distributed_optimizer": True, "overlap_param_gather": True},
                                              " + distributed optimizer")
    vp = lay.vp if est.model.num_layers % (max(lay.pp // 2, 1) * lay.vp) == 0 else 1
    tried = [_describe(cmp, f"TP {lay.tp} -> {lay.tp // 2}{sfx}", variant(est, tp=lay.tp // 2, **opt))
             ] if lay.tp % 2 == 0 else []
    tried += [_describe(cmp, f"PP {lay.pp} -> {lay.pp // 2}{sfx}", variant(est, pp=lay.pp // 2, vp=vp, **opt))
              ] if lay.pp % 2 == 0 else []
    text = (f"peak {peak / GIB:.1f} GiB of {est.usable_bytes / GIB:.1f} GiB usable ({100 * free:.0f}% free): lower TP "
            "or PP one step and give the GPUs to DP; " + "; ".join(t for t, _ in tried))
    return [Finding("MEMORY_HEADROOM", text, {"peak_bytes": peak, "usable_bytes": est.usable_bytes,
                                              "free_frac": free, "options": [n for _, n in tried]})]


def _bubble(cmp: Comparison) -> list[Finding]:
    est, lay = cmp.estimate, cmp.estimate.layout
    if lay.pp == 1:  # no pipeline, no bubble
        return []
    b, step = cmp.metrics["bubble_and_pp_s"], cmp.metrics["step_time_s"]
    frac = (b.measured / step.measured if b.measured is not None and step.measured
            else (b.predicted or 0.0) / float(est.time.step_s))
    mfu = cmp.metrics["mfu"].measured or cmp.metrics["mfu"].predicted or 0.0
    if frac < VISIBLE_BUBBLE or (mfu >= LOW_MFU and cmp.step_ratio < SLOW_RATIO):
        return []
    m, p = est.num_microbatches, lay.pp
    vps = [(v, variant(est, vp=v)) for v in range(2, 9) if v != lay.vp and est.model.num_layers % (p * v) == 0]
    tried = [_describe(cmp, f"VP {v}", var) for v, var in vps if not isinstance(var, str)] or [
        _describe(cmp, f"VP {v}", var) for v, var in vps[:1]]
    if lay.mbs > 1:
        tried.append(_describe(cmp, f"micro-batch {lay.mbs} -> {lay.mbs // 2} ({2 * m} micro-batches)",
                               variant(est, mbs=lay.mbs // 2)))
    ok = [n for _, n in tried if n.get("fits") and n.get("gain", 0.0) > 0]
    best = max(ok, key=lambda n: n["gain"]) if ok else None
    text = (f"MFU {100 * mfu:.1f}% with a visible bubble: {100 * frac:.0f}% of the step "
            + ("measured (forward-backward minus compute)" if b.measured is not None else "predicted")
            + (f"; (p-1)/(v*m) = ({p}-1)/({lay.vp}x{m})" if not lay.schedule else
               f"; {schedule_label(lay.schedule, lay.vp)}") + f" = {100 * float(est.time.bubble_frac):.1f}%, "
            f"m/p = {m / p:.1f}. "
            "Interleave (--num-layers-per-virtual-pipeline-stage) or raise the number of micro-batches: "
            + "; ".join(t for t, _ in tried) + (f". Best: {best['label']}" if best else ""))
    return [Finding("BUBBLE", text, {"bubble_frac": frac, "mfu": mfu, "pp": p, "vp": lay.vp,
                                     "num_microbatches": m, "options": [n for _, n in tried]})]


def _tp_comm(cmp: Comparison) -> list[Finding]:
    est, lay, cl = cmp.estimate, cmp.estimate.layout, cmp.estimate.cluster
    exposed = {k: float(v) for k, v in est.time.exposed_comm_s.items()}
    step = float(est.time.step_s)
    if lay.tp == 1 or exposed["tp"] / step < COMM_SHARE or max(exposed, key=lambda k: exposed[k]) != "tp":
        return []
    inside = lay.tp <= cl.nvlink_domain_size and cl.nvlink_domain_size % lay.tp == 0
    text = (f"exposed TP communication {exposed['tp']:.3g} s = {100 * exposed['tp'] / step:.0f}% of the predicted "
            f"step, the largest communication term; the TP group of {lay.tp} consecutive ranks "
            + (f"stays inside the {cl.nvlink_domain_size}-GPU NVLink domain" if inside else
               f"CROSSES the {cl.nvlink_domain_size}-GPU NVLink domain: keep TP <= {cl.nvlink_domain_size}"))
    opts = ([_describe(cmp, "--tp-comm-overlap", variant(est, tp_comm_overlap=True))]
            if lay.sp and not lay.tp_comm_overlap else [])
    opts += [_describe(cmp, f"TP {lay.tp} -> {lay.tp // 2}", variant(est, tp=lay.tp // 2))] if lay.tp % 2 == 0 else []
    text += ("; " + "; ".join(t for t, _ in opts)) if opts else ""
    return [Finding("TP_COMM", text, {"exposed_tp_s": exposed["tp"], "share": exposed["tp"] / step,
                                      "tp_inside_nvlink": inside, "options": [n for _, n in opts]})]


def _dp_sync(cmp: Comparison) -> list[Finding]:
    est, lay = cmp.estimate, cmp.estimate.layout
    d, step = cmp.comm["dp"], cmp.metrics["step_time_s"]
    measured = d.measured is not None and bool(step.measured)
    value, total = (d.measured, step.measured) if measured else (d.predicted, step.predicted)
    if lay.dp * lay.cp == 1 or not value or not total or value / total < DP_SHARE:
        return []
    flags = {"overlap_grad_reduce": "--overlap-grad-reduce", "distributed_optimizer": "--use-distributed-optimizer",
             "overlap_param_gather": "--overlap-param-gather"}
    missing = [k for k in flags if not getattr(lay, k) and not (k == "overlap_param_gather" and not lay.dist_opt)]
    if "distributed_optimizer" in missing:
        missing.append("overlap_param_gather")
    opts = [_describe(cmp, " ".join(flags[k] for k in dict.fromkeys(missing)),
                      variant(est, **dict.fromkeys(missing, True)))] if missing and not lay.fsdp else []
    text = (f"DP gradient sync exposed: {value:.3g} s = {100 * value / total:.0f}% of the step "
            + ("(all-grads-sync timer)" if measured else "(predicted)")
            + ("; turn on " + opts[0][0] if opts else
               "; overlap flags are on: raise --ddp-bucket-size so fewer, larger buckets overlap better"))
    return [Finding("DP_SYNC_EXPOSED", text, {"exposed_dp_s": value, "share": value / total,
                                              "missing_flags": [flags[k] for k in dict.fromkeys(missing)]})]


def _key(lay: ParallelLayout) -> tuple[Any, ...]:
    return (lay.tp, lay.pp, lay.vp, lay.cp, lay.ep, lay.etp, lay.mbs, lay.recompute, lay.fsdp, lay.dist_opt)


def neighbourhood(cmp: Comparison) -> Plan | None:
    """Search restricted around the current layout: TP, PP, micro-batch one step either way, any VP and recompute."""
    est, lay, cl, n = cmp.estimate, cmp.estimate.layout, cmp.estimate.cluster, cmp.estimate.cluster.num_gpus

    def around(v: int, top: int) -> tuple[int, ...]:
        return tuple(sorted({x for x in (v // 2 if v % 2 == 0 else v, v, 2 * v) if 1 <= x <= top}))

    space = SearchSpace(tp=around(lay.tp, max(lay.tp, cl.nvlink_domain_size)), pp=around(lay.pp, n), cp=(lay.cp,),
                        ep=(lay.ep,) if est.model.is_moe else None, mbs=around(lay.mbs, 64),
                        dp_variants=("fsdp",) if lay.fsdp else ("distopt",), fsdp_everywhere=lay.fsdp,
                        allow_cross_node=True,
                        tp_comm_overlap=lay.tp_comm_overlap)
    try:
        return plan(est.model, cl, est.training, space=space, top_k=12, advise_gpu_counts=False)
    except NoFeasiblePlanError:
        return None


def launch_command(est: Estimate, *, model_ref: str | None = None, gpu_ref: str | None = None,
                   profile: str | None = None, out: str | None = None) -> str:
    """``paraplan launch`` command line for a layout (estimate flags)."""
    lay, tr, cl = est.layout, est.training, est.cluster
    args = ["paraplan", "launch", "--model", model_ref or est.model.name, "--gpu", gpu_ref or cl.gpu.name]
    on = {"num-gpus": cl.num_gpus, "gpus-per-node": cl.gpus_per_node if cl.gpus_per_node != cl.gpu.gpus_per_node
          else None, "seq-len": tr.seq_len, "gbs": tr.global_batch_size, "tp": lay.tp, "pp": lay.pp,
          "vp": lay.vp if lay.vp > 1 else None, "cp": lay.cp if lay.cp > 1 else None,
          "ep": lay.ep if lay.ep > 1 else None, "etp": lay.etp if est.model.is_moe and lay.etp != lay.tp else None,
          "mbs": lay.mbs, "precision": tr.precision if tr.precision != "bf16" else None,
          "decoder-first-pipeline-num-layers": lay.first_stage_layers or None,
          "decoder-last-pipeline-num-layers": lay.last_stage_layers or None}
    args += [w for k, v in on.items() if v is not None for w in (f"--{k}", str(v))]
    switches = {"--no-sequence-parallel": not lay.sequence_parallel and lay.tp > 1, "--fsdp": lay.fsdp,
                "--no-distributed-optimizer": not lay.distributed_optimizer and not lay.fsdp,
                "--no-overlap-grad-reduce": not lay.overlap_grad_reduce, "--tp-comm-overlap": lay.tp_comm_overlap,
                "--no-overlap-param-gather": lay.dist_opt and not lay.overlap_param_gather}
    args += ["--recompute", lay.recompute, *(flag for flag, on in switches.items() if on)]
    args += ["--profile", profile] if profile else []
    args += ["--target", "all", "--out", out or "runs/" + lay.short().replace(" ", "-")]
    return shlex.join(args)


def _next_layout(cmp: Comparison, found: Plan | None, refs: dict[str, str | None], *, searched: bool = True) -> Finding:
    cur = _key(cmp.estimate.layout)
    if not searched:
        return Finding("NEXT_LAYOUT", "no layout search was run: only the findings above apply",
                       {"layout": None})
    cands = [c for c in (found.candidates if found else ()) if _key(c.layout) != cur and _fits(cmp, c)]
    if not cands:
        return Finding("NEXT_LAYOUT", "no other layout around the current one fits (with the measured memory ratio): "
                       "keep it", {"layout": None})
    best, cmd = cands[0], launch_command(cands[0], **refs)
    gain, expect = _gain(cmp.estimate, best), float(best.time.step_s) * cmp.step_ratio
    text = (f"next layout to try: {best.layout.short()} (from {cmp.estimate.layout.short()}): predicted step "
            f"{float(best.time.step_s):.3g} s vs {float(cmp.estimate.time.step_s):.3g} s ({100 * gain:+.1f}% throughput"
            + (f"; about {expect:.3g} s on this cluster at the measured ratio x{cmp.step_ratio:.2f}"
               if cmp.step_ratio != 1.0 else "")
            + f"), peak {best.peak_bytes * cmp.memory_ratio / GIB:.1f} GiB. Launch: {cmd}")
    if gain <= 0:
        text = "the current layout is already the fastest predicted around it; runner-up: " + text
    return Finding("NEXT_LAYOUT", text, {
        "layout": config_dict(best.layout, best.training, best.num_microbatches), "short": best.layout.short(),
        "predicted_step_s": float(best.time.step_s), "gain": gain, "expected_step_s": expect, "command": cmd})


def diagnose(cmp: Comparison, found: Plan | None = None, *, search: bool = True, model_ref: str | None = None,
             gpu_ref: str | None = None, profile: str | None = None) -> list[Finding]:
    """Findings with their numbers, in the tuning method's order, ending with the next layout; ``found`` is a
    plan restricted around the current layout (searched here when None and ``search``)."""
    out = [_step_finding(cmp), *_memory_gap(cmp), *_headroom(cmp), *_bubble(cmp), *_tp_comm(cmp), *_dp_sync(cmp)]
    searched = found is not None or search
    if found is None and search:
        found = neighbourhood(cmp)
    refs = {"model_ref": model_ref, "gpu_ref": gpu_ref, "profile": profile}
    nxt = _next_layout(cmp, found, refs, searched=searched)
    return [*out, *(_best_overall(cmp, nxt, refs) if search else []), nxt]


BEST_OVERALL_MARGIN = 0.05
"""The global search's best is shown next to the step-by-step pick when it is this much faster."""


def _best_overall(cmp: Comparison, nxt: Finding, refs: dict[str, str | None]) -> list[Finding]:
    """The best layout of the whole search (the step-by-step pick moves TP, PP and the micro-batch
    one step at a time; a layout several steps away can be much faster)."""
    est = cmp.estimate
    try:
        whole = plan(est.model, est.cluster, est.training, top_k=12)
    except NoFeasiblePlanError:
        return []
    cands = [c for c in whole.candidates if _fits(cmp, c)]
    if not cands:
        return []
    best = cands[0]
    step_pick = min(float(nxt.numbers.get("predicted_step_s") or est.time.step_s), float(est.time.step_s))
    if float(best.time.step_s) > (1.0 - BEST_OVERALL_MARGIN) * step_pick or _key(best.layout) == _key(est.layout):
        return []
    gain, cmd = _gain(est, best), launch_command(best, **refs)
    return [Finding("BEST_OVERALL", f"the best layout of the whole search is {best.layout.short()}: predicted step "
                    f"{float(best.time.step_s):.3g} s ({100 * gain:+.1f}% throughput over the current layout), "
                    f"peak {best.peak_bytes * cmp.memory_ratio / GIB:.1f} GiB, several steps away from the next "
                    f"layout below. Launch: {cmd}",
                    {"layout": config_dict(best.layout, best.training, best.num_microbatches),
                     "short": best.layout.short(), "predicted_step_s": float(best.time.step_s), "gain": gain,
                     "command": cmd})]
