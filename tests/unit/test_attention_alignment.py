"""Attention heads whose dims tensor cores cannot take (not multiples of 8) run unfused on CUDA cores."""

from __future__ import annotations

import pytest

from paraplan.estimate.flops import attention_heads_tensor_core_aligned
from paraplan.estimate.step_time import attention_layer_time, gemm_efficiency
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec
from tests.conftest import gpt_model


@pytest.mark.parametrize(("hidden", "heads", "aligned"), [
    (13824, 128, False),  # head dim 108 (BLOOM prequel candidate)
    (14400, 96, False),   # 150
    (13824, 96, True),    # 144
    (12288, 96, True),    # 128
    (14336, 256, True),   # 56
])
def test_head_dim_alignment(hidden: int, heads: int, aligned: bool) -> None:
    model = gpt_model(hidden_size=hidden, num_attention_heads=heads)
    assert attention_heads_tensor_core_aligned(model) is aligned


def test_mla_head_dims_are_aligned() -> None:
    assert attention_heads_tensor_core_aligned(load_model("deepseek-v3"))  # 128 + 64 and 128


def test_misaligned_heads_fall_back_to_unfused_attention_on_cuda_cores() -> None:
    gpu = load_gpu("a100-80gb")
    cluster = make_cluster(gpu, 8)
    layout = ParallelLayout(tp=8, pp=1, dp=1, mbs=1)
    flash = TrainingSpec(seq_len=2048, global_batch_size=16)
    unfused = TrainingSpec(seq_len=2048, global_batch_size=16, attention_backend="unfused")
    h108 = gpt_model(hidden_size=13824, num_attention_heads=128)  # head dim 108
    h144 = gpt_model(hidden_size=13824, num_attention_heads=96)   # head dim 144, same score FLOPs
    slow = attention_layer_time(h108, cluster, flash, layout).attn_fwd_s
    assert float(slow) == pytest.approx(float(attention_layer_time(h108, cluster, unfused, layout).attn_fwd_s))
    # by hand: (3 G + E) / 3.5, G = full-score GEMMs at the FP32 CUDA-core rate, E = softmax + dropout traffic
    s, a, t = 2048, 128, 8
    score_flops = 2.0 * s * s * 13824 / t
    eff = gpu.efficiency
    g = 2.0 * score_flops / (gpu.simt_flops_per_s * gemm_efficiency(eff, s, s, 108))
    e = a / t * s * s * 20.0 / (gpu.hbm_bytes_per_s * eff.hbm_frac)
    assert float(slow) == pytest.approx((3 * g + e) / 3.5)
    assert gpu.simt_flops_per_s == pytest.approx(19.5e12)  # A100 datasheet FP32
    aligned_unfused = attention_layer_time(h144, cluster, unfused, layout).attn_fwd_s
    aligned_flash = attention_layer_time(h144, cluster, flash, layout).attn_fwd_s
    assert float(slow) > 3 * float(aligned_unfused) > 3 * float(aligned_flash)


def test_simt_fallback_when_the_datasheet_value_is_absent() -> None:
    gpu = load_gpu("b200")
    assert gpu.peak_fp32_simt_flops_per_s is None
    assert gpu.simt_flops_per_s == pytest.approx(gpu.peak_bf16_flops_per_s / 16)
