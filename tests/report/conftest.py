"""Shared plans for the report tests (built once per session: searches take a moment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.search import Plan, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker here too, so this folder runs before pyproject lists it."""
    config.addinivalue_line("markers", "browser: needs Debian's chromium and playwright (tests/report/test_browser.py)")


LOG_PATH = Path(__file__).parent / "data" / "train.log"
"""A short Megatron log: 3 iteration lines (GBS 256), memory of ranks 0 and 8."""
LOG = LOG_PATH.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def plan_8b() -> Plan:
    """llama3-8b on 16 H100s, top 3, PP 2 with VP 6 or 8, mbs 2, no recompute, so a schedule is drawn (no memory
    margin: the tests name these three layouts, which the default margin would change): #1 tp1 pp2 vp8 dp8 fsdp,
    #2 the same with vp6 (a custom pipeline layout), #3 vp8 with the distributed optimizer."""
    from paraplan.headroom import NO_HEADROOM
    from paraplan.search import SearchSpace

    return plan(load_model("llama3-8b"), make_cluster(load_gpu("h100-80gb"), 16),
                TrainingSpec(seq_len=4096, global_batch_size=256),
                space=SearchSpace(pp=(2,), vp=(6, 8), mbs=(2,), recompute=("none",)), top_k=3, headroom=NO_HEADROOM)


@pytest.fixture(scope="session")
def plan_70b() -> Plan:
    """llama3-70b on 64 H100s (interleaved pipeline at the top)."""
    return plan(load_model("llama3-70b"), make_cluster(load_gpu("h100-80gb"), 64),
                TrainingSpec(seq_len=8192, global_batch_size=512), top_k=4)
