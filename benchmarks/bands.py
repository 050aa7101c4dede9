#!/usr/bin/env python3
"""Write src/paraplan/bands.json: the measured error bands of peak memory and step time (paraplan.bands).

    python benchmarks/bands.py            # rebuild from ../shared/calibration (a few minutes: every fold is refitted)
    python benchmarks/bands.py --check    # exit 1 when the packaged file is stale (its inputs fingerprint or its
                                          # memory bands differ from what the model gives now; seconds)

A band is the interval of measured / predicted that held for ``TARGET_COVERAGE`` of the held-out rows of a family.

Step time (published_runs.csv, the rows benchmarks/calibration.py scores). Every row is predicted by a model whose
fitted efficiency parameters were refitted per GPU architecture without it: ``FOLDS``-fold, seeded
(benchmarks/cross_validate.py, which reuses benchmarks/fit_efficiency.py's fit). The band is a central
split-conformal interval of those held-out ratios, itself held out: each fold is judged by the band of the other
folds' rows. Leave-one-source-out figures are computed the same way and stored beside (calibration.py prints both).

Peak memory (megatron_golden.csv, the rows benchmarks/memory.py scores, and the BLOOM nvidia-smi peaks of
published_runs.csv as benchmarks/bloom_memory.py predicts them leave-one-out). The memory model has no fitted
constants, so its residuals are held-out residuals. 431 of the 437 dense golden rows use under 5 GiB, where the
error is a constant (unmodelled allocations of a few hundred MiB), not a share; a purely relative band from them
(-10% / +39%) would put a 30 GiB margin on an 80 GB GPU. So the memory band is constant-plus-relative::

    predicted x lo_ratio - lo_offset  <=  measured  <=  predicted x hi_ratio + hi_offset

the ratios from the rows whose prediction is at least ``LARGE_ROW_MIN_USE`` of usable memory (the family's own when
it has ``MIN_RELATIVE_ROWS`` of them, else all families'; widened to contain 1), the offsets from the other
(small) rows' residuals beyond the ratios. Coverage is counted over every row, held out by the same k-fold rule.

Tier tolerance (paraplan.ranking.tier_tolerance, issue 14: "layouts whose step times differ by less than the
step-time error band are one tier"). Over pairs of the k-fold held-out step-time rows of one job with different
layouts (benchmarks/ranking.py's ``job_key``, plus the container release for Megatron-Bridge rows: a release
changes the software, not the layout), rho = e_b / e_a, e = predicted / measured step time. With b predicted
(1 + d) x a's step, b is measured faster than a exactly when rho > 1 + d. The pair's order is arbitrary, so rho
and 1 / rho both count (the sample is symmetric). The tolerance is the one-sided ``TARGET_COVERAGE`` quantile minus
one: 1 + tol is the split-conformal upper bound (rank ceil((N + 1) x 0.8) of the N symmetrized ratios) below which
80% of the within-job ratios lie, so a layout predicted more than tol slower than another is measured slower in at
least 80% of pairs, the level the other bands hold; within tol the model cannot order them at that level (one
tier). (The half-width of the central 80% interval, ``paraplan.ranking.band_tolerance``, would ask for 90% on one
side.) Its held-out coverage is leave-one-job-out: each job's ratios judged by the bound of the other jobs' pairs.
A family with pairs from fewer than ``MIN_PAIR_JOBS`` jobs takes the bound of all families' pairs (``pooled``).

A band's nominal level starts at the target and rises in ``LEVEL_STEP`` steps until its held-out coverage reaches
it (finite folds can fall a little short of the conformal expectation); the band over all rows is taken at that
level and the level is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import hashlib
import io
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cross_validate import (  # noqa: E402
    ARCH_GPUS,
    FIX,
    FOLDS,
    FTOL,
    MAX_NFEV,
    SEED,
    START_FROM,
    VTRAIN_ROWS,
    fast_predict,
    fold_ids,
    held_out,
)
from paraplan.bands import PACKAGED_NAME, REGENERATE  # noqa: E402
from paraplan.errors import SpecError  # noqa: E402
from paraplan.estimator import estimate  # noqa: E402
from paraplan.specs.cluster import make_cluster  # noqa: E402
from paraplan.specs.load import load_gpu  # noqa: E402
from paraplan.units import GIB  # noqa: E402
from published_cases import Case, load_cases, pct  # noqa: E402

PACKAGED_PATH = ROOT / "src" / "paraplan" / PACKAGED_NAME
SHARED = ROOT.parent / "shared" / "calibration"
TARGET_COVERAGE = 0.8
LEVEL_STEP = 0.005
MAX_LEVEL = 0.95
LARGE_ROW_MIN_USE = 0.25
"""A memory row founds the relative part of the band when its prediction is at least this share of usable memory
(there the error is a share of the peak; below, a constant). Assumed: a quarter of the GPU, where an unmodelled
0.5 GiB is under 3% of the peak on an 80 GB GPU."""
MIN_RELATIVE_ROWS = 20
"""Fewest large rows a family's own relative part is taken from; with fewer, all families' large rows are pooled."""
MIN_PAIR_JOBS = 5
"""Fewest jobs a family's own within-job (tier) band is taken from; with fewer, all families' pairs are pooled."""


@dataclass(frozen=True, slots=True)
class Row:
    """One measured value and its (held-out) prediction."""

    id: str
    family: str
    predicted: float
    measured: float
    source: str = ""
    usable: float = math.inf
    """Usable memory of the row's GPU (memory rows)."""
    fold_key: str = ""
    """The row's identity for its fold (``Case.fold_key`` for step rows); empty: ``id``."""

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted

    @property
    def large(self) -> bool:
        return self.predicted >= LARGE_ROW_MIN_USE * self.usable


def conformal_interval(values: Sequence[float], coverage: float = TARGET_COVERAGE) -> tuple[float, float]:
    """Central split-conformal interval of ``values``: the floor((n+1)a/2)-th and ceil((n+1)(1-a/2))-th order
    statistics (1-based, a = 1 - coverage), clamped to the sample; a new exchangeable value falls inside with
    probability >= coverage."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    a = 1 - coverage
    lo_rank = max(1, math.floor((n + 1) * a / 2 + 1e-9))  # 1e-9: 100 x 0.9 is 90.00000000000001 in floats
    hi_rank = min(n, math.ceil((n + 1) * (1 - a / 2) - 1e-9))
    return xs[lo_rank - 1], xs[hi_rank - 1]


@dataclass(frozen=True, slots=True)
class Interval:
    """``predicted x lo_ratio - lo_offset <= measured <= predicted x hi_ratio + hi_offset``."""

    lo_ratio: float
    hi_ratio: float
    lo_offset: float = 0.0
    hi_offset: float = 0.0

    def covers(self, r: Row) -> bool:
        lo = r.predicted * self.lo_ratio - self.lo_offset
        return lo <= r.measured <= r.predicted * self.hi_ratio + self.hi_offset


def relative_interval(rows: Sequence[Row], family: str, level: float) -> Interval:
    """Step time: the conformal interval of the family's ratios."""
    return Interval(*conformal_interval([r.ratio for r in rows if r.family == family], level))


def memory_interval(rows: Sequence[Row], family: str, level: float) -> Interval:
    """Peak memory: ratios from the large rows (the family's, or all families' when it has too few, widened to
    contain 1), offsets from the family's small rows' residuals beyond them."""
    large = [r for r in rows if r.large and r.family == family]
    if len(large) < MIN_RELATIVE_ROWS:
        large = [r for r in rows if r.large]
    lo_r, hi_r = conformal_interval([r.ratio for r in large], level)
    lo_r, hi_r = min(lo_r, 1.0), max(hi_r, 1.0)
    small = [r for r in rows if not r.large and r.family == family]
    _, hi_off = conformal_interval([r.measured - r.predicted * hi_r for r in small], level)
    lo_off, _ = conformal_interval([r.measured - r.predicted * lo_r for r in small], level)
    return Interval(lo_r, hi_r, max(0.0, -lo_off) if small else 0.0, max(0.0, hi_off) if small else 0.0)


def held_out_band(rows: Sequence[Row], family: str, make: Callable[[Sequence[Row], str, float], Interval],
                  folds: int = FOLDS, seed: int = SEED) -> dict[str, Any]:
    """The family's band over all ``rows`` and its held-out coverage (each fold judged by the band ``make``
    builds from the other folds), at the lowest level from the target whose coverage reaches it."""
    fold = fold_ids([r.fold_key or r.id for r in rows], folds, seed)
    mine = [i for i, r in enumerate(rows) if r.family == family]
    level = TARGET_COVERAGE
    while True:
        covered = 0
        for k in range(folds):
            band = make([r for r, f in zip(rows, fold, strict=True) if f != k], family, level)
            covered += sum(band.covers(rows[i]) for i in mine if fold[i] == k)
        if not mine or covered / len(mine) >= TARGET_COVERAGE or level >= MAX_LEVEL:
            break
        level = round(level + LEVEL_STEP, 4)
    band = make(rows, family, level)
    return {"lo_ratio": round(band.lo_ratio, 4), "hi_ratio": round(band.hi_ratio, 4),
            "lo_offset": float(round(band.lo_offset)), "hi_offset": float(round(band.hi_offset)),
            "coverage": round(covered / len(mine), 4) if mine else math.nan, "rows": len(mine), "level": level}


# --- peak memory -------------------------------------------------------------------------------------------------

def golden_memory_rows() -> list[Row]:
    """Last-stage predicted vs measured max allocated bytes of every golden row benchmarks/memory.py scores."""
    import memory

    gpus = {name: load_gpu(name) for name in set(memory.GOLDEN_GPU.values())}
    out = []
    with open(SHARED / "megatron_golden.csv", newline="") as f:
        for r in csv.DictReader(f):
            case = memory.golden_case(r)
            if case is None:
                continue
            cluster = make_cluster(gpus[case["gpu"]], case["n"], None if case["gpu"] == "gb200" else 8)
            try:
                est = estimate(case["model"], cluster, case["training"], case["layout"])
            except SpecError:
                continue
            out.append(Row(id=f"{case['id']}[{case['hw']}]", family="moe" if case["moe"] else "dense",
                           predicted=float(est.stages[-1].memory.total_bytes), measured=case["measured"],
                           source="megatron_golden", usable=float(est.usable_bytes)))
    return out


def bloom_memory_rows() -> list[Row]:
    """BLOOM nvidia-smi peaks (published_runs.csv), predicted as benchmarks/bloom_memory.py does: Megatron-Core's
    terms + DeepSpeed's extra state + reserved + the per-process constant fitted on the other rows."""
    from bloom_memory import bloom_rows, predicted_rows

    preds = [p for p in predicted_rows(bloom_rows()) if not p["oom"]]
    resid = [p["measured_bytes"] - p["base_bytes"] for p in preds]
    gpu = load_gpu("a100-80gb")
    return [Row(id=p["label"], family="dense", predicted=p["base_bytes"] + statistics.median(resid[:i] + resid[i + 1:]),
                measured=p["measured_bytes"], source="bloom_nvidia_smi", usable=float(gpu.hbm_bytes))
            for i, p in enumerate(preds)]


def memory_rows() -> list[Row]:
    return golden_memory_rows() + bloom_memory_rows()


# --- step time ---------------------------------------------------------------------------------------------------

def step_s(case: Case, tokens_per_s_per_gpu: float) -> float:
    """Step time of a case at a throughput: gbs x seq / (tokens/s/GPU x GPUs)."""
    return float(case.gbs * case.seq_len / (tokens_per_s_per_gpu * case.num_gpus))


def scored_cases() -> list[Case]:
    """The published rows the model predicts (those calibration.py scores)."""
    cases, _ = load_cases("published")
    return [c for c in cases if isinstance(fast_predict(c), float)]


def step_rows(held: list[Any]) -> list[Row]:
    return [Row(id=h.case.id, fold_key=h.case.fold_key, family="moe" if h.case.moe else "dense",
                predicted=step_s(h.case, h.predicted), measured=step_s(h.case, h.case.target_tokens_per_s_per_gpu),
                source=h.case.source)
            for h in held if isinstance(h.predicted, float) and h.predicted > 0]


def error_figures(rows: Sequence[Row]) -> dict[str, Any]:
    """Throughput APE of held-out rows (|predicted / measured tokens/s - 1| = |measured / predicted step - 1|)."""
    apes = [abs(1 / r.ratio - 1) for r in rows]
    return {"median_ape": round(pct(apes, 0.5), 4), "p90_ape": round(pct(apes, 0.9), 4),
            "within_20": round(sum(a <= 0.2 for a in apes) / len(apes), 4) if apes else math.nan, "rows": len(apes)}


def cv_summary(rows: Sequence[Row], held: list[Any]) -> dict[str, Any]:
    by_source = {s: error_figures([r for r in rows if r.source == s]) for s in sorted({r.source for r in rows})}
    by_family = {f: error_figures([r for r in rows if r.family == f]) for f in ("dense", "moe")}
    return {**error_figures(rows), "uncalibrated_rows": sum(h.uncalibrated for h in held),
            "by_source": by_source, "by_family": by_family}


# --- within-job pairs: the tier tolerance -----------------------------------------------------------------------

@cache
def _csv_rows() -> list[dict[str, str]]:
    with open(SHARED / "published_runs.csv", newline="") as f:
        return list(csv.DictReader(f))


def release_of(case: Case) -> str:
    """The container release of a Megatron-Bridge row (``26.04.01`` from its source_detail), else ''."""
    if case.source != "Megatron-Bridge":
        return ""
    m = re.search(r"\(([\w.]+) NeMo Container", _csv_rows()[int(case.id.split(":")[1])]["source_detail"])
    return m.group(1) if m else ""


@dataclass(frozen=True, slots=True)
class Pair:
    """Two held-out rows of one job with different layouts: rho = e_b / e_a (e = predicted / measured step)."""

    job: tuple[Any, ...]
    family: str
    rho: float


def within_job_pairs(held: Sequence[Any]) -> list[Pair]:
    """Every pair of held-out rows (``cross_validate.Held``) of one job (``ranking.job_key`` + release) whose layouts
    differ (``ranking.layout_key``); rows without a prediction are left out."""
    from ranking import job_key, layout_key

    by_job: dict[tuple[Any, ...], list[tuple[Case, float]]] = defaultdict(list)
    for h in held:
        if isinstance(h.predicted, float) and h.predicted > 0:
            # e = predicted / measured step time = measured / predicted tokens/s
            by_job[(*job_key(h.case), release_of(h.case))].append((h.case, h.case.target_tokens_per_s_per_gpu
                                                                  / h.predicted))
    return [Pair(job, "moe" if a.moe else "dense", eb / ea) for job, rows in by_job.items()
            for (a, ea), (b, eb) in combinations(rows, 2) if layout_key(a) != layout_key(b)]


def upper_bound(values: Sequence[float], coverage: float = TARGET_COVERAGE) -> float:
    """One-sided split-conformal upper bound: the ceil((n + 1) x coverage)-th smallest value (the largest when n is
    too small); a new exchangeable value is at most it with probability >= coverage."""
    xs = sorted(values)
    if not xs:
        return math.nan
    return xs[min(len(xs), math.ceil((len(xs) + 1) * coverage - 1e-9)) - 1]


def symmetric(pairs: Sequence[Pair]) -> list[float]:
    """rho and 1 / rho of every pair (which layout is a is arbitrary)."""
    return [x for p in pairs for x in (p.rho, 1 / p.rho)]


def tier_band(pairs: Sequence[Pair], family: str) -> dict[str, Any]:
    """The family's tier tolerance from the within-job pairs (all families' when it has pairs of fewer than
    ``MIN_PAIR_JOBS`` jobs) and its leave-one-job-out coverage."""
    own = [p for p in pairs if p.family == family]
    pooled = len({p.job for p in own}) < MIN_PAIR_JOBS
    use = list(pairs) if pooled else own
    jobs = sorted({p.job for p in use}, key=repr)
    covered = total = 0
    for job in jobs:
        hi = upper_bound(symmetric([p for p in use if p.job != job]))
        mine = symmetric([p for p in use if p.job == job])
        covered += sum(x <= hi for x in mine)
        total += len(mine)
    hi = upper_bound(symmetric(use))
    return {"family": family, "tolerance": round(hi - 1, 4), "hi_ratio": round(hi, 4), "pairs": len(use),
            "jobs": len(jobs), "own_pairs": len(own), "pooled": pooled,
            "coverage": round(covered / total, 4) if total else math.nan, "method": TIER_METHOD}


def tier_bands(held: Sequence[Any]) -> dict[str, dict[str, Any]]:
    pairs = within_job_pairs(held)
    return {family: tier_band(pairs, family) for family in ("dense", "moe")}


# --- inputs fingerprint ------------------------------------------------------------------------------------------

def fingerprint(cases: list[Case]) -> dict[str, str]:
    """What the cross-validation depends on: the calibration files, the presets' fitted values, the fit settings
    and the model (its predictions for every published and vTrain row at the presets' values)."""
    from cross_validate import vtrain_sample

    def h(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    files = {name: hashlib.sha256((SHARED / name).read_bytes()).hexdigest()[:16]
             for name in ("published_runs.csv", "megatron_golden.csv", "vtrain_runs.csv")}
    eff = {g: {f.name: getattr(load_gpu(g).efficiency, f.name) for f in fields(load_gpu(g).efficiency)}
           for gs in ARCH_GPUS.values() for g in gs}
    vt = vtrain_sample(max(VTRAIN_ROWS.values()))
    preds = [f"{c.id}:{fast_predict(c):.6g}" for c in cases + vt]  # type: ignore[str-format]
    settings = {"folds": FOLDS, "seed": SEED, "fix": FIX, "vtrain_rows": VTRAIN_ROWS, "max_nfev": MAX_NFEV,
                "ftol": FTOL, "start_from": START_FROM, "target": TARGET_COVERAGE, "level_step": LEVEL_STEP,
                "min_pair_jobs": MIN_PAIR_JOBS}
    return {**files, "efficiency": h(json.dumps(eff, sort_keys=True)), "predictions": h("\n".join(preds)),
            "settings": h(json.dumps(settings, sort_keys=True))}


# --- the file ----------------------------------------------------------------------------------------------------

MEMORY_METHOD = ("peak_bytes: megatron_golden.csv max allocated bytes (last rank) vs the last stage's peak, and the "
                 "BLOOM nvidia-smi peaks of published_runs.csv (bloom_memory.py, leave-one-out constant); "
                 f"constant-plus-relative: ratios from rows predicted at >= {100 * LARGE_ROW_MIN_USE:.0f}% of usable "
                 f"memory (pooled over families below {MIN_RELATIVE_ROWS} rows), offsets from the other rows")
STEP_METHOD = ("step_s: published_runs.csv step time (from tokens/s/GPU); each row predicted with the efficiency "
               f"parameters refitted per GPU architecture without its fold ({FOLDS}-fold, seed {SEED}, "
               "fit_efficiency.py's fit)")
BAND_RULE = (f"; central split-conformal interval, {FOLDS}-fold held-out coverage (seed {SEED}), nominal level "
             f"raised from {100 * TARGET_COVERAGE:.0f}% in {100 * LEVEL_STEP:.1f}% steps until coverage >= "
             f"{100 * TARGET_COVERAGE:.0f}%")

TIER_METHOD = ("tier: pairs of the 5-fold held-out step-time rows of one job (benchmarks/ranking.py job_key + "
               "Megatron-Bridge container release) with different layouts; rho = e_b / e_a, e = predicted / measured "
               "step; tolerance = the one-sided split-conformal 80% upper bound of rho and 1 / rho, minus 1; "
               "coverage leave-one-job-out")


def memory_bands(mem: list[Row]) -> list[dict[str, Any]]:
    out = []
    for family in ("dense", "moe"):
        b = held_out_band(mem, family, memory_interval)
        iv = Interval(b["lo_ratio"], b["hi_ratio"], b["lo_offset"], b["hi_offset"])
        by_source = {s: round(sum(iv.covers(r) for r in rs) / len(rs), 4)
                     for s in ("megatron_golden", "bloom_nvidia_smi")
                     if (rs := [r for r in mem if r.family == family and r.source == s])}
        out.append({"quantity": "peak_bytes", "family": family, **b,
                    "large_rows": sum(r.large for r in mem if r.family == family),
                    "in_band_by_source": by_source, "method": MEMORY_METHOD + BAND_RULE})
    return out


def cross_validated(progress: Callable[[str], None] | None = None,
                    cases: list[Case] | None = None, jobs: int = 1) -> dict[str, Any]:
    """The k-fold and leave-one-source-out figures (refits every fold), with the k-fold held-out rows."""
    cases = scored_cases() if cases is None else cases
    kfold = held_out(cases, "kfold", progress=progress, jobs=jobs)
    loso = held_out(cases, "loso", progress=progress, jobs=jobs)
    k_rows, l_rows = step_rows(kfold), step_rows(loso)
    return {"kfold": cv_summary(k_rows, kfold), "loso": cv_summary(l_rows, loso), "_kfold_rows": k_rows,
            "_kfold_held": kfold}


def cached_cross_validation() -> tuple[dict[str, Any] | None, list[str]]:
    """The packaged cross-validated figures, or None and why when the file's inputs fingerprint differs."""
    data = json.loads(PACKAGED_PATH.read_text(encoding="utf-8")) if PACKAGED_PATH.exists() else {}
    if "cross_validation" not in data:
        return None, ["no cross-validated figures in it"]
    if data.get("inputs") != fingerprint(scored_cases()):
        return None, ["its inputs differ: calibration data, presets' efficiency, fit settings or the model"]
    return data["cross_validation"], []


def build(progress: Callable[[str], None] | None = None, jobs: int = 1) -> dict[str, Any]:
    cases = scored_cases()
    mem = memory_rows()
    cv = cross_validated(progress, cases, jobs)
    k_rows = cv.pop("_kfold_rows")
    tiers = tier_bands(cv.pop("_kfold_held"))
    step = [{"quantity": "step_s", "family": family, **held_out_band(k_rows, family, relative_interval),
             "method": STEP_METHOD + BAND_RULE} for family in ("dense", "moe")]
    return {"generator": REGENERATE, "built": _dt.date.today().isoformat(),
            "data": ["shared/calibration/megatron_golden.csv", "shared/calibration/published_runs.csv",
                     "shared/calibration/vtrain_runs.csv (training rows of the A100 refits only)"],
            "target_coverage": TARGET_COVERAGE, "folds": FOLDS, "seed": SEED,
            "inputs": fingerprint(cases),
            "bands": memory_bands(mem) + step,
            "cross_validation": cv,
            "tiers": tiers}


def text_of(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1) + "\n"


def same_but_date(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal apart from the build date."""
    return {k: v for k, v in a.items() if k != "built"} == {k: v for k, v in b.items() if k != "built"}


def stale_parts(old: dict[str, Any]) -> list[str]:
    """What differs between the packaged file and the model now, cheaply: the inputs fingerprint (the step-time
    cross-validation depends on nothing else) and the memory bands (recomputed in full)."""
    cases = scored_cases()
    out = []
    if old.get("inputs") != fingerprint(cases):
        out.append("inputs (calibration data, presets' efficiency, fit settings or the model's predictions)")
    with contextlib.redirect_stdout(io.StringIO()):
        fresh = memory_bands(memory_rows())
    if [b for b in old.get("bands", []) if b.get("quantity") == "peak_bytes"] != fresh:
        out.append("memory bands")
    if "tiers" not in old:
        out.append("tier bands (absent)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the packaged file is stale (seconds)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--jobs", type=int, default=1, help="fits run in parallel (0: one per CPU); same results")
    args = ap.parse_args()
    if not SHARED.is_dir():
        print(f"bands: {SHARED} is absent", file=sys.stderr)
        return 2
    if args.check:
        old = json.loads(PACKAGED_PATH.read_text(encoding="utf-8")) if PACKAGED_PATH.exists() else {}
        stale = stale_parts(old)
        print(f"{PACKAGED_PATH}: " + (f"stale ({'; '.join(stale)}): regenerate it with {REGENERATE}" if stale
                                      else "up to date"))
        return 1 if stale else 0
    data = build(None if args.quiet else lambda s: print(s, file=sys.stderr, flush=True), args.jobs)
    PACKAGED_PATH.write_text(text_of(data), encoding="utf-8")
    for b in data["bands"]:
        off = (f" -{b['lo_offset'] / GIB:.2f}/+{b['hi_offset'] / GIB:.2f} GiB" if b["quantity"] == "peak_bytes" else "")
        print(f"{b['quantity']:<10} {b['family']:<5} measured/predicted {b['lo_ratio']:.3f}..{b['hi_ratio']:.3f}{off}; "
              f"held-out coverage {100 * b['coverage']:.1f}% of {b['rows']} rows (level {100 * b['level']:.1f}%)")
    for t in data["tiers"].values():
        print(f"tier       {t['family']:<5} within-job band: one tier within {100 * t['tolerance']:.1f}% "
              f"({t['pairs']} pairs of {t['jobs']} jobs{', pooled' if t['pooled'] else ''}); leave-one-job-out "
              f"coverage {100 * t['coverage']:.1f}%")
    for scheme, cv in data["cross_validation"].items():
        print(f"{scheme}: median APE {100 * cv['median_ape']:.1f}%, p90 {100 * cv['p90_ape']:.1f}%, "
              f"within-20% {100 * cv['within_20']:.0f}% over {cv['rows']} rows")
    print(f"wrote {PACKAGED_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
