"""``--knob NAME=a,b``: a list only where Megatron's flag takes one (nargs + or *); otherwise one line naming
--knob, not the first value kept and the rest dropped."""

from __future__ import annotations

import pytest

from paraplan.cli import main

JOB = ["estimate", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--tp", "1",
       "--format", "json"]


@pytest.mark.parametrize("knob", ["moe-token-dispatcher-type=flex,moe-flex-dispatcher-backend=hybridep",
                                  "moe-token-dispatcher-type=flex,hybridep",
                                  "moe-token-dispatcher-type=flex,garbage=1"])
def test_a_second_value_of_a_one_value_knob_is_refused(knob: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*JOB, "--knob", knob])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("error: --knob moe-token-dispatcher-type takes one value, got 2") and err.count("\n") == 1


def test_a_list_knob_keeps_its_list(capsys: pytest.CaptureFixture[str]) -> None:
    """cuda-graph-modules takes a list (nargs +): both modules are kept."""
    import json

    code = main([*JOB, "--knob", "cuda-graph-impl=transformer_engine", "--knob", "cuda-graph-modules=attn,mlp"])
    out, _ = capsys.readouterr()
    assert code in (0, 4)  # 4: does not fit, the JSON still written
    assert json.loads(out)["config"]["memory_knobs"]["cuda_graph_modules"] == ["attn", "mlp"]


def test_cuda_graph_modules_without_an_impl_is_said_to_do_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron ignores --cuda-graph-modules under --cuda-graph-impl none (its default): a note, and the estimate."""
    code = main([*JOB, "--knob", "cuda-graph-modules=attn,moe_router"])
    out, err = capsys.readouterr()
    assert code == 0 and out
    assert err == "note: --knob cuda-graph-modules has no effect without --cuda-graph-impl\n"
