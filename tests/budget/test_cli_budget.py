"""`paraplan budget` in-process: JSON/CSV/table output, the plot, one-line errors naming the flag."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

import paraplan.cli.budget as cli_budget  # registers the command
from paraplan.cli import main

BASE = ["budget", "--model", "llama3-8b", "--tokens", "2T", "--gpu", "h100-80gb,b200", "--max-gpus", "256"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_rows_and_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--days", "30", "--price-per-gpu-hour", "h100-80gb=2.5,b200=4", "-f", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    row = d["rows"][0]
    assert set(row) >= {"gpu", "num_gpus", "config", "tokens_per_s_per_gpu", "days", "gpu_hours", "cost_usd",
                        "meets_deadline"}
    assert row["gpu"] == "h100-80gb" and row["num_gpus"] == 8 and row["config"]["gbs"] == 1024
    assert row["cost_usd"] == pytest.approx(2.5 * row["gpu_hours"] / row["goodput"])
    assert row["effective_days"] == pytest.approx(row["days"] / row["goodput"])
    assert {r["gpu"] for r in d["rows"]} == {"h100-80gb", "b200"}
    rec = d["recommendation"]
    assert rec["basis"] == "cheapest" and set(rec["per_gpu"]) == {"h100-80gb", "b200"}
    assert rec["overall"]["meets_deadline"] is True
    assert d["deadline_days"] == 30 and d["tokens"] == 2e12


def test_fixed_count_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--gpus", "64", "--seq-len", "8192", "--gbs", "256", "-f", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert [(r["gpu"], r["num_gpus"], r["gbs"]) for r in d["rows"]] == [("h100-80gb", 64, 256), ("b200", 64, 256)]
    assert all(r["meets_deadline"] is None and r["cost_usd"] is None for r in d["rows"])
    assert d["recommendation"]["basis"] == "fastest"


def test_csv_has_one_line_per_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--format", "csv", "--price-per-gpu-hour", "3"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(cli_budget.CSV_COLUMNS)
    assert [r["num_gpus"] for r in rows if r["gpu"] == "b200"] == ["8", "16", "32", "64", "128", "256"]
    assert float(rows[0]["cost_usd"]) == pytest.approx(3 * float(rows[0]["gpu_hours"]) / float(rows[0]["goodput"]),
                                                       rel=1e-5)


def test_table_renders_rows_recommendation_and_notes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*BASE, "--days", "60", "--max-gbs", "2048"], capsys)
    assert code == 0 and err == ""  # no progress bar off a terminal
    assert "time and cost to train" in out and "recommendation" in out and "overall (fastest)" in out
    assert "critical batch" in out


def test_html_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "budget.html"
    code, _, _ = run([*BASE, "--gpus-per-node", "h100-80gb=4", "--html", str(path), "-f", "json"], capsys)
    assert code == 0 and "plotly" in path.read_text(encoding="utf-8").lower()


def test_gpus_per_node_override(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--gpus-per-node", "4", "-f", "json"], capsys)
    assert code == 0
    assert json.loads(out)["rows"][0]["num_gpus"] == 4


@pytest.mark.parametrize(("change", "pattern"), [
    (["--tokens", "15Q"], r"--tokens: expected a positive token count"),
    (["--tokens", "-1T"], r"--tokens"),
    (["--price-per-gpu-hour", "v100=2"], r"--price-per-gpu-hour: 'v100' is not one of the GPUs swept"),
    (["--price-per-gpu-hour", "b200=free"], r"--price-per-gpu-hour: expected GPU=USD"),
    (["--days", "0"], r"--days must be > 0"),
    (["--gpus", "0"], r"--gpus must be a positive integer"),
    (["--gbs", "0"], r"--gbs must be a positive integer"),
    (["--gbs", "512", "--max-gbs", "256"], r"--max-gbs \(256\) must be >= --gbs \(512\)"),
    (["--gpus-per-node", "b200=x"], r"--gpus-per-node: expected a positive integer"),
    (["--gpu", "v100"], r"unknown gpu 'v100'"),
    (["--gpu", ","], r"--gpu: expected comma-separated GPU presets"),
    (["--model", "llama9-1t"], r"unknown model preset"),
    (["--days", "soon"], r"days"),
])
def test_bad_input_is_one_line_exit_1(change: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*BASE, *change], capsys)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error:")
    assert re.search(pattern, err), err


def test_moe_note_and_cross_node_ep(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["budget", "--model", "qwen3-30b-a3b", "--tokens", "1T", "--gpu", "h100-80gb", "--gpus", "16", "-f", "json"]
    code, out, _ = run([*args, "--nvlink-only"], capsys)
    assert code == 0 and any("--nvlink-only" in n for n in json.loads(out)["notes"])
    code, out, _ = run(args, capsys)
    d = json.loads(out)
    assert code == 0 and d["rows"][0]["feasible"] and not any("--nvlink-only" in n for n in d["notes"])


def test_unpriced_gpu_and_html_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "b.html"
    assert main(["budget", "--model", "llama3-8b", "--tokens", "1T", "--days", "30", "--gpu", "h100-80gb",
                 "--price-per-gpu-hour", "b200=3", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "no --price-per-gpu-hour for h100-80gb" in out and f"wrote {html}" in out.replace("\n", "")
    assert html.stat().st_size > 0
