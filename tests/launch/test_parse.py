"""Reading launch scripts users keep: Megatron's example scripts (written from memory), Slurm,
argument files, one-line commands, bash arrays and variables, unknown flags and defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.launch.parse import parse_file, parse_script
from paraplan.launch.shell import Env, read_commands

from .cases import FIXTURES


def test_gpt3_175b_example_script() -> None:
    p = parse_file(FIXTURES / "train_gpt3_175b_distributed.sh")
    m = p.flags.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.max_position_embeddings) == (96, 12288, 96, 2048)
    assert m.position_embedding_type == "learned_absolute" and m.normalization == "LayerNorm"
    assert m.vocab_size == 50257  # GPT-2 BPE (--merge-file)
    lay = p.flags.layout_fields
    assert (lay["tp"], lay["pp"], lay["mbs"], lay["recompute"]) == (8, 16, 1, "none")
    assert not lay["distributed_optimizer"] and not lay["sequence_parallel"]
    assert p.flags.training_fields == {"seq_len": 2048, "global_batch_size": 1536, "precision": "fp16",
                                       "attention_backend": "flash"}
    assert p.world_size == 8 and p.num_nodes == 1 and p.launcher[0] == "torchrun"
    assert p.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert not any("fp16" in n for n in p.flags.notes)  # --fp16 is read as fp16, not noted as bf16
    assert any(d.startswith("--use-distributed-optimizer not set") for d in p.defaults_applied)
    assert p.layout(128).dp == 1


def test_llama3_8b_fp8_example_script() -> None:
    p = parse_file(FIXTURES / "train_llama3_8b_h100_fp8.sh")
    m = p.flags.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_query_groups, m.kv_channels) == \
        (32, 4096, 14336, 8, 128)
    assert m.swiglu and m.untie_embeddings_and_output_weights and not m.add_bias_linear
    assert m.vocab_size == 128256 and m.position_embedding_type == "rope"
    assert p.flags.training_fields["precision"] == "fp8"  # "--fp8-format hybrid" split from one array element
    lay = p.layout()
    assert (lay.tp, lay.pp, lay.dp, lay.mbs) == (1, 1, 8, 1)
    assert lay.distributed_optimizer and lay.overlap_grad_reduce and lay.overlap_param_gather
    assert p.training().global_batch_size == 128
    assert p.unknown_flags == ()
    assert p.args.count("--fp8-amax-history-len") == 1


def test_slurm_srun_script_with_bash_c() -> None:
    p = parse_file(FIXTURES / "mixtral_8x7b_srun.sbatch")
    assert p.world_size == 32 and p.gpus_per_node == 8 and p.num_nodes == 4
    assert p.launcher[0] == "srun" and p.launcher[-1] == "python"
    m = p.flags.model
    assert m.num_experts == 8 and m.moe_router_topk == 2 and m.num_query_groups == 8
    lay = p.layout()
    assert (lay.pp, lay.vp, lay.ep, lay.dp, lay.recompute, lay.recompute_num_layers) == (4, 2, 8, 8, "full", 1)
    assert p.unknown_flags == ("--use-legacy-models",)
    assert any(d.startswith("--expert-tensor-parallel-size not set") for d in p.defaults_applied)


def test_one_line_command_and_args_file(tmp_path: Path) -> None:
    line = ("torchrun --nproc-per-node=4 --nnodes=2 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
            "--num-attention-heads 4 --seq-length 512 --max-position-embeddings 512 --micro-batch-size 2 "
            "--tensor-model-parallel-size=2 --bf16 --vocab-size 1000 --my-private-flag x")
    p = parse_script(line)
    assert p.world_size == 8 and p.layout().dp == 4 and p.layout().mbs == 2
    assert p.unknown_flags == ("--my-private-flag",)
    assert p.training().global_batch_size == 8  # Megatron's default: micro-batch x DP
    args_file = tmp_path / "args.txt"
    args_file.write_text(line.split("pretrain_gpt.py ", 1)[1].replace(" --", " \\\n  --"), encoding="utf-8")
    q = parse_file(args_file)
    assert q.world_size is None and q.flags.model == parse_script(line, name="args", source=str(args_file)).flags.model
    assert q.layout(16).dp == 8
    with pytest.raises(SpecError, match="pass --num-gpus"):
        q.layout()


def test_missing_required_dimension_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match="--num-layers is missing"):
        parse_script("python pretrain_gpt.py --hidden-size 64 --num-attention-heads 4 --seq-length 8")


def test_unresolved_variable_in_a_number_names_the_flag() -> None:
    with pytest.raises(SpecError, match="--num-layers '\\$NUM_LAYERS' is not an integer"):
        parse_script("python pretrain_gpt.py --num-layers $NUM_LAYERS --hidden-size 64 --num-attention-heads 4")


def test_command_substitution_is_not_split_and_not_a_literal() -> None:
    script = ("python pretrain_gpt.py --tensor-model-parallel-size ${TP:-$(touch X)} --num-layers 4 "
              "--hidden-size 64 --num-attention-heads 4 --seq-length 8")
    with pytest.raises(SpecError, match=r"^--tensor-model-parallel-size '\$\{TP:-\$\(touch X\)\}' is not a "
                                        r"literal value \(command substitution\)"):
        parse_script(script)
    with pytest.raises(SpecError, match=r"'\$\(echo 2 3\)' is not a literal value \(command substitution\)"):
        parse_script(script.replace("${TP:-$(touch X)}", "$(echo 2 3)"))
    assert parse_script("TP=2\n" + script).layout(8).tp == 2  # set: the default (and its command) is not used


def test_megatron_problems_are_reported_with_its_words() -> None:
    p = parse_script("python pretrain_gpt.py --num-layers 8 --hidden-size 64 --num-attention-heads 4 "
                     "--seq-length 64 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3 "
                     "--recompute-granularity selective --recompute-method uniform")
    codes = dict(p.flags.problems)
    assert "number of layers per pipeline stage must be divisible" in codes["LAYERS_NOT_DIVISIBLE_BY_VP"]
    assert codes["RECOMPUTE_METHOD_SELECTIVE"].startswith("recompute method is not yet supported")
    assert codes["MICRO_BATCH_SIZE_MISSING"] == "micro_batch_size argument is None"
    assert codes["MAX_POSITIONS_MISSING"] == "max_position_embeddings argument is None"


def test_sbatch_values_feed_slurm_variables() -> None:
    text = ("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:4\n"
            'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node "$SLURM_GPUS_PER_NODE" '
            "pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
            "--micro-batch-size 1\n")
    p = parse_script(text)
    assert (p.world_size, p.gpus_per_node, p.num_nodes) == (8, 4, 2)


def test_sourced_files_next_to_the_script_are_followed(tmp_path: Path) -> None:
    (tmp_path / "args.sh").write_text("ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4\n"
                                      "  --seq-length 64 --micro-batch-size 1)\n", encoding="utf-8")
    script = tmp_path / "run.sh"
    script.write_text('source "$(dirname "$0")/args.sh"\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n'
                      'python -u pretrain_gpt.py "${ARGS[@]}"\n', encoding="utf-8")
    p = parse_file(script)
    assert p.flags.model.num_layers == 2 and p.launcher == ("python", "-u")


def test_shell_reader_word_splitting_and_defaults() -> None:
    env = Env()
    cmds = read_commands('A="x y"\nB=( "$A" $A "${C:-c d}" )\nrun ${B[@]} "${B[@]}" $A"z" \'$A\' "" \\\n  end\n',
                         env)
    assert env.arrays["B"] == ["x y", "x", "y", "c d"]
    assert cmds[-1].fields == ("run", "x", "y", "x", "y", "c", "d", "x y", "x", "y", "c d", "x", "yz", "$A",
                               "", "end")


def test_file_tests_and_echo_lines_are_not_the_command() -> None:
    text = ('P=pretrain_gpt.py\nif [ ! -f "$P" ]; then echo "no $P"; fi\n'
            "python $P --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 2>&1 | tee log\n")
    p = parse_script(text)
    assert p.launcher == ("python",) and p.args[-1] == "64"


def test_nothing_to_parse_is_an_error() -> None:
    with pytest.raises(SpecError, match=r"no pretrain_gpt\.py command line"):
        parse_script("echo hello\n")


def test_pipeline_layout_string_with_repetition() -> None:
    # megatron-core's own docstring example: 61 decoder layers and one MTP layer over 32 virtual stages
    p = parse_script("python pretrain_gpt.py --num-layers 61 --hidden-size 64 --num-attention-heads 4 "
                     "--seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --mtp-num-layers 1 "
                     "--pipeline-model-parallel-size 8 "
                     "--pipeline-model-parallel-layout 'Ettt|(tt|)*29,m|L'")
    lay = p.layout(8)
    assert (lay.pp, lay.vp) == (8, 4)
    assert lay.pipeline_layout == (3,) + (2,) * 29 + (0, 0)
    assert p.flags.problems == ()
    bad = parse_script("python pretrain_gpt.py --num-layers 8 --hidden-size 64 --num-attention-heads 4 "
                       "--seq-length 64 --micro-batch-size 1 --pipeline-model-parallel-size 2 "
                       "--pipeline-model-parallel-layout 'Et*4|t*3|L' --decoder-first-pipeline-num-layers 4")
    codes = dict(bad.flags.problems)
    assert codes["PIPELINE_LAYOUT_LENGTH"].startswith("The length of pipeline_model_parallel_layout must be")


BASE_ARGS = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "4096",
             "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16"]


@pytest.mark.parametrize(("extra", "code"), [
    (["--fp16"], "FP16_AND_BF16"),
    (["--fp8-format", "hybrid", "--fp4-format", "e2m1"], "FP4_AND_FP8"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform"], "RECOMPUTE_NUM_LAYERS"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "2"], "RECOMPUTE_NUM_LAYERS_SELECTIVE"),
    (["--batch-size", "4"], "REMOVED_FLAG"),
    (["--checkpoint-activations"], "REMOVED_FLAG"),
    (["--use-torch-fsdp2", "--pipeline-model-parallel-size", "2"], "TORCH_FSDP2"),
    (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
      "--overlap-param-gather-with-optimizer-step"], "OVERLAP_PARAM_GATHER_WITH_OPTIMIZER_STEP_NEEDS_VPP"),
])
def test_flag_combinations_megatron_rejects_are_problems(extra: list[str], code: str) -> None:
    from paraplan.specs.megatron_flags import read_flags

    assert code in {c for c, _ in read_flags([*BASE_ARGS, *extra]).problems}
    assert not read_flags(BASE_ARGS).problems


@pytest.mark.parametrize("layout", ["(t*99999)*99999", "t*" + "9" * 5000])
def test_a_pipeline_layout_that_expands_past_the_limit_is_one_line(layout: str) -> None:
    script = (f"python pretrain_gpt.py --pipeline-model-parallel-layout '{layout}' --num-layers 4 "
              "--hidden-size 64 --num-attention-heads 4 --seq-length 8")
    with pytest.raises(SpecError, match=r"^--pipeline-model-parallel-layout: expands to more than 1,048,576"):
        parse_script(script)
