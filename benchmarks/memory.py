#!/usr/bin/env python3
"""Memory benchmark: paraplan's last-stage memory vs Megatron-LM's own CI measurements.

Data: ../shared/calibration/megatron_golden.csv (Megatron-LM functional-test golden values at
d98e8a6; see SOURCES.md): ``mem_max_allocated_bytes_max`` is torch's max allocated memory on the
last rank (= last pipeline stage). We compare it with ``per_stage[-1].total_bytes`` less the fragmentation
allowance (max allocated counts live tensors, not the allocator's reserved-but-free blocks) for every
GPT/MoE decoder row whose GPU count is known, and print the median and p90 absolute percentage
error for dense and MoE rows separately. The last line is the headline:

    memory: dense median APE X% p90 Y% (N rows); moe median APE X% p90 Y% (M rows)

``--headroom`` prints the session-5 one-sided margin instead (paraplan.headroom.MEMORY_UNDER_PREDICTION_P80,
no longer the planner's default, which is the memory band of paraplan.bands, benchmarks/bands.py): the 80th
percentile of measured / predicted - 1 over the same rows, with its 5-fold cross-validated held-out coverage.

Also the BLOOM rows of published_runs.csv: reported nvidia-smi peaks and [OOM] verdicts.
Run: python benchmarks/memory.py [--worst 15] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from paraplan.errors import SpecError  # noqa: E402
from paraplan.estimator import estimate  # noqa: E402
from paraplan.layout import ParallelLayout  # noqa: E402
from paraplan.specs.cluster import make_cluster  # noqa: E402
from paraplan.specs.load import load_gpu, model_from_megatron_args, parse_moe_layer_freq  # noqa: E402
from paraplan.specs.training import TrainingSpec  # noqa: E402
from paraplan.units import GIB  # noqa: E402
from published_cases import pct  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration"
GOLDEN_GPU = {"dgx_a100": "a100-80gb", "dgxa100_dracooci": "a100-80gb", "dgxa100_dracooci-ord": "a100-80gb",
              "dgx_h100": "h100-80gb", "dgxh100_dgxc": "h100-80gb", "dgx_gb200": "gb200"}


def _i(x: str) -> int | None:
    x = (x or "").strip()
    return int(float(x)) if x else None


def _b(x: str) -> bool:
    return str(x).strip().lower() == "true"


def golden_case(r: dict[str, str]) -> dict[str, Any] | None:  # noqa: C901 - a flat column mapping
    """One golden row -> (model, layout, training, gpu, measured bytes), or None if unusable."""
    if r["family"] not in ("gpt", "moe", "mixtral") or r["model_kind"] not in ("dense", "moe"):
        return None
    if r["pipeline_layout"].strip() or r["hybrid_layer_pattern"].strip() or "offload" in r["test_case"]:
        return None
    if _b(r["megatron_fsdp"]) or r["hardware"] not in GOLDEN_GPU:
        return None
    mem = r["mem_max_allocated_bytes_max"]
    tp, pp, cp = _i(r["tp"]) or 1, _i(r["pp"]) or 1, _i(r["cp"]) or 1
    n = _i(r["num_gpus"])
    if not mem or n is None or n % (tp * pp * cp):
        return None
    L = _i(r["num_layers"])
    args: dict[str, Any] = {
        "num_layers": L, "hidden_size": _i(r["hidden_size"]),
        "num_attention_heads": _i(r["num_attention_heads"]),
        "vocab_size": _i(r["padded_vocab_size"]) or _i(r["vocab_size"]),
        "make_vocab_size_divisible_by": (1 if _i(r["padded_vocab_size"])
                                         else (_i(r["make_vocab_size_divisible_by"]) or 128)),
        "swiglu": _b(r["swiglu"]), "normalization": r["normalization"] or "LayerNorm",
        "position_embedding_type": r["position_embedding_type"] or "learned_absolute",
        "untie_embeddings_and_output_weights": _b(r["untie_embeddings"]),
        "add_bias_linear": not _b(r["disable_bias_linear"]),
        "max_position_embeddings": _i(r["max_position_embeddings"]) or _i(r["seq_length"]),
    }
    if not args["vocab_size"]:
        return None
    if _i(r["ffn_hidden_size"]):
        args["ffn_hidden_size"] = _i(r["ffn_hidden_size"])
    if _b(r["group_query_attention"]) and _i(r["num_query_groups"]):
        args["num_query_groups"] = _i(r["num_query_groups"])
    if _i(r["kv_channels"]):
        args["kv_channels"] = _i(r["kv_channels"])
    if _b(r["multi_latent_attention"]):
        args["multi_latent_attention"] = True
        for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if _i(r[k]):
                args[k] = _i(r[k])
    if _i(r["num_experts"]):
        args["num_experts"] = _i(r["num_experts"])
        args["moe_router_topk"] = _i(r["moe_router_topk"]) or 2
        if _i(r["moe_ffn_hidden_size"]):
            args["moe_ffn_hidden_size"] = _i(r["moe_ffn_hidden_size"])
        if _i(r["moe_shared_expert_intermediate_size"]):
            args["moe_shared_expert_intermediate_size"] = _i(r["moe_shared_expert_intermediate_size"])
        if r["moe_layer_freq"].strip():
            try:
                args["moe_layer_freq"] = parse_moe_layer_freq(r["moe_layer_freq"].strip(), L)
            except SpecError:
                return None
    if _i(r["mtp_num_layers"]):
        args["mtp_num_layers"] = _i(r["mtp_num_layers"])
    rec = r["recompute"].strip()
    recompute, modules, nlayers = "none", ("core_attn",), 1
    if rec.startswith("full"):
        recompute = "full"
        parts = rec.split("/")
        nlayers = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1
    elif rec.startswith("selective"):
        recompute = "selective"
        if "modules=[" in rec:
            modules = tuple(rec.split("modules=[")[1].rstrip("]").split())
    try:
        model = model_from_megatron_args(args, name=r["test_case"])
        layout = ParallelLayout(
            tp=tp, pp=pp, vp=_i(r["vp"]) or 1, cp=cp, ep=_i(r["ep"]) or 1, etp=_i(r["etp"]) or 0,
            dp=n // (tp * pp * cp), mbs=_i(r["micro_batch_size"]) or 1, recompute=recompute,  # type: ignore[arg-type]
            recompute_modules=modules, recompute_num_layers=nlayers,
            sequence_parallel=_b(r["sequence_parallel"]), distributed_optimizer=_b(r["distributed_optimizer"]),
            overlap_grad_reduce=_b(r["overlap_grad_reduce"]), overlap_param_gather=_b(r["overlap_param_gather"]),
            account_for_embedding="account_for_embedding" in r["test_case"],
            account_for_loss="account_for_embedding_loss" in r["test_case"] or "account_for_loss" in r["test_case"],
        )
        # --transformer-impl local builds the local layer spec (gpt_layer_specs.get_gpt_layer_local_spec), whose core
        # attention is Megatron's DotProductAttention: unfused, whatever --attention-backend says
        local = r["transformer_impl"].strip() == "local"
        backend = "unfused" if local or r["attention_backend"] in ("unfused", "local") else "flash"
        training = TrainingSpec(seq_len=_i(r["seq_length"]) or 1024,
                                global_batch_size=_i(r["global_batch_size"]) or 1,
                                precision="fp8" if r["precision"].startswith("fp8") else "bf16",
                                attention_backend=backend)
    except SpecError:
        return None
    return {"id": r["test_case"], "hw": r["hardware"], "gpu": GOLDEN_GPU[r["hardware"]], "n": n,
            "model": model, "layout": layout, "training": training, "measured": float(mem),
            "moe": model.is_moe}


HEADROOM_FOLDS = 5


def under_prediction_band(errors: list[float], q: float, folds: int = HEADROOM_FOLDS) -> dict[str, Any]:
    """The q-quantile of ``measured / predicted - 1`` (the one-sided error band), and a k-fold check of it:
    each fold's quantile from the other folds (rows dealt round-robin in file order), and the share of the
    held-out rows it covers (measured within predicted x (1 + band)); about q when the band generalises."""
    band = pct(errors, q)
    fold_bands, covered = [], 0
    for k in range(folds):
        train = [e for i, e in enumerate(errors) if i % folds != k]
        held = [e for i, e in enumerate(errors) if i % folds == k]
        fold_bands.append(pct(train, q))
        covered += sum(e <= fold_bands[-1] for e in held)
    return {"band": band, "quantile": q, "rows": len(errors), "fold_bands": fold_bands,
            "held_out_coverage": covered / len(errors) if errors else math.nan,
            "under_predicted_rows": sum(e > 0 for e in errors)}


def headroom_band() -> dict[str, Any]:
    """The band over every scored golden row (what paraplan.headroom packages, rounded to 0.1%)."""
    from paraplan.headroom import MEMORY_UNDER_PREDICTION_QUANTILE

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        _, _, under = run_golden(0)
    return under_prediction_band(under, MEMORY_UNDER_PREDICTION_QUANTILE)


def run_golden(worst: int) -> tuple[dict[str, list[float]], list[tuple[float, str]], list[float]]:
    """APEs per kind, the rows worst first, and measured / predicted - 1 of every row in file order."""
    gpus = {name: load_gpu(name) for name in set(GOLDEN_GPU.values())}
    apes: dict[str, list[float]] = {"dense": [], "moe": []}
    signed: dict[str, list[float]] = {"dense": [], "moe": []}
    rows: list[tuple[float, str]] = []
    under: list[float] = []
    skipped = 0
    with open(SHARED / "megatron_golden.csv", newline="") as f:
        for r in csv.DictReader(f):
            case = golden_case(r)
            if case is None:
                skipped += 1
                continue
            cluster = make_cluster(gpus[case["gpu"]], case["n"], None if case["gpu"] == "gb200" else 8)
            try:
                est = estimate(case["model"], cluster, case["training"], case["layout"])
            except SpecError as err:
                rows.append((math.inf, f"{case['id']}: rejected: {err}"))
                skipped += 1
                continue
            # torch's max allocated counts live tensors only: the allocator's fragmentation (reserved - allocated,
            # the fragmentation allowance of the fit check) is not in it
            last = est.stages[-1]
            pred = float(last.memory.total_bytes) - float(last.other.fragmentation_bytes)
            kind = "moe" if case["moe"] else "dense"
            ape = abs(pred - case["measured"]) / case["measured"]
            apes[kind].append(ape)
            signed[kind].append(pred / case["measured"] - 1)
            under.append(case["measured"] / pred - 1)
            rows.append((ape, f"{case['id']} [{case['hw']}] {case['layout'].short()}: "
                              f"pred {pred / GIB:.2f} GiB vs {case['measured'] / GIB:.2f} GiB"))
    print(f"golden rows used: dense {len(apes['dense'])}, moe {len(apes['moe'])}; skipped {skipped}")
    for kind in ("dense", "moe"):
        if signed[kind]:
            print(f"  {kind}: median signed error {100 * statistics.median(signed[kind]):+.1f}%")
    rows.sort(key=lambda x: -x[0] if math.isfinite(x[0]) else 0.0)
    if worst:
        print(f"worst {worst}:")
        for ape, text in rows[:worst]:
            print(f"  {100 * ape:6.1f}%  {text}")
    return apes, rows, under


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--headroom", action="store_true", help="print the session-5 one-sided memory margin (p80)")
    args = ap.parse_args()
    if args.headroom:
        b = headroom_band()
        print(f"memory under-prediction band: p{100 * b['quantile']:.0f} of measured/predicted - 1 = "
              f"{100 * b['band']:.1f}% over {b['rows']} golden rows ({b['under_predicted_rows']} under-predicted); "
              f"{HEADROOM_FOLDS}-fold: fold bands "
              + ", ".join(f"{100 * x:.1f}%" for x in b["fold_bands"])
              + f", held-out coverage {100 * b['held_out_coverage']:.1f}%")
        print(f"MEMORY_UNDER_PREDICTION_P80 = {b['band']:.3f}")
        return 0
    apes, _, _ = run_golden(args.worst)
    from bloom_memory import run_bloom  # type: ignore[import-not-found]

    run_bloom()
    parts = []
    for kind in ("dense", "moe"):
        xs = apes[kind]
        parts.append(f"{kind} median APE {100 * pct(xs, 0.5):.1f}% p90 {100 * pct(xs, 0.9):.1f}% ({len(xs)} rows)")
    print("memory: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
