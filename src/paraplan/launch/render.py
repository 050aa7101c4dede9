"""Render launch files from templates and write them atomically.

Targets: ``megatron`` (megatron_args.sh + env.sh), ``torchrun`` (+ torchrun.sh), ``slurm``
(+ job.sbatch), ``k8s`` (+ pytorchjob.yaml), ``all``; every target also writes manifest.json
(layout, resolved inputs, prediction, candidate id) so a run can be joined to its prediction.
Templates are jinja2 with StrictUndefined; shell values go through ``shquote`` (shlex.quote),
YAML values through ``yamlstr`` (JSON strings are valid YAML scalars). Site-specific values come
from the site profile (``paraplan.launch.site``). Conventions: ecosystem.md section 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import jinja2

from paraplan import __version__
from paraplan.errors import SpecError
from paraplan.launch.megatron import (
    FSDP_MAX_CONNECTIONS_MESSAGE,
    MAX_CONNECTIONS_MESSAGE,
    MEGATRON_COMMIT,
    ArgGroup,
    Placeholder,
    Value,
    argv,
    as_launched,
    fsdp_rejects_max_connections,
    megatron_args,
    needs_max_connections_1,
)
from paraplan.launch.site import IMAGE_PLACEHOLDER, SiteProfile
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

SCHEMA_VERSION: Final = 1
TARGETS: Final = ("megatron", "torchrun", "slurm", "k8s")
TARGET_FILES: Final[dict[str, tuple[str, ...]]] = {
    "megatron": ("megatron_args.sh", "env.sh"),
    "torchrun": ("megatron_args.sh", "env.sh", "torchrun.sh"),
    "slurm": ("megatron_args.sh", "env.sh", "job.sbatch"),
    "k8s": ("megatron_args.sh", "env.sh", "pytorchjob.yaml"),
}
EXECUTABLE: Final = ("torchrun.sh", "job.sbatch")
MAX_CONNECTIONS: Final = "CUDA_DEVICE_MAX_CONNECTIONS"
RDZV_PORT: Final = 29400
"""torchrun's default c10d rendezvous port."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the launch files are made from."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: ParallelLayout
    prediction: dict[str, Any] | None = None
    """``Estimate.to_dict()`` of this layout (goes into manifest.json)."""
    site: SiteProfile = field(default_factory=SiteProfile)


def resolved_inputs(spec: LaunchSpec) -> dict[str, Any]:
    """The resolved inputs as plain data (model, training, cluster, layout)."""
    c = spec.cluster
    return {
        "model": asdict(spec.model), "training": asdict(spec.training),
        "cluster": {"gpu": c.gpu.name, "arch": c.gpu.arch, "num_gpus": c.num_gpus,
                    "gpus_per_node": c.gpus_per_node, "nvlink_domain_size": c.nvlink_domain_size},
        "layout": asdict(spec.layout),
    }


def candidate_id(spec: LaunchSpec) -> str:
    """Stable short id: sha256 of the canonical JSON of the resolved inputs and layout."""
    blob = json.dumps(resolved_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def environment(spec: LaunchSpec) -> list[tuple[str, str, str]]:
    """(name, value, comment) to export: the site's env, then what Megatron requires.

    A site value of CUDA_DEVICE_MAX_CONNECTIONS that Megatron would reject for this layout is an
    error (SpecError), not silently replaced: TP/CP before Blackwell assert it is 1, Megatron-FSDP
    asserts it is > 1 or unset (ecosystem.md 1.4).
    """
    required: list[tuple[str, str, str]] = []
    site_value = dict(spec.site.env).get(MAX_CONNECTIONS)
    if needs_max_connections_1(spec.layout, spec.cluster.gpu.arch):
        if site_value is not None and site_value != "1":
            raise SpecError(f"site.env.{MAX_CONNECTIONS}: {site_value!r} conflicts with this layout "
                            f"({spec.layout.short()}): Megatron asserts {MAX_CONNECTIONS_MESSAGE!r}; "
                            "remove it from the site profile or set it to 1")
        required.append((MAX_CONNECTIONS, "1", f"Megatron: {MAX_CONNECTIONS_MESSAGE!r}"))
    elif spec.layout.fsdp and fsdp_rejects_max_connections(site_value):
        raise SpecError(f"site.env.{MAX_CONNECTIONS}: {site_value!r} conflicts with Megatron-FSDP: Megatron "
                        f"asserts {FSDP_MAX_CONNECTIONS_MESSAGE!r}; remove it from the site profile")
    names = {name for name, _, _ in required}
    site = [(k, v, "from the site profile") for k, v in spec.site.env if k not in names]
    return site + required


def _shword(value: Value) -> str:
    """One array element: placeholders double-quoted (expanded), values shell-quoted; values with
    commas are quoted too (shellcheck SC2054 reads a bare comma in an array as a mistake)."""
    if isinstance(value, Placeholder):
        return f'"{value.shell()}"'
    quoted = shlex.quote(value)
    return f"'{value}'" if quoted == value and "," in value else quoted


def _yamlstr(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=False)


def template_env() -> jinja2.Environment:
    """The jinja2 environment: StrictUndefined, kept trailing newline, shquote/yamlstr filters."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("paraplan.launch", "templates"),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    env.filters["shword"] = _shword
    env.filters["yamlstr"] = _yamlstr
    return env


def _k8s(groups: tuple[ArgGroup, ...], spec: LaunchSpec, env: list[tuple[str, str, str]]
         ) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Container args (placeholders as Kubernetes ``$(VAR)`` references) and the pod env."""
    words: list[str] = []
    site_env = dict(spec.site.env)
    pod_env = [("MEGATRON_PATH", spec.site.megatron_path, ""), *env]
    seen = {name for name, _, _ in pod_env}
    for group in groups:
        for arg in group.args:
            words.append(arg.flag)
            for v in arg.values:
                if not isinstance(v, Placeholder):
                    words.append(v)
                    continue
                words.append(f"$({v.env})")
                if v.env in seen:
                    continue
                seen.add(v.env)
                if v.env in site_env:
                    pod_env.append((v.env, site_env[v.env], "from the site profile"))
                elif v.default is not None:
                    pod_env.append((v.env, v.default, "PLACEHOLDER default"))
                else:
                    pod_env.append((v.env, f"SET_{v.env}", f"PLACEHOLDER: {v.hint}"))
    return words, pod_env


def slurm_segment(cluster: ClusterSpec) -> int | None:
    """``#SBATCH --segment`` (nodes), as NVIDIA's GB200 scripts set it for jobs over 18 nodes
    (ecosystem.md 2.2); None when not needed or when the node count does not tile into segments."""
    seg = cluster.segment_nodes
    return seg if seg is not None and cluster.num_nodes % seg == 0 else None


def _segment_missing(cluster: ClusterSpec) -> str:
    """A warning for job.sbatch when the job needs rack segments its node count cannot tile."""
    seg = cluster.segment_nodes
    if seg is None or cluster.num_nodes % seg == 0:
        return ""
    return (f"{cluster.num_nodes} nodes do not tile into {seg}-node rack segments (no --segment): the prediction "
            f"assumes the racks are filled in order, {cluster.nvlink_domain_size} ranks each")


def _context(spec: LaunchSpec, cid: str, groups: tuple[ArgGroup, ...]) -> dict[str, Any]:
    env = environment(spec)
    k8s_args, k8s_env = _k8s(groups, spec, env)
    c = spec.cluster
    return {
        "version": __version__, "candidate_id": cid, "commit": MEGATRON_COMMIT,
        "model_name": spec.model.name, "gpu_name": c.gpu.name, "num_gpus": c.num_gpus,
        "num_nodes": c.num_nodes, "gpus_per_node": min(c.gpus_per_node, c.num_gpus),
        "layout_short": spec.layout.short(), "groups": groups, "env": env,
        "unset_max_connections": spec.layout.fsdp, "site": spec.site,
        "job_name": f"paraplan-{cid}", "rdzv_port": RDZV_PORT, "k8s_args": k8s_args,
        "segment": slurm_segment(c), "segment_missing": _segment_missing(c),
        "k8s_env": k8s_env, "image_placeholder": IMAGE_PLACEHOLDER,
    }


def _json_default(obj: object) -> object:
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def manifest(spec: LaunchSpec, cid: str, groups: tuple[ArgGroup, ...],
             files: list[str], targets: list[str]) -> dict[str, Any]:
    """manifest.json: what was generated, from what, and what paraplan predicts for it."""
    model, layout = as_launched(spec.model, spec.layout, spec.training)
    return {
        "schema_version": SCHEMA_VERSION, "tool": "paraplan", "tool_version": __version__,
        "candidate_id": cid, "megatron_commit": MEGATRON_COMMIT, "targets": targets,
        "files": files, "layout": asdict(spec.layout), "inputs": resolved_inputs(spec),
        "launched": {"model": asdict(model), "layout": asdict(layout)},
        "megatron_args": argv(groups), "env": {n: v for n, v, _ in environment(spec)},
        "site": spec.site.as_dict(), "prediction": spec.prediction,
    }


def render_files(spec: LaunchSpec, targets: list[str] | tuple[str, ...]) -> dict[str, str]:
    """All files for ``targets`` (names from TARGETS or "all"), rendered in memory."""
    chosen = list(TARGETS) if "all" in targets else list(dict.fromkeys(targets))
    for t in chosen:
        if t not in TARGETS:
            raise SpecError(f"target '{t}' is unknown (allowed: {', '.join(TARGETS)}, all)")
    groups = megatron_args(spec.model, spec.layout, spec.training, arch=spec.cluster.gpu.arch)
    cid = candidate_id(spec)
    ctx = _context(spec, cid, groups)
    env = template_env()
    names = list(dict.fromkeys(n for t in chosen for n in TARGET_FILES[t]))
    files = {n: env.get_template(f"{n}.j2").render(**ctx) for n in names}
    doc = manifest(spec, cid, groups, [*names, "manifest.json"], chosen)
    files["manifest.json"] = json.dumps(doc, indent=2, default=_json_default, allow_nan=False) + "\n"
    return files


LAUNCH_FILE_NAMES: Final = frozenset(n for names in TARGET_FILES.values() for n in names) | {"manifest.json"}


def _previous_launch_files(target: Path) -> set[str]:
    """The launch files an earlier ``paraplan launch`` wrote into ``target`` (its manifest.json),
    limited to names paraplan writes; empty when there is no readable manifest."""
    try:
        doc = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    names = doc.get("files") if isinstance(doc, dict) and doc.get("tool") == "paraplan" else None
    return {n for n in names if isinstance(n, str)} & LAUNCH_FILE_NAMES if isinstance(names, list) else set()


def write_files(files: dict[str, str], out: str | Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out`` all at once, or nothing.

    Existing files are kept unless ``force`` (SpecError naming the first one). With ``force``,
    the launch files an earlier paraplan launch left there that this one does not write (a
    narrower ``--target``) are removed, so no stale script runs against the new arguments.
    Everything is written to a temporary directory next to ``out`` first. A new ``out`` is one
    rename; an existing one moves the old files aside, moves the new ones in, and moves the old
    ones back if any step fails, so an error never leaves partial or mixed output.
    """
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise SpecError(f"--out {target}: exists and is not a directory")
    stale: list[str] = []
    if target.is_dir():
        for name in files:
            path = target / name
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise SpecError(f"{path} exists and is not a regular file; remove it first")
            if path.exists() and not force:
                raise SpecError(f"{path} exists (use --force to overwrite)")
        if force:
            stale = sorted(n for n in _previous_launch_files(target) - set(files) if (target / n).is_file())
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.paraplan-", dir=target.parent))
    except OSError as err:
        raise SpecError(f"--out {target}: cannot write here ({err.strerror})") from None
    new, old = tmp / "new", tmp / "old"
    try:
        new.mkdir()
        old.mkdir()
        for name, text in files.items():
            path = new / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755 if name in EXECUTABLE else 0o644)
        if not target.exists():
            new.chmod(0o755)
            os.rename(new, target)
        else:
            _swap_in(new, old, target, list(files), stale)
    except OSError as err:
        raise SpecError(f"--out {target}: could not write {Path(err.filename or '').name or 'the files'} "
                        f"({err.strerror}); nothing was written") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return [target / name for name in files]


def _swap_in(new: Path, old: Path, target: Path, names: list[str], stale: list[str]) -> None:
    """Move ``target``'s files named ``names`` + ``stale`` into ``old``, then ``new``'s into
    ``target``; on an OSError undo both and raise SpecError."""
    moved_old: list[str] = []
    moved_new: list[str] = []
    try:
        for name in [*names, *stale]:
            if (target / name).exists():
                os.replace(target / name, old / name)
                moved_old.append(name)
        for name in names:
            os.replace(new / name, target / name)
            moved_new.append(name)
    except OSError as err:
        for name in moved_new:
            os.replace(target / name, new / name)
        for name in moved_old:
            os.replace(old / name, target / name)
        raise SpecError(f"--out {target}: could not write {err.filename or ''}: {err.strerror}; "
                        "nothing was changed") from None
