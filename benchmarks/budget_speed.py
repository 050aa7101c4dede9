#!/usr/bin/env python3
"""Budget sweep speed: `paraplan.budget.budget` over GPU counts x GPU types, wall time and layouts evaluated.

Cases (issue 7): Llama-3.1 405B on 15T tokens at seq 8192 over h100-80gb, h200-141gb and b200, full sweep
(node x 2^k up to 65,536, no deadline) with a fixed GBS and with the GBS allowed to grow to 4x; DeepSeek-V3
(MoE, the largest layout space) on h100-80gb and b200. Each sweep calls the vectorised search once per
(GPU type, count, GBS). Prints one line per case and `budget speed: worst X s` last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from paraplan.budget import budget
from paraplan.specs.load import load_gpu, load_model

CASES: list[tuple[str, tuple[str, ...], int, int | None]] = [
    ("llama3.1-405b", ("h100-80gb", "h200-141gb", "b200"), 8192, None),
    ("llama3.1-405b", ("h100-80gb", "h200-141gb", "b200"), 8192, 2048),
    ("deepseek-v3", ("h100-80gb", "b200"), 4096, None),
]


def main() -> int:
    worst = 0.0
    for model_name, gpu_names, seq, max_gbs in CASES:
        model, gpus = load_model(model_name), [load_gpu(g) for g in gpu_names]
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            res = budget(model, gpus, tokens=15e12, seq_len=seq, max_gbs=max_gbs)
            times.append(time.perf_counter() - t0)
        best = min(times)
        worst = max(worst, best)
        feasible = sum(r.feasible for r in res.rows)
        print(f"{model_name} x {','.join(gpu_names)} seq {seq} GBS {res.gbs}"
              + (f"..{max_gbs}" if max_gbs else "") + f": {best:.3f} s, {len(res.rows)} counts "
              f"({feasible} feasible), {res.layouts_evaluated:,} layouts ({res.layouts_evaluated / best:,.0f}/s)")
    print(f"budget speed: worst {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
