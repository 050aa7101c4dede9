"""Review findings on the manifests ``check`` reads (session 7, FIXC): a ``kind`` that is not a string, ``bash -c``
strings with their positional parameters, the messages about the container env, a torchrun ``--nnodes`` the job does
not start, PyTorchJob replica types read as the training operator reads them, and Master / Worker envs that differ."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paraplan.cli.check  # noqa: F401  (registers the command)
from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.launch.check import check_parsed
from paraplan.launch.parse import parse_manifest
from paraplan.launch.shell import shell_c
from paraplan.specs.load import load_gpu

ARGS = ["--num-layers=4", "--hidden-size=256", "--num-attention-heads=4", "--seq-length=512",
        "--max-position-embeddings=512", "--micro-batch-size=1", "--global-batch-size=32", "--bf16",
        "--tensor-model-parallel-size=2"]
ENV = [{"name": "MEGATRON_PATH", "value": "/opt/megatron-lm"}, {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]


def _job(**trainer: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2, "numProcPerNode": 4,
                                                                               "env": ENV, **trainer}}}


def _pytorchjob(master: dict[str, Any], worker: dict[str, Any] | None = None, **replicas: Any) -> dict[str, Any]:
    def pod(c: dict[str, Any]) -> dict[str, Any]:
        return {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i",
                                                      "command": ["torchrun", "/m/pretrain_gpt.py"], **c}]}}}
    specs = replicas or {"Master": {"replicas": 1, **pod(master)},
                         **({"Worker": {"replicas": 1, **pod(worker)}} if worker is not None else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"},
            "spec": {"nprocPerNode": "4", "pytorchReplicaSpecs": specs}}


def _cli_error(text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    f = tmp_path / "job.yaml"
    f.write_text(text)
    assert main(["check", str(f), "--gpu", "h100-80gb"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------------ 1: kind
@pytest.mark.parametrize("text", [
    "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: [TrainJob]\n",
    "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: {a: 1}\n",
    "apiVersion: v1\nkind: ConfigMap\n---\napiVersion: trainer.kubeflow.org/v1alpha1\nkind: {TrainJob: 1}\n",
    "kind: 5\n",
])
def test_a_kind_that_is_not_a_string_is_one_line(text: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(text, tmp_path, capsys)
    assert "kind must be a string" in err
    assert ("document 2: kind" in err) == text.startswith("apiVersion: v1\n")


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.floats(allow_nan=False, width=16),
                     st.text(alphabet="abc$()@ -=0128", max_size=12),
                     st.sampled_from(["auto", "gpu", "TrainJob", "PyTorchJob", "bash", "-c", "torchrun",
                                      "/m/pretrain_gpt.py", "$(TP)", '"$@"', "Master", "Worker", "master"]))
_TREES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["name", "value", "valueFrom", "command", "args", "env", "numNodes", "kind",
                                     "numProcPerNode", "replicas", "template", "spec", "containers", "limits",
                                     "nvidia.com/gpu", "Master", "Worker", "trainer", "x"]), inner, max_size=4)),
    max_leaves=12)
_PATHS = [("kind",), ("apiVersion",), ("spec",), ("spec", "trainer"), ("spec", "trainer", "command"),
          ("spec", "trainer", "args"), ("spec", "trainer", "env"), ("spec", "trainer", "numNodes"),
          ("spec", "trainer", "resourcesPerNode"), ("spec", "pytorchReplicaSpecs"),
          ("spec", "pytorchReplicaSpecs", "Master"), ("spec", "pytorchReplicaSpecs", "worker"),
          ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers"), ("spec", "nprocPerNode")]


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(key, {})
    if isinstance(node, dict):
        node[path[-1]] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["trainjob", "pytorchjob"]), path=st.sampled_from(_PATHS), value=_TREES,
       extra=st.lists(_TREES, max_size=2), command=st.sampled_from([
           ["torchrun", "/m/pretrain_gpt.py"], ["bash", "-c", 'torchrun /m/pretrain_gpt.py "$@"', "bash"],
           ["bash", "-xec", "torchrun $(MEGATRON_PATH)/pretrain_gpt.py $1 $2", "x"]]))
def test_any_structure_in_a_manifest_is_a_result_or_one_spec_error(
        base: str, path: tuple[str, ...], value: Any, extra: list[Any], command: list[str]) -> None:
    """Random YAML structures at any field of a TrainJob / PyTorchJob, and random documents beside it: the reader
    returns or raises SpecError, never another exception."""
    doc = _job(command=command, args=ARGS) if base == "trainjob" else _pytorchjob({"args": ARGS}, {"args": ARGS})
    if base == "pytorchjob" and path[:2] == ("spec", "trainer"):
        path = ("spec", "pytorchReplicaSpecs", "Worker", *path[2:])
    _set(doc, path, value)
    text = yaml.safe_dump_all([doc, *extra])
    try:
        parsed = parse_manifest(text, source="j.yaml")
    except SpecError as err:
        assert "\n" not in str(err)
        return
    assert parsed.flags.layout_fields["tp"] >= 1


# ------------------------------------------------------------------------------------------------ 2: bash -c
@pytest.mark.parametrize("command", [
    ["bash", "-c", 'exec torchrun $(MEGATRON_PATH)/pretrain_gpt.py "$@"', "bash"],
    ["bash", "-lc", 'cd /w && torchrun $(MEGATRON_PATH)/pretrain_gpt.py "$@"', "bash"],
    ["/bin/bash", "-ec", 'torchrun $(MEGATRON_PATH)/pretrain_gpt.py "${@}"', "train"],
    ["sh", "-xec", 'exec torchrun $(MEGATRON_PATH)/pretrain_gpt.py $*', "sh"],
    ["bash", "-o", "pipefail", "-c", 'torchrun $(MEGATRON_PATH)/pretrain_gpt.py "$@"', "bash"],
])
def test_bash_c_gives_the_args_as_positional_parameters(command: list[str]) -> None:
    p = parse_manifest(yaml.safe_dump(_job(command=command, args=ARGS)), source="j.yaml")
    assert p.flags.layout_fields["tp"] == 2 and p.flags.training_fields["global_batch_size"] == 32
    assert p.launcher == ("torchrun",) and p.world_size == 8
    assert "--bf16" in p.args and not any("$" in a for a in p.args)


def test_numbered_parameters_and_the_name_word() -> None:
    script = 'torchrun /m/pretrain_gpt.py "$1" --tensor-model-parallel-size=$2 ' + " ".join(ARGS[:-1])
    p = parse_manifest(yaml.safe_dump(_job(command=["bash", "-c", script, "name", "--use-distributed-optimizer"],
                                           args=["4"])), source="j.yaml")
    assert p.flags.layout_fields["tp"] == 4 and "--use-distributed-optimizer" in p.args
    assert "name" not in p.args  # $0, not an argument


def test_without_the_name_word_the_first_arg_is_dollar_0_as_bash_does() -> None:
    """``bash -c 'torchrun ... "$@"' --tensor-model-parallel-size=2 ...``: bash takes the first word as $0."""
    script = 'torchrun /m/pretrain_gpt.py "$@"'
    p = parse_manifest(yaml.safe_dump(_job(command=["bash", "-c", script], args=["--lost", *ARGS])), source="j.yaml")
    assert "--lost" not in p.args and p.flags.layout_fields["tp"] == 2
    notes = [n for n in p.flags.notes if n.startswith("bash -c:")]  # said, in one line
    assert len(notes) == 1 and "'--lost' is the command string's $0" in notes[0] and "\n" not in notes[0]


@pytest.mark.parametrize(("command", "args"), [
    (["bash", "-c", 'torchrun /m/pretrain_gpt.py "$@"', "bash"], ARGS),  # the name word
    (["bash", "-c", "torchrun /m/pretrain_gpt.py " + " ".join(ARGS)], ["--unused"]),  # no $@: nothing dropped
    (["torchrun", "/m/pretrain_gpt.py"], ARGS),  # no bash -c
])
def test_no_dollar_0_note_where_no_flag_is_lost(command: list[str], args: list[str]) -> None:
    p = parse_manifest(yaml.safe_dump(_job(command=command, args=args)), source="j.yaml")
    assert p.flags.layout_fields["tp"] == 2 and not any(n.startswith("bash -c:") for n in p.flags.notes)


def test_a_script_with_bash_c_and_no_name_word_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same in a launch script (the reader follows bash -c inside it); check prints the note, in JSON too."""
    import json

    monkeypatch.setenv("COLUMNS", "400")
    f = tmp_path / "train.sh"
    f.write_text("bash -c 'torchrun --nproc-per-node 8 /m/pretrain_gpt.py " + " ".join(ARGS[:-1]) + ' "$@"\' '
                 "--tensor-model-parallel-size 2 --use-distributed-optimizer\n")
    assert main(["check", str(f), "--gpu", "h100-80gb", "--format", "json"]) in (0, 1)
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("bash -c:")]
    assert notes == ["bash -c: '--tensor-model-parallel-size' is the command string's $0 (bash takes the first word "
                     "after the string as $0), so \"$@\" leaves it out and the command line runs without it; write a "
                     "name word before the arguments (bash -c '...' bash --flag ...)"]
    assert main(["check", str(f), "--gpu", "h100-80gb"]) in (0, 1)
    assert "note: bash -c: '--tensor-model-parallel-size' is the command string's $0" in capsys.readouterr().out


_OPTIONS = st.lists(st.sampled_from(["-e", "-x", "-l", "-ex", "-xe", "-o pipefail", "-eo pipefail", "--norc",
                                     "--noprofile", "+e", "-u"]), max_size=3)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@settings(max_examples=40, deadline=None)
@given(before=_OPTIONS, after=_OPTIONS, joined=st.booleans(),
       rest=st.lists(st.text(alphabet="ab -$", min_size=1, max_size=4), max_size=3))
def test_shell_c_reads_options_and_parameters_as_bash_does(before: list[str], after: list[str], joined: bool,
                                                           rest: list[str]) -> None:
    opts = [w for o in before for w in o.split()]
    words = ["bash", *opts, *(["-lc"] if joined else ["-c"]), *[w for o in after for w in o.split()]]
    script = 'printf "<%s>" "$0" "$@"'
    words += [script, *rest]
    found = shell_c(words)
    run = subprocess.run(words, capture_output=True, text=True, timeout=20,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    if found is None:  # a long option after a short one: bash refuses it
        assert run.returncode != 0 and any(w.startswith("--") for w in words[len(opts) + 2:] + opts[1:])
        return
    assert found[0] == script and run.returncode == 0
    assert run.stdout == "".join(f"<{w}>" for w in found[1])


def test_shell_c_is_none_without_c() -> None:
    assert shell_c(["bash", "-e", "train.sh", "-c"]) is None and shell_c(["bash", "-c"]) is None
    assert shell_c(["python", "-c", "x"]) is None


# ------------------------------------------------------------------------------------------------ 3: messages
def test_an_unset_reference_says_it_is_not_in_the_container_env(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(command=["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"],
               args=[*ARGS[:-1], "--tensor-model-parallel-size=$(UNDEFINED)"])
    err = _cli_error(yaml.safe_dump(job), tmp_path, capsys)
    assert "--tensor-model-parallel-size gets $(UNDEFINED) as written: UNDEFINED is not set in the container env" \
        in err and "command substitution" not in err
    forward = _job(command=["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"],
                   args=[*ARGS[:-1], "--tensor-model-parallel-size=$(TPX)"],
                   env=[*ENV, {"name": "TPX", "value": "$(TP)"}, {"name": "TP", "value": "2"}])
    err = _cli_error(yaml.safe_dump(forward), tmp_path, capsys)
    assert "TPX refers to $(TP), which is set after it" in err and "command substitution" not in err
    secret = _job(command=["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"],
                  args=[*ARGS[:-1], "--tensor-model-parallel-size=$(TP)"],
                  env=[*ENV, {"name": "TP", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "tp"}}}])
    assert "takes $(TP) from a valueFrom entry" in _cli_error(yaml.safe_dump(secret), tmp_path, capsys)


def test_a_literal_escape_and_a_defined_earlier_reference_are_fine() -> None:
    job = _job(command=["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"],
               args=[*ARGS[:-1], "--tensor-model-parallel-size=$(TPX)", "--data-path=$$(HOME)"],
               env=[*ENV, {"name": "TP", "value": "2"}, {"name": "TPX", "value": "$(TP)"}])
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert p.flags.layout_fields["tp"] == 2 and "--data-path=$(HOME)" in p.args


def test_missing_max_connections_names_the_container_env() -> None:
    job = _job(command=["torchrun", "/m/pretrain_gpt.py"], args=[*ARGS, "--sequence-parallel"], env=[])
    result = check_parsed(parse_manifest(yaml.safe_dump(job), source="j.yaml"), load_gpu("h100-80gb"))
    msgs = [m for c, m in result.violations if c == "CUDA_DEVICE_MAX_CONNECTIONS"]
    assert len(msgs) == 1 and msgs[0].endswith("(not set in the container env)")


@pytest.mark.parametrize(("nnodes", "problem"), [("--nnodes=4", True), ("--nnodes=1", True), ("--nnodes=2", False),
                                                 ("--nnodes=1:4", False), ("--nnodes=3:4", True)])
def test_torchrun_nnodes_the_job_does_not_start_is_a_problem(nnodes: str, problem: bool) -> None:
    job = _job(command=["torchrun", nnodes, "/m/pretrain_gpt.py"], args=ARGS, env=ENV)
    result = check_parsed(parse_manifest(yaml.safe_dump(job), source="j.yaml"), load_gpu("h100-80gb"))
    found = [m for c, m in result.violations if c == "NNODES_MISMATCH"]
    assert bool(found) == problem
    if problem:
        assert f"torchrun {nnodes} but the TrainJob starts 2 nodes (spec.trainer.numNodes)" in found[0]
        assert result.estimate is None


def test_pytorchjob_replica_types_are_read_as_the_operator_does(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Any case of Master / Worker is that type (setTypeNameToCamelCase); other types and a type written twice
    are refused, as is a Master with more than one replica (the webhook)."""
    job = _pytorchjob({"args": ARGS}, {"args": ARGS})
    specs = job["spec"]["pytorchReplicaSpecs"]
    specs["master"], specs["WORKER"] = specs.pop("Master"), specs.pop("Worker")
    specs["WORKER"]["replicas"] = 3
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert (p.num_nodes, p.world_size) == (4, 16)
    specs["Master"] = specs["master"]
    assert "has both 'Master' and 'master'" in _cli_error(yaml.safe_dump(job), tmp_path, capsys)
    del specs["Master"], specs["master"]
    specs["Chief"] = specs["WORKER"]
    assert "spec.pytorchReplicaSpecs.'Chief': a replica type must be Master or Worker" in _cli_error(
        yaml.safe_dump(job), tmp_path, capsys)
    two = _pytorchjob({"args": ARGS})
    two["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    assert "Master.replicas must be 1" in _cli_error(yaml.safe_dump(two), tmp_path, capsys)


def test_master_and_worker_env_that_the_job_reads_must_agree(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    args = [*ARGS[:-1], "--tensor-model-parallel-size=$(TP)"]
    same = _pytorchjob({"args": args, "env": [{"name": "TP", "value": "2"}, {"name": "ROLE", "value": "m"}]},
                       {"args": args, "env": [{"name": "TP", "value": "2"}, {"name": "ROLE", "value": "w"}]})
    assert parse_manifest(yaml.safe_dump(same), source="j.yaml").flags.layout_fields["tp"] == 2  # ROLE is not read
    differ = _pytorchjob({"args": args, "env": [{"name": "TP", "value": "2"}]},
                         {"args": args, "env": [{"name": "TP", "value": "4"}]})
    assert "set TP differently (Master '2', Worker '4')" in _cli_error(yaml.safe_dump(differ), tmp_path, capsys)
    only = _pytorchjob({"args": ARGS, "env": [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]},
                       {"args": ARGS})
    assert "set CUDA_DEVICE_MAX_CONNECTIONS differently (Master '1', Worker not set)" in _cli_error(
        yaml.safe_dump(only), tmp_path, capsys)
    script = 'torchrun /m/pretrain_gpt.py --tensor-model-parallel-size=$TP "$@"'
    shell = _pytorchjob({"command": ["bash", "-c", script, "bash"], "args": ARGS[:-1],
                         "env": [{"name": "TP", "value": "2"}]},
                        {"command": ["bash", "-c", script, "bash"], "args": ARGS[:-1],
                         "env": [{"name": "TP", "value": "8"}]})
    assert "set TP differently" in _cli_error(yaml.safe_dump(shell), tmp_path, capsys)


def test_a_script_running_bash_c_with_positional_parameters(tmp_path: Path) -> None:
    """The same positional parameters for a ``bash -c`` inside a script (srun bash -c '...' bash ARGS)."""
    from paraplan.launch.parse import parse_file

    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nsrun --nodes=1 --ntasks-per-node=2 bash -ec 'torchrun --nproc-per-node=2 "
                      "/m/pretrain_gpt.py \"$@\"' bash " + " ".join(ARGS) + "\n")
    p = parse_file(script)
    assert p.flags.layout_fields["tp"] == 2 and "--bf16" in p.args and p.world_size == 2
