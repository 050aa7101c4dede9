"""Golden values of the FP8 weight copies on Blackwell, by hand from Transformer Engine's quantizers.

``nvte_is_non_tn_fp8_gemm_supported`` (common/transformer_engine.cpp) is true on sm 10.x / 11.x (B200, GB200, B300,
GB300): ``Float8Quantizer`` and ``Float8CurrentScalingQuantizer::create_tensor`` (pytorch/csrc/quantizer.cpp) then
make no transpose for the columnwise use (``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``):
one 1-byte copy per weight under delayed or tensorwise scaling, none beyond the FP8 parameter itself with
``--fp8-param-gather``. MXFP8 and blockwise scales run along one direction: both copies stay. Hopper: both copies.
"""

from __future__ import annotations

import pytest

from paraplan.estimate.memory import fp8_cache_bytes_per_param
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, precision="fp8", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("recipe", "gather", "hopper", "blackwell"), [
    ("delayed", False, 2.0, 1.0), ("tensorwise", False, 2.0, 1.0),
    ("delayed", True, 1.0, 0.0), ("tensorwise", True, 1.0, 0.0),
    ("mxfp8", False, 2.0 * (1 + 1 / 32), 2.0 * (1 + 1 / 32)), ("mxfp8", True, 1 + 1 / 32, 1 + 1 / 32),
    ("blockwise", False, 2.0 * (1 + 4 / 128**2), 2.0 * (1 + 4 / 128**2)),
])
def test_copies_per_parameter(recipe: str, gather: bool, hopper: float, blackwell: float) -> None:
    t = _t(fp8_recipe=recipe, fp8_param_gather=gather)
    assert fp8_cache_bytes_per_param(t, "hopper") == pytest.approx(hopper)
    assert fp8_cache_bytes_per_param(t, "blackwell") == pytest.approx(blackwell)


def test_b200_stage_keeps_one_byte_per_weight_and_the_search_agrees() -> None:
    from paraplan.layout import LayoutTable
    from paraplan.search import evaluate_table

    model = load_model("llama3-70b")
    layout = ParallelLayout(tp=2, pp=4, vp=5, dp=8, mbs=1, recompute="none", sequence_parallel=True)
    training = _t(fp8_recipe="tensorwise")
    b200 = make_cluster(load_gpu("b200"), 64)
    est = estimate(model, b200, training, layout)
    for st in est.stages:
        assert float(st.other.fp8_weight_cache_bytes) == pytest.approx(1.0 * float(st.params.total))
    h100 = estimate(model, make_cluster(load_gpu("h100-80gb"), 64), training, layout)
    stage0 = h100.stages[0]
    assert float(stage0.other.fp8_weight_cache_bytes) == pytest.approx(2.0 * float(stage0.params.total))
    # the search's vectorised peak is the estimate's, on Blackwell too
    peak = evaluate_table(model, b200, training, LayoutTable.from_layouts([layout])).peak_bytes
    assert float(peak[0]) == pytest.approx(est.peak_bytes, rel=1e-12)
