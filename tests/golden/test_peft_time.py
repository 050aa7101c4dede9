"""PEFT (LoRA, Megatron-Bridge ``task=peft``) step time, by hand: the frozen base weights run no weight-gradient
GEMM (Transformer Engine module/linear.py ``_linear_backward``: wgrad only with ``requires_wgrad``), so a layer's
GEMMs take forward + dgrad = 2 forward times instead of 3; the frozen output layer likewise; and the frozen weights
are in no DDP grad buffer and no optimizer shard (param_and_grad_buffer.py), so there is no gradient reduce,
parameter gather or optimizer step on them (the adapters are neglected, as in the memory model)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.estimate.step_time import stage_terms, step_time
from paraplan.estimate.time.compute import GEMM_FWD_BWD_FACTOR
from paraplan.estimate.time.layer import layer_time
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

LLAMA = load_model("llama3-8b")
H100 = load_gpu("h100-80gb")
LAY = ParallelLayout(tp=2, pp=2, dp=2, mbs=1, recompute="none", sequence_parallel=True, distributed_optimizer=True)


def _training(peft: bool) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=32, peft=peft)


def test_layer_gemms_are_forward_and_dgrad_only() -> None:
    cluster = make_cluster(H100, 8, 8)
    full = layer_time(LLAMA, cluster, _training(False), LAY, moe=False)
    peft = layer_time(LLAMA, cluster, _training(True), LAY, moe=False)
    assert float(peft.gemm_fwd_s) == pytest.approx(float(full.gemm_fwd_s))
    assert float(full.gpu_s - peft.gpu_s) == pytest.approx(float(full.gemm_fwd_s))
    gemm_part = GEMM_FWD_BWD_FACTOR * float(full.gemm_fwd_s)
    assert float(full.gpu_s) - gemm_part == pytest.approx(float(peft.gpu_s) - 2 * float(full.gemm_fwd_s))


def test_output_layer_and_dp_by_hand() -> None:
    cluster = make_cluster(H100, 8, 8)
    a, b = stage_terms(LLAMA, cluster, _training(False), LAY), stage_terms(LLAMA, cluster, _training(True), LAY)
    assert float(a.logits_s - b.logits_s) == pytest.approx(float(a.logits_wgrad_s)) and float(b.logits_wgrad_s) == 0
    full = step_time(LLAMA, cluster, _training(False), LAY, num_microbatches=16)
    peft = step_time(LLAMA, cluster, _training(True), LAY, num_microbatches=16)
    assert float(full.link_comm_s["dp"]) > 0 and float(peft.link_comm_s["dp"]) == 0.0
    assert float(peft.exposed_comm_s["dp"]) == 0.0 and float(peft.optimizer_s) == 0.0
    # 16 micro-batches on the slowest stage (the last: 16 layers + the output layer), each without its wgrad GEMMs
    lt = layer_time(LLAMA, cluster, _training(False), LAY, moe=False)
    saved = 16 * (16 * float(lt.gemm_fwd_s) + float(a.logits_wgrad_s))
    assert int(full.slowest_stage) == int(peft.slowest_stage) == 1
    assert float(full.compute_s - peft.compute_s) == pytest.approx(saved)
    assert float(peft.step_s) < float(full.step_s)


def test_recompute_is_unchanged() -> None:
    cluster = make_cluster(H100, 8, 8)
    lay = replace(LAY, recompute="full")
    full = step_time(LLAMA, cluster, _training(False), lay, num_microbatches=16)
    peft = step_time(LLAMA, cluster, _training(True), lay, num_microbatches=16)
    assert float(peft.recompute_s) == pytest.approx(float(full.recompute_s))
