"""Activation memory saved for the backward pass, per GPU, per micro-batch.

Starting point: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), section 4 and Table 2, per layer with 16-bit activations and 1-byte
dropout masks:
    attention 11sbh + 5as^2b, MLP 19sbh, two norms 4sbh  ->  sbh(34 + 5as/h)
    TP (no SP): sbh(10 + 24/t + 5as/(ht));  TP + SP: (sbh/t)(34 + 5as/h);  full recompute: 2sbh
Extended here (docs/model.md, "Activations"):
  * flash attention (TE fused attention, Megatron's default): no s^2 terms; it keeps Q, K, V, the
    output O and an fp32 log-sum-exp per head and token;
  * GQA/MQA: K and V are 2*s*b*d*g wide; with TP > g each rank holds one gathered KV head (d*max(g,t)/t);
  * SwiGLU: the activation input is 2f wide; any ffn width f;
  * MLA: the compressed latents (c_q, c_kv + rope) are kept replicated over TP;
  * MoE: top-k routed token copies, dispatched over EP; each GPU processes
    s*b*k*etp/(t*c) token copies (balanced routing) at width f_e/etp, plus router probabilities;
  * CP: the sequence is split over CP ranks (s -> s/c); ring exchanges are transient;
  * FP8: GEMM inputs are saved as 1-byte FP8 copies (Transformer Engine);
  * recomputation: selective by Megatron ``--recompute-modules`` (core_attn, layernorm, mlp,
    moe_act, moe, shared_experts, mla_up_proj); full keeps one layer input per checkpoint group
    and rebuilds one group during backward.
All functions are vectorised over candidates (numpy arrays for layout fields).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Bool, Num

BF16_BYTES = 2.0
FP8_BYTES = 1.0
NVFP4_BYTES = 0.5 + 1.0 / 16
"""One NVFP4 element: 4-bit E2M1 value + one E4M3 scale per 16 (TE ``NVFP4Tensor``)."""
FP32_BYTES = 4.0
MASK_BYTES = 1.0
INT64_BYTES = 8.0


@dataclass(frozen=True, slots=True)
class ActivationContext:
    """Per-candidate quantities the activation formulas need (scalars or arrays)."""

    seq_len: int
    mbs: Num
    tp: Num
    cp: Num
    sp: Bool
    ep: Num
    etp: Num
    recompute_code: Num
    recompute_modules: tuple[str, ...]
    recompute_num_layers: int
    fp8: bool
    flash: bool = True
    offload_modules: tuple[str, ...] = ()
    """Modules whose inputs fine-grained activation offloading keeps on the host
    (``TrainingSpec.offloaded_modules``)."""
    routed_load: float = 1.0
    """Routed token copies over the dropless T k (``time.ep.routed_load_factor``: token drop / padding)."""
    fp4: bool = False
    """NVFP4 training: saved GEMM inputs are TE's columnwise NVFP4 copies (``NVFP4_BYTES``)."""
    te_cross_entropy: bool = False
    """Transformer Engine's fused cross entropy (``TrainingSpec.cross_entropy_loss_fusion`` with
    ``cross_entropy_fusion_impl`` te): no fp32 logits copy (``output_bytes``)."""

    @property
    def tokens(self) -> Num:
        """Tokens of one micro-batch on one CP rank: s*b/c."""
        return self.seq_len * self.mbs / self.cp

    @property
    def seq_shard(self) -> Num:
        """Divisor of h-sized tensors outside the TP regions: t with sequence parallel, else 1."""
        return np.where(self.sp, self.tp, 1)

    @property
    def gemm_input_bytes(self) -> float:
        """Bytes per element of saved GEMM inputs (FP8 copies under FP8 training, NVFP4 ones under FP4)."""
        return FP8_BYTES if self.fp8 else NVFP4_BYTES if self.fp4 else BF16_BYTES


def _mod(ctx: ActivationContext, name: str) -> Num:
    """True where selective recompute of module ``name`` is active."""
    return (ctx.recompute_code == 1) & (name in ctx.recompute_modules)


def _off(ctx: ActivationContext, *names: str) -> bool:
    """True when fine-grained activation offloading moves the input of one of ``names`` to the host
    (Megatron-LM ``--offload-modules``: ``FineGrainedActivationOffloadingInterface`` around each module)."""
    return any(n in ctx.offload_modules for n in names)


def attention_block_bytes(model: ModelSpec, ctx: ActivationContext) -> Num:
    """Attention half of a layer (input norm to output dropout), no full recompute.

    norm input 2Th/sh + norm output (QKV input) g*Th/sh + Q,K,V 2T(q+2d*max(g,t))/t
    + output O 2Tq/t (+ FP8 copy for the projection) + LSE 4aT/t + dropout mask Th/sh,
    T = s*b/c tokens, sh = t with SP else 1, g = GEMM-input bytes.
    MLA: Q,K 2T*a*(d_qk+d_rope)/t, V 2T*a*d_v/t, latents 2T(2c_q + 2c_kv + d_rope) replicated.
    Offloaded module inputs are not on the GPU: ``attn_norm`` the norm input, ``qkv_linear`` the QKV GEMM input,
    ``core_attn`` Q, K, V, ``attn_proj`` the output O (with its FP8 copy).
    """
    T, t, sh = ctx.tokens, ctx.tp, ctx.seq_shard
    h, a = model.hidden_size, model.num_attention_heads
    norm_in = BF16_BYTES * T * h / sh
    norm_out = np.where(_mod(ctx, "layernorm"), 0.0, ctx.gemm_input_bytes * T * h / sh)
    if model.multi_latent_attention:
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        qkv = BF16_BYTES * T * a * (2 * dq + model.v_head_dim) / t
        cq = model.q_lora_rank or 0
        latents = BF16_BYTES * T * (2 * cq + 2 * model.kv_lora_rank + model.qk_pos_emb_head_dim)
        qkv = np.where(_mod(ctx, "mla_up_proj"), 0.0, qkv)
        out_width = a * model.v_head_dim
    else:
        d, g = model.head_dim, model.query_groups
        qkv = BF16_BYTES * T * (model.query_width + 2 * d * np.maximum(g, t)) / t
        latents = 0.0
        out_width = model.query_width
    out = BF16_BYTES * T * out_width / t
    if ctx.fp8 or ctx.fp4:
        out = out + ctx.gemm_input_bytes * T * out_width / t
    if ctx.flash:
        core = np.where(_mod(ctx, "core_attn"), 0.0, FP32_BYTES * a * T / t)
    else:
        # Korthikanti 2022 Eq. 1: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b
        per_score = BF16_BYTES + (MASK_BYTES + BF16_BYTES if model.attention_dropout > 0 else 0.0)
        core = np.where(_mod(ctx, "core_attn"), 0.0, per_score * a * T * ctx.seq_len / t)
    lse = core
    mask = MASK_BYTES * T * h / sh if model.hidden_dropout > 0 else 0.0
    if _off(ctx, "attn_norm"):
        norm_in = 0.0
    if _off(ctx, "qkv_linear"):
        norm_out = 0.0 * norm_out
    if _off(ctx, "core_attn"):
        qkv = 0.0 * qkv
    if _off(ctx, "attn_proj"):
        out = 0.0 * out
    return norm_in + norm_out + qkv + latents + out + lse + mask


def dense_mlp_bytes(model: ModelSpec, ctx: ActivationContext, *, ffn: int, with_norm: bool) -> Num:
    """Dense (or shared-expert) MLP half: norm input 2Th/sh, fc1 input g*Th/sh,
    activation input 2T*f*(2|1)/t, fc2 input g*T*f/t, dropout mask Th/sh.
    ``mlp`` recompute keeps only the block input."""
    T, t, sh, h = ctx.tokens, ctx.tp, ctx.seq_shard, model.hidden_size
    gate = 2 if model.swiglu else 1
    norm_in = BF16_BYTES * T * h / sh if (with_norm and not _off(ctx, "mlp_norm")) else 0.0
    fc1_in = ctx.gemm_input_bytes * T * h / sh
    if with_norm:
        fc1_in = np.where(_mod(ctx, "layernorm"), 0.0, fc1_in)
    inner = BF16_BYTES * T * ffn * gate / t + ctx.gemm_input_bytes * T * ffn / t
    mask = MASK_BYTES * T * h / sh if (model.hidden_dropout > 0 and with_norm) else 0.0
    full = norm_in + fc1_in + inner + mask
    if with_norm:
        return np.where(_mod(ctx, "mlp"), norm_in, full)
    return full


def saved_routed_load(routed_load: float, rank_capacity_factor: float | None, paged_stash: bool,
                      stash_buffer_size_factor_cuda: float) -> float:
    """Routed token copies an expert MLP keeps for the backward, over the dropless T k
    (``ActivationContext.routed_load``).

    - ``--moe-paged-stash``: |f_cuda|, the GPU stash holds pages of the tokens received, sized from the expected count
      avg_num_tokens = max_num_tokens // rank capacity factor = T k (megatron/core/transformer/moe/experts.py,
      ``TEGroupedMLP`` op-fuser path) accumulated over the layers in flight, times ``abs(factor)``
      (moe/paged_stash.py ``PagedStashManager.allocate_stash_buffers``; a negative factor sizes from the largest actual
      count, T k again under balanced routing). The host buffer (``..._factor_cpu``) is host memory.
    - ``--moe-expert-rank-capacity-factor`` r without the stash: r, HybridEP's output is a static budget of
      padded_num_tokens x topk x r rows (token_dispatcher.py ``_HybridEPManager.setup_metadata``, ``budget``; the
      rounding to the quantization alignment is dropped) and the grouped MLP runs on, and saves, all
      max_num_tokens rows.
    - otherwise ``routed_load`` (``time.ep.routed_load_factor``: token drop / padding to capacity).
    """
    if paged_stash:
        return abs(float(stash_buffer_size_factor_cuda))
    if rank_capacity_factor is not None:
        return float(rank_capacity_factor)
    return routed_load


def moe_mlp_bytes(model: ModelSpec, ctx: ActivationContext) -> Num:
    """MoE half of a layer: norm, router (fp32 logits and probabilities), routed experts, shared.

    Routed token copies per GPU: Te = s*b*k*etp/(t*c) (balanced dispatch over EP, each copy
    processed by the ETP group), times ``routed_load`` (capacity factor, padding, rank budget, paged stash:
    ``saved_routed_load``). Saved per copy: fc1 input h,
    activation input f_e*(2|1)/etp, fc2 input f_e/etp and its fp32 routing probability (4 B); offloaded:
    ``mlp_norm`` the norm input, ``expert_fc1`` the fc1 input, ``moe_act`` the activation input,
    ``fused_group_mlp`` all three GEMM-side inputs. The probabilities are applied inside the activation
    (``megatron/core/transformer/moe/experts.py`` ``TEGroupedMLP.forward``, ``bias_act_func``:
    ``weighted_bias_swiglu_impl(fc1_output, bias, permuted_probs)``), so the
    expert output is not kept for the combine: unpermute is an index scatter-add.
    """
    assert model.num_experts is not None
    T, t, sh, h = ctx.tokens, ctx.tp, ctx.seq_shard, model.hidden_size
    k, fe = model.moe_router_topk, model.moe_ffn
    gate = 2 if model.swiglu else 1
    norm_in = 0.0 if _off(ctx, "mlp_norm") else BF16_BYTES * T * h / sh
    norm_out = np.where(_mod(ctx, "layernorm"), 0.0, BF16_BYTES * T * h / sh)
    router = 2 * FP32_BYTES * T * model.num_experts / sh
    te = T * k * ctx.etp / t * ctx.routed_load
    act_in = np.where(_mod(ctx, "moe_act"), 0.0, BF16_BYTES * te * fe * gate / ctx.etp)
    fc1_in = ctx.gemm_input_bytes * te * h
    fc2_in = ctx.gemm_input_bytes * te * fe / ctx.etp
    if _off(ctx, "expert_fc1", "fused_group_mlp"):
        fc1_in = 0.0 * fc1_in
    if _off(ctx, "moe_act", "fused_group_mlp"):
        act_in = 0.0 * act_in
    if _off(ctx, "fused_group_mlp"):
        fc2_in = 0.0 * fc2_in
    routed = fc1_in + act_in + fc2_in + FP32_BYTES * te
    shared: Num = 0.0
    if model.shared_ffn:
        shared = dense_mlp_bytes(model, ctx, ffn=model.shared_ffn, with_norm=False)
        shared = np.where(_mod(ctx, "shared_experts"), 0.0, shared)
    mask = MASK_BYTES * T * h / sh if model.hidden_dropout > 0 else 0.0
    full = norm_in + norm_out + router + routed + shared + mask
    return np.where(_mod(ctx, "moe"), norm_in, full)


def layer_bytes_no_full_recompute(model: ModelSpec, ctx: ActivationContext, *, moe: bool) -> Num:
    """All activations one layer keeps for one micro-batch (none/selective recompute)."""
    mlp = moe_mlp_bytes(model, ctx) if moe else dense_mlp_bytes(model, ctx, ffn=model.ffn, with_norm=True)
    return attention_block_bytes(model, ctx) + mlp


def layer_input_bytes(model: ModelSpec, ctx: ActivationContext) -> Num:
    """Input of a layer, 2*T*h/sh: what full recompute keeps per checkpoint."""
    return BF16_BYTES * ctx.tokens * model.hidden_size / ctx.seq_shard


def layer_bytes(model: ModelSpec, ctx: ActivationContext, *, moe: bool) -> Num:
    """Saved activations per layer per micro-batch under the layout's recompute setting.

    Full recompute (uniform, N = recompute_num_layers): one layer input per N layers.
    """
    full = layer_input_bytes(model, ctx) / ctx.recompute_num_layers
    return np.where(ctx.recompute_code == 2, full, layer_bytes_no_full_recompute(model, ctx, moe=moe))


def recompute_working_bytes(model: ModelSpec, ctx: ActivationContext, *, has_moe: bool) -> Num:
    """Transient activations rebuilt during backward under full recompute: one checkpoint
    group (N layers) of one micro-batch, the largest layer type. 0 otherwise."""
    from paraplan.layout import RECOMPUTE_CODES  # local: avoid a cycle at import time

    none_ctx = ActivationContext(
        seq_len=ctx.seq_len, mbs=ctx.mbs, tp=ctx.tp, cp=ctx.cp, sp=ctx.sp, ep=ctx.ep,
        etp=ctx.etp, recompute_code=RECOMPUTE_CODES["none"], recompute_modules=(),
        recompute_num_layers=1, fp8=ctx.fp8, flash=ctx.flash, routed_load=ctx.routed_load, fp4=ctx.fp4,
    )
    per_layer = layer_bytes_no_full_recompute(model, none_ctx, moe=False)
    if has_moe:
        per_layer = np.maximum(per_layer, layer_bytes_no_full_recompute(model, none_ctx, moe=True))
    return np.where(ctx.recompute_code == 2, ctx.recompute_num_layers * per_layer, 0.0)


def embedding_bytes(model: ModelSpec, ctx: ActivationContext) -> Num:
    """First stage, per micro-batch: int64 token ids (and position ids) 8*s*b/c each, embedding
    dropout mask s*b*h/(c*sh) (Korthikanti 2022 section 4.2)."""
    ids = INT64_BYTES * ctx.tokens * (2 if model.position_embedding_type == "learned_absolute" else 1)
    mask = MASK_BYTES * ctx.tokens * model.hidden_size / ctx.seq_shard if model.hidden_dropout > 0 else 0.0
    return ids + mask


TE_CROSS_ENTROPY_FP32_GRAD = False
"""The Transformer Engine release assumed for its fused cross entropy, one switch for memory (``output_bytes``) and
time (``time.compute.LOSS_BYTES_PER_LOGIT_FUSED``). False: TE <= 2.17, the releases of the NeMo 25.x-26.06 containers
every Megatron-Bridge calibration row ran, whose forward writes the bf16 softmax gradient into the logits in place
and saves them for backward (TE ``common/triton/cross_entropy.py`` ``cross_entropy_kernel``:
``tl.store(X_ptr + X_offsets, X_block.to(grad_dtype))``; ``pytorch/triton/cross_entropy.py``
``cross_entropy_forward``: ``return loss, _input``). True: TE 2.18 (commit 01bbe3e, "Store the input gradient in
FP32"), an fp32 gradient beside the logits, as the unfused loss keeps. Assumed, not fitted."""
TE_CROSS_ENTROPY_GRAD_BYTES = FP32_BYTES if TE_CROSS_ENTROPY_FP32_GRAD else 0.0
"""Bytes per logit element that TE's fused cross entropy keeps beyond the bf16 logits: 0 in place (TE <= 2.17),
4 with TE 2.18's fp32 gradient (``TE_CROSS_ENTROPY_FP32_GRAD``)."""


def output_bytes(model: ModelSpec, ctx: ActivationContext, *, padded_vocab: Num) -> Num:
    """Last stage, one micro-batch: final-norm input and output 2*2Th/sh, then the logits:
    bf16 logits 2TV/t and the fp32 copy the vocab-parallel cross entropy keeps 4TV/t
    (``tensor_parallel.vocab_parallel_cross_entropy``: ``calculate_logits_max`` casts ``.float()``, the softmax is
    saved; MCore's fused ``native`` loss, ``fusions/fused_cross_entropy.py``, the same). TE's fused loss
    (``ctx.te_cross_entropy``): 2TV/t + ``TE_CROSS_ENTROPY_GRAD_BYTES`` TV/t, the gradient written into the
    logits (``language_module.py`` ``compute_language_model_loss`` -> ``te_parallel_cross_entropy``)."""
    T, t, sh, h = ctx.tokens, ctx.tp, ctx.seq_shard, model.hidden_size
    norms = 2 * BF16_BYTES * T * h / sh
    kept = TE_CROSS_ENTROPY_GRAD_BYTES if ctx.te_cross_entropy else FP32_BYTES
    logits = (BF16_BYTES + kept) * T * padded_vocab / t
    return norms + logits
