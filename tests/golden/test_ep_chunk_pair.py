"""Golden values of the start and end of a combined-1F1B chunk pair (``ep.paired_chunk_s``), by hand from
Megatron-LM's ``TransformerModelChunkSchedulePlan.run`` (model_chunk_schedule_plan.py): each (forward chunk,
backward chunk) pair starts with both streams free and ends with the compute stream waiting for both chunks' events
(``wait_current_stream``), so the first combine backward has only the first attention forward beside it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.estimate import step_time as st_mod
from paraplan.estimate.time import ep
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.schedules import schedule_named
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


def test_cold_start_by_hand() -> None:
    """a = 3 per pass (ep_s 12), M = 2, A = 2 (compute 3 (A + M) = 12), --delay-wgrad-compute. Layer 1 from 0:
    combine bwd 0-3, attention fwd 0-2, dispatch fwd 3-6, MLP dgrad 3-5 (after the combine bwd), dispatch bwd 6-9,
    MLP wgrad 5-7, MLP fwd 7-9, combine fwd 9-12, attention dgrad 9-11, wgrad 11-13; every later layer 12 later
    (the steady period = the compute, nothing exposed). Four layers end at 49 = 4 x 12 + 1: the compute stream idled
    1 (3-2) beside the first combine backward."""
    assert float(ep.paired_exposed_s(12.0, 12.0, 2.0, delay_wgrad=True)) == pytest.approx(0.0, abs=1e-12)
    assert float(ep.paired_chunk_s(12.0, 12.0, 2.0, delay_wgrad=True)) == pytest.approx(1.0, rel=1e-12)


def test_comm_bound_chunk_has_no_extra() -> None:
    """a = 25 (ep_s 100), M = 2, A = 2, no delay: the communication stream runs its four passes back to back from 0
    (combine bwd 0-25, dispatch fwd 25-50, dispatch bwd 50-75, combine fwd 75-100, the next combine bwd waits only
    for the attention dgrad at 79): the steady exposure 100 - 12 = 88 per layer already counts everything."""
    assert float(ep.paired_exposed_s(100.0, 12.0, 2.0, delay_wgrad=False)) == pytest.approx(88.0, rel=1e-12)
    assert float(ep.paired_chunk_s(100.0, 12.0, 2.0, delay_wgrad=False)) == pytest.approx(0.0, abs=1e-9)
    assert float(ep.paired_chunk_s(0.0, 12.0, 2.0, delay_wgrad=True)) == 0.0  # no passes, nothing to expose


@settings(max_examples=300, deadline=None)
@given(ep_s=st.floats(0.0, 50.0), compute_s=st.floats(0.1, 50.0), mlp_frac=st.floats(0.0, 0.33),
       share=st.floats(0.05, 1.0), delay=st.booleans())
def test_chunk_pair_takes_at_least_its_compute_and_its_passes(ep_s: float, compute_s: float, mlp_frac: float,
                                                              share: float, delay: bool) -> None:
    """L layers of a chunk pair (steady exposure each, plus the one-off) never take less than their compute or than
    the 4 L passes on the one communication stream; the one-off is never negative."""
    m = mlp_frac * compute_s
    steady = float(ep.paired_exposed_s(ep_s, compute_s, m, delay_wgrad=delay, compute_share=share))
    once = float(ep.paired_chunk_s(ep_s, compute_s, m, delay_wgrad=delay, compute_share=share))
    layers = ep.PAIRED_STEADY_LAYERS
    att = max(compute_s - 3 * m, 0.0) / 3
    work = 3 * (att + m)
    total = layers * (work + steady) + once
    tol = 1e-9 * (1.0 + ep_s + compute_s) * layers
    assert once >= 0.0
    assert total >= layers * work - tol and total >= layers * ep_s - tol


def test_step_adds_vp_chunk_pairs_per_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-off enters the step m (1 - f) VP times (VP chunk pairs per micro-batch on the slowest stage, f the
    unpaired share of ``Schedule.ep_exposed_frac``), times the calibrated (1 - ep_overlap_frac)."""
    model = load_model("qwen3-235b-a22b")
    h100 = load_gpu("h100-80gb")
    # without host-bound time (time.layer.moe_host_bound_s): it lengthens the paired compute, which then hides the
    # chunk's one-off; this test checks how the one-off enters the step
    cluster = make_cluster(replace(h100, efficiency=replace(h100.efficiency, host_op_issue_s=0.0)), 256)
    training = TrainingSpec(seq_len=4096, global_batch_size=8192, delay_wgrad_compute=True, precision="fp8",
                            moe_token_dispatcher_type="alltoall")
    layout = ParallelLayout(tp=2, pp=8, vp=4, dp=16, ep=32, etp=1, mbs=1, sequence_parallel=True,
                            pipeline_layout=(2, *[3] * 30, 2), schedule="combined_1f1b")  # NVIDIA's H100 recipe
    with_chunk = estimate(model, cluster, training, layout)
    part = st_mod.stage_terms(model, cluster, training, layout).parts[1]
    assert float(part.ep_paired_chunk_s) > 0.0
    monkeypatch.setattr(ep, "paired_chunk_s", lambda *a, **k: 0.0)
    without = estimate(model, cluster, training, layout)
    m = training.global_batch_size // (layout.dp * layout.mbs)
    frac = float(schedule_named("combined_1f1b").ep_exposed_frac(pp=8, vp=4, num_microbatches=m))
    keep = 1.0 - cluster.gpu.efficiency.ep_overlap_frac
    want = m * (1.0 - frac) * layout.vp * keep * float(part.ep_paired_chunk_s)
    got = float(with_chunk.time.exposed_comm_s["ep"] - without.time.exposed_comm_s["ep"])
    assert np.isclose(got, want, rtol=1e-9)
