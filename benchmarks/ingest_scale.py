#!/usr/bin/env python3
"""Ingest scale (issue 17): `paraplan ingest` wall time and peak memory on 1, 10 and 100 MB logs.

The synthetic logs are built from the real formats of tests/fixtures/logs (17_slurm-on-aws: the
Megatron-LM 2026 theoretical-memory block, per-rank memory reports, iteration lines, the
``(min, max) time across ranks (ms):`` timer block) plus the noise a real run prints between them
(NCCL INFO, warnings, datetime lines). Each log interval is one iteration line, a timer block of
8 timers and 6 noise lines (about 1.6 KB), so records grow with the log: 1 iteration record and
8 timer records per interval. Each size is ingested in its own ``python -m paraplan ingest``
process (table output); its wall time, CPU time and peak RSS come from ``os.wait4``. Parse time is
the CPU time less that of a tiny log (start-up and imports), steady when other processes share the cores.

Prints one row per size and, last, ``ingest scale (1 MB -> 10 MB -> 100 MB): parse CPU time xA, xB;
peak memory xC, xD`` (time ~x10 per 10x size is linear; memory grows only by the records kept, about
350 bytes each, so much less than 10x).
Usage: ``python benchmarks/ingest_scale.py [MB ...]`` (default 1 10 100), ``--gzip`` to gzip the logs.
"""

from __future__ import annotations

import gzip
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES_MB = (1, 10, 100)
MB = 10**6

HEAD = """\
using world size: 32, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel sizes: None, \
tensor-model-parallel size: 8, pipeline-model-parallel size: 2
Number of parameters in transformer block in billions:  64.43
Number of parameters in embedding layers in billions: 0.26
Total number of parameters in billions: 64.69
Number of parameters in most loaded shard in billions: 2.0794
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 1024.0 MB
Number of in-flight microbatches: 8
Theoretical memory footprints: weight and optimizer=35695.42 MB, activation=86554.12 MB, total=122249.54 MB
""" + "".join(
    f"[Rank {r}] (after 1 iterations) memory (MB) | allocated: 36891.15 | max allocated: 44566.31 | "
    f"reserved: 44752.00 | max reserved: 44752.00\n" for r in range(32))

ITERATION = (" [2026-03-28 14:{m:02d}:{s:02d}.528844] iteration {i:8d}/ 1000000 | consumed samples: {cs:12d} | "
             "elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | global batch size:   512 | "
             "lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {gn:.3f} | number of skipped iterations:   0 | "
             "number of nan iterations:   0 |\n")
TIMERS = ("forward-backward", "forward-compute", "backward-compute", "batch-generator", "layernorm-grads-all-reduce",
          "embedding-grads-all-reduce", "all-grads-sync", "optimizer")
NOISE = (
    "gpu-st-p4de-24xlarge-{r}:{p}:{p} [{r}] NCCL INFO Channel 02/0 : {r}[{r}] -> {q}[{q}] via P2P/IPC/read\n",
    "/opt/megatron/core/transformer/attention.py:412: UserWarning: The sequence length {i} is not a multiple of 128\n",
    "[after training step {i}] datetime: 2026-03-28 14:{m:02d}:{s:02d}.{p:06d} \n",
    "gpu-st-p4de-24xlarge-{r}:{p}:{p} [{r}] NCCL INFO comm 0x{p:x} rank {r} nranks 32 cudaDev {q} - Init COMPLETE\n",
    "WARNING:megatron.core.rerun_state_machine:Result validation enabled for iteration {i}\n",
    " > number of empty bins: {q}, rank {r}\n",
)


def interval(i: int) -> str:
    """One log interval: noise, the iteration line, then its timer block."""
    r, q, p, m, s = i % 32, (i * 7) % 8, 1000 + i % 9000, (i // 60) % 60, i % 60
    noise = "".join(line.format(i=i, r=r, q=q, p=p, m=m, s=s) for line in NOISE)
    it = ITERATION.format(i=i, m=m, s=s, cs=512 * i, ms=7000 + (i * 37) % 500 / 10, lr=2e-7 * (1 + i % 100),
                          loss=12.0 - (i % 1000) / 500, gn=30 + i % 17)
    block = "INFO:megatron.core.timers:(min, max) time across ranks (ms):\n" + "".join(
        f"    {name + ' ':.<48}: ({100 + (i * k) % 50:.2f}, {120 + (i * k) % 60:.2f})\n"
        for k, name in enumerate(TIMERS, start=1))
    return noise + it + block


def write_log(path: Path, size_bytes: int, *, gz: bool) -> int:
    """Write a log of about ``size_bytes`` (uncompressed); returns the number of intervals."""
    opener = gzip.open if gz else open
    n, written = 0, 0
    with opener(path, "wt", encoding="utf-8") as f:  # type: ignore[operator]
        f.write(HEAD)
        written += len(HEAD)
        while written < size_bytes:
            chunk = "".join(interval(n + k) for k in range(1, 51))
            f.write(chunk)
            written, n = written + len(chunk), n + 50
    return n


def run_ingest(path: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one ``paraplan ingest`` process, from ``os.wait4`` (this child's own
    rusage: ``RUSAGE_CHILDREN`` would keep the running maximum over all children)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "paraplan", "ingest", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"ingest {path} failed ({proc.returncode}): {out.strip().splitlines()[-1:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def main(argv: list[str]) -> int:
    gz = "--gzip" in argv
    sizes = [int(a) for a in argv if a != "--gzip"] or list(SIZES_MB)
    rows: list[tuple[int, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="paraplan-ingest-scale-") as tmp:
        base = Path(tmp) / "head.log"
        base.write_text(HEAD + interval(1) + interval(2), encoding="utf-8")
        _, start_cpu, start_mib = min(run_ingest(base) for _ in range(3))  # interpreter start-up and imports
        print(f"start-up (a {base.stat().st_size:,}-byte log): {start_cpu:.2f} s CPU, {start_mib:.1f} MiB")
        print(f"{'log':>8} {'file MB':>8} {'intervals':>10} {'wall s':>8} {'CPU s':>7} {'parse s':>8} {'MB/s':>6} "
              f"{'peak RSS MiB':>13}")
        for size in sizes:
            path = Path(tmp) / f"train_{size}mb.log{'.gz' if gz else ''}"
            n = write_log(path, size * MB, gz=gz)
            wall, cpu, rss = min(run_ingest(path) for _ in range(3 if size <= 10 else 1))  # best of 3 when short
            parse = max(cpu - start_cpu, 1e-3)  # CPU time: steady when other processes share the cores
            rows.append((size, parse, rss))
            print(f"{size:>6}MB {path.stat().st_size / MB:>8.1f} {n:>10,} {wall:>8.2f} {cpu:>7.2f} {parse:>8.2f} "
                  f"{size / parse:>6.1f} {rss:>13.1f}", flush=True)
            path.unlink()
    steps = list(itertools.pairwise(rows))
    times = ", ".join(f"x{b[1] / a[1]:.1f}" for a, b in steps)
    mems = ", ".join(f"x{b[2] / a[2]:.2f}" for a, b in steps)
    sizes_text = " -> ".join(f"{s} MB" for s, _, _ in rows)
    print(f"ingest scale ({sizes_text}): parse CPU time {times}; peak memory {mems}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
