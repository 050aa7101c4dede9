"""One place for what two readers or writers used to do each on their own (session-7 clean-up)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.launch.megatron import knobs_set, memory_knob_args, moe_knobs_set
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import _cuda_graphs
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import CUDA_GRAPH_MODULES, KNOB_FLAGS, TrainingSpec

BASE = TrainingSpec(seq_len=4096, global_batch_size=64)


def test_knobs_set_is_empty_at_megatron_defaults() -> None:
    assert knobs_set(BASE) == []
    assert memory_knob_args(BASE) == [] and moe_knobs_set(BASE) == []


def test_knobs_set_lists_exactly_the_knobs_away_from_their_defaults() -> None:
    t = TrainingSpec(seq_len=4096, global_batch_size=64, grad_reduce_in_bf16=True, moe_shared_expert_overlap=True,
                     cuda_graph_impl="local")
    given = ("grad_reduce_in_bf16", "moe_shared_expert_overlap", "cuda_graph_impl")
    assert knobs_set(t) == [(k, KNOB_FLAGS[k], getattr(t, k)) for k in KNOB_FLAGS if k in given]
    assert moe_knobs_set(t) == [KNOB_FLAGS["moe_shared_expert_overlap"]]


@pytest.mark.parametrize("key", sorted(KNOB_FLAGS))
def test_the_defaults_compared_against_are_the_field_defaults(key: str) -> None:
    """The job fields differ (seq_len, GBS), the knobs at their field defaults are never listed."""
    default = next(f.default for f in fields(TrainingSpec) if f.name == key)
    assert getattr(BASE, key) == default
    assert key not in {k for k, _, _ in knobs_set(BASE)}


# --- the deprecated CUDA-graph scopes: the recipe library and Megatron's command line read them alike ---------

_FLAGS = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --max-position-embeddings 512 "
          "--micro-batch-size 1 --global-batch-size 8 --bf16").split()
_SCOPE_WORDS = (*CUDA_GRAPH_MODULES, "full", "full_iteration")


def _from_recipe(impl: str, scope: list[str]) -> dict[str, object] | str:
    base = bridge_recipes()[0]
    r = replace(base, fields={**base.fields, "cuda_graph_impl": impl, "cuda_graph_scope": scope})
    try:
        return _cuda_graphs(r)
    except SpecError:
        return "refused"


def _from_argv(impl: str, scope: list[str]) -> dict[str, object] | str:
    try:
        t = read_flags([*_FLAGS, "--cuda-graph-impl", impl, *(["--cuda-graph-modules", *scope] if scope else [])])
    except SpecError:
        return "refused"
    got = t.training_fields
    if got["cuda_graph_impl"] == "full_iteration":
        return {"cuda_graph_impl": "full_iteration"}
    return {"cuda_graph_impl": got["cuda_graph_impl"], "cuda_graph_modules": got.get("cuda_graph_modules", ())}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["local", "transformer_engine", "full_iteration"]),
       st.lists(st.sampled_from(_SCOPE_WORDS), max_size=4))
def test_recipe_cells_and_megatron_args_translate_the_scopes_alike(impl: str, scope: list[str]) -> None:
    """A recipe's cuda_graph_impl / cuda_graph_scope cells and the same values as Megatron flags give the same
    TrainingSpec fields, or are both refused (full only alone; full_iteration only alone and not with
    transformer_engine; modules once each)."""
    assert _from_recipe(impl, scope) == _from_argv(impl, scope)


@pytest.mark.parametrize(("impl", "scope", "fields"), [
    ("local", ["full_iteration"], {"cuda_graph_impl": "full_iteration"}),  # 33 NVIDIA recipes set this
    ("transformer_engine", ["attn", "attn"],
     {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn",)}),
    ("transformer_engine", ["full"], {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ()}),
    ("transformer_engine", ["full", "attn"], "refused"),
    ("transformer_engine", ["full_iteration"], "refused"),
    ("none", ["attn", "moe_router"], {}),  # Bridge clears the scope when the impl is none
])
def test_recipe_scope_cells(impl: str, scope: list[str], fields: object) -> None:
    assert _from_recipe(impl, scope) == fields


# --- paraplan models / gpus print their rows as data through one function ---------------------------------------

def test_models_and_gpus_share_the_data_formats(capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io
    import json

    from paraplan.cli import main
    from paraplan.cli.info import ListFormat, printed_as_data

    rows = [{"name": "a", "n": 1}, {"name": "b,c", "n": 2}]
    assert printed_as_data(rows, ListFormat.json) and json.loads(capsys.readouterr().out) == rows
    assert printed_as_data(rows, ListFormat.csv)
    assert list(csv.DictReader(io.StringIO(capsys.readouterr().out))) == [{"name": "a", "n": "1"},
                                                                          {"name": "b,c", "n": "2"}]
    assert not printed_as_data(rows, ListFormat.table) and capsys.readouterr().out == ""
    for command in ("models", "gpus"):
        assert main([command, "--format", "json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert main([command, "--format", "csv"]) == 0
        assert [r["name"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))] == [r["name"] for r in listed]
