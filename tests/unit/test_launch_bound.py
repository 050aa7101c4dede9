"""A layer takes max(GPU time, host issue time) + host-device syncs (estimate/step_time.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.estimate.step_time import ATTENTION_BWD_FACTOR, LayerTime, layer_time
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


def _lt(gemm: float, overhead: float, sync: float = 0.0) -> LayerTime:
    return LayerTime(gemm_fwd_s=gemm, attn_fwd_s=0.0, elementwise_s=0.0, overhead_s=overhead,
                     tp_link_s=0.0, ep_link_s=0.0, cp_link_s=0.0, host_sync_s=sync)


def test_small_layer_is_launch_bound_large_layer_is_not() -> None:
    assert _lt(gemm=1e-4, overhead=1e-3).compute_s == pytest.approx(1e-3)
    assert _lt(gemm=1e-2, overhead=1e-3).compute_s == pytest.approx(3e-2)
    # syncs drain the queue: they add whatever the regime
    assert _lt(gemm=1e-2, overhead=1e-3, sync=2e-3).compute_s == pytest.approx(3.2e-2)
    assert ATTENTION_BWD_FACTOR > 0


def test_micro_batch_size_is_free_while_launch_bound() -> None:
    """vTrain's h=1024 runs: the time per micro-batch hardly moves from mbs 1 to 4. With a host
    issue time above the GPU time, the model gives the same per-layer time at mbs 1 and 2."""
    model = load_model("gpt2")
    gpu = load_gpu("a100-80gb")
    gpu = replace(gpu, efficiency=replace(gpu.efficiency, layer_overhead_s=50e-3))
    cluster = make_cluster(gpu, 8, 8)
    training = TrainingSpec(seq_len=1024, global_batch_size=64)
    t = [layer_time(model, cluster, training, ParallelLayout(tp=1, pp=1, dp=8, mbs=b), moe=False).compute_s
         for b in (1, 2)]
    assert t[0] == pytest.approx(t[1]) == pytest.approx(50e-3)
    fast = replace(gpu, efficiency=replace(gpu.efficiency, layer_overhead_s=0.0))
    t0 = [layer_time(model, make_cluster(fast, 8, 8), training, ParallelLayout(tp=1, pp=1, dp=8, mbs=b),
                     moe=False).compute_s for b in (1, 2)]
    assert t0[1] > 1.8 * t0[0]


def test_fp16_gradients_are_reduced_in_fp16() -> None:
    """Megatron forces fp32 gradient reduction for bf16 only; fp16 reduces 2 B per parameter."""
    from paraplan.estimator import estimate

    model = load_model("llama2-7b")
    cluster = make_cluster(load_gpu("a100-80gb"), 16, 8)
    layout = ParallelLayout(tp=8, pp=1, dp=2, mbs=1, distributed_optimizer=False)
    dp = {}
    for precision in ("bf16", "fp16"):
        training = TrainingSpec(seq_len=2048, global_batch_size=32, precision=precision)  # type: ignore[arg-type]
        dp[precision] = float(estimate(model, cluster, training, layout).time.link_comm_s["dp"])
    assert 0.45 < dp["fp16"] / dp["bf16"] < 0.55
