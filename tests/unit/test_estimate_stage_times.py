"""Estimate.stage_times: the per-rank micro-batch times the step time is built from (the report draws them)."""

from __future__ import annotations

import numpy as np
import pytest

import paraplan

TRAINING = {"seq_len": 8192, "global_batch_size": 512}


@pytest.mark.parametrize(("model", "layout"), [
    ("llama3-70b", {"tp": 4, "pp": 4, "vp": 5}),
    ("mixtral-8x7b", {"tp": 2, "pp": 4, "ep": 4}),
    ("qwen3-30b-a3b", {"tp": 1, "pp": 4, "ep": 8, "recompute": "full"}),
])
def test_stage_times_are_the_step_times_stages(model: str, layout: dict[str, object]) -> None:
    est = paraplan.estimate(model, "h100-80gb", 64, layout=layout,
                            training=TRAINING)
    times = est.stage_times
    assert len(times) == est.layout.pp
    totals = [float(t.total_s) for t in times]
    assert int(est.time.slowest_stage) == int(np.argmax(totals))
    # the bubble is the pipeline's idle fraction of m slowest-stage micro-batches
    assert float(est.time.bubble_s) == pytest.approx(float(est.time.bubble_frac) * est.num_microbatches * max(totals))
    assert totals[0] != totals[1] or totals[-1] != totals[1]  # embedding / loss make end stages differ
