"""``--cross-entropy-loss-fusion`` / ``--cross-entropy-fusion-impl`` (language_module.py
``compute_language_model_loss``): the unfused vocab-parallel cross entropy, Megatron-Core's fused ``jit_fuser`` kernels
(native) or Transformer Engine's Triton kernels (te). Time: their HBM bytes per logit, kernel by kernel; memory: the
unfused and native losses keep the same fp32 copy; te (TE <= 2.17, time and memory alike) writes its gradient into
the bf16 logits
(tests/golden/test_cross_entropy_memory.py is that golden)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.errors import LayoutError, SpecError
from paraplan.estimate.activations import TE_CROSS_ENTROPY_FP32_GRAD, TE_CROSS_ENTROPY_GRAD_BYTES
from paraplan.estimate.params import padded_vocab
from paraplan.estimate.step_time import stage_terms
from paraplan.estimate.time.compute import LOSS_BYTES_PER_LOGIT_FUSED, TE_LOSS_BYTES_PER_LOGIT, hbm_rate
from paraplan.estimator import estimate
from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import not_modelled, training_knobs
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec
from tests.launch.test_bridge import _knob_spec

LLAMA = load_model("llama3-8b")
LAY = ParallelLayout(tp=2, pp=1, dp=4, mbs=1, recompute="none", sequence_parallel=True, distributed_optimizer=True)
UNFUSED = TrainingSpec(seq_len=4096, global_batch_size=32)
NATIVE = replace(UNFUSED, cross_entropy_loss_fusion=True)
TE = replace(NATIVE, cross_entropy_fusion_impl="te")


@pytest.mark.parametrize(("training", "bytes_per_logit"), [
    (UNFUSED, 6 + 4 + 8 + 8 + 4 + 8 + 8 + 6),  # upcast, max, -max, exp, sum, /sum; scale, cast to bf16
    (NATIVE, 6 + 8 + 8 + 6),                    # upcast+max, -max+exp+sum, /sum; scale+cast
    (TE, 2 + 4 + 4),                            # TE <= 2.17: online softmax; loss+grad in place; element_mul
    (replace(UNFUSED, cross_entropy_fusion_impl="te"), 52),  # the impl does nothing without the fusion
])
def test_loss_traffic_golden(training: TrainingSpec, bytes_per_logit: float) -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 8, 8)
    base = stage_terms(LLAMA, cluster, UNFUSED, LAY).logits_s
    got = stage_terms(LLAMA, cluster, training, LAY).logits_s
    logits = 4096 * padded_vocab(LLAMA, 2) / 2
    assert float(got - base) == pytest.approx((bytes_per_logit - 52) * logits / hbm_rate(cluster), abs=1e-12)


def test_one_te_release_assumption_for_memory_and_time() -> None:
    """TE <= 2.17 works in place in bf16 (10 B per logit, no extra memory); TE 2.18 writes an fp32 gradient (22 B:
    2 + (2 + 4) + (4 + 4) + the cast to bf16 (4 + 2), and 4 B kept per logit). Memory and time read one switch."""
    assert TE_LOSS_BYTES_PER_LOGIT == {False: 10.0, True: 22.0}
    assert LOSS_BYTES_PER_LOGIT_FUSED["te"] == TE_LOSS_BYTES_PER_LOGIT[TE_CROSS_ENTROPY_FP32_GRAD]
    assert TE_CROSS_ENTROPY_GRAD_BYTES == (4.0 if TE_CROSS_ENTROPY_FP32_GRAD else 0.0)
    assert TE_CROSS_ENTROPY_FP32_GRAD is False  # the calibration rows' NeMo 25.x-26.06 containers ship TE <= 2.17


def test_memory_never_rises_and_the_step_is_faster() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 8, 8)
    a, b, c = (estimate(LLAMA, cluster, t, LAY) for t in (UNFUSED, NATIVE, TE))
    assert a.peak_bytes == b.peak_bytes > c.peak_bytes
    assert float(c.time.step_s) < float(b.time.step_s) < float(a.time.step_s)


FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16").split()


def test_read_written_and_refused_as_megatron_lm_does() -> None:
    got = read_flags([*FLAGS, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native"]).training_fields
    assert (got["cross_entropy_loss_fusion"], got["cross_entropy_fusion_impl"]) == (True, "native")
    plain = read_flags([*FLAGS, "--cross-entropy-fusion-impl", "te"])
    assert "cross_entropy_fusion_impl" not in plain.training_fields
    assert memory_knobs_from_words(["--cross-entropy-loss-fusion"], "bf16") == {"cross_entropy_loss_fusion": True}
    with pytest.raises(SpecError, match="cross-entropy-fusion-impl must be one of native, te"):
        memory_knobs_from_words(["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "cuda"], "bf16")
    words = argv(megatron_args(LLAMA, LAY, NATIVE), resolve=True)
    assert "--cross-entropy-loss-fusion" in words
    assert "--cross-entropy-fusion-impl" not in words  # native is Megatron-LM's default
    assert "--cross-entropy-loss-fusion" not in argv(megatron_args(LLAMA, LAY, UNFUSED), resolve=True)
    with pytest.raises(LayoutError, match="stability issues") as err:  # Megatron-LM's validate_args assert
        megatron_args(LLAMA, LAY, TE)
    assert "\n" not in str(err.value)
    spec = _knob_spec(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    items = dict(overrides(spec, choose_recipe(spec)))
    assert (items["model.cross_entropy_loss_fusion"], items["model.cross_entropy_fusion_impl"]) == (True, "te")


def test_taken_from_the_recipes() -> None:
    for impl in ("te", "native"):  # no runnable recipe uses native (the 9 are models without a preset): one is made
        r = next(x for x in bridge_recipes() if x.get("cross_entropy_fusion_impl") == "te" and x.runnable)
        r = replace(r, fields={**r.fields, "cross_entropy_fusion_impl": impl})
        knobs = training_knobs(r, "bf16")
        assert (knobs["cross_entropy_loss_fusion"], knobs["cross_entropy_fusion_impl"]) == (True, impl)
        assert not any(s.startswith("cross_entropy") for s in not_modelled(r))
