"""Shared plans for the report tests (built once per session: searches take a moment)."""

from __future__ import annotations

import pytest

from paraplan.search import Plan, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec



def pytest_configure(config: pytest.Config) -> None:
    """Register the marker here too, so this folder runs before pyproject lists it."""
    config.addinivalue_line("markers", "browser: needs Debian's chromium and playwright (tests/report/test_browser.py)")


LOG = """\
 iteration       10/     100 | consumed samples:         2560 | elapsed time per iteration (ms): 6100.0 | throughput per GPU (TFLOP/s/GPU): 380.0 | learning rate: 1.0E-04 | global batch size:   256 | lm loss: 9.1E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 50000.0 | max allocated: 66000.0 | reserved: 70000.0 | max reserved: 70000.0
[Rank 8] (after 10 iterations) memory (MB) | allocated: 48000.0 | max allocated: 61000.0 | reserved: 65000.0 | max reserved: 65000.0
 iteration       20/     100 | consumed samples:         5120 | elapsed time per iteration (ms): 5900.0 | throughput per GPU (TFLOP/s/GPU): 392.0 | learning rate: 1.0E-04 | global batch size:   256 | lm loss: 8.1E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 iteration       30/     100 | consumed samples:         7680 | elapsed time per iteration (ms): 5950.0 | throughput per GPU (TFLOP/s/GPU): 389.0 | learning rate: 1.0E-04 | global batch size:   256 | lm loss: 7.5E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


@pytest.fixture(scope="session")
def plan_8b() -> Plan:
    """llama3-8b on 16 H100s, top 3, PP forced >= 2 somewhere in the top so a schedule is drawn."""
    from paraplan.search import SearchSpace

    return plan(load_model("llama3-8b"), make_cluster(load_gpu("h100-80gb"), 16),
                TrainingSpec(seq_len=4096, global_batch_size=256), space=SearchSpace(pp=(2, 4)), top_k=3)


@pytest.fixture(scope="session")
def plan_70b() -> Plan:
    """llama3-70b on 64 H100s (interleaved pipeline at the top)."""
    return plan(load_model("llama3-70b"), make_cluster(load_gpu("h100-80gb"), 64),
                TrainingSpec(seq_len=8192, global_batch_size=512), top_k=4)
