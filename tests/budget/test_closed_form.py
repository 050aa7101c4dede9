"""The closed forms 6*T*P/(n*X) and 8*T*P/(n*X_hw) (Narayanan et al. 2021) against the planner's time to train.

X is the planner's model FLOP/s per GPU, X_hw its hardware FLOP/s (recomputed forward included). The two agree
exactly once the closed form is scaled by the planner's FLOPs per token (attention scores and logits are what
6*P leaves out, embeddings what it adds), and within 15% raw for Llama-3 8B/70B at seq 4096.
"""

from __future__ import annotations

import pytest

from paraplan.budget import budget, closed_form_days
from paraplan.estimate.flops import model_flops_per_step, recompute_flops_per_step
from paraplan.estimate.params import model_param_counts
from paraplan.search import SearchSpace, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec
from paraplan.units import SECONDS_PER_DAY, TFLOP

TOKENS = 15e12
SEQ, GBS = 4096, 1024
RAW_TOLERANCE = 0.15
CASES = [("llama3-8b", 8), ("llama3-8b", 64), ("llama3-70b", 64), ("llama3-70b", 256)]


@pytest.mark.parametrize(("name", "n"), CASES)
def test_six_tp_over_nx_matches_planner_days(name: str, n: int) -> None:
    model = load_model(name)
    res = budget(model, [load_gpu("h100-80gb")], tokens=TOKENS, seq_len=SEQ, gbs=GBS, num_gpus=n)
    (row,) = res.rows
    assert row.feasible and row.days is not None and row.model_tflops_per_gpu is not None and row.config
    params = model_param_counts(model, max_positions=model.max_position_embeddings or SEQ).total
    x = row.model_tflops_per_gpu * TFLOP
    closed = 6 * TOKENS * params / (n * x) / SECONDS_PER_DAY
    assert closed == pytest.approx(closed_form_days(TOKENS, params, n, x), rel=1e-12)
    assert row.closed_form_days == pytest.approx(closed, rel=1e-12)
    flops = model_flops_per_step(model, seq_len=SEQ, global_batch_size=GBS, tp=row.config["tp"])
    expected_ratio = 6 * params * SEQ * GBS / flops  # 6P per token over Megatron's model FLOPs per token
    assert closed / row.days == pytest.approx(expected_ratio, rel=1e-9)
    assert abs(closed / row.days - 1) < RAW_TOLERANCE


@pytest.mark.parametrize(("name", "n"), [("llama3-8b", 8), ("llama3-70b", 64)])
def test_eight_tp_over_nx_hw_under_full_recompute(name: str, n: int) -> None:
    model = load_model(name)
    training = TrainingSpec(seq_len=SEQ, global_batch_size=GBS)
    cluster = make_cluster(load_gpu("h100-80gb"), n)
    est = plan(model, cluster, training, space=SearchSpace(recompute=("full",)), top_k=1).candidates[0]
    assert est.layout.recompute == "full"
    days = TOKENS / (float(est.throughput.tokens_per_s_per_gpu) * n) / SECONDS_PER_DAY
    params = model_param_counts(model, max_positions=model.max_position_embeddings or SEQ).total
    x_hw = float(est.throughput.hardware_tflops_per_gpu) * TFLOP
    closed = closed_form_days(TOKENS, params, n, x_hw, flops_per_param_token=8.0)
    hw_flops = model_flops_per_step(model, seq_len=SEQ, global_batch_size=GBS, tp=est.layout.tp)
    hw_flops += recompute_flops_per_step(model, seq_len=SEQ, global_batch_size=GBS, recompute_code=2,
                                         recompute_modules=tuple(est.layout.recompute_modules))
    assert closed / days == pytest.approx(8 * params * SEQ * GBS / hw_flops, rel=1e-9)
    assert abs(closed / days - 1) < RAW_TOLERANCE


def test_closed_form_days_is_linear() -> None:
    base = closed_form_days(1e12, 1e9, 8, 4e14)
    assert base == pytest.approx(6 * 1e12 * 1e9 / (8 * 4e14) / SECONDS_PER_DAY)
    assert closed_form_days(2e12, 1e9, 16, 4e14) == pytest.approx(base)
    assert closed_form_days(1e12, 1e9, 8, 4e14, flops_per_param_token=8.0) == pytest.approx(base * 8 / 6)
