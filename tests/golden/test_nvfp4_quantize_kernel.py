"""How Transformer Engine casts NVFP4 operands (``TrainingSpec.nvfp4_quantize_kernel``, ``--knob
nvfp4-quantize-kernel=split``): goldens by hand from TE's csrc/quantizer.cpp ``NVFP4Quantizer::quantize_impl``.

A forward input or backward output gradient of an NVFP4 linear needs a rowwise copy and a random-Hadamard-transformed
columnwise copy (recipe/__init__.py ``NVFP4BlockScaling``: RHT on the inputs and gradients, "both versions are
computed from the high precision input"). Both releases first run ``nvte_hadamard_transform_amax`` (read the bf16
tensor, 2 B per element) and write two NVFP4 copies (0.5 B + one E4M3 scale per 16 = 0.5625 B each):
- TE >= 2.14 (``fused``): ``nvte_quantize_with_hadamard_transform`` casts both from one more read: 2 + 2 + 1.125
  = 5.125 B per element;
- TE 2.12 / 2.13 (``split``): ``nvte_quantize_v2`` (rowwise) and ``nvte_hadamard_transform_cast_fusion_columnwise``
  each read the tensor: 2 + 2 + 2 + 1.125 = 7.125 B per element.
Grouped (MoE expert) linears use TE >= 2.12's one-kernel grouped cast (extensions/cast.cpp
``split_quantize_nvfp4_impl_with_rht_helper``, ``nvte_group_hadamard_transform_cast_fusion``) in both: it needs every
expert's token count a multiple of 128, which Megatron-LM's FP4 padding gives (router padding, the flex dispatchers'
``pad_multiple``, or ``TEGroupedMLP``'s ``Fp8Padding`` fallback at TE's NVFP4 alignment, 128): 5.125 B.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from paraplan.cli.options import knob_fields
from paraplan.errors import SpecError
from paraplan.estimate.time import compute, permute
from paraplan.estimate.time.layer import dense_mlp_time, moe_mlp_time
from paraplan.launch.megatron import megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec, training_dict

LLAMA8 = load_model("llama3-8b")
GB200 = load_gpu("gb200")


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kernel", "grouped", "per_element"), [
    ("fused", False, 2 + 2 + 2 * 0.5625), ("split", False, 2 + 2 + 2 + 2 * 0.5625),
    ("fused", True, 2 + 2 + 2 * 0.5625),
    ("split", True, 2 + 2 + 2 * 0.5625),  # TE 2.12 / 2.13: grouped one-kernel cast of 128-aligned expert segments
])
def test_quantize_bytes_per_release(kernel: str, grouped: bool, per_element: float) -> None:
    m, n, k = 8192, 4096, 1024
    training = _t(precision="fp4", nvfp4_quantize_kernel=kernel)
    assert compute.nvfp4_quant_bytes_per_element(training, grouped=grouped) == pytest.approx(per_element)
    assert compute.quantize_bytes(training, m, n, k, grouped=grouped) == pytest.approx(per_element * m * (k + n))


def test_split_adds_one_bf16_read_per_operand_element_to_the_mlp() -> None:
    cluster = make_cluster(GB200, 8)
    layout = ParallelLayout(mbs=1, recompute="none")
    h, f, T = 4096, 14336, 8192
    fused = dense_mlp_time(LLAMA8, cluster, _t(precision="fp4"), layout, ffn=f)
    split = dense_mlp_time(LLAMA8, cluster, _t(precision="fp4", nvfp4_quantize_kernel="split"), layout, ffn=f)
    # fc1 (T x h)(h x 2f): input T x h, gradient T x 2f; fc2 (T x f)(f x h): input T x f, gradient T x h
    operands = T * (h + 2 * f) + T * (f + h)
    assert float(split.elementwise_s - fused.elementwise_s) == pytest.approx(
        2.0 * operands / compute.hbm_rate(cluster))
    assert float(split.gemm_fwd_s) == float(fused.gemm_fwd_s)


def test_default_and_validation() -> None:
    assert _t().nvfp4_quantize_kernel == "fused"
    assert "nvfp4_quantize_kernel" not in training_dict(_t(precision="fp4"))  # ids made from the spec stay the same
    with pytest.raises(SpecError, match=r"nvfp4_quantize_kernel must be one of fused, split, got 'te2\.12'"):
        _t(precision="fp4", nvfp4_quantize_kernel="te2.12")
    with pytest.raises(SpecError, match=r"^nvfp4_quantize_kernel \(--knob nvfp4-quantize-kernel\) split needs "
                                        r"precision fp4 .*, got precision fp8$"):
        _t(precision="fp8", nvfp4_quantize_kernel="split")


def test_knob_parses_and_is_not_written_into_launch_files() -> None:
    assert knob_fields(["nvfp4-quantize-kernel=split"], "fp4") == {"nvfp4_quantize_kernel": "split"}
    for bad, got in (("nvfp4-quantize-kernel", "no value"), ("nvfp4-quantize-kernel=2.12", "'2.12'")):
        with pytest.raises(SpecError, match=f"--knob nvfp4-quantize-kernel must be one of fused, split, got {got}"):
            knob_fields([bad], "fp4")
    layout = ParallelLayout(tp=2, dp=4, mbs=1, recompute="none")
    split = megatron_args(LLAMA8, layout, _t(precision="fp4", nvfp4_quantize_kernel="split"), arch="blackwell")
    assert split == megatron_args(LLAMA8, layout, _t(precision="fp4"), arch="blackwell")


SHARED = Path(__file__).resolve().parents[3] / "shared" / "calibration"


@pytest.mark.skipif(not (SHARED / "published_runs.csv").exists(), reason="needs ../shared/calibration")
def test_calibration_rows_run_their_containers_te_release() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from calibration import case_training
    from published_cases import load_cases, nvfp4_quantize_kernel_of

    assert nvfp4_quantize_kernel_of("26.02") == "split"  # TE 2.12 (Bridge docs/releases/software-versions.md)
    assert nvfp4_quantize_kernel_of("26.02.01") == "split"
    assert nvfp4_quantize_kernel_of("26.04") == "fused"  # TE 2.14
    assert nvfp4_quantize_kernel_of("26.08") == nvfp4_quantize_kernel_of(None) == "fused"
    from published_cases import CONTAINER_TE_RELEASE  # Bridge uv.lock at v0.3.1, v0.4.2, v0.5.1, v0.6.0
    assert [CONTAINER_TE_RELEASE[c] for c in ("26.02.01", "26.04.01", "26.06.01", "26.08")] == [
        (2, 12), (2, 14), (2, 16), (2, 17)]
    cases, _ = load_cases("published")
    fp4 = [c for c in cases if c.precision == "fp4"]
    assert {c.nvfp4_quantize_kernel for c in fp4} == {"fused", "split"}
    for c in cases:
        want = c.nvfp4_quantize_kernel if c.precision == "fp4" else "fused"
        assert case_training(c, "flash").nvfp4_quantize_kernel == want


@pytest.mark.parametrize("job", [
    ["--recipe", "gpt-oss-20b-gb200-nvfp4-8"],
    ["-m", "llama3-8b", "-g", "gb200", "-n", "8", "-s", "8192", "--gbs", "64", "--precision", "fp4",
     "--knob", "first-last-layers-bf16"],
])
def test_estimate_runs_split_with_bf16_layers_and_split_is_slower(job: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The first/last BF16 layers' copy of the training drops the FP4-only knob (step_time.bf16_layers_extra_s):
    estimate with both knobs runs, and the split casts' extra bf16 read makes the step longer."""
    import json

    from paraplan.cli import main

    steps = []
    for kernel in ("fused", "split"):
        code = main(["estimate", *job, "--knob", f"nvfp4-quantize-kernel={kernel}", "--format", "json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        steps.append(json.loads(out)["time"]["step_s"])
    assert steps[1] > steps[0]


def test_knob_errors_use_the_users_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    job = ["estimate", "-m", "llama3-8b", "-g", "gb200", "-n", "8", "-s", "8192", "--gbs", "64"]
    assert main([*job, "--precision", "bf16", "--knob", "nvfp4-quantize-kernel=split"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: nvfp4_quantize_kernel (--knob nvfp4-quantize-kernel) split needs precision fp4")
    assert err.count("\n") == 1 and err.rstrip().endswith("got precision bf16")
    assert main([*job, "--knob", "nvfp4-kernel=split"]) == 1
    err = capsys.readouterr().err
    assert "not a knob; one of" in err and "nvfp4-quantize-kernel=fused|split" in err and "attention-kernel" in err


def test_an_fp4_estimate_says_which_cast_it_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    job = ["estimate", "-m", "llama3-8b", "-g", "gb200", "-n", "8", "-s", "8192", "--gbs", "64", "--format", "json"]
    notes = {}
    for extra in ([], ["--knob", "nvfp4-quantize-kernel=split"], ["--precision", "fp8"]):
        prec = [] if "--precision" in extra else ["--precision", "fp4"]
        assert main([*job, *prec, *extra]) == 0
        notes[len(extra) and extra[1]] = [n for n in json.loads(capsys.readouterr().out)["notes"] if "NVFP4" in n]
    assert notes[0] == ["NVFP4 casts: one kernel (TE >= 2.14); --knob nvfp4-quantize-kernel=split for TE <= 2.13"]
    assert len(notes["nvfp4-quantize-kernel=split"]) == 1 and "two kernels" in notes["nvfp4-quantize-kernel=split"][0]
    assert notes["fp8"] == []
    assert main([*job[:-2], "--precision", "fp4"]) == 0  # the table prints it too
    assert "NVFP4 casts: one kernel" in capsys.readouterr().out


def test_routed_experts_cast_in_one_grouped_kernel_in_both_releases() -> None:
    """Through ``moe_mlp_time``: the routed experts' operands cost 5.125 B per element under fused and split (their
    token segments are 128-aligned, so TE >= 2.12's grouped one-kernel cast runs); only the shared expert's (a plain
    linear) pays split's extra bf16 read."""
    cluster = make_cluster(GB200, 8)
    layout = ParallelLayout(ep=8, etp=1, mbs=1, recompute="none")
    qwen, dsv3 = load_model("qwen3-30b-a3b"), load_model("deepseek-v3")
    fp4, split, bf16 = _t(precision="fp4"), _t(precision="fp4", nvfp4_quantize_kernel="split"), _t()
    assert qwen.shared_ffn in (None, 0) and dsv3.shared_ffn
    assert float(moe_mlp_time(qwen, cluster, split, layout).elementwise_s) == pytest.approx(
        float(moe_mlp_time(qwen, cluster, fp4, layout).elementwise_s), rel=1e-12)
    # the routed operands: fc1 input (te x h) + gradient (te x 2 fe), fc2 input (te x fe) + gradient (te x h)
    h, fe, te = qwen.hidden_size, qwen.moe_ffn, 8192 * qwen.moe_router_topk
    local = qwen.num_experts / layout.ep
    operands = te * (2 * h + 3 * fe)
    pads = permute.permute_bytes(fp4, te * h, local) - permute.permute_bytes(bf16, te * h, local)
    extra = (moe_mlp_time(qwen, cluster, fp4, layout).elementwise_s
             - moe_mlp_time(qwen, cluster, bf16, layout).elementwise_s)
    assert float(extra) == pytest.approx((5.125 * operands + pads) / compute.hbm_rate(cluster))
    shared = (dense_mlp_time(dsv3, cluster, split, layout, ffn=dsv3.shared_ffn).elementwise_s
              - dense_mlp_time(dsv3, cluster, fp4, layout, ffn=dsv3.shared_ffn).elementwise_s)
    assert float(shared) > 0
    assert float(moe_mlp_time(dsv3, cluster, split, layout).elementwise_s
                 - moe_mlp_time(dsv3, cluster, fp4, layout).elementwise_s) == pytest.approx(float(shared))
