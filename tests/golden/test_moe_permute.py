"""Golden values of the MoE dispatcher's row copies outside its communication kernels (``estimate.time.permute``), by
hand from Megatron-LM d98e8a6 (megatron/core/transformer/moe/):

- every dispatcher but HybridEP with ``moe_permute_fusion_into_hybridep``: ``permute`` + ``unpermute``, 24 B per routed
  element forward + backward (the pair's MOE_PERMUTE_BYTES_PER_ELEMENT);
- alltoall with more than one local expert: ``sort_chunks_by_idxs`` and back (token_dispatcher.py
  ``dispatch_postprocess`` / ``combine_preprocess``), 8 B each (read + write a bf16 row, forward and backward);
- FP8 / FP4 / grouped tensor: the experts' ``Fp8Padding`` / ``Fp8Unpadding`` (experts.py), 8 B each, unless
  ``skip_routed_expert_padding`` (HybridEP pads in its dispatch) or DeepEP's fused permute already padded.
"""

from __future__ import annotations

import itertools

import pytest

from paraplan.estimate.time import permute
from paraplan.estimate.time.compute import hbm_rate
from paraplan.estimate.time.layer import moe_mlp_time
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

DSV3 = load_model("deepseek-v3")
B200 = make_cluster(load_gpu("b200"), 256)
EP8 = ParallelLayout(tp=1, pp=16, dp=16, ep=8, mbs=1)
"""DeepSeek-V3's B200 layout of NVIDIA's recipe (PP16 EP8): 256 / 8 = 32 experts per rank."""
HYBRIDEP = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
DEEPEP = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=2048, **kw)  # type: ignore[arg-type]


FP8 = {"precision": "fp8", "fp8_recipe": "mxfp8"}


@pytest.mark.parametrize(("knobs", "local", "per_element"), [
    ({}, 32, 24.0 + 16.0),                                       # alltoall bf16: permute pair + sort pair
    ({}, 1, 24.0),                                               # one expert per rank: nothing to sort
    (FP8, 32, 24.0 + 16.0 + 16.0),                               # + Fp8Padding / Fp8Unpadding
    ({**FP8, "moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}, 32, 24.0 + 16.0),
    ({"moe_use_grouped_tensor": True}, 32, 24.0 + 16.0 + 16.0),  # 256-token segments even in bf16
    ({**FP8, "moe_token_dispatcher_type": "allgather"}, 32, 24.0 + 16.0),  # its permute sorts; pads
    ({**FP8, **DEEPEP}, 32, 24.0 + 16.0),                        # permute on the received tokens; pads
    ({**FP8, **DEEPEP, "moe_permute_fusion": True}, 32, 24.0),   # fused_permute_and_pad_with_probs pads
    ({**FP8, **HYBRIDEP}, 32, 24.0),                             # padded in dispatch; standalone permute kernel
    ({**FP8, **HYBRIDEP, "moe_permute_fusion_into_hybridep": True}, 32, 0.0),  # permute inside the kernels
    ({**FP8, "precision": "fp4"}, 32, 24.0 + 16.0 + 16.0),
])
def test_permute_bytes_per_dispatcher(knobs: dict[str, object], local: int, per_element: float) -> None:
    assert float(permute.permute_bytes(_t(**knobs), 1000.0, local)) == pytest.approx(1000.0 * per_element, rel=1e-15)


def test_alltoall_pays_the_sort_and_padding_hybridep_fuses() -> None:
    # DeepSeek-V3, s 4096, mbs 1, EP 8, top-8: te = 4096 x 8 routed copies of h = 7168 per rank
    te_h = 4096 * 8 * DSV3.hidden_size
    a2a = moe_mlp_time(DSV3, B200, _t(**FP8), EP8)
    hyb = moe_mlp_time(DSV3, B200, _t(**FP8, **HYBRIDEP), EP8)
    extra_s = (16.0 + 16.0) * te_h / hbm_rate(B200)  # sort pair + padding pair, 8 B each per routed element
    assert float(a2a.elementwise_s - hyb.elementwise_s) == pytest.approx(extra_s, rel=1e-12)
    assert extra_s == pytest.approx(32.0 * 4096 * 8 * 7168 / (8.0e12 * 0.75), rel=1e-12)  # 1.25 ms on B200
    # the GEMMs are the dispatcher's business only through the load factor: equal here
    assert float(a2a.gemm_fwd_s) == float(hyb.gemm_fwd_s)


def test_hybridep_never_copies_more_than_deepep_or_alltoall() -> None:
    for prec, grouped, cap, pad, fused, local in itertools.product(
            ("bf16", "fp8", "fp4"), (False, True), (None, 1.0), (False, True), (False, True), (1, 4)):
        if pad and cap is None:
            continue
        kw: dict[str, object] = {"precision": prec, "moe_use_grouped_tensor": grouped,
                                 "moe_expert_capacity_factor": cap, "moe_pad_expert_input_to_capacity": pad}
        a2a = float(permute.permute_bytes(_t(**kw), 1.0, local))
        hyb = float(permute.permute_bytes(_t(**kw, **HYBRIDEP, moe_permute_fusion_into_hybridep=fused), 1.0, local))
        assert hyb <= a2a, kw
        if not pad:  # Megatron refuses DeepEP with drop-and-pad (TrainingSpec too)
            deep = float(permute.permute_bytes(_t(**kw, **DEEPEP, moe_permute_fusion=fused), 1.0, local))
            assert hyb <= deep <= a2a, kw
