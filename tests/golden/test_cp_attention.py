"""Golden values of context-parallel attention, by hand from Transformer Engine's context_parallel.py
(transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):

- p2p (``AttnFuncWithCPAndKVP2P``): c steps of equal FLOPs (step 0 causal over the two local chunks, the
  others a full block of half the size); forward: c - 1 sends of the K,V block, each beside one step;
  backward: step 0 sends K,V, steps 1 .. c-2 send K,V + dK,dV (one buffer of twice the block), step c-1
  dK,dV; per step exposed = max(0, send - cp_overlap_frac x step).
- a2a (``AttnFuncWithCPAndQKVOA2A``): all-to-all(Q, K, V) + all-to-all(O) forward, the same bytes backward;
  heads per rank must divide by CP.
- allgather (``AttnFuncWithCPAndKVAllGather``): all-gather of K, V forward, again backward, reduce-scatter of
  dK, dV.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import LayoutError, SpecError
from paraplan.estimate import comm
from paraplan.estimate.time import cp
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.rules import check_layout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.grid import Group
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec

H100 = load_gpu("h100-80gb")
LLAMA2 = load_model("llama2-7b")
NET_BUSBW = 50e9 * 0.9
"""One 400 Gb/s NIC per H100 (50 GB/s) x network_bus_frac 0.9 (ecosystem.md 4.2)."""
KV_1M = 2 * 2 * 32768 * 4096 // 8
"""Llama-2 7B at 1M tokens, TP 8, CP 32: bf16 K and V of 32,768 local tokens x 32 heads x 128 / TP 8."""


def test_kv_block_bytes_llama2_1m() -> None:
    assert cp.kv_block_bytes(LLAMA2, 32768, 8, 128 * 32) == KV_1M == 67_108_864


def test_p2p_ring_steps_by_hand() -> None:
    """TP 8 x CP 32 on 1,024 H100: the CP group spans 32 nodes, each send on the GPU's own NIC."""
    cluster = make_cluster(H100, 1024, 8)
    group = Group(size=32, stride=8)
    assert comm.tier_busbw(cluster, group.span) == pytest.approx(NET_BUSBW)
    alpha = float(comm.tier_latency_s(cluster, group.span))
    x1 = KV_1M / NET_BUSBW + alpha
    x2 = 2 * KV_1M / NET_BUSBW + alpha
    attn_fwd = 0.04
    a_f, a_b = attn_fwd / 32, 2.5 * attn_fwd / 32
    f = H100.efficiency.cp_overlap_frac
    assert f == 0.8
    # forward: 31 sends beside 31 steps; backward: steps 0 and 31 send one block, the 30 between two
    want = 31 * max(0.0, x1 - f * a_f) + 2 * max(0.0, x1 - f * a_b) + 30 * max(0.0, x2 - f * a_b)
    assert max(0.0, x1 - f * a_b) == 0.0 < max(0.0, x2 - f * a_b)  # this case exposes the 2-block sends only
    q = o = 2 * 32768 * 4096 // 8
    got = cp.p2p_times(cluster, group, KV_1M, q, o, attn_fwd)
    assert float(got.exposed_s) == pytest.approx(want, rel=1e-12)
    assert float(got.exposed_s) == pytest.approx(30.0e-3, rel=2e-3)
    assert float(got.link_s) == pytest.approx(33 * x1 + 30 * x2, rel=1e-12)
    # merges: step 0 copies (4 B), 31 steps merge at 4.5 B per element of O, dQ, dK, dV
    elements = (o + q + KV_1M) / 2
    rate = H100.hbm_bytes_per_s * H100.efficiency.hbm_frac
    assert float(got.merge_s) == pytest.approx((31 * 4.5 + 4.0) * elements / rate, rel=1e-12)


def test_p2p_two_ranks_send_one_block_each_way() -> None:
    """CP 2: one forward send; backward step 0 sends K,V, step 1 dK,dV (no two-block step)."""
    cluster = make_cluster(H100, 16, 8)
    group = Group(size=2, stride=8)
    alpha = float(comm.tier_latency_s(cluster, group.span))
    x1 = 1e8 / NET_BUSBW + alpha
    got = cp.p2p_times(cluster, group, 1e8, 5e7, 5e7, 0.0)  # no attention to hide behind
    assert float(got.exposed_s) == pytest.approx(3 * x1, rel=1e-12) == pytest.approx(float(got.link_s), rel=1e-12)


def test_no_cp_no_terms() -> None:
    cluster = make_cluster(H100, 8, 8)
    for kind in cp.CP_COMM_TYPES:
        t = cp.cp_times(cluster, Group(size=1, stride=1), kind, LLAMA2, 4096, 1, 4096, 0.01)
        assert float(t.link_s) == float(t.exposed_s) == float(t.merge_s) == 0.0, kind


def test_a2a_by_hand_inside_nvlink() -> None:
    """CP 8 inside one H100 node: Q+K+V (3 x 2 x 4096 x 4096 B) and O (2 x 4096 x 4096 B) all-to-alls,
    forward and backward, each (n-1)/n x S / NVLink busbw + log2(8) alpha, none hidden."""
    cluster = make_cluster(H100, 8, 8)
    group = Group(size=8, stride=1)
    bw = 450e9 * H100.efficiency.nvlink_bus_frac
    alpha = float(comm.tier_latency_s(cluster, group.span))
    s_qkv, s_o = 3 * 2 * 4096 * 4096, 2 * 4096 * 4096
    one = 7 / 8 * s_qkv / bw + 3 * alpha + 7 / 8 * s_o / bw + 3 * alpha
    got = cp.cp_times(cluster, group, "a2a", LLAMA2, 4096, 1, 4096, 0.01)
    assert float(got.link_s) == pytest.approx(2 * one, rel=1e-12) == pytest.approx(float(got.exposed_s))
    assert float(got.merge_s) == 0.0


def test_allgather_by_hand_inside_nvlink() -> None:
    """All-gather of 8 K,V blocks (8 x 2 x 2 x 4096 x 4096 B) forward, again backward, reduce-scatter of dK,dV."""
    cluster = make_cluster(H100, 8, 8)
    group = Group(size=8, stride=1)
    bw = 450e9 * H100.efficiency.nvlink_bus_frac
    alpha = float(comm.tier_latency_s(cluster, group.span))
    ag = 7 / 8 * 8 * (2 * 2 * 4096 * 4096) / bw + 3 * alpha
    got = cp.cp_times(cluster, group, "all_gather", LLAMA2, 4096, 1, 4096, 0.01)
    assert float(got.link_s) == pytest.approx(3 * ag, rel=1e-12) == pytest.approx(float(got.exposed_s))


@settings(max_examples=60, deadline=None)
@given(c=st.sampled_from([2, 3, 4, 8, 16, 32]), kv=st.floats(1e5, 1e9), attn=st.floats(0.0, 1.0),
       more=st.floats(0.0, 1.0))
def test_p2p_exposed_within_link_and_falls_with_attention(c: int, kv: float, attn: float, more: float) -> None:
    cluster = make_cluster(H100, 8 * c, 8)
    group = Group(size=c, stride=8)
    a = cp.p2p_times(cluster, group, kv, kv / 2, kv / 2, attn)
    b = cp.p2p_times(cluster, group, kv, kv / 2, kv / 2, attn + more)
    assert 0.0 <= float(a.exposed_s) <= float(a.link_s) * (1 + 1e-12)
    assert float(b.exposed_s) <= float(a.exposed_s) * (1 + 1e-12)
    assert float(b.link_s) == pytest.approx(float(a.link_s))


def _est(cp_size: int, kind: str, seq: int = 131072) -> dict[str, float]:
    layout = ParallelLayout(tp=8, cp=cp_size, dp=64 // (8 * cp_size), mbs=1, recompute="none",
                            sequence_parallel=True)
    training = TrainingSpec(seq_len=seq, global_batch_size=8, cp_comm_type=kind)  # type: ignore[arg-type]
    t = estimate(LLAMA2, make_cluster(H100, 64, 8), training, layout).time.as_dict()
    return {"step": t["step_s"], "cp": t["exposed_comm_s"]["cp"], "cp_link": t["link_comm_s"]["cp"]}


def test_estimate_reads_the_comm_type() -> None:
    """Llama-2 7B at 128K tokens, TP 8 x CP 4 over 4 nodes: a2a and allgather hide nothing; p2p hides its sends."""
    p2p, a2a, ag = (_est(4, k) for k in ("p2p", "a2a", "all_gather"))
    assert a2a["cp"] == pytest.approx(a2a["cp_link"]) and ag["cp"] == pytest.approx(ag["cp_link"])
    assert p2p["cp"] < p2p["cp_link"]
    assert p2p["step"] < a2a["step"] and p2p["step"] < ag["step"]


def test_a2a_heads_rule() -> None:
    """Llama-2 7B: 32 heads over TP 8 leave 4 per rank: CP 8 with a2a is refused with TE's message."""
    layout = ParallelLayout(tp=8, cp=8, dp=1, mbs=1, recompute="none", sequence_parallel=True)
    training = TrainingSpec(seq_len=131072, global_batch_size=8, cp_comm_type="a2a")
    with pytest.raises(LayoutError) as err:
        check_layout(LLAMA2, training, make_cluster(H100, 64, 8), layout)
    assert str(err.value).startswith("cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V. "
                                     "Found num_heads_q = 4, num_heads_kv = 4, cp_size = 8.")
    check_layout(LLAMA2, TrainingSpec(seq_len=131072, global_batch_size=8), make_cluster(H100, 64, 8), layout)


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 8192 "
         "--max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--context-parallel-size 2").split()


def test_comm_type_read_from_megatron_args() -> None:
    assert read_flags([*FLAGS, "--cp-comm-type", "a2a"]).training_fields["cp_comm_type"] == "a2a"
    assert read_flags([*FLAGS, "--cp-comm-type", "all_gather", "all_gather"]).training_fields["cp_comm_type"] \
        == "all_gather"
    assert "cp_comm_type" not in read_flags(FLAGS).training_fields


@pytest.mark.parametrize(("words", "message"), [
    (["--cp-comm-type", "p2p", "a2a"], "--cp-comm-type must be one of p2p, a2a, all_gather for every layer, "
                                       "got 'p2p a2a'"),
    (["--cp-comm-type", "ring"], "--cp-comm-type must be one of p2p, a2a, all_gather for every layer, got 'ring'"),
    (["--cp-comm-type", "allgather"], "--cp-comm-type allgather: Transformer Engine spells it all_gather; use one of "
                                      "p2p, a2a, all_gather"),
    (["--cp-comm-type", "a2a+p2p"], "--cp-comm-type a2a+p2p (hierarchical context parallelism) is not modelled; "
                                    "use one of p2p, a2a, all_gather"),
])
def test_comm_type_refused_in_one_line(words: list[str], message: str) -> None:
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, *words])
    assert str(err.value) == message


def test_comm_type_knob_words_and_launch_round_trip() -> None:
    assert memory_knobs_from_words(["--cp-comm-type=a2a"], "bf16") == {"cp_comm_type": "a2a"}
    training = TrainingSpec(seq_len=131072, global_batch_size=8, cp_comm_type="all_gather")
    layout = ParallelLayout(tp=8, cp=4, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    words = argv(megatron_args(LLAMA2, layout, training), resolve=True)
    assert words[words.index("--cp-comm-type") + 1] == "all_gather"
    assert read_flags(words).training_fields["cp_comm_type"] == "all_gather"
    default = argv(megatron_args(LLAMA2, layout, TrainingSpec(seq_len=131072, global_batch_size=8)), resolve=True)
    assert "--cp-comm-type" not in default


def test_cli_knob_moves_the_cp_term(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    cli = ["estimate", "--model", "llama2-7b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "8", "--cp", "4",
           "--seq-len", "131072", "--gbs", "8", "--recompute", "none", "--format", "json"]
    assert main(cli) == 0
    p2p = json.loads(capsys.readouterr().out)["time"]
    assert main([*cli, "--knob", "cp-comm-type=all_gather"]) == 0
    ag = json.loads(capsys.readouterr().out)["time"]
    assert ag["exposed_comm_s"]["cp"] > p2p["exposed_comm_s"]["cp"]
    assert main([*cli, "--knob", "cp-comm-type=a2a+p2p"]) == 1
    err = capsys.readouterr().err.strip()
    assert "a2a+p2p (hierarchical context parallelism) is not modelled" in err and "\n" not in err


def test_merges_make_cp_cost_more_than_its_micro_batch_twin() -> None:
    """Same per-GPU tokens: CP 2 x mbs 2 against CP 1 x mbs 1 (8K tokens): CP adds the ring's merges."""
    cluster = make_cluster(H100, 16, 8)
    training = TrainingSpec(seq_len=8192, global_batch_size=64)
    base = estimate(LLAMA2, cluster, training, ParallelLayout(tp=1, cp=1, dp=16, mbs=1, recompute="none"))
    twin = estimate(LLAMA2, cluster, training, ParallelLayout(tp=1, cp=2, dp=8, mbs=2, recompute="none"))
    assert float(twin.time.step_s) > float(base.time.step_s)
    assert np.isfinite(float(twin.time.step_s))


def test_recompute_reruns_the_forward_exchange() -> None:
    """Full and core_attn recompute re-run TE's CP attention forward: its exposed exchange (here all of the
    a2a forward all-to-alls) is paid again; other selective modules do not re-run it."""
    from dataclasses import replace

    from paraplan.estimate.time.layer import attention_layer_time, recompute_s

    cluster = make_cluster(H100, 64, 8)
    training = TrainingSpec(seq_len=131072, global_batch_size=8, cp_comm_type="a2a")
    layout = ParallelLayout(tp=2, cp=4, dp=8, mbs=1, recompute="none", sequence_parallel=True)
    lt = attention_layer_time(LLAMA2, cluster, training, layout)
    fwd = cp.a2a_times(cluster, Group(size=4, stride=2), cp.kv_block_bytes(LLAMA2, 32768, 2, 4096),
                       cp.q_block_bytes(LLAMA2, 32768, 2), cp.o_block_bytes(LLAMA2, 32768, 2)).fwd_exposed_s
    assert float(lt.cp_fwd_exposed_s) == pytest.approx(float(fwd)) and float(fwd) > 0.0
    assert float(lt.cp_exposed_s) == pytest.approx(2 * float(fwd))
    eff = cluster.gpu.efficiency
    selective = replace(layout, recompute="selective")
    core = recompute_s(lt, selective, ("core_attn",), eff, moe=False)
    norm = recompute_s(lt, selective, ("layernorm",), eff, moe=False)
    full_layout = replace(layout, recompute="full")
    lt_full = attention_layer_time(LLAMA2, cluster, training, full_layout)
    full = recompute_s(lt_full, full_layout, (), eff, moe=False)
    without = recompute_s(replace(lt_full, cp_fwd_exposed_s=0.0), full_layout, (), eff, moe=False)
    assert float(core) == pytest.approx(float(lt.attn_fwd_s) + float(fwd))
    assert float(norm) < float(core)
    assert float(full) - float(without) == pytest.approx(float(fwd))
