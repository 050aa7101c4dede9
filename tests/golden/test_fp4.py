"""NVFP4 (``--fp4-format e2m1 --fp4-recipe nvfp4``) and the FP8 recipes' time: goldens by hand from the code cited.

- Weights (TE ``NVFP4Tensor``, NVFP4BlockScaling): packed E2M1 (0.5 B) + one E4M3 scale per 16 elements = 0.5625 B
  per copy; TE keeps a rowwise and a columnwise copy beside the bf16 weight (1.125 B); ``--fp4-param-gather``: the
  rowwise copy is the parameter (0.5625 B, packed in the uint8 DDP buffer), only the columnwise one is extra. Only
  the transformer layers' linears are quantized, not the embedding or output layer; ``--first-last-layers-bf16``
  leaves the first/last N layers unquantized (``fp4_utils.get_fp4_context``).
- Time: fprop, dgrad and wgrad run at the dense FP4 peak (GB200: 10 PFLOP/s, ecosystem.md 4.1). Each GEMM's input
  (forward) and output gradient (backward) is quantized: amax read (2 B) + quantize read (2 B) + rowwise and
  columnwise NVFP4 copies (2 x 0.5625 B) = 5.125 B per element. FP8: tensorwise (current scaling) reads each once
  more for its amax (+2 B), MXFP8 writes 1/32 B of scales per direction (+1/16 B), over delayed scaling.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.estimate.memory import fp8_cache_bytes_per_param, weight_bytes_per_param
from paraplan.estimate.time import compute
from paraplan.estimate.time.layer import attention_layer_time, dense_mlp_time
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec, optimizer_bytes_per_param

LLAMA70 = load_model("llama3-70b")
LLAMA8 = load_model("llama3-8b")
GB200 = load_gpu("gb200")


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, **kw)  # type: ignore[arg-type]


def test_fp4_weight_bytes_per_param() -> None:
    assert weight_bytes_per_param(_t(precision="fp4")) == 2.0
    assert fp8_cache_bytes_per_param(_t(precision="fp4")) == 1.125
    assert weight_bytes_per_param(_t(precision="fp4", fp4_param_gather=True)) == 0.5625
    assert fp8_cache_bytes_per_param(_t(precision="fp4", fp4_param_gather=True)) == 0.5625
    # no bf16 param to keep the remainder of: the precision-aware optimizer's master weight is a full fp32
    aware = {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert optimizer_bytes_per_param(_t(precision="fp4", **aware)) == 2.0 + 4.0
    assert optimizer_bytes_per_param(_t(precision="fp4", fp4_param_gather=True, **aware)) == 4.0 + 4.0


def _stages(training: TrainingSpec):  # type: ignore[no-untyped-def]
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                            distributed_optimizer=True)
    return estimate(LLAMA70, make_cluster(GB200, 64), training, layout).stages


def test_llama3_70b_fp4_copies_cover_the_layers_only() -> None:
    for st0 in _stages(_t(precision="fp4"))[:1]:
        layers = float(st0.params.layers_dense)
        assert float(st0.params.embedding) > 0  # the first stage holds the embedding: not quantized
        assert float(st0.other.fp8_weight_cache_bytes) == pytest.approx(1.125 * layers)
    gather = _stages(_t(precision="fp4", fp4_param_gather=True))[3]
    assert float(gather.other.fp8_weight_cache_bytes) == pytest.approx(0.5625 * float(gather.params.layers_dense))
    assert float(gather.memory.weights_bytes) == pytest.approx(0.5625 * float(gather.params.total))  # no embedding
    first = _stages(_t(precision="fp4", fp4_param_gather=True))[0]  # the embedding stays a bf16 parameter
    assert float(first.memory.weights_bytes) == pytest.approx(0.5625 * float(first.params.layers_dense)
                                                              + 2.0 * float(first.params.embedding))


def test_first_last_layers_bf16_keep_no_fp4_copies() -> None:
    base = _stages(_t(precision="fp4"))
    ends = _stages(_t(precision="fp4", first_last_layers_bf16=True, num_layers_at_start_in_bf16=2,
                      num_layers_at_end_in_bf16=1))
    per_layer = [float(s.params.layers_dense) / 10 for s in base]  # 80 layers over PP 8: 10 per rank
    cache = [float(s.other.fp8_weight_cache_bytes) for s in ends]
    assert cache[0] == pytest.approx(1.125 * 8 * per_layer[0])
    assert cache[7] == pytest.approx(1.125 * 9 * per_layer[7])
    assert cache[3] == pytest.approx(float(base[3].other.fp8_weight_cache_bytes))


def test_first_last_layers_bf16_refused_with_delayed_scaling() -> None:
    with pytest.raises(SpecError, match="Delayed scaling does not support first / last layer in BF16"):
        _t(precision="fp8", first_last_layers_bf16=True)
    _t(precision="fp8", fp8_recipe="mxfp8", first_last_layers_bf16=True)


@pytest.mark.parametrize(("kw", "per_element"), [
    ({"precision": "fp4"}, 2 + 2 + 2 * 0.5625), ({"precision": "fp8", "fp8_recipe": "delayed"}, 0.0),
    ({"precision": "fp8", "fp8_recipe": "tensorwise"}, 2.0), ({"precision": "fp8", "fp8_recipe": "mxfp8"}, 1 / 16),
    ({"precision": "fp8", "fp8_recipe": "blockwise"}, 1 / 16), ({"precision": "bf16"}, 0.0),
])
def test_quantize_bytes(kw: dict[str, object], per_element: float) -> None:
    m, n, k = 8192, 4096, 1024
    assert compute.quantize_bytes(_t(**kw), m, n, k) == pytest.approx(per_element * m * (k + n))


def test_fp4_gemm_at_the_fp4_peak() -> None:
    cluster = make_cluster(GB200, 8)
    m, n, k = 8192, 8192, 8192
    eff = compute.gemm_efficiency(GB200.efficiency, m, n, k)
    assert compute.gemm_s(cluster, "fp4", m, n, k) == pytest.approx(2 * m * n * k / (10000e12 * eff))
    # GB200: FP8 = fp8_gemm_speedup x BF16 (fitted), FP4 = 4 x BF16 (datasheet peaks 10000 / 2500)
    assert compute.gemm_s(cluster, "fp4", m, n, k) / compute.gemm_s(cluster, "fp8", m, n, k) == pytest.approx(
        GB200.efficiency.fp8_gemm_speedup / 4)
    h100 = make_cluster(load_gpu("h100-80gb"), 8)
    with pytest.raises(SpecError, match=r"compute capability 10\.0"):
        compute.gemm_s(h100, "fp4", m, n, k)


def test_llama3_8b_mlp_quantize_traffic() -> None:
    cluster = make_cluster(GB200, 8)
    layout = ParallelLayout(mbs=1, recompute="none")
    h, f, T = 4096, 14336, 8192
    rate = compute.hbm_rate(cluster)
    bf16 = dense_mlp_time(LLAMA8, cluster, _t(), layout, ffn=f)
    fp4 = dense_mlp_time(LLAMA8, cluster, _t(precision="fp4"), layout, ffn=f)
    # fc1 (T x h)(h x 2f): input T h, output gradient T 2f; fc2 (T x f)(f x h): input T f, gradient T h
    assert float(fp4.elementwise_s - bf16.elementwise_s) == pytest.approx(5.125 * T * (2 * h + 3 * f) / rate)
    cs = dense_mlp_time(LLAMA8, cluster, _t(precision="fp8", fp8_recipe="tensorwise"), layout, ffn=f)
    ds = dense_mlp_time(LLAMA8, cluster, _t(precision="fp8"), layout, ffn=f)
    assert float(cs.elementwise_s - ds.elementwise_s) == pytest.approx(2.0 * T * (2 * h + 3 * f) / rate)
    assert float(cs.gemm_fwd_s) == float(ds.gemm_fwd_s)


def test_fp8_dot_product_attention_backward_at_the_fp8_peak() -> None:
    cluster = make_cluster(GB200, 8)
    layout = ParallelLayout(mbs=1, recompute="none")
    plain = attention_layer_time(LLAMA8, cluster, _t(precision="fp4"), layout)
    dpa = attention_layer_time(LLAMA8, cluster, _t(precision="fp4", fp8_dot_product_attention=True), layout)
    # GB200 has an exponential rate (5e12/s), so the bound is explicit (compute.flash_attention_bounds_s): per score
    # element at head dim 128 the forward's 512 FLOPs at the FP8 peak (1.024e-13 s) wait for the exponential
    # (2e-13 s = 512 / 2.56e15), the backward's 1280 at the FP8 peak (2.56e-13 s) bind; plain BF16 is 512 / 2.5e15 +
    # 1280 / 2.5e15, MMA-bound. So dpa x 3.5 = plain x (2500 / 2560 + 2.5 x 2500 / 5000)
    assert float(dpa.attn_fwd_s) * 3.5 == pytest.approx(float(plain.attn_fwd_s) * (2500 / 2560 + 2.5 * 2500 / 5000))
    with pytest.raises(SpecError, match="fp8_dot_product_attention needs precision fp8 or fp4"):
        _t(fp8_dot_product_attention=True)


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--use-distributed-optimizer").split()


def test_fp4_flags_read_from_megatron_args() -> None:
    flags = read_flags([*FLAGS, "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--fp4-param-gather",
                        "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "0",
                        "--num-layers-at-end-in-bf16", "2"])
    t = flags.training_fields
    assert not flags.problems
    assert (t["precision"], t["fp4_recipe"], t["fp4_param_gather"]) == ("fp4", "nvfp4", True)
    assert (t["first_last_layers_bf16"], t["num_layers_at_start_in_bf16"], t["num_layers_at_end_in_bf16"]) == (
        True, 0, 2)


def test_fp4_flag_problems_from_megatron_args() -> None:
    codes = {c for c, _ in read_flags([*FLAGS, "--fp4-param-gather"]).problems}
    assert "FP4_PARAM_GATHER_NEEDS_FP4" in codes
    codes = {c for c, _ in read_flags([*FLAGS, "--fp8-format", "hybrid", "--first-last-layers-bf16"]).problems}
    assert "FIRST_LAST_BF16_DELAYED" in codes
    codes = {c for c, _ in read_flags([*FLAGS, "--fp8-format", "hybrid", "--fp4-format", "e2m1"]).problems}
    assert "FP4_AND_FP8" in codes
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, "--fp4-format", "e2m3"])
    assert str(err.value) == "--fp4-format must be e2m1, got 'e2m3'"
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, "--fp4-format", "e2m1", "--fp4-recipe", "custom"])
    assert str(err.value) == "--fp4-recipe must be one of nvfp4, got 'custom'"


def test_fp4_knobs_written_back_and_read_again() -> None:
    training = _t(precision="fp4", fp4_param_gather=True, grad_reduce_in_bf16=True, first_last_layers_bf16=True,
                  num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=4)
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                            distributed_optimizer=True)
    words = argv(megatron_args(LLAMA70, layout, training, arch="blackwell"), resolve=True)
    flags = read_flags(words)
    assert not flags.problems
    back = flags.training_fields
    for key in ("precision", "fp4_recipe", "fp4_param_gather", "grad_reduce_in_bf16", "first_last_layers_bf16",
                "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
        assert back.get(key, getattr(TrainingSpec(seq_len=1, global_batch_size=1), key)) == getattr(training, key)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["estimate", "-m", "llama3-8b", "-n", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--gbs", "64",
        "--seq-len", "8192"]


def test_cli_fp4(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli([*BASE, "-g", "h100-80gb", "--precision", "fp4"], capsys)
    assert code == 1 and err.count("\n") == 1 and "NVFP4" in err and "Traceback" not in err
    code, _, err = _cli([*BASE, "-g", "gb200", "--precision", "fp8", "--knob", "fp4-param-gather"], capsys)
    assert code == 1 and "--knob fp4-param-gather needs --precision fp4" in err
    code, out, _ = _cli([*BASE, "-g", "gb200", "--precision", "fp4", "--knob", "fp4-param-gather",
                         "--format", "json"], capsys)
    import json

    d = json.loads(out)
    assert code == 0 and d["config"]["memory_knobs"] == {"fp4_param_gather": True}
    assert d["config"]["precision"] == "fp4"


@st.composite
def _fp4_setups(draw: st.DrawFn) -> tuple[ParallelLayout, TrainingSpec]:
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    mbs = draw(st.sampled_from([1, 2]))
    rec = draw(st.sampled_from(["none", "selective", "full"]))
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, recompute=rec, distributed_optimizer=draw(st.booleans()),
                            sequence_parallel=tp > 1)  # type: ignore[arg-type]
    training = TrainingSpec(seq_len=2048, global_batch_size=mbs * dp * draw(st.sampled_from([1, 4])), precision="fp4")
    return layout, training


def _peaks(layout: ParallelLayout, training: TrainingSpec) -> np.ndarray:
    est = estimate(LLAMA8, make_cluster(GB200, layout.world_size), training, layout)
    return np.array([float(s.memory.total_bytes) for s in est.stages])


@settings(max_examples=20, deadline=None)
@given(_fp4_setups(), st.integers(0, 2), st.integers(0, 2))
def test_fp4_param_gather_and_bf16_ends_never_raise_memory(s: tuple, start: int, end: int) -> None:
    layout, training = s
    before = _peaks(layout, training)
    if layout.distributed_optimizer:
        assert np.all(_peaks(layout, replace(training, fp4_param_gather=True)) <= before * (1 + 1e-12))
    ends = replace(training, first_last_layers_bf16=True, num_layers_at_start_in_bf16=start,
                   num_layers_at_end_in_bf16=end)
    assert np.all(_peaks(layout, ends) <= before * (1 + 1e-12))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["b200", "gb200", "b300", "gb300"]), st.integers(64, 16384), st.integers(64, 16384),
       st.integers(64, 16384))
def test_fp4_gemm_never_slower_than_fp8_on_blackwell(gpu: str, m: int, n: int, k: int) -> None:
    cluster = make_cluster(load_gpu(gpu), 8)
    assert compute.gemm_s(cluster, "fp4", m, n, k) <= compute.gemm_s(cluster, "fp8", m, n, k)


def test_first_last_layers_bf16_run_at_the_bf16_rate() -> None:
    from paraplan.estimate.step_time import bf16_layers_extra_s, stage_terms
    from paraplan.estimate.time.layer import layer_time

    cluster = make_cluster(GB200, 8)
    layout = ParallelLayout(mbs=1, recompute="none")
    fp4 = _t(precision="fp4")
    ends = replace(fp4, first_last_layers_bf16=True, num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=4)
    one = float(layer_time(LLAMA8, cluster, _t(), layout, moe=False).compute_s
                - layer_time(LLAMA8, cluster, fp4, layout, moe=False).compute_s)
    assert one > 0
    # per BF16 layer (each stage adds it per such layer it holds); no start layers: no start term
    assert bf16_layers_extra_s(LLAMA8, cluster, ends, layout) == (0.0, pytest.approx(one))
    assert bf16_layers_extra_s(LLAMA8, cluster, fp4, layout) == (0.0, 0.0)
    assert stage_terms(LLAMA8, cluster, ends, layout).bf16_end_s == pytest.approx(one)
    slow = estimate(LLAMA8, make_cluster(GB200, 8), ends, ParallelLayout(dp=8, mbs=1, recompute="none"))
    fast = estimate(LLAMA8, make_cluster(GB200, 8), fp4, ParallelLayout(dp=8, mbs=1, recompute="none"))
    m = 256 // 8  # micro-batches per rank
    assert float(slow.time.compute_s - fast.time.compute_s) == pytest.approx(m * 4 * one, rel=1e-9)


def test_fp4_param_gather_gathers_nvfp4_bytes() -> None:
    from paraplan.estimate import comm
    from paraplan.estimate.params import stage_params
    from paraplan.estimate.stages import all_stage_layers
    from paraplan.estimate.time import dp

    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                            distributed_optimizer=True)
    cluster = make_cluster(GB200, 64)
    stage = all_stage_layers(LLAMA70, layout)[3]
    groups = dp.dp_groups(LLAMA70, cluster, layout, 8192, None)
    _, bf16, _ = dp.dp_times(LLAMA70, cluster, layout, stage, groups, 8192, _t(precision="fp4"))
    _, fp4, _ = dp.dp_times(LLAMA70, cluster, layout, stage, groups, 8192, _t(precision="fp4", fp4_param_gather=True))
    p = stage_params(LLAMA70, stage, tp=4, pp=8, ep=1, etp=0, max_positions=8192)
    # the same buckets (latency terms), 2 - 0.5625 B/param fewer bytes over the DP ring
    saved = comm.all_gather_s((2.0 - 0.5625) * float(p.dense), groups.n_dense, groups.bw_d, 0.0)
    assert float(bf16 - fp4) == pytest.approx(float(saved))
