"""The recipe next to a plan's pick: when a recipe exists for the plan's model and GPU preset, the closest one (GPU
count, then sequence, then GBS; ``catalogue.closest_recipe``) is estimated with its layout and knobs on the plan's
job (GPU count, sequence, GBS, precision, the plan's cluster), or on its own job when its layout cannot run on the
plan's, and compared with the pick: memory term by term, step time term by term, tokens/s/GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paraplan.errors import PlannerError
from paraplan.units import GIB

if TYPE_CHECKING:
    from paraplan.estimate.memory import MemoryOptions
    from paraplan.estimator import Estimate
    from paraplan.recipes.catalogue import Recipe
    from paraplan.recipes.knobs import RecipeRun
    from paraplan.search import Plan, RecipeLayouts
    from paraplan.specs.cluster import ClusterSpec
    from paraplan.specs.model import ModelSpec
    from paraplan.specs.training import TrainingSpec

AGREE_FRAC = 0.03
"""A recipe within 3% of the pick's tokens/s/GPU agrees with it on speed (the RECIPE finding says so)."""

_MEMORY_TERMS = ("weights", "grads", "optimizer", "activations", "other")
MEMORY_KNOBS = ("reuse_grad_buf_for_mxfp8_param_ag",)
"""Not-modelled columns that lower a recipe's memory below paraplan's estimate; gradient and optimizer dtypes, FP8
and FP4 parameter gather, optimizer and activation offloading, PEFT, the fused cross entropy and the paged stash
are modelled (``knobs.training_knobs``), and the allocator's expandable segments (``knobs.recipe_memory_options``)."""


@dataclass(frozen=True, slots=True)
class RecipeComparison:
    """The recipe, how it was run (``at``: ``this job`` or ``its own job``), its estimate (None with ``error``)."""

    recipe: Recipe
    at: str
    run: RecipeRun | None = None
    estimate: Estimate | None = None
    error: str = ""

    def as_dict(self, pick: Estimate | None = None) -> dict[str, Any]:
        """The ``recipe`` block of plan/explain JSON."""
        r = self.recipe
        out: dict[str, Any] = {
            "source": r.source, "alias": r.alias, "origin": r.origin, "at": self.at, "derivation": r.derivation,
            "recipe_job": {"num_gpus": r.get("num_gpus"), "seq_length": r.get("seq_length"),
                           "global_batch_size": r.get("global_batch_size"), "precision": r.get("precision")},
            "not_modelled": list(self.run.not_modelled) if self.run else [], "error": self.error,
        }
        e = self.estimate
        if e is not None:
            from paraplan.estimator import config_dict

            out.update(config=config_dict(e.layout, e.training, e.num_microbatches),
                       memory={"peak_bytes": e.peak_bytes, "usable_bytes": e.usable_bytes, "fits": e.fits},
                       time={"step_s": float(e.time.step_s)},
                       throughput={"tokens_per_s_per_gpu": float(e.throughput.tokens_per_s_per_gpu),
                                   "mfu": float(e.throughput.mfu)})
            if pick is not None:
                out["vs_pick"] = {"peak_bytes": e.peak_bytes - pick.peak_bytes,
                                  "tokens_per_s_per_gpu_frac": float(e.throughput.tokens_per_s_per_gpu)
                                  / float(pick.throughput.tokens_per_s_per_gpu) - 1.0,
                                  "same_layout": same_layout(e, pick)}
        return out


def _estimate(run: RecipeRun, plan: Plan, num_gpus: int, options: MemoryOptions | None) -> Estimate:
    from dataclasses import replace

    from paraplan.estimator import estimate
    from paraplan.specs.cluster import make_cluster

    cluster = plan.cluster if num_gpus == plan.cluster.num_gpus else make_cluster(
        plan.cluster.gpu, num_gpus, plan.cluster.gpus_per_node)
    from paraplan.recipes.knobs import training_knobs

    training = replace(plan.training, seq_len=run.job.seq_len, global_batch_size=run.job.gbs,
                       precision=run.job.precision, attention_backend=run.job.attention_backend,  # type: ignore[arg-type]
                       **training_knobs(run.recipe, run.job.precision))  # its memory knobs, as estimate --recipe
    notes = [f"recipe {run.recipe.alias}", *run.notes]
    from paraplan.recipes.knobs import recipe_memory_options

    # the recipe runs with its own allocator setting (PYTORCH_CUDA_ALLOC_CONF), as estimate --recipe
    return estimate(run.model, cluster, training, run.layout, memory_options=recipe_memory_options(run.recipe, options),
                    extra_notes=notes)


def job_recipe_layouts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       recipes: tuple[Recipe, ...] | None = None) -> RecipeLayouts:
    """``ranking.RECIPE_FIELDS`` and aliases of the NVIDIA recipes for exactly this job (model and GPU preset, GPU
    count, sequence, GBS; ``recipes``: the packaged library when None), for the ``nvidia_recipe`` rule."""
    from paraplan.layout import RECOMPUTE_CODES
    from paraplan.recipes.catalogue import bridge_recipes
    from paraplan.recipes.knobs import layout_fields

    out: list[tuple[int, ...]] = []
    names: list[str] = []
    for r in recipes if recipes is not None else bridge_recipes():
        if not (r.runnable and r.model_preset == model.name and r.gpu_preset == cluster.gpu.name
                and r.get("num_gpus") == cluster.num_gpus and r.get("seq_length") == training.seq_len
                and r.get("global_batch_size") == training.global_batch_size):
            continue
        try:
            f, _ = layout_fields(r)
        except PlannerError:
            continue  # a malformed row: no layout to prefer
        etp = f["etp"] or f["tp"]
        out.append((f["tp"], f["pp"], f["vp"], f["cp"], f["ep"], etp if model.is_moe else f["tp"], f["mbs"],
                    RECOMPUTE_CODES[f["recompute"]]))
        names.append(r.alias)
    return tuple(dict.fromkeys(out)), tuple(names)


def compare_with_plan(plan: Plan, options: MemoryOptions | None = None,
                      recipes: tuple[Recipe, ...] | None = None) -> RecipeComparison | None:
    """The closest recipe for the plan's model and GPU, estimated (None when the pair has no recipe)."""
    from paraplan.recipes.catalogue import bridge_recipes, closest_recipe
    from paraplan.recipes.knobs import recipe_run

    tr = plan.training
    r = closest_recipe(recipes if recipes is not None else bridge_recipes(), model=plan.model.name,
                       gpu=plan.cluster.gpu.name, num_gpus=plan.cluster.num_gpus, seq_len=tr.seq_len,
                       gbs=tr.global_batch_size, precision=tr.precision)
    if r is None:
        return None
    errors = []
    here: dict[str, Any] = {"num_gpus": plan.cluster.num_gpus, "seq_len": tr.seq_len, "gbs": tr.global_batch_size,
                            "precision": tr.precision, "model": plan.model}
    jobs: tuple[tuple[str, dict[str, Any]], ...] = (("this job", here), ("its own job", {"model": plan.model}))
    for at, job in jobs:
        try:
            run = recipe_run(r, **job)
            return RecipeComparison(recipe=r, at=at, run=run, estimate=_estimate(run, plan, run.job.num_gpus, options))
        except PlannerError as err:
            errors.append(f"{at}: {err}")
    return RecipeComparison(recipe=r, at="none", error="; ".join(errors))


def same_layout(a: Estimate, b: Estimate) -> bool:
    """The same parallel sizes, micro-batch and recompute."""
    la, lb = a.layout, b.layout
    return all(getattr(la, f) == getattr(lb, f) for f in ("tp", "pp", "vp", "cp", "ep", "etp", "mbs", "recompute")) \
        and (la.recompute != "selective" or la.recompute_modules == lb.recompute_modules)


def _time_terms(e: Estimate) -> dict[str, float]:
    t = e.time
    terms = {"compute": float(t.compute_s), "recompute": float(t.recompute_s), "bubble": float(t.bubble_s),
             "optimizer": float(t.optimizer_s), "overhead": float(t.overhead_s)}
    terms.update({f"{k} comm": float(v) for k, v in t.exposed_comm_s.items()})
    return terms


def _memory_terms(e: Estimate) -> dict[str, float]:
    m = e.stages[e.peak_stage].memory
    return {k: float(getattr(m, f"{k}_bytes")) for k in _MEMORY_TERMS}


def _mechanism(term: str, rec: Estimate, pick: Estimate) -> str:
    """Why a step-time term differs, from the layouts."""
    a, b = rec.layout, pick.layout
    if term == "bubble":
        return (f"pipeline bubble: recipe PP {a.pp} VP {a.vp} over {rec.num_microbatches} micro-batches, pick PP "
                f"{b.pp} VP {b.vp} over {pick.num_microbatches}")
    if term == "recompute":
        return f"recompute: recipe {a.recompute}, pick {b.recompute}"
    if term == "tp comm":
        return (f"TP communication: recipe TP {a.tp}{' with' if a.tp_comm_overlap else ' without'} --tp-comm-overlap, "
                f"pick TP {b.tp}{' with' if b.tp_comm_overlap else ' without'}")
    if term == "dp comm":
        return (f"data-parallel gradient reduce-scatter and parameter all-gather over DP x CP: recipe "
                f"{a.dp * a.cp}{' Megatron-FSDP' if a.fsdp else ''}, pick {b.dp * b.cp}"
                f"{' Megatron-FSDP' if b.fsdp else ''} (what is not hidden behind compute)")
    if term == "pp comm":
        return f"pipeline sends: recipe PP {a.pp} VP {a.vp}, pick PP {b.pp} VP {b.vp}"
    if term == "cp comm":
        return f"context-parallel ring exchange: recipe CP {a.cp}, pick CP {b.cp}"
    if term == "ep comm":
        return f"expert all-to-all: recipe EP {a.ep}, pick EP {b.ep}"
    if term.endswith(" comm"):
        axis = term[:-5].upper()
        return f"exposed {axis} communication: recipe {a.short()}, pick {b.short()}"
    if term == "compute":
        text = (f"compute of the slowest stage (GEMM efficiency at the per-GPU shapes, layers per stage): recipe TP "
                f"{a.tp} mbs {a.mbs} PP {a.pp} VP {a.vp} {_split(a)}, pick TP {b.tp} mbs {b.mbs} PP {b.pp} VP {b.vp} "
                f"{_split(b)}")
        host_rec, host_pick = float(rec.time.host_bound_s), float(pick.time.host_bound_s)
        if host_rec > 0 or host_pick > 0:  # inside compute_s: the GPU waits for the host after an MoE dispatcher sync
            text += (f", of which host-bound MoE layers (the GPU waits while the host issues a layer's ops after its "
                     f"dispatcher syncs, per layer and micro-batch): recipe {host_rec:.3f} s over "
                     f"{rec.num_microbatches} micro-batches, pick {host_pick:.3f} s over {pick.num_microbatches}")
        return text
    if term == "optimizer":
        return (f"optimizer step over the local shard: recipe DP x CP {a.dp * a.cp}, pick {b.dp * b.cp}")
    if term == "overhead":
        return (f"per-step and per-micro-batch overheads: recipe {rec.num_microbatches} micro-batches, pick "
                f"{pick.num_microbatches}")
    return f"{term}: recipe {a.short()}, pick {b.short()}"


def _split(lay: Any) -> str:
    """``even split`` or ``custom split`` (a pipeline layout or uneven first/last stages)."""
    custom = (lay.pipeline_layout or lay.first_stage_layers or lay.last_stage_layers or lay.account_for_embedding
              or lay.account_for_loss)
    return "custom split" if custom and lay.pp > 1 else "even split"


def _memory_mechanism(term: str, rec: Estimate, pick: Estimate) -> str:
    """Why a memory term of the peak stage differs, from the layouts and knobs."""
    a, b = rec.layout, pick.layout
    if term == "weights":
        fsdp = " and DP by Megatron-FSDP" if a.fsdp or b.fsdp else ""
        return (f"weights sharded over TP x PP (experts over EP){fsdp}: recipe TP {a.tp} PP {a.pp} EP {a.ep}"
                f"{' fsdp' if a.fsdp else ''}, pick TP {b.tp} PP {b.pp} EP {b.ep}{' fsdp' if b.fsdp else ''}")
    if term == "grads":
        rg, pg = ("bf16" if e.training.grad_reduce_in_bf16 or e.training.main_grads_dtype == "bf16" else "fp32"
                  for e in (rec, pick))
        return (f"gradient buffer: recipe {rg}{' sharded (fsdp)' if a.fsdp else ''}, pick {pg}"
                f"{' sharded (fsdp)' if b.fsdp else ''}, over TP x PP {a.tp * a.pp} vs {b.tp * b.pp}")
    if term == "optimizer":
        return (f"optimizer states sharded over DP x CP: recipe {a.dp * a.cp}, pick {b.dp * b.cp} (and over TP x PP "
                f"{a.tp * a.pp} vs {b.tp * b.pp})")
    if term == "activations":
        return (f"activations: recipe mbs {a.mbs} {a.recompute} recompute TP {a.tp} CP {a.cp} PP {a.pp} VP {a.vp}, "
                f"pick mbs {b.mbs} {b.recompute} TP {b.tp} CP {b.cp} PP {b.pp} VP {b.vp} (micro-batches in flight on "
                f"the peak stage: recipe {_in_flight(rec)}, pick {_in_flight(pick)})")
    return "other (logits, workspace, communication buffers)"


def _in_flight(e: Estimate) -> str:
    """``141 chunk micro-batches x 0.99 GiB = 140.0 GiB on stage 1``: the peak stage's activations by the schedule's
    in-flight count."""
    st = e.stages[e.peak_stage]
    units, act = float(st.in_flight), float(st.memory.activations_bytes)
    return (f"{units:.0f} chunk micro-batches x {act / max(units, 1.0) / GIB:.2f} GiB = {act / GIB:.1f} GiB on "
            f"stage {e.peak_stage}")


def outside_search(plan: Plan, rec: Estimate) -> list[str]:
    """What puts the recipe's layout outside the plan's search space (why the search could not rank it)."""
    sp, lay = plan.space, rec.layout
    if sp is None:
        return []
    out = []
    if lay.tp_comm_overlap and not sp.tp_comm_overlap:
        out.append("--tp-comm-overlap (plan --tp-comm-overlap)")
    for axis in ("tp", "pp", "vp", "cp", "ep", "mbs"):
        allowed = getattr(sp, axis)
        if allowed is not None and getattr(lay, axis) not in allowed:
            out.append(f"{axis.upper()} {getattr(lay, axis)} (searched {','.join(map(str, allowed))})")
    if lay.recompute not in sp.recompute:
        out.append(f"recompute {lay.recompute}")
    elif lay.recompute == "selective" and lay.recompute_modules != sp.recompute_modules:
        out.append(f"recompute modules {','.join(lay.recompute_modules)} (plan --recompute-modules)")
    if lay.pipeline_layout or lay.first_stage_layers or lay.last_stage_layers or lay.account_for_embedding \
            or lay.account_for_loss:
        out.append("its own pipeline split (the search uses even or balanced splits)")
    if not lay.sequence_parallel and lay.tp > 1 and False not in sp.sequence_parallel:
        out.append("sequence parallel off")
    variant = "fsdp" if lay.fsdp else ("distopt" if lay.distributed_optimizer else "ddp")
    if variant not in sp.dp_variants:
        out.append(f"data-parallel variant {variant}")
    return out


def _tier_text(plan: Plan, rec: Estimate, pick: Estimate, nums: dict[str, Any]) -> str:
    """Where the recipe's layout sits in the plan's tiers: in the pick's tier, equivalent within the band, and the
    rule that put the pick first; or how far beyond the band it is (``nums`` gets tier, in_tier, decided_by)."""
    from paraplan.ranking import rule_words
    from paraplan.search import first_rule, rank_keys

    if plan.objective != "throughput" or plan.ranking is None:
        return ""
    a = rank_keys(plan, pick.layout, pick.peak_bytes, float(pick.time.step_s))
    b = rank_keys(plan, rec.layout, rec.peak_bytes, float(rec.time.step_s))
    if a is None or b is None:
        return ""
    tol = plan.ranking.tier_tolerance
    nums.update(recipe_tier=b.tier, pick_tier=a.tier, in_tier=a.tier == b.tier)
    if b.step < 1.0:
        nums.update(faster_than_search=True)
        return (f"; the recipe is faster than every layout of this search ({100 * (b.step - 1):+.1f}% step time): "
                "what puts it outside the search (below) or its knobs make the difference")
    if a.tier != b.tier:
        return (f"; the recipe is tier {b.tier} (step {100 * (b.step - 1):+.1f}% over the fastest layout that fits; "
                f"tier 1 holds layouts within {100 * tol:.1f}%)")
    rule = first_rule(plan, a, b)
    nums["decided_by"] = rule
    if not rule:
        back = first_rule(plan, b, a)
        nums["recipe_decided_by"] = back
        return (f"; the recipe is in the pick's tier {a.tier} (equivalent within the {100 * tol:.1f}% band) and "
                f"would rank before it by {rule_words(back)}, were its layout with these knobs among this search's")
    return (f"; the recipe is in the pick's tier {a.tier}: equivalent within the {100 * tol:.1f}% step-time band; "
            f"the pick comes first by {rule_words(rule)}")


def _knobs_layout_split(cmp: RecipeComparison, plan: Plan, rec: Estimate, pick: Estimate) -> tuple[float, float] | None:
    """The recipe's step-time gap to the pick split at the recipe's layout run with the plan's knobs: (recipe minus
    that, what the recipe's knobs do; that minus the pick, what its layout does). None when that layout does not run
    without the recipe's knobs (a Megatron rule)."""
    from paraplan.errors import PlannerError
    from paraplan.estimator import estimate

    if cmp.run is None or cmp.at != "this job":
        return None
    try:
        mid = estimate(cmp.run.model, plan.cluster, plan.training, cmp.run.layout)
    except PlannerError:
        return None
    return float(rec.time.step_s) - float(mid.time.step_s), float(mid.time.step_s) - float(pick.time.step_s)


def recipe_finding(cmp: RecipeComparison, plan: Plan) -> tuple[str, str, dict[str, Any]]:
    """RECIPE: the recipe next to the pick, in numbers, and the term that differs most, as (code, text, numbers)
    for ``paraplan.explain.Finding`` (this module does not import explain: no import circle)."""
    pick = plan.candidates[0]
    r = cmp.recipe
    rec = cmp.estimate
    head = (f"{'NVIDIA' if r.origin == 'bridge' else 'your'} recipe {r.alias} ({r.get('num_gpus')} GPUs, seq "
            f"{r.get('seq_length')}, GBS "
            f"{r.get('global_batch_size')}, {r.get('precision')}; the closest for this model and GPU)")
    nums: dict[str, Any] = {"source": r.source, "alias": r.alias, "at": cmp.at}
    if r.derivation:
        nums["derivation"] = r.derivation
        head += f" [{r.derivation}]"
    if rec is None:
        return "RECIPE", f"{head}: its layout does not run here ({cmp.error})", nums
    pick_tps, rec_tps = float(pick.throughput.tokens_per_s_per_gpu), float(rec.throughput.tokens_per_s_per_gpu)
    gain = rec_tps / pick_tps - 1.0
    mem_terms, pick_mem = _memory_terms(rec), _memory_terms(pick)
    mem_diff = {k: mem_terms[k] - pick_mem[k] for k in _MEMORY_TERMS}
    mem_top = max(mem_diff, key=lambda k: abs(mem_diff[k]))
    nums.update(peak_bytes=rec.peak_bytes, pick_peak_bytes=pick.peak_bytes, fits=rec.fits,
                tokens_per_s_per_gpu=rec_tps, pick_tokens_per_s_per_gpu=pick_tps, gain_frac=gain,
                same_layout=same_layout(rec, pick), memory_term=mem_top, memory_term_diff_bytes=mem_diff[mem_top])
    text = (f"{head}, run with its knobs on {cmp.at}: {rec.layout.short()}, peak {rec.peak_bytes / GIB:.1f} GiB "
            f"({(rec.peak_bytes - pick.peak_bytes) / GIB:+.1f} vs the pick; {mem_top} {mem_diff[mem_top] / GIB:+.1f}"
            f" GiB), {rec_tps:,.0f} tokens/s/GPU ({100 * gain:+.1f}%)")
    if not rec.fits:
        lower = [x for x in (cmp.run.not_modelled if cmp.run else ()) if x.startswith(MEMORY_KNOBS)]
        nums["memory_knobs_not_modelled"] = lower
        text += (f"; predicted NOT to fit ({rec.peak_bytes / GIB:.1f} of {rec.usable_bytes / GIB:.1f} GiB usable, "
                 f"largest term {max(mem_terms, key=lambda k: mem_terms[k])})"
                 + (f", without its knobs that lower memory and paraplan does not model yet: {', '.join(lower)}"
                    if lower else ""))
    if cmp.at != "this job":
        text += "; compare per GPU only (another job)"
    elif same_layout(rec, pick) and abs(gain) <= AGREE_FRAC:
        text += "; the pick uses the same layout and agrees on speed"
    else:
        if same_layout(rec, pick):
            text += "; the pick uses the same layout with other knobs or data-parallel variant"
        terms, pick_terms = _time_terms(rec), _time_terms(pick)
        diffs = {k: terms.get(k, 0.0) - pick_terms.get(k, 0.0) for k in dict.fromkeys([*terms, *pick_terms])}
        ranked = sorted(diffs, key=lambda k: -abs(diffs[k]))
        step_gap = float(rec.time.step_s) - float(pick.time.step_s)
        nums.update(step_gap_s=step_gap, time_term=ranked[0], time_term_diff_s=diffs[ranked[0]],
                    time_terms_diff_s=diffs, memory_terms_diff_bytes=mem_diff)
        verdict = "agrees with the pick on speed" if abs(gain) <= AGREE_FRAC else (
            "is predicted faster than the pick" if gain > 0 else "is predicted slower")
        split = _knobs_layout_split(cmp, plan, rec, pick)
        if split is not None:
            nums.update(step_gap_knobs_s=split[0], step_gap_layout_s=split[1])
        text += (f"; it {verdict}: step {step_gap:+.3f} s"
                 + (f" ({split[0]:+.3f} s from its knobs, {split[1]:+.3f} s from its layout)" if split else "")
                 + " = " + ", ".join(f"{k} {diffs[k]:+.3f}" for k in ranked)
                 + " s; memory " + ", ".join(f"{k} {mem_diff[k] / GIB:+.1f}" for k in _MEMORY_TERMS) + " GiB"
                 + f"; most from {_mechanism(ranked[0], rec, pick)}"
                 + (f", then {_mechanism(ranked[1], rec, pick)}" if len(ranked) > 1 and diffs[ranked[1]] else "")
                 + f"; memory most from {_memory_mechanism(mem_top, rec, pick)}")
        text += _tier_text(plan, rec, pick, nums)
        outside = outside_search(plan, rec)
        if outside:
            nums["outside_search"] = outside
            text += "; outside this plan's search: " + ", ".join(outside)
    if cmp.run and cmp.run.not_modelled:
        nums["not_modelled"] = list(cmp.run.not_modelled)
        text += f"; not modelled yet: {len(cmp.run.not_modelled)} of its knobs (estimate --recipe {r.alias} lists them)"
    return "RECIPE", text, nums
