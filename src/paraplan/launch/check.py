"""Check a parsed launch script: every Megatron rule it breaks, and the estimate when it breaks none.

Rules come from ``paraplan.rules.rules_for`` for the layout's schedule (all of them are evaluated, not
only the first), the flag-level rules of ``paraplan.launch.megatron.launch_violations``, what the argument reader found
(``MegatronFlags.problems``), the pipeline split (``estimate.pipeline``) and the environment
Megatron asserts (CUDA_DEVICE_MAX_CONNECTIONS, ecosystem.md 1.4). Messages are Megatron's.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from paraplan.errors import LayoutError, SpecError
from paraplan.estimate.memory import MemoryOptions, alloc_conf_expandable_segments
from paraplan.estimate.pipeline import stage_assignment
from paraplan.estimate.time import fsdp
from paraplan.estimator import Estimate, estimate, max_positions_for
from paraplan.fileio import brief
from paraplan.headroom import Headroom
from paraplan.launch.megatron import (
    CPU_OFFLOAD_V1,
    CPU_OFFLOAD_V1_MESSAGE,
    FSDP_MAX_CONNECTIONS_MESSAGE,
    FSDP_REQUIRED_FLAGS,
    MAX_CONNECTIONS_MESSAGE,
    fsdp_rejects_max_connections,
    launch_violations,
    layout_dict,
    needs_max_connections_1,
)
from paraplan.launch.parse import ParsedScript
from paraplan.layout import ParallelLayout
from paraplan.rules import FULL_ITERATION_NAN_CHECK_MESSAGE, NO_NAN_CHECK_FLAG, RuleContext, rules_for
from paraplan.schedules import schedule_of
from paraplan.specs.cluster import ClusterSpec, GpuSpec, make_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import KNOB_FLAGS, TrainingSpec


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What ``paraplan check`` reports for one script."""

    parsed: ParsedScript
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: ParallelLayout
    violations: tuple[tuple[str, str], ...]
    """(code, Megatron's message) for every rule the script breaks."""
    estimate: Estimate | None
    """Memory and throughput; None when a rule is broken."""
    alternative: dict[str, Any] | None = None
    """What ``plan`` would choose instead (``suggest_alternative``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        p = self.parsed
        return {
            "world_size": self.cluster.num_gpus, "gpu": self.cluster.gpu.name,
            "gpus_per_node": self.cluster.gpus_per_node, "layout": self.layout.short(),
            "layout_fields": layout_dict(self.layout), "training": asdict(self.training),
            "model": self.model.name,
            "violations": [{"code": c, "message": m} for c, m in self.violations],
            "unknown_flags": list(p.unknown_flags), "defaults_applied": list(p.defaults_applied),
            "notes": list(p.flags.notes), "launcher": list(p.launcher),
            "estimate": self.estimate.to_dict() if self.estimate is not None else None,
            "alternative": self.alternative,
        }


def suggest_alternative(result: CheckResult, headroom: Headroom | None = None) -> dict[str, Any] | None:
    """What ``paraplan plan`` would choose for the same model, cluster and batch, with the
    predicted gain over the script's layout (None when the script's estimate is unavailable and
    no layout fits either)."""
    from paraplan.errors import PlannerError
    from paraplan.search import plan

    try:
        p = plan(result.model, result.cluster, result.training, top_k=1, headroom=headroom,
                 options=script_memory_options(result.parsed)[0])  # the script's allocator
    except PlannerError as err:  # nothing fits, or the model itself breaks a rule (e.g. positions < seq)
        return {"layout": None, "reason": str(err)}
    best = p.candidates[0]
    tokens = float(best.throughput.tokens_per_s_per_gpu)
    current = float(result.estimate.throughput.tokens_per_s_per_gpu) if result.estimate is not None else None
    gain = None if current is None else tokens / current - 1.0
    cfg = best.to_dict()["config"]
    keys = ("tp", "pp", "vp", "cp", "ep", "etp", "mbs") if result.model.is_moe else ("tp", "pp", "vp", "cp", "mbs")
    flags = " ".join(f"--{k} {cfg[k]}" for k in keys if cfg[k] != 1)  # no expert flags for a dense model
    return {
        "layout": best.layout.short(), "config": cfg, "tokens_per_s_per_gpu": tokens,
        "step_s": float(best.time.step_s), "peak_bytes": best.peak_bytes,
        "predicted_gain": gain, "same_as_script": best.layout == result.layout,
        "estimate_flags": flags + f" --recompute {best.layout.recompute}"
                          + (" --fsdp" if best.layout.fsdp else ""),
    }


def _layout(parsed: ParsedScript, world: int) -> ParallelLayout:
    """The script's layout; DP rounded down when the world size does not divide (a rule reports it)."""
    f = parsed.flags.layout_fields
    model_size = f["tp"] * f["pp"] * f["cp"]
    return ParallelLayout(dp=max(1, world // model_size), **f)


def _env_violations(parsed: ParsedScript, layout: ParallelLayout, gpu: GpuSpec) -> list[tuple[str, str]]:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron asserts it (only for scripts that launch)."""
    if not parsed.launcher:
        return []
    value = parsed.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if needs_max_connections_1(layout, gpu.arch) and value != "1":
        return [("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS_MESSAGE
                 + (f" (not set in {parsed.env_source})" if value is None else f" ({parsed.env_source} sets {value})"))]
    if layout.fsdp and fsdp_rejects_max_connections(value):
        return [("CUDA_DEVICE_MAX_CONNECTIONS", FSDP_MAX_CONNECTIONS_MESSAGE)]
    return []


def knob_flag_violations(parsed: ParsedScript, training: TrainingSpec) -> list[tuple[str, str]]:
    """What arguments.py ``validate_args`` asserts beside the knobs of the script: full-iteration CUDA graphs
    without ``--no-check-for-nan-in-loss-and-grad``, ``--overlap-param-gather-with-optimizer-step`` with a distributed
    checkpoint format (``--ckpt-format`` other than torch; torch_dist by default), and, for scripts that launch,
    fine-grained activation offloading without NVTE_CPU_OFFLOAD_V1=1 in the environment."""
    values = parsed.flags.values
    found: list[tuple[str, str]] = []
    if training.cuda_graph_impl == "full_iteration" and NO_NAN_CHECK_FLAG not in values:
        found.append(("FULL_ITERATION_NAN_CHECK", FULL_ITERATION_NAN_CHECK_MESSAGE))
    ckpt = values.get("--ckpt-format")
    if training.overlap_param_gather_with_optimizer_step and (ckpt[0] if ckpt else "torch_dist") != "torch":
        found.append(("OVERLAP_PARAM_GATHER_WITH_OPT_STEP_DIST_CKPT", "--overlap-param-gather-with-optimizer-step "
                      "not supported with distributed checkpointing yet (--ckpt-format "
                      f"{ckpt[0] if ckpt else 'torch_dist, the default'})"))
    if training.fine_grained_activation_offloading and parsed.launcher \
            and parsed.env.get(CPU_OFFLOAD_V1) != "1":
        value = parsed.env.get(CPU_OFFLOAD_V1)
        found.append((CPU_OFFLOAD_V1, CPU_OFFLOAD_V1_MESSAGE + (f" (not set in {parsed.env_source})" if value is None
                                                               else f" ({parsed.env_source} sets {value})")))
    return found


def fsdp_flag_violations(parsed: ParsedScript) -> list[tuple[str, str]]:
    """A Megatron-FSDP launch (``--use-megatron-fsdp``) missing a flag of ``FSDP_REQUIRED_FLAGS`` (or with
    another value), one entry per flag, naming the flag and where the requirement comes from."""
    values = parsed.flags.values
    if "--use-megatron-fsdp" not in values:
        return []
    found: list[tuple[str, str]] = []
    for flag, value, source in FSDP_REQUIRED_FLAGS:
        given = values.get(flag)
        if given is None or (value is not None and (given[0] if given else None) != value):
            want = flag if value is None else f"{flag} {value}"
            got = "missing" if given is None else f"got {' '.join(given) or 'no value'}"
            found.append(("FSDP_REQUIRED_FLAG", f"Megatron-FSDP needs {want} ({got}; {source})"))
    return found


def rule_violations(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                    layout: ParallelLayout) -> list[tuple[str, str]]:
    """Every broken rule of ``paraplan.rules.rules_for`` (the layout's schedule) plus the pipeline, position
    and flag rules."""
    ctx = RuleContext(model=model, training=training, cluster=cluster, layout=layout)
    found = [(r.code, r.message(ctx)) for r in rules_for(schedule_of(layout)) if bool(np.any(r.violated(ctx)))]
    codes = {c for c, _ in found}
    for check in (lambda: stage_assignment(model.num_layers, layout),
                  lambda: max_positions_for(model, training),
                  lambda: cluster.gpu.peak_flops_per_s(training.precision)):
        try:
            check()
        except LayoutError as err:
            if err.reason not in codes:
                found.append((err.reason, str(err)))
        except SpecError as err:
            found.append(("PRECISION_UNSUPPORTED", str(err)))
    codes = {c for c, _ in found}
    return found + [v for v in launch_violations(model, layout, training, cluster.gpu.arch) if v[0] not in codes]


def script_training(fields: dict[str, Any]) -> tuple[TrainingSpec, list[tuple[str, str]]]:
    """A script's TrainingSpec and the knob rules it breaks (TrainingSpec's validation, in Megatron's words where it
    mirrors an assert), listed as KNOB_RULE violations like the other rules: the knob whose removal lifts a rule is
    left out and the rest read again, so every such rule is listed, not only the first. A rule that names a knob
    left out is about the leaving out, not about the script (the rank budget's "requires backend 'hybridep'" once
    the backend is gone): it is not listed, so every message listed is true of the script. An error no knob lifts
    (the batch, the precision) stays a SpecError."""
    left = dict(fields)
    found: list[tuple[str, str]] = []
    removed: list[str] = []
    while True:
        try:
            return TrainingSpec(**left), found
        except SpecError as err:
            message = str(err)
            lifting = next((key for key in left if key in KNOB_FLAGS and _lifts(left, key, message)), None)
            if lifting is None:
                raise
            if not any(_names(message, key) for key in removed):
                found.append(("KNOB_RULE", message))
            removed.append(lifting)
            del left[lifting]


def _names(message: str, key: str) -> bool:
    """``message`` names the knob ``key`` (its field or its Megatron-LM flag)."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", message) is not None \
        or re.search(rf"{re.escape(KNOB_FLAGS[key])}(?![\w-])", message) is not None


def _lifts(fields: dict[str, Any], key: str, message: str) -> bool:
    """Leaving ``key`` out of ``fields`` lifts the TrainingSpec error ``message``."""
    try:
        TrainingSpec(**{k: v for k, v in fields.items() if k != key})
    except SpecError as err:
        return str(err) != message
    return True


def script_memory_options(parsed: ParsedScript) -> tuple[MemoryOptions | None, str | None]:
    """The allocator the script's environment sets (``PYTORCH_CUDA_ALLOC_CONF``, read as PyTorch does:
    ``estimate.memory.alloc_conf_expandable_segments``): with expandable segments no fragmentation allowance, and a
    note saying so; (None, None) otherwise (the default allowance)."""
    conf = parsed.env.get("PYTORCH_CUDA_ALLOC_CONF")
    if not conf or not alloc_conf_expandable_segments(conf):
        return None, None
    return MemoryOptions(expandable_segments=True), (
        f"PYTORCH_CUDA_ALLOC_CONF={brief(conf)} ({parsed.env_source}): expandable segments, so no fragmentation "
        "allowance in the memory estimate")


def check_parsed(parsed: ParsedScript, gpu: GpuSpec, *, num_gpus: int | None = None,
                 gpus_per_node: int | None = None, headroom: Headroom | None = None,
                 own_knobs: dict[str, Any] | None = None) -> CheckResult:
    """Rules and, if none is broken, the estimate of a parsed script on ``gpu`` (``headroom``: the memory
    margin of the estimate's fit verdict and of plan's alternative; None = the memory model's band;
    ``own_knobs``: TrainingSpec fields of paraplan's own knobs, which no Megatron flag carries, e.g.
    ``nvfp4_quantize_kernel``)."""
    world = parsed.resolve_world(num_gpus)
    per_node = gpus_per_node or parsed.gpus_per_node
    if per_node is not None and world > per_node and world % per_node:
        per_node = None
    cluster = make_cluster(gpu, world, per_node)
    model = parsed.flags.model
    layout = _layout(parsed, world)
    fields = {**parsed.flags.training_fields, **(own_knobs or {})}
    if fields.get("global_batch_size") is None:
        fields["global_batch_size"] = layout.mbs * layout.dp
    training, knob_rules = script_training(fields)
    found = knob_rules + rule_violations(model, training, cluster, layout)
    found += [p for p in parsed.flags.problems if p[0] not in {c for c, _ in found}]
    found += _env_violations(parsed, layout, gpu)
    found += knob_flag_violations(parsed, training)
    found += [p for p in fsdp_flag_violations(parsed) if p[1] not in {m for _, m in found}]
    est = None
    options, alloc_note = script_memory_options(parsed)
    if not found:
        scope = fsdp.scope_note(layout.tp, layout.pp, layout.cp, gpu.arch) if layout.fsdp else None
        est = estimate(model, cluster, training, layout, extra_notes=[*parsed.flags.notes, *([scope] if scope else []),
                                                                      *([alloc_note] if alloc_note else [])],
                       headroom=headroom, memory_options=options)
    result = CheckResult(parsed=parsed, model=model, cluster=cluster, training=training,
                         layout=layout, violations=tuple(found), estimate=est)
    alternative = suggest_alternative(result, headroom)
    return result if alternative is None else replace(result, alternative=alternative)
