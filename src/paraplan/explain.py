"""Explanations of a plan, computed from numbers: structured findings, no prose templates elsewhere.

Each ``Finding`` has a code, a one-line text with the numbers, and the numbers themselves. The
findings follow the tuning order users apply (../shared/reference/tuning-method.md): fit first
(binding memory constraint, TP inside the node, PP only when TP is not enough, CP only for long
sequences, DP takes the rest), then speed (dominant time terms, bubble vs micro-batches,
interleaving, sequence parallel, distributed optimizer), and the gap to the runner-up term by term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paraplan.checkpoint import StorageSpec, advise, format_decimal_bytes
from paraplan.estimate.step_time import launch_bound_layer
from paraplan.estimator import Estimate
from paraplan.goodput import FailureSpec
from paraplan.schedules import schedule_label
from paraplan.search import Plan
from paraplan.specs.training import TrainingSpec
from paraplan.units import GB, GIB

LONG_SEQUENCE_TOKENS = 8192
"""NVIDIA's parallelism guide targets CP at sequences of 8K tokens and more (tuning-method.md 5)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason, with its numbers."""

    code: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "text": self.text, "numbers": self.numbers}


def _time_terms(est: Estimate) -> dict[str, float]:
    """The step's terms; the host-bound part of compute (the GPU waits for the CPU after an MoE sync:
    ``StepTime.host_bound_s``) is its own term, not GPU compute."""
    t = est.time
    hb = float(t.host_bound_s)
    terms = {"compute": float(t.compute_s) - hb, "host-bound (MoE)": hb, "recompute": float(t.recompute_s),
             "bubble": float(t.bubble_s), "optimizer": float(t.optimizer_s), "overhead": float(t.overhead_s)}
    terms.update({f"{k} comm": float(v) for k, v in t.exposed_comm_s.items()})
    return terms


def host_bound_fixes(training: TrainingSpec) -> list[str]:
    """The settings that make this dispatcher's MoE layer sync-free (``estimate.time.moe_sync.dispatcher_host_syncs``
    0, or a CUDA graph over the dispatch), only those Megatron-LM d98e8a6 accepts with it (transformer_config.py
    ``__post_init__``): drop-and-pad for alltoall and HybridEP, not DeepEP ("Flex token dispatcher with deepep backend
    does not support moe_pad_expert_input_to_capacity"), whose ``buffer.dispatch`` always waits, nor allgather, whose
    ``.cpu()`` runs at any capacity; HybridEP's rank budget, which needs ``--use-transformer-engine-op-fuser`` or
    ``--moe-use-grouped-tensor`` ("moe_expert_rank_capacity_factor with the 'hybridep' backend requires ...");
    the ``moe`` graph scope only with drop-and-pad ("moe cuda graph is only supported with drop-padding MoE");
    ``full_iteration`` only with a sync-free dispatcher."""
    drop_pad = "drop-and-pad (--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity)"
    dispatcher = training.moe_token_dispatcher_type
    if dispatcher == "flex" and training.moe_flex_dispatcher_backend == "hybridep":
        needs = "" if (training.use_transformer_engine_op_fuser or training.moe_use_grouped_tensor) else \
            " with --moe-use-grouped-tensor or --use-transformer-engine-op-fuser"
        return [f"HybridEP's rank budget (--moe-expert-rank-capacity-factor{needs})", drop_pad,
                "then a CUDA graph over the dispatch (--cuda-graph-impl full_iteration, or the moe scope with "
                "drop-and-pad)"]
    if dispatcher == "alltoall":
        return [drop_pad, "then a CUDA graph over the dispatch (--cuda-graph-modules moe, or --cuda-graph-impl "
                "full_iteration)"]
    current = "DeepEP, which waits for the counts in every dispatch and refuses drop-and-pad" \
        if dispatcher == "flex" else "allgather, whose .cpu() of the counts runs at any capacity"
    flex = "" if dispatcher == "flex" else "--moe-token-dispatcher-type flex "
    return [f"another dispatcher ({current}): HybridEP ({flex}--moe-flex-dispatcher-backend hybridep) with its rank "
            "budget (--moe-expert-rank-capacity-factor with --moe-use-grouped-tensor), or alltoall with " + drop_pad]


def memory_findings(plan: Plan, best: Estimate) -> list[Finding]:
    """Binding memory constraint of the best layout and of smaller model parallelism."""
    out = []
    peak = best.stages[best.peak_stage]
    stage = peak.memory.as_dict()
    terms = {k[:-6]: v for k, v in stage.items() if k != "total_bytes"}
    top_term = max(terms, key=lambda k: terms[k])
    detail = ""
    if top_term == "other":
        parts = {k[:-6].replace("_", " "): v for k, v in peak.other.as_dict().items()}
        detail = " (" + ", ".join(f"{k} {v / GIB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                                  if v >= 0.05 * GIB) + " GiB)"
    out.append(Finding(
        "BINDING_MEMORY",
        f"peak memory is stage {best.peak_stage}: {best.peak_bytes / GIB:.1f} GiB of {best.usable_bytes / GIB:.1f} "
        f"GiB usable ({100 * best.peak_bytes / best.usable_bytes:.0f}%); largest term {top_term} "
        f"{terms[top_term] / GIB:.1f} GiB{detail}",
        {"peak_bytes": best.peak_bytes, "usable_bytes": best.usable_bytes, "stage": best.peak_stage,
         "largest_term": top_term}))
    ev = plan.feasible
    if ev is not None:
        # the fewest GPUs a model replica needs (TP x PP x CP; EP borrows from DP), fastest first
        mp = ev.table.tp * ev.table.pp * ev.table.cp
        smallest = np.flatnonzero(mp == mp.min())
        i = int(smallest[np.argmax(ev.tokens_per_s_per_gpu[smallest])])
        out.append(Finding(
            "SMALLEST_MODEL_PARALLEL",
            f"smallest TP x PP x CP that fits: {int(mp[i])} (fastest of them {ev.table.row(i).short()}, "
            f"{ev.peak_bytes[i] / GIB:.1f} GiB, {float(ev.tokens_per_s_per_gpu[i]):.0f} tokens/s/GPU); "
            f"{plan.rejections.get('OOM', 0)} layouts rejected for memory",
            {"tp_x_pp_x_cp": int(mp[i]), "oom_rejections": plan.rejections.get("OOM", 0)}))
    return out


def _cp_finding(plan: Plan, best: Estimate) -> Finding:
    """Why the best layout splits the sequence: for memory (no CP = 1 layout fits) or for speed,
    with the best CP = 1 layout's throughput; below ``LONG_SEQUENCE_TOKENS`` that overrules the
    tuning rule "CP only for long sequences" (tuning-method.md rule 5), and the finding says so."""
    lay, tr, ev = best.layout, plan.training, plan.feasible
    data: dict[str, Any] = {"cp": lay.cp, "seq_len": tr.seq_len, "tokens_per_rank": tr.seq_len // lay.cp}
    head = f"CP {lay.cp} splits the {tr.seq_len}-token sequence ({tr.seq_len // lay.cp} tokens per rank)"
    if ev is None or not (ev.table.cp == 1).any():
        return Finding("CP_LONG_SEQUENCE", f"{head}: no layout with CP = 1 fits in memory", data)
    cp1 = np.flatnonzero(ev.table.cp == 1)
    i = int(cp1[np.argmax(ev.tokens_per_s_per_gpu[cp1])])
    best_cp1, ours = float(ev.tokens_per_s_per_gpu[i]), float(best.throughput.tokens_per_s_per_gpu)
    data.update(cp1_layout=ev.table.row(i).short(), cp1_tokens_per_s_per_gpu=best_cp1,
                gain_frac=ours / best_cp1 - 1.0)
    why = (f"the best CP = 1 layout ({ev.table.row(i).short()}) runs at {best_cp1:.0f} tokens/s/GPU vs "
           f"{ours:.0f} ({100 * (ours / best_cp1 - 1.0):+.1f}%)")
    if tr.seq_len >= LONG_SEQUENCE_TOKENS:
        return Finding("CP_LONG_SEQUENCE", f"{head}: {why}", data)
    return Finding("CP_SHORT_SEQUENCE",
                   f"{head}, below the {LONG_SEQUENCE_TOKENS} tokens from which the tuning rule uses CP; the "
                   f"numbers overrule the rule: {why}. Short chunks leave the ring exchange little attention "
                   "to hide behind: measure both before committing", data)


def _fit_means(best: Estimate) -> str:
    """What shards the model states of a PP = 1 layout: TP, EP, FSDP or the distributed optimizer."""
    lay = best.layout
    parts = [f"TP {lay.tp}"] if lay.tp > 1 else []
    if lay.ep > 1:
        parts.append(f"EP {lay.ep}")
    if lay.fsdp:
        parts.append("Megatron-FSDP sharding weights, gradients and optimizer states")
    elif lay.distributed_optimizer and lay.dp * lay.cp > 1:
        parts.append("the distributed optimizer")
    return ", ".join(parts) if parts else "replicated on every GPU"


def rule_findings(plan: Plan, best: Estimate) -> list[Finding]:
    """The tuning-order rules as they apply to the best layout."""
    lay, cl, tr = best.layout, plan.cluster, plan.training
    if lay.tp > 1:
        out = [Finding("TP_INSIDE_NODE",
                       f"TP {lay.tp} stays inside the {cl.nvlink_domain_size}-GPU NVLink domain: TP communicates "
                       f"every layer ({float(best.time.link_comm_s['tp']):.2f} s/step on the link)",
                       {"tp": lay.tp, "domain": cl.nvlink_domain_size})]
    else:
        out = [Finding("TP_NOT_NEEDED", "TP = 1: the layers are not split, so there is no per-layer TP traffic",
                       {"tp": 1, "domain": cl.nvlink_domain_size})]
    ev = plan.feasible
    if lay.pp > 1 and ev is not None:
        pp1 = ev.table.pp == 1
        text = (f"PP {lay.pp} is used: " + ("no layout with PP = 1 fits in memory" if not pp1.any() else
                f"the best PP = 1 layout runs at {float(ev.tokens_per_s_per_gpu[pp1].max()):.0f} tokens/s/GPU vs "
                f"{float(best.throughput.tokens_per_s_per_gpu):.0f}"))
        out.append(Finding("PP_WHEN_NEEDED", text, {"pp": lay.pp, "pp1_fits": bool(pp1.any())}))
    elif lay.pp == 1:
        out.append(Finding("PP_NOT_NEEDED", f"PP = 1: the model fits without a pipeline ({_fit_means(best)}), "
                           "so no pipeline bubble", {"pp": 1}))
    if lay.cp > 1:
        out.append(_cp_finding(plan, best))
    elif tr.seq_len >= LONG_SEQUENCE_TOKENS:
        out.append(Finding("CP_NOT_NEEDED", f"CP = 1 although the sequence is {tr.seq_len} tokens: "
                           "activations fit without splitting it", {"seq_len": tr.seq_len}))
    m, p = best.num_microbatches, lay.pp
    out.append(Finding("DP_TAKES_REST", f"DP = {lay.dp} = {cl.num_gpus} / (TP {lay.tp} x PP {lay.pp} x CP {lay.cp}); "
                       f"{m} micro-batches of {lay.mbs}", {"dp": lay.dp, "num_microbatches": m}))
    if p > 1:
        bub = float(best.time.bubble_frac)
        if lay.schedule:
            label = schedule_label(lay.schedule, lay.vp)
            out.append(Finding("BUBBLE", f"pipeline bubble {100 * bub:.1f}% under {label} (VP {lay.vp}); "
                               f"m/p = {m / p:.1f}",
                               {"bubble_frac": bub, "m_over_p": m / p, "vp": lay.vp, "schedule": lay.schedule}))
        else:
            vp_text = (f"interleaved with VP {lay.vp}" if lay.vp > 1 else "not interleaved")
            out.append(Finding("BUBBLE", f"pipeline bubble (p-1)/(v*m) = ({p}-1)/({lay.vp}x{m}) = {100 * bub:.1f}% "
                               f"({vp_text}); m/p = {m / p:.1f}", {"bubble_frac": bub, "m_over_p": m / p,
                                                                   "vp": lay.vp}))
    if lay.tp > 1:
        out.append(Finding("SEQUENCE_PARALLEL", "sequence parallel " + ("on" if lay.sp else "OFF") +
                           f" with TP {lay.tp}: norm/dropout activations sharded over TP", {"sp": lay.sp}))
    expert = (f"; expert states over expert-DP {lay.edp}" + (" (not sharded)" if lay.edp == 1 else "")
              if best.model.is_moe and (lay.fsdp or lay.distributed_optimizer) else "")
    out.append(Finding("OPTIMIZER_SHARDING",
                       (f"Megatron-FSDP shards weights, gradients and optimizer states over DP x CP {lay.dp * lay.cp}"
                        if lay.fsdp else
                        f"distributed optimizer shards optimizer states over DP x CP {lay.dp * lay.cp}"
                        if lay.distributed_optimizer else "optimizer states replicated (no distributed optimizer)")
                       + expert + f": {float(best.stages[best.peak_stage].memory.optimizer_bytes) / GIB:.1f} GiB "
                       "optimizer on the peak stage",
                       {"fsdp": lay.fsdp, "distributed_optimizer": lay.distributed_optimizer, "edp": lay.edp}))
    return out


def fsdp_findings(plan: Plan, best: Estimate) -> list[Finding]:
    """MEGATRON_FSDP: what the pick's Megatron-FSDP traffic costs (link and exposed, and why), and how many layouts
    the default scope (``estimate.time.fsdp.benchmarked``) left out."""
    left = plan.rejections.get("FSDP_NOT_BENCHMARKED", 0)
    lay, parts = best.layout, []
    numbers: dict[str, Any] = {"left_out": left}
    if lay.fsdp:
        link, exposed = float(best.time.link_comm_s["dp"]), float(best.time.exposed_comm_s["dp"])
        m = best.training.global_batch_size // (lay.mbs * lay.dp)
        parts.append(f"Megatron-FSDP moves {link:.2f} s per step over DP x CP {lay.dp * lay.cp} (2 parameter "
                     f"all-gathers and 1 gradient reduce-scatter of the rank's weights per micro-batch, {m} "
                     f"micro-batches), {exposed:.2f} s exposed: each layer's traffic hides behind one layer's "
                     f"compute, the first layer of each of the {lay.vp} chunk(s) in each pass does not")
        numbers.update(link_s=link, exposed_s=exposed, num_microbatches=m)
    if left:
        parts.append(f"Megatron-FSDP left out of {left:,} layouts (searched by default only at PP 1, CP 1, TP 1, or "
                     "TP up to 2 on Blackwell, where NVIDIA runs it; `plan --dp-variant fsdp` searches it everywhere)")
    return [Finding("MEGATRON_FSDP", "; ".join(parts), numbers)] if parts else []


def time_findings(best: Estimate, runner_up: Estimate | None, rule: str = "") -> list[Finding]:
    """Dominant time terms and the gap to the runner-up, term by term (``rule``: the ranking rule that put the
    best first, ``Plan.decided_by[0]``)."""
    terms = _time_terms(best)
    step = float(best.time.step_s)
    top = sorted(terms.items(), key=lambda kv: -kv[1])[:3]
    # "compute" here leaves the host-bound time out (its own term), unlike estimate's and the RECIPE breakdown's
    label = {"compute": "compute excl. host-bound (MoE)"} if terms["host-bound (MoE)"] > 0.0 else {}
    out = [Finding("DOMINANT_TIME", "step " + f"{step:.2f} s: " + ", ".join(
        f"{label.get(k, k)} {v:.2f} s ({100 * v / step:.0f}%)" for k, v in top), {"step_s": step, **dict(top)})]
    if runner_up is not None:
        other = _time_terms(runner_up)
        diffs = {k: other[k] - terms[k] for k in terms}
        # the largest differences, those that show at the printed precision (1 ms): a zero term says nothing
        big = [kv for kv in sorted(diffs.items(), key=lambda kv: -abs(kv[1])) if abs(kv[1]) >= 5e-4][:3]
        gap = float(runner_up.time.step_s) - step
        if abs(gap) <= 1e-9 * step:
            mem = (runner_up.peak_bytes - best.peak_bytes) / GIB
            from paraplan.ranking import rule_words

            text = (f"runner-up {runner_up.layout.short()} ties on step time ({step:.3f} s) and needs "
                    f"{mem:+.1f} GiB peak; the tie goes to " + (rule_words(rule) if rule else
                    "the simpler layout (fewer parallel axes, then smaller TP, PP, VP, CP, EP, larger micro-batch, "
                    "lighter recompute, no FSDP)"))
        else:
            parts = ", ".join(f"{label.get(k, k)} {v:+.3f} s" for k, v in big)
            text = (f"runner-up {runner_up.layout.short()} is {gap:+.3f} s/step ({100 * gap / step:+.1f}%)"
                    + (f": {parts}" if parts else ""))
        out.append(Finding("RUNNER_UP_GAP", text, {"gap_s": gap, **{k: v for k, v in big}}))
    gpu_s, issue_s = launch_bound_layer(best.model, best.cluster, best.training, best.layout)
    if gpu_s < issue_s:
        out.append(Finding(
            "LAUNCH_BOUND",
            f"layers are launch-bound: {1e3 * gpu_s:.2f} ms of GPU work per layer and micro-batch is less "
            f"than the {1e3 * issue_s:.2f} ms the host needs to issue its kernels (layer_overhead_s), so "
            f"the GPU waits; more work per micro-batch (mbs {best.layout.mbs} now; a larger one, less TP, "
            "or fewer GPUs for this batch) would cost no extra time per micro-batch",
            {"gpu_s": gpu_s, "issue_s": issue_s, "mbs": best.layout.mbs}))
    if float(best.time.host_bound_s) > 0.0:  # time.layer.moe_host_bound_s
        per, hb = float(best.time.host_bound_per_layer_s), float(best.time.host_bound_s)
        out.append(Finding(
            "HOST_BOUND",
            f"host-bound: {1e3 * per:.2f} ms per MoE layer and micro-batch ({hb:.2f} s, {100 * hb / step:.0f}% of the "
            "step): after the dispatcher's host sync the GPU waits while the CPU issues the layer's ops "
            "(host_op_issue_s); removed by " + "; ".join(host_bound_fixes(best.training)),
            {"host_bound_s": hb, "host_bound_per_layer_s": per}))
    return out


def _rule_detail(rule: str, a: Estimate, b: Estimate, plan: Plan) -> str:
    """The numbers behind a ranking rule between two listed layouts."""
    from paraplan.ranking import FREE_MEMORY_BANDS, parallel_dims

    la, lb = a.layout, b.layout
    if rule == "free_memory":
        step = plan.ranking.memory_step_bytes if plan.ranking else GIB
        return (f"{(a.usable_bytes - a.peak_bytes) / GIB:.1f} vs {(b.usable_bytes - b.peak_bytes) / GIB:.1f} GiB free "
                f"(counted in whole memory bands of {step / GIB:.1f} GiB free, up to {FREE_MEMORY_BANDS})")
    if rule in ("distributed_optimizer", "megatron_fsdp"):
        return f"{'Megatron-FSDP' if la.fsdp else 'distributed optimizer'} vs {'Megatron-FSDP' if lb.fsdp else 'not'}"
    if rule == "nvlink_domain":
        return "TP and CP groups inside the NVLink domain vs not"
    if rule == "even_pipeline_split":
        return "even split vs " + ("a custom pipeline layout" if lb.pipeline_layout else "uneven first/last stages")
    if rule == "fewer_parallel_dims":
        from paraplan.layout import LayoutTable

        dims = parallel_dims(LayoutTable.from_layouts([la, lb]))
        return f"{int(dims[0])} vs {int(dims[1])} of TP, PP, VP, CP, EP above 1"
    if rule == "nvidia_recipe":
        names = plan.ranking.recipe_names if plan.ranking else ()
        return f"the layout of NVIDIA recipe {', '.join(names)}"
    if rule in ("step_time", "tier", "memory_headroom"):
        return f"step {float(a.time.step_s):.3f} vs {float(b.time.step_s):.3f} s, peak {a.peak_bytes / GIB:.1f} vs " \
               f"{b.peak_bytes / GIB:.1f} GiB"
    return f"{la.short()} vs {lb.short()}"


def ranking_findings(plan: Plan) -> list[Finding]:
    """RANKING: the pick's tier (how many layouts the band cannot tell apart from the fastest) and the rule that
    put it before the runner-up, with that rule's numbers."""
    ctx, ev = plan.ranking, plan.feasible
    if ctx is None or ev is None or not plan.tiers or plan.objective != "throughput":
        return []
    from paraplan.ranking import MODEL_STATE_BINDS_FRAC, rule_words

    best = float(ev.step_s.min())
    in_tier1 = int((ev.step_s <= best * (1 + ctx.tier_tolerance)).sum())
    text = (f"tier {plan.tiers[0]}: {in_tier1} of {plan.num_feasible} layouts that fit are within "
            f"{100 * ctx.tier_tolerance:.1f}% of the fastest step time ({best:.3f} s): one tier: within "
            f"{100 * ctx.tier_tolerance:.1f}%, {ctx.tolerance_source}, the model's order of two layouts holds for "
            "fewer than 80% of measured pairs (benchmarks/bands.py)")
    nums: dict[str, Any] = {"tier": plan.tiers[0], "tier_size": in_tier1, "tier_tolerance": ctx.tier_tolerance,
                            "tier_tolerance_source": ctx.tolerance_source,
                            "fastest_step_s": best, "rules": list(ctx.rule_codes())}
    if len(plan.candidates) > 1 and plan.decided_by and plan.decided_by[0]:
        rule = plan.decided_by[0]
        a, b = plan.candidates[0], plan.candidates[1]
        text += (f"; #1 comes before #2 ({b.layout.short()}) by {rule_words(rule)}: "
                 f"{_rule_detail(rule, a, b, plan)}")
        nums["decided_by"] = rule
    if ctx.model_state_frac is not None:
        which = "Megatron-FSDP" if ctx.prefer_fsdp else "the distributed optimizer"
        text += (f"; model state is {100 * ctx.model_state_frac:.0f}% of the peak of the fastest "
                 f"distributed-optimizer layout (binds from {100 * MODEL_STATE_BINDS_FRAC:.0f}%), so {which} is "
                 "preferred in a tier")
    return [Finding("RANKING", text, nums)]


WHAT_IF_GAIN = 0.03
"""``explain`` names the best layout under a search change (TP comm overlap, more recompute
modules) when it is at least 3% faster than the plan's pick."""


def _what_if(plan: Plan, **change: Any) -> tuple[Estimate, float] | None:
    """The best layout of the plan's search with ``change`` applied to its space, and its
    throughput gain over the plan's pick; None without a space or a feasible layout. With both searches' feasible
    rows (throughput objective), the fastest layout of each: the gain is the change's, not that of the in-tier rules
    (``paraplan.ranking``), which may pick a slower layout of a step-time tier in either search."""
    from dataclasses import replace

    from paraplan.errors import NoFeasiblePlanError
    from paraplan.estimator import estimate
    from paraplan.search import plan as search

    if plan.space is None:
        return None
    try:
        alt = search(plan.model, plan.cluster, plan.training, space=replace(plan.space, **change),
                     objective=plan.objective, top_k=1, headroom=plan.headroom,  # type: ignore[arg-type]
                     advise_gpu_counts=False)
    except NoFeasiblePlanError:
        return None
    ev, alt_ev = plan.feasible, alt.feasible
    both = ev is not None and alt_ev is not None and len(ev.step_s) > 0 and len(alt_ev.step_s) > 0
    if plan.objective == "throughput" and both and ev is not None and alt_ev is not None:
        other = estimate(plan.model, plan.cluster, plan.training, alt_ev.table.row(int(np.argmin(alt_ev.step_s))),
                         headroom=plan.headroom)
        return other, float(np.min(ev.step_s)) / float(other.time.step_s) - 1.0  # tokens/s ~ 1 / step
    other = alt.candidates[0]
    base = float(plan.candidates[0].throughput.tokens_per_s_per_gpu)
    return other, float(other.throughput.tokens_per_s_per_gpu) / base - 1.0


def overlap_findings(plan: Plan) -> list[Finding]:
    """The best layout if TP communication were overlapped with the GEMMs (``--tp-comm-overlap``,
    Transformer Engine userbuffers, which NVIDIA's Megatron-Bridge recipes turn on), when the plan
    did not assume it and it would gain at least ``WHAT_IF_GAIN``."""
    if plan.space is None or plan.space.tp_comm_overlap:
        return []
    found = _what_if(plan, tp_comm_overlap=True)
    if found is None or found[1] < WHAT_IF_GAIN:
        return []
    other, gain = found
    return [Finding("TP_COMM_OVERLAP", f"with --tp-comm-overlap (TE userbuffers; `plan --tp-comm-overlap`) the best "
                    f"layout is {other.layout.short()} at {float(other.throughput.tokens_per_s_per_gpu):.0f} "
                    f"tokens/s/GPU ({100 * gain:+.1f}%): TP traffic then hides behind the GEMMs",
                    {"layout": other.layout.short(), "gain_frac": gain})]


def _ep_span(est: Estimate) -> str:
    """Where an estimate's EP group runs: inside one NVLink domain, or across the network."""
    from paraplan.specs.grid import Grid
    from paraplan.specs.topology import span_in_domain

    span = int(Grid.of(est.layout).ep_group.span)
    block = est.cluster.topology.nvlink.block_gpus
    inside = bool(span_in_domain(span, block))
    return f"EP {est.layout.ep} spans {span} ranks, {'inside one' if inside else 'across'} NVLink domain" \
        + ("" if inside else "s (network)")


def ep_findings(plan: Plan, best: Estimate) -> list[Finding]:
    """EP_SIZE (MoE plans): the best layout with a larger expert-parallel size than the pick's (the EP sizes NVIDIA's
    recipes use, 32/64, when the pick's is smaller), next to the pick, term by term: why the smaller EP wins (the
    dispatch/combine on the network against the expert weights it shards), in numbers."""
    if not plan.model.is_moe or plan.space is None or plan.model.num_experts is None:
        return []
    e, world = best.layout.ep, plan.cluster.num_gpus
    larger = tuple(x for x in range(e + 1, min(plan.model.num_experts, world) + 1)
                   if plan.model.num_experts % x == 0 and world % x == 0 and x & (x - 1) == 0
                   and (plan.space.ep is None or x in plan.space.ep))
    if not larger:
        return []
    found = _what_if(plan, ep=larger)
    dispatcher: str = plan.training.moe_token_dispatcher_type
    if dispatcher == "flex":
        dispatcher += f" ({plan.training.moe_flex_dispatcher_backend})"
    if found is None:
        return [Finding("EP_SIZE", f"no layout with EP {', '.join(map(str, larger))} fits in memory "
                        f"({dispatcher} dispatcher); the pick's EP {e} does", {"ep": e, "larger": list(larger)})]
    other, gain = found
    terms, alt = _time_terms(best), _time_terms(other)
    diffs = {k: alt[k] - terms[k] for k in terms}
    big = sorted(diffs, key=lambda k: -abs(diffs[k]))[:3]
    step_gap = float(other.time.step_s) - float(best.time.step_s)
    mem = (other.peak_bytes - best.peak_bytes) / GIB
    verdict = "the pick's smaller EP wins" if gain <= 0 else "the larger EP is faster but not picked (tier rules)"
    text = (f"best with a larger EP: {other.layout.short()} at {float(other.throughput.tokens_per_s_per_gpu):,.0f} "
            f"tokens/s/GPU ({100 * gain:+.1f}%), {verdict}: step {step_gap:+.3f} s ("
            + ", ".join(f"{k} {diffs[k]:+.3f} s" for k in big)
            + f"), peak {mem:+.1f} GiB; EP link {float(other.time.link_comm_s['ep']):.2f} s vs "
            f"{float(best.time.link_comm_s['ep']):.2f} s per step with the {dispatcher} dispatcher: "
            f"{_ep_span(other)}, {_ep_span(best)}")
    if dispatcher == "alltoall" and "across" in _ep_span(other):
        text += "; DeepEP/HybridEP send a token once per remote node (--knob moe-token-dispatcher-type=flex)"
    return [Finding("EP_SIZE", text, {"ep": e, "larger_layout": other.layout.short(), "gain_frac": gain,
                                      "step_gap_s": step_gap, "peak_diff_bytes": other.peak_bytes - best.peak_bytes,
                                      **{f"{k} diff_s": diffs[k] for k in big}})]


def moe_recompute_modules(plan: Plan) -> tuple[str, ...]:
    """Selective-recompute modules for MoE/MLA models as NVIDIA's recipes use them: MLA's up
    projections, the expert activation and the norms, cheap to recompute next to what they free
    (moe_act and layernorm are not allowed with FP8 delayed scaling, Megatron's
    'Delayed scaling does not support moe_act and layernorm recompute for fp8.')."""
    mods = ["core_attn"] + (["mla_up_proj"] if plan.model.multi_latent_attention else [])
    if not (plan.training.precision == "fp8" and plan.training.fp8_recipe == "delayed"):
        mods += (["moe_act"] if plan.model.is_moe else []) + ["layernorm"]
    return tuple(mods)


def recompute_module_findings(plan: Plan) -> list[Finding]:
    """For MoE/MLA models planned with the default modules: the best layout when selective recompute
    also recomputes ``moe_recompute_modules``, if at least ``WHAT_IF_GAIN`` faster (the memory it
    frees buys a smaller model-parallel layout or a larger micro-batch)."""
    if (plan.space is None or plan.space.recompute_modules != ("core_attn",) or "selective" not in plan.space.recompute
            or not (plan.model.is_moe or plan.model.multi_latent_attention)):
        return []
    mods = moe_recompute_modules(plan)
    found = _what_if(plan, recompute_modules=mods) if mods != ("core_attn",) else None
    if found is None or found[1] < WHAT_IF_GAIN or found[0].layout.recompute != "selective":
        return []
    other, gain = found
    return [Finding("RECOMPUTE_MODULES", f"recomputing {', '.join(mods)} (`plan --recompute-modules "
                    f"{','.join(mods)}`) makes {other.layout.short()} the best layout at "
                    f"{float(other.throughput.tokens_per_s_per_gpu):.0f} tokens/s/GPU ({100 * gain:+.1f}%), peak "
                    f"{other.peak_bytes / GIB:.1f} GiB", {"modules": list(mods), "layout": other.layout.short(),
                                                         "gain_frac": gain})]


WHAT_IF_SCHEDULES = (("zb-h1", 1), ("dualpipe-v", 2))
"""The what-if schedules ``explain`` tries on the best layout, with the VP each runs with."""


def schedule_findings(plan: Plan, best: Estimate) -> list[Finding]:
    """What the what-if schedules (ZB-H1, DualPipe-V; ``paraplan.schedules``, not in Megatron-LM) would
    gain on the best layout when it pipelines: its step time, bubble and peak memory under each, same
    TP/PP/CP/DP/micro-batches (VP as the schedule needs), or why the schedule cannot run it."""
    from dataclasses import replace

    from paraplan.errors import LayoutError
    from paraplan.estimator import estimate
    from paraplan.schedules import NOT_IN_MEGATRON, schedule_named

    lay = best.layout
    if lay.pp == 1 or not schedule_named(lay.schedule).megatron:
        return []
    step = float(best.time.step_s)
    parts: list[str] = []
    numbers: dict[str, dict[str, Any]] = {}
    for name, vp in WHAT_IF_SCHEDULES:
        title = schedule_named(name).title
        alt_layout = replace(lay, schedule=name, vp=vp, first_stage_layers=0, last_stage_layers=0, pipeline_layout=())
        try:
            alt = estimate(plan.model, plan.cluster, plan.training, alt_layout)
        except LayoutError as err:
            parts.append(f"{title} cannot run it ({err.reason})")
            numbers[name] = {"reason": err.reason}
            continue
        alt_step = float(alt.time.step_s)
        gain = step / alt_step - 1.0
        fits = "fits" if alt.fits else "does NOT fit"
        parts.append(f"{title} (VP {vp}) {step:.2f} -> {alt_step:.2f} s/step ({100 * gain:+.1f}% tokens/s/GPU), bubble "
                     f"{100 * float(best.time.bubble_frac):.1f}% -> {100 * float(alt.time.bubble_frac):.1f}%, peak "
                     f"{alt.peak_bytes / GIB:.1f} GiB ({fits})")
        numbers[name] = {"step_s": alt_step, "gain_frac": gain, "bubble_frac": float(alt.time.bubble_frac),
                         "peak_bytes": alt.peak_bytes, "fits": alt.fits}
    return [Finding("SCHEDULE_WHAT_IF", f"what-if schedules, {NOT_IN_MEGATRON}, on {lay.short()}: " + "; ".join(parts)
                    + " (`plan --schedule zb-h1|dualpipe-v` searches with one)", numbers)]


CKPT_BLOCKING_FLAG = 0.05
"""Share of training blocked in checkpoint saves above which CHECKPOINT flags the storage as the limit."""


def checkpoint_findings(best: Estimate, storage: StorageSpec | None = None,
                        failures: FailureSpec | None = None) -> list[Finding]:
    """Checkpoint size and save time of the best layout, its Young/Daly interval and goodput; host-RAM and storage
    limits (``paraplan.checkpoint``, ``paraplan.goodput``)."""
    adv = advise(best, storage, failures)
    size, t, g = adv.size, adv.timing, adv.goodput
    blocked = g.save_blocking_s / (g.interval_s + g.save_blocking_s)
    out = [Finding("CHECKPOINT", f"checkpoint {format_decimal_bytes(size.total_bytes)} ({size.ckpt_format}, "
                   f"{format_decimal_bytes(size.max_bytes_per_rank)} per rank), save {t.save_s:,.1f} s at "
                   f"{t.bandwidth_bytes_per_s / GB:,.0f} GB/s; {g.failures_per_day:.2f} failures/day -> "
                   f"--save-interval {g.save_interval_iters} (Young/Daly), goodput {g.goodput:.1%}",
                   {**adv.as_dict(), "blocked_frac": blocked})]
    if t.host_ram_fits is False:
        assert storage is not None and storage.host_memory_bytes_per_node is not None
        staged = format_decimal_bytes(t.host_ram_bytes_per_node)
        ram = format_decimal_bytes(storage.host_memory_bytes_per_node)
        out.append(Finding("HOST_RAM_LIMIT", f"--async-save would stage {staged} per node > host RAM {ram}: the "
                           "first async save would exhaust it; launch writes a synchronous save",
                           {"host_ram_bytes_per_node": t.host_ram_bytes_per_node,
                            "host_memory_bytes_per_node": storage.host_memory_bytes_per_node}))
    if blocked > CKPT_BLOCKING_FLAG:
        out.append(Finding("STORAGE_LIMIT", f"checkpoint saves block {blocked:.0%} of training ({t.save_s:,.0f} s "
                           f"each, {t.storage_bound} bandwidth binds): faster storage or --async-save pays",
                           {"blocked_frac": blocked, "storage_bound": t.storage_bound}))
    return out


def recipe_findings(plan: Plan, recipe: Any = None) -> list[Finding]:
    """RECIPE: NVIDIA's closest recipe for the model and GPU next to the pick (``paraplan.recipes.compare``;
    ``recipe``: a RecipeComparison already made, else one with the default memory allowances); none without one."""
    from paraplan.recipes.compare import compare_with_plan, recipe_finding

    cmp = recipe if recipe is not None else compare_with_plan(plan)
    return [] if cmp is None else [Finding(*recipe_finding(cmp, plan))]


def explain(plan: Plan, storage: StorageSpec | None = None, failures: FailureSpec | None = None, *,
            recipe: Any = None) -> list[Finding]:
    """All findings for the best layout of a plan (``storage``/``failures``: the site's, for CHECKPOINT;
    ``recipe``: the RecipeComparison for RECIPE, made here when not given)."""
    best = plan.candidates[0]
    runner = plan.candidates[1] if len(plan.candidates) > 1 else None
    rej = ", ".join(f"{k} {v}" for k, v in sorted(plan.rejections.items(), key=lambda kv: -kv[1])) or "none"
    return (memory_findings(plan, best) + time_findings(best, runner, plan.decided_by[0] if plan.decided_by else "")
            + ranking_findings(plan) + rule_findings(plan, best)
            + schedule_findings(plan, best) + overlap_findings(plan) + recompute_module_findings(plan)
            + fsdp_findings(plan, best)
            + ep_findings(plan, best)
            + recipe_findings(plan, recipe)
            + checkpoint_findings(best, storage, failures)
            + [Finding("SEARCH", f"{plan.num_evaluated} layouts evaluated, {plan.num_feasible} fit; rejected: {rej}",
                       {"evaluated": plan.num_evaluated, "feasible": plan.num_feasible, **plan.rejections})])
