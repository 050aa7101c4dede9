"""job.sbatch works from any directory: a stub ``sbatch`` copies the script into a spool directory and runs the
copy from the submit directory (as Slurm does), a stub ``scontrol`` answers ``show job`` with the script's
original path (Command=), stub ``srun``/``torchrun`` record their argv. Also: site values in job.sbatch, the
FSDP flags ``check`` asks for, and the printed site template."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paraplan.cli import main
from paraplan.launch.check import check_parsed
from paraplan.launch.parse import parse_file
from paraplan.launch.render import render_files, write_files
from paraplan.launch.site import SITE_KEYS, SITE_TEMPLATE, load_site, site_from_dict

from .cases import SITE, llama70b_spec
from .matrix import plan_spec

SBATCH = """#!/bin/bash
# stub sbatch: copy the script to the spool directory and run it from the submit directory
set -e
spool="$SPOOL/job42"; mkdir -p "$spool"; cp "$1" "$spool/slurm_script"
export SLURM_JOB_ID=42 SLURM_SUBMIT_DIR="$PWD" SLURM_NNODES=8 SLURM_JOB_NODELIST=node-a
printf '%s\\n' "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" > "$SPOOL/command"
exec bash "$spool/slurm_script"
"""
SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show job" ]; then
  printf '   JobId=42 JobName=x\\n   Command=%s\\n   WorkDir=%s\\n' "$(cat "$SPOOL/command")" "$PWD"
else
  printf 'node-a\\n'
fi
"""
RECORD = '#!/bin/sh\nprintf "%s\\0" "$(basename "$0")" "$@" >> "$STUB_LOG"\n'


def stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("scontrol", SCONTROL), ("srun", RECORD), ("module", RECORD)):
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("launch_dir_env", [False, True])
def test_sbatch_from_another_directory_finds_its_files(tmp_path: Path, launch_dir_env: bool) -> None:
    out = tmp_path / "runs" / "llama70b"
    write_files(render_files(llama70b_spec(), ["slurm"]), out)
    elsewhere = tmp_path / "home" / "user"
    elsewhere.mkdir(parents=True)
    (tmp_path / "spool").mkdir()
    env = {"PATH": f"{stubs(tmp_path)}:/usr/bin:/bin", "SPOOL": str(tmp_path / "spool"),
           "STUB_LOG": str(tmp_path / "stub.log"), "TOKENIZER_MODEL": "t", "HOME": str(elsewhere)}
    if launch_dir_env:  # a LAUNCH_DIR that points elsewhere (another launch) is passed over: wrong candidate
        other = tmp_path / "other"
        write_files(render_files(plan_spec("llama3-8b-dp8"), ["slurm"]), other)
        env["LAUNCH_DIR"] = str(other)
    done = subprocess.run(["sbatch", "../../runs/llama70b/job.sbatch"], cwd=elsewhere, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    words = (tmp_path / "stub.log").read_text(encoding="utf-8").split("\0")
    assert words[words.index("srun") + 1] == "--kill-on-bad-exit=1" and "torchrun" in words
    # env.sh (the site's DATA_PATH) and megatron_args.sh were found and sourced
    assert words[words.index("--data-path") + 1] == "/lustre/data/pile_text_document"
    assert f"{'/opt/megatron-lm'}/pretrain_gpt.py" in words


def test_sbatch_without_its_files_stops_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(llama70b_spec(), ["slurm"]), out)
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(out / "job.sbatch", lone / "job.sbatch")
    env = {"PATH": f"{stubs(tmp_path)}:/usr/bin:/bin", "STUB_LOG": str(tmp_path / "stub.log")}
    done = subprocess.run(["bash", str(lone / "job.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "cannot find the launch files of candidate" in done.stderr
    assert not (tmp_path / "stub.log").exists()


def test_site_values_in_job_sbatch() -> None:
    site = site_from_dict({**SITE, "qos": "normal", "extra_sbatch": [], "env": {"NCCL_IB_HCA": "mlx5",
                                                                                "UCX_NET_DEVICES": "mlx5_0:1"}})
    text = render_files(llama70b_spec(site), ["slurm"])["job.sbatch"]
    for line in ("#SBATCH --partition=batch", "#SBATCH --account=llm-team", "#SBATCH --qos=normal",
                 "#SBATCH --time=04:00:00", "--container-image=nvcr.io/nvidia/nemo:25.07",
                 "--container-mounts=/lustre:/lustre"):
        assert line in text
    env = render_files(llama70b_spec(site), ["slurm"])["env.sh"]
    # site values are defaults: a value already in the user's environment wins
    assert 'export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"' in env
    assert 'export UCX_NET_DEVICES="${UCX_NET_DEVICES:-mlx5_0:1}"' in env
    gb200 = render_files(plan_spec("llama3.1-405b-gb200"), ["slurm"])["job.sbatch"]
    assert "#SBATCH --segment=16" in gb200  # NVL72: 64-GPU segments of 4-GPU trays


def test_checkpoint_dir_is_the_default_of_every_target() -> None:
    site = site_from_dict({"checkpoint_dir": "/lustre/ckpt/"})
    files = render_files(llama70b_spec(site), ["all"])
    assert 'export CHECKPOINT_DIR="${CHECKPOINT_DIR:-/lustre/ckpt}"' in files["env.sh"]
    assert "'checkpoint.save': ('CHECKPOINT_DIR', '/lustre/ckpt')," in files["bridge_recipe.py"]
    assert """checkpoint.load='${oc.env:CHECKPOINT_DIR,"/lustre/ckpt"}'""" in files["bridge_overrides.txt"]
    assert "- name: CHECKPOINT_DIR\n      value: /lustre/ckpt" in files["trainjob.yaml"]
    assert "PLACEHOLDER: CHECKPOINT_DIR is '/lustre/ckpt' inside the container and no volume" in files["trainjob.yaml"]
    with pytest.raises(Exception, match=r"site\.checkpoint_dir: expected an absolute path"):
        site_from_dict({"checkpoint_dir": "ckpt"})


def test_check_reports_a_missing_fsdp_flag(tmp_path: Path) -> None:
    spec = plan_spec("llama3-8b-fsdp")
    out = tmp_path / "launch"
    write_files(render_files(spec, ["slurm"]), out)
    ok = check_parsed(parse_file(out / "job.sbatch"), spec.cluster.gpu, num_gpus=16)
    assert ok.violations == ()
    args = (out / "megatron_args.sh").read_text(encoding="utf-8")
    # the guide's list: one line per missing flag, naming the flag and the guide
    for flag in ("--data-parallel-sharding-strategy",):
        start = args.index(f"  {flag}")
        line = args[start:args.index("\n", start) + 1]
        (out / "megatron_args.sh").write_text(args.replace(line, ""), encoding="utf-8")
        broken = check_parsed(parse_file(out / "job.sbatch"), spec.cluster.gpu, num_gpus=16)
        assert [(c, "guide" in m) for c, m in broken.violations if flag in m] == [("FSDP_REQUIRED_FLAG", True)]
    # Megatron sets the distributed optimizer itself and NVIDIA's own FSDP recipes keep gradient-accumulation
    # fusion: neither is required
    for flag in ("--no-gradient-accumulation-fusion", "--use-distributed-optimizer"):
        (out / "megatron_args.sh").write_text(args.replace(f"  {flag}\n", ""), encoding="utf-8")
        assert check_parsed(parse_file(out / "job.sbatch"), spec.cluster.gpu, num_gpus=16).violations == ()
    (out / "megatron_args.sh").write_text(args.replace("fsdp_dtensor", "torch_dist"), encoding="utf-8")
    broken = check_parsed(parse_file(out / "job.sbatch"), spec.cluster.gpu, num_gpus=16)
    assert any("--ckpt-format fsdp_dtensor" in m for _, m in broken.violations)


def test_print_site_template_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--print-site-template"]) == 0
    printed = capsys.readouterr().out
    assert printed == SITE_TEMPLATE
    data = yaml.safe_load(printed)
    assert set(data) == set(SITE_KEYS)  # every key is documented
    (tmp_path / "site.yaml").write_text(printed, encoding="utf-8")
    site = load_site(tmp_path / "site.yaml")
    assert site.kubernetes.queue == "team-a" and site.qos == "normal" and site.checkpoint_dir == "/lustre/checkpoints"
    files = render_files(replace(llama70b_spec(), site=site), ["all"])  # every target reads it
    assert "#SBATCH --qos=normal" in files["job.sbatch"]
    assert "kueue.x-k8s.io/queue-name: team-a" in files["trainjob.yaml"]
    assert json.loads(files["manifest.json"])["site"]["kubernetes"]["queue"] == "team-a"


def test_launch_without_out_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--model", "llama3-8b"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err
