"""Hostile names and site values: no generated file runs anything it should not, YAML stays one document.

Every hostile string carries a command that would create the canary file if any shell or YAML
reader interpreted it; the shell files are checked with ``bash -n``, shellcheck (when installed),
then sourced / run with stub ``torchrun`` / ``srun`` / ``scontrol`` / ``module`` that only record
their argv, in an empty HOME and working directory: afterwards only the stubs' records exist.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paraplan.errors import SpecError
from paraplan.launch.quoting import one_line
from paraplan.launch.render import LaunchSpec, render_files, write_files
from paraplan.launch.site import site_from_dict
from paraplan.specs.cluster import make_cluster

from .cases import SITE, llama70b_spec, moe_single_node_spec

CANARY = "pwned"
"""Relative to the run's working directory (an empty temp dir); the strings below create it."""

HOSTILE = {
    "newline": f"x\ntouch {CANARY}\n# ",
    "carriage_return": f"x\rtouch {CANARY}\r",
    "command_substitution": f"$(touch {CANARY})",
    "backticks": f"`touch {CANARY}`",
    "semicolon": f"x; touch {CANARY}; #",
    "single_quote": f"x'; touch {CANARY}; '",
    "double_quote": f'x"; touch {CANARY}; "',
    "terminal_escape": "\x1b]0;owned\x07\x1b[2J",
    "jinja": "{{ 7 * 7 }}{% raw %}",
    "yaml_document": "x\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: evil}",
    "yaml_mapping": "a: b # c",
    "line_separators": f"x\u2028touch {CANARY}\u2029\x85\x7f",
    "bidi_override": "safe\u202e\u2066",
}
PRINTABLE = {k: v for k, v in HOSTILE.items() if one_line(v) == v}
"""The hostile strings a site value may hold (control characters are refused: see below)."""

STUBS = ("torchrun", "srun", "module")
RECORD = '#!/bin/sh\nprintf "%s\\0" "$(basename "$0")" "$@" >> "$STUB_LOG"\n'


def stub_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in STUBS:
        (bin_dir / name).write_text(RECORD, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\n'\n", encoding="utf-8")
    (bin_dir / "scontrol").chmod(0o755)
    return bin_dir


def run_everything(out: Path, tmp_path: Path, unset: tuple[str, ...] = ()) -> list[str]:
    """bash -n, shellcheck, source the sourced files, run the scripts: in an empty HOME and cwd (without the
    variables ``unset``: a site default yields to the user's environment)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    log = tmp_path / "stub.log"
    env = {"PATH": f"{stub_bin(tmp_path)}:/usr/bin:/bin", "HOME": str(home), "STUB_LOG": str(log),
           "TOKENIZER_MODEL": "t", "DATA_PATH": "/d", "MASTER_ADDR": "node-0", "SLURM_SUBMIT_DIR": str(out),
           "SLURM_NNODES": "8", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-a"}
    env = {k: v for k, v in env.items() if k not in unset}
    shell_files = [n for n in ("env.sh", "megatron_args.sh", "torchrun.sh", "job.sbatch") if (out / n).exists()]
    for name in shell_files:
        subprocess.run(["bash", "-n", str(out / name)], check=True, env=env)
        if shutil.which("shellcheck") is not None:
            proc = subprocess.run(["shellcheck", "-x", name], cwd=out, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    source = f'source {out}/env.sh && source {out}/megatron_args.sh && printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    args = subprocess.run(["bash", "-c", source], cwd=work, env=env, capture_output=True, text=True, check=True)
    for script in ("torchrun.sh", "job.sbatch"):
        if (out / script).exists():
            subprocess.run(["bash", str(out / script)], cwd=work, env=env, capture_output=True, check=True)
    assert not (work / CANARY).exists() and not (out / CANARY).exists()
    assert list(work.iterdir()) == [] and list(home.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bin", "home", "work", "stub.log", out.name])
    return args.stdout.split("\0")


def check_yaml_and_json(out: Path) -> tuple[dict[str, object], dict[str, object]]:
    """pytorchjob.yaml, trainjob.yaml (and its companions) are exactly one document each; manifest.json parses;
    bridge_recipe.py (when written) compiles and its tables are literals. pytorchjob and the manifest returned."""
    docs = list(yaml.safe_load_all((out / "pytorchjob.yaml").read_text(encoding="utf-8")))
    assert len(docs) == 1 and docs[0]["kind"] == "PyTorchJob"
    for name, kind in (("trainjob.yaml", "TrainJob"), ("clustertrainingruntime.yaml", "ClusterTrainingRuntime"),
                       ("computedomain.yaml", "ComputeDomain")):
        if (out / name).exists() or name == "trainjob.yaml":
            more = list(yaml.safe_load_all((out / name).read_text(encoding="utf-8")))
            assert len(more) == 1 and more[0]["kind"] == kind, name
    if (out / "bridge_recipe.py").exists():
        check_python(out / "bridge_recipe.py")
    return docs[0], json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def check_python(path: Path) -> dict[str, object]:
    """bridge_recipe.py compiles, every line is printable, its upper-case tables are literals (returned)."""
    import ast

    text = path.read_text(encoding="utf-8")
    assert all(line.isprintable() for line in text.split("\n"))
    tree = ast.parse(text)
    compile(tree, str(path), "exec")
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper() \
                and node.targets[0].id != "CHECKPOINT_DIR":
            tables[node.targets[0].id] = ast.literal_eval(node.value)
    return tables


def comment_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.lstrip().startswith("#")]


@pytest.mark.parametrize("make", [llama70b_spec, moe_single_node_spec], ids=["multi_node", "single_node"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_model_name_is_inert(case: str, make: Callable[[], LaunchSpec], tmp_path: Path) -> None:
    spec = make()
    spec = replace(spec, model=replace(spec.model, name=HOSTILE[case]))
    files = render_files(spec, ["all"])
    write_files(files, tmp_path / "launch")
    run_everything(tmp_path / "launch", tmp_path)
    _, manifest = check_yaml_and_json(tmp_path / "launch")
    assert manifest["inputs"]["model"]["name"] == HOSTILE[case]  # type: ignore[index]
    for name in ("megatron_args.sh", "torchrun.sh", "job.sbatch", "pytorchjob.yaml"):
        lines = files[name].split("\n")
        assert any(one_line(HOSTILE[case]) in line for line in comment_lines(files[name])), name
        assert all(line.isprintable() for line in lines), name  # no ESC, DEL, U+2028 ... in any file


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gpu_name_is_inert(case: str, tmp_path: Path) -> None:
    spec = llama70b_spec()
    gpu = replace(spec.cluster.gpu, name=HOSTILE[case])
    spec = replace(spec, cluster=make_cluster(gpu, spec.cluster.num_gpus, spec.cluster.gpus_per_node))
    write_files(render_files(spec, ["all"]), tmp_path / "launch")
    run_everything(tmp_path / "launch", tmp_path)
    _, manifest = check_yaml_and_json(tmp_path / "launch")
    assert manifest["inputs"]["cluster"]["gpu"] == HOSTILE[case]  # type: ignore[index]
    assert (tmp_path / "launch/bridge_recipe.py").exists()  # the base recipe: the GPU name only in comments
    for name in ("bridge_recipe.py", "trainjob.yaml"):
        text = (tmp_path / "launch" / name).read_text(encoding="utf-8")
        assert any(one_line(HOSTILE[case]) in line for line in comment_lines(text)), name


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_model_name_in_the_bridge_recipe_is_a_comment(case: str, tmp_path: Path) -> None:
    from paraplan.launch.bridge import choose_recipe, overrides, recipe_file

    spec = llama70b_spec()
    recipe = choose_recipe(spec)
    hostile = replace(spec, model=replace(spec.model, name=HOSTILE[case]))
    text = recipe_file(hostile, "c0ffee", recipe, overrides(hostile, recipe))
    (tmp_path / "bridge_recipe.py").write_text(text, encoding="utf-8")
    check_python(tmp_path / "bridge_recipe.py")
    assert any(one_line(HOSTILE[case]) in line for line in comment_lines(text))
    code = [line for line in text.split("\n") if not line.lstrip().startswith("#")]
    assert not any(CANARY in line for line in code)


@pytest.mark.parametrize("case", sorted(PRINTABLE))
def test_hostile_site_values_are_quoted(case: str, tmp_path: Path) -> None:
    value = PRINTABLE[case]
    site = site_from_dict({**SITE, "env": {"DATA_PATH": value, "NCCL_IB_SL": "1"}, "container_image": value,
                           "modules": [value], "container_mounts": [value], "namespace": value,
                           "image_pull_secret": value})
    write_files(render_files(llama70b_spec(site), ["all"]), tmp_path / "launch")
    args = run_everything(tmp_path / "launch", tmp_path, unset=("DATA_PATH",))
    assert args[args.index("--data-path") + 1] == value  # one word, exactly the value
    stub_words = (tmp_path / "stub.log").read_text(encoding="utf-8").split("\0")
    i = stub_words.index("module")
    assert stub_words[i:i + 3] == ["module", "load", value]
    assert f"--container-image={value}" in stub_words
    doc, manifest = check_yaml_and_json(tmp_path / "launch")
    job = yaml.safe_load((tmp_path / "launch/trainjob.yaml").read_text(encoding="utf-8"))
    assert job["metadata"]["namespace"] == value and job["spec"]["trainer"]["image"] == value
    assert {"name": "DATA_PATH", "value": value.replace("$", "$$")} in job["spec"]["trainer"]["env"]
    assert check_python(tmp_path / "launch/bridge_recipe.py")["ENV"] == {"DATA_PATH": value, "NCCL_IB_SL": "1",
                                                                          "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert doc["metadata"]["namespace"] == value  # type: ignore[index]
    container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert container["image"] == value
    assert {"name": "DATA_PATH", "value": value.replace("$", "$$")} in container["env"]  # $(..) not expanded
    assert manifest["env"]["DATA_PATH"] == value  # type: ignore[index]


@pytest.mark.parametrize("key", ["partition", "account", "time", "container_image", "namespace",
                                 "image_pull_secret", "megatron_path", "modules", "container_mounts",
                                 "extra_sbatch", "env"])
@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028"])
def test_control_characters_in_site_values_are_refused(key: str, char: str) -> None:
    value = f"--a{char}b" if key == "extra_sbatch" else f"a{char}b"
    data = {key: {"X": value}} if key == "env" else {key: value}
    field = "site.env.X" if key == "env" else f"site.{key}"
    with pytest.raises(SpecError, match=rf"^{field}: .*(control character|characters that cannot)"):
        site_from_dict(data)


def test_a_site_profile_built_in_code_is_checked_too() -> None:
    spec = llama70b_spec()
    bad = replace(spec.site, partition="batch\n#SBATCH --nodes=1000")
    with pytest.raises(SpecError, match=r"^site\.partition: "):
        render_files(replace(spec, site=bad), ["slurm"])


@pytest.mark.parametrize("option", ["--nodes=1000", "--qos=high --nodes=1000", "--qos=high -N 1000", "-N1000",
                                    "-vN 4", "--node=4", "--ntasks=9", "--ntasks-per-node=2", "-n 16",
                                    "--gpus=64", "-G 8", "--gpus-per-task=1", "--gres=gpu:4", "--gres gpu:h100:8",
                                    "--gre=gpu:1", "--tres-per-task=gres/gpu:1", '"--qos=high --nodes=1000"',
                                    "'-N' 4", "--nodelist=n[1-99]", "-w n1", "--nodefile=f"])
def test_extra_sbatch_may_not_change_geometry_in_any_spelling(option: str) -> None:
    with pytest.raises(SpecError, match=r"^site\.extra_sbatch: .* sets the job geometry"):
        site_from_dict({"extra_sbatch": [option]})


@pytest.mark.parametrize("option", ["--qos=high", "--gres=nvme:1", "--gpu-bind=closest", "-J name", "--mem=0",
                                    "--comment='two words'", "--reservation=big --qos=high"])
def test_extra_sbatch_keeps_other_options(option: str) -> None:
    assert site_from_dict({"extra_sbatch": [option]}).extra_sbatch == (option,)


def _plan_json(tmp_path: Path, edit: dict[str, str]) -> Path:
    from paraplan.cli import main

    plan = tmp_path / "plan.json"
    assert main(["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--top", "1",
                 "--tp", "1,2", "--pp", "1", "--save", str(plan)]) == 0
    doc = json.loads(plan.read_text(encoding="utf-8"))
    doc["inputs"]["model"]["name"] = edit["model"]
    doc["inputs"]["gpu"]["name"] = edit["gpu"]
    plan.write_text(json.dumps(doc), encoding="utf-8")
    return plan


@pytest.mark.parametrize("case", ["newline", "command_substitution", "yaml_document", "line_separators"])
def test_names_edited_into_plan_json_are_inert(case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    plan = _plan_json(tmp_path / "in", {"model": HOSTILE[case], "gpu": HOSTILE[case]})
    capsys.readouterr()
    code = main(["launch", "--plan", str(plan), "--out", str(tmp_path / "launch")])
    _, err = capsys.readouterr()
    if code != 0:  # refusing the edited plan in one line is fine too; a file that runs code is not
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "launch").exists()
        return
    shutil.rmtree(tmp_path / "in")
    run_everything(tmp_path / "launch", tmp_path)
    check_yaml_and_json(tmp_path / "launch")


def test_jinja_syntax_in_a_name_is_not_rendered() -> None:
    spec = llama70b_spec()
    files = render_files(replace(spec, model=replace(spec.model, name="{{ 7 * 7 }}")), ["megatron"])
    assert "{{ 7 * 7 }}" in files["megatron_args.sh"] and "49" not in comment_lines(files["megatron_args.sh"])[1]
