"""Capacity planning: how many GPUs of which kind, in which layout, how long and at what cost.

For each GPU type the GPU count is swept in node multiples (node x 1, 2, 4, ... up to 65,536; one
count past the first meeting the deadline; or exactly ``num_gpus``); each count takes
the best layout of the vectorised search (``paraplan.search.plan``, top 1). Time to train is
tokens / (tokens/s/GPU x GPUs); GPU-hours and cost follow. Rows are flagged where scaling stops paying
(per-GPU throughput below 70% of the best at a smaller count, fewer micro-batches than pipeline stages,
one micro-batch per DP rank); counts the global batch cannot be split over are infeasible rows.

Sanity check (tests/budget): the closed form time = 6*T*P/(n*X), X the planner's model FLOP/s
per GPU, equals the planner's time times 6*P*tokens / model FLOPs (attention scores and logits
are the difference); 8*T*P/(n*X_hw) with X_hw counting the recomputed forward under full
recompute (Narayanan et al. 2021, arXiv:2104.04473, section 5.1).

Checkpoints and failures (``paraplan.checkpoint``, ``paraplan.goodput``): each row's layout gets its checkpoint
size and save time on the site's storage, the Young/Daly save interval in iterations and the goodput it gives;
effective days = step-time days / goodput, and cost is paid on the effective (wall) GPU-hours. The deadline and the
recommendation use effective days.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from paraplan.checkpoint import (
    DEFAULT_STORAGE_BYTES_PER_S_PER_GPU,
    CheckpointAdvice,
    StorageSpec,
    advise,
    format_decimal_bytes,
)
from paraplan.errors import NoFeasiblePlanError, SpecError
from paraplan.estimate.params import model_param_counts
from paraplan.estimator import Estimate, config_dict, max_positions_for
from paraplan.fileio import brief
from paraplan.goodput import DEFAULT_FAILURE_RATE_PER_GPU_HOUR, FailureSpec
from paraplan.headroom import DEFAULT_HEADROOM, Headroom
from paraplan.search import SearchSpace, plan
from paraplan.specs.cluster import GpuSpec, make_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec
from paraplan.units import GB, GIB, SECONDS_PER_DAY, SECONDS_PER_HOUR, TFLOP

MAX_GPUS: Final = 65_536
"""Largest count swept without a deadline (the largest published single jobs are ~16-32K GPUs)."""
EFFICIENCY_FLOOR: Final = 0.70
"""Per-GPU throughput relative to the best at a smaller count below which scaling stops paying."""
CKPT_OVERHEAD_FLAG: Final = 0.05
"""Share of training time spent blocked in checkpoint saves above which a row is flagged (storage too slow)."""
STOP_EFFICIENCY: Final = 0.25  # a GPU type's sweep stops after a count this far below the best per-GPU rate
GBS_TOLERANCE: Final = 0.02
"""With a GBS range, the smallest GBS within this fraction of the best throughput is kept."""
DEFAULT_BATCH_TOKENS: Final = 4 * 2**20
"""Default tokens per step: ~4M, Llama 3's initial batch (Dubey et al. 2024, section 3.4.1)."""
MAX_TOKENS: Final = 1e18
"""Largest --tokens accepted (a million times Llama 3's 15T): a count past it is a typo, and its days overflow."""
MAX_PRICE_PER_GPU_HOUR: Final = 1e6
"""Largest USD per GPU-hour accepted (1e308 printed $infT)."""
TOKEN_SUFFIXES: Final = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
CONVERGENCE_NOTE: Final = ("a larger global batch than the base is a convergence trade-off: past the critical batch "
                           "size more tokens are needed for the same loss (McCandlish et al. 2018, arXiv:1812.06162); "
                           "times here assume the same token count")

Progress = Callable[[int, int], None]


def default_gbs(seq_len: int) -> int:
    """Sequences per step for ~4M tokens, a power of two (1024 at seq 4096), at least 1."""
    return 1 << max(0, round(math.log2(max(1.0, DEFAULT_BATCH_TOKENS / seq_len))))


def parse_token_count(text: str, flag: str = "--tokens") -> float:
    """'15T', '300B', '2.5e12', '500k' -> tokens (decimal suffixes K M B/G T P); SpecError naming the flag."""
    raw = text.strip().replace("_", "").replace(",", "")
    mult = 1.0
    if raw and raw[-1].upper() in TOKEN_SUFFIXES:
        mult, raw = TOKEN_SUFFIXES[raw[-1].upper()], raw[:-1]
    try:
        value = float(raw) * mult
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{flag}: expected a positive token count like 15T, 300B or 2.5e12, got {brief(text)}")
    if value > MAX_TOKENS:
        raise SpecError(f"{flag}: {value:.3g} tokens is out of range; allowed up to {MAX_TOKENS:g} (1e6 T), "
                        f"got {brief(text)}")
    return value


def parse_prices(text: str | None, gpu_names: Sequence[str], flag: str = "--price-per-gpu-hour",
                 known: Sequence[str] = ()) -> dict[str, float]:
    """'h100-80gb=2.5,b200=4' (or one number for every GPU) -> {gpu: USD per GPU-hour}; ``known`` names
    that are not swept are accepted (a standing price list), others are errors."""
    if not text or not text.strip():
        return {}
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, raw = item.rpartition("=")
        if name and name not in gpu_names and name not in known:
            raise SpecError(f"{flag}: '{name}' is not one of the GPUs swept ({', '.join(gpu_names)})")
        try:
            price = float(raw)
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price <= 0:
            raise SpecError(f"{flag}: expected GPU=USD with a positive price (e.g. h100-80gb=2.5), got {brief(item)}")
        if price > MAX_PRICE_PER_GPU_HOUR:
            raise SpecError(f"{flag}: {price:g} USD per GPU-hour is out of range; allowed up to "
                            f"{MAX_PRICE_PER_GPU_HOUR:g}, got {brief(item)}")
        out.update({name: price} if name else dict.fromkeys(gpu_names, price))
    return out


def closed_form_days(tokens: float, params: float, num_gpus: int, flops_per_s_per_gpu: float,
                     flops_per_param_token: float = 6.0) -> float:
    """Time to train in days = c*T*P/(n*X): c = 6 (forward + backward), 8 with full recompute."""
    return flops_per_param_token * tokens * params / (num_gpus * flops_per_s_per_gpu) / SECONDS_PER_DAY


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetRow:
    """One (GPU type, GPU count) point of the sweep: the best layout and what it costs."""

    gpu: str
    num_gpus: int
    gpus_per_node: int
    gbs: int
    feasible: bool
    reason: str | None = None
    """Why nothing fits (infeasible rows)."""
    reason_code: str | None = None
    config: dict[str, Any] | None = None
    layout: str | None = None
    tokens_per_s_per_gpu: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    days: float | None = None
    """Step-time days: tokens / throughput, no checkpoints or failures."""
    gpu_hours: float | None = None
    """Step-time GPU-hours."""
    cost_usd: float | None = None
    """Price x effective GPU-hours (wall time, failures and saves included)."""
    meets_deadline: bool | None = None
    """Effective days within the deadline; None without a deadline."""
    goodput: float | None = None
    """Useful / wall time (``paraplan.goodput``)."""
    effective_days: float | None = None
    """days / goodput (None when goodput is 0: failures outpace progress)."""
    checkpoint_bytes: float | None = None
    """Total bytes one save writes."""
    checkpoint_save_s: float | None = None
    save_interval_iters: int | None = None
    host_ram_bytes_per_node: float | None = None
    """Host memory an ``--async-save`` stages per node."""
    checkpoint: dict[str, Any] | None = None
    """Format, per-rank bytes, load time, async decision, failures per day, restart time."""
    efficiency: float | None = None
    """Per-GPU throughput relative to the best at this or a smaller count of this GPU type (<= 1): the smallest
    feasible count is often memory-starved (full recompute), so it is a poor reference on its own."""
    closed_form_days: float | None = None
    """6*T*P/(n*X) with the planner's model FLOP/s per GPU (P: active parameters)."""
    flags: tuple[tuple[str, str], ...] = ()
    layouts_evaluated: int = 0

    @property
    def scaling_pays(self) -> bool:
        """Feasible, efficiency above the floor and at least PP micro-batches."""
        codes = {c for c, _ in self.flags}
        return self.feasible and not codes & {"LOW_EFFICIENCY", "MICROBATCHES_LT_PP", "NO_PROGRESS"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready row (stable keys: gpu, num_gpus, config, tokens_per_s_per_gpu, days, gpu_hours, cost_usd,
        meets_deadline)."""
        return {
            "gpu": self.gpu, "num_gpus": self.num_gpus, "num_nodes": max(1, self.num_gpus // self.gpus_per_node),
            "gbs": self.gbs, "feasible": self.feasible, "reason": self.reason, "reason_code": self.reason_code,
            "config": self.config, "layout": self.layout, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu, "days": self.days,
            "gpu_hours": self.gpu_hours, "cost_usd": self.cost_usd, "meets_deadline": self.meets_deadline,
            "efficiency": self.efficiency, "scaling_pays": self.scaling_pays,
            "closed_form_days": self.closed_form_days, "goodput": self.goodput,
            "effective_days": self.effective_days, "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_save_s": self.checkpoint_save_s, "save_interval_iters": self.save_interval_iters,
            "host_ram_bytes_per_node": self.host_ram_bytes_per_node, "checkpoint": self.checkpoint,
            "flags": [{"code": c, "text": t} for c, t in self.flags], "layouts_evaluated": self.layouts_evaluated,
        }


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """All rows of the sweep (GPU types in the order given, counts ascending) and the recommendation."""

    model: str
    tokens: float
    seq_len: int
    gbs: int
    max_gbs: int | None
    deadline_days: float | None
    params: int
    rows: tuple[BudgetRow, ...]
    recommendation: dict[str, Any]
    notes: tuple[str, ...] = field(default=())

    @property
    def layouts_evaluated(self) -> int:
        """Candidate layouts the search looked at over the whole sweep."""
        return sum(r.layouts_evaluated for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """``{"rows": [...], "recommendation": {...}, ...}``."""
        return {"model": self.model, "tokens": self.tokens, "seq_len": self.seq_len, "gbs": self.gbs,
                "max_gbs": self.max_gbs, "deadline_days": self.deadline_days, "params": self.params,
                "rows": [r.to_dict() for r in self.rows], "recommendation": self.recommendation,
                "layouts_evaluated": self.layouts_evaluated, "notes": list(self.notes)}


@dataclass(frozen=True, slots=True)
class _Sweep:
    """Inputs shared by every point of the sweep."""

    model: ModelSpec
    tokens: float
    seq_len: int
    gbs_options: tuple[int, ...]
    precision: str
    space: SearchSpace | None
    params: int
    days: float | None
    prices: dict[str, float]
    storage: StorageSpec
    failures: FailureSpec
    headroom: Headroom | None = None


def sweep_counts(gpus_per_node: int, max_gpus: int = MAX_GPUS) -> list[int]:
    """Node x 1, 2, 4, ... up to ``max_gpus`` (at least one node)."""
    counts, n = [], gpus_per_node
    while n <= max(max_gpus, gpus_per_node):
        counts.append(n)
        n *= 2
    return counts


def _infeasible_reason(err: NoFeasiblePlanError, gbs: int, n: int, gpu: GpuSpec,
                       headroom: Headroom) -> tuple[str, str]:
    rej = err.rejections
    if rej.get("OOM") or rej.get("OOM_MARGIN"):
        usable = gpu.usable_bytes / GIB
        inside = rej.get("OOM_MARGIN", 0)
        margin = (f" less the {headroom.describe(gpu.usable_bytes)}; {inside} fit only inside that margin"
                  if inside else "")
        return "OOM", (f"out of memory: none of the {rej.get('OOM', 0) + inside} valid layouts fits in {usable:.1f} "
                       f"GiB usable on {n} x {gpu.name}{margin}")
    if rej.get("GBS_NOT_DIVISIBLE"):
        return "GBS_NOT_DIVISIBLE", (f"GBS {gbs} cannot be split over the data-parallel ranks of any layout on "
                                     f"{n} GPUs (batch too small per DP rank): raise gbs/max_gbs")
    top = max(rej, key=lambda k: rej[k]) if rej else "NO_LAYOUT"
    return top, f"no valid layout on {n} x {gpu.name} (most rejected: {top})"


def _resilience(s: _Sweep, n: int, gbs: int, est: Estimate) -> tuple[CheckpointAdvice, list[tuple[str, str]]]:
    """Checkpoint size/time, save interval and goodput of one row, and its flags."""
    adv = advise(est, s.storage, s.failures, train_iters=math.ceil(s.tokens / (gbs * s.seq_len)))
    timing, gp = adv.timing, adv.goodput
    flags: list[tuple[str, str]] = []
    if timing.host_ram_fits is False:
        assert s.storage.host_memory_bytes_per_node is not None
        flags.append(("HOST_RAM", f"--async-save would stage {format_decimal_bytes(timing.host_ram_bytes_per_node)} "
                                  f"per node > host RAM {format_decimal_bytes(s.storage.host_memory_bytes_per_node)}: "
                                  "synchronous save"))
    blocked = gp.save_blocking_s / (gp.interval_s + gp.save_blocking_s)
    if blocked > CKPT_OVERHEAD_FLAG:
        flags.append(("CKPT_SLOW", f"checkpoint saves block {blocked:.0%} of training "
                                   f"({timing.save_s:,.0f} s per save, {timing.storage_bound} storage bandwidth)"))
    return adv, flags


def _row_from(s: _Sweep, gpu: GpuSpec, per_node: int, n: int, gbs: int, est: Estimate, evaluated: int) -> BudgetRow:
    x = float(est.throughput.tokens_per_s_per_gpu)
    model_flops = float(est.throughput.model_tflops_per_gpu) * TFLOP
    days = s.tokens / (x * n) / SECONDS_PER_DAY
    gpu_hours = s.tokens / x / SECONDS_PER_HOUR
    price = s.prices.get(gpu.name)
    lay = est.layout
    adv, flags = _resilience(s, n, gbs, est)
    goodput = adv.goodput.goodput
    effective_days = days / goodput if goodput > 0 else None
    if effective_days is None:
        flags.insert(0, ("NO_PROGRESS", "failures outpace progress: restarts and lost work exceed the MTBF"))
    if est.num_microbatches < lay.pp:
        flags.append(("MICROBATCHES_LT_PP", f"{est.num_microbatches} micro-batch(es) < PP {lay.pp}: "
                                            "the pipeline bubble dominates"))
    if est.num_microbatches == 1:
        flags.append(("SMALL_BATCH_PER_DP", f"1 micro-batch per DP rank ({gbs // lay.dp} seq): "
                                            "DP cannot grow further at this GBS"))
    if gbs > s.gbs_options[0]:
        flags.append(("GBS_RAISED", f"GBS raised to {gbs} (convergence trade-off)"))
    return BudgetRow(
        gpu=gpu.name, num_gpus=n, gpus_per_node=per_node, gbs=gbs, feasible=True,
        config=config_dict(lay, est.training, est.num_microbatches), layout=lay.short(), tokens_per_s_per_gpu=x,
        model_tflops_per_gpu=model_flops / TFLOP, mfu=float(est.throughput.mfu), days=days, gpu_hours=gpu_hours,
        cost_usd=None if price is None or effective_days is None else price * gpu_hours / goodput,
        meets_deadline=None if s.days is None else effective_days is not None and effective_days <= s.days,
        goodput=goodput, effective_days=effective_days, checkpoint_bytes=adv.size.total_bytes,
        checkpoint_save_s=adv.timing.save_s, save_interval_iters=adv.save_interval_iters,
        host_ram_bytes_per_node=adv.timing.host_ram_bytes_per_node, checkpoint=adv.as_dict(),
        closed_form_days=closed_form_days(s.tokens, s.params, n, model_flops), flags=tuple(flags),
        layouts_evaluated=evaluated)


def _evaluate_count(s: _Sweep, gpu: GpuSpec, per_node: int, n: int) -> BudgetRow:
    """Best layout at ``n`` GPUs (over the GBS options: the smallest within GBS_TOLERANCE of the best)."""
    base = s.gbs_options[0]
    try:
        cluster = make_cluster(gpu, n, per_node)
    except SpecError as err:
        return BudgetRow(gpu=gpu.name, num_gpus=n, gpus_per_node=per_node, gbs=base, feasible=False,
                         reason=str(err), reason_code="BAD_COUNT")
    found: list[tuple[int, Estimate]] = []
    evaluated = 0
    last_err: NoFeasiblePlanError | None = None
    for gbs in s.gbs_options:
        training = TrainingSpec(seq_len=s.seq_len, global_batch_size=gbs, precision=s.precision)  # type: ignore[arg-type]
        try:
            p = plan(s.model, cluster, training, space=s.space, top_k=1, headroom=s.headroom, advise_gpu_counts=False)
        except NoFeasiblePlanError as err:
            evaluated += sum(err.rejections.values())
            last_err = err  # the largest GBS tried: the most room for DP
            continue
        evaluated += p.num_evaluated
        found.append((gbs, p.candidates[0]))
    if not found:
        assert last_err is not None
        code, reason = _infeasible_reason(last_err, s.gbs_options[-1], n, gpu,
                                           (s.headroom or DEFAULT_HEADROOM).for_model(s.model.is_moe))
        return BudgetRow(gpu=gpu.name, num_gpus=n, gpus_per_node=per_node, gbs=s.gbs_options[-1], feasible=False,
                         reason=reason,
                         reason_code=code, layouts_evaluated=evaluated)
    best = max(float(e.throughput.tokens_per_s_per_gpu) for _, e in found)
    gbs, est = next((g, e) for g, e in found
                    if float(e.throughput.tokens_per_s_per_gpu) >= (1 - GBS_TOLERANCE) * best)
    return _row_from(s, gpu, per_node, n, gbs, est, evaluated)


def _x(row: BudgetRow) -> float:
    assert row.tokens_per_s_per_gpu is not None
    return row.tokens_per_s_per_gpu


def _with_efficiency(row: BudgetRow, ref: BudgetRow) -> BudgetRow:
    eff = _x(row) / _x(ref)
    flags = row.flags
    if eff < EFFICIENCY_FLOOR:
        flags = (("LOW_EFFICIENCY", f"per-GPU throughput {eff:.0%} of the best at fewer GPUs ({ref.num_gpus}) "
                                    f"(< {EFFICIENCY_FLOOR:.0%}): scaling stops paying"), *flags)
    return replace(row, efficiency=eff, flags=flags)


def _sweep_gpu(s: _Sweep, gpu: GpuSpec, per_node: int, counts: list[int]) -> Iterator[BudgetRow]:
    """Rows of one GPU type, counts ascending; stops one count past the deadline or when the batch runs out."""
    try:
        gpu.peak_flops_per_s(s.precision)
    except SpecError as err:  # e.g. fp8 on a GPU without FP8: one infeasible row, go on
        yield BudgetRow(gpu=gpu.name, num_gpus=counts[0], gpus_per_node=per_node, gbs=s.gbs_options[0],
                        feasible=False, reason=str(err), reason_code="PRECISION")
        return
    ref: BudgetRow | None = None
    met = False
    for n in counts:
        row = _evaluate_count(s, gpu, per_node, n)
        if row.feasible:
            ref = row if ref is None or _x(row) > _x(ref) else ref
            row = _with_efficiency(row, ref)
        yield row
        if met or (not row.feasible and ref is not None and row.reason_code != "OOM"):
            return  # one count past the deadline shows the marginal gain; or the batch cannot be split further
        if row.efficiency is not None and row.efficiency < STOP_EFFICIENCY:
            return
        met = bool(row.meets_deadline)


def _eff_days(row: BudgetRow) -> float:
    """Effective days for ranking (inf where failures outpace progress)."""
    return math.inf if row.effective_days is None else row.effective_days


def _nothing_fits(rows: Sequence[BudgetRow]) -> str:
    """"nothing fits" with, per GPU type, the reason at its largest swept count (the count most likely to fit), so
    the cause (memory, or a batch that cannot be split) is on the recommendation line even where a narrow table
    hides its notes column; out of memory there means more GPUs may fit (``--max-gpus``)."""
    largest: dict[str, BudgetRow] = {}
    for r in rows:
        if not r.feasible and r.reason and (r.gpu not in largest or r.num_gpus > largest[r.gpu].num_gpus):
            largest[r.gpu] = r
    reasons = [(r.reason or "") if r.gpu in (r.reason or "") else f"{r.gpu} at {r.num_gpus:,} GPUs: {r.reason}"
               for r in largest.values()]
    hint = "; more GPUs may fit (--max-gpus)" if any(r.reason_code == "OOM" for r in largest.values()) else ""
    return "nothing fits" + (f": {'; '.join(reasons)}{hint}" if reasons else "")


def _recommend(rows: Sequence[BudgetRow], gpu_names: Sequence[str], days: float | None) -> dict[str, Any]:
    per_gpu: dict[str, BudgetRow | None] = {}
    for name in gpu_names:
        feas = [r for r in rows if r.gpu == name and r.feasible]
        if days is not None:
            per_gpu[name] = next((r for r in feas if r.meets_deadline), None)
        else:
            paying = [r for r in feas if r.scaling_pays]
            per_gpu[name] = paying[-1] if paying else (feas[0] if feas else None)
    rule = ("smallest count meeting the deadline" if days is not None else
            f"largest count where scaling still pays (efficiency >= {EFFICIENCY_FLOOR:.0%}, micro-batches >= PP)")
    picks = [r for r in per_gpu.values() if r is not None]
    priced = [r for r in picks if r.cost_usd is not None]
    note = ""
    if priced:
        overall: BudgetRow | None = min(priced, key=lambda r: (r.cost_usd, _eff_days(r)))
        basis = "cheapest"
        if len(priced) < len(picks):
            note = "GPUs without a price are not compared on cost"
    elif picks:
        overall, basis = min(picks, key=lambda r: (_eff_days(r), r.num_gpus)), "fastest"
    else:
        feas_all = [r for r in rows if r.feasible]
        overall = min(feas_all, key=lambda r: (_eff_days(r), r.num_gpus)) if feas_all else None
        basis = "fastest"
        note = ("no count meets the deadline; the fastest configuration is shown" if feas_all and days is not None
                else "" if feas_all else _nothing_fits(rows))
    return {"per_gpu": {k: (v.to_dict() if v else None) for k, v in per_gpu.items()}, "per_gpu_rule": rule,
            "overall": overall.to_dict() if overall else None, "basis": basis, "note": note}


def _resilience_notes(s: _Sweep) -> list[str]:
    """What the goodput and checkpoint columns assume."""
    notes: list[str] = []
    fail = s.failures
    notes.append(f"goodput: {fail.failure_rate_per_gpu_hour:.3g} failures per GPU-hour"
                 + (" (Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100)"
                    if fail.failure_rate_per_gpu_hour == DEFAULT_FAILURE_RATE_PER_GPU_HOUR else "")
                 + f", restart = {fail.requeue_s:g} s requeue + checkpoint load, Young/Daly save interval; "
                 "effective days = days / goodput" + ("; cost on effective GPU-hours" if s.prices else ""))
    if s.storage.aggregate_bytes_per_s is None:
        notes.append(f"checkpoint storage: {DEFAULT_STORAGE_BYTES_PER_S_PER_GPU / GB:.3f} GB/s per GPU by default "
                     "(Llama 3's 2 TB/s over 16,384 GPUs); set storage_gbps, storage_gbps_per_node and "
                     "host_memory_gb_per_node in a --site file")
    return notes


def budget(model: ModelSpec, gpus: Sequence[GpuSpec], *, tokens: float, seq_len: int = 4096, gbs: int | None = None,
           max_gbs: int | None = None, days: float | None = None, num_gpus: int | None = None,
           prices: dict[str, float] | None = None, gpus_per_node: dict[str, int] | None = None,
           precision: str = "bf16", space: SearchSpace | None = None, max_gpus: int = MAX_GPUS,
           progress: Progress | None = None, storage: StorageSpec | None = None,
           failures: FailureSpec | None = None, headroom: Headroom | None = None) -> BudgetResult:
    """Sweep GPU counts per GPU type, best layout each, time/cost to train ``tokens``; recommend.

    ``gbs`` is fixed unless ``max_gbs`` is given: then each count uses the smallest of gbs x 2^k <= max_gbs
    within 2% of the best throughput (the batch grows with DP only where it pays). ``progress(done, total)``
    is called after each point. ``storage`` and ``failures`` (site file; defaults in ``paraplan.checkpoint`` and
    ``paraplan.goodput``) set checkpoint save times and the failure rate; ``headroom`` the memory margin a
    layout keeps free (None: the memory model's error band, ``paraplan.headroom``).
    """
    if not gpus:
        raise SpecError("budget: at least one GPU type is needed")
    if not math.isfinite(tokens) or tokens <= 0:
        raise SpecError(f"tokens must be > 0, got {tokens}")
    if days is not None and (not math.isfinite(days) or days <= 0):
        raise SpecError(f"days must be > 0, got {days}")
    if num_gpus is not None and num_gpus < 1:
        raise SpecError(f"num_gpus must be a positive integer, got {num_gpus}")
    base = gbs if gbs is not None else default_gbs(seq_len)
    TrainingSpec(seq_len=seq_len, global_batch_size=base, precision=precision)  # type: ignore[arg-type]
    if max_gbs is not None and max_gbs < base:
        raise SpecError(f"max_gbs ({max_gbs}) must be >= gbs ({base})")
    options = [base]
    while max_gbs is not None and options[-1] * 2 <= max_gbs:
        options.append(options[-1] * 2)
    max_positions, _ = max_positions_for(model, TrainingSpec(seq_len=seq_len, global_batch_size=base))
    counts_p = model_param_counts(model, max_positions=max_positions)
    s = _Sweep(model=model, tokens=tokens, seq_len=seq_len, gbs_options=tuple(options), precision=precision,
               space=space, params=counts_p.active_per_token, days=days, prices=dict(prices or {}),
               storage=storage or StorageSpec(), failures=failures or FailureSpec(), headroom=headroom)
    plan_counts = [(g, (gpus_per_node or {}).get(g.name, g.gpus_per_node)) for g in gpus]
    sweeps = [(g, pn, [num_gpus] if num_gpus else sweep_counts(pn, max_gpus)) for g, pn in plan_counts]
    total, done = sum(len(c) for _, _, c in sweeps), 0
    rows: list[BudgetRow] = []
    for gpu, per_node, counts in sweeps:
        start = done
        for row in _sweep_gpu(s, gpu, per_node, counts):
            rows.append(row)
            done += 1
            if progress:
                progress(done, total)
        done = start + len(counts)  # counts skipped after an early stop
    if progress:
        progress(done, total)
    names = [g.name for g in gpus]
    notes = [f"GBS {base} sequences x seq {seq_len} = {base * seq_len / 1e6:.2f}M tokens per step"
             + (" (default: ~4M tokens)" if gbs is None else "")]
    if not num_gpus:
        past = "one count past the first meeting the deadline, " if days else ""
        notes.append(f"each GPU type's sweep stops {past}when the GBS cannot be split further or below "
                     f"{STOP_EFFICIENCY:.0%} efficiency, else at {max_gpus:,} GPUs")
    if max_gbs is not None:
        notes.append(f"GBS may grow with DP up to {max_gbs} (the smallest within {GBS_TOLERANCE:.0%} of the best "
                     f"throughput is used): {CONVERGENCE_NOTE}")
    notes += _resilience_notes(s)
    if model.is_moe:
        notes.append("closed_form_days uses the active parameters per token" + (
            "" if space is None or space.allow_cross_node else "; EP groups stay inside one NVLink domain "
            "(--nvlink-only); large MoE runs use cross-node EP"))
    return BudgetResult(model=model.name, tokens=tokens, seq_len=seq_len, gbs=base, max_gbs=max_gbs,
                        deadline_days=days, params=counts_p.active_per_token, rows=tuple(rows),
                        recommendation=_recommend(rows, names, days), notes=tuple(notes))
