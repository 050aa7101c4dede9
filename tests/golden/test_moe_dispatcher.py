"""Golden values of the MoE dispatcher knobs, by hand from the Megatron-LM code each formula cites (main @ d98e8a6):

- alltoall (token_dispatcher.py ``MoEAlltoAllTokenDispatcher``): T k routed bf16 rows per rank, 4 all-to-alls;
- allgather (``MoEAllGatherTokenDispatcher``): all-gather of the ETP x EP group's hidden states (bf16), reduce-scatter
  in the router probabilities' dtype, both mirrored in backward;
- flex / DeepEP, HybridEP (``_DeepepManager``, ``_HybridEPManager``): a token crosses the network once per remote
  NVLink domain holding one of its experts, NVLink once per rank holding one;
- combined 1F1B (``model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run``): two streams, four passes.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from paraplan.errors import SpecError
from paraplan.estimate import comm
from paraplan.estimate.time import ep
from paraplan.estimate.time.compute import hbm_rate
from paraplan.estimate.time.layer import moe_mlp_time
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.grid import Group
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec

DSV3 = load_model("deepseek-v3")
H100 = make_cluster(load_gpu("h100-80gb"), 1024)


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=16384, **kw)  # type: ignore[arg-type]


def test_domain_miss_is_the_hypergeometric_zero() -> None:
    # 256 experts, top-8, a domain of 8 ranks x 4 experts = 32 experts: C(224, 8) / C(256, 8)
    assert float(ep.domain_miss_prob(256, 8, 32)) == pytest.approx(math.comb(224, 8) / math.comb(256, 8), rel=1e-12)
    assert float(ep.domain_miss_prob(256, 8, 256)) == 0.0
    assert float(ep.domain_miss_prob(256, 8, 0)) == 1.0


def test_node_limited_routing_misses_half_the_domains() -> None:
    # DeepSeek-V3: 8 groups, top-4 groups; one group per 8-GPU node at EP 64: C(7, 4) / C(8, 4) = 1/2
    assert float(ep.group_miss_prob(8, 4, 1)) == pytest.approx(35 / 70, rel=1e-15)


def test_flex_copies_of_deepseek_v3_at_ep64_on_h100() -> None:
    assert (DSV3.moe_router_num_groups, DSV3.moe_router_group_topk, DSV3.num_experts, DSV3.moe_router_topk) \
        == (8, 4, 256, 8)
    rdma, nvlink = ep.flex_copies_per_token(DSV3, 64, 8)
    assert float(rdma) == pytest.approx(7 * 0.5, rel=1e-12)  # 7 remote nodes, each hit with probability 1/2
    assert float(nvlink) == pytest.approx(64 * (1 - math.comb(252, 8) / math.comb(256, 8)), rel=1e-12)


def test_flex_link_time_by_hand() -> None:
    tokens, h = 2048.0, DSV3.hidden_size
    group = Group(size=64, stride=1)
    topo = H100.topology
    row = 2.0 * tokens * h
    rdma, nvlink = 3.5, 64 * (1 - math.comb(252, 8) / math.comb(256, 8))
    per_pass = max(rdma * row / float(topo.busbw(64, start=1)), nvlink * row / topo.nvlink.busbw_bytes_per_s) \
        + math.log2(64) * float(comm.tier_latency_s(H100, 64))
    assert float(ep.flex_link_s(H100, DSV3, group, tokens, h)) == pytest.approx(4 * per_pass, rel=1e-12)
    # the network carries 3.5 copies of a token instead of alltoall's 8 x 56/64 = 7: less than half the time
    a2a = float(ep.all_to_all_link_s(H100, group, tokens * 8, h))
    assert float(ep.flex_link_s(H100, DSV3, group, tokens, h)) < 0.55 * a2a


def test_flex_inside_one_nvlink_domain_is_nvlink_only() -> None:
    group = Group(size=8, stride=1)
    rdma, nvlink = ep.flex_copies_per_token(DSV3, 8, 8)
    assert float(rdma) == 0.0
    row = 2.0 * 1024 * DSV3.hidden_size
    want = 4 * (float(nvlink) * row / H100.topology.nvlink.busbw_bytes_per_s
                + 3 * float(comm.tier_latency_s(H100, 8)))
    assert float(ep.flex_link_s(H100, DSV3, group, 1024.0, DSV3.hidden_size)) == pytest.approx(want, rel=1e-12)


def test_allgather_link_time_by_hand() -> None:
    group = Group(size=8, stride=1)  # ETP 1 x EP 8 inside a node
    tokens, h = 4096.0, DSV3.hidden_size
    busbw = float(comm.ring_busbw(H100, 8, 1))
    alpha = float(comm.tier_latency_s(H100, 8))

    def ag(nbytes: float) -> float:
        return 7 / 8 * nbytes / busbw + 3 * alpha

    full = 8 * tokens * h
    want = 2 * (ag(2 * full) + ag(4 * full))  # bf16 hidden states; the combine in the fp32 router dtype
    assert float(ep.all_gather_link_s(H100, group, tokens, h, 4.0)) == pytest.approx(want, rel=1e-12)
    fp32 = replace(DSV3, moe_router_dtype="fp32")
    t = _t(moe_token_dispatcher_type="allgather")
    assert float(ep.dispatcher_link_s(H100, fp32, t, group, group, 8 * tokens, h)) == pytest.approx(want, rel=1e-12)
    # no --moe-router-dtype: the probabilities (and the combine) are bf16
    assert DSV3.moe_router_dtype is None
    bf16 = 2 * (ag(2 * full) + ag(2 * full))
    assert float(ep.dispatcher_link_s(H100, DSV3, t, group, group, 8 * tokens, h)) == pytest.approx(bf16, rel=1e-12)


def test_dispatcher_link_picks_the_formula() -> None:
    ep_g, tp_ep = Group(size=64, stride=1), Group(size=64, stride=1)
    routed, h = 8 * 2048.0, DSV3.hidden_size
    got = {kind: float(ep.dispatcher_link_s(H100, DSV3, _t(moe_token_dispatcher_type=kind), ep_g, tp_ep, routed, h))
           for kind in ("alltoall", "allgather", "flex")}
    assert got["alltoall"] == pytest.approx(float(ep.all_to_all_link_s(H100, ep_g, routed, h)), rel=1e-15)
    assert got["flex"] == pytest.approx(float(ep.flex_link_s(H100, DSV3, ep_g, 2048.0, h)), rel=1e-15)
    assert got["allgather"] == pytest.approx(float(ep.all_gather_link_s(H100, tp_ep, 2048.0, h, 2.0)), rel=1e-15)
    # gathering every token of 64 ranks costs more than sending 8 copies of one's own, which costs more than
    # sending one copy per remote node
    assert got["allgather"] > got["alltoall"] > 2 * got["flex"]


def test_capacity_load_factor() -> None:
    assert ep.routed_load_factor(_t()) == 1.0
    assert ep.routed_load_factor(_t(moe_expert_capacity_factor=0.8)) == 0.8  # tokens over capacity dropped
    assert ep.routed_load_factor(_t(moe_expert_capacity_factor=1.5)) == 1.0  # dropless in balance
    assert ep.routed_load_factor(_t(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True)) == 1.5


def test_paired_overlap_by_hand() -> None:
    # a = 3 per pass, A = 2 (attention forward), M = 2 (MLP forward): compute 3 (A + M) = 12 per layer.
    # Without delayed wgrad the steady layer period is 14 (2 exposed): the dispatch backward waits for the
    # MLP dgrad + wgrad (4), then the attention backward (4) waits for it. With it the period is 12.
    assert float(ep.paired_exposed_s(12.0, 12.0, 2.0, delay_wgrad=False)) == pytest.approx(2.0, rel=1e-12)
    assert float(ep.paired_exposed_s(12.0, 12.0, 2.0, delay_wgrad=True)) == pytest.approx(0.0, abs=1e-12)
    # communication-bound: the comm stream runs back to back, 4 a per layer
    assert float(ep.paired_exposed_s(100.0, 12.0, 2.0, delay_wgrad=True)) == pytest.approx(100.0 - 12.0, rel=1e-12)
    assert float(ep.paired_exposed_s(0.0, 12.0, 2.0, delay_wgrad=False)) == 0.0


def test_shared_expert_overlap_by_hand() -> None:
    # a = 2 per pass, shared expert forward S = 2: forward passes hide 1 each, backward ones 2 each
    assert float(ep.unpaired_exposed_s(8.0, 2.0, shared_overlap=True)) == pytest.approx(2 * 1.0 + 2 * 0.0)
    assert float(ep.unpaired_exposed_s(8.0, 2.0, shared_overlap=False)) == 8.0


LAYOUT = ParallelLayout(tp=2, pp=8, vp=4, dp=64, ep=64, etp=1, mbs=1, recompute="selective",
                        recompute_modules=("mla_up_proj", "mlp"), sequence_parallel=True,
                        pipeline_layout=(1, *[2] * 30, 0))
"""NVIDIA's DeepSeek-V3 1,024-H100 layout (TP2 PP8 VP4 EP64) with a split of its 61 layers over 32 virtual stages."""


def test_estimate_moves_with_the_dispatcher() -> None:
    base = estimate(DSV3, H100, _t(), LAYOUT)
    flex = estimate(DSV3, H100, _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                                   moe_permute_fusion=True), LAYOUT)
    assert float(flex.time.exposed_comm_s["ep"]) < 0.55 * float(base.time.exposed_comm_s["ep"])
    lay = LAYOUT
    t_base = moe_mlp_time(DSV3, H100, _t(), lay)
    t_flex = moe_mlp_time(DSV3, H100, _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                                         moe_permute_fusion=True, moe_permute_fusion_into_hybridep=True), lay)
    te = 4096 * 8 / 2  # routed copies per rank: T k ETP / TP
    # alltoall (bf16: no quantization padding): permute + unpermute 24 B (MOE_PERMUTE_BYTES_PER_ELEMENT) and, with
    # 256 / 64 = 4 experts per rank, sort_chunks_by_idxs and back, 2 x 8 B, per routed element, fwd + bwd
    permute_s = 24.0 * te * DSV3.hidden_size / hbm_rate(H100)
    sort_s = 16.0 * te * DSV3.hidden_size / hbm_rate(H100)
    assert float(t_base.elementwise_s - t_flex.elementwise_s) == pytest.approx(permute_s + sort_s, rel=1e-12)
    # --moe-permute-fusion alone keeps HybridEP's permute copies (fused=moe_permute_fusion_into_hybridep)
    t_te = moe_mlp_time(DSV3, H100, _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                                       moe_permute_fusion=True), lay)
    assert float(t_base.elementwise_s - t_te.elementwise_s) == pytest.approx(sort_s, rel=1e-12)
    assert flex.peak_bytes == base.peak_bytes  # the dispatcher moves time, not memory, in the model


def test_capacity_padding_scales_the_expert_work() -> None:
    base = estimate(DSV3, H100, _t(), LAYOUT)
    pad = estimate(DSV3, H100, _t(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True), LAYOUT)
    # per MoE layer (the step's figure is the slowest stage's, which may be another stage with the padding)
    lt_base = moe_mlp_time(DSV3, H100, _t(), LAYOUT)
    lt_pad = moe_mlp_time(DSV3, H100, _t(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True), LAYOUT)
    assert float(lt_pad.ep_link_s) == pytest.approx(1.5 * float(lt_base.ep_link_s), rel=0.02)
    assert float(pad.time.compute_s) > float(base.time.compute_s)


def test_combined_1f1b_exposes_less_with_delayed_wgrad() -> None:
    lay = replace(LAYOUT, schedule="combined_1f1b", recompute_modules=("mla_up_proj",))
    plain = estimate(DSV3, H100, _t(), lay)
    delayed = estimate(DSV3, H100, _t(delay_wgrad_compute=True), lay)
    none = estimate(DSV3, H100, _t(), replace(lay, schedule=""))
    assert float(delayed.time.exposed_comm_s["ep"]) <= float(plain.time.exposed_comm_s["ep"])
    assert float(plain.time.exposed_comm_s["ep"]) < float(none.time.exposed_comm_s["ep"])


MOE_FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
             "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16 "
             "--use-distributed-optimizer --num-experts 8 --moe-router-topk 2 "
             "--expert-model-parallel-size 8").split()


def test_moe_knobs_read_from_megatron_args() -> None:
    flags = read_flags([*MOE_FLAGS, "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep",
                        "--moe-hybridep-num-sms", "32", "--moe-permute-fusion", "--moe-shared-expert-overlap",
                        "--moe-expert-capacity-factor", "1.25", "--moe-pad-expert-input-to-capacity"])
    t = flags.training_fields
    assert (t["moe_token_dispatcher_type"], t["moe_flex_dispatcher_backend"], t["moe_hybridep_num_sms"]) \
        == ("flex", "hybridep", 32)
    assert (t["moe_permute_fusion"], t["moe_shared_expert_overlap"]) == (True, True)
    assert (t["moe_expert_capacity_factor"], t["moe_pad_expert_input_to_capacity"]) == (1.25, True)
    assert not flags.unknown_flags
    # the current spelling, the in-kernel HybridEP permute, and the new flag winning over the deprecated one
    # (TransformerConfig.__post_init__: "an explicit moe_flex_dispatcher_num_sms takes precedence")
    flex = [*MOE_FLAGS, "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]
    t = read_flags([*flex, "--moe-flex-dispatcher-num-sms", "24", "--moe-hybridep-num-sms", "32",
                    "--moe-permute-fusion-into-hybridep"]).training_fields
    assert (t["moe_hybridep_num_sms"], t["moe_permute_fusion_into_hybridep"]) == (24, True)
    assert "moe_permute_fusion" not in t
    deepep = read_flags([*MOE_FLAGS, "--moe-token-dispatcher-type", "flex", "--moe-permute-fusion-into-hybridep"])
    assert "moe_permute_fusion_into_hybridep" not in deepep.training_fields
    assert any("--moe-permute-fusion-into-hybridep is ignored without --moe-flex-dispatcher-backend hybridep" in n
               for n in deepep.notes)


def test_deprecated_deepep_sms_flag_read_as_megatron_routes_it() -> None:
    # TransformerConfig.__post_init__: moe_deepep_num_sms and moe_hybridep_num_sms are routed to
    # moe_flex_dispatcher_num_sms (an explicit one wins); two different deprecated values are a ValueError
    flex = [*MOE_FLAGS, "--moe-token-dispatcher-type", "flex"]
    flags = read_flags([*flex, "--moe-deepep-num-sms", "20"])
    assert flags.training_fields["moe_hybridep_num_sms"] == 20 and not flags.unknown_flags
    assert read_flags([*flex, "--moe-deepep-num-sms", "20", "--moe-hybridep-num-sms", "20"]).training_fields[
        "moe_hybridep_num_sms"] == 20
    assert read_flags([*flex, "--moe-deepep-num-sms", "20", "--moe-hybridep-num-sms", "32",
                       "--moe-flex-dispatcher-num-sms", "24"]).training_fields["moe_hybridep_num_sms"] == 24
    with pytest.raises(SpecError, match=r"^Conflicting deprecated SM-count knobs --moe-deepep-num-sms 20, "
                                        r"--moe-hybridep-num-sms 32; set a single --moe-flex-dispatcher-num-sms"):
        read_flags([*flex, "--moe-deepep-num-sms", "20", "--moe-hybridep-num-sms", "32"])
    with pytest.raises(SpecError, match=r"^--moe-deepep-num-sms must be an integer from 1 to 1024, got 'x'"):
        read_flags([*flex, "--moe-deepep-num-sms", "x"])
    assert memory_knobs_from_words(["--moe-token-dispatcher-type", "flex", "--moe-deepep-num-sms", "24"],
                                   "bf16")["moe_hybridep_num_sms"] == 24
    # written back under the current flag only
    words = argv(megatron_args(DSV3, LAYOUT, _t(moe_token_dispatcher_type="flex", moe_hybridep_num_sms=20)),
                 resolve=True)
    assert words[words.index("--moe-flex-dispatcher-num-sms") + 1] == "20" and "--moe-deepep-num-sms" not in words


def test_megatron_default_dispatcher_is_allgather() -> None:
    flags = read_flags(list(MOE_FLAGS))
    assert flags.training_fields["moe_token_dispatcher_type"] == "allgather"
    assert any("--moe-token-dispatcher-type" in d for d in map(str, flags.defaults_applied))
    # a backend without the flex dispatcher is ignored, with a note
    flags = read_flags([*MOE_FLAGS, "--moe-token-dispatcher-type", "alltoall", "--moe-flex-dispatcher-backend",
                        "hybridep"])
    assert "moe_flex_dispatcher_backend" not in flags.training_fields
    assert any("ignored without --moe-token-dispatcher-type flex" in n for n in flags.notes)


def test_bad_moe_knob_values_one_line() -> None:
    with pytest.raises(SpecError, match=r"^--moe-token-dispatcher-type must be one of alltoall, allgather, flex, "):
        read_flags([*MOE_FLAGS, "--moe-token-dispatcher-type", "deepep"])
    with pytest.raises(SpecError, match=r"^--moe-hybridep-num-sms must be an integer from 1 to 1024"):
        read_flags([*MOE_FLAGS, "--moe-token-dispatcher-type", "flex", "--moe-hybridep-num-sms", "x"])
    with pytest.raises(SpecError, match="needs moe_expert_capacity_factor"):
        _t(moe_pad_expert_input_to_capacity=True)
    with pytest.raises(SpecError, match="deepep backend does not support moe_pad_expert_input_to_capacity"):
        _t(moe_token_dispatcher_type="flex", moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    with pytest.raises(SpecError, match="moe_shared_expert_overlap only works with alltoall or flex"):
        _t(moe_token_dispatcher_type="allgather", moe_shared_expert_overlap=True)
    with pytest.raises(SpecError, match="moe_expert_capacity_factor must be a number above 0"):
        _t(moe_expert_capacity_factor=0.0)


def test_moe_knobs_from_the_cli_words() -> None:
    got = memory_knobs_from_words(["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep",
                                   "--delay-wgrad-compute", "--moe-permute-fusion"], "bf16")
    assert got == {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
                   "delay_wgrad_compute": True, "moe_permute_fusion": True}
    hybrid = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]
    for sms in ("--moe-flex-dispatcher-num-sms", "--moe-hybridep-num-sms"):  # the deprecated spelling still read
        got = memory_knobs_from_words([*hybrid, sms, "16", "--moe-permute-fusion-into-hybridep"], "bf16")
        assert (got["moe_hybridep_num_sms"], got["moe_permute_fusion_into_hybridep"]) == (16, True)


def test_moe_knobs_written_back_and_read_again() -> None:
    training = _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", moe_hybridep_num_sms=32,
                  moe_permute_fusion=True, moe_permute_fusion_into_hybridep=True, delay_wgrad_compute=True)
    lay = replace(LAYOUT, schedule="combined_1f1b", recompute_modules=("mla_up_proj",))
    words = argv(megatron_args(DSV3, lay, training), resolve=True)
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert words.count("--moe-token-dispatcher-type") == 1
    assert words[words.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    assert {"--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-permute-fusion",
            "--moe-permute-fusion-into-hybridep"} <= set(words)
    # the SMs under the current flag, not the deprecated --moe-hybridep-num-sms (transformer_config.py __post_init__)
    assert words[words.index("--moe-flex-dispatcher-num-sms") + 1] == "32" and "--moe-hybridep-num-sms" not in words
    deepep = argv(megatron_args(DSV3, lay, replace(training, moe_flex_dispatcher_backend="deepep")), resolve=True)
    assert "--moe-permute-fusion-into-hybridep" not in deepep
    flags = read_flags(words)
    back = flags.training_fields
    for key in ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_hybridep_num_sms",
                "moe_permute_fusion", "moe_permute_fusion_into_hybridep", "delay_wgrad_compute"):
        assert back[key] == getattr(training, key), key
    assert flags.layout_fields["schedule"] == "combined_1f1b"


def test_default_moe_launch_writes_alltoall_and_no_knob() -> None:
    words = argv(megatron_args(DSV3, LAYOUT, _t()), resolve=True)
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert not {"--moe-flex-dispatcher-backend", "--delay-wgrad-compute", "--moe-permute-fusion",
                "--moe-hybridep-num-sms", "--moe-flex-dispatcher-num-sms", "--moe-permute-fusion-into-hybridep",
                "--overlap-moe-expert-parallel-comm"} & set(words)


def test_launch_refuses_delay_wgrad_without_ep_overlap() -> None:
    codes = [c for c, _ in launch_violations(DSV3, LAYOUT, _t(delay_wgrad_compute=True))]
    assert "DELAY_WGRAD_NEEDS_EP_OVERLAP" in codes
    lay = replace(LAYOUT, schedule="combined_1f1b", recompute_modules=("mla_up_proj",))
    codes = [c for c, _ in launch_violations(DSV3, lay, _t(moe_shared_expert_overlap=True))]
    assert "SHARED_EXPERT_OVERLAP_WITH_EP_OVERLAP" in codes


def test_recipe_moe_knobs_go_into_the_estimate() -> None:
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import estimate_recipe, moe_knobs, not_modelled, recipe_run, training_knobs

    h100 = find_recipe("deepseek-v3-h100-bf16-1024", bridge_recipes())
    assert moe_knobs(h100) == {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                               "moe_hybridep_num_sms": 32, "delay_wgrad_compute": False, "moe_permute_fusion": True,
                               "moe_shared_expert_overlap": False}
    assert set(moe_knobs(h100).items()) <= set(training_knobs(h100, "bf16").items())
    assert not any(x.startswith(("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_permute_fusion",
                                 "moe_a2a_overlap", "delay_wgrad_compute")) for x in not_modelled(h100))
    est = estimate_recipe(h100)
    alltoall = replace(h100, fields={**h100.fields, "moe_token_dispatcher_type": "alltoall"})
    assert float(estimate_recipe(alltoall).time.exposed_comm_s["ep"]) > 1.5 * float(est.time.exposed_comm_s["ep"])
    # Bridge's moe_a2a_overlap is Megatron's combined 1F1B
    overlap = next(r for r in bridge_recipes() if r.runnable and r.get("moe_a2a_overlap") is True
                   and r.get("delay_wgrad_compute") is True)
    run = recipe_run(overlap)
    assert run.layout.schedule == "combined_1f1b"
    assert training_knobs(overlap, run.job.precision)["delay_wgrad_compute"] is True
    # an unresolved cell keeps paraplan's default and is listed
    unknown = replace(h100, fields={**h100.fields, "moe_flex_dispatcher_backend": "?"})
    assert "moe_flex_dispatcher_backend" not in moe_knobs(unknown)
    assert any(x.startswith("moe_flex_dispatcher_backend=?") for x in not_modelled(unknown))
    dense = find_recipe("llama3-70b-h100-fp8cs-64", bridge_recipes())
    assert moe_knobs(dense) == {"delay_wgrad_compute": False}  # the one MoE column it sets, at Megatron's default
    # an unset dispatcher keeps Megatron's, and only it: the other knobs the recipe sets stay
    nodisp = replace(h100, fields={**h100.fields, "moe_token_dispatcher_type": "", "delay_wgrad_compute": True})
    knobs = moe_knobs(nodisp)
    assert "moe_token_dispatcher_type" not in knobs and "moe_flex_dispatcher_backend" not in knobs
    assert knobs["delay_wgrad_compute"] is True and knobs["moe_permute_fusion"] is True


def test_explain_says_why_the_smaller_ep_wins() -> None:
    from paraplan.explain import ep_findings
    from paraplan.search import SearchSpace, plan

    model = load_model("qwen3-30b-a3b")
    cluster = make_cluster(load_gpu("h100-80gb"), 32)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    p = plan(model, cluster, training, space=SearchSpace(tp=(1,), pp=(1,), cp=(1,), ep=(8, 16, 32)), top_k=2)
    best = p.candidates[0]
    found = ep_findings(p, best)
    assert [f.code for f in found] == ["EP_SIZE"]
    f = found[0]
    assert best.layout.ep == 8 and f.numbers["gain_frac"] < 0  # EP 16/32 cross the network with alltoall
    assert "across NVLink domains (network)" in f.text and "inside one NVLink domain" in f.text
    assert "ep comm" in f.text and "moe-token-dispatcher-type=flex" in f.text


def test_capacity_padding_scales_the_routed_activations() -> None:
    from paraplan.estimate import activations as act
    from paraplan.estimate.memory import activation_context

    lay = replace(LAYOUT, recompute="none", recompute_modules=())
    base = activation_context(DSV3, _t(), lay)
    pad = activation_context(DSV3, _t(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True), lay)
    assert pad.routed_load == 1.5 and base.routed_load == 1.0
    te = 4096 * 8 * 1 / 2  # T k ETP / TP routed copies per rank
    fe, h = DSV3.moe_ffn, DSV3.hidden_size
    assert DSV3.swiglu
    # fc1 in, act in (SwiGLU), fc2 in, the fp32 prob (no expert output: moe/experts.py bias_act_func weights it)
    routed = 2 * te * h + 2 * te * fe * 2 + 2 * te * fe + 4 * te
    diff = float(act.moe_mlp_bytes(DSV3, pad) - act.moe_mlp_bytes(DSV3, base))
    assert diff == pytest.approx(0.5 * routed, rel=1e-12)
