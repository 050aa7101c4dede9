"""Robust ranking: tiers of step time within the model's error band, then the rules an expert applies inside a tier.

Step times the model cannot tell apart are one **tier**. Tiers are made greedily from the fastest layout up, so
they do not depend on enumeration order:

    tier 1 = every layout with step_s <= best x (1 + tol); tier 2 = the same on the rest; and so on

(``tol`` = ``tier_tolerance(model)``, the measured within-job band of two layouts' error ratio). Within a tier
the order is, most significant first (``RULES``):

1. ``free_memory``: more free memory, counted in whole memory bands free (``memory_tie_step_bytes``: the memory
   model's error band on this GPU, at least 1 GiB), up to ``FREE_MEMORY_BANDS``: differences inside one band are
   ties, and free memory beyond three bands buys no measured safety (``free_memory_key``);
2. ``distributed_optimizer``: the distributed optimizer over Megatron-FSDP, or ``megatron_fsdp`` (FSDP first) when
   model state is what binds: the weights, gradients and optimizer states of the tier-1 fastest distributed-optimizer
   layout are at least ``MODEL_STATE_BINDS_FRAC`` of its peak (Megatron-LM's parallelism guide lists Megatron-FSDP
   for "Model State" as the constraint it addresses, docs/user-guide/parallelism-guide.md);
3. ``nvlink_domain``: TP and CP groups inside one NVLink domain;
4. ``even_pipeline_split``: even splits over custom pipeline layouts (``--pipeline-model-parallel-layout`` or an
   uneven first/last stage);
5. ``fewer_parallel_dims``: fewer of TP, PP, VP, CP, EP above 1;
6. ``nvidia_recipe``: the layout of an NVIDIA recipe for the same job (model, GPU, GPU count, sequence, GBS);
7. ``step_time``: the faster step time (rounded to 1e-9 relative: exact ties fall through);
8. ``simpler``: smaller TP, PP, VP, CP, EP, ETP, then a larger micro-batch, lighter recompute, no FSDP, SP on,
   the distributed optimizer over plain DDP.

Rules 1 to 6 are small integers packed into one int64 ``coarse`` key, so a ranking is one ``np.lexsort`` over whole
columns (and the search sorts only the rows whose coarse key is among the smallest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from paraplan.units import GIB

if TYPE_CHECKING:
    from paraplan.layout import LayoutTable
    from paraplan.specs.model import ModelSpec

PROVISIONAL_TIER_TOLERANCE: Final = 0.05
"""Fallback when the packaged band file has no within-job band (``tier_tolerance``). Measured, not fitted: over the
11,544 layout pairs of benchmarks/ranking.py's job groups (mostly vTrain, in-sample), pairs whose predicted step
times differ by less than 5% are ordered as measured only 58-66% of the time (a coin flip is 50%), pairs 5-10%
apart 72%, pairs 10% or more apart 80% and up."""

MODEL_STATE_BINDS_FRAC: Final = 0.75
"""Model state (weights + gradients + optimizer states on the peak stage) binds when it is at least three quarters
of the peak of the fastest distributed-optimizer layout of tier 1: activations are then too small a part for
recompute, CP or a longer pipeline to relieve, and only sharding the states further (Megatron-FSDP) does. Assumed
(Megatron-LM's guide names model state as FSDP's constraint but gives no number)."""

FREE_MEMORY_BANDS: Final = 3
"""Whole memory bands of free memory beyond which more is not preferred (``free_memory_key``). From the held-out
memory rows of benchmarks/bands.py (2026-12-01): the measured peak exceeded the prediction by more than k times the
band's upper excess (predicted x (hi_ratio - 1) + hi_offset) on 49 / 25 / 6 of 507 dense rows for k = 1 / 2 / 3
(11 / 6 / 0 of 130 MoE): each band free up to three lowers the share of runs that would not fit (about 10%, 5%,
1%), a fourth cannot lower it measurably. Read from those rows, not fitted to the ranking: a layout that buys more
free memory (full recompute, more model parallelism) pays its step time for nothing the memory model can show."""

MEMORY_STEP_MIN_BYTES: Final = float(GIB)
"""Smallest free-memory step (``--headroom 0`` leaves no band to use): 1 GiB."""

RULES: Final = (
    ("tier", "a faster tier (step time beyond the band)"),
    ("free_memory", "more free memory"),
    ("distributed_optimizer", "the distributed optimizer over Megatron-FSDP"),
    ("nvlink_domain", "TP and CP inside the NVLink domain"),
    ("even_pipeline_split", "an even pipeline split over a custom pipeline layout"),
    ("fewer_parallel_dims", "fewer parallel dimensions"),
    ("nvidia_recipe", "an NVIDIA recipe's layout for this job"),
    ("step_time", "a faster step time within the tier"),
    ("simpler", "the simpler layout (smaller TP, PP, VP, CP, EP, larger micro-batch, lighter recompute)"),
)
"""(code, words) of every rule, in the order they decide; ``decided_by`` is one of the codes (``megatron_fsdp``
replaces ``distributed_optimizer`` when model state binds), or ``exact_tie``."""

_BITS: Final = (("tier", 20), ("free_memory", 12), ("distributed_optimizer", 1), ("nvlink_domain", 2),
                ("even_pipeline_split", 1), ("fewer_parallel_dims", 3), ("nvidia_recipe", 1))
"""Bits of each coarse rule in the packed key (most significant first; 40 of int64's 63)."""

PROVISIONAL_SOURCE: Final = ("provisional: the packaged band file has no within-job band "
                              "(paraplan.ranking.PROVISIONAL_TIER_TOLERANCE)")
"""``tier_tolerance_source`` without a within-job band."""

RECIPE_FIELDS: Final = ("tp", "pp", "vp", "cp", "ep", "etp", "mbs", "recompute_code")
"""What makes a row the layout of a recipe (``recipes.compare.same_layout``'s fields)."""


def band_tolerance(lo_ratio: float, hi_ratio: float) -> float:
    """Tier tolerance of a measured/predicted step-time band [lo, hi]: its half-width, (hi - lo) / 2. (The full
    width hi / lo - 1 would treat the two layouts' errors as independent; on one job they mostly are not: the same
    GPU, model and efficiency constants err alike for both.)"""
    return max(0.0, (hi_ratio - lo_ratio) / 2)


def band_tier_tolerance(model: ModelSpec) -> float:
    """``band_tolerance`` of the measured step-time band of ``model``'s family (``paraplan.bands``): 13.3% dense,
    32.7% MoE with the bands of 2026-12-01. Not the default (``tier_tolerance``): that band is of one estimate's
    absolute error, most of which the layouts of one job share."""
    from paraplan.bands import band_for, family_of

    band = band_for("step_s", family_of(model.is_moe))
    return band_tolerance(band.lo_ratio, band.hi_ratio)


def tier_tolerance(model: ModelSpec) -> float:
    """Relative step-time difference below which two layouts of ``model`` are one tier: the measured within-job band
    of ``model``'s family (``paraplan.bands.tier_band_for``; benchmarks/bands.py ``tier_band``): over pairs of
    held-out measured runs of one job with different layouts, the ratio of their error ratios (predicted / measured
    step of one over the other's) is at most 1 + tolerance for 80% of pairs. A layout predicted more than that
    slower than another is measured slower in at least 80% of pairs; closer, the model cannot order them at that
    level. ``PROVISIONAL_TIER_TOLERANCE`` when the packaged file has no within-job band.

    Not the absolute step-time band (``band_tier_tolerance``): most of one estimate's error is shared by the layouts
    of one job (the same GPU, model and efficiency constants)."""
    from paraplan.bands import family_of, tier_band_for

    band = tier_band_for(family_of(model.is_moe))
    return PROVISIONAL_TIER_TOLERANCE if band is None else band.tolerance


def tier_tolerance_source(model: ModelSpec) -> str:
    """Where ``tier_tolerance(model)`` comes from, in words (plan notes, JSON, explain)."""
    from paraplan.bands import family_of, tier_band_for

    band = tier_band_for(family_of(model.is_moe))
    return PROVISIONAL_SOURCE if band is None else band.describe()


def memory_tie_step_bytes(usable_bytes: float, is_moe: bool = False) -> float:
    """Free-memory step of the ``free_memory`` rule: the memory model's error band of the family on this GPU (the
    default headroom margin, ``paraplan.headroom.DEFAULT_HEADROOM.for_model``), at least ``MEMORY_STEP_MIN_BYTES``."""
    from paraplan.headroom import DEFAULT_HEADROOM

    return max(MEMORY_STEP_MIN_BYTES, DEFAULT_HEADROOM.for_model(is_moe).margin_bytes(usable_bytes))


def tier_uppers(step_s: NDArray[np.float64], tol: float, min_rows: int | None = None) -> NDArray[np.float64]:
    """Upper step time of each tier, fastest first: tier k holds the steps in (upper[k-1], upper[k]], and upper[k]
    = (1 + tol) x the fastest step above upper[k-1]. With ``min_rows`` only the first tiers that hold at least that
    many rows (all tiers when the rows run out)."""
    s = np.sort(step_s[np.isfinite(step_s)])
    uppers: list[float] = []
    j = 0
    while j < len(s) and (min_rows is None or j < min_rows):
        upper = float(s[j]) * (1.0 + tol)
        uppers.append(upper)
        j = int(np.searchsorted(s, upper, side="right"))
    return np.asarray(uppers, dtype=float)


def tiers_of(step_s: NDArray[np.float64], uppers: NDArray[np.float64]) -> NDArray[np.int64]:
    """Tier (1 = fastest) of each step time; rows above the last upper get len(uppers) + 1."""
    return np.searchsorted(uppers, step_s, side="left").astype(np.int64) + 1


@dataclass(frozen=True, slots=True)
class RankContext:
    """What the ranking rules need beyond the rows: the tier tolerance, the free-memory step, whether model state
    binds (FSDP first), and the layouts of NVIDIA recipes for the same job."""

    tier_tolerance: float = PROVISIONAL_TIER_TOLERANCE
    memory_step_bytes: float = MEMORY_STEP_MIN_BYTES
    prefer_fsdp: bool = False
    model_state_frac: float | None = None
    """Model state over peak of the tier-1 fastest distributed-optimizer layout (None: no such layout)."""
    recipe_layouts: tuple[tuple[int, ...], ...] = ()
    """``RECIPE_FIELDS`` of each matching recipe."""
    recipe_names: tuple[str, ...] = ()
    tolerance_source: str = PROVISIONAL_SOURCE
    """Where the tolerance comes from (``tier_tolerance_source``)."""

    def rule_codes(self) -> tuple[str, ...]:
        """The rule codes in order, with ``megatron_fsdp`` for rule 2 when model state binds."""
        return tuple("megatron_fsdp" if c == "distributed_optimizer" and self.prefer_fsdp else c for c, _ in RULES)

    def describe(self) -> str:
        """One line for the plan's notes."""
        words = [w for c, w in RULES[1:]]
        if self.prefer_fsdp:
            words[1] = "Megatron-FSDP over the distributed optimizer (model state binds)"
        binds = ("" if self.model_state_frac is None else
                 f"; model state is {100 * self.model_state_frac:.0f}% of the peak of the fastest "
                 f"distributed-optimizer layout (binds at {100 * MODEL_STATE_BINDS_FRAC:.0f}%)")
        return (f"ranking: layouts within {100 * self.tier_tolerance:.1f}% of a tier's fastest step time are one "
                f"tier ({self.tolerance_source}); within a tier: " + ", then ".join(words[:1]) +
                f" (in whole memory bands of {self.memory_step_bytes / GIB:.1f} GiB, up to {FREE_MEMORY_BANDS}), "
                "then " +
                ", then ".join(words[1:]) + binds)

    def as_dict(self) -> dict[str, Any]:
        """JSON: the tolerance, the memory step, the rules in order and what rule 2 decided."""
        return {"tier_tolerance": self.tier_tolerance, "tier_tolerance_source": self.tolerance_source,
                "memory_step_bytes": self.memory_step_bytes, "prefer_fsdp": self.prefer_fsdp,
                "free_memory_bands": FREE_MEMORY_BANDS,
                "model_state_frac": self.model_state_frac, "model_state_binds_frac": MODEL_STATE_BINDS_FRAC,
                "rules": list(self.rule_codes()), "recipes": list(self.recipe_names)}


def _in_domain(table: LayoutTable, nvlink_block_gpus: int) -> NDArray[np.int64]:
    """How many of the TP and CP groups of each row leave the NVLink domain (0, 1 or 2)."""
    from paraplan.specs.grid import Grid
    from paraplan.specs.topology import span_in_domain

    grid = Grid.of(table)
    out_tp = (table.tp > 1) & ~span_in_domain(grid.tp_group.span, nvlink_block_gpus)
    out_cp = (table.cp > 1) & ~span_in_domain(grid.cp_group.span, nvlink_block_gpus)
    return out_tp.astype(np.int64) + out_cp.astype(np.int64)


def _recipe_key(table: LayoutTable, recipes: tuple[tuple[int, ...], ...]) -> NDArray[np.int64]:
    """0 for rows with a recipe's layout, 1 for the others."""
    hit = np.zeros(len(table), dtype=bool)
    for rec in recipes:
        m = np.ones(len(table), dtype=bool)
        for name, value in zip(RECIPE_FIELDS, rec, strict=True):
            m &= getattr(table, name) == value
        hit |= m
    return (~hit).astype(np.int64)


def parallel_dims(table: LayoutTable) -> NDArray[np.int64]:
    """How many of TP, PP, VP, CP, EP are above 1."""
    return ((table.tp > 1).astype(np.int64) + (table.pp > 1) + (table.vp > 1) + (table.cp > 1) + (table.ep > 1))


def free_memory_key(free_bytes: NDArray[np.float64], step_bytes: float) -> NDArray[np.int64]:
    """Rule 1's key (smaller is better): ``FREE_MEMORY_BANDS`` less the whole memory bands free, at least 0::

        key = FREE_MEMORY_BANDS - min(FREE_MEMORY_BANDS, floor(free / step))

    Counted from zero free, not from the tier's most free layout, so the order of two layouts does not depend on
    which other layouts share their tier; layouts less than one band apart in the same band are ties, and layouts
    with ``FREE_MEMORY_BANDS`` bands free or more all tie."""
    bands = np.floor(np.maximum(free_bytes, 0.0) / step_bytes)
    out: NDArray[np.int64] = (FREE_MEMORY_BANDS - np.minimum(bands, FREE_MEMORY_BANDS)).astype(np.int64)
    return out


def coarse_columns(table: LayoutTable, peak_bytes: NDArray[np.float64], step_s: NDArray[np.float64],
                   ctx: RankContext, *, usable_bytes: float, nvlink_block_gpus: int,
                   uppers: NDArray[np.float64]) -> dict[str, NDArray[np.int64]]:
    """Rules 1 to 6 and the tier, one small non-negative integer column each (smaller is better), in order; each
    row's values depend on that row alone (and the tiers' bounds)."""
    tier = tiers_of(step_s, uppers)
    fsdp = table.fsdp.astype(np.int64)
    cols = {"tier": tier, "free_memory": free_memory_key(usable_bytes - peak_bytes, ctx.memory_step_bytes),
            "distributed_optimizer": 1 - fsdp if ctx.prefer_fsdp else fsdp,
            "nvlink_domain": _in_domain(table, nvlink_block_gpus),
            "even_pipeline_split": table.uneven.astype(np.int64),
            "fewer_parallel_dims": parallel_dims(table),
            "nvidia_recipe": _recipe_key(table, ctx.recipe_layouts)}
    return {k: np.clip(cols[k], 0, (1 << bits) - 1) for k, bits in _BITS}


def pack(cols: dict[str, NDArray[np.int64]]) -> NDArray[np.int64]:
    """The coarse columns as one int64 key that sorts as they do, most significant first."""
    key = np.zeros(len(next(iter(cols.values()))), dtype=np.int64)
    for name, bits in _BITS:
        key = (key << bits) | cols[name]
    return key


def simpler_columns(table: LayoutTable) -> list[NDArray[np.int64]]:
    """Rule 8's columns, most significant first."""
    return [table.tp, table.pp, table.vp, table.cp, table.ep, table.etp, -table.mbs, table.recompute_code,
            table.fsdp.astype(np.int64), (~table.sequence_parallel).astype(np.int64),
            (~table.distributed_optimizer).astype(np.int64)]  # every searched column: a total order


def rounded_step(step_s: NDArray[np.float64]) -> NDArray[np.float64]:
    """Step time relative to the fastest, rounded to 1e-9 (exact ties compare equal)."""
    return np.asarray(np.round(step_s / max(float(np.min(step_s)), 1e-30), 9), dtype=float)


def sort_keys(coarse: NDArray[np.int64], step: NDArray[np.float64], table: LayoutTable) -> list[NDArray[Any]]:
    """``np.lexsort`` keys (least significant first) of the full order: coarse, rounded step, simpler."""
    return [*reversed(simpler_columns(table)), step, coarse]


def decided_by(ctx: RankContext, coarse_a: dict[str, int], coarse_b: dict[str, int], step_a: float, step_b: float,
               simpler_a: tuple[int, ...], simpler_b: tuple[int, ...]) -> str:
    """The first rule on which a layout (a) differs from the one after it (b): the rule that put a first."""
    codes = dict(zip((c for c, _ in RULES), ctx.rule_codes(), strict=True))
    for name, _ in _BITS:
        if coarse_a[name] != coarse_b[name]:
            return codes[name]
    if step_a != step_b:
        return "step_time"
    if simpler_a != simpler_b:
        return "simpler"
    return "exact_tie"


def rule_words(code: str) -> str:
    """The words of a ``decided_by`` code."""
    if code == "megatron_fsdp":
        return "Megatron-FSDP over the distributed optimizer (model state binds)"
    if code == "exact_tie":
        return "an exact tie (same keys)"
    return dict(RULES)[code]
