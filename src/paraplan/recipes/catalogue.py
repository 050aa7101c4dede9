"""The recipe library: NVIDIA's Megatron-Bridge performance recipes, and the user's own.

The packaged ``bridge_recipes.json`` holds one row per row of ``../shared/reference/bridge_perf_recipes.csv``
(432 recipes, 84 columns, written by ``python -m paraplan.recipes.build``), each under the CSV's column names with
its cells read by ``parse_cell``. A recipe's identifier is its ``source`` (``path:function``); ``alias`` gives a
short, deterministic name (``llama3-70b-h100-fp8cs-64``; a user recipe's ends in ``-user``). ``model`` and ``gpu``
map to paraplan's presets through ``MODEL_PRESETS`` and ``GPU_PRESETS``; a row whose model or GPU has no preset
stays in the library with the reason (``paraplan recipes --all``).

User recipes (``--recipes FILE``) are a CSV with the same header or a YAML list of mappings (or a mapping with a
``recipes`` list), keyed by the same column names; a column a user row leaves out takes the Megatron-Bridge pretrain
default of bridge_perf_recipes.md ("Defaults assumed"), as ``DEFAULTS`` lists. Every row is validated when the file
is read: one line naming the file, the row and the column.

This module imports no numpy, pydantic or yaml at load (``paraplan recipes`` lists without them).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Final

from paraplan.errors import SpecError

Cell = str | int | float | bool | None | list[str]
"""A recipe field: the CSV cell as ``parse_cell`` reads it (``""``: not set / not applicable, ``"?"``: not
statically resolvable, as bridge_perf_recipes.md defines them)."""

PACKAGED_NAME: Final = "bridge_recipes.json"
CSV_NAME: Final = "bridge_perf_recipes.csv"

MODEL_PRESETS: Final[dict[str, str]] = {
    "llama3_8b": "llama3-8b",
    "llama3_70b": "llama3-70b",
    "llama31_405b": "llama3.1-405b",
    "deepseek_v3": "deepseek-v3",
    "qwen3_30b_a3b": "qwen3-30b-a3b",
    "qwen3_235b_a22b": "qwen3-235b-a22b",
    "gpt_oss_120b": "gpt-oss-120b",
    "gpt_oss_20b": "gpt-oss-20b",
}
"""Recipe ``model`` -> paraplan model preset (``paraplan models``); the GPT-OSS-20B perf recipes change the model
(``RECIPE_MODEL_CHANGES``). The other recipe models (Kimi-K2,
Nemotron-H/3, Qwen3-Next, Qwen3/3.5-VL, GLM, DeepSeek-V4, Wan) have no preset yet."""

RECIPE_MODEL_CHANGES: Final[dict[str, dict[str, str | int]]] = {
    "gpt_oss_20b": {"vocab_size": 128256, "position_embedding_type": "rope"},
}
"""ModelSpec fields a recipe model's performance recipes set over its preset: Megatron-Bridge
perf_recipes/gpt_oss/common.py ``_apply_gpt_oss_20b_common_configs`` sets ``model.vocab_size = 128256`` and
``model.position_embedding_type = "rope"`` (the preset: 201088, YaRN), so those recipes are estimated as they run."""

GPU_PRESETS: Final[dict[str, str]] = {
    "h100": "h100-80gb", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300",
}
"""Recipe ``gpu`` -> paraplan GPU preset (``paraplan gpus``); VR200 and R100 have none."""
_GPU_NAMES: Final = {preset: name for name, preset in GPU_PRESETS.items()}

MAX_USER_FILE_BYTES: Final = 16 * 2**20
"""Largest user recipe file read (16 MiB; the whole NVIDIA table is 0.4 MB)."""
MAX_USER_ROWS: Final = 10_000
MAX_CELL_CHARS: Final = 4096

_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?\d+\.\d*(e-?\d+)?")


def parse_cell(text: str) -> Cell:
    """One CSV cell as a value: ``None``, ``True``/``False``, integers, decimals, ``[a,b]`` lists (of strings);
    anything else (``""``, ``"?"``, layouts, env vars, names) stays the text."""
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [x.strip() for x in inner.split(",")] if inner else []
    return text


def cell_text(value: Cell) -> str:
    """A field as the CSV writes it (for tables and messages)."""
    if value is None:
        return "None"
    if isinstance(value, list):
        return "[" + ",".join(value) + "]"
    return str(value)


@dataclass(frozen=True, slots=True)
class Recipe:
    """One recipe: its fields under the CSV's column names, its short alias, and the paraplan presets it maps to
    (``reason`` says why not, when it does not)."""

    fields: dict[str, Cell]
    alias: str
    model_preset: str | None
    gpu_preset: str | None
    reason: str = ""
    origin: str = "bridge"
    """``bridge`` (the packaged NVIDIA table) or the user file it came from."""
    row: int = 0
    """Data row in its file (1 = first row after the header)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """The identifier: the CSV's ``source`` (path:function)."""
        return str(self.fields["source"])

    @property
    def runnable(self) -> bool:
        """Model and GPU both have paraplan presets."""
        return self.model_preset is not None and self.gpu_preset is not None

    @property
    def derivation(self) -> str:
        """Why this NVIDIA recipe is not a run NVIDIA published: derived by weak scaling from another GPU count
        (``paraplan.recipes.provenance``); "" for the rest and for user recipes."""
        if self.origin != "bridge":
            return ""
        from paraplan.recipes.provenance import derivation_of

        return derivation_of(self.source.rsplit(":", 1)[-1])

    def get(self, column: str) -> Cell:
        """The field, or the Bridge default when the row leaves the column out (user rows)."""
        return self.fields.get(column, DEFAULTS.get(column, ""))

    def as_dict(self) -> dict[str, Any]:
        """JSON: identifier, alias, presets, reason, derivation, then every field under its column name."""
        return {"source": self.source, "alias": self.alias, "paraplan_model": self.model_preset,
                "paraplan_gpu": self.gpu_preset, "runnable": self.runnable, "reason": self.reason,
                "derivation": self.derivation, "origin": self.origin, "fields": {c: self.get(c) for c in columns()}}


DEFAULTS: Final[dict[str, Cell]] = {
    "family": "", "task": "pretrain", "config_variant": "", "cp": 1, "vp": None, "ep": 1, "etp": None, "dp": "",
    "sequence_parallel": False, "pipeline_model_parallel_layout": None,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
    "recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None, "recompute_modules": None,
    "cpu_offloading": False, "cpu_offloading_num_layers": 0, "cpu_offloading_activations": True,
    "cpu_offloading_weights": False, "optimizer_cpu_offload": False, "optimizer_offload_fraction": 0.0,
    "fine_grained_activation_offloading": False, "offload_modules": [], "cuda_graph_impl": "none",
    "cuda_graph_scope": [], "fp8_param_gather": False, "fp4_param_gather": False, "grad_reduce_in_fp32": True,
    "use_distributed_optimizer": True, "use_megatron_fsdp": False, "data_parallel_sharding_strategy": "no_shard",
    "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_param_gather_with_optimizer_step": False,
    "tp_comm_overlap": False, "tp_comm_overlap_cfg": "", "moe_token_dispatcher_type": "",
    "moe_flex_dispatcher_backend": "", "moe_a2a_overlap": False, "delay_wgrad_compute": False,
    "moe_permute_fusion": "", "moe_grouped_gemm": "", "moe_router_dtype": "", "moe_shared_expert_overlap": "",
    "mtp_num_layers": "", "manual_gc": False, "manual_gc_interval": 0, "CUDA_DEVICE_MAX_CONNECTIONS": "",
    "PYTORCH_CUDA_ALLOC_CONF": "", "other_env": "", "optimizer": "adam", "use_precision_aware_optimizer": False,
    "optimizer_state_dtypes": "main_grads=fp32;main_params=fp32;exp_avg=fp32;exp_avg_sq=fp32",
    "num_distributed_optimizer_instances": 1, "outer_dp_sharding_strategy": "no_shard", "nccl_ub": False,
    "fsdp_double_buffer": False, "defer_embedding_wgrad_compute": False, "wgrad_deferral_limit": -1,
    "first_last_layers_bf16": False, "fp8_dot_product_attention": False, "reuse_grad_buf_for_mxfp8_param_ag": False,
    "moe_router_force_load_balancing": "", "moe_expert_capacity_factor": "", "moe_hybridep_num_sms": "",
    "moe_router_fusion": "", "moe_paged_stash": "", "use_transformer_engine_op_fuser": False,
    "gradient_accumulation_fusion": True, "attention_backend": None, "cross_entropy_fusion_impl": "native",
    "peft": None, "notes": "",
}
"""What a user row that leaves a column out means: the Megatron-Bridge pretrain recipe and MCore defaults
(bridge_perf_recipes.md, "Defaults assumed"; MoE columns empty: the model's own setting)."""

REQUIRED: Final = ("source", "model", "gpu", "num_gpus", "precision", "seq_length", "global_batch_size",
                   "micro_batch_size", "tp", "pp")
"""Columns every user recipe row gives."""


@cache
def _packaged() -> dict[str, Any]:
    text = resources.files("paraplan.recipes").joinpath(PACKAGED_NAME).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def columns() -> tuple[str, ...]:
    """The reference CSV's 84 column names, in its order."""
    return tuple(_packaged()["columns"])


def alias_for(fields: dict[str, Cell]) -> str:
    """``<model>-<gpu>-<precision>-<N>[-<task>][-<variant>]``, lower case, dashes: the model as its paraplan
    preset when it has one (``llama3-70b-h100-fp8cs-64``). The parts are those of the recipe's function name, so
    two recipes of the table never share one (tests/recipes checks)."""
    model = str(fields.get("model", ""))
    gpu = str(fields.get("gpu", ""))
    parts = [MODEL_PRESETS.get(model, model.replace("_", "-")), _GPU_NAMES.get(gpu, gpu),
             str(fields.get("precision", "")).replace("_", ""), str(fields.get("num_gpus", ""))]
    task = str(fields.get("task") or "pretrain")
    if task != "pretrain":
        parts.append(task)
    if fields.get("config_variant"):
        parts.append(str(fields["config_variant"]).replace("_", "-"))
    return "-".join(parts).lower()


def make_recipe(fields: dict[str, Cell], *, origin: str = "bridge", row: int = 0) -> Recipe:
    """A Recipe with its alias and presets resolved (``reason`` when they are not)."""
    model, gpu = str(fields.get("model", "")), str(fields.get("gpu", ""))
    model_preset = MODEL_PRESETS.get(model) or (model if model in _preset_names("models") else None)
    gpu_preset = GPU_PRESETS.get(gpu) or (gpu if gpu in _preset_names("gpus") else None)
    reasons = []
    if model_preset is None:
        reasons.append(f"no paraplan model preset for {model} (paraplan models)")
    if gpu_preset is None:
        reasons.append(f"no paraplan GPU preset for {gpu} (paraplan gpus)")
    alias = alias_for(fields) + ("" if origin == "bridge" else "-user")  # never one of NVIDIA's aliases
    return Recipe(fields=fields, alias=alias, model_preset=model_preset, gpu_preset=gpu_preset,
                  reason="; ".join(reasons), origin=origin, row=row)


@cache
def _preset_names(kind: str) -> frozenset[str]:
    """The built-in preset names of ``kind`` (models, gpus): the YAML files' names, read without yaml."""
    folder = resources.files("paraplan.specs.presets").joinpath(kind)
    return frozenset(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


@cache
def bridge_recipes() -> tuple[Recipe, ...]:
    """The packaged NVIDIA recipes, in the CSV's order."""
    cols = columns()
    return tuple(make_recipe(dict(zip(cols, r, strict=True)), row=i + 1) for i, r in enumerate(_packaged()["rows"]))


def find_recipe(name: str, recipes: tuple[Recipe, ...]) -> Recipe:
    """The recipe whose source, function name or alias is ``name``; one line with the nearest names if none."""
    if not name.strip():
        raise SpecError("--recipe: empty (give a source, function name or alias from `paraplan recipes --all`)")
    for r in recipes:
        if name in (r.source, r.alias, r.source.rsplit(":", 1)[-1]):
            return r
    import difflib

    names = [r.alias for r in recipes]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise SpecError(f"--recipe: unknown recipe '{name}' (give a source, function name or alias from "
                    f"`paraplan recipes --all`){hint}")


def _log_ratio(a: Cell, b: float) -> float:
    return abs(math.log2(float(a) / b)) if isinstance(a, int | float) and a > 0 and b > 0 else math.inf


def closest_recipe(recipes: tuple[Recipe, ...], *, model: str, gpu: str, num_gpus: int, seq_len: int, gbs: int,
                   precision: str) -> Recipe | None:
    """The recipe for this model and GPU preset nearest this job: closest GPU count, then sequence length, then GBS
    (each as a ratio), then the same GEMM precision (bf16 / fp8 / nvfp4), pretraining, no config variant; None when no
    recipe exists for the pair."""
    mine = [r for r in recipes if r.runnable and r.model_preset == model and r.gpu_preset == gpu]
    if not mine:
        return None

    def key(r: Recipe) -> tuple[float, float, float, bool, bool, bool, str]:
        prec = str(r.get("precision"))
        same = {"fp8": prec.startswith("fp8"), "fp4": prec == "nvfp4"}.get(precision, prec == precision)
        return (_log_ratio(r.get("num_gpus"), num_gpus), _log_ratio(r.get("seq_length"), seq_len),
                _log_ratio(r.get("global_batch_size"), gbs), not same, r.get("task") != "pretrain",
                bool(r.get("config_variant")), r.source)

    return min(mine, key=key)

