"""Render launch files and write them atomically.

Targets: ``megatron`` (megatron_args.sh + env.sh), ``torchrun`` (+ torchrun.sh), ``slurm`` = ``sbatch``
(+ job.sbatch), ``k8s`` = ``pytorchjob`` (+ pytorchjob.yaml, legacy Kubeflow v1), ``trainjob`` (+ trainjob.yaml,
Kubeflow Trainer v2, with clustertrainingruntime.yaml / computedomain.yaml where needed), ``bridge``
(bridge_recipe.py + bridge_overrides.txt), ``all``; every target also writes manifest.json (layout, resolved
inputs, prediction, candidate id) so a run can be joined to its prediction.
The shell files are jinja2 templates with StrictUndefined; every interpolated value is an integer, a validated
name (filter ``name``) or quoted for the file's language by the filters of ``paraplan.launch.quoting``:
``sh`` (shlex.quote), ``shword`` (array elements), ``sh_comment`` (the rest of a ``#`` line, kept
one line). The YAML files are built as data and written by ``yaml.safe_dump`` (``paraplan.launch.kubernetes``),
the Bridge files from ``repr`` of validated values (``paraplan.launch.bridge``). Site-specific values come from
the site profile (``paraplan.launch.site``, validated again here). Conventions: ecosystem.md section 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import jinja2

from paraplan._version import __version__
from paraplan.errors import LayoutError, SpecError
from paraplan.fileio import check_output_file
from paraplan.launch.bridge import bridge_files, bridge_overrides_gaps
from paraplan.launch.kubernetes import gpu_product_warnings, pytorchjob_file, trainjob_files
from paraplan.launch.megatron import (
    MEGATRON_COMMIT,
    UB_CFG_FILE,
    ArgGroup,
    CheckpointArgs,
    Placeholder,
    Value,
    argv,
    as_launched,
    environment,
    forced_env_names,
    layout_dict,
    megatron_args,
    ub_cfg_file,
)
from paraplan.launch.quoting import in_dquotes, integer, one_line, plain_name, sh, yaml_scalar
from paraplan.launch.site import IMAGE_PLACEHOLDER, SiteProfile, validated_site
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec, training_dict

SCHEMA_VERSION: Final = 1
TARGETS: Final = ("megatron", "torchrun", "slurm", "k8s", "trainjob", "bridge")
TARGET_ALIASES: Final = {"sbatch": "slurm", "pytorchjob": "k8s"}
"""Other names of a target (``--target pytorchjob`` is the legacy Kubeflow v1 PyTorchJob, ``k8s``)."""
TARGET_FILES: Final[dict[str, tuple[str, ...]]] = {
    "megatron": ("megatron_args.sh", "env.sh"),
    "torchrun": ("megatron_args.sh", "env.sh", "torchrun.sh"),
    "slurm": ("megatron_args.sh", "env.sh", "job.sbatch"),
    "k8s": ("megatron_args.sh", "env.sh", "pytorchjob.yaml"),
    "trainjob": ("megatron_args.sh", "env.sh", "trainjob.yaml"),
    "bridge": ("bridge_recipe.py", "bridge_overrides.txt"),
}
"""Files of each target; ``trainjob`` adds clustertrainingruntime.yaml / computedomain.yaml where needed."""
OPTIONAL_FILES: Final = ("clustertrainingruntime.yaml", "computedomain.yaml", UB_CFG_FILE)
BUILT_FILES: Final = frozenset({"pytorchjob.yaml", "trainjob.yaml", *OPTIONAL_FILES, "bridge_recipe.py",
                                "bridge_overrides.txt"})
"""Files built as data in Python (YAML by yaml.safe_dump, Python by repr of validated values), not templates."""
EXECUTABLE: Final = ("torchrun.sh", "job.sbatch")
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
    checkpoint: CheckpointArgs | None = None
    """Recommended checkpoint flags (``launch`` fills them from the estimate and the site's storage)."""


def resolved_inputs(spec: LaunchSpec) -> dict[str, Any]:
    """The resolved inputs as plain data (model, training, cluster, layout)."""
    c = spec.cluster
    return {
        "model": asdict(spec.model), "training": training_dict(spec.training),
        "cluster": {"gpu": c.gpu.name, "arch": c.gpu.arch, "num_gpus": c.num_gpus,
                    "gpus_per_node": c.gpus_per_node, "nvlink_domain_size": c.nvlink_domain_size},
        "layout": layout_dict(spec.layout),
    }


def candidate_id(spec: LaunchSpec) -> str:
    """Stable short id: sha256 of the canonical JSON of the resolved inputs and layout."""
    blob = json.dumps(resolved_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def _shword(value: Value) -> str:
    """One array element: placeholders double-quoted (expanded), values shell-quoted; values with
    commas are quoted too (shellcheck SC2054 reads a bare comma in an array as a mistake)."""
    if isinstance(value, Placeholder):
        plain_name(value.env)
        in_dquotes(value.hint + (value.default or "") + value.suffix)
        return f'"{value.shell()}"'
    quoted = shlex.quote(value)
    return f"'{value}'" if quoted == value and "," in value else quoted


def _env_default(value: object, name: str) -> str:
    """``NAME`` exported with ``value`` as its default: a value the user already set in the environment wins
    (``export NAME="${NAME:-value}"``; a value that cannot stand in double quotes is assigned shell-quoted
    when ``NAME`` is unset or empty)."""
    plain_name(name)
    try:
        return f'export {name}="${{{name}:-{in_dquotes(value)}}}"'
    except ValueError:
        return (f"# shellcheck disable=SC2089,SC2090  # the quoted value is literal on purpose\n"
                f'{{ [[ -n "${{{name}:-}}" ]] || {name}={sh(value)}; export {name}; }}')


def template_env() -> jinja2.Environment:
    """The jinja2 environment: StrictUndefined, kept trailing newline, the quoting filters."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("paraplan.launch", "templates"),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["sh"] = sh
    env.filters["shword"] = _shword
    env.filters["sh_comment"] = one_line
    env.filters["yaml"] = yaml_scalar
    env.filters["name"] = plain_name
    env.filters["integer"] = integer
    env.filters["in_dquotes"] = in_dquotes
    env.filters["env_default"] = _env_default
    return env


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
    c = spec.cluster
    return {
        "version": __version__, "candidate_id": cid, "commit": MEGATRON_COMMIT,
        "model_name": spec.model.name, "gpu_name": c.gpu.name, "num_gpus": c.num_gpus,
        "num_nodes": c.num_nodes, "gpus_per_node": min(c.gpus_per_node, c.num_gpus),
        "layout_short": spec.layout.short(), "groups": groups, "env": env,
        "forced_env": forced_env_names(spec),
        "unset_max_connections": spec.layout.fsdp, "site": spec.site,
        "job_name": f"paraplan-{cid}", "rdzv_port": RDZV_PORT,
        "segment": slurm_segment(c), "segment_missing": _segment_missing(c),
        "image_placeholder": IMAGE_PLACEHOLDER,
    }


def _json_default(obj: object) -> object:
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def manifest(spec: LaunchSpec, cid: str, groups: tuple[ArgGroup, ...],
             files: list[str], targets: list[str]) -> dict[str, Any]:
    """manifest.json: what was generated, from what, and what paraplan predicts for it. ``megatron_args`` (the
    ``pretrain_gpt.py`` arguments) only when a Megatron-LM target is among ``targets``: the Bridge target runs its
    recipe with bridge_overrides.txt, and may carry what Megatron-LM refuses (TE's fused cross entropy)."""
    model, layout = as_launched(spec.model, spec.layout, spec.training)
    return {
        "schema_version": SCHEMA_VERSION, "tool": "paraplan", "tool_version": __version__,
        "candidate_id": cid, "megatron_commit": MEGATRON_COMMIT, "targets": targets,
        "files": files, "layout": layout_dict(spec.layout), "inputs": resolved_inputs(spec),
        "launched": {"model": asdict(model), "layout": layout_dict(layout)},
        **({"megatron_args": argv(groups)} if set(targets) - {"bridge"} else {}),
        "env": {n: v for n, v, _ in environment(spec)},
        "site": spec.site.as_dict(), "prediction": spec.prediction,
        **({} if spec.checkpoint is None else {"checkpoint": asdict(spec.checkpoint)}),
    }


def _bridge_target(spec: LaunchSpec, cid: str, targets: list[str] | tuple[str, ...], chosen: list[str],
                   skipped: dict[str, str], files: dict[str, str]) -> list[str]:
    """Add the Megatron-Bridge files to ``files``; the fields only bridge_recipe.py sets (named in launch's note).
    Under ``--target all`` a Bridge refusal skips the target (``skipped``, ``chosen``), or refuses in one line when
    the Megatron-LM targets were refused too."""
    try:
        files.update(bridge_files(spec, cid))
        return bridge_overrides_gaps(spec)
    except SpecError as err:
        if "all" not in targets:
            raise
        if skipped:  # the Megatron-LM targets were refused too: nothing to write, refused in one line
            raise SpecError(f"--target all: no target can be written: bridge: {err}; the Megatron-LM targets: "
                            f"{next(iter(skipped.values()))}") from None
        skipped["bridge"] = str(err)  # --target all: every target the model has
        chosen.remove("bridge")
        return []


def render_files(spec: LaunchSpec, targets: list[str] | tuple[str, ...]) -> dict[str, str]:
    """All files for ``targets`` (names from TARGETS or "all"), rendered in memory."""
    chosen = list(TARGETS) if "all" in targets else list(dict.fromkeys(TARGET_ALIASES.get(t, t) for t in targets))
    for t in chosen:
        if t not in TARGETS:
            raise SpecError(f"target '{t}' is unknown (allowed: {', '.join([*TARGETS, *TARGET_ALIASES])}, all)")
    spec = replace(spec, site=validated_site(spec.site))  # a SiteProfile built in code passes the same checks
    skipped: dict[str, str] = {}
    try:
        groups = megatron_args(spec.model, spec.layout, spec.training, arch=spec.cluster.gpu.arch,
                               checkpoint=spec.checkpoint, megatron_lm=chosen != ["bridge"])
    except LayoutError as err:  # --target all: TE's fused cross entropy is for the Bridge target only
        if "all" not in targets or err.reason != "TE_CROSS_ENTROPY_FUSION":
            raise
        skipped = {t: str(err) for t in chosen if t != "bridge"}
        chosen = ["bridge"]
        groups = megatron_args(spec.model, spec.layout, spec.training, arch=spec.cluster.gpu.arch,
                               checkpoint=spec.checkpoint, megatron_lm=False)
    cid = candidate_id(spec)
    ctx = _context(spec, cid, groups)
    ub_text = ub_cfg_file(spec.training, spec.layout)
    ctx["ub_cfg"] = ub_text is not None  # job.sbatch mounts the launch directory in the container for it
    env = template_env()
    names = list(dict.fromkeys(n for t in chosen for n in TARGET_FILES[t]))
    files = {n: env.get_template(f"{n}.j2").render(**ctx) for n in names if n not in BUILT_FILES}
    if "megatron_args.sh" in names and ub_text is not None:
        files[UB_CFG_FILE] = ub_text  # what --tp-comm-overlap-cfg "$LAUNCH_DIR/..." reads
    k8s = {"job_name": ctx["job_name"], "candidate_id": cid, "cluster": spec.cluster, "site": spec.site,
           "groups": groups, "env": ctx["env"], "gpus_per_node": ctx["gpus_per_node"],
           "ub_cfg": ub_text}  # a ConfigMap in the manifest, mounted in every pod
    about = (f"{spec.model.name} on {spec.cluster.num_nodes} node(s) x {ctx['gpus_per_node']} GPUs "
             f"({spec.cluster.gpu.name}); {spec.layout.short()}")
    if "k8s" in chosen:
        files["pytorchjob.yaml"] = pytorchjob_file(
            **k8s, header=[f"Kubeflow PyTorchJob, generated by paraplan {__version__} (candidate {cid}).", about])
    if "trainjob" in chosen:
        files.update(trainjob_files(
            **k8s, header=[f"Kubeflow Trainer v2, generated by paraplan {__version__} (candidate {cid}).", about]))
    gaps = _bridge_target(spec, cid, targets, chosen, skipped, files) if "bridge" in chosen else []
    names = [n for n in names if n in files] + [n for n in files if n not in names]
    doc = manifest(spec, cid, groups, [*names, "manifest.json"], chosen)
    if skipped:
        doc["skipped_targets"] = skipped
    if spec.training.overlap_param_gather_with_optimizer_step and set(chosen) - {"bridge"}:
        from paraplan.launch.megatron import OPT_STEP_LEFT_OUT

        doc["left_out"] = [OPT_STEP_LEFT_OUT]  # megatron_args leaves it out of the Megatron-LM files
    if gaps:
        doc["bridge_overrides_not_set"] = gaps
    warnings = gpu_product_warnings(spec.site, spec.cluster.gpu.name) if {"k8s", "trainjob"} & set(chosen) else []
    if warnings:
        doc["warnings"] = warnings
    files["manifest.json"] = json.dumps(doc, indent=2, default=_json_default, allow_nan=False) + "\n"
    return files


LAUNCH_FILE_NAMES: Final = frozenset(n for names in TARGET_FILES.values() for n in names) | {
    "manifest.json", *OPTIONAL_FILES}


def _previous_launch_files(target: Path) -> set[str]:
    """The launch files an earlier ``paraplan launch`` wrote into ``target`` (its manifest.json),
    limited to names paraplan writes; empty when there is no readable manifest."""
    try:
        doc = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    names = doc.get("files") if isinstance(doc, dict) and doc.get("tool") == "paraplan" else None
    return {n for n in names if isinstance(n, str)} & LAUNCH_FILE_NAMES if isinstance(names, list) else set()


def _check_out_dir(target: Path) -> bool:
    """Whether ``--out`` exists (as a directory, or a symlink to one); SpecError when it cannot be one."""
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        check_output_file(target, "--out")  # a parent that is a file, a name too long: one line
        return False
    except OSError as err:
        raise SpecError(f"--out {target}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SpecError(f"--out {target}: exists and is not a directory")
    return True


def _check_member(path: Path, force: bool) -> None:
    """A launch file name in an existing ``--out``: absent, or a regular file (replaced with ``force``)."""
    if path.is_symlink():
        raise SpecError(f"--out {path}: is a symlink, not a regular file; refusing to replace it")
    check_output_file(path, "--out", force=force)


def write_files(files: dict[str, str], out: str | Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out`` all at once, or nothing.

    Existing files are kept unless ``force`` (SpecError naming the first one); a directory,
    device, FIFO, socket or symlink in the way is refused always. With ``force``, the launch
    files an earlier paraplan launch left there that this one does not write (a narrower
    ``--target``) are removed, so no stale script runs against the new arguments. Everything is
    written to a temporary directory next to ``out`` first. A new ``out`` is one rename; an
    existing one moves the old files aside, moves the new ones in, and on any failure or
    interrupt (KeyboardInterrupt included) moves the old ones back: ``out`` holds either the
    complete old set or the complete new one.
    """
    target = Path(out)
    stale: list[str] = []
    if _check_out_dir(target):
        for name in files:
            _check_member(target / name, force)
        if force:
            stale = sorted(n for n in _previous_launch_files(target) - set(files) if (target / n).is_file())
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name[:64]}.paraplan-", dir=target.parent))
    except OSError as err:
        raise SpecError(f"--out {target}: cannot write here ({err.strerror})") from None
    new, old = tmp / "new", tmp / "old"
    keep = False
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
            keep = True  # until the swap is done or undone, old/ may hold the only copy of the old files
            _swap_in(new, old, target, list(files), stale)
            keep = False
    except OSError as err:
        raise SpecError(f"--out {target}: could not write {Path(err.filename or '').name or 'the files'} "
                        f"({err.strerror}); nothing was written") from None
    finally:
        if tmp.exists() and not (keep and old.is_dir() and any(old.iterdir())):
            shutil.rmtree(tmp)
    return [target / name for name in files]


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block is done, then raise KeyboardInterrupt (main thread only)."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or handler is None:
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if received:
            raise KeyboardInterrupt


def _restore(new: Path, old: Path, target: Path, names: list[str], existed: set[str]) -> None:
    """Undo a partial swap from what is on disk (not from bookkeeping an interrupt may have cut short):
    new files found in ``target`` go back to ``new``, the originals in ``old`` back to ``target``."""
    for name in names:
        moved_in = not os.path.lexists(new / name) and os.path.lexists(target / name)
        if moved_in and (name not in existed or os.path.lexists(old / name)):
            os.replace(target / name, new / name)
    for name in existed:
        if os.path.lexists(old / name):
            os.replace(old / name, target / name)


def _swap_in(new: Path, old: Path, target: Path, names: list[str], stale: list[str]) -> None:
    """Move ``target``'s files named ``names`` + ``stale`` into ``old``, then ``new``'s into
    ``target``. On any exception (KeyboardInterrupt too) undo both and re-raise (an OSError as
    SpecError); Ctrl-C is held meanwhile, so the swap and its undo run to the end."""
    existed = {n for n in [*names, *stale] if os.path.lexists(target / n)}
    with _sigint_deferred():
        try:
            for name in [*names, *stale]:
                if name in existed:
                    os.replace(target / name, old / name)
            for name in names:
                os.replace(new / name, target / name)
        except BaseException as err:
            try:
                _restore(new, old, target, names, existed)
            except OSError as undo:
                raise SpecError(f"--out {target}: could not put the previous files back ({undo.strerror}); "
                                f"they are in {old}") from None
            if isinstance(err, OSError):
                raise SpecError(f"--out {target}: could not write {err.filename or ''}: {err.strerror}; "
                                "nothing was changed") from None
            raise
