"""Output files (plan --save, report -o, calibrate --out, budget --html): nothing is replaced without --force,
nothing that is not a regular file is ever replaced, and every refusal is one line naming the option."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

import paraplan.cli.budget
import paraplan.cli.calibrate
from paraplan import fileio
from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.fileio import check_output_file, write_text_atomic

PLAN = ["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--top", "1",
        "--tp", "1,2", "--pp", "1"]
BUDGET = ["budget", "--model", "llama3-8b", "--tokens", "2T", "--gpu", "h100-80gb", "--max-gpus", "64"]
COMMANDS = {
    "plan --save": (lambda p: [*PLAN, "--save", str(p)], "--save"),
    "report -o": (lambda p: ["report", *PLAN[1:], "-o", str(p)], "--output"),
    "calibrate --out": (lambda p: ["calibrate", "--runs", str(p.parent / "runs.csv"), "--gpu", "h100-80gb",
                                   "--out", str(p)], "--out"),
    "budget --html": (lambda p: [*BUDGET, "--html", str(p)], "--html"),
}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def unix_socket(tmp_path: Path) -> Path:
    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_existing_file_is_kept_without_force(command: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    make, option = COMMANDS[command]
    target = tmp_path / "existing.out"
    target.write_text("mine\n", encoding="utf-8")
    code, out, err = run(make(target), capsys)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [f"error: {option} {target}: exists (use --force to replace it)"]
    assert target.read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["fifo", "socket", "symlink to a fifo", "dangling symlink", "directory"])
def test_non_regular_targets_are_refused_even_with_force(command: str, kind: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    make, option = COMMANDS[command]
    if kind == "fifo":
        target = fifo(tmp_path)
    elif kind == "socket":
        target = unix_socket(tmp_path)
    elif kind == "directory":
        target = tmp_path / "dir"
        target.mkdir()
    else:
        target = tmp_path / "link"
        target.symlink_to(fifo(tmp_path) if kind == "symlink to a fifo" else tmp_path / "nothing")
    before = os.lstat(target)
    code, out, err = run([*make(target), "--force"], capsys)
    assert code == 1 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {option} {target}: ")
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


def test_a_character_device_is_never_replaced(tmp_path: Path) -> None:
    if not os.path.exists("/dev/null") or not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("no /dev/null character device")
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    for path in ("/dev/null", link):  # only the check runs: nothing is written either way
        with pytest.raises(SpecError, match=r"is a character device, not a regular file; refusing to replace it$"):
            check_output_file(path, "--output", force=True)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_name_too_long_is_one_line(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make, option = COMMANDS[command]
    code, _, err = run(make(tmp_path / ("x" * 300)), capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {option} {tmp_path}/") and "name too long" in err


def test_plan_save_replaces_only_with_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "plan.json"
    target.write_text("{}\n", encoding="utf-8")
    code, _, err = run([*PLAN, "--save", str(target), "--force"], capsys)
    assert code == 0, err
    assert '"tool": "paraplan"' in target.read_text(encoding="utf-8")


def test_force_writes_through_a_symlink_to_a_regular_file(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_text_atomic(link, "new\n", force=True)
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_file_created_after_the_check_is_still_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.html"
    checked = fileio.check_output_file

    def check_then_someone_writes(path: str | Path, option: str = "output", *, force: bool = False) -> Path:
        result = checked(path, option, force=force)
        if not target.exists():
            target.write_text("theirs\n", encoding="utf-8")
        return result

    monkeypatch.setattr(fileio, "check_output_file", check_then_someone_writes)
    with pytest.raises(SpecError, match=r"^--output .*out\.html: exists \(use --force to replace it\)$"):
        write_text_atomic(target, "mine\n", option="--output")
    assert target.read_text(encoding="utf-8") == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html"]  # no temp file left


def test_budget_html_is_the_same_bytes_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a.html", tmp_path / "b.html"
    assert run([*BUDGET, "--html", str(first)], capsys)[0] == 0
    assert run([*BUDGET, "--html", str(second)], capsys)[0] == 0
    assert first.read_bytes() == second.read_bytes()
    assert f'id="{paraplan.cli.budget.BUDGET_DIV_ID}"' in first.read_text(encoding="utf-8")
    code, _, err = run([*BUDGET, "--html", str(first), "--force"], capsys)
    assert code == 0, err
    assert first.read_bytes() == second.read_bytes()


def test_calibrate_profile_keeps_any_source_text_as_one_yaml_string(tmp_path: Path) -> None:
    import yaml

    from paraplan.calibrate import fit_profile, write_profile
    from paraplan.specs.load import load_gpu
    from tests.tune.helpers import synthetic_runs

    source = "x\n---\nkind: Pod\nmetadata: {name: evil}\n\x7f\x85\u2028 # c: d"
    out = tmp_path / "profile.yaml"
    write_profile(out, fit_profile(synthetic_runs("h100-80gb")[:4], load_gpu("h100-80gb")), source)
    docs = list(yaml.safe_load_all(out.read_text(encoding="utf-8")))
    assert len(docs) == 1 and docs[0]["source"] == source
