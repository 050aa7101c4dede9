"""pytorchjob.yaml parses and has the fields Kubeflow's PyTorchJob (kubeflow.org/v1) requires."""

from __future__ import annotations

import re
from typing import Any

import yaml

from paraplan.launch.megatron import argv, megatron_args
from paraplan.launch.render import LaunchSpec, render_files

from .cases import deepseek_uneven_spec, llama70b_spec, moe_single_node_spec


def job(spec: LaunchSpec) -> dict[str, Any]:
    doc = yaml.safe_load(render_files(spec, ["k8s"])["pytorchjob.yaml"])
    assert isinstance(doc, dict)
    return doc


def container(replica: dict[str, Any]) -> dict[str, Any]:
    containers = replica["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pytorch"]  # the operator requires this name
    return containers[0]  # type: ignore[no-any-return]


def test_multi_node_job_has_master_and_workers() -> None:
    doc = job(llama70b_spec())
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    assert doc["metadata"]["name"].startswith("paraplan-") and doc["metadata"]["namespace"] == "training"
    spec = doc["spec"]
    assert spec["nprocPerNode"] == "8"  # a string in the v1 API
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 7
    for role in ("Master", "Worker"):
        assert replicas[role]["restartPolicy"] == "OnFailure"
        c = container(replicas[role])
        assert c["image"] == "nvcr.io/nvidia/nemo:25.07"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert c["command"] == ["torchrun", "/opt/megatron-lm/pretrain_gpt.py"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        volumes = replicas[role]["template"]["spec"]["volumes"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in volumes
        assert replicas[role]["template"]["spec"]["imagePullSecrets"] == [{"name": "ngc"}]


def test_single_node_job_has_no_worker() -> None:
    replicas = job(moe_single_node_spec())["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master"}
    assert "PLACEHOLDER" in render_files(moe_single_node_spec(), ["k8s"])["pytorchjob.yaml"]


def test_args_are_the_megatron_args_with_env_references_defined() -> None:
    spec = deepseek_uneven_spec()
    c = container(job(spec)["spec"]["pytorchReplicaSpecs"]["Master"])
    env = {e["name"]: e["value"] for e in c["env"]}
    assert all(isinstance(v, str) for v in env.values())
    refs = {m.group(1) for a in c["args"] for m in re.finditer(r"\$\((\w+)\)", a)}
    assert refs and refs <= set(env)
    words = argv(megatron_args(spec.model, spec.layout, spec.training))
    assert [a for a in c["args"] if "$(" not in a] == [w for w in words if "${" not in w]
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["TOKENIZER_TYPE"] == "HuggingFaceTokenizer"
    assert env["DATA_PATH"] == "SET_DATA_PATH"


def test_site_env_fills_placeholders() -> None:
    c = container(job(llama70b_spec())["spec"]["pytorchReplicaSpecs"]["Worker"])
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["DATA_PATH"] == "/lustre/data/pile_text_document" and env["NCCL_IB_SL"] == "1"


def test_site_kubernetes_settings_reach_the_legacy_job_too() -> None:
    from paraplan.launch.site import site_from_dict

    from .test_trainjob import K8S_SITE

    doc = job(llama70b_spec(site_from_dict(K8S_SITE)))
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert doc["spec"]["runPolicy"] == {"suspend": True}
    for role in ("Master", "Worker"):
        pod = doc["spec"]["pytorchReplicaSpecs"][role]["template"]
        c = container(doc["spec"]["pytorchReplicaSpecs"][role])
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/ib": 8}
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert {"name": "lustre", "mountPath": "/lustre"} in c["volumeMounts"]
        assert {"name": "CHECKPOINT_DIR", "value": "/lustre/checkpoints"} in c["env"]
        assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"]
    assert "&" not in render_files(llama70b_spec(), ["k8s"])["pytorchjob.yaml"].split("spec:", 1)[1]  # no anchors
