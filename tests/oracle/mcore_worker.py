#!/usr/bin/env python3
"""Oracle worker: count the parameters megatron-core instantiates on each rank.

Adapted from ``shared/tools/mcore_params.py`` (the project's shared oracle tool: builds an
mcore GPTModel on CPU per rank and prints per-rank parameter counts as JSON). Changes here:
a ``dp`` field (expert grids larger than TP x PP), ``pos`` / ``seq`` for learned-absolute vs
RoPE positions, per-chunk layer numbers and EP ranks in the output, and an optional output file.

Builds a megatron-core GPTModel on CPU with the gloo backend, one process per rank
(TP x PP x DP ranks), using the "local" layer spec (no CUDA, no Transformer Engine, no Apex),
and reports, for every rank, the number of parameters it holds, split into embedding /
output_layer / decoder_layers / routed_experts / final_norm, plus the global layer numbers
(1-based, chunk by chunk) it builds.

Usage (venv with ``pip install torch==2.13.0 megatron-core==0.16.1``):
    python mcore_worker.py case.json            # JSON document on stdout
    python mcore_worker.py case.json out.json   # ... written to out.json instead
    echo '{"tp":4,"pp":1}' | python mcore_worker.py -

Case fields (all optional; defaults in DEFAULT_CASE):
    num_layers, hidden, heads, kv_heads (num_query_groups; null = MHA), ffn, vocab,
    seq (max_sequence_length = max_position_embeddings), pos ("rope"|"learned_absolute"),
    swiglu (bool), tied (bool: share embeddings and output weights),
    norm ("RMSNorm"|"LayerNorm"), bias (bool: add_bias_linear),
    moe_num_experts (null = dense), moe_ffn, moe_topk, ep, etp (null = TP),
    tp, pp, vpp (virtual pipeline chunks per rank, or null), dp,
    make_vocab_size_divisible_by (padding rule, as in Megatron-LM training:
    padded = ceil(vocab / (divisible_by * tp)) * divisible_by * tp)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any

DEFAULT_CASE: dict[str, Any] = {
    "num_layers": 8,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 4,
    "ffn": 2048,
    "vocab": 32000,
    "seq": 256,
    "pos": "rope",
    "swiglu": True,
    "tied": False,
    "norm": "RMSNorm",
    "bias": False,
    "moe_num_experts": None,
    "moe_ffn": None,
    "moe_topk": 2,
    "ep": 1,
    "etp": None,
    "tp": 2,
    "pp": 2,
    "vpp": None,
    "dp": 1,
    "make_vocab_size_divisible_by": 128,
}


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM training's ``_vocab_size_with_padding``."""
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


def classify(name: str) -> str:
    """Bucket of a named parameter."""
    if "embedding" in name:
        return "embedding"
    if name.startswith("output_layer") or ".output_layer." in name:
        return "output_layer"
    if "final_layernorm" in name or "final_norm" in name:
        return "final_norm"
    if ".experts." in name:
        return "routed_experts"
    if ".layers." in name:
        return "decoder_layers"
    return "other"


def _config(case: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw: dict[str, Any] = dict(
        num_layers=case["num_layers"],
        hidden_size=case["hidden"],
        num_attention_heads=case["heads"],
        num_query_groups=case["kv_heads"],
        ffn_hidden_size=case["ffn"],
        tensor_model_parallel_size=case["tp"],
        pipeline_model_parallel_size=case["pp"],
        virtual_pipeline_model_parallel_size=case["vpp"],
        expert_model_parallel_size=case["ep"],
        # sequence_parallel does not change parameter counts; the local (torch) norm used
        # without Apex/TE refuses it, so it stays off here.
        sequence_parallel=False,
        gated_linear_unit=bool(case["swiglu"]),
        activation_func=F.silu if case["swiglu"] else F.gelu,
        normalization=case["norm"],
        add_bias_linear=bool(case["bias"]),
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    if case["etp"] is not None:
        kw["expert_tensor_parallel_size"] = case["etp"]
    if case["moe_num_experts"]:
        kw.update(
            num_moe_experts=case["moe_num_experts"],
            moe_ffn_hidden_size=case["moe_ffn"] or case["ffn"],
            moe_router_topk=case["moe_topk"],
        )
    return TransformerConfig(**kw)


def worker(rank: int, world_size: int, case: dict[str, Any], init_file: str, out_dir: str) -> None:
    """One rank: build the model chunks this rank owns and write its counts to out_dir."""
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        # mcore moves the tied embedding copy (and MoE router parameters) to CUDA in places;
        # we only count parameters, so let .cuda() be a no-op on this CPU-only torch.
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    dist.init_process_group(
        backend="gloo", init_method=f"file://{init_file}", world_size=world_size, rank=rank
    )
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    ps.initialize_model_parallel(
        tensor_model_parallel_size=case["tp"],
        pipeline_model_parallel_size=case["pp"],
        virtual_pipeline_model_parallel_size=case["vpp"],
        expert_model_parallel_size=case["ep"],
        expert_tensor_parallel_size=case["etp"],
    )
    config = _config(case)
    spec = get_gpt_layer_local_spec(num_experts=case["moe_num_experts"], normalization=case["norm"])
    vocab = padded_vocab(case["vocab"], case["make_vocab_size_divisible_by"], case["tp"])

    models = []
    for vp in range(case["vpp"] or 1):
        kw: dict[str, Any] = {}
        if case["vpp"]:
            kw["vp_stage"] = vp
            pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
            post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        else:
            pre = ps.is_pipeline_first_stage()
            post = ps.is_pipeline_last_stage()
        models.append(
            GPTModel(
                config=config,
                transformer_layer_spec=spec,
                vocab_size=vocab,
                max_sequence_length=case["seq"],
                pre_process=pre,
                post_process=post,
                share_embeddings_and_output_weights=bool(case["tied"]),
                position_embedding_type=case["pos"],
                **kw,
            )
        )

    breakdown: dict[str, int] = {}
    total = 0
    chunk_layers: list[list[int]] = []
    for m in models:
        for name, p in m.named_parameters():
            k = classify(name)
            breakdown[k] = breakdown.get(k, 0) + p.numel()
            total += p.numel()
        chunk_layers.append([int(layer.layer_number) for layer in m.decoder.layers])
    res = {
        "rank": rank,
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_rank": ps.get_data_parallel_rank(),
        "ep_rank": ps.get_expert_model_parallel_rank(),
        "params": total,
        "breakdown": breakdown,
        "chunk_layers": chunk_layers,
        "layer_numbers": [n for c in chunk_layers for n in c],
        "padded_vocab": vocab,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(case_in: dict[str, Any]) -> dict[str, Any]:
    """Spawn one process per rank and gather their counts."""
    import torch.multiprocessing as mp

    unknown = set(case_in) - set(DEFAULT_CASE)
    if unknown:
        raise SystemExit(f"unknown case fields: {sorted(unknown)}")
    case = {**DEFAULT_CASE, **case_in}
    world = case["tp"] * case["pp"] * case["dp"]
    tmp = tempfile.mkdtemp(prefix="mcore_worker_")
    try:
        mp.start_processes(
            worker,
            args=(world, case, os.path.join(tmp, "init"), tmp),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        ranks = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "case": case,
        "world_size": world,
        "ranks": ranks,
        "max_params_per_rank": max(r["params"] for r in ranks),
        "sum_params_over_ranks": sum(r["params"] for r in ranks),
    }


def main() -> None:
    case: dict[str, Any] = {}
    if len(sys.argv) > 1:
        if sys.argv[1] == "-":
            case = json.loads(sys.stdin.read())
        else:
            with open(sys.argv[1]) as f:
                case = json.load(f)
    out = run_case(case)
    text = json.dumps(out, indent=1)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
