"""Checkpoint bytes per rank and in total, save/load time and async staging (paraplan.checkpoint)."""

from __future__ import annotations

import pytest

from paraplan.checkpoint import (
    DEFAULT_STORAGE_BYTES_PER_S_PER_GPU,
    StorageSpec,
    advise,
    checkpoint_size,
    checkpoint_timing,
)
from paraplan.errors import SpecError
from paraplan.estimate.params import model_param_counts
from paraplan.estimator import Estimate, estimate, max_positions_for
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

from ..conftest import gpt_model

H100 = load_gpu("h100-80gb")
TRAIN = TrainingSpec(seq_len=2048, global_batch_size=64)


def est(model: ModelSpec, num_gpus: int, **layout: object) -> Estimate:
    return estimate(model, make_cluster(H100, num_gpus), TRAIN, layout_for_world(num_gpus, **layout))


def unique_params(model: ModelSpec, tp: int) -> int:
    """Whole-model parameters (published-size count at TP 1) plus the vocabulary padding rows at ``tp``
    (embedding, and output layer when untied): what the shards of every rank add up to."""
    whole = model_param_counts(model, max_positions=max_positions_for(model, TRAIN)[0]).total
    pad_rows = model.padded_vocab_size(tp) - model.padded_vocab_size(1)
    return whole + pad_rows * model.hidden_size * (2 if model.untie_embeddings_and_output_weights else 1)


def llama_tp_replicated(model: ModelSpec) -> int:
    """RMSNorm models without biases: two norms a layer and the final norm are whole on every TP rank."""
    return (2 * model.num_layers + 1) * model.hidden_size


def test_untied_model_writes_2_bytes_of_weights_and_12_of_optimizer_per_parameter() -> None:
    model = load_model("llama3-8b")  # untied embeddings
    e = est(model, 16, tp=2, pp=2)
    size = checkpoint_size(e)
    p = unique_params(model, 2)
    # every TP rank's optimizer buffer holds its own copy of the norms: (TP - 1) extra copies
    p_opt = p + (2 - 1) * llama_tp_replicated(model)
    assert size.ckpt_format == "torch_dist"
    assert size.weights_bytes == pytest.approx(2 * p, rel=1e-12)  # bf16 weights, each written once
    assert size.main_weights_bytes == pytest.approx(4 * p_opt, rel=1e-12)  # fp32 master weights
    assert size.moments_bytes == pytest.approx(8 * p_opt, rel=1e-12)  # exp_avg + exp_avg_sq
    assert size.total_bytes == pytest.approx(2 * p + 12 * p_opt, rel=1e-12)
    assert checkpoint_size(e, with_optimizer=False).total_bytes == pytest.approx(2 * p, rel=1e-12)
    tp1 = checkpoint_size(est(model, 16, pp=2))
    assert tp1.total_bytes == pytest.approx(14 * unique_params(model, 1), rel=1e-12)


def test_bytes_per_rank_shrink_with_dp_and_sum_to_the_total() -> None:
    model = load_model("llama3-8b")
    small, large = checkpoint_size(est(model, 8, tp=2, pp=2)), checkpoint_size(est(model, 32, tp=2, pp=2))
    for a, b in zip(small.bytes_per_rank, large.bytes_per_rank, strict=True):
        assert b == pytest.approx(a / 4)  # DP 2 -> 8
    assert large.total_bytes == pytest.approx(small.total_bytes)
    ranks_per_stage = 32 // 2  # bytes_per_rank is TP rank 0's, which also writes the norms
    assert large.total_bytes < sum(large.bytes_per_rank) * ranks_per_stage < 1.001 * large.total_bytes
    assert large.max_bytes_per_node == 8 * large.max_bytes_per_rank


def test_cp_shards_like_dp() -> None:
    model = load_model("llama3-8b")
    a, b = checkpoint_size(est(model, 16, tp=2, cp=2)), checkpoint_size(est(model, 16, tp=2))
    assert a.max_bytes_per_rank == pytest.approx(b.max_bytes_per_rank)  # DP x CP = 4 x 2 = 8 x 1


def test_tied_output_copy_is_not_written_twice_but_its_optimizer_state_is() -> None:
    model = gpt_model()  # tied embeddings, learned positions, LayerNorm (2h) and biases
    e = est(model, 8, tp=2, pp=2)
    p = unique_params(model, 2)
    size = checkpoint_size(e)
    assert size.weights_bytes == pytest.approx(2 * p, rel=1e-12)
    h = model.hidden_size
    # TP-replicated: per layer two LayerNorms (2 x 2h) and the row-parallel biases of proj and fc2 (2 x h),
    # the final LayerNorm and the learned positions
    replicated = model.num_layers * 6 * h + 2 * h + max_positions_for(model, TRAIN)[0] * h
    tied_copy = model.padded_vocab_size(2) * h  # the last stage's word-embedding copy has optimizer state
    assert size.main_weights_bytes / 4 == pytest.approx(p + replicated + tied_copy, rel=1e-12)


def test_fsdp_dtensor_writes_fp32_main_weights_and_moments_only() -> None:
    model = load_model("llama3-8b")
    e = est(model, 16, tp=2, fsdp=True, distributed_optimizer=False)
    p = unique_params(model, 2)
    size = checkpoint_size(e)
    assert size.ckpt_format == "fsdp_dtensor"
    assert size.weights_bytes == 0
    assert size.total_bytes == pytest.approx(12 * p, rel=1e-12)  # DCP writes replicated chunks once
    assert checkpoint_size(e, with_optimizer=False).total_bytes == pytest.approx(4 * p, rel=1e-12)
    with pytest.raises(SpecError, match="fsdp_dtensor needs Megatron-FSDP"):
        checkpoint_size(est(model, 16, tp=2), ckpt_format="fsdp_dtensor")
    with pytest.raises(SpecError, match="ckpt_format"):
        checkpoint_size(e, ckpt_format="torch")


def test_experts_shard_over_expert_dp() -> None:
    model = load_model("mixtral-8x7b")
    a = checkpoint_size(est(model, 16, tp=2, ep=4))
    b = checkpoint_size(est(model, 16, tp=2, ep=8))
    p = unique_params(model, 2)
    assert model.num_experts is not None
    router = model.num_layers * model.num_experts * model.hidden_size  # whole on every TP rank, like the norms
    assert a.total_bytes == pytest.approx(2 * p + 12 * (p + llama_tp_replicated(model) + router), rel=1e-12)
    assert b.total_bytes == pytest.approx(a.total_bytes, rel=1e-12)
    # EP 4 x expert-DP 2 or EP 8 x expert-DP 1: each rank writes 1/8 of the TP shard of the experts either way
    assert b.max_bytes_per_rank == pytest.approx(a.max_bytes_per_rank, rel=1e-12)
    dense_only = checkpoint_size(est(load_model("llama3-8b"), 16, tp=2))
    assert dense_only.max_bytes_per_rank < a.max_bytes_per_rank


def test_save_time_aggregate_per_node_and_async_staging() -> None:
    e = est(load_model("llama3-8b"), 16, tp=2, pp=2)
    size = checkpoint_size(e)
    default = checkpoint_timing(size, 16, StorageSpec())
    assert default.save_s == pytest.approx(size.total_bytes / (16 * DEFAULT_STORAGE_BYTES_PER_S_PER_GPU))
    assert default.host_ram_fits is None and not default.async_save and default.blocking_save_s == default.save_s
    fast = StorageSpec(aggregate_bytes_per_s=100e9, per_node_bytes_per_s=1e9)
    t = checkpoint_timing(size, 16, fast)
    assert t.storage_bound == "per_node" and t.save_s == pytest.approx(size.max_bytes_per_node / 1e9)
    roomy = StorageSpec(aggregate_bytes_per_s=10e9, host_memory_bytes_per_node=size.max_bytes_per_node,
                        async_overlap_frac=0.75)
    t = checkpoint_timing(size, 16, roomy)
    assert t.async_save and t.host_ram_fits is True
    assert t.blocking_save_s == pytest.approx(0.25 * size.total_bytes / 10e9)
    tight = StorageSpec(aggregate_bytes_per_s=10e9, host_memory_bytes_per_node=0.99 * size.max_bytes_per_node)
    t = checkpoint_timing(size, 16, tight)
    assert t.host_ram_fits is False and not t.async_save
    with pytest.raises(SpecError, match="async_overlap_frac"):
        StorageSpec(async_overlap_frac=1.5)


def test_advice_reason_is_one_line_with_the_numbers() -> None:
    adv = advise(est(load_model("llama3-8b"), 16, tp=2, pp=2))
    text = adv.reason()
    assert "\n" not in text and f"every {adv.save_interval_iters} iterations" in text
    assert "synchronous save: host RAM per node unknown" in text
