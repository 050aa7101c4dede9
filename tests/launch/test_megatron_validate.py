"""Megatron-LM accepts every launch: the arguments of each matrix plan (``matrix.py``), read from the
megatron_args.sh and env.sh paraplan writes (sourced by bash, as torchrun.sh does), pass Megatron-LM's own
``parse_args`` + ``validate_args``, and the TransformerConfig built from them (``core_transformer_config_from_args``)
passes its own checks.

Optional: skipped unless MEGATRON_LM points at a Megatron-LM checkout (main d98e8a6 is what the flag
table was made from) and a Python with torch is given by MEGATRON_LM_PYTHON (default: this interpreter).
Megatron-LM's code is never copied here; ``megatron_validate_worker.py`` (our code) imports it from the
checkout, on CPU, with the stand-ins its docstring lists. Also: ``check`` of each written launch reports no
broken rule (always runs).

Setup (about 30 s for the 35 plans on 2 CPU cores): ``python3 -m venv /tmp/mlm-venv && /tmp/mlm-venv/bin/pip install
torch==2.13.0 numpy packaging einops``; ``git archive`` Megatron-LM into /tmp/src/megatron-lm; then run
with ``MEGATRON_LM=/tmp/src/megatron-lm MEGATRON_LM_PYTHON=/tmp/mlm-venv/bin/python``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from paraplan.launch.check import check_parsed
from paraplan.launch.parse import parse_file
from paraplan.launch.render import render_files, write_files

from .matrix import NAMES, _spec, plan_spec

HERE = Path(__file__).parent
CAPABILITY = {"ampere": [8, 0], "hopper": [9, 0], "blackwell": [10, 0]}
USER_VALUES = {"DATA_PATH": "/data/pile_text_document", "TOKENIZER_MODEL": "meta-llama/Meta-Llama-3-8B"}


def test_matrix_has_at_least_30_plans() -> None:
    assert len(NAMES) >= 30


def sourced(directory: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """(MEGATRON_ARGS, variables env.sh exports, variables env.sh unsets) as bash sees them."""
    script = ('set -euo pipefail; before="$(env -0 | sort -z | base64 -w0)"; source ./env.sh; '
              'source ./megatron_args.sh; printf "%s\\0" "${MEGATRON_ARGS[@]}" > args.bin; env -0 > env.bin; '
              'printf "%s" "${CUDA_DEVICE_MAX_CONNECTIONS-__unset__}" > cdmc.txt')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **USER_VALUES}
    subprocess.run(["bash", "-c", script], cwd=directory, env=env, check=True)
    words = (directory / "args.bin").read_bytes().decode().split("\0")[:-1]
    after = dict(item.split("=", 1) for item in (directory / "env.bin").read_bytes().decode().split("\0") if item)
    exported = {k: v for k, v in after.items() if env.get(k) != v and k not in ("PWD", "SHLVL", "_", "OLDPWD")}
    unset = ["CUDA_DEVICE_MAX_CONNECTIONS"] if (directory / "cdmc.txt").read_text() == "__unset__" else []
    return words, exported, unset


@cache
def written(name: str, root: str) -> Path:
    out = Path(root) / name
    write_files(render_files(plan_spec(name), ["all"]), out)
    return out


@pytest.fixture(scope="module")
def out_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("matrix"))


@pytest.mark.parametrize("name", NAMES)
def test_check_of_each_written_launch_reports_no_broken_rule(name: str, out_root: str) -> None:
    spec = plan_spec(name)
    out = written(name, out_root)
    for script in ("job.sbatch", "torchrun.sh"):
        result = check_parsed(parse_file(out / script), spec.cluster.gpu, num_gpus=spec.cluster.num_gpus,
                              gpus_per_node=spec.cluster.gpus_per_node)
        assert result.violations == (), f"{name}/{script}: {result.violations}"
        assert result.estimate is not None


def _megatron() -> tuple[str, str]:
    source = os.environ.get("MEGATRON_LM")
    if not source or not (Path(source) / "megatron/training/arguments.py").is_file():
        pytest.skip("MEGATRON_LM is not set to a Megatron-LM checkout")
    python = os.environ.get("MEGATRON_LM_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import torch (set MEGATRON_LM_PYTHON)")
    return source, python


@pytest.fixture(scope="module")
def megatron_results(out_root: str) -> dict[str, dict[str, Any]]:
    source, python = _megatron()
    cases = []
    for name in NAMES:
        spec = plan_spec(name)
        words, exported, unset = sourced(written(name, out_root))
        cases.append({"name": name, "argv": words, "env": exported, "unset": unset,
                      "world_size": spec.cluster.num_gpus, "capability": CAPABILITY[spec.cluster.gpu.arch]})
    return {r["name"]: r for r in _run_worker(python, source, cases, Path(out_root) / "results.json")}


def _run_worker(python: str, source: str, cases: list[dict[str, Any]], results: Path) -> list[dict[str, Any]]:
    done = subprocess.run([python, str(HERE / "megatron_validate_worker.py"), source, str(results)],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: list[dict[str, Any]] = json.loads(results.read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize("name", NAMES)
def test_megatron_lm_parse_args_and_validate_args_accept_the_launch(
        name: str, megatron_results: dict[str, dict[str, Any]]) -> None:
    result = megatron_results[name]
    assert result["ok"], f"{name}: {result['error']}"
    spec = plan_spec(name)
    assert result["data_parallel_size"] == spec.layout.dp  # Megatron derives the same DP from the world size
    assert result["config"] == ("MLATransformerConfig" if spec.model.multi_latent_attention else "TransformerConfig")


def test_megatron_lm_rejects_the_old_deepseek_launch(out_root: str) -> None:
    """The harness can fail: the DeepSeek-V3 flags as paraplan wrote them before (yarn with MTP) are refused."""
    source, python = _megatron()
    name = "deepseek-v3-uneven"
    spec = plan_spec(name)
    words, exported, unset = sourced(written(name, out_root))
    i = words.index("--position-embedding-type")
    old = [*words[:i + 1], "yarn", *words[i + 2:]]
    case = {"name": name, "argv": old, "env": exported, "unset": unset, "world_size": spec.cluster.num_gpus,
            "capability": CAPABILITY[spec.cluster.gpu.arch]}
    result = _run_worker(python, source, [case], Path(out_root) / "old.json")[0]
    assert not result["ok"] and "Multi-Token Prediction (MTP) is not supported with yarn" in result["error"]


def _opt_step_launch(root: Path) -> tuple[Path, Any]:
    """A Llama-3-70B launch (VP 5, distributed optimizer, --overlap-param-gather) with
    --overlap-param-gather-with-optimizer-step, as a recipe that sets it gives it."""
    from paraplan.specs.load import load_model

    spec = _spec(load_model("llama3-70b"), "h100-80gb", 64, {"tp": 4, "pp": 4, "vp": 5},
                 {"seq_len": 8192, "global_batch_size": 128, "overlap_param_gather_with_optimizer_step": True})
    out = root / "opt-step"
    if not out.exists():
        write_files(render_files(spec, ["all"]), out)
    return out, spec


def test_gather_with_optimizer_step_is_left_out_of_megatron_lm_files_with_a_comment(tmp_path: Path) -> None:
    out, spec = _opt_step_launch(tmp_path)
    args = (out / "megatron_args.sh").read_text()
    flag_lines = [line for line in args.splitlines() if "--overlap-param-gather-with-optimizer-step" in line]
    assert len(flag_lines) == 1 and flag_lines[0].lstrip().startswith("#") and "validate_args" in flag_lines[0]
    assert "--ckpt-format torch_dist" in args
    manifest = json.loads((out / "manifest.json").read_text())
    assert "left out" in manifest["left_out"][0]
    assert "overlap_param_gather_with_optimizer_step=true" in (out / "bridge_overrides.txt").read_text()
    for script in ("job.sbatch", "torchrun.sh"):
        result = check_parsed(parse_file(out / script), spec.cluster.gpu, num_gpus=spec.cluster.num_gpus,
                              gpus_per_node=spec.cluster.gpus_per_node)
        assert result.violations == (), result.violations


def test_megatron_lm_accepts_the_files_and_refuses_the_flag_with_torch_dist(tmp_path: Path) -> None:
    """Megatron-LM's validate_args takes the files as written and refuses them with the flag put back."""
    source, python = _megatron()
    out, spec = _opt_step_launch(tmp_path)
    words, exported, unset = sourced(out)
    base = {"env": exported, "unset": unset, "world_size": spec.cluster.num_gpus,
            "capability": CAPABILITY[spec.cluster.gpu.arch]}
    cases = [{"name": "as-written", "argv": words, **base},
             {"name": "with-flag", "argv": [*words, "--overlap-param-gather-with-optimizer-step"], **base}]
    written_ok, with_flag = _run_worker(python, source, cases, tmp_path / "opt-step.json")
    assert written_ok["ok"], written_ok["error"]
    assert not with_flag["ok"]
    assert "--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing" \
        in with_flag["error"]
