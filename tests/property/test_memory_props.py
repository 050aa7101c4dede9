"""Invariants of the memory model (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

GPU = load_gpu("h100-80gb")
MODELS = {name: load_model(name) for name in ("llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt3-175b")}


@st.composite
def setups(draw: st.DrawFn) -> tuple:
    name = draw(st.sampled_from(sorted(MODELS)))
    model = MODELS[name]
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4, 8) if model.num_layers % p == 0]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if model.is_moe and (model.num_experts or 1) % e == 0
                               and (tp * cp * dp) % e == 0] or [1]))
    mbs = draw(st.sampled_from([1, 2]))
    rec = draw(st.sampled_from(["none", "selective", "full"]))
    seq = draw(st.sampled_from([1024, 2048]))
    layout = ParallelLayout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=1 if model.is_moe else 0, mbs=mbs,
                            recompute=rec)  # type: ignore[arg-type]
    m = draw(st.sampled_from([1, 4, 16]))
    training = TrainingSpec(seq_len=seq, global_batch_size=mbs * dp * m)
    return model, layout, training


def run(model, layout, training):  # type: ignore[no-untyped-def]
    return estimate(model, make_cluster(GPU, layout.world_size, 8 if layout.world_size >= 8 else layout.world_size),
                    training, layout)


@settings(max_examples=40, deadline=None)
@given(setups())
def test_terms_non_negative_and_sum_to_total(s: tuple) -> None:
    est = run(*s)
    for stage in est.stages:
        d = stage.memory.as_dict()
        terms = [v for k, v in d.items() if k != "total_bytes"]
        assert all(v >= 0 for v in terms)
        assert abs(sum(terms) - d["total_bytes"]) <= 1e-6 * d["total_bytes"]
    t = est.time.as_dict()
    parts = [t["compute_s"], t["recompute_s"], t["bubble_s"], t["optimizer_s"], t["overhead_s"],
             *t["exposed_comm_s"].values()]
    assert all(v >= 0 for v in parts)
    assert abs(sum(parts) - t["step_s"]) <= 1e-9 * t["step_s"]
    assert 0 < est.throughput.mfu <= 1


def _state(est) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    w = max(float(s.memory.weights_bytes) for s in est.stages)
    o = max(float(s.memory.optimizer_bytes) for s in est.stages)
    return w, o


@settings(max_examples=25, deadline=None)
@given(setups())
def test_weights_and_optimizer_non_increasing_in_tp_and_dp(s: tuple) -> None:
    model, layout, training = s
    t2 = layout.tp * 2
    if t2 > 8 or model.num_attention_heads % t2 or (model.query_groups % t2 and t2 % model.query_groups):
        return
    base = _state(run(model, layout, training))
    more_tp = replace(layout, tp=layout.tp * 2, etp=1 if model.is_moe else layout.tp * 2)
    w2, o2 = _state(run(model, more_tp, training))
    assert w2 <= base[0] * (1 + 1e-9) and o2 <= base[1] * (1 + 1e-9)
    more_dp = replace(layout, dp=layout.dp * 2)
    training2 = replace(training, global_batch_size=training.global_batch_size * 2)
    w3, o3 = _state(run(model, more_dp, training2))
    assert w3 <= base[0] * (1 + 1e-9) and o3 <= base[1] * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(setups())
def test_weights_and_optimizer_non_increasing_in_pp(s: tuple) -> None:
    model, layout, training = s
    if model.num_layers % (layout.pp * 2):
        return
    base = _state(run(model, layout, training))
    w2, o2 = _state(run(model, replace(layout, pp=layout.pp * 2), training))
    assert w2 <= base[0] * (1 + 1e-9) and o2 <= base[1] * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(setups())
def test_activations_non_decreasing_in_mbs_and_seq(s: tuple) -> None:
    model, layout, training = s
    base = max(float(x.memory.activations_bytes) for x in run(model, layout, training).stages)
    bigger_mbs = replace(layout, mbs=layout.mbs * 2)
    t2 = replace(training, global_batch_size=training.global_batch_size * 2)
    assert max(float(x.memory.activations_bytes) for x in run(model, bigger_mbs, t2).stages) >= base
    longer = replace(training, seq_len=training.seq_len * 2)
    if (model.max_position_embeddings or 0) < longer.seq_len and model.position_embedding_type == "learned_absolute":
        return
    assert max(float(x.memory.activations_bytes) for x in run(model, layout, longer).stages) >= base
