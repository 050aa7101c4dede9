"""trainjob.yaml (Kubeflow Trainer v2) and the files it needs: a structural check of our own that always runs,
and a validation against the CRDs' OpenAPI schemas.

The issue asked for the CRD schemas vendored as test fixtures; the workplace does not allow committing files
from other repositories, so the schema test reads them from a kubeflow/trainer checkout named by
KUBEFLOW_TRAINER (manifests/base/crds/trainer.kubeflow.org_{trainjobs,clustertrainingruntimes}.yaml; checked
with kubeflow/trainer master 8c0f5059b of 2026-08-21, API trainer.kubeflow.org/v1alpha1) and is skipped without it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from paraplan.errors import SpecError
from paraplan.launch.megatron import argv, megatron_args
from paraplan.launch.render import LaunchSpec, render_files
from paraplan.launch.site import site_from_dict

from .cases import SITE, llama70b_spec
from .matrix import plan_spec

K8S_SITE = {**SITE, "checkpoint_dir": "/lustre/checkpoints", "env": {**SITE["env"], "ODD": "a$(HOME)b"},
            "kubernetes": {
                "queue": "team-a", "priority_class": "high", "rdma_resources": {"rdma/ib": 8},
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "node_affinity": {"topology.kubernetes.io/zone": ["zone-a", "zone-b"]},
                "topology_key": "cloud.provider.com/topology-block",
                "volumes": [{"name": "lustre", "mount_path": "/lustre", "pvc": "lustre-pvc"},
                            {"name": "models", "mount_path": "/models", "nfs_server": "nfs.example.com",
                             "nfs_path": "/export/models", "read_only": True}],
                "shm_size": "128Gi", "service_account": "trainer"}}


def files_for(spec: LaunchSpec) -> dict[str, str]:
    return render_files(spec, ["trainjob"])


def docs(text: str) -> dict[str, Any]:
    loaded = list(yaml.safe_load_all(text))
    assert len(loaded) == 1  # one document per file
    assert isinstance(loaded[0], dict)
    return loaded[0]


def k8s_spec() -> LaunchSpec:
    return llama70b_spec(site_from_dict(K8S_SITE))


def pod(job: dict[str, Any]) -> dict[str, Any]:
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"  # the replicated job of Kubeflow's torch runtimes
    return patch["template"]["spec"]["template"]  # type: ignore[no-any-return]


def test_trainjob_structure() -> None:
    spec = k8s_spec()
    files = files_for(spec)
    assert set(files) == {"megatron_args.sh", "env.sh", "trainjob.yaml", "manifest.json"}
    job = docs(files["trainjob.yaml"])
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    assert job["metadata"]["namespace"] == "training" and job["metadata"]["name"].startswith("paraplan-")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert job["spec"]["suspend"] is True  # Kueue unsuspends it on admission
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed", "kind": "ClusterTrainingRuntime",
                                         "apiGroup": "trainer.kubeflow.org"}
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == "nvcr.io/nvidia/nemo:25.07"
    assert trainer["numNodes"] == 8 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 8, "rdma/ib": 8}
    assert trainer["command"] == ["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"]
    template = pod(job)
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-block"}
    p = template["spec"]
    (container,) = p["containers"]
    assert container["name"] == "node"
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"},
                                         {"name": "lustre", "mountPath": "/lustre"},
                                         {"name": "models", "mountPath": "/models", "readOnly": True}]
    assert p["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Gi"}}
    assert p["volumes"][1] == {"name": "lustre", "persistentVolumeClaim": {"claimName": "lustre-pvc",
                                                                           "readOnly": False}}
    assert p["volumes"][2]["nfs"] == {"server": "nfs.example.com", "path": "/export/models", "readOnly": True}
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert p["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    terms = p["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                            "values": ["zone-a", "zone-b"]}]}]
    assert p["imagePullSecrets"] == [{"name": "ngc"}] and p["serviceAccountName"] == "trainer"


def test_trainjob_args_are_the_megatron_args_and_every_reference_is_defined() -> None:
    spec = k8s_spec()
    trainer = docs(files_for(spec)["trainjob.yaml"])["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert len(trainer["args"]) <= 128 and len(trainer["env"]) <= 128  # the CRD's maxItems
    refs = {m.group(1) for a in [*trainer["args"], *trainer["command"]] for m in re.finditer(r"(?<!\$)\$\((\w+)\)", a)}
    assert refs and refs <= set(env)
    words: list[str] = []
    for a in trainer["args"]:
        words += a.split("=", 1) if a.startswith("--") and "=" in a else [a]
    expected = argv(megatron_args(spec.model, spec.layout, spec.training, arch=spec.cluster.gpu.arch))
    assert len(words) == len(expected)
    for got, want in zip(words, expected, strict=True):
        assert got == want or (want.startswith("${") and got == f"$({want[2:].split(':')[0].split('}')[0]})")
    assert env["CHECKPOINT_DIR"] == "/lustre/checkpoints" and env["DATA_PATH"] == "/lustre/data/pile_text_document"
    assert env["ODD"] == "a$$(HOME)b"  # a literal $( is escaped, Kubernetes does not expand it
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_no_site_gives_placeholders_and_no_queue() -> None:
    spec = plan_spec("mixtral-8x7b-ep8")
    text = files_for(spec)["trainjob.yaml"]
    job = docs(text)
    assert job["spec"]["suspend"] is False and "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert job["spec"]["trainer"]["image"].endswith("SET_CONTAINER_IMAGE")
    assert "PLACEHOLDER: CHECKPOINT_DIR" in text
    assert "securityContext" not in pod(job)["spec"]["containers"][0]  # no RDMA devices asked for


def test_gb200_multi_node_gets_a_compute_domain_claim() -> None:
    spec = plan_spec("deepseek-v3-gb200-fp8")
    files = files_for(spec)
    assert {"clustertrainingruntime.yaml", "computedomain.yaml"} <= set(files)
    job, runtime, domain = (docs(files[n]) for n in ("trainjob.yaml", "clustertrainingruntime.yaml",
                                                     "computedomain.yaml"))
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1" and domain["kind"] == "ComputeDomain"
    assert domain["spec"]["numNodes"] == spec.cluster.num_nodes == 64
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert job["spec"]["trainer"]["resourcesPerNode"]["claims"] == [{"name": "compute-domain-channel"}]
    rpod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert rpod["resourceClaims"] == [{"name": "compute-domain-channel", "resourceClaimTemplateName": template}]
    h100 = files_for(plan_spec("deepseek-v3-uneven"))
    assert "computedomain.yaml" not in h100 and "clustertrainingruntime.yaml" not in h100


def test_site_can_ask_for_the_runtime_file() -> None:
    site = site_from_dict({"kubernetes": {"create_runtime": True, "runtime": "megatron-torch"}})
    files = files_for(replace(llama70b_spec(), site=site))
    runtime = docs(files["clustertrainingruntime.yaml"])
    assert runtime["kind"] == "ClusterTrainingRuntime" and runtime["metadata"]["name"] == "megatron-torch"
    assert docs(files["trainjob.yaml"])["spec"]["runtimeRef"]["name"] == "megatron-torch"


def test_checkpoint_dir_must_be_on_a_writable_volume() -> None:
    data = {**K8S_SITE, "checkpoint_dir": "/models/ckpt"}  # /models is read-only
    with pytest.raises(SpecError, match=r"site\.checkpoint_dir: '/models/ckpt' is on no writable"):
        files_for(llama70b_spec(site_from_dict(data)))


@pytest.mark.parametrize(("data", "match"), [
    ({"volumes": [{"name": "Data", "mount_path": "/d", "pvc": "x"}]}, r"site\.kubernetes\.volumes\[0\]\.name: "),
    ({"volumes": [{"name": "d", "mount_path": "/d"}]}, r"site\.kubernetes\.volumes\[0\]: .*exactly one of"),
    ({"quue": "a"}, r"site\.kubernetes\.quue: unknown key \(allowed: runtime, "),
    ({"rdma_resources": {"rdma/ib": 0}}, r"site\.kubernetes\.rdma_resources\.rdma/ib: "),
    ({"rdma_resources": {"ib": 1}}, r"site\.kubernetes\.rdma_resources\.ib\.\[key\]: 'ib' is not a resource name"),
    ({"create_runtime": "yes"}, r"site\.kubernetes\.create_runtime: Input should be a valid boolean"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, r"tolerations\[0\]: .*takes no value"),
    ({"shm_size": "64 GB"}, r"site\.kubernetes\.shm_size: '64 GB' is not a quantity"),
    ({"queue": "team a\nx"}, r"site\.kubernetes\.queue: 'team a\\nx' is not a Kubernetes name"),
    ([1], r"site\.kubernetes: expected a mapping"),
])
def test_kubernetes_section_errors_name_the_field_in_one_line(data: Any, match: str) -> None:
    with pytest.raises(SpecError, match=match) as err:
        site_from_dict({"kubernetes": data})
    assert "\n" not in str(err.value)


def _crd_schema(root: Path, name: str) -> dict[str, Any]:
    doc = yaml.safe_load((root / "manifests/base/crds" / f"trainer.kubeflow.org_{name}.yaml").read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", ["site", "gb200", "no-site"])
def test_files_validate_against_the_trainer_crd_schemas(case: str) -> None:
    root = os.environ.get("KUBEFLOW_TRAINER")
    if not root or not (Path(root) / "manifests/base/crds").is_dir():
        pytest.skip("KUBEFLOW_TRAINER is not set to a kubeflow/trainer checkout")
    jsonschema = pytest.importorskip("jsonschema")
    spec = {"site": k8s_spec, "gb200": lambda: plan_spec("deepseek-v3-gb200-fp8"),
            "no-site": lambda: plan_spec("llama3-8b-fsdp")}[case]()
    files = files_for(spec)
    kinds = {"trainjob.yaml": "trainjobs", "clustertrainingruntime.yaml": "clustertrainingruntimes"}
    checked = 0
    for name, crd in kinds.items():
        if name in files:
            jsonschema.validate(docs(files[name]), _crd_schema(Path(root), crd))
            checked += 1
    assert checked == (2 if case == "gb200" else 1)
    broken = docs(files["trainjob.yaml"])
    broken["spec"]["trainer"]["numNodes"] = "eight"  # the schema check can fail
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _crd_schema(Path(root), "trainjobs"))


@pytest.mark.parametrize(("plan", "product", "contradicts"), [
    ("llama3.1-405b-gb200", "NVIDIA-H100-80GB-HBM3", True),
    ("llama3.1-405b-gb200", "NVIDIA-GB200", False),
    ("llama70b", "NVIDIA-H100-80GB-HBM3", False),
    ("llama70b", "NVIDIA-GB200", True),
])
def test_node_selector_naming_another_gpu_is_a_warning(plan: str, product: str, contradicts: bool) -> None:
    site = site_from_dict({"kubernetes": {"node_selector": {"nvidia.com/gpu.product": product}}})
    spec = llama70b_spec(site) if plan == "llama70b" else replace(plan_spec(plan), site=site)
    manifest = json.loads(render_files(spec, ["trainjob"])["manifest.json"])
    if contradicts:
        (warning,) = manifest["warnings"]
        assert f"'{product}' is not the plan's GPU ({spec.cluster.gpu.name})" in warning
    else:
        assert "warnings" not in manifest


def test_b200_is_not_read_as_gb200_and_affinity_is_checked() -> None:
    from paraplan.launch.kubernetes import gpu_product_warnings

    b200 = site_from_dict({"kubernetes": {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-GB200"},
                                          "node_affinity": {"nvidia.com/gpu.product": ["NVIDIA-B200", "NVIDIA-H200"]}}})
    (warning,) = gpu_product_warnings(b200, "b200")  # the affinity allows a B200: only the selector contradicts
    assert warning.startswith("site.kubernetes.node_selector nvidia.com/gpu.product: 'NVIDIA-GB200'")
    assert len(gpu_product_warnings(b200, "gb300")) == 2


def test_launch_prints_the_gpu_product_warning_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    site = tmp_path / "site.yaml"
    site.write_text("kubernetes:\n  node_selector:\n    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\n",
                    encoding="utf-8")
    args = ["launch", "--model", "llama3-8b", "--gpu", "gb200", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "64",
            "--target", "trainjob", "--site", str(site), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert lines == ["warning: site.kubernetes.node_selector nvidia.com/gpu.product: 'NVIDIA-H100-80GB-HBM3' is not "
                     "the plan's GPU (gb200)"]
