"""The packaged recipe library against the reference CSV: regenerated equal, every row kept, identifiers and
aliases unique, models and GPUs resolved or listed with a reason."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.recipes.build import PACKAGED_PATH, library_text
from paraplan.recipes.catalogue import (
    GPU_PRESETS,
    MODEL_PRESETS,
    bridge_recipes,
    cell_text,
    columns,
    find_recipe,
    parse_cell,
)
from paraplan.specs.load import load_gpu, load_model, model_preset_names

CSV_PATH = Path(__file__).resolve().parents[3] / "shared" / "reference" / "bridge_perf_recipes.csv"
needs_csv = pytest.mark.skipif(not CSV_PATH.exists(), reason="../shared/reference/bridge_perf_recipes.csv absent")


def csv_rows() -> tuple[list[str], list[dict[str, str]]]:
    with CSV_PATH.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


@needs_csv
def test_packaged_file_is_the_generator_output() -> None:
    assert library_text(CSV_PATH.read_text(encoding="utf-8")) == PACKAGED_PATH.read_text(encoding="utf-8")


@needs_csv
def test_one_recipe_per_csv_row_under_the_csv_column_names() -> None:
    header, rows = csv_rows()
    recipes = bridge_recipes()
    assert len(recipes) == len(rows)
    assert list(columns()) == header
    for r, row in zip(recipes, rows, strict=True):
        assert r.source == row["source"]
        assert set(r.fields) == set(header)
        for col, text in row.items():  # every cell reads back to the CSV's text
            assert cell_text(r.fields[col]) == text, (r.source, col)


def test_identifiers_and_aliases_are_unique_and_found() -> None:
    recipes = bridge_recipes()
    assert len({r.source for r in recipes}) == len(recipes)
    assert len({r.alias for r in recipes}) == len(recipes)
    assert not {r.alias for r in recipes} & {r.source for r in recipes}
    for r in recipes:
        assert re.fullmatch(r"[a-z0-9.]+(-[a-z0-9.]+)+", r.alias), r.alias
        assert find_recipe(r.alias, recipes) is r
        assert find_recipe(r.source, recipes) is r
        assert find_recipe(r.source.rsplit(":", 1)[1], recipes) is r


def test_alias_is_made_from_the_function_name_parts() -> None:
    r = find_recipe("llama3_70b_pretrain_64gpu_h100_fp8cs_config", bridge_recipes())
    assert r.alias == "llama3-70b-h100-fp8cs-64"
    sft = next(x for x in bridge_recipes() if x.get("task") == "sft")
    assert sft.alias.endswith("-sft")
    variant = next(x for x in bridge_recipes() if x.get("config_variant"))
    assert variant.alias.endswith(str(variant.get("config_variant")).replace("_", "-"))


def test_every_mapped_model_and_gpu_resolves_and_the_rest_say_why() -> None:
    assert set(MODEL_PRESETS.values()) <= set(model_preset_names())
    for name in GPU_PRESETS.values():
        load_gpu(name)
    seen_models, seen_gpus = set(), set()
    for r in bridge_recipes():
        if r.runnable:
            assert r.reason == ""
            assert r.model_preset is not None and r.gpu_preset is not None
            seen_models.add(r.model_preset)
            seen_gpus.add(r.gpu_preset)
        else:
            assert r.reason
            assert (r.model_preset is None) == ("model preset" in r.reason)
            assert (r.gpu_preset is None) == ("GPU preset" in r.reason)
    for name in seen_models:
        assert load_model(name).name == name
    assert seen_models == set(MODEL_PRESETS.values())


def test_parse_cell_types() -> None:
    assert parse_cell("None") is None
    assert parse_cell("True") is True and parse_cell("False") is False
    assert parse_cell("64") == 64 and parse_cell("-1") == -1
    assert parse_cell("0.0") == 0.0 and isinstance(parse_cell("1.1"), float)
    assert parse_cell("[a,b]") == ["a", "b"] and parse_cell("[]") == []
    assert parse_cell("") == "" and parse_cell("?") == "?"
    assert parse_cell("Et*4|tL") == "Et*4|tL"


def test_recipes_command_lists_runnable_by_default_and_all_with_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--format", "json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["recipes", "--all", "--format", "json"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert len(everything) == len(bridge_recipes())
    assert len(default) == sum(r.runnable for r in bridge_recipes())
    assert all(d["runnable"] for d in default)
    assert all(d["reason"] for d in everything if not d["runnable"])
    assert list(everything[0]["fields"]) == list(columns())


def test_recipes_filters_by_recipe_or_preset_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--model", "llama3-70b", "--gpu", "h100", "--format", "json"]) == 0
    by_preset = json.loads(capsys.readouterr().out)
    assert main(["recipes", "--model", "llama3_70b", "--gpu", "h100-80gb", "--format", "json"]) == 0
    by_recipe = json.loads(capsys.readouterr().out)
    assert by_preset == by_recipe
    want = [r.source for r in bridge_recipes() if r.get("model") == "llama3_70b" and r.get("gpu") == "h100"]
    assert [d["source"] for d in by_preset] == want and want


def test_recipes_table_and_csv(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--model", "deepseek-v3", "--gpu", "gb200"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3-gb200-" in out and "estimate --recipe" in out
    assert main(["recipes", "--gpu", "vr200", "--format", "csv"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # header only: no VR200 preset, so nothing runnable
    assert main(["recipes", "--gpu", "vr200", "--all", "--format", "csv"]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert rows and all("vr200" in r["reason"] for r in rows)


def test_recipes_unknown_model_or_gpu_is_one_line_naming_the_known(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--model", "--gpu"):
        assert main(["recipes", flag, "no-such-thing", "--format", "json"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {flag}: no recipe for 'no-such-thing'")
        assert ("llama3_70b" if flag == "--model" else "gb200") in err


def test_recipes_known_pair_without_runnable_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--model", "llama3-8b", "--gpu", "vr200"]) == 0
    out = capsys.readouterr().out
    assert "add --all" in out
    assert main(["recipes", "--model", "llama3-8b", "--gpu", "vr200", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_the_generator_prints_usage_for_help_and_one_line_for_a_bad_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.recipes.build import main as build_main

    with pytest.raises(SystemExit) as done:
        build_main(["--help"])
    assert done.value.code == 0 and "usage: python -m paraplan.recipes.build" in capsys.readouterr().out
    before = PACKAGED_PATH.read_bytes()
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    short = tmp_path / "short.csv"
    short.write_text("a,b\n1\n")
    for path, text in ((tmp_path / "none.csv", "FileNotFoundError"), (tmp_path, "IsADirectoryError"),
                       (empty, "no header row"), (short, "a row has 1 cells, the header 2")):
        assert build_main(["--check", str(path)]) == 1
        assert build_main([str(path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 2 and err.startswith(f"error: {path}: ") and text in err, err
    assert PACKAGED_PATH.read_bytes() == before  # nothing written
