"""The flash-attention kernel generation (``TrainingSpec.attention_kernel``, ``--knob attention-kernel=fa2``).

By hand from ecosystem.md 4.4, "Flash-attention-2 (hdim 128, seq 8192): H200 329 TFLOP/s, GB200 374, A100 (hdim 64)
180": under ``fa2`` the flash-attention forward takes score_flops / rate, with rate = the measured FLOP/s scaled to
the GPU's own bf16 peak within the architecture (H100 has the H200's 989 TFLOP/s peak: 329 TFLOP/s; B200, 2,250
against GB200's 2,500: 374 x 2250 / 2500 = 336.6 TFLOP/s). ``current`` (the default) keeps the preset's fitted
``attention_frac``, so nothing moves when the knob is not set. It is not a Megatron-LM flag: launch files never
write it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.cli.options import knob_fields
from paraplan.errors import SpecError
from paraplan.estimate.time import compute
from paraplan.estimate.time.layer import attention_layer_time
from paraplan.estimator import estimate, memory_knobs_of
from paraplan.launch.megatron import megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec, training_dict

LLAMA8 = load_model("llama3-8b")  # h 4096, 32 heads of 128, 8 KV groups
SEQ = 16384


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=SEQ, global_batch_size=64, **kw)  # type: ignore[arg-type]


def _score_flops(tp: int, cp: int) -> float:
    # causal: 2 FLOP/MAC x 2 GEMMs x 1/2 = 2 x b s^2 (a x hd) / (c t), b = 1
    return 2.0 * SEQ ** 2 * (32 * 128) / (cp * tp)


@pytest.mark.parametrize(("gpu", "rate_flops_per_s"), [
    ("h200-141gb", 329e12), ("h100-80gb", 329e12), ("gb200", 374e12), ("b200", 374e12 * 2250 / 2500),
    ("a100-80gb", 180e12),
])
def test_fa2_forward_at_the_measured_rate(gpu: str, rate_flops_per_s: float) -> None:
    cluster = make_cluster(load_gpu(gpu), 8)
    flops = _score_flops(tp=2, cp=1)
    assert float(compute.flash_attention_fwd_s(cluster, flops, kernel="fa2")) == pytest.approx(
        flops / rate_flops_per_s, rel=1e-12)


def test_fa2_in_the_attention_layer() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    layout = ParallelLayout(tp=2, mbs=1, recompute="none")
    fa2 = attention_layer_time(LLAMA8, cluster, _t(attention_kernel="fa2"), layout)
    assert float(fa2.attn_fwd_s) == pytest.approx(_score_flops(tp=2, cp=1) / 329e12, rel=1e-12)
    cur = attention_layer_time(LLAMA8, cluster, _t(), layout)
    # today's preset (its fitted attention_frac of 989 TFLOP/s) is faster; the GEMMs do not change
    frac = load_gpu("h100-80gb").efficiency.attention_frac
    assert float(cur.attn_fwd_s) == pytest.approx(_score_flops(tp=2, cp=1) / (989e12 * frac), rel=1e-12)
    assert float(cur.attn_fwd_s) < float(fa2.attn_fwd_s)
    assert float(fa2.gemm_fwd_s) == float(cur.gemm_fwd_s)


def test_fa2_keeps_the_unfused_backend_as_it_is() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    layout = ParallelLayout(tp=2, mbs=1, recompute="none")
    a = attention_layer_time(LLAMA8, cluster, _t(attention_backend="unfused"), layout)
    b = attention_layer_time(LLAMA8, cluster, _t(attention_backend="unfused", attention_kernel="fa2"), layout)
    assert float(a.attn_fwd_s) == float(b.attn_fwd_s)


def test_default_is_current_and_moves_nothing() -> None:
    assert _t().attention_kernel == "current"
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    layout = ParallelLayout(tp=2, dp=4, mbs=1, recompute="none")
    plain = estimate(LLAMA8, cluster, _t(), layout)
    same = estimate(LLAMA8, cluster, _t(attention_kernel="current"), layout)
    slow = estimate(LLAMA8, cluster, _t(attention_kernel="fa2"), layout)
    assert float(same.time.step_s) == float(plain.time.step_s)
    assert float(slow.time.step_s) > float(plain.time.step_s)
    assert "attention_kernel" not in training_dict(_t())  # ids made from the spec stay the same
    assert memory_knobs_of(_t(attention_kernel="fa2")) == {"attention_kernel": "fa2"}


def test_bad_values_one_line() -> None:
    with pytest.raises(SpecError, match="attention_kernel must be one of current, fa2, got 'fa3'"):
        _t(attention_kernel="fa3")
    with pytest.raises(SpecError, match="attention_kernel fa2 has no FP8 attention"):
        _t(precision="fp8", fp8_dot_product_attention=True, attention_kernel="fa2")
    mi300x = make_cluster(load_gpu("mi300x"), 8)
    with pytest.raises(SpecError, match=r"no measured FlashAttention-2 rate for GPU 'mi300x' \(arch cdna3\)"):
        compute.flash_attention_fwd_s(mi300x, 1e12, kernel="fa2")


def test_knob_parses() -> None:
    assert knob_fields(["attention-kernel=fa2"], "bf16") == {"attention_kernel": "fa2"}
    assert knob_fields(["--attention-kernel=current"], "bf16") == {"attention_kernel": "current"}
    assert knob_fields(["grad-reduce-in-bf16", "attention-kernel=fa2"], "bf16") == {
        "grad_reduce_in_bf16": True, "attention_kernel": "fa2"}
    for bad, got in (("attention-kernel", "no value"), ("attention-kernel=flash", "'flash'")):
        with pytest.raises(SpecError, match=f"--knob attention-kernel must be one of current, fa2, got {got}"):
            knob_fields([bad], "bf16")


CLI = ["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--tp", "2", "--seq-len",
       str(SEQ), "--gbs", "64", "--mbs", "1", "--recompute", "none", "--format", "json"]


def test_cli_knob_slows_attention(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(CLI) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*CLI, "--knob", "attention-kernel=fa2"]) == 0
    fa2 = json.loads(capsys.readouterr().out)
    assert fa2["config"]["memory_knobs"] == {"attention_kernel": "fa2"}
    assert fa2["time"]["step_s"] > base["time"]["step_s"]
    assert fa2["memory"]["peak_bytes"] == base["memory"]["peak_bytes"]
    assert main([*CLI, "--knob", "attention-kernel=fa3"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --knob attention-kernel must be one of current, fa2, got 'fa3'"


def test_not_written_into_launch_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = ParallelLayout(tp=2, dp=4, mbs=1, recompute="none")
    assert megatron_args(LLAMA8, layout, _t(attention_kernel="fa2")) == megatron_args(LLAMA8, layout, _t())
    args = ["launch", *CLI[1:-2], "--target", "megatron", "--out", str(tmp_path / "run"),
            "--knob", "attention-kernel=fa2"]
    assert main(args) == 0, capsys.readouterr().err
    text = (tmp_path / "run" / "megatron_args.sh").read_text()
    assert "attention-kernel" not in text and "fa2" not in text


SHARED = Path(__file__).resolve().parents[3] / "shared" / "calibration"


@pytest.mark.skipif(not (SHARED / "published_runs.csv").exists(), reason="needs ../shared/calibration")
def test_calibration_rows_run_their_source_kernel() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from calibration import case_training
    from published_cases import load_cases

    cases, _ = load_cases("published")
    kernels = {c.source: c.attention_kernel for c in cases}
    assert kernels["NeMo perf"] == "fa2"  # NeMo 24.03.01, Transformer Engine 1.4 (SOURCES.md section 10)
    assert kernels["Megatron-Bridge"] == "current"  # 2025-26 containers: the rows the presets were fitted on
    assert {k for s, k in kernels.items() if s not in ("NeMo perf",)} == {"current"}
    nemo = next(c for c in cases if c.source == "NeMo perf")
    assert case_training(nemo, "flash").attention_kernel == "fa2"  # what calibration and cross_validate run
