"""plan and explain declare their shared flags once (PLAN_OPTIONS, one field of PlanRequest each); report builds
the same request by keyword."""

from __future__ import annotations

import inspect
from dataclasses import fields

from paraplan.cli.plan import PLAN_OPTIONS, PlanRequest, explain_cmd, plan_cmd


def test_plan_options_are_the_request_fields() -> None:
    assert [name for name, _, _ in PLAN_OPTIONS] == [f.name for f in fields(PlanRequest)]


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
