"""Writing launch files: all or nothing, never overwriting without --force."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.launch.render import render_files, write_files

from .cases import llama70b_spec


def files() -> dict[str, str]:
    return render_files(llama70b_spec(), ["all"])


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_creates_the_directory_and_marks_scripts_executable(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    paths = write_files(files(), out)
    assert sorted(p.name for p in out.iterdir()) == sorted(files())
    assert [p.name for p in paths] == list(files())
    assert (out / "torchrun.sh").stat().st_mode & 0o111 and (out / "job.sbatch").stat().st_mode & 0o111
    assert not (out / "env.sh").stat().st_mode & 0o111
    assert leftovers(out.parent) == []


def test_existing_file_without_force_names_it_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.sbatch").write_text("mine\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"job\.sbatch exists \(use --force"):
        write_files(files(), out)
    assert [p.name for p in out.iterdir()] == ["job.sbatch"]
    assert (out / "job.sbatch").read_text(encoding="utf-8") == "mine\n"
    assert leftovers(tmp_path) == []


def test_force_overwrites_and_keeps_other_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.sbatch").write_text("mine\n", encoding="utf-8")
    (out / "notes.txt").write_text("keep\n", encoding="utf-8")
    write_files(files(), out, force=True)
    assert (out / "job.sbatch").read_text(encoding="utf-8") == files()["job.sbatch"]
    assert (out / "notes.txt").read_text(encoding="utf-8") == "keep\n"


def test_failure_while_writing_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    calls = {"n": 0}
    original = Path.write_text

    def failing_write_text(self: Path, *args: object, **kwargs: object) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", failing_write_text)
    with pytest.raises(SpecError, match=r"No space left.*nothing was written"):
        write_files(files(), out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x", encoding="utf-8")
    with pytest.raises(SpecError, match="is not a directory"):
        write_files(files(), target)


def test_force_with_a_narrower_target_removes_the_earlier_launch_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_files(files(), out)
    (out / "notes.txt").write_text("keep\n", encoding="utf-8")
    slurm_only = render_files(llama70b_spec(), ["slurm"])
    write_files(slurm_only, out, force=True)
    # torchrun.sh and pytorchjob.yaml of the earlier launch would run against the new arguments
    assert sorted(p.name for p in out.iterdir()) == sorted([*slurm_only, "notes.txt"])
    assert leftovers(tmp_path) == []


def test_a_directory_in_the_way_is_refused_before_anything_moves(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_files(files(), out)
    before = {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}
    (out / "pytorchjob.yaml").unlink()
    (out / "pytorchjob.yaml").mkdir()
    with pytest.raises(SpecError, match=r"pytorchjob\.yaml exists and is not a regular file"):
        write_files(files(), out, force=True)
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir() if p.is_file()} == \
        {k: v for k, v in before.items() if k != "pytorchjob.yaml"}
    assert leftovers(tmp_path) == []


def test_a_failed_move_puts_the_old_files_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    out = tmp_path / "out"
    out.mkdir()
    old = {name: f"old {name}\n" for name in files()}
    for name, text in old.items():
        (out / name).write_text(text, encoding="utf-8")
    calls = {"n": 0}
    original = os.replace

    def failing_replace(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] == len(old) + 3:  # all old files moved aside, 2 new ones moved in
            raise OSError(13, "Permission denied", str(dst))
        original(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(SpecError, match="nothing was changed"):
        write_files(files(), out, force=True)
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()} == old
    assert leftovers(tmp_path) == []
