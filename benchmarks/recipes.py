#!/usr/bin/env python3
"""Recipe benchmark: how paraplan sees NVIDIA's own Megatron-Bridge performance recipes.

For every recipe of the packaged library whose model and GPU have presets, it estimates the recipe with all its
knobs (``paraplan estimate --recipe``) and plans the same job (model, GPU, count, sequence, GBS, precision, and the
recipe's MoE dispatcher knobs (``knobs.moe_knobs``: layouts are ranked at the dispatcher the job runs); the default
search space, as ``paraplan plan`` runs it). Per recipe:

- fits: the recipe's layout is predicted to fit in memory;
- top tier: its layout (TP, PP, VP, CP, EP, ETP, micro-batch, recompute) is one of the plan's top ``TOP_K``;
- within 10%: its predicted tokens/s/GPU is at least 90% of the top pick's.

Recipes Megatron-Core itself rejects (bridge_perf_recipes.md's notes) and jobs where nothing fits are counted apart.
The recipe CSV holds settings only, no measurements: this measures agreement with NVIDIA's choices, not accuracy.

Last line (issue 14 reads it):

    recipes: N compared (S skipped); fit F/N; top tier T/N; within 10% W/N; top tier or within 10% U/N (P%);
    fit and top tier or within 10% B/N

(top tier and within 10% compare layouts and speed whether or not the recipe fits; the last count asks both.)

Usage: python benchmarks/recipes.py [--model PRESET] [--gpu PRESET] [--rows]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass

from paraplan.errors import NoFeasiblePlanError, PlannerError
from paraplan.recipes.catalogue import Recipe, bridge_recipes
from paraplan.recipes.compare import same_layout
from paraplan.recipes.knobs import estimate_recipe, moe_knobs, recipe_run

TOP_K = 5
"""The plan's top tier: its first five layouts (``plan --top`` default)."""
WITHIN = 0.10


@dataclass(frozen=True, slots=True)
class Row:
    """One recipe against the plan of its job."""

    alias: str
    fits: bool
    top_tier: bool
    ratio: float
    """Recipe tokens/s/GPU over the top pick's."""
    pick: str

    @property
    def within(self) -> bool:
        return self.ratio >= 1.0 - WITHIN


def compare(r: Recipe) -> Row | str:
    """The Row of ``r``, or why it was skipped."""
    from paraplan.search import plan
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu
    from paraplan.specs.training import TrainingSpec

    try:
        est = estimate_recipe(r)
    except PlannerError as err:
        return f"recipe rejected ({getattr(err, 'reason', '') or type(err).__name__})"
    job = recipe_run(r).job
    try:
        p = plan(est.model, make_cluster(load_gpu(job.gpu), job.num_gpus),
                 TrainingSpec(seq_len=job.seq_len, global_batch_size=job.gbs, precision=job.precision,  # type: ignore[arg-type]
                              attention_backend=job.attention_backend, **moe_knobs(r)),  # type: ignore[arg-type]
                 top_k=TOP_K)
    except NoFeasiblePlanError:
        return "no layout fits the job"
    top = p.candidates[0]
    return Row(alias=r.alias, fits=est.fits, top_tier=any(same_layout(est, c) for c in p.candidates),
               ratio=float(est.throughput.tokens_per_s_per_gpu) / float(top.throughput.tokens_per_s_per_gpu),
               pick=top.layout.short())


def summary(rows: list[Row], skipped: Counter[str]) -> str:
    n = len(rows)
    fit = sum(r.fits for r in rows)
    top = sum(r.top_tier for r in rows)
    within = sum(r.within for r in rows)
    either = sum(r.top_tier or r.within for r in rows)
    both = sum(r.fits and (r.top_tier or r.within) for r in rows)
    share = 100.0 * either / n if n else 0.0
    return (f"recipes: {n} compared ({sum(skipped.values())} skipped); fit {fit}/{n}; top tier {top}/{n}; "
            f"within 10% {within}/{n}; top tier or within 10% {either}/{n} ({share:.0f}%); fit and top tier or "
            f"within 10% {both}/{n}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="only recipes of this model preset")
    ap.add_argument("--gpu", help="only recipes on this GPU preset")
    ap.add_argument("--rows", action="store_true", help="print one line per recipe")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    skipped: Counter[str] = Counter()
    for r in bridge_recipes():
        if not r.runnable or (args.model and r.model_preset != args.model) or (args.gpu and r.gpu_preset != args.gpu):
            continue
        got = compare(r)
        if isinstance(got, str):
            skipped[got] += 1
            if args.rows:
                print(f"  {r.alias:<42} skipped: {got}")
            continue
        rows.append(got)
        if args.rows:
            print(f"  {got.alias:<42} {'fits' if got.fits else 'OOM ':<4} {'top' if got.top_tier else '   '} "
                  f"{100 * got.ratio:5.1f}% of the pick ({got.pick})")
    per_model: dict[str, list[Row]] = {}
    for row in rows:
        per_model.setdefault(row.alias.split("-")[0] + "-" + row.alias.split("-")[1], []).append(row)
    for name, group in sorted(per_model.items()):
        print(f"  {name:<16} " + summary(group, Counter()).removeprefix("recipes: "))
    for reason, count in skipped.most_common():
        print(f"  skipped {count}: {reason}")
    print(summary(rows, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
