"""launch's checkpoint flags: --save-interval (iterations), --ckpt-format, --async-save where the staging fits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

import paraplan.cli.launch  # noqa: F401  (registers the command)
from paraplan.checkpoint import advise
from paraplan.cli import main
from paraplan.errors import LayoutError
from paraplan.estimator import estimate
from paraplan.launch.megatron import CheckpointArgs, argv, flag_pairs, megatron_args
from paraplan.launch.site import site_from_dict
from paraplan.layout import layout_for_world

from .cases import llama70b_spec
from .test_megatron_args import tsv_flags

BASE = ["launch", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "4",
        "--vp", "5", "--cp", "2", "--seq-len", "8192", "--gbs", "512", "--target", "megatron"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_async_flags_exist_in_megatron_and_carry_the_interval() -> None:
    spec = llama70b_spec()
    ckpt = CheckpointArgs(save_interval_iters=137, ckpt_format="torch_dist", async_save=True, reason="why")
    groups = megatron_args(spec.model, spec.layout, spec.training, checkpoint=ckpt)
    words = argv(groups, resolve=True)
    assert {w for w in words if w.startswith("--")} <= tsv_flags()
    pairs = dict(flag_pairs(groups))
    assert pairs["--save-interval"] == '${SAVE_INTERVAL:-137}'
    assert words[words.index("--save-interval") + 1] == "137"
    assert pairs["--ckpt-format"] == "torch_dist"
    assert "--async-save" in pairs and "--use-persistent-ckpt-worker" in pairs
    assert any("--save-interval 137: why" in g.title for g in groups)
    sync = megatron_args(spec.model, spec.layout, spec.training, checkpoint=CheckpointArgs(
        save_interval_iters=5, ckpt_format="torch_dist", async_save=False, reason="r"))
    assert "--async-save" not in dict(flag_pairs(sync))


@pytest.mark.parametrize(("kw", "match"), [
    ({"save_interval_iters": 0}, "--save-interval"),
    ({"save_interval_iters": 2.5}, "--save-interval"),
    ({"save_interval_iters": True}, "--save-interval"),
    ({"ckpt_format": "torch; rm -rf /"}, "--ckpt-format"),
    ({"reason": "two\nlines"}, "single line"),
])
def test_checkpoint_values_are_validated(kw: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"save_interval_iters": 10, "ckpt_format": "torch_dist", "async_save": False,
                               "reason": "ok", **kw}
    with pytest.raises(LayoutError, match=match):
        CheckpointArgs(**args)  # type: ignore[arg-type]


def test_fsdp_needs_fsdp_dtensor() -> None:
    spec = llama70b_spec()
    fsdp = layout_for_world(64, tp=4, fsdp=True, distributed_optimizer=False)
    bad = CheckpointArgs(save_interval_iters=10, ckpt_format="torch_dist", async_save=False, reason="r")
    with pytest.raises(LayoutError, match="fsdp_dtensor"):
        megatron_args(spec.model, fsdp, spec.training, checkpoint=bad)


def test_launch_writes_the_recommended_interval_sync_without_host_ram(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run([*BASE, "--out", str(tmp_path / "run")], capsys)
    assert code == 0
    spec = llama70b_spec()
    adv = advise(estimate(spec.model, spec.cluster, spec.training, spec.layout))
    text = (tmp_path / "run" / "megatron_args.sh").read_text(encoding="utf-8")
    assert f'--save-interval "${{SAVE_INTERVAL:-{adv.save_interval_iters}}}"' in text
    assert "--ckpt-format torch_dist" in text and "--async-save" not in text
    assert "host RAM per node unknown" in text
    assert f"--save-interval {adv.save_interval_iters}" in stdout
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["checkpoint"]["save_interval_iters"] == adv.save_interval_iters
    subprocess.run(["bash", "-n", str(tmp_path / "run" / "megatron_args.sh")], check=True)


def test_launch_writes_async_save_when_the_staging_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = llama70b_spec()
    adv = advise(estimate(spec.model, spec.cluster, spec.training, spec.layout))
    need_gb = adv.timing.host_ram_bytes_per_node / 1e9
    for name, ram_gb, expect in (("fits", 2 * need_gb, True), ("tight", 0.5 * need_gb, False)):
        site = tmp_path / f"{name}.yaml"
        site.write_text(yaml.safe_dump({"host_memory_gb_per_node": ram_gb, "storage_gbps": 50}), encoding="utf-8")
        code, _, _ = run([*BASE, "--site", str(site), "--out", str(tmp_path / name)], capsys)
        assert code == 0
        text = (tmp_path / name / "megatron_args.sh").read_text(encoding="utf-8")
        assert ("--async-save" in text) == expect
        assert ("--use-persistent-ckpt-worker" in text) == expect
        assert ("fits host RAM" in text) == expect and ("> host RAM" in text) == (not expect)
        with_site = site_from_dict({"host_memory_gb_per_node": ram_gb, "storage_gbps": 50})
        interval = advise(estimate(spec.model, spec.cluster, spec.training, spec.layout), with_site.storage(),
                          with_site.failures()).save_interval_iters
        assert f'"${{SAVE_INTERVAL:-{interval}}}"' in text


@pytest.mark.parametrize(("value", "key"), [("-1", "storage_gbps"), ("1.5", "async_save_overlap"),
                                            ("fast", "requeue_s"), ("0", "host_memory_gb_per_node")])
def test_bad_site_numbers_fail_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str,
                                           key: str) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"{key}: {value}\n", encoding="utf-8")
    code, _, err = run([*BASE, "--site", str(site), "--out", str(tmp_path / "run")], capsys)
    assert code == 1 and f"site.{key}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
