"""Invariants of the memory knobs (hypothesis): bf16 gradients, precision-aware low-precision moments, FP8 param
gather, optimizer CPU offload and the fused cross entropy never raise a stage's memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.specs.training import TrainingSpec

from .test_memory_props import run, setups

SMALLER_DTYPES = {"fp32": ("fp32", "fp16", "bf16", "fp8"), "fp16": ("fp16", "fp8"), "bf16": ("bf16", "fp8"),
                  "fp8": ("fp8",)}


@st.composite
def knobbed(draw: st.DrawFn) -> tuple:
    model, layout, training = draw(setups())
    precision = draw(st.sampled_from(["bf16", "fp8", "fp16"]))
    aware = draw(st.booleans())
    kw: dict[str, object] = {"precision": precision, "use_precision_aware_optimizer": aware}
    if precision == "fp8":
        kw["fp8_recipe"] = draw(st.sampled_from(["delayed", "tensorwise", "mxfp8", "blockwise"]))
    if aware:
        kw["exp_avg_dtype"] = draw(st.sampled_from(["fp32", "fp16", "bf16", "fp8"]))
        kw["exp_avg_sq_dtype"] = draw(st.sampled_from(["fp32", "fp16", "bf16", "fp8"]))
        kw["main_params_dtype"] = draw(st.sampled_from(["fp32", "fp16"]))
    layout = replace(layout, distributed_optimizer=draw(st.booleans()))
    return model, layout, replace(training, **kw)  # type: ignore[arg-type]


def peak(model, layout, training) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array([float(s.memory.total_bytes) for s in run(model, layout, training).stages])


def _never_more(s: tuple, changed: TrainingSpec) -> None:
    model, layout, training = s
    before, after = peak(model, layout, training), peak(model, layout, changed)
    assert np.all(after <= before * (1 + 1e-12)), (training, changed)


@settings(max_examples=30, deadline=None)
@given(knobbed())
def test_bf16_gradients_never_raise_memory(s: tuple) -> None:
    _never_more(s, replace(s[2], grad_reduce_in_bf16=True))


@settings(max_examples=30, deadline=None)
@given(knobbed(), st.data())
def test_lower_precision_moments_never_raise_memory(s: tuple, data: st.DataObject) -> None:
    t = s[2]
    if not t.use_precision_aware_optimizer:  # turning the precision-aware optimizer on, moments as they are
        _never_more(s, replace(t, use_precision_aware_optimizer=True))
        return
    m = data.draw(st.sampled_from(SMALLER_DTYPES[t.exp_avg_dtype]))
    v = data.draw(st.sampled_from(SMALLER_DTYPES[t.exp_avg_sq_dtype]))
    _never_more(s, replace(t, exp_avg_dtype=m, exp_avg_sq_dtype=v))


@settings(max_examples=30, deadline=None)
@given(knobbed())
def test_fp8_param_gather_never_raises_memory(s: tuple) -> None:
    t = s[2]
    if t.precision == "fp8":
        _never_more(s, replace(t, fp8_param_gather=True))


@settings(max_examples=30, deadline=None)
@given(knobbed(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_optimizer_offload_never_raises_memory(s: tuple, f1: float, f2: float) -> None:
    """Offload keeps 12 B x (1 - fraction) of fp32 state on the GPU (HybridDeviceOptimizer ignores the moment
    dtypes), so it is compared with the optimizer it replaces: fp32 moments, or any moments at fraction 1."""
    model, layout, t = s
    base = replace(t, use_precision_aware_optimizer=True, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32",
                   main_params_dtype="fp32", store_param_remainders=False)
    lo, hi = sorted((f1, f2))
    _never_more((model, layout, base), replace(base, optimizer_cpu_offload=True, optimizer_offload_fraction=lo))
    off_lo = replace(base, optimizer_cpu_offload=True, optimizer_offload_fraction=lo)
    _never_more((model, layout, off_lo), replace(off_lo, optimizer_offload_fraction=hi))
    aware = t if t.use_precision_aware_optimizer else replace(t, use_precision_aware_optimizer=True)
    _never_more((model, layout, aware), replace(aware, optimizer_cpu_offload=True, optimizer_offload_fraction=1.0))


@settings(max_examples=30, deadline=None)
@given(knobbed(), st.sampled_from(["native", "te"]))
def test_cross_entropy_fusion_never_raises_memory(s: tuple, impl: str) -> None:
    """Fusing the loss keeps at most the unfused loss's logits (TE's: the bf16 logits only), on every stage."""
    _never_more(s, replace(s[2], cross_entropy_loss_fusion=True, cross_entropy_fusion_impl=impl))
