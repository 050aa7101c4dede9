"""Blackwell and Blackwell Ultra are separate fit groups, each fitted inside each cross-validation fold (issue 18)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "calibration"
needs_shared = pytest.mark.skipif(not (SHARED / "published_runs.csv").exists(), reason="needs ../shared/calibration")


def _cv():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return pytest.importorskip("cross_validate")


def test_blackwell_ultra_is_its_own_group() -> None:
    cv = _cv()
    assert cv.ARCH_GPUS["blackwell"] == ["b200", "gb200"]
    assert cv.ARCH_GPUS["blackwell_ultra"] == ["b300", "gb300"]
    assert len(cv.ARCH_OF) == sum(len(g) for g in cv.ARCH_GPUS.values())


@needs_shared
def test_each_group_is_fitted_per_fold_on_its_own_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fit per (fold, group), on that group's rows outside the fold; every held-out row is predicted with its
    own group's fit of its own fold (recorded fits return a marker value read back from the prediction)."""
    cv = _cv()
    from published_cases import load_cases  # type: ignore[import-not-found]

    cases = [c for c in load_cases("published")[0] if cv.ARCH_OF.get(c.gpu, "").startswith("blackwell")]
    assert {cv.ARCH_OF[c.gpu] for c in cases} == {"blackwell", "blackwell_ultra"}
    fits: list[tuple[str, list[Any]]] = []

    def fake_fit(train: list[Any], arch: str) -> dict[str, float]:
        fits.append((arch, train))
        return {"attention_frac": 0.35 + 0.001 * len(fits)}

    seen: list[tuple[str, float]] = []

    def fake_predict(case: Any, values: dict[str, float] | None) -> float:
        assert values is not None
        seen.append((case.id, values["attention_frac"]))
        return 1.0

    monkeypatch.setattr(cv, "fit_for", fake_fit)
    monkeypatch.setattr(cv, "predict_with", fake_predict)
    held = cv.held_out(cases, "kfold")
    groups = cv.groups_of(cases, "kfold")
    assert len(fits) == sum(len({cv.ARCH_OF[cases[i].gpu] for i in idx}) for idx in groups.values()) >= 2 * cv.FOLDS
    marker = dict(seen)
    assert len(seen) == len(marker) == len(cases)
    for h in held:
        k = int(h.fold.split()[1])
        arch = cv.ARCH_OF[h.case.gpu]
        want = {c.id for i, c in enumerate(cases) if i not in groups[f"fold {k}"] and cv.ARCH_OF[c.gpu] == arch}
        n = next(j for j, (a, train) in enumerate(fits, 1) if a == arch and {c.id for c in train} == want)
        assert marker[h.case.id] == pytest.approx(0.35 + 0.001 * n)
    for arch, train in fits:
        assert {cv.ARCH_OF[c.gpu] for c in train} == {arch}
