"""Read a ``pretrain_gpt.py`` command line back into specs: the inverse of ``launch.megatron``.

Input is a shell script (``torchrun ... pretrain_gpt.py ...``, ``srun ... python
pretrain_gpt.py ...``, Megatron's own example scripts with bash arrays), a file holding only
arguments, or a one-line string. ``paraplan.launch.shell`` resolves continuations, arrays and
simple variables; this module interprets the Megatron flags (``paraplan.specs.megatron_flags``) and the
launcher flags for the world size (torchrun ``--nnodes`` x ``--nproc-per-node``, srun/#SBATCH
``--nodes``, ``--gpus-per-node``, ``--ntasks-per-node``).

A Kubeflow ``TrainJob`` or ``PyTorchJob`` manifest (what ``launch.kubernetes`` writes) is read through its
trainer container's command and args (``parse_manifest``); the world size is then the job's nodes x processes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from paraplan.errors import SpecError
from paraplan.fileio import brief, load_yaml_documents, path_exists, read_input_text
from paraplan.launch.expand import MAX_SCRIPT_CHARS
from paraplan.launch.shell import Command, Env, read_commands, shell_c
from paraplan.layout import ParallelLayout, layout_for_world
from paraplan.specs.megatron_flags import MegatronFlags, read_flags
from paraplan.specs.training import TrainingSpec

ENTRY_POINT: Final = "pretrain_gpt.py"
_TORCHRUN: Final = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_SLURM_SEED: Final = {"nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
                      "gpus_per_node": ("SLURM_GPUS_PER_NODE",),
                      "ntasks_per_node": ("SLURM_NTASKS_PER_NODE",)}


@dataclass(frozen=True, slots=True)
class ParsedScript:
    """What a launch script says: specs, world size, and what had to be assumed."""

    flags: MegatronFlags
    """Model, layout and training read from the Megatron arguments."""
    world_size: int | None
    """GPUs from the launcher (torchrun, srun, #SBATCH); None when the script does not say."""
    gpus_per_node: int | None
    num_nodes: int | None
    env: dict[str, str] = field(default_factory=dict)
    """Variables the script sets (e.g. CUDA_DEVICE_MAX_CONNECTIONS)."""
    args: tuple[str, ...] = ()
    """The Megatron arguments found, after shell expansion."""
    launcher: tuple[str, ...] = ()
    """The words before ``pretrain_gpt.py`` (torchrun/srun and their options)."""
    world_hint: str = ""
    """Where the world size would come from, when it is unknown (a Kubernetes manifest's fields)."""
    env_source: str = "the script"
    """Where ``env`` was set, for messages: the script, or a manifest's container env."""

    @property
    def unknown_flags(self) -> tuple[str, ...]:
        """Flags Megatron-LM does not define (listed, not fatal)."""
        return self.flags.unknown_flags

    @property
    def defaults_applied(self) -> tuple[str, ...]:
        """Important flags that are missing, with the default Megatron uses."""
        return self.flags.defaults_applied

    def resolve_world(self, num_gpus: int | None = None) -> int:
        """``num_gpus`` if given, else the launcher's world size (SpecError when unknown)."""
        world = num_gpus if num_gpus is not None else self.world_size
        if world is None:
            raise SpecError(f"world size: {self.world_hint}; pass --num-gpus" if self.world_hint else
                            "world size: the script has no torchrun --nnodes/--nproc-per-node, "
                            "srun or #SBATCH --nodes/--gpus-per-node; pass --num-gpus")
        return world

    def layout(self, num_gpus: int | None = None) -> ParallelLayout:
        """The layout, DP = world / (TP x PP x CP)."""
        return layout_for_world(self.resolve_world(num_gpus), **self.flags.layout_fields)

    def training(self, num_gpus: int | None = None) -> TrainingSpec:
        """The training spec; a missing --global-batch-size is micro-batch x DP (Megatron's)."""
        fields_ = dict(self.flags.training_fields)
        if fields_.get("global_batch_size") is None:
            lay = self.layout(num_gpus)
            fields_["global_batch_size"] = lay.mbs * lay.dp
        return TrainingSpec(**fields_)


def _sbatch_options(text: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*#SBATCH\s+(.*)", line)
        if not m:
            continue
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:
            continue
        opts.update(_options(words))
    return opts


_SHORT: Final = {"-N": "--nodes", "-n": "--ntasks", "-G": "--gpus"}


def _options(words: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``--key=value`` / ``--key value`` / ``-N value`` options as {"nodes": value}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        w = _SHORT.get(words[i], words[i])
        if w.startswith("--"):
            key, eq, value = w[2:].partition("=")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value = words[i + 1]
                i += 1
            out[key.replace("_", "-")] = value
        i += 1
    return out


def _count(value: str | None) -> int | None:
    """An integer option value: '8', 'h100:8', 'gpu:8', '2-4' (max), '1:4' (max)."""
    if not value:
        return None
    m = re.fullmatch(r"(?:[A-Za-z0-9_]+:)*(\d+)(?:[-:](\d+))?", value.strip())
    if not m:
        return None
    return int(m.group(2) or m.group(1))


def _world(launcher: tuple[str, ...], sbatch: dict[str, str], env: Env
           ) -> tuple[int | None, int | None, int | None]:
    """(world size, GPUs per node, nodes) from torchrun, srun and #SBATCH options."""
    names = [w.rsplit("/", 1)[-1] for w in launcher]
    torch_at = next((k for k, w in enumerate(names) if w in _TORCHRUN), None)
    srun_at = next((k for k, w in enumerate(names) if w == "srun"), None)
    sb_nodes = _count(sbatch.get("nodes"))
    sb_gpn = _count(sbatch.get("gpus-per-node")) or _count(sbatch.get("gres"))
    if torch_at is not None:
        opts = _options(launcher[torch_at + 1:])
        nodes = _count(opts.get("nnodes")) or (1 if "standalone" in opts else None) or sb_nodes or 1
        per_node = _count(opts.get("nproc-per-node")) or sb_gpn
        return (nodes * per_node if per_node else None), per_node, nodes
    if srun_at is not None:
        opts = {**sbatch, **_options(launcher[srun_at + 1:torch_at])}
        nodes = _count(opts.get("nodes")) or sb_nodes or 1
        per_node = _count(opts.get("ntasks-per-node"))
        if per_node:
            return nodes * per_node, per_node, nodes
        tasks = _count(opts.get("ntasks"))
        return tasks, (tasks // nodes if tasks else sb_gpn), nodes
    if sb_nodes and sb_gpn:
        return sb_nodes * sb_gpn, sb_gpn, sb_nodes
    world = _count(env.scalars.get("WORLD_SIZE"))
    return world, sb_gpn, sb_nodes


_NOT_LAUNCHERS: Final = ("echo", "printf", "cat", "[", "[[", "test", "ls", "cp", "mv", "rm", "mkdir",
                          "cd", "realpath", "readlink", "dirname", "basename", "grep", "sed")


def _find_command(commands: list[Command]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(launcher words, Megatron arguments) of the command running pretrain_gpt.py.

    When several commands name it (a file test, an echo), the one with the most flags wins.
    """
    best: tuple[int, tuple[str, ...], tuple[str, ...]] | None = None
    for cmd in commands:
        if cmd.fields[0].rsplit("/", 1)[-1] in _NOT_LAUNCHERS:
            continue
        for k, f in enumerate(cmd.fields):
            if f.rsplit("/", 1)[-1] == ENTRY_POINT:
                args = cmd.fields[k + 1:]
                score = sum(a.startswith("--") for a in args)
                if best is None or score > best[0]:
                    best = (score, cmd.fields[:k], args)
                break
    return None if best is None else (best[1], best[2])


def _args_only(commands: list[Command], env: Env) -> tuple[str, ...]:
    """A file of arguments: commands that start with a flag, else the arrays holding flags."""
    words = [f for cmd in commands if cmd.fields[0].startswith("--") for f in cmd.fields]
    if words:
        return tuple(words)
    return tuple(f for arr in env.arrays.values() if any(x.startswith("--") for x in arr)
                 for f in arr)


def _includer(base_dir: Path | None) -> Callable[[str], str | None]:
    """Follow ``source FILE``: the file as written, else its name next to the script."""
    def include(word: str) -> str | None:
        candidates = [Path(word)] if "$" not in word else []
        if base_dir is not None:
            candidates.append(base_dir / word.rsplit("/", 1)[-1])
        for path in candidates:
            if path_exists(path) and path.is_file():
                try:
                    return read_input_text(path, "source")
                except SpecError:
                    return None
        return None
    return include


def parse_script(text: str, *, name: str = "custom", source: str = "",
                 base_dir: str | Path | None = None, env_seed: dict[str, str] | None = None,
                 positional: list[str] | None = None, files: dict[str, str] | None = None) -> ParsedScript:
    """Parse a script, an arguments file or a one-line command (see the module docstring).

    ``source``d files are read from ``base_dir`` (the script's folder) when they exist there; ``env_seed``:
    variables set before the script runs (a container's environment); ``positional``: ``$0``, ``$1``, ... (the
    words after a ``bash -c`` string), None when unknown; ``files``: path -> text of files the container holds
    (``config_map_files``).
    """
    sbatch = _sbatch_options(text)
    env = Env(scalars=dict(env_seed or {}), positional=None if positional is None else list(positional))
    for key, names in _SLURM_SEED.items():
        value = sbatch.get(key.replace("_", "-"))
        if key == "gpus_per_node" and not value and "gres" in sbatch:
            value = str(_count(sbatch["gres"]) or "")
        for var in names:
            if value:
                env.scalars[var] = str(_count(value) or value)
    commands = read_commands(text, env, include=_includer(Path(base_dir) if base_dir else None))
    found = _find_command(commands)
    launcher, args = found if found else ((), _args_only(commands, env))
    if not args:
        raise SpecError(f"no {ENTRY_POINT} command line or Megatron arguments found"
                        + (f" in {source}" if source else ""))
    flags = read_flags(args, name=name, source=source, base_dir=str(base_dir) if base_dir else None, files=files)
    if env.notes:  # what the shell reader noticed (a bash -c string's $0)
        flags = replace(flags, notes=(*flags.notes, *env.notes))
    world, per_node, nodes = _world(launcher, sbatch, env)
    return ParsedScript(flags=flags, world_size=world, gpus_per_node=per_node, num_nodes=nodes,
                        env=dict(env.scalars), args=args, launcher=launcher)


def parse_file(path: str | Path) -> ParsedScript:
    """Parse a script, an arguments file, or a Kubeflow TrainJob / PyTorchJob manifest (``.yaml``/``.yml``, or a
    file that is one: ``parse_manifest``); SpecError when it cannot be read."""
    if isinstance(path, str) and not path:  # Path("") is the current folder
        raise SpecError("script: an empty file name (give a file)")
    p = Path(path)
    text = read_input_text(p, "script")
    if p.suffix.lower() in (".yaml", ".yml"):
        return parse_manifest(text, name=p.stem, source=str(p))
    if _MANIFEST_LINE.search(text):  # a manifest under another name; a script writing one (heredoc) is a script
        try:
            docs = load_yaml_documents(text, "script", str(p))
        except SpecError:
            docs = []
        if docs and all(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in docs if d is not None):
            return parse_manifest(text, name=p.stem, source=str(p))
    return parse_script(text, name=p.stem, source=str(p), base_dir=p.parent)


# ------------------------------------------------------------------------------------------ Kubernetes manifests
_MANIFEST_LINE: Final = re.compile(r"^(apiVersion|kind):", re.MULTILINE)
MANIFEST_KINDS: Final = {"TrainJob": "trainer.kubeflow.org/", "PyTorchJob": "kubeflow.org/"}
"""The manifests ``check`` reads, with their API group: Kubeflow Trainer v2 ``TrainJob`` (trainer.kubeflow.org/
v1alpha1) and Kubeflow Training Operator v1 ``PyTorchJob`` (kubeflow.org/v1), as ``launch.kubernetes`` writes them."""
_K8S_REF: Final = re.compile(r"\$\$|\$\(([^()$\s]+)\)")
_GPU_RESOURCE: Final = "nvidia.com/gpu"
_REPLICA_TYPES: Final = ("Master", "Worker")
_ENV_READ: Final = ("CUDA_", "NVTE_", "NCCL_", "TORCH_", "PYTORCH_", "PET_")
"""Prefixes of the variables a Megatron job reads from its environment (beside those its command line names)."""


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """``text`` as Kubernetes passes it to the container: ``$(VAR)`` is the value of the container's ``VAR`` when
    it is set (else left as written) and ``$$`` is ``$`` (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    return _K8S_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _k8s_names(text: str) -> list[str]:
    """The names ``text`` refers to as ``$(VAR)`` (not the ``$$(VAR)`` escapes)."""
    return [m.group(1) for m in _K8S_REF.finditer(text) if m.group(1)]


@dataclass(frozen=True, slots=True)
class _ContainerEnv:
    """A container's ``env`` as Kubernetes sets it."""

    values: dict[str, str]
    """name -> value, ``$(VAR)`` of earlier entries expanded."""
    unset: dict[str, list[str]]
    """name -> the ``$(VAR)`` its value keeps as written (VAR not set before it)."""
    elsewhere: frozenset[str]
    """Names set from ``valueFrom`` (a Secret, ConfigMap or pod field: not known from the file)."""

    def unset_in(self, text: str) -> list[str]:
        """The ``$(VAR)`` that stay as written in ``text`` expanded with this env (directly or through a value)."""
        names = _k8s_names(text)
        return [*(n for n in names if n not in self.values), *(u for n in names for u in self.unset.get(n, ()))]


def _at(doc: Any, path: str, source: str, prefix: str = "") -> Any:
    """The value at a dotted ``path`` of a manifest (None when a key is missing; SpecError when a step is not a
    mapping; ``prefix``: where ``doc`` is in the manifest)."""
    node = doc
    keys = path.split(".")
    for i, key in enumerate(keys):
        if node is None:
            return None
        if not isinstance(node, dict):
            where = ".".join([*([prefix] if prefix else []), *keys[:i]]) or "the document"
            raise SpecError(f"{source}: {where} must be a mapping, got {brief(node)}")
        node = node.get(key)
    return node


def _words(value: Any, where: str, source: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise SpecError(f"{source}: {where} must be a list of strings, got {brief(value)}")
    return value


def _container_env(entries: Any, where: str, source: str) -> _ContainerEnv:
    """A container's ``env`` with ``$(VAR)`` of earlier entries expanded, as Kubernetes sets it (``valueFrom``
    entries are not known from the file: left out, so their references stay as written). A value naming a later
    entry is a SpecError: Kubernetes expands only the entries before it (k8s.io/kubernetes pkg/kubelet
    kubelet_pods.go makeEnvironmentVariables), so the reference would stay as written."""
    out: dict[str, str] = {}
    unset: dict[str, list[str]] = {}
    elsewhere: set[str] = set()
    if entries is None:
        return _ContainerEnv(out, unset, frozenset())
    if not isinstance(entries, list):
        raise SpecError(f"{source}: {where} must be a list of name/value entries, got {brief(entries)}")
    names = [e.get("name") if isinstance(e, dict) else None for e in entries]
    size = 0
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise SpecError(f"{source}: {where}: each entry needs a name, got {brief(e)}")
        name, value = e["name"], e.get("value")
        if value is None:
            if e.get("valueFrom") is not None:
                elsewhere.add(name)
            continue
        if isinstance(value, (dict, list)):
            raise SpecError(f"{source}: {where}: {name}'s value must be a string, got {brief(value)}")
        text = str(value)
        missing = [n for n in _k8s_names(text) if n not in out]
        later = next((n for n in missing if n in names[k + 1:]), None)
        if later is not None:
            raise SpecError(f"{source}: {where}: {name} refers to $({later}), which is set after it; Kubernetes "
                            f"expands only the entries before one, so {name} would be {brief(text)} as written "
                            f"(move {later} above {name})")
        unset[name] = [*missing, *(u for n in _k8s_names(text) if n in out for u in unset.get(n, ()))]
        out[name] = k8s_expand(text, out)
        elsewhere.discard(name)
        size += len(out[name])
        if size > MAX_SCRIPT_CHARS:
            raise SpecError(f"{source}: {where} expands to more than {MAX_SCRIPT_CHARS // 2**20} MiB")
    return _ContainerEnv(out, unset, frozenset(elsewhere))


def _count_field(value: Any, where: str, source: str, gpus: int | None) -> int | None:
    """A node / process count: a positive integer (or its string), ``auto``/``gpu``: the GPUs per node."""
    if value is None or value in ("auto", "gpu"):
        return gpus
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{source}: {where} must be a positive integer or auto, got {brief(value)}")
    return value


def _gpus(resources: Any, where: str, source: str) -> int | None:
    limits = _at(resources, "limits", source, where)
    limit = limits.get(_GPU_RESOURCE) if isinstance(limits, dict) else None
    return None if limit is None else _count_field(limit, f"{where}.limits.{_GPU_RESOURCE}", source, None)


@dataclass(frozen=True, slots=True)
class _Job:
    """What a manifest's trainer container runs, and on how many nodes and processes."""

    words: list[str]
    """command + args, as written (before ``$(VAR)`` expansion)."""
    env: _ContainerEnv
    nodes: int | None
    per_node: int | None
    where: str
    """The container's path in the manifest."""
    nodes_field: str
    """Where ``nodes`` comes from."""


def _trainjob(doc: dict[str, Any], source: str) -> _Job:
    """The command + args, env, nodes and processes per node of a TrainJob's ``spec.trainer``: the torch plugin
    gives torchrun ``numNodes`` and ``numProcPerNode`` (default auto: the GPUs of ``resourcesPerNode``;
    kubeflow/trainer pkg/runtime/framework/plugins/torch)."""
    trainer = _at(doc, "spec.trainer", source)
    if not isinstance(trainer, dict):
        raise SpecError(f"{source}: TrainJob has no spec.trainer (the command is in the runtime, not this file)")
    words = [*_words(trainer.get("command"), "spec.trainer.command", source),
             *_words(trainer.get("args"), "spec.trainer.args", source)]
    env = _container_env(trainer.get("env"), "spec.trainer.env", source)
    gpus = _gpus(trainer.get("resourcesPerNode"), "spec.trainer.resourcesPerNode", source)
    nodes = _count_field(trainer.get("numNodes"), "spec.trainer.numNodes", source, None)
    per_node = _count_field(trainer.get("numProcPerNode"), "spec.trainer.numProcPerNode", source, gpus)
    return _Job(words, env, nodes, per_node, "spec.trainer", "spec.trainer.numNodes")


def _replica_specs(specs: dict[Any, Any], source: str) -> dict[str, Any]:
    """The replica specs by type, read as the training operator does: any case of Master / Worker is that type
    (kubeflow/trainer release-1.9 pkg/apis/kubeflow.org/v1 defaulting_utils.go setTypeNameToCamelCase); another
    type, or one type written twice, is a SpecError (the operator's webhook refuses other types:
    pkg/webhooks/pytorch validatePyTorchReplicaSpecs)."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, rs in specs.items():
        role = next((r for r in _REPLICA_TYPES if isinstance(key, str) and key.lower() == r.lower()), None)
        if role is None:
            raise SpecError(f"{source}: spec.pytorchReplicaSpecs.{brief(key)}: a replica type must be Master or "
                            "Worker (the training operator refuses others)")
        if role in out:
            raise SpecError(f"{source}: spec.pytorchReplicaSpecs has both {written[role]!r} and {key!r} (the "
                            f"training operator reads either as {role} and keeps one); write one")
        out[role], written[role] = rs, key
    return out


def _pytorchjob(doc: dict[str, Any], source: str) -> _Job:
    """The same for a PyTorchJob: the ``pytorch`` container of the Master replica (else the Worker's), nodes the
    replicas of both, processes per node ``spec.nprocPerNode`` (auto/gpu: the container's GPU limit). The
    Master and Worker containers must run the same command line with the same environment."""
    specs = _at(doc, "spec.pytorchReplicaSpecs", source)
    if not isinstance(specs, dict) or not specs:
        raise SpecError(f"{source}: PyTorchJob has no spec.pytorchReplicaSpecs")
    found: list[tuple[str, dict[str, Any], _ContainerEnv]] = []
    nodes = 0
    for role, rs in sorted(_replica_specs(specs, source).items(), key=lambda kv: _REPLICA_TYPES.index(kv[0])):
        if rs is None:
            continue
        containers = _at(rs, "template.spec.containers", source, f"spec.pytorchReplicaSpecs.{role}")
        where = f"spec.pytorchReplicaSpecs.{role}.template.spec.containers"
        if not isinstance(containers, list):
            raise SpecError(f"{source}: {where} must be a list of containers")
        c = next((c for c in containers if isinstance(c, dict) and c.get("name") == "pytorch"), None)
        if c is None:
            raise SpecError(f"{source}: {where} has no container named pytorch (the operator's training container)")
        replicas = _count_field(rs.get("replicas", 1), f"spec.pytorchReplicaSpecs.{role}.replicas", source, None) or 1
        if role == "Master" and replicas != 1:
            raise SpecError(f"{source}: spec.pytorchReplicaSpecs.Master.replicas must be 1 (the training operator's "
                            f"webhook), got {replicas}")
        nodes += replicas
        found.append((f"{where}[pytorch]", c, _container_env(c.get("env"), f"{where}[pytorch].env", source)))
    if not found:
        raise SpecError(f"{source}: spec.pytorchReplicaSpecs has no Master or Worker replica")
    if any((c.get("command"), c.get("args")) != (found[0][1].get("command"), found[0][1].get("args"))
           for _, c, _ in found):
        raise SpecError(f"{source}: the Master and Worker pytorch containers run different commands; check reads one "
                        "command line")
    where, c, env = found[0]
    words = [*_words(c.get("command"), f"{where}.command", source), *_words(c.get("args"), f"{where}.args", source)]
    for _, _, other in found[1:]:
        _same_env(env, other, " ".join(words), source)
    gpus = _gpus(c.get("resources"), f"{where}.resources", source)
    per_node = _count_field(_at(doc, "spec.nprocPerNode", source), "spec.nprocPerNode", source, gpus)
    return _Job(words, env, nodes, per_node, where, "spec.pytorchReplicaSpecs.*.replicas")


def _same_env(master: _ContainerEnv, worker: _ContainerEnv, command: str, source: str) -> None:
    """SpecError when the Master and Worker containers set a variable differently that the job reads: one its
    command line names (``$(VAR)``, ``$VAR``, ``${VAR}``) or one of the ``_ENV_READ`` families."""
    for name in sorted(set(master.values) | set(worker.values) | master.elsewhere | worker.elsewhere):
        a, b = master.values.get(name), worker.values.get(name)
        if a == b and (name in master.elsewhere) == (name in worker.elsewhere):
            continue
        named = re.search(rf"\$(?:\({re.escape(name)}\)|\{{{re.escape(name)}\b|{re.escape(name)}\b)", command)
        if named or name.startswith(_ENV_READ):
            shown = ["from valueFrom" if name in e.elsewhere else "not set" if v is None else brief(v)
                     for v, e in ((a, master), (b, worker))]
            raise SpecError(f"{source}: the Master and Worker pytorch containers set {name} differently (Master "
                            f"{shown[0]}, Worker {shown[1]}); every process of the job must read the same value")


def _kinds(docs: list[Any], source: str) -> None:
    """SpecError when a document's ``kind`` is not a string (Kubernetes' is: the object's type name)."""
    for k, d in enumerate(docs):
        kind = d.get("kind") if isinstance(d, dict) else None
        if kind is not None and not isinstance(kind, str):
            at = f"document {k + 1}: " if len(docs) > 1 else ""
            raise SpecError(f"{source}: {at}kind must be a string (check reads {' and '.join(MANIFEST_KINDS)}), "
                            f"got {brief(kind)}")


def _pod_specs(doc: dict[str, Any]) -> list[Any]:
    """The pod specs of a job as ``launch.kubernetes`` writes them: each PyTorchJob replica's template, or the
    TrainJob's runtime patches."""
    if doc.get("kind") == "PyTorchJob":
        specs = (doc.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        return [((rs or {}).get("template") or {}).get("spec") for rs in specs.values() if isinstance(rs, dict)]
    out: list[Any] = []
    for patch in (doc.get("spec") or {}).get("runtimePatches") or []:
        jobs = (((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for rj in jobs.get("replicatedJobs") or []:
            out.append(((((rj or {}).get("template") or {}).get("spec") or {}).get("template") or {}).get("spec"))
    return out


def config_map_files(docs: list[Any], job: dict[str, Any]) -> dict[str, str]:
    """path -> text of the ConfigMap files (documents of the same manifest) the job's pods mount: a ``configMap``
    volume's keys (or its ``items``) under each container ``volumeMounts`` ``mountPath`` (no ``subPath``). Only what
    every pod spec mounts the same way is taken (a Master and a Worker that differ hold neither)."""
    maps = {(d.get("metadata") or {}).get("name"): d.get("data") or {} for d in docs
            if isinstance(d, dict) and d.get("kind") == "ConfigMap" and isinstance(d.get("metadata"), dict)}
    found: list[dict[str, str]] = []
    for spec in _pod_specs(job):
        if not isinstance(spec, dict):
            continue
        files: dict[str, str] = {}
        volumes = {v.get("name"): v.get("configMap") for v in spec.get("volumes") or [] if isinstance(v, dict)}
        for c in spec.get("containers") or []:
            for m in (c.get("volumeMounts") or []) if isinstance(c, dict) else []:
                cm = volumes.get(m.get("name")) if isinstance(m, dict) else None
                data = maps.get(cm.get("name")) if isinstance(cm, dict) else None
                if not isinstance(cm, dict) or not isinstance(data, dict) or m.get("subPath") \
                        or not isinstance(m.get("mountPath"), str):
                    continue
                items = cm.get("items") or [{"key": k, "path": k} for k in data]
                for item in items if isinstance(items, list) else []:
                    key, rel = (item.get("key"), item.get("path")) if isinstance(item, dict) else (None, None)
                    if isinstance(key, str) and isinstance(rel, str) and isinstance(data.get(key), str):
                        files[f"{m['mountPath'].rstrip('/')}/{rel}"] = data[key]
        found.append(files)
    if not found:
        return {}
    return {k: v for k, v in found[0].items() if all(f.get(k) == v for f in found[1:])}


def _flag_of(words: list[str], name: str) -> str:
    """The flag whose value holds ``$(name)`` (for messages)."""
    ref = f"$({name})"
    for k, w in enumerate(words):
        if ref in w:
            if w.startswith("--"):
                return w.split("=", 1)[0]
            return words[k - 1] if k and words[k - 1].startswith("--") else brief(w)
    return ref


def _nnodes_problem(value: str | None, nodes: int | None, kind: str, field_: str) -> tuple[str, str] | None:
    """torchrun ``--nnodes`` (N or MIN:MAX) against the nodes the job starts: its rendezvous waits for them."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", (value or "").strip())
    if m is None or nodes is None:
        return None
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if low <= nodes <= high:
        return None
    return ("NNODES_MISMATCH", f"torchrun --nnodes={value} but the {kind} starts {nodes} node{'s' * (nodes != 1)} "
            f"({field_}): torchrun's rendezvous waits for {low} node{'s' * (low != 1)}, so the job would not start")


def parse_manifest(text: str, *, name: str = "custom", source: str = "manifest") -> ParsedScript:
    """A Kubeflow ``TrainJob`` or ``PyTorchJob`` (``MANIFEST_KINDS``; the one among a file's YAML documents): the
    trainer container's command and args with ``$(VAR)`` expanded from its env as Kubernetes does (``k8s_expand``),
    read as the command line they are (a ``bash -c`` script as a script, with the words after it as ``$0``, ``$1``,
    ...); the world size is nodes x processes per node unless torchrun's own options say otherwise (a torchrun
    ``--nnodes`` the job's node count does not meet is a problem). Anything else is a one-line SpecError naming
    what it is."""
    docs = load_yaml_documents(text, "script", source)
    _kinds(docs, source)
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") in MANIFEST_KINDS]
    if len(jobs) > 1:
        raise SpecError(f"{source}: {len(jobs)} TrainJob / PyTorchJob documents; check reads one job a file")
    if not jobs:
        kinds = [d.get("kind") for d in docs if isinstance(d, dict) and isinstance(d.get("kind"), str)]
        what = (f"a YAML {', '.join(map(brief, kinds))}" if kinds else "a YAML file that is not a Kubernetes object")
        raise SpecError(f"{source}: {what}; check reads Kubeflow TrainJob (trainer.kubeflow.org) and PyTorchJob "
                        "(kubeflow.org/v1) manifests, shell scripts and Megatron argument files")
    doc = jobs[0]
    kind = doc["kind"]
    api = doc.get("apiVersion")
    if not isinstance(api, str) or not api.startswith(MANIFEST_KINDS[kind]):
        raise SpecError(f"{source}: {kind} apiVersion must be {MANIFEST_KINDS[kind]}..., got {brief(api)}")
    job = (_trainjob if kind == "TrainJob" else _pytorchjob)(doc, source)
    env, nodes, per_node, where = job.env.values, job.nodes, job.per_node, job.where
    unset = [n for w in job.words for n in job.env.unset_in(w)]
    words = [k8s_expand(w, env) for w in job.words]
    seed = {**env, **({"PET_NNODES": str(nodes)} if nodes else {}),
            **({"PET_NPROC_PER_NODE": str(per_node)} if per_node else {})}
    shell = shell_c(words)
    text, positional = (shell[0], shell[1]) if shell is not None else (shlex.join(words), None)
    not_run = SpecError(f"{source}: the {kind}'s {where} command and args do not run {ENTRY_POINT} (got "
                        f"{brief(' '.join(words)) if words else 'none: the runtime has the command'})")
    if ENTRY_POINT not in text and not any(ENTRY_POINT in w for w in positional or ()):
        raise not_run
    try:
        parsed = parse_script(text, name=name, source=source, env_seed=seed, positional=positional,
                              files=config_map_files(docs, doc))
    except SpecError as err:
        for ref in dict.fromkeys(unset):
            if f"$({ref})" not in str(err):
                continue
            flag = _flag_of(words, ref)
            if ref in job.env.elsewhere:
                raise SpecError(f"{source}: {flag} takes $({ref}) from a valueFrom entry of {where}.env (a Secret, "
                                "ConfigMap or pod field), which the file does not hold; write the value") from None
            if shell is None:  # in a bash -c string an unset $(NAME) is bash's command substitution
                raise SpecError(f"{source}: {flag} gets $({ref}) as written: {ref} is not set in the container env "
                                f"({where}.env), and Kubernetes leaves $(VAR) unexpanded when no env entry sets "
                                "VAR before it") from None
        raise
    if not parsed.launcher:
        raise not_run
    names = [w.rsplit("/", 1)[-1] for w in parsed.launcher]
    torch_at = next((k for k, w in enumerate(names) if w in _TORCHRUN), None)
    opts = _options(parsed.launcher[torch_at + 1:]) if torch_at is not None else {}
    problem = _nnodes_problem(opts.get("nnodes"), nodes, kind, job.nodes_field)
    if torch_at is not None:
        nodes = _count(opts.get("nnodes")) or nodes
        per_node = _count(opts.get("nproc-per-node")) or per_node
    else:  # python pretrain_gpt.py: one process a pod
        per_node = 1
    per_node_field = "spec.trainer.numProcPerNode" if kind == "TrainJob" else "spec.nprocPerNode"
    hint = (f"the {kind} sets no spec.trainer.numNodes" if nodes is None else
            f"the {kind} sets no process count per node ({per_node_field}, or a {_GPU_RESOURCE} limit)")
    world = nodes * per_node if nodes and per_node else None
    flags = parsed.flags if problem is None else replace(parsed.flags, problems=(*parsed.flags.problems, problem))
    return replace(parsed, flags=flags, world_size=world, gpus_per_node=per_node, num_nodes=nodes,
                   world_hint="" if world else hint,
                   env_source="the container env" if shell is None else "the container env or its bash -c script")


def parsed_summary(parsed: ParsedScript) -> dict[str, Any]:
    """JSON-ready view of what was read (without the estimate)."""
    return {
        "world_size": parsed.world_size, "gpus_per_node": parsed.gpus_per_node,
        "num_nodes": parsed.num_nodes, "launcher": list(parsed.launcher),
        "layout_fields": dict(parsed.flags.layout_fields),
        "training_fields": dict(parsed.flags.training_fields),
        "unknown_flags": list(parsed.unknown_flags),
        "defaults_applied": list(parsed.defaults_applied),
        "notes": list(parsed.flags.notes),
    }
