"""Selective recompute modules act on the layers Megatron-Core applies them to: "mlp" on dense
MLPs only, "moe" on MoE layers only (transformer_layer.py ``recompute_mlp``, moe/moe_layer.py)."""

from __future__ import annotations

import pytest

from paraplan.estimator import estimate
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

H100 = load_gpu("h100-80gb")


def _step_and_peak(model: str, n: int, **kw: object) -> tuple[float, float]:
    est = estimate(load_model(model), make_cluster(H100, n), TrainingSpec(seq_len=4096, global_batch_size=64),
                   layout_for_world(n, **kw))  # type: ignore[arg-type]
    return float(est.time.step_s), float(est.peak_bytes)


def test_moe_module_on_a_dense_model_recomputes_nothing() -> None:
    none = _step_and_peak("llama3-8b", 8, tp=2, recompute="none")
    moe = _step_and_peak("llama3-8b", 8, tp=2, recompute="selective", recompute_modules=("moe",))
    mlp = _step_and_peak("llama3-8b", 8, tp=2, recompute="selective", recompute_modules=("mlp",))
    assert moe == pytest.approx(none)
    assert mlp[0] > none[0] and mlp[1] < none[1]


def test_mlp_module_on_an_all_moe_model_recomputes_nothing() -> None:
    none = _step_and_peak("mixtral-8x7b", 16, tp=2, ep=8, recompute="none")
    mlp = _step_and_peak("mixtral-8x7b", 16, tp=2, ep=8, recompute="selective", recompute_modules=("mlp",))
    moe = _step_and_peak("mixtral-8x7b", 16, tp=2, ep=8, recompute="selective", recompute_modules=("moe",))
    assert mlp == pytest.approx(none)
    assert moe[0] > none[0] and moe[1] < none[1]


def test_fp8_weight_copies_under_fsdp_are_those_of_the_layers_in_flight() -> None:
    """Megatron-FSDP gathers a layer's weights for its GEMMs and frees them: only the ~2 layers in
    flight have FP8 copies (a full FP8 copy of every weight made FSDP + FP8 never fit)."""
    from paraplan.estimate.memory import FSDP_LAYERS_IN_FLIGHT

    copies = 1.0  # GB200, delayed scaling: one FP8 copy serves both GEMM layouts (no transpose on Blackwell)

    model = load_model("llama3-70b")
    fp8 = TrainingSpec(seq_len=8192, global_batch_size=256, precision="fp8")
    cluster = make_cluster(load_gpu("gb200"), 64)
    fsdp = estimate(model, cluster, fp8, layout_for_world(64, tp=1, recompute="full", fsdp=True,
                                                          distributed_optimizer=False))
    dist = estimate(model, cluster, fp8, layout_for_world(64, tp=1, recompute="full"))
    st_f, st_d = fsdp.stages[0], dist.stages[0]
    per_layer = (st_f.params.layers_dense + st_f.params.layers_experts) / model.num_layers
    assert float(st_f.other.fp8_weight_cache_bytes) == pytest.approx(
        copies * FSDP_LAYERS_IN_FLIGHT * per_layer)
    assert float(st_d.other.fp8_weight_cache_bytes) == pytest.approx(copies * st_d.params.total)
    assert fsdp.fits  # the published Bridge recipe (TP 1, FSDP, FP8 on 64 GB200) runs
