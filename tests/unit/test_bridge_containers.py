"""benchmarks/bridge_containers.py: the Megatron-Bridge jobs measured in several NeMo containers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
bc = pytest.importorskip("bridge_containers")
published_cases = pytest.importorskip("published_cases")

NEEDS_SHARED = pytest.mark.skipif(not (published_cases.SHARED / "published_runs.csv").is_file(),
                                  reason="../shared/calibration is absent")


def _row(**kw: str) -> dict[str, str]:
    base = {"model": "gpt-oss-120B", "gpu": "GB200", "num_gpus": "64", "seq_length": "4096", "gbs": "1280",
            "mbs": "4", "tp": "1", "pp": "1", "vp": "", "cp": "1", "ep": "64", "precision": "mxfp8",
            "distributed_optimizer": "", "notes": "container NeMo 26.06; task=Pre-Training Performance"}
    return {**base, **kw}


def test_job_key_ignores_the_container_and_keeps_precision_and_task_apart() -> None:
    assert bc.job_key(_row()) == bc.job_key(_row(notes="container NeMo 26.08; task=Pre-Training Performance"))
    assert bc.job_key(_row()) != bc.job_key(_row(precision="bf16"))
    assert bc.job_key(_row()) != bc.job_key(_row(notes="container NeMo 26.06; task=LoRA"))
    assert bc.job_key(_row(vp="")) == bc.job_key(_row(vp="1"))
    prim = _row(precision="", notes="container NeMo 25.09; precision column absent for 25.09")
    alt = _row(precision="", notes="container NeMo 25.09; row built from the parenthesized values")
    assert bc.job_key(prim) != bc.job_key(alt)


def test_knob_diff_counts_a_missing_knob_as_the_default() -> None:
    assert bc.knob_diff({"a": 1, "b": 2}, {"a": 1, "b": 2}) == {}
    assert bc.knob_diff({"a": 1}, {"a": 2, "c": True}) == {"a": (1, 2), "c": ("-", True)}


def _entry(container: str, measured: float, knobs: dict[str, object], excluded: str = "") -> object:
    case = published_cases.Case(id="published:0000", source="Megatron-Bridge", label="x", model={}, gpu="gb200",
                                num_gpus=64, gpus_per_node=None, seq_len=4096, gbs=1280, layout={}, precision="fp8",
                                target_tokens_per_s_per_gpu=measured, moe=True, excluded=excluded)
    return bc.Entry(0, container, "", measured, case, knobs=knobs)


def test_gaps_are_same_knob_pairs_beyond_ten_percent_with_their_reason() -> None:
    a, b = _entry("26.06", 28947, {"k": 1}), _entry("26.06.01", 18304, {"k": 1}, excluded="footnote")
    c, d = _entry("26.08", 28672, {"k": 1}), _entry("26.04", 20000, {"k": 2})
    found = bc.gaps([(("job",), [a, b, c, d])])
    pairs = {(x.container, y.container): why for _, x, y, why in found}
    assert pairs == {("26.06", "26.06.01"): "footnote", ("26.06.01", "26.08"): "footnote"}  # a-c 1% apart; d differs
    e = _entry("26.02", 30000, {"k": 3})
    f = _entry("26.02.01", 20000, {"k": 3})
    assert [why for *_, why in bc.gaps([(("job",), [e, f])])] == ["unexplained"]


@NEEDS_SHARED
def test_table_lists_the_gpt_oss_job_in_each_container_it_was_measured() -> None:
    groups = {key: es for key, es in bc.jobs()}
    key = next(k for k in groups if k[:3] == ("gpt-oss-120B", "GB200", "64") and k[10] == "64" and k[11] == "mxfp8")
    es = groups[key]
    assert [e.container for e in es] == ["26.06", "26.06.01", "26.08"]  # release order
    assert [round(e.measured) for e in es] == [28947, 18304, 28672]
    assert [bool(e.case and e.case.excluded) for e in es] == [False, True, False]
    assert all(len({e.container for e in es}) > 1 for es in groups.values())
    lines = bc.table_lines(lambda case: 1.0)
    assert lines[0].startswith(f"Megatron-Bridge jobs measured in more than one container: {len(groups)}")
    assert any(line.startswith("same knobs, measured more than 10% apart:") for line in lines)
