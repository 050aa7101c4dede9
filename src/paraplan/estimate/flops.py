"""FLOPs: Megatron's reported model FLOPs, and the per-GPU GEMM shapes that set compute time.

Model FLOPs per global batch mirror ``num_floating_point_operations`` in Megatron-LM's
``megatron/training/training.py`` at d98e8a6 (megatron-formulas.md section 6): every GEMM counted
3x (forward, dgrad, wgrad) x 2 (multiply-add), attention scores with the causal half
(S2 = B*s^2 term), MLA projections, MTP layers counted as extra layers, logits once per
prediction head. No recomputation: this is the MFU numerator (PaLM, Chowdhery et al. 2022,
arXiv:2204.02311 App. B). Hardware FLOPs add the recomputed forward passes (HFU numerator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from paraplan.estimate.params import padded_vocab
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Num


def _layer_counts(model: ModelSpec) -> tuple[int, int, int]:
    """(dense layers, MoE layers, MTP layers), MTP layers typed like the last main layer."""
    pattern = model.moe_layer_pattern()
    n_moe = sum(pattern)
    mtp = model.mtp_num_layers
    n_moe_total = n_moe + (mtp if model.mtp_layer_is_moe else 0)
    n_dense_total = model.num_layers - n_moe + (0 if model.mtp_layer_is_moe else mtp)
    return n_dense_total, n_moe_total, mtp


def attention_projection_params(model: ModelSpec) -> int:
    """Weights of the attention GEMMs of one layer (FLOPs per token = 2x this, forward).

    Standard: h*(q + 2*d*g) + q*h. MLA: q (h*c_q + c_q*a*(d_qk+d_rope), or h*a*(d_qk+d_rope)),
    kv_down h*(c_kv + d_rope), kv_up c_kv*a*(d_qk + d_v), out a*d_v*h.
    """
    h, a = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        dq = model.qk_head_dim + model.qk_pos_emb_head_dim
        q = h * a * dq if model.q_lora_rank is None else h * model.q_lora_rank + model.q_lora_rank * a * dq
        kv = h * (model.kv_lora_rank + model.qk_pos_emb_head_dim)
        kv += model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim)
        return q + kv + a * model.v_head_dim * h
    return h * (model.query_width + 2 * model.kv_width) + model.query_width * h


TENSOR_CORE_MULTIPLE_16BIT = 8
"""16-bit GEMM dimensions tensor cores take at full speed are multiples of 8 elements (16 bytes);
FlashAttention-2 and cuDNN fused attention need head dims that are multiples of 8 (NVIDIA Matrix
Multiplication Background User's Guide, "Tensor Core Requirements"; flash-attn and Transformer
Engine backend selection)."""


def attention_heads_tensor_core_aligned(model: ModelSpec) -> bool:
    """True when every attention head dim (q/k and v) is a multiple of 8.

    Otherwise Transformer Engine falls back to unfused attention (torch baddbmm over the full,
    not causal-halved, s x s scores) whose K = head_dim GEMMs miss tensor cores; measured on the
    BLOOM prequel (Megatron-DeepSpeed, A100): head dims 108 and 150 ran 30-40% slower per step
    than their neighbours with aligned heads (published_runs.csv, chronicles-prequel)."""
    return all(d % TENSOR_CORE_MULTIPLE_16BIT == 0 for d in attention_head_dims(model))


def attention_head_dims(model: ModelSpec) -> tuple[int, int]:
    """(q/k head dim, v head dim): MLA's qk_head_dim + rope dim and v_head_dim, else kv_channels."""
    if model.multi_latent_attention:
        return model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


def attention_score_width(model: ModelSpec) -> float:
    """Per-token width w of the two attention-score GEMMs: forward FLOPs per query token =
    2*s_kv*w (QK^T at the qk width plus AV at the v width, halved... see callers)."""
    if model.multi_latent_attention:
        a = model.num_attention_heads
        return (a * (model.qk_head_dim + model.qk_pos_emb_head_dim) + a * model.v_head_dim) / 2
    return float(model.query_width)


def windowed_score_pairs(seq_len: int, left: int) -> int:
    """(query, key) pairs one sliding-window layer scores over a sequence: query i (0-based) sees
    min(i + 1, w) keys, w = left + 1 (``--window-size (left, 0)``), so the sum is w*s - w(w-1)/2 for s >= w and the
    causal s(s+1)/2 otherwise (``left`` -1: unlimited). Flash attention (cuDNN fused attention, which TE runs for
    windows, ``attention/dot_product_attention/utils.py`` ``get_attention_backend``) skips the tiles outside the
    window, ~2*b*s*w*d per score GEMM instead of the causal b*s^2*d; the time model counts the tiles it computes
    whole (``windowed_tile_pairs``), these exact pairs are the lower bound they cover."""
    w = seq_len if left < 0 else min(left + 1, seq_len)
    return w * seq_len - w * (w - 1) // 2


ATTENTION_TILE_TOKENS: Final = 128
"""Query and key tile of the fused attention kernel, tokens (ASSUMED, not fitted): TE runs cuDNN's fused attention
for gpt-oss's sinks (``get_attention_backend`` disables flash-attn for softmax_type learnable / off-by-one), and
cuDNN's kernels are closed source, so no primary source gives their tile; 128 x 128 is the tile of the open
flash-attention kernels on these GPUs (an assumption). A kernel computes a tile whole or skips it, so a 128-key
window costs ~2 key tiles per 128-query tile, not 128 keys."""


def windowed_tile_pairs(seq_len: int, left: int, tile_tokens: int = ATTENTION_TILE_TOKENS) -> int:
    """(query, key) elements of the tiles a causal sliding-window layer computes: query tile q (rows q*T ..
    min(q*T + T, s) - 1) touches the key tiles from (max(0, q*T - left)) // T to q (``left`` -1: unlimited, every
    tile up to the diagonal), each computed whole: sum over touched tiles of rows(q) x cols(k), T = ``tile_tokens``.

    Closed form: n = ceil(s/T) tiles, m = ceil(left/T) (n when unlimited); query tile q touches min(q, m) + 1 key
    tiles; the n-1 full query tiles give T^2 * sum_{q<n-1} (min(q, m) + 1), the last one (r = s - (n-1)T rows)
    r * (min(n-1, m) * T + r) (its diagonal tile is r x r)."""
    n = -(-seq_len // tile_tokens)
    m = n if left < 0 else -(-left // tile_tokens)
    full = n - 1  # query tiles 0 .. n-2, all T rows
    sum_min = full * (full - 1) // 2 if full <= m + 1 else m * (m + 1) // 2 + (full - 1 - m) * m
    r = seq_len - full * tile_tokens
    return tile_tokens * tile_tokens * (sum_min + full) + r * (min(full, m) * tile_tokens + r)


def attention_score_fraction(model: ModelSpec, seq_len: int) -> float:
    """Score work per layer, averaged over the main layers, as a share of the causal work that
    ``attention_score_width`` callers take (Megatron's ``num_floating_point_operations``): 1 for full causal
    attention; for a windowed layer the tiles it computes over the causal layer's, both counted in whole
    ``ATTENTION_TILE_TOKENS`` tiles (``windowed_tile_pairs``), layers chosen by ``ModelSpec.window_layer_pattern``
    (gpt-oss-120B at s = 4096: 18 of 36 layers at 128 keys, 63 of 528 tiles -> 0.560; exact pairs would give 0.531,
    ``windowed_score_pairs``). Megatron's reported model FLOPs (``model_flops_per_step``) do not count the window;
    the time model does."""
    pattern = model.window_layer_pattern()
    if model.window_size is None or not any(pattern):
        return 1.0
    windowed = min(1.0, windowed_tile_pairs(seq_len, model.window_size[0]) / windowed_tile_pairs(seq_len, -1))
    n_win = sum(pattern)
    return (n_win * windowed + (len(pattern) - n_win)) / len(pattern)


def model_flops_per_step(model: ModelSpec, *, seq_len: int, global_batch_size: int, tp: Num = 1) -> Num:
    """Megatron's model FLOPs for one global batch (causal attention counted at half).

    F = 6*T*[ h*mu*(f*N_dense + (f_e*k + f_s)*N_moe) + P_attn*N + M*(3h + 2h^2) + h*V*(M+1) ]
        + 6*B*s^2*w*N
    T = B*s tokens, mu = 3 (SwiGLU) or 2, N = all layers incl. MTP, V = padded vocab,
    w = q for standard attention (QK^T + AV, causal halves 2 GEMMs -> 1 x q).
    """
    h, s, b = model.hidden_size, seq_len, global_batch_size
    tokens = b * s
    mu = 3 if model.swiglu else 2
    n_dense, n_moe, mtp = _layer_counts(model)
    n_all = n_dense + n_moe
    mlp = h * mu * (model.ffn * n_dense + (model.moe_ffn * model.moe_router_topk + model.shared_ffn) * n_moe)
    attn = attention_projection_params(model) * n_all
    vpad = padded_vocab(model, tp)
    per_token = mlp + attn + mtp * (3 * h + 2 * h * h) + h * vpad * (mtp + 1)
    score = 6.0 * b * s * s * attention_score_width(model) * n_all
    return 6.0 * tokens * per_token + score


def recompute_flops_per_step(
    model: ModelSpec, *, seq_len: int, global_batch_size: int, recompute_code: Num,
    recompute_modules: tuple[str, ...], full_frac: Num = 1.0,
) -> Num:
    """Forward FLOPs redone by activation recomputation (added to model FLOPs for HFU).

    full: one extra forward of every layer = (model FLOPs of the layers) / 3, times ``full_frac`` (the share of
    layers the block method re-runs);
    selective core_attn: the attention-score forward = 2*B*s^2*w*N (causal half);
    selective mlp/moe/shared_experts: those blocks' forward GEMMs; mla_up_proj: MLA's up projections.
    """
    h, s, b = model.hidden_size, seq_len, global_batch_size
    tokens = b * s
    mu = 3 if model.swiglu else 2
    n_dense, n_moe, _ = _layer_counts(model)
    n_all = n_dense + n_moe
    attn_proj = 2.0 * tokens * attention_projection_params(model) * n_all
    score = 2.0 * b * s * s * attention_score_width(model) * n_all * attention_score_fraction(model, s)
    dense_mlp = 2.0 * tokens * h * mu * model.ffn * n_dense
    routed = 2.0 * tokens * h * mu * model.moe_ffn * model.moe_router_topk * n_moe
    shared = 2.0 * tokens * h * mu * model.shared_ffn * n_moe
    full = (attn_proj + score + dense_mlp + routed + shared) * full_frac
    selective = score * ("core_attn" in recompute_modules)
    selective += dense_mlp * ("mlp" in recompute_modules)
    selective += (routed + shared) * ("moe" in recompute_modules)
    selective += shared * ("shared_experts" in recompute_modules and "moe" not in recompute_modules)
    if model.multi_latent_attention and "mla_up_proj" in recompute_modules:  # q (up) and kv up projections
        q_in = model.q_lora_rank if model.q_lora_rank is not None else h
        up = (q_in * (model.qk_head_dim + model.qk_pos_emb_head_dim)
              + model.kv_lora_rank * (model.qk_head_dim + model.v_head_dim)) * model.num_attention_heads
        selective += 2.0 * tokens * up * n_all
    return np.where(recompute_code == 2, full, np.where(recompute_code == 1, selective, 0.0))


@dataclass(frozen=True, slots=True)
class Gemm:
    """A GEMM of shape (m x k) @ (k x n) on one GPU, repeated ``count`` times per micro-batch."""

    m: Num
    n: Num
    k: Num
    count: Num = 1

    @property
    def flops(self) -> Num:
        """2*m*n*k*count (forward)."""
        return 2.0 * self.m * self.n * self.k * self.count
