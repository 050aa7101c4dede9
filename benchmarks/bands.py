#!/usr/bin/env python3
"""Write src/paraplan/bands.json: the measured error bands of peak memory and step time (paraplan.bands).

    python benchmarks/bands.py            # writes src/paraplan/bands.json from ../shared/calibration
    python benchmarks/bands.py --check    # exit 1 when the packaged file differs from what it would write

Peak memory (megatron_golden.csv, the rows benchmarks/memory.py scores): the memory model has no fitted
constants, so its residuals are held-out residuals. Step time (published_runs.csv, the rows
benchmarks/calibration.py scores): every row is predicted by a model whose fitted efficiency parameters were
refitted per GPU architecture without it (seeded k-fold; benchmarks/fit_efficiency.py's fit). The band itself is
held out too: each fold's band is built from the other folds' rows and its coverage counted on the fold.
A band is the central interval of measured / predicted that holds for ``TARGET_COVERAGE`` of the rows, with
split-conformal order statistics (the ceil((n+1)(1 - a/2))-th of n), so that held-out coverage is at least the
target in expectation.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from paraplan.bands import PACKAGED_NAME  # noqa: E402
from paraplan.errors import SpecError  # noqa: E402
from paraplan.estimator import estimate  # noqa: E402
from paraplan.specs.cluster import make_cluster  # noqa: E402
from paraplan.specs.load import load_gpu  # noqa: E402

PACKAGED_PATH = ROOT / "src" / "paraplan" / PACKAGED_NAME
SHARED = ROOT.parent / "shared" / "calibration"
TARGET_COVERAGE = 0.8
FOLDS = 5
SEED = 18
"""Seed of the fold assignment (issue 18)."""
LEVEL_STEP = 0.005
MAX_LEVEL = 0.95
BAND_RULE = (f"central split-conformal interval of measured/predicted at the lowest level from "
             f"{100 * TARGET_COVERAGE:.0f}% (steps of {100 * LEVEL_STEP:.1f}%) whose {FOLDS}-fold held-out coverage "
             f"(seed {SEED}) is >= {100 * TARGET_COVERAGE:.0f}%")


@dataclass(frozen=True, slots=True)
class Row:
    """One measured value and its prediction (for step time: predicted by a model fitted without the row)."""

    id: str
    family: str
    predicted: float
    measured: float
    source: str = ""

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def fold_ids(n: int, folds: int = FOLDS, seed: int = SEED) -> list[int]:
    """Fold of each of ``n`` rows: a seeded shuffle dealt round-robin (fold sizes differ by at most one)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    out = [0] * n
    for pos, i in enumerate(order):
        out[i] = pos % folds
    return out


def conformal_interval(ratios: list[float], coverage: float = TARGET_COVERAGE) -> tuple[float, float]:
    """Central split-conformal interval of ``ratios``: the floor((n+1)a/2)-th and ceil((n+1)(1-a/2))-th order
    statistics (1-based, a = 1 - coverage), clamped to the sample; a new exchangeable ratio falls inside with
    probability >= coverage."""
    xs = sorted(ratios)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    a = 1 - coverage
    lo_rank = max(1, math.floor((n + 1) * a / 2 + 1e-9))  # 1e-9: 100 x 0.9 is 90.00000000000001 in floats
    hi_rank = min(n, math.ceil((n + 1) * (1 - a / 2) - 1e-9))
    return xs[lo_rank - 1], xs[hi_rank - 1]


def held_out_band(rows: list[Row], folds: int = FOLDS, seed: int = SEED) -> dict[str, Any]:
    """The band over all ``rows``, and its held-out coverage: each fold judged by the band of the other folds.

    The nominal level starts at ``TARGET_COVERAGE`` and rises in ``LEVEL_STEP`` steps until the held-out coverage
    reaches the target (finite folds can fall a little short of the conformal expectation); the band over all
    rows is then taken at that level."""
    fold = fold_ids(len(rows), folds, seed)
    level, covered = TARGET_COVERAGE, 0
    while True:
        covered = 0
        for k in range(folds):
            lo, hi = conformal_interval([r.ratio for r, f in zip(rows, fold, strict=True) if f != k], level)
            covered += sum(lo <= r.ratio <= hi for r, f in zip(rows, fold, strict=True) if f == k)
        if not rows or covered / len(rows) >= TARGET_COVERAGE or level >= MAX_LEVEL:
            break
        level = round(level + LEVEL_STEP, 4)
    lo, hi = conformal_interval([r.ratio for r in rows], level)
    return {"lo_ratio": round(lo, 4), "hi_ratio": round(hi, 4),
            "coverage": round(covered / len(rows), 4) if rows else math.nan, "rows": len(rows), "level": level}


# --- peak memory -------------------------------------------------------------------------------------------------

def memory_rows() -> list[Row]:
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
                           predicted=float(est.stages[-1].memory.total_bytes), measured=case["measured"]))
    return out


# --- step time ---------------------------------------------------------------------------------------------------

def step_s(case: Any, tokens_per_s_per_gpu: float) -> float:
    """Step time of a case at a throughput: gbs x seq / (tokens/s/GPU x GPUs)."""
    return float(case.gbs * case.seq_len / (tokens_per_s_per_gpu * case.num_gpus))


def step_rows_in_sample() -> list[Row]:
    """Predicted (presets as packaged) vs measured step time of every row benchmarks/calibration.py scores;
    measured / predicted step time = predicted / measured tokens/s/GPU."""
    from calibration import predict
    from published_cases import load_cases

    cases, _ = load_cases("published")
    out = []
    for c in cases:
        p = predict(c)
        if isinstance(p, float) and p > 0:
            out.append(Row(id=c.id, family="moe" if c.moe else "dense", predicted=step_s(c, p),
                           measured=step_s(c, c.target_tokens_per_s_per_gpu), source=c.source))
    return out


def bands(memory: list[Row], step: list[Row], step_method: str) -> list[dict[str, Any]]:
    out = []
    for quantity, rows, method in (
        ("peak_bytes", memory, "megatron_golden.csv max allocated bytes (last rank) vs the last stage's peak; " +
                               BAND_RULE),
        ("step_s", step, step_method),
    ):
        for family in ("dense", "moe"):
            fam = [r for r in rows if r.family == family]
            out.append({"quantity": quantity, "family": family, **held_out_band(fam), "lo_offset": 0.0,
                        "hi_offset": 0.0, "method": method})
    return out


def build() -> dict[str, Any]:
    mem = memory_rows()
    step = step_rows_in_sample()
    step_method = ("published_runs.csv step time (from tokens/s/GPU) vs the model as packaged (in-sample "
                   "efficiency fit); " + BAND_RULE)
    return {"generator": "python benchmarks/bands.py", "built": _dt.date.today().isoformat(),
            "data": ["shared/calibration/megatron_golden.csv", "shared/calibration/published_runs.csv"],
            "target_coverage": TARGET_COVERAGE, "folds": FOLDS, "seed": SEED,
            "bands": bands(mem, step, step_method)}


def text_of(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def same_but_date(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal apart from the build date."""
    return {k: v for k, v in a.items() if k != "built"} == {k: v for k, v in b.items() if k != "built"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the packaged file instead of writing")
    args = ap.parse_args()
    if not SHARED.is_dir():
        print(f"bands: {SHARED} is absent", file=sys.stderr)
        return 2
    data = build()
    if args.check:
        old = json.loads(PACKAGED_PATH.read_text(encoding="utf-8")) if PACKAGED_PATH.exists() else {}
        ok = same_but_date(old, data)
        print(f"{PACKAGED_PATH}: {'up to date' if ok else 'differs: regenerate it with python benchmarks/bands.py'}")
        return 0 if ok else 1
    PACKAGED_PATH.write_text(text_of(data), encoding="utf-8")
    for b in data["bands"]:
        print(f"{b['quantity']:<10} {b['family']:<5} measured/predicted {b['lo_ratio']:.3f}..{b['hi_ratio']:.3f}; "
              f"held-out coverage {100 * b['coverage']:.1f}% of {b['rows']} rows")
    print(f"wrote {PACKAGED_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
