"""BLOOM memory rows of published_runs.csv (BigScience tr11-176B chronicles-prequel, Jean Zay A100 80GB).

The sources report the maximum nvidia-smi memory of the first/last nodes (GB, read as GiB, which
includes the CUDA context, NCCL buffers and PyTorch's cached blocks) and six out-of-memory
configurations. Models: Megatron-DeepSpeed GPT with vocab 250,680, LayerNorm, GeLU, biases, tied
embeddings, ALiBi (no position parameters), full activation checkpointing, ZeRO-1 (SOURCES.md
section 9).

paraplan models Megatron-Core's allocated memory. Megatron-DeepSpeed holds more, and nvidia-smi
sees more than torch allocates; the comparison adds, per GPU:

1. ``deepspeed_state_extra_bytes``: what DeepSpeed's optimizers keep that Megatron-Core does not
   (named terms with their source, no fitting);
2. ``RESERVED``: the GPU preset's reserved bytes (CUDA context);
3. one per-process constant for the rest of what nvidia-smi shows outside live tensors (NCCL
   communicator buffers of the ~10 process groups Megatron-DeepSpeed creates, the caching
   allocator's free blocks, JIT-loaded kernels). It is not reported by the source, so it is fitted
   as the median residual and scored leave-one-out: each row is predicted with the constant fitted
   on the other rows, and the OOM rows never enter the fit.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

from paraplan.errors import SpecError
from paraplan.estimate.memory import MemoryBreakdown
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, model_from_megatron_args
from paraplan.specs.training import TrainingSpec
from paraplan.units import GIB

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "published_runs.csv"

DS_BUCKET_ELEMENTS = 5e8
"""DeepSpeed ZeRO defaults reduce_bucket_size = allgather_bucket_size = 5e8 elements
(deepspeed/runtime/zero/config.py); BLOOM's ds_config left them at the defaults."""


def bloom_rows(path: Path = SHARED) -> list[dict[str, str]]:
    """The BigScience rows of published_runs.csv (or a copy with the same columns)."""
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["source"].startswith("bigscience")]


def deepspeed_layer_split(num_layers: int, pp: int, count_embedding: bool) -> list[int]:
    """Transformer layers per pipeline stage as DeepSpeed's PipelineModule assigns them.

    Megatron-DeepSpeed's GPTModelPipe partitions with ``partition_method='type:transformer'``
    unless ``--pp-partition-method`` says otherwise; BLOOM's "Rebalancing layers" runs used
    ``'type:transformer|embedding'``, which also counts the two tied EmbeddingPipe specs (first and
    last) as units. DeepSpeed (deepspeed/runtime/utils.py ``partition_balanced``, 0.6.0) finds the
    smallest bottleneck B that a greedy left-to-right fill can meet; with unit weights that is
    B = ceil(units / pp), and the greedy fill (``_lprobe``) gives every stage B units until they run
    out. So type:transformer puts B layers on every stage but the last (78 layers on PP 12: 7 x 11
    and 1), and type:transformer|embedding gives the first and last stage one layer less than the
    middle ones. Checked against DeepSpeed 0.6.0's own code (tests/golden/test_bloom_memory.py).
    """
    units = num_layers + (2 if count_embedding else 0)
    bottleneck = -(-units // pp)
    loads = [min(bottleneck, max(units - i * bottleneck, 0)) for i in range(pp)]
    if count_embedding:
        loads[0] -= 1
        loads[-1] -= 1
    if min(loads) < 0 or sum(loads) != num_layers:
        raise SpecError(f"num_layers={num_layers} on pp={pp}: stage left without layers")
    return loads


def bloom_case(r: dict[str, str]) -> dict[str, Any] | None:
    """Row -> specs, or None when the row has no memory information."""
    oom = not r["step_time_s"] and not r["tflops_per_gpu"]
    if not r["peak_mem_gb"] and not oom:
        return None
    if "CHECK:" in r["notes"]:
        return None
    L, h, a = int(r["num_layers"]), int(r["hidden_size"]), int(r["num_heads"])
    model = model_from_megatron_args({
        "num_layers": L, "hidden_size": h, "num_attention_heads": a,
        "vocab_size": int(r["vocab_size"] or 250680), "normalization": "LayerNorm",
        "position_embedding_type": "none", "untie_embeddings_and_output_weights": False,
    }, name=r["model"])
    n, tp, pp = int(r["num_gpus"]), int(r["tp"]), int(r["pp"])
    dp = int(r["dp"] or n // (tp * pp))
    zero1 = dp > 1 and not r["distributed_optimizer"].startswith("ZeRO stage 0")
    split = deepspeed_layer_split(L, pp, count_embedding="type:transformer|embedding" in r["notes"])
    uneven = len(set(split)) > 1
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=int(r["mbs"]), recompute="full",
                            sequence_parallel=False, distributed_optimizer=zero1,
                            overlap_grad_reduce=False, overlap_param_gather=False,
                            first_stage_layers=split[0] if uneven else 0,
                            last_stage_layers=split[-1] if uneven else 0)
    precision = "fp16" if r["precision"].strip() == "fp16" else "bf16"
    training = TrainingSpec(seq_len=int(r["seq_length"]), global_batch_size=int(r["gbs"]),
                            attention_backend="unfused", precision=precision)  # type: ignore[arg-type]
    return {"model": model, "layout": layout, "training": training, "n": n, "oom": oom,
            "measured": None if oom else float(r["peak_mem_gb"]) * GIB,
            "label": f"{r['model']} {r['source_detail'].rsplit('(', 1)[-1].rstrip(')')}"}


def deepspeed_state_extra_bytes(stage: MemoryBreakdown, precision: str, dp: int) -> dict[str, float]:
    """Per-GPU bytes Megatron-DeepSpeed holds beyond Megatron-Core's accounting of a stage.

    Sources: DeepSpeed 0.6.3 (the release with the BF16_Optimizer BLOOM used),
    deepspeed/runtime/{pipe/engine.py, bf16_optimizer.py, zero/stage_1_and_2.py, utils.py}.

    - ``reduce_bucket`` = 5e8 elements x 2 B, fp16 with ZeRO-1 over DP > 1: with pipeline
      parallelism ZeRO-1's ``reduce_gradients`` allocates the ipg bucket (reduce_bucket_size).
      bf16 has none: the pipeline engine runs bf16 only with ZeRO stage 0 plus BF16_Optimizer, and
      all-reduces the optimizer's flat fp32 gradient groups in place (``_bf16_reduce_grads``;
      ``flatten`` of a single tensor is a view).
    - ``allgather_bucket`` = 5e8 elements x 2 B when optimizer state is sharded over DP > 1: both
      optimizers all-gather the updated 16-bit weights with ``all_gather_dp_groups`` in shards of
      allgather_bucket_size elements, which torch.distributed stages in one flat output buffer.
    - ``bf16_lp_grads`` = 2 B x parameters held, bf16 only: BF16_Optimizer accumulates gradients in
      an fp32 buffer for every parameter (``fp32_groups_gradients_flat``) and keeps the bf16
      ``.grad`` of every parameter from the end of one backward to the start of the next
      (``update_hp_grads(clear_lp_grads=False)``): 2 + 4 B of gradients per parameter, where
      Megatron-Core keeps 4 (fp32 main grads).
    fp16 with ZeRO-1 keeps 2 B fp16 grads and fp32 gradient partitions, which paraplan's fp16
    accounting (2 B grads + 16 B/DP optimizer state) already matches.
    """
    params = float(stage.weights_bytes) / 2.0  # 16-bit weights
    bucket = DS_BUCKET_ELEMENTS * 2
    return {
        "reduce_bucket": bucket if dp > 1 and precision == "fp16" else 0.0,
        "allgather_bucket": bucket if dp > 1 else 0.0,
        "bf16_lp_grads": 2.0 * params if precision == "bf16" else 0.0,
    }


def predicted_rows(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Per row: the predicted nvidia-smi peak without the fitted constant, measured bytes, OOM flag."""
    gpu = load_gpu("a100-80gb")
    out = []
    for r in rows:
        try:
            case = bloom_case(r)
            if case is None:
                continue
            est = estimate(case["model"], make_cluster(gpu, case["n"], 8), case["training"], case["layout"])
        except SpecError:
            continue
        precision = case["training"].precision
        dp = case["layout"].dp if case["layout"].distributed_optimizer else 1  # sharded state
        per_stage = [float(s.memory.total_bytes) + sum(deepspeed_state_extra_bytes(s.memory, precision, dp).values())
                     for s in est.stages]
        # The source read nvidia-smi on the first and last nodes (the first and last pipeline
        # stages: Megatron-DeepSpeed puts TP innermost, then DP, then PP); an OOM or a fit is
        # decided by the fullest stage anywhere.
        out.append({"label": case["label"], "precision": precision, "oom": case["oom"],
                    "measured_bytes": case["measured"],
                    "base_bytes": max(per_stage[0], per_stage[-1]) + gpu.reserved_bytes,
                    "base_any_stage_bytes": max(per_stage) + gpu.reserved_bytes,
                    "capacity_bytes": gpu.hbm_bytes})
    return out


def score(preds: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit the per-process constant (median residual) and score rows leave-one-out."""
    meas = [p for p in preds if not p["oom"]]
    resid = [p["measured_bytes"] - p["base_bytes"] for p in meas]
    constant = statistics.median(resid)
    apes, signed, fit_missed = [], [], []
    for i, p in enumerate(meas):
        loo = statistics.median(resid[:i] + resid[i + 1:])
        pred = p["base_bytes"] + loo
        apes.append(abs(pred - p["measured_bytes"]) / p["measured_bytes"])
        signed.append(pred / p["measured_bytes"] - 1)
        if p["base_any_stage_bytes"] + loo > p["capacity_bytes"]:
            fit_missed.append(p["label"])
    ooms = [p for p in preds if p["oom"]]
    oom_missed = [p["label"] for p in ooms if p["base_any_stage_bytes"] + constant <= p["capacity_bytes"]]
    cross = {}
    for fit_on, test_on in (("fp16", "bf16"), ("bf16", "fp16")):
        train = [r for p, r in zip(meas, resid, strict=True) if p["precision"] == fit_on]
        test = [p for p in meas if p["precision"] == test_on]
        if train and test:
            c = statistics.median(train)
            cross[f"{fit_on}->{test_on}"] = statistics.median(
                abs(p["base_bytes"] + c - p["measured_bytes"]) / p["measured_bytes"] for p in test)
    return {"constant_bytes": constant, "median_ape": statistics.median(apes) if apes else math.nan,
            "median_signed": statistics.median(signed) if signed else math.nan,
            "within15": sum(1 for x in apes if x <= 0.15), "n": len(apes),
            "oom_said": len(ooms) - len(oom_missed), "oom_total": len(ooms), "oom_missed": oom_missed,
            "fit_said": len(meas) - len(fit_missed), "fit_missed": fit_missed, "cross_precision": cross,
            "median_ape_no_constant": statistics.median(
                abs(p["base_bytes"] - p["measured_bytes"]) / p["measured_bytes"] for p in meas)}


def run_bloom(path: Path = SHARED) -> dict[str, Any]:
    """Print the BLOOM memory comparison; returns the figures."""
    s = score(predicted_rows(bloom_rows(path)))
    print(f"BLOOM nvidia-smi peaks (Megatron-DeepSpeed terms + fitted per-process constant "
          f"{s['constant_bytes'] / GIB:.1f} GiB, leave-one-out): median APE {100 * s['median_ape']:.1f}% "
          f"(without the constant {100 * s['median_ape_no_constant']:.1f}%), median signed "
          f"{100 * s['median_signed']:+.1f}%, within 15%: {s['within15']}/{s['n']}; OOM rows predicted "
          f"not to fit: {s['oom_said']}/{s['oom_total']}; other rows predicted to fit: {s['fit_said']}/{s['n']}")
    print("  constant fitted on one precision, scored on the other: " + ", ".join(
        f"{k} median APE {100 * v:.1f}%" for k, v in s["cross_precision"].items()))
    for label in s["oom_missed"]:
        print(f"  OOM row predicted to fit: {label}")
    for label in s["fit_missed"]:
        print(f"  measured row predicted not to fit: {label}")
    return s


if __name__ == "__main__":
    run_bloom()
