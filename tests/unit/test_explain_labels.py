"""explain's time findings: one meaning per word, no zero terms, fixes that name every flag they need."""

from __future__ import annotations

from dataclasses import replace

from paraplan.estimator import estimate
from paraplan.explain import host_bound_fixes, time_findings
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

QWEN = load_model("qwen3-30b-a3b")
CLUSTER = make_cluster(load_gpu("h100-80gb"), 8)
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=64)


def test_dominant_time_says_its_compute_leaves_host_bound_time_out() -> None:
    best = estimate(QWEN, CLUSTER, TRAINING, ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1))
    assert float(best.time.host_bound_s) > 0.0
    dominant = time_findings(best, None)[0]
    assert dominant.code == "DOMINANT_TIME" and "compute excl. host-bound (MoE) " in dominant.text
    assert " compute " not in f" {dominant.text} ".replace("compute excl.", "")


def test_runner_up_gap_lists_no_zero_term() -> None:
    """A runner-up slower by its compute alone: the gap names that one term, not two zero ones after it."""
    a = estimate(QWEN, CLUSTER, TRAINING, ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1))
    b = replace(a, time=replace(a.time, compute_s=a.time.compute_s + 0.1, step_s=a.time.step_s + 0.1))
    gap = next(f for f in time_findings(a, b) if f.code == "RUNNER_UP_GAP")
    assert gap.text.endswith(": compute excl. host-bound (MoE) +0.100 s"), gap.text
    assert set(gap.numbers) == {"gap_s", "compute"}


def test_the_hybridep_fix_for_allgather_names_the_flex_dispatcher() -> None:
    allgather = replace(TRAINING, moe_token_dispatcher_type="allgather")
    assert "HybridEP (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep)" in \
        host_bound_fixes(allgather)[0]
    deepep = replace(TRAINING, moe_token_dispatcher_type="flex")
    assert "HybridEP (--moe-flex-dispatcher-backend hybridep)" in host_bound_fixes(deepep)[0]
