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
    with pytest.raises(SpecError, match=r"^--out .*job\.sbatch: exists \(use --force to replace it\)$"):
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
    with pytest.raises(SpecError, match=r"^--out .*pytorchjob\.yaml: is a directory"):
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


def _contents(out: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}


def _earlier_launch(tmp_path: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """An --out holding a complete earlier launch (all targets) plus a user file; the new set is slurm only
    (so torchrun.sh and pytorchjob.yaml are stale and must go with the new set)."""
    out = tmp_path / "out"
    earlier = {name: f"old {name}\n" if name != "manifest.json" else text for name, text in files().items()}
    out.mkdir()
    for name, text in earlier.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "notes.txt").write_text("keep\n", encoding="utf-8")
    new = render_files(llama70b_spec(), ["slurm"])
    return out, {**earlier, "notes.txt": "keep\n"}, {**new, "notes.txt": "keep\n"}


SWAP_RENAMES = len(files()) + 4  # every earlier file moved aside, then the 4 new ones moved in


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("step", range(1, SWAP_RENAMES + 1))
def test_an_interrupt_at_any_step_of_the_swap_leaves_the_old_or_the_new_set(
        step: int, when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    out, old_set, new_set = _earlier_launch(tmp_path)
    new_files = {k: v for k, v in new_set.items() if k != "notes.txt"}
    calls = {"n": 0}
    original = os.replace

    def interrupted_replace(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] == step and when == "after":
            original(src, dst)  # type: ignore[arg-type]  # the rename happened, the bookkeeping did not
        if calls["n"] == step:
            raise KeyboardInterrupt
        original(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        write_files(new_files, out, force=True)
    assert _contents(out) in (old_set, new_set)
    assert _contents(out) == old_set  # an interrupt inside the swap undoes it
    assert leftovers(tmp_path) == []


def test_ctrl_c_during_the_swap_is_held_until_the_new_set_is_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    out, _, new_set = _earlier_launch(tmp_path)
    new_files = {k: v for k, v in new_set.items() if k != "notes.txt"}
    calls = {"n": 0}
    original = os.replace

    def replace_then_sigint(src: object, dst: object) -> None:
        calls["n"] += 1
        original(src, dst)  # type: ignore[arg-type]
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_sigint)
    with pytest.raises(KeyboardInterrupt):
        write_files(new_files, out, force=True)
    assert calls["n"] == SWAP_RENAMES  # the swap ran to its end before the interrupt was raised
    assert _contents(out) == new_set
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_when_the_undo_fails_too_the_old_files_are_kept_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    out, old_set, new_set = _earlier_launch(tmp_path)
    new_files = {k: v for k, v in new_set.items() if k != "notes.txt"}
    calls = {"n": 0}
    original = os.replace

    def broken_after_two(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(5, "Input/output error", str(dst))
        original(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", broken_after_two)
    with pytest.raises(SpecError, match=r"could not put the previous files back .*; they are in .*old$") as info:
        write_files(new_files, out, force=True)
    kept = Path(str(info.value).rsplit("they are in ", 1)[1])
    assert {p.name: p.read_text(encoding="utf-8") for p in kept.iterdir()} == \
        {k: old_set[k] for k in list(new_files)[:2]}
