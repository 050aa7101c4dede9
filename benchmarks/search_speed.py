#!/usr/bin/env python3
"""Search speed: `plan` over the full layout space, wall time and candidates evaluated.

Cases (issue 3): Llama-3.1 405B on 16,384 H100 (seq 8192, GBS 2048) and DeepSeek-V3 on 2,048
H100 (seq 4096, GBS 8192), full space. Target: each well under 1 s on a 2-core machine.
Prints one line per case and `search speed: worst X s` last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from paraplan.search import plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

CASES = [("llama3.1-405b", "h100-80gb", 16384, 8192, 2048), ("deepseek-v3", "h100-80gb", 2048, 4096, 8192)]


def main() -> int:
    worst = 0.0
    for model_name, gpu, n, seq, gbs in CASES:
        model, cluster = load_model(model_name), make_cluster(load_gpu(gpu), n)
        training = TrainingSpec(seq_len=seq, global_batch_size=gbs)
        plan(model, cluster, training, top_k=5)  # warm imports and caches
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            p = plan(model, cluster, training, top_k=5)
            times.append(time.perf_counter() - t0)
        best = min(times)
        worst = max(worst, best)
        rate = p.num_evaluated / best
        print(f"{model_name} on {n} x {gpu}: {best:.3f} s, {p.num_evaluated} candidates "
              f"({rate:,.0f}/s), {p.num_feasible} fit; best {p.candidates[0].layout.short()}")
    print(f"search speed: worst {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
