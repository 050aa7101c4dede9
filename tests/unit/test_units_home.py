"""units.py is the one home of 2**30 (GIB); GpuSpec.usable_bytes the one place that subtracts the reserved
memory from HBM. Both are read from the source, so a new spelled-out copy fails here."""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.specs.load import load_gpu
from paraplan.units import GIB

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "src" / "paraplan").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")])
GIB_LITERAL = re.compile(r"2\s*\*\*\s*30|1\s*<<\s*30|1024\s*\*\*\s*3")
USABLE = re.compile(r"hbm_bytes\s*-\s*(?:[\w.]+\.)?reserved_bytes")


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines with their comments cut; docstrings still count (they are code to a reader, but mentioning
    1024**3 in prose about another tool's units is fine: those lines are listed below)."""
    return [(i, line.split("#", 1)[0]) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]


PROSE = {("ingest/megatron.py", "divides by 1024**3"), ("ingest/primus.py", "GiB (2**30)"),
         ("ingest/primus.py", "``/ 1024**3``"), ("units.py", "2**30 or 1e12"), ("units.py", "(binary, 2**30)")}
"""Docstrings that name the constant while describing units (not computing with them)."""


def test_gib_is_spelled_only_in_units() -> None:
    hits = []
    for path in SOURCES:
        rel = path.relative_to(ROOT / "src" / "paraplan").as_posix() if "src" in path.parts else path.name
        for i, line in _code_lines(path):
            if GIB_LITERAL.search(line) and not (rel == "units.py" and line.startswith("GIB:")) \
                    and not any(rel == f and text in line for f, text in PROSE):
                hits.append(f"{rel}:{i}: {line.strip()}")
    assert not hits, "use paraplan.units.GIB: " + "; ".join(hits)


def test_usable_memory_is_computed_only_by_gpuspec() -> None:
    hits = [f"{path.name}:{i}" for path in SOURCES for i, line in _code_lines(path)
            if USABLE.search(line) and path.name != "cluster.py"]
    assert not hits, "use GpuSpec.usable_bytes: " + ", ".join(hits)
    gpu = load_gpu("h100-80gb")
    assert gpu.usable_bytes == gpu.hbm_bytes - gpu.reserved_bytes
    assert gpu.reserved_bytes == 1.5 * GIB and GIB == 1 << 30
