"""The flex dispatcher's SM count in the Bridge files (review FIXC 4): the unified
``model.moe_flex_dispatcher_num_sms`` (Megatron-LM TransformerConfig), the deprecated per-backend keys cleared before
it so that a recipe's own value is not routed over the plan's, and Bridge's legacy key for the backend where an older
Megatron-Core lacks the unified field (Bridge training/model_load_save.py ``_normalize_moe_dispatcher_sm_config``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.render import render_files

from .matrix import plan_spec
from .test_bridge import literal_tables

LEGACY = ("moe_deepep_num_sms", "moe_hybridep_num_sms")


def _spec(backend: str, sms: int | None) -> Any:
    spec = plan_spec("deepseek-v3-gb200-fp8")
    return replace(spec, training=replace(spec.training, moe_token_dispatcher_type="flex",
                                          moe_flex_dispatcher_backend=backend, moe_hybridep_num_sms=sms))


def _post_init(model: dict[str, Any]) -> int | None:
    """TransformerConfig.__post_init__ (Megatron-LM d98e8a6): an unset moe_flex_dispatcher_num_sms takes the
    deprecated per-backend value that is set (two different ones are a ValueError)."""
    if model.get("moe_flex_dispatcher_num_sms") is None:
        given = {model[k] for k in LEGACY if model.get(k) is not None}
        assert len(given) <= 1, "Conflicting deprecated SM-count knobs"
        return next(iter(given), None)
    return int(model["moe_flex_dispatcher_num_sms"])


def _apply(overrides_: dict[str, Any], fallback: dict[str, str], model: dict[str, Any], unified: bool) -> None:
    """bridge_recipe.py's ``_set`` on a model config that has the unified field or not (an older Megatron-Core)."""
    for path, value in overrides_.items():
        if not unified and path in fallback and path.split(".")[1] not in model:
            path = fallback[path]
        section, name = path.split(".", 1)
        if section == "model":
            model[name] = value


@pytest.mark.parametrize(("backend", "legacy"), [("deepep", "moe_deepep_num_sms"),
                                                 ("hybridep", "moe_hybridep_num_sms")])
@pytest.mark.parametrize("sms", [24, None])
@pytest.mark.parametrize("recipe_sms", [16, None])
def test_the_plan_sm_count_wins_for_every_backend(backend: str, legacy: str, sms: int | None,
                                                  recipe_sms: int | None) -> None:
    spec = _spec(backend, sms)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["model.moe_flex_dispatcher_num_sms"] == sms
    assert all(items[f"model.{k}"] is None for k in LEGACY)
    keys = list(items)
    assert max(keys.index(f"model.{k}") for k in LEGACY) < keys.index("model.moe_flex_dispatcher_num_sms")
    files = render_files(spec, ["bridge"])
    body = [line for line in files["bridge_overrides.txt"].splitlines() if not line.startswith("#")]
    assert f"model.moe_flex_dispatcher_num_sms={'null' if sms is None else sms}" in body
    assert {f"model.{k}=null" for k in LEGACY} <= set(body)
    tables = literal_tables(files["bridge_recipe.py"])
    assert tables["FALLBACK_FIELDS"] == {"model.moe_flex_dispatcher_num_sms": f"model.{legacy}"}
    for unified in (True, False):  # the base recipe sets its own count on the key it knows
        model: dict[str, Any] = {legacy: recipe_sms, **({"moe_flex_dispatcher_num_sms": None} if unified else {})}
        model.setdefault("moe_deepep_num_sms", None)
        model.setdefault("moe_hybridep_num_sms", None)
        _apply(tables["OVERRIDES"], tables["FALLBACK_FIELDS"], model, unified)
        assert _post_init(model) == sms, (unified, model)


def test_the_deepep_count_is_not_written_under_the_hybridep_name() -> None:
    items = dict(overrides(_spec("deepep", 24), choose_recipe(_spec("deepep", 24))))
    assert items["model.moe_hybridep_num_sms"] is None and items["model.moe_flex_dispatcher_num_sms"] == 24


def test_no_fallback_without_a_flex_dispatcher() -> None:
    tables = literal_tables(render_files(plan_spec("deepseek-v3-gb200-fp8"), ["bridge"])["bridge_recipe.py"])
    assert tables["FALLBACK_FIELDS"] == {} and "model.moe_flex_dispatcher_num_sms" not in tables["OVERRIDES"]
