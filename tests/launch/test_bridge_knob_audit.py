"""The Megatron-Bridge target writes every knob the plan estimated wherever it takes effect, at Megatron-LM's default
too: a performance recipe sets many of them its own way (``_benchmark_common``: ``train.manual_gc = True``,
``grad_reduce_in_fp32 = False``, the cross-entropy kernel; HybridEP's SMs), so a knob left out would run at the
recipe's value, not at the one the plan priced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from paraplan.launch.bridge import SMS_FIELD, TORCH_DTYPES, choose_recipe, overrides
from paraplan.specs.training import KNOB_FLAGS, TrainingSpec

from .matrix import plan_spec

_ALWAYS: Callable[[TrainingSpec, bool], bool] = lambda t, moe: True  # noqa: E731


def _moe(t: TrainingSpec, moe: bool) -> bool:
    return moe


def _flex(t: TrainingSpec, moe: bool) -> bool:
    return moe and t.moe_token_dispatcher_type == "flex"


def _low(t: TrainingSpec, moe: bool) -> bool:
    return t.precision in ("fp8", "fp4")


BRIDGE_FIELDS: dict[str, tuple[str | None, Callable[[TrainingSpec, bool], bool], Callable[[Any], Any]]] = {
    "grad_reduce_in_bf16": ("ddp.grad_reduce_in_fp32", _ALWAYS, lambda v: not v),
    "use_precision_aware_optimizer": ("optimizer.use_precision_aware_optimizer", _ALWAYS, bool),
    "main_grads_dtype": ("optimizer.main_grads_dtype", _ALWAYS, TORCH_DTYPES.get),
    "main_params_dtype": ("optimizer.main_params_dtype", _ALWAYS, TORCH_DTYPES.get),
    "exp_avg_dtype": ("optimizer.exp_avg_dtype", _ALWAYS, TORCH_DTYPES.get),
    "exp_avg_sq_dtype": ("optimizer.exp_avg_sq_dtype", _ALWAYS, TORCH_DTYPES.get),
    "fp8_recipe": (None, _ALWAYS, str),  # the recipe / mixed-precision preset chosen for it (test_bridge.py)
    "fp8_param_gather": ("mixed_precision.fp8_param_gather", lambda t, moe: t.precision == "fp8", bool),
    "optimizer_cpu_offload": ("optimizer.optimizer_cpu_offload", _ALWAYS, bool),
    "optimizer_offload_fraction": ("optimizer.optimizer_offload_fraction",
                                   lambda t, moe: t.optimizer_cpu_offload, float),
    "cpu_offloading_num_layers": ("model.cpu_offloading_num_layers", _ALWAYS, int),
    "fine_grained_activation_offloading": ("model.fine_grained_activation_offloading", _ALWAYS, bool),
    "offload_modules": ("model.offload_modules", _ALWAYS, list),
    "cp_comm_type": ("model.cp_comm_type", _ALWAYS, str),
    "fsdp_double_buffer": ("ddp.fsdp_double_buffer", _ALWAYS, bool),
    "moe_token_dispatcher_type": ("model.moe_token_dispatcher_type", _moe, str),
    "moe_flex_dispatcher_backend": ("model.moe_flex_dispatcher_backend", _flex, str),
    "moe_hybridep_num_sms": (SMS_FIELD, _flex, lambda v: v),
    "delay_wgrad_compute": ("model.delay_wgrad_compute", _moe, bool),
    "moe_permute_fusion": ("model.moe_permute_fusion", _moe, bool),
    "moe_permute_fusion_into_hybridep": ("model.moe_permute_fusion_into_hybridep",
                                         lambda t, moe: _flex(t, moe) and t.moe_flex_dispatcher_backend == "hybridep",
                                         bool),
    "moe_shared_expert_overlap": ("model.moe_shared_expert_overlap", _moe, bool),
    "moe_expert_capacity_factor": ("model.moe_expert_capacity_factor", _moe, lambda v: v),
    "moe_pad_expert_input_to_capacity": ("model.moe_pad_expert_input_to_capacity", _moe, bool),
    "moe_expert_rank_capacity_factor": ("model.moe_expert_rank_capacity_factor", _moe, lambda v: v),
    "moe_paged_stash": ("model.moe_paged_stash", _moe, bool),
    "use_transformer_engine_op_fuser": ("model.use_transformer_engine_op_fuser", _moe, bool),
    "moe_use_grouped_tensor": ("model.moe_use_grouped_tensor", _moe, bool),
    "moe_paged_stash_buffer_size_factor_cuda": ("model.moe_paged_stash_buffer_size_factor_cuda", _moe, float),
    "moe_paged_stash_buffer_size_factor_cpu": ("model.moe_paged_stash_buffer_size_factor_cpu", _moe, float),
    "cuda_graph_impl": ("model.cuda_graph_impl", _ALWAYS, str),
    "cuda_graph_modules": ("model.cuda_graph_scope", lambda t, moe: t.cuda_graph_impl not in ("none", "full_iteration"),
                           list),
    "overlap_param_gather_with_optimizer_step": ("optimizer.overlap_param_gather_with_optimizer_step", _ALWAYS, bool),
    "gradient_accumulation_fusion": ("model.gradient_accumulation_fusion", _ALWAYS, bool),
    "fp4_recipe": ("mixed_precision.fp4_recipe", lambda t, moe: t.precision == "fp4", str),
    "fp4_param_gather": ("mixed_precision.fp4_param_gather", lambda t, moe: t.precision == "fp4", bool),
    "first_last_layers_bf16": ("mixed_precision.first_last_layers_bf16", _low, bool),
    "num_layers_at_start_in_bf16": ("mixed_precision.num_layers_at_start_in_bf16",
                                    lambda t, moe: _low(t, moe) and t.first_last_layers_bf16, int),
    "num_layers_at_end_in_bf16": ("mixed_precision.num_layers_at_end_in_bf16",
                                  lambda t, moe: _low(t, moe) and t.first_last_layers_bf16, int),
    "manual_gc": ("train.manual_gc", _ALWAYS, bool),
    "manual_gc_interval": ("train.manual_gc_interval", lambda t, moe: t.manual_gc, int),
    "defer_embedding_wgrad_compute": ("model.defer_embedding_wgrad_compute", _ALWAYS, bool),
    "wgrad_deferral_limit": ("model.wgrad_deferral_limit", _ALWAYS, int),
    "cross_entropy_loss_fusion": ("model.cross_entropy_loss_fusion", _ALWAYS, bool),
    "cross_entropy_fusion_impl": ("model.cross_entropy_fusion_impl", _ALWAYS, str),
    "tp_comm_overlap_ag": ("model.tp_comm_overlap_ag", _ALWAYS, bool),
    "tp_comm_overlap_rs": ("model.tp_comm_overlap_rs", _ALWAYS, bool),
    "tp_comm_overlap_rs_dgrad": ("model.tp_comm_overlap_rs_dgrad", _ALWAYS, bool),
    # a dataclass the overrides cannot write: --target bridge refuses a config its recipe does not set (ubcfg)
    "tp_comm_overlap_cfg": (None, _ALWAYS, str),
}
"""Knob -> (its ConfigContainer field, where it takes effect (training, MoE model), its value there)."""

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dense bf16, Megatron's defaults": ("llama3-8b-dp8", {}),
    "dense fp8, first/last layers bf16": ("llama3-8b-fp8-tp2", {"first_last_layers_bf16": True,
                                                                "fp8_recipe": "tensorwise"}),
    "dense fp4 on Blackwell": ("llama3-70b-mxfp8-b200", {"precision": "fp4", "fp8_recipe": "delayed"}),
    "MoE fp8, Megatron's defaults": ("deepseek-v3-gb200-fp8", {}),
    "MoE HybridEP, manual GC, offload": ("deepseek-v3-gb200-fp8", {
        "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep", "moe_hybridep_num_sms": 24,
        "manual_gc": True, "manual_gc_interval": 10, "use_precision_aware_optimizer": True,
        "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5, "tp_comm_overlap_ag": False}),
}


def test_every_knob_has_its_bridge_field() -> None:
    assert set(BRIDGE_FIELDS) == set(KNOB_FLAGS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_knob_is_written_where_it_takes_effect(case: str) -> None:
    name, knobs = CASES[case]
    spec = plan_spec(name)
    spec = replace(spec, training=replace(spec.training, **knobs))
    t, moe = spec.training, spec.model.is_moe
    items = dict(overrides(spec, choose_recipe(spec)))
    for key, (path, applies, value_of) in BRIDGE_FIELDS.items():
        if path is not None and applies(t, moe):
            assert path in items, f"{case}: {key} ({path}) is not written"
            assert items[path] == value_of(getattr(t, key)), (case, key, items[path])


def test_manual_gc_off_is_written_over_the_perf_recipe() -> None:
    """_benchmark_common sets train.manual_gc = True; a plan at Megatron-LM's default (off) says so explicitly."""
    spec = plan_spec("deepseek-v3-gb200-fp8")
    assert choose_recipe(spec).kind == "perf"
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["train.manual_gc"] is False and "train.manual_gc_interval" not in items


def test_unfused_attention_is_written_as_the_enum() -> None:
    """The plan priced unfused attention's s x s scores (Megatron-LM ``--attention-backend unfused``); the Bridge
    target runs it: TransformerConfig.attention_backend is an ``AttnBackend`` member, which bridge_recipe.py sets by
    name and bridge_overrides.txt cannot (named in its note)."""
    from paraplan.launch.bridge import bridge_files, bridge_overrides_gaps

    from .test_bridge import literal_tables

    spec = plan_spec("llama3-8b-dp8")
    assert "model.attention_backend" not in dict(overrides(spec, choose_recipe(spec)))  # flash: the recipe's kernel
    unfused = replace(spec, training=replace(spec.training, attention_backend="unfused"))
    assert dict(overrides(unfused, choose_recipe(unfused)))["model.attention_backend"] == "unfused"
    files = bridge_files(unfused, "c")
    source = files["bridge_recipe.py"]
    assert "from megatron.core.transformer import enums" in source.splitlines()
    assert literal_tables(source)["ENUM_FIELDS"] == {"model.attention_backend": "AttnBackend"}
    assert "        value = getattr(enums, ENUM_FIELDS[path])[value]" in source.splitlines()
    assert literal_tables(source)["OVERRIDES"]["model.attention_backend"] == "unfused"
    assert "model.attention_backend" in bridge_overrides_gaps(unfused)
    assert not any(line.startswith("model.attention_backend=") for line in files["bridge_overrides.txt"].splitlines())
    compile(source, "bridge_recipe.py", "exec")
