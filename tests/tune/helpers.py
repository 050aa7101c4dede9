"""Synthetic Megatron-LM logs written from an estimate, so that tests know what the diagnosis must say."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from paraplan.calibrate import Run, make_run, predict_step_s
from paraplan.estimator import Estimate, estimate
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import EfficiencySpec, GpuSpec, make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

MIB = 2**20


def make_estimate(model: str, num_gpus: int, seq_len: int, gbs: int, gpu: str = "h100-80gb",
                  **layout: Any) -> Estimate:
    """Estimate of a preset model on ``num_gpus`` GPUs with the given layout fields."""
    cluster = make_cluster(load_gpu(gpu), num_gpus)
    training = TrainingSpec(seq_len=seq_len, global_batch_size=gbs)
    return estimate(load_model(model), cluster, training, layout_for_world(num_gpus, **layout))


def dp_rank0_ranks(est: Estimate, stage: int) -> list[int]:
    """Global ranks of DP rank 0 on one PP stage, Megatron order tp-cp-ep-dp-pp."""
    lay = est.layout
    base = stage * lay.tp * lay.cp * lay.dp
    return [base + c * lay.tp + t for c in range(lay.cp) for t in range(lay.tp)]


def _timer_line(name: str, lo_s: float, hi_s: float) -> str:
    return "    " + (name + " ").ljust(48, ".") + f": ({lo_s * 1e3:.2f}, {hi_s * 1e3:.2f})"


def megatron_log(est: Estimate, *, step_s: float | None = None, bubble_s: float | None = None,
                 dp_sync_s: float = 0.0, mem_factor: float = 1.0, records: int = 5, tflops: float | None = None,
                 timers: bool = True, memory: bool = True, gbs: int | None = None) -> str:
    """A log in Megatron's 2026 format: iteration lines (the first inflated by warm-up), memory
    lines of every DP-rank-0 rank (max allocated = predicted stage total x ``mem_factor``), and
    a (min, max) timer block whose forward-backward minus compute is ``bubble_s``."""
    step = step_s if step_s is not None else float(est.time.step_s)
    bubble = bubble_s if bubble_s is not None else float(est.time.bubble_s)
    gbs = gbs or est.training.global_batch_size
    compute = max(step - bubble - dp_sync_s - float(est.time.optimizer_s) - 0.01, 0.01 * step)
    lines = [f"using world size: {est.cluster.num_gpus}"]
    for i in range(records):
        it = (i + 1) * 10
        ms = step * 1e3 * (3.0 if i == 0 else 1.0 + 0.001 * i)
        tf = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" if tflops else ""
        lines.append(f" [2026-01-01 00:00:{i:02d}.000000] iteration {it:8d}/    1000 | consumed samples: "
                     f"{it * gbs:12d} | elapsed time per iteration (ms): {ms:.1f} |{tf} learning rate: 1.000000E-04 |"
                     f" global batch size: {gbs:5d} | lm loss: 5.000000E+00 | loss scale: 1.0 | grad norm: 1.000 |"
                     " number of skipped iterations:   0 | number of nan iterations:   0 |")
        if memory and i == 0:
            for s, st in enumerate(est.stages):
                peak = float(st.memory.total_bytes) * mem_factor / MIB
                for r in dp_rank0_ranks(est, s):
                    lines.append(f"[Rank {r}] (after {it} iterations) memory (MB) | allocated: {0.8 * peak:.2f} | "
                                 f"max allocated: {peak:.2f} | reserved: {1.02 * peak:.2f} | "
                                 f"max reserved: {1.02 * peak:.2f}")
        if timers:
            fc, bc = compute / 3.0, 2.0 * compute / 3.0
            fb = fc + bc + bubble + dp_sync_s
            lines += ["(min, max) time across ranks (ms):", _timer_line("forward-backward", fb, fb),
                      _timer_line("forward-compute", fc * 0.9, fc), _timer_line("backward-compute", bc * 0.9, bc)]
            if dp_sync_s:
                lines.append(_timer_line("all-grads-sync", dp_sync_s * 0.8, dp_sync_s))
            lines.append(_timer_line("optimizer", float(est.time.optimizer_s), float(est.time.optimizer_s)))
    return "\n".join(lines) + "\n"


TRUE_EFFICIENCY = {"gemm_max_frac": 0.55, "attention_frac": 0.45, "nvlink_bus_frac": 0.6, "network_bus_frac": 0.5,
                   "dp_overlap_frac": 0.5, "step_overhead_s": 0.3}
"""The "real cluster" synthetic runs are measured on: slower GEMMs and collectives than the preset."""

RUN_SPECS: list[tuple[str, int, int, int, dict[str, int]]] = [
    ("llama3-8b", 8, 4096, 128, {"tp": 1, "pp": 1}), ("llama3-8b", 16, 8192, 128, {"tp": 2, "pp": 1}),
    ("llama3-8b", 32, 4096, 256, {"tp": 2, "pp": 2, "mbs": 2}), ("llama2-7b", 16, 4096, 256, {"tp": 1, "pp": 2}),
    ("llama2-13b", 16, 4096, 128, {"tp": 4, "pp": 1}), ("qwen2.5-7b", 32, 4096, 512, {"tp": 2, "pp": 1, "mbs": 2}),
    ("llama3-70b", 64, 4096, 256, {"tp": 8, "pp": 2}), ("llama2-7b", 64, 4096, 512, {"tp": 1, "pp": 1}),
    ("llama3-8b", 8, 2048, 64, {"tp": 4, "pp": 1}), ("llama2-13b", 32, 4096, 256, {"tp": 2, "pp": 2, "vp": 2}),
    ("llama3-70b", 32, 4096, 128, {"tp": 8, "pp": 4}), ("qwen2.5-7b", 16, 4096, 128, {"tp": 1, "pp": 2}),
]


def true_efficiency(gpu: GpuSpec) -> EfficiencySpec:
    return replace(gpu.efficiency, **TRUE_EFFICIENCY)


def synthetic_runs(gpu_name: str = "h100-80gb") -> list[Run]:
    """RUN_SPECS measured on the "true" cluster (step times predicted with TRUE_EFFICIENCY)."""
    gpu = load_gpu(gpu_name)
    runs = []
    for name, n, seq, gbs, kw in RUN_SPECS:
        run = make_run(load_model(name), make_cluster(gpu, n), TrainingSpec(seq_len=seq, global_batch_size=gbs),
                       layout_for_world(n, **kw), 1.0, f"{name}/{n}/{kw}")
        runs.append(replace(run, measured_step_s=predict_step_s(run, true_efficiency(gpu))))
    return runs
