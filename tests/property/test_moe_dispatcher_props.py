"""Invariants of the MoE dispatcher and expert-parallel overlap formulas (hypothesis): the flex dispatcher never puts
more token copies on the network than the alltoall one, overlap never exposes more than the communication itself,
more communication never exposes less, and delaying the weight gradients never exposes more."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.estimate.time import ep
from paraplan.specs.load import load_model

DSV3 = load_model("deepseek-v3")
POSITIVE = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(experts_log2=st.integers(3, 9), topk=st.integers(1, 8), ep_log2=st.integers(1, 9),
       per_domain_log2=st.integers(0, 6))
def test_flex_network_copies_at_most_alltoall(experts_log2: int, topk: int, ep_log2: int, per_domain_log2: int) -> None:
    e, n = 2 ** experts_log2, 2 ** min(ep_log2, experts_log2)
    g = 2 ** min(per_domain_log2, ep_log2)
    k = min(topk, e)
    model = replace(DSV3, num_experts=e, moe_router_topk=k, moe_router_num_groups=None, moe_router_group_topk=None)
    rdma, nvlink = ep.flex_copies_per_token(model, n, g)
    remote_share = (n - min(g, n)) / n
    assert -1e-12 <= float(rdma) <= k * remote_share + 1e-9  # union bound: one copy per remote domain hit
    assert -1e-12 <= float(nvlink) <= min(k, n) + 1e-9       # one copy per rank hit
    assert 0.0 <= float(ep.domain_miss_prob(e, k, e / n)) <= 1.0


@settings(max_examples=300, deadline=None)
@given(ep_s=POSITIVE, more=POSITIVE, att=POSITIVE, mlp=POSITIVE, delay=st.booleans())
def test_paired_overlap_is_bounded_and_monotone(ep_s: float, more: float, att: float, mlp: float, delay: bool) -> None:
    compute = 3.0 * (att + mlp)
    got = float(ep.paired_exposed_s(ep_s, compute, mlp, delay_wgrad=delay))
    assert -1e-9 <= got <= ep_s * (1 + 1e-9) + 1e-9
    assert float(ep.paired_exposed_s(ep_s + more, compute, mlp, delay_wgrad=delay)) >= got - 1e-9 * (1 + ep_s + more)


@settings(max_examples=300, deadline=None)
@given(ep_s=POSITIVE, att=POSITIVE, mlp=POSITIVE)
def test_delayed_wgrad_never_exposes_more(ep_s: float, att: float, mlp: float) -> None:
    compute = 3.0 * (att + mlp)
    delayed = float(ep.paired_exposed_s(ep_s, compute, mlp, delay_wgrad=True))
    plain = float(ep.paired_exposed_s(ep_s, compute, mlp, delay_wgrad=False))
    assert delayed <= plain + 1e-9 * (1 + ep_s + compute)


@settings(max_examples=200, deadline=None)
@given(ep_s=POSITIVE, shared=POSITIVE)
def test_shared_expert_overlap_never_exposes_more(ep_s: float, shared: float) -> None:
    hidden = float(ep.unpaired_exposed_s(ep_s, shared, shared_overlap=True))
    assert 0.0 <= hidden <= float(ep.unpaired_exposed_s(ep_s, shared, shared_overlap=False)) + 1e-12


def test_vectorised_like_scalars() -> None:
    ep_s = np.array([0.0, 3.0, 12.0, 100.0])
    got = ep.paired_exposed_s(ep_s, 12.0, 2.0, delay_wgrad=False)
    assert np.allclose(got, [float(ep.paired_exposed_s(float(x), 12.0, 2.0, delay_wgrad=False)) for x in ep_s])
