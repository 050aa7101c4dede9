"""Kubernetes launch files built as data and written by ``yaml.safe_dump`` (one document per file).

``trainjob.yaml``               Kubeflow Trainer v2 ``TrainJob`` (trainer.kubeflow.org/v1alpha1), referencing a
                                ``ClusterTrainingRuntime`` (default ``torch-distributed``, run by JobSet); the
                                site's pod settings go in ``spec.runtimePatches``
``clustertrainingruntime.yaml`` the runtime itself, when the site asks for it (``kubernetes.create_runtime``) or
                                the job needs a ComputeDomain claim on its pods
``computedomain.yaml``          GB200/GB300: the NVIDIA DRA driver's ``ComputeDomain`` (IMEX channel across the
                                NVL72 nodes of the job), claimed by every training pod

Pod settings from the site file (``paraplan.launch.k8s_site``): GPUs and RDMA devices per node, IPC_LOCK when
RDMA devices are requested, volumes and mounts (data, checkpoints), a memory-backed /dev/shm, node selector,
tolerations, node affinity, Kueue queue label and ``suspend``, Kueue topology-aware placement.

Values are data, never spliced into YAML text: names are validated (DNS labels), literal strings in ``args``
and ``env`` have ``$`` doubled, so Kubernetes expands only the ``$(VAR)`` references paraplan writes.
The Trainer's torch plugin gives torchrun its node count, rank and rendezvous (PET_* variables).
"""

from __future__ import annotations

import copy
from typing import Any, Final

import yaml

from paraplan.errors import SpecError
from paraplan.launch.megatron import UB_CFG_FILE, UB_CFG_PATH, Arg, ArgGroup, Placeholder
from paraplan.launch.quoting import one_line
from paraplan.launch.site import IMAGE_PLACEHOLDER, SiteProfile
from paraplan.specs.cluster import ClusterSpec

TRAINER_API: Final = "trainer.kubeflow.org/v1alpha1"
TRAINER_GROUP: Final = "trainer.kubeflow.org"
COMPUTE_DOMAIN_API: Final = "resource.nvidia.com/v1beta1"
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
KUEUE_PREFERRED_TOPOLOGY: Final = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_REQUIRED_TOPOLOGY: Final = "kueue.x-k8s.io/podset-required-topology"
TRAINER_NODE: Final = "node"
"""Replicated job and container name of Kubeflow's torch runtimes (``torch-distributed``)."""
CLAIM_NAME: Final = "compute-domain-channel"
MAX_LIST_ITEMS: Final = 128
"""TrainJob ``spec.trainer.args``/``command``/``env`` hold at most 128 items (the CRD's maxItems)."""


UB_CFG_MOUNT: Final = "/etc/paraplan/userbuffers"
"""Where every training pod mounts the userbuffers ConfigMap (read-only): Megatron-LM opens
``--tp-comm-overlap-cfg`` on every rank (training/initialize.py ``_initialize_tp_communicators``)."""
UB_CFG_VOLUME: Final = "paraplan-ub-cfg"


def ub_config_map_name(job_name: str) -> str:
    return f"{job_name}-ub-cfg"


def _ub_config_map_of(job_name: str, ub_cfg: str | None) -> str | None:
    """The userbuffers ConfigMap's name for ``pod_patch``, None without a config."""
    return None if ub_cfg is None else ub_config_map_name(job_name)


def ub_config_map(job_name: str, site: SiteProfile, text: str) -> dict[str, Any]:
    """The ConfigMap holding ``UB_CFG_FILE`` (its data the YAML text, quoted as YAML by ``yaml.safe_dump``)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": ub_config_map_name(job_name),
                         **({"namespace": site.namespace} if site.namespace else {})},
            "data": {UB_CFG_FILE: text}}


def _ub_groups(groups: tuple[ArgGroup, ...], ub_cfg: str | None) -> tuple[ArgGroup, ...]:
    """``groups`` with ``--tp-comm-overlap-cfg`` pointing at the mounted ConfigMap (``UB_CFG_MOUNT``) instead of
    ``$LAUNCH_DIR``, which a pod does not have."""
    if ub_cfg is None:
        return groups
    path = f"{UB_CFG_MOUNT}/{UB_CFG_FILE}"
    return tuple(ArgGroup(g.title, tuple(Arg(a.flag, tuple(path if v == UB_CFG_PATH else v for v in a.values))
                                         for a in g.args)) for g in groups)


def _with_config_map(text: str, job_name: str, site: SiteProfile, ub_cfg: str | None) -> str:
    """A manifest's text with the userbuffers ConfigMap as its first document (applied before the job)."""
    if ub_cfg is None:
        return text
    cm = yaml.safe_dump(ub_config_map(job_name, site, ub_cfg), sort_keys=False, width=10_000, allow_unicode=False)
    lines = text.splitlines(keepends=True)
    n = next((k for k, line in enumerate(lines) if not line.startswith("#")), len(lines))  # the header comments
    head = lines[:n]
    note = (f"# ConfigMap {ub_config_map_name(job_name)}: the --tp-comm-overlap-cfg file, mounted read-only at "
            f"{UB_CFG_MOUNT} in every pod\n")
    return "".join(head) + note + cm + "---\n" + "".join(lines[n:])


def k8s_literal(text: str) -> str:
    """``text`` as Kubernetes passes it on: ``$`` doubled, so no ``$(VAR)`` in it is expanded."""
    return text.replace("$", "$$")


GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
"""The node label NVIDIA GPU Feature Discovery sets to the GPU's product name (e.g. NVIDIA-H100-80GB-HBM3)."""
GPU_PRODUCT_TOKENS: Final = {"a100-40gb": "A100", "a100-80gb": "A100", "h100-80gb": "H100", "h200-141gb": "H200",
                             "b200": "B200", "b300": "B300", "gb200": "GB200", "gb300": "GB300", "mi300x": "MI300X"}
"""paraplan GPU -> the word of the product label that names it (the label's words are split at '-' and '_', so
B200 does not match NVIDIA-GB200)."""


def _names_gpu(product: str, gpu_name: str) -> bool:
    token = GPU_PRODUCT_TOKENS.get(gpu_name)
    return token is None or token in product.upper().replace("_", "-").split("-")


def gpu_product_warnings(site: SiteProfile, gpu_name: str) -> list[str]:
    """One line for each site node selector / required node affinity on ``nvidia.com/gpu.product`` that names
    another GPU than the plan's (the pods would land on GPUs the plan did not price, or never schedule)."""
    k = site.kubernetes
    out: list[str] = []
    product = k.node_selector.get(GPU_PRODUCT_LABEL)
    if product is not None and not _names_gpu(product, gpu_name):
        out.append(f"site.kubernetes.node_selector {GPU_PRODUCT_LABEL}: {product!r} is not the plan's GPU "
                   f"({gpu_name})")
    allowed = k.node_affinity.get(GPU_PRODUCT_LABEL)
    if allowed and not any(_names_gpu(v, gpu_name) for v in allowed):
        out.append(f"site.kubernetes.node_affinity {GPU_PRODUCT_LABEL}: {', '.join(allowed)} do not include the "
                   f"plan's GPU ({gpu_name})")
    return [one_line(w) for w in out]


def needs_compute_domain(cluster: ClusterSpec) -> bool:
    """Whether the job spans several nodes of one multi-node NVLink domain (GB200/GB300 NVL72): the pods then
    need an IMEX channel from a ComputeDomain to use NVLink across nodes (EP/TP groups over MNNVL)."""
    return cluster.nvlink_domain_size > cluster.gpus_per_node and cluster.num_nodes > 1


def _k8s_ref(v: Placeholder) -> str:
    """A placeholder as a Kubernetes ``$(VAR)`` reference, its literal suffix after it."""
    return f"$({v.env})" + (k8s_literal(v.suffix) if v.suffix else "")


def container_args(groups: tuple[ArgGroup, ...], site_env: dict[str, str]) -> tuple[list[str], list[dict[str, str]]]:
    """Megatron arguments for a container (``--flag=value`` where the flag takes one value, so that the list
    stays within the CRD's 128 items) and the env entries the ``$(VAR)`` references need."""
    words: list[str] = []
    refs: list[dict[str, str]] = []
    seen: set[str] = set()
    for group in groups:
        for arg in group.args:
            values = []
            for v in arg.values:
                if not isinstance(v, Placeholder):
                    values.append(k8s_literal(v))
                    continue
                values.append(_k8s_ref(v))
                if v.env not in seen and v.env not in site_env:
                    seen.add(v.env)
                    refs.append({"name": v.env, "value": v.default if v.default is not None else f"SET_{v.env}"})
            words += [f"{arg.flag}={values[0]}"] if len(values) == 1 else [arg.flag, *values]
    return words, refs


def _pod_env(env: list[tuple[str, str, str]], refs: list[dict[str, str]], site: SiteProfile) -> list[dict[str, str]]:
    out = [{"name": "MEGATRON_PATH", "value": k8s_literal(site.megatron_path)}]
    out += [{"name": name, "value": k8s_literal(value)} for name, value, _ in env]
    names = {e["name"] for e in out}
    out += [r for r in refs if r["name"] not in names]
    return out


def _check_checkpoint_dir(site: SiteProfile) -> None:
    """With volumes declared, checkpoint_dir must be on a writable one (SpecError); without any, trainjob.yaml
    says so in a PLACEHOLDER comment (a Slurm-only site file still writes every target)."""
    ckpt = site.checkpoint_dir
    if ckpt is None or not site.kubernetes.volumes:
        return
    mounts = [v.mount_path.rstrip("/") for v in site.kubernetes.volumes if not v.read_only]
    if not any(ckpt == m or ckpt.startswith(m + "/") for m in mounts):
        raise SpecError(f"site.checkpoint_dir: {ckpt!r} is on no writable site.kubernetes.volumes mount_path "
                        f"({', '.join(mounts) or 'none given'}); checkpoints would be lost with the pod")


def _affinity(site: SiteProfile) -> dict[str, Any] | None:
    terms = [{"key": k, "operator": "In", "values": list(v)} for k, v in site.kubernetes.node_affinity.items()]
    if not terms:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def pod_patch(site: SiteProfile, *, container: str, ub_config_map: str | None = None) -> dict[str, Any]:
    """Pod settings of the site: mounts, volumes (with /dev/shm), IPC_LOCK, scheduling, pull secret; the
    userbuffers ConfigMap ``ub_config_map`` mounted read-only at ``UB_CFG_MOUNT`` when given."""
    k = site.kubernetes
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    mounts += [{"name": v.name, "mountPath": v.mount_path, **({"readOnly": True} if v.read_only else {})}
               for v in k.volumes]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k.shm_size}}]
    volumes += [{"name": v.name, **v.source()} for v in k.volumes]
    if ub_config_map is not None:
        if any(v.name == UB_CFG_VOLUME for v in k.volumes):
            raise SpecError(f"site.kubernetes.volumes: the name {UB_CFG_VOLUME!r} is paraplan's (the userbuffers "
                            "ConfigMap); rename the volume")
        mounts.append({"name": UB_CFG_VOLUME, "mountPath": UB_CFG_MOUNT, "readOnly": True})
        volumes.append({"name": UB_CFG_VOLUME, "configMap": {"name": ub_config_map}})
    c: dict[str, Any] = {"name": container, "volumeMounts": mounts}
    if k.rdma_resources:  # RDMA (GPUDirect, verbs) needs locked memory
        c["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    spec: dict[str, Any] = {"containers": [c], "volumes": volumes}
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in k.tolerations]
    affinity = _affinity(site)
    if affinity is not None:
        spec["affinity"] = affinity
    if site.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": site.image_pull_secret}]
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    return spec


def topology_annotations(site: SiteProfile) -> dict[str, str]:
    """Kueue topology-aware scheduling of the training pods (when the site names its topology label)."""
    key = site.kubernetes.topology_key
    if key is None:
        return {}
    return {KUEUE_REQUIRED_TOPOLOGY if site.kubernetes.topology_required else KUEUE_PREFERRED_TOPOLOGY: key}


def compute_domain_name(job_name: str, site: SiteProfile) -> str:
    return site.kubernetes.compute_domain or f"{job_name}-compute-domain"


def dump(doc: dict[str, Any], header: list[str]) -> str:
    """One YAML document: ``#`` header lines (one line each, printable), then ``yaml.safe_dump`` of ``doc``."""
    lines = [f"# {one_line(h)}" for h in header]
    return "\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=10_000, allow_unicode=False)


def _runtime(name: str, site: SiteProfile, image: str, gpus: int, claim_template: str | None) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": [{"name": TRAINER_NODE, "image": image,
                                           "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if claim_template is not None:
        pod["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template}]
    return {
        "apiVersion": TRAINER_API, "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
            "name": TRAINER_NODE,
            "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                         "spec": {"template": {"spec": pod}}}}]}}},
    }


def trainjob_files(*, job_name: str, candidate_id: str, header: list[str], cluster: ClusterSpec, site: SiteProfile,
                   groups: tuple[ArgGroup, ...], env: list[tuple[str, str, str]], gpus_per_node: int,
                   ub_cfg: str | None = None) -> dict[str, str]:
    """trainjob.yaml (with the userbuffers ConfigMap ``ub_cfg``, the YAML text, when given), and
    clustertrainingruntime.yaml / computedomain.yaml where needed."""
    _check_checkpoint_dir(site)
    groups = _ub_groups(groups, ub_cfg)
    k = site.kubernetes
    site_env = dict(site.env)
    args, refs = container_args(groups, site_env)
    pod_env = _pod_env(env, refs, site)
    for what, items in (("args", args), ("env", pod_env)):
        if len(items) > MAX_LIST_ITEMS:
            raise SpecError(f"trainjob: {len(items)} {what} entries, more than the TrainJob CRD allows "
                            f"({MAX_LIST_ITEMS}); move site.env entries into the image or a ConfigMap")
    image = site.container_image or IMAGE_PLACEHOLDER
    domain = needs_compute_domain(cluster)
    make_runtime = k.create_runtime or domain
    runtime = f"{job_name}-runtime" if domain and not k.create_runtime else k.runtime
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpus_per_node, **k.rdma_resources}}
    if domain:
        resources["claims"] = [{"name": CLAIM_NAME}]
    labels = {"paraplan/candidate-id": candidate_id}
    if k.queue:
        labels[KUEUE_QUEUE_LABEL] = k.queue
    if k.priority_class:
        labels[KUEUE_PRIORITY_LABEL] = k.priority_class
    metadata: dict[str, Any] = {"name": job_name, **({"namespace": site.namespace} if site.namespace else {}),
                                "labels": labels}
    pod_meta: dict[str, Any] = {"annotations": topology_annotations(site)} if k.topology_key else {}
    suspend = k.suspend if k.suspend is not None else k.queue is not None
    job = {
        "apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata,
        "spec": {
            "suspend": suspend,
            "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime", "apiGroup": TRAINER_GROUP},
            "trainer": {"image": image, "command": ["torchrun", "$(MEGATRON_PATH)/pretrain_gpt.py"], "args": args,
                        "env": pod_env, "numNodes": cluster.num_nodes, "numProcPerNode": gpus_per_node,
                        "resourcesPerNode": resources},
            "runtimePatches": [{"manager": "paraplan", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": TRAINER_NODE, "template": {"spec": {"template": {
                    **({"metadata": pod_meta} if pod_meta else {}),
                    "spec": pod_patch(site, container=TRAINER_NODE,
                                      ub_config_map=_ub_config_map_of(job_name, ub_cfg))}}}}]}}}}],
        },
    }
    ckpt_note = [] if site.checkpoint_dir and k.volumes else [
        f"PLACEHOLDER: CHECKPOINT_DIR is {site.checkpoint_dir or 'checkpoints'!r} inside the container and no volume "
        "holds it (lost with the pod):", "set checkpoint_dir in site.yaml to a path on a kubernetes.volumes mount"]
    files = {"trainjob.yaml": dump(job, [*header, *ckpt_note, f"Runtime: ClusterTrainingRuntime {runtime}"
                                         + (" (clustertrainingruntime.yaml)" if make_runtime else
                                            " (installed with Kubeflow Trainer)"),
                                         "Apply: kubectl apply -f trainjob.yaml"
                                         + ("; Kueue admits it (suspend: true until then)" if k.queue else "")])}
    files["trainjob.yaml"] = _with_config_map(files["trainjob.yaml"], job_name, site, ub_cfg)
    if make_runtime:
        claim = compute_domain_name(job_name, site) if domain else None
        files["clustertrainingruntime.yaml"] = dump(
            _runtime(runtime, site, image, gpus_per_node, None if claim is None else f"{claim}-channel"),
            [*header, "Kubeflow Trainer v2 ClusterTrainingRuntime (torch, JobSet) for trainjob.yaml"])
    if domain:
        name = compute_domain_name(job_name, site)
        cd = {"apiVersion": COMPUTE_DOMAIN_API, "kind": "ComputeDomain",
              "metadata": {"name": name, **({"namespace": site.namespace} if site.namespace else {})},
              "spec": {"numNodes": cluster.num_nodes,
                       "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}}
        files["computedomain.yaml"] = dump(cd, [*header, "NVIDIA DRA driver ComputeDomain: one IMEX channel for the "
                                                f"{cluster.num_nodes} NVL72 nodes (multi-node NVLink); apply first"])
    return files


def pytorchjob_file(*, job_name: str, candidate_id: str, header: list[str], cluster: ClusterSpec, site: SiteProfile,
                    groups: tuple[ArgGroup, ...], env: list[tuple[str, str, str]], gpus_per_node: int,
                    ub_cfg: str | None = None) -> str:
    """pytorchjob.yaml: the legacy Kubeflow Training Operator v1 ``PyTorchJob`` (Master + Workers), with the same
    pod settings from the site as the TrainJob (the operator sets PET_* and MASTER_ADDR/PORT for torchrun), and the
    userbuffers ConfigMap ``ub_cfg`` (the YAML text) when given."""
    _check_checkpoint_dir(site)
    groups = _ub_groups(groups, ub_cfg)
    k = site.kubernetes
    words: list[str] = []
    for group in groups:
        for arg in group.args:
            words += [arg.flag, *(_k8s_ref(v) if isinstance(v, Placeholder) else k8s_literal(v) for v in arg.values)]
    _, refs = container_args(groups, dict(site.env))
    spec = pod_patch(site, container="pytorch",
                     ub_config_map=_ub_config_map_of(job_name, ub_cfg))
    container = spec["containers"][0]
    container.update({
        "image": site.container_image or IMAGE_PLACEHOLDER,
        "command": ["torchrun", f"{k8s_literal(site.megatron_path)}/pretrain_gpt.py"], "args": words,
        "env": _pod_env(env, refs, site),
        "resources": {"limits": {"nvidia.com/gpu": gpus_per_node, **k.rdma_resources}}})
    spec["containers"] = [{key: container[key] for key in ("name", "image", "command", "args", "env", "resources",
                                                           "volumeMounts", "securityContext") if key in container}]
    labels = {"paraplan/candidate-id": candidate_id, **({KUEUE_QUEUE_LABEL: k.queue} if k.queue else {}),
              **({KUEUE_PRIORITY_LABEL: k.priority_class} if k.priority_class else {})}
    template: dict[str, Any] = {"spec": spec}
    if k.topology_key:
        template = {"metadata": {"annotations": topology_annotations(site)}, "spec": spec}

    def replica(n: int) -> dict[str, Any]:  # a fresh copy each: no YAML anchors
        return {"replicas": n, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}

    replicas = {"Master": replica(1), **({"Worker": replica(cluster.num_nodes - 1)} if cluster.num_nodes > 1 else {})}
    suspend = k.suspend if k.suspend is not None else k.queue is not None
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": job_name, **({"namespace": site.namespace} if site.namespace else {}),
                        "labels": labels},
           "spec": {**({"runPolicy": {"suspend": True}} if suspend else {}), "nprocPerNode": str(gpus_per_node),
                    "pytorchReplicaSpecs": replicas}}
    notes = ["The operator sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and MASTER_ADDR/PORT for torchrun.",
             "$(VAR) in args is expanded by Kubernetes from the container env (a literal $ is written $$).",
             "Legacy Kubeflow Training Operator v1; trainjob.yaml is the Trainer v2 equivalent."]
    if not site.container_image:
        notes.append("PLACEHOLDER: set container_image in the site profile (an image with Megatron-LM at "
                     "megatron_path, e.g. NVIDIA's NeMo container)")
    return _with_config_map(dump(job, [*header, *notes]), job_name, site, ub_cfg)
