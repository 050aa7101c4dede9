"""The generated shell files: bash -n, shellcheck, and what they actually run (fake torchrun/srun)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from paraplan.launch.megatron import Placeholder, megatron_args
from paraplan.launch.render import render_files, write_files

from .cases import deepseek_uneven_spec, llama70b_spec, moe_single_node_spec

SHELL_FILES = ("megatron_args.sh", "env.sh", "torchrun.sh", "job.sbatch")
SPECS = {"llama70b": llama70b_spec, "moe_single_node": moe_single_node_spec,
         "deepseek_uneven": deepseek_uneven_spec}
ECHO_ARGS = '#!/usr/bin/env bash\nprintf "%s\\n" "$(basename "$0")" "$@"\n'


@pytest.fixture(params=sorted(SPECS))
def out_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    write_files(render_files(SPECS[request.param](), ["all"]), tmp_path / "launch")
    return tmp_path / "launch"


def fake_bin(tmp_path: Path, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(ECHO_ARGS, encoding="utf-8")
        path.chmod(0o755)
    return bin_dir


def resolved_args(spec_name: str, env: dict[str, str]) -> list[str]:
    spec = SPECS[spec_name]()
    out: list[str] = []
    for group in megatron_args(spec.model, spec.layout, spec.training, arch=spec.cluster.gpu.arch):
        for arg in group.args:
            out.append(arg.flag)
            for v in arg.values:
                if isinstance(v, Placeholder):
                    out.append(env.get(v.env, v.default or ""))
                else:
                    out.append(v)
    return out


@pytest.mark.parametrize("name", SHELL_FILES)
def test_bash_n_accepts_the_shell_files(out_dir: Path, name: str) -> None:
    subprocess.run(["bash", "-n", str(out_dir / name)], check=True)


@pytest.mark.parametrize("name", SHELL_FILES)
def test_shellcheck_passes(out_dir: Path, name: str) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (Debian package: shellcheck)")
    proc = subprocess.run(["shellcheck", "-x", name], cwd=out_dir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sourcing_the_args_gives_one_word_per_argument(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(deepseek_uneven_spec(), ["megatron"]), out)
    env = {"DATA_PATH": "/data/my corpus_text_document", "TOKENIZER_MODEL": "deepseek-ai/DeepSeek-V3",
           "LR": "1e-4", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", 'source ./megatron_args.sh && printf "%s\\n" "${MEGATRON_ARGS[@]}"'],
                          cwd=out, env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines() == resolved_args("deepseek_uneven", env)
    assert "[0]*3+[1]*58" in proc.stdout.splitlines()


def test_missing_data_path_stops_with_the_placeholder_message(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(llama70b_spec(), ["megatron"]), out)
    proc = subprocess.run(["bash", "-c", "source ./megatron_args.sh"], cwd=out,
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "set DATA_PATH" in proc.stderr


def test_torchrun_sh_runs_torchrun_with_rendezvous_and_the_args(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(llama70b_spec(), ["torchrun"]), out)
    bin_dir = fake_bin(tmp_path, "torchrun")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "node-0", "TOKENIZER_MODEL": "meta-llama/x"}
    proc = subprocess.run(["bash", str(out / "torchrun.sh")], env=env, capture_output=True, text=True,
                          check=True)
    words = proc.stdout.splitlines()
    assert words[:6] == ["torchrun", "--nnodes=8", "--nproc-per-node=8",
                         "--rdzv-id=paraplan-" + words[3].rsplit("-", 1)[-1], "--rdzv-backend=c10d",
                         "--rdzv-endpoint=node-0:29400"]
    assert words[6] == "/opt/megatron-lm/pretrain_gpt.py"
    # DATA_PATH comes from the site profile through env.sh
    assert words[7:] == resolved_args("llama70b", {**env, "DATA_PATH": "/lustre/data/pile_text_document"})


def test_single_node_torchrun_is_standalone(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(moe_single_node_spec(), ["torchrun"]), out)
    bin_dir = fake_bin(tmp_path, "torchrun")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DATA_PATH": "/d", "TOKENIZER_MODEL": "t",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    script = f'source {out}/env.sh; echo "CDMC=${{CUDA_DEVICE_MAX_CONNECTIONS:-unset}}"; bash {out}/torchrun.sh'
    words = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert words[0] == "CDMC=unset"  # FSDP: env.sh unsets it
    assert words[1:4] == ["torchrun", "--standalone", "--nproc-per-node=8"]


def test_sbatch_runs_srun_torchrun_per_node_with_the_environment(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_files(render_files(llama70b_spec(), ["slurm"]), out)
    bin_dir = fake_bin(tmp_path, "srun", "module")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n", encoding="utf-8")
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(out), "SLURM_NNODES": "8",
           "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[a-h]", "TOKENIZER_MODEL": "t"}
    words = subprocess.run(["bash", str(out / "job.sbatch")], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert words[:2] == ["module", "load"]
    srun = words[words.index("srun"):]
    assert srun[:4] == ["srun", "--kill-on-bad-exit=1", "--container-image=nvcr.io/nvidia/nemo:25.07",
                        "--container-mounts=/lustre:/lustre"]
    assert srun[4:10] == ["torchrun", "--nnodes=8", "--nproc-per-node=8", "--rdzv-id=42",
                          "--rdzv-backend=c10d", "--rdzv-endpoint=node-a:29400"]
    text = (out / "job.sbatch").read_text(encoding="utf-8")
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --exclusive", "#SBATCH --partition=batch", "#SBATCH --account=llm-team",
                 "#SBATCH --time=04:00:00", "#SBATCH --qos=high"):
        assert line in text.splitlines()
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (out / "env.sh").read_text(encoding="utf-8")
