"""Parameters per GPU, per pipeline stage, as megatron-core instantiates them.

Per-module counts mirror mcore's GPTModel with the Transformer Engine layer spec
(``megatron/core/models/gpt/gpt_layer_specs.py``): column-parallel weights and biases are
split over TP, row-parallel weights split with their bias replicated, norms and the MoE router
replicated, routed experts split over EP (whole experts) and ETP (inside an expert), MLA down
projections replicated ("duplicated" linears), KV heads replicated when TP > query groups.
Embedding (V_pad/TP x h) on the first stage, output layer and final norm on the last stage; with
tied embeddings and PP > 1 the last stage keeps a duplicate output weight (mcore
``setup_embeddings_and_output_layer``); MTP layers sit on the last stage with their own copy of
the embedding (see ../shared/reference/megatron-formulas.md sections 1 and 5).

All functions are vectorised: tp/etp/ep and the per-stage layer counts may be numpy arrays.
Megatron's own estimator (``theoretical_memory_usage.py``) counts fewer pieces (no biases, no
position embedding, uniform stages); docs/model.md lists the differences.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import NDArray

from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Num


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer on one GPU, by placement."""

    attention: Num
    """TP-sharded attention weights (QKV/MLA projections, output projection, their split biases)."""
    mlp: Num
    """TP-sharded dense MLP or shared-expert weights."""
    experts: Num
    """Routed expert weights held by this GPU (E/EP experts, 1/ETP of each)."""
    replicated: Num
    """Norms, router, replicated biases and MLA down projections (same on every TP rank)."""

    @property
    def total(self) -> Num:
        """All parameters of the layer on this GPU."""
        return self.attention + self.mlp + self.experts + self.replicated


def attention_params(model: ModelSpec, *, tp: Num) -> LayerParams:
    """Attention block per GPU (excluding the input norm, counted in ``replicated``).

    Standard/GQA: QKV weight h*(q + 2*d*g)/tp (one column-parallel linear; with tp > g mcore
    0.16 gathers the KV output at run time rather than replicating weights: oracle-checked),
    output projection q*h/tp, optional QKV bias (q + 2*d*g)/tp and row bias h,
    QK norms 2*nu*d, learnable softmax (attention sinks) a/tp. q = d*a, d = kv_channels, g = query groups,
    nu = 2 LayerNorm / 1 RMSNorm.
    MLA (DeepSeek-V2/V3): q_down h*c_q + q_norm nu*c_q (replicated), q_up c_q*a*(d_qk+d_rope)/tp
    (or q_proj h*a*(d_qk+d_rope)/tp without q_lora), kv_down h*(c_kv+d_rope) + kv_norm nu*c_kv
    (replicated), kv_up c_kv*a*(d_qk+d_v)/tp, output a*d_v*h/tp (megatron-formulas.md section 1).
    """
    h, a, nu = model.hidden_size, model.num_attention_heads, model.norm_params
    bias = model.add_bias_linear
    if model.multi_latent_attention:
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        ckv = model.kv_lora_rank
        if model.q_lora_rank is None:
            q_split, q_rep = h * a * dq, 0
        else:
            cq = model.q_lora_rank
            q_split, q_rep = cq * a * dq, h * cq + (nu * cq if model.qk_layernorm else 0)
        split = q_split + ckv * a * (model.qk_head_dim + model.v_head_dim) + a * model.v_head_dim * h
        rep = q_rep + h * (ckv + model.qk_pos_emb_head_dim) + (nu * ckv if model.qk_layernorm else 0)
        rep += h if bias else 0
        return LayerParams(attention=split / tp, mlp=0, experts=0, replicated=rep + nu * h)
    d, g, q = model.head_dim, model.query_groups, model.query_width
    qkv_out = q + 2 * d * g
    split = h * qkv_out + q * h
    if bias or model.add_qkv_bias:
        split = split + qkv_out
    if model.softmax_type == "learnable":  # TE DotProductAttention ``softmax_offset``: one sink logit per head
        split = split + a
    rep = (h if bias else 0) + (2 * nu * d if model.qk_layernorm else 0)
    return LayerParams(attention=split / tp, mlp=0, experts=0, replicated=rep + nu * h)


def mlp_params(model: ModelSpec, *, ffn: int, tp: Num) -> Num:
    """One (dense or shared-expert) MLP per GPU: fc1 h*f*(2 if SwiGLU else 1)/tp + fc2 f*h/tp.

    Biases (add_bias_linear): fc1 bias f*(2|1)/tp split, fc2 bias h replicated (returned
    separately by ``mlp_replicated_params``).
    """
    h = model.hidden_size
    gate = 2 if model.swiglu else 1
    split = h * ffn * gate + ffn * h
    if model.add_bias_linear:
        split += ffn * gate
    return split / tp


def mlp_replicated_params(model: ModelSpec) -> int:
    """Replicated part of one MLP: the row-parallel fc2 bias h (when biases are on)."""
    return model.hidden_size if model.add_bias_linear else 0


def dense_layer_params(model: ModelSpec, *, tp: Num) -> LayerParams:
    """A dense transformer layer per GPU: attention + MLP + two norms (2*nu*h replicated)."""
    att = attention_params(model, tp=tp)
    nu, h = model.norm_params, model.hidden_size
    return LayerParams(
        attention=att.attention,
        mlp=mlp_params(model, ffn=model.ffn, tp=tp),
        experts=0,
        replicated=att.replicated + nu * h + mlp_replicated_params(model),
    )


def moe_layer_params(model: ModelSpec, *, tp: Num, ep: Num, etp: Num) -> LayerParams:
    """An MoE layer per GPU: attention, router E*h, shared experts (over TP), routed experts.

    Router: E*h weights (+ E bias with add_bias_linear, megatron-formulas.md section 1).
    Routed: (E/ep) experts x (h*f_e*(2|1) + f_e*h)/etp (+ biases f_e*(2|1)/etp split, h replicated
    per expert). Shared expert: an MLP of width f_s over TP, plus an h-sized gate if configured.
    """
    assert model.num_experts is not None
    att = attention_params(model, tp=tp)
    nu, h, e = model.norm_params, model.hidden_size, model.num_experts
    gate = 2 if model.swiglu else 1
    fe = model.moe_ffn
    per_expert_split = h * fe * gate + fe * h + (fe * gate if model.add_bias_linear else 0)
    per_expert_rep = h if model.add_bias_linear else 0
    experts = (e / ep) * (per_expert_split / etp + per_expert_rep)
    shared = mlp_params(model, ffn=model.shared_ffn, tp=tp) if model.shared_ffn else 0
    shared_rep = (mlp_replicated_params(model) if model.shared_ffn else 0) + (
        h if model.moe_shared_expert_gate and model.shared_ffn else 0
    )
    router = e * h + (e if model.add_bias_linear else 0)
    return LayerParams(
        attention=att.attention,
        mlp=shared,
        experts=experts,
        replicated=att.replicated + nu * h + router + shared_rep,
    )


@dataclass(frozen=True, slots=True)
class StageLayers:
    """What one pipeline rank holds (all its virtual chunks together); fields may be arrays."""

    num_dense_layers: Num
    num_moe_layers: Num
    has_embedding: Num
    """First pipeline rank (word + position embedding)."""
    has_output: Num
    """Last pipeline rank (final norm, output layer, loss)."""
    num_mtp_layers: Num = 0
    """MTP layers (last rank)."""
    num_bf16_start_layers: Num = 0
    """Layers of this rank among the model's first ``num_layers_at_start_in_bf16`` by GLOBAL layer number, with
    ``--first-last-layers-bf16`` (``fp8_utils.is_first_last_bf16_layer``: ``layer_no < num_layers_at_start_in_bf16``):
    with VP or an uneven split they may sit on other ranks than the first (``stages.bf16_layers_of``)."""
    num_bf16_end_layers: Num = 0
    """Layers of this rank among the model's last ``num_layers_at_end_in_bf16`` (``layer_no >= num_layers -
    num_layers_at_end_in_bf16``)."""


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters one GPU of a pipeline stage holds, by module. Fields may be arrays."""

    embedding: Num
    """Word embedding V_pad*h/tp (+ learned positions max_pos*h) on the first stage."""
    output_layer: Num
    """Output projection h*V_pad/tp and final norm on the last stage (a copy when tied, PP>1)."""
    layers_dense: Num
    """Non-expert parameters of the transformer layers (attention, MLPs, norms, router)."""
    layers_experts: Num
    """Routed expert parameters of the MoE layers."""
    mtp: Num
    """Multi-token-prediction block(s): norms, eh_proj, one layer each, embedding copy."""

    @property
    def expert(self) -> Num:
        """Expert-parallel parameters (optimizer sharded over expert-DP)."""
        return self.layers_experts

    @property
    def dense(self) -> Num:
        """Everything else (optimizer sharded over DP x CP)."""
        return self.embedding + self.output_layer + self.layers_dense + self.mtp

    @property
    def total(self) -> Num:
        """All parameters held by one GPU of this stage."""
        return self.dense + self.expert

    def as_dict(self) -> dict[str, float]:
        """Scalar breakdown (for JSON)."""
        out = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        out["total"] = float(self.total)
        return out


def embedding_params(model: ModelSpec, *, tp: Num, max_positions: int) -> Num:
    """Word embedding V_pad(tp)*h/tp, plus max_positions*h for learned absolute positions."""
    vpad = padded_vocab(model, tp)
    pos = max_positions * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    return vpad * model.hidden_size / tp + pos


def padded_vocab(model: ModelSpec, tp: Num) -> Num:
    """Vectorised ``ModelSpec.padded_vocab_size``: ceil(V / (div*tp)) * div*tp."""
    multiple = model.make_vocab_size_divisible_by * np.asarray(tp)
    padded: Num = -(-model.vocab_size // multiple) * multiple
    return padded


def output_params(model: ModelSpec, *, tp: Num, pp: Num) -> Num:
    """Final norm nu*h + output layer h*V_pad/tp (absent when tied and PP == 1: shares the embedding)."""
    vpad = padded_vocab(model, tp)
    separate = model.untie_embeddings_and_output_weights | (np.asarray(pp) > 1)
    return model.norm_params * model.hidden_size + np.where(separate, vpad * model.hidden_size / tp, 0)


def mtp_params(model: ModelSpec, *, tp: Num, ep: Num, etp: Num, pp: Num, max_positions: int) -> Num:
    """One MTP block: enorm + hnorm + final norm (3*nu*h), eh_proj 2h*h/tp, one transformer layer
    of the last main layer's type; the MTP stage keeps its own embedding copy when PP > 1."""
    if model.mtp_num_layers == 0:
        return 0
    nu, h = model.norm_params, model.hidden_size
    layer = (moe_layer_params(model, tp=tp, ep=ep, etp=etp) if model.mtp_layer_is_moe
             else dense_layer_params(model, tp=tp))
    block = 3 * nu * h + 2 * h * h / tp + layer.total
    emb_copy = np.where(np.asarray(pp) > 1, embedding_params(model, tp=tp, max_positions=max_positions), 0)
    return model.mtp_num_layers * block + emb_copy


def mtp_expert_params(model: ModelSpec, *, tp: Num, ep: Num, etp: Num) -> Num:
    """Routed-expert part of the MTP blocks (for expert-DP sharding)."""
    if model.mtp_num_layers == 0 or not model.mtp_layer_is_moe:
        return 0
    return model.mtp_num_layers * moe_layer_params(model, tp=tp, ep=ep, etp=etp).experts


@dataclass(frozen=True, slots=True)
class ParamTerms:
    """The stage-independent parts of ``stage_params`` (fields may be arrays), shared by the stages
    of a layout."""

    dense_layer: Num
    """All parameters of one dense layer on one GPU."""
    moe_dense: Num
    """Non-expert parameters of one MoE layer (0 for dense models)."""
    moe_experts: Num
    """Routed-expert parameters of one MoE layer (0 for dense models)."""
    embedding: Num
    output: Num
    mtp_total: Num
    mtp_experts: Num

    def take(self, index: NDArray[np.int64]) -> ParamTerms:
        """Rows ``index`` of every array field."""
        return ParamTerms(**{f.name: (v if np.ndim(v := getattr(self, f.name)) == 0 else np.asarray(v)[index])
                             for f in fields(self)})


def param_terms(model: ModelSpec, *, tp: Num, pp: Num, ep: Num, etp: Num, max_positions: int) -> ParamTerms:
    """Per-layer, embedding, output and MTP parameter counts of a layout (or table of layouts)."""
    dense = dense_layer_params(model, tp=tp)
    if model.is_moe:
        moe = moe_layer_params(model, tp=tp, ep=ep, etp=etp)
        moe_dense, moe_experts = moe.attention + moe.mlp + moe.replicated, moe.experts
    else:
        moe_dense, moe_experts = 0, 0
    return ParamTerms(
        dense_layer=dense.total, moe_dense=moe_dense, moe_experts=moe_experts,
        embedding=embedding_params(model, tp=tp, max_positions=max_positions),
        output=output_params(model, tp=tp, pp=pp),
        mtp_total=mtp_params(model, tp=tp, ep=ep, etp=etp, pp=pp, max_positions=max_positions),
        mtp_experts=mtp_expert_params(model, tp=tp, ep=ep, etp=etp),
    )


def stage_params(
    model: ModelSpec, stage: StageLayers, *, tp: Num, pp: Num, ep: Num, etp: Num, max_positions: int,
    terms: ParamTerms | None = None,
) -> StageParams:
    """Parameters held by one GPU of a pipeline stage (vectorised over candidates). ``terms``: the
    layout's ``param_terms`` when already computed (the same for every stage)."""
    t = terms if terms is not None else param_terms(model, tp=tp, pp=pp, ep=ep, etp=etp, max_positions=max_positions)
    has_mtp = np.asarray(stage.num_mtp_layers) > 0
    return StageParams(
        embedding=np.where(stage.has_embedding, t.embedding, 0),
        output_layer=np.where(stage.has_output, t.output, 0),
        layers_dense=stage.num_dense_layers * t.dense_layer + stage.num_moe_layers * t.moe_dense,
        layers_experts=stage.num_moe_layers * t.moe_experts + np.where(has_mtp, t.mtp_experts, 0),
        mtp=np.where(has_mtp, t.mtp_total - t.mtp_experts, 0),
    )


@dataclass(frozen=True, slots=True)
class ModelParamCounts:
    """Whole-model parameter counts (no parallelism; vocab padded at TP = 1)."""

    total: int
    """All parameters of the main model (embedding, layers, final norm, output layer if untied)."""
    active_per_token: int
    """Parameters a token passes through: routed experts replaced by the top-k."""
    mtp: int
    """Extra parameters of the MTP blocks (not in ``total``; published sizes exclude them)."""
    embedding: int
    """Word (+ position) embedding."""


def model_param_counts(model: ModelSpec, *, max_positions: int, tp: int = 1) -> ModelParamCounts:
    """Total and active parameter counts (published model sizes use the unpadded-at-TP=1 vocab)."""
    pattern = model.moe_layer_pattern()
    n_moe = sum(pattern)
    n_dense = model.num_layers - n_moe
    dense = dense_layer_params(model, tp=tp).total
    emb = embedding_params(model, tp=tp, max_positions=max_positions)
    out = output_params(model, tp=tp, pp=1)
    total = n_dense * dense + emb + out
    active = total
    if model.is_moe:
        assert model.num_experts is not None
        moe = moe_layer_params(model, tp=tp, ep=1, etp=tp)
        total += n_moe * moe.total
        active += n_moe * (moe.total - moe.experts * (1 - model.moe_router_topk / model.num_experts))
    mtp = mtp_params(model, tp=tp, ep=1, etp=tp, pp=1, max_positions=max_positions)
    return ModelParamCounts(
        total=round(float(total)), active_per_token=round(float(active)),
        mtp=round(float(mtp)), embedding=round(float(emb)),
    )
