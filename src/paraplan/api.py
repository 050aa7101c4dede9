"""The public API: ``paraplan.estimate`` (one layout) and ``paraplan.plan`` (search and rank), re-exported by
``paraplan/__init__.py`` with the spec and result types (docs/api.md), and the one door the CLI uses.

Both take the model and the GPU as names (presets, or files as the CLI reads them) or as spec objects, and
return the library's own result types (``Estimate``, ``Plan``). The CLI's ``estimate`` and ``plan`` commands
call these two functions.

Every other library name the CLI uses is re-exported here under the name its own module gives it (``REEXPORTS``:
name -> (module, what it is)); ``tests/unit/test_layering.py`` holds the CLI to this module. Nothing heavy is
imported with this module: the functions import the library when called, and a re-exported name imports its
module on first use (PEP 562), so ``from paraplan.api import preset_rows`` (``paraplan models``) loads neither
numpy nor pydantic nor yaml.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from paraplan.errors import SpecError

if TYPE_CHECKING:
    from paraplan.budget import BudgetResult as BudgetResult
    from paraplan.budget import BudgetRow as BudgetRow
    from paraplan.budget import budget as budget
    from paraplan.budget import parse_prices as parse_prices
    from paraplan.budget import parse_token_count as parse_token_count
    from paraplan.calibrate import DEFAULT_PARAMS as DEFAULT_PARAMS
    from paraplan.calibrate import PARAM_BOUNDS as PARAM_BOUNDS
    from paraplan.calibrate import ErrorStats as ErrorStats
    from paraplan.calibrate import FitResult as FitResult
    from paraplan.calibrate import Run as Run
    from paraplan.calibrate import RunInputs as RunInputs
    from paraplan.calibrate import error_stats as error_stats
    from paraplan.calibrate import fit_profile as fit_profile
    from paraplan.calibrate import predict_step_s as predict_step_s
    from paraplan.calibrate import profile_document as profile_document
    from paraplan.calibrate import read_manifest as read_manifest
    from paraplan.calibrate import read_pair as read_pair
    from paraplan.calibrate import read_runs_csv as read_runs_csv
    from paraplan.calibrate import write_profile as write_profile
    from paraplan.checkpoint import CheckpointAdvice as CheckpointAdvice
    from paraplan.checkpoint import advise as advise
    from paraplan.checkpoint import format_decimal_bytes as format_decimal_bytes
    from paraplan.estimate.memory import MemoryOptions as MemoryOptions
    from paraplan.estimate.memory import alloc_conf_expandable_segments as alloc_conf_expandable_segments
    from paraplan.estimate.pipeline import auto_uneven_split as auto_uneven_split
    from paraplan.estimate.pipeline import pipeline_layout_string as pipeline_layout_string
    from paraplan.estimator import Estimate as Estimate
    from paraplan.estimator import memory_knobs_of as memory_knobs_of
    from paraplan.explain import CKPT_BLOCKING_FLAG as CKPT_BLOCKING_FLAG
    from paraplan.explain import explain as explain
    from paraplan.fileio import brief as brief
    from paraplan.fileio import check_output_file as check_output_file
    from paraplan.fileio import clip as clip
    from paraplan.fileio import load_yaml_text as load_yaml_text
    from paraplan.fileio import read_input_text as read_input_text
    from paraplan.fileio import write_text_atomic as write_text_atomic
    from paraplan.headroom import Headroom as Headroom
    from paraplan.headroom import parse_headroom as parse_headroom
    from paraplan.ingest import RunLog as RunLog
    from paraplan.ingest import read_logs as read_logs
    from paraplan.ingest.source import MAX_LINE_BYTES as MAX_LINE_BYTES
    from paraplan.launch.check import CheckResult as CheckResult
    from paraplan.launch.check import check_parsed as check_parsed
    from paraplan.launch.check import suggest_alternative as suggest_alternative
    from paraplan.launch.megatron import MEGATRON_COMMIT as MEGATRON_COMMIT
    from paraplan.launch.megatron import CheckpointArgs as CheckpointArgs
    from paraplan.launch.megatron import dense_moe_knobs_note as dense_moe_knobs_note
    from paraplan.launch.megatron import launch_violations as launch_violations
    from paraplan.launch.megatron import ub_cfg_ignored_note as ub_cfg_ignored_note
    from paraplan.launch.parse import parse_file as parse_file
    from paraplan.launch.parse import parse_script as parse_script
    from paraplan.launch.render import LaunchSpec as LaunchSpec
    from paraplan.launch.render import candidate_id as candidate_id
    from paraplan.launch.render import render_files as render_files
    from paraplan.launch.render import write_files as write_files
    from paraplan.launch.site import SITE_TEMPLATE as SITE_TEMPLATE
    from paraplan.launch.site import SiteProfile as SiteProfile
    from paraplan.launch.site import load_site as load_site
    from paraplan.layout import RECOMPUTE_METHODS as RECOMPUTE_METHODS
    from paraplan.layout import RECOMPUTE_MODULES as RECOMPUTE_MODULES
    from paraplan.layout import ParallelLayout as ParallelLayout
    from paraplan.layout import check_layout_sizes as check_layout_sizes
    from paraplan.layout import layout_for_world as layout_for_world
    from paraplan.recipes.catalogue import Recipe as Recipe
    from paraplan.recipes.catalogue import cell_text as cell_text
    from paraplan.recipes.catalogue import find_recipe as find_recipe
    from paraplan.recipes.compare import RecipeComparison as RecipeComparison
    from paraplan.recipes.compare import compare_with_plan as compare_with_plan
    from paraplan.recipes.knobs import estimate_run as estimate_run
    from paraplan.recipes.knobs import recipe_memory_options as recipe_memory_options
    from paraplan.recipes.knobs import recipe_run as recipe_run
    from paraplan.recipes.knobs import run_dict as run_dict
    from paraplan.recipes.knobs import training_knobs as training_knobs
    from paraplan.recipes.user import catalogue as catalogue
    from paraplan.report import build_context as build_context
    from paraplan.report import charts as charts
    from paraplan.report import render_html as render_html
    from paraplan.schedules import SCHEDULE_NAMES as SCHEDULE_NAMES
    from paraplan.search import FitTip as FitTip
    from paraplan.search import Objective
    from paraplan.search import Plan as Plan
    from paraplan.search import SearchSpace as SearchSpace
    from paraplan.search import advice_text as advice_text
    from paraplan.serialize import dumps_json as dumps_json
    from paraplan.serialize import load_plan as load_plan
    from paraplan.serialize import save_plan as save_plan
    from paraplan.serialize import search_space_from as search_space_from
    from paraplan.specs.cluster import ClusterSpec as ClusterSpec
    from paraplan.specs.cluster import EfficiencySpec as EfficiencySpec
    from paraplan.specs.cluster import GpuSpec as GpuSpec
    from paraplan.specs.cluster import make_cluster as make_cluster
    from paraplan.specs.load import gpu_override_keys as gpu_override_keys
    from paraplan.specs.load import gpu_preset_names as gpu_preset_names
    from paraplan.specs.load import load_gpu as load_gpu
    from paraplan.specs.load import load_model as load_model
    from paraplan.specs.load import model_preset_names as model_preset_names
    from paraplan.specs.load import override_gpu as override_gpu
    from paraplan.specs.megatron_flags import argv_from_dump as argv_from_dump
    from paraplan.specs.megatron_flags import memory_knobs_from_words as memory_knobs_from_words
    from paraplan.specs.model import ModelSpec as ModelSpec
    from paraplan.specs.presets.index import preset_rows as preset_rows
    from paraplan.specs.profile import profile_overrides as profile_overrides
    from paraplan.specs.training import ATTENTION_KERNELS as ATTENTION_KERNELS
    from paraplan.specs.training import KNOB_FLAG_ALIASES as KNOB_FLAG_ALIASES
    from paraplan.specs.training import KNOB_FLAGS as KNOB_FLAGS
    from paraplan.specs.training import KNOB_REFINEMENTS as KNOB_REFINEMENTS
    from paraplan.specs.training import NVFP4_QUANTIZE_KERNELS as NVFP4_QUANTIZE_KERNELS
    from paraplan.specs.training import TIME_ONLY_KNOBS as TIME_ONLY_KNOBS
    from paraplan.specs.training import TrainingSpec as TrainingSpec
    from paraplan.specs.userbuffers import ub_configs as ub_configs
    from paraplan.tune import Comparison as Comparison
    from paraplan.tune import Metric as Metric
    from paraplan.tune import compare as compare
    from paraplan.tune import diagnose as diagnose

REEXPORTS: dict[str, tuple[str, str]] = {
    # specs and loading
    "ModelSpec": ("paraplan.specs.model", "A decoder transformer (fields named as Megatron-LM's arguments)."),
    "GpuSpec": ("paraplan.specs.cluster", "One GPU model with its node and network figures."),
    "EfficiencySpec": ("paraplan.specs.cluster", "Achievable fractions of the datasheet peaks, and fixed overheads."),
    "ClusterSpec": ("paraplan.specs.cluster", "The GPUs a job runs on: GPU model, count, node size, NVLink domain."),
    "TrainingSpec": ("paraplan.specs.training", "What one training step processes."),
    "make_cluster": ("paraplan.specs.cluster", "A cluster of ``num_gpus`` GPUs (node size: the preset's by default)."),
    "load_model": ("paraplan.specs.load", "A model from a preset name, config.json, Megatron-args file or log."),
    "load_gpu": ("paraplan.specs.load", "A GPU from a preset name or a YAML/JSON file."),
    "override_gpu": ("paraplan.specs.load", "A GPU with some fields replaced (``--gpu-set`` keys, human units)."),
    "gpu_override_keys": ("paraplan.specs.load", "The keys a GPU file or ``--gpu-set`` may set."),
    "model_preset_names": ("paraplan.specs.load", "Names of the built-in model presets."),
    "gpu_preset_names": ("paraplan.specs.load", "Names of the built-in GPU presets."),
    "preset_rows": ("paraplan.specs.presets.index", "The rows ``paraplan models`` / ``paraplan gpus`` print."),
    "profile_overrides": ("paraplan.specs.profile", "The GPU overrides a calibration profile file makes."),
    "argv_from_dump": ("paraplan.specs.megatron_flags", "A command line equivalent to a log's argument dump."),
    "memory_knobs_from_words": ("paraplan.specs.megatron_flags", "TrainingSpec memory knobs from Megatron flag words."),
    "KNOB_FLAGS": ("paraplan.specs.training", "Each TrainingSpec memory knob's Megatron flag."),
    "KNOB_REFINEMENTS": ("paraplan.specs.training", "A memory knob -> the knobs Megatron reads only with it on."),
    "KNOB_FLAG_ALIASES": ("paraplan.specs.training", "A memory knob -> its deprecated Megatron flags."),
    "TIME_ONLY_KNOBS": ("paraplan.specs.training", "The TrainingSpec knobs that move step time only."),
    "ATTENTION_KERNELS": ("paraplan.specs.training", "TrainingSpec.attention_kernel choices (paraplan's knob)."),
    "NVFP4_QUANTIZE_KERNELS": ("paraplan.specs.training",
                               "TrainingSpec.nvfp4_quantize_kernel choices (paraplan's knob)."),
    # layouts, estimates and plans
    "ParallelLayout": ("paraplan.layout", "Parallel sizes, micro-batch and memory/overlap switches of one run."),
    "RECOMPUTE_MODULES": ("paraplan.layout", "The module names Megatron's ``--recompute-modules`` accepts."),
    "RECOMPUTE_METHODS": ("paraplan.layout", "The methods Megatron's ``--recompute-method`` accepts."),
    "check_layout_sizes": ("paraplan.layout", "SpecError for a layout flag that sizes a list above num_layers."),
    "layout_for_world": ("paraplan.layout", "A layout with DP = GPUs / (TP x PP x CP) (SpecError if not whole)."),
    "MemoryOptions": ("paraplan.estimate.memory", "Memory allowances not derived from the model."),
    "alloc_conf_expandable_segments": ("paraplan.estimate.memory",
                                       "Whether a PYTORCH_CUDA_ALLOC_CONF value turns on expandable segments."),
    "auto_uneven_split": ("paraplan.estimate.pipeline", "The split used when layers do not divide over PP x VP."),
    "pipeline_layout_string": ("paraplan.estimate.pipeline", "Megatron's pipeline layout string for per-stage counts."),
    "SCHEDULE_NAMES": ("paraplan.schedules", "The pipeline schedules a plan may use."),
    "Estimate": ("paraplan.estimator", "Everything paraplan predicts for one layout."),
    "memory_knobs_of": ("paraplan.estimator", "The TrainingSpec memory knobs away from Megatron's defaults."),
    "Headroom": ("paraplan.headroom", "A memory margin: a fraction of usable memory or a fixed size."),
    "parse_headroom": ("paraplan.headroom", "``--headroom`` text (``5GiB``, ``10%``, ``0``) as a Headroom."),
    "SearchSpace": ("paraplan.search", "The values each axis may take in a search."),
    "Plan": ("paraplan.search", "Ranked feasible layouts and why the others were rejected."),
    "FitTip": ("paraplan.search", "One change that would make the smallest layout fit, as data (knob and value)."),
    "advice_text": ("paraplan.search", "``what would make it fit: ...`` with each ``FitTip`` worded by the caller."),
    "explain": ("paraplan.explain", "All findings for the best layout of a plan."),
    "CKPT_BLOCKING_FLAG": ("paraplan.explain", "The blocking-checkpoint share of time explain flags."),
    "CheckpointAdvice": ("paraplan.checkpoint", "Checkpoint size, timing, interval and goodput of one layout."),
    "advise": ("paraplan.checkpoint", "Checkpoint size and save time of an estimate's layout, interval and goodput."),
    "format_decimal_bytes": ("paraplan.checkpoint", "Storage sizes as decimal TB/GB."),
    # plan.json and output
    "dumps_json": ("paraplan.serialize", "The one JSON serializer of paraplan's output (standard JSON only)."),
    "load_plan": ("paraplan.serialize", "Read plan.json (SpecError naming the file and field on anything malformed)."),
    "save_plan": ("paraplan.serialize", "Write plan.json (an existing file only with ``force``)."),
    "search_space_from": ("paraplan.serialize", "The SearchSpace a plan.json was made with (None when it has none)."),
    "check_output_file": ("paraplan.fileio", "The path to write an option's output file to, checked before any work."),
    "write_text_atomic": ("paraplan.fileio", "Write through a temporary file in the target folder, then rename."),
    "read_input_text": ("paraplan.fileio", "The text of an input file (SpecError in one line)."),
    "load_yaml_text": ("paraplan.fileio", "A YAML document through the safe loader (SpecError in one line)."),
    "brief": ("paraplan.fileio", "``repr(value)`` cut to about ``limit`` characters, in bounded time."),
    "clip": ("paraplan.fileio", "``str(text)`` shortened to ``limit`` characters (its middle cut out)."),
    # budget
    "budget": ("paraplan.budget", "Sweep GPU counts per GPU type: time and cost to train; recommend."),
    "BudgetResult": ("paraplan.budget", "All rows of a budget sweep and the recommendation."),
    "BudgetRow": ("paraplan.budget", "One (GPU type, GPU count) point of a budget sweep."),
    "parse_prices": ("paraplan.budget", "``'h100-80gb=2.5,b200=4'`` (or one number) -> USD per GPU-hour by GPU."),
    "parse_token_count": ("paraplan.budget", "``'15T'``, ``'300B'``, ``'2.5e12'`` -> tokens."),
    # logs, tuning and calibration
    "read_logs": ("paraplan.ingest", "Read Megatron/Primus logs (one per job of a resumed run) into one RunLog."),
    "RunLog": ("paraplan.ingest", "Everything read from one or more logs, in source order."),
    "MAX_LINE_BYTES": ("paraplan.ingest.source", "The longest log line read whole (longer lines are cut)."),
    "compare": ("paraplan.tune", "Predicted vs measured step time, throughput, MFU, memory, DP sync and bubble."),
    "diagnose": ("paraplan.tune", "Findings in the tuning method's order, ending with the next layout."),
    "Comparison": ("paraplan.tune", "A measured run next to its prediction."),
    "Metric": ("paraplan.tune", "One quantity predicted and (where the log gives it) measured."),
    "RunInputs": ("paraplan.calibrate", "What a launch manifest or plan.json says ran: specs, layout, prediction."),
    "read_manifest": ("paraplan.calibrate", "Read a launch directory's manifest.json."),
    "Run": ("paraplan.calibrate", "One measured run: what ran, and its measured step time."),
    "read_pair": ("paraplan.calibrate", "A run from a manifest and its logs (median step time after warm-up)."),
    "read_runs_csv": ("paraplan.calibrate", "Runs from a CSV file."),
    "fit_profile": ("paraplan.calibrate", "Fit efficiency parameters to the runs' measured step times."),
    "FitResult": ("paraplan.calibrate", "Fitted efficiency parameters and the error before and after."),
    "ErrorStats": ("paraplan.calibrate", "Errors of predicted vs measured step time over runs."),
    "error_stats": ("paraplan.calibrate", "Absolute relative errors and RMS log error."),
    "predict_step_s": ("paraplan.calibrate", "Predicted step time of a run with other efficiency parameters."),
    "profile_document": ("paraplan.calibrate", "The cluster-profile mapping a fit writes."),
    "write_profile": ("paraplan.calibrate", "Write the profile YAML atomically."),
    "DEFAULT_PARAMS": ("paraplan.calibrate", "The efficiency parameters a calibration fits by default."),
    "PARAM_BOUNDS": ("paraplan.calibrate", "The bounds of each fitted efficiency parameter."),
    # launch scripts
    "parse_script": ("paraplan.launch.parse", "Parse a launch script, arguments file or one-line command."),
    "parse_file": ("paraplan.launch.parse", "Parse a script, arguments file or Kubeflow TrainJob/PyTorchJob YAML."),
    "check_parsed": ("paraplan.launch.check", "Broken rules and, if none, the estimate of a parsed script."),
    "suggest_alternative": ("paraplan.launch.check", "What ``plan`` would choose for the same job."),
    "CheckResult": ("paraplan.launch.check", "What ``paraplan check`` reports for one script."),
    "launch_violations": ("paraplan.launch.megatron", "Megatron's rules on the flags themselves, in Megatron's words."),
    "dense_moe_knobs_note": ("paraplan.launch.megatron", "The note for MoE knobs given for a dense model."),
    "ub_cfg_ignored_note": ("paraplan.launch.megatron", "The note for a userbuffers config without --tp-comm-overlap."),
    "MEGATRON_COMMIT": ("paraplan.launch.megatron", "The Megatron-LM commit the flags and rules follow."),
    "CheckpointArgs": ("paraplan.launch.megatron", "The checkpoint flags ``launch`` writes for a layout."),
    "LaunchSpec": ("paraplan.launch.render", "Everything the launch files are made from."),
    "candidate_id": ("paraplan.launch.render", "A layout's stable short id (sha256 of its resolved inputs)."),
    "render_files": ("paraplan.launch.render", "The launch files for some targets, rendered in memory."),
    "write_files": ("paraplan.launch.render", "Write rendered files into a folder all at once, or nothing."),
    "SiteProfile": ("paraplan.launch.site", "Cluster-specific launch values (a site file)."),
    "load_site": ("paraplan.launch.site", "The site profile in a YAML file, or the defaults."),
    "SITE_TEMPLATE": ("paraplan.launch.site", "A commented site.yaml to start from."),
    # reports and recipes
    "build_context": ("paraplan.report", "The report context of a plan."),
    "charts": ("paraplan.report", "Every figure of the report, in page order."),
    "render_html": ("paraplan.report", "The report page."),
    "catalogue": ("paraplan.recipes.user", "NVIDIA's Megatron-Bridge recipes followed by the user's."),
    "Recipe": ("paraplan.recipes.catalogue", "One published recipe: its fields, alias and the presets it maps to."),
    "find_recipe": ("paraplan.recipes.catalogue", "The recipe of a source, function name or alias."),
    "cell_text": ("paraplan.recipes.catalogue", "A recipe field as the CSV writes it."),
    "recipe_run": ("paraplan.recipes.knobs", "A recipe as model, job and layout, with overrides."),
    "estimate_run": ("paraplan.recipes.knobs", "The estimate of a recipe run."),
    "recipe_memory_options": ("paraplan.recipes.knobs", "MemoryOptions with a recipe's allocator setting."),
    "ub_configs": ("paraplan.specs.userbuffers", "Megatron-Bridge's named userbuffers configs (packaged)."),
    "training_knobs": ("paraplan.recipes.knobs", "A recipe's TrainingSpec memory knobs at a precision."),
    "run_dict": ("paraplan.recipes.knobs", "The ``recipe`` block of ``estimate --recipe``'s JSON."),
    "compare_with_plan": ("paraplan.recipes.compare", "The closest recipe for a plan's model and GPU, estimated."),
    "RecipeComparison": ("paraplan.recipes.compare", "A recipe, how it was run, and its estimate."),
}
"""The library names the CLI uses, re-exported: name -> (the module that defines it, what it is). Each is imported
from its module on first use; the ``TYPE_CHECKING`` imports above give mypy the same names (a test checks that
they agree)."""

ModelRef: TypeAlias = "str | ModelSpec"
"""A model preset name, a config.json / Megatron-args file / Megatron log path, or a ``ModelSpec``."""
GpuRef: TypeAlias = "str | GpuSpec | ClusterSpec"
"""A GPU preset name or YAML path, a ``GpuSpec``, or a whole ``ClusterSpec`` (then ``num_gpus`` may be left out)."""
TrainingRef: TypeAlias = "TrainingSpec | Mapping[str, Any]"
"""A ``TrainingSpec`` or its fields as a mapping, e.g. ``{"seq_len": 8192, "global_batch_size": 512}``."""
LayoutRef: TypeAlias = "ParallelLayout | Mapping[str, Any]"
"""A ``ParallelLayout`` or its fields without ``dp``, e.g. ``{"tp": 8, "pp": 4}`` (DP = GPUs / (TP x PP x CP))."""
SpaceRef: TypeAlias = "SearchSpace | Mapping[str, Any]"
"""A ``SearchSpace`` or its fields as a mapping, e.g. ``{"tp": (4, 8), "pp": (1, 2, 4)}``."""


def resolve_model(model: ModelRef) -> ModelSpec:
    """``model`` as a ``ModelSpec`` (a name or path is loaded as ``paraplan plan --model`` loads it)."""
    from paraplan.specs.load import load_model
    from paraplan.specs.model import ModelSpec

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    raise SpecError(f"model: expected a preset name, a file path or a ModelSpec, got {type(model).__name__}")


def resolve_cluster(gpu: GpuRef, num_gpus: int | None, gpus_per_node: int | None = None) -> ClusterSpec:
    """The cluster of ``num_gpus`` GPUs of ``gpu`` (a ``ClusterSpec`` is taken as it is; ``num_gpus``, when
    given, must be its world size, and ``gpus_per_node`` must be left out)."""
    from paraplan.specs.cluster import ClusterSpec, GpuSpec, make_cluster
    from paraplan.specs.load import load_gpu

    if isinstance(gpu, ClusterSpec):
        if num_gpus is not None and num_gpus != gpu.num_gpus:
            raise SpecError(f"num_gpus: {num_gpus} differs from the ClusterSpec's {gpu.num_gpus} (leave it out)")
        if gpus_per_node is not None:
            raise SpecError("gpus_per_node: a ClusterSpec has its own (leave it out)")
        return gpu
    if num_gpus is None:
        raise SpecError("num_gpus: required unless gpu is a ClusterSpec")
    for name, value in (("num_gpus", num_gpus), ("gpus_per_node", gpus_per_node)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(gpu, str):
        gpu = load_gpu(gpu)
    if not isinstance(gpu, GpuSpec):
        raise SpecError(f"gpu: expected a preset name, a YAML path, a GpuSpec or a ClusterSpec, "
                        f"got {type(gpu).__name__}")
    return make_cluster(gpu, num_gpus, gpus_per_node)


def resolve_training(training: TrainingRef) -> TrainingSpec:
    """``training`` as a ``TrainingSpec`` (a mapping is checked field by field)."""
    from paraplan.specs.training import TrainingSpec
    from paraplan.specs.validate import validate_fields

    if isinstance(training, TrainingSpec):
        return training
    if isinstance(training, Mapping):
        return validate_fields(TrainingSpec, dict(training), "training.")  # type: ignore[no-any-return]
    raise SpecError(f"training: expected a TrainingSpec or a mapping of its fields, got {type(training).__name__}")


def resolve_layout(layout: LayoutRef, num_gpus: int) -> ParallelLayout:
    """``layout`` as a ``ParallelLayout`` on ``num_gpus`` GPUs (a mapping gets DP = GPUs / (TP x PP x CP))."""
    from paraplan.layout import ParallelLayout, layout_for_world

    if isinstance(layout, ParallelLayout):
        return layout
    if not isinstance(layout, Mapping):
        raise SpecError(f"layout: expected a ParallelLayout or a mapping of its fields, got {type(layout).__name__}")
    allowed = sorted(f.name for f in fields(ParallelLayout) if f.name != "dp")
    unknown = sorted(str(k) for k in layout if k not in allowed)
    if unknown:
        raise SpecError(f"layout.{unknown[0]}: unknown field (allowed: {', '.join(allowed)}; DP is derived)")
    return layout_for_world(num_gpus, **layout)


def resolve_space(space: SpaceRef | None) -> SearchSpace:
    """``space`` as a ``SearchSpace`` (None: everything Megatron allows)."""
    from paraplan.search import SearchSpace

    if space is None:
        return SearchSpace()
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, Mapping):
        allowed = sorted(f.name for f in fields(SearchSpace))
        unknown = sorted(str(k) for k in space if k not in allowed)
        if unknown:
            raise SpecError(f"space.{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in space.items()}
        return SearchSpace(**values)
    raise SpecError(f"space: expected a SearchSpace or a mapping of its fields, got {type(space).__name__}")


def estimate(model: ModelRef, gpu: GpuRef, num_gpus: int | None = None, *, layout: LayoutRef,
             training: TrainingRef, gpus_per_node: int | None = None, memory_options: MemoryOptions | None = None,
             mfu_peak: Literal["bf16", "fp8", "fp16", "fp4"] = "bf16", notes: Sequence[str] = (),
             headroom: Headroom | None = None) -> Estimate:
    """Memory per pipeline stage, step time and throughput of one layout.

    ``mfu_peak``: the dense peak MFU and HFU divide by; ``notes``: the caller's own notes, kept after the
    estimate's in ``Estimate.notes``; ``headroom``: the memory margin of ``Estimate.fits_with_margin`` (None:
    the memory model's error band). Raises ``LayoutError`` (a ``SpecError``) naming the first Megatron rule
    the layout breaks, ``SpecError`` for a bad input.
    """
    from paraplan.estimator import estimate as _estimate_layout

    if mfu_peak not in ("bf16", "fp8", "fp16", "fp4"):
        raise SpecError(f"mfu_peak must be bf16, fp8, fp16 or fp4, got {mfu_peak!r}")
    if isinstance(notes, str):
        raise SpecError("notes: expected a sequence of strings, got one string")
    cluster = resolve_cluster(gpu, num_gpus, gpus_per_node)
    return _estimate_layout(resolve_model(model), cluster, resolve_training(training),
                            resolve_layout(layout, cluster.num_gpus), memory_options=memory_options,
                            mfu_peak=mfu_peak, extra_notes=[str(n) for n in notes], headroom=headroom)


def plan(model: ModelRef, gpu: GpuRef, num_gpus: int | None = None, *, training: TrainingRef,
         space: SpaceRef | None = None, objective: Objective = "throughput", top_k: int = 5,
         gpus_per_node: int | None = None, memory_options: MemoryOptions | None = None,
         headroom: Headroom | None = None) -> Plan:
    """Search every valid layout of ``space`` and rank the ones that fit by ``objective``; the best
    ``top_k`` are full estimates (``Plan.candidates``). A layout fits when its peak plus the ``headroom``
    margin stays within usable memory (None: the memory model's error band, ``paraplan.headroom``).

    Raises ``NoFeasiblePlanError`` (with rejection counts) when nothing fits, ``SpecError`` for a bad input.
    """
    from paraplan.search import plan as _search

    if objective not in ("throughput", "memory-headroom"):
        raise SpecError(f"objective must be throughput or memory-headroom, got {objective!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise SpecError(f"top_k must be a positive integer, got {top_k!r}")
    from paraplan.recipes.compare import job_recipe_layouts

    cluster = resolve_cluster(gpu, num_gpus, gpus_per_node)
    spec, train = resolve_model(model), resolve_training(training)
    return _search(spec, cluster, train, space=resolve_space(space), objective=objective, top_k=top_k,
                   options=memory_options, headroom=headroom, recipes=job_recipe_layouts(spec, cluster, train))


def __getattr__(name: str) -> Any:
    """PEP 562: a re-exported name (``REEXPORTS``) is imported from its module the first time it is asked for."""
    if name not in REEXPORTS:
        raise AttributeError(f"module 'paraplan.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(REEXPORTS[name][0]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "GpuRef",
    "LayoutRef",
    "ModelRef",
    "SpaceRef",
    "TrainingRef",
    "estimate",
    "plan",
    "resolve_cluster",
    "resolve_layout",
    "resolve_model",
    "resolve_space",
    "resolve_training",
    *REEXPORTS,
]
