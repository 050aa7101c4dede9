"""Megatron-LM's rules on the CUDA-graph, offloading and optimizer knobs, in launch, check and plan's search.

Each combination below is one Megatron-LM refuses (megatron/core/transformer/transformer_config.py
``__post_init__``, megatron/training/arguments.py ``validate_args``, megatron/core/optimizer/optimizer_config.py
``__post_init__``); launch must refuse it in one line, check must report it, and plan must not rank a layout
that breaks it. The Megatron-LM run of the written files is test_megatron_validate.py (the knob plans of matrix.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import paraplan.cli.check  # noqa: F401  (registers the command)
from paraplan.cli import main
from paraplan.errors import LayoutError, NoFeasiblePlanError, SpecError
from paraplan.launch.megatron import argv, environment, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.search import SearchSpace, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words
from paraplan.specs.training import TrainingSpec

from .matrix import plan_spec

LLAMA = load_model("llama3-8b")
QWEN = load_model("qwen3-30b-a3b")
H100 = load_gpu("h100-80gb")
SPECS = Path(__file__).parents[2] / "src/paraplan/specs"


def _t(**kw: Any) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=64, **kw)


DENSE = ParallelLayout(tp=2, dp=4, recompute="none")
MOE = ParallelLayout(ep=8, etp=1, dp=16, recompute="none")


@pytest.mark.parametrize(("model", "layout", "training", "code", "words"), [
    (LLAMA, DENSE, _t(cpu_offloading_num_layers=4, cuda_graph_impl="transformer_engine"),
     "CUDA_GRAPH_CPU_OFFLOADING", "CUDA graphs not supported with CPU offloading."),
    (QWEN, MOE, _t(moe_expert_capacity_factor=1.0, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=("moe_router", "moe_preprocess")),
     "CUDA_GRAPH_MOE_PREPROCESS_SYNC", "moe_preprocess cuda graph is not supported when there are DtoH copies"),
    (QWEN, MOE, _t(moe_expert_capacity_factor=1.0, cuda_graph_impl="local", cuda_graph_modules=("moe_router",)),
     "CUDA_GRAPH_MOE_PREPROCESS_SYNC", "moe_preprocess cuda graph is not supported"),  # local adds moe_preprocess
    (QWEN, replace(MOE, recompute="selective", recompute_modules=("moe",)),
     _t(cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_router",)),
     "CUDA_GRAPH_MOE_RECOMPUTE", "moe recompute is not supported with moe_router CUDA graph"),
    (LLAMA, DENSE, _t(fine_grained_activation_offloading=True, offload_modules=("core_attn",),
                      cuda_graph_impl="local", cuda_graph_modules=("attn",)),
     "CUDA_GRAPH_LOCAL_OFFLOAD_MODULES", "Unsupported offload_modules: ['core_attn']."),
    (QWEN, MOE, _t(fine_grained_activation_offloading=True, offload_modules=("expert_fc1",), cuda_graph_impl="local"),
     "CUDA_GRAPH_LOCAL_OFFLOAD_WHOLE_LAYER", "not supported with whole-layer CUDA graph capture."),
    (QWEN, replace(MOE, schedule="combined_1f1b"),
     _t(delay_wgrad_compute=True, cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn",),
        gradient_accumulation_fusion=False),
     "CUDA_GRAPH_DELAY_WGRAD_NEEDS_GRAD_ACC_FUSION", "CUDA graph with delay_wgrad_compute requires "
                                                    "gradient_accumulation_fusion"),
    (QWEN, replace(MOE, schedule="combined_1f1b"),
     _t(cuda_graph_impl="transformer_engine", cuda_graph_modules=("mlp",)),
     "CUDA_GRAPH_EP_OVERLAP_SCOPE", "CUDA graph scope on moe and mlp is not supported with "
                                    "overlap_moe_expert_parallel_comm"),
    # the dropless alltoall dispatcher's d2h_event.synchronize(), DeepEP's host wait, HybridEP without a rank
    # budget: a host sync inside the captured iteration (paraplan's words: Megatron checks nothing)
    (QWEN, MOE, _t(cuda_graph_impl="full_iteration"),
     "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC", "needs a sync-free token dispatcher"),
    (QWEN, MOE, _t(cuda_graph_impl="full_iteration", moe_token_dispatcher_type="flex"),
     "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC", "needs a sync-free token dispatcher"),
    (QWEN, MOE, _t(cuda_graph_impl="full_iteration", moe_token_dispatcher_type="flex",
                   moe_flex_dispatcher_backend="hybridep"),
     "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC", "needs a sync-free token dispatcher"),
])
def test_launch_refuses_what_megatron_refuses(model: Any, layout: ParallelLayout, training: TrainingSpec, code: str,
                                              words: str) -> None:
    found = dict(launch_violations(model, layout, training))
    assert code in found and words in found[code]
    with pytest.raises(LayoutError) as err:
        megatron_args(model, layout, training)
    assert err.value.reason in found and "\n" not in str(err.value)


@pytest.mark.parametrize(("model", "layout", "training"), [
    # drop-padding MoE has no DtoH copy in the preprocess step: moe_preprocess may be graphed
    (QWEN, MOE, _t(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_router", "moe_preprocess"))),
    (QWEN, MOE, _t(cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_router", "moe_preprocess"))),
    (QWEN, replace(MOE, recompute="selective", recompute_modules=("core_attn",)),
     _t(cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_router",))),
    (QWEN, MOE, _t(fine_grained_activation_offloading=True, offload_modules=("expert_fc1",), cuda_graph_impl="local",
                   cuda_graph_modules=("attn",))),
    (LLAMA, DENSE, _t(cpu_offloading_num_layers=4, cuda_graph_impl="full_iteration")),
    (QWEN, MOE, _t(cuda_graph_impl="full_iteration", moe_expert_capacity_factor=1.0,
                   moe_pad_expert_input_to_capacity=True)),
    (QWEN, MOE, _t(cuda_graph_impl="full_iteration", moe_token_dispatcher_type="flex",
                   moe_flex_dispatcher_backend="hybridep", moe_expert_rank_capacity_factor=1.5,
                   use_transformer_engine_op_fuser=True)),
    (QWEN, replace(MOE, schedule="combined_1f1b"),
     _t(delay_wgrad_compute=True, cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn",))),
])
def test_the_neighbouring_combinations_are_accepted(model: Any, layout: ParallelLayout,
                                                    training: TrainingSpec) -> None:
    assert not [c for c, _ in launch_violations(model, layout, training) if c.startswith("CUDA_GRAPH")]


def test_full_iteration_graphs_write_the_nan_check_off() -> None:
    """arguments.py: '--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration'."""
    layout = replace(DENSE, recompute="full", recompute_method="block", recompute_num_layers=4)
    words = argv(megatron_args(LLAMA, layout, _t(cuda_graph_impl="full_iteration")), resolve=True)
    assert "--no-check-for-nan-in-loss-and-grad" in words
    assert "--no-check-for-nan-in-loss-and-grad" not in argv(megatron_args(LLAMA, DENSE, _t()), resolve=True)
    dests = (SPECS / "megatron_dests.tsv").read_text(encoding="utf-8").splitlines()
    assert "check_for_nan_in_loss_and_grad\t--no-check-for-nan-in-loss-and-grad\tStoreFalse\tTrue" in dests
    assert "--no-check-for-nan-in-loss-and-grad" in (SPECS / "megatron_flags.txt").read_text().split()


def test_fine_grained_offloading_exports_nvte_cpu_offload_v1() -> None:
    env = {name: value for name, value, _ in environment(plan_spec("llama3-8b-fine-grained-offload"))}
    assert env["NVTE_CPU_OFFLOAD_V1"] == "1"
    assert "NVTE_CPU_OFFLOAD_V1" not in {name for name, _, _ in environment(plan_spec("llama3-8b-dp8"))}


SCRIPT = ("export CUDA_DEVICE_MAX_CONNECTIONS=1\n{env}"
          "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
          "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
          "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
          "--sequence-parallel --bf16 --vocab-size 32000 --use-distributed-optimizer {extra}\n")


def _codes(tmp_path: Path, extra: str, capsys: pytest.CaptureFixture[str], env: str = "") -> dict[str, str]:
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.format(extra=extra, env=env), encoding="utf-8")
    main(["check", str(script), "--gpu", "h100-80gb", "--format", "json"])
    out, _ = capsys.readouterr()
    return {v["code"]: v["message"] for v in json.loads(out)["violations"]}


@pytest.mark.parametrize(("extra", "env", "code"), [
    ("--cuda-graph-impl full_iteration --recompute-granularity full --recompute-method block "
     "--recompute-num-layers 4", "", "FULL_ITERATION_NAN_CHECK"),
    ("--fine-grained-activation-offloading --offload-modules core_attn", "", "NVTE_CPU_OFFLOAD_V1"),
    ("--fine-grained-activation-offloading --offload-modules core_attn", "export NVTE_CPU_OFFLOAD_V1=0\n",
     "NVTE_CPU_OFFLOAD_V1"),
    ("--overlap-grad-reduce --overlap-param-gather --overlap-param-gather-with-optimizer-step "
     "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4",
     "", "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_DIST_CKPT"),
    ("--cuda-graph-impl transformer_engine --cpu-offloading-num-layers 4", "", "CUDA_GRAPH_CPU_OFFLOADING"),
    ("--cuda-graph-impl local --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
     "", "CUDA_GRAPH_FULL_RECOMPUTE"),
])
def test_check_reports_the_rule_and_not_its_fixed_script(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         extra: str, env: str, code: str) -> None:
    found = _codes(tmp_path, extra, capsys, env)
    assert code in found and "\n" not in found[code]
    fixed = {"FULL_ITERATION_NAN_CHECK": (extra + " --no-check-for-nan-in-loss-and-grad", env),
             "NVTE_CPU_OFFLOAD_V1": (extra, "export NVTE_CPU_OFFLOAD_V1=1\n"),
             "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_DIST_CKPT": (extra + " --ckpt-format torch", env),
             "CUDA_GRAPH_CPU_OFFLOADING": (extra.replace("transformer_engine", "full_iteration")
                                           + " --no-check-for-nan-in-loss-and-grad", env),
             "CUDA_GRAPH_FULL_RECOMPUTE": (extra.replace("local", "full_iteration")
                                           + " --no-check-for-nan-in-loss-and-grad", env)}[code]
    assert code not in _codes(tmp_path, fixed[0], capsys, fixed[1])


@pytest.mark.parametrize("words", [["--main-grads-dtype", "bf16"], ["--exp-avg-dtype", "bf16"],
                                   ["--exp-avg-sq-dtype", "fp8"], ["--main-params-dtype", "fp16"]])
def test_low_precision_optimizer_tensors_need_the_precision_aware_optimizer(words: list[str]) -> None:
    """optimizer_config.py: '<dtype> can only be fp32 when not using precision-aware optimizer'."""
    name = words[0][2:].replace("-", "_")
    with pytest.raises(SpecError, match=f"'{name} can only be fp32 when not using precision-aware optimizer'"):
        TrainingSpec(seq_len=4096, global_batch_size=64, **memory_knobs_from_words(words, "bf16"))
    fields = memory_knobs_from_words([*words, "--use-precision-aware-optimizer"], "bf16")
    assert TrainingSpec(seq_len=4096, global_batch_size=64, **fields).use_precision_aware_optimizer


def test_estimate_and_check_refuse_a_bf16_main_grad_without_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cli = ["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
           "--gbs", "64", "--knob", "main-grads-dtype=bf16"]
    assert main(cli) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "main_grads_dtype can only be fp32" in err
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.format(extra="--main-grads-dtype bf16", env=""), encoding="utf-8")
    assert main(["check", str(script), "--gpu", "h100-80gb"]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "main_grads_dtype can only be fp32" in out  # listed as a broken rule


CLUSTER = make_cluster(H100, 8)


def test_plan_does_not_rank_per_layer_graphs_with_full_recompute() -> None:
    with pytest.raises(NoFeasiblePlanError) as err:
        plan(LLAMA, CLUSTER, _t(cuda_graph_impl="local"), space=SearchSpace(recompute=("full",)))
    assert err.value.rejections["CUDA_GRAPH_FULL_RECOMPUTE"] > 0
    p = plan(LLAMA, CLUSTER, _t(cuda_graph_impl="local"))
    assert p.rejections["CUDA_GRAPH_FULL_RECOMPUTE"] > 0
    assert "full recompute is only supported" in p.rejection_examples["CUDA_GRAPH_FULL_RECOMPUTE"]
    assert all(c.layout.recompute != "full" for c in p.candidates)
    assert all(not launch_violations(LLAMA, c.layout, c.training) for c in p.candidates)


def test_plan_ranks_only_interleaved_layouts_for_gather_with_optimizer_step() -> None:
    training = _t(overlap_param_gather_with_optimizer_step=True)
    p = plan(LLAMA, CLUSTER, training)
    assert p.rejections["OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_VP"] > 0
    assert p.candidates and all(c.layout.vp > 1 for c in p.candidates)
    assert all(not launch_violations(LLAMA, c.layout, training) for c in p.candidates)
    assert "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_VP" not in plan(LLAMA, CLUSTER, _t()).rejections


def test_check_reports_a_full_iteration_graph_over_a_syncing_dispatcher(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The dropless alltoall dispatcher syncs the host inside the captured iteration; drop-and-pad does not."""
    moe = ("--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4 --expert-tensor-parallel-size 1 "
           "--moe-grouped-gemm --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad")
    found = _codes(tmp_path, moe, capsys)
    assert "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC" in found and "\n" not in found["CUDA_GRAPH_FULL_ITERATION_MOE_SYNC"]
    a2a = moe + " --moe-token-dispatcher-type alltoall"
    assert "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC" in _codes(tmp_path, a2a, capsys)
    fixed = a2a + " --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity"
    assert "CUDA_GRAPH_FULL_ITERATION_MOE_SYNC" not in _codes(tmp_path, fixed, capsys)


def test_estimate_refuses_a_full_iteration_graph_over_a_syncing_dispatcher(capsys: pytest.CaptureFixture[str]) -> None:
    cli = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "gb200", "-n", "16", "-s", "4096", "--gbs", "512",
           "--tp", "1", "--pp", "1", "--ep", "16", "--mbs", "4", "--recompute", "none",
           "--knob", "cuda-graph-impl=full_iteration"]
    assert main(cli) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "needs a sync-free token dispatcher" in err
    assert main([*cli, "--knob", "moe-token-dispatcher-type=flex", "--knob", "moe-flex-dispatcher-backend=hybridep",
                 "--knob", "moe-expert-rank-capacity-factor=1.5",
                 "--knob", "use-transformer-engine-op-fuser=true"]) == 0
