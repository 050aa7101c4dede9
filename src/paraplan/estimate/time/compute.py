"""Compute terms: GEMMs at a shape-dependent efficiency, attention, element-wise kernels at HBM
bandwidth, the output layer and the embedding.

GEMM efficiency falls with every small dimension (e_max * prod_x x/(x + d0), x in m, n, k: TP
shrinks n or k, few tokens per expert shrink m); flash attention forward runs at
``attention_frac`` of peak with a 2.5x backward; element-wise kernels move a calibrated number of
bytes per token and hidden unit (``EfficiencySpec``); see docs/model.md section 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from paraplan.errors import SpecError
from paraplan.estimate import activations as act
from paraplan.estimate.flops import attention_head_dims
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Num
from paraplan.specs.training import TrainingSpec

FLOPS_PER_MAC: Final = 2.0
"""A multiply-add is two floating-point operations."""
CAUSAL_SCORE_FLOPS_FACTOR: Final = 2.0
"""Forward score FLOPs per query token and key token and unit of score width: ``FLOPS_PER_MAC`` x 2
GEMMs (QK^T, AV) x 1/2 (causal mask: flash attention skips the upper triangle)."""
UNFUSED_SCORE_FACTOR: Final = 2.0
"""Unfused attention computes the full s x s scores: twice the causal half."""
GEMM_FWD_BWD_FACTOR: Final = 3.0
"""Forward + backward GEMM time in forward GEMMs: backward computes dgrad and wgrad, each a GEMM of
the forward's size (Narayanan et al. 2021, arXiv:2104.04473, section 5.1: 3x forward FLOPs)."""
ATTENTION_BWD_FACTOR: Final = 2.5
"""FlashAttention-2 backward recomputes the scores: 5 score-sized GEMMs vs 2 forward (Dao 2023)."""
HALF_LAYER_SHARE: Final = 0.5
"""Share of a layer's kernel launches (``layer_overhead_s``) and of its norm/residual/dropout
traffic (``elementwise_bytes_per_token_hidden``) that falls on each of its two halves, the
attention block and the MLP block (each has one norm, one dropout and one residual add)."""
ACT_FN_BYTES_PER_ELEMENT: Final = 12.0
"""SwiGLU/GeLU forward (read 2, write 2... per element) and backward traffic, bf16, per element of f."""
MOE_PERMUTE_BYTES_PER_ELEMENT: Final = 24.0
"""HBM bytes per routed token copy and hidden unit moved by the MoE token permutation
(docs/model.md section 4), read as: permute and unpermute each read and write the bf16 row
forward (8 B), twice that backward (16 B) (Megatron-Core ``moe_utils.permute``/``unpermute``)."""
SOFTMAX_BYTES_PER_SCORE: Final = 10.0
"""Unfused attention, HBM bytes per s x s score element, forward + backward: fused
scale-mask-softmax reads 2 and writes 2 forward; its backward reads the gradient and the
probabilities and writes 2 (Megatron ``FusedScaleMaskSoftmax``, bf16)."""
DROPOUT_BYTES_PER_SCORE: Final = 10.0
"""Attention dropout on the scores, forward (read 2, write 2 + 1-byte mask) + backward (read 2 +
mask, write 2); only when ``attention_dropout`` > 0."""
LOSS_BYTES_PER_LOGIT: Final = 52.0
"""HBM bytes per logit element of the unfused vocab-parallel cross entropy (Megatron-LM's default), forward +
backward, kernel by kernel (megatron/core/tensor_parallel/cross_entropy.py ``_VocabParallelCrossEntropy``): the
bf16 logits upcast (read 2, write 4), the max (4), the max subtracted in place (4 + 4), exp in place (4 + 4), the
sum (4), the division in place (4 + 4): 38 forward; the gradient scaled in place (4 + 4) and cast to the bf16
logits' dtype by autograd (4 + 2): 14 backward. Per-token terms (the target gather, the loss) are neglected."""
TE_LOSS_BYTES_PER_LOGIT: Final = {False: 2.0 + (2 + 2) + (2 + 2), True: 2.0 + (2 + 4) + (4 + 4) + (4 + 2)}
"""HBM bytes per logit element of Transformer Engine's fused cross entropy (TE pytorch/triton/cross_entropy.py,
common/triton/cross_entropy.py), by the release ``activations.TE_CROSS_ENTROPY_FP32_GRAD`` assumes. TE <= 2.17
(False): ``online_softmax_kernel`` reads the bf16 logits (2), ``cross_entropy_kernel`` reads them again and writes the
bf16 gradient in place (2 + 2), ``element_mul_kernel`` scales it in place (2 + 2: Megatron's per-token loss makes
grad_output a tensor, not 1.0); the gradient is already in the logits' dtype, no cast: 10. TE 2.18 (True): the
gradient is written in fp32 (2 + 4), scaled in fp32 (4 + 4) and cast to bf16 by autograd (4 + 2): 22."""
LOSS_BYTES_PER_LOGIT_FUSED: Final = {"native": 28.0, "te": TE_LOSS_BYTES_PER_LOGIT[act.TE_CROSS_ENTROPY_FP32_GRAD]}
"""Same with ``--cross-entropy-loss-fusion``, by ``cross_entropy_fusion_impl``. native (fusions/
fused_cross_entropy.py, ``jit_fuser`` kernels): upcast + max (2 + 4), subtract + exp + sum (4 + 4), division
(4 + 4): 22 forward; the gradient scaled and cast to bf16 in one kernel (4 + 2): 6 backward. te:
``TE_LOSS_BYTES_PER_LOGIT`` of the assumed TE release (the same assumption as the memory's
``activations.TE_CROSS_ENTROPY_GRAD_BYTES``)."""


def loss_bytes_per_logit(training: TrainingSpec) -> float:
    """HBM bytes per logit element of the cross entropy ``training`` runs: ``LOSS_BYTES_PER_LOGIT`` unfused, else
    ``LOSS_BYTES_PER_LOGIT_FUSED`` of its implementation (language_module.py ``compute_language_model_loss``)."""
    if not training.cross_entropy_loss_fusion:
        return LOSS_BYTES_PER_LOGIT
    return LOSS_BYTES_PER_LOGIT_FUSED[training.cross_entropy_fusion_impl]


UNFUSED_ROPE_BYTES_PER_ELEMENT: Final = 24.0 + 26.0
"""HBM bytes per rotated q or k element (bf16) of Megatron's unfused RoPE, forward + backward, kernel by kernel
(megatron/core/models/common/embeddings/rope_utils.py ``_apply_rotary_pos_emb_bshd``, ``_rotate_half``; the cos/sin
tables are s x d, negligible): forward ``t * cos_`` (2 + 2), ``-x2`` on half the elements (1 + 1), ``torch.cat((-x2,
x1))`` (2 + 2), ``* sin_`` (2 + 2), the sum (2 + 2 + 2), ``torch.cat((t, t_pass))`` with an empty ``t_pass`` (2 + 2):
24; backward (autograd) ``grad * sin_`` (2 + 2), the negation (1 + 1), the chunk's gradient assembled by a cat
(2 + 2), ``grad * cos_`` (2 + 2), the two gradients of ``t`` summed (2 + 2 + 2), the ``t[..., :rot_dim]`` slice's
zero-filled gradient and copy (2 + 2 + 2): 26."""
FUSED_ROPE_BYTES_PER_ELEMENT: Final = (2.0 + 2.0) + (2.0 + 2.0)
"""The same for Transformer Engine's fused RoPE (``fused_apply_rotary_pos_emb``): the element read and written once
forward and once backward. It is what the models the element-wise constant was fitted on mostly run, so it is taken
as inside the fitted ``elementwise_bytes_per_token_hidden`` (an accounting assumption)."""


def rope_unfused(model: ModelSpec) -> bool:
    """True when Megatron applies RoPE with its unfused kernels whatever ``--apply-rope-fusion`` says: YaRN RoPE on
    standard (non-MLA) attention. Two reasons in the code: Megatron-Core's ``apply_rotary_pos_emb`` (rope_utils.py)
    takes the unfused path when ``mscale`` != 1, and attention.py passes YaRN's concentration factor as ``mscale``
    (yarn_rotary_pos_embedding.py ``_yarn_get_concentration_factor``: 0.1 ln(factor) + 1 without mscale /
    mscale_all_dim: 1.35 for gpt-oss's factor 32); Megatron-Bridge's ``validate_rope_fusion_compatibility``
    (utils/fusions.py, called by ``GPTModelProvider.provide``) also turns the fusion off for any position embedding
    other than "rope" (gpt-oss's provider sets "yarn"). MLA's rope path (multi_latent_attention.py) is not examined
    here and is left as fused."""
    return model.position_embedding_type == "yarn" and not model.multi_latent_attention


def rope_extra_bytes_per_element(model: ModelSpec) -> float:
    """HBM bytes per rotated q/k element beyond the fused RoPE the fitted element-wise constant holds:
    ``UNFUSED_ROPE_BYTES_PER_ELEMENT`` - ``FUSED_ROPE_BYTES_PER_ELEMENT`` (42) when ``rope_unfused``, else 0."""
    return UNFUSED_ROPE_BYTES_PER_ELEMENT - FUSED_ROPE_BYTES_PER_ELEMENT if rope_unfused(model) else 0.0


QUICK_GEGLU_CLAMP_BYTES_PER_ELEMENT: Final = (2.0 + 2.0) + (2.0 + 2.0) + (2.0 + 2.0 + 2.0) + (2.0 + 2.0)
"""HBM bytes per fc1-output element (bf16, both GLU halves) of the clamp that Megatron's QuickGeGLU fusion runs
OUTSIDE its fused kernel (megatron/core/fusions/fused_bias_geglu.py ``weighted_bias_quick_geglu_impl``: with
``clamp_value`` it clamps ``x_glu`` and ``x_linear`` and ``torch.cat``s them before ``WeightedQuickGeGLUFunction``),
forward + backward: the two clamps (2 + 2, each over its half), the cat (2 + 2); backward the clamps' masked gradient
(read the gradient and the saved input, write: 2 + 2 + 2; the cat's backward is a view) and the chunk's gradient
assembled by a cat (2 + 2): 18. The SwiGLU fusion clamps inside its kernel (fused_bias_swiglu.py
``weighted_bias_swiglu_impl`` passes ``clamp_value`` in): nothing extra there."""


def quick_geglu_clamp_bytes_per_element(model: ModelSpec, training: TrainingSpec) -> float:
    """``QUICK_GEGLU_CLAMP_BYTES_PER_ELEMENT`` for the routed experts of a model with a clamped QuickGeGLU
    (``quick_geglu`` and ``activation_func_clamp_value``; gpt-oss) on TEGroupedMLP's unfused-op path, else 0: under
    ``--use-transformer-engine-op-fuser`` the experts run TE's fused ops (experts.py ``_make_fused_ops``: the clamped
    QuickGeGLU is one TE op). Assumes the bias-activation fusion on (Megatron-Bridge's GPTOSSProvider
    ``bias_activation_fusion = True``; Megatron-LM's ``--no-bias-gelu-fusion`` default)."""
    if not (model.quick_geglu and model.activation_func_clamp_value is not None):
        return 0.0
    return 0.0 if training.use_transformer_engine_op_fuser else QUICK_GEGLU_CLAMP_BYTES_PER_ELEMENT


BIAS_PRODUCT_GRADIENTS: Final = 2.0
"""Gradients of the expert bias's ``b * p``: one for the bias b, one for the routing probability p (it comes from the
router, which trains)."""
PRODUCT_GRADIENT_PASSES: Final = 3.0
"""Passes over the full product of one broadcast-product gradient: autograd forms ``grad * other`` (read, write) and
sums it to the broadcast operand's shape (read)."""


def expert_bias_bytes_per_element(model: ModelSpec, training: TrainingSpec, probs_bytes: float) -> float:
    """HBM bytes per routed token copy and hidden unit of the fc2 expert bias, forward + backward, when the experts
    have biases (``add_bias_linear``; gpt-oss), else 0. TEGroupedMLP builds fc2 with ``skip_bias_add=True`` and adds
    the probability-weighted bias after the grouped GEMM in PyTorch, per local expert (experts.py
    ``TEGroupedMLP._apply_bias``: ``torch.cat([t + b * p for ... in zip(torch.split(out, tokens_per_expert), biases,
    torch.split(probs, tokens_per_expert))]).to(out.dtype)``; the fc1 bias is in the grouped GEMM's epilogue, TE
    grouped_linear.py). With o = the bytes of promote(bf16, probs) (``probs_bytes``: ``layer.routed_probs_bytes``):
    forward ``b * p`` (write o), the sum (2 + o + o), the cat (o + o), ``.to(bf16)`` when o > 2 (o + 2); backward
    the cast's gradient when o > 2 (2 + o), the sum's gradient cast to bf16 when o > 2 (o + 2), the product's two
    gradients, each a full product and a reduction (b's over tokens, p's over h: 3 o each), the split's gradient
    assembled by a cat (2 + 2). bf16 probs (o = 2): 12 + 16 = 28; fp32 (o = 4): 28 + 40 = 68. The packed path
    (``moe_use_grouped_tensor``, ``_apply_packed_bias``) is counted the same (not separately examined); under
    ``--use-transformer-engine-op-fuser`` the bias is inside TE's fused ops (0). Per-expert kernel launches of the
    loop are neglected."""
    if not model.add_bias_linear or training.use_transformer_engine_op_fuser:
        return 0.0
    o = max(BF16_BYTES_PER_ELEMENT, probs_bytes)
    b = BF16_BYTES_PER_ELEMENT
    cast = o > b
    fwd = o + (b + o + o) + (o + o) + ((o + b) if cast else 0.0)
    bwd = ((b + o) + (o + b) if cast else 0.0) + BIAS_PRODUCT_GRADIENTS * PRODUCT_GRADIENT_PASSES * o + (b + b)
    return float(fwd + bwd)


EMBEDDING_BYTES_PER_TOKEN_HIDDEN: Final = 8.0
"""HBM bytes per token and hidden unit of the embedding lookup, forward + backward, as the model
counts them: the bf16 row written forward (2), its gradient read and accumulated into the fp32
main-grad table backward (2 + 4); an accounting, not a measured figure."""
OUTPUT_LAYER_FP8: Final = False
"""The output layer runs in BF16 under ``--fp8-format``: Megatron-Core builds it as a plain
ColumnParallelLinear outside Transformer Engine's fp8 autocast (gpt_model.py ``output_layer``)."""


BF16_BYTES_PER_ELEMENT: Final = 2.0
"""A bf16 element read by a quantize kernel."""
AMAX_PASS_BYTES_PER_ELEMENT: Final = 2.0
"""Current (per-tensor) scaling needs the tensor's amax before it can cast: one more read of the bf16 tensor
(Transformer Engine ``Float8CurrentScalingQuantizer`` / ``NVFP4Quantizer``: ``compute_amax``, then the cast)."""
FP8_QUANT_EXTRA_BYTES_PER_ELEMENT: Final = {"delayed": 0.0, "tensorwise": AMAX_PASS_BYTES_PER_ELEMENT,
                                            "mxfp8": 2 * 1.0 / 32, "blockwise": 2 * 4.0 / 128}
"""HBM bytes per quantized GEMM operand element (forward input, backward output gradient) that an FP8 recipe
moves beyond delayed scaling, whose fused cast-transpose (read 2 B, write the rowwise and columnwise FP8 copies,
1 B each, amax from the previous step) is inside the fitted ``fp8_gemm_speedup``: tensorwise (current scaling)
reads the tensor once more for its amax; MXFP8 writes one E8M0 scale per 32 elements in each of its two
directions (TE ``MXFP8Quantizer``: rowwise and columnwise blocks differ); blockwise one fp32 scale per 1 x 128
block in each direction (TE ``Float8BlockQuantizer``, activations and gradients 1D)."""
NVFP4_BYTES_PER_ELEMENT: Final = 0.5 + 1.0 / 16
"""One NVFP4 copy: a 4-bit E2M1 value plus one E4M3 scale per 16 elements (TE ``NVFP4Tensor``; the fp32
per-tensor scale is negligible)."""
NVFP4_QUANT_BYTES_PER_ELEMENT: Final = (AMAX_PASS_BYTES_PER_ELEMENT + BF16_BYTES_PER_ELEMENT
                                        + 2 * NVFP4_BYTES_PER_ELEMENT)
"""HBM bytes per quantized GEMM operand element under NVFP4 (TE ``NVFP4BlockScaling``): the amax pass for the
per-tensor scale (read 2), the quantize kernel's read (2) and both copies it writes, rowwise and columnwise, each
computed from the bf16 tensor (``NVFP4BlockScaling``: "both versions are computed from the high precision
input"): 5.125 B. The random Hadamard transform of the columnwise copy (16 x 16: 32 FLOP/element) and
stochastic rounding of gradients run inside this memory-bound kernel (10 FLOP/B, far under the ridge point)."""

FA2_MEASURED_FLOPS_PER_S: Final = {"hopper": (329e12, "h200-141gb", 989e12), "blackwell": (374e12, "gb200", 2500e12),
                                   "ampere": (180e12, "a100", 312e12)}
"""Measured FlashAttention-2 kernel throughput per architecture: (FLOP/s, the GPU it was measured on, that GPU's
dense BF16 peak in FLOP/s), from ecosystem.md 4.4: "Flash-attention-2 (hdim 128, seq 8192): H200 329 TFLOP/s,
GB200 374, A100 (hdim 64) 180" (peaks: the h200-141gb, gb200 and a100 presets' bf16_tflops). The A100 figure is at
head dim 64, the only A100 one there; it is used for every head dim (an assumption).
Used by ``attention_kernel`` 'fa2' (``fa2_peak_fraction``): H200 0.333, GB200 0.150, A100 0.577 of the bf16 peak."""


def gemm_precision(training: TrainingSpec) -> str:
    """The GEMM precision of the transformer layers' linear layers: 'fp8', 'fp4' or 'bf16' (fp16 runs at the
    bf16 rate)."""
    return training.precision if training.precision in ("fp8", "fp4") else "bf16"


NVFP4_SPLIT_EXTRA_BYTES_PER_ELEMENT: Final = {"fused": 0.0, "split": BF16_BYTES_PER_ELEMENT}
"""HBM bytes per RHT-quantized NVFP4 operand element beyond ``NVFP4_QUANT_BYTES_PER_ELEMENT``, by
``TrainingSpec.nvfp4_quantize_kernel``: Transformer Engine <= 2.13 (csrc/quantizer.cpp ``NVFP4Quantizer::quantize_impl``
at v2.12) runs the rowwise cast (``nvte_quantize_v2``) and the RHT columnwise cast
(``nvte_hadamard_transform_cast_fusion_columnwise``) as two kernels, each reading the bf16 tensor (2 B); TE >= 2.14
runs them as one (``nvte_quantize_with_hadamard_transform``, hadamard_transform/
row_cast_col_hadamard_transform_cast_fusion.cu). The amax pass (``nvte_hadamard_transform_amax``) and the writes are
the same in both."""


def nvfp4_quant_bytes_per_element(training: TrainingSpec, *, grouped: bool = False) -> float:
    """HBM bytes per NVFP4 GEMM operand element quantized per micro-batch (forward input, backward output
    gradient): ``NVFP4_QUANT_BYTES_PER_ELEMENT`` (amax 2 + read 2 + two 0.5625 B copies = 5.125) plus
    ``NVFP4_SPLIT_EXTRA_BYTES_PER_ELEMENT`` of the training's ``nvfp4_quantize_kernel`` (split: 7.125) for a
    non-grouped linear; a grouped (MoE expert) linear's operands: 5.125 in both. TE >= 2.12 casts them in one
    grouped kernel when every expert's token count is a multiple of 128 (extensions/cast.cpp
    ``split_quantize_nvfp4_impl_with_rht_helper``: ``all_aligned_token_dim`` -> ``nvte_group_hadamard_transform_
    cast_fusion``, else ``nvte_group_nvfp4_quantize_with_amax`` + ``..._columnwise``, two reads), and under FP4
    Megatron-LM d98e8a6 always hands it 128-aligned segments: ``--moe-router-padding-for-quantization``, HybridEP's
    ``pad_multiple`` and DeepEP's fused permute pad to ``get_align_size_for_quantization`` (fp4_utils.py
    ``get_fp4_align_size``: 128; 256 with the grouped tensor / op fuser), and otherwise ``TEGroupedMLP.forward``'s
    ``Fp8Padding`` fallback pads to TE's ``get_align_size_for_quantization(NVFP4BlockScaling)``: 128
    (experts.py, ``align_size=None``; the same fallback at Bridge v0.3.1's Megatron-LM 55ac708). ``split`` stands
    for TE 2.12 / 2.13 (the NVFP4 calibration rows' oldest container, 26.02, runs 2.12); TE <= 2.11 has no grouped
    one-kernel cast (per-expert ``nvte_quantize_v2`` + columnwise RHT cast: 7.125), not modelled."""
    extra = 0.0 if grouped else NVFP4_SPLIT_EXTRA_BYTES_PER_ELEMENT[training.nvfp4_quantize_kernel]
    return NVFP4_QUANT_BYTES_PER_ELEMENT + extra


def quantize_bytes(training: TrainingSpec, m: Num, n: Num, k: Num, count: Num = 1, *, grouped: bool = False) -> Num:
    """HBM bytes of quantizing one GEMM's operands per micro-batch, forward + backward: the input (m x k,
    forward) and the output gradient (m x n, backward) at ``nvfp4_quant_bytes_per_element`` under FP4
    (``grouped``: a grouped MoE expert GEMM), at the FP8 recipe's ``FP8_QUANT_EXTRA_BYTES_PER_ELEMENT`` under FP8,
    none in bf16. Weights are quantized once per step (Megatron's ``set_is_first_microbatch``: TE caches them), not
    counted."""
    if training.precision == "fp4":
        per = nvfp4_quant_bytes_per_element(training, grouped=grouped)
    elif training.precision == "fp8":
        per = FP8_QUANT_EXTRA_BYTES_PER_ELEMENT[training.fp8_recipe]
    else:
        return 0.0
    return per * m * (k + n) * count


def gemm_efficiency(eff: EfficiencySpec, m: Num, n: Num, k: Num) -> Num:
    """Fraction of peak a GEMM (m x k)(k x n) reaches: e_max * prod_x x/(x + d0).

    Fitted shape: cuBLASLt square GEMMs on A100 reach 82% at 8192^3 and ~47% at 1024^3
    (ecosystem.md 4.4); skinny GEMMs (one dim ~192) lose about half.
    """
    d0 = eff.gemm_half_dim
    return eff.gemm_max_frac * (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))


def gemm_s(cluster: ClusterSpec, fp8: bool | str, m: Num, n: Num, k: Num, count: Num = 1) -> Num:
    """Forward time of ``count`` GEMMs (m x k)(k x n) on one GPU: 2 m n k FLOPs each at
    ``gemm_efficiency`` of the dense BF16 peak, ``fp8_gemm_speedup`` faster in FP8 (True or 'fp8'); under
    'fp4' (NVFP4: fprop, dgrad and wgrad all in FP4, TE ``NVFP4BlockScaling``) at ``gemm_efficiency`` of the
    dense FP4 peak (``GpuSpec.peak_flops_per_s('fp4')``: no fitted speed-up)."""
    eff = cluster.gpu.efficiency
    flops = FLOPS_PER_MAC * m * n * k * count
    if fp8 == "fp4":
        return flops / (cluster.gpu.peak_flops_per_s("fp4") * gemm_efficiency(eff, m, n, k))
    t = flops / (cluster.gpu.peak_bf16_flops_per_s * gemm_efficiency(eff, m, n, k))
    return t / eff.fp8_gemm_speedup if fp8 in (True, "fp8") else t


def hbm_rate(cluster: ClusterSpec) -> float:
    """Achieved HBM bandwidth of element-wise kernels: datasheet x ``hbm_frac``."""
    return cluster.gpu.hbm_bytes_per_s * cluster.gpu.efficiency.hbm_frac


def attention_score_flops(mbs: Num, seq_len: int, width: float, cp: Num, tp: Num) -> Num:
    """Forward FLOPs of the two score GEMMs per rank, causal: ``CAUSAL_SCORE_FLOPS_FACTOR`` x b s^2 w
    / (c t), w = ``flops.attention_score_width`` (Megatron's ``num_floating_point_operations``)."""
    return CAUSAL_SCORE_FLOPS_FACTOR * mbs * seq_len ** 2 * width / (cp * tp)


def fa2_peak_fraction(cluster: ClusterSpec) -> float:
    """Fraction of the dense BF16 peak the FlashAttention-2 kernel reaches on ``cluster``'s GPU: the measured rate of
    its architecture over the bf16 peak of the GPU it was measured on (``FA2_MEASURED_FLOPS_PER_S``); a GPU of the
    same architecture without its own figure (H100, B200, B300, GB300) runs at that fraction of its own peak (H100:
    the H200's die and tensor-core peak, 329 TFLOP/s). An architecture without a figure is refused in one line."""
    arch = cluster.gpu.arch
    if arch not in FA2_MEASURED_FLOPS_PER_S:
        raise SpecError(f"attention_kernel fa2: no measured FlashAttention-2 rate for GPU {cluster.gpu.name!r} "
                        f"(arch {arch or 'not set'}); measured for {', '.join(FA2_MEASURED_FLOPS_PER_S)} "
                        "(ecosystem.md 4.4); use attention_kernel current")
    rate, _gpu, peak = FA2_MEASURED_FLOPS_PER_S[arch]
    return rate / peak


EXP_PER_SCORE_FWD: Final = 1.0
"""Exponentials per score element in flash attention's forward: the softmax's exp(s - running max), once per
element (Dao 2023, FlashAttention-2, Algorithm 1; the open Blackwell kernel flash_attn/cute/flash_fwd_sm100.py
issues it as ``ex2`` on the special-function unit, partly emulated on the FMA pipe on sm_100)."""
EXP_PER_SCORE_BWD: Final = 1.0
"""Exponentials per score element in flash attention's backward: P = exp(S - logsumexp) recomputed once per
element (FlashAttention-2, Algorithm 2); its 5 score-sized GEMMs are ``ATTENTION_BWD_FACTOR`` x the forward's."""


def flops_per_score(head_dims: tuple[int, int]) -> float:
    """MMA FLOPs per score element of the forward, (q/k head dim dq, v head dim dv): QK^T (2 dq) + PV (2 dv) =
    ``FLOPS_PER_MAC`` x (dq + dv); 4 d = 512 at head dim 128 (``flops.attention_head_dims``)."""
    dq, dv = head_dims
    return FLOPS_PER_MAC * (dq + dv)


def flash_attention_bounds_s(score_flops: Num, flops_per_score_elem: float, mma_fwd_flops_per_s: float,
                             mma_bwd_flops_per_s: float, exp_per_s: float, frac: float) -> tuple[Num, Num]:
    """(forward, backward) flash-attention time bound by both its MMA rate and its exponential rate, each at the
    fraction ``frac`` the kernel reaches of the unit that binds:

        n = F / f                      score elements (f = ``flops_per_score``, 512 at head dim 128)
        t_fwd = max(F / R_fwd, n x e_f / X) / frac
        t_bwd = max(b x F / R_bwd, n x e_b / X) / frac

    F: the forward score FLOPs (causal half counted, ``attention_score_flops``), R: the dense tensor-core peak of
    the forward / backward MMAs, X: the special-function units' exponential rate (``GpuSpec.sfu_exp_per_s``),
    e_f = ``EXP_PER_SCORE_FWD``, e_b = ``EXP_PER_SCORE_BWD``, b = ``ATTENTION_BWD_FACTOR``. The kernel overlaps the
    softmax of one tile with the MMAs of the next (FlashAttention-3/4 ping-pong, flash_attn/cute/flash_fwd_sm100.py:
    softmax warps beside the MMA warp), so the slower unit binds. At head dim 128 on B200 the forward's two rates
    are about equal (2.25e15 / 512 = 4.4e12 score elements/s vs ~5e12 exponentials/s); sm_103 (B300, GB300) doubles
    the exponential rate (flash_fwd_sm100.py: "SM103 has fast native exp2", its ex2 emulation off there; "FP8 fwd is
    MUFU/ex2-bound" on sm_100), so there the MMAs bind; at head dim 64 (gpt-oss) sm_100's forward is
    exponential-bound. The backward (10 d MMA FLOPs per exponential) is MMA-bound on every GPU here."""
    scores = score_flops / flops_per_score_elem
    fwd = np.maximum(score_flops / mma_fwd_flops_per_s, scores * EXP_PER_SCORE_FWD / exp_per_s) / frac
    bwd = np.maximum(ATTENTION_BWD_FACTOR * score_flops / mma_bwd_flops_per_s,
                     scores * EXP_PER_SCORE_BWD / exp_per_s) / frac
    return fwd, bwd


def flash_attention_fwd_s(cluster: ClusterSpec, score_flops: Num, *, fp8: bool = False,
                          kernel: str = "current", model: ModelSpec | None = None) -> Num:
    """Flash-attention forward: its score FLOPs at ``attention_frac`` of the dense BF16 peak (``kernel``
    'current': today's fused kernels, the preset's fitted fraction), or under ``kernel`` 'fa2' (the 2023-24
    generation: flash-attn 2 and the cuDNN FusedAttention of Transformer Engine 1.x) at ``fa2_peak_fraction``:
    t = score_flops / (peak_bf16 x frac). The 2.5x backward (``ATTENTION_BWD_FACTOR``) is FA2's in both.

    ``fp8`` (``fp8_dot_product_attention``: cuDNN's FP8 fused attention, TE ``fp8_dpa``): the backward's score
    GEMMs run at the same fraction of the dense FP8 peak, the forward stays at the BF16 rate, returned as the
    forward time whose (1 + ``ATTENTION_BWD_FACTOR``) multiple is the forward + backward time. An assumption with
    a reason: the forward computes one exponential per score element against 4 x head-dim MMA FLOPs (512 at head
    dim 128), and on Blackwell the special-function units (16 per clock per SM, CUDA Programming Guide's
    throughput table; not re-read for this repo) already issue them at about the BF16 MMA rate per element, so
    FP8 MMAs do not shorten it; the backward (5 score-sized GEMMs, one exponential) is MMA-bound.

    Where the GPU has an exponential rate (``GpuSpec.sfu_exp_per_s``) and ``model`` is given (its q/k and v
    head dims, ``flops.attention_head_dims``), that bound is explicit: forward and backward are
    ``flash_attention_bounds_s`` (under ``fp8`` the forward MMAs too at the FP8 peak, the exponentials bounding
    them), returned as the same forward-equivalent time (t_fwd + t_bwd) / (1 + ``ATTENTION_BWD_FACTOR``)."""
    frac = fa2_peak_fraction(cluster) if kernel == "fa2" else cluster.gpu.efficiency.attention_frac
    gpu = cluster.gpu
    if gpu.sfu_exp_per_s is not None and model is not None:
        mma = gpu.peak_flops_per_s("fp8") if fp8 else gpu.peak_bf16_flops_per_s
        fwd, bwd = flash_attention_bounds_s(score_flops, flops_per_score(attention_head_dims(model)), mma, mma,
                                            gpu.sfu_exp_per_s, frac)
        return (fwd + bwd) / (1.0 + ATTENTION_BWD_FACTOR)
    t = score_flops / (gpu.peak_bf16_flops_per_s * frac)
    if not fp8:
        return t
    ratio = gpu.peak_flops_per_s("fp8") / gpu.peak_bf16_flops_per_s
    return t * (1.0 + ATTENTION_BWD_FACTOR / ratio) / (1.0 + ATTENTION_BWD_FACTOR)


def unfused_attention_fwd_s(model: ModelSpec, cluster: ClusterSpec, seq_len: int, mbs: Num, cp: Num, tp: Num,
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
    s = seq_len
    hd, _ = attention_head_dims(model)
    peak = gpu.peak_bf16_flops_per_s if aligned else gpu.simt_flops_per_s
    g = UNFUSED_SCORE_FACTOR * score_flops / (peak * gemm_efficiency(eff, s / cp, s, hd))
    scores = mbs * model.num_attention_heads / tp * s * s / cp
    per_score = SOFTMAX_BYTES_PER_SCORE + (DROPOUT_BYTES_PER_SCORE if model.attention_dropout > 0 else 0.0)
    e = scores * per_score / (gpu.hbm_bytes_per_s * eff.hbm_frac)
    return (GEMM_FWD_BWD_FACTOR * g + e) / (1.0 + ATTENTION_BWD_FACTOR)


def block_elementwise_s(cluster: ClusterSpec, tokens: Num, hidden: int, sp_shard: Num) -> Num:
    """Norm, dropout and residual traffic of one half-layer (attention or MLP block), forward +
    backward: ``HALF_LAYER_SHARE`` x ``elementwise_bytes_per_token_hidden`` x tokens x h, sharded
    over TP by sequence parallelism, at ``hbm_rate``."""
    eff = cluster.gpu.efficiency
    return HALF_LAYER_SHARE * eff.elementwise_bytes_per_token_hidden * tokens * hidden / sp_shard / hbm_rate(cluster)


def block_elementwise_bytes(eff: EfficiencySpec, tokens: Num, hidden: int, sp_shard: Num) -> Num:
    """The bytes of ``block_elementwise_s`` (summed with other traffic before dividing by the rate)."""
    return HALF_LAYER_SHARE * eff.elementwise_bytes_per_token_hidden * tokens * hidden / sp_shard


def block_overhead_s(eff: EfficiencySpec) -> float:
    """Host time to issue one half-layer's kernels: ``HALF_LAYER_SHARE`` x ``layer_overhead_s``."""
    return HALF_LAYER_SHARE * eff.layer_overhead_s


def logits_s(cluster: ClusterSpec, tokens: Num, vocab: Num, tp: Num, hidden: int,
             loss_bytes: float = LOSS_BYTES_PER_LOGIT) -> Num:
    """Output layer and loss of one head per micro-batch, forward + backward: the (T x h)(h x V/t)
    GEMM (``GEMM_FWD_BWD_FACTOR``, in BF16: ``OUTPUT_LAYER_FP8``) plus ``loss_bytes`` (``loss_bytes_per_logit``)
    per local logit (T V / t, padded vocabulary) at ``hbm_rate``."""
    return (GEMM_FWD_BWD_FACTOR * gemm_s(cluster, OUTPUT_LAYER_FP8, tokens, vocab / tp, hidden)
            + loss_bytes * tokens * vocab / tp / hbm_rate(cluster))


def embedding_s(cluster: ClusterSpec, tokens: Num, hidden: int, sp_shard: Num) -> Num:
    """Embedding lookup on the first stage, forward + backward: ``EMBEDDING_BYTES_PER_TOKEN_HIDDEN``
    per token and hidden unit (sharded by sequence parallelism) at ``hbm_rate``."""
    return EMBEDDING_BYTES_PER_TOKEN_HIDDEN * tokens * hidden / sp_shard / hbm_rate(cluster)


SMS_PER_ARCH: Final = {"ampere": 108, "hopper": 132, "blackwell": 148}
"""SMs per GPU by architecture where the GPU spec gives no ``sm_count`` (``sm_count_of``): A100 108 and H100 SXM5 132
(NVIDIA's A100 and H100 architecture whitepapers); H200 is the same GH100 configuration as H100 SXM5. Blackwell 148
is ASSUMED (the count CUDA reports for B200; no primary document giving it was read here), and B300/GB300 are taken
at it: under one point of ``UB_COMM_SMS``' share either way."""
SMS_DEFAULT: Final = 132
"""SM count of an architecture not in ``SMS_PER_ARCH`` (the H100's)."""


def sm_count_of(cluster: ClusterSpec) -> int:
    """Streaming multiprocessors of the cluster's GPU: its spec's ``sm_count``, else ``SMS_PER_ARCH`` of its
    architecture (``SMS_DEFAULT`` for others). The one place TP userbuffers (``time.tp``) and the flex dispatcher
    (``time.ep``) read it."""
    return cluster.gpu.sm_count or SMS_PER_ARCH.get(cluster.gpu.arch, SMS_DEFAULT)


def compute_share_beside(sm_count: int, comm_sms: Num, knob: str) -> Num:
    """Share of the GPU a compute kernel gets while a communication kernel holding ``comm_sms`` of its ``sm_count``
    SMs runs beside it: (SM_total - SM_comm) / SM_total. The GEMMs and attention kernels the transfer hides behind
    are tensor-core bound and tile over every SM the scheduler gives them (a persistent communication kernel keeps
    its SMs for its whole run: DeepEP / HybridEP launch exactly ``num_sms`` blocks, one per SM,
    hybrid_ep_backend.cuh ``blockIdx.x < NUM_OF_BLOCKS``), so their rate scales with the SMs left; a kernel given
    every SM leaves the compute one (SM_comm is taken at most SM_total - 1: the scheduler still interleaves).
    Refused in one line naming ``knob`` (the flag that gave ``comm_sms``) only above the GPU's SMs (HybridEP
    asserts ``sm_count >= sms_dispatch``). Shared by every overlapped transfer whose SMs are known (EP:
    ``time.ep``; TP userbuffers' ``num_sm`` can call it the same way)."""
    sms = np.asarray(comm_sms, dtype=float)
    if np.any(sms > sm_count):
        raise SpecError(f"{knob} ({int(np.max(sms))}) must be at most the GPU's {sm_count} SMs: its communication "
                        "kernels cannot take more SMs than the GPU has")
    out: Num = (sm_count - np.minimum(sms, sm_count - 1)) / sm_count
    return out


def slowed_end(start: Num, work_s: Num, busy: Sequence[tuple[Num, Num]], share: Num) -> Num:
    """End of a compute kernel of ``work_s`` seconds (at the whole GPU) that starts at ``start`` on a stream beside
    communication kernels running over the intervals ``busy`` ((begin, end) pairs in time order, disjoint: one
    stream): it runs at full rate outside them and at ``share`` of it inside (``compute_share_beside``). For one
    interval [start, start + a] and work c: end = start + c + (1 - share) min(a, c / share)."""
    t = np.asarray(start, dtype=float)
    w = np.asarray(work_s, dtype=float)
    r = np.asarray(share, dtype=float)
    for begin, end in busy:
        free = np.minimum(w, np.clip(np.asarray(begin, dtype=float) - t, 0.0, None))  # full rate before it begins
        t, w = t + free, w - free
        overlap = np.clip(np.asarray(end, dtype=float) - np.maximum(t, begin), 0.0, None)
        slow = np.minimum(w, r * overlap)  # work done at the reduced rate while it runs
        t = np.where(slow > 0.0, np.maximum(t, begin) + slow / r, t)
        w = w - slow
    out: Num = t + w
    return out
