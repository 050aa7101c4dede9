"""Oracle: megatron-core's TransformerConfig accepts the values paraplan's launch arguments emit.

``TransformerConfig.__post_init__`` (with ``ModelParallelConfig``) runs many of Megatron's
validation rules (heads vs TP, query groups vs TP, sequence parallel needs TP, uneven pipeline
splits vs VP, recompute settings, MoE and MLA settings). The emitted ``pretrain_gpt.py`` words are
read back flag by flag and turned into the config the way Megatron-LM's ``core_transformer_config_from_args``
does, on CPU. Needs the ``oracle`` extra (torch CPU + megatron-core); skipped otherwise.
Run: ``PYTHONPATH=src .venv-oracle/bin/pytest tests/oracle -q -m oracle``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from hypothesis import HealthCheck, given, settings

from paraplan.launch.megatron import argv, megatron_args
from paraplan.launch.render import LaunchSpec
from paraplan.layout import ParallelLayout
from paraplan.specs.megatron_flags import split_flags
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec
from tests.launch.cases import deepseek_uneven_spec, llama70b_spec, moe_single_node_spec
from tests.launch.test_roundtrip import launch_cases

pytestmark = pytest.mark.oracle
ORACLE_EXAMPLES = int(os.environ.get("ORACLE_EXAMPLES", "60"))
"""Hypothesis examples (600 pass locally in about 20 s)."""


def _optional_fields(v: dict[str, tuple[str, ...]], kw: dict[str, Any], layers: int, pp: int, ffn: int) -> None:
    def num(flag: str) -> int:
        return int(v[flag][0])

    def has(flag: str) -> bool:
        return flag in v

    if has("--kv-channels"):
        kw["kv_channels"] = num("--kv-channels")
    if has("--group-query-attention"):
        kw["num_query_groups"] = num("--num-query-groups")
    extra = int(kw["account_for_embedding_in_pipeline_split"]) + int(kw["account_for_loss_in_pipeline_split"])
    if has("--num-layers-per-virtual-pipeline-stage"):  # as arguments.py derives it
        vpp = (layers + extra) // pp // num("--num-layers-per-virtual-pipeline-stage")
        kw["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    if has("--pipeline-model-parallel-layout"):
        kw["pipeline_model_parallel_layout"] = v["--pipeline-model-parallel-layout"][0]
        stages = len(v["--pipeline-model-parallel-layout"][0].split("|"))
        kw["virtual_pipeline_model_parallel_size"] = stages // pp if stages > pp else None
    if has("--num-virtual-stages-per-pipeline-rank"):
        kw["virtual_pipeline_model_parallel_size"] = num("--num-virtual-stages-per-pipeline-rank")
    for flag, key in (("--decoder-first-pipeline-num-layers", "num_layers_in_first_pipeline_stage"),
                      ("--decoder-last-pipeline-num-layers", "num_layers_in_last_pipeline_stage"),
                      ("--recompute-num-layers", "recompute_num_layers"), ("--mtp-num-layers", "mtp_num_layers"),
                      ("--num-experts", "num_moe_experts"), ("--moe-router-topk", "moe_router_topk"),
                      ("--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
                      ("--moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size"),
                      ("--expert-model-parallel-size", "expert_model_parallel_size"),
                      ("--expert-tensor-parallel-size", "expert_tensor_parallel_size")):
        if has(flag):
            kw[key] = num(flag)
    for flag, key in (("--recompute-granularity", "recompute_granularity"),
                      ("--recompute-method", "recompute_method"),
                      ("--moe-token-dispatcher-type", "moe_token_dispatcher_type"),
                      ("--fp8-format", "fp8"), ("--fp8-recipe", "fp8_recipe")):
        if has(flag):
            kw[key] = v[flag][0]
    if has("--recompute-modules"):
        kw["recompute_modules"] = list(v["--recompute-modules"])
    if has("--num-experts"):
        kw["moe_grouped_gemm"] = has("--moe-grouped-gemm")
        freq = v["--moe-layer-freq"][0]
        kw["moe_layer_freq"] = eval(freq) if "[" in freq else int(freq)  # as Megatron's moe_freq_type
        kw["moe_shared_expert_gate"] = has("--moe-shared-expert-gate")
        kw["moe_router_pre_softmax"] = has("--moe-router-pre-softmax")
        kw.setdefault("moe_ffn_hidden_size", ffn)


def config_from_words(words: list[str]) -> Any:
    """TransformerConfig (or MLATransformerConfig) from pretrain_gpt.py arguments."""
    import torch.nn.functional as F

    v, unknown, _ = split_flags(words)
    assert not unknown

    def num(flag: str) -> int:
        return int(v[flag][0])

    def has(flag: str) -> bool:
        return flag in v

    layers, hidden, pp = num("--num-layers"), num("--hidden-size"), num("--pipeline-model-parallel-size")
    swiglu = has("--swiglu")
    ffn = num("--ffn-hidden-size") if has("--ffn-hidden-size") else (
        int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden)
    kw: dict[str, Any] = dict(
        num_layers=layers, hidden_size=hidden, num_attention_heads=num("--num-attention-heads"),
        ffn_hidden_size=ffn, tensor_model_parallel_size=num("--tensor-model-parallel-size"),
        pipeline_model_parallel_size=pp, context_parallel_size=num("--context-parallel-size"),
        sequence_parallel=has("--sequence-parallel"), bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, hidden_dropout=float(v["--hidden-dropout"][0]),
        attention_dropout=float(v["--attention-dropout"][0]), normalization=v["--normalization"][0],
        add_bias_linear=not has("--disable-bias-linear"), add_qkv_bias=has("--add-qkv-bias"),
        qk_layernorm=has("--qk-layernorm"), gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu, tp_comm_overlap=has("--tp-comm-overlap"),
        account_for_embedding_in_pipeline_split=has("--account-for-embedding-in-pipeline-split"),
        account_for_loss_in_pipeline_split=has("--account-for-loss-in-pipeline-split"),
    )
    _optional_fields(v, kw, layers, pp, ffn)
    if has("--multi-latent-attention"):
        for flag, key in (("--q-lora-rank", "q_lora_rank"), ("--kv-lora-rank", "kv_lora_rank"),
                          ("--qk-head-dim", "qk_head_dim"), ("--qk-pos-emb-head-dim", "qk_pos_emb_head_dim"),
                          ("--v-head-dim", "v_head_dim")):
            if has(flag):
                kw[key] = num(flag)
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def build(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec) -> Any:
    """The config; Transformer Engine version checks answer as a recent TE would (none on CPU)."""
    import megatron.core.transformer.transformer_config as tc

    words = argv(megatron_args(model, layout, training), resolve=True)
    original = tc.is_te_min_version
    tc.is_te_min_version = lambda *args, **kwargs: True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_from_words(words)
    finally:
        tc.is_te_min_version = original


@pytest.mark.parametrize("make", [llama70b_spec, moe_single_node_spec, deepseek_uneven_spec])
def test_fixed_launch_cases_build_a_valid_config(make: Any) -> None:
    spec: LaunchSpec = make()
    cfg = build(spec.model, spec.layout, spec.training)
    assert cfg.tensor_model_parallel_size == spec.layout.tp
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == spec.layout.vp


def test_the_oracle_rejects_what_megatron_rejects() -> None:
    with pytest.raises(ValueError, match="Cannot use sequence parallelism without tensor parallelism"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, sequence_parallel=True)


@settings(max_examples=ORACLE_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(launch_cases())
def test_every_valid_layout_builds_a_transformer_config(case: tuple[ModelSpec, ParallelLayout, TrainingSpec]) -> None:
    model, layout, training = case
    build(model, layout, training)
