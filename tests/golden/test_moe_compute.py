"""Golden values of the MoE compute side, by hand from the Megatron-LM code it cites (main @ d98e8a6)."""

from __future__ import annotations

from dataclasses import replace

from paraplan.estimate.time.layer import moe_mlp_time
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

QWEN = load_model("qwen3-30b-a3b")
B200 = make_cluster(load_gpu("b200"), 8)
LAYOUT = ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1)


def test_fp32_router_runs_the_gating_gemm_on_bf16_tensor_cores() -> None:
    # moe_utils.py RouterGatingLinearFunction.forward: te_general_gemm(weight, inp, torch.float32) takes the bf16
    # operands and writes fp32 logits, so --moe-router-dtype fp32 costs the bf16 GEMM's time
    assert QWEN.moe_router_dtype == "fp32"
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    fp32 = moe_mlp_time(QWEN, B200, training, LAYOUT)
    plain = moe_mlp_time(replace(QWEN, moe_router_dtype=None), B200, training, LAYOUT)
    assert float(fp32.gemm_fwd_s) == float(plain.gemm_fwd_s)
    # by hand: the router is gemm_fwd_s less the routed experts' (1 + moe_overhead_frac) x their GEMMs:
    # 2 x 4096 tokens x 128 experts x 2048 hidden at 2250 TFLOP/s x e_max x prod x / (x + d0)
    eff = B200.gpu.efficiency
    d0 = eff.gemm_half_dim
    shape = (4096 / (4096 + d0)) * (128 / (128 + d0)) * (2048 / (2048 + d0))
    router_s = 2 * 4096 * 128 * 2048 / (2250e12 * eff.gemm_max_frac * shape)
    routed_s = float(fp32.mlp_gemm_fwd_s) * (1.0 + eff.moe_overhead_frac)
    assert abs(float(fp32.gemm_fwd_s) - routed_s - router_s) < 1e-12
