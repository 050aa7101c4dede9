"""``paraplan launch`` and ``paraplan check`` in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import paraplan.cli.check
import paraplan.cli.launch  # noqa: F401  (registers the commands until cli/__init__ lists them)
from paraplan.cli import main

from .cases import FIXTURES, SITE

BASE = ["launch", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "4",
        "--vp", "5", "--cp", "2", "--seq-len", "8192", "--gbs", "512"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_launch_writes_every_target_with_the_prediction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE), encoding="utf-8")
    out = tmp_path / "run"
    code, stdout, _ = run([*BASE, "--target", "all", "--out", str(out), "--site", str(site)], capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["megatron_args.sh", "env.sh", "torchrun.sh", "job.sbatch", "pytorchjob.yaml", "trainjob.yaml",
         "bridge_recipe.py", "bridge_overrides.txt", "manifest.json"])
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert sorted(manifest["files"]) == sorted(p.name for p in out.iterdir())
    assert manifest["schema_version"] == 1 and len(manifest["candidate_id"]) == 12
    assert manifest["candidate_id"] in stdout
    assert manifest["layout"]["tp"] == 4 and manifest["inputs"]["cluster"]["num_gpus"] == 64
    assert manifest["prediction"]["config"]["vp"] == 5
    assert manifest["prediction"]["memory"]["peak_bytes"] > 0
    assert "--partition=batch" in (out / "job.sbatch").read_text(encoding="utf-8")


def test_repeated_target_writes_each_of_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--target bridge --target trainjob`` writes both sets of files (it used to keep the last one silently)."""
    out = tmp_path / "run"
    code, _, err = run([*BASE, "--target", "bridge", "--target", "trainjob", "--target", "bridge", "--out", str(out)],
                       capsys)
    assert code == 0, err
    names = {p.name for p in out.iterdir()}
    assert {"bridge_recipe.py", "bridge_overrides.txt", "trainjob.yaml", "manifest.json"} <= names
    assert "job.sbatch" not in names and "pytorchjob.yaml" not in names


def test_candidate_id_is_stable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = []
    for name in ("a", "b"):
        assert run([*BASE, "--target", "megatron", "--out", str(tmp_path / name)], capsys)[0] == 0
        ids.append(json.loads((tmp_path / name / "manifest.json").read_text(encoding="utf-8"))["candidate_id"])
    assert ids[0] == ids[1]
    assert run([*BASE[:-2], "--gbs", "1024", "--target", "megatron", "--out", str(tmp_path / "c")], capsys)[0] == 0
    assert json.loads((tmp_path / "c" / "manifest.json").read_text(encoding="utf-8"))["candidate_id"] != ids[0]


def test_invalid_layout_fails_with_megatrons_message_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["launch", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "3",
            "--seq-len", "8192", "--gbs", "512", "--out", str(out)]
    code, _, err = run(args, capsys)
    assert code == 1 and "is not divisible by total_model_size" in err
    code, _, err = run([*BASE[:9], "--seq-len", "8192", "--gbs", "512", "--out", str(out)], capsys)
    assert code == 0
    code, _, err = run([*BASE, "--out", str(out)], capsys)
    assert code == 1 and "exists (use --force" in err
    assert run([*BASE, "--out", str(out), "--force"], capsys)[0] == 0


def test_launch_from_a_saved_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import paraplan.cli.plan  # noqa: F401

    plan = tmp_path / "plan.json"
    assert run(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096",
                "--gbs", "128", "--top", "3", "--save", str(plan), "--format", "json"], capsys)[0] == 0
    out = tmp_path / "from-plan"
    assert run(["launch", "--plan", str(plan), "--rank", "2", "--target", "torchrun", "--out", str(out)],
               capsys)[0] == 0
    chosen = json.loads(plan.read_text(encoding="utf-8"))["plan"]["candidates"][1]["config"]
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert {k: manifest["layout"][k] for k in ("tp", "pp", "cp", "dp", "mbs")} == \
        {k: chosen[k] for k in ("tp", "pp", "cp", "dp", "mbs")}
    code, _, err = run(["launch", "--plan", str(plan), "--rank", "9", "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and "--rank 9" in err


def test_launch_without_inputs_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["launch", "--model", "llama3-8b", "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and "--gpu, --num-gpus, --seq-len, --gbs" in err


def test_check_reports_memory_for_a_valid_script(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["check", str(FIXTURES / "mixtral_8x7b_srun.sbatch"), "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["violations"] == [] and d["world_size"] == 32
    assert d["unknown_flags"] == ["--use-legacy-models"]
    assert d["estimate"]["memory"]["peak_bytes"] > 0
    alt = d["alternative"]
    assert alt["layout"] and alt["predicted_gain"] is not None and alt["tokens_per_s_per_gpu"] > 0
    assert any(x.startswith("--hidden-dropout not set") for x in d["defaults_applied"])


def test_check_lists_every_broken_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "bad.sh"
    script.write_text(
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 31 --hidden-size 3840 "
        "--num-attention-heads 30 --seq-length 4098 --max-position-embeddings 4096 --micro-batch-size 1 "
        "--global-batch-size 100 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
        "--context-parallel-size 1 --sequence-parallel --bf16 --vocab-size 32000 --overlap-param-gather\n",
        encoding="utf-8")
    code, out, _ = run(["check", str(script), "--format", "json"], capsys)
    assert code == 1
    d = json.loads(out)
    codes = [v["code"] for v in d["violations"]]
    for expected in ("HEADS_NOT_DIVISIBLE_BY_TP", "SEQ_NOT_DIVISIBLE_BY_TP_SP", "LAYERS_NOT_DIVISIBLE_BY_PP",
                     "MAX_POSITIONS_LT_SEQ", "OVERLAP_PARAM_GATHER_NEEDS_DIST_OPT",
                     "OVERLAP_PARAM_GATHER_NEEDS_GRAD_REDUCE", "CUDA_DEVICE_MAX_CONNECTIONS"):
        assert expected in codes
    messages = {v["code"]: v["message"] for v in d["violations"]}
    assert messages["HEADS_NOT_DIVISIBLE_BY_TP"] == \
        "num_attention_heads (30) must be a multiple of tensor_model_parallel_size (4)."
    assert d["estimate"] is None


def test_check_table_output_and_world_size_from_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["check", str(FIXTURES / "train_gpt3_175b_distributed.sh")], capsys)
    assert code == 1 and "WORLD_SIZE_MISMATCH" in out
    code, out, _ = run(["check", str(FIXTURES / "train_gpt3_175b_distributed.sh"), "--num-gpus", "1024",
                        "--gpu", "a100-80gb"], capsys)
    assert code == 0 and "no Megatron rule broken" in out and "throughput" in out


def test_check_missing_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["check", "/nonexistent/run.sh"], capsys)
    assert code == 1 and err.startswith("error: script: cannot read '/nonexistent/run.sh': file not found")


DENSE_SCRIPT = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 "
                "--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 128 --bf16 "
                "--swiglu --use-distributed-optimizer --normalization RMSNorm --position-embedding-type rope "
                "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 "
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n")


def test_check_suggests_no_expert_flags_for_a_dense_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Llama-3-8B script: plan's pick has TP 2 (so ETP 2 in its config), but ETP means nothing without experts."""
    script = tmp_path / "dense.sh"
    script.write_text(DENSE_SCRIPT)
    assert main(["check", str(script), "--gpu", "h100-80gb", "--format", "json"]) == 0
    alt = json.loads(capsys.readouterr().out)["alternative"]
    assert alt["config"]["tp"] > 1  # the pick has TP, which the config's ETP follows
    assert f"--tp {alt['config']['tp']}" in alt["estimate_flags"]
    assert "--etp" not in alt["estimate_flags"] and "--ep " not in alt["estimate_flags"]


def test_launch_notes_the_gather_with_optimizer_step_it_leaves_out(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, stdout, _ = run([*BASE, "--knob", "overlap-param-gather-with-optimizer-step", "--out", str(out)], capsys)
    assert code == 0
    assert "note: --overlap-param-gather-with-optimizer-step left out: Megatron-LM's validate_args" in " ".join(
        stdout.split())
    assert "--overlap-param-gather-with-optimizer-step" not in json.loads((out / "manifest.json").read_text())[
        "megatron_args"]
    code, stdout, _ = run([*BASE, "--knob", "overlap-param-gather-with-optimizer-step", "--target", "bridge",
                           "--out", str(tmp_path / "bridge")], capsys)
    assert code == 0 and "left out" not in stdout  # Megatron-Bridge has no such rule: its files keep it
    assert "overlap_param_gather_with_optimizer_step=true" in (tmp_path / "bridge" / "bridge_overrides.txt").read_text()
