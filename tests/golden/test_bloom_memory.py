"""BLOOM prequel memory (BigScience tr11-176B chronicles-prequel, Megatron-DeepSpeed, nvidia-smi).

tests/fixtures/calibration/bloom_prequel_rows.csv is a copy of the bigscience rows of
shared/calibration/published_runs.csv (source and line of every row in its columns). The
comparison lives in benchmarks/bloom_memory.py: Megatron-Core memory from paraplan + the named
Megatron-DeepSpeed terms + one per-process constant, scored leave-one-out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from paraplan.estimate.memory import MemoryBreakdown

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bloom = pytest.importorskip("bloom_memory")
ROWS = ROOT / "tests" / "fixtures" / "calibration" / "bloom_prequel_rows.csv"


def _stage(params: float) -> MemoryBreakdown:
    return MemoryBreakdown(weights_bytes=2 * params, grads_bytes=4 * params, optimizer_bytes=0.0,
                           activations_bytes=0.0, other_bytes=0.0)


def test_deepspeed_terms_follow_their_definitions() -> None:
    bf16 = bloom.deepspeed_state_extra_bytes(_stage(1e9), "bf16", dp=8)
    assert bf16 == {"reduce_bucket": 0.0, "allgather_bucket": 1e9, "bf16_lp_grads": 2e9}
    fp16 = bloom.deepspeed_state_extra_bytes(_stage(1e9), "fp16", dp=8)
    assert fp16 == {"reduce_bucket": 1e9, "allgather_bucket": 1e9, "bf16_lp_grads": 0.0}
    plain = bloom.deepspeed_state_extra_bytes(_stage(1e9), "fp16", dp=1)
    assert sum(plain.values()) == 0.0


@pytest.mark.parametrize(("layers", "pp", "count_embedding", "expected"), [
    # Expected values from running DeepSpeed 0.6.0's own partition_balanced (runtime/utils.py) on
    # GPTModelPipe's layer specs with binary weights.
    (78, 12, False, [7] * 11 + [1]),
    (106, 12, False, [9] * 11 + [7]),
    (72, 12, False, [6] * 12),
    (70, 12, True, [5] + [6] * 10 + [5]),
    (82, 12, True, [6] + [7] * 10 + [6]),
    (100, 6, True, [16, 17, 17, 17, 17, 16]),
])
def test_deepspeed_layer_split_matches_deepspeed(layers: int, pp: int, count_embedding: bool,
                                                 expected: list[int]) -> None:
    assert bloom.deepspeed_layer_split(layers, pp, count_embedding) == expected


@pytest.fixture(scope="module")
def figures() -> dict[str, object]:
    return bloom.score(bloom.predicted_rows(bloom.bloom_rows(ROWS)))  # type: ignore[no-any-return]


def test_bloom_rows_used(figures: dict[str, object]) -> None:
    assert figures["n"] == 70 and figures["oom_total"] == 6


def test_bloom_peaks_leave_one_out(figures: dict[str, object]) -> None:
    # Measured 2026-11-29 (session 3): LOO median APE 4.8%, 66/70 within 15%; constant 9.1 GiB.
    assert figures["median_ape"] < 0.06
    assert figures["within15"] >= 64
    # The constant fitted on one precision predicts the other at 6.4% (fp16 -> bf16) and 8.3%
    # (bf16 -> fp16): bf16 rows carry ~2 B/param more than the sourced BF16_Optimizer terms
    # (regression of the residual on parameters held: 1.8 GiB per 1e9 params for bf16, 0.0 for
    # fp16). Session 2 read 3.4% / 3.9% with every stage at ceil(L/PP) layers and ZeRO buckets
    # on bf16 rows, both of which DeepSpeed's code contradicts.
    for ape in figures["cross_precision"].values():  # type: ignore[attr-defined]
        assert ape < 0.10
    # Without the DeepSpeed terms and constant the median error is 16.8%: the constant carries
    # ~9 GiB, physically plausible for NCCL buffers + allocator cache, but fitted.
    assert 4 * 2**30 < figures["constant_bytes"] < 12 * 2**30  # type: ignore[operator]


def test_bloom_oom_rows(figures: dict[str, object]) -> None:
    # 5/6 OOM rows predicted not to fit and 70/70 measured rows predicted to fit (fullest stage).
    # The miss: line 957 (206B, h=14336, L=82 on PP 12: 6 layers + embedding on stage 0, 7 on
    # the others) predicted at 64 GiB; line 949, the same width with one layer less per stage,
    # measured 60 GiB and is predicted at 57.6.
    assert figures["oom_said"] >= 5
    assert figures["fit_said"] == figures["n"]


def test_line_957_oom_is_not_implied_by_its_measured_neighbour() -> None:
    """Why line 957 stays a miss: line 931 has the same layout, heads, layers per stage and
    precision, with h = 13312 instead of 14336, and measured 60 GB. No memory term grows faster
    than h^2 at a fixed layout (weights/grads/optimizer ~ h^2, activations ~ h), so scaling all of
    line 931 by (14336/13312)^2 bounds line 957 at about 70 GB, below the 80 GB it ran out of."""
    rows = {r["source_detail"].rsplit("(", 1)[-1].rstrip(")"): r for r in bloom.bloom_rows(ROWS)}
    r931, r957 = rows["line 931"], rows["line 957"]
    same = ("num_layers", "num_heads", "tp", "pp", "dp", "mbs", "gbs", "precision", "seq_length")
    assert all(r931[k] == r957[k] for k in same)
    assert r931["notes"].replace("[OOM] run did not fit in 80GB (Mem column = OOM); ", "") == \
        r957["notes"].replace("[OOM] run did not fit in 80GB (Mem column = OOM); ", "")
    bound_gb = float(r931["peak_mem_gb"]) * (int(r957["hidden_size"]) / int(r931["hidden_size"])) ** 2
    assert bound_gb < 72 < 80


def test_line_957_oom_is_not_implied_by_its_other_measured_neighbour() -> None:
    """A second, independent bound: line 949 has line 957's hidden size, heads, layout, precision
    and partition method, with 70 layers instead of 82, and measured 60 GB. DeepSpeed's
    type:transformer|embedding split gives line 949 at most 6 layers per stage and line 957 at
    most 7, and the first/last stages 5 and 6 (plus the embedding). Every memory term at a fixed
    hidden size and layout grows at most in proportion to the layers a stage holds (the embedding
    and per-process constants do not grow at all), so line 957 is bounded by 60 GB x 6/5 = 72 GB."""
    rows = {r["source_detail"].rsplit("(", 1)[-1].rstrip(")"): r for r in bloom.bloom_rows(ROWS)}
    r949, r957 = rows["line 949"], rows["line 957"]
    same = ("hidden_size", "num_heads", "tp", "pp", "dp", "mbs", "gbs", "precision", "seq_length")
    assert all(r949[k] == r957[k] for k in same)
    split_949 = bloom.deepspeed_layer_split(int(r949["num_layers"]), int(r949["pp"]), count_embedding=True)
    split_957 = bloom.deepspeed_layer_split(int(r957["num_layers"]), int(r957["pp"]), count_embedding=True)
    growth = max(b / a for a, b in zip(split_949, split_957, strict=True))
    assert growth == 6 / 5
    assert float(r949["peak_mem_gb"]) * growth < 80
