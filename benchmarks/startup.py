#!/usr/bin/env python3
"""CLI start-up: `paraplan --version`, `--help`, `models` and `gpus` next to a bare interpreter start.

Each command runs as a subprocess (the console script of the interpreter running this file, else
``python -m paraplan``), interleaved with ``python -c "import json"`` so that both see the same machine
load; the median of several repetitions of each is compared. Prints one line per command with its
ratio to the bare start, `startup: worst X.Xx (limit 8x)` last, and exits 1 above the limit
(``--limit``; ``--only`` picks commands, e.g. ``--only --version,--help``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("--version", "--help", "models", "gpus")
LIMIT = 8.0
"""Largest allowed ratio of a command's median wall time to the bare interpreter's."""


def paraplan_argv() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m paraplan`` from src/."""
    script = Path(sys.executable).with_name("paraplan")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "paraplan"]


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9, help="runs of each command (median)")
    ap.add_argument("--limit", type=float, default=LIMIT, help="largest allowed ratio to the bare start")
    ap.add_argument("--only", default=",".join(COMMANDS), help="commands to measure, comma-separated")
    args = ap.parse_args()
    commands = [c for c in args.only.split(",") if c]
    env = {**os.environ, "COLUMNS": "80"}
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    bare = [sys.executable, "-c", "import json"]
    tool = paraplan_argv()
    for argv in (bare, *([*tool, c] for c in commands)):  # warm the file cache and the .pyc files
        wall_s(argv, env)
    bare_s: list[float] = []
    times: dict[str, list[float]] = {c: [] for c in commands}
    for _ in range(args.repeat):
        for c in commands:
            bare_s.append(wall_s(bare, env))
            times[c].append(wall_s([*tool, c], env))
    base = statistics.median(bare_s)
    print(f"python -c 'import json': {1000 * base:.1f} ms (median of {len(bare_s)})")
    worst = 0.0
    for c in commands:
        med = statistics.median(times[c])
        ratio = med / base
        worst = max(worst, ratio)
        print(f"paraplan {c}: {1000 * med:.1f} ms, {ratio:.1f}x")
    print(f"startup: worst {worst:.1f}x (limit {args.limit:g}x)")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
