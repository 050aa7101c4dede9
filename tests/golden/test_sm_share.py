"""Golden values of the compute slowdown the EP dispatch / combine kernels cause by holding SMs, by hand from the code
each formula cites:

- flex dispatcher SMs: ``--moe-flex-dispatcher-num-sms`` or the backend default (Megatron ``_DeepepManager``: 20;
  DeepEP hybrid-ep ``Configurer``: 24 inside one NVLink domain, 8 across);
- compute beside a pass runs at (SM_total - SM_comm) / SM_total of the GPU (GpuSpec.sm_count: H100 SXM5 132);
- the combined-1F1B two-stream plan then charges each hidden pass a (1 - share) of compute time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate.time import ep
from paraplan.estimate.time.compute import compute_share_beside, slowed_end, sm_count_of
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.grid import Group
from paraplan.specs.load import gpu_from_dict, load_gpu, load_model
from paraplan.specs.training import TrainingSpec

DSV3 = load_model("deepseek-v3")
H100_GPU = load_gpu("h100-80gb")
H100 = make_cluster(H100_GPU, 1024)
LAYOUT = ParallelLayout(tp=2, pp=8, vp=4, dp=64, ep=64, etp=1, mbs=1, recompute="selective",
                        recompute_modules=("mla_up_proj",), sequence_parallel=True,
                        pipeline_layout=(1, *[2] * 30, 0), schedule="combined_1f1b")
"""NVIDIA's DeepSeek-V3 1,024-H100 layout (TP2 PP8 VP4 EP64) on the combined-1F1B EP-overlap schedule."""


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=16384, delay_wgrad_compute=True, **kw)  # type: ignore[arg-type]


def _flex(**kw: object) -> TrainingSpec:
    return _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", **kw)


def test_presets_carry_the_whitepaper_sm_counts() -> None:
    assert (load_gpu("a100-80gb").sm_count, load_gpu("a100-40gb").sm_count, H100_GPU.sm_count) == (108, 108, 132)
    for name in ("h200-141gb", "b200", "b300", "gb200", "gb300", "mi300x"):  # no primary figure read
        assert load_gpu(name).sm_count is None
    # the one fallback both TP userbuffers and the flex dispatcher read: the architecture's figure
    assert [sm_count_of(make_cluster(load_gpu(g), 8, 8)) for g in ("h200-141gb", "b200", "gb300")] == [132, 148, 148]


def test_compute_share_by_hand() -> None:
    assert float(compute_share_beside(132, 33, "k")) == pytest.approx(99 / 132, rel=1e-15)
    assert float(compute_share_beside(108, 20, "k")) == pytest.approx(88 / 108, rel=1e-15)
    assert float(compute_share_beside(132, 132, "k")) == pytest.approx(1 / 132)  # HybridEP accepts all: one left
    with pytest.raises(SpecError, match="must be at most the GPU's 132 SMs"):
        compute_share_beside(132, 133, "k")


def test_flex_sms_defaults_per_backend() -> None:
    # DeepEP: 20 whatever the group; HybridEP: 24 inside one NVLink domain, 8 when the group spans several
    assert float(ep.flex_comm_sms(_t(moe_token_dispatcher_type="flex"), 64, 8)) == 20.0
    assert float(ep.flex_comm_sms(_flex(), 8, 8)) == 24.0
    assert float(ep.flex_comm_sms(_flex(), 64, 8)) == 8.0
    assert float(ep.flex_comm_sms(_flex(moe_hybridep_num_sms=32), 64, 8)) == 32.0


def test_ep_compute_share_only_for_flex() -> None:
    inside = Group(size=8, stride=1)
    across = Group(size=64, stride=2)
    assert float(ep.ep_compute_share(H100, _flex(), inside)) == pytest.approx(108 / 132, rel=1e-15)
    assert float(ep.ep_compute_share(H100, _flex(), across)) == pytest.approx(124 / 132, rel=1e-15)
    assert ep.ep_compute_share(H100, _t(moe_token_dispatcher_type="alltoall"), across) == 1.0
    gb200 = make_cluster(load_gpu("gb200"), 256)  # no sm_count in the preset: the architecture's (assumed) 148
    assert float(ep.ep_compute_share(gb200, _flex(moe_hybridep_num_sms=32), across)) == pytest.approx(116 / 148)


def test_slowed_end_by_hand() -> None:
    # 10 s of work beside a 4 s pass at 3/4: 3 s done in the pass, 7 s after it -> 11
    assert float(slowed_end(0.0, 10.0, [(0.0, 4.0)], 0.75)) == pytest.approx(11.0, rel=1e-15)
    # 2 s of work at 1/2 inside a 4 s pass -> ends at 4, still inside it
    assert float(slowed_end(0.0, 2.0, [(0.0, 4.0)], 0.5)) == pytest.approx(4.0, rel=1e-15)
    # from 1: full rate to 3 (2 s), 1 s of work in (3, 5), full rate to 6 (1 s), 1 s in (6, 8), 5 s after -> 13
    assert float(slowed_end(1.0, 10.0, [(3.0, 5.0), (6.0, 8.0)], 0.5)) == pytest.approx(13.0, rel=1e-15)
    # a pass over before the kernel starts slows nothing
    assert float(slowed_end(5.0, 2.0, [(0.0, 4.0)], 0.5)) == pytest.approx(7.0, rel=1e-15)


def test_paired_passes_cost_their_sm_share_by_hand() -> None:
    # a = 1 per pass, A = 8, M = 2: every pass starts with the compute kernel it hides behind and is shorter than
    # it, so each of the 4 passes slows that kernel by a (1 - share) = 0.25 at share 3/4 (33 of 132 SMs held).
    for delay in (False, True):
        assert float(ep.paired_exposed_s(4.0, 30.0, 2.0, delay_wgrad=delay)) == pytest.approx(0.0, abs=1e-12)
    assert float(ep.paired_exposed_s(4.0, 30.0, 2.0, delay_wgrad=False, compute_share=0.75)) \
        == pytest.approx(4 * 0.25, rel=1e-12)
    # communication-bound: the passes run back to back (4 a = 100 per layer) and the slowed compute still fits
    # beside them (12 / 0.75 = 16 < 100): nothing more is exposed than the link time the compute leaves
    assert float(ep.paired_exposed_s(100.0, 12.0, 2.0, delay_wgrad=True, compute_share=0.75)) \
        == pytest.approx(100.0 - 12.0, rel=1e-12)


def test_shared_expert_overlap_costs_its_sm_share_by_hand() -> None:
    # a = 2 per pass, S = 4: forward passes beside 2 s (fc1 / fc2 halves), backward ones beside 4 s; at share 1/2
    # a 2 s kernel inside a 2 s pass ends at 3 (1 s done in it): exposed 1; a 4 s one ends at 5: exposed 1
    assert float(ep.unpaired_exposed_s(8.0, 4.0, shared_overlap=True)) == pytest.approx(0.0, abs=1e-12)
    assert float(ep.unpaired_exposed_s(8.0, 4.0, shared_overlap=True, compute_share=0.5)) \
        == pytest.approx(2 * 1.0 + 2 * 1.0, rel=1e-12)


def test_estimate_charges_the_flex_sms_on_h100() -> None:
    off = estimate(DSV3, H100, _flex(moe_hybridep_num_sms=1), LAYOUT)  # one SM held: a 1/132 slowdown
    on = estimate(DSV3, H100, _flex(moe_hybridep_num_sms=32), LAYOUT)
    more = estimate(DSV3, H100, _flex(moe_hybridep_num_sms=64), LAYOUT)
    hidden = float(off.time.link_comm_s["ep"] - off.time.exposed_comm_s["ep"])
    extra = float(on.time.exposed_comm_s["ep"] - off.time.exposed_comm_s["ep"])
    link = float(off.time.link_comm_s["ep"])
    assert 0.0 < hidden and 0.0 < extra <= link * 31 / 132 * (1 + 1e-9)  # at most the held SMs' share of the passes
    assert float(more.time.step_s) > float(on.time.step_s) > float(off.time.step_s)  # more SMs held: slower
    assert on.time.compute_s == off.time.compute_s  # the cost is the EP passes', not the kernels' own time
    # the alltoall dispatcher (NCCL channels not derived) is not charged
    a2a = _t(moe_token_dispatcher_type="alltoall")
    many = make_cluster(replace(H100_GPU, sm_count=1024), 1024)
    assert estimate(DSV3, H100, a2a, LAYOUT).time.step_s == estimate(DSV3, many, a2a, LAYOUT).time.step_s


@pytest.mark.parametrize("value", [0, -1, 2000, 1.5, "x", [132]])
def test_bad_sm_count_one_line(value: object) -> None:
    data = {"hbm_gib": 80, "hbm_tbyte_per_s": 3.35, "bf16_tflops": 989, "nvlink_gbyte_per_s": 450,
            "network_gbit_per_s": 400, "gpus_per_node": 8, "nvlink_domain_size": 8, "sm_count": value}
    with pytest.raises(SpecError, match="sm_count") as err:
        gpu_from_dict(data, name="custom")
    assert "\n" not in str(err.value)


def test_flex_sms_above_the_gpu_refused_one_line_naming_the_flag() -> None:
    estimate(DSV3, H100, _flex(moe_hybridep_num_sms=132), LAYOUT)  # Megatron and HybridEP accept every SM
    with pytest.raises(SpecError, match="--moe-flex-dispatcher-num-sms \\(133\\) must be at most the GPU's 132 SMs"):
        estimate(DSV3, H100, _flex(moe_hybridep_num_sms=133), LAYOUT)


@settings(max_examples=300, deadline=None)
@given(ep_s=st.floats(0.0, 50.0), compute_s=st.floats(0.1, 50.0), mlp_frac=st.floats(0.0, 0.33),
       share=st.floats(0.05, 1.0), lower=st.floats(0.0, 1.0), delay=st.booleans())
def test_sm_share_costs_at_most_its_share_of_the_passes(ep_s: float, compute_s: float, mlp_frac: float,
                                                        share: float, lower: float, delay: bool) -> None:
    """Holding SMs never hides more, costs at most (1 - share) of the link time per layer, and costs more the
    more SMs it holds (a lower share)."""
    m = mlp_frac * compute_s
    free = float(ep.paired_exposed_s(ep_s, compute_s, m, delay_wgrad=delay))
    held = float(ep.paired_exposed_s(ep_s, compute_s, m, delay_wgrad=delay, compute_share=share))
    more = float(ep.paired_exposed_s(ep_s, compute_s, m, delay_wgrad=delay, compute_share=share * lower + 0.01))
    tol = 1e-9 * (1.0 + ep_s + compute_s)
    assert free - tol <= held <= free + (1.0 - share) * ep_s + tol
    if share * lower + 0.01 <= share:
        assert more >= held - tol
