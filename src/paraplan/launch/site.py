"""The site profile: every cluster-specific value the launch templates use.

A YAML file (``paraplan launch --site site.yaml``; ``paraplan launch --print-site-template`` prints a commented
example, ``SITE_TEMPLATE``) with these keys, all optional:

    partition, account, time          Slurm #SBATCH values (time as a quoted "HH:MM:SS")
    container_image, container_mounts pyxis/enroot ``srun --container-image/--container-mounts``,
                                      and the Kubernetes container image
    modules                           ``module load`` lines in job.sbatch
    env                               exported in env.sh and set in the pod (NCCL/network env)
    megatron_path                     Megatron-LM checkout holding pretrain_gpt.py
                                      (default /opt/megatron-lm, as in NVIDIA's NeMo containers)
    namespace, image_pull_secret      Kubernetes
    kubernetes                        the Kubernetes section (``paraplan.launch.k8s_site``): Trainer v2
                                      runtime, Kueue queue, RDMA resources, scheduling, volumes, ComputeDomain
    qos                               Slurm ``#SBATCH --qos``
    checkpoint_dir                    absolute checkpoint directory (shared storage): the CHECKPOINT_DIR
                                      default of every target, mounted in Kubernetes when a volume holds it
    extra_sbatch                      more ``#SBATCH`` options, e.g. "--reservation=llm"
    storage_gbps, storage_gbps_per_node
                                      checkpoint storage bandwidth (GB/s) for the job and per node
    host_memory_gb_per_node           host RAM per node (GB): ``--async-save`` staging must fit
    async_save_overlap                share of an async save hidden behind training (0..1)
    failure_rate_per_gpu_hour, requeue_s
                                      failures and the requeue time (``paraplan.goodput``)

Defaults are safe: nothing site-specific is invented; what is missing is simply not emitted
(Kubernetes needs an image, so it gets a visible placeholder). Unknown keys are rejected.
"""

from __future__ import annotations

import math
import re
import shlex
import unicodedata
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from paraplan.checkpoint import StorageSpec
from paraplan.errors import SpecError
from paraplan.fileio import read_yaml
from paraplan.goodput import FailureSpec
from paraplan.launch.k8s_site import KubernetesSite, SiteErrors, kubernetes_site
from paraplan.units import GB

DEFAULT_MEGATRON_PATH: Final = "/opt/megatron-lm"
IMAGE_PLACEHOLDER: Final = "nvcr.io/nvidia/nemo:SET_CONTAINER_IMAGE"
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SLURM_VALUE: Final = re.compile(r"[A-Za-z0-9_.,:=@%/+\-\[\]]+")
_PATH: Final = re.compile(r"/?[A-Za-z0-9_.+\-]+(/[A-Za-z0-9_.+\-]+)*/?")


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteProfile:
    """Cluster-specific launch values (see the module docstring)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    megatron_path: str = DEFAULT_MEGATRON_PATH
    namespace: str | None = None
    image_pull_secret: str | None = None
    extra_sbatch: tuple[str, ...] = ()
    storage_gbps: float | None = None
    storage_gbps_per_node: float | None = None
    host_memory_gb_per_node: float | None = None
    async_save_overlap: float | None = None
    failure_rate_per_gpu_hour: float | None = None
    requeue_s: float | None = None
    qos: str | None = None
    checkpoint_dir: str | None = None
    kubernetes: KubernetesSite = field(default_factory=KubernetesSite)

    def storage(self) -> StorageSpec:
        """Checkpoint storage and host memory (defaults in ``paraplan.checkpoint`` where not set)."""
        return StorageSpec(
            aggregate_bytes_per_s=None if self.storage_gbps is None else self.storage_gbps * GB,
            per_node_bytes_per_s=None if self.storage_gbps_per_node is None else self.storage_gbps_per_node * GB,
            host_memory_bytes_per_node=None if self.host_memory_gb_per_node is None
            else self.host_memory_gb_per_node * GB,
            **({} if self.async_save_overlap is None else {"async_overlap_frac": self.async_save_overlap}))

    def failures(self) -> FailureSpec:
        """Failure rate and requeue time (defaults in ``paraplan.goodput`` where not set)."""
        kw = {k: v for k, v in (("failure_rate_per_gpu_hour", self.failure_rate_per_gpu_hour),
                                ("requeue_s", self.requeue_s)) if v is not None}
        return FailureSpec(**kw)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (env as a mapping; unset storage/failure numbers left out)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["env"] = dict(self.env)
        for key in ("container_mounts", "modules", "extra_sbatch"):
            out[key] = list(out[key])
        for key in (*NUMBER_KEYS, "qos", "checkpoint_dir"):  # only those the site sets
            if out[key] is None:
                del out[key]
        out["kubernetes"] = self.kubernetes.model_dump(mode="json", exclude_defaults=True)
        if not out["kubernetes"]:
            del out["kubernetes"]
        return out


SITE_KEYS: Final = tuple(f.name for f in fields(SiteProfile))
NUMBER_KEYS: Final = {"storage_gbps": (False, None), "storage_gbps_per_node": (False, None),
                      "host_memory_gb_per_node": (False, None), "async_save_overlap": (True, 1.0),
                      "failure_rate_per_gpu_hour": (True, None), "requeue_s": (True, None)}
"""Numeric keys: (zero allowed, upper bound)."""


def _number(key: str, value: Any) -> float:
    zero_ok, upper = NUMBER_KEYS[key]
    number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    low_ok = number >= 0 if zero_ok else number > 0
    if not (math.isfinite(number) and low_ok and (upper is None or number <= upper)):
        bound = (">= 0" if zero_ok else "> 0") + ("" if upper is None else f" and <= {upper:g}")
        raise SpecError(f"site.{key}: expected a number {bound}, got {value!r}")
    return number


def _printable(key: str, text: str) -> str:
    """``text`` when it holds no control, line-break or format character (DEL and U+2028 included)."""
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")), None)
    if bad is not None:
        raise SpecError(f"site.{key}: {text!r} contains the control character U+{ord(bad):04X} "
                        "(use printable single-line text)")
    return text


def _text(key: str, value: Any, pattern: re.Pattern[str] | None = None) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"site.{key}: expected a string, got {value!r}")
    text = _printable(key, str(value))
    if not text.strip():
        raise SpecError(f"site.{key}: expected a non-empty single-line string, got {value!r}")
    if pattern is not None and not pattern.fullmatch(text):
        raise SpecError(f"site.{key}: {text!r} has characters that cannot be used here")
    return text


def _list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v] if key == "container_mounts" else [value]
    if not isinstance(value, list):
        raise SpecError(f"site.{key}: expected a list of strings, got {value!r}")
    return tuple(_text(key, v) for v in value)


def _path(key: str, value: Any) -> str:
    text = _text(key, value, _PATH)
    if key == "checkpoint_dir" and not text.startswith("/"):
        raise SpecError(f"site.checkpoint_dir: expected an absolute path (shared storage), got {text!r}")
    return text.rstrip("/") or "/"


def site_from_dict(data: dict[str, Any], source: str = "site") -> SiteProfile:
    """Validate a site mapping: every error found, each one line naming its key, raised together as one
    SiteErrors (``<source>: N errors: a: ...; b: ...``; a single error reads as itself)."""
    errors: list[str] = []
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key not in SITE_KEYS:
            errors.append(f"site: unknown key '{key}' (allowed: {', '.join(SITE_KEYS)})")
            continue
        if value is None:
            continue
        try:
            kw[key] = _site_value(key, value)
        except SiteErrors as err:
            errors += err.messages
        except SpecError as err:
            errors.append(str(err))
    if not errors:
        try:
            return SiteProfile(**kw)
        except SpecError as err:
            errors.append(str(err))
    raise SiteErrors(errors, source)


def _site_value(key: str, value: Any) -> Any:
    if key == "time" and isinstance(value, int) and not isinstance(value, bool):
        raise SpecError('site.time: quote the time limit, e.g. time: "04:00:00" (YAML reads '
                        "04:00:00 unquoted as a number of seconds)")
    if key in ("partition", "account", "time", "qos"):
        return _text(key, value, _SLURM_VALUE)
    if key in ("container_mounts", "modules"):
        return _list(key, value)
    if key == "extra_sbatch":
        return tuple(_sbatch_option(v) for v in _list(key, value))
    if key == "env":
        return _env(value)
    if key in NUMBER_KEYS:
        return _number(key, value)
    if key in ("megatron_path", "checkpoint_dir"):
        return _path(key, value)
    if key == "kubernetes":
        return kubernetes_site(value)
    return _text(key, value)


GEOMETRY_SBATCH: Final = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--ntasks-per-gpu",
                           "--ntasks-per-core", "--ntasks-per-socket", "--gpus", "-G", "--gpus-per-node",
                           "--gpus-per-task", "--gpus-per-socket", "--nodelist", "-w", "--nodefile", "-F",
                           "--use-min-nodes", "--gres=gpu", "--tres-per-task=gpu")
"""sbatch options that set the job's size; job.sbatch derives them from the layout (one task per
node running torchrun, all GPUs of the node), so a site profile may not change them (other
``--gres`` resources are allowed)."""
_GEOMETRY_LONG: Final = tuple(o for o in GEOMETRY_SBATCH if o.startswith("--") and "=" not in o)
_GEOMETRY_SHORT: Final = frozenset(o[1] for o in GEOMETRY_SBATCH if len(o) == 2)
_GPU_RESOURCE: Final = ("--gres", "--tres-per-task")
_SHORT_FLAGS: Final = frozenset("hHkOQsuvVW")
"""sbatch short options that take no argument (they may be bundled: -vN4 is -v -N 4)."""


def _sets_geometry(word: str) -> bool:
    """Whether one sbatch word sets the job size, in any spelling getopt accepts: ``--nodes=4``,
    ``--nodes 4``, an unambiguous prefix (``--node=4``), ``-N4``, ``-vN4``, ``--gres=gpu:8``."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        if len(name) > 2 and any(o.startswith(name) for o in _GEOMETRY_LONG):
            return True
        return any(o.startswith(name) for o in _GPU_RESOURCE) and "gpu" in word.lower() and len(name) > 2
    if word.startswith("-"):
        for c in word[1:]:
            if c not in _SHORT_FLAGS:
                return c in _GEOMETRY_SHORT
    return False


def _sbatch_option(text: str) -> str:
    try:
        words = [part for word in shlex.split(text) for part in word.split()]  # '"--qos=a -N 4"' too
    except ValueError as err:
        raise SpecError(f"site.extra_sbatch: {text!r} cannot be split into words ({err})") from None
    if not words or not words[0].startswith("-") or "#" in text:
        raise SpecError(f"site.extra_sbatch: {text!r} is not an sbatch option (e.g. --qos=high)")
    gpu_words = [w for i, w in enumerate(words) if i and words[i - 1].split("=")[0] in _GPU_RESOURCE]
    if any(_sets_geometry(w) for w in words) or any("gpu" in w.lower() for w in gpu_words):
        raise SpecError(f"site.extra_sbatch: {text!r} sets the job geometry, which job.sbatch derives from the "
                        f"layout (not allowed: {', '.join(GEOMETRY_SBATCH)})")
    return text


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise SpecError(f"site.env: expected a mapping NAME: value, got {value!r}")
    out: list[tuple[str, str]] = []
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SpecError(f"site.env: {name!r} is not a valid environment variable name")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise SpecError(f"site.env.{name}: expected a string or number, got {v!r} "
                            "(quote values such as \"1\" or \"true\")")
        out.append((name, _printable(f"env.{name}", str(v))))
    return tuple(out)


def validated_site(site: SiteProfile) -> SiteProfile:
    """``site`` checked as a site file is (a SiteProfile built in code gets the same one-line errors)."""
    return site_from_dict({k: v for k, v in site.as_dict().items() if v not in (None, (), [], {})})


def load_site(path: str | Path | None) -> SiteProfile:
    """The site profile in ``path`` (YAML), or the defaults when ``path`` is None."""
    if path is None:
        return SiteProfile()
    data = read_yaml(path, "site")
    if data is None:
        return SiteProfile()
    if not isinstance(data, dict):
        raise SpecError(f"site: '{path}' must hold a mapping of keys ({', '.join(SITE_KEYS)})")
    return site_from_dict(data, Path(path).name or "site")


SITE_TEMPLATE: Final = '''\
# paraplan site profile (paraplan launch --site site.yaml). Every key is optional; unknown keys are errors.
# Values shown are examples: delete what your site does not need (nothing site-specific is invented).

# --- Slurm (job.sbatch) ---
partition: batch                  # #SBATCH --partition
account: llm-team                 # #SBATCH --account
qos: normal                       # #SBATCH --qos
time: "04:00:00"                  # #SBATCH --time (quoted: YAML reads 04:00:00 as seconds)
extra_sbatch:                     # more #SBATCH options (not the job size: paraplan derives it)
  - --reservation=llm
modules: []                       # module load lines, e.g. [cuda/12.8]

# --- container (Pyxis/enroot on Slurm; the image on Kubernetes) ---
container_image: nvcr.io/nvidia/nemo:25.07
container_mounts:                 # srun --container-mounts (SRC:DST[:FLAGS])
  - /lustre:/lustre
megatron_path: /opt/megatron-lm   # Megatron-LM checkout holding pretrain_gpt.py inside the container

# --- environment (env.sh, the pod env, the Bridge recipe's env_vars): NCCL/UCX settings of the fabric ---
env:
  NCCL_IB_HCA: mlx5
  NCCL_SOCKET_IFNAME: eth0
  UCX_NET_DEVICES: mlx5_0:1
  DATA_PATH: /lustre/data/pile_text_document
  TOKENIZER_MODEL: meta-llama/Meta-Llama-3-8B

# --- checkpoints (shared storage; on Kubernetes it must be on a writable volume below) ---
checkpoint_dir: /lustre/checkpoints
storage_gbps: 100                 # aggregate checkpoint write bandwidth, GB/s
storage_gbps_per_node: 10         # per-node write bandwidth, GB/s
host_memory_gb_per_node: 1800     # host RAM per node, GB (async save staging must fit)
async_save_overlap: 0.9           # share of an async save hidden behind training (0..1)
failure_rate_per_gpu_hour: 0.00002
requeue_s: 600                    # seconds from a failure to the job running again

# --- Kubernetes (trainjob.yaml, pytorchjob.yaml) ---
namespace: training
image_pull_secret: ngc
kubernetes:
  runtime: torch-distributed      # Trainer v2 ClusterTrainingRuntime to reference
  create_runtime: false           # true: also write clustertrainingruntime.yaml
  queue: team-a                   # Kueue LocalQueue (label kueue.x-k8s.io/queue-name); job created suspended
  priority_class: null            # Kueue WorkloadPriorityClass
  suspend: null                   # default: true with a queue, else false
  rdma_resources:                 # RDMA devices per node (adds IPC_LOCK), e.g. nvidia.com/hostdev: 8
    rdma/ib: 8
  node_selector:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  node_affinity: {}               # label key: [allowed values] (required)
  topology_key: null              # node label of the network block/rack: Kueue topology-aware placement
  topology_required: false        # true: podset-required-topology (else preferred)
  volumes:                        # one of pvc, host_path, nfs_server + nfs_path each
    - {name: lustre, mount_path: /lustre, pvc: lustre-pvc}
  shm_size: 64Gi                  # the memory-backed /dev/shm
  compute_domain: null            # GB200/GB300 ComputeDomain name (default <job>-compute-domain)
  service_account: null
'''
"""The documented site.yaml (``paraplan launch --print-site-template``); a test loads it back."""
