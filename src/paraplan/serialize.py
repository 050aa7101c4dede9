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
from paraplan.errors import SpecError
from paraplan.fileio import write_text_atomic
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
               "pipeline_layout")


def inputs_dict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict[str, Any]:
    """Resolved inputs as plain JSON."""
    m = asdict(model)
    if isinstance(m.get("moe_layer_freq"), tuple):
        m["moe_layer_freq"] = list(m["moe_layer_freq"])
    return {"model": m, "gpu": asdict(cluster.gpu), "num_gpus": cluster.num_gpus,
            "gpus_per_node": cluster.gpus_per_node, "training": asdict(training)}


def plan_document(p: Plan) -> dict[str, Any]:
    """The full plan.json document (with the search space, so that a report re-runs the same search)."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": "paraplan", "tool_version": __version__,
                           "inputs": inputs_dict(p.model, p.cluster, p.training), "plan": p.to_dict()}
    if p.space is not None:
        doc["search_space"] = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(p.space).items()}
    return doc


def search_space_from(doc: dict[str, Any]) -> SearchSpace | None:
    """The SearchSpace a plan.json was made with (None for plan files without it)."""
    raw = doc.get("search_space")
    if not isinstance(raw, dict):
        return None
    kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                          if k in SearchSpace.__dataclass_fields__}
    try:
        return SearchSpace(**kw)
    except TypeError as err:
        raise SpecError(f"plan: search_space is malformed ({err})") from None


def write_json_atomic(path: str | Path, doc: dict[str, Any], *, option: str = "output", force: bool = False) -> None:
    """Write JSON atomically (see ``write_text_atomic``: an existing file only with ``force``)."""
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n", option=option, force=force)


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


def layout_from_config(config: dict[str, Any]) -> ParallelLayout:
    """ParallelLayout from a ``config`` block of estimate/plan JSON."""
    kw = {k: config[k] for k in LAYOUT_KEYS if k in config}
    for key in ("recompute_modules", "pipeline_layout"):
        if key in kw:
            kw[key] = tuple(kw[key])
    return ParallelLayout(**kw)


def load_plan(path: str | Path) -> LoadedPlan:
    """Read plan.json; SpecError with the field on anything malformed."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"plan: file '{path}' not found") from None
    except json.JSONDecodeError as err:
        raise SpecError(f"plan: '{path}' is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        found = doc.get("schema_version") if isinstance(doc, dict) else None
        raise SpecError(f"plan: '{path}' has schema_version {found}; expected {SCHEMA_VERSION}")
    try:
        inputs = doc["inputs"]
        model = model_from_megatron_args(inputs["model"], name=inputs["model"].get("name", "model"))
        gpu_raw = dict(inputs["gpu"])
        gpu_raw["efficiency"] = validate_fields(EfficiencySpec, gpu_raw.get("efficiency") or {}, "gpu.efficiency.")
        gpu = validate_fields(GpuSpec, gpu_raw, "gpu.")
        cluster = make_cluster(gpu, int(inputs["num_gpus"]), int(inputs["gpus_per_node"]))
        training = validate_fields(TrainingSpec, inputs["training"], "training.")
        cands = doc["plan"]["candidates"]
        layouts = tuple(layout_from_config(c["config"]) for c in cands)
    except KeyError as err:
        raise SpecError(f"plan: '{path}' is missing field {err}") from None
    return LoadedPlan(model=model, cluster=cluster, training=training, layouts=layouts,
                      predictions=tuple(cands), document=doc)
