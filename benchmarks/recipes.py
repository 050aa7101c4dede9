#!/usr/bin/env python3
"""Recipe benchmark: how paraplan sees NVIDIA's own Megatron-Bridge performance recipes.

For every recipe of the packaged library whose model and GPU have presets, it estimates the recipe with all its
knobs (``paraplan estimate --recipe``) and plans the same job (model, GPU, count, sequence, GBS, precision, and the
recipe's MoE dispatcher knobs (``knobs.moe_knobs``: layouts are ranked at the dispatcher the job runs); the default
search space, as ``paraplan plan`` runs it). Per recipe:

- fits: the recipe's layout is predicted to fit in memory;
- top tier: the recipe, as estimated with its knobs, is in the pick's step-time tier (``paraplan.ranking``: its step
  time within the tier tolerance of the fastest layout that fits, or faster);
- within 10%: its predicted tokens/s/GPU is at least 90% of the top pick's.

Recipes Megatron-Core itself rejects (bridge_perf_recipes.md's notes) and jobs where nothing fits are counted apart.
A recipe whose coded layout is predicted not to fit stays in the counts (as not fitting); the last line says how
many of those have a docstring naming another layout ("docstring says PP=8; docstring says CP=2", the reference CSV
notes) that fits with the recipe's knobs: the
in-flight activations the coded layout keeps are Megatron's own schedule (``schedules.py``
``get_pp_rank_microbatches``: rank r of p keeps 2(p - r - 1) + (v - 1) p + 1 chunk micro-batches of the interleaved
schedule), so the code, not the count, disagrees with the published layout. ``--rows`` prints, for every recipe
predicted not to fit, the physics: the peak stage's chunk micro-batches in flight x activation bytes per chunk, the
other terms, against usable memory, the docstring's layout when the notes name one, and the library's recipe with the
same per-GPU settings at another GPU count (``other_scale``: data parallelism shards the model state differently).
The recipe CSV holds settings only, no measurements: this measures agreement with NVIDIA's choices, not accuracy.
The job is planned with the recipe's task (PEFT: frozen base weights, ``TrainingSpec.peft``), its MoE knobs and its
allocator (``PYTORCH_CUDA_ALLOC_CONF``: expandable segments leave no fragmentation allowance, for the recipe and for
the layouts searched, ``knobs.recipe_memory_options``).

Last line (issue 14 reads it):

    recipes: N compared (S skipped); fit F/N; top tier T/N; within 10% W/N; top tier or within 10% U/N (P%);
    fit and top tier or within 10% B/N[; not fit: N - F, of them G derived by NVIDIA by weak scaling, no published
    run, D whose coded layout does not fit, the docstring's does]

Recipes NVIDIA derived by weak scaling with no published run (``Recipe.derivation``, paraplan.recipes.provenance:
"legacy-scaled GBS" docstrings and the Llama-3.1-405B 128-GPU recipes that code the former harness's 256-GPU V2
layout at GBS 768) stay in the counts; two lines before the last count them apart: the derived ones, and the rest.

(top tier and within 10% compare layouts and speed whether or not the recipe fits; the last count asks both.)

Usage: python benchmarks/recipes.py [--model PRESET] [--gpu PRESET] [--rows]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paraplan.errors import NoFeasiblePlanError, PlannerError
from paraplan.recipes.catalogue import Recipe, bridge_recipes
from paraplan.recipes.compare import job_recipe_layouts, same_layout
from paraplan.recipes.knobs import estimate_recipe, moe_knobs, recipe_memory_options, recipe_run

if TYPE_CHECKING:
    from paraplan.estimator import Estimate

TOP_K = 1
"""Layouts the plan lists (the benchmark needs the pick and its tier only)."""
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
    tier_how: str = ""
    """Why it is top tier: ``same layout`` as the pick, ``in the band`` of the fastest, ``faster`` than every
    searched layout (its knobs are outside the search), or "" (not top tier)."""
    physics: str = ""
    """Why the recipe does not fit (``oom_physics``), "" when it fits."""
    docstring_fits: bool = False
    """It does not fit, the reference CSV notes say its docstring names another layout, and that layout fits with the
    recipe's knobs (``CODED_LAYOUT_OOM``): counted as not fitting, and named on the last line."""
    derivation: str = ""
    """``Recipe.derivation``: NVIDIA derived the recipe by weak scaling and published no run of it
    (``paraplan.recipes.provenance``); counted, and counted apart (``DERIVED``)."""

    @property
    def within(self) -> bool:
        return self.ratio >= 1.0 - WITHIN


DOCSTRING_LAYOUT = re.compile(r"docstring says (TP|PP|CP|VP|EP)=(\d+)")
"""A reference-CSV note naming the layout a recipe's docstring gives where the code differs (bridge_perf_recipes.md)."""
CODED_LAYOUT_OOM = "coded layout does not fit, the docstring's does"
DERIVED = "derived by NVIDIA by weak scaling, no published run"
"""What the recipes with a ``Recipe.derivation`` share (each reason starts with it; ``paraplan recipes`` prints them
in full): the same per-GPU settings as another GPU count's recipe, its model state sharded over fewer data-parallel
ranks, and no row of NVIDIA's published summary measured them."""


def docstring_layout(r: Recipe) -> dict[str, int]:
    """The layout fields the CSV notes say ``r``'s docstring gives instead of the coded ones (empty: none)."""
    notes = r.get("notes")
    return {k.lower(): int(v) for k, v in DOCSTRING_LAYOUT.findall(notes)} if isinstance(notes, str) else {}


def oom_physics(r: Recipe, est: Estimate) -> str:
    """Why ``est`` (``r`` with its knobs) does not fit: the peak stage's chunk micro-batches in flight x activation
    bytes per chunk, the other terms, usable memory; and the docstring's layout when the notes name one."""
    from dataclasses import fields

    from paraplan.units import GIB

    i = est.peak_stage
    st = est.stages[i]
    mem, units = st.memory, float(st.in_flight)
    act = float(mem.activations_bytes)
    state = float(mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes)
    parts = ", ".join(f"{f.name.removesuffix('_bytes').replace('_', ' ')} {float(getattr(st.other, f.name)) / GIB:.1f}"
                      for f in fields(st.other) if float(getattr(st.other, f.name)) >= 0.05 * GIB)
    text = (f"stage {i}: {units:.0f} chunk micro-batches in flight x {act / units / GIB:.2f} GiB = {act / GIB:.1f} "
            f"GiB activations + {state / GIB:.1f} GiB weights, grads, optimizer (weights "
            f"{float(mem.weights_bytes) / GIB:.1f}, grads {float(mem.grads_bytes) / GIB:.1f}, optimizer "
            f"{float(mem.optimizer_bytes) / GIB:.1f}) + {float(mem.other_bytes) / GIB:.1f} GiB other ({parts}) = "
            f"{est.peak_bytes / GIB:.1f} of {est.usable_bytes / GIB:.1f} GiB usable, "
            f"{(est.peak_bytes - est.usable_bytes) / GIB:.1f} GiB over")
    n_off = est.training.cpu_offloading_num_layers
    if n_off:
        layers = est.model.num_layers
        text += (f" (--cpu-offloading-num-layers {n_off}: {layers - n_off} of {layers} layers' activations stay, "
                 "L - N as TE's DefaultOffloadSynchronizer keeps them)")
    sib = other_scale(r)
    if sib is not None:
        try:
            alt_est = estimate_recipe(sib)
        except PlannerError:
            alt_est = None
        if alt_est is not None:
            alt_mem = alt_est.stages[alt_est.peak_stage].memory
            alt_state = float(alt_mem.weights_bytes + alt_mem.grads_bytes + alt_mem.optimizer_bytes)
            text += (f"; {sib.alias}, the same per-GPU settings on {sib.get('num_gpus')} GPUs (dp {sib.get('dp')}, "
                     f"GBS {sib.get('global_batch_size')}): peak {alt_est.peak_bytes / GIB:.1f} GiB, "
                     + ("fits" if alt_est.fits else "does NOT fit")
                     + f", weights, grads, optimizer {alt_state / GIB:.1f} GiB against {state / GIB:.1f} here")
    doc = docstring_layout(r)
    if doc:
        alt = docstring_estimate(r, doc)
        text += (f"; notes: {r.get('notes')}: " + (f"{alt.layout.short()} peak {alt.peak_bytes / GIB:.1f} GiB, "
                 + ("fits" if alt.fits else "does NOT fit") if alt is not None else "rejected"))
    return text


SCALE_FIELDS = ("source", "num_gpus", "dp", "global_batch_size", "notes", "config_variant")
"""Recipe columns that may differ between one recipe run at two scales (the rest are its per-GPU settings)."""


def other_scale(r: Recipe) -> Recipe | None:
    """The library recipe with ``r``'s model, GPU and every per-GPU setting at another GPU count (the Llama-3-70B
    32-GPU recipes are the 64-GPU ones with GBS 128, "legacy-scaled"), the largest such count; None when none."""
    same = [x for x in bridge_recipes() if x is not r and x.get("num_gpus") != r.get("num_gpus")
            and all(x.get(c) == r.get(c) for c in r.fields if c not in SCALE_FIELDS)]
    return max(same, key=lambda x: n if isinstance(n := x.get("num_gpus"), int) else 0) if same else None


def docstring_estimate(r: Recipe, doc: dict[str, int]) -> Estimate | None:
    """``r`` with its knobs at the docstring's layout (None when Megatron's rules reject it)."""
    try:
        return estimate_recipe(r, layout_overrides=doc)
    except PlannerError:
        return None


def compare(r: Recipe) -> Row | str:
    """The Row of ``r``, or why it was skipped."""
    from paraplan.search import plan, rank_keys
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu
    from paraplan.specs.training import TrainingSpec

    try:
        est = estimate_recipe(r)
    except PlannerError as err:
        return f"recipe rejected ({getattr(err, 'reason', '') or type(err).__name__})"
    doc_fits = False
    if not est.fits and docstring_layout(r):
        alt = docstring_estimate(r, docstring_layout(r))
        doc_fits = alt is not None and alt.fits
    job = recipe_run(r).job
    cluster = make_cluster(load_gpu(job.gpu), job.num_gpus)
    # the dispatcher knobs, not --delay-wgrad-compute: it needs the EP-overlap schedule (combined_1f1b), which the
    # default search does not explore (Megatron's rule DELAY_WGRAD_NEEDS_EP_OVERLAP would reject every layout)
    dispatch = {k: v for k, v in moe_knobs(r).items() if k != "delay_wgrad_compute"}
    training = TrainingSpec(seq_len=job.seq_len, global_batch_size=job.gbs, precision=job.precision,  # type: ignore[arg-type]
                            attention_backend=job.attention_backend, peft=r.get("task") == "peft",
                            **dispatch)  # type: ignore[arg-type]
    try:
        p = plan(est.model, cluster, training, top_k=TOP_K, options=recipe_memory_options(r),
                 recipes=job_recipe_layouts(est.model, cluster, training))
    except NoFeasiblePlanError:
        return "no layout fits the job"
    top = p.candidates[0]
    keys = rank_keys(p, est.layout, est.peak_bytes, float(est.time.step_s))
    in_tier = keys is not None and keys.tier == p.tiers[0]
    how = ("same layout" if same_layout(est, top) else "faster" if keys is not None and keys.step < 1.0
           else "in the band" if in_tier else "")
    return Row(alias=r.alias, fits=est.fits, top_tier=bool(how),
               ratio=float(est.throughput.tokens_per_s_per_gpu) / float(top.throughput.tokens_per_s_per_gpu),
               pick=top.layout.short(), tier_how=how, physics="" if est.fits else oom_physics(r, est),
               docstring_fits=doc_fits, derivation=r.derivation)


def model_key(alias: str) -> str:
    """The model part of a recipe alias (``llama3.1-405b-b200-bf16-128`` -> ``llama3.1-405b``)."""
    return "-".join(alias.split("-")[:2])


def summary(rows: list[Row], skipped: Counter[str]) -> str:
    n = len(rows)
    fit = sum(r.fits for r in rows)
    top = sum(r.top_tier for r in rows)
    within = sum(r.within for r in rows)
    either = sum(r.top_tier or r.within for r in rows)
    both = sum(r.fits and (r.top_tier or r.within) for r in rows)
    share = 100.0 * either / n if n else 0.0
    doc = sum(r.docstring_fits for r in rows)
    derived = sum(bool(r.derivation) for r in rows if not r.fits)
    apart = [f"{derived} {DERIVED}"] if derived else []
    apart += [f"{doc} whose {CODED_LAYOUT_OOM}"] if doc else []
    return (f"recipes: {n} compared ({sum(skipped.values())} skipped); fit {fit}/{n}; top tier {top}/{n}; "
            f"within 10% {within}/{n}; top tier or within 10% {either}/{n} ({share:.0f}%); fit and top tier or "
            f"within 10% {both}/{n}" + (f"; not fit: {n - fit}, of them " + ", ".join(apart) if apart else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="only recipes of this model preset")
    ap.add_argument("--gpu", help="only recipes on this GPU preset")
    ap.add_argument("--rows", action="store_true", help="print one line per recipe")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    skipped: Counter[str] = Counter()
    skipped_of: dict[str, Counter[str]] = {}
    for r in bridge_recipes():
        if not r.runnable or (args.model and r.model_preset != args.model) or (args.gpu and r.gpu_preset != args.gpu):
            continue
        got = compare(r)
        if isinstance(got, str):
            skipped[got] += 1
            skipped_of.setdefault(model_key(r.alias), Counter())[got] += 1
            if args.rows:
                print(f"  {r.alias:<42} skipped: {got}")
            continue
        rows.append(got)
        if args.rows:
            print(f"  {got.alias:<42} {'fits' if got.fits else 'OOM ':<4} {got.tier_how or '-':<11} "
                  f"{100 * got.ratio:5.1f}% of the pick ({got.pick})")
            if got.physics:
                print(f"    {got.physics}")
    per_model: dict[str, list[Row]] = {}
    for row in rows:
        per_model.setdefault(model_key(row.alias), []).append(row)
    for name, group in sorted(per_model.items()):
        print(f"  {name:<16} " + summary(group, skipped_of.get(name, Counter())).removeprefix("recipes: "))
    for reason, count in skipped.most_common():
        print(f"  skipped {count}: {reason}")
    derived = [r for r in rows if r.derivation]
    if derived:
        print(f"  {DERIVED} (paraplan recipes prints each reason): "
              + summary(derived, Counter()).removeprefix("recipes: "))
        print("  the others (not derived by weak scaling): "
              + summary([r for r in rows if not r.derivation], skipped).removeprefix("recipes: "))
    hows = Counter(r.tier_how for r in rows if r.top_tier)
    print("  top tier: " + ", ".join(f"{hows[h]} {h}" for h in ("same layout", "in the band", "faster"))
          + " (faster: predicted faster than every layout of the default search, its knobs are outside it)")
    print(summary(rows, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
