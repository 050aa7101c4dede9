"""Oracle: paraplan's per-stage parameter counts equal what megatron-core instantiates.

Each case builds a real megatron-core GPTModel on CPU (gloo, one process per rank) in a
subprocess (``mcore_worker.py``) and, for every pipeline rank, checks that

* all ranks of that stage (TP, and DP/EP where present) hold the same number of parameters;
* the global layers that rank builds are the ones ``paraplan.estimate.pipeline`` assigns it;
* that number equals ``stage_params(...).total`` for the stage, exactly.

Coverage: GPT/Llama-style dense models, MQA, interleaved and uneven pipelines (first/last stage
counts, ``pipeline_model_parallel_layout``), MoE with EP/ETP, layer patterns and shared experts,
QK norms, multi-latent attention (TE-like duplicated down projections, see mcore_worker.py) and
MTP blocks. Ranks are forked after one megatron-core import per case (about 4-6 s a case).

Needs the ``oracle`` extra (torch CPU + megatron-core); skipped otherwise.
Run: ``PYTHONPATH=src .venv-oracle/bin/pytest tests/oracle -q -m oracle``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # megatron.core warns at import time when Apex/Transformer Engine are absent (always on CPU).
    warnings.simplefilter("ignore")
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")

from paraplan.estimate.params import stage_params
from paraplan.estimate.pipeline import pipeline_layout_string, stage_assignment
from paraplan.estimate.stages import all_stage_layers
from paraplan.layout import ParallelLayout
from paraplan.specs.load import model_from_megatron_args
from paraplan.specs.model import ModelSpec

pytestmark = pytest.mark.oracle

WORKER = Path(__file__).with_name("mcore_worker.py")
CASE_TIMEOUT_S = 180

# Small models (hidden 256-512, 8 layers) so each case builds in seconds on 2 CPU cores.
# Field names are mcore_worker.py's; missing fields take its DEFAULT_CASE.
GPT = dict(hidden=512, heads=8, kv_heads=None, ffn=2048, swiglu=False, norm="LayerNorm",
           bias=True, pos="learned_absolute", tied=True)
LLAMA = dict(hidden=512, heads=8, kv_heads=4, ffn=1408, swiglu=True, norm="RMSNorm",
             bias=False, pos="rope", tied=False)
MOE = dict(LLAMA, hidden=256, heads=4, kv_heads=2, ffn=1024, moe_num_experts=4, moe_topk=2,
           moe_ffn=512)
SMALL = dict(LLAMA, hidden=256, heads=4, kv_heads=2, ffn=1024)
# DeepSeek-style MLA (RMSNorm, no biases, RoPE, untied); mcore's MLA ignores num_query_groups.
MLA = dict(SMALL, kv_heads=None, mla=True, q_lora_rank=96, kv_lora_rank=64, qk_head_dim=32,
           qk_pos_emb_head_dim=16, v_head_dim=48)
# First two layers dense, the rest MoE (DeepSeek's first_k_dense_replace = 2).
FIRST2_DENSE = [0, 0, 1, 1, 1, 1, 1, 1]

CASES: dict[str, dict[str, Any]] = {
    # GPT-style: GeLU, LayerNorm, biases, learned positions, tied embeddings (copy on last stage).
    "gpt_tied_tp2_pp2": dict(GPT, tp=2, pp=2),
    # Llama-style: SwiGLU, RMSNorm, no biases, GQA (4 KV heads), RoPE, untied.
    "llama_gqa_tp2_pp2": dict(LLAMA, tp=2, pp=2),
    # Fewer KV heads than TP ranks (MQA at TP 2).
    "mqa_kv1_tp2": dict(LLAMA, kv_heads=1, tp=2, pp=1),
    # Interleaved pipeline: 2 ranks x 2 virtual chunks of 2 layers; tied output copy.
    "gpt_tied_tp2_pp2_vpp2": dict(GPT, tp=2, pp=2, vpp=2),
    # MoE, experts split over EP inside the TP group: TP2 EP2 ETP1.
    "moe_tp2_ep2_etp1": dict(MOE, tp=2, pp=1, ep=2, etp=1),
    # MoE on two pipeline stages: EP2 across data-parallel ranks, ETP defaults to TP (= 1).
    "moe_pp2_ep2_dp2": dict(MOE, tp=1, pp=2, dp=2, ep=2),
    # MoE with biases and LayerNorm/GeLU (router bias, per-expert fc2 bias).
    "moe_bias_tp2_ep2_etp1": dict(MOE, swiglu=False, norm="LayerNorm", bias=True, tp=2, pp=1,
                                  ep=2, etp=1),
    # Vocabulary padding: 50257 -> 50432 at TP 2 (multiple 128 x 2), untied output.
    "vocab_pad_50257_tp2": dict(LLAMA, vocab=50257, tp=2, pp=1),
    # MoE layer pattern (decoder block spec): stage 0 holds 2 dense + 2 MoE layers, stage 1
    # 4 MoE layers; EP inside the TP group.
    "moe_first2dense_tp2_pp2_ep2_etp1": dict(MOE, moe_layer_freq=FIRST2_DENSE, tp=2, pp=2, ep=2,
                                              etp=1),
    # Shared expert (width 1024) with its sigmoid gate (h weights), EP across TP ranks; every
    # other layer MoE (moe_layer_freq 2: layers 0, 2, 4, 6).
    "moe_shared_gate_freq2_tp2_ep2_etp1": dict(MOE, moe_shared_ffn=1024, moe_shared_gate=True,
                                               moe_layer_freq=2, tp=2, pp=1, ep=2, etp=1),
    # Qwen3-style: per-head Q/K RMSNorm with GQA (2 KV heads at TP 2), two stages.
    "qwen3_qknorm_gqa_tp2_pp2": dict(SMALL, qk_layernorm=True, tp=2, pp=2),
    # MLA with a query low-rank (q_layernorm over c_q, kv_layernorm over c_kv).
    "mla_qlora_qknorm_tp2": dict(MLA, qk_layernorm=True, tp=2, pp=1),
    # MLA with a full-rank query, LayerNorm + biases (linear_proj bias only), no QK norms.
    "mla_noqlora_ln_bias_tp2": dict(MLA, q_lora_rank=None, norm="LayerNorm", bias=True, tp=2,
                                    pp=1),
    # MLA, full-rank query with QK norms as LayerNorm: kv_layernorm only (2 * kv_lora_rank).
    "mla_noqlora_qknorm_layernorm_tp2": dict(MLA, q_lora_rank=None, qk_layernorm=True,
                                             norm="LayerNorm", tp=2, pp=1),
    # MTP at PP 1, tied, with LayerNorm QK norms: no embedding or output copies.
    "mtp1_gpt_tied_qknorm_tp2_pp1": dict(GPT, hidden=256, heads=4, ffn=1024, qk_layernorm=True,
                                         mtp_num_layers=1, tp=2, pp=1),
    # GPT-style dense + 1 MTP layer, tied, learned positions: the last stage holds the tied
    # output copy and the MTP stage's own embedding copy (word + positions).
    "mtp1_gpt_tied_tp2_pp2": dict(GPT, hidden=256, heads=4, ffn=1024, mtp_num_layers=1, tp=2,
                                  pp=2),
    # DeepSeek-V3 in small: MLA + first 2 dense then MoE + shared expert (no gate) + 1 MTP
    # layer (an MoE layer, like the last decoder layer), PP 2, EP 2 across DP.
    "deepseek_mini_mla_moe_shared_mtp_pp2_ep2": dict(
        MLA, qk_layernorm=True, moe_num_experts=4, moe_topk=2, moe_ffn=256, moe_shared_ffn=512,
        moe_layer_freq=FIRST2_DENSE, mtp_num_layers=1, tp=1, pp=2, dp=2, ep=2),
    # Untied, PP 4 x VP 2 with uneven stages: first rank 4 layers (2 per chunk), middle ranks
    # 2 each, last rank 2 (--decoder-first/last-pipeline-num-layers 4/2).
    "untied_pp4_vp2_first4_last2": dict(SMALL, num_layers=10, tp=1, pp=4, vpp=2,
                                        first_stage_layers=4, last_stage_layers=2),
    # --pipeline-model-parallel-layout, PP 2 x VP 2 (virtual stages chunk-major), MTP in the
    # last virtual stage.
    "pipeline_layout_pp2_vp2_mtp": dict(SMALL, mtp_num_layers=1, tp=1, pp=2,
                                        pipeline_layout="Ett|ttt|tt|tmL"),
}


def _full_case(case: dict[str, Any]) -> dict[str, Any]:
    """The case with the worker's defaults filled in (the worker is loaded by path)."""
    spec = importlib.util.spec_from_file_location("_oracle_mcore_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**module.DEFAULT_CASE, **case}


def model_spec(case: dict[str, Any]) -> ModelSpec:
    """The case as Megatron-LM arguments, through paraplan's Megatron-args loader."""
    args: dict[str, Any] = {
        "num_layers": case["num_layers"],
        "hidden_size": case["hidden"],
        "num_attention_heads": case["heads"],
        "ffn_hidden_size": case["ffn"],
        "vocab_size": case["vocab"],
        "make_vocab_size_divisible_by": case["make_vocab_size_divisible_by"],
        "max_position_embeddings": case["seq"],
        "position_embedding_type": case["pos"],
        "swiglu": case["swiglu"],
        "normalization": case["norm"],
        "add_bias_linear": case["bias"],
        "untie_embeddings_and_output_weights": not case["tied"],
    }
    if case["kv_heads"] is not None:
        args.update(group_query_attention=True, num_query_groups=case["kv_heads"])
    if case["moe_num_experts"]:
        args.update(num_experts=case["moe_num_experts"], moe_router_topk=case["moe_topk"],
                    moe_ffn_hidden_size=case["moe_ffn"] or case["ffn"],
                    moe_layer_freq=case["moe_layer_freq"],
                    moe_shared_expert_intermediate_size=case["moe_shared_ffn"],
                    moe_shared_expert_gate=case["moe_shared_gate"])
    if case["qk_layernorm"]:
        args["qk_layernorm"] = True
    if case["mla"]:
        assert case["mla_down_proj"] == "duplicated", "paraplan models the TE spec's MLA"
        args.pop("num_query_groups", None)
        args.update(multi_latent_attention=True, q_lora_rank=case["q_lora_rank"],
                    kv_lora_rank=case["kv_lora_rank"], qk_head_dim=case["qk_head_dim"],
                    qk_pos_emb_head_dim=case["qk_pos_emb_head_dim"],
                    v_head_dim=case["v_head_dim"])
    if case["mtp_num_layers"]:
        args["mtp_num_layers"] = case["mtp_num_layers"]
    return model_from_megatron_args(args, name="oracle")


def layout_counts(pipeline_layout: str) -> tuple[int, ...]:
    """Decoder layers ('t') per virtual stage of a ``--pipeline-model-parallel-layout`` string."""
    return tuple(stage.count("t") for stage in pipeline_layout.split("|"))


def layout(case: dict[str, Any]) -> ParallelLayout:
    kw: dict[str, Any] = {}
    vp = case["vpp"] or 1
    if case["pipeline_layout"]:
        counts = layout_counts(case["pipeline_layout"])
        vp = len(counts) // case["pp"]
        kw["pipeline_layout"] = counts
    return ParallelLayout(tp=case["tp"], pp=case["pp"], vp=vp, ep=case["ep"],
                          etp=case["etp"] or 0, dp=case["dp"],
                          first_stage_layers=case["first_stage_layers"] or 0,
                          last_stage_layers=case["last_stage_layers"] or 0, **kw)


def run_worker(case: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Run mcore_worker.py on the case in its own process group; kill the group on timeout."""
    case_file, out_file = tmp_path / "case.json", tmp_path / "out.json"
    case_file.write_text(json.dumps(case))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(case_file), str(out_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"mcore worker timed out after {CASE_TIMEOUT_S}s:\n{log[-4000:]}")
    if proc.returncode != 0 or not out_file.exists():
        pytest.fail(f"mcore worker failed (rc={proc.returncode}):\n{log[-6000:]}")
    return json.loads(out_file.read_text())  # type: ignore[no-any-return]


def _mcore_modules(breakdown: dict[str, int], pp_rank: int) -> dict[str, int]:
    """mcore's buckets mapped onto StageParams fields (final norm belongs to output_layer; an
    embedding past the first stage is the MTP stage's copy, counted in StageParams.mtp)."""
    emb = breakdown.get("embedding", 0)
    return {
        "embedding": emb if pp_rank == 0 else 0,
        "output_layer": breakdown.get("output_layer", 0) + breakdown.get("final_norm", 0),
        "layers_dense": breakdown.get("decoder_layers", 0),
        "layers_experts": breakdown.get("routed_experts", 0),
        "mtp": breakdown.get("mtp", 0) + (emb if pp_rank > 0 else 0),
        "other": breakdown.get("other", 0),
    }


def test_layout_strings_round_trip() -> None:
    """The layout strings used here are what paraplan emits for those counts (no megatron)."""
    for case in CASES.values():
        text = case.get("pipeline_layout")
        if text:
            full = _full_case(case)
            assert pipeline_layout_string(layout_counts(text), full["pp"],
                                          mtp_layers=full["mtp_num_layers"] or 0) == text


@pytest.mark.parametrize("case_id", list(CASES))
def test_stage_params_match_mcore(case_id: str, tmp_path: Path) -> None:
    case = _full_case(CASES[case_id])
    model, lay = model_spec(case), layout(case)
    stages = all_stage_layers(model, lay)
    assignment = stage_assignment(model.num_layers, lay)
    result = run_worker(case, tmp_path)
    assert result["world_size"] == case["tp"] * case["pp"] * case["dp"]

    problems: list[str] = []
    for pp_rank, stage in enumerate(stages):
        ranks = [r for r in result["ranks"] if r["pp_rank"] == pp_rank]
        assert ranks, f"no mcore rank reports pp_rank {pp_rank}"
        counts = {r["rank"]: r["params"] for r in ranks}
        # Every TP (and DP/EP) rank of one stage holds the same number of parameters.
        assert len(set(counts.values())) == 1, f"stage {pp_rank}: ranks differ: {counts}"
        for r in ranks:
            assert r["padded_vocab"] == model.padded_vocab_size(case["tp"])
            want_chunks = [[i + 1 for i in chunk] for chunk in assignment[pp_rank].chunks]
            assert r["chunk_layers"] == want_chunks, f"stage {pp_rank}: layer assignment differs"

        mcore_total = ranks[0]["params"]
        ours = stage_params(model, stage, tp=lay.tp, pp=lay.pp, ep=lay.ep, etp=lay.etp,
                            max_positions=case["seq"])
        total = float(ours.total)
        if total != mcore_total:
            theirs = _mcore_modules(ranks[0]["breakdown"], pp_rank)
            mine = {k: v for k, v in ours.as_dict().items() if k != "total"}
            keys = sorted(set(mine) | set(theirs))
            diffs = {k: mine.get(k, 0.0) - theirs.get(k, 0)
                     for k in keys if mine.get(k, 0.0) != theirs.get(k, 0)}
            problems.append(
                f"stage {pp_rank}: paraplan {total:.0f} != mcore {mcore_total} "
                f"(paraplan - mcore = {total - mcore_total:+.0f}); by module: {diffs}; "
                f"mcore {theirs}; paraplan {mine}"
            )
    assert not problems, f"{case_id}:\n" + "\n".join(problems)
