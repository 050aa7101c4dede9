"""Golden tests of the pipeline schedules (``paraplan.schedules``): bubble and in-flight counts at
points computed by hand from the papers' formulas, and the timeline of each schedule's own order
agreeing with them.

Sources: Narayanan et al. 2021 (arXiv:2104.04473) section 2.2 for 1F1B / interleaved; Megatron-LM
``get_pp_rank_microbatches`` (``+ 1`` warm-up with ``overlap_moe_expert_parallel_comm``); Qi et al.
2024 (arXiv:2401.10241) section 3.1 for ZB-H1, bubble (p - 1)(T_F + T_B - T_W); the DualPipe README
table (DeepSeek-V3 report, arXiv:2412.19437) for DualPipe-V, bubble (PP/2 - 1)(F&B + B - 3W) and
PP + 1 activations over PP = 2p stages. Time units: F = 1, B_input = W = 1 (so the whole backward
is 2, a micro-batch 3 per rank; a chunk of a 2-chunk rank half of that).
"""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.errors import LayoutError
from paraplan.estimate.stages import all_stage_layers
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.report.schedule import simulate
from paraplan.schedules import NOT_IN_MEGATRON, SCHEDULE_NAMES, schedule_named
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec
from tests.conftest import gpt_model

VP_OF = {"1f1b": 1, "interleaved": 2, "combined_1f1b": 2, "zb-h1": 1, "dualpipe-v": 2}


def _bubble(name: str, p: int, v: int, m: int) -> float:
    return float(schedule_named(name).bubble_frac(pp=p, vp=v, num_microbatches=m))


def _in_flight(name: str, p: int, v: int, m: int) -> list[int]:
    s = schedule_named(name)
    return [int(s.in_flight_units(rank=r, pp=p, vp=v, num_microbatches=m)) for r in range(p)]


def test_every_schedule_is_registered_and_what_ifs_are_flagged() -> None:
    assert set(SCHEDULE_NAMES) == set(VP_OF)
    assert [n for n in SCHEDULE_NAMES if not schedule_named(n).megatron] == ["zb-h1", "dualpipe-v"]
    assert NOT_IN_MEGATRON == "not in Megatron-LM"


# --- hand-computed points -------------------------------------------------------------------------------

def test_1f1b_golden() -> None:
    # (p - 1)(F + B) idle on the critical path over m (F + B) of work: 3 / 8 at p = 4, m = 8
    assert _bubble("1f1b", 4, 1, 8) == pytest.approx(3 / 8, rel=1e-15)
    assert _in_flight("1f1b", 4, 1, 8) == [4, 3, 2, 1]
    assert _in_flight("1f1b", 4, 1, 2) == [2, 2, 2, 1]


def test_interleaved_golden() -> None:
    # (p - 1) / (v m) = 3 / 16; rank 0 warm-up 2 (p - 1) + (v - 1) p = 10 chunk-forwards, plus one
    assert _bubble("interleaved", 4, 2, 8) == pytest.approx(3 / 16, rel=1e-15)
    assert _in_flight("interleaved", 4, 2, 8) == [11, 9, 7, 5]
    assert int(schedule_named("interleaved").first_chunk_in_flight(pp=4, vp=2, num_microbatches=8)) == 7


def test_combined_1f1b_golden() -> None:
    s = schedule_named("combined_1f1b")
    assert _bubble("combined_1f1b", 4, 2, 8) == pytest.approx(3 / 16, rel=1e-15)  # interleaved's
    # the extra warm-up chunk-forward reaches interleaved's peak; a pair allocates what it frees
    assert _in_flight("combined_1f1b", 4, 2, 8) == _in_flight("interleaved", 4, 2, 8) == [11, 9, 7, 5]
    assert _in_flight("combined_1f1b", 1, 1, 8) == [1]  # PP = 1: F(i + 1) layer j beside B(i) layer L-1-j
    # unpaired passes keep their all-to-all: rank 0's 11 warm-up chunk-forwards of 16; PP = 1: 1 of 8
    assert float(s.ep_exposed_frac(pp=4, vp=2, num_microbatches=8)) == pytest.approx(11 / 16, rel=1e-15)
    assert float(s.ep_exposed_frac(pp=1, vp=1, num_microbatches=8)) == pytest.approx(1 / 8, rel=1e-15)
    assert s.launch_flags == ("--overlap-moe-expert-parallel-comm",)  # --delay-wgrad-compute is a knob


def test_zb_h1_golden() -> None:
    # Qi et al.: (p - 1)(T_F + T_B - T_W) = 3 (1 + 1 - 1) = 3 units idle, m (T_F + T_B + T_W) = 24 of work
    assert _bubble("zb-h1", 4, 1, 8) == pytest.approx(3 / 24, rel=1e-12)
    assert _bubble("zb-h1", 4, 1, 8) == pytest.approx(_bubble("1f1b", 4, 1, 8) / 3, rel=1e-12)
    # the peak over ranks is 1F1B's p (Qi et al.); rank r also keeps r deferred weight gradients
    assert _in_flight("zb-h1", 4, 1, 8) == [4, 4, 4, 4]
    assert max(_in_flight("zb-h1", 4, 1, 8)) == max(_in_flight("1f1b", 4, 1, 8))


def test_dualpipe_v_golden() -> None:
    # DualPipe README, PP = 8 stages on p = 4 ranks, chunk F = 1/2, B = 1, W = 1/2, F&B = F + B = 3/2:
    # (PP/2 - 1)(F&B + B - 3W) = 3 (3/2 + 1 - 3/2) = 3 units idle; m = 16 micro-batches of 3 units = 48
    assert _bubble("dualpipe-v", 4, 2, 16) == pytest.approx(3 / 48, rel=1e-12)
    # PP + 1 = 9 chunk-micro-batches on every rank (each chunk half of the rank's layers)
    assert _in_flight("dualpipe-v", 4, 2, 16) == [9, 9, 9, 9]
    assert int(schedule_named("dualpipe-v").output_rank(4)) == 0  # the V turns back: loss on rank 0


# --- each schedule's own timeline agrees with its formulas ------------------------------------------------

def _peak_held(ops: list[tuple[str, int, int]], pairs: frozenset[int] = frozenset()) -> int:
    """Most forward activations held along a rank's order (released by a whole B, or by W after I); a combined
    F&B pair (``pairs``: its F's position) frees layer by layer what it allocates, so it is counted after both."""
    held = peak = 0
    for i, (kind, _, _) in enumerate(ops):
        held += {"F": 1, "B": -1, "I": 0, "W": -1}[kind]
        if i not in pairs:
            peak = max(peak, held)
    return peak


@pytest.mark.parametrize("name", list(VP_OF))
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_timeline_bubble_equals_the_formula(name: str, p: int, m: int) -> None:
    v = VP_OF[name]
    sched = simulate(pp=p, vp=v, num_microbatches=m, forward=[1 / 3] * p, backward=[2 / 3] * p, schedule=name)
    assert sched.bubble_frac == pytest.approx(_bubble(name, p, v, m), abs=1e-9)


@pytest.mark.parametrize("name", list(VP_OF))
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_timeline_holds_the_in_flight_count(name: str, p: int, m: int) -> None:
    v, s = VP_OF[name], schedule_named(name)
    pairs = [s.paired_ops(rank=r, pp=p, vp=v, num_microbatches=m) if name == "combined_1f1b" else frozenset[int]()
             for r in range(p)]  # DualPipe-V's 2p + 1 (its README) counts a pair's F before its B
    peaks = [_peak_held(s.rank_order(rank=r, pp=p, vp=v, num_microbatches=m), pairs[r])  # type: ignore[arg-type]
             for r in range(p)]
    assert peaks == _in_flight(name, p, v, m)


@pytest.mark.parametrize("name", list(VP_OF))
def test_timeline_runs_every_pass_once(name: str) -> None:
    p, m, v = 4, 8, VP_OF[name]
    sched = simulate(pp=p, vp=v, num_microbatches=m, forward=[1.0] * p, backward=[2.0] * p, schedule=name)
    for r in range(p):
        assert sched.count(r, "F") == m * v
        assert sched.count(r, "B") + sched.count(r, "I") == m * v
        assert sched.count(r, "W") == sched.count(r, "I")


def test_zero_bubble_timeline_beats_1f1b_by_the_paper_margin() -> None:
    p, m = 8, 32
    one = simulate(pp=p, vp=1, num_microbatches=m, forward=[1.0] * p, backward=[2.0] * p)
    zb = simulate(pp=p, vp=1, num_microbatches=m, forward=[1.0] * p, backward=[2.0] * p, schedule="zb-h1")
    assert one.makespan - zb.makespan == pytest.approx((p - 1) * 2.0, abs=1e-9)  # (p - 1)(T_B + T_W - (T_B - T_W))


# --- Megatron's choice is today's formulas, bit for bit --------------------------------------------------

def test_megatron_choice_is_1f1b_or_interleaved_by_vp_bit_for_bit() -> None:
    auto = schedule_named("")
    pp = np.array([1, 2, 4, 4, 8, 16])
    vp = np.array([1, 1, 1, 2, 3, 4])
    m = np.array([8, 16, 3, 8, 24, 64])
    rank = np.array([0, 1, 2, 0, 5, 15])
    assert np.array_equal(auto.bubble_frac(pp=pp, vp=vp, num_microbatches=m), (pp - 1) / (vp * m))
    expect = np.where(vp > 1, np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, m * vp), np.minimum(pp - rank, m))
    assert np.array_equal(auto.in_flight_units(rank=rank, pp=pp, vp=vp, num_microbatches=m), expect)
    emb = np.where(vp > 1, np.minimum(2 * pp - 1, m), np.minimum(pp, m))
    assert np.array_equal(auto.first_chunk_in_flight(pp=pp, vp=vp, num_microbatches=m), emb)


# --- rules and placement ----------------------------------------------------------------------------------

def _training(m: int) -> TrainingSpec:
    return TrainingSpec(seq_len=2048, global_batch_size=m)


@pytest.mark.parametrize(("layout", "m", "reason"), [
    (ParallelLayout(pp=4, vp=2, dp=1, schedule="zb-h1"), 8, "SCHEDULE_VP"),
    (ParallelLayout(pp=4, vp=1, dp=1, schedule="dualpipe-v"), 8, "SCHEDULE_VP"),
    (ParallelLayout(pp=4, vp=2, dp=1, schedule="dualpipe-v"), 7, "SCHEDULE_MICROBATCHES"),
    (ParallelLayout(pp=1, dp=4, schedule="zb-h1"), 8, "SCHEDULE_NEEDS_PP"),
    (ParallelLayout(pp=4, vp=2, dp=1, schedule="combined_1f1b"), 8, "COMBINED_1F1B_NEEDS_EP"),
    (ParallelLayout(pp=4, vp=1, dp=1, schedule="interleaved"), 8, "SCHEDULE_VP"),
])
def test_schedule_rules_reject_with_a_reason(layout: ParallelLayout, m: int, reason: str) -> None:
    model = gpt_model(num_layers=8)
    cluster = make_cluster(load_gpu("h100-80gb"), 4)
    with pytest.raises(LayoutError) as err:
        estimate(model, cluster, _training(m), layout)
    assert err.value.reason == reason


def test_combined_1f1b_needs_vp_with_a_pipeline_and_no_full_recompute() -> None:
    model = load_model("mixtral-8x7b")
    cluster = make_cluster(load_gpu("h100-80gb"), 16)
    base = dict(pp=2, dp=8, ep=8, schedule="combined_1f1b")
    for lay, reason in ((ParallelLayout(vp=1, **base), "COMBINED_1F1B_NEEDS_VP"),  # type: ignore[arg-type]
                        (ParallelLayout(vp=2, recompute="full", **base), "COMBINED_1F1B_RECOMPUTE")):  # type: ignore[arg-type]
        with pytest.raises(LayoutError) as err:
            estimate(model, cluster, _training(64), lay)
        assert err.value.reason == reason


def test_unknown_schedule_is_one_line_naming_the_choices() -> None:
    from paraplan.errors import SpecError

    with pytest.raises(SpecError, match="schedule: unknown 'zb-h2'; allowed: 1f1b, interleaved, combined_1f1b"):
        ParallelLayout(schedule="zb-h2")


def test_dualpipe_v_puts_embedding_and_loss_on_rank_0() -> None:
    model = gpt_model(num_layers=8)
    stages = all_stage_layers(model, ParallelLayout(pp=4, vp=2, dp=1, schedule="dualpipe-v"))
    assert stages[0].has_embedding and stages[0].has_output
    assert not any(s.has_output for s in stages[1:])
    megatron = all_stage_layers(model, ParallelLayout(pp=4, vp=2, dp=1))
    assert megatron[3].has_output and not megatron[0].has_output


def test_what_if_schedules_gain_the_bubble_they_remove() -> None:
    """Same layout, fewer bubble seconds: ZB-H1 takes 2/3 of 1F1B's bubble away, nothing else changes."""
    model = gpt_model(num_layers=16)
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    tr = TrainingSpec(seq_len=2048, global_batch_size=16)
    one = estimate(model, cluster, tr, ParallelLayout(pp=8, dp=1, schedule="1f1b"))
    zb = estimate(model, cluster, tr, ParallelLayout(pp=8, dp=1, schedule="zb-h1"))
    assert float(zb.time.bubble_s) == pytest.approx(float(one.time.bubble_s) / 3, rel=1e-12)
    assert float(one.time.step_s) - float(zb.time.step_s) == pytest.approx(
        float(one.time.bubble_s) * 2 / 3, rel=1e-9)
    assert float(zb.time.compute_s) == float(one.time.compute_s)
