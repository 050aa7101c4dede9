"""Snapshot tests: the files each target writes for fixed layouts (UPDATE_SNAPSHOTS=1 refreshes).

manifest.json is compared without ``prediction`` and ``tool_version`` (they move with the
performance model and releases; their presence is checked in test_render.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from paraplan.launch.render import OPTIONAL_FILES, TARGET_FILES, LaunchSpec, render_files

from .cases import CASES, SNAPSHOTS

UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"
FILES = sorted({name for names in TARGET_FILES.values() for name in names} | {"manifest.json", *OPTIONAL_FILES})


def comparable(name: str, text: str) -> str:
    if name != "manifest.json":
        return text
    doc = json.loads(text)
    doc.pop("prediction")
    doc.pop("tool_version")
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", FILES)
def test_rendered_file_matches_snapshot(case: str, name: str) -> None:
    make: Callable[[], LaunchSpec] = CASES[case]
    files = render_files(make(), ["all"])
    path = SNAPSHOTS / case / name
    if name not in files:  # a file this case does not need (bridge without a recipe, no ComputeDomain)
        if UPDATE and path.exists():
            path.unlink()
        assert not path.exists(), f"{path} is stale; UPDATE_SNAPSHOTS=1 removes it"
        return
    got = comparable(name, files[name])
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"missing snapshot {path}; run with UPDATE_SNAPSHOTS=1"
    assert got == path.read_text(encoding="utf-8"), f"{path} differs; UPDATE_SNAPSHOTS=1 refreshes it"


@pytest.mark.parametrize(("target", "expected"), [
    ("megatron", ["megatron_args.sh", "env.sh", "manifest.json"]),
    ("torchrun", ["megatron_args.sh", "env.sh", "torchrun.sh", "manifest.json"]),
    ("slurm", ["megatron_args.sh", "env.sh", "job.sbatch", "manifest.json"]),
    ("k8s", ["megatron_args.sh", "env.sh", "pytorchjob.yaml", "manifest.json"]),
    ("sbatch", ["megatron_args.sh", "env.sh", "job.sbatch", "manifest.json"]),
    ("pytorchjob", ["megatron_args.sh", "env.sh", "pytorchjob.yaml", "manifest.json"]),
    ("trainjob", ["megatron_args.sh", "env.sh", "trainjob.yaml", "manifest.json"]),
    ("bridge", ["bridge_recipe.py", "bridge_overrides.txt", "manifest.json"]),
    ("all", ["megatron_args.sh", "env.sh", "torchrun.sh", "job.sbatch", "pytorchjob.yaml", "trainjob.yaml",
             "bridge_recipe.py", "bridge_overrides.txt", "manifest.json"]),
])
def test_each_target_writes_its_files(target: str, expected: list[str]) -> None:
    files = render_files(CASES["llama70b"](), [target])
    assert list(files) == expected
    for name, text in files.items():
        if name != "manifest.json":
            assert text == render_files(CASES["llama70b"](), ["all"])[name]
