"""Korthikanti et al. 2022 (arXiv:2205.05198) Table 2 activation formulas at hand-computed points.

Model: GPT style (MHA, f = 4h, GeLU, dropout), unfused attention (the paper stores the s^2
softmax and dropout tensors), 16-bit activations. Per layer:
    no parallelism          sbh(34 + 5as/h)
    TP (no SP)              sbh(10 + 24/t + 5as/(ht))
    TP + SP                 sbh/t (34 + 5as/h)
    TP + SP + selective     34 sbh / t
    full recompute          2 sbh (our layer input; /t with SP)
"""

from __future__ import annotations

import pytest

from paraplan.estimate import activations as act
from paraplan.layout import RECOMPUTE_CODES
from tests.conftest import gpt_model

S, B, H, A = 2048, 2, 1024, 16


def ctx(*, tp: int, sp: bool, recompute: str, flash: bool = False) -> act.ActivationContext:
    return act.ActivationContext(seq_len=S, mbs=B, tp=tp, cp=1, sp=sp, ep=1, etp=tp,
                                 recompute_code=RECOMPUTE_CODES[recompute], recompute_modules=("core_attn",),
                                 recompute_num_layers=1, fp8=False, flash=flash)


def layer(c: act.ActivationContext) -> float:
    return float(act.layer_bytes(gpt_model(hidden_size=H, num_attention_heads=A), c, moe=False))


SBH = S * B * H


def test_no_parallelism_matches_eq1() -> None:
    assert layer(ctx(tp=1, sp=False, recompute="none")) == SBH * (34 + 5 * A * S / H)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_without_sp(t: int) -> None:
    expected = SBH * (10 + 24 / t + 5 * A * S / (H * t))
    assert layer(ctx(tp=t, sp=False, recompute="none")) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel(t: int) -> None:
    assert layer(ctx(tp=t, sp=True, recompute="none")) == pytest.approx(SBH / t * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_selective_recompute_with_sp_is_34_sbh_over_t(t: int) -> None:
    assert layer(ctx(tp=t, sp=t > 1, recompute="selective")) == pytest.approx(34 * SBH / t, rel=1e-12)


def test_selective_recompute_without_sp() -> None:
    assert layer(ctx(tp=4, sp=False, recompute="selective")) == pytest.approx(SBH * (10 + 24 / 4), rel=1e-12)


def test_full_recompute_keeps_the_layer_input() -> None:
    assert layer(ctx(tp=1, sp=False, recompute="full")) == 2 * SBH
    assert layer(ctx(tp=4, sp=True, recompute="full")) == 2 * SBH / 4


def test_flash_attention_drops_the_s_squared_terms() -> None:
    flash = layer(ctx(tp=1, sp=False, recompute="none", flash=True))
    lse = 4 * A * S * B  # fp32 log-sum-exp per head and token
    assert flash == 34 * SBH + lse
