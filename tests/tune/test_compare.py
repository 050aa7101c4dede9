"""compare(): measured runs next to their predictions (sample logs and synthetic logs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.estimator import Estimate, estimate
from paraplan.ingest import parse_text, read_logs
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, model_from_megatron_args
from paraplan.specs.training import TrainingSpec
from paraplan.tune import compare
from tests.tune.helpers import dp_rank0_ranks, make_estimate, megatron_log

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
MIB = 2**20


def _sample(prefix: str) -> str:
    return str(next(LOGS.glob(f"{prefix}_*.log")))


def gpt70b_estimate() -> Estimate:
    """The run of logs/17: GPT 70B (80 x 8192, 64 heads, vocab 32000), 32 GPUs, TP 4 / PP 8 / DP 1,
    seq 4096, GBS 512, full recompute, no SP, no distributed optimizer (see the file header)."""
    model = model_from_megatron_args({"num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                                      "vocab_size": 32000, "max_position_embeddings": 4096}, name="gpt-70b")
    layout = layout_for_world(32, tp=4, pp=8, recompute="full", sequence_parallel=False,
                              distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False)
    return estimate(model, make_cluster(load_gpu("h100-80gb"), 32, 8),
                    TrainingSpec(seq_len=4096, global_batch_size=512), layout)


def test_sample_17_ranks_map_to_pipeline_stages() -> None:
    est = gpt70b_estimate()
    cmp = compare(est, read_logs([_sample("17")]))
    assert len(cmp.stages) == 8
    # stage = rank // (TP 4 x CP 1 x DP 1): ranks 0-3 hold the embedding and peak at 47104.31 MiB
    assert cmp.stages[0].ranks == (0, 1, 2, 3)
    assert cmp.stages[0].measured_bytes == pytest.approx(47104.31 * MIB)
    assert cmp.stages[1].ranks == (4, 5, 6, 7)
    assert cmp.stages[1].measured_bytes == pytest.approx(44566.31 * MIB)
    assert cmp.stages[6].ranks == (24, 27)
    assert cmp.stages[5].measured_bytes is None and cmp.stages[7].ranks == ()
    assert cmp.metrics["peak_memory_bytes"].measured == pytest.approx(47104.31 * MIB)
    assert cmp.stages[0].reserved_bytes == pytest.approx(48934.0 * MIB)
    # only the first iteration was logged: it is used, flagged as warm-up
    assert cmp.warmup_only and cmp.metrics["step_time_s"].measured == pytest.approx(776.9383)
    assert any("warm-up" in n for n in cmp.notes)
    assert cmp.step_ratio == 1.0  # a warm-up step does not scale other predictions
    # the prediction is within 25% of the measured per-stage peaks (full recompute, no SP)
    for s in cmp.stages:
        if s.ratio is not None:
            assert 0.8 < s.ratio < 1.25


def test_sample_01_mixtral_throughput_and_step() -> None:
    est = make_estimate("mixtral-8x7b", 16, 4096, 128, tp=2, ep=8)
    cmp = compare(est, read_logs([_sample("01")]))
    assert not cmp.warmup_only and cmp.iterations == 2
    assert cmp.metrics["step_time_s"].measured == pytest.approx(10.11765)
    assert cmp.metrics["log_tflops_per_gpu"].measured == pytest.approx(129.1)
    tok = cmp.metrics["tokens_per_s_per_gpu"].measured
    assert tok == pytest.approx(128 * 4096 / (10.11765 * 16))
    assert cmp.metrics["peak_memory_bytes"].measured is None
    assert all(s.measured_bytes is None for s in cmp.stages)


def test_synthetic_log_roundtrip_with_cp() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 128, tp=2, cp=2, pp=2)
    text = megatron_log(est, step_s=5.0, bubble_s=0.5, dp_sync_s=0.2, mem_factor=1.2)
    cmp = compare(est, parse_text(text))
    assert dp_rank0_ranks(est, 1) == [8, 9, 10, 11]
    assert [s.ranks for s in cmp.stages] == [(0, 1, 2, 3), (8, 9, 10, 11)]
    for s in cmp.stages:
        assert s.ratio == pytest.approx(1.2, rel=1e-4)
    assert cmp.metrics["step_time_s"].measured == pytest.approx(5.0, rel=5e-3)  # warm-up record skipped
    assert cmp.metrics["bubble_and_pp_s"].measured == pytest.approx(0.5, abs=1e-3)
    assert cmp.comm["dp"].measured == pytest.approx(0.2, abs=1e-4)
    assert cmp.metrics["optimizer_s"].measured == pytest.approx(float(est.time.optimizer_s), abs=1e-4)
    mfu = cmp.metrics["mfu"]
    assert mfu.ratio == pytest.approx(float(est.time.step_s) / 5.0, rel=5e-3)
    d = cmp.to_dict()
    assert set(d) >= {"config", "metrics", "memory_per_stage", "exposed_comm_s", "notes"}


def test_gbs_mismatch_is_an_error_and_no_step_is_a_note() -> None:
    # a log of another global batch is another run: its MFU against this prediction was 294% once
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=1)
    with pytest.raises(SpecError, match="global batch size 32 differs from the prediction's 64"):
        compare(est, parse_text(megatron_log(est, gbs=32, timers=False, memory=False)))
    empty = compare(est, parse_text("nothing here\n"))
    assert empty.metrics["step_time_s"].measured is None and empty.step_ratio == 1.0
    assert any("no step time" in n for n in empty.notes)


def test_ranks_outside_the_world_are_reported() -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=2, pp=2)
    line = ("[Rank 12] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 | reserved: 3.0 | "
            "max reserved: 3.0\n")
    cmp = compare(est, parse_text(line))
    assert any("outside the world" in n for n in cmp.notes)


def test_a_log_faster_than_the_gpu_can_be_is_an_error() -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=1)
    fast = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 10.0 | global batch size: 64 |\n"
                      " iteration 20/100 | elapsed time per iteration (ms): 10.0 | global batch size: 64 |\n")
    with pytest.raises(SpecError, match="MFU for this model on 8 GPUs"):
        compare(est, fast)


def test_a_log_tflops_of_another_formula_is_noted() -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=1)
    right = float(est.throughput.model_tflops_per_gpu)
    same = compare(est, parse_text(megatron_log(est, tflops=right)))
    assert not any("counts FLOPs differently" in n for n in same.notes)
    older = compare(est, parse_text(megatron_log(est, tflops=0.5 * right)))
    assert any("counts FLOPs differently from Megatron main's formula" in n for n in older.notes)
