"""`check --knob` and `estimate --megatron-args --knob` take paraplan's own knobs (no Megatron flag carries them):
the script read back with the knob it was planned with gives the launch manifest's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.cli import main

JOB = ["-m", "llama3-8b", "-g", "gb200", "-n", "8", "-s", "8192", "--gbs", "64", "--precision", "fp4"]


def _launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, dict[str, float]]:
    plan = tmp_path / "plan.json"
    assert main(["plan", *JOB, "--knob", "nvfp4-quantize-kernel=split", "--save", str(plan)]) == 0
    out = tmp_path / "L"
    assert main(["launch", "--plan", str(plan), "--rank", "1", "--target", "all", "--out", str(out)]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    est = manifest["prediction"]
    return out / "job.sbatch", {"step_s": est["time"]["step_s"], "mfu": est["throughput"]["mfu"]}


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    est = doc["estimate"]
    return {"step_s": est["time"]["step_s"], "mfu": est["throughput"]["mfu"]}


def test_check_with_the_planned_knob_gives_the_manifest_numbers(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    script, manifest = _launch(tmp_path, capsys)
    plain = _check(["check", str(script), "-g", "gb200"], capsys)
    knob = _check(["check", str(script), "-g", "gb200", "--knob", "nvfp4-quantize-kernel=split"], capsys)
    assert knob == pytest.approx(manifest, rel=1e-9)
    assert plain["step_s"] < knob["step_s"]  # TE <= 2.13's split cast moves 2 B more per element


def test_megatron_args_take_the_own_knob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script, manifest = _launch(tmp_path, capsys)
    args = (script.parent / "megatron_args.sh").resolve()
    base = ["estimate", "--megatron-args", f"@{args}", "-g", "gb200", "-n", "8"]
    assert main([*base, "--knob", "nvfp4-quantize-kernel=split", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["time"]["step_s"] == pytest.approx(manifest["step_s"], rel=1e-9)


@pytest.mark.parametrize("knob", ["recompute-granularity=full", "fp8-param-gather", ""])
def test_a_megatron_flag_as_knob_beside_a_script_is_refused_in_one_line(
        knob: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script, _ = _launch(tmp_path, capsys)
    assert main(["check", str(script), "-g", "gb200", "--knob", knob]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: --knob: beside a script only paraplan's own knobs are taken "
                          "(attention-kernel, nvfp4-quantize-kernel)")


def test_the_own_knob_is_validated_against_the_scripts_precision(capsys: pytest.CaptureFixture[str]) -> None:
    fixture = Path(__file__).resolve().parents[1] / "launch" / "fixtures" / "train_llama3_8b_h100_fp8.sh"
    assert main(["check", str(fixture), "-g", "h100-80gb", "--knob", "nvfp4-quantize-kernel=split"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: nvfp4_quantize_kernel (--knob nvfp4-quantize-kernel) split needs precision fp4")
    assert err.rstrip().endswith("got precision fp8")


@pytest.mark.parametrize(("alias", "derived"), [("llama3.1-405b-b200-bf16-128", True),
                                                ("llama3-70b-gb300-bf16-32", True),
                                                ("llama3-70b-gb300-bf16-64", False)])
def test_estimate_recipe_says_when_nvidia_derived_it_without_a_published_run(
        alias: str, derived: bool, capsys: pytest.CaptureFixture[str]) -> None:
    main(["estimate", "--recipe", alias, "--format", "json"])
    notes = json.loads(capsys.readouterr().out)["notes"]
    said = [n for n in notes if n.startswith(f"recipe {alias} is derived by NVIDIA by weak scaling, no published run")]
    assert len(said) == int(derived)
