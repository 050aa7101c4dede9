"""benchmarks/ranking.py scoring rules on hand-made groups (predictions stubbed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
ranking = pytest.importorskip("ranking")


def _case(tp: int, measured: float, *, gbs: int = 64, source: str = "S") -> Any:
    from published_cases import Case

    return Case(id=f"tp{tp}-{measured}", source=source, label="m", model={"num_layers": 4, "hidden_size": 64},
                gpu="a100-80gb", num_gpus=8, gpus_per_node=8, seq_len=1024, gbs=gbs,
                layout={"tp": tp, "pp": 1, "mbs": 1}, precision="bf16", target_tokens_per_s_per_gpu=measured,
                moe=False)


def test_groups_need_three_layouts_and_average_repeats() -> None:
    cases = [_case(1, 100.0), _case(1, 120.0), _case(2, 90.0), _case(4, 50.0), _case(8, 10.0, gbs=32)]
    groups = ranking.groups_of(cases)
    assert len(groups) == 1  # the gbs=32 run is another job, alone
    measured = sorted(m for _, m in groups[0])
    assert measured == [50.0, 90.0, 110.0]


def test_pairwise_order_and_regret(monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: tp1 100, tp2 95 (within the 10% gap: not scored), tp4 50
    # predicted: tp4 is picked (wrong), tp1 above tp2
    preds = {1: 80.0, 2: 70.0, 4: 90.0}
    monkeypatch.setattr(ranking, "predict", lambda c: preds[c.layout["tp"]])
    group = [(_case(1, 100.0), 100.0), (_case(2, 95.0), 95.0), (_case(4, 50.0), 50.0)]
    r = ranking.score_group(group)
    assert r is not None
    assert r["pairs"] == 2  # (tp1, tp4) and (tp2, tp4)
    assert r["concordant"] == 0
    assert r["regret"] == pytest.approx(0.5)
    assert r["pick"].layout["tp"] == 4


def test_tier_one_scores_the_layouts_the_planner_cannot_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # predicted: tp4 90, tp1 88 (within 5%: tier 1 with it), tp2 70 (tier 2); measured: tp1 best, tp4 half of it
    preds = {1: 88.0, 2: 70.0, 4: 90.0}
    monkeypatch.setattr(ranking, "predict", lambda c: preds[c.layout["tp"]])
    group = [(_case(1, 100.0), 100.0), (_case(2, 95.0), 95.0), (_case(4, 50.0), 50.0)]
    r = ranking.score_group(group)
    assert r is not None
    assert r["tier1"] == 2
    assert r["tier1_best_regret"] == pytest.approx(0.0)  # tp1 is in tier 1
    assert r["tier1_worst_regret"] == pytest.approx(0.5)  # and so is tp4
