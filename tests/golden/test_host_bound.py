"""Golden host-bound MoE layers, by hand from the op counts of ``estimate.time.moe_sync`` (each count's docstring
cites the Megatron-LM d98e8a6 function it reads) and the formula of ``time.layer.moe_host_bound_s``:

- ops per MoE layer and micro-batch, (forward, backward): attention (16, 20), router (21, 10), alltoall (34, 10)
  with permute fusion or (51, 16) without, DeepEP (26, 8), HybridEP (19, 4), experts (10, 10), shared expert (6, 8),
  TP > 1 with SP adds (2, 2); combined 1F1B adds 4 schedule nodes of (9, 7);
- the GPU waits only after a sync: first for the post-sync ops (alltoall 2, HybridEP 1) on a drained GPU
  (``host_sync_s``), then plain schedules pay max(0, f x op - GPU forward - that wait), paired ones
  max(0, (f + b) x op - GPU forward + backward - that wait); a sync-free layer pays nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate.time import moe_sync
from paraplan.estimate.time.layer import layer_time, recompute_s
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import EfficiencySpec, host_kind, make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

QWEN = load_model("qwen3-30b-a3b")
LAYOUT = ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1)
HYBRID = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
DEEPEP = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}
DROP_PAD = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
BUDGET = {**HYBRID, "moe_expert_rank_capacity_factor": 1.5, "use_transformer_engine_op_fuser": True}
ATTN_GRAPH = {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn",)}
OP_S = 50e-6


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=64, precision="fp8", **kw)  # type: ignore[arg-type]


def _cluster(op_s: float = OP_S, gpu: str = "h100-80gb"):  # type: ignore[no-untyped-def]
    g = load_gpu(gpu)
    return make_cluster(replace(g, efficiency=replace(g.efficiency, host_op_issue_s=op_s)), 8)


@pytest.mark.parametrize(("kw", "tp", "shared", "ops"), [
    ({}, 1, False, (16 + 21 + 51 + 10, 20 + 10 + 16 + 10)),  # alltoall, unfused permute
    ({"moe_permute_fusion": True}, 1, False, (16 + 21 + 34 + 10, 20 + 10 + 10 + 10)),
    ({}, 2, False, (16 + 2 + 21 + 51 + 10, 20 + 2 + 10 + 16 + 10)),  # SP collectives
    ({}, 1, True, (16 + 21 + 51 + 10 + 6, 20 + 10 + 16 + 10 + 8)),  # shared expert
    (DEEPEP, 1, False, (16 + 21 + 26 + 10, 20 + 10 + 8 + 10)),
    (HYBRID, 1, False, (16 + 21 + 19 + 10, 20 + 10 + 4 + 10)),
    # graph scopes (transformer_layer.py _get_submodules_under_cudagraphs): attn replays the attention block (and
    # its SP collectives) but not pre_mlp_layernorm (1, 1), which the moe_router scope replays with the router
    (ATTN_GRAPH, 2, False, (1 + 21 + 51 + 10, 1 + 10 + 16 + 10)),
    # moe_preprocess also replays the alltoall preprocess (14) and the unfused first permutation (11; gradient 2)
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router", "moe_preprocess")}, 1,
     False, (51 - 25 + 10, 16 - 2 + 10)),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router")}, 1,
     False, (51 + 10, 16 + 10)),
    # the moe_router scope replays the shared expert too, unless --moe-shared-expert-overlap runs it outside
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router")}, 1, True,
     (51 + 10, 16 + 10)),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router"),
      "moe_shared_expert_overlap": True}, 1, True, (51 + 10 + 6, 16 + 10 + 8)),
    # HybridEP's preprocess: _initialize_metadata 8 + setup_metadata 3, no gradient ops
    ({**HYBRID, "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router",
                                                                                "moe_preprocess")}, 1, False,
     (19 - 11 + 10, 4 + 10)),
])
def test_host_issue_ops(kw: dict[str, object], tp: int, shared: bool, ops: tuple[int, int]) -> None:
    fwd, bwd = moe_sync.host_issue_ops(_t(**kw), tp=tp, shared_expert=shared)
    assert (int(fwd), int(bwd)) == ops


def test_no_load_balancing_loss_drops_the_aux_loss_ops() -> None:
    """router.py ``TopKRouter.routing`` computes the aux loss only ``if ... self.is_aux_loss_enabled()``: with
    load balancing "none" (gpt-oss) the router issues 21 - 12 forward and 10 - 5 backward ops."""
    with_loss = moe_sync.host_issue_ops(_t(), tp=1, shared_expert=False)
    without = moe_sync.host_issue_ops(_t(), tp=1, shared_expert=False, aux_loss=False)
    assert (int(with_loss[0]) - int(without[0]), int(with_loss[1]) - int(without[1])) == (12, 5)
    gpt = load_model("gpt-oss-120b")
    assert gpt.moe_router_load_balancing_type == "none"
    cl = _cluster()
    lay = replace(LAYOUT, schedule="combined_1f1b")
    got = layer_time(gpt, cl, _t(), lay, moe=True)
    zero = layer_time(gpt, _cluster(0.0), _t(), lay, moe=True)
    f, b = moe_sync.host_bound_ops(_t(), tp=1, shared_expert=False, schedule="combined_1f1b", aux_loss=False)
    expect = max(0.0, (f + b) * OP_S - float(zero.gpu_s) - float(got.host_sync_s))
    assert float(got.host_bound_s) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize(("kw", "schedule", "ops"), [
    ({}, "", (98, 0)),  # plain 1F1B: the backward runs ahead of the GPU
    ({}, "interleaved", (98, 0)),
    ({}, "combined_1f1b", (98 + 4 * 9, 56 + 4 * 7)),  # the paired backward is issued between the same syncs
    (DROP_PAD, "combined_1f1b", (0, 0)),  # alltoall with drop-and-pad: no sync
    (BUDGET, "", (0, 0)),  # HybridEP's rank budget: no sync
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("moe",), **DROP_PAD}, "", (0, 0)),
])
def test_host_bound_ops(kw: dict[str, object], schedule: str, ops: tuple[int, int]) -> None:
    fwd, bwd = moe_sync.host_bound_ops(_t(**kw), tp=1, shared_expert=False, schedule=schedule)
    assert (int(fwd), int(bwd)) == ops


def test_host_bound_time_plain_is_forward_ops_beyond_the_gpu_forward() -> None:
    cl, t = _cluster(), _t()
    base = layer_time(QWEN, _cluster(0.0), t, LAYOUT, moe=True)
    lt = layer_time(QWEN, cl, t, LAYOUT, moe=True)
    # the sync's own wait: alltoall issues its tokens' all_to_all (2 ops) on an idle GPU; the excess is net of it
    assert float(base.host_sync_s) == 0.0 and float(lt.host_sync_s) == pytest.approx(2 * OP_S, rel=1e-12)
    expect = max(0.0, 98 * OP_S - float(base.gpu_fwd_s) - 2 * OP_S)
    assert expect > 0.0  # this layer is host-bound at 50 us per op
    assert float(lt.host_bound_s) == pytest.approx(expect, rel=1e-12)
    assert float(lt.host_bound_fwd_s) == float(lt.host_bound_s)
    # the GPU waits max(sync wait, issue - GPU), not their sum
    assert float(lt.compute_s) == pytest.approx(
        float(base.compute_s) + max(2 * OP_S, 98 * OP_S - float(base.gpu_fwd_s)), rel=1e-12)


def test_gpu_bound_layer_waits_only_for_the_ops_after_its_sync() -> None:
    """At 1 us per op Qwen3-30B's layer is GPU-bound: the only wait is the post-sync issue (HybridEP: the dispatch
    call after ``cudaStreamSynchronize``, 1 op), not a fitted per-sync constant."""
    cl, t = _cluster(1e-6), _t(**HYBRID)
    lt = layer_time(QWEN, cl, t, LAYOUT, moe=True)
    base = layer_time(QWEN, _cluster(0.0), t, LAYOUT, moe=True)
    assert float(lt.host_bound_s) == 0.0
    assert float(lt.host_sync_s) == pytest.approx(1e-6, rel=1e-12)
    assert float(lt.compute_s) - float(base.compute_s) == pytest.approx(1e-6, rel=1e-9)
    assert float(layer_time(QWEN, cl, _t(**BUDGET), LAYOUT, moe=True).host_sync_s) == 0.0


def test_host_bound_time_combined_pairs_forward_and_backward() -> None:
    cl, t = _cluster(), _t()
    combined = replace(LAYOUT, schedule="combined_1f1b")
    base = layer_time(QWEN, _cluster(0.0), t, combined, moe=True)
    lt = layer_time(QWEN, cl, t, combined, moe=True)
    expect = max(0.0, (98 + 36 + 56 + 28) * OP_S - float(base.gpu_s) - 2 * OP_S)
    assert expect > 0.0
    assert float(lt.host_bound_s) == pytest.approx(expect, rel=1e-12)
    assert float(lt.host_bound_fwd_s) == pytest.approx(max(0.0, 134 * OP_S - float(base.gpu_fwd_s) - 2 * OP_S),
                                                       rel=1e-12)


def test_dense_layers_and_sync_free_layers_are_not_host_bound() -> None:
    cl = _cluster()
    assert float(layer_time(QWEN, cl, _t(), LAYOUT, moe=False).host_bound_s) == 0.0
    assert float(layer_time(QWEN, cl, _t(**DROP_PAD), LAYOUT, moe=True).host_bound_s) == 0.0


def test_full_recompute_reruns_the_forward_host_bound_time() -> None:
    cl, t = _cluster(), _t()
    full = replace(LAYOUT, recompute="full")
    lt = layer_time(QWEN, cl, t, full, moe=True)
    no_host = replace(lt, host_bound_s=0.0, host_bound_fwd_s=0.0)
    eff = cl.gpu.efficiency
    assert float(recompute_s(lt, full, (), eff, moe=True)) - float(recompute_s(no_host, full, (), eff, moe=True)) \
        == pytest.approx(float(lt.host_bound_fwd_s), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(op_s=st.floats(0.0, 2e-4), schedule=st.sampled_from(["", "combined_1f1b"]),
       mbs=st.sampled_from([1, 2, 4]))
def test_host_bound_is_never_negative_and_grows_with_the_per_op_cost(op_s: float, schedule: str, mbs: int) -> None:
    lay = replace(LAYOUT, schedule=schedule, mbs=mbs)
    lo = layer_time(QWEN, _cluster(op_s), _t(), lay, moe=True)
    hi = layer_time(QWEN, _cluster(op_s * 1.5 + 1e-6), _t(), lay, moe=True)
    assert float(lo.host_bound_s) >= 0.0
    assert float(hi.compute_s) >= float(lo.compute_s)


def test_step_breakdown_names_the_host_bound_term() -> None:
    cl = _cluster()
    lay = replace(LAYOUT, schedule="combined_1f1b")
    est = estimate(QWEN, cl, _t(), lay)
    hb = float(est.time.host_bound_s)
    assert hb > 0.0 and hb <= float(est.time.compute_s)
    per_layer = float(layer_time(QWEN, cl, _t(), lay, moe=True).host_bound_s)
    assert float(est.time.host_bound_per_layer_s) == pytest.approx(per_layer, rel=1e-12)
    # every layer of Qwen3-30B is MoE: m micro-batches x 48 layers x the per-layer term
    m = lay.num_microbatches(64)
    assert hb == pytest.approx(m * 48 * per_layer, rel=1e-9)
    assert est.time.as_dict()["host_bound_per_layer_s"] == pytest.approx(per_layer)
    graphed = estimate(QWEN, cl, _t(**DROP_PAD, cuda_graph_impl="local", cuda_graph_modules=("moe",)), lay)
    assert float(graphed.time.host_bound_s) == 0.0


def test_host_op_issue_s_is_validated() -> None:
    with pytest.raises(SpecError, match="host_op_issue_s"):
        EfficiencySpec(host_op_issue_s=-1e-6)


def test_host_kind() -> None:
    assert [host_kind(g) for g in ("gb200", "gb300", "b200", "b300", "h100-80gb")] == \
        ["grace", "grace", "x86", "x86", "x86"]


def test_explain_prints_the_host_bound_term_and_its_fixes() -> None:
    from paraplan.explain import time_findings

    cl = _cluster()
    lay = replace(LAYOUT, schedule="combined_1f1b")
    est = estimate(QWEN, cl, _t(), lay)
    found = {f.code: f for f in time_findings(est, None)}
    per = float(est.time.host_bound_per_layer_s)
    assert f"host-bound: {1e3 * per:.2f} ms per MoE layer" in found["HOST_BOUND"].text
    # alltoall: drop-and-pad is its fix; HybridEP's rank budget is not offered (Megatron refuses it without HybridEP)
    assert "--moe-pad-expert-input-to-capacity" in found["HOST_BOUND"].text
    assert "--moe-expert-rank-capacity-factor" not in found["HOST_BOUND"].text
    assert found["HOST_BOUND"].numbers["host_bound_per_layer_s"] == per
    sync_free = estimate(QWEN, cl, _t(**DROP_PAD), lay)
    assert "HOST_BOUND" not in {f.code for f in time_findings(sync_free, None)}


@pytest.mark.parametrize(("kw", "present", "absent"), [
    ({}, ["--moe-pad-expert-input-to-capacity", "--cuda-graph-modules moe"], ["--moe-expert-rank-capacity-factor"]),
    (HYBRID, ["--moe-expert-rank-capacity-factor with --moe-use-grouped-tensor", "--moe-pad-expert-input-to-capacity"],
     []),
    # Megatron's budget rule is met already: the fix names no extra flag
    ({**HYBRID, "moe_use_grouped_tensor": True}, ["(--moe-expert-rank-capacity-factor)"],
     ["with --moe-use-grouped-tensor or"]),
    # DeepEP: transformer_config.py refuses drop-and-pad with it, and its dispatch always waits
    (DEEPEP, ["refuses drop-and-pad", "--moe-flex-dispatcher-backend hybridep"], ["--cuda-graph-modules moe"]),
    ({"moe_token_dispatcher_type": "allgather"}, ["allgather", "alltoall with drop-and-pad"], []),
])
def test_host_bound_fixes_follow_the_dispatcher(kw: dict[str, object], present: list[str],
                                                absent: list[str]) -> None:
    from paraplan.explain import host_bound_fixes

    text = "; ".join(host_bound_fixes(_t(**kw)))
    for p in present:
        assert p in text
    for a in absent:
        assert a not in text
    if kw == DEEPEP:  # no fix offered that Megatron refuses: drop-and-pad only as part of switching to alltoall
        assert text.count("drop-and-pad (--moe-expert-capacity-factor") == 1
        assert "alltoall with drop-and-pad" in text


def test_dominant_time_names_host_bound_time_apart_from_compute() -> None:
    from paraplan.explain import time_findings

    cl = _cluster()
    est = estimate(QWEN, cl, _t(), replace(LAYOUT, schedule="combined_1f1b"))
    hb = float(est.time.host_bound_s)
    assert hb > 0.1 * float(est.time.step_s)  # large enough to rank among the top three terms
    dom = next(f for f in time_findings(est, None) if f.code == "DOMINANT_TIME")
    assert dom.numbers["host-bound (MoE)"] == pytest.approx(hb)
    assert dom.numbers["compute"] == pytest.approx(float(est.time.compute_s) - hb)
    assert "host-bound (MoE)" in dom.text
