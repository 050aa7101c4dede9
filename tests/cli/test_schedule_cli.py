"""``plan --schedule``: the search, plan.json, launch and explain carry the schedule; what-ifs say
"not in Megatron-LM" everywhere and launch refuses them in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import LayoutError
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.serialize import load_plan
from paraplan.specs.load import load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec

MOE = ["plan", "-m", "mixtral-8x7b", "-g", "h100-80gb", "-n", "64", "-s", "4096", "--gbs", "256", "-k", "2"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_what_if_schedule_is_flagged_in_every_candidate_and_the_notes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*MOE, "--schedule", "zb-h1", "-f", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    for cand in doc["candidates"]:
        assert cand["config"]["schedule"] == "zb-h1" and cand["config"]["vp"] == 1
        assert "not in Megatron-LM" in cand["config"]["schedule_note"]
    assert any("not in Megatron-LM" in n for n in doc["notes"])


def test_table_output_names_the_what_if(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*MOE, "--schedule", "dualpipe-v"], capsys)
    assert code == 0
    assert "dualpipe-v" in out and "not in Megatron-LM" in " ".join(out.split())


def test_megatron_default_writes_no_schedule_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*MOE, "-f", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert all("schedule" not in c["config"] for c in doc["candidates"])
    assert not any("Megatron-LM" in n for n in doc["notes"])


def test_unknown_schedule_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*MOE, "--schedule", "zb-h2"], capsys)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--schedule" in lines[0] and "dualpipe-v" in lines[0]


def test_plan_json_carries_the_schedule_and_launch_refuses_a_what_if(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.json"
    assert run([*MOE, "--schedule", "zb-h1", "--save", str(saved)], capsys)[0] == 0
    loaded = load_plan(saved)
    assert loaded.layouts[0].schedule == "zb-h1"
    assert loaded.document["search_space"]["schedule"] == "zb-h1"
    code, _, err = run(["launch", "--plan", str(saved), "--out", str(tmp_path / "run")], capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "not in Megatron-LM" in lines[0] and "zb-h1" in lines[0]
    assert not (tmp_path / "run").exists()


def test_default_plan_json_has_no_schedule_in_its_search_space(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.json"
    assert run([*MOE, "--save", str(saved)], capsys)[0] == 0
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert "schedule" not in doc["search_space"]
    assert load_plan(saved).layouts[0].schedule == ""


def test_combined_1f1b_writes_megatrons_flags_and_reads_back() -> None:
    model = load_model("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    lay = ParallelLayout(pp=2, vp=2, ep=8, dp=32, schedule="combined_1f1b")
    words = argv(megatron_args(model, lay, training))
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" not in words
    assert read_flags(words).layout_fields["schedule"] == "combined_1f1b"
    delayed = argv(megatron_args(model, lay, replace(training, delay_wgrad_compute=True)))  # the knob, as modelled
    assert "--overlap-moe-expert-parallel-comm" in delayed and "--delay-wgrad-compute" in delayed
    assert read_flags(delayed).training_fields["delay_wgrad_compute"] is True
    plain = argv(megatron_args(model, ParallelLayout(pp=2, vp=2, ep=8, dp=32), training))
    assert "--overlap-moe-expert-parallel-comm" not in plain


@pytest.mark.parametrize("name", ["zb-h1", "dualpipe-v"])
def test_megatron_args_refuse_a_what_if(name: str) -> None:
    model = load_model("llama3-8b")
    with pytest.raises(LayoutError) as err:
        megatron_args(model, ParallelLayout(pp=2, dp=4, schedule=name),
                      TrainingSpec(seq_len=4096, global_batch_size=64))
    assert err.value.reason == "SCHEDULE_NOT_IN_MEGATRON" and "not in Megatron-LM" in str(err.value)


def test_explain_says_what_the_what_if_schedules_would_gain(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "-m", "llama3-70b", "-g", "h100-80gb", "-n", "64", "-s", "8192", "--gbs", "512",
                        "--pp", "4,8", "-k", "1", "--explain", "-f", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    found = {f["code"]: f for f in doc["explanation"]}
    what_if = found["SCHEDULE_WHAT_IF"]
    assert "not in Megatron-LM" in what_if["text"]
    assert set(what_if["numbers"]) == {"zb-h1", "dualpipe-v"}
    cfg = doc["candidates"][0]["config"]
    p, m = cfg["pp"], cfg["num_microbatches"]
    # the same layout with ZB-H1 (VP 1): bubble (p - 1) / (3 m), Qi et al. 2024
    assert what_if["numbers"]["zb-h1"]["bubble_frac"] == pytest.approx((p - 1) / (3 * m), rel=1e-12)
    assert what_if["numbers"]["dualpipe-v"]["bubble_frac"] == pytest.approx((p - 1) / (3 * m), rel=1e-12)


def test_combined_1f1b_on_a_dense_model_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "64",
                          "--schedule", "combined_1f1b"], capsys)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--schedule combined_1f1b" in lines[0] and "expert" in lines[0]
