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
    assert bf16 == {"zero_buckets": 2e9, "bf16_lp_grads": 2e9}
    fp16 = bloom.deepspeed_state_extra_bytes(_stage(1e9), "fp16", dp=1)
    assert fp16 == {"zero_buckets": 0.0, "bf16_lp_grads": 0.0}


@pytest.fixture(scope="module")
def figures() -> dict[str, object]:
    return bloom.score(bloom.predicted_rows(bloom.bloom_rows(ROWS)))  # type: ignore[no-any-return]


def test_bloom_rows_used(figures: dict[str, object]) -> None:
    assert figures["n"] == 70 and figures["oom_total"] == 6


def test_bloom_peaks_leave_one_out(figures: dict[str, object]) -> None:
    # Measured 2026-11-29: LOO median APE 3.5%, 66/70 within 15%; constant 7.7 GiB.
    assert figures["median_ape"] < 0.06
    assert figures["within15"] >= 64
    # The constant is a property of the runtime, not of the precision: fitted on fp16 rows it
    # predicts the bf16 rows (3.4%) and vice versa (3.9%).
    for ape in figures["cross_precision"].values():  # type: ignore[attr-defined]
        assert ape < 0.06
    # Without the DeepSpeed terms and constant the median error is 12.7%: the constant carries
    # ~8 GiB, physically plausible for NCCL buffers + allocator cache, but fitted.
    assert 4 * 2**30 < figures["constant_bytes"] < 12 * 2**30  # type: ignore[operator]


def test_bloom_oom_rows(figures: dict[str, object]) -> None:
    # 5/6 OOM rows predicted not to fit and 69/70 measured rows predicted to fit. The misses:
    # line 957 (206B, predicted ~70 GiB, OOM recorded; its neighbour line 949 measured 60 GiB with
    # one layer less per stage) and line 909 (measured 79.0 GiB, predicted 80.1 GiB).
    assert figures["oom_said"] >= 5
    assert figures["fit_said"] >= 69
