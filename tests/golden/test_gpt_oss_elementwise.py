"""gpt-oss's element-wise passes that Megatron runs unfused: the fc2 expert bias, the QuickGeGLU clamp, YaRN RoPE.

Goldens by hand from the cited code, kernel by kernel (bf16 = 2 bytes, fp32 = 4):
- experts.py ``TEGroupedMLP._apply_bias``: ``torch.cat([t + b * p ...]).to(dtype)`` per local expert after fc2;
- fused_bias_geglu.py ``weighted_bias_quick_geglu_impl``: two clamps and a cat before the fused activation;
- rope_utils.py ``_apply_rotary_pos_emb_bshd``: YaRN's mscale != 1 keeps Megatron on the unfused path, and
  Megatron-Bridge's ``validate_rope_fusion_compatibility`` turns the fusion off for position embeddings other than
  "rope".
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.estimate.time import compute
from paraplan.estimate.time.layer import attention_layer_time, moe_mlp_time, routed_probs_bytes
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

TRAIN = TrainingSpec(seq_len=4096, global_batch_size=256)
LAY = ParallelLayout(ep=8, etp=1, mbs=1, recompute="none")


def test_expert_bias_bytes_by_hand() -> None:
    """bf16 probabilities (alltoall, no --moe-router-dtype): forward b*p (write 2), t + bp (2 + 2 + 2), cat (2 + 2),
    .to a no-op: 12; backward the two product gradients (3 x 2 each) and the split's cat (2 + 2): 16. fp32 (flex):
    forward 4 + (2 + 4 + 4) + (4 + 4) + (4 + 2) = 28; backward (2 + 4) + (4 + 2) + 6 x 4 + 4 = 40."""
    model = load_model("gpt-oss-120b")
    assert compute.expert_bias_bytes_per_element(model, TRAIN, 2.0) == 28.0
    assert compute.expert_bias_bytes_per_element(model, TRAIN, 4.0) == 68.0
    assert compute.expert_bias_bytes_per_element(replace(model, add_bias_linear=False), TRAIN, 2.0) == 0.0
    fused = replace(TRAIN, use_transformer_engine_op_fuser=True)
    assert compute.expert_bias_bytes_per_element(model, fused, 2.0) == 0.0


def test_routed_probs_dtype_follows_the_router_and_the_dispatcher() -> None:
    model = load_model("gpt-oss-120b")
    assert routed_probs_bytes(model, TRAIN) == 2.0
    assert routed_probs_bytes(replace(model, moe_router_dtype="fp32"), TRAIN) == 4.0
    assert routed_probs_bytes(model, replace(TRAIN, moe_token_dispatcher_type="flex")) == 4.0
    assert routed_probs_bytes(replace(model, moe_router_dtype="fp64"),
                              replace(TRAIN, moe_token_dispatcher_type="flex")) == 8.0


def test_quick_geglu_clamp_bytes_by_hand() -> None:
    """Forward: the two clamps (read 2 + write 2 per element, each over its half) and the cat (2 + 2): 8; backward:
    the masked gradient (2 + 2 + 2) and the chunk's cat (2 + 2): 10. SwiGLU clamps inside its fused kernel."""
    model = load_model("gpt-oss-120b")
    assert compute.quick_geglu_clamp_bytes_per_element(model, TRAIN) == 18.0
    assert compute.quick_geglu_clamp_bytes_per_element(replace(model, activation_func_clamp_value=None), TRAIN) == 0.0
    assert compute.quick_geglu_clamp_bytes_per_element(replace(model, quick_geglu=False), TRAIN) == 0.0
    fused = replace(TRAIN, use_transformer_engine_op_fuser=True)
    assert compute.quick_geglu_clamp_bytes_per_element(model, fused) == 0.0


def test_rope_bytes_by_hand() -> None:
    """Unfused forward t*cos (4), -x2 on half (2), cat (4), *sin (4), the sum (6), the cat with the empty pass-through
    (4) = 24; backward grad*sin (4), negation (2), chunk cat (4), grad*cos (4), the two gradients summed (6), the
    slice's zeroed gradient and copy (6) = 26; fused: read + write forward and backward = 8; extra 50 - 8 = 42."""
    gpt_oss = load_model("gpt-oss-120b")
    assert compute.rope_unfused(gpt_oss)
    assert compute.rope_extra_bytes_per_element(gpt_oss) == 42.0
    assert compute.rope_extra_bytes_per_element(replace(gpt_oss, position_embedding_type="rope")) == 0.0
    assert not compute.rope_unfused(load_model("deepseek-v3"))  # MLA's rope path is not examined: left fused


def test_moe_elementwise_adds_bias_and_clamp_passes() -> None:
    """The MoE block's element-wise time grows by (18 x 2f + 28 x h) bytes per routed copy over the HBM rate: T = 4096
    tokens x top-4 on one GPU (EP 8, dropless), f = 2880, h = 2880."""
    model = load_model("gpt-oss-120b")
    cluster = make_cluster(load_gpu("b200"), 8)
    plain = replace(model, add_bias_linear=False, activation_func_clamp_value=None)
    extra = moe_mlp_time(model, cluster, TRAIN, LAY).elementwise_s - moe_mlp_time(plain, cluster, TRAIN,
                                                                                LAY).elementwise_s
    copies = 4096 * 4
    want = (18.0 * copies * 2 * 2880 + 28.0 * copies * 2880) / compute.hbm_rate(cluster)
    assert extra == pytest.approx(want)


def test_attention_elementwise_adds_unfused_rope() -> None:
    """42 extra bytes per rotated element: q (64 heads x 64) and k (8 groups x 64) for 4096 tokens, TP 1."""
    model = load_model("gpt-oss-120b")
    cluster = make_cluster(load_gpu("b200"), 8)
    rope = replace(model, position_embedding_type="rope")
    extra = attention_layer_time(model, cluster, TRAIN, LAY).elementwise_s - attention_layer_time(
        rope, cluster, TRAIN, LAY).elementwise_s
    assert extra == pytest.approx(42.0 * 4096 * (64 * 64 + 8 * 64) / compute.hbm_rate(cluster))


def test_other_models_are_untouched() -> None:
    """No bias, no clamp, plain RoPE: the three terms are zero for Qwen3 and Llama."""
    for name in ("qwen3-30b-a3b", "llama3-8b"):
        model = load_model(name)
        assert compute.rope_extra_bytes_per_element(model) == 0.0
        assert compute.quick_geglu_clamp_bytes_per_element(model, TRAIN) == 0.0
        assert compute.expert_bias_bytes_per_element(model, TRAIN, 2.0) == 0.0
