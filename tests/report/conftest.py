"""Shared plans for the report tests (built once per session: searches take a moment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.search import Plan, SearchSpace, plan
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
    """llama3-8b on 16 H100s, top 3, PP 2 with VP 8 or 6 so a schedule is drawn (no memory margin: the tests name
    these layouts, which the default margin would change): #1 tp1 pp2 vp8 dp8 mbs2, #2 the same with Megatron-FSDP
    (put there by hand: the tests compare a log with an FSDP layout of #1's sizes, which the search no longer ranks
    second since FSDP gathers are hidden layer by layer), #3 the search's #2, vp6 (one step-time tier with vp8,
    which goes first as an even pipeline split). TP 1 and CP 1 only: in the (about 12%) step-time tier CP 2 layouts with
    more free memory would go first."""
    import dataclasses

    from paraplan.estimator import estimate
    from paraplan.headroom import NO_HEADROOM
    from paraplan.search import SearchSpace

    p = plan(load_model("llama3-8b"), make_cluster(load_gpu("h100-80gb"), 16),
             TrainingSpec(seq_len=4096, global_batch_size=256),
             space=SearchSpace(tp=(1,), cp=(1,), pp=(2,), vp=(6, 8), mbs=(2,), recompute=("none",)), top_k=3,
             headroom=NO_HEADROOM)
    best = p.candidates[0]
    fsdp = estimate(p.model, p.cluster, p.training, dataclasses.replace(best.layout, fsdp=True,
                                                                         distributed_optimizer=False),
                    headroom=NO_HEADROOM)
    return dataclasses.replace(p, candidates=(best, fsdp, p.candidates[1]))


@pytest.fixture(scope="session")
def plan_70b() -> Plan:
    """llama3-70b on 64 H100s, distributed optimizer (interleaved pipeline at the top; with Megatron-FSDP searched
    too, tp1 pp1 fsdp fits inside the memory band's margin and wins)."""
    return plan(load_model("llama3-70b"), make_cluster(load_gpu("h100-80gb"), 64),
                TrainingSpec(seq_len=8192, global_batch_size=512), top_k=4, space=SearchSpace(dp_variants=("distopt",)))
