"""One place for what two readers or writers used to do each on their own (session-7 clean-up)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from paraplan.launch.megatron import knobs_set, memory_knob_args, moe_knobs_set
from paraplan.specs.training import KNOB_FLAGS, TrainingSpec

BASE = TrainingSpec(seq_len=4096, global_batch_size=64)


def test_knobs_set_is_empty_at_megatron_defaults() -> None:
    assert knobs_set(BASE) == []
    assert memory_knob_args(BASE) == [] and moe_knobs_set(BASE) == []


def test_knobs_set_lists_exactly_the_knobs_away_from_their_defaults() -> None:
    t = TrainingSpec(seq_len=4096, global_batch_size=64, grad_reduce_in_bf16=True, moe_shared_expert_overlap=True,
                     cuda_graph_impl="local")
    assert knobs_set(t) == [(k, KNOB_FLAGS[k], getattr(t, k))
                            for k in KNOB_FLAGS if k in ("grad_reduce_in_bf16", "moe_shared_expert_overlap", "cuda_graph_impl")]
    assert moe_knobs_set(t) == [KNOB_FLAGS["moe_shared_expert_overlap"]]


@pytest.mark.parametrize("key", sorted(KNOB_FLAGS))
def test_the_defaults_compared_against_are_the_field_defaults(key: str) -> None:
    """The job fields differ (seq_len, GBS), the knobs at their field defaults are never listed."""
    default = next(f.default for f in fields(TrainingSpec) if f.name == key)
    assert getattr(BASE, key) == default
    assert key not in {k for k, _, _ in knobs_set(BASE)}
