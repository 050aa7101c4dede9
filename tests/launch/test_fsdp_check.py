"""``paraplan check`` on a Megatron-FSDP script: one line per flag the Megatron-FSDP guide lists as required."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan.cli.check  # noqa: F401  (registers the command)
from paraplan.cli import main
from paraplan.launch.megatron import FSDP_REQUIRED_FLAGS

SCRIPT = ("torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
          "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
          "--global-batch-size 64 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
          "--bf16 --vocab-size 32000 --use-megatron-fsdp --overlap-grad-reduce --overlap-param-gather {extra}\n")


def _check(tmp_path: Path, extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, str]]]:
    script = tmp_path / "fsdp.sh"
    script.write_text(SCRIPT.format(extra=extra), encoding="utf-8")
    code = main(["check", str(script), "--gpu", "h100-80gb", "--format", "json"])
    out, _ = capsys.readouterr()
    return code, [v for v in json.loads(out)["violations"] if v["code"] == "FSDP_REQUIRED_FLAG"]


def test_the_guides_flags_are_the_required_ones() -> None:
    assert [f for f, _, _ in FSDP_REQUIRED_FLAGS] == ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                                       "--ckpt-format"]
    assert all("guide" in source for _, _, source in FSDP_REQUIRED_FLAGS)


def test_each_missing_flag_is_one_line_naming_it_and_the_guide(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _check(tmp_path, "", capsys)
    assert code == 1
    assert len(found) == 2
    assert "--data-parallel-sharding-strategy (missing" in found[0]["message"]
    assert "--ckpt-format fsdp_dtensor (missing" in found[1]["message"]
    assert all("Megatron-FSDP guide" in v["message"] and "\n" not in v["message"] for v in found)


def test_a_wrong_checkpoint_format_is_named_with_its_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, found = _check(tmp_path, "--data-parallel-sharding-strategy optim_grads_params --ckpt-format torch_dist",
                      capsys)
    assert [v["message"].split(" (")[0] for v in found] == ["Megatron-FSDP needs --ckpt-format fsdp_dtensor"]
    assert "got torch_dist" in found[0]["message"]


def test_with_the_guides_flags_nothing_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # without --use-distributed-optimizer (Megatron sets it) and with gradient-accumulation fusion (NVIDIA's
    # DeepSeek-V3 FSDP recipes keep it)
    code, found = _check(tmp_path, "--data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor",
                         capsys)
    assert found == [] and code == 0


def test_fsdp_outside_nvidias_combinations_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = "--data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor"
    script = tmp_path / "fsdp.sh"
    tp2 = SCRIPT.format(extra=ok).replace("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2")
    script.write_text(tp2, encoding="utf-8")
    for gpu, warned in (("h100-80gb", True), ("b200", False)):
        assert main(["check", str(script), "--gpu", gpu, "--format", "json"]) == 0
        notes = json.loads(capsys.readouterr().out)["estimate"]["notes"]
        found = [n for n in notes if "outside the combinations NVIDIA runs" in n]
        assert len(found) == int(warned)  # TP 2 is what NVIDIA runs on Blackwell
        assert all("Megatron warns" in n for n in found)
    script.write_text(SCRIPT.format(extra=ok), encoding="utf-8")
    assert main(["check", str(script), "--gpu", "h100-80gb", "--format", "json"]) == 0
    assert not any("outside the combinations" in n for n in json.loads(capsys.readouterr().out)["estimate"]["notes"])
