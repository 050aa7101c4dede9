"""A new user's slips, as one line and exit 1: an empty name (an unset shell variable) is refused as empty instead of
being read as the current folder or silently taken as "not given"; an empty or gappy list flag does not search
every value; ``--top`` is bounded; a failing command leaves no output file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.cli.plan import MAX_TOP

JOB = ["-n", "8", "-s", "4096", "--gbs", "64"]
EST = ["estimate", "-m", "llama3-8b", "-g", "h100-80gb", *JOB]
PLAN = ["plan", "-m", "llama3-8b", "-g", "h100-80gb", *JOB]
FIXTURES = Path(__file__).resolve().parents[1] / "launch" / "fixtures"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "message"), [
    (["estimate", "-m", "", "-g", "h100-80gb", *JOB], "error: model: empty (give a preset, e.g. llama3-8b, or a file)"),
    (["plan", "-m", "llama3-8b", "-g", "", *JOB], "error: gpu: empty (give a preset, e.g. h100-80gb, or a file)"),
    (["check", "", "-g", "h100-80gb"], "error: script: an empty file name (give a file)"),
    (["ingest", ""], "error: an empty log file name (give a log file or a TensorBoard directory)"),
    (["tune", "--log", "", "-g", "h100-80gb"], "error: an empty log file name"),
    ([*EST, "--profile", ""], "error: profile: an empty file name (give a file)"),
    (["recipes", "--recipes", ""], "error: --recipes: an empty file name (give a CSV or YAML file)"),
    ([*PLAN, "--site", ""], "error: site: an empty file name (give a file)"),
    (["estimate", "--megatron-args", "", "-g", "h100-80gb"], "error: --megatron-args: empty (give a pretrain_gpt.py"),
    (["calibrate", "--runs", "", "-g", "h100-80gb", "-o", "p.yaml"], "error: runs: an empty file name (give a file)"),
    ([*PLAN, "--tp", ""], "error: --tp: empty (give comma-separated positive integers, e.g. 1,2,4; leave the flag out"),
    ([*PLAN, "--mbs", " "], "error: --mbs: empty (give comma-separated positive integers"),
    ([*PLAN, "--pp", "1,,2"], "error: --pp: expected comma-separated positive integers, got '1,,2'"),
    ([*PLAN, "--top", str(MAX_TOP + 1)], f"error: --top must be in [1, {MAX_TOP}], got {MAX_TOP + 1}"),
    (["explain", "-m", "llama3-8b", "-g", "h100-80gb", *JOB, "--top", "99999999999"],
     f"error: --top must be in [1, {MAX_TOP}], got 99,999,999,999"),
])
def test_a_slip_is_one_line_and_exit_1(args: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty name must not read the current folder
    code, out, err = _run(args, capsys)
    assert code == 1 and out == "" and err.startswith(message) and err.count("\n") == 1, err
    assert "Traceback" not in err and "'.'" not in err
    assert os.listdir(tmp_path) == []  # nothing written (calibrate's p.yaml, a report)


@pytest.mark.parametrize("args", [
    ["report", "-m", "llama3-8b", "-g", "h100-80gb", *JOB, "-o", ""],
    ["report", "--plan", "", "-o", "r.html"],
    ["report", "-m", "llama3-8b", "-g", "h100-80gb", *JOB, "-o", "r.html", "--log", ""],
    ["report", "-m", "llama3-8b", "-g", "h100-80gb", *JOB, "-o", "r.html", "--top", "1000"],
])
def test_report_refuses_empty_names_and_a_huge_top_without_writing(args: list[str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(args, capsys)
    assert code == 1 and err.count("\n") == 1 and ("empty" in err or "--top must be" in err), err
    assert os.listdir(tmp_path) == []


def test_a_top_in_range_still_lists_that_many(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*PLAN, "--top", "12", "--format", "csv"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 1 + 12


def test_calibrate_writes_no_profile_when_its_cross_validation_is_refused(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """One run cannot be cross-validated: exit 1, and the profile is not written (it was, before the error)."""
    runs = tmp_path / "runs.csv"
    runs.write_text("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,8,1,1,1,64,4096,3.2\n",
                    encoding="utf-8")
    out = tmp_path / "p.yaml"
    code, _, err = _run(["calibrate", "--runs", str(runs), "-g", "h100-80gb", "-o", str(out), "--cross-validate"],
                        capsys)
    assert code == 1 and err.strip() == "error: --cross-validate needs at least 2 runs"
    assert not out.exists()
    code, _, _ = _run(["calibrate", "--runs", str(runs), "-g", "h100-80gb", "-o", str(out)], capsys)
    assert code == 0 and out.exists()  # without the refused option the same runs write it


def test_an_empty_check_script_name_is_not_the_current_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With a script in the current folder, "" still names no file (it used to be read as '.', a directory)."""
    (tmp_path / "train.sh").write_text((FIXTURES / "train_llama3_8b_h100_fp8.sh").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["check", "", "-g", "h100-80gb"], capsys)
    assert code == 1 and err.strip() == "error: script: an empty file name (give a file)"
    assert _run(["check", "train.sh", "-g", "b200"], capsys)[0] == 0


@pytest.mark.parametrize("override", ["hbm_gib=1", "reserved_gib=100", "hbm_gib=1.5"])
def test_a_gpu_with_no_usable_memory_is_refused(override: str, capsys: pytest.CaptureFixture[str]) -> None:
    """HBM at or below the reserved memory leaves nothing to the allocator: one line naming both keys (it was a
    search against -0.5 GiB usable)."""
    code, _, err = _run([*PLAN, "--gpu-set", override], capsys)
    assert code == 1 and err.count("\n") == 1
    assert "reserved_gib (" in err and ") must be less than hbm_gib (" in err and "no usable memory" in err
