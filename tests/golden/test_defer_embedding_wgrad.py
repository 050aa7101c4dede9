"""``--defer-embedding-wgrad-compute`` / ``--wgrad-deferral-limit``, by hand from Megatron-LM d98e8a6:
tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication`` keeps the output layer's activation
and gradient of the first ``limit`` micro-batches (all with 0) instead of running its weight-gradient GEMM, and
pipeline_parallel/schedules.py ``finish_embedding_wgrad_compute`` runs them after the last micro-batch;
ModelParallelConfig.__post_init__ refuses it without PP or without gradient accumulation fusion."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate.memory import MemoryOptions, deferred_wgrad_entries
from paraplan.estimate.params import padded_vocab
from paraplan.estimate.step_time import FLUSH_IDLE_SHARE, deferred_wgrad_terms, stage_terms, step_time
from paraplan.estimate.time.compute import gemm_s
from paraplan.estimator import estimate
from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.megatron import argv, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import not_modelled, training_knobs
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec
from tests.launch.test_bridge import _knob_spec

LLAMA = load_model("llama3-8b")
H100 = load_gpu("h100-80gb")
PP4 = ParallelLayout(tp=1, pp=4, dp=2, mbs=1, recompute="none", distributed_optimizer=True)
OFF = TrainingSpec(seq_len=4096, global_batch_size=64)
ON = replace(OFF, defer_embedding_wgrad_compute=True)


@pytest.mark.parametrize(("limit", "m", "saved", "deferred"), [
    (0, 32, 1.0, 32.0),       # 0: every micro-batch deferred
    (22, 32, 22 / 32, 22.0),  # the first 22 of 32
    (22, 8, 1.0, 8.0),        # a limit above m defers all m
])
def test_deferred_terms_golden(limit: int, m: int, saved: float, deferred: float) -> None:
    s, d = deferred_wgrad_terms(replace(ON, wgrad_deferral_limit=limit), PP4, 1.0, m)
    assert (float(s), float(d)) == pytest.approx((saved, deferred))
    assert deferred_wgrad_terms(OFF, PP4, 1.0, m) == (0.0, 0.0)
    assert tuple(map(float, deferred_wgrad_terms(ON, replace(PP4, pp=1), 1.0, m))) == (0.0, 0.0)


@pytest.mark.parametrize("mtp_layers", [0, 1])
def test_step_time_by_hand(mtp_layers: int) -> None:
    """Llama-3-8B on 8 H100, TP1 PP4 DP2, 32 micro-batches: the last stage (the slowest, it holds the output layer)
    loses its output-layer wgrad GEMM (T x h)(h x V) each micro-batch, one per head: with an MTP layer (on the last
    stage) the MTP head's too, one shared weight; the 32 x heads deferred GEMMs hide in its flush idle time, 2/3 of
    the bubble, and only what is longer shows."""
    model = replace(LLAMA, mtp_num_layers=mtp_layers)
    heads = 1 + mtp_layers
    cluster = make_cluster(H100, 8, 8)
    a, b = (step_time(model, cluster, t, PP4, num_microbatches=32) for t in (OFF, ON))
    wgrad = float(gemm_s(cluster, False, 4096, padded_vocab(model, 1), model.hidden_size))
    assert float(stage_terms(model, cluster, ON, PP4).logits_wgrad_s) == pytest.approx(wgrad)
    assert int(a.slowest_stage) == 3 and int(b.slowest_stage) == 3
    assert float(a.compute_s - b.compute_s) == pytest.approx(
        heads * 32 * wgrad - max(0.0, heads * 32 * wgrad - FLUSH_IDLE_SHARE * float(b.bubble_s)))
    # the bubble shrinks with the slowest stage: (p-1)/m of it
    assert float(b.bubble_s) == pytest.approx(float(a.bubble_s) - 3 / 32 * heads * 32 * wgrad)
    assert float(b.step_s) < float(a.step_s)


def test_megatron_rules() -> None:
    assert [c for c, _ in launch_violations(LLAMA, replace(PP4, pp=1, dp=8), ON)
            if c.startswith("DEFER")] == ["DEFER_EMBEDDING_WGRAD_NEEDS_PP"]
    assert not [c for c, _ in launch_violations(LLAMA, PP4, ON) if c.startswith("DEFER")]
    with pytest.raises(SpecError, match="gradient accumulation fusion"):
        replace(ON, gradient_accumulation_fusion=False)
    with pytest.raises(SpecError, match="wgrad_deferral_limit must be an integer >= 0"):
        replace(ON, wgrad_deferral_limit=-1)


FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--pipeline-model-parallel-size 2").split()


def test_read_from_megatron_args_and_written_back() -> None:
    got = read_flags([*FLAGS, "--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "22"]).training_fields
    assert (got["defer_embedding_wgrad_compute"], got["wgrad_deferral_limit"]) == (True, 22)
    plain = read_flags([*FLAGS, "--wgrad-deferral-limit", "22"])
    assert "wgrad_deferral_limit" not in plain.training_fields
    assert memory_knobs_from_words(["--defer-embedding-wgrad-compute"], "bf16") == {
        "defer_embedding_wgrad_compute": True}
    words = argv(megatron_args(LLAMA, PP4, replace(ON, wgrad_deferral_limit=22)), resolve=True)
    assert "--defer-embedding-wgrad-compute" in words and words[words.index("--wgrad-deferral-limit") + 1] == "22"
    assert "--wgrad-deferral-limit" not in argv(megatron_args(LLAMA, PP4, OFF), resolve=True)
    spec = _knob_spec(defer_embedding_wgrad_compute=True, wgrad_deferral_limit=22)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert (items["model.defer_embedding_wgrad_compute"], items["model.wgrad_deferral_limit"]) == (True, 22)


def test_taken_from_the_recipes() -> None:
    rows = [r for r in bridge_recipes() if r.get("defer_embedding_wgrad_compute") is True]
    assert rows
    knobs = training_knobs(rows[0], "bf16")
    assert (knobs["defer_embedding_wgrad_compute"], knobs["wgrad_deferral_limit"]) == (
        True, rows[0].get("wgrad_deferral_limit"))
    assert not any(s.startswith(("defer_embedding", "wgrad_deferral")) for s in not_modelled(rows[0]))
    plain = next(r for r in bridge_recipes() if r.get("defer_embedding_wgrad_compute") is False)
    assert "defer_embedding_wgrad_compute" not in training_knobs(plain, "bf16")


LLAMA70 = load_model("llama3-70b")
PP4_TP4 = ParallelLayout(tp=4, pp=4, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                         distributed_optimizer=True)
GIB = 1024.0 ** 3


def _stages(training: TrainingSpec, layout: ParallelLayout, model: ModelSpec = LLAMA70) -> list[dict[str, float]]:
    cluster = make_cluster(H100, 32, 8)
    return [s.other.as_dict() | {"total": float(s.memory.total_bytes)}
            for s in estimate(model, cluster, training, layout).stages]


def test_deferred_buffers_memory_by_hand() -> None:
    """Llama-3-70B, s 4096, TP4 SP PP4 VP5 DP2, GBS 32: m = 16 micro-batches deferred; each keeps the output layer's
    sequence-parallel input 2 x 4096 x 8192 / 4 B and its bf16 logit gradient 2 x 4096 x 128512 / 4 B (the
    vocabulary 128256 padded to a multiple of 128 x TP; layers.py
    ``embedding_activation_buffer`` / ``grad_output_buffer``), about 4.17 GiB on the last stage, nothing elsewhere."""
    off = replace(OFF, global_batch_size=32)
    on = replace(off, defer_embedding_wgrad_compute=True)
    a, b = _stages(off, PP4_TP4), _stages(on, PP4_TP4)
    entry = 2 * 4096 * 128512 / 4 + 2 * 4096 * 8192 / 4
    assert b[3]["deferred_wgrad_bytes"] == pytest.approx(16 * entry)
    assert 16 * entry / GIB == pytest.approx(4.17, abs=0.01)
    assert b[3]["total"] - a[3]["total"] == pytest.approx(16 * entry * (1 + MemoryOptions().fragmentation_frac))
    assert [x["total"] for x in a[:3]] == [x["total"] for x in b[:3]]
    # the limit keeps the first 5 only; without SP the input is the whole T x h
    lim = _stages(replace(on, wgrad_deferral_limit=5), PP4_TP4)
    assert lim[3]["deferred_wgrad_bytes"] == pytest.approx(5 * entry)
    nosp = _stages(on, replace(PP4_TP4, sequence_parallel=False))
    assert nosp[3]["deferred_wgrad_bytes"] == pytest.approx(16 * (2 * 4096 * 128512 / 4 + 2 * 4096 * 8192))


@settings(max_examples=30, deadline=None)
@given(limit=st.integers(0, 40), m=st.integers(1, 64), heads=st.integers(1, 3))
def test_deferred_entries_monotone(limit: int, m: int, heads: int) -> None:
    """Entries never exceed every call (heads x m), grow with m, and with the limit (0 = all)."""
    t = replace(ON, wgrad_deferral_limit=limit)
    d = float(deferred_wgrad_entries(t, m, heads))
    assert 0 < d <= heads * m
    assert float(deferred_wgrad_entries(t, m + 1, heads)) >= d
    if limit:
        assert d <= limit
        assert float(deferred_wgrad_entries(replace(t, wgrad_deferral_limit=limit + 1), m, heads)) >= d
    assert deferred_wgrad_entries(OFF, m, heads) == 0.0


@pytest.mark.parametrize(("limit", "m", "heads", "saved", "deferred"), [
    (0, 32, 2, 2.0, 64.0),        # the main head and one MTP head: two output-layer calls a micro-batch
    (22, 32, 2, 22 / 32, 22.0),   # the limit counts calls, not micro-batches
    (40, 32, 2, 40 / 32, 40.0),
    (0, 8, 3, 3.0, 24.0),
])
def test_deferred_terms_count_every_head(limit: int, m: int, heads: int, saved: float, deferred: float) -> None:
    """multi_token_prediction.py ``process_mtp_loss`` calls the shared ``output_layer`` once per MTP head: each call
    appends to the same buffers (layers.py), so its wgrad is deferred too, up to the limit."""
    s, d = deferred_wgrad_terms(replace(ON, wgrad_deferral_limit=limit), PP4, 1.0, m, heads)
    assert (float(s), float(d)) == pytest.approx((saved, deferred))
    assert float(d) == float(deferred_wgrad_entries(replace(ON, wgrad_deferral_limit=limit), m, heads))  # = memory

