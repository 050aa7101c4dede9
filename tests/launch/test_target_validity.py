"""Each launch target carries only what it accepts: TE's fused cross entropy (``--cross-entropy-fusion-impl te``) is
refused by Megatron-LM's validate_args and run by Megatron-Bridge's perf recipes. ``--target bridge`` writes no
Megatron-LM argument line into manifest.json; ``--target all`` writes the targets that are valid (Bridge) and names
the others with the reason, or, when none is, refuses in one line before writing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.launch.render import TARGETS, render_files

from .matrix import plan_spec

TE_CE = ["--knob", "cross-entropy-loss-fusion", "--knob", "cross-entropy-fusion-impl=te"]
JOB = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "64", "--tp", "2"]


def _manifest(out: Path) -> dict[str, object]:
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_bridge_alone_carries_no_megatron_lm_argument_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", *JOB, *TE_CE, "--target", "bridge", "--out", str(tmp_path / "b")]) == 0
    doc = _manifest(tmp_path / "b")
    assert doc["targets"] == ["bridge"] and "megatron_args" not in doc
    assert "--cross-entropy-fusion-impl" not in json.dumps(doc)  # nowhere in the manifest
    items = (tmp_path / "b" / "bridge_overrides.txt").read_text(encoding="utf-8").splitlines()
    assert 'model.cross_entropy_fusion_impl="te"' in items and "model.cross_entropy_loss_fusion=true" in items


def test_a_megatron_lm_target_still_carries_its_argument_line() -> None:
    for targets in (["megatron"], ["bridge", "slurm"], ["all"]):
        doc = json.loads(render_files(plan_spec("llama3-8b-dp8"), targets)["manifest.json"])
        assert doc["megatron_args"][:2] == ["--tensor-model-parallel-size", "1"], targets


def test_all_writes_the_valid_target_and_names_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "all"
    assert main(["launch", *JOB, *TE_CE, "--target", "all", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["bridge_overrides.txt", "bridge_recipe.py", "manifest.json"]
    doc = _manifest(out)
    assert doc["targets"] == ["bridge"] and "megatron_args" not in doc
    assert doc["files"] == ["bridge_recipe.py", "bridge_overrides.txt", "manifest.json"]
    skipped = doc["skipped_targets"]
    assert isinstance(skipped, dict) and set(skipped) == set(TARGETS) - {"bridge"}
    assert all("disabled due to stability issues" in why for why in skipped.values())
    notes = [line for line in stdout.splitlines() if line.startswith("note: ") and "not written" in line]
    assert notes == [f"note: {', '.join(t for t in TARGETS if t != 'bridge')} not written: {skipped['megatron']}"]


def test_all_refuses_in_one_line_when_no_target_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral has no Bridge recipe, and the Megatron-LM targets refuse TE's fused cross entropy: nothing written."""
    out = tmp_path / "none"
    job = ["--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "64",
           "--ep", "8"]
    assert main(["launch", *job, *TE_CE, "--target", "all", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no target can be written" in err and "no recipe for model 'mixtral-8x7b'" in err
    assert "disabled due to stability issues" in err
    assert not out.exists()
    out.mkdir()  # an existing directory is left as it was
    (out / "keep.txt").write_text("x", encoding="utf-8")
    assert main(["launch", *job, *TE_CE, "--target", "all", "--out", str(out)]) == 1
    capsys.readouterr()
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
