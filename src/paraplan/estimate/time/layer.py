"""One transformer layer per micro-batch on one GPU: its attention block and its dense or MoE MLP,
as compute, host and link times (``LayerTime``), and what recomputing it costs."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Final

import numpy as np

from paraplan.estimate.flops import attention_heads_tensor_core_aligned, attention_score_fraction, attention_score_width
from paraplan.estimate.layouts import LayerLayout
from paraplan.estimate.time import compute, cp, ep, moe_sync, permute, tp
from paraplan.estimate.time.compute import ACT_FN_BYTES_PER_ELEMENT, ATTENTION_BWD_FACTOR, GEMM_FWD_BWD_FACTOR, gemm_s
from paraplan.layout import RECOMPUTE_CODES
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.grid import Axis, Grid
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num
from paraplan.specs.training import TrainingSpec

FWD_BWD_HALVES: Final = 2.0
"""Forward issues half of a layer's kernels and collectives, backward the other half (its host syncs are all in
the forward: ``moe_sync.BACKWARD_SYNCS``)."""
ELEMENTWISE_FWD_BWD_RATIO: Final = 3.0
"""Element-wise traffic forward + backward over forward: backward reads the saved input and the
output gradient and writes the input gradient, twice the forward's bytes."""
SWIGLU_FC1_FACTOR: Final = 2
"""SwiGLU's fc1 produces the gate and the up projection: 2 f output columns (GeLU: f)."""
MOE_ROUTER_LAUNCH_FRAC: Final = 0.5
"""Share of an MoE block's kernel issue (``block_overhead_s``) in its router and token preprocessing (the
``moe_router`` / ``moe_preprocess`` CUDA graph modules: gating GEMM, top-k, softmax, aux-loss and permutation
metadata kernels) against dispatch, expert GEMMs, activation and combine. Assumed (an even split of the MoE
block's launches; not derived from a kernel count, not fitted): docs/model.md section 4."""
FLEX_PROBS_BYTES: Final = 4.0
"""Routing probabilities under the flex dispatcher: fp32 (``routed_probs_bytes``)."""
SELECTIVE_ELEMENTWISE_DIVISOR: Final = 6.0
"""Selective recompute of ``layernorm`` (or ``moe_act``) re-runs half of the forward element-wise
traffic (1 / (``ELEMENTWISE_FWD_BWD_RATIO`` x 2) of the layer's): a modelling share, not measured."""


@dataclass(frozen=True, slots=True)
class LayerTime:
    """Time pieces of one layer for one micro-batch on one GPU (fields may be arrays)."""

    gemm_fwd_s: Num
    """Forward GEMMs (backward = 2x: dgrad + wgrad)."""
    attn_fwd_s: Num
    """Flash-attention forward (backward = 2.5x)."""
    elementwise_s: Num
    """Norms, activations, dropout, residual, rotary, permutation: forward + backward."""
    overhead_s: Num
    """Host time to issue the layer's kernels, forward + backward; the GPU runs behind it, so it
    counts only where it is longer than the GPU's time (``compute_s``)."""
    tp_link_s: Num
    ep_link_s: Num
    cp_link_s: Num
    mlp_gemm_fwd_s: Num = 0.0
    """Part of gemm_fwd_s in the (dense or MoE) MLP, for selective recompute of mlp/moe."""
    host_sync_s: Num = 0.0
    """Host-device synchronisations, forward + backward: the GPU drains its queue and then waits
    for the host, so this adds to the GPU's time (MoE token counts before the all-to-all:
    ``moe_sync.host_syncs_per_moe_layer`` x ``moe_sync.post_sync_ops`` x ``host_op_issue_s``; all of them in the
    forward)."""
    cp_exposed_s: Num = 0.0
    """The part of ``cp_link_s`` attention does not hide (``time.cp``: per ring step for p2p)."""
    cp_fwd_exposed_s: Num = 0.0
    """The forward's part of ``cp_exposed_s`` (re-run by full and ``core_attn`` recompute)."""
    mla_up_gemm_fwd_s: Num = 0.0
    """Part of gemm_fwd_s in MLA's query and key-value up projections, for selective recompute of mla_up_proj."""
    frozen_wgrad_s: Num = 0.0
    """Weight-gradient GEMM time the backward skips because the weights are frozen (PEFT: ``training.peft``; one
    forward's GEMM time, the wgrad's FLOPs; ``frozen_wgrad_s``)."""
    tp_exposed_s: Num = 0.0
    """The part of ``tp_link_s`` that shows, forward + backward (``tp.block_exposure``: per GEMM pair under
    --tp-comm-overlap)."""
    tp_fwd_exposed_s: Num = 0.0
    """The forward's part of ``tp_exposed_s`` (re-run by full recompute)."""
    shared_gemm_fwd_s: Num = 0.0
    """Forward GEMMs of the MoE layer's shared expert (part of gemm_fwd_s): what selective recompute of
    shared_experts re-runs, and what ``--moe-shared-expert-overlap`` hides the dispatch behind
    (``ep.unpaired_exposed_s``)."""
    host_bound_s: Num = 0.0
    """Host-bound time of an MoE layer, forward + backward: where the GPU waits after a dispatcher sync while the
    host issues the layer's ops, what those ops take beyond the GPU's time (``moe_host_bound_s``)."""
    host_bound_fwd_s: Num = 0.0
    """The forward's part of ``host_bound_s`` (re-run by full and ``moe`` recompute)."""

    @property
    def gpu_s(self) -> Num:
        """GPU work, forward + backward (GEMMs, attention, element-wise)."""
        return (GEMM_FWD_BWD_FACTOR * self.gemm_fwd_s - self.frozen_wgrad_s
                + (1.0 + ATTENTION_BWD_FACTOR) * self.attn_fwd_s + self.elementwise_s)

    @property
    def compute_s(self) -> Num:
        """Forward + backward compute: the GPU's time, or the host's kernel-issue time when that
        is longer (a launch-bound layer: the GPU waits for the CPU)."""
        return np.maximum(self.gpu_s, self.overhead_s) + self.host_sync_s + self.host_bound_s

    @property
    def gpu_fwd_s(self) -> Num:
        """The forward's part of ``gpu_s``: forward GEMMs, attention and 1 / ``ELEMENTWISE_FWD_BWD_RATIO`` of the
        element-wise traffic."""
        return self.gemm_fwd_s + self.attn_fwd_s + self.elementwise_s / ELEMENTWISE_FWD_BWD_RATIO


def graph_captured_frac(training: TrainingSpec, block: str) -> float:
    """Share of one half-layer's kernel issue that a CUDA graph replays instead of the host launching each kernel
    (``block``: "attn", "mlp" for a dense MLP, "moe" for an MoE block). A replayed graph costs one
    ``cudaGraphLaunch`` per capture instead of one launch per kernel (taken as free).

    Mirrors Megatron-Core: ``cuda_graph_impl`` none captures nothing; ``full_iteration`` captures the whole
    forward-backward (megatron/core/full_cuda_graph.py); the per-layer ``local`` / ``transformer_engine`` graphs
    capture the whole layer when ``cuda_graph_modules`` is empty, else the submodules listed
    (transformer_layer.py ``_get_submodules_under_cudagraphs``: attn = input norm + self-attention; mlp = a dense
    layer's MLP; moe = an MoE layer's whole MoE block; moe_router [+ moe_preprocess] = its router and
    preprocessing, ``MOE_ROUTER_LAUNCH_FRAC`` of its launches; local capture adds moe_preprocess to moe_router
    and back, transformer_config.py ``__post_init__``)."""
    impl, mods = training.cuda_graph_impl, training.cuda_graph_modules
    if impl == "none":
        return 0.0
    if impl == "full_iteration" or not mods:
        return 1.0
    if block == "moe":
        if "moe" in mods:
            return 1.0
        return MOE_ROUTER_LAUNCH_FRAC if "moe_router" in mods or "moe_preprocess" in mods else 0.0
    return 1.0 if block in mods else 0.0


def _issue_s(eff: EfficiencySpec, training: TrainingSpec, block: str) -> float:
    """Host issue time of one half-layer: ``block_overhead_s`` less what CUDA graphs replay."""
    return compute.block_overhead_s(eff) * (1.0 - graph_captured_frac(training, block))


def frozen_wgrad_s(training: TrainingSpec, gemm_fwd_s: Num) -> Num:
    """The weight-gradient GEMMs PEFT does not run: LoRA freezes the base weights (``requires_grad=False``), so
    TE's linear backward computes dgrad only (transformer_engine/pytorch/module/linear.py ``_linear_backward``: the
    wgrad GEMM runs only with ``requires_wgrad`` = the weight's ``requires_grad``): one forward GEMM time (wgrad =
    forward FLOPs) with ``training.peft``, else 0. The adapters' own GEMMs (rank 16-32 on a few projections) are
    neglected, as in the memory model (``TrainingSpec.peft``)."""
    return gemm_fwd_s if training.peft else 0.0


def fc1_width_factor(model: ModelSpec) -> int:
    """fc1 output columns per unit of FFN width: ``SWIGLU_FC1_FACTOR`` with SwiGLU, else 1."""
    return SWIGLU_FC1_FACTOR if model.swiglu else 1


def _ctx(layout: LayerLayout, training: TrainingSpec) -> tuple[Num, Int, Int]:
    """(tokens per rank s b / c, the sequence-parallel shard, TP)."""
    tokens = training.seq_len * layout.mbs / layout.cp
    sh = np.where(layout.sp, layout.tp, 1)
    return tokens, sh, layout.tp


def attention_layer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                         layout: LayerLayout) -> LayerTime:
    """Attention half of a layer: projections, flash attention, its norm/elementwise, TP/CP comm."""
    eff = cluster.gpu.efficiency
    fp8 = compute.gemm_precision(training)
    T, sh, t = _ctx(layout, training)
    h, a = model.hidden_size, model.num_attention_heads
    kv_width: Num = 0.0
    shapes: list[tuple[Num, Num, Num]]
    up_shapes: list[tuple[Num, Num, Num]] = []
    if model.multi_latent_attention:
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        ckv, cq = model.kv_lora_rank, model.q_lora_rank
        # the up projections (linear_q_up_proj, or linear_q_proj without q_lora_rank, and linear_kv_up_proj) are
        # what mla_up_proj recomputes (multi_latent_attention.py ``qkv_up_proj_and_rope_apply``)
        q_up: tuple[Num, Num, Num] = (T, a * dq / t, h) if cq is None else (T, a * dq / t, cq)
        kv_up: tuple[Num, Num, Num] = (T, a * (model.qk_head_dim + model.v_head_dim) / t, ckv)
        up_shapes = [q_up, kv_up]
        shapes = [q_up] if cq is None else [(T, cq, h), q_up]
        shapes += [(T, ckv + model.qk_pos_emb_head_dim, h), kv_up, (T, h, a * model.v_head_dim / t)]
    else:
        kv_width = model.head_dim * np.maximum(model.query_groups, t)
        shapes = [(T, (model.query_width + cp.KV_TENSORS * kv_width) / t, h), (T, h, model.query_width / t)]
    g: Num = sum(gemm_s(cluster, fp8, m, n, k) for m, n, k in shapes)
    up: Num = sum((gemm_s(cluster, fp8, m, n, k) for m, n, k in up_shapes), 0.0)
    quant: Num = sum(compute.quantize_bytes(training, m, n, k) for m, n, k in shapes)
    score_flops = compute.attention_score_flops(layout.mbs, training.seq_len, attention_score_width(model),
                                                layout.cp, t)
    aligned = attention_heads_tensor_core_aligned(model)
    if training.attention_backend == "flash" and aligned:
        # fused kernels skip the tiles outside a sliding window; the unfused path scores the full s x s and masks
        attn = compute.flash_attention_fwd_s(cluster, score_flops * attention_score_fraction(model, training.seq_len),
                                             fp8=training.fp8_dot_product_attention,
                                             kernel=training.attention_kernel,
                                             model=model)
    else:
        attn = compute.unfused_attention_fwd_s(model, cluster, training.seq_len, layout.mbs, layout.cp, t,
                                               score_flops, aligned=aligned)
    grid = Grid.inner(layout)
    tpx = tp.block_exposure(cluster, grid.tp_group, layout, eff, fp8, T, h, shapes[:-1], shapes[-1],
                            **tp_switches(training), block="attn")
    cpt = cp.cp_times(cluster, grid.cp_group, training.cp_comm_type, model, T, t, kv_width, attn)
    rope = compute.rope_extra_bytes_per_element(model) * T * (model.query_width + kv_width) / t
    elem = (compute.block_elementwise_s(cluster, T, h, sh) + (quant + rope) / compute.hbm_rate(cluster)
            + cpt.merge_s)
    return LayerTime(gemm_fwd_s=g, attn_fwd_s=attn, elementwise_s=elem,
                     overhead_s=_issue_s(eff, training, "attn"),
                     tp_link_s=tpx.link_s, tp_exposed_s=tpx.exposed_s, tp_fwd_exposed_s=tpx.fwd_exposed_s,
                     ep_link_s=0.0, cp_link_s=cpt.link_s, cp_exposed_s=cpt.exposed_s,
                     cp_fwd_exposed_s=cpt.fwd_exposed_s, mla_up_gemm_fwd_s=up,
                     frozen_wgrad_s=frozen_wgrad_s(training, g))


def tp_switches(training: TrainingSpec) -> dict[str, Any]:
    """The userbuffers pair switches (and ``tp_comm_overlap_rs_dgrad``), PEFT and the per-GEMM config
    (``tp_comm_overlap_cfg``) as ``tp.block_exposure`` takes them."""
    from paraplan.specs.userbuffers import gemms_of

    return {"overlap_ag": training.tp_comm_overlap_ag, "overlap_rs": training.tp_comm_overlap_rs,
            "peft": training.peft, "ub": gemms_of(training.tp_comm_overlap_cfg),
            "overlap_rs_dgrad": training.tp_comm_overlap_rs_dgrad}


def dense_mlp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayerLayout,
                   *, ffn: int) -> LayerTime:
    """Dense (or shared-expert) MLP: fc1 (T x h)(h x f*gate/t), fc2 (T x f/t)(f/t x h), TP comm."""
    eff = cluster.gpu.efficiency
    fp8 = compute.gemm_precision(training)
    T, sh, t = _ctx(layout, training)
    h = model.hidden_size
    gate = fc1_width_factor(model)
    g = gemm_s(cluster, fp8, T, ffn * gate / t, h) + gemm_s(cluster, fp8, T, h, ffn / t)
    quant = compute.quantize_bytes(training, T, ffn * gate / t, h) + compute.quantize_bytes(training, T, h, ffn / t)
    elem = (compute.block_elementwise_bytes(eff, T, h, sh)
            + ACT_FN_BYTES_PER_ELEMENT * T * ffn * gate / t + quant) / compute.hbm_rate(cluster)
    tpx = tp.block_exposure(cluster, Grid.inner(layout).tp_group, layout, eff, fp8, T, h,
                            [(T, ffn * gate / t, h)], (T, h, ffn / t), **tp_switches(training))
    return LayerTime(gemm_fwd_s=g, attn_fwd_s=0.0, elementwise_s=elem, overhead_s=_issue_s(eff, training, "mlp"),
                     tp_link_s=tpx.link_s, tp_exposed_s=tpx.exposed_s, tp_fwd_exposed_s=tpx.fwd_exposed_s,
                     ep_link_s=0.0, cp_link_s=0.0, mlp_gemm_fwd_s=g, frozen_wgrad_s=frozen_wgrad_s(training, g))


def moe_mlp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayerLayout) -> LayerTime:
    """MoE MLP: router, routed experts as grouped GEMMs with m = tokens per local expert (times the
    capacity's ``ep.routed_load_factor``), the dispatcher's row copies outside its kernels
    (``permute.permute_bytes``), the dispatcher's dispatch + combine, forward + backward (``ep.dispatcher_link_s``),
    shared expert. The router's gating GEMM
    (T/sp x h)(h x E) runs on the BF16 tensor cores whatever ``--moe-router-dtype`` says: fp32 only makes its
    output fp32 (moe_utils.py ``RouterGatingLinearFunction.forward``: ``te_general_gemm(weight, inp, router_dtype)``
    on the bf16 operands; fp64 falls back to ``torch.mm`` in fp64, not modelled)."""
    assert model.num_experts is not None
    eff = cluster.gpu.efficiency
    fp8 = compute.gemm_precision(training)
    T, sh, t = _ctx(layout, training)
    h, e, k, fe = model.hidden_size, model.num_experts, model.moe_router_topk, model.moe_ffn
    gate = fc1_width_factor(model)
    te = T * k * layout.etp / t * ep.routed_load_factor(training)
    local = e / layout.ep
    m_e = te / local
    routed = (gemm_s(cluster, fp8, m_e, fe * gate / layout.etp, h, local)
              + gemm_s(cluster, fp8, m_e, h, fe / layout.etp, local))
    router = gemm_s(cluster, False, T / sh, e, h)
    hbm = compute.hbm_rate(cluster)
    elem = (compute.block_elementwise_bytes(eff, T, h, sh)
            + ACT_FN_BYTES_PER_ELEMENT * te * fe * gate / layout.etp
            + permute.permute_bytes(training, te * h, local)
            + compute.quantize_bytes(training, m_e, fe * gate / layout.etp, h, local, grouped=True)
            + compute.quantize_bytes(training, m_e, h, fe / layout.etp, local, grouped=True)
            + compute.quick_geglu_clamp_bytes_per_element(model, training) * te * fe * gate / layout.etp
            + compute.expert_bias_bytes_per_element(model, training, routed_probs_bytes(model, training)) * te * h
            ) / hbm
    grid = Grid.inner(layout)
    tp_ep = grid.group(Axis.TP, Axis.EP, expert=True)
    # the routed experts' grouped GEMMs have no userbuffers pairs: their ETP traffic shows as without overlap
    etp_link = ep.etp_link_s(cluster, grid.etp_group, te, h)
    etp_exposed = (1.0 - eff.tp_overlap_frac) * etp_link
    moe_gemm = routed * (1.0 + eff.moe_overhead_frac) + router
    out = LayerTime(gemm_fwd_s=moe_gemm, attn_fwd_s=0.0, frozen_wgrad_s=frozen_wgrad_s(training, moe_gemm),
                    elementwise_s=elem, overhead_s=_issue_s(eff, training, "moe"),
                    host_sync_s=moe_host_sync_s(eff, training),
                    tp_link_s=etp_link, tp_exposed_s=etp_exposed, tp_fwd_exposed_s=etp_exposed / FWD_BWD_HALVES,
                    ep_link_s=ep.dispatcher_link_s(cluster, model, training, grid.ep_group, tp_ep, te, h),
                    cp_link_s=0.0, mlp_gemm_fwd_s=routed)
    if model.shared_ffn:
        sh_t = dense_mlp_time(model, cluster, training, layout, ffn=model.shared_ffn)
        # the shared expert sits in the same MLP block: its norm/residual traffic is counted once
        out = replace(_add(out, sh_t, elementwise_extra=-compute.block_elementwise_s(cluster, T, h, sh)),
                      shared_gemm_fwd_s=sh_t.gemm_fwd_s)
    return out


def routed_probs_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Bytes of one routing probability as the experts receive it: the router's dtype (``ep.ROUTER_PROBS_BYTES``,
    bf16 without ``--moe-router-dtype``: ``ep.ROUTER_PROBS_DEFAULT_BYTES``), fp32 at least under the flex dispatcher
    (token_dispatcher.py: DeepEP and HybridEP "only support float32 probs" and call ``self.token_probs.float()``)."""
    probs = ep.ROUTER_PROBS_BYTES.get(model.moe_router_dtype or "", ep.ROUTER_PROBS_DEFAULT_BYTES)
    return max(probs, FLEX_PROBS_BYTES) if training.moe_token_dispatcher_type == "flex" else probs


def moe_host_sync_s(eff: EfficiencySpec, training: TrainingSpec) -> float:
    """Host-device sync time of one MoE layer per micro-batch, forward + backward: the dispatcher's syncs less
    what a CUDA graph captures (``moe_sync.host_syncs_per_moe_layer``) x the GPU's idle time after one sync. The
    sync drains the GPU's queue, so the GPU idles while the host issues the ops up to the next token exchange
    (``moe_sync.post_sync_ops``) at ``EfficiencySpec.host_op_issue_s`` each (the host's wake-up from the spin wait is
    microseconds, left out). ``EfficiencySpec.moe_layer_overhead_s`` is no longer charged: it was fitted as a
    per-sync constant before ``moe_host_bound_s`` existed and charged the same wait twice (issue 18)."""
    return moe_sync.host_syncs_per_moe_layer(training) * moe_sync.post_sync_ops(training) * eff.host_op_issue_s


def _add(a: LayerTime, b: LayerTime, *, elementwise_extra: Num = 0.0) -> LayerTime:
    return LayerTime(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a)}
                     | {"elementwise_s": a.elementwise_s + b.elementwise_s + elementwise_extra,
                        "overhead_s": a.overhead_s})


def layer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayerLayout, *,
               moe: bool) -> LayerTime:
    """One full layer (attention + MLP or MoE)."""
    att = attention_layer_time(model, cluster, training, layout)
    mlp = moe_mlp_time(model, cluster, training, layout) if moe else dense_mlp_time(
        model, cluster, training, layout, ffn=model.ffn)
    lt = LayerTime(**{f.name: getattr(att, f.name) + getattr(mlp, f.name) for f in fields(att)})
    if not moe:
        return lt
    total, fwd = moe_host_bound_s(cluster.gpu.efficiency, training, layout, lt, shared_expert=bool(model.shared_ffn),
                                  aux_loss=model.moe_router_load_balancing_type != "none")
    return replace(lt, host_bound_s=total, host_bound_fwd_s=fwd)


def moe_host_bound_s(eff: EfficiencySpec, training: TrainingSpec, layout: LayerLayout, lt: LayerTime, *,
                     shared_expert: bool, aux_loss: bool = True) -> tuple[Num, Num]:
    """(forward + backward, forward) host-bound time of one MoE layer per micro-batch: after the dispatcher's sync
    the GPU waits while the host issues ``moe_sync.host_bound_ops`` ops at ``EfficiencySpec.host_op_issue_s``
    each, so the layer takes max(GPU time, host time) over what the host issues between two syncs; this is the
    excess over the GPU's time. Plain schedules: one layer's forward, max(0, f x op - GPU forward) (its backward
    has no sync and the host runs ahead). Paired schedules (combined 1F1B): the forward and the paired backward
    layer, max(0, (f + b) x op - GPU forward + backward). 0 where a CUDA graph makes the layer sync-free
    (``moe_sync.host_syncs_per_moe_layer``). The wait right after the sync (``lt.host_sync_s``, the first ops
    after it, on an idle GPU) is part of the same host issue: the excess is net of it, so the GPU's idle time
    between two syncs is max(sync wait, issue - GPU time), the largest prefix of host issue ahead of the GPU, not
    their sum."""
    from paraplan.schedules import schedule_of

    f_ops, b_ops = moe_sync.host_bound_ops(training, tp=layout.tp, shared_expert=shared_expert,
                                           schedule=schedule_of(layout).name, aux_loss=aux_loss)
    per_op = eff.host_op_issue_s
    fwd: Num = np.maximum(f_ops * per_op - lt.gpu_fwd_s - lt.host_sync_s, 0.0)
    if np.all(np.asarray(b_ops) == 0):
        return fwd, fwd
    total: Num = np.maximum((f_ops + b_ops) * per_op - lt.gpu_s - lt.host_sync_s, 0.0)
    return total, fwd


def launch_bound_layer(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       layout: LayerLayout) -> tuple[float, float]:
    """(GPU time, host issue time) of one layer per micro-batch, forward + backward, for the
    layer kind most of the model has (MoE layers for MoE models). The layer is launch-bound
    when the first is smaller: see ``LayerTime.compute_s``."""
    lt = layer_time(model, cluster, training, layout, moe=model.is_moe)
    return float(np.max(lt.gpu_s)), float(np.max(lt.overhead_s))


def recompute_s(lt: LayerTime, layout: LayerLayout, modules: tuple[str, ...], eff: EfficiencySpec, *,
                moe: bool) -> Num:
    """Recompute time of one layer for one micro-batch. Full: one more forward of the layer (its
    forward GEMMs, attention, 1 / ``ELEMENTWISE_FWD_BWD_RATIO`` of its element-wise traffic, half
    of its kernel issue and EP communication: ``FWD_BWD_HALVES``; all of its host syncs, which are all in the
    forward (``moe_sync.BACKWARD_SYNCS``); its forward's exposed TP time).
    Selective modules follow Megatron-Core's TransformerLayer/MoELayer: "mlp" recomputes dense
    MLPs only, "moe" (and "moe_act") MoE layers only (megatron/core/transformer/transformer_layer.py
    ``recompute_mlp``, moe/moe_layer.py; "moe" checkpoints the whole MoE forward, ``custom_forward`` with the
    dispatch, so its host syncs run again); "shared_experts" the shared expert's forward GEMMs of MoE layers
    (moe_layer.py ``shared_experts_recompute``; inside "moe" when both are set); "mla_up_proj" MLA's query and
    key-value up-projection GEMMs (multi_latent_attention.py ``recompute_up_proj``). Full and ``core_attn``
    recompute re-run the CP attention forward with its exposed exchange (``cp_fwd_exposed_s``: TE's CP attention
    function is what core_attn checkpoints)."""
    full = (np.maximum(lt.gpu_fwd_s, lt.overhead_s / FWD_BWD_HALVES)
            + lt.host_sync_s + lt.host_bound_fwd_s)
    full = (full + lt.tp_fwd_exposed_s
            + lt.ep_link_s / FWD_BWD_HALVES + lt.cp_fwd_exposed_s)
    sel = (lt.attn_fwd_s + lt.cp_fwd_exposed_s) * ("core_attn" in modules)
    sel = sel + lt.mlp_gemm_fwd_s * (("moe" if moe else "mlp") in modules)
    sel = sel + (lt.host_sync_s + lt.host_bound_fwd_s) * (moe and "moe" in modules)
    sel = sel + lt.mla_up_gemm_fwd_s * ("mla_up_proj" in modules)
    sel = sel + lt.shared_gemm_fwd_s * (moe and "shared_experts" in modules and "moe" not in modules)
    sel = sel + lt.elementwise_s / SELECTIVE_ELEMENTWISE_DIVISOR * (("layernorm" in modules)
                                                                    or (moe and "moe_act" in modules))
    return np.where(layout.recompute_code == RECOMPUTE_CODES["full"], full,
                    np.where(layout.recompute_code == RECOMPUTE_CODES["selective"], sel, 0.0))
