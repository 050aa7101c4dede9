"""A site profile's env that sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (env.sh and the pod export it
to the job) is the allocator plan and launch estimate with, as ``check`` does for a script's env: no fragmentation
allowance (``estimate.memory.EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC``), an explicit ``--fragmentation`` winning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan.cli.launch
import paraplan.cli.plan  # noqa: F401  (register the commands)
from paraplan.cli import main
from paraplan.estimate.memory import EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC

PLAN = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096", "--gbs", "128",
        "--top", "1", "--format", "json"]


def _site(tmp_path: Path, conf: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(f'env:\n  PYTORCH_CUDA_ALLOC_CONF: "{conf}"\n', encoding="utf-8")
    return str(path)


def _peak(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[float, str]:
    assert main(["plan", *PLAN, *args]) == 0
    got = capsys.readouterr()
    return float(json.loads(got.out)["candidates"][0]["memory"]["peak_bytes"]), got.err


def test_plan_applies_the_site_allocator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC == 0.0
    plain, err = _peak(capsys)
    assert "expandable" not in err
    site, err = _peak(capsys, "--site", _site(tmp_path, "garbage_collection_threshold:0.8,expandable_segments:True"))
    assert "PYTORCH_CUDA_ALLOC_CONF" in err and "no fragmentation allowance" in err
    no_frag, _ = _peak(capsys, "--fragmentation", "0")
    assert site < plain and site == no_frag
    off, err = _peak(capsys, "--site", _site(tmp_path, "expandable_segments:True,expandable_segments:False"))
    assert off == plain and "expandable" not in err  # a later pair wins, as PyTorch's parseArgs
    given, _ = _peak(capsys, "--fragmentation", "0.1")
    with_site, err = _peak(capsys, "--fragmentation", "0.1", "--site", _site(tmp_path, "expandable_segments:True"))
    assert with_site == given and "expandable" not in err


def test_a_bad_site_allocator_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *PLAN, "--site", _site(tmp_path, "expandable_segments:yes")]) == 1
    err = capsys.readouterr().err.strip()
    assert "expandable_segments must be True or False" in err and "\n" not in err


def test_launch_applies_the_site_allocator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["launch", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--tp", "2", "--target", "slurm", "--force"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    plain = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert "expandable segments" not in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "b"), "--site", _site(tmp_path, "expandable_segments:True")]) == 0
    assert "expandable segments" in capsys.readouterr().out
    site = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert site["prediction"]["memory"]["peak_bytes"] < plain["prediction"]["memory"]["peak_bytes"]
