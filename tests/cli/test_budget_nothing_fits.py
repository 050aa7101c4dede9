"""budget: when no count fits, the recommendation line says why (the table's notes column may be off-screen)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from paraplan.cli import app


def test_nothing_fits_names_the_reason_in_json_and_table() -> None:
    args = ["budget", "--model", "llama3-8b", "--tokens", "1T", "--gpus", "70000", "--gpu", "h100-80gb"]
    res = CliRunner().invoke(app, [*args, "--format", "json"])
    rec = json.loads(res.stdout)["recommendation"]
    assert rec["overall"] is None
    assert rec["note"].startswith("nothing fits: h100-80gb x 70,000: GBS 1024 cannot be split")
    table = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert "cannot be split" in " ".join(table.stdout.split())
