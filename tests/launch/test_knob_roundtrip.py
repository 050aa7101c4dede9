"""Every knob (``KNOB_FLAGS``) written into the launch files comes back from them (issue 18: "parsing of every knob
from Megatron args and back into launch files"): TrainingSpec -> ``megatron_args`` -> argv -> ``read_flags``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.load import load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import KNOB_FLAGS, TrainingSpec
from tests.unit.test_review_fixb import KNOB_SAMPLES, _ancestors_on

DENSE, MOE = load_model("llama3-8b"), load_model("qwen3-30b-a3b")
_MOE_KNOBS = {k for k in KNOB_FLAGS if k.startswith("moe_") or k in ("delay_wgrad_compute",
                                                                     "use_transformer_engine_op_fuser")}
_RANK_BUDGET = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                "use_transformer_engine_op_fuser": True, "moe_expert_rank_capacity_factor": 1.5}
CONTEXT: dict[str, dict[str, object]] = {
    "moe_expert_rank_capacity_factor": _RANK_BUDGET,
    "moe_paged_stash": _RANK_BUDGET,
    "moe_paged_stash_buffer_size_factor_cuda": {**_RANK_BUDGET, "moe_paged_stash": True},
    "moe_paged_stash_buffer_size_factor_cpu": {**_RANK_BUDGET, "moe_paged_stash": True},
    "moe_pad_expert_input_to_capacity": {"moe_expert_capacity_factor": 1.0},
    "fine_grained_activation_offloading": {"offload_modules": ("core_attn",)},
    "num_layers_at_start_in_bf16": {"first_last_layers_bf16": True},
    "num_layers_at_end_in_bf16": {"first_last_layers_bf16": True},
}
"""The other knobs Megatron's rules ask for beside a knob (beyond the one it refines, ``_ancestors_on``)."""
NOT_MEGATRON_LM = {
    "cross_entropy_fusion_impl": "te is refused by Megatron-LM's validate_args; only `launch --target bridge` "
                                 "writes it (tests/unit/test_review_fixb.py)",
    "tp_comm_overlap_cfg": "a Megatron-Bridge config name goes into a YAML file beside the script, read back as that "
                           "file (tests/launch/test_ub_cfg_surfaces.py)",
    "overlap_param_gather_with_optimizer_step": "Megatron-LM refuses it with distributed checkpointing, which its "
                                                "launch files use, so they leave it out with a comment "
                                                "(tests/launch/test_megatron_validate.py); read from Megatron args in "
                                                "tests/golden/test_time_knobs.py",
}
"""Knobs whose Megatron-LM launch files carry them in another form, with the test that covers it."""


def _layout(key: str) -> ParallelLayout:
    """A layout on which ``key`` takes effect (and Megatron's rules let it run)."""
    if key == "fsdp_double_buffer":
        return ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none", fsdp=True)
    if key == "cp_comm_type":
        return ParallelLayout(tp=2, pp=1, cp=2, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    if key in ("defer_embedding_wgrad_compute", "wgrad_deferral_limit"):
        return ParallelLayout(tp=1, pp=2, vp=2, dp=4, mbs=1, recompute="none")
    if key.startswith("tp_comm_overlap"):
        return ParallelLayout(tp=4, pp=1, dp=2, mbs=1, recompute="none", sequence_parallel=True, tp_comm_overlap=True)
    if key in _MOE_KNOBS:
        return ParallelLayout(tp=1, pp=1, ep=8, etp=1, dp=8, mbs=1, recompute="none",
                              schedule="combined_1f1b" if key == "delay_wgrad_compute" else "")
    return ParallelLayout(tp=2, pp=1, dp=4, mbs=1, recompute="none", sequence_parallel=True)


@pytest.mark.parametrize("key", sorted(set(KNOB_FLAGS) - set(NOT_MEGATRON_LM)))
def test_every_knob_written_into_the_launch_files_is_read_back(key: str) -> None:
    _value, precision, expected = KNOB_SAMPLES[key]
    fields = {**{k: v for k, v in _ancestors_on(key).items() if k != key}, **CONTEXT.get(key, {}), key: expected}
    training = replace(TrainingSpec(seq_len=4096, global_batch_size=64, precision=precision), **fields)
    model = MOE if key in _MOE_KNOBS else DENSE
    words = argv(megatron_args(model, _layout(key), training, arch="blackwell" if precision == "fp4" else "hopper"),
                 resolve=True)
    assert KNOB_FLAGS[key] in words, (key, words)
    back = read_flags(words)
    assert not back.problems, back.problems
    for k, v in fields.items():
        assert back.training_fields.get(k, getattr(TrainingSpec(seq_len=4096, global_batch_size=64), k)) == v, k


def test_the_knobs_left_out_are_knobs() -> None:
    assert set(NOT_MEGATRON_LM) <= set(KNOB_FLAGS) and set(CONTEXT) <= set(KNOB_FLAGS)
