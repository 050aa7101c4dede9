"""Step time: the composer of the terms in ``paraplan.estimate.time``.

    step = m * t_stage + bubble + exposed_pp + exposed_dp + optimizer + overhead
    t_stage = compute + recompute + exposed TP + exposed CP + exposed EP      (slowest stage)
    bubble  = (p - 1)/v * t_stage         (Narayanan et al. 2021, arXiv:2104.04473, section 2.2)

Each term is a named function with its formula and source: compute (``time.compute``, per layer
in ``time.layer``), TP (``time.tp``), CP (``time.cp``), EP (``time.ep``), PP (``time.pp``), DP
(``time.dp``), optimizer (``time.optimizer``); the bubble is the schedule's
(``estimate.pipeline``); ``step_overhead_s`` is calibrated (``EfficiencySpec``). Collectives run
on the tier their group spans (``paraplan.specs.grid``, ``paraplan.specs.topology``). All formulas
are vectorised (layout fields may be numpy arrays), see docs/model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from paraplan.estimate.flops import model_flops_per_step, recompute_flops_per_step
from paraplan.estimate.layouts import LayerLayout, StepLayout
from paraplan.estimate.memory import block_recompute_frac, deferred_wgrad_entries
from paraplan.estimate.params import ParamTerms, StageLayers, padded_vocab, stage_params
from paraplan.estimate.time import compute, dp, ep, fsdp, offload, pp, tp
from paraplan.estimate.time.compute import ATTENTION_BWD_FACTOR, gemm_efficiency, gemm_s
from paraplan.estimate.time.layer import (
    LayerTime,
    attention_layer_time,
    frozen_wgrad_s,
    launch_bound_layer,
    layer_time,
    recompute_s,
)
from paraplan.estimate.time.optimizer import grad_accumulation_s, optimizer_s
from paraplan.layout import ParallelLayout
from paraplan.schedules import schedule_of
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.grid import Grid
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num
from paraplan.specs.training import TrainingSpec
from paraplan.units import TFLOP

__all__ = ["ATTENTION_BWD_FACTOR", "LayerTime", "StageTerms", "StageTime", "StepTime", "Throughput",
           "attention_layer_time", "gemm_efficiency", "gemm_s", "launch_bound_layer", "layer_time", "stage_terms",
           "stage_time", "step_time", "step_time_from_stages", "throughput"]


@dataclass(frozen=True, slots=True)
class StageTime:
    """One micro-batch (forward + backward) on one pipeline rank."""

    compute_s: Num
    recompute_s: Num
    link_s: dict[str, Num]
    exposed_s: dict[str, Num]
    ep_paired_s: Num = 0.0
    """EP time left exposed when every micro-batch pass is paired with another's (``ep.paired_exposed_s``)."""
    host_bound_s: Num = 0.0
    """The host-bound part of ``compute_s`` (``LayerKindTerms.host_bound_s`` over the rank's layers)."""

    @property
    def total_s(self) -> Num:
        """Compute + recompute + exposed TP/CP/EP communication."""
        return self.compute_s + self.recompute_s + self.exposed_s["tp"] + self.exposed_s["cp"] + self.exposed_s["ep"]


@dataclass(frozen=True, slots=True)
class LayerKindTerms:
    """What ``stage_time`` reads of one layer kind (dense, MoE or MTP), per micro-batch."""

    compute_s: Num
    recompute_s: Num
    tp_link_s: Num
    ep_link_s: Num
    cp_link_s: Num
    attn_fwd_s: Num
    cp_exposed_s: Num = 0.0
    ep_unpaired_s: Num = 0.0
    """EP time exposed by a pass that runs alone (``ep.unpaired_exposed_s``, before ``ep_overlap_frac``)."""
    ep_paired_s: Num = 0.0
    """EP time exposed by a pass paired with another micro-batch's (``ep.paired_exposed_s``)."""
    ep_paired_chunk_s: Num = 0.0
    """EP time a combined chunk pair exposes once at its start and end (``ep.paired_chunk_s``)."""
    tp_exposed_s: Num = 0.0
    """TP time that shows (``LayerTime.tp_exposed_s``: per GEMM pair under --tp-comm-overlap)."""
    host_bound_s: Num = 0.0
    """Host-bound time in ``compute_s`` (``LayerTime.host_bound_s``: the GPU waits for the host after an MoE sync)."""


@dataclass(frozen=True, slots=True)
class StageTerms:
    """The stage-independent terms of ``stage_time`` (fields may be arrays): computed once per
    layout, or once per distinct per-layer combination in the search
    (``paraplan.layout.layer_key_table``) and gathered with ``take``."""

    parts: tuple[LayerKindTerms, ...]
    """Dense layers, then MoE layers (MoE models), then MTP layers (models with MTP)."""
    tp_exposed_frac: Num
    """Share of the output layer's TP communication not hidden (1 - ``tp.overlap_frac``); the layers' exposed TP
    time is their own (``LayerKindTerms.tp_exposed_s``)."""
    logits_s: Num
    """Output layer and loss of one head."""
    embedding_s: Num
    """Embedding lookup on the first stage."""
    output_tp_link_s: Num
    """TP all-gathers around the output layer."""
    bf16_start_s: Num = 0.0
    """Extra compute + recompute of ONE of the model's first ``num_layers_at_start_in_bf16`` BF16 layers
    (``first_last_layers_bf16``; ``bf16_layers_extra_s``); a stage adds it per such layer it holds
    (``StageLayers.num_bf16_start_layers``)."""
    bf16_end_s: Num = 0.0
    """Same for one of the model's last ``num_layers_at_end_in_bf16`` layers."""
    logits_wgrad_s: Num = 0.0
    """The output layer's weight-gradient GEMM of one micro-batch (part of ``logits_s``): what
    ``--defer-embedding-wgrad-compute`` moves to the pipeline flush (``deferred_wgrad_terms``)."""

    def take(self, index: NDArray[np.int64]) -> StageTerms:
        """Rows ``index`` of every array field."""
        def pick(v: Num) -> Num:
            """Rows ``index`` of an array field; a scalar stays."""
            return v if np.ndim(v) == 0 else np.asarray(v)[index]

        parts = tuple(LayerKindTerms(**{f.name: pick(getattr(k, f.name)) for f in fields(k)}) for k in self.parts)
        return StageTerms(parts=parts, tp_exposed_frac=pick(self.tp_exposed_frac), logits_s=pick(self.logits_s),
                          embedding_s=pick(self.embedding_s), output_tp_link_s=pick(self.output_tp_link_s),
                          bf16_start_s=pick(self.bf16_start_s), bf16_end_s=pick(self.bf16_end_s),
                          logits_wgrad_s=pick(self.logits_wgrad_s))


def bf16_layers_extra_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                        layout: LayerLayout) -> tuple[Num, Num]:
    """(start, end) extra compute + recompute per micro-batch of ONE layer that ``--first-last-layers-bf16`` keeps
    out of the FP8/FP4 autocast (``fp8_utils.get_fp8_context`` / ``fp4_utils.get_fp4_context``: the model's first
    ``num_layers_at_start_in_bf16`` and last ``num_layers_at_end_in_bf16`` layers by global layer number run a
    ``nullcontext``): its time in BF16 less its time in the low precision, for the kind (dense or MoE) of the
    model's first and last layer; 0 for an end with no BF16 layers. Each stage adds it once per such layer it holds
    (``StageLayers.num_bf16_start_layers`` / ``num_bf16_end_layers``: with VP or an uneven split not only the
    first/last stage). (0, 0) without the knob."""
    if not (training.first_last_layers_bf16 and training.precision in ("fp8", "fp4")):
        return 0.0, 0.0
    bf16 = replace(training, precision="bf16", first_last_layers_bf16=False, fp8_param_gather=False,
                   fp4_param_gather=False, fp8_dot_product_attention=False, nvfp4_quantize_kernel="fused")
    modules, eff = tuple(layout.recompute_modules), cluster.gpu.efficiency

    def extra(moe: bool) -> Num:
        """One layer of this kind in BF16 less in the low precision (compute + recompute)."""
        lo = layer_time(model, cluster, training, layout, moe=moe)
        hi = layer_time(model, cluster, bf16, layout, moe=moe)
        return (hi.compute_s - lo.compute_s + recompute_s(hi, layout, modules, eff, moe=moe)
                - recompute_s(lo, layout, modules, eff, moe=moe))

    pattern = model.moe_layer_pattern()
    return (extra(pattern[0]) if training.num_layers_at_start_in_bf16 else 0.0,
            extra(pattern[-1]) if training.num_layers_at_end_in_bf16 else 0.0)


def stage_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayerLayout) -> StageTerms:
    """Per-layer times of each layer kind and the per-micro-batch output/embedding terms."""
    eff = cluster.gpu.efficiency
    modules = tuple(layout.recompute_modules)
    dense = layer_time(model, cluster, training, layout, moe=False)
    kinds = [(dense, False)]
    if model.is_moe:
        kinds.append((layer_time(model, cluster, training, layout, moe=True), True))
    if model.mtp_num_layers:
        mtp_lt = kinds[-1][0] if model.mtp_layer_is_moe else dense
        kinds.append((mtp_lt, bool(model.is_moe and model.mtp_layer_is_moe)))
    delay = training.delay_wgrad_compute
    share = ep.ep_compute_share(cluster, training, Grid.inner(layout).ep_group) if model.is_moe else 1.0
    parts = tuple(LayerKindTerms(compute_s=lt.compute_s, recompute_s=recompute_s(lt, layout, modules, eff, moe=m),
                                 host_bound_s=lt.host_bound_s,
                                 tp_link_s=lt.tp_link_s, ep_link_s=lt.ep_link_s, cp_link_s=lt.cp_link_s,
                                 attn_fwd_s=lt.attn_fwd_s, cp_exposed_s=lt.cp_exposed_s, tp_exposed_s=lt.tp_exposed_s,
                                 ep_unpaired_s=ep.unpaired_exposed_s(lt.ep_link_s, lt.shared_gemm_fwd_s,
                                                                     shared_overlap=training.moe_shared_expert_overlap,
                                                                     compute_share=share),
                                 ep_paired_s=ep.paired_exposed_s(lt.ep_link_s, lt.compute_s, lt.mlp_gemm_fwd_s,
                                                                 delay_wgrad=delay, compute_share=share),
                                 ep_paired_chunk_s=ep.paired_chunk_s(lt.ep_link_s, lt.compute_s, lt.mlp_gemm_fwd_s,
                                                                     delay_wgrad=delay, compute_share=share))
                  for lt, m in kinds)
    tokens = training.seq_len * layout.mbs / layout.cp
    sh = np.where(layout.sp, layout.tp, 1)
    h = model.hidden_size
    tp_group = Grid.inner(layout).tp_group
    bf16_start, bf16_end = bf16_layers_extra_s(model, cluster, training, layout)
    vocab = padded_vocab(model, layout.tp)
    wgrad = gemm_s(cluster, compute.OUTPUT_LAYER_FP8, tokens, vocab / layout.tp, h)
    return StageTerms(
        bf16_start_s=bf16_start, bf16_end_s=bf16_end,
        parts=parts, tp_exposed_frac=1.0 - tp.overlap_frac(layout, eff),
        # PEFT: the frozen output layer runs no weight-gradient GEMM (time.layer.frozen_wgrad_s)
        logits_s=compute.logits_s(cluster, tokens, vocab, layout.tp, h, compute.loss_bytes_per_logit(training))
        - frozen_wgrad_s(training, wgrad),
        embedding_s=compute.embedding_s(cluster, tokens, h, sh),
        output_tp_link_s=tp.output_link_s(cluster, tp_group, tokens, h),
        logits_wgrad_s=wgrad - frozen_wgrad_s(training, wgrad),
    )


FLUSH_IDLE_SHARE = 2.0 / 3.0
"""Share of the pipeline bubble the last stage spends idle after its last backward (the flush): the backward's
share of a micro-batch's forward + backward (``GEMM_FWD_BWD_FACTOR`` 3: backward 2 of 3)."""


def deferred_wgrad_terms(training: TrainingSpec, layout: StepLayout, wgrad_s: Num, num_microbatches: Int,
                         heads: Num = 1.0) -> tuple[Num, Num]:
    """(per micro-batch time the last stage saves, deferred work at the flush) of
    ``--defer-embedding-wgrad-compute``: the output layer's weight-gradient GEMM (``wgrad_s`` per call) of D calls is
    kept back in its backward (tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``: the
    activation and gradient go to the buffers while fewer than the limit are held) and run after the last
    micro-batch (schedules.py ``finish_embedding_wgrad_compute``): saved = D / m x wgrad, deferred = D x wgrad, with
    D = ``memory.deferred_wgrad_entries`` (heads m, or min(limit, heads m)): the output layer runs once per head and
    micro-batch, ``heads`` = 1 + the stage's MTP layers (multi_token_prediction.py ``process_mtp_loss`` calls the
    shared ``output_layer`` for every MTP head, and each call appends to the same buffers). (0, 0) without the knob
    or with PP 1 (Megatron-Core refuses it there)."""
    if not training.defer_embedding_wgrad_compute:
        return 0.0, 0.0
    m = np.asarray(num_microbatches)
    d = deferred_wgrad_entries(training, m, heads)
    on = np.asarray(layout.pp) > 1
    return np.where(on, d / np.maximum(m, 1) * wgrad_s, 0.0), np.where(on, d * wgrad_s, 0.0)


def stage_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: StepLayout,
               stage: StageLayers, terms: StageTerms | None = None) -> StageTime:
    """Forward + backward of one micro-batch on one pipeline rank (all its chunks). ``terms``: the
    layout's ``stage_terms`` when already computed (the same for every stage)."""
    eff = cluster.gpu.efficiency
    terms = terms if terms is not None else stage_terms(model, cluster, training, layout)
    counts = [stage.num_dense_layers]
    if model.is_moe:
        counts.append(stage.num_moe_layers)
    if model.mtp_num_layers:
        counts.append(stage.num_mtp_layers)
    parts = list(zip(terms.parts, counts, strict=True))
    compute = sum(n * k.compute_s for k, n in parts)
    # the block method re-runs only the first recompute_num_layers decoder layers of each chunk (not MTP layers)
    decoder = 1 + int(model.is_moe)
    frac = block_recompute_frac(layout, stage)
    recompute = sum((frac if i < decoder else 1.0) * n * k.recompute_s for i, (k, n) in enumerate(parts))
    links: dict[str, Num] = {"tp": sum(n * k.tp_link_s for k, n in parts), "ep": sum(n * k.ep_link_s for k, n in parts),
             "cp": sum(n * k.cp_link_s for k, n in parts)}
    # logits and loss on the last stage (and per MTP head), embedding on the first
    heads = 1 + np.asarray(stage.num_mtp_layers)
    compute = compute + np.where(stage.has_output, heads * terms.logits_s, 0.0)
    compute = compute + np.where(stage.has_embedding, terms.embedding_s, 0.0)
    # the model's first / last BF16 layers by global layer number, wherever they sit (StageLayers)
    compute = compute + stage.num_bf16_start_layers * terms.bf16_start_s + stage.num_bf16_end_layers * terms.bf16_end_s
    links["tp"] = links["tp"] + np.where(stage.has_output, terms.output_tp_link_s, 0.0)
    if not training.gradient_accumulation_fusion and not training.peft:  # the unfused main-grad adds (no frozen grads)
        from paraplan.estimate.positions import max_positions_for

        held = stage_params(model, stage, tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                            max_positions=max_positions_for(model, training)[0]).total
        compute = compute + grad_accumulation_s(cluster, training, held)
    exposed: dict[str, Num] = {
        "tp": sum(n * k.tp_exposed_s for k, n in parts)
        + np.where(stage.has_output, terms.tp_exposed_frac * terms.output_tp_link_s, 0.0),
        "ep": (1.0 - eff.ep_overlap_frac) * sum(n * k.ep_unpaired_s for k, n in parts),
        "cp": sum(n * k.cp_exposed_s for k, n in parts),
    }
    paired = (1.0 - eff.ep_overlap_frac) * sum(n * k.ep_paired_s for k, n in parts)
    if model.is_moe:  # VP chunk pairs per micro-batch, each with its start and end (ep.paired_chunk_s)
        paired = paired + (1.0 - eff.ep_overlap_frac) * layout.vp * np.where(
            np.asarray(stage.num_moe_layers) > 0, terms.parts[1].ep_paired_chunk_s, 0.0)
    return StageTime(compute_s=compute, recompute_s=recompute, link_s=links, exposed_s=exposed, ep_paired_s=paired,
                     host_bound_s=sum(n * k.host_bound_s for k, n in parts))


@dataclass(frozen=True, slots=True)
class StepTime:
    """Step-time breakdown (seconds). ``step_s`` = compute + recompute + bubble + optimizer +
    overhead + sum of exposed communication."""

    step_s: Num
    compute_s: Num
    recompute_s: Num
    bubble_s: Num
    optimizer_s: Num
    overhead_s: Num
    exposed_comm_s: dict[str, Num]
    link_comm_s: dict[str, Num]
    bubble_frac: Num
    slowest_stage: Int
    host_bound_s: Num = 0.0
    """The host-bound part of ``compute_s`` (not added again to ``step_s``): where the GPU waits after an MoE
    layer's dispatcher sync while the host issues the layer's ops (``time.layer.moe_host_bound_s``); 0 when the
    host runs ahead (no sync, or a CUDA graph / drop-and-pad / HybridEP's rank budget removes it)."""
    host_bound_per_layer_s: Num = 0.0
    """``host_bound_s`` per MoE layer and micro-batch (``LayerTime.host_bound_s``)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (scalar) breakdown."""
        return {
            "step_s": float(self.step_s), "compute_s": float(self.compute_s),
            "recompute_s": float(self.recompute_s), "bubble_s": float(self.bubble_s),
            "optimizer_s": float(self.optimizer_s), "overhead_s": float(self.overhead_s),
            "exposed_comm_s": {k: float(v) for k, v in self.exposed_comm_s.items()},
            "link_comm_s": {k: float(v) for k, v in self.link_comm_s.items()},
            "bubble_frac": float(self.bubble_frac), "slowest_stage": int(self.slowest_stage),
            "host_bound_s": float(self.host_bound_s), "host_bound_per_layer_s": float(self.host_bound_per_layer_s),
        }


def step_time_from_stages(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: StepLayout,
    stages: Sequence[StageLayers], *, num_microbatches: Int, max_positions: int, terms: StageTerms | None = None,
    params: ParamTerms | None = None,
) -> StepTime:
    """Step time of a layout given the stages to consider (all, or first/second/last). ``terms``
    and ``params``: the layout's ``stage_terms`` and ``params.param_terms`` when already computed
    (the search gathers them)."""
    eff = cluster.gpu.efficiency
    m = num_microbatches
    terms = terms if terms is not None else stage_terms(model, cluster, training, layout)
    times = [stage_time(model, cluster, training, layout, st, terms) for st in stages]
    deferred: Num = 0.0
    if training.defer_embedding_wgrad_compute:  # the last stage's output-layer wgrad GEMMs leave the steady state
        per_stage = [deferred_wgrad_terms(training, layout, terms.logits_wgrad_s, m, 1 + np.asarray(st.num_mtp_layers))
                     for st in stages]
        times = [replace(t, compute_s=t.compute_s - np.where(st.has_output, saved, 0.0))
                 for t, st, (saved, _) in zip(times, stages, per_stage, strict=True)]
        for st, (_, held) in zip(stages, per_stage, strict=True):
            deferred = np.maximum(deferred, np.where(st.has_output, held, 0.0))
    groups = dp.dp_groups(model, cluster, layout, max_positions, params)
    totals = np.stack([np.broadcast_to(np.asarray(st.total_s, dtype=float), np.shape(times[0].total_s))
                       for st in times])
    slow = np.argmax(totals, axis=0)

    def pick(values: list[Num]) -> Num:
        """Each layout's value on its slowest stage."""
        arr = np.stack([np.broadcast_to(np.asarray(v, dtype=float), totals.shape[1:]) for v in values])
        out: Num = np.take_along_axis(arr, np.expand_dims(slow, 0), 0)[0] if arr.ndim > 1 else arr[slow]
        return out

    def worst(values: list[Num]) -> Num:
        """Each layout's largest value over the stages."""
        out: Num = np.max(np.stack([np.broadcast_to(np.asarray(v, dtype=float), totals.shape[1:]) for v in values]), 0)
        return out

    t_stage = pick([st.total_s for st in times])
    sched = schedule_of(layout)
    bub_frac = sched.bubble_frac(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    bubble = bub_frac * m * t_stage
    # DP: every stage reduces its own gradients in parallel; the slowest one is exposed.
    dps = [dp.dp_times(model, cluster, layout, st, groups, max_positions, training) for st in stages]
    grad, gather, local = (worst(list(column)) for column in zip(*dps, strict=True))
    gpu_share = 1.0 - float(training.optimizer_offload_fraction) if training.optimizer_cpu_offload else 1.0
    optimizer = optimizer_s(cluster, gpu_share * local) + offload.optimizer_offload_s(
        training, local, cluster.gpu.host_bytes_per_s)
    dp_exposed, dp_link = dp.exposed_and_link_s(
        layout, grad, gather, eff.dp_overlap_frac * t_stage, m,
        recompute_hide_s=eff.dp_overlap_frac * pick([st.recompute_s for st in times]),
        units=fsdp.units_per_rank(model.num_layers + model.mtp_num_layers, layout.pp),
        behind_optimizer_s=dp.gather_behind_optimizer_s(layout, gather, optimizer, training))
    grid = Grid.of(layout)
    p2p = pp.p2p_time_s(cluster, grid.pp_group, pp.p2p_bytes(training.seq_len, layout.mbs, layout.cp,
                                                              model.hidden_size, np.where(layout.sp, layout.tp, 1)))
    exposed = {
        "tp": m * pick([st.exposed_s["tp"] for st in times]),
        "cp": m * pick([st.exposed_s["cp"] for st in times]),
        "ep": ep.exposed_s(sched, layout, m, pick([st.exposed_s["ep"] for st in times]),
                           pick([st.ep_paired_s for st in times])),
        "pp": pp.exposed_s(layout.pp, sched.p2p_exposed_transfers(pp=layout.pp, vp=layout.vp, num_microbatches=m),
                           p2p, eff.pp_overlap_frac * sched.p2p_overlap_scale(vp=layout.vp)),
        "dp": dp_exposed,
    }
    links = {
        "tp": m * pick([st.link_s["tp"] for st in times]),
        "cp": m * pick([st.link_s["cp"] for st in times]),
        "ep": m * pick([st.link_s["ep"] for st in times]),
        "pp": pp.link_s(layout.pp, sched.p2p_transfers(pp=layout.pp, vp=layout.vp, num_microbatches=m), p2p),
        "dp": dp_link,
    }
    if training.activation_offloading:  # host <-> device copies of offloaded activations (time.offload)
        from paraplan.estimate.memory import layer_activations, stage_offloaded_bytes

        la = layer_activations(model, training, layout)
        moved = [stage_offloaded_bytes(model, training, st, la) for st in stages]
        host = cluster.gpu.host_bytes_per_s
        exposed["offload"] = m * pick([offload.activation_offload_exposed_s(b, host, t.compute_s)
                                       for b, t in zip(moved, times, strict=True)])
        links["offload"] = m * offload.activation_offload_link_s(pick(moved), host)
    compute_s = m * pick([st.compute_s for st in times])
    # the deferred GEMMs run in the last stage's idle time after its last backward; what does not fit shows
    compute_s = compute_s + np.maximum(0.0, deferred - FLUSH_IDLE_SHARE * bubble)
    recompute = m * pick([st.recompute_s for st in times])
    overhead = eff.step_overhead_s
    step = compute_s + recompute + bubble + optimizer + overhead + sum(exposed.values())
    return StepTime(step_s=step, compute_s=compute_s, recompute_s=recompute, bubble_s=bubble,
                    optimizer_s=optimizer, overhead_s=overhead, exposed_comm_s=exposed,
                    link_comm_s=links, bubble_frac=bub_frac, slowest_stage=slow,
                    host_bound_s=m * pick([st.host_bound_s for st in times]),
                    host_bound_per_layer_s=terms.parts[1].host_bound_s if model.is_moe else 0.0)


def step_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: ParallelLayout, *,
              num_microbatches: int) -> StepTime:
    """Scalar path: all pipeline stages of one layout."""
    from paraplan.estimate.positions import max_positions_for
    from paraplan.estimate.stages import all_stage_layers, bf16_layers_of

    max_positions, _ = max_positions_for(model, training)
    stages = all_stage_layers(model, layout, bf16_layers_of(training))
    # ranks holding the same layers (most middle ranks) take the same time: time each kind once; the
    # slowest stage (the first maximum) and the DP maxima are unchanged, its index maps back
    first_of: dict[StageLayers, int] = {}
    for r, st in enumerate(stages):
        first_of.setdefault(st, r)
    t = step_time_from_stages(model, cluster, training, layout, list(first_of),
                              num_microbatches=num_microbatches, max_positions=max_positions)
    return replace(t, slowest_stage=np.asarray(list(first_of.values()))[t.slowest_stage])


@dataclass(frozen=True, slots=True)
class Throughput:
    """Tokens/s/GPU, model TFLOP/s per GPU, MFU and HFU (fractions)."""

    tokens_per_s_per_gpu: Num
    model_tflops_per_gpu: Num
    hardware_tflops_per_gpu: Num
    mfu: Num
    hfu: Num
    mfu_peak: str
    model_flops_per_step: Num

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``mfu_peak`` says which dense peak MFU/HFU divide by."""
        return {
            "tokens_per_s_per_gpu": float(self.tokens_per_s_per_gpu),
            "model_tflops_per_gpu": float(self.model_tflops_per_gpu),
            "hardware_tflops_per_gpu": float(self.hardware_tflops_per_gpu),
            "mfu": float(self.mfu), "hfu": float(self.hfu), "mfu_peak": self.mfu_peak,
            "model_flops_per_step": float(self.model_flops_per_step),
        }


def throughput(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: StepLayout,
               t: StepTime, *, mfu_peak: str = "bf16") -> Throughput:
    """Throughput from a step time (Megatron's FLOPs formula; MFU against the dense peak)."""
    n = cluster.num_gpus
    model_flops = model_flops_per_step(model, seq_len=training.seq_len,
                                       global_batch_size=training.global_batch_size, tp=layout.tp)
    per_chunk = model.num_layers / (layout.pp * layout.vp)
    block = (np.minimum(layout.recompute_num_layers, per_chunk) / per_chunk
             if layout.recompute_method == "block" else 1.0)
    extra = recompute_flops_per_step(model, seq_len=training.seq_len,
                                     global_batch_size=training.global_batch_size,
                                     recompute_code=layout.recompute_code,
                                     recompute_modules=tuple(layout.recompute_modules), full_frac=block)
    peak = cluster.gpu.peak_flops_per_s(mfu_peak)
    model_rate = model_flops / (t.step_s * n)
    hw_rate = (model_flops + extra) / (t.step_s * n)
    return Throughput(
        tokens_per_s_per_gpu=training.tokens_per_step / (t.step_s * n),
        model_tflops_per_gpu=model_rate / TFLOP, hardware_tflops_per_gpu=hw_rate / TFLOP,
        mfu=model_rate / peak, hfu=hw_rate / peak, mfu_peak=mfu_peak,
        model_flops_per_step=model_flops,
    )
