#!/usr/bin/env python3
"""Oracle worker: count the parameters megatron-core instantiates on each rank.

Adapted from ``shared/tools/mcore_params.py`` (the project's shared oracle tool: builds an
mcore GPTModel on CPU per rank and prints per-rank parameter counts as JSON). Changes here:
a ``dp`` field (expert grids larger than TP x PP), ``pos`` / ``seq`` for learned-absolute vs
RoPE positions, per-chunk layer numbers and EP ranks in the output, an optional output file,
MoE layer patterns and shared experts (built, as Megatron-LM's ``gpt_builders`` does for MoE
models, from ``get_gpt_decoder_block_spec(config, use_transformer_engine=False)``), QK norms,
multi-latent attention, MTP blocks, uneven first/last pipeline stages and
``pipeline_model_parallel_layout``, and fork-after-import rank processes (the ~4 s
torch + megatron-core import is paid once per case, not once per rank).

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
    moe_layer_freq (int, or a 0/1 list of num_layers values: Megatron's --moe-layer-freq),
    moe_shared_ffn (moe_shared_expert_intermediate_size, null = none), moe_shared_gate (bool),
    qk_layernorm (bool),
    mla (bool: MLATransformerConfig + MLA local spec), q_lora_rank (null = full-rank Q),
    kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim,
    mla_down_proj ("duplicated": the MLA down projections are whole on every TP rank, as the
    Transformer Engine spec builds them (TELinear, parallel_mode="duplicated"); "column": the
    local spec's ColumnParallelLinear, which splits them over TP),
    mtp_num_layers (null = none; the MTP layer copies the spec of the last decoder layer),
    tp, pp, vpp (virtual pipeline chunks per rank, or null), dp,
    first_stage_layers / last_stage_layers (num_layers_in_first/last_pipeline_stage, null = even),
    pipeline_layout (pipeline_model_parallel_layout string, e.g. "Ett|ttt|tt|tL", or null),
    make_vocab_size_divisible_by (padding rule, as in Megatron-LM training:
    padded = ceil(vocab / (divisible_by * tp)) * divisible_by * tp)

Environment: MCORE_WORKER_START=spawn starts the rank processes with "spawn" (fresh
interpreters) instead of the default "fork" after importing megatron-core in the parent.
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
    "moe_layer_freq": 1,
    "moe_shared_ffn": None,
    "moe_shared_gate": False,
    "qk_layernorm": False,
    "mla": False,
    "q_lora_rank": None,
    "kv_lora_rank": 64,
    "qk_head_dim": 32,
    "qk_pos_emb_head_dim": 16,
    "v_head_dim": 32,
    "mla_down_proj": "duplicated",
    "mtp_num_layers": None,
    "first_stage_layers": None,
    "last_stage_layers": None,
    "pipeline_layout": None,
}


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM training's ``_vocab_size_with_padding``."""
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


def classify(name: str) -> str:
    """Bucket of a named parameter (MTP blocks apart, their routed experts with the others)."""
    if name.startswith("mtp."):
        return "routed_experts" if ".experts." in name else "mtp"
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
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

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
        qk_layernorm=bool(case["qk_layernorm"]),
    )
    if case["mtp_num_layers"]:
        kw["mtp_num_layers"] = case["mtp_num_layers"]
    if case["first_stage_layers"] is not None:
        kw["num_layers_in_first_pipeline_stage"] = case["first_stage_layers"]
    if case["last_stage_layers"] is not None:
        kw["num_layers_in_last_pipeline_stage"] = case["last_stage_layers"]
    if case["pipeline_layout"] is not None:
        kw["pipeline_model_parallel_layout"] = case["pipeline_layout"]
    if case["etp"] is not None:
        kw["expert_tensor_parallel_size"] = case["etp"]
    if case["moe_num_experts"]:
        kw.update(
            num_moe_experts=case["moe_num_experts"],
            moe_ffn_hidden_size=case["moe_ffn"] or case["ffn"],
            moe_router_topk=case["moe_topk"],
            moe_layer_freq=case["moe_layer_freq"],
            moe_shared_expert_intermediate_size=case["moe_shared_ffn"],
            moe_shared_expert_gate=bool(case["moe_shared_gate"]),
        )
    if case["mla"]:
        kw.pop("num_query_groups")
        kw.update(
            q_lora_rank=case["q_lora_rank"],
            kv_lora_rank=case["kv_lora_rank"],
            qk_head_dim=case["qk_head_dim"],
            qk_pos_emb_head_dim=case["qk_pos_emb_head_dim"],
            v_head_dim=case["v_head_dim"],
            rope_type="rope",
        )
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def _core_attention_class() -> type:
    """A parameter-free core attention that accepts MLA's constructor arguments.

    megatron-core 0.16.1's local MLA spec cannot be built: ``MLASelfAttention`` passes
    ``k_channels`` / ``v_channels`` to its core attention, which the local
    ``DotProductAttention`` does not accept (only TEDotProductAttention does). Core attention
    holds no parameters in either backend, so this stand-in changes no count.
    """
    import torch

    class MLACoreAttention(torch.nn.Module):
        def __init__(self, **_: Any) -> None:
            super().__init__()

    return MLACoreAttention


def _patch_mla_specs(layer_specs: list[Any], down_proj: str) -> None:
    """Make megatron-core 0.16.1's local MLA layer spec buildable on CPU, and choose how its
    down projections are split.

    Two fixes, neither changing a parameter count:
    * ``multi_latent_attention.HAVE_TE`` is True without Transformer Engine (its TE names are
      MagicMocks from ``megatron.core.extensions.transformer_engine``), so
      ``isinstance(self.linear_proj, TELinear)`` raises; set it to False.
    * core attention: ``_core_attention_class``.

    ``down_proj`` "duplicated" builds linear_q_down_proj / linear_kv_down_proj with mcore's
    own ``megatron.core.post_training.modelopt.layers.Linear`` (a torch.nn.Linear holding the
    whole h x c weight on every TP rank, what ModelOpt's local MLA spec uses), which matches the
    Transformer Engine spec (``backend.linear()`` = TELinear, parallel_mode="duplicated").
    "column" keeps the local spec's ColumnParallelLinear, which splits them over TP.
    """
    from megatron.core.post_training.modelopt.layers import Linear
    from megatron.core.transformer import multi_latent_attention as mla_module

    mla_module.HAVE_TE = False
    mla_module.Linear = Linear
    core = _core_attention_class()
    for spec in layer_specs:
        sub = spec.submodules.self_attention.submodules
        sub.core_attention = core
        if down_proj == "duplicated":
            sub.linear_q_down_proj = Linear
            sub.linear_kv_down_proj = Linear


def _import_mcore() -> None:
    """Import what the ranks use (done once in the parent before forking them)."""
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed  # noqa: F401
    from megatron.core import parallel_state  # noqa: F401
    from megatron.core.models.gpt import gpt_layer_specs, gpt_model  # noqa: F401
    from megatron.core.post_training.modelopt import layers  # noqa: F401
    from megatron.core.transformer import multi_latent_attention  # noqa: F401


def _layout_vpp(case: dict[str, Any]) -> int | None:
    """Virtual pipeline size implied by a pipeline layout string (None without one or if 1)."""
    if not case["pipeline_layout"]:
        return None
    vpp = len(case["pipeline_layout"].split("|")) // case["pp"]
    return vpp if vpp > 1 else None


def worker(rank: int, world_size: int, case: dict[str, Any], init_file: str, out_dir: str) -> None:
    """One rank: build the model chunks this rank owns and write its counts to out_dir."""
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        # mcore moves the tied embedding copy (and MoE router parameters) to CUDA in places;
        # we only count parameters, so let .cuda() be a no-op on this CPU-only torch, and let
        # "the current CUDA device" be the CPU (MLA's RotaryEmbedding builds inv_freq there).
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    dist.init_process_group(
        backend="gloo", init_method=f"file://{init_file}", world_size=world_size, rank=rank
    )
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    ps.initialize_model_parallel(
        tensor_model_parallel_size=case["tp"],
        pipeline_model_parallel_size=case["pp"],
        virtual_pipeline_model_parallel_size=case["vpp"] or _layout_vpp(case),
        expert_model_parallel_size=case["ep"],
        expert_tensor_parallel_size=case["etp"],
    )
    config = _config(case)
    vocab = padded_vocab(case["vocab"], case["make_vocab_size_divisible_by"], case["tp"])
    vpp = config.virtual_pipeline_model_parallel_size  # also set by a pipeline layout

    models = []
    for vp in range(vpp or 1):
        vp_stage = vp if vpp else None
        if case["moe_num_experts"]:
            # Megatron-LM's gpt_builders: MoE models use the decoder block spec, which mixes
            # dense and MoE layers by moe_layer_freq and slices this stage's layers.
            spec: Any = get_gpt_decoder_block_spec(
                config, use_transformer_engine=False, normalization=case["norm"],
                vp_stage=vp_stage,
            )
            layer_specs = list(spec.layer_specs)
            # The MTP layer copies the global last decoder layer (gpt_builders falls back to
            # the full layer spec when this stage builds no decoder layer).
            mtp_layer = get_gpt_decoder_layer_specs(
                config, use_transformer_engine=False, normalization=case["norm"])[-1]
            mtp_src: Any = spec if layer_specs else mtp_layer
            layer_specs.append(mtp_layer)
        else:
            spec = get_gpt_layer_local_spec(
                num_experts=None, normalization=case["norm"],
                qk_layernorm=bool(case["qk_layernorm"]), multi_latent_attention=bool(case["mla"]),
            )
            mtp_src, layer_specs = spec, [spec]
        if case["mla"]:
            _patch_mla_specs(layer_specs, case["mla_down_proj"])
        mtp_spec = None
        if case["mtp_num_layers"]:
            mtp_spec = get_gpt_mtp_block_spec(
                config, mtp_src, use_transformer_engine=False, vp_stage=vp_stage)
        kw: dict[str, Any] = {}
        if mtp_spec is not None:
            kw["mtp_block_spec"] = mtp_spec
        if vpp:
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
        start = os.environ.get("MCORE_WORKER_START", "fork")
        if start == "fork":
            _import_mcore()
        mp.start_processes(
            worker,
            args=(world, case, os.path.join(tmp, "init"), tmp),
            nprocs=world,
            join=True,
            start_method=start,
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
