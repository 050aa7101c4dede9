"""Fast start of ``paraplan models`` and ``paraplan gpus``: the packaged preset index (never stale), the fast path
in ``main`` (the same output as typer's command, anything else through typer), and what they import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import paraplan.cli as cli
from paraplan.cli import fast_command, main
from paraplan.specs.presets import index

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "pydantic", "yaml", "plotly", "jinja2")
FAST_ARGS = [[], ["--format", "table"], ["--format", "json"], ["-f", "csv"], ["--format=json"], ["-fcsv"]]


# ----------------------------------------------------------------------------- the index
def test_packaged_index_is_what_the_loaders_give_now() -> None:
    """index.json equals the index regenerated in memory from the YAML presets, the loaders and the parameter
    counts (so a change to any of them without regenerating fails here)."""
    packaged = Path(index.INDEX_PATH).read_text(encoding="utf-8")
    fresh = index.build_index()
    assert json.loads(packaged) == fresh, f"src/paraplan/specs/presets/index.json is stale: run {index.REGENERATE}"
    assert packaged == index.index_text(fresh), f"index.json is not as written: run {index.REGENERATE}"


def test_index_has_a_row_per_preset_in_the_loaders_order() -> None:
    from paraplan.specs.load import gpu_preset_names, model_preset_names

    assert [r["name"] for r in index.preset_rows("models")] == model_preset_names()
    assert [r["name"] for r in index.preset_rows("gpus")] == gpu_preset_names()


def test_index_is_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "specs/presets/index.json" in data["tool"]["setuptools"]["package-data"]["paraplan"]


def _fake_index(tmp_path: Path, digests: dict[str, str]) -> Path:
    path = tmp_path / "index.json"
    rows = [{"name": "not-a-preset"}]
    path.write_text(json.dumps({"regenerate": index.REGENERATE, "yaml_sha256": digests, "models": rows,
                                "gpus": rows}), encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", index.KINDS)
def test_index_rows_are_read_only_while_the_yaml_files_match(kind: index.Kind, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "INDEX_PATH", str(_fake_index(tmp_path, index.yaml_sha256())))
    assert index.preset_rows(kind) == [{"name": "not-a-preset"}]  # proves the rows come from the file


@pytest.mark.parametrize("change", ["edited", "added", "removed"])
def test_a_stale_index_gives_the_loaders_rows(change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digests = index.yaml_sha256()
    first = next(iter(digests))
    if change == "edited":
        digests[first] = "0" * 64
    elif change == "added":  # the index knows a file the folder lacks, as when one was deleted
        digests["models/gone.yaml"] = "0" * 64
    else:
        del digests[first]
    monkeypatch.setattr(index, "INDEX_PATH", str(_fake_index(tmp_path, digests)))
    assert index.preset_rows("models") == index.model_rows()
    assert index.preset_rows("gpus") == index.gpu_rows()


@pytest.mark.parametrize("content", [None, "", "{", "[]", '{"yaml_sha256": {}}'])
def test_a_missing_or_broken_index_gives_the_loaders_rows(content: str | None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "index.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    monkeypatch.setattr(index, "INDEX_PATH", str(path))
    assert index.preset_rows("gpus") == index.gpu_rows()


def test_regenerating_writes_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "index.json"
    target.write_text("old", encoding="utf-8")
    monkeypatch.setattr(index, "INDEX_PATH", str(target))
    assert index.main() == 0
    assert target.read_text(encoding="utf-8") == index.index_text(index.build_index())
    assert str(target) in capsys.readouterr().out


# ----------------------------------------------------------------------------- the fast path
@pytest.mark.parametrize(("args", "expected"), [
    (["models"], ("models", "table")),
    (["gpus", "--format", "json"], ("gpus", "json")),
    (["gpus", "-f", "csv"], ("gpus", "csv")),
    (["models", "--format=csv"], ("models", "csv")),
    (["models", "-fjson"], ("models", "json")),
    (["models", "--help"], None),
    (["models", "--format", "JSON"], None),
    (["models", "--format", "xml"], None),
    (["models", "--format"], None),
    (["models", "--format="], None),
    (["models", "-f=json"], None),
    (["models", "--format", "json", "--format", "csv"], None),
    (["models", "-x"], None),
    (["gpus", "extra"], None),
    (["models", "--formats=json"], None),
    (["plan"], None),
    ([], None),
])
def test_fast_command_takes_exactly_the_plain_invocations(args: list[str], expected: tuple[str, str] | None) -> None:
    assert fast_command(args) == expected


def test_no_fast_path_while_completing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_PARAPLAN_COMPLETE", "complete_bash")
    assert fast_command(["models"]) is None


def _typer_output(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stdout of typer's own ``models``/``gpus`` command (the path ``main`` spares)."""
    import typer.main

    group = typer.main.get_command(cli.app)
    capsys.readouterr()
    group.main(args=args, prog_name="paraplan", standalone_mode=False)
    return capsys.readouterr().out


@pytest.mark.parametrize("columns", ["80", "250"])
@pytest.mark.parametrize("rest", FAST_ARGS, ids=lambda a: " ".join(a) or "plain")
@pytest.mark.parametrize("command", ["models", "gpus"])
def test_fast_path_prints_what_the_typer_command_prints(command: str, rest: list[str], columns: str,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    expected = _typer_output([command, *rest], capsys)

    def no_typer(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the fast path ran typer")

    monkeypatch.setattr(cli, "app", no_typer)
    assert main([command, *rest]) == 0
    out, err = capsys.readouterr()
    assert out == expected and err == ""
    assert out.strip()


@pytest.mark.parametrize("args", [["models", "--help"], ["gpus", "--format", "xml"], ["models", "-x"],
                                  ["models", "--format", "json", "--format", "csv"]],
                         ids=["help", "bad-value", "unknown-option", "twice"])
def test_other_invocations_go_through_typer(args: list[str], monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    real = cli.app

    def spy(*a: Any, **kw: Any) -> Any:
        calls.append(list(kw["args"]))
        return real(*a, **kw)

    monkeypatch.setattr(cli, "app", spy)
    code = main(args)
    out, err = capsys.readouterr()
    assert calls == [args]
    if args[-1] == "--help":
        assert code == 0 and "Usage: paraplan models" in out
    elif args[-1] == "csv":
        assert code == 0 and out.startswith("name,layers,")  # click takes the last value
    else:  # a bad value is bad input (1), an unknown option usage (2)
        assert code == (2 if args[-1] == "-x" else 1) and err.startswith("error: ") and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- what they import
def _imported(args: list[str]) -> set[str]:
    """Top-level names of the modules ``python -m paraplan ARGS`` imports (``-X importtime``)."""
    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "paraplan", *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "paraplan.cli" in names  # the probe sees the CLI's imports
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("args", [["models"], ["models", "--format", "json"], ["gpus"], ["gpus", "-f", "csv"]],
                         ids=" ".join)
def test_models_and_gpus_import_no_heavy_module(args: list[str]) -> None:
    assert sorted(_imported(args) & set(HEAVY)) == []


def test_the_typer_path_would_import_pydantic() -> None:
    """The probe can fail: ``models --help`` builds typer's command, whose option coercion imports pydantic."""
    assert "pydantic" in _imported(["models", "--help"])
