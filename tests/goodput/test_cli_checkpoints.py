"""plan/explain/budget show checkpoint size and save time and flag host-RAM and storage limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan.cli.budget
import paraplan.cli.plan  # noqa: F401  (register the commands)
from paraplan.budget import budget
from paraplan.checkpoint import StorageSpec, format_decimal_bytes
from paraplan.cli import main
from paraplan.specs.load import load_gpu, load_model

PLAN = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096", "--gbs", "128",
        "--top", "2"]


def site_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_plan_json_and_table_show_checkpoints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *PLAN, "--format", "json"]) == 0
    ckpts = json.loads(capsys.readouterr().out)["checkpoints"]
    assert len(ckpts) == 2 and all(c["total_bytes"] > 0 and c["save_s"] > 0 for c in ckpts)
    assert main(["plan", *PLAN]) == 0
    out = " ".join(capsys.readouterr().out.split())
    first = ckpts[0]
    assert (f"#1 {format_decimal_bytes(first['total_bytes'])} {first['ckpt_format']}, save {first['save_s']:,.1f} s, "
            f"--save-interval {first['save_interval_iters']}") in out
    assert "checkpoint limit" not in out


def test_explain_flags_host_ram_and_storage_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = site_file(tmp_path, "host_memory_gb_per_node: 1\nstorage_gbps: 0.0005\n")
    assert main(["explain", *PLAN, "--site", site, "--format", "json"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["explanation"]}
    assert found["CHECKPOINT"]["numbers"]["host_ram_fits"] is False
    assert found["CHECKPOINT"]["numbers"]["save_s"] == pytest.approx(found["CHECKPOINT"]["numbers"]["total_bytes"]
                                                                     / 0.0005e9)
    assert "HOST_RAM_LIMIT" in found and "STORAGE_LIMIT" in found
    assert main(["plan", *PLAN, "--site", site]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "checkpoint limit #1: --async-save staging" in out and "saves block" in out
    roomy = site_file(tmp_path, "host_memory_gb_per_node: 4000\nstorage_gbps: 1000\n")
    assert main(["explain", *PLAN, "--site", roomy, "--format", "json"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["explanation"]}
    assert found["CHECKPOINT"]["numbers"]["async_save"] is True
    assert "HOST_RAM_LIMIT" not in found and "STORAGE_LIMIT" not in found


def test_budget_flags_limits_and_slow_storage_lowers_goodput() -> None:
    model, gpus = load_model("llama3-8b"), [load_gpu("h100-80gb")]
    fast = budget(model, gpus, tokens=1e12, num_gpus=64, storage=StorageSpec(aggregate_bytes_per_s=1e12))
    slow = budget(model, gpus, tokens=1e12, num_gpus=64,
                  storage=StorageSpec(aggregate_bytes_per_s=1e6, host_memory_bytes_per_node=1e9))
    (f,), (s,) = fast.rows, slow.rows
    assert f.goodput is not None and s.goodput is not None and s.goodput < f.goodput
    assert s.checkpoint_save_s is not None and f.checkpoint_save_s is not None
    assert s.checkpoint_save_s == pytest.approx(f.checkpoint_save_s * 1e6)
    codes = {c for c, _ in s.flags}
    assert {"HOST_RAM", "CKPT_SLOW"} <= codes and not {c for c, _ in f.flags} & {"HOST_RAM", "CKPT_SLOW"}


def test_budget_site_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = site_file(tmp_path, "failure_rate_per_gpu_hour: -3\n")
    code = main(["budget", "--model", "llama3-8b", "--tokens", "1T", "--gpu", "h100-80gb", "--gpus", "8",
                 "--site", site])
    err = capsys.readouterr().err
    assert code == 1 and "site.failure_rate_per_gpu_hour" in err and len(err.strip().splitlines()) == 1
