"""Megatron-Bridge launch files: a Python recipe file and the equivalent Hydra-style override list.

``bridge_recipe.py``     starts from the matching Bridge performance recipe (``megatron.bridge.perf_recipes``,
                         listed in ../shared/reference/bridge_perf_recipes.csv) when one exists for the model,
                         GPU and precision, else from the model's base recipe (``megatron.bridge.recipes``), and
                         sets paraplan's layout on the ``ConfigContainer``; run it with torchrun
``bridge_overrides.txt`` the same settings as ``KEY=VALUE`` ConfigContainer overrides for Bridge's
                         ``scripts/training/run_recipe.py --recipe <function>`` (and scripts/performance)

Every value written into the Python file is ``repr()`` of a validated int, float, bool, str or None (or a
list of validated str); field paths and recipe names are checked identifiers. Nothing is concatenated into
code. Field names follow Bridge's config dataclasses (a test checks them against Bridge's source).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Final

from paraplan._version import __version__
from paraplan.errors import SpecError
from paraplan.estimate.pipeline import pipeline_layout_string
from paraplan.launch.megatron import (
    BLACKWELL_ARCHS,
    TRAIN_ITERS_DEFAULT,
    as_launched,
    environment,
    save_interval_default,
)
from paraplan.launch.quoting import one_line

if TYPE_CHECKING:
    from paraplan.launch.render import LaunchSpec
    from paraplan.specs.model import ModelSpec

BRIDGE_COMMIT: Final = "067f987"
"""Megatron-Bridge commit of the recipe table and field names."""
BASE_RECIPES: Final[dict[str, tuple[str, str]]] = {
    "llama2-7b": ("megatron.bridge.recipes.llama", "llama2_7b_pretrain_config"),
    "llama3-8b": ("megatron.bridge.recipes.llama", "llama3_8b_pretrain_config"),
    "llama3-70b": ("megatron.bridge.recipes.llama", "llama3_70b_pretrain_config"),
    "llama3.1-405b": ("megatron.bridge.recipes.llama", "llama31_405b_pretrain_config"),
    "qwen2.5-7b": ("megatron.bridge.recipes.qwen", "qwen25_7b_pretrain_config"),
    "qwen2.5-72b": ("megatron.bridge.recipes.qwen", "qwen25_72b_pretrain_config"),
    "qwen3-30b-a3b": ("megatron.bridge.recipes.qwen", "qwen3_30b_a3b_pretrain_config"),
    "qwen3-235b-a22b": ("megatron.bridge.recipes.qwen", "qwen3_235b_a22b_pretrain_config"),
    "deepseek-v3": ("megatron.bridge.recipes.deepseek", "deepseek_v3_pretrain_config"),
    "gpt3-175b": ("megatron.bridge.recipes.gpt", "gpt3_175b_pretrain_config"),
    "gpt-oss-20b": ("megatron.bridge.recipes.gpt_oss", "gpt_oss_20b_pretrain_config"),
    "gpt-oss-120b": ("megatron.bridge.recipes.gpt_oss", "gpt_oss_120b_pretrain_config"),
}
"""paraplan model -> (module, function) of Bridge's base pretrain recipe (``megatron.bridge.recipes``)."""
PERF_STEMS: Final = {"llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b", "llama3.1-405b": "llama31_405b",
                     "qwen3-30b-a3b": "qwen3_30b_a3b", "qwen3-235b-a22b": "qwen3_235b_a22b",
                     "deepseek-v3": "deepseek_v3", "gpt-oss-120b": "gpt_oss_120b"}
"""paraplan model -> the ``model`` column of the performance recipe table. Not gpt-oss-20b: its performance recipes
build another model (perf_recipes/gpt_oss/common.py ``_apply_gpt_oss_20b_common_configs``: vocab 128256, plain
RoPE), so its launch takes the base recipe, which builds the HF model (recipes/gpt_oss/h100/gpt_oss.py)."""
GPU_NAMES: Final = {"h100-80gb": "h100", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300"}
_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FIELD: Final = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?")
_SOURCE: Final = re.compile(r"src/(megatron/bridge/perf_recipes/[a-z0-9_/]+)\.py:([a-z0-9_]+)")
_WORD: Final = re.compile(r"[A-Za-z0-9_.:/+-]+")
_LAYOUT: Final = re.compile(r"[EtmL|]+")

Scalar = int | float | bool | str | None
SMS_FIELD: Final = "model.moe_flex_dispatcher_num_sms"
"""The flex dispatcher's SM count for every backend (Megatron-LM TransformerConfig.moe_flex_dispatcher_num_sms)."""
SMS_LEGACY_FIELDS: Final = {"deepep": "model.moe_deepep_num_sms", "hybridep": "model.moe_hybridep_num_sms"}
"""The deprecated per-backend fields it unifies, where an older Megatron-Core lacks it: HybridEP's for hybridep,
DeepEP's for every other backend (Bridge training/model_load_save.py ``_normalize_moe_dispatcher_sm_config``)."""


def sms_legacy_field(backend: str) -> str:
    """The deprecated SM-count field Bridge maps ``backend``'s count to (``SMS_LEGACY_FIELDS``)."""
    return SMS_LEGACY_FIELDS["hybridep" if backend == "hybridep" else "deepep"]


@dataclass(frozen=True, slots=True)
class EnvValue:
    """A value read from the environment at run time, as the Megatron-LM launch's placeholders: ``default`` None
    means required. bridge_recipe.py reads ``os.environ``; bridge_overrides.txt an OmegaConf ``oc.env``
    interpolation (Bridge resolves the overrides with ``OmegaConf.to_container(resolve=True)``)."""

    env: str
    default: int | str | None = None

    def __post_init__(self) -> None:
        if not _IDENT.fullmatch(self.env) or (isinstance(self.default, str) and not _WORD.fullmatch(self.default)):
            raise SpecError(f"bridge environment value {self.env!r}: not a plain name and default")


Value = Scalar | list[str] | EnvValue

NO_RECIPE_CHECKED: Final = ("megatron.bridge.recipes", "megatron.bridge.models")
"""Where choose_recipe's note says it looked when Bridge has no recipe for a model family."""
NO_FAMILY: Final = {
    "mixtral": "no Mixtral recipe module in megatron.bridge.recipes and no Mixtral model provider in "
               "megatron.bridge.models (megatron.bridge.models.mistral holds the dense MistralModelProvider only), "
               "so there is no base recipe to fall back to",
}
"""Model families Bridge has neither a recipe nor a provider for (checked at BRIDGE_COMMIT)."""
PLANNED_OFF: Final[tuple[tuple[str, Scalar | list[str], str], ...]] = (
    ("scheduler.lr_decay_iters", None, "_benchmark_common decays the LR over its 50 iterations; None: train_iters"),
)
"""Benchmark-only settings of a performance recipe (``_benchmark_common`` and the recipe itself) that the plan
did not model, reset to what the plan assumes (the knobs the plan did estimate, CUDA graphs among them, are
written with their estimated values by ``knob_overrides``, manual GC among them). Kept as the recipe sets them
(stated in bridge_recipe.py): ``train.eval_iters = 0``,
``logger.log_interval = 1``, the NaN / large-gradient checks off, the fused RoPE kernel
(``apply_rope_fusion``; the cross entropy's fusion is a knob, written with the plan's value): throughput settings
that do not change
the layout the plan priced; re-enable the checks for a long run if you want them."""


TORCH_DTYPES: Final = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "uint8"}
"""paraplan's optimizer-state dtype names -> the ``torch`` dtype Megatron-LM maps them to (arguments.py
``dtype_map``: fp8 moments are ``torch.uint8``); bridge_recipe.py sets ``getattr(torch, name)``."""
HYDRA_DTYPES: Final = ("float32", "bfloat16", "float16")
"""The torch dtype names Bridge's override parser reads back into a ``torch.dtype`` (utils/activation_map.py
``DTYPE_MAP``: it has no ``uint8``, and its "fp8" is float8_e4m3fn, not the uint8 Megatron-Core's optimizer takes)."""
DTYPE_FIELDS: Final = ("optimizer.main_grads_dtype", "optimizer.main_params_dtype", "optimizer.exp_avg_dtype",
                       "optimizer.exp_avg_sq_dtype")
ENUM_FIELDS: Final = {"model.attention_backend": "AttnBackend"}
"""Fields whose value is a Megatron-Core enum member by name (megatron/core/transformer/enums.py): bridge_recipe.py
sets ``enums.AttnBackend[value]``; bridge_overrides.txt cannot (Bridge's override parser converts dtypes and callables
back from strings, not enums: training/utils/omegaconf_utils.py ``_apply_overrides``)."""
COMM_OVERLAP_FIELDS: Final = ("overlap_grad_reduce", "overlap_param_gather", "overlap_param_gather_with_optimizer_step",
                              "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                              "defer_embedding_wgrad_compute", "wgrad_deferral_limit")
"""Fields a recipe's ``comm_overlap`` (CommOverlapConfig) writes over model / optimizer / ddp in its setup
(training/comm_overlap.py ``_override_user_cfgs`` + ``_apply_cfgs``: its defaults are False unless the user
config sets them), so bridge_recipe.py sets them there too when the recipe has one."""


@dataclass(frozen=True, slots=True)
class Recipe:
    """The Bridge recipe function a launch starts from."""

    module: str
    function: str
    kind: str
    """"perf" (the performance recipe table) or "base" (the model's base recipe)."""

    def __post_init__(self) -> None:
        if not _MODULE.fullmatch(self.module) or not _IDENT.fullmatch(self.function):
            raise SpecError(f"bridge recipe: {self.module}.{self.function} is not a Python name")


BRIDGE_FP8: Final = {"delayed": ("fp8_ds", "bf16_with_fp8_delayed_scaling_mixed"),
                     "tensorwise": ("fp8_cs", "bf16_with_fp8_current_scaling_mixed"),
                     "mxfp8": ("fp8_mx", "bf16_with_mxfp8_mixed"),
                     "blockwise": ("fp8_sc", "bf16_with_fp8_subchannel_scaling_mixed")}
"""``--fp8-recipe`` -> (the table's precision column, Bridge's mixed-precision preset; training/mixed_precision.py)."""


def bridge_precision(precision: str, arch: str, fp8_recipe: str = "delayed") -> tuple[str, str]:
    """(the table's precision column, Bridge's mixed-precision preset) for paraplan's precision: the FP8 recipe the
    spec names when it is not Megatron's default; for the default (delayed) MXFP8 on Blackwell, where NVIDIA's
    performance recipes are MXFP8 or current scaling and none is delayed, and delayed before it; NVFP4 for fp4."""
    if precision == "fp4":  # NVFP4 (Blackwell only: launch_violations)
        return ("nvfp4", "bf16_with_nvfp4_mixed")
    if precision == "fp8":
        if fp8_recipe == "delayed" and arch in BLACKWELL_ARCHS:
            return BRIDGE_FP8["mxfp8"]
        return BRIDGE_FP8[fp8_recipe]
    return ("fp16", "fp16_mixed") if precision == "fp16" else ("bf16", "bf16_mixed")


def perf_table() -> list[dict[str, str]]:
    """The performance recipe table shipped with paraplan (bridge_perf_recipes.tsv: the columns of
    ../shared/reference/bridge_perf_recipes.csv the choice reads; a test checks the copy)."""
    text = resources.files("paraplan.launch").joinpath("bridge_perf_recipes.tsv").read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines(), delimiter="\t"))


ARCHITECTURE_FIELDS: Final = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                               "ffn_hidden_size", "vocab_size", "num_experts")
"""ModelSpec fields a Bridge recipe fixes: a model named like a preset must match the preset in all of them."""


def check_preset_architecture(model: ModelSpec) -> None:
    """SpecError (one line) when ``model`` carries a preset's name but not its architecture: Bridge picks
    its recipe by name, and the recipe builds the preset's model (a 2-layer 'llama3-8b' would train 8B)."""
    from paraplan.specs.load import load_model_preset

    preset = load_model_preset(model.name)
    diff = [f"{f} {getattr(model, f)} (preset {getattr(preset, f)})" for f in ARCHITECTURE_FIELDS
            if getattr(model, f) != getattr(preset, f)]
    if diff:
        raise SpecError(f"--target bridge: model '{model.name}' differs from the {model.name} preset that Bridge's "
                        f"recipe builds: {', '.join(diff[:3])}; rename the model or use --target megatron")


def choose_recipe(spec: LaunchSpec) -> Recipe:
    """The performance recipe for (model, GPU, precision, pretrain, no variant), the one with the same GPU count
    or else the nearest; otherwise the model's base recipe; SpecError when Bridge has neither."""
    model, gpu = spec.model.name, GPU_NAMES.get(spec.cluster.gpu.name)
    if model in BASE_RECIPES:
        check_preset_architecture(spec.model)
    column, _ = bridge_precision(spec.training.precision, spec.cluster.gpu.arch, spec.training.fp8_recipe)
    stem = PERF_STEMS.get(model)
    rows = [r for r in perf_table() if stem is not None and r["model"] == stem and r["gpu"] == gpu
            and r["precision"] == column and r["task"] == "pretrain" and not r["config_variant"]]
    if rows:
        best = min(rows, key=lambda r: (abs(int(r["num_gpus"]) - spec.cluster.num_gpus), int(r["num_gpus"])))
        m = _SOURCE.fullmatch(best["source"])
        if m is None:
            raise SpecError(f"bridge recipe table: cannot read source {best['source']!r}")
        return Recipe(m.group(1).replace("/", "."), m.group(2), "perf")
    if model in BASE_RECIPES:
        return Recipe(*BASE_RECIPES[model], "base")
    family = re.split(r"[-.0-9]", model, maxsplit=1)[0] or model
    why = NO_FAMILY.get(family, f"no recipe function for this model in {NO_RECIPE_CHECKED[0]}")
    raise SpecError(f"--target bridge: Megatron-Bridge has no recipe for model '{model}' (Megatron-Bridge "
                    f"{BRIDGE_COMMIT}: {why}; paraplan maps recipes for: {', '.join(sorted(BASE_RECIPES))})")


def knob_overrides(spec: LaunchSpec) -> list[tuple[str, Scalar | list[str]]]:
    """The knobs the plan estimated (``TrainingSpec``, ``KNOB_FLAGS``), as ConfigContainer fields with the
    estimated values; written whatever the recipe sets, since a performance recipe sets many of them its own way
    (``_benchmark_common``: grad_reduce_in_fp32 False; CUDA graphs, HybridEP in the MoE recipes).

    Paths: ``model.*`` TransformerConfig / ModelParallelConfig, ``optimizer.*`` OptimizerConfig, ``ddp.*``
    DistributedDataParallelConfig, ``mixed_precision.*`` MixedPrecisionConfig, whose ``setup`` writes its fields
    over the same-named model / optimizer / ddp fields (training/mixed_precision.py
    ``update_config_with_precision_overrides``), so grad_reduce_in_fp32 and the FP8 / FP4 settings go there."""
    from paraplan.specs.training import main_grad_bytes

    t, m = spec.training, spec.model
    impl = t.cuda_graph_impl
    out: list[tuple[str, Scalar | list[str]]] = [
        ("model.cuda_graph_impl", impl),
        ("model.cuda_graph_scope", list(t.cuda_graph_modules) if impl not in ("none", "full_iteration") else []),
        # _benchmark_common sets both from the recipe's own graphs; CUDA graphs need TE's RNG tracker
        ("model.use_te_rng_tracker", impl != "none"), ("rng.te_rng_tracker", impl != "none"),
        ("model.gradient_accumulation_fusion", t.gradient_accumulation_fusion),
        ("model.cp_comm_type", t.cp_comm_type),
        ("model.cpu_offloading", t.cpu_offloading_num_layers > 0),
        ("model.cpu_offloading_num_layers", t.cpu_offloading_num_layers),
        ("model.fine_grained_activation_offloading", t.fine_grained_activation_offloading),
        ("model.offload_modules", list(t.offload_modules)),
        ("model.defer_embedding_wgrad_compute", t.defer_embedding_wgrad_compute),
        ("model.wgrad_deferral_limit", t.wgrad_deferral_limit),
        ("model.cross_entropy_loss_fusion", t.cross_entropy_loss_fusion),
        ("model.cross_entropy_fusion_impl", t.cross_entropy_fusion_impl),
    ]
    # paraplan's flash is Megatron's flash / fused / auto, as the recipe picks it; unfused is written (Megatron-LM's
    # --attention-backend unfused): the plan priced its s x s scores
    if t.attention_backend == "unfused":
        out.append(("model.attention_backend", "unfused"))
    # userbuffers pair switches (TransformerConfig fields Bridge's CommOverlapConfig leaves alone), written either way
    out += [(f"model.{k}", getattr(t, k)) for k in ("tp_comm_overlap_ag", "tp_comm_overlap_rs",
                                                     "tp_comm_overlap_rs_dgrad")]
    # modelled as no time, written either way: the perf recipes turn it on (_benchmark_common: manual_gc True,
    # interval 100), Megatron-LM's default is off
    out += [("train.manual_gc", t.manual_gc)] + ([("train.manual_gc_interval", t.manual_gc_interval)]
                                                 if t.manual_gc else [])
    if m.is_moe:
        out += [("model.moe_token_dispatcher_type", t.moe_token_dispatcher_type)]
        if t.moe_token_dispatcher_type == "flex":
            out += [("model.moe_flex_dispatcher_backend", t.moe_flex_dispatcher_backend),
                    # the deprecated per-backend keys first, cleared: a recipe's own value would be routed over an
                    # unset unified field (TransformerConfig.__post_init__); the unified key is every backend's
                    *[(key, None) for key in SMS_LEGACY_FIELDS.values()],
                    (SMS_FIELD, t.moe_hybridep_num_sms)]
            if t.moe_flex_dispatcher_backend == "hybridep":
                out += [("model.moe_permute_fusion_into_hybridep", t.moe_permute_fusion_into_hybridep)]
        out += [("model.moe_permute_fusion", t.moe_permute_fusion),
                ("model.moe_shared_expert_overlap", t.moe_shared_expert_overlap),
                ("model.moe_expert_capacity_factor", t.moe_expert_capacity_factor),
                ("model.moe_pad_expert_input_to_capacity", t.moe_pad_expert_input_to_capacity),
                # the rank budget, the paged stash that needs it and the op fuser it needs: one consistent set
                ("model.moe_expert_rank_capacity_factor", t.moe_expert_rank_capacity_factor),
                ("model.moe_paged_stash", t.moe_paged_stash),
                ("model.moe_paged_stash_buffer_size_factor_cuda", t.moe_paged_stash_buffer_size_factor_cuda),
                ("model.moe_paged_stash_buffer_size_factor_cpu", t.moe_paged_stash_buffer_size_factor_cpu),
                ("model.use_transformer_engine_op_fuser", t.use_transformer_engine_op_fuser),
                ("model.moe_use_grouped_tensor", t.moe_use_grouped_tensor),
                ("model.overlap_moe_expert_parallel_comm", spec.layout.schedule == "combined_1f1b"),
                ("model.delay_wgrad_compute", t.delay_wgrad_compute)]
    out += [("optimizer.use_precision_aware_optimizer", t.use_precision_aware_optimizer),
            ("optimizer.main_grads_dtype", TORCH_DTYPES[t.main_grads_dtype]),
            ("optimizer.main_params_dtype", TORCH_DTYPES[t.main_params_dtype]),
            ("optimizer.exp_avg_dtype", TORCH_DTYPES[t.exp_avg_dtype]),
            ("optimizer.exp_avg_sq_dtype", TORCH_DTYPES[t.exp_avg_sq_dtype]),
            ("optimizer.store_param_remainders", t.store_param_remainders),
            ("optimizer.optimizer_cpu_offload", t.optimizer_cpu_offload),
            ("optimizer.optimizer_offload_fraction", float(t.optimizer_offload_fraction) if t.optimizer_cpu_offload
             else 0.0),
            ("optimizer.overlap_param_gather_with_optimizer_step", t.overlap_param_gather_with_optimizer_step),
            ("ddp.fsdp_double_buffer", t.fsdp_double_buffer),
            ("ddp.grad_reduce_in_fp32", main_grad_bytes(t) == 4.0),
            ("mixed_precision.grad_reduce_in_fp32", main_grad_bytes(t) == 4.0)]
    if t.precision == "fp8":
        _, preset = bridge_precision(t.precision, spec.cluster.gpu.arch, t.fp8_recipe)
        mxfp8 = preset == BRIDGE_FP8["mxfp8"][1]
        out += [("mixed_precision.fp8_param_gather", t.fp8_param_gather),
                # config.py ConfigContainer.validate: MXFP8 param gather needs it (without Megatron-FSDP)
                ("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", t.fp8_param_gather and mxfp8
                 and not spec.layout.fsdp)]
    if t.precision == "fp4":
        out += [("mixed_precision.fp4_recipe", t.fp4_recipe), ("mixed_precision.fp4_param_gather", t.fp4_param_gather)]
    if t.precision in ("fp8", "fp4"):
        out += [("mixed_precision.fp8_dot_product_attention", t.fp8_dot_product_attention),
                ("mixed_precision.first_last_layers_bf16", t.first_last_layers_bf16)]
        if t.first_last_layers_bf16:
            out += [("mixed_precision.num_layers_at_start_in_bf16", t.num_layers_at_start_in_bf16),
                    ("mixed_precision.num_layers_at_end_in_bf16", t.num_layers_at_end_in_bf16)]
    return out


def comm_overlap_values(items: list[tuple[str, Value]]) -> dict[str, Scalar]:
    """The ``COMM_OVERLAP_FIELDS`` values among ``items``, for a recipe's ``comm_overlap``."""
    out: dict[str, Scalar] = {}
    for k, v in items:
        name = k.rpartition(".")[2]
        if name in COMM_OVERLAP_FIELDS and not isinstance(v, list | EnvValue):
            out[name] = v
    return out


def not_in_overrides_file(recipe: Recipe, items: list[tuple[str, Value]]) -> list[str]:
    """Fields of ``items`` that bridge_overrides.txt cannot set (bridge_recipe.py does): ``mixed_precision.*`` when
    the recipe names a preset (a base recipe's ``mixed_precision`` is a string, which has no fields to override),
    and an optimizer dtype Bridge's override parser has no name for (``HYDRA_DTYPES``)."""
    return [k for k, v in items if (recipe.kind == "base" and k.startswith("mixed_precision."))
            or (k in DTYPE_FIELDS and v not in HYDRA_DTYPES) or k in ENUM_FIELDS]


def overrides(spec: LaunchSpec, recipe: Recipe) -> list[tuple[str, Value]]:
    """(ConfigContainer field path, value) for paraplan's layout, batch, precision and checkpoints; a performance
    recipe keeps its own mixed-precision config (it was chosen for the same precision)."""
    m, lay = as_launched(spec.model, spec.layout, spec.training)
    _, preset = bridge_precision(spec.training.precision, spec.cluster.gpu.arch, spec.training.fp8_recipe)
    out: list[tuple[str, Value]] = [
        ("model.tensor_model_parallel_size", lay.tp), ("model.pipeline_model_parallel_size", lay.pp),
        ("model.virtual_pipeline_model_parallel_size", lay.vp if lay.vp > 1 else None),
        ("model.context_parallel_size", lay.cp), ("model.sequence_parallel", lay.sp),
    ]
    if m.is_moe:
        out += [("model.expert_model_parallel_size", lay.ep), ("model.expert_tensor_parallel_size", lay.etp)]
    layout = pipeline_layout_string(lay.pipeline_layout, lay.pp, mtp_layers=m.mtp_num_layers) \
        if lay.pipeline_layout else None
    out += [("model.pipeline_model_parallel_layout", layout),
            ("model.num_layers_in_first_pipeline_stage", lay.first_stage_layers or None),
            ("model.num_layers_in_last_pipeline_stage", lay.last_stage_layers or None),
            ("model.account_for_embedding_in_pipeline_split", lay.account_for_embedding),
            ("model.account_for_loss_in_pipeline_split", lay.account_for_loss)]
    if lay.recompute == "selective":
        out += [("model.recompute_granularity", "selective"), ("model.recompute_modules", list(lay.recompute_modules)),
                ("model.recompute_method", None), ("model.recompute_num_layers", None)]
    elif lay.recompute == "full":
        out += [("model.recompute_granularity", "full"), ("model.recompute_method", lay.recompute_method),
                ("model.recompute_num_layers", lay.recompute_num_layers), ("model.recompute_modules", None)]
    else:
        out += [("model.recompute_granularity", None)]
    out += [("model.tp_comm_overlap", lay.tp_comm_overlap), ("model.seq_length", spec.training.seq_len),
            ("dataset.seq_length", spec.training.seq_len),
            ("train.global_batch_size", spec.training.global_batch_size), ("train.micro_batch_size", lay.mbs),
            ("ddp.use_distributed_optimizer", lay.distributed_optimizer), ("ddp.use_megatron_fsdp", lay.fsdp),
            ("ddp.data_parallel_sharding_strategy", "optim_grads_params" if lay.fsdp else "no_shard"),
            ("ddp.overlap_grad_reduce", lay.overlap_grad_reduce),
            ("ddp.overlap_param_gather", lay.overlap_param_gather)]
    if recipe.kind == "base":
        out.append(("mixed_precision", preset))
    # the knobs the plan estimated (gradient_accumulation_fusion: the knob, Megatron-FSDP or not)
    out += knob_overrides(spec)
    out += [("train.train_iters", EnvValue("TRAIN_ITERS", TRAIN_ITERS_DEFAULT)),
            ("dataset.data_path", EnvValue("DATA_PATH")),
            ("tokenizer.tokenizer_type", EnvValue("TOKENIZER_TYPE", "HuggingFaceTokenizer")),
            ("tokenizer.tokenizer_model", EnvValue("TOKENIZER_MODEL")),
            ("checkpoint.save", EnvValue("CHECKPOINT_DIR", spec.site.checkpoint_dir or "checkpoints")),
            ("checkpoint.load", EnvValue("CHECKPOINT_DIR", spec.site.checkpoint_dir or "checkpoints"))]
    if recipe.kind == "perf":
        out += [(k, v) for k, v, _ in PLANNED_OFF]
    if spec.checkpoint is not None:
        out += [("checkpoint.save_interval", save_interval_default(spec.checkpoint)),
                ("checkpoint.ckpt_format", spec.checkpoint.ckpt_format),
                ("checkpoint.async_save", spec.checkpoint.async_save)]
    elif lay.fsdp:
        out.append(("checkpoint.ckpt_format", "fsdp_dtensor"))
    return [(_field(k), _checked(k, v)) for k, v in out]


def _field(path: str) -> str:
    if not _FIELD.fullmatch(path):
        raise SpecError(f"bridge override: {path!r} is not a ConfigContainer field path")
    return path


def _checked(path: str, value: object) -> Value:
    """``value`` when it is an int, float, bool, None, a plain word, or a list of plain words."""
    if value is None or isinstance(value, bool | int | float | EnvValue):
        return value
    if isinstance(value, str) and (_WORD.fullmatch(value) or _LAYOUT.fullmatch(value)):
        return value
    if isinstance(value, list) and all(isinstance(v, str) and _WORD.fullmatch(v) for v in value):
        return [str(v) for v in value]
    raise SpecError(f"bridge override {path}: {value!r} is not a plain value")


def hydra_value(value: Value) -> str:
    """A value as Bridge's ``KEY=VALUE`` overrides read it (OmegaConf dotlist: null, true/false, JSON strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(value) + "]"
    if isinstance(value, EnvValue):  # quoted: Hydra's override grammar reads a nested interpolation only quoted
        if value.default is None:
            return f"'${{oc.env:{value.env}}}'"
        if isinstance(value.default, int):  # oc.env returns a string; oc.decode reads it back as an int
            return f"'${{oc.decode:${{oc.env:{value.env},{value.default}}}}}'"
        return f"'${{oc.env:{value.env},{json.dumps(value.default)}}}'"
    return json.dumps(value)


def _env(spec: LaunchSpec) -> dict[str, str]:
    return {name: value for name, value, _ in environment(spec)}


def recipe_file(spec: LaunchSpec, cid: str, recipe: Recipe, items: list[tuple[str, Value]]) -> str:
    """bridge_recipe.py: imports the recipe function, applies ``OVERRIDES``, runs Bridge's pretrain."""
    env = _env(spec)
    fixed = [(k, v) for k, v in items if not isinstance(v, EnvValue)]
    from_env = [(k, (v.env, v.default)) for k, v in items if isinstance(v, EnvValue)]
    reset = [line for k, v, why in PLANNED_OFF for line in (f"#   {k} = {v!r}", f"#     ({why})")] \
        if recipe.kind == "perf" else []
    lines = [
        f"# Megatron-Bridge recipe, generated by paraplan {one_line(__version__)} (candidate {one_line(cid)}).",
        f"# {one_line(spec.model.name)} on {spec.cluster.num_nodes} node(s) x {spec.cluster.gpus_per_node} GPUs "
        f"({one_line(spec.cluster.gpu.name)}); {one_line(spec.layout.short())}",
        f"# Starts from Bridge's {'performance' if recipe.kind == 'perf' else 'base'} recipe (Megatron-Bridge "
        f"{BRIDGE_COMMIT}):",
        f"#   {recipe.module}",
        f"#   .{recipe.function}",
        "# Run on every node: torchrun --nnodes=N --nproc-per-node=G ... bridge_recipe.py",
        "# Reads DATA_PATH, TOKENIZER_MODEL (both required), TOKENIZER_TYPE, TRAIN_ITERS and CHECKPOINT_DIR from the",
        "# environment (ENV_OVERRIDES), as the Megatron-LM launch does. The same settings for",
        "# scripts/training/run_recipe.py: bridge_overrides.txt.",
        *(["# A performance recipe is a benchmark (_benchmark_common: 50 iterations, no checkpoints); paraplan sets",
           "# train_iters and checkpoints (ENV_OVERRIDES) and resets the benchmark-only settings the plan did not",
           "# model:",
           *reset,
           "# and keeps eval_iters = 0, log_interval = 1, the NaN/large-gradient checks off and the fused kernels",
           "# as the recipe sets them (throughput settings that do not change the planned layout); manual GC is",
           "# the plan's (train.manual_gc in OVERRIDES)."]
          if recipe.kind == "perf" else []),
        '"""paraplan layout on a Megatron-Bridge recipe (generated; see the comments above)."""',
        "",
        "import os",
        "",
        "import torch",
        f"from {recipe.module} import (",
        f"    {recipe.function} as base_recipe,",
        ")",
        "from megatron.bridge.training.comm_overlap import CommOverlapConfig",
        "from megatron.bridge.training.gpt_step import forward_step",
        "from megatron.bridge.training.mixed_precision import get_mixed_precision_config",
        "from megatron.bridge.training.pretrain import pretrain",
        "from megatron.core.transformer import enums",
        "",
        "OVERRIDES = {",
        *[f"    {k!r}: {v!r}," for k, v in fixed],
        "}",
        "ENV_OVERRIDES = {  # field path: (environment variable, default; None = required)",
        *[f"    {k!r}: {v!r}," for k, v in from_env],
        "}",
        "ENV = {",
        *[f"    {k!r}: {v!r}," for k, v in env.items()],
        "}",
        f"UNSET_ENV = {(['CUDA_DEVICE_MAX_CONNECTIONS'] if spec.layout.fsdp else [])!r}",
        f"TP_COMM_OVERLAP = {spec.layout.tp_comm_overlap!r}",
        "COMM_OVERLAP = {  # also set on the recipe's comm_overlap, whose setup writes them over model/optimizer",
        *[f"    {k!r}: {v!r}," for k, v in comm_overlap_values(items).items()],
        "}",
        "DTYPE_FIELDS = [  # fields set to getattr(torch, value)",
        *[f"    {k!r}," for k in DTYPE_FIELDS],
        "]",
        "ENUM_FIELDS = {  # fields set to the member of that name of the megatron.core.transformer.enums class",
        *[f"    {k!r}: {v!r}," for k, v in ENUM_FIELDS.items()],
        "}",
        "FALLBACK_FIELDS = {  # a field an older Megatron-Core lacks: the deprecated one it replaces",
        *([f"    {SMS_FIELD!r}: {sms_legacy_field(spec.training.moe_flex_dispatcher_backend)!r},"]
          if any(k == SMS_FIELD for k, _ in items) else []),
        "}",
        "",
        "",
        "def _set(cfg, path, value):",
        "    target, _, name = path.rpartition('.')",
        "    obj = getattr(cfg, target) if target else cfg",
        "    if target == 'mixed_precision' and isinstance(obj, str):  # a preset name: its config, to set fields on",
        "        obj = cfg.mixed_precision = get_mixed_precision_config(obj)",
        "    if path in DTYPE_FIELDS:",
        "        value = getattr(torch, value)",
        "    if path in ENUM_FIELDS:",
        "        value = getattr(enums, ENUM_FIELDS[path])[value]",
        "    if not hasattr(obj, name) and path in FALLBACK_FIELDS:",
        "        return _set(cfg, FALLBACK_FIELDS[path], value)",
        "    if not hasattr(obj, name):",
        "        raise AttributeError(f'{path}: not a field of the recipe')",
        "    setattr(obj, name, value)",
        "",
        "",
        "def _from_env(name, default):",
        "    value = os.environ.get(name, '')",
        "    if not value:",
        "        if default is None:",
        "            raise SystemExit(f'set {name}: bridge_recipe.py reads it from the environment')",
        "        return default",
        "    return int(value) if isinstance(default, int) else value",
        "",
        "",
        "def recipe():",
        '    """The base recipe with paraplan\'s layout applied (AttributeError for a field the recipe lacks)."""',
        "    cfg = base_recipe()",
        "    for path, value in OVERRIDES.items():",
        "        _set(cfg, path, value)",
        "    cfg.dataset.blend = None  # dataset.data_path below becomes the blend (GPTDatasetConfig.finalize)",
        "    for path, (name, default) in ENV_OVERRIDES.items():",
        "        _set(cfg, path, _from_env(name, default))",
        "    if TP_COMM_OVERLAP and cfg.comm_overlap is None:",
        "        cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=True)",
        "    elif cfg.comm_overlap is not None:",
        "        cfg.comm_overlap.tp_comm_overlap = TP_COMM_OVERLAP",
        "    if cfg.comm_overlap is not None:",
        "        for name, value in COMM_OVERLAP.items():",
        "            setattr(cfg.comm_overlap, name, value)",
        "    cfg.env_vars.update(ENV)",
        "    for name in UNSET_ENV:",
        "        cfg.env_vars.pop(name, None)",
        "        os.environ.pop(name, None)",
        "    return cfg",
        "",
        "",
        "if __name__ == '__main__':",
        "    pretrain(recipe(), forward_step)",
    ]
    return "\n".join(lines) + "\n"


RUNTIME_FIELDS: Final = ("dataset.blend", "comm_overlap.tp_comm_overlap", "env_vars",
                          *(f"comm_overlap.{f}" for f in COMM_OVERLAP_FIELDS))
"""ConfigContainer fields bridge_recipe.py sets besides ``OVERRIDES`` (checked against Bridge's source too)."""


def overrides_file(spec: LaunchSpec, cid: str, recipe: Recipe, items: list[tuple[str, Value]]) -> str:
    """bridge_overrides.txt: ``#`` comments, then one ``KEY=VALUE`` override per line."""
    head = [f"# Megatron-Bridge ConfigContainer overrides, generated by paraplan {one_line(__version__)} "
            f"(candidate {one_line(cid)}); one KEY=VALUE per line.",
            f"# Use: python scripts/training/run_recipe.py --recipe {recipe.function} --mode pretrain "
            "$(grep -v '^#' bridge_overrides.txt)",
            "# ${oc.env:NAME} values read the environment when Bridge resolves the overrides: set DATA_PATH and",
            "# TOKENIZER_MODEL (required); TRAIN_ITERS, TOKENIZER_TYPE and CHECKPOINT_DIR have defaults.",
            *(["# Performance recipe: the benchmark-only settings the plan did not model are reset (see",
               "# bridge_recipe.py); eval_iters = 0 and the NaN checks off are kept as the recipe sets them; manual",
               "# GC is the plan's (train.manual_gc)."]
              if recipe.kind == "perf" else [])]
    gaps = not_in_overrides_file(recipe, items)
    if gaps:
        head += ["# Not settable here (bridge_recipe.py sets them): " + ", ".join(gaps) + " (the recipe's",
                 "# mixed_precision is a preset name, or Bridge's override parser has no name for the dtype or",
                 "# does not read an enum)."]
    overlap = comm_overlap_values(items)
    head += [f"# If the recipe sets comm_overlap, also set comm_overlap.{k}={hydra_value(v)} (its setup writes it "
             "over model/optimizer)." for k, v in overlap.items()]
    lines = [f"{k}={hydra_value(v)}" for k, v in items if k not in gaps]
    data = next(i for i, (k, _) in enumerate(items) if k == "dataset.data_path")
    lines.insert(data, "dataset.blend=null")  # dataset.data_path becomes the blend (GPTDatasetConfig.finalize)
    return "\n".join([*head, *lines]) + "\n"


def bridge_overrides_gaps(spec: LaunchSpec) -> list[str]:
    """The fields bridge_recipe.py sets and bridge_overrides.txt cannot (``not_in_overrides_file``)."""
    recipe = choose_recipe(spec)
    return not_in_overrides_file(recipe, overrides(spec, recipe))


def check_ub_cfg(spec: LaunchSpec, recipe: Recipe) -> None:
    """SpecError (one line) when the plan's ``tp_comm_overlap_cfg`` is not the one the chosen recipe sets itself:
    Bridge's is a ``TransformerLayerTPOverlapCfg`` dataclass (training/comm_overlap.py), which neither the overrides
    file nor the recipe's field overrides can write."""
    want = spec.training.tp_comm_overlap_cfg
    if not want:
        return
    from paraplan.recipes.catalogue import bridge_recipes

    source = f"src/{recipe.module.replace('.', '/')}.py:{recipe.function}"  # _SOURCE
    own = next((r.get("tp_comm_overlap_cfg") for r in bridge_recipes() if r.get("source") == source), None)
    if want != own:
        shown = want if not want.startswith("{") else "(a --tp-comm-overlap-cfg file)"
        raise SpecError(f"--target bridge: tp_comm_overlap_cfg {shown} cannot be set on Bridge's recipe (a "
                        f"TransformerLayerTPOverlapCfg; {recipe.function} sets {own or 'none'}); use --target "
                        "megatron, torchrun or slurm (they write tp_comm_overlap_cfg.yaml)")


def bridge_files(spec: LaunchSpec, cid: str) -> dict[str, str]:
    """bridge_recipe.py and bridge_overrides.txt for ``spec``."""
    recipe = choose_recipe(spec)
    check_ub_cfg(spec, recipe)
    items = overrides(spec, recipe)
    return {"bridge_recipe.py": recipe_file(spec, cid, recipe, items),
            "bridge_overrides.txt": overrides_file(spec, cid, recipe, items)}
