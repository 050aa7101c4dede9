"""Golden values of the memory knobs NVIDIA's recipes set, by hand from the Megatron-LM code each formula cites.

Per parameter (Megatron-LM main @ d98e8a6):
- grad buffer (arguments.py validate_args + param_and_grad_buffer.py group_params_for_buffers): fp32 4 B by default
  under bf16/fp8; ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16`` -> bf16 2 B.
- optimizer (optimizer/__init__.py, distrib_optimizer.py, optimizer_config.py): fp32 master 4 + m 4 + v 4 = 12 B;
  precision-aware: TE FusedAdam holds m, v in their dtypes and, when ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``,
  the master weight (fp32 as a 16-bit remainder of the bf16 param: 2 B; fp16: 2 B); otherwise MCore's fp32 main
  params (4 B). CPU offload (hybrid_optimizer.py): 12 B x (1 - fraction) stay on the GPU.
- FP8 weights (TE): a rowwise and a columnwise FP8 copy, 1 B each plus scales (MXFP8: 1 B per 32 elements);
  ``--fp8-param-gather``: the rowwise copy is the parameter, no bf16 copy.
"""

from __future__ import annotations

import pytest

from paraplan.errors import SpecError
from paraplan.estimate.memory import fp8_cache_bytes_per_param, weight_bytes_per_param
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec, main_grad_bytes, optimizer_bytes_per_param

GiB = 2**30


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "grad_b"), [
    ({}, 4.0), ({"grad_reduce_in_bf16": True}, 2.0),
    ({"main_grads_dtype": "bf16", "use_precision_aware_optimizer": True}, 2.0),
    ({"precision": "fp8", "grad_reduce_in_bf16": True}, 2.0), ({"precision": "fp16"}, 2.0),
])
def test_grad_buffer_bytes(kw: dict[str, object], grad_b: float) -> None:
    assert main_grad_bytes(_t(**kw)) == grad_b


PA = {"use_precision_aware_optimizer": True}


@pytest.mark.parametrize(("kw", "opt_b"), [
    ({}, 12.0),
    ({"precision": "fp16"}, 16.0),                                               # + fp32 main grad
    (PA, 2.0 + 4.0 + 4.0),                                                       # remainders + fp32 m, v
    ({**PA, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2.0 + 2.0 + 2.0),
    ({**PA, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "store_param_remainders": False}, 4.0 + 2 + 2),
    ({**PA, "main_params_dtype": "fp16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp16"}, 2.0 + 1.0 + 2.0),
    # FP8 current scaling with fp32 main params: MCore keeps fp32 main params (no_fp8_or_ds_fp8 is False)
    ({**PA, "precision": "fp8", "fp8_recipe": "tensorwise", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
     4.0 + 2.0 + 2.0),
    # delayed scaling: TE holds the master weights (remainders of the bf16 param)
    ({**PA, "precision": "fp8", "fp8_recipe": "delayed", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
     2.0 + 2.0 + 2.0),
    ({**PA, "precision": "fp8", "fp8_param_gather": True}, 4.0 + 4.0 + 4.0),  # FP8 params: no bf16 bits to share
    ({**PA, "optimizer_cpu_offload": True}, 0.0),                               # Megatron's CLI default fraction 1.0
    ({**PA, "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.25}, 9.0),
])
def test_optimizer_bytes(kw: dict[str, object], opt_b: float) -> None:
    assert optimizer_bytes_per_param(_t(**kw)) == pytest.approx(opt_b)


@pytest.mark.parametrize(("kw", "weights_b", "cache_b"), [
    ({}, 2.0, 0.0),
    ({"precision": "fp8"}, 2.0, 2.0),
    ({"precision": "fp8", "fp8_recipe": "tensorwise", "fp8_param_gather": True}, 1.0, 1.0),
    ({"precision": "fp8", "fp8_recipe": "mxfp8"}, 2.0, 2.0 * (1 + 1 / 32)),
    ({"precision": "fp8", "fp8_recipe": "mxfp8", "fp8_param_gather": True}, 1 + 1 / 32, 1 + 1 / 32),
])
def test_fp8_weight_bytes(kw: dict[str, object], weights_b: float, cache_b: float) -> None:
    t = _t(**kw)
    assert weight_bytes_per_param(t) == pytest.approx(weights_b)
    assert fp8_cache_bytes_per_param(t) == pytest.approx(cache_b)


@pytest.mark.parametrize(("kw", "message"), [
    ({"exp_avg_dtype": "int4"}, "exp_avg_dtype must be one of fp32, fp16, bf16, fp8"),
    ({"fp8_recipe": "nvfp4"}, "fp8_recipe must be one of delayed, tensorwise, mxfp8, blockwise"),
    ({"optimizer_offload_fraction": 1.5}, "optimizer_offload_fraction must be a number from 0 to 1"),
    ({"optimizer_offload_fraction": float("nan")}, "optimizer_offload_fraction must be a number from 0 to 1"),
    ({"fp8_param_gather": True}, "fp8_param_gather (--fp8-param-gather) needs precision fp8"),
    ({"optimizer_cpu_offload": True}, "needs use_precision_aware_optimizer"),
])
def test_bad_knobs_one_line(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=None) as err:
        _t(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


# The concrete case of issue 18: Llama-3-70B on 64 H100, FP8, TP4 PP8 VP5, mbs 1, GBS 256 (Bridge's
# llama3_70b_pretrain_64gpu_h100_fp8cs_config: grad_reduce_in_fp32=False, fp8_param_gather=True, tensorwise)
LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
LAYOUT = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none")


def _stage0(training: TrainingSpec):  # type: ignore[no-untyped-def]
    est = estimate(LLAMA, make_cluster(H100, 64, 8), training, LAYOUT)
    return est.stages[0]


def test_llama3_70b_bf16_grads_halve_the_grad_buffer() -> None:
    base = _stage0(_t(precision="fp8", fp8_recipe="tensorwise"))
    knob = _stage0(_t(precision="fp8", fp8_recipe="tensorwise", grad_reduce_in_bf16=True))
    p = base.params.total
    assert float(base.memory.grads_bytes) == pytest.approx(4.0 * p)
    assert float(knob.memory.grads_bytes) == pytest.approx(2.0 * p)
    saved = float(base.memory.total_bytes - knob.memory.total_bytes)
    assert saved == pytest.approx(2.0 * p)
    assert saved / GiB > 4.0  # stage 0 holds 2.4B parameters: about 4.5 GiB less


def test_llama3_70b_fp8_param_gather_drops_the_bf16_copy() -> None:
    base = _stage0(_t(precision="fp8", fp8_recipe="tensorwise", grad_reduce_in_bf16=True))
    knob = _stage0(_t(precision="fp8", fp8_recipe="tensorwise", grad_reduce_in_bf16=True, fp8_param_gather=True))
    p = base.params.total
    assert float(knob.memory.weights_bytes) == pytest.approx(1.0 * p)
    assert float(knob.other.fp8_weight_cache_bytes) == pytest.approx(1.0 * p)
    assert float(base.memory.total_bytes - knob.memory.total_bytes) == pytest.approx(2.0 * p)


def test_precision_aware_bf16_moments_shard_over_dp() -> None:
    base = _stage0(_t(precision="fp8", fp8_recipe="delayed"))
    knob = _stage0(_t(precision="fp8", fp8_recipe="delayed", use_precision_aware_optimizer=True,
                      exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    p = base.params.total  # dense model: the distributed optimizer shards over DP x CP = 2
    assert float(base.memory.optimizer_bytes) == pytest.approx(12.0 * p / 2)
    assert float(knob.memory.optimizer_bytes) == pytest.approx(6.0 * p / 2)


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--use-distributed-optimizer").split()


def test_knobs_read_from_megatron_args() -> None:
    flags = read_flags([*FLAGS, "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--fp8-param-gather",
                        "--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                        "--exp-avg-sq-dtype", "fp8", "--main-params-dtype", "fp16", "--optimizer-cpu-offload",
                        "--optimizer-offload-fraction", "0.5"])
    t = flags.training_fields
    assert (t["fp8_recipe"], t["fp8_param_gather"], t["grad_reduce_in_bf16"]) == ("mxfp8", True, True)
    assert (t["exp_avg_dtype"], t["exp_avg_sq_dtype"], t["main_params_dtype"]) == ("bf16", "fp8", "fp16")
    assert (t["optimizer_cpu_offload"], t["optimizer_offload_fraction"]) == (True, 0.5)
    assert not flags.unknown_flags
    # Megatron's own assert: FP8 param gather with CPU offload needs delayed scaling
    assert [c for c, _ in flags.problems] == ["OPTIMIZER_CPU_OFFLOAD_FP8_RECIPE"]


def test_knob_defaults_not_set_by_reader() -> None:
    t = read_flags(FLAGS).training_fields
    assert not {"grad_reduce_in_bf16", "fp8_param_gather", "optimizer_cpu_offload", "exp_avg_dtype"} & set(t)


def test_megatron_asserts_on_knobs_are_problems() -> None:
    codes = {c for c, _ in read_flags([*FLAGS, "--optimizer-cpu-offload"]).problems}
    assert "OPTIMIZER_CPU_OFFLOAD_NEEDS_PRECISION_AWARE" in codes
    no_dist = [f for f in FLAGS if f != "--use-distributed-optimizer"]
    codes = {c for c, _ in read_flags([*no_dist, "--fp8-format", "hybrid", "--fp8-param-gather"]).problems}
    assert "FP8_PARAM_GATHER_NEEDS_DIST_OPT" in codes


def test_bad_knob_value_from_megatron_args_one_line() -> None:
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, "--exp-avg-dtype", "int8"])
    assert str(err.value) == "--exp-avg-dtype must be one of fp32, fp16, bf16, fp8, got 'int8'"


def test_knobs_written_back_and_read_again() -> None:
    training = _t(precision="fp8", fp8_recipe="delayed", fp8_param_gather=True, grad_reduce_in_bf16=True,
                  use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16",
                  optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    words = argv(megatron_args(LLAMA, layout, training), resolve=True)
    for flag in ("--grad-reduce-in-bf16", "--fp8-param-gather", "--use-precision-aware-optimizer",
                 "--optimizer-cpu-offload"):
        assert flag in words
    assert words[words.index("--fp8-recipe") + 1] == "delayed"
    assert words[words.index("--exp-avg-dtype") + 1] == "bf16"
    flags = read_flags(words)
    assert not flags.problems
    back = flags.training_fields
    for key in ("fp8_recipe", "fp8_param_gather", "grad_reduce_in_bf16", "use_precision_aware_optimizer",
                "exp_avg_dtype", "exp_avg_sq_dtype", "optimizer_cpu_offload", "optimizer_offload_fraction"):
        assert back[key] == getattr(training, key), key


def test_default_training_writes_no_knob_flags() -> None:
    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)
    words = argv(megatron_args(LLAMA, layout, _t()), resolve=True)
    assert not {"--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype",
                "--optimizer-cpu-offload", "--optimizer-offload-fraction", "--fp8-param-gather"} & set(words)


def test_launch_refuses_what_megatron_asserts() -> None:
    from paraplan.launch.megatron import launch_violations

    layout = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                            distributed_optimizer=False, overlap_param_gather=False)
    gather = _t(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    assert "FP8_PARAM_GATHER_NEEDS_DIST_OPT" in {c for c, _ in launch_violations(LLAMA, layout, gather)}
    offload = _t(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True,
                 use_precision_aware_optimizer=True, optimizer_cpu_offload=True)
    assert "OPTIMIZER_CPU_OFFLOAD_FP8_RECIPE" in {c for c, _ in launch_violations(LLAMA, LAYOUT, offload)}
    assert not launch_violations(LLAMA, LAYOUT, _t(precision="fp8", fp8_param_gather=True))


CLI = ["estimate", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "8",
       "--vp", "5", "--seq-len", "8192", "--gbs", "256", "--mbs", "1", "--precision", "fp8", "--recompute", "none",
       "--format", "json"]


def test_cli_knobs_lower_stage0(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    assert main(CLI) == 0
    base = json.loads(capsys.readouterr().out)["memory"]["per_stage"][0]
    assert main([*CLI, "--knob", "grad-reduce-in-bf16", "--knob", "fp8-recipe=tensorwise",
                 "--knob", "fp8-param-gather"]) == 0
    knob = json.loads(capsys.readouterr().out)["memory"]["per_stage"][0]
    assert knob["grads_bytes"] == pytest.approx(base["grads_bytes"] / 2)
    assert knob["weights_bytes"] == pytest.approx(base["weights_bytes"] / 2)


@pytest.mark.parametrize(("extra", "message"), [
    (["--knob", "exp-avg-dtype=int4"], "--exp-avg-dtype must be one of fp32, fp16, bf16, fp8, got 'int4'"),
    (["--knob", "foo"], "--knob foo: not a knob; one of"),
    (["--knob", "optimizer-cpu-offload"], "must be used in conjunction with `--use-precision-aware-optimizer`"),
    (["--knob", "optimizer-offload-fraction=x"], "--optimizer-offload-fraction 'x' is not a number"),
])
def test_cli_bad_knob_one_line(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    assert main([*CLI, *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_fp8_knob_needs_fp8(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    bf16 = [w if w != "fp8" else "bf16" for w in CLI]
    assert main([*bf16, "--knob", "fp8-param-gather"]) == 1
    assert capsys.readouterr().err.strip() == "error: --knob fp8-param-gather needs --precision fp8"


def test_launch_writes_the_knobs(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from paraplan.cli import main

    args = ["launch", *CLI[1:-2], "--target", "megatron", "--out", str(tmp_path / "run"),
            "--knob", "grad-reduce-in-bf16", "--knob", "use-precision-aware-optimizer",
            "--knob", "exp-avg-dtype=bf16", "--knob", "exp-avg-sq-dtype=bf16"]
    assert main(args) == 0, capsys.readouterr().err
    text = (tmp_path / "run" / "megatron_args.sh").read_text()
    for words in ("--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                  "--exp-avg-sq-dtype bf16"):
        assert words in text


def test_dp_time_moves_fewer_bytes() -> None:
    """Time, where trivial: the gradient reduce-scatter moves main_grad_bytes per parameter (bf16: half) and the
    parameter all-gather FP8 bytes with --fp8-param-gather (estimate/time/dp.py dp_times)."""
    from dataclasses import replace

    lay = replace(LAYOUT, overlap_grad_reduce=False, overlap_param_gather=False)

    def dp_s(training: TrainingSpec) -> float:
        est = estimate(LLAMA, make_cluster(H100, 64, 8), training, lay)
        return float(est.time.as_dict()["exposed_comm_s"]["dp"])

    base = dp_s(_t(precision="fp8", fp8_recipe="tensorwise"))
    bf16 = dp_s(_t(precision="fp8", fp8_recipe="tensorwise", grad_reduce_in_bf16=True))
    both = dp_s(_t(precision="fp8", fp8_recipe="tensorwise", grad_reduce_in_bf16=True, fp8_param_gather=True))
    assert both < bf16 < base


def test_cli_shows_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    knobs = ["--knob", "grad-reduce-in-bf16", "--knob", "fp8-recipe=tensorwise"]
    assert main([*CLI, *knobs]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert cfg["memory_knobs"] == {"grad_reduce_in_bf16": True, "fp8_recipe": "tensorwise"}
    assert main(CLI) == 0
    assert "memory_knobs" not in json.loads(capsys.readouterr().out)["config"]
    assert main([*CLI[:-2], *knobs]) == 0
    assert "memory knobs: --grad-reduce-in-bf16 --fp8-recipe tensorwise" in capsys.readouterr().out


def test_launch_bridge_files_carry_the_knobs(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from paraplan.cli import main

    base = ["launch", *CLI[1:-2], "--target", "bridge", "--out"]
    assert main([*base, str(tmp_path / "a"), "--knob", "grad-reduce-in-bf16"]) == 0
    assert "does not carry the memory knobs" not in capsys.readouterr().out
    lines = (tmp_path / "a/bridge_overrides.txt").read_text(encoding="utf-8").splitlines()
    assert "ddp.grad_reduce_in_fp32=false" in lines
    assert main([*base, str(tmp_path / "b")]) == 0
    assert "ddp.grad_reduce_in_fp32=true" in (tmp_path / "b/bridge_overrides.txt").read_text(encoding="utf-8")


def test_plan_searches_with_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    job = ["plan", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192",
           "--gbs", "256", "--precision", "fp8", "--tp", "4", "--pp", "8", "--vp", "5", "--mbs", "1",
           "--recompute", "none", "--dp-variant", "fsdp", "--top", "1", "--format", "json"]  # one variant: same layout
    assert main(job) == 0
    (plain,) = json.loads(capsys.readouterr().out)["candidates"]
    assert main([*job, "--knob", "grad-reduce-in-bf16"]) == 0
    (knob,) = json.loads(capsys.readouterr().out)["candidates"]
    assert knob["config"]["memory_knobs"] == {"grad_reduce_in_bf16": True} and "memory_knobs" not in plain["config"]
    for a, b in zip(plain["memory"]["per_stage"], knob["memory"]["per_stage"], strict=True):
        assert b["grads_bytes"] == pytest.approx(a["grads_bytes"] / 2)


def test_knob_line_is_written_as_megatron_takes_it() -> None:
    from paraplan.cli.render import knob_words

    t = TrainingSpec(seq_len=4096, global_batch_size=64, cuda_graph_impl="transformer_engine",
                     cuda_graph_modules=("attn", "moe_router"), gradient_accumulation_fusion=False)
    words = knob_words(t)
    assert "--cuda-graph-modules attn moe_router" in words and "(" not in words
    assert words.endswith("--no-gradient-accumulation-fusion")  # a store-false flag takes no value
    # the words read back as the same knobs
    back = read_flags(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                       "--seq-length", "4096", "--max-position-embeddings", "4096", *words.split()])
    assert back.training_fields["cuda_graph_modules"] == ("attn", "moe_router")
    assert back.training_fields["gradient_accumulation_fusion"] is False


@pytest.mark.parametrize(("knob", "text"), [
    ("cuda-graph-impl", "--cuda-graph-impl must be one of none, local, transformer_engine, full_iteration, "
                        "got no value"),
    ("moe-hybridep-num-sms=\u00b2", "--moe-hybridep-num-sms must be an integer from 1 to 1024, got '\u00b2'"),
    ("moe-hybridep-num-sms", "--moe-hybridep-num-sms must be an integer from 1 to 1024, got no value"),
    ("cpu-offloading-num-layers=\u00b2", "--cpu-offloading-num-layers"),
])
def test_bad_knob_values_are_one_line(knob: str, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    args = ["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--knob", "moe-token-dispatcher-type=flex", "--knob", knob]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text in err, err
