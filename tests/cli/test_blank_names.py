"""A blank name (spaces only: a shell variable that holds a space) is refused as empty, as an empty one is."""

from __future__ import annotations

import pytest

from paraplan.cli import main

JOB = ["-n", "8", "-s", "4096", "--gbs", "64"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["estimate", "--model", " ", "-g", "h100-80gb", *JOB], "error: model: empty"),
    (["estimate", "--model", "", "-g", "h100-80gb", *JOB], "error: model: empty"),
    (["estimate", "--model", "llama3-8b", "-g", "  ", *JOB], "error: gpu: empty"),
    (["estimate", "--recipe", ""], "error: --recipe: empty"),
    (["estimate", "--recipe", " "], "error: --recipe: empty"),
    (["recipes", "--model", ""], "error: --model: empty"),
    (["recipes", "--model", " "], "error: --model: empty"),
    (["recipes", "--gpu", " "], "error: --gpu: empty"),
])
def test_a_blank_name_is_refused_as_empty(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.startswith(expected + " (") and err.count("\n") == 1
