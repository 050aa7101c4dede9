"""User recipes (``--recipes FILE``): a CSV with the reference table's header (any subset of its columns that holds
``catalogue.REQUIRED``), or YAML: a list of mappings, or a mapping whose ``recipes`` key holds that list, keyed by
the same column names. Cells are read as the packaged ones (``catalogue.parse_cell``); every row is checked when the
file is read, each error one line naming the file, the row (1 = the first recipe) and the column."""

from __future__ import annotations

import csv
import difflib
import io
from typing import Any

from paraplan.errors import SpecError
from paraplan.recipes.catalogue import (
    MAX_CELL_CHARS,
    MAX_USER_FILE_BYTES,
    MAX_USER_ROWS,
    MODEL_PRESETS,
    REQUIRED,
    Cell,
    Recipe,
    bridge_recipes,
    columns,
    make_recipe,
    parse_cell,
)


def _check_columns(path: str, names: list[str], where: str) -> None:
    allowed = columns()
    for name in names:
        if name not in allowed:
            near = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise SpecError(f"--recipes {path}: {where}unknown column {name!r}{hint}; allowed: the columns of "
                            f"bridge_perf_recipes.csv: {', '.join(allowed)}")
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise SpecError(f"--recipes {path}: {where}missing column(s) {', '.join(missing)} (every recipe gives "
                        f"{', '.join(REQUIRED)})")


def _csv_rows(path: str, text: str) -> list[dict[str, Cell]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise SpecError(f"--recipes {path}: empty file (expected a CSV header or YAML recipes)") from None
    except csv.Error as err:
        raise SpecError(f"--recipes {path}: not a valid CSV header: {err}") from None
    header = [h.strip() for h in header]
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise SpecError(f"--recipes {path}: column {dup!r} appears twice in the header")
    _check_columns(path, header, "")
    rows: list[dict[str, Cell]] = []
    try:
        for values in reader:
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise SpecError(f"--recipes {path}: row {len(rows) + 1}: {len(values)} cells, the header has "
                                f"{len(header)}")
            _limit(path, len(rows) + 1)
            rows.append({c: _cell(path, len(rows) + 1, c, v) for c, v in zip(header, values, strict=True)})
    except csv.Error as err:
        raise SpecError(f"--recipes {path}: row {len(rows) + 1}: not valid CSV: {err}") from None
    return rows


def _limit(path: str, row: int) -> None:
    if row > MAX_USER_ROWS:
        raise SpecError(f"--recipes {path}: more than {MAX_USER_ROWS} recipes")


def _cell(path: str, row: int, column: str, value: Any) -> Cell:
    """A CSV cell or YAML value as a field (strings read as the packaged cells are)."""
    if isinstance(value, str):
        if len(value) > MAX_CELL_CHARS:
            raise SpecError(f"--recipes {path}: row {row}: column {column}: longer than {MAX_CELL_CHARS} characters")
        return parse_cell(value.strip())
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list) and all(isinstance(x, str) and len(x) <= MAX_CELL_CHARS for x in value) \
            and len(value) <= 256:
        return [str(x) for x in value]
    raise SpecError(f"--recipes {path}: row {row}: column {column}: expected a number, True/False, None, text or a "
                    f"list of names, got {type(value).__name__}")


def _yaml_rows(path: str, text: str) -> list[dict[str, Cell]]:
    from paraplan.fileio import load_yaml_text

    # the hardened reader: duplicate keys, deep nesting, alias bombs and control bytes refused in one line
    data = load_yaml_text(text, "--recipes", path)
    if isinstance(data, dict) and set(data) == {"recipes"}:
        data = data["recipes"]
    if not isinstance(data, list):
        raise SpecError(f"--recipes {path}: expected a list of recipes (or a mapping with a 'recipes' list), got "
                        f"{type(data).__name__}")
    rows: list[dict[str, Cell]] = []
    for i, item in enumerate(data, start=1):
        _limit(path, i)
        if not isinstance(item, dict) or not all(isinstance(k, str) for k in item):
            raise SpecError(f"--recipes {path}: row {i}: expected a mapping of column names to values")
        _check_columns(path, list(item), f"row {i}: ")
        rows.append({k: _cell(path, i, k, v) for k, v in item.items()})
    return rows


def _check_row(path: str, r: Recipe) -> None:
    from paraplan.recipes.knobs import layout_fields, not_modelled, recipe_job

    if not isinstance(r.fields.get("source"), str) or not r.fields["source"]:
        raise SpecError(f"--recipes {path}: row {r.row}: column source: expected a name (path:function or any "
                        "identifier)")
    if r.model_preset is None:
        from paraplan.recipes.catalogue import _preset_names

        known = sorted(set(MODEL_PRESETS) | _preset_names("models"))
        raise SpecError(f"--recipes {path}: row {r.row}: column model: {r.fields.get('model')!r} has no paraplan "
                        f"preset (allowed: {', '.join(known)})")
    if r.gpu_preset is None:
        from paraplan.recipes.catalogue import GPU_PRESETS, _preset_names

        known = sorted(set(GPU_PRESETS) | _preset_names("gpus"))
        raise SpecError(f"--recipes {path}: row {r.row}: column gpu: {r.fields.get('gpu')!r} has no paraplan preset "
                        f"(allowed: {', '.join(known)})")
    recipe_job(r)
    layout_fields(r)
    not_modelled(r)


def read_user_recipes(path: str) -> list[Recipe]:
    """The recipes of a user file, each checked (SpecError in one line naming the row and column)."""
    from paraplan.fileio import read_input_text

    text = read_input_text(path, "--recipes", max_bytes=MAX_USER_FILE_BYTES)
    is_csv = path.lower().endswith(".csv")
    rows = _csv_rows(path, text) if is_csv else _yaml_rows(path, text)
    out: list[Recipe] = []
    seen: set[str] = set()
    for i, fields in enumerate(rows, start=1):
        r = make_recipe(fields, origin=path, row=i)
        _check_row(path, r)
        for name in dict.fromkeys((r.source, r.alias)):
            if name in seen:
                raise SpecError(f"--recipes {path}: row {i}: '{name}' names an earlier row too (sources and aliases "
                                "are unique; a config_variant tells two rows of one job apart)")
            seen.add(name)
        out.append(r)
    if not out:
        raise SpecError(f"--recipes {path}: no recipes in the file")
    return out


def catalogue(user_file: str | None = None) -> tuple[Recipe, ...]:
    """The NVIDIA recipes followed by those of ``user_file`` (validated; an identifier or alias already in the
    library is an error naming the row)."""
    base = bridge_recipes()
    if not user_file:
        return base
    taken = {r.source for r in base} | {r.alias for r in base}
    out = list(base)
    for r in read_user_recipes(user_file):
        for name in dict.fromkeys((r.source, r.alias)):
            if name in taken:
                raise SpecError(f"--recipes {user_file}: row {r.row}: '{name}' is already a recipe of the library "
                                "(give the row another source)")
            taken.add(name)
        out.append(r)
    return tuple(out)
