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
