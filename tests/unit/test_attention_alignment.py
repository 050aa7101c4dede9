"""Attention heads whose dims tensor cores cannot take (not multiples of 8) run unfused on CUDA cores."""

from __future__ import annotations

import pytest

from paraplan.estimate.flops import attention_heads_tensor_core_aligned
from paraplan.estimate.step_time import attention_layer_time
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


def test_misaligned_attention_runs_at_the_simt_rate_on_full_scores() -> None:
    gpu = load_gpu("a100-80gb")
    cluster = make_cluster(gpu, 8)
    training = TrainingSpec(seq_len=2048, global_batch_size=16)
    layout = ParallelLayout(tp=8, pp=1, dp=1, mbs=1)
    # same query width (h = 13824), so the same score FLOPs; head dim 108 vs 144
    slow = attention_layer_time(gpt_model(hidden_size=13824, num_attention_heads=128), cluster, training, layout)
    fast = attention_layer_time(gpt_model(hidden_size=13824, num_attention_heads=96), cluster, training, layout)
    expected = 2.0 * gpu.peak_bf16_flops_per_s / gpu.simt_flops_per_s  # 2x (no causal skip) x 16
    assert float(slow.attn_fwd_s) / float(fast.attn_fwd_s) == pytest.approx(expected)
    assert gpu.simt_flops_per_s == pytest.approx(19.5e12)  # A100 datasheet FP32


def test_simt_fallback_when_the_datasheet_value_is_absent() -> None:
    gpu = load_gpu("b200")
    assert gpu.peak_fp32_simt_flops_per_s is None
    assert gpu.simt_flops_per_s == pytest.approx(gpu.peak_bf16_flops_per_s / 16)
