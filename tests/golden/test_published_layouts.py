"""Published Megatron runs predicted within stated tolerances (SC21 Table 1; Korthikanti Table 5).

Targets are tokens/s/GPU. SC21 (Narayanan et al. 2021, arXiv:2104.04473, Table 1, via the
Megatron-LM README image cases_april2021.png and examples/sc21 scripts) printed TFLOP/s/GPU with
its Eq. 3 (recompute counted): tokens/s/GPU = TFLOP/s / (96 l h^2 (1 + s/6h + V/16lh)).
Korthikanti et al. 2022 (arXiv:2205.05198) Tables 3 and 5: iteration times, no data parallelism.
A100 80GB, sequence 2048, vocabulary 51,200, fp16 (SC21) / bf16, unfused attention (both
papers predate FlashAttention in Megatron).

Tolerances (why): the efficiency constants are per-architecture fits over ~300 A100 rows
(benchmarks/fit_efficiency.py), not fits to these rows; SC21 within 20%, Korthikanti within 25%
(its full-recompute baselines of the 530B/1T models run 19-22% slower in the model than measured:
the model charges the recomputed forward at full price where Megatron overlaps part of it).
"""

from __future__ import annotations

import pytest

from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, model_from_megatron_args
from paraplan.specs.training import TrainingSpec

A100 = load_gpu("a100-80gb")


def sc21_tokens(tflops: float, L: int, h: int, s: int = 2048, V: int = 51200) -> float:
    """SC21 Eq. 3 per token: 96 l h^2 (1 + s/6h + V/16lh)."""
    return tflops * 1e12 / (96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)))


# (label, layers, hidden, heads, gpus, gbs, tp, pp, vp, mbs, TFLOP/s per GPU printed in Table 1)
SC21 = [
    ("1.7B", 24, 2304, 24, 32, 512, 1, 1, 1, 16, 137),
    ("3.6B", 30, 3072, 32, 64, 512, 2, 1, 1, 16, 138),
    ("7.5B", 36, 4096, 32, 128, 512, 4, 1, 1, 16, 142),
    ("18B", 40, 6144, 48, 256, 1024, 8, 1, 1, 8, 135),
    ("39B", 48, 8192, 64, 512, 1536, 8, 2, 1, 4, 138),
    ("76B", 60, 10240, 80, 1024, 1792, 8, 4, 3, 2, 140),
    ("145B", 80, 12288, 96, 1536, 2304, 8, 8, 2, 2, 148),
    ("310B", 96, 16384, 128, 1920, 2160, 8, 16, 2, 1, 155),
    ("530B", 105, 20480, 128, 2520, 2520, 8, 35, 3, 1, 163),
    ("1T", 128, 25600, 160, 3072, 3072, 8, 64, 1, 1, 163),
]
# (label, layers, hidden, heads, gpus, gbs, tp, pp, vp, mbs, recompute, sequence parallel, iteration s)
KORTHIKANTI = [
    ("22B sel+SP", 48, 6144, 64, 8, 4, 8, 1, 1, 4, "selective", True, 1.10),
    ("22B full", 48, 6144, 64, 8, 4, 8, 1, 1, 4, "full", False, 1.42),
    ("175B sel+SP", 96, 12288, 96, 64, 64, 8, 8, 3, 1, "selective", True, 13.75),
    ("175B full", 96, 12288, 96, 64, 64, 8, 8, 3, 1, "full", False, 18.13),
    ("530B sel+SP", 105, 20480, 128, 280, 280, 8, 35, 3, 1, "selective", True, 37.83),
    ("530B full", 105, 20480, 128, 280, 280, 8, 35, 3, 1, "full", False, 49.05),
    ("1T sel+SP", 128, 25600, 160, 512, 512, 8, 64, 1, 1, "selective", True, 71.49),
    ("1T full", 128, 25600, 160, 512, 512, 8, 64, 1, 1, "full", False, 94.42),
]


def predict(L: int, h: int, a: int, n: int, gbs: int, tp: int, pp: int, vp: int, mbs: int, recompute: str,
            sp: bool, precision: str) -> float:
    model = model_from_megatron_args({"num_layers": L, "hidden_size": h, "num_attention_heads": a,
                                      "vocab_size": 51200, "max_position_embeddings": 2048})
    layout = ParallelLayout(tp=tp, pp=pp, vp=vp, dp=n // (tp * pp), mbs=mbs, recompute=recompute,  # type: ignore[arg-type]
                            sequence_parallel=sp, distributed_optimizer=False,
                            overlap_grad_reduce=False, overlap_param_gather=False)
    # 2021-2022 Megatron-LM: unfused attention (baddbmm + fused scale-mask-softmax), before FlashAttention
    training = TrainingSpec(seq_len=2048, global_batch_size=gbs, precision=precision,  # type: ignore[arg-type]
                            attention_backend="unfused")
    return float(estimate(model, make_cluster(A100, n), training, layout).throughput.tokens_per_s_per_gpu)


@pytest.mark.parametrize("row", SC21, ids=[r[0] for r in SC21])
def test_sc21_table1_within_20_percent(row: tuple) -> None:
    label, L, h, a, n, gbs, tp, pp, vp, mbs, tflops = row
    measured = sc21_tokens(tflops, L, h)
    ours = predict(L, h, a, n, gbs, tp, pp, vp, mbs, "full", False, "fp16")
    delta = ours / measured - 1
    print(f"SC21 {label}: paper {measured:.1f} tok/s/GPU, ours {ours:.1f}, delta {100 * delta:+.1f}%")
    assert abs(delta) <= 0.20


@pytest.mark.parametrize("row", KORTHIKANTI, ids=[r[0] for r in KORTHIKANTI])
def test_korthikanti_table5_within_25_percent(row: tuple) -> None:
    label, L, h, a, n, gbs, tp, pp, vp, mbs, rec, sp, step_s = row
    measured = gbs * 2048 / (step_s * n)
    ours = predict(L, h, a, n, gbs, tp, pp, vp, mbs, rec, sp, "bf16")
    delta = ours / measured - 1
    print(f"Korthikanti {label}: paper {measured:.1f} tok/s/GPU, ours {ours:.1f}, delta {100 * delta:+.1f}%")
    assert abs(delta) <= 0.25


def test_selective_beats_full_recompute_as_in_table5() -> None:
    """Korthikanti Table 5: SP + selective recompute is 29-32% faster than full recompute."""
    for sel, full in zip(KORTHIKANTI[::2], KORTHIKANTI[1::2], strict=True):
        fast = predict(*sel[1:12], "bf16")
        slow = predict(*full[1:12], "bf16")
        assert 1.15 < fast / slow < 1.6, (sel[0], fast / slow)
