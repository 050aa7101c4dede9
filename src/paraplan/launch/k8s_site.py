"""The ``kubernetes:`` section of site.yaml: a pydantic model with path-qualified one-line errors.

Everything the Kubernetes targets (``trainjob``, ``pytorchjob``) need from the site: the Trainer v2
runtime, Kueue queue and suspend, RDMA device resources, node selector / tolerations / affinity,
topology-aware placement, volumes (data, checkpoints) and /dev/shm, the GB200/GB300 ComputeDomain.
Every string is checked for the place it lands in (a Kubernetes name, label value, resource name,
absolute path): the YAML itself is built as data and written by ``yaml.safe_dump``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints, ValidationError, model_validator

from paraplan.errors import SpecError

DNS_LABEL: Final = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
DNS_SUBDOMAIN: Final = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
LABEL_KEY: Final = rf"({DNS_SUBDOMAIN}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{{0,61}}[A-Za-z0-9])?"
LABEL_VALUE: Final = r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?"
RESOURCE_NAME: Final = rf"{DNS_SUBDOMAIN}/[A-Za-z0-9]([A-Za-z0-9_.-]{{0,61}}[A-Za-z0-9])?"
ABS_PATH: Final = r"/[A-Za-z0-9_.+@=,:/-]*"
QUANTITY: Final = r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?"

Name = Annotated[str, StringConstraints(pattern=rf"^{DNS_LABEL}$", max_length=63)]
Subdomain = Annotated[str, StringConstraints(pattern=rf"^{DNS_SUBDOMAIN}$", max_length=253)]
LabelKey = Annotated[str, StringConstraints(pattern=rf"^{LABEL_KEY}$", max_length=317)]
LabelValue = Annotated[str, StringConstraints(pattern=rf"^{LABEL_VALUE}$", max_length=63)]
ResourceName = Annotated[str, StringConstraints(pattern=rf"^{RESOURCE_NAME}$", max_length=317)]
AbsPath = Annotated[str, StringConstraints(pattern=rf"^{ABS_PATH}$", max_length=4096)]
Quantity = Annotated[str, StringConstraints(pattern=rf"^{QUANTITY}$", max_length=32)]
Count = Annotated[int, Field(ge=1, le=1024, strict=True)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Toleration(_Strict):
    """A pod toleration (``spec.tolerations[]``)."""

    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("operator Exists takes no value")
        return self


class Volume(_Strict):
    """A volume mounted into the training container: exactly one of ``pvc``, ``host_path``, ``nfs_server``
    (with ``nfs_path``)."""

    name: Name
    mount_path: AbsPath
    read_only: StrictBool = False
    pvc: Name | None = None
    host_path: AbsPath | None = None
    nfs_server: Subdomain | None = None
    nfs_path: AbsPath | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = [s for s in (self.pvc, self.host_path, self.nfs_server) if s is not None]
        if len(sources) != 1:
            raise ValueError("give exactly one of pvc, host_path, nfs_server")
        if (self.nfs_server is None) != (self.nfs_path is None):
            raise ValueError("nfs_server and nfs_path go together")
        if self.mount_path == "/dev/shm":
            raise ValueError("/dev/shm is mounted by paraplan (shm_size sets its size)")
        return self

    def source(self) -> dict[str, Any]:
        """The volume source as Kubernetes data."""
        if self.pvc is not None:
            return {"persistentVolumeClaim": {"claimName": self.pvc, "readOnly": self.read_only}}
        if self.host_path is not None:
            return {"hostPath": {"path": self.host_path, "type": "Directory"}}
        return {"nfs": {"server": self.nfs_server, "path": self.nfs_path, "readOnly": self.read_only}}


class KubernetesSite(_Strict):
    """The ``kubernetes:`` section (all optional)."""

    runtime: Name = "torch-distributed"
    """Trainer v2 ClusterTrainingRuntime the TrainJob references (Kubeflow ships ``torch-distributed``)."""
    create_runtime: StrictBool = False
    """Also write clustertrainingruntime.yaml (a JobSet-based torch runtime named ``runtime``)."""
    queue: Name | None = None
    """Kueue LocalQueue: label ``kueue.x-k8s.io/queue-name``; the job is created suspended for Kueue."""
    suspend: StrictBool | None = None
    """``spec.suspend`` (default: true when ``queue`` is set, else false)."""
    priority_class: Name | None = None
    """Kueue WorkloadPriorityClass (label ``kueue.x-k8s.io/priority-class``)."""
    rdma_resources: dict[ResourceName, Count] = Field(default_factory=dict)
    """Extended resources per node for the RDMA NICs, e.g. ``{"rdma/ib": 8}`` or
    ``{"nvidia.com/hostdev": 8}`` (with IPC_LOCK added to the container)."""
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    node_affinity: dict[LabelKey, tuple[LabelValue, ...]] = Field(default_factory=dict)
    """Required node affinity: label key -> allowed values (operator In)."""
    topology_key: LabelKey | None = None
    """Node label of the network block/rack (e.g. ``cloud.provider.com/topology-block``): Kueue
    topology-aware scheduling (``kueue.x-k8s.io/podset-preferred-topology``) for the training pods."""
    topology_required: StrictBool = False
    """Use ``podset-required-topology`` (all pods in one such domain) instead of preferred."""
    volumes: tuple[Volume, ...] = ()
    shm_size: Quantity = "64Gi"
    """Size of the memory-backed /dev/shm (NCCL and the data loader use it)."""
    compute_domain: Name | None = None
    """GB200/GB300 NVLink (IMEX) ComputeDomain's ResourceClaimTemplate name (NVIDIA DRA driver). Default:
    ``<job name>-compute-domain`` whenever the plan spans several NVL72 nodes."""
    service_account: Name | None = None

    @model_validator(mode="after")
    def _unique_volumes(self) -> KubernetesSite:
        names = [v.name for v in self.volumes]
        paths = [v.mount_path for v in self.volumes]
        if len(set(names)) != len(names) or "dshm" in names:
            raise ValueError("volume names must be unique and not 'dshm'")
        if len(set(paths)) != len(paths):
            raise ValueError("volume mount_paths must be unique")
        return self


_PATTERN_WORDS: Final = {
    DNS_LABEL: "a Kubernetes name (lower-case letters, digits and '-', at most 63)",
    DNS_SUBDOMAIN: "a DNS name (lower-case letters, digits, '-' and '.')",
    LABEL_KEY: "a label key ([prefix/]name of letters, digits, '-', '_', '.')",
    LABEL_VALUE: "a label value (letters, digits, '-', '_', '.', at most 63)",
    RESOURCE_NAME: "a resource name such as rdma/ib or nvidia.com/hostdev",
    ABS_PATH: "an absolute path of letters, digits and _.+@=,:/-",
    QUANTITY: "a quantity such as 64Gi",
}


def _where(loc: tuple[int | str, ...]) -> str:
    out = "site.kubernetes"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class SiteErrors(SpecError):
    """Several site-file errors, each one path-qualified line; printed joined in ONE line
    (``site.yaml: 3 errors: a: ...; b: ...; c: ...``) so that a user can fix them at once."""

    def __init__(self, messages: list[str], source: str = "site") -> None:
        self.messages = list(messages)
        text = self.messages[0] if len(self.messages) == 1 else \
            f"{source}: {len(self.messages)} errors: " + "; ".join(self.messages)
        super().__init__(text)


def _message(error: Any) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    msg = error["msg"]
    if error["type"] == "extra_forbidden":
        fields = KubernetesSite.model_fields if len(loc) == 1 else None
        allowed = f" (allowed: {', '.join(fields)})" if fields else ""
        msg = f"unknown key{allowed}"
    elif error["type"] == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        kind = next((d for p, d in _PATTERN_WORDS.items() if pattern == f"^{p}$"), "a valid value")
        msg = f"{error['input']!r} is not {kind}"
    return re.sub(r"\s+", " ", f"{_where(loc)}: {msg}")


def kubernetes_site(data: Any) -> KubernetesSite:
    """The ``kubernetes:`` mapping validated; SiteErrors naming every bad field, one line each."""
    if not isinstance(data, dict):
        raise SpecError(f"site.kubernetes: expected a mapping of keys ({', '.join(KubernetesSite.model_fields)}), "
                        f"got {data!r}")
    try:
        return KubernetesSite.model_validate(data)
    except ValidationError as err:
        raise SiteErrors([_message(e) for e in err.errors()]) from None


__all__ = ["KubernetesSite", "SiteErrors", "Toleration", "Volume", "kubernetes_site"]
