"""tune and report use what the log states about its run: a mismatch is an error, and the log's
argument dump alone is enough to compare (with --gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.ingest import parse_text
from paraplan.tune import compare
from tests.tune.helpers import make_estimate, megatron_log

DUMP = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "synthetic" / "argument_dump.log"
SIZES = ("using world size: 16, data-parallel size: 8, context-parallel size: 1, hierarchical context-parallel "
         "sizes: None, tensor-model-parallel size: 2, pipeline-model-parallel size: 1\n")


def test_a_log_of_another_layout_is_an_error() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=4)
    with pytest.raises(SpecError, match=r"dp 8 \(log\) vs 4, tp 2 \(log\) vs 4 \(predicted\)"):
        compare(est, parse_text(SIZES + megatron_log(est)))
    same = make_estimate("llama3-8b", 16, 4096, 64, tp=2)
    assert compare(same, parse_text(SIZES + megatron_log(same))).iterations > 0


def test_tune_reads_the_run_from_the_argument_dump(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--log", str(DUMP), "--gpu", "h100-80gb", "--no-search", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cfg = doc["comparison"]["config"]
    assert doc["comparison"]["metrics"]["step_time_s"]["measured"] == pytest.approx(8.15)
    assert (cfg["tp"], cfg["dp"], cfg["gbs"], cfg["seq_len"]) == (2, 8, 128, 8192)
    assert main(["tune", "--log", str(DUMP), "--no-search"]) == 1
    assert "also give --gpu" in capsys.readouterr().err


def test_without_a_dump_or_flags_tune_asks_for_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text(" iteration 10/100 | elapsed time per iteration (ms): 100.0 |\n", encoding="utf-8")
    assert main(["tune", "--log", str(log), "--gpu", "h100-80gb"]) == 1
    assert "the log has no Megatron argument dump" in capsys.readouterr().err


def test_layout_flags_next_to_an_argument_dump_are_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--log", str(DUMP), "--gpu", "h100-80gb", "--tp", "4", "--no-search"]) == 1
    assert "drop --tp" in capsys.readouterr().err


def test_the_next_layouts_launch_command_runs_with_the_log_as_model(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import shlex

    assert main(["tune", "--log", str(DUMP), "--gpu", "h100-80gb", "--format", "json"]) == 0
    cmd = shlex.split(json.loads(capsys.readouterr().out)["findings"][-1]["numbers"]["command"])
    assert cmd[:4] == ["paraplan", "launch", "--model", str(DUMP)]
    out = cmd.index("--out")
    cmd[out + 1] = str(tmp_path / "next")
    assert main(cmd[1:]) == 0
    assert "--rotary-base 500000" in (tmp_path / "next" / "megatron_args.sh").read_text(encoding="utf-8")
