"""Layout search: enumerate Megatron-Core layouts as numpy columns, reject with reasons, rank.

    candidates (LayoutTable)  ->  rule masks (paraplan.rules)   -> rejections counted per reason
                              ->  memory of stages 0, 1, p-1    -> OOM rejections
                              ->  step time (same formulas)     -> ranking (deterministic)
                              ->  top K re-estimated through the scalar path (all stages)

Every candidate is counted once, under the first reason it fails (rule order, then placement,
then memory). Ranking sorts by the objective rounded to 1e-9 relative and then by a simplicity
key (fewer parallel axes, smaller TP, PP, ...), so it does not depend on enumeration order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray

from paraplan.errors import Field, LayoutError, NoFeasiblePlanError, SpecError
from paraplan.estimate.comm import span_in_domain
from paraplan.estimate.memory import MemoryOptions, layer_activations, stage_memory
from paraplan.estimate.params import ParamTerms, param_terms
from paraplan.estimate.pipeline import auto_uneven_split, first_last_chunk_counts
from paraplan.estimate.stages import (
    PipelineCounts,
    bf16_layers_of,
    pipeline_counts,
    representative_ranks,
    stage_layers_table,
)
from paraplan.estimate.step_time import stage_terms, step_time_from_stages
from paraplan.estimate.time import fsdp
from paraplan.estimator import Estimate, estimate, max_positions_for
from paraplan.headroom import DEFAULT_HEADROOM, NO_HEADROOM, Headroom
from paraplan.layout import RECOMPUTE_CODES, LayerKeyTable, LayoutTable, distinct_rows, layer_key_table
from paraplan.ranking import (
    MODEL_STATE_BINDS_FRAC,
    RankContext,
    coarse_columns,
    decided_by,
    memory_tie_step_bytes,
    pack,
    rounded_step,
    simpler_columns,
    sort_keys,
    tier_tolerance,
    tier_tolerance_source,
    tier_uppers,
)
from paraplan.rules import RuleContext, knob_violations, rules_for
from paraplan.schedules import NOT_IN_MEGATRON, schedule_named
from paraplan.specs.cluster import MAX_NUM_GPUS, ClusterSpec
from paraplan.specs.grid import Grid
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import KNOB_FLAGS, TrainingSpec
from paraplan.units import GIB

Objective = Literal["throughput", "memory-headroom"]
DP_VARIANTS = ("distopt", "fsdp", "ddp")
MEMORY_HEADROOM_MAX_LOSS = 0.05
"""``--objective memory-headroom``: the most free memory among layouts within this throughput loss of the best."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Values each axis may take (None: everything Megatron allows)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    dp_variants: tuple[str, ...] = ("distopt", "fsdp")
    sequence_parallel: tuple[bool, ...] = (True,)
    max_pp: int | None = None
    allow_cross_node: bool = True
    """Let CP and EP groups span NVLink domains, costed on the network (large MoE runs need EP
    beyond a node); False keeps them inside one domain."""
    tp_comm_overlap: bool = False
    """--tp-comm-overlap on every layout with sequence parallelism in effect; dropped where it is not (TP 1 or SP
    off), as Megatron-Bridge's CommOverlapConfig does (training/comm_overlap.py: "Disabling tensor parallel
    communication overlap due to TP size < 2"): Megatron-LM's validate_args refuses it there."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """Modules the selective-recompute layouts recompute (Megatron's --recompute-modules)."""
    schedule: str = ""
    """Pipeline schedule of every layout (``paraplan.schedules``; "" = Megatron's choice from VP)."""
    fsdp_everywhere: bool = False
    """Search Megatron-FSDP on every layout; False keeps it to the combinations NVIDIA runs
    (``estimate.time.fsdp.benchmarked``; the others are rejected as FSDP_NOT_BENCHMARKED)."""


MAX_WORLD = MAX_NUM_GPUS
"""Largest world size the search takes: its divisors come from trial division up to sqrt(world)."""
MAX_LAYERS = 1_000_000
"""Most decoder layers the search takes (its pipeline splits are linear in the layer count)."""
MAX_LAYOUTS = 2_000_000
"""Largest search space (layouts before the rules): the table and its rule masks stay in memory."""
EVAL_CHUNK_ROWS = 1 << 18
"""Rows evaluated together: bounds the memory of the formulas' temporaries on large spaces."""


def _prime_factors(n: int) -> dict[int, int]:
    """Prime factorisation of n >= 1 by trial division (at most sqrt(n) / 2 divisions)."""
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _divisors(n: int) -> list[int]:
    """All divisors of n >= 1, ascending, from its prime factorisation."""
    divs = [1]
    for prime, power in _prime_factors(n).items():
        divs = [d * prime**k for d in divs for k in range(power + 1)]
    return sorted(divs)


def _check_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: SearchSpace) -> None:
    """One-line SpecErrors for search values no layout can use and that would cost time or memory, or
    overflow the int64 columns. (TP, PP, CP above the world size are only dropped: they never make a
    row, see ``_axis_values``; callers such as ``tune`` step past the world.)"""
    world = cluster.num_gpus
    schedule_named(space.schedule)  # SpecError naming the schedules
    if space.schedule == "combined_1f1b" and not model.is_moe:
        raise SpecError.naming(Field("schedule"), " combined_1f1b: overlap_moe_expert_parallel_comm is only supported "
                               f"with expert model parallelism, and {model.name} has no experts")
    if model.num_layers > MAX_LAYERS:
        raise SpecError(f"num_layers: at most {MAX_LAYERS:,} for the search, got {model.num_layers:,}")
    if world > MAX_WORLD:
        raise SpecError.naming(Field("num_gpus"), f": at most {MAX_WORLD:,} (2^40) GPUs for the search, got {world:,}")
    mbs_hi = max(training.global_batch_size, 64)
    bounds = {"tp": (1, None, ""), "pp": (1, None, ""), "cp": (1, None, ""),
              "ep": (1, world, "the number of GPUs"), "etp": (0, world, "the number of GPUs; 0 = TP"),
              "vp": (1, model.num_layers, f"num_layers of {model.name}"),
              "mbs": (1, mbs_hi, "the global batch size, or 64")}
    for name, (lo, hi, what) in bounds.items():
        values = getattr(space, name)
        bad = [v for v in values or () if isinstance(v, bool) or not isinstance(v, int | np.integer)
               or v < lo or (hi is not None and v > hi)]
        if bad:
            allowed = f"allowed {lo} to {hi:,} ({what})" if hi is not None else f"allowed {lo} or more"
            raise SpecError.naming(Field(name), f": {bad[0]} is out of range; {allowed}")
    if mbs_hi * world >= 2**63:  # micro-batch x DP in int64
        raise SpecError.naming(Field("global_batch_size"), f": {training.global_batch_size:,} on {world:,} GPUs is too "
                               "large for the search (GBS x GPUs must stay below 2^63)")
    if space.max_pp is not None and (isinstance(space.max_pp, bool) or not isinstance(space.max_pp, int | np.integer)
                                     or space.max_pp < 1):
        raise SpecError.naming(Field("max_pp"), f": expected a positive integer, got {space.max_pp!r}")


def _unique(values: Iterable[Any]) -> list[Any]:
    """Values without repeats, in their order (a repeated value would enumerate layouts twice)."""
    return list(dict.fromkeys(values))


def _axis_values(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 space: SearchSpace) -> dict[str, list[int]]:
    world = cluster.num_gpus
    pow2 = [2**i for i in range(12) if 2**i <= world]
    # TP, PP, CP above the world never divide it: dropped here (no row, no overflow of their product)
    tp = (_unique(t for t in space.tp if t <= world) if space.tp
          else [t for t in pow2 if t <= cluster.nvlink_domain_size])
    max_pp = min(space.max_pp or model.num_layers, model.num_layers, world)
    pp = _unique(p for p in space.pp if p <= world) if space.pp else [p for p in _divisors(world) if p <= max_pp]
    sched = schedule_named(space.schedule)
    vp = _unique(space.vp) if space.vp else [v for v in (1, 2, 3, 4, 6, 8) if sched.allows_vp(v)]
    cp = (_unique(c for c in space.cp if c <= world) if space.cp
          else [c for c in pow2 if (c <= 32 and training.seq_len % (2 * c) == 0) or c == 1])
    if model.is_moe:
        assert model.num_experts is not None
        ep = _unique(space.ep) if space.ep else [e for e in _divisors(model.num_experts) if e <= world]
        etp = _unique(space.etp) if space.etp else [1] + [t for t in tp if t > 1]
    else:
        ep, etp = [1], [0]
    return {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": etp}


def candidate_table(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    space: SearchSpace) -> LayoutTable:
    """Every combination of the axes whose TP x PP x CP divides the world (DP derived)."""
    world = cluster.num_gpus
    ax = _axis_values(model, cluster, training, space)
    grid = np.array(list(itertools.product(ax["tp"], ax["pp"], ax["cp"])), dtype=np.int64).reshape(-1, 3)
    grid = grid[world % (grid[:, 0] * grid[:, 1] * grid[:, 2]) == 0]
    rec_codes = [RECOMPUTE_CODES[r] for r in _unique(space.recompute)]
    dpv = [DP_VARIANTS.index(v) for v in _unique(space.dp_variants)]
    rest_axes = (ax["vp"], ax["ep"], ax["etp"], _unique(space.mbs), rec_codes, dpv,
                 _unique([int(s) for s in space.sequence_parallel]))
    n_product = len(grid) * int(np.prod([len(a) for a in rest_axes]))
    if n_product > 16 * MAX_LAYOUTS:  # before the VP/ETP filter below, which holds one bool per combination
        _too_many(n_product, len(grid), rest_axes)
    rest = np.array(list(itertools.product(*rest_axes)), dtype=np.int64).reshape(-1, 7)
    # rows are (grid row, rest row) pairs in row-major order; filter on that 2-D view, then gather
    g_tp, g_pp, g_cp = (np.ascontiguousarray(grid[:, k]) for k in range(3))
    r_vp, r_ep, r_etp, r_mbs, r_rec, r_dpv, r_sp = (np.ascontiguousarray(rest[:, k]) for k in range(7))
    keep = np.broadcast_to((r_vp == 1)[None, :] | (g_pp > 1)[:, None], (len(grid), len(rest)))  # VP needs PP
    if model.is_moe:  # ETP 1 (folding) or = TP (Megatron's default)
        keep = keep & (((r_etp == 0) | (r_etp == 1))[None, :] | (r_etp[None, :] == g_tp[:, None]))
    sel = np.flatnonzero(keep)
    if len(sel) > MAX_LAYOUTS:
        _too_many(len(sel), len(grid), rest_axes)
    gi, ri = np.divmod(sel, max(len(rest), 1))
    tp, pp, cp, vp = g_tp[gi], g_pp[gi], g_cp[gi], r_vp[ri]
    etp = np.where(r_etp[ri] == 0, tp, r_etp[ri])
    dpv_col = r_dpv[ri]
    sp_col = r_sp[ri].astype(bool)
    return LayoutTable(
        tp=tp, pp=pp, vp=vp, cp=cp, ep=r_ep[ri], etp=etp,
        dp=(world // (g_tp * g_pp * g_cp))[gi], mbs=r_mbs[ri], recompute_code=r_rec[ri],
        sequence_parallel=sp_col,
        distributed_optimizer=dpv_col == DP_VARIANTS.index("distopt"),
        fsdp=dpv_col == DP_VARIANTS.index("fsdp"),
        overlap_grad_reduce=np.ones(len(sel), dtype=bool),
        overlap_param_gather=dpv_col != DP_VARIANTS.index("ddp"),
        tp_comm_overlap=np.full(len(sel), space.tp_comm_overlap) & sp_col & (tp > 1),  # SearchSpace.tp_comm_overlap
        pipeline_layouts=uneven_layouts(model, pp, vp), recompute_modules=space.recompute_modules,
        schedule=space.schedule,
    )


def _too_many(n_layouts: int, n_grid: int, rest_axes: tuple[list[int], ...]) -> None:
    sizes = " x ".join(f"{len(a)} {k}" for k, a in zip(("vp", "ep", "etp", "mbs", "recompute", "dp-variant"),
                                                       rest_axes, strict=False))
    raise SpecError(f"search space too large: {n_layouts:,} layouts (from {n_grid} TP x PP x CP x {sizes}), at "
                    f"most {MAX_LAYOUTS:,}; narrow --tp/--pp/--cp/--vp/--ep/--mbs")


def uneven_layouts(model: ModelSpec, pp: NDArray[np.int64],
                   vp: NDArray[np.int64]) -> dict[tuple[int, int], tuple[int, ...]]:
    """Balanced per-virtual-stage layer counts for every (pp, vp) whose layers do not divide:
    Megatron accepts them through --decoder-first/last-pipeline-num-layers or
    --pipeline-model-parallel-layout (DeepSeek-V3's 61 layers, Qwen3-235B's 94, Llama-3.1's 126)."""
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    (pair_pp, pair_vp), _ = distinct_rows([pp, vp])
    for p, v in zip(pair_pp.tolist(), pair_vp.tolist(), strict=True):
        if p < 2 or model.num_layers % (p * v) == 0:
            continue
        if p * v > model.num_layers + 2:
            continue  # fewer layers (with embedding and loss) than virtual stages: the rules reject these rows
        try:
            split = auto_uneven_split(model.num_layers, p, v)
        except LayoutError:
            continue  # too few layers for that many virtual stages: the rules reject these rows
        if len(split) == 2 and p * v > 2:  # --decoder-first/last-pipeline-num-layers, as chunk counts
            split = first_last_chunk_counts(model.num_layers, p, v, *split)
        out[(p, v)] = tuple(split)
    return out


@dataclass(frozen=True, slots=True)
class Evaluated:
    """Vectorised results for the candidates that pass every rule."""

    table: LayoutTable
    peak_bytes: NDArray[np.float64]
    step_s: NDArray[np.float64]
    tokens_per_s_per_gpu: NDArray[np.float64]
    fits: NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class _Groups:
    """What the memory and the time passes share about a table's rows: pipeline counts and
    representative ranks per (PP, VP), per-layer keys, parameter terms per (TP, PP, EP, ETP)."""

    counts: PipelineCounts
    ranks: list[NDArray[np.int64]]
    keys: LayerKeyTable
    key_of_row: NDArray[np.int64]
    params: ParamTerms
    params_of_row: NDArray[np.int64]

    @classmethod
    def of(cls, model: ModelSpec, training: TrainingSpec, table: LayoutTable) -> _Groups:
        max_positions, _ = max_positions_for(model, training)
        counts = pipeline_counts(model, table.pp, table.vp, table.pipeline_layouts, bf16_layers_of(training))
        keys, key_of_row = layer_key_table(table)
        (tp, pp, ep, etp), params_of_row = distinct_rows([table.tp, table.pp, table.ep, table.etp])
        return cls(counts=counts, ranks=representative_ranks(model, table.pp, table.vp, counts=counts),
                   keys=keys, key_of_row=key_of_row,
                   params=param_terms(model, tp=tp, pp=pp, ep=ep, etp=etp, max_positions=max_positions),
                   params_of_row=params_of_row)

    def take(self, rows: NDArray[np.int64]) -> _Groups:
        """The same groups for the rows ``rows`` of the table."""
        return _Groups(counts=self.counts.take(rows), ranks=[r[rows] for r in self.ranks], keys=self.keys,
                       key_of_row=self.key_of_row[rows], params=self.params, params_of_row=self.params_of_row[rows])


def peak_bytes_table(model: ModelSpec, training: TrainingSpec, table: LayoutTable,
                     options: MemoryOptions | None = None, *, groups: _Groups | None = None,
                     arch: str = "hopper") -> NDArray[np.float64]:
    """Peak per-GPU memory of every row: the largest of the representative stages (``arch``: the GPU's)."""
    max_positions, _ = max_positions_for(model, training)
    g = groups if groups is not None else _Groups.of(model, training, table)
    ranks = np.stack(g.ranks, axis=1)
    # evaluate each distinct (row, rank) once: PP = 1 rows need one stage, PP = 2 rows two
    ranks = np.sort(ranks, axis=1)
    distinct = np.ones(ranks.shape, dtype=bool)
    distinct[:, 1:] = ranks[:, 1:] != ranks[:, :-1]
    rows, cols = np.nonzero(distinct)
    rank = ranks[rows, cols]
    sub = table.take(rows)
    m = training.global_batch_size // (sub.mbs * sub.dp)
    # per-layer terms once per distinct (TP, CP, EP, ETP, mbs, recompute, SP) and gathered
    per_layer = layer_activations(model, training, g.keys).take(g.key_of_row[rows])
    stages = stage_layers_table(model, sub.pp, sub.vp, rank, counts=g.counts.take(rows), schedule=sub.schedule)
    totals = np.asarray(stage_memory(model, training, sub, stages, rank=rank, num_microbatches=m,
                                     max_positions=max_positions, options=options, per_layer=per_layer,
                                     param_terms=g.params.take(g.params_of_row[rows]), arch=arch).memory.total_bytes,
                        dtype=float)
    # rows ascend and every row has at least one stage: the maximum over each row's run
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    return np.maximum.reduceat(totals, starts) if len(totals) else np.full(len(table), -np.inf)


def step_s_table(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 table: LayoutTable, *, groups: _Groups | None = None) -> NDArray[np.float64]:
    """Step time of every row (slowest of the representative stages).

    A stage whose rank repeats an earlier one of the same row (all of them at PP = 1) changes
    neither the slowest stage (the first maximum) nor the DP maxima, so rows are grouped by which
    of their representative ranks are new and each group is timed on those stages only."""
    max_positions, _ = max_positions_for(model, training)
    m = training.global_batch_size // (table.mbs * table.dp)
    g = groups if groups is not None else _Groups.of(model, training, table)
    ranks = np.stack(g.ranks, axis=1)
    repeat = np.zeros(len(table), dtype=np.int64)
    for j in range(1, ranks.shape[1]):
        repeat |= (ranks[:, :j] == ranks[:, j:j + 1]).any(axis=1).astype(np.int64) << j
    terms = stage_terms(model, cluster, training, g.keys)
    step = np.empty(len(table))
    (patterns,), group_of_row = distinct_rows([repeat])
    for k, pattern in enumerate(patterns.tolist()):
        idx = np.flatnonzero(group_of_row == k) if len(patterns) > 1 else np.arange(len(table))
        sub = table.take(idx) if len(patterns) > 1 else table
        sub_counts = g.counts.take(idx)
        stages = [stage_layers_table(model, sub.pp, sub.vp, ranks[idx, j], counts=sub_counts,
                                      schedule=sub.schedule)
                  for j in range(ranks.shape[1]) if not (pattern >> j) & 1]
        t = step_time_from_stages(model, cluster, training, sub, stages, num_microbatches=m[idx],
                                  max_positions=max_positions, terms=terms.take(g.key_of_row[idx]),
                                  params=g.params.take(g.params_of_row[idx]))
        step[idx] = np.asarray(t.step_s, dtype=float)
    return step


def evaluate_table(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, table: LayoutTable,
                   options: MemoryOptions | None = None, *, time_all: bool = True,
                   margin_bytes: float = 0.0) -> Evaluated:
    """Peak memory and step time of every row, vectorised. A row fits when its peak plus
    ``margin_bytes`` stays within usable memory. With ``time_all=False`` only rows that
    fit are timed (the others get an infinite step time): the search's fast path. Large tables are
    evaluated ``EVAL_CHUNK_ROWS`` rows at a time (rows are independent: the same numbers)."""
    if len(table) > EVAL_CHUNK_ROWS:
        chunks = [np.arange(i, min(i + EVAL_CHUNK_ROWS, len(table))) for i in range(0, len(table), EVAL_CHUNK_ROWS)]
        parts = [evaluate_table(model, cluster, training, table.take(c), options, time_all=time_all,
                                margin_bytes=margin_bytes) for c in chunks]
        return Evaluated(table=table, peak_bytes=np.concatenate([p.peak_bytes for p in parts]),
                         step_s=np.concatenate([p.step_s for p in parts]),
                         tokens_per_s_per_gpu=np.concatenate([p.tokens_per_s_per_gpu for p in parts]),
                         fits=np.concatenate([p.fits for p in parts]))
    groups = _Groups.of(model, training, table)
    peak = peak_bytes_table(model, training, table, options, groups=groups, arch=cluster.gpu.arch)
    usable = cluster.gpu.usable_bytes
    fits = peak + margin_bytes <= usable
    if time_all:
        step = step_s_table(model, cluster, training, table, groups=groups)
    else:
        step = np.full(len(table), np.inf)
        idx = np.nonzero(fits)[0]
        if len(idx):
            step[idx] = step_s_table(model, cluster, training, table.take(idx), groups=groups.take(idx))
    return Evaluated(table=table, peak_bytes=peak, step_s=step,
                     tokens_per_s_per_gpu=training.tokens_per_step / (step * cluster.num_gpus), fits=fits)


def simplicity_key(table: LayoutTable) -> list[NDArray[np.int64]]:
    """Tie-break columns, most significant first: fewer axes > 1, then smaller TP, PP, VP, CP, EP..."""
    axes = ((table.tp > 1).astype(int) + (table.pp > 1) + (table.vp > 1) + (table.cp > 1) + (table.ep > 1))
    return [axes, table.tp, table.pp, table.vp, table.cp, table.ep, table.etp, -table.mbs,
            table.recompute_code, table.fsdp.astype(int), (~table.sequence_parallel).astype(int)]


@dataclass(frozen=True, slots=True)
class Plan:
    """Ranked feasible layouts and why the others were rejected."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    objective: str
    candidates: tuple[Estimate, ...]
    rejections: dict[str, int]
    rejection_examples: dict[str, str]
    num_evaluated: int
    num_feasible: int
    feasible: Evaluated | None = None
    notes: tuple[str, ...] = field(default=())
    space: SearchSpace | None = None
    """The search space the plan was made with (None for plans read back from plan.json)."""
    headroom: Headroom = DEFAULT_HEADROOM
    """The memory margin a layout had to keep free to count as fitting."""
    tiers: tuple[int, ...] = ()
    """Step-time tier of each candidate (``paraplan.ranking``; 1 = the fastest's)."""
    decided_by: tuple[str, ...] = ()
    """The rule that ranked each candidate before the next one (a ``paraplan.ranking.RULES`` code; "" for the
    last layout that fits)."""
    ranking: RankContext | None = None
    """The ranking's tolerance and rules (None for plans read back from plan.json)."""

    @property
    def usable_bytes(self) -> float:
        """Usable memory per GPU (HBM less the reserved part)."""
        return float(self.cluster.gpu.usable_bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON: candidates best first, rejections per reason."""
        return {
            "objective": self.objective,
            "num_evaluated": self.num_evaluated,
            "num_feasible": self.num_feasible,
            "headroom": self.headroom.as_dict(self.usable_bytes),
            "candidates": [
                {"rank": i + 1, **{k: v for k, v in c.to_dict().items()
                                   if k in ("config", "placement", "memory", "time", "throughput", "notes")},
                 **({"tier": self.tiers[i], "decided_by": self.decided_by[i]} if i < len(self.tiers) else {})}
                for i, c in enumerate(self.candidates)
            ],
            **({"ranking": self.ranking.as_dict()} if self.ranking is not None else {}),
            "rejections": dict(sorted(self.rejections.items(), key=lambda kv: -kv[1])),
            "rejection_examples": self.rejection_examples,
            "notes": list(self.notes),
        }


def _placement_masks(cluster: ClusterSpec, table: LayoutTable, space: SearchSpace) -> dict[str, Any]:
    block = cluster.nvlink_block_gpus
    if space.allow_cross_node:
        return {}
    # the same placement rule the cost model uses (comm.span_in_domain): a group stays on NVLink
    # when its rank span tiles the domain
    grid = Grid.of(table)
    return {"CP_CROSSES_NVLINK": (table.cp > 1) & ~span_in_domain(grid.cp_group.span, block),
            "EP_CROSSES_NVLINK": (table.ep > 1) & ~span_in_domain(grid.ep_group.span, block)}


RecipeLayouts = tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]
"""``ranking.RECIPE_FIELDS`` of the NVIDIA recipes for a job, and their names (``recipes.compare.job_recipe_layouts``
makes them: the search layer does not read the recipe library)."""


def rank_context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, ev: Evaluated,
                 options: MemoryOptions | None = None, recipes: RecipeLayouts = ((), ())) -> RankContext:
    """The ranking's context for the feasible rows ``ev``: the tier tolerance, the free-memory step, whether model
    state binds (``ranking.MODEL_STATE_BINDS_FRAC``, judged on the fastest distributed-optimizer layout of tier 1,
    estimated through the scalar path, only when tier 1 also has Megatron-FSDP layouts) and the recipe layouts."""
    tol = tier_tolerance(model)
    ctx = RankContext(tier_tolerance=tol, memory_step_bytes=memory_tie_step_bytes(float(cluster.gpu.usable_bytes),
                                                                                     model.is_moe),
                      tolerance_source=tier_tolerance_source(model))
    ctx = replace(ctx, recipe_layouts=recipes[0], recipe_names=recipes[1])
    best = float(np.min(ev.step_s))
    tier1 = ev.step_s <= best * (1.0 + tol)
    dist = np.flatnonzero(tier1 & ~ev.table.fsdp & ev.table.distributed_optimizer)
    if not len(dist) or not (tier1 & ev.table.fsdp).any():
        return ctx
    sub = ev.table.take(dist)
    i = int(dist[np.lexsort([*reversed(simpler_columns(sub)), rounded_step(ev.step_s)[dist]])[0]])
    est = estimate(model, cluster, training, ev.table.row(i), memory_options=options)
    mem = est.stages[est.peak_stage].memory
    frac = float(mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes) / float(mem.total_bytes)
    return replace(ctx, model_state_frac=frac, prefer_fsdp=frac >= MODEL_STATE_BINDS_FRAC)


def plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, space: SearchSpace | None = None,
         objective: Objective = "throughput", top_k: int = 5, options: MemoryOptions | None = None,
         headroom: Headroom | None = None, recipes: RecipeLayouts = ((), ()), advise_gpu_counts: bool = True) -> Plan:
    """Search the layout space; raise NoFeasiblePlanError (with rejection counts) if nothing fits.

    When nothing fits for memory, the advice's GPU count is the smallest count that fits by searching larger
    counts the same way (``gpus_that_fit``); ``advise_gpu_counts=False`` leaves that search out (its own calls).

    A layout fits when its peak plus the ``headroom`` margin (default: the memory model's error band,
    ``paraplan.headroom``) stays within usable memory; those that fit only inside the margin are
    rejected as OOM_MARGIN, those above usable memory as OOM. ``recipes``: the layouts of NVIDIA recipes for
    this job, for the ranking's ``nvidia_recipe`` rule (``recipes.compare.job_recipe_layouts``)."""
    space = space or SearchSpace()
    headroom = (headroom if headroom is not None else DEFAULT_HEADROOM).for_model(model.is_moe)
    headroom.check_range(cluster.gpu.usable_bytes, cluster.gpu.name)
    cluster.gpu.peak_flops_per_s(training.precision)
    if (training.precision == "fp8" and training.fp8_recipe == "delayed" and "selective" in space.recompute
            and {"moe_act", "layernorm"} & set(space.recompute_modules)):  # launch_violations FP8_DELAYED_RECOMPUTE
        raise SpecError.naming(Field("recompute_modules"), ": Delayed scaling does not support moe_act and layernorm "
                               "recompute for fp8.")
    _check_space(model, cluster, training, space)
    table = candidate_table(model, cluster, training, space)
    n_total = len(table)
    if n_total == 0:
        given: list[str] = []  # the axes given, each as its field and values ("tp 3 pp 2,4")
        for k in ("tp", "pp", "cp"):
            if getattr(space, k):
                given += [" "] * bool(given) + [Field(k), f" {','.join(map(str, getattr(space, k)))}"]
        raise SpecError.naming("no layout to search: ", *(given or [Field("space")]), " leaves no TP x PP x CP "
                               f"that divides the {cluster.num_gpus} GPUs (world size must be TP x PP x CP x DP)")
    ctx = RuleContext(model=model, training=training, cluster=cluster, layout=table)
    alive = np.ones(n_total, dtype=bool)
    rejections: dict[str, int] = {}
    examples: dict[str, str] = {}
    masks: list[tuple[str, NDArray[np.bool_], Callable[[RuleContext], str] | None]] = [
        (r.code, np.broadcast_to(np.asarray(r.violated(ctx), dtype=bool), (n_total,)), r.message)
        for r in rules_for(schedule_named(space.schedule))]
    masks += [(code, np.broadcast_to(np.asarray(mask, dtype=bool), (n_total,)), None)
              for code, mask in _placement_masks(cluster, table, space).items()]
    knob_rules = knob_masks(model, training, table, cluster.gpu.arch)
    masks += knob_rules
    if not space.fsdp_everywhere:
        masks.append(("FSDP_NOT_BENCHMARKED",
                      table.fsdp & ~fsdp.benchmarked(table.tp, table.pp, table.cp, cluster.gpu.arch),
                      lambda c: f"{c.layout.short()}: Megatron-FSDP is searched by default only at {fsdp.FSDP_SCOPE}"))
    for code, mask, msg in masks:
        hit = alive & mask
        count = int(hit.sum())
        if count:
            rejections[code] = count
            i = int(np.argmax(hit))
            row = table.row(i)
            examples[code] = (msg(RuleContext(model=model, training=training, cluster=cluster, layout=row))
                              if msg is not None else f"{row.short()}: group spans more than one NVLink domain "
                                          f"({cluster.nvlink_domain_size} GPUs)")
            alive &= ~mask
    valid = table.take(np.nonzero(alive)[0])
    usable = float(cluster.gpu.usable_bytes)
    margin = headroom.margin_bytes(usable)
    ev = (evaluate_table(model, cluster, training, valid, options, time_all=False, margin_bytes=margin)
          if len(valid) else None)
    if ev is not None and (~ev.fits).any():
        _count_oom(valid, ev, usable, headroom, rejections, examples)
    if ev is None or not ev.fits.any():
        smallest = None
        if ev is not None and len(valid):
            i = int(np.argmin(ev.peak_bytes))
            smallest = (valid.row(i), float(ev.peak_bytes[i]))
            key = "OOM" if smallest[1] > usable else "OOM_MARGIN"
            examples[key] = f"smallest footprint {examples[key]}"
        hint = "OOM" if smallest is None or smallest[1] > usable else "OOM_MARGIN"
        summary = _no_fit_message(model, cluster, training, rejections, examples, hint=hint)
        advice = knob_rule_tip(model, training, cluster.gpu.arch, table, masks, {c for c, _, _ in knob_rules},
                               rejections, examples, valid=len(valid)) or fit_advice(
            cluster, space, smallest, headroom, gpus_that_fit(model, cluster, training, space, options, headroom)
            if advise_gpu_counts and smallest is not None else None)
        raise NoFeasiblePlanError(f"{summary}; {advice_text(advice)}", rejections=rejections, summary=summary,
                                  advice=advice, examples=examples, num_evaluated=n_total,
                                  smallest=None if smallest is None else (smallest[0].short(), smallest[1]))
    fit_idx = np.nonzero(ev.fits)[0]
    feasible = Evaluated(table=valid.take(fit_idx), peak_bytes=ev.peak_bytes[fit_idx], step_s=ev.step_s[fit_idx],
                         tokens_per_s_per_gpu=ev.tokens_per_s_per_gpu[fit_idx], fits=ev.fits[fit_idx])
    ranking = rank_context(model, cluster, training, feasible, options, recipes)
    picked, ties = _ranked_top(feasible, objective, cluster, top_k + 1, ranking)  # one more: what the last beat
    tiers, decided = ranking_of(feasible, picked, objective, cluster, ranking)
    picked, tiers, decided = picked[:top_k], tiers[:top_k], decided[:top_k]
    top = [estimate(model, cluster, training, feasible.table.row(int(i)), memory_options=options, headroom=headroom)
           for i in picked]
    notes: tuple[str, ...] = ()
    if objective == "memory-headroom":
        best = float(np.min(feasible.step_s))
        notes += (f"memory-headroom: the most free memory among layouts within {100 * MEMORY_HEADROOM_MAX_LOSS:.0f}% "
                  f"of the best throughput (step time at most {best / (1 - MEMORY_HEADROOM_MAX_LOSS):.3f} s, "
                  f"best {best:.3f} s)",)
    notes += (
        (f"{ties} layout(s) tie exactly with a listed one (same step time and peak memory, e.g. CP traded for "
         "a larger micro-batch) and are not listed; the one listed is the simplest of its tie",) if ties else ())
    sched = schedule_named(space.schedule)
    if not sched.megatron:
        notes += (f"schedule {sched.name}: {sched.title} is a what-if, {NOT_IN_MEGATRON}; the numbers say what it "
                  "would gain (launch refuses it)",)
    if rejections.get("FSDP_NOT_BENCHMARKED"):
        notes += (f"Megatron-FSDP left out of {rejections['FSDP_NOT_BENCHMARKED']:,} layouts: searched by default "
                  f"only at {fsdp.FSDP_SCOPE}; `plan --dp-variant fsdp` (SearchSpace.fsdp_everywhere) searches "
                  "it on every layout",)
    notes += (ranking.describe(),) * (objective == "throughput")
    notes += (f"fit means peak + margin <= {usable / GIB:.1f} GiB usable; {headroom.describe(usable)}",)
    return Plan(model=model, cluster=cluster, training=training, objective=objective, candidates=tuple(top),
                rejections=rejections, rejection_examples=examples, num_evaluated=n_total,
                num_feasible=len(fit_idx), feasible=feasible, notes=notes, space=space, headroom=headroom,
                tiers=tiers, decided_by=decided, ranking=ranking)


KNOB_RULE_COLUMNS: Final = ("recompute_code", "pp", "vp", "distributed_optimizer", "fsdp", "overlap_grad_reduce",
                             "overlap_param_gather")
"""The layout columns ``rules.knob_violations`` reads (the rest of what it reads is the same in every
row of a table: the schedule, the recompute modules)."""


def knob_masks(model: ModelSpec, training: TrainingSpec, table: LayoutTable,
               arch: str) -> list[tuple[str, NDArray[np.bool_], Callable[[RuleContext], str]]]:
    """The rows that break a rule of the training knobs (``rules.knob_violations``: per-layer CUDA graphs
    with full recompute, ``--overlap-param-gather-with-optimizer-step`` without VP, ...), one mask per rule code,
    each with Megatron's message for its example row: the rules are evaluated once per distinct combination of
    ``KNOB_RULE_COLUMNS``, so that launch never refuses a layout plan ranked."""
    if not len(table):
        return []
    values, group = distinct_rows([np.asarray(getattr(table, c)) for c in KNOB_RULE_COLUMNS])
    first = np.full(len(values[0]), len(table), dtype=np.int64)
    np.minimum.at(first, group, np.arange(len(table), dtype=np.int64))
    hits: dict[str, NDArray[np.bool_]] = {}
    for g, i in enumerate(first.tolist()):
        for code, _ in knob_violations(model, table.row(int(i)), training, arch):
            hits[code] = hits.get(code, np.zeros(len(table), dtype=bool)) | (group == g)

    def message(code: str) -> Callable[[RuleContext], str]:
        return lambda c: dict(knob_violations(model, c.layout, training, arch))[code]

    return [(code, mask, message(code)) for code, mask in hits.items()]


KNOB_RULE_FIELDS: Final = (*KNOB_FLAGS, "precision")
"""The TrainingSpec fields a knob rule can be lifted by (``knob_rule_tip``): the knobs and the precision."""


def knob_rule_tip(model: ModelSpec, training: TrainingSpec, arch: str, table: LayoutTable,
                  masks: Sequence[tuple[str, NDArray[np.bool_], Any]], knob_codes: set[str],
                  rejections: dict[str, int], examples: dict[str, str], *, valid: int = 0) -> tuple[FitTip, ...]:
    """The advice when the knob rules (``knob_masks``) rejected every layout the other rules leave (``valid``
    layouts were left after all rules): every knob rule that rejects one of them (most rejections first; a layout
    is counted under its first rule only, so a rule may reject layouts another one counted), Megatron's words of
    each, and the training fields set away from their default whose default lifts a rule on its first rejected
    layout. Empty when layouts were left, or when the other rules leave none either (the search space is what to
    relax)."""
    if valid or not any(rejections.get(c) for c in knob_codes):
        return ()
    left = np.ones(len(table), dtype=bool)
    for code, mask, _ in masks:
        if code not in knob_codes:
            left &= ~mask
    if not left.any():
        return ()
    hits = {code: int((left & mask).sum()) for code, mask, _ in masks if code in knob_codes}
    codes = sorted((c for c, n in hits.items() if n), key=lambda c: (-rejections.get(c, 0), -hits[c]))
    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainingSpec)}
    words: list[str] = []
    per_rule: list[tuple[str, ...]] = []
    for code in codes:
        hit = left & next(mask for c, mask, _ in masks if c == code)
        row = table.row(int(np.argmax(hit)))
        words.append(dict(knob_violations(model, row, training, arch)).get(code) or examples.get(code, ""))
        lifting: list[str] = []
        for name in KNOB_RULE_FIELDS:
            if getattr(training, name) == defaults[name]:
                continue
            try:
                lifted = replace(training, **{name: defaults[name]})
            except SpecError:  # the default does not stand alone with the other knobs
                continue
            if code not in dict(knob_violations(model, row, lifted, arch)):
                lifting.append(name)
        per_rule.append(tuple(lifting))
    knobs = tuple(dict.fromkeys(name for names in per_rule for name in names))
    return (FitTip("knob_rule", float(sum(rejections.get(c, 0) for c in codes)), rules=tuple(codes), knobs=knobs,
                   reason="; ".join(w for w in words if w), rule_knobs=tuple(per_rule) if len(codes) > 1 else ()),)


def _count_oom(valid: LayoutTable, ev: Evaluated, usable: float, headroom: Headroom,
               rejections: dict[str, int], examples: dict[str, str]) -> None:
    """Rejections of the rows that do not fit: OOM above usable memory, OOM_MARGIN within it but inside
    the margin; each with its smallest-footprint example."""
    over = ev.peak_bytes > usable
    for code, mask in (("OOM", ~ev.fits & over), ("OOM_MARGIN", ~ev.fits & ~over)):
        if not mask.any():
            continue
        rejections[code] = int(mask.sum())
        idx = np.nonzero(mask)[0]
        j = int(idx[np.argmin(ev.peak_bytes[idx])])
        need = float(ev.peak_bytes[j]) / GIB
        examples[code] = (f"{valid.row(j).short()} needs {need:.1f} GiB > {usable / GIB:.1f} GiB usable"
                          if code == "OOM" else
                          f"{valid.row(j).short()} needs {need:.1f} GiB, within {usable / GIB:.1f} GiB usable "
                          f"but inside the {headroom.describe(usable)}")


def distinct_top(ev: Evaluated, order: NDArray[np.int64], top_k: int) -> tuple[list[int], int]:
    """The first ``top_k`` of ``order`` that differ from every one before them in step time or peak
    memory (relative 1e-9), and how many exact ties were passed over on the way: such layouts do the
    same per-GPU work (CP x micro-batch, or recompute variants that cost nothing), and ``rank_order``
    already put the simplest of them first."""
    picked: list[int] = []
    seen: set[tuple[float, float]] = set()
    ties = 0
    step = np.round(ev.step_s / max(float(np.min(ev.step_s)), 1e-30), 9)  # the rounding rank_order uses
    peak_mib = np.round(ev.peak_bytes / 2**20, 3)
    for i in order:
        key = (float(step[i]), float(peak_mib[i]))
        if key in seen:
            ties += 1
            continue
        seen.add(key)
        picked.append(int(i))
        if len(picked) == top_k:
            break
    return picked, ties


def _rounded_objective(ev: Evaluated, objective: str, cluster: ClusterSpec) -> NDArray[np.float64]:
    if objective == "memory-headroom":
        # the smallest peak (most free memory) among the layouts within MEMORY_HEADROOM_MAX_LOSS of the
        # best throughput, then the others by step time (every fitting peak is below the HBM: < 1 < 2)
        best = float(np.min(ev.step_s))
        near = ev.step_s * (1 - MEMORY_HEADROOM_MAX_LOSS) <= best * (1 + 1e-12)
        primary = np.where(near, ev.peak_bytes / cluster.gpu.hbm_bytes, 2 + ev.step_s / max(best, 1e-30))
    else:
        primary = ev.step_s
    return np.round(primary / max(float(np.min(primary)), 1e-30), 9)


def _coarse(ev: Evaluated, rows: NDArray[np.int64] | None, ctx: RankContext, cluster: ClusterSpec,
            uppers: NDArray[np.float64]) -> dict[str, NDArray[np.int64]]:
    """``ranking.coarse_columns`` of the rows ``rows`` of ``ev`` (all with None)."""
    table = ev.table if rows is None else ev.table.take(rows)
    peak = ev.peak_bytes if rows is None else ev.peak_bytes[rows]
    step = ev.step_s if rows is None else ev.step_s[rows]
    return coarse_columns(table, peak, step, ctx, usable_bytes=float(cluster.gpu.usable_bytes),
                          nvlink_block_gpus=cluster.nvlink_block_gpus, uppers=uppers)


def rank_order(ev: Evaluated, objective: str, cluster: ClusterSpec,
               ctx: RankContext | None = None) -> NDArray[np.int64]:
    """Indices best first. Throughput: step-time tiers, then the rules of ``paraplan.ranking`` (``ctx``; None:
    the provisional tolerance, no FSDP preference, no recipe). Memory-headroom: its objective (rounded),
    then the simplicity key."""
    if objective == "memory-headroom":
        keys: Sequence[Any] = [*reversed(simplicity_key(ev.table)), _rounded_objective(ev, objective, cluster)]
        return np.lexsort(keys)
    ctx = ctx or RankContext()
    uppers = tier_uppers(ev.step_s, ctx.tier_tolerance)
    coarse = pack(_coarse(ev, None, ctx, cluster, uppers))
    return np.lexsort(sort_keys(coarse, rounded_step(ev.step_s), ev.table))


def _ranked_top(ev: Evaluated, objective: str, cluster: ClusterSpec, top_k: int,
                ctx: RankContext | None = None) -> tuple[list[int], int]:
    """``distinct_top(ev, rank_order(ev, ...), top_k)`` without sorting every row. Memory-headroom: the rows
    whose rounded objective is at most the (64 top_k)-th smallest are a prefix of ``rank_order`` (the objective
    is its first key), so they are sorted alone. Throughput: the first tiers holding 64 top_k rows, and of them
    the rows whose packed coarse key is at most the (64 top_k)-th smallest. The full order is the fallback when
    ties use up that prefix before ``top_k`` distinct layouts are found."""
    want = 64 * top_k
    if len(ev.step_s) > 4 * want:
        if objective == "memory-headroom":
            rounded = _rounded_objective(ev, objective, cluster)
            idx = np.flatnonzero(rounded <= np.partition(rounded, want)[want])
            keys: Sequence[Any] = [*reversed(simplicity_key(ev.table.take(idx))), rounded[idx]]
        else:
            ctx = ctx or RankContext()
            uppers = tier_uppers(ev.step_s, ctx.tier_tolerance, min_rows=want)
            idx = np.flatnonzero(ev.step_s <= uppers[-1])  # whole tiers (the first ones hold the best coarse keys)
            coarse = pack(_coarse(ev, idx, ctx, cluster, uppers))
            if len(idx) > 4 * want:
                keep = coarse <= np.partition(coarse, want)[want]
                idx, coarse = idx[keep], coarse[keep]
            step = np.round(ev.step_s[idx] / max(float(np.min(ev.step_s)), 1e-30), 9)  # rounded_step's rounding
            keys = sort_keys(coarse, step, ev.table.take(idx))
        picked, ties = distinct_top(ev, idx[np.lexsort(keys)], top_k)
        if len(picked) == top_k:
            return picked, ties
    return distinct_top(ev, rank_order(ev, objective, cluster, ctx), top_k)


def ranking_of(ev: Evaluated, rows: list[int], objective: str, cluster: ClusterSpec,
               ctx: RankContext) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Step-time tier of each of ``rows`` (ranked, best first) and the rule that put each before the next one
    (``paraplan.ranking.decided_by``; the last row, with nothing after it, gets "")."""
    if not rows:
        return (), ()
    idx = np.asarray(rows, dtype=np.int64)
    uppers = tier_uppers(ev.step_s, ctx.tier_tolerance, min_rows=None)
    cols = _coarse(ev, idx, ctx, cluster, uppers)
    step = np.round(ev.step_s[idx] / max(float(np.min(ev.step_s)), 1e-30), 9)
    simple = np.stack(simpler_columns(ev.table.take(idx)), axis=1)
    headroom = _rounded_objective(ev, objective, cluster)[idx] if objective == "memory-headroom" else None
    decided = []
    for a in range(len(rows) - 1):
        b = a + 1
        if headroom is not None and headroom[a] != headroom[b]:
            decided.append("memory_headroom")
            continue
        if headroom is not None:
            decided.append("simpler" if tuple(simple[a]) != tuple(simple[b]) else "exact_tie")
            continue
        decided.append(decided_by(ctx, {k: int(v[a]) for k, v in cols.items()}, {k: int(v[b]) for k, v in cols.items()},
                                  float(step[a]), float(step[b]), tuple(simple[a].tolist()), tuple(simple[b].tolist())))
    return tuple(int(t) for t in cols["tier"]), (*decided, "")


@dataclass(frozen=True, slots=True)
class RankKeys:
    """Where one layout would sit in a plan's ranking: its tier, its coarse rule values, its rounded step time
    and its simplicity columns (``paraplan.ranking``)."""

    tier: int
    coarse: dict[str, int]
    step: float
    simpler: tuple[int, ...]


def rank_keys(p: Plan, layout: Any, peak_bytes: float, step_s: float) -> RankKeys | None:
    """The ranking keys of ``layout`` (with its predicted peak and step) among the plan's feasible layouts, as
    ``rank_order`` would compute them were it one of them (None for plans without rows or ranking context)."""
    ev, ctx = p.feasible, p.ranking
    if ev is None or ctx is None or not len(ev.step_s):
        return None
    table = LayoutTable.from_layouts([layout])
    table.etp = np.where(table.etp == 0, table.tp, table.etp)  # 0 = TP, as the search's columns hold it
    custom = bool(layout.pipeline_layout or layout.first_stage_layers or layout.last_stage_layers
                  or layout.account_for_embedding or layout.account_for_loss)
    if custom:
        table.pipeline_layouts = {(int(layout.pp), int(layout.vp)): tuple(layout.pipeline_layout) or (0,)}
    usable = float(p.cluster.gpu.usable_bytes)
    uppers = tier_uppers(ev.step_s, ctx.tier_tolerance)
    cols = coarse_columns(table, np.array([peak_bytes]), np.array([step_s]), ctx, usable_bytes=usable,
                          nvlink_block_gpus=p.cluster.nvlink_block_gpus, uppers=uppers)
    best = max(float(np.min(ev.step_s)), 1e-30)
    return RankKeys(tier=int(cols["tier"][0]), coarse={k: int(v[0]) for k, v in cols.items()},
                    step=float(np.round(step_s / best, 9)),
                    simpler=tuple(int(c[0]) for c in simpler_columns(table)))


def first_rule(p: Plan, a: RankKeys, b: RankKeys) -> str:
    """The rule that ranks ``a`` before ``b`` (``paraplan.ranking.decided_by``; "" when b comes first)."""
    assert p.ranking is not None
    if (pack({k: np.array([v]) for k, v in a.coarse.items()})[0], a.step, a.simpler) > (
            pack({k: np.array([v]) for k, v in b.coarse.items()})[0], b.step, b.simpler):
        return ""
    return decided_by(p.ranking, a.coarse, b.coarse, a.step, b.step, a.simpler, b.simpler)


FitKnob = Literal["search_space", "headroom", "num_gpus", "no_gpu_count", "recompute", "pipeline", "mbs", "gpu_memory",
                  "knob_rule"]

ADVICE_MAX_GPUS: Final = 65_536
"""The largest GPU count the no-fit advice searches (``gpus_that_fit``; budget's default ``--max-gpus``), or twice
the count given when that is larger."""


@dataclass(frozen=True, slots=True)
class CountFit:
    """Larger GPU counts searched for the no-fit advice (``gpus_that_fit``): the smallest that fits, or none."""

    num_gpus: int | None
    """The smallest count tried at which a layout fits (peak + margin <= usable); None: none up to ``max_gpus``."""
    max_gpus: int
    """The largest count tried."""
    layout: str
    """The smallest-footprint layout at ``num_gpus``, or (none fits) the smallest over every count tried."""
    peak_bytes: float
    """Its peak memory per GPU."""
    at_gpus: int
    """The count ``layout`` is at."""


def _advice_counts(cluster: ClusterSpec) -> list[int]:
    """The counts the advice tries: doubling from the count given, in whole nodes past one node."""
    per_node, n = cluster.gpus_per_node, cluster.num_gpus
    counts: list[int] = []
    top = min(max(ADVICE_MAX_GPUS, 2 * cluster.num_gpus), MAX_NUM_GPUS)
    while True:
        n *= 2
        if n > per_node:
            n = -(-n // per_node) * per_node
        if n > top:
            return counts
        counts.append(n)


def gpus_that_fit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: SearchSpace,
                  options: MemoryOptions | None, headroom: Headroom) -> CountFit | None:
    """The smallest larger GPU count (doubling, ``_advice_counts``) at which the same search finds a layout that fits,
    by the memory model itself: more GPUs shrink memory per GPU only as far as the layout rules let TP/PP/CP/EP grow
    and DP shard the optimizer (the batch, the layers, the heads, the NVLink domain bound them). None when no larger
    count has a layout to search."""
    best: tuple[str, float, int] | None = None
    counts = _advice_counts(cluster)
    for n in counts:
        try:
            p = plan(model, replace(cluster, num_gpus=n), training, space=space, top_k=1, options=options,
                     headroom=headroom, advise_gpu_counts=False)
        except NoFeasiblePlanError as err:
            if err.smallest is not None and (best is None or err.smallest[1] < best[1]):
                best = (err.smallest[0], err.smallest[1], n)
            continue
        except SpecError:  # the search space given does not apply at this count (e.g. too many layouts)
            continue
        c = p.candidates[0]
        return CountFit(n, n, c.layout.short(), float(c.peak_bytes), n)
    if best is None:
        return None
    return CountFit(None, counts[-1], best[0], best[1], best[2])



@dataclass(frozen=True, slots=True)
class FitTip:
    """One change that would make the smallest-footprint layout fit, as data: which knob and to what.

    ``search_space``: relax the searched axes or the batch (no layout was valid); ``headroom``: a margin smaller
    than ``value`` bytes (the smallest layout fits only inside it); ``num_gpus``: ``value`` GPUs or more
    (``ratio``: the smallest layout's peak over the usable memory, less the margin with ``less_margin``);
    ``recompute``: allow full recompute; ``pipeline``: allow more pipeline stages; ``mbs``: micro-batch
    ``value`` (1); ``gpu_memory``: a GPU with more than ``value`` bytes usable; ``knob_rule``: the knob rules
    ``rules`` (Megatron's words of each, "; "-separated: ``reason``) rejected the ``value`` layouts the other rules
    leave: change the training fields ``knobs`` (``knob_rule_tip``)."""

    knob: FitKnob
    value: float | None = None
    ratio: float | None = None
    less_margin: bool = False
    rules: tuple[str, ...] = ()
    knobs: tuple[str, ...] = ()
    reason: str = ""
    rule_knobs: tuple[tuple[str, ...], ...] = ()
    """``knob_rule`` with several ``rules``: the ``knobs`` that lift each (every rule rejects every layout left, so
    each must be lifted); empty with one rule."""
    layout: str = ""
    """``num_gpus``: the smallest-footprint layout at ``value`` GPUs; ``no_gpu_count``: the smallest found."""
    peak_bytes: float = 0.0
    """That layout's peak memory per GPU."""
    at_gpus: int = 0
    """``no_gpu_count``: the count that layout is at."""

    def describe(self) -> str:
        """The tip in the library's terms (``SearchSpace`` fields and ``plan`` arguments)."""
        if self.knob == "search_space":
            return "relax the search space (SearchSpace tp/pp/cp/mbs/max_pp) or change global_batch_size"
        if self.knob == "num_gpus":
            return f"{self.value:,.0f} GPUs (num_gpus; {self.count_text()})"
        if self.knob == "no_gpu_count":
            return self.count_text()
        if self.knob == "headroom":
            return (f"a smaller memory margin (headroom; the smallest layout fits only inside the "
                    f"{(self.value or 0.0) / GIB:.1f} GiB margin, NO_HEADROOM accepts it at the memory model's risk)")
        if self.knob == "recompute":
            return "allow full recompute (SearchSpace.recompute with full)"
        if self.knob == "pipeline":
            return "allow more pipeline stages (SearchSpace.max_pp/pp)"
        if self.knob == "mbs":
            return f"micro-batch {self.value:.0f} (SearchSpace.mbs)"
        if self.knob == "knob_rule":
            return (f"{self.rules_text(words=False)}: change {self.change_text(lambda k: k)} (TrainingSpec), or what "
                    "the rule asks for (NoFeasiblePlanError.examples has its words)")
        return f"a GPU with more than {(self.value or 0.0) / GIB:.0f} GiB usable"


    def count_text(self, count: str = "GPU count") -> str:
        """``num_gpus``: the pick at that count and its peak; ``no_gpu_count``: that no ``count`` (the CLI: its flag)
        up to ``value`` fits, with the smallest footprint found."""
        limit = f"usable memory{' less the margin' if self.less_margin else ''}"
        if self.knob == "num_gpus":
            return (f"the first count that fits, doubling from this one; its pick {self.layout} peaks at "
                    f"{self.peak_bytes / GIB:.1f} GiB")
        return (f"no {count} up to {self.value:,.0f} fits: the smallest footprint found, {self.layout} on "
                f"{self.at_gpus:,} GPUs, needs {self.peak_bytes / GIB:.1f} GiB, {self.ratio:.1f}x the {limit} (more "
                "GPUs shrink memory per GPU only as far as the model's layers, heads, experts, sequence and the batch "
                "let TP/PP/CP/EP/DP grow)")

    def change_text(self, name: Callable[[str], str]) -> str:
        """``knob_rule``: the knobs to change, each worded by ``name``: "A or B" for one rule, "A (RULE1) and B or C
        (RULE2)" for several."""
        if not self.rule_knobs:
            return " or ".join(map(name, self.knobs)) or "the knobs it names"
        return " and ".join(f"{' or '.join(map(name, knobs)) or 'the knobs it names'} ({code})"
                            for code, knobs in zip(self.rules, self.rule_knobs, strict=True))

    def rules_text(self, *, words: bool = True) -> str:
        """``knob_rule``: which rules rejected how many layouts (with Megatron's words of each: ``words``)."""
        many = len(self.rules) > 1
        why = f": {self.reason}" if words and self.reason else ""
        return (f"Megatron's knob rule{'s' * many} {', '.join(self.rules)} reject{'' if many else 's'} every layout "
                f"the other rules accept ({self.value or 0:,.0f}{why})")


def fit_advice(cluster: ClusterSpec, space: SearchSpace, smallest: tuple[Any, float] | None,
               headroom: Headroom = NO_HEADROOM, more: CountFit | None = None) -> tuple[FitTip, ...]:
    """What would make the smallest-footprint layout fit, from its numbers; ``more``: the larger GPU counts searched
    (``gpus_that_fit``; None: no count is advised)."""
    if smallest is None:
        return (FitTip("search_space"),)
    layout, need = smallest
    usable = cluster.gpu.usable_bytes
    margin = headroom.margin_bytes(usable)
    count_tips = []
    if more is not None and margin < usable:  # a margin of all usable memory leaves no GPU count that fits
        ratio = need / (usable - margin)
        if more.num_gpus is not None:
            count_tips.append(FitTip("num_gpus", more.num_gpus, ratio, margin > 0, layout=more.layout,
                                     peak_bytes=more.peak_bytes))
        else:
            count_tips.append(FitTip("no_gpu_count", more.max_gpus, more.peak_bytes / (usable - margin), margin > 0,
                                     layout=more.layout, peak_bytes=more.peak_bytes, at_gpus=more.at_gpus))
    if need <= usable:  # it fits only inside the margin (more GPUs help only while the margin leaves memory)
        return (FitTip("headroom", margin), *count_tips)
    tips = count_tips
    if layout.recompute != "full" and "full" not in space.recompute:
        tips.append(FitTip("recompute"))
    if space.max_pp is not None or space.pp is not None:
        tips.append(FitTip("pipeline"))
    if layout.mbs > 1:
        tips.append(FitTip("mbs", 1))
    tips.append(FitTip("gpu_memory", need + margin))
    return tuple(tips)


def advice_text(tips: tuple[FitTip, ...], describe: Callable[[FitTip], str] = FitTip.describe) -> str:
    """``what would make it fit: A; or B ...`` with each tip worded by ``describe``."""
    return "what would make it fit: " + "; or ".join(describe(t) for t in tips)


def _no_fit_message(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    rejections: dict[str, int], examples: dict[str, str], hint: str = "OOM") -> str:
    """What was searched and rejected, and the example of rejection ``hint`` (the advice is added by the caller)."""
    parts = ", ".join(f"{k} {v}" for k, v in sorted(rejections.items(), key=lambda kv: -kv[1]))
    hint = examples.get(hint, "")
    return (f"no layout of {model.name} fits on {cluster.num_gpus} x {cluster.gpu.name} at seq "
            f"{training.seq_len}, GBS {training.global_batch_size}: rejected {parts}"
            + (f"; {hint}" if hint else ""))
