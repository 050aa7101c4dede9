"""--tp-comm-overlap (userbuffers) per GEMM pair, by hand from Transformer Engine's module/base.py ``initialize_ub``
(default methods: ring_exchange for qkv/fc1 fprop and proj/fc2 dgrad, pipeline for proj/fc2 fprop, bulk for
qkv/fc1 dgrad and wgrad; 16 SMs for pipeline and bulk, 4 splits for pipeline) and its CommOverlap kernels."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.estimate.time import tp
from paraplan.estimate.time.compute import gemm_s
from paraplan.estimate.time.layer import dense_mlp_time, recompute_s
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
TP4 = ParallelLayout(tp=4, pp=1, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                     distributed_optimizer=True, tp_comm_overlap=True)
TRAINING = TrainingSpec(seq_len=8192, global_batch_size=16)


@pytest.mark.parametrize(("comm", "gemm", "t", "exposed"), [
    (0.8, 0.5, 4, 3 * (0.8 / 3 - 0.5 / 4)),  # each of 3 hops (0.267) longer than a chunk (0.125)
    (0.3, 0.5, 4, 0.0),                      # hops of 0.1 hide behind chunks of 0.125
    (0.8, 0.5, 1, 0.0),                      # no TP, nothing to exchange
])
def test_ring_exchange_golden(comm: float, gemm: float, t: int, exposed: float) -> None:
    assert float(tp.ring_exchange_exposed_s(comm, gemm, gemm, t)) == pytest.approx(exposed)


def test_pipeline_rs_golden() -> None:
    # GEMM 1.0 s on 7/8 of the SMs: 1/0.875 = 1.142857 s; RS 0.4 s in 4 chunks of 0.1, each behind a GEMM chunk of
    # 0.2857 except the last: 0.1 + (1.142857 - 1.0)
    assert float(tp.pipeline_rs_exposed_s(0.4, 1.0, 1.0, 0.125, 2)) == pytest.approx(0.1 + 1.0 / 0.875 - 1.0)
    # RS 2.0 s: each chunk 0.5 s against a GEMM chunk 0.2857: 0.5 + 3 x 0.2143 + 0.142857
    slowed = 1.0 / 0.875
    assert float(tp.pipeline_rs_exposed_s(2.0, 1.0, 1.0, 0.125, 2)) == pytest.approx(
        0.5 + 3 * (0.5 - slowed / 4) + slowed - 1.0)
    assert float(tp.pipeline_rs_exposed_s(2.0, 1.0, 1.0, 0.125, 1)) == 0.0


@pytest.mark.parametrize(("comm", "gemm", "exposed"), [(0.3, 1.0, 0.125 * 0.3), (1.0, 0.3, 0.7 + 0.125 * 0.3)])
def test_bulk_golden(comm: float, gemm: float, exposed: float) -> None:
    assert float(tp.bulk_exposed_s(comm, gemm, 0.125)) == pytest.approx(exposed)


@pytest.mark.parametrize(("comm", "gemm", "exposed"), [
    (0.3, 1.0, 1.0 / 0.875 - 1.0),                  # the GEMM on 7/8 of the SMs, the whole RS behind it
    (1.5, 1.0, 1.5 - 1.0 / 0.875 + 1.0 / 0.875 - 1.0),  # the RS outlasts the slowed GEMM: 0.5 in all
])
def test_bulk_golden_with_the_sm_margin(comm: float, gemm: float, exposed: float) -> None:
    """TE's default for bulk (``set_sm_margin`` True): the GEMM runs on SMs - num_sm for its whole run."""
    assert float(tp.bulk_exposed_s(comm, gemm, 0.125, True)) == pytest.approx(exposed)


def test_comm_sm_share_is_te_default_over_the_gpu_sms() -> None:
    cluster = make_cluster(H100, 8, 8)
    assert tp.comm_sm_share(cluster) == pytest.approx(16 / 132)


def test_mlp_block_by_hand() -> None:
    """Llama-3-70B MLP on 8 H100, TP4 SP, seq 8192, bf16: every pair from the GEMM times and collective times."""
    cluster = make_cluster(H100, 8, 8)
    T, h, f = 8192, LLAMA.hidden_size, LLAMA.ffn
    eff = H100.efficiency
    busbw = H100.nvlink_bytes_per_s * eff.nvlink_bus_frac
    coll = 3 / 4 * 2 * T * h / busbw + 2 * eff.collective_latency_s  # all-gather = reduce-scatter of 2 T h bytes
    fc1 = gemm_s(cluster, "bf16", T, 2 * f / 4, h)
    fc2 = gemm_s(cluster, "bf16", T, h, f / 4)
    fc2_dgrad = gemm_s(cluster, "bf16", T, f / 4, h)
    share = 16 / 132
    ring = lambda g: max(0.0, 3 * (coll / 3 - g / 4))  # noqa: E731
    slowed = fc2 / (1 - share)
    pipe = coll / 4 + 3 * max(0.0, (coll - slowed) / 4) + slowed - fc2
    bulk = max(0.0, coll - fc1 / (1 - share)) + fc1 / (1 - share) - fc1  # TE's bulk default: set_sm_margin
    fwd = ring(fc1) + pipe
    total = fwd + ring(fc2_dgrad) + 2 * bulk
    mlp = dense_mlp_time(LLAMA, cluster, TRAINING, TP4, ffn=f)
    assert float(mlp.tp_exposed_s) == pytest.approx(total, rel=1e-9)
    assert float(mlp.tp_fwd_exposed_s) == pytest.approx(fwd, rel=1e-9)
    assert float(mlp.tp_link_s) == pytest.approx(5 * coll, rel=1e-9)
    # without userbuffers: the 4 collectives of block_link_s all show (tp_overlap_frac 0)
    off = dense_mlp_time(LLAMA, cluster, TRAINING, replace(TP4, tp_comm_overlap=False), ffn=f)
    assert float(off.tp_exposed_s) == pytest.approx(4 * coll, rel=1e-9)
    assert float(off.tp_fwd_exposed_s) == pytest.approx(2 * coll, rel=1e-9)
    # full recompute re-runs the forward pairs
    full = replace(TP4, recompute="full")
    on_full = dense_mlp_time(LLAMA, cluster, TRAINING, full, ffn=f)
    no_tp = replace(on_full, tp_fwd_exposed_s=0.0)
    assert float(recompute_s(on_full, full, (), eff, moe=False) - recompute_s(no_tp, full, (), eff, moe=False)) \
        == pytest.approx(fwd, rel=1e-9)


def test_userbuffers_hide_tp_traffic_of_a_large_model() -> None:
    """70B on 8 H100 TP4: the GEMMs are long against the collectives, so the step is faster with the overlap and
    most of the TP traffic is hidden."""
    cluster = make_cluster(H100, 8, 8)
    on = estimate(LLAMA, cluster, TRAINING, replace(TP4, recompute="full"))
    off = estimate(LLAMA, cluster, TRAINING, replace(TP4, recompute="full", tp_comm_overlap=False))
    assert float(on.time.step_s) < float(off.time.step_s)
    assert float(on.time.exposed_comm_s["tp"]) < 0.5 * float(on.time.link_comm_s["tp"])
