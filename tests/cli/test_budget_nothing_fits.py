"""budget: when no count fits, the recommendation line says why (the table's notes column may be off-screen)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from paraplan.cli import app


def _recommendation(args: list[str]) -> dict[str, object]:
    res = CliRunner().invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.stdout
    rec: dict[str, object] = json.loads(res.stdout)["recommendation"]
    assert rec["overall"] is None
    return rec


def test_nothing_fits_names_the_reason_in_json_and_table() -> None:
    args = ["budget", "--model", "llama3-8b", "--tokens", "1T", "--gpus", "70000", "--gpu", "h100-80gb"]
    note = str(_recommendation(args)["note"])
    assert note.startswith("nothing fits: h100-80gb at 70,000 GPUs: GBS 1024 cannot be split")
    assert "--max-gpus" not in note  # the batch, not memory, is the cause
    table = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert "cannot be split" in " ".join(table.stdout.split())


def test_out_of_memory_names_each_gpu_at_its_largest_count() -> None:
    args = ["budget", "--model", "deepseek-v3", "--tokens", "1e12", "--max-gpus", "16", "--gpu", "h100-80gb,b200"]
    note = str(_recommendation(args)["note"])
    assert "on 16 x h100-80gb" in note and "on 16 x b200" in note and "on 8 x" not in note
    assert note.count("out of memory") == 2
    assert note.endswith("more GPUs may fit (--max-gpus)")


def test_out_of_memory_inside_the_margin_names_the_headroom_as_typed() -> None:
    args = ["budget", "--model", "llama3-8b", "--tokens", "1e9", "--gpus", "8", "--gpu", "h100-80gb",
            "--headroom", "70GiB"]
    assert "less the margin 70.0 GiB (--headroom 70GiB); " in str(_recommendation(args)["note"])
