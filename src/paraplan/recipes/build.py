"""Write the packaged recipe library from the reference CSV::

    python -m paraplan.recipes.build ../shared/reference/bridge_perf_recipes.csv

writes ``src/paraplan/recipes/bridge_recipes.json``: the CSV's column names, then one array per row, its cells in
the columns' order, each read by ``catalogue.parse_cell`` (the loader pairs them with the column names).
``--check`` compares instead of writing (exit 1 when the file differs).
``tests/recipes`` regenerates it in memory and asserts it equals the packaged file.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from paraplan.recipes.catalogue import CSV_NAME, PACKAGED_NAME, parse_cell

PACKAGED_PATH = Path(__file__).with_name(PACKAGED_NAME)


def library_from_csv(text: str) -> dict[str, Any]:
    """The packaged library for the CSV ``text``: ``columns`` and ``rows`` (one list of cells per recipe)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    rows = []
    for values in reader:
        if len(values) != len(header):
            raise ValueError(f"{CSV_NAME}: a row has {len(values)} cells, the header {len(header)}")
        rows.append([parse_cell(v) for v in values])
    return {"generated_from": CSV_NAME, "generator": "python -m paraplan.recipes.build", "columns": header,
            "rows": rows}


def library_text(text: str) -> str:
    """The packaged file's text: one recipe per line, so a diff shows the recipes that changed."""
    lib = library_from_csv(text)
    head = {k: v for k, v in lib.items() if k != "rows"}
    lines = [json.dumps(r, ensure_ascii=True, separators=(",", ":")) for r in lib["rows"]]
    return json.dumps(head, ensure_ascii=True)[:-1] + ', "rows": [\n' + ",\n".join(lines) + "\n]}\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m paraplan.recipes.build",
        description=f"Write {PACKAGED_NAME} (the packaged recipe library) from {CSV_NAME}.")
    parser.add_argument("csv", metavar="PATH/bridge_perf_recipes.csv", help="the reference recipe table")
    parser.add_argument("--check", action="store_true", help="compare with the packaged file instead of writing "
                        "(exit 1 when it differs)")
    args = parser.parse_args(argv)
    try:
        text = library_text(Path(args.csv).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        print(f"error: {args.csv}: not a readable CSV file ({type(err).__name__}: "
              f"{getattr(err, 'strerror', None) or err})", file=sys.stderr)
        return 1
    except (ValueError, StopIteration, csv.Error) as err:
        print(f"error: {args.csv}: {str(err) or 'no header row'}", file=sys.stderr)
        return 1
    if args.check:
        same = PACKAGED_PATH.exists() and PACKAGED_PATH.read_text(encoding="utf-8") == text
        print(f"{PACKAGED_PATH}: {'up to date' if same else 'differs: regenerate it'}")
        return 0 if same else 1
    PACKAGED_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {PACKAGED_PATH} ({text.count(chr(10)) - 2} recipes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
