"""Done-when of issue 15: Llama-3.1-405B on 16,384 H100 over 54 days, default failure rate: goodput within 5
points of the ~90% effective training time Meta reports (Llama 3 paper, section 3.3.4), and budget prints the
save interval and checkpoint size it assumed."""

from __future__ import annotations

import json

import pytest

import paraplan.cli.budget  # noqa: F401  (registers the command)
from paraplan.budget import budget
from paraplan.checkpoint import format_decimal_bytes
from paraplan.cli import main
from paraplan.specs.load import load_gpu, load_model

META_EFFECTIVE_TRAINING = 0.90
ARGS = ["budget", "--model", "llama3.1-405b", "--tokens", "15.6T", "--gpu", "h100-80gb", "--gpus", "16384",
        "--seq-len", "8192", "--days", "54"]


def test_llama3_405b_goodput_is_within_5_points_of_meta() -> None:
    res = budget(load_model("llama3.1-405b"), [load_gpu("h100-80gb")], tokens=15.6e12, seq_len=8192,
                 num_gpus=16_384, days=54.0)
    (row,) = res.rows
    assert row.feasible and row.goodput is not None and row.checkpoint is not None
    assert abs(row.goodput - META_EFFECTIVE_TRAINING) <= 0.05
    assert row.checkpoint["failures_per_day"] == pytest.approx(419 / 54)
    # 405B parameters x (2 B bf16 weights + 12 B fp32 master weights and Adam moments), within 0.5%
    assert row.checkpoint_bytes == pytest.approx(14 * 405.85e9, rel=5e-3)
    assert row.save_interval_iters is not None and row.save_interval_iters >= 1
    assert row.effective_days == pytest.approx(row.days / row.goodput)  # type: ignore[operator]


def test_budget_prints_the_save_interval_and_checkpoint_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert main(ARGS) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert f"goodput {row['goodput']:.1%}" in out
    assert f"checkpoint {format_decimal_bytes(row['checkpoint_bytes'])} (torch_dist)" in out
    assert f"every {row['save_interval_iters']:,} iterations" in out
    assert "419 unexpected interruptions in 54 days on 16,384 H100" in out
