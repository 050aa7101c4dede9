"""Golden values of the fused cross entropy's memory, by hand from the code each formula cites.

- Unfused (``tensor_parallel/cross_entropy.py`` ``calculate_logits_max``: ``vocab_parallel_logits.float()``, the
  softmax saved) and MCore's fused ``native`` loss: the bf16 logits 2 B plus the fp32 softmax 4 B per logit.
- Transformer Engine's fused loss (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``; Megatron-Bridge's
  perf recipes): ``cross_entropy_forward`` writes the gradient into the bf16 logits and returns them for backward
  (TE <= 2.17, the calibration rows' containers): 2 B per logit.
Llama-3-70B, TP 1, seq 8192, mbs 2: T = 16,384 tokens, padded vocabulary 128,256 (a multiple of 128).
"""

from __future__ import annotations

import pytest

from paraplan.errors import LayoutError
from paraplan.estimate.activations import ActivationContext, output_bytes
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec

LLAMA = load_model("llama3-70b")
T = 8192 * 2
V = 128_256
NORMS = 2 * 2 * T * 8192  # final-norm input and output, bf16


def _ctx(te: bool) -> ActivationContext:
    return ActivationContext(seq_len=8192, mbs=2, tp=1, cp=1, sp=False, ep=1, etp=1, recompute_code=0,
                             recompute_modules=(), recompute_num_layers=1, fp8=True, te_cross_entropy=te)


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, precision="fp8", **kw)  # type: ignore[arg-type]


def test_unfused_loss_keeps_bf16_logits_and_the_fp32_softmax() -> None:
    assert output_bytes(LLAMA, _ctx(False), padded_vocab=V) == NORMS + 6 * T * V == 13_144_948_736


def test_te_fused_loss_keeps_only_the_bf16_logits() -> None:
    assert output_bytes(LLAMA, _ctx(True), padded_vocab=V) == NORMS + 2 * T * V == 4_739_563_520


def test_the_last_stage_drops_the_fp32_copy_and_its_fragmentation_share() -> None:
    cluster = make_cluster(load_gpu("gb200"), 64)
    layout = ParallelLayout(tp=1, pp=1, dp=64, mbs=2, recompute="none", fsdp=True)
    base = dict(fp8_recipe="tensorwise", fp8_param_gather=True, grad_reduce_in_bf16=True, fsdp_double_buffer=True,
                cpu_offloading_num_layers=40)
    off = estimate(LLAMA, cluster, _t(**base), layout)
    native = estimate(LLAMA, cluster, _t(**base, cross_entropy_loss_fusion=True), layout)
    te = estimate(LLAMA, cluster, _t(**base, cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te"), layout)
    assert native.peak_bytes == off.peak_bytes  # MCore's native fusion keeps the fp32 softmax too
    # 4 B x T x V fewer logits bytes, and the 5% fragmentation allowance on them
    assert off.peak_bytes - te.peak_bytes == pytest.approx(4 * T * V * 1.05, rel=1e-9)


def test_impl_without_the_fusion_changes_nothing() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 64)
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    assert estimate(LLAMA, cluster, _t(cross_entropy_fusion_impl="te"), layout).peak_bytes == \
        estimate(LLAMA, cluster, _t(), layout).peak_bytes


FLAGS = ["--num-layers", "80", "--hidden-size", "8192", "--ffn-hidden-size", "28672", "--num-attention-heads", "64",
         "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
         "--max-position-embeddings", "8192", "--swiglu", "--normalization", "RMSNorm",
         "--untie-embeddings-and-output-weights",
         "--disable-bias-linear", "--position-embedding-type", "rope", "--vocab-size", "128256",
         "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "8", "--micro-batch-size", "1",
         "--global-batch-size", "256", "--bf16", "--use-distributed-optimizer"]


def test_read_from_megatron_args_and_megatron_rejects_the_te_fusion() -> None:
    native = read_flags([*FLAGS, "--cross-entropy-loss-fusion"])
    assert native.training_fields["cross_entropy_loss_fusion"] is True
    assert "cross_entropy_fusion_impl" not in native.training_fields and not native.problems
    te = read_flags([*FLAGS, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"])
    assert te.training_fields["cross_entropy_fusion_impl"] == "te"
    assert [c for c, _ in te.problems] == ["TE_CROSS_ENTROPY_FUSION"]  # arguments.py validate_args asserts
    assert not read_flags([*FLAGS, "--cross-entropy-fusion-impl", "te"]).problems  # no fusion: the impl is unused


def test_bad_impl_from_megatron_args_is_one_line() -> None:
    from paraplan.errors import SpecError

    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, "--cross-entropy-fusion-impl", "apex"])
    assert str(err.value) == "--cross-entropy-fusion-impl must be one of native, te, got 'apex'"


def test_written_into_launch_files_and_read_back() -> None:
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    training = TrainingSpec(seq_len=8192, global_batch_size=256, cross_entropy_loss_fusion=True)
    words = argv(megatron_args(LLAMA, layout, training), resolve=True)
    assert "--cross-entropy-loss-fusion" in words and "--cross-entropy-fusion-impl" not in words
    assert read_flags(words).training_fields["cross_entropy_loss_fusion"] is True
    default = argv(megatron_args(LLAMA, layout, TrainingSpec(seq_len=8192, global_batch_size=256)), resolve=True)
    assert "--cross-entropy-loss-fusion" not in default


def test_launch_refuses_the_te_fusion_with_megatrons_words() -> None:
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    te = TrainingSpec(seq_len=8192, global_batch_size=256, cross_entropy_loss_fusion=True,
                      cross_entropy_fusion_impl="te")
    # Megatron-LM's validate_args asserts; Megatron-Core only warns: the rule is the Megatron-LM launch files'
    assert "TE_CROSS_ENTROPY_FUSION" not in {c for c, _ in launch_violations(LLAMA, layout, te)}
    with pytest.raises(LayoutError, match="disabled due to stability issues") as err:
        megatron_args(LLAMA, layout, te)
    assert err.value.reason == "TE_CROSS_ENTROPY_FUSION"
    assert "--cross-entropy-fusion-impl" in argv(megatron_args(LLAMA, layout, te, megatron_lm=False))


def test_bridge_recipes_carry_the_fusion_and_their_kernel() -> None:
    from paraplan.recipes.catalogue import bridge_recipes
    from paraplan.recipes.knobs import training_knobs

    recipes = {r.alias: r for r in bridge_recipes()}
    te = training_knobs(recipes["llama3-70b-gb200-fp8cs-64"], "fp8")
    assert (te["cross_entropy_loss_fusion"], te["cross_entropy_fusion_impl"]) == (True, "te")
    natives = [r for r in recipes.values() if r.get("cross_entropy_fusion_impl") == "native"]
    assert natives and all(training_knobs(r, "bf16")["cross_entropy_fusion_impl"] == "native" for r in natives)


def test_cli_knob_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    job = ["estimate", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "8",
           "--vp", "5", "--seq-len", "8192", "--gbs", "256", "--mbs", "1", "--recompute", "none", "--precision", "fp8",
           "--knob", "grad-reduce-in-bf16", "--format", "json"]
    assert main([*job, "--knob", "cross-entropy-loss-fusion"]) == 0
    knobs = json.loads(capsys.readouterr().out)["config"]["memory_knobs"]
    assert knobs == {"grad_reduce_in_bf16": True, "cross_entropy_loss_fusion": True}
    # estimate takes TE's fusion (Megatron-Bridge runs it); only Megatron-LM launch files refuse it
    assert main([*job, "--knob", "cross-entropy-loss-fusion", "--knob", "cross-entropy-fusion-impl=te"]) == 0
    knobs = json.loads(capsys.readouterr().out)["config"]["memory_knobs"]
    assert knobs["cross_entropy_fusion_impl"] == "te"
