"""Golden host-device sync counts of an MoE layer, by hand from Megatron-LM d98e8a6 (megatron/core/transformer/moe/):

- allgather: ``MoEAllGatherTokenDispatcher.dispatch_postprocess``'s ``.cpu()`` of the counts: 1;
- alltoall: ``_maybe_dtoh_and_synchronize``'s one ``d2h_event.synchronize()``; skipped with drop-and-pad: 1 / 0;
- flex DeepEP: ``buffer.dispatch`` waits for the GPU's counts on the CPU (fused_a2a.py ``FusedDispatch``): 1;
- flex HybridEP: ``non_blocking = num_permuted_tokens is not None`` (set by the rank budget or drop-and-pad): 1 / 0;
- the backward reuses the forward's host counts (``_AllToAll.backward``, the DeepEP / HybridEP handle): 0;
- a full-iteration CUDA graph, or the ``moe`` module captured, holds no sync: 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate.time import moe_sync
from paraplan.estimate.time.layer import moe_mlp_time, recompute_s
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import PAGED_STASH_RANK_CAPACITY_FACTOR, training_knobs
from paraplan.rules import knob_violations
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec

QWEN = load_model("qwen3-30b-a3b")
GB200 = make_cluster(load_gpu("gb200"), 8)
LAYOUT = ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=4)
HYBRID = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
BUDGET = {**HYBRID, "moe_expert_rank_capacity_factor": 1.5, "use_transformer_engine_op_fuser": True}
DROP_PAD = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=256, precision="fp8", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "syncs"), [
    ({"moe_token_dispatcher_type": "allgather"}, 1),
    ({"moe_token_dispatcher_type": "allgather", **DROP_PAD}, 1),  # the .cpu() runs whatever the capacity
    ({}, 1),  # alltoall dropless
    ({"moe_expert_capacity_factor": 1.2}, 1),  # token drop without padding: the sync moves earlier, still one
    (DROP_PAD, 0),
    ({"moe_token_dispatcher_type": "flex"}, 1),  # DeepEP
    ({"moe_token_dispatcher_type": "flex", "moe_expert_capacity_factor": 1.2}, 1),
    (HYBRID, 1),
    ({**HYBRID, "moe_expert_capacity_factor": 1.2}, 1),  # no padding: num_permuted_tokens stays None
    ({**HYBRID, **DROP_PAD}, 0),
    (BUDGET, 0),
    ({**BUDGET, "moe_paged_stash": True}, 0),
])
def test_dispatcher_syncs(kw: dict[str, object], syncs: int) -> None:
    t = _t(**kw)
    assert moe_sync.dispatcher_host_syncs(t) == syncs
    assert moe_sync.host_syncs_per_moe_layer(t) == syncs  # no CUDA graph


@pytest.mark.parametrize(("kw", "syncs"), [
    # full_iteration is sync-free only with a sync-free dispatcher (rules: CUDA_GRAPH_FULL_ITERATION_MOE_SYNC)
    ({"cuda_graph_impl": "full_iteration", **BUDGET}, 0),
    ({"cuda_graph_impl": "full_iteration", **DROP_PAD}, 0),
    ({"cuda_graph_impl": "full_iteration"}, 1),
    ({"cuda_graph_impl": "full_iteration", **HYBRID}, 1),
    ({"cuda_graph_impl": "full_iteration", "moe_token_dispatcher_type": "flex"}, 1),  # DeepEP's host wait
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe"), **DROP_PAD}, 0),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("moe",), **DROP_PAD}, 0),
    # the router graph leaves the dispatch (and its sync) outside
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router", "moe_preprocess"),
      **HYBRID}, 1),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("moe_router",)}, 1),
    # a per-layer graph of the whole layer: no Megatron rule makes a dropless MoE layer sync-free there
    ({"cuda_graph_impl": "local"}, 1),
    ({"cuda_graph_impl": "transformer_engine"}, 1),
    ({"cuda_graph_impl": "none", "cuda_graph_modules": ("moe",), **DROP_PAD}, 0),  # drop-and-pad, no graph
    ({"cuda_graph_impl": "none", "cuda_graph_modules": ("moe",)}, 1),  # modules without an impl: no capture
])
def test_graphs_remove_the_syncs_they_capture(kw: dict[str, object], syncs: int) -> None:
    assert moe_sync.host_syncs_per_moe_layer(_t(**kw)) == syncs


@pytest.mark.parametrize(("kw", "ops"), [
    ({"moe_token_dispatcher_type": "allgather"}, 2), ({}, 2), ({"moe_token_dispatcher_type": "flex"}, 1),
    (HYBRID, 1)])
def test_post_sync_ops(kw: dict[str, object], ops: int) -> None:
    """Ops from the sync's return to the token exchange: alltoall's tokens ``all_to_all`` (2), allgather's
    ``.item()`` + permute (2), DeepEP's dispatch kernel in the same C++ call (1), HybridEP's dispatch call after
    ``cudaStreamSynchronize`` in ``metadata_preprocessing`` (1)."""
    assert moe_sync.post_sync_ops(_t(**kw)) == ops


def test_host_sync_time_is_count_times_the_per_sync_cost() -> None:
    per_sync = moe_sync.post_sync_ops(_t(**HYBRID)) * GB200.gpu.efficiency.host_op_issue_s
    assert per_sync > 0.0  # the Grace host's per-op cost
    eager = moe_mlp_time(QWEN, GB200, _t(**HYBRID), LAYOUT)
    assert float(eager.host_sync_s) == pytest.approx(per_sync, rel=1e-15)
    for kw in ({**BUDGET, "cuda_graph_impl": "full_iteration"}, BUDGET):
        assert float(moe_mlp_time(QWEN, GB200, _t(**kw), LAYOUT).host_sync_s) == 0.0
    # what a full-iteration graph saves: one sync per MoE layer and micro-batch on top of the launches
    assert float(eager.compute_s) - float(moe_mlp_time(QWEN, GB200, _t(**BUDGET), LAYOUT).compute_s) \
        == pytest.approx(per_sync, rel=1e-9)


def test_recompute_reruns_every_sync() -> None:
    """The syncs are all in the forward: full recompute and selective ``moe`` recompute (moe_layer.py: the whole
    ``custom_forward`` with the dispatch is checkpointed) pay all of them again; ``moe_act`` does not."""
    lt = moe_mlp_time(QWEN, GB200, _t(**HYBRID), LAYOUT)
    no_sync = replace(lt, host_sync_s=0.0)
    sync = float(lt.host_sync_s)
    eff = GB200.gpu.efficiency
    for lay, mods in ((replace(LAYOUT, recompute="full"), ()),
                      (replace(LAYOUT, recompute="selective", recompute_modules=("moe",)), ("moe",))):
        got = float(recompute_s(lt, lay, mods, eff, moe=True)) - float(recompute_s(no_sync, lay, mods, eff, moe=True))
        assert got == pytest.approx(sync, rel=1e-9)
    act = replace(LAYOUT, recompute="selective", recompute_modules=("moe_act",))
    assert float(recompute_s(lt, act, ("moe_act",), eff, moe=True)) \
        == float(recompute_s(no_sync, act, ("moe_act",), eff, moe=True))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([{"moe_token_dispatcher_type": "allgather"}, {}, {"moe_token_dispatcher_type": "flex"},
                        HYBRID, BUDGET, DROP_PAD, {**HYBRID, **DROP_PAD}]),
       st.sampled_from(["none", "local", "transformer_engine", "full_iteration"]),
       st.sampled_from([(), ("attn",), ("attn", "moe_router"), ("moe_router", "moe_preprocess")]))
def test_graphs_never_add_syncs(kw: dict[str, object], impl: str, mods: tuple[str, ...]) -> None:
    if impl == "full_iteration":
        mods = ()
    base = _t(**kw)
    graphed = replace(base, cuda_graph_impl=impl, cuda_graph_modules=mods)
    assert moe_sync.host_syncs_per_moe_layer(graphed) <= moe_sync.host_syncs_per_moe_layer(base)
    assert float(moe_mlp_time(QWEN, GB200, graphed, LAYOUT).compute_s) \
        <= float(moe_mlp_time(QWEN, GB200, base, LAYOUT).compute_s) * (1 + 1e-12)


def test_full_iteration_step_is_faster_by_the_syncs() -> None:
    """Qwen3-30B-A3B (48 MoE layers) on 8 GB200, 8 micro-batches a step: the full-iteration graph with HybridEP's
    rank budget (what the NVIDIA recipes run) removes 48 x 8 syncs from the step (and the launches, which this
    GPU-bound layer hides); without the budget HybridEP syncs inside the capture, which estimate refuses."""
    t = _t(**HYBRID)
    eager = estimate(QWEN, GB200, t, LAYOUT)
    assert "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC" in dict(
        knob_violations(QWEN, LAYOUT, replace(t, cuda_graph_impl="full_iteration")))
    graphed = estimate(QWEN, GB200, _t(**BUDGET, cuda_graph_impl="full_iteration"), LAYOUT)
    assert QWEN.num_layers == 48 and sum(QWEN.moe_layer_pattern()) == 48
    micro = 256 // (8 * 4)
    saved = eager.time.step_s - graphed.time.step_s
    assert saved == pytest.approx(48 * micro * GB200.gpu.efficiency.host_op_issue_s, rel=1e-6)  # 1 op per sync


MOE_FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
             "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16 "
             "--use-distributed-optimizer --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 "
             "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep").split()


def test_rank_budget_and_paged_stash_read_and_written_back() -> None:
    flags = read_flags([*MOE_FLAGS, "--moe-expert-rank-capacity-factor", "1.2", "--moe-paged-stash",
                        "--use-transformer-engine-op-fuser"])
    t = flags.training_fields
    assert (t["moe_expert_rank_capacity_factor"], t["moe_paged_stash"], t["use_transformer_engine_op_fuser"]) \
        == (1.2, True, True)
    assert not flags.unknown_flags
    training = _t(**BUDGET, moe_paged_stash=True)
    words = argv(megatron_args(QWEN, LAYOUT, training), resolve=True)
    assert words[words.index("--moe-expert-rank-capacity-factor") + 1] == "1.5"
    assert {"--moe-paged-stash", "--use-transformer-engine-op-fuser"} <= set(words)
    default = argv(megatron_args(QWEN, LAYOUT, _t(**HYBRID)), resolve=True)
    assert not {"--moe-expert-rank-capacity-factor", "--moe-paged-stash", "--use-transformer-engine-op-fuser"} \
        & set(default)


def test_rank_budget_rules_as_megatron() -> None:
    """TransformerConfig.__post_init__: the budget is HybridEP's and needs the op fuser; the paged stash needs the
    budget and no CPU offloading."""
    with pytest.raises(SpecError, match=r"^moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend"):
        _t(moe_expert_rank_capacity_factor=1.5, use_transformer_engine_op_fuser=True)
    with pytest.raises(SpecError, match=r"^moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend"):
        _t(moe_token_dispatcher_type="flex", moe_expert_rank_capacity_factor=1.5,
           use_transformer_engine_op_fuser=True)  # DeepEP
    with pytest.raises(SpecError, match="requires use_transformer_engine_op_fuser=True"):
        _t(**HYBRID, moe_expert_rank_capacity_factor=1.5)
    with pytest.raises(SpecError, match=r"^moe_paged_stash requires moe_expert_rank_capacity_factor"):
        _t(**HYBRID, moe_paged_stash=True)
    with pytest.raises(SpecError, match=r"^moe_paged_stash cannot be enabled with cpu_offloading"):
        _t(**BUDGET, moe_paged_stash=True, cpu_offloading_num_layers=2)
    with pytest.raises(SpecError, match=r"^moe_expert_rank_capacity_factor must be a number above 0"):
        _t(**{**BUDGET, "moe_expert_rank_capacity_factor": 0.0})
    with pytest.raises(SpecError, match=r"^moe_paged_stash must be true or false"):
        _t(**BUDGET, moe_paged_stash="yes")


def test_paged_stash_recipes_run_sync_free() -> None:
    stash = [r for r in bridge_recipes() if r.get("moe_paged_stash") is True]
    assert stash  # 33 in the packaged library
    for r in stash:
        knobs = training_knobs(r, "fp8")
        assert (knobs["moe_paged_stash"], knobs["moe_expert_rank_capacity_factor"],
                knobs["use_transformer_engine_op_fuser"]) == (True, PAGED_STASH_RANK_CAPACITY_FACTOR, True)
        t = TrainingSpec(seq_len=4096, global_batch_size=256, precision="fp8", **knobs)
        assert moe_sync.dispatcher_host_syncs(t) == 0


def test_bridge_target_writes_the_budget_set() -> None:
    from paraplan.launch.bridge import choose_recipe, overrides
    from tests.launch.test_bridge import _knob_spec

    spec = _knob_spec(**BUDGET, moe_paged_stash=True)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert (items["model.moe_expert_rank_capacity_factor"], items["model.moe_paged_stash"],
            items["model.use_transformer_engine_op_fuser"]) == (1.5, True, True)
    plain = _knob_spec(**HYBRID)  # cleared with the rest, so that a recipe's own budget is not run unestimated
    items = dict(overrides(plain, choose_recipe(plain)))
    assert (items["model.moe_expert_rank_capacity_factor"], items["model.moe_paged_stash"]) == (None, False)


def test_retired_per_sync_constant_is_not_charged() -> None:
    """``moe_layer_overhead_s`` charged the wait after a sync a second time beside the host-issue term (issue 18):
    no time term reads it, and ``calibrate --params`` no longer offers it."""
    from paraplan.calibrate import PARAM_BOUNDS

    g = GB200.gpu
    other = make_cluster(replace(g, efficiency=replace(g.efficiency, moe_layer_overhead_s=1e-3)), 8)
    t = _t(**HYBRID)
    assert estimate(QWEN, other, t, LAYOUT).time.step_s == estimate(QWEN, GB200, t, LAYOUT).time.step_s
    assert "moe_layer_overhead_s" not in PARAM_BOUNDS and "host_op_issue_s" in PARAM_BOUNDS


def test_rank_budget_rule_is_megatrons_backend_check() -> None:
    """Megatron checks the backend only (transformer_config.py: 'hybridep' or 'ncclep'): the hybridep backend under the
    alltoall dispatcher is accepted, and the budget, HybridEP's (the flex dispatcher's), changes nothing there."""
    with pytest.raises(SpecError, match=r"to be 'hybridep' or 'ncclep'\."):
        _t(moe_expert_rank_capacity_factor=1.5, use_transformer_engine_op_fuser=True)
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    plain = _t(moe_flex_dispatcher_backend="hybridep", use_transformer_engine_op_fuser=True)
    budget = replace(plain, moe_expert_rank_capacity_factor=0.5)
    assert plain.moe_token_dispatcher_type == budget.moe_token_dispatcher_type == "alltoall"
    assert estimate(QWEN, cluster, budget, LAYOUT).peak_bytes == estimate(QWEN, cluster, plain, LAYOUT).peak_bytes
    flex = [estimate(QWEN, cluster, replace(t, moe_token_dispatcher_type="flex"), LAYOUT).peak_bytes
            for t in (plain, budget)]
    assert flex[0] != flex[1]  # under flex the budget acts
