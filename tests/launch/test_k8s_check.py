"""``paraplan check`` reads Kubeflow manifests: the trainjob.yaml / pytorchjob.yaml that launch writes come back as
the same job as its torchrun.sh (model, layout, training, world, the environment Megatron asserts), and any other
YAML is one line naming what it is."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import paraplan.cli.check  # noqa: F401  (registers the command)
from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.launch.check import check_parsed
from paraplan.launch.kubernetes import k8s_literal
from paraplan.launch.megatron import as_launched
from paraplan.launch.parse import k8s_expand, parse_file, parse_manifest
from paraplan.launch.render import LaunchSpec, render_files, write_files
from paraplan.specs.load import load_gpu

from .cases import deepseek_gb200_spec, llama70b_spec, moe_single_node_spec
from .matrix import plan_spec

MATRIX = ("deepseek-v3-fsdp-ep", "llama3-8b-full-iteration-graph", "qwen3-30b-a3b-te-graph-router",
          "llama3-8b-fine-grained-offload")
CASES: dict[str, Any] = {"llama70b": llama70b_spec, "moe_single_node": moe_single_node_spec,
                         "deepseek_gb200": deepseek_gb200_spec,
                         **{name: (lambda n=name: plan_spec(n)) for name in MATRIX}}
ASSERTED_ENV = ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_CPU_OFFLOAD_V1")


@pytest.mark.parametrize("case", sorted(CASES))
def test_launch_manifests_read_back_as_the_torchrun_script(case: str, tmp_path: Path) -> None:
    spec: LaunchSpec = CASES[case]()
    write_files(render_files(spec, ["torchrun", "k8s", "trainjob"]), tmp_path)
    script = parse_file(tmp_path / "torchrun.sh")
    gpu = load_gpu(spec.cluster.gpu.name)
    want_model, want_layout = as_launched(spec.model, spec.layout, spec.training)
    for name in ("trainjob.yaml", "pytorchjob.yaml"):
        parsed = parse_file(tmp_path / name)
        assert parsed.world_size == spec.cluster.num_gpus, name
        assert parsed.gpus_per_node == script.gpus_per_node == spec.cluster.gpus_per_node, name
        assert parsed.num_nodes == spec.cluster.num_nodes, name
        assert parsed.layout() == want_layout, name
        assert replace(parsed.flags.model, name=spec.model.name, source=spec.model.source) == want_model, name
        assert parsed.training() == spec.training, name
        assert parsed.flags.layout_fields == script.flags.layout_fields, name
        assert parsed.flags.training_fields == script.flags.training_fields, name
        assert parsed.unknown_flags == script.unknown_flags == (), name
        assert parsed.launcher[:1] == ("torchrun",), name
        assert {k: parsed.env.get(k) for k in ASSERTED_ENV} == {k: script.env.get(k) for k in ASSERTED_ENV}, name
        assert "$(" not in " ".join(parsed.args), name  # every reference the writer made is set in the env
        mine, theirs = check_parsed(parsed, gpu), check_parsed(script, gpu)
        assert mine.violations == theirs.violations, name
        assert mine.estimate is not None and theirs.estimate is not None
        assert mine.estimate.peak_bytes == theirs.estimate.peak_bytes, name


def test_check_cli_reads_a_trainjob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_files(render_files(llama70b_spec(), ["trainjob"]), tmp_path)
    assert main(["check", str(tmp_path / "trainjob.yaml"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 64 and out["layout"].startswith("tp4 pp4 vp5 cp2 dp2") and out["violations"] == []


def _job(**trainer: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}}


ARGS = ["--num-layers=4", "--hidden-size=256", "--num-attention-heads=4", "--seq-length=512",
        "--max-position-embeddings=512", "--micro-batch-size=1", "--global-batch-size=32", "--bf16",
        "--tensor-model-parallel-size=$(TP)"]


def test_world_from_nodes_and_gpus_per_node_and_env_references() -> None:
    """numProcPerNode defaults to auto: the GPUs of resourcesPerNode (kubeflow/trainer torch plugin)."""
    job = _job(command=["torchrun", "/m/pretrain_gpt.py"], args=ARGS, numNodes=2,
               resourcesPerNode={"limits": {"nvidia.com/gpu": 4}},
               env=[{"name": "TP", "value": "2"}, {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}])
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert (p.world_size, p.gpus_per_node, p.num_nodes) == (8, 4, 2)
    assert p.layout().tp == 2 and p.layout().dp == 4 and p.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_torchrun_options_win_over_the_manifest() -> None:
    job = _job(command=["torchrun", "--nproc-per-node=2", "/m/pretrain_gpt.py"], args=ARGS, numNodes=3,
               numProcPerNode=8, env=[{"name": "TP", "value": "1"}])
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert (p.world_size, p.gpus_per_node, p.num_nodes) == (6, 2, 3)


def test_bash_c_command_is_read_as_a_script_with_the_container_env() -> None:
    script = ("export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
              "torchrun --nnodes $PET_NNODES --nproc-per-node $PET_NPROC_PER_NODE /m/pretrain_gpt.py "
              + " ".join(a.replace("$(TP)", "$TP") for a in ARGS))
    job = _job(command=["/bin/bash", "-c"], args=[script], numNodes=2, numProcPerNode=8,
               env=[{"name": "TP", "value": "4"}])
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert (p.world_size, p.gpus_per_node) == (16, 8) and p.layout().tp == 4
    assert p.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_pytorchjob_world_is_the_replicas_times_nproc() -> None:
    container = {"name": "pytorch", "command": ["torchrun", "/m/pretrain_gpt.py"],
                 "args": [a.replace("$(TP)", "2") for a in ARGS], "resources": {"limits": {"nvidia.com/gpu": 8}}}
    pod = {"template": {"spec": {"containers": [container]}}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"},
           "spec": {"nprocPerNode": "auto", "pytorchReplicaSpecs": {"Master": {"replicas": 1, **pod},
                                                                     "Worker": {"replicas": 3, **pod}}}}
    p = parse_manifest(yaml.safe_dump(job), source="j.yaml")
    assert (p.world_size, p.gpus_per_node, p.num_nodes) == (32, 8, 4)


def test_a_manifest_without_a_world_size_says_which_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(_job(command=["torchrun", "/m/pretrain_gpt.py"], args=ARGS,
                                     env=[{"name": "TP", "value": "1"}])))
    assert main(["check", str(f)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "numNodes" in err and "--num-gpus" in err
    assert main(["check", str(f), "--num-gpus", "8", "--format", "json"]) == 0
    capsys.readouterr()
    container = {"name": "pytorch", "command": ["torchrun", "/m/pretrain_gpt.py"],
                 "args": [a.replace("$(TP)", "1") for a in ARGS]}
    f.write_text(yaml.safe_dump({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
        "pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [container]}}}}}}))
    assert main(["check", str(f)]) == 1
    assert "the PyTorchJob sets no process count per node (spec.nprocPerNode, or a nvidia.com/gpu limit); " \
        "pass --num-gpus" in capsys.readouterr().err


def test_k8s_expand_as_kubernetes_does() -> None:
    env = {"A": "x", "B": "y$z"}
    assert k8s_expand("$(A)-$(B)-$(C)-$$(A)-$$-$", env) == "x-y$z-$(C)-$(A)-$-$"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="$()AB x", max_size=30))
def test_a_literal_written_for_kubernetes_comes_back_as_written(text: str) -> None:
    assert k8s_expand(k8s_literal(text), {"A": "1", "B": "2"}) == text


def test_env_expansion_is_bounded() -> None:
    env = [{"name": "V0", "value": "x" * 1024}] + [{"name": f"V{i}", "value": f"$(V{i - 1})$(V{i - 1})"}
                                                   for i in range(1, 40)]
    job = _job(command=["torchrun", "/m/pretrain_gpt.py"], args=ARGS, numNodes=1, env=env)
    with pytest.raises(SpecError, match="expands to more than"):
        parse_manifest(yaml.safe_dump(job), source="j.yaml")


BAD: list[tuple[str, str]] = [
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", "a YAML 'Deployment'; check reads Kubeflow"),
    ("- a\n- b\n", "not a Kubernetes object; check reads Kubeflow TrainJob"),
    ("kind: TrainJob\napiVersion: [\n", "is not valid YAML"),
    ("apiVersion: kubeflow.org/v1\nkind: TrainJob\nspec: {}\n", "TrainJob apiVersion must be trainer.kubeflow.org/"),
    ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nspec: {runtimeRef: {name: r}}\n",
     "TrainJob has no spec.trainer"),
    (yaml.safe_dump(_job(numNodes=2)), "do not run pretrain_gpt.py (got none: the runtime has the command)"),
    (yaml.safe_dump(_job(command=["python", "train.py"], args=["--lr", "1"])), "do not run pretrain_gpt.py"),
    (yaml.safe_dump(_job(command="torchrun pretrain_gpt.py")), "spec.trainer.command must be a list of strings"),
    (yaml.safe_dump(_job(command=["torchrun", "pretrain_gpt.py"], args=ARGS, numNodes=-1)),
     "spec.trainer.numNodes must be a positive integer or auto"),
    (yaml.safe_dump(_job(command=["torchrun", "pretrain_gpt.py"], args=ARGS, env={"TP": 1})),
     "spec.trainer.env must be a list of name/value entries"),
    (yaml.safe_dump(_job(command=["torchrun", "pretrain_gpt.py"], args=ARGS, resourcesPerNode=[8])),
     "spec.trainer.resourcesPerNode must be a mapping"),
    (yaml.safe_dump(_job(command=["torchrun", "pretrain_gpt.py"], args=[2024, "--bf16"])),
     "spec.trainer.args must be a list of strings"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master:\n      template:\n"
     "        spec: {containers: [{name: main, command: [torchrun, pretrain_gpt.py]}]}\n",
     "has no container named pytorch"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master: [1]\n",
     "spec.pytorchReplicaSpecs.Master must be a mapping"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master:\n"
     "      replicas: two\n      template:\n"
     "        spec: {containers: [{name: pytorch, command: [torchrun, pretrain_gpt.py], args: [2026-01-01]}]}\n",
     "spec.pytorchReplicaSpecs.Master.replicas must be a positive integer"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: {pytorchReplicaSpecs: {}}\n",
     "PyTorchJob has no spec.pytorchReplicaSpecs"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master:\n      template:\n"
     "        spec: {containers: [{name: pytorch, command: [torchrun, pretrain_gpt.py], args: [--bf16]}]}\n"
     "    Worker:\n      template:\n"
     "        spec: {containers: [{name: pytorch, command: [torchrun, pretrain_gpt.py], args: [--fp16]}]}\n",
     "the Master and Worker pytorch containers run different commands"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_other_yaml_is_one_line(text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(text)
    assert main(["check", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_a_manifest_under_another_name_and_a_script_that_writes_one(tmp_path: Path) -> None:
    job = _job(command=["torchrun", "/m/pretrain_gpt.py"], args=ARGS, numNodes=1, numProcPerNode=2,
               env=[{"name": "TP", "value": "2"}])
    (tmp_path / "job.txt").write_text(yaml.safe_dump(job))
    assert parse_file(tmp_path / "job.txt").world_size == 2
    script = ("#!/bin/bash\ncat > job.yaml <<EOF\napiVersion: v1\nkind: ConfigMap\nEOF\n"
              "torchrun --nproc-per-node 2 /m/pretrain_gpt.py " + " ".join(a.replace("$(TP)", "1") for a in ARGS))
    (tmp_path / "run.sh").write_text(script)
    p = parse_file(tmp_path / "run.sh")
    assert p.world_size == 2 and p.layout().tp == 1


def test_a_kubectl_file_with_the_runtime_and_the_job(tmp_path: Path) -> None:
    """GB200 jobs come with computedomain.yaml and clustertrainingruntime.yaml; ``kubectl apply -f`` files often hold
    all of them: the one TrainJob among the documents is read."""
    files = render_files(deepseek_gb200_spec(), ["trainjob"])
    assert {"computedomain.yaml", "clustertrainingruntime.yaml"} <= set(files)
    bundle = tmp_path / "all.yaml"
    bundle.write_text("---\n".join(files[n] for n in ("computedomain.yaml", "clustertrainingruntime.yaml",
                                                      "trainjob.yaml")))
    (tmp_path / "trainjob.yaml").write_text(files["trainjob.yaml"])
    one, alone = parse_file(bundle), parse_file(tmp_path / "trainjob.yaml")
    assert (one.world_size, one.flags.layout_fields, one.flags.training_fields) == (
        alone.world_size, alone.flags.layout_fields, alone.flags.training_fields)
    two = tmp_path / "two.yaml"
    two.write_text(files["trainjob.yaml"] + "---\n" + files["trainjob.yaml"])
    with pytest.raises(SpecError, match="2 TrainJob / PyTorchJob documents; check reads one job a file"):
        parse_file(two)
    runtime_only = tmp_path / "runtime.yaml"
    runtime_only.write_text(files["clustertrainingruntime.yaml"])
    with pytest.raises(SpecError, match="a YAML 'ClusterTrainingRuntime'; check reads Kubeflow TrainJob"):
        parse_file(runtime_only)


def test_the_documents_of_a_stream_are_bounded() -> None:
    from paraplan.fileio import MAX_YAML_DOCUMENTS, load_yaml_documents

    assert load_yaml_documents("a: 1\n---\nb: 2\n", "x") == [{"a": 1}, {"b": 2}]
    with pytest.raises(SpecError, match=f"more than {MAX_YAML_DOCUMENTS} YAML documents"):
        load_yaml_documents("---\na: 1\n" * (MAX_YAML_DOCUMENTS + 1), "x")
