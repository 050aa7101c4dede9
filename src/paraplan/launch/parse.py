"""Read a ``pretrain_gpt.py`` command line back into specs: the inverse of ``launch.megatron``.

Input is a shell script (``torchrun ... pretrain_gpt.py ...``, ``srun ... python
pretrain_gpt.py ...``, Megatron's own example scripts with bash arrays), a file holding only
arguments, or a one-line string. ``paraplan.launch.shell`` resolves continuations, arrays and
simple variables; this module interprets the Megatron flags (``paraplan.specs.megatron_flags``) and the
launcher flags for the world size (torchrun ``--nnodes`` x ``--nproc-per-node``, srun/#SBATCH
``--nodes``, ``--gpus-per-node``, ``--ntasks-per-node``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from paraplan.errors import SpecError
from paraplan.fileio import path_exists, read_input_text
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
            raise SpecError("world size: the script has no torchrun --nnodes/--nproc-per-node, "
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
                 base_dir: str | Path | None = None) -> ParsedScript:
    """Parse a script, an arguments file or a one-line command (see the module docstring).

    ``source``d files are read from ``base_dir`` (the script's folder) when they exist there.
    """
    sbatch = _sbatch_options(text)
    env = Env()
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
    """Parse a script or arguments file (SpecError when it cannot be read)."""
    p = Path(path)
    text = read_input_text(p, "script")
    return parse_script(text, name=p.stem, source=str(p), base_dir=p.parent)


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
