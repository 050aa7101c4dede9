"""``paraplan report`` in-process: plan flags or plan.json, --log (with `paraplan tune`'s diagnosis), one-line
errors, the progress bar."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from markupsafe import escape
from rich.console import Console

import paraplan.cli.report as report_cli
from paraplan.cli import main
from tests.report.conftest import LOG_PATH

FLAGS = ["-m", "llama3-8b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "256"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_report_from_plan_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    code, stdout, err = run(["report", *FLAGS, "--pp", "2,4", "--top", "2", "--log", str(LOG_PATH), "-o", str(out)],
                            capsys)
    assert code == 0, err
    html = out.read_text(encoding="utf-8")
    for chart_id in ("chart-landscape", "chart-memory", "chart-time", "chart-schedule-0", "chart-measured"):
        assert f'id="{chart_id}"' in html
    assert "wrote" in stdout and "2 top layouts" in stdout and "predicted vs measured" in stdout
    assert "diagnosis finding(s)" in stdout
    assert '<code class="tag">NEXT_LAYOUT</code>' in html
    assert "Launch: paraplan launch --model llama3-8b --gpu h100-80gb --num-gpus 16" in html
    assert err == ""  # stderr is not a terminal: no progress bar
    assert not list(tmp_path.glob(".*.tmp"))


def test_report_from_plan_json_keeps_its_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.json"
    code, _, err = run(["plan", *FLAGS, "--top", "3", "--save", str(saved), "--format", "json"], capsys)
    assert code == 0, err
    out = tmp_path / "r.html"
    code, stdout, err = run(["report", "--plan", str(saved), "-o", str(out)], capsys)
    assert code == 0, err
    from paraplan.serialize import load_plan

    html = out.read_text(encoding="utf-8")
    for i, lay in enumerate(load_plan(saved).layouts):
        assert f"#{i + 1} {lay.short()}" in html
    assert "3 top layouts" in stdout


def test_report_diagnosis_matches_paraplan_tune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.json"
    code, _, err = run(["plan", *FLAGS, "--pp", "2,4", "--top", "3", "--save", str(saved), "--format", "json"], capsys)
    assert code == 0, err
    code, stdout, err = run(["tune", "--plan", str(saved), "--rank", "2", "--log", str(LOG_PATH), "--format", "json"],
                            capsys)
    assert code == 0, err
    findings = json.loads(stdout)["findings"]
    out = tmp_path / "r.html"
    code, _, err = run(["report", "--plan", str(saved), "--rank", "2", "--log", str(LOG_PATH), "-o", str(out)],
                       capsys)
    assert code == 0, err
    html = out.read_text(encoding="utf-8")
    section = html[html.index('<section id="diagnosis">'):html.index('<section id="findings">')]
    items = re.findall(r'<li><code class="tag">([A-Z_]+)</code>(.*?)</li>', section, re.S)
    assert items == [(f["code"], str(escape(f["text"]))) for f in findings]
    assert findings[-1]["code"] == "NEXT_LAYOUT" and "--model llama3-8b --gpu h100-80gb" in findings[-1]["text"]
    from paraplan.serialize import load_plan

    assert f"Compared layout #2 {load_plan(saved).layouts[1].short()}" in section


@pytest.mark.parametrize("log", [[], ["--log", str(LOG_PATH)]])
def test_same_inputs_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], log: list[str]) -> None:
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert run(["report", *FLAGS, "--top", "2", *log, "-o", str(a)], capsys)[0] == 0
    assert run(["report", *FLAGS, "--top", "2", *log, "-o", str(b)], capsys)[0] == 0
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "x.html"], "give --plan plan.json, or the plan flags (missing --model"),
    (["--plan", "p.json", "-m", "llama3-8b", "-o", "x.html"], "--plan already holds the resolved inputs"),
    (["--plan", "missing.json", "-o", "x.html"], "not found"),
    ([*FLAGS, "--top", "0", "-o", "x.html"], "--top must be in [1, 100], got 0"),
    ([*FLAGS, "--log", "missing.log", "-o", "x.html"], "missing.log"),
])
def test_bad_input_is_one_line_and_exit_1(args: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["report", *args], capsys)
    assert code == 1
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x.html").exists()


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["report", "--help"], capsys)
    assert code == 0 and "Example: paraplan report" in out


def test_progress_shows_only_when_the_work_takes_a_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(report_cli, "Console", lambda stderr: Console(file=buf, force_terminal=True, width=80))
    with report_cli.progress(2, delay_s=10.0) as step:
        step("quick")
    assert buf.getvalue() == ""
    with report_cli.progress(2, delay_s=0.0) as step:
        step("searching layouts")
        time.sleep(0.3)
        step("writing")
    assert "searching layouts" in buf.getvalue() or "writing" in buf.getvalue()


def test_report_from_a_plan_file_reruns_the_plans_own_search(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan_json, html = tmp_path / "plan.json", tmp_path / "r.html"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096",
                 "--gbs", "64", "--tp", "2", "--pp", "1", "--mbs", "1", "--save", str(plan_json),
                 "--format", "json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)["num_evaluated"]
    assert json.loads(plan_json.read_text())["search_space"]["tp"] == [2]
    assert main(["report", "--plan", str(plan_json), "-o", str(html)]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert f"({evaluated} evaluated)" in out  # the restricted search, not the whole space
