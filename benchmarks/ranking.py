#!/usr/bin/env python3
"""Ranking benchmark: does paraplan order layouts the way the measurements do?

A planner is used to pick among layouts of one job, so what matters beyond the error of each
estimate is the order. This groups the measured runs of ../shared/calibration/ by job (source,
model, GPU type, GPU count, global batch, sequence length, precision); every group with at least
three different layouts is a ranking problem. Predictions are benchmarks/calibration.py's
(``predict``). Per group it scores:

- pairwise order: for every pair of layouts whose measured throughputs differ by at least
  ``MIN_GAP`` (10%, above the run-to-run noise of the sources), is the faster one predicted faster;
- regret of the top pick: 1 - measured(predicted best) / measured(best) in the group.

A line before the last scores the planner's step-time tiers (``paraplan.ranking``): how often tier 1 (layouts
predicted within the tier tolerance of the best) holds a layout within 5% of the measured best, and the regret of
its worst layout (what a tie-break inside the tier could cost at most). Last line:

    ranking: pairwise order X% of N pairs (gap >= 10%); top pick within 5% of the best in A/B
    groups; median regret R%, p90 regret Q%

Usage: python benchmarks/ranking.py [--split published|vtrain|all] [--groups]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibration import predict  # noqa: E402
from paraplan.bands import family_of, tier_band_for  # noqa: E402
from paraplan.ranking import PROVISIONAL_TIER_TOLERANCE  # noqa: E402
from published_cases import Case, load_cases, pct  # noqa: E402

MIN_GAP = 0.10
"""Pairs closer than this are not scored: the sources repeat a layout with up to ~5-10% spread."""
GOOD_PICK = 0.05
"""A top pick within 5% of the measured best counts as a good pick."""


def tier_tolerance(c: Case) -> float:
    """The planner's step-time tier of the case's family (``paraplan.ranking.tier_tolerance``: the packaged
    within-job band, or the provisional 5% without one): layouts it cannot order; the ``tiers`` line scores them."""
    band = tier_band_for(family_of(c.moe))
    return PROVISIONAL_TIER_TOLERANCE if band is None else band.tolerance


def job_key(c: Case) -> tuple[Any, ...]:
    """What must be equal for two runs to be alternatives for the same job."""
    m = c.model
    dims = tuple(m.get(k) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                     "num_query_groups", "num_experts", "vocab_size"))
    return (c.source, dims, c.gpu, c.num_gpus, c.gbs, c.seq_len, c.precision)


def layout_key(c: Case) -> tuple[Any, ...]:
    return tuple(sorted((k, str(v)) for k, v in c.layout.items()))


def groups_of(cases: list[Case]) -> list[list[tuple[Case, float]]]:
    """Jobs with >= 3 distinct layouts; repeated layouts keep their mean measured throughput."""
    by_job: dict[tuple[Any, ...], dict[tuple[Any, ...], list[Case]]] = defaultdict(lambda: defaultdict(list))
    for c in cases:
        by_job[job_key(c)][layout_key(c)].append(c)
    out = []
    for layouts in by_job.values():
        if len(layouts) < 3:
            continue
        group = []
        for runs in layouts.values():
            measured = statistics.fmean(r.target_tokens_per_s_per_gpu for r in runs)
            group.append((runs[0], measured))
        out.append(group)
    return out


def score_group(group: list[tuple[Case, float]]) -> dict[str, Any] | None:
    """Pairwise order and top-pick regret of one job (None when no layout could be estimated)."""
    scored = [(c, meas, p) for c, meas in group if isinstance(p := predict(c), float) and p > 0]
    if len(scored) < 2:
        return None
    concordant = pairs = 0
    for (_, m1, p1), (_, m2, p2) in combinations(scored, 2):
        if max(m1, m2) < (1 + MIN_GAP) * min(m1, m2):
            continue
        pairs += 1
        concordant += int((m1 > m2) == (p1 > p2))
    best_measured = max(m for _, m, _ in scored)
    pick = max(scored, key=lambda t: t[2])
    # tier 1 of paraplan.ranking: predicted step within the tolerance of the fastest (throughput within 1 / (1 + tol))
    tier1 = [(c, m) for c, m, p in scored if p * (1 + tier_tolerance(c)) >= pick[2]]
    return {"case": scored[0][0], "n": len(scored), "pairs": pairs, "concordant": concordant,
            "regret": 1 - pick[1] / best_measured, "pick": pick[0], "tier1": len(tier1),
            "tier1_best_regret": 1 - max(m for _, m in tier1) / best_measured,
            "tier1_worst_regret": 1 - min(m for _, m in tier1) / best_measured}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("published", "vtrain", "all"), default="all")
    ap.add_argument("--groups", action="store_true", help="print one line per job")
    args = ap.parse_args()
    cases: list[Case] = []
    for split in ("published", "vtrain"):
        if args.split in (split, "all"):
            cases += load_cases(split)[0]
    results = [r for g in groups_of(cases) if (r := score_group(g)) is not None]
    per_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        per_source[r["case"].source].append(r)
    print(f"{'source':<34} {'jobs':>5} {'pairs':>6} {'order':>6} {'good pick':>10} {'med regret':>11}")
    for source, rs in sorted(per_source.items()):
        pairs = sum(r["pairs"] for r in rs)
        conc = sum(r["concordant"] for r in rs)
        good = sum(1 for r in rs if r["regret"] <= GOOD_PICK)
        order = f"{100 * conc / pairs:5.1f}%" if pairs else "   n/a"
        print(f"{source[:34]:<34} {len(rs):>5} {pairs:>6} {order:>6} {good:>5}/{len(rs):<4} "
              f"{100 * statistics.median(r['regret'] for r in rs):>10.1f}%")
    if args.groups:
        for r in sorted(results, key=lambda r: -r["regret"]):
            c = r["case"]
            print(f"  {c.source[:22]:<22} {c.label[:28]:<28} n={c.num_gpus:<4} gbs={c.gbs:<5} layouts={r['n']:<3} "
                  f"order {r['concordant']}/{r['pairs']} regret {100 * r['regret']:.1f}%")
    pairs = sum(r["pairs"] for r in results)
    conc = sum(r["concordant"] for r in results)
    regrets = [r["regret"] for r in results]
    good = sum(1 for x in regrets if x <= GOOD_PICK)
    tier_good = sum(1 for r in results if r["tier1_best_regret"] <= GOOD_PICK)
    worst = [r["tier1_worst_regret"] for r in results]
    tols = "/".join(f"{100 * t:.1f}%" for t in sorted({tier_tolerance(r["case"]) for r in results}))
    print(f"tiers (tolerance {tols}, paraplan.ranking): tier 1 holds a layout within "
          f"{100 * GOOD_PICK:.0f}% of the measured best in {tier_good}/{len(results)} groups (the top pick alone "
          f"{good}/{len(results)}); median tier-1 size {pct([float(r['tier1']) for r in results], 0.5):.0f} of "
          f"{pct([float(r['n']) for r in results], 0.5):.0f} layouts; regret of the worst tier-1 layout: median "
          f"{100 * pct(worst, 0.5):.1f}%, p90 {100 * pct(worst, 0.9):.1f}%")
    print(f"ranking: pairwise order {100 * conc / max(pairs, 1):.1f}% of {pairs} pairs (gap >= {100 * MIN_GAP:.0f}%); "
          f"top pick within {100 * GOOD_PICK:.0f}% of the best in {good}/{len(results)} groups; "
          f"median regret {100 * pct(regrets, 0.5):.1f}%, p90 regret {100 * pct(regrets, 0.9):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
