"""BLOOM memory rows of published_runs.csv (BigScience tr11-176B chronicles-prequel, Jean Zay A100 80GB).

The sources report the maximum nvidia-smi memory of the first/last nodes (GB, read as GiB, which
includes the CUDA context and PyTorch's cached blocks) and six out-of-memory configurations.
Models: Megatron-DeepSpeed GPT with vocab 250,680, LayerNorm, GeLU, biases, tied embeddings,
ALiBi (no position parameters), full activation checkpointing, ZeRO-1 (see SOURCES.md section 9).
We compare max(first stage, last stage) total + the GPU's reserved bytes with the reading, and
check that the OOM rows are predicted not to fit. Megatron-DeepSpeed's ZeRO-1 keeps two
communication buckets that Megatron-Core does not have (DeepSpeed defaults reduce_bucket_size and
allgather_bucket_size = 5e8 elements, fp16: 2 GB together); they are added to the workspace here.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

from paraplan.errors import SpecError
from paraplan.estimate.memory import MemoryOptions
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, model_from_megatron_args
from paraplan.specs.training import TrainingSpec

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration"


def bloom_rows() -> list[dict[str, str]]:
    with open(SHARED / "published_runs.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["source"].startswith("bigscience")]


def bloom_case(r: dict[str, str]) -> dict[str, Any] | None:
    """Row -> specs, or None when the row has no memory information."""
    oom = not r["step_time_s"] and not r["tflops_per_gpu"]
    if not r["peak_mem_gb"] and not oom:
        return None
    if "CHECK:" in r["notes"]:
        return None
    L, h, a = int(r["num_layers"]), int(r["hidden_size"]), int(r["num_heads"])
    pp_ = int(r["pp"])
    # DeepSpeed's PipelineModule splits layers unevenly (partition_method type:transformer), which
    # Megatron-Core does not allow: stand in with ceil(L/PP) layers on every stage (the most any
    # stage holds).
    L = -(-L // pp_) * pp_
    model = model_from_megatron_args({
        "num_layers": L, "hidden_size": h, "num_attention_heads": a,
        "vocab_size": int(r["vocab_size"] or 250680), "normalization": "LayerNorm",
        "position_embedding_type": "none", "untie_embeddings_and_output_weights": False,
    }, name=r["model"])
    n, tp, pp = int(r["num_gpus"]), int(r["tp"]), int(r["pp"])
    dp = int(r["dp"] or n // (tp * pp))
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=int(r["mbs"]), recompute="full",
                            sequence_parallel=False, distributed_optimizer=dp > 1,
                            overlap_grad_reduce=False, overlap_param_gather=False)
    precision = "fp16" if r["precision"].strip() == "fp16" else "bf16"
    training = TrainingSpec(seq_len=int(r["seq_length"]), global_batch_size=int(r["gbs"]),
                            attention_backend="unfused", precision=precision)  # type: ignore[arg-type]
    return {"model": model, "layout": layout, "training": training, "n": n, "oom": oom,
            "measured": None if oom else float(r["peak_mem_gb"]) * 2**30, "label": r["model"]}


def run_bloom() -> dict[str, Any]:
    """Print the BLOOM memory comparison; returns the figures."""
    gpu = load_gpu("a100-80gb")
    apes, signed, oom_said, oom_total, rejected, fit_said = [], [], 0, 0, 0, 0
    for r in bloom_rows():
        try:
            case = bloom_case(r)
            if case is None:
                continue
            zero_buckets = 2 * 5e8 * 2 if case["layout"].dp > 1 else 0.0
            options = MemoryOptions(workspace_bytes=MemoryOptions().workspace_bytes + zero_buckets)
            est = estimate(case["model"], make_cluster(gpu, case["n"], 8), case["training"], case["layout"],
                           memory_options=options)
        except SpecError:
            rejected += 1
            continue
        peak = max(float(est.stages[0].memory.total_bytes), float(est.stages[-1].memory.total_bytes))
        if case["oom"]:
            oom_total += 1
            oom_said += int(not est.fits)
            continue
        fit_said += int(est.fits)
        pred = peak + gpu.reserved_bytes
        apes.append(abs(pred - case["measured"]) / case["measured"])
        signed.append(pred / case["measured"] - 1)
    within = sum(1 for x in apes if x <= 0.15)
    med = statistics.median(apes) if apes else math.nan
    print(f"BLOOM nvidia-smi peaks: median APE {100 * med:.1f}%, median signed "
          f"{100 * statistics.median(signed):+.1f}%, within 15%: {within}/{len(apes)}; "
          f"OOM rows predicted not to fit: {oom_said}/{oom_total}; other rows predicted to fit: "
          f"{fit_said}/{len(apes)}; rejected {rejected}")
    return {"median_ape": med, "within15": within, "n": len(apes), "oom_said": oom_said, "oom_total": oom_total}
