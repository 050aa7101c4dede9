"""Which knobs move memory and which move step time only (``specs.training.TIME_ONLY_KNOBS``): estimate and check
print them under ``memory knobs:`` and ``time-only knobs:``; the JSON keeps ``config.memory_knobs`` (every knob away
from Megatron's defaults, the field's name as before) and names the time-only ones in ``config.time_only_knobs``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paraplan.errors import SpecError
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import ClusterSpec, make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import KNOB_FLAGS, TIME_ONLY_KNOBS, TrainingSpec
from tests.unit.test_review_fixb import KNOB_SAMPLES, _ancestors_on

H100 = make_cluster(load_gpu("h100-80gb"), 16, 8)
B200 = make_cluster(load_gpu("b200"), 16, 8)
PP2 = {"tp": 2, "pp": 2, "dp": 4, "mbs": 1, "recompute": "none", "distributed_optimizer": True}
PP1 = {"tp": 2, "pp": 1, "dp": 8, "mbs": 1, "recompute": "none", "distributed_optimizer": True}
FSDP = {"tp": 1, "pp": 1, "dp": 16, "mbs": 1, "recompute": "none", "fsdp": True}
CP2 = {"tp": 2, "pp": 1, "cp": 2, "dp": 4, "mbs": 1, "recompute": "none", "distributed_optimizer": True}
MOE = {"tp": 2, "pp": 2, "ep": 4, "dp": 4, "mbs": 1, "recompute": "none", "distributed_optimizer": True}
CASES = (("llama3-8b", PP2), ("llama3-8b", PP1), ("llama3-8b", FSDP), ("llama3-8b", CP2), ("mixtral-8x7b", MOE))
"""Dense with and without a pipeline, Megatron-FSDP, context parallelism, and MoE with expert parallelism."""

_RANK_BUDGET_NEEDS = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                      "use_transformer_engine_op_fuser": True}
_RANK_BUDGET = {**_RANK_BUDGET_NEEDS, "moe_expert_rank_capacity_factor": 1.5}
MOVES: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "grad_reduce_in_bf16": ("bf16", PP2, {}, {"grad_reduce_in_bf16": True}),
    "use_precision_aware_optimizer": ("bf16", PP2, {}, {"use_precision_aware_optimizer": True}),
    "main_grads_dtype": ("bf16", PP2, {"use_precision_aware_optimizer": True}, {"main_grads_dtype": "bf16"}),
    # fp16 master weights against fp32 ones kept whole (no remainders under the FP8 parameter gather)
    "main_params_dtype": ("fp8", PP2, {"use_precision_aware_optimizer": True, "fp8_param_gather": True},
                          {"main_params_dtype": "fp16"}),
    "exp_avg_dtype": ("bf16", PP2, {"use_precision_aware_optimizer": True}, {"exp_avg_dtype": "bf16"}),
    "exp_avg_sq_dtype": ("bf16", PP2, {"use_precision_aware_optimizer": True}, {"exp_avg_sq_dtype": "bf16"}),
    "fp8_recipe": ("fp8", PP2, {}, {"fp8_recipe": "mxfp8"}),
    "fp8_param_gather": ("fp8", PP2, {}, {"fp8_param_gather": True}),
    "optimizer_cpu_offload": ("bf16", PP2, {"use_precision_aware_optimizer": True}, {"optimizer_cpu_offload": True}),
    "optimizer_offload_fraction": ("bf16", PP2, {"use_precision_aware_optimizer": True, "optimizer_cpu_offload": True},
                                   {"optimizer_offload_fraction": 0.5}),
    "cpu_offloading_num_layers": ("bf16", PP1, {}, {"cpu_offloading_num_layers": 2}),
    "fine_grained_activation_offloading": ("bf16", PP2, {"offload_modules": ("core_attn",)},
                                           {"fine_grained_activation_offloading": True}),
    "offload_modules": ("bf16", PP2, {"fine_grained_activation_offloading": True, "offload_modules": ("core_attn",)},
                        {"offload_modules": ("core_attn", "attn_proj")}),
    "fsdp_double_buffer": ("bf16", FSDP, {}, {"fsdp_double_buffer": True}),
    "cuda_graph_impl": ("bf16", PP2, {}, {"cuda_graph_impl": "local"}),
    "cuda_graph_modules": ("bf16", PP2, {"cuda_graph_impl": "transformer_engine"}, {"cuda_graph_modules": ("mlp",)}),
    "fp4_param_gather": ("fp4", PP2, {}, {"fp4_param_gather": True}),
    "first_last_layers_bf16": ("fp4", PP2, {}, {"first_last_layers_bf16": True}),
    "num_layers_at_start_in_bf16": ("fp4", PP2, {"first_last_layers_bf16": True}, {"num_layers_at_start_in_bf16": 2}),
    "num_layers_at_end_in_bf16": ("fp4", PP2, {"first_last_layers_bf16": True}, {"num_layers_at_end_in_bf16": 2}),
    "defer_embedding_wgrad_compute": ("bf16", PP2, {}, {"defer_embedding_wgrad_compute": True}),
    "wgrad_deferral_limit": ("bf16", PP2, {"defer_embedding_wgrad_compute": True}, {"wgrad_deferral_limit": 3}),
    # the fused loss moves memory through its kernel: TE's keeps only the bf16 logits
    "cross_entropy_loss_fusion": ("bf16", PP2, {"cross_entropy_fusion_impl": "te"},
                                  {"cross_entropy_loss_fusion": True}),
    "cross_entropy_fusion_impl": ("bf16", PP2, {"cross_entropy_loss_fusion": True},
                                  {"cross_entropy_fusion_impl": "te"}),
    # the routed tokens an expert saves: dropped below its capacity, padded up to it
    "moe_expert_capacity_factor": ("bf16", MOE, {}, {"moe_expert_capacity_factor": 0.5}),
    "moe_pad_expert_input_to_capacity": ("bf16", MOE, {"moe_expert_capacity_factor": 1.5},
                                         {"moe_pad_expert_input_to_capacity": True}),
    # HybridEP's static rank budget: the grouped MLP saves all its rows; the paged stash then sizes them by its factor
    "moe_expert_rank_capacity_factor": ("bf16", MOE, _RANK_BUDGET_NEEDS, {"moe_expert_rank_capacity_factor": 1.5}),
    "moe_paged_stash": ("bf16", MOE, _RANK_BUDGET, {"moe_paged_stash": True}),
    "moe_paged_stash_buffer_size_factor_cuda": ("bf16", MOE, {**_RANK_BUDGET, "moe_paged_stash": True},
                                                {"moe_paged_stash_buffer_size_factor_cuda": 1.5}),
}
"""Every knob that moves memory: (precision, layout, the knobs it needs, the change), on llama3-8b (mixtral-8x7b for
an MoE layout; 16 GPUs)."""
SINGLE_VALUED = {"fp4_recipe"}
"""Knobs with one allowed value (never away from the default)."""
NEEDS: dict[str, dict[str, Any]] = {"moe_paged_stash_buffer_size_factor_cpu": {
    **_RANK_BUDGET, "moe_paged_stash": True, "moe_paged_stash_buffer_size_factor_cpu": 1.0}}
"""Time-only knobs that Megatron's rules accept only beside others (TrainingSpec ``_check_rank_capacity``)."""


def _per_stage(model: str, layout: dict[str, Any], cluster: ClusterSpec, training: TrainingSpec) -> Any:
    return estimate(load_model(model), cluster, training, ParallelLayout(**layout)).to_dict()["memory"]["per_stage"]


def _training(precision: str, fields: dict[str, Any]) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=64, precision=precision, **fields)  # type: ignore[arg-type]


def test_every_knob_is_classified() -> None:
    assert set(KNOB_FLAGS) == set(MOVES) | (TIME_ONLY_KNOBS & set(KNOB_FLAGS)) | SINGLE_VALUED
    assert not set(MOVES) & TIME_ONLY_KNOBS


@pytest.mark.parametrize("key", sorted(MOVES))
def test_a_memory_knob_moves_memory(key: str) -> None:
    precision, layout, base, change = MOVES[key]
    cluster = B200 if precision == "fp4" else H100
    model = "mixtral-8x7b" if layout is MOE else "llama3-8b"
    before = _per_stage(model, layout, cluster, _training(precision, base))
    assert _per_stage(model, layout, cluster, _training(precision, {**base, **change})) != before


@pytest.mark.parametrize("key", sorted(TIME_ONLY_KNOBS - SINGLE_VALUED))
def test_a_time_only_knob_leaves_every_stage_memory_unchanged(key: str) -> None:
    base: dict[str, Any] = {}  # the knobs it needs (some move memory themselves): on in both runs
    if key in NEEDS:
        precision, on = "bf16", NEEDS[key]
        base = {k: v for k, v in on.items() if k != key}
    elif key in KNOB_SAMPLES:
        precision, on = KNOB_SAMPLES[key][1], {**_ancestors_on(key), key: KNOB_SAMPLES[key][2]}
    else:  # no Megatron-LM flag: fp8_dot_product_attention, attention_kernel, nvfp4_quantize_kernel (FP4 only)
        precision = "fp4" if key == "nvfp4_quantize_kernel" else "fp8"
        on = {key: {"attention_kernel": "fa2", "nvfp4_quantize_kernel": "split"}.get(key, True)}
    assert all(k in TIME_ONLY_KNOBS for k in on if k not in base), on  # the others it needs move time only too
    ran = 0
    for model, layout in CASES:
        cluster = B200 if precision == "fp4" else H100
        try:
            with_knob = _per_stage(model, layout, cluster, _training(precision, on))
        except SpecError:  # a rule of the knob's (e.g. MoE knobs on a dense model)
            continue
        assert with_knob == _per_stage(model, layout, cluster, _training(precision, base)), (key, model, layout)
        ran += 1
    assert ran >= 2, key


def test_estimate_prints_memory_and_time_only_knobs_apart(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from paraplan.cli import main

    monkeypatch.setenv("COLUMNS", "250")  # one line each

    cli = ["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
           "--gbs", "64", "--tp", "2", "--pp", "2", "--knob", "grad-reduce-in-bf16", "--knob", "manual-gc",
           "--knob", "no-tp-comm-overlap-ag", "--knob", "cp-comm-type=a2a"]
    assert main(cli) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "memory knobs: --grad-reduce-in-bf16" in lines
    assert "time-only knobs: --cp-comm-type a2a --manual-gc --no-tp-comm-overlap-ag" in lines
    assert main([*cli, "--format", "json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert cfg["memory_knobs"] == {"grad_reduce_in_bf16": True, "cp_comm_type": "a2a", "manual_gc": True,
                                   "tp_comm_overlap_ag": False}
    assert cfg["time_only_knobs"] == ["cp_comm_type", "manual_gc", "tp_comm_overlap_ag"]
    assert main([*cli[:-6], "--format", "json"]) == 0
    assert "time_only_knobs" not in json.loads(capsys.readouterr().out)["config"]
    assert main(cli[:-6]) == 0
    assert not any(line.startswith("time-only knobs:") for line in capsys.readouterr().out.splitlines())


def test_a_recipe_prints_its_time_only_knobs_apart(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The 405B recipe's manual GC and optimizer-step overlap move time only (the review's repro)."""
    from paraplan.cli import main

    monkeypatch.setenv("COLUMNS", "250")

    assert main(["estimate", "--recipe", "llama3.1-405b-gb200-bf16-128"]) == 4  # does not fit (coded layout)
    out = capsys.readouterr().out
    memory = next(line for line in out.splitlines() if line.startswith("memory knobs:"))
    assert "--grad-reduce-in-bf16" in memory and "--manual-gc" not in memory
    assert "--overlap-param-gather-with-optimizer-step" not in memory
    assert "time-only knobs: --overlap-param-gather-with-optimizer-step --manual-gc" in out


def test_knob_words_name_fields_without_a_megatron_flag_as_such() -> None:
    """Review finding (session 8): a knob with no Megatron-LM flag, and a Megatron-Bridge named userbuffers config,
    are not printed as if they were Megatron-LM arguments."""
    from paraplan.cli.render import knob_words
    from paraplan.specs.userbuffers import packaged

    name = sorted(packaged())[0]
    words = knob_words(TrainingSpec(seq_len=4096, global_batch_size=8, precision="fp8",
                                    fp8_dot_product_attention=True, tp_comm_overlap_cfg=name))
    assert "fp8_dot_product_attention=True (no Megatron-LM flag)" in words
    assert f"tp_comm_overlap_cfg={name} (a Megatron-Bridge config" in words
    assert "--tp-comm-overlap-cfg" not in words and not words.startswith("fp8_dot_product_attention ")
