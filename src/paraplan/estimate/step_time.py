"""Step time: per-micro-batch stage time, pipeline bubble, exposed communication, optimizer.

    step = m * t_stage + bubble + exposed_pp + exposed_dp + optimizer + overhead
    t_stage = compute + recompute + exposed TP + exposed CP + exposed EP      (slowest stage)
    bubble  = (p - 1)/v * t_stage         (Narayanan et al. 2021, arXiv:2104.04473, section 2.2)

Compute: GEMM FLOPs per GPU at an efficiency that falls with every small GEMM dimension
(e_max * prod_x x/(x + d0), x in m, n, k: TP shrinks n or k, few tokens per expert shrink m);
flash attention forward at ``attention_frac`` of peak with a 2.5x backward (FlashAttention-2:
five score-sized GEMMs backward vs two forward); element-wise kernels at HBM bandwidth; a fixed
launch overhead per layer. Communication: ``paraplan.estimate.comm``; the share each overlap
mechanism hides is a calibrated efficiency parameter (``EfficiencySpec``).
All formulas are vectorised (layout fields may be numpy arrays), see docs/model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from paraplan.estimate import comm
from paraplan.estimate.flops import (
    attention_head_dims,
    attention_heads_tensor_core_aligned,
    attention_score_width,
    model_flops_per_step,
    recompute_flops_per_step,
)
from paraplan.estimate.params import ParamTerms, StageLayers, padded_vocab, param_terms, stage_params
from paraplan.schedules import Schedule, schedule_of
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec, grad_bytes_per_param
from paraplan.units import TFLOP

Num = Any

AXES = ("tp", "cp", "ep", "pp", "dp")
ATTENTION_BWD_FACTOR = 2.5
"""FlashAttention-2 backward recomputes the scores: 5 score-sized GEMMs vs 2 forward (Dao 2023)."""
ACT_FN_BYTES_PER_ELEMENT = 12.0
"""SwiGLU/GeLU forward (read 2, write 2... per element) and backward traffic, bf16, per element of f."""
OPTIMIZER_BYTES_PER_PARAM = 34.0
"""Adam step per local parameter: read grad 4 + master/m/v 12, write master/m/v 12 + bf16 param 2,
grad-norm read 4."""
DDP_BUCKET_PARAMS = 40_000_000
"""Megatron DDP bucket size (parameters) for gradient reduce-scatter (ddp_config.bucket_size)."""


def gemm_efficiency(eff: EfficiencySpec, m: Num, n: Num, k: Num) -> Num:
    """Fraction of peak a GEMM (m x k)(k x n) reaches: e_max * prod_x x/(x + d0).

    Fitted shape: cuBLASLt square GEMMs on A100 reach 82% at 8192^3 and ~47% at 1024^3
    (ecosystem.md 4.4); skinny GEMMs (one dim ~192) lose about half.
    """
    d0 = eff.gemm_half_dim
    return eff.gemm_max_frac * (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))


def gemm_s(cluster: ClusterSpec, fp8: bool, m: Num, n: Num, k: Num, count: Num = 1) -> Num:
    """Forward time of ``count`` GEMMs (m x k)(k x n) on one GPU."""
    eff = cluster.gpu.efficiency
    flops = 2.0 * m * n * k * count
    t = flops / (cluster.gpu.peak_bf16_flops_per_s * gemm_efficiency(eff, m, n, k))
    return t / eff.fp8_gemm_speedup if fp8 else t


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
    for the host, so this adds to the GPU's time (MoE token counts before the all-to-all)."""

    @property
    def gpu_s(self) -> Num:
        """GPU work, forward + backward (GEMMs, attention, element-wise)."""
        return 3.0 * self.gemm_fwd_s + (1.0 + ATTENTION_BWD_FACTOR) * self.attn_fwd_s + self.elementwise_s

    @property
    def compute_s(self) -> Num:
        """Forward + backward compute: the GPU's time, or the host's kernel-issue time when that
        is longer (a launch-bound layer: the GPU waits for the CPU)."""
        return np.maximum(self.gpu_s, self.overhead_s) + self.host_sync_s


def _ctx(layout: Any, training: TrainingSpec) -> tuple[Num, Num, Num]:
    tokens = training.seq_len * layout.mbs / layout.cp
    sh = np.where(layout.sp, layout.tp, 1)
    return tokens, sh, layout.tp


SOFTMAX_BYTES_PER_SCORE = 10.0
"""Unfused attention, HBM bytes per s x s score element, forward + backward: fused
scale-mask-softmax reads 2 and writes 2 forward; its backward reads the gradient and the
probabilities and writes 2 (Megatron ``FusedScaleMaskSoftmax``, bf16)."""
DROPOUT_BYTES_PER_SCORE = 10.0
"""Attention dropout on the scores, forward (read 2, write 2 + 1-byte mask) + backward (read 2 +
mask, write 2); only when ``attention_dropout`` > 0."""


def unfused_attention_fwd_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any,
                            score_flops: Num, *, aligned: bool) -> Num:
    """Unfused attention (``--attention-backend unfused``/local, or the fallback when head dims
    are not multiples of 8) expressed as a forward time whose (1 + 2.5) multiple is its forward +
    backward time: (3 G + E) / 3.5.

    G: the two score GEMMs over the full s x s scores (2x the causal count), batched with
    k = head dim, at GEMM efficiency (m = s/c, n = s, k = head dim) of the tensor-core peak, or of
    the FP32 CUDA-core peak when head dims are not multiples of 8; backward = 2 G.
    E: softmax (and dropout) traffic over b a s^2/(c t) score elements at HBM bandwidth
    (Korthikanti et al. 2022, section 4.1 for the tensors; byte counts above).
    """
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    s = training.seq_len
    hd, _ = attention_head_dims(model)
    peak = gpu.peak_bf16_flops_per_s if aligned else gpu.simt_flops_per_s
    g = 2.0 * score_flops / (peak * gemm_efficiency(eff, s / layout.cp, s, hd))
    scores = layout.mbs * model.num_attention_heads / layout.tp * s * s / layout.cp
    per_score = SOFTMAX_BYTES_PER_SCORE + (DROPOUT_BYTES_PER_SCORE if model.attention_dropout > 0 else 0.0)
    e = scores * per_score / (gpu.hbm_bytes_per_s * eff.hbm_frac)
    return (3.0 * g + e) / (1.0 + ATTENTION_BWD_FACTOR)


def attention_layer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any) -> LayerTime:
    """Attention half of a layer: projections, flash attention, its norm/elementwise, TP/CP comm."""
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    fp8 = training.precision == "fp8"
    T, sh, t = _ctx(layout, training)
    h, a = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        ckv, cq = model.kv_lora_rank, model.q_lora_rank
        if cq is None:
            g = gemm_s(cluster, fp8, T, a * dq / t, h)
        else:
            g = gemm_s(cluster, fp8, T, cq, h) + gemm_s(cluster, fp8, T, a * dq / t, cq)
        g = g + gemm_s(cluster, fp8, T, ckv + model.qk_pos_emb_head_dim, h)
        g = g + gemm_s(cluster, fp8, T, a * (model.qk_head_dim + model.v_head_dim) / t, ckv)
        g = g + gemm_s(cluster, fp8, T, h, a * model.v_head_dim / t)
        kv_bytes = 2.0 * T * a * (dq + model.v_head_dim) / t
    else:
        kv_width = model.head_dim * np.maximum(model.query_groups, t)
        g = gemm_s(cluster, fp8, T, (model.query_width + 2 * kv_width) / t, h)
        g = g + gemm_s(cluster, fp8, T, h, model.query_width / t)
        kv_bytes = 2.0 * 2.0 * T * kv_width / t
    score_flops = 2.0 * layout.mbs * training.seq_len ** 2 * attention_score_width(model) / (layout.cp * t)
    aligned = attention_heads_tensor_core_aligned(model)
    if training.attention_backend == "flash" and aligned:
        attn = score_flops / (gpu.peak_bf16_flops_per_s * eff.attention_frac)
    else:
        attn = unfused_attention_fwd_s(model, cluster, training, layout, score_flops, aligned=aligned)
    hbm = gpu.hbm_bytes_per_s * eff.hbm_frac
    elem = 0.5 * eff.elementwise_bytes_per_token_hidden * T * h / sh / hbm
    act_bytes = 2.0 * T * h
    tp_bw = comm.ring_busbw(cluster, t, 1)
    tp_link = 4.0 * comm.all_gather_s(act_bytes, t, tp_bw, eff.collective_latency_s)
    cp_bw = comm.tier_busbw(cluster, t * layout.cp)
    cp_link = 3.0 * (layout.cp - 1) * comm.p2p_s(kv_bytes, cp_bw, eff.collective_latency_s)
    return LayerTime(gemm_fwd_s=g, attn_fwd_s=attn, elementwise_s=elem,
                     overhead_s=0.5 * eff.layer_overhead_s, tp_link_s=tp_link, ep_link_s=0.0,
                     cp_link_s=np.where(layout.cp > 1, cp_link, 0.0))


def dense_mlp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any,
                   *, ffn: int) -> LayerTime:
    """Dense (or shared-expert) MLP: fc1 (T x h)(h x f*gate/t), fc2 (T x f/t)(f/t x h), TP comm."""
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    fp8 = training.precision == "fp8"
    T, sh, t = _ctx(layout, training)
    h = model.hidden_size
    gate = 2 if model.swiglu else 1
    g = gemm_s(cluster, fp8, T, ffn * gate / t, h) + gemm_s(cluster, fp8, T, h, ffn / t)
    hbm = gpu.hbm_bytes_per_s * eff.hbm_frac
    elem = (0.5 * eff.elementwise_bytes_per_token_hidden * T * h / sh
            + ACT_FN_BYTES_PER_ELEMENT * T * ffn * gate / t) / hbm
    tp_link = 4.0 * comm.all_gather_s(2.0 * T * h, t, comm.ring_busbw(cluster, t, 1), eff.collective_latency_s)
    return LayerTime(gemm_fwd_s=g, attn_fwd_s=0.0, elementwise_s=elem, overhead_s=0.5 * eff.layer_overhead_s,
                     tp_link_s=tp_link, ep_link_s=0.0, cp_link_s=0.0, mlp_gemm_fwd_s=g)


def moe_mlp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any) -> LayerTime:
    """MoE MLP: router, routed experts as grouped GEMMs with m = tokens per local expert,
    permutation traffic, EP all-to-all (dispatch + combine, forward + backward), shared expert."""
    assert model.num_experts is not None
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    fp8 = training.precision == "fp8"
    T, sh, t = _ctx(layout, training)
    h, e, k, fe = model.hidden_size, model.num_experts, model.moe_router_topk, model.moe_ffn
    gate = 2 if model.swiglu else 1
    te = T * k * layout.etp / t
    local = e / layout.ep
    m_e = te / local
    routed = (gemm_s(cluster, fp8, m_e, fe * gate / layout.etp, h, local)
              + gemm_s(cluster, fp8, m_e, h, fe / layout.etp, local))
    router = gemm_s(cluster, False, T / sh, e, h)
    hbm = gpu.hbm_bytes_per_s * eff.hbm_frac
    elem = (0.5 * eff.elementwise_bytes_per_token_hidden * T * h / sh
            + ACT_FN_BYTES_PER_ELEMENT * te * fe * gate / layout.etp + 24.0 * te * h) / hbm
    ep_link = 4.0 * comm.all_to_all_s(cluster, 2.0 * te * h, layout.ep, layout.etp, eff.collective_latency_s)
    etp_link = np.where(layout.etp > 1, 4.0 * comm.all_gather_s(
        2.0 * te * h, layout.etp, comm.ring_busbw(cluster, layout.etp, 1), eff.collective_latency_s), 0.0)
    out = LayerTime(gemm_fwd_s=routed * (1.0 + eff.moe_overhead_frac) + router, attn_fwd_s=0.0,
                    elementwise_s=elem, overhead_s=0.5 * eff.layer_overhead_s, host_sync_s=eff.moe_layer_overhead_s,
                    tp_link_s=etp_link,
                    ep_link_s=ep_link, cp_link_s=0.0, mlp_gemm_fwd_s=routed)
    if model.shared_ffn:
        sh_t = dense_mlp_time(model, cluster, training, layout, ffn=model.shared_ffn)
        out = _add(out, sh_t, elementwise_extra=-0.5 * eff.elementwise_bytes_per_token_hidden * T * h / sh / hbm)
    return out


def _add(a: LayerTime, b: LayerTime, *, elementwise_extra: Num = 0.0) -> LayerTime:
    return LayerTime(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a)}
                     | {"elementwise_s": a.elementwise_s + b.elementwise_s + elementwise_extra,
                        "overhead_s": a.overhead_s})


def layer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any, *, moe: bool) -> LayerTime:
    """One full layer (attention + MLP or MoE)."""
    att = attention_layer_time(model, cluster, training, layout)
    mlp = moe_mlp_time(model, cluster, training, layout) if moe else dense_mlp_time(
        model, cluster, training, layout, ffn=model.ffn)
    return LayerTime(**{f.name: getattr(att, f.name) + getattr(mlp, f.name) for f in fields(att)})


def launch_bound_layer(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       layout: Any) -> tuple[float, float]:
    """(GPU time, host issue time) of one layer per micro-batch, forward + backward, for the
    layer kind most of the model has (MoE layers for MoE models). The layer is launch-bound
    when the first is smaller: see ``LayerTime.compute_s``."""
    lt = layer_time(model, cluster, training, layout, moe=model.is_moe)
    return float(np.max(lt.gpu_s)), float(np.max(lt.overhead_s))


@dataclass(frozen=True, slots=True)
class StageTime:
    """One micro-batch (forward + backward) on one pipeline rank."""

    compute_s: Num
    recompute_s: Num
    link_s: dict[str, Num]
    exposed_s: dict[str, Num]

    @property
    def total_s(self) -> Num:
        """Compute + recompute + exposed TP/CP/EP communication."""
        return self.compute_s + self.recompute_s + self.exposed_s["tp"] + self.exposed_s["cp"] + self.exposed_s["ep"]


def _recompute_s(lt: LayerTime, layout: Any, modules: tuple[str, ...], eff: EfficiencySpec, *, moe: bool) -> Num:
    """Recompute time of one layer for one micro-batch. Selective modules follow Megatron-Core's
    TransformerLayer/MoELayer: "mlp" recomputes dense MLPs only, "moe" (and "moe_act") MoE layers
    only (megatron/core/transformer/transformer_layer.py ``recompute_mlp``, moe/moe_layer.py)."""
    full = (np.maximum(lt.gemm_fwd_s + lt.attn_fwd_s + lt.elementwise_s / 3.0, lt.overhead_s / 2.0)
            + lt.host_sync_s / 2.0)
    full = full + (1.0 - _tp_overlap(layout, eff)) * lt.tp_link_s / 2.0 + lt.ep_link_s / 2.0
    sel = lt.attn_fwd_s * ("core_attn" in modules)
    sel = sel + lt.mlp_gemm_fwd_s * (("moe" if moe else "mlp") in modules)
    sel = sel + lt.elementwise_s / 6.0 * (("layernorm" in modules) or (moe and "moe_act" in modules))
    return np.where(layout.recompute_code == 2, full, np.where(layout.recompute_code == 1, sel, 0.0))


def _tp_overlap(layout: Any, eff: EfficiencySpec) -> Num:
    return np.where(layout.tp_comm_overlap & layout.sp, eff.tp_comm_overlap_frac, eff.tp_overlap_frac)


@dataclass(frozen=True, slots=True)
class LayerKindTerms:
    """What ``stage_time`` reads of one layer kind (dense, MoE or MTP), per micro-batch."""

    compute_s: Num
    recompute_s: Num
    tp_link_s: Num
    ep_link_s: Num
    cp_link_s: Num
    attn_fwd_s: Num


@dataclass(frozen=True, slots=True)
class StageTerms:
    """The stage-independent terms of ``stage_time`` (fields may be arrays): computed once per
    layout, or once per distinct per-layer combination in the search
    (``paraplan.layout.layer_key_table``) and gathered with ``take``."""

    parts: tuple[LayerKindTerms, ...]
    """Dense layers, then MoE layers (MoE models), then MTP layers (models with MTP)."""
    tp_exposed_frac: Num
    """Share of TP communication not hidden (1 - the TP overlap)."""
    logits_s: Num
    """Output layer and loss of one head."""
    embedding_s: Num
    """Embedding lookup on the first stage."""
    output_tp_link_s: Num
    """TP all-gathers around the output layer."""

    def take(self, index: NDArray[np.int64]) -> StageTerms:
        """Rows ``index`` of every array field."""
        def pick(v: Num) -> Num:
            return v if np.ndim(v) == 0 else np.asarray(v)[index]

        parts = tuple(LayerKindTerms(**{f.name: pick(getattr(k, f.name)) for f in fields(k)}) for k in self.parts)
        return StageTerms(parts=parts, tp_exposed_frac=pick(self.tp_exposed_frac), logits_s=pick(self.logits_s),
                          embedding_s=pick(self.embedding_s), output_tp_link_s=pick(self.output_tp_link_s))


def stage_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any) -> StageTerms:
    """Per-layer times of each layer kind and the per-micro-batch output/embedding terms."""
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    modules = tuple(layout.recompute_modules)
    dense = layer_time(model, cluster, training, layout, moe=False)
    kinds = [(dense, False)]
    if model.is_moe:
        kinds.append((layer_time(model, cluster, training, layout, moe=True), True))
    if model.mtp_num_layers:
        mtp_lt = kinds[-1][0] if model.mtp_layer_is_moe else dense
        kinds.append((mtp_lt, bool(model.is_moe and model.mtp_layer_is_moe)))
    parts = tuple(LayerKindTerms(compute_s=lt.compute_s, recompute_s=_recompute_s(lt, layout, modules, eff, moe=m),
                                 tp_link_s=lt.tp_link_s, ep_link_s=lt.ep_link_s, cp_link_s=lt.cp_link_s,
                                 attn_fwd_s=lt.attn_fwd_s) for lt, m in kinds)
    T, sh, t = _ctx(layout, training)
    fp8 = training.precision == "fp8"
    vpad = padded_vocab(model, t)
    hbm = gpu.hbm_bytes_per_s * eff.hbm_frac
    logits = 3.0 * gemm_s(cluster, fp8 and False, T, vpad / t, model.hidden_size) + 16.0 * T * vpad / t / hbm
    return StageTerms(
        parts=parts, tp_exposed_frac=1.0 - _tp_overlap(layout, eff), logits_s=logits,
        embedding_s=8.0 * T * model.hidden_size / sh / hbm,
        output_tp_link_s=2.0 * comm.all_gather_s(2.0 * T * model.hidden_size, t, comm.ring_busbw(cluster, t, 1),
                                                 eff.collective_latency_s),
    )


def stage_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any,
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
    recompute = sum(n * k.recompute_s for k, n in parts)
    links = {"tp": sum(n * k.tp_link_s for k, n in parts), "ep": sum(n * k.ep_link_s for k, n in parts),
             "cp": sum(n * k.cp_link_s for k, n in parts)}
    attn = sum(n * (1.0 + ATTENTION_BWD_FACTOR) * k.attn_fwd_s for k, n in parts)
    # logits and loss on the last stage (and per MTP head), embedding on the first
    heads = 1 + np.asarray(stage.num_mtp_layers)
    compute = compute + np.where(stage.has_output, heads * terms.logits_s, 0.0)
    compute = compute + np.where(stage.has_embedding, terms.embedding_s, 0.0)
    links["tp"] = links["tp"] + np.where(stage.has_output, terms.output_tp_link_s, 0.0)
    exposed = {
        "tp": terms.tp_exposed_frac * links["tp"],
        "ep": (1.0 - eff.ep_overlap_frac) * links["ep"],
        "cp": np.maximum(links["cp"] - eff.cp_overlap_frac * attn, 0.0),
    }
    return StageTime(compute_s=compute, recompute_s=recompute, link_s=links, exposed_s=exposed)


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
    slowest_stage: Num

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (scalar) breakdown."""
        return {
            "step_s": float(self.step_s), "compute_s": float(self.compute_s),
            "recompute_s": float(self.recompute_s), "bubble_s": float(self.bubble_s),
            "optimizer_s": float(self.optimizer_s), "overhead_s": float(self.overhead_s),
            "exposed_comm_s": {k: float(v) for k, v in self.exposed_comm_s.items()},
            "link_comm_s": {k: float(v) for k, v in self.link_comm_s.items()},
            "bubble_frac": float(self.bubble_frac), "slowest_stage": int(self.slowest_stage),
        }


@dataclass(frozen=True, slots=True)
class _DpGroups:
    """Stage-independent inputs of the DP collectives: parameter terms, group sizes, bandwidths."""

    params: ParamTerms
    n_dense: Num
    n_exp: Num
    bw_d: Num
    bw_e: Num


def _dp_groups(model: ModelSpec, cluster: ClusterSpec, layout: Any, max_positions: int,
               params: ParamTerms | None) -> _DpGroups:
    n_dense, n_exp = layout.dp * layout.cp, layout.edp
    # rank order tp-cp-ep-dp-pp: the DP x CP group strides over TP, expert-DP over ETP x EP
    return _DpGroups(
        params=params if params is not None else param_terms(model, tp=layout.tp, pp=layout.pp, ep=layout.ep,
                                                             etp=layout.etp, max_positions=max_positions),
        n_dense=n_dense, n_exp=n_exp, bw_d=comm.ring_busbw(cluster, n_dense, layout.tp),
        bw_e=comm.ring_busbw(cluster, n_exp, layout.etp * layout.ep))


def _dp_times(model: ModelSpec, cluster: ClusterSpec, layout: Any, stage: StageLayers,
              groups: _DpGroups, max_positions: int, precision: str) -> tuple[Num, Num, Num]:
    """(gradient reduce, parameter gather, local optimizer params) for one stage, link time."""
    eff = cluster.gpu.efficiency
    gb = grad_bytes_per_param(precision)
    p = stage_params(model, stage, tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                     max_positions=max_positions, terms=groups.params)
    n_dense, n_exp, bw_d, bw_e = groups.n_dense, groups.n_exp, groups.bw_d, groups.bw_e
    alpha = eff.collective_latency_s
    buckets_d = np.ceil(p.dense / DDP_BUCKET_PARAMS)
    buckets_e = np.ceil(p.expert / DDP_BUCKET_PARAMS)
    rs = (comm.reduce_scatter_s(gb * p.dense, n_dense, bw_d, alpha * buckets_d)
          + comm.reduce_scatter_s(gb * p.expert, n_exp, bw_e, alpha * buckets_e))
    ag = (comm.all_gather_s(2.0 * p.dense, n_dense, bw_d, alpha * buckets_d)
          + comm.all_gather_s(2.0 * p.expert, n_exp, bw_e, alpha * buckets_e))
    ar = (comm.all_reduce_s(gb * p.dense, n_dense, bw_d, alpha * buckets_d)
          + comm.all_reduce_s(gb * p.expert, n_exp, bw_e, alpha * buckets_e))
    grad = np.where(layout.dist_opt, rs, ar)
    gather = np.where(layout.dist_opt, ag, 0.0)
    local = np.where(layout.dist_opt, p.dense / n_dense + p.expert / n_exp, p.total)
    return grad, gather, local


def _ep_exposed(sched: Schedule, layout: Any, m: Num, ep_s: Num, compute_s: Num) -> Num:
    """Exposed expert-parallel all-to-all of a step: m * ep_s per micro-batch, unless the schedule
    overlaps it with another micro-batch's compute (combined 1F1B, DualPipe-V): then a share
    ``f = Schedule.ep_exposed_frac`` of the passes (the unpaired ones) keeps it and the paired ones
    expose only what the other micro-batch's compute does not cover: m (f e + (1 - f) max(e - c, 0))."""
    frac = sched.ep_exposed_frac(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    if isinstance(frac, float) and frac == 1.0:
        return m * ep_s
    return m * (frac * ep_s + (1.0 - frac) * np.maximum(ep_s - compute_s, 0.0))


def step_time_from_stages(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any,
    stages: Sequence[StageLayers], *, num_microbatches: Num, max_positions: int, terms: StageTerms | None = None,
    params: ParamTerms | None = None,
) -> StepTime:
    """Step time of a layout given the stages to consider (all, or first/second/last). ``terms``
    and ``params``: the layout's ``stage_terms`` and ``params.param_terms`` when already computed
    (the search gathers them)."""
    eff, gpu = cluster.gpu.efficiency, cluster.gpu
    m = num_microbatches
    terms = terms if terms is not None else stage_terms(model, cluster, training, layout)
    times = [stage_time(model, cluster, training, layout, st, terms) for st in stages]
    totals = np.stack([np.broadcast_to(np.asarray(st.total_s, dtype=float), np.shape(times[0].total_s))
                       for st in times])
    slow = np.argmax(totals, axis=0)

    def pick(values: list[Num]) -> Num:
        arr = np.stack([np.broadcast_to(np.asarray(v, dtype=float), totals.shape[1:]) for v in values])
        return np.take_along_axis(arr, np.expand_dims(slow, 0), 0)[0] if arr.ndim > 1 else arr[slow]

    t_stage = pick([st.total_s for st in times])
    sched = schedule_of(layout)
    bub_frac = sched.bubble_frac(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    bubble = bub_frac * m * t_stage
    # DP: every stage reduces its own gradients in parallel; the slowest one is exposed.
    groups = _dp_groups(model, cluster, layout, max_positions, params)
    dp = [_dp_times(model, cluster, layout, st, groups, max_positions, training.precision) for st in stages]
    grad = np.max(np.stack([np.broadcast_to(np.asarray(d[0], dtype=float), totals.shape[1:]) for d in dp]), 0)
    gather = np.max(np.stack([np.broadcast_to(np.asarray(d[1], dtype=float), totals.shape[1:]) for d in dp]), 0)
    local = np.max(np.stack([np.broadcast_to(np.asarray(d[2], dtype=float), totals.shape[1:]) for d in dp]), 0)
    hide = eff.dp_overlap_frac * t_stage
    # distributed optimizer / DDP: one gradient reduce and one parameter gather per step, hidden
    # behind the last micro-batch's backward (2/3 of it) and the first forward (1/3).
    grad_exp = np.where(layout.overlap_grad_reduce, np.maximum(grad - hide * 2.0 / 3.0, 0.0), grad)
    gath_exp = np.where(layout.overlap_param_gather & layout.dist_opt,
                        np.maximum(gather - hide / 3.0, 0.0), gather)
    # Megatron-FSDP (optim_grads_params): every micro-batch gathers the weights for forward and
    # backward (2 all-gathers of 2P) and reduce-scatters the gradients, overlapped with compute.
    fsdp_link_mb = 2.0 * gather + grad
    fsdp_exposed = m * np.maximum(fsdp_link_mb - hide, 0.0)
    dp_exposed = np.where(layout.fsdp, fsdp_exposed, grad_exp + gath_exp)
    dp_link = np.where(layout.fsdp, m * fsdp_link_mb, grad + gather)
    # PP: activations forward and gradients backward at every chunk boundary.
    t_ = np.where(layout.sp, layout.tp, 1)
    pp_bytes = 2.0 * training.seq_len * layout.mbs / layout.cp * model.hidden_size / t_
    pp_bw = comm.tier_busbw(cluster, layout.tp * layout.cp * layout.dp * layout.pp)
    p2p = comm.p2p_s(pp_bytes, pp_bw, eff.collective_latency_s)
    sends = sched.p2p_transfers(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    pp_link = np.where(layout.pp > 1, 1.0 * sends * p2p, 0.0)
    pp_overlap = eff.pp_overlap_frac * sched.p2p_overlap_scale(vp=layout.vp)
    on_path = sched.p2p_exposed_transfers(pp=layout.pp, vp=layout.vp, num_microbatches=m)
    pp_exposed = np.where(layout.pp > 1, on_path * p2p * (1.0 - pp_overlap), 0.0)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * local / (gpu.hbm_bytes_per_s * eff.hbm_frac)
    exposed = {
        "tp": m * pick([st.exposed_s["tp"] for st in times]),
        "cp": m * pick([st.exposed_s["cp"] for st in times]),
        "ep": _ep_exposed(sched, layout, m, pick([st.exposed_s["ep"] for st in times]),
                          pick([st.compute_s for st in times])),
        "pp": pp_exposed,
        "dp": dp_exposed,
    }
    links = {
        "tp": m * pick([st.link_s["tp"] for st in times]),
        "cp": m * pick([st.link_s["cp"] for st in times]),
        "ep": m * pick([st.link_s["ep"] for st in times]),
        "pp": pp_link,
        "dp": dp_link,
    }
    compute = m * pick([st.compute_s for st in times])
    recompute = m * pick([st.recompute_s for st in times])
    overhead = eff.step_overhead_s + 0.0 * compute
    step = compute + recompute + bubble + optimizer + overhead + sum(exposed.values())
    return StepTime(step_s=step, compute_s=compute, recompute_s=recompute, bubble_s=bubble,
                    optimizer_s=optimizer, overhead_s=overhead, exposed_comm_s=exposed,
                    link_comm_s=links, bubble_frac=bub_frac, slowest_stage=slow)


def step_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any, *,
              num_microbatches: int) -> StepTime:
    """Scalar path: all pipeline stages of one layout."""
    from paraplan.estimate.positions import max_positions_for
    from paraplan.estimate.stages import all_stage_layers

    max_positions, _ = max_positions_for(model, training)
    stages = all_stage_layers(model, layout)
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


def throughput(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Any,
               t: StepTime, *, mfu_peak: str = "bf16") -> Throughput:
    """Throughput from a step time (Megatron's FLOPs formula; MFU against the dense peak)."""
    n = cluster.num_gpus
    model_flops = model_flops_per_step(model, seq_len=training.seq_len,
                                       global_batch_size=training.global_batch_size, tp=layout.tp)
    extra = recompute_flops_per_step(model, seq_len=training.seq_len,
                                     global_batch_size=training.global_batch_size,
                                     recompute_code=layout.recompute_code,
                                     recompute_modules=tuple(layout.recompute_modules))
    peak = cluster.gpu.peak_flops_per_s(mfu_peak)
    model_rate = model_flops / (t.step_s * n)
    hw_rate = (model_flops + extra) / (t.step_s * n)
    return Throughput(
        tokens_per_s_per_gpu=training.tokens_per_step / (t.step_s * n),
        model_tflops_per_gpu=model_rate / TFLOP, hardware_tflops_per_gpu=hw_rate / TFLOP,
        mfu=model_rate / peak, hfu=hw_rate / peak, mfu_peak=mfu_peak,
        model_flops_per_step=model_flops,
    )
