"""plan.json: the hand-off between commands (plan -> launch, report, tune, budget).

    {"schema_version": 1, "tool": "paraplan", "tool_version": ...,
     "inputs": {"model": {ModelSpec fields}, "gpu": {GpuSpec fields}, "num_gpus", "gpus_per_node",
                "training": {TrainingSpec fields}},
     "plan": {candidates best first (config, memory, time, throughput), rejections, ...}}

Inputs are fully resolved (every field written), so a plan reloads without the presets it came from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from paraplan._version import __version__
from paraplan.errors import PlannerError, SpecError
from paraplan.fileio import brief, non_finite_path, read_json, write_text_atomic
from paraplan.layout import ParallelLayout
from paraplan.search import Plan, SearchSpace
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, make_cluster
from paraplan.specs.load import model_from_megatron_args, validate_fields
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

SCHEMA_VERSION = 1

LAYOUT_KEYS = ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "mbs", "recompute", "recompute_modules",
               "sequence_parallel", "distributed_optimizer", "fsdp", "overlap_grad_reduce",
               "overlap_param_gather", "tp_comm_overlap", "first_stage_layers", "last_stage_layers",
               "pipeline_layout", "schedule", "recompute_num_layers", "recompute_method")


def inputs_dict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict[str, Any]:
    """Resolved inputs as plain JSON."""
    m = asdict(model)
    if isinstance(m.get("moe_layer_freq"), tuple):
        m["moe_layer_freq"] = list(m["moe_layer_freq"])
    gpu = asdict(cluster.gpu)
    if not gpu["topology"]:  # two tiers from the rates: plan.json as before tiers existed
        del gpu["topology"]
    return {"model": m, "gpu": gpu, "num_gpus": cluster.num_gpus,
            "gpus_per_node": cluster.gpus_per_node, "training": asdict(training)}


def plan_document(p: Plan) -> dict[str, Any]:
    """The full plan.json document (with the search space, so that a report re-runs the same search)."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": "paraplan", "tool_version": __version__,
                           "inputs": inputs_dict(p.model, p.cluster, p.training), "plan": p.to_dict()}
    if p.space is not None:
        doc["search_space"] = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(p.space).items()
                               if k != "schedule" or v}  # Megatron's own choice: no key, as before schedules
    return doc


def search_space_from(doc: dict[str, Any]) -> SearchSpace | None:
    """The SearchSpace a plan.json was made with (None for plan files without it)."""
    raw = doc.get("search_space")
    if not isinstance(raw, dict):
        return None
    kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                          if k in SearchSpace.__dataclass_fields__}
    try:
        return validate_fields(SearchSpace, kw, "plan: search_space.")  # type: ignore[no-any-return]
    except TypeError as err:
        raise SpecError(f"plan: search_space is malformed ({err})") from None


def dumps_json(doc: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
    """The one JSON serializer of paraplan's output (``--format json``, plan.json): standard JSON only.

    A NaN or infinite value is a bug caught here, not written as the non-standard ``NaN``/``Infinity``:
    PlannerError in one line naming where it is.
    """
    try:
        return json.dumps(doc, indent=indent, sort_keys=sort_keys, allow_nan=False)
    except ValueError:
        where = non_finite_path(doc)
        if where is None:
            raise
        raise PlannerError(f"internal error: {where} is not a finite number; nothing was written "
                           "(please report this with the command line)") from None


def write_json_atomic(path: str | Path, doc: dict[str, Any], *, option: str = "output", force: bool = False) -> None:
    """Write JSON atomically (see ``write_text_atomic``: an existing file only with ``force``)."""
    write_text_atomic(path, dumps_json(doc) + "\n", option=option, force=force)


def save_plan(p: Plan, path: str | Path, *, option: str = "output", force: bool = False) -> None:
    """Write plan.json (an existing file only with ``force``)."""
    write_json_atomic(path, plan_document(p), option=option, force=force)


@dataclass(frozen=True, slots=True)
class LoadedPlan:
    """A plan.json read back: specs and the ranked layouts with their predictions."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layouts: tuple[ParallelLayout, ...]
    predictions: tuple[dict[str, Any], ...]
    document: dict[str, Any]


def layout_from_config(config: dict[str, Any], prefix: str = "config.") -> ParallelLayout:
    """ParallelLayout from a ``config`` block of estimate/plan JSON (types checked; SpecError naming
    ``prefix`` + the field)."""
    kw = {k: config[k] for k in LAYOUT_KEYS if k in config}
    for key in ("recompute_modules", "pipeline_layout"):
        if isinstance(kw.get(key), list):
            kw[key] = tuple(kw[key])
    return validate_fields(ParallelLayout, kw, prefix)  # type: ignore[no-any-return]


_KINDS: dict[type, str] = {dict: "an object", list: "a list", int: "an integer", str: "a string"}


def field_at(doc: Any, where: str, kind: type) -> Any:
    """``doc`` at the dotted path ``where`` (``plan.candidates``), checked to be a ``kind``; SpecError
    naming the path ("inputs.num_gpus: expected an integer, got '8x'") otherwise."""
    value, parts = doc, where.split(".")
    for k, part in enumerate(parts):
        if not isinstance(value, dict):
            raise SpecError(f"{'.'.join(parts[:k])}: expected an object, got {brief(value)}")
        if part not in value:
            raise SpecError(f"missing field {'.'.join(parts[:k + 1])}")
        value = value[part]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SpecError(f"{where}: expected {_KINDS.get(kind, kind.__name__)}, got {brief(value)}")
    return value


def load_plan(path: str | Path) -> LoadedPlan:
    """Read plan.json; SpecError in one line naming the file and the field on anything malformed
    ("plan.json: plan.candidates[0].config.tp: Input should be a valid integer")."""
    doc = read_json(path, "plan")
    name = Path(path).name
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        found = brief(doc.get("schema_version")) if isinstance(doc, dict) else None
        raise SpecError(f"plan: '{name}' has schema_version {found}; expected {SCHEMA_VERSION}")
    try:
        model_raw = field_at(doc, "inputs.model", dict)
        model = model_from_megatron_args(model_raw, name=str(model_raw.get("name", "model")))
        gpu_raw = dict(field_at(doc, "inputs.gpu", dict))
        gpu_raw["efficiency"] = validate_fields(EfficiencySpec, field_at(doc, "inputs.gpu.efficiency", dict)
                                                if "efficiency" in gpu_raw else {}, "gpu.efficiency.")
        gpu = validate_fields(GpuSpec, gpu_raw, "gpu.")
        cluster = make_cluster(gpu, field_at(doc, "inputs.num_gpus", int), field_at(doc, "inputs.gpus_per_node", int))
        training = validate_fields(TrainingSpec, field_at(doc, "inputs.training", dict), "training.")
        cands = field_at(doc, "plan.candidates", list)
        layouts = []
        for i, cand in enumerate(cands):
            config = cand.get("config") if isinstance(cand, dict) else cand
            if not isinstance(config, dict):
                raise SpecError(f"plan.candidates[{i}]{'.config' if isinstance(cand, dict) else ''}: expected an "
                                f"object, got {brief(config)}")
            layouts.append(layout_from_config(config, f"plan.candidates[{i}].config."))
    except SpecError as err:
        raise SpecError(f"plan: {name}: {err}") from None
    return LoadedPlan(model=model, cluster=cluster, training=training, layouts=tuple(layouts),
                      predictions=tuple(cands), document=doc)
