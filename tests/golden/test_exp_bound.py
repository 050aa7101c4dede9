"""Flash attention bound by its exponentials as well as its MMAs (issue 18, Blackwell vs Blackwell Ultra).

By hand: the forward does 4 d MMA FLOPs and one exponential per score element, the backward 2.5x the MMA FLOPs and
one exponential (the recomputed P). At head dim 64 on GB200 (2,500 TFLOP/s BF16, 5e12 exponentials/s), F = 2.56e14
forward score FLOPs are n = F / 256 = 1e12 score elements: MMAs 0.1024 s, exponentials 0.2 s, so the forward takes
0.2 s / frac and is exponential-bound; the backward's MMAs (0.256 s) bind. On GB300 (10.7e12 exponentials/s) the
exponentials take 0.09346 s: the MMAs bind both ways. At head dim 128 the forward MMAs (0.2048 s for F = 5.12e14)
outlast GB200's exponentials (0.2 s): the bound is the MMA one and nothing moves there.
"""

from __future__ import annotations

import pytest

from paraplan.estimate.time import compute
from paraplan.estimate.time.layer import attention_layer_time
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

FRAC = 0.5


def test_exp_bound_by_hand() -> None:
    fwd, bwd = compute.flash_attention_bounds_s(2.56e14, compute.flops_per_score((64, 64)), 2.5e15, 2.5e15, 5e12,
                                                FRAC)
    assert float(fwd) == pytest.approx(0.2 / FRAC, rel=1e-12)
    assert float(bwd) == pytest.approx(2.5 * 0.1024 / FRAC, rel=1e-12)
    fwd, bwd = compute.flash_attention_bounds_s(2.56e14, 256.0, 2.5e15, 2.5e15, 10.7e12, FRAC)
    assert float(fwd) == pytest.approx(0.1024 / FRAC, rel=1e-12)
    assert float(bwd) == pytest.approx(0.256 / FRAC, rel=1e-12)


def test_head_dim_128_stays_mma_bound_on_gb200() -> None:
    assert compute.flops_per_score((128, 128)) == 512.0
    fwd, bwd = compute.flash_attention_bounds_s(5.12e14, 512.0, 2.5e15, 2.5e15, 5e12, FRAC)
    assert float(fwd) == pytest.approx(0.2048 / FRAC, rel=1e-12)
    assert float(bwd) == pytest.approx(2.5 * 0.2048 / FRAC, rel=1e-12)


def test_forward_equivalent_time_on_the_presets() -> None:
    """flash_attention_fwd_s returns (t_fwd + t_bwd) / 3.5 with the preset's attention_frac; without a model (or an
    exponential rate: H100) the MMA-only time it always returned."""
    gptoss = load_model("gpt-oss-120b")
    assert compute.flops_per_score(compute.attention_head_dims(gptoss)) == 256.0
    for name, exp_per_s in (("gb200", 5e12), ("gb300", 10.7e12)):
        cluster = make_cluster(load_gpu(name), 8)
        assert cluster.gpu.sfu_exp_per_s == exp_per_s
        frac = cluster.gpu.efficiency.attention_frac
        mma = 2.56e14 / 2.5e15
        expected = (max(mma, 1e12 / exp_per_s) + max(2.5 * mma, 1e12 / exp_per_s)) / frac / 3.5
        got = compute.flash_attention_fwd_s(cluster, 2.56e14, model=gptoss)
        assert float(got) == pytest.approx(expected, rel=1e-12)
        assert float(compute.flash_attention_fwd_s(cluster, 2.56e14)) == pytest.approx(mma / frac, rel=1e-12)
    h100 = make_cluster(load_gpu("h100-80gb"), 8)
    assert h100.gpu.sfu_exp_per_s is None
    assert float(compute.flash_attention_fwd_s(h100, 2.56e14, model=gptoss)) == pytest.approx(
        2.56e14 / (989e12 * h100.gpu.efficiency.attention_frac), rel=1e-12)


def test_gpt_oss_attention_is_slower_on_sm100_than_sm103_per_flop() -> None:
    """In the layer, times attention_frac (the presets' fitted fractions may differ): gpt-oss (head dim 64) attention
    is longer on GB200 (exponential-bound forward: (0.2 + 0.256) / (0.1024 + 0.256) of the MMA-only time) than on
    GB300 (MMA-bound), both at 2,500 TFLOP/s BF16; Llama-3 8B (head dim 128) keeps the MMA-only time on both."""
    t = TrainingSpec(seq_len=4096, global_batch_size=64)
    layout = ParallelLayout(mbs=1, recompute="none")
    norm = {}
    for model_name in ("gpt-oss-120b", "llama3-8b"):
        model = load_model(model_name)
        for gpu in ("gb200", "gb300"):
            cluster = make_cluster(load_gpu(gpu), 8)
            lt = attention_layer_time(model, cluster, t, layout)
            norm[(model_name, gpu)] = float(lt.attn_fwd_s) * cluster.gpu.efficiency.attention_frac
    assert norm[("llama3-8b", "gb200")] == pytest.approx(norm[("llama3-8b", "gb300")], rel=1e-12)
    assert norm[("gpt-oss-120b", "gb200")] == pytest.approx(
        norm[("gpt-oss-120b", "gb300")] * (0.2 + 0.256) / (0.1024 + 0.256), rel=1e-9)
