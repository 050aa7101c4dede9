"""plan and explain declare their shared flags once (PLAN_OPTIONS, one field of PlanRequest each); report builds
the same request by keyword."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import pytest

from paraplan.cli.plan import PLAN_OPTIONS, PlanRequest, explain_cmd, plan_cmd


def test_plan_options_are_the_request_fields() -> None:
    # --schedule is the one field each command places itself (its --help position differs)
    assert [name for name, _, _ in PLAN_OPTIONS] + ["schedule"] == [f.name for f in fields(PlanRequest)]
    for cmd in (plan_cmd, explain_cmd):
        assert "schedule" in inspect.signature(cmd).parameters


def test_plan_and_explain_share_every_option() -> None:
    shared = [name for name, _, _ in PLAN_OPTIONS]
    for cmd in (plan_cmd, explain_cmd):
        params = list(inspect.signature(cmd).parameters)
        assert params[:len(shared)] == shared
        assert "req" not in params


def test_the_shared_flags_are_the_same_typer_options_in_both() -> None:
    plan_params, explain_params = inspect.signature(plan_cmd).parameters, inspect.signature(explain_cmd).parameters
    for name, _, option in PLAN_OPTIONS:
        assert plan_params[name].default is option and explain_params[name].default is option, name
    assert "explain" in plan_params and "explain" not in explain_params


def test_the_cli_computes_through_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import paraplan.api
    import paraplan.cli.estimate
    import paraplan.cli.launch
    from paraplan.cli import main

    assert paraplan.cli.estimate.run_estimate is paraplan.api.estimate
    assert paraplan.cli.launch.run_estimate is paraplan.api.estimate
    calls: list[dict[str, object]] = []
    real = paraplan.api.plan

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(paraplan.api, "plan", spy)
    assert main(["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--top", "2",
                 "--tp", "1,2", "-f", "json"]) == 0
    assert len(calls) == 1 and calls[0]["top_k"] == 2


def test_an_empty_choice_list_is_refused_not_read_as_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    """`--dp-variant ""` (an empty shell variable) once searched Megatron-FSDP on every layout."""
    from paraplan.cli import main
    code = main(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "8192",
                 "--gbs", "64", "--dp-variant", ""])
    err = capsys.readouterr().err
    assert code == 1 and "--dp-variant: empty (allowed: distopt, fsdp, ddp)" in err


def test_explain_refuses_csv_rather_than_dropping_its_findings(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main
    code = main(["explain", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "8192",
                 "--gbs", "64", "--format", "csv"])
    assert code == 1 and "--format: explain prints table or json" in capsys.readouterr().err
