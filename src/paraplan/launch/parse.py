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
from paraplan.launch.shell import Command, Env, read_commands
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
                 base_dir: str | Path | None = None, env_seed: dict[str, str] | None = None) -> ParsedScript:
    """Parse a script, an arguments file or a one-line command (see the module docstring).

    ``source``d files are read from ``base_dir`` (the script's folder) when they exist there; ``env_seed``:
    variables set before the script runs (a container's environment).
    """
    sbatch = _sbatch_options(text)
    env = Env(scalars=dict(env_seed or {}))
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
    flags = read_flags(args, name=name, source=source)
    world, per_node, nodes = _world(launcher, sbatch, env)
    return ParsedScript(flags=flags, world_size=world, gpus_per_node=per_node, num_nodes=nodes,
                        env=dict(env.scalars), args=args, launcher=launcher)


def parse_file(path: str | Path) -> ParsedScript:
    """Parse a script, an arguments file, or a Kubeflow TrainJob / PyTorchJob manifest (``.yaml``/``.yml``, or a
    file that is one: ``parse_manifest``); SpecError when it cannot be read."""
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
_SHELLS: Final = ("bash", "sh", "dash", "zsh")
_GPU_RESOURCE: Final = "nvidia.com/gpu"


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """``text`` as Kubernetes passes it to the container: ``$(VAR)`` is the value of the container's ``VAR`` when
    it is set (else left as written) and ``$$`` is ``$`` (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    return _K8S_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


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


def _container_env(entries: Any, where: str, source: str) -> dict[str, str]:
    """A container's ``env`` with ``$(VAR)`` of earlier entries expanded, as Kubernetes sets it (``valueFrom``
    entries are not known from the file: left out, so their references stay as written)."""
    out: dict[str, str] = {}
    if entries is None:
        return out
    if not isinstance(entries, list):
        raise SpecError(f"{source}: {where} must be a list of name/value entries, got {brief(entries)}")
    size = 0
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise SpecError(f"{source}: {where}: each entry needs a name, got {brief(e)}")
        value = e.get("value")
        if value is None:
            continue
        out[e["name"]] = k8s_expand(str(value), out)
        size += len(out[e["name"]])
        if size > MAX_SCRIPT_CHARS:
            raise SpecError(f"{source}: {where} expands to more than {MAX_SCRIPT_CHARS // 2**20} MiB")
    return out


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


def _trainjob(doc: dict[str, Any], source: str) -> tuple[list[str], dict[str, str], int | None, int | None, str]:
    """(command + args, env, nodes, processes per node, where they are) of a TrainJob's ``spec.trainer``: the
    torch plugin gives torchrun ``numNodes`` and ``numProcPerNode`` (default auto: the GPUs of
    ``resourcesPerNode``; kubeflow/trainer pkg/runtime/framework/plugins/torch)."""
    trainer = _at(doc, "spec.trainer", source)
    if not isinstance(trainer, dict):
        raise SpecError(f"{source}: TrainJob has no spec.trainer (the command is in the runtime, not this file)")
    words = [*_words(trainer.get("command"), "spec.trainer.command", source),
             *_words(trainer.get("args"), "spec.trainer.args", source)]
    env = _container_env(trainer.get("env"), "spec.trainer.env", source)
    gpus = _gpus(trainer.get("resourcesPerNode"), "spec.trainer.resourcesPerNode", source)
    nodes = _count_field(trainer.get("numNodes"), "spec.trainer.numNodes", source, None)
    per_node = _count_field(trainer.get("numProcPerNode"), "spec.trainer.numProcPerNode", source, gpus)
    return words, env, nodes, per_node, "spec.trainer"


def _pytorchjob(doc: dict[str, Any], source: str) -> tuple[list[str], dict[str, str], int | None, int | None, str]:
    """The same for a PyTorchJob: the ``pytorch`` container of the Master replica (else the Worker's), nodes the
    replicas of both, processes per node ``spec.nprocPerNode`` (auto/gpu: the container's GPU limit)."""
    specs = _at(doc, "spec.pytorchReplicaSpecs", source)
    if not isinstance(specs, dict) or not specs:
        raise SpecError(f"{source}: PyTorchJob has no spec.pytorchReplicaSpecs")
    found: list[tuple[str, dict[str, Any]]] = []
    nodes = 0
    for role in ("Master", "Worker"):
        rs = specs.get(role)
        if rs is None:
            continue
        containers = _at(rs, "template.spec.containers", source, f"spec.pytorchReplicaSpecs.{role}")
        where = f"spec.pytorchReplicaSpecs.{role}.template.spec.containers"
        if not isinstance(containers, list):
            raise SpecError(f"{source}: {where} must be a list of containers")
        c = next((c for c in containers if isinstance(c, dict) and c.get("name") == "pytorch"), None)
        if c is None:
            raise SpecError(f"{source}: {where} has no container named pytorch (the operator's training container)")
        found.append((f"{where}[pytorch]", c))
        nodes += _count_field(rs.get("replicas", 1), f"spec.pytorchReplicaSpecs.{role}.replicas", source, None) or 1
    if not found:
        raise SpecError(f"{source}: spec.pytorchReplicaSpecs has no Master or Worker replica")
    if any((c.get("command"), c.get("args")) != (found[0][1].get("command"), found[0][1].get("args"))
           for _, c in found):
        raise SpecError(f"{source}: the Master and Worker pytorch containers run different commands; check reads one "
                        "command line")
    where, c = found[0]
    words = [*_words(c.get("command"), f"{where}.command", source), *_words(c.get("args"), f"{where}.args", source)]
    env = _container_env(c.get("env"), f"{where}.env", source)
    gpus = _gpus(c.get("resources"), f"{where}.resources", source)
    per_node = _count_field(_at(doc, "spec.nprocPerNode", source), "spec.nprocPerNode", source, gpus)
    return words, env, nodes, per_node, where


def parse_manifest(text: str, *, name: str = "custom", source: str = "manifest") -> ParsedScript:
    """A Kubeflow ``TrainJob`` or ``PyTorchJob`` (``MANIFEST_KINDS``; the one among a file's YAML documents): the
    trainer container's command and args with ``$(VAR)`` expanded from its env as Kubernetes does (``k8s_expand``),
    read as the command line they are (a ``bash -c`` script as a script); the world size is nodes x processes per
    node unless torchrun's own options say otherwise. Anything else is a one-line SpecError naming what it is."""
    docs = load_yaml_documents(text, "script", source)
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
    words, env, nodes, per_node, where = (_trainjob if kind == "TrainJob" else _pytorchjob)(doc, source)
    words = [k8s_expand(w, env) for w in words]
    seed = {**env, **({"PET_NNODES": str(nodes)} if nodes else {}),
            **({"PET_NPROC_PER_NODE": str(per_node)} if per_node else {})}
    shell = bool(words) and words[0].rsplit("/", 1)[-1] in _SHELLS and "-c" in words[1:]
    if shell and not any(w.rsplit("/", 1)[-1] == ENTRY_POINT for w in words):
        script = words[words.index("-c", 1) + 1:words.index("-c", 1) + 2]
        text = script[0] if script else ""
    else:
        text = shlex.join(words)
    not_run = SpecError(f"{source}: the {kind}'s {where} command and args do not run {ENTRY_POINT} (got "
                        f"{brief(' '.join(words)) if words else 'none: the runtime has the command'})")
    if ENTRY_POINT not in text:
        raise not_run
    parsed = parse_script(text, name=name, source=source, env_seed=seed)
    if not parsed.launcher:
        raise not_run
    names = [w.rsplit("/", 1)[-1] for w in parsed.launcher]
    torch_at = next((k for k, w in enumerate(names) if w in _TORCHRUN), None)
    opts = _options(parsed.launcher[torch_at + 1:]) if torch_at is not None else {}
    if torch_at is not None:
        nodes = _count(opts.get("nnodes")) or nodes
        per_node = _count(opts.get("nproc-per-node")) or per_node
    else:  # python pretrain_gpt.py: one process a pod
        per_node = 1
    per_node_field = "spec.trainer.numProcPerNode" if kind == "TrainJob" else "spec.nprocPerNode"
    hint = (f"the {kind} sets no spec.trainer.numNodes" if nodes is None else
            f"the {kind} sets no process count per node ({per_node_field}, or a {_GPU_RESOURCE} limit)")
    world = nodes * per_node if nodes and per_node else None
    return replace(parsed, world_size=world, gpus_per_node=per_node, num_nodes=nodes,
                   world_hint="" if world else hint)


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
