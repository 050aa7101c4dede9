"""A recipe's columns as paraplan inputs: the job (model, GPU, count, sequence, batch, precision), the layout with
every knob paraplan models, and the knobs it does not model yet, listed (never silently dropped).

Column by column (bridge_perf_recipes.md gives each column's meaning and default):
  * applied: ``seq_length``, ``global_batch_size``, ``micro_batch_size``, ``tp``, ``pp``, ``cp``, ``vp``, ``ep``,
    ``etp``, ``sequence_parallel``, ``pipeline_model_parallel_layout`` (MCore string notation, read as
    ``PipelineParallelLayerLayout`` does), the ``account_for_*`` pipeline-split flags, recompute granularity,
    method ``uniform`` or ``block`` with ``recompute_num_layers`` and the selective ``recompute_modules`` paraplan
    models,
    ``use_distributed_optimizer``, ``use_megatron_fsdp``, ``overlap_grad_reduce``, ``overlap_param_gather``,
    ``tp_comm_overlap``, ``attention_backend``, ``mtp_num_layers`` (when the recipe sets it) and ``precision``
    (bf16; every FP8 recipe as paraplan's FP8 with its ``--fp8-recipe``; NVFP4 as paraplan's fp4), and the
    allocator's ``PYTORCH_CUDA_ALLOC_CONF`` (expandable segments: no fragmentation allowance,
    ``recipe_memory_options``);
  * memory knobs (``MEMORY_COLUMNS``, into the TrainingSpec by ``training_knobs``): bf16 gradient buffers
    (``grad_reduce_in_fp32=False``), the FP8 scaling recipe (from ``precision``), FP8 and FP4 parameter gather, the
    precision-aware optimizer with ``optimizer_state_dtypes`` (and the Bridge launcher's precision-aware optimizer
    for bf16 Adam), optimizer CPU offload, BF16 first/last layers, FP8 dot-product attention, CUDA graphs
    (``cuda_graph_impl`` / ``cuda_graph_scope``: graph pools in memory, kernel launches in time), activation
    offloading (layer-level and fine-grained), PEFT (``task``), manual GC (``manual_gc``, ``manual_gc_interval``:
    modelled as no time), the deferred output-layer wgrad (``defer_embedding_wgrad_compute``,
    ``wgrad_deferral_limit``), the cross-entropy fusion (``cross_entropy_fusion_impl``, fused as Megatron-Bridge's
    ``GPTModelProvider`` default ``cross_entropy_loss_fusion=True``), the named userbuffers config
    (``tp_comm_overlap_cfg`` under ``tp_comm_overlap``, where the packaged configs hold it);
  * MoE knobs (``MOE_COLUMNS``, into the TrainingSpec; time, and memory for the capacity factor and the paged
    stash): the dispatcher, the flex backend and its SMs,
    ``delay_wgrad_compute``, permute fusion (TE's; HybridEP's in-kernel permute is
    ``moe_permute_fusion_into_hybridep``, which has no column: off), shared-expert overlap, the capacity factor,
    the paged stash (with its HybridEP rank budget: no host sync in the dispatch); ``moe_a2a_overlap`` is
    the combined_1f1b schedule;
  * not modelled yet (``not_modelled``): every other column that moves memory or time, when its value differs from
    what paraplan's formulas assume (``ASSUMED``), e.g. the router dtype and fusion, NCCL userbuffers,
    the process environment;
  * identity only: ``source``, ``family``, ``model``, ``gpu``, ``num_gpus``, ``task``, ``config_variant``,
    ``dp`` (checked against num_gpus / (TP x PP x CP)), ``notes``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from paraplan.errors import SpecError
from paraplan.recipes.catalogue import Cell, Recipe, cell_text

if TYPE_CHECKING:
    from paraplan.estimate.memory import MemoryOptions
    from paraplan.estimator import Estimate
    from paraplan.layout import ParallelLayout
    from paraplan.specs.model import ModelSpec

PRECISIONS: Final[dict[Cell, str]] = {
    "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_cs": "fp8", "fp8_mx": "fp8", "fp8_sc": "fp8", "fp8_ds": "fp8",
    "nvfp4": "fp4",
}
"""Recipe precision -> paraplan's GEMM precision. The FP8 recipes (current scaling, MXFP8, subchannel, delayed) run
at paraplan's FP8 rate with their own scaling state and quantisation traffic (``FP8_RECIPE_OF``); NVFP4 is
paraplan's fp4."""
RECOMPUTE: Final[dict[Cell, str]] = {None: "none", "selective": "selective", "full": "full"}
ATTENTION: Final[dict[Cell, str]] = {None: "flash", "auto": "flash", "flash": "flash", "fused": "flash",
                                     "unfused": "unfused", "local": "unfused"}
"""Recipe attention_backend -> paraplan's (flash/cuDNN fused keep no s x s scores; unfused/local do)."""
TASKS: Final = ("pretrain", "sft", "peft")
MAX_LAYOUT_CHARS: Final = 100_000
"""Longest pipeline layout a recipe's notation may expand to (a user file's ``t*999999999`` is refused)."""

_FP32_STATES = "main_grads=fp32;main_params=fp32;exp_avg=fp32;exp_avg_sq=fp32"


def _on(column: str, *values: Cell) -> Callable[[Recipe], bool]:
    return lambda r: r.get(column) in values


def _off(column: str, *values: Cell) -> Callable[[Recipe], bool]:
    return lambda r: r.get(column) not in values


ASSUMED: Final[dict[str, tuple[tuple[Cell, ...], Callable[[Recipe], bool] | None]]] = {
    "reuse_grad_buf_for_mxfp8_param_ag": ((False,), None),
    "optimizer": (("adam",), None),
    "num_distributed_optimizer_instances": ((1,), None),
    "outer_dp_sharding_strategy": ((), _off("num_distributed_optimizer_instances", 1, "")),
    "data_parallel_sharding_strategy": (("optim_grads_params",), _on("use_megatron_fsdp", True)),
    "cpu_offloading_activations": ((True,), _on("cpu_offloading", True)),
    "cpu_offloading_weights": ((False,), _on("cpu_offloading", True)),
    "moe_grouped_gemm": ((True, ""), None),
    "moe_router_dtype": (("fp32", ""), None),
    "moe_router_fusion": ((False, ""), None),
    "moe_router_force_load_balancing": ((True, ""), None),
    "nccl_ub": ((False,), None),
    "tp_comm_overlap_cfg": ((None, ""), lambda r: _bool(r, "tp_comm_overlap") and not _ub_named(r)),
    # applied with the paged stash (``training_knobs``: its rank budget needs the fuser); noted otherwise
    "use_transformer_engine_op_fuser": ((False,), lambda r: not _bool_or_false(r, "moe_paged_stash")),
    "CUDA_DEVICE_MAX_CONNECTIONS": (("",), None),
    "other_env": (("",), None),
}
"""Columns paraplan does not model yet -> (the values its formulas already assume, when the column applies: None
= always; ``()`` = any value is shown). Assumed: fp32 gradient buffers and optimizer states, bf16 weight gathers,
Adam, grouped GEMMs, fp32 router, balanced routing (``moe_router_force_load_balancing``: it changes the logits,
not the host syncs), no TE op fuser speed-up, activation offloading of activations only (no weights),
no environment effects but the allocator's; userbuffers with Transformer Engine's default pairs (``initialize_ub``)
where a recipe names a ``tp_comm_overlap_cfg`` the packaged configs lack (``specs.userbuffers.packaged``; a named one
is applied, ``training_knobs``)."""

IDENTITY: Final = ("source", "family", "model", "gpu", "num_gpus", "task", "config_variant", "dp", "notes")
APPLIED: Final = (
    "precision", "seq_length", "global_batch_size", "micro_batch_size", "tp", "pp", "cp", "vp", "ep", "etp",
    "sequence_parallel", "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "recompute_modules", "use_distributed_optimizer", "use_megatron_fsdp", "overlap_grad_reduce",
    "overlap_param_gather", "tp_comm_overlap", "attention_backend", "mtp_num_layers",
    "moe_a2a_overlap",
)
"""Columns that go into the estimate; the memory knobs of ``MEMORY_COLUMNS`` go into the TrainingSpec
(``training_knobs``), with ``tp_comm_overlap_cfg``, the per-GEMM userbuffers config behind ``tp_comm_overlap``."""
MEMORY_COLUMNS: Final = ("grad_reduce_in_fp32", "fp8_param_gather", "use_precision_aware_optimizer",
                         "optimizer_state_dtypes", "optimizer_cpu_offload", "optimizer_offload_fraction",
                         "cpu_offloading", "cpu_offloading_num_layers", "fine_grained_activation_offloading",
                         "offload_modules", "peft",
                         "fsdp_double_buffer", "cuda_graph_impl", "cuda_graph_scope",
                         "overlap_param_gather_with_optimizer_step", "gradient_accumulation_fusion",
                         "fp4_param_gather", "first_last_layers_bf16", "fp8_dot_product_attention", "manual_gc",
                         "manual_gc_interval", "defer_embedding_wgrad_compute", "wgrad_deferral_limit",
                         "cross_entropy_fusion_impl", "tp_comm_overlap_cfg")
ALLOCATOR_COLUMN: Final = "PYTORCH_CUDA_ALLOC_CONF"
"""The allocator setting (``recipe_memory_options``): ``expandable_segments:True`` drops the fragmentation
allowance (``estimate.memory.EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC``)."""
MOE_COLUMNS: Final = {"moe_token_dispatcher_type": "moe_token_dispatcher_type",
                      "moe_flex_dispatcher_backend": "moe_flex_dispatcher_backend",
                      "moe_hybridep_num_sms": "moe_hybridep_num_sms", "delay_wgrad_compute": "delay_wgrad_compute",
                      "moe_permute_fusion": "moe_permute_fusion",
                      "moe_shared_expert_overlap": "moe_shared_expert_overlap",
                      "moe_expert_capacity_factor": "moe_expert_capacity_factor",
                      "moe_paged_stash": "moe_paged_stash"}
"""MoE knobs (time; the capacity factor and the paged stash move memory too): recipe column -> TrainingSpec field
(``training_knobs``); ``moe_a2a_overlap`` is the
combined_1f1b schedule (``layout_fields``). A ``?`` cell (not statically resolvable) keeps the default and is
listed as not modelled. ``moe_paged_stash`` (HybridEP) brings the ``moe_expert_rank_capacity_factor`` Megatron
requires with it (``PAGED_STASH_RANK_CAPACITY_FACTOR``), the TE op fuser that factor requires and the helpers' stash
buffer factors (``PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA`` / ``_CPU``): its dispatch is then sync-free
(``estimate.time.moe_sync``) and its routed activations sized by the stash."""
PAGED_STASH_RANK_CAPACITY_FACTOR: Final = 1.5
"""``moe_expert_rank_capacity_factor`` of a recipe with ``moe_paged_stash`` (the CSV has no column for it): the value
Megatron-Bridge's shared recipe helpers set beside the paged stash (perf_recipes deepseek/common.py, qwen/common.py
``_enable_hybridep_full_iteration_mxfp8``, gpt_oss/common.py). Whether it is set moves the host syncs; beside the
paged stash its value moves nothing (the stash, not the budget, holds the routed activations)."""
PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA: Final = 1.2
"""``moe_paged_stash_buffer_size_factor_cuda`` of a recipe with ``moe_paged_stash`` (no CSV column): the value the same
Megatron-Bridge helpers set (deepseek/common.py, qwen/common.py, gpt_oss/common.py; a few qwen3_moe recipes set 1.1
or 1.0 themselves). The GPU stash is that many times the routed tokens (``activations.saved_routed_load``)."""
PAGED_STASH_BUFFER_SIZE_FACTOR_CPU: Final = 1.0
"""``moe_paged_stash_buffer_size_factor_cpu`` the same helpers set beside it: a host buffer, no GPU memory."""
RECIPE_MODEL_KNOBS: Final[dict[str, dict[str, Any]]] = {
    "gpt_oss_20b": {"cp_comm_type": "a2a"}, "gpt_oss_120b": {"cp_comm_type": "a2a"},
}
"""Knobs a model's recipes set where the CSV has no column: Megatron-Bridge recipes/gpt_oss/h100/gpt_oss.py sets
``cfg.model.cp_comm_type = "a2a"`` in the pretrain configs every gpt-oss perf recipe starts from ("When CP>1 is
used, a2a is required for TE attention backends with learnable softmax"; rules.py CP_SOFTMAX_NEEDS_A2A)."""
FP8_RECIPE_OF: Final = {"fp8_cs": "tensorwise", "fp8_mx": "mxfp8", "fp8_sc": "blockwise", "fp8_ds": "delayed"}
"""Recipe precision -> Megatron's ``--fp8-recipe`` (TrainingSpec.fp8_recipe)."""
_STATE_FIELDS: Final = {"main_grads": "main_grads_dtype", "main_params": "main_params_dtype",
                        "exp_avg": "exp_avg_dtype", "exp_avg_sq": "exp_avg_sq_dtype"}


def training_knobs(r: Recipe, precision: str) -> dict[str, Any]:
    """TrainingSpec memory knobs of ``r`` (``specs.training.KNOB_FLAGS`` names) run at paraplan ``precision``:
    ``grad_reduce_in_fp32=False`` -> bf16 gradient buffer; the FP8 recipe and FP8 parameter gather (FP8 jobs;
    NVFP4 runs as FP8 without them); the precision-aware optimizer with ``optimizer_state_dtypes``; CPU offload."""
    out: dict[str, Any] = {"grad_reduce_in_bf16": not _bool(r, "grad_reduce_in_fp32")}
    prec = r.get("precision")
    if precision == "fp8" and prec in FP8_RECIPE_OF:
        out["fp8_recipe"] = FP8_RECIPE_OF[str(prec)]
        out["fp8_param_gather"] = _bool(r, "fp8_param_gather")
    if precision == "fp4" and prec == "nvfp4":
        out["fp4_param_gather"] = _bool(r, "fp4_param_gather")
    if precision in ("fp8", "fp4") and prec != "bf16":
        out.update(_bf16_layers(r))
        out["fp8_dot_product_attention"] = _bool(r, "fp8_dot_product_attention")
    # the Bridge launcher (scripts/performance/run_script.py _run_training): "Preserve BF16 Adam precision-aware
    # behavior": compute dtype bf16 with Adam sets use_precision_aware_optimizer=True, the recipe's dtypes kept
    aware = _bool(r, "use_precision_aware_optimizer") or (prec == "bf16" and r.get("optimizer") == "adam")
    out["use_precision_aware_optimizer"] = aware
    if aware:
        text = r.get("optimizer_state_dtypes")
        pairs = [p.partition("=") for p in text.split(";")] if isinstance(text, str) else []
        if not pairs or any(k not in _STATE_FIELDS or not eq for k, eq, _ in pairs):
            raise bad(r, "optimizer_state_dtypes", "main_grads=..;main_params=..;exp_avg=..;exp_avg_sq=..")
        out.update({_STATE_FIELDS[k]: v for k, _, v in pairs})
    if _bool(r, "optimizer_cpu_offload"):
        frac = r.get("optimizer_offload_fraction")
        if isinstance(frac, bool) or not isinstance(frac, (int, float)):
            raise bad(r, "optimizer_offload_fraction", "a number from 0 to 1")
        out.update(optimizer_cpu_offload=True, optimizer_offload_fraction=float(frac))
    if _bool(r, "use_megatron_fsdp") and _bool(r, "fsdp_double_buffer"):
        out["fsdp_double_buffer"] = True
    out.update(moe_knobs(r))
    out.update(_cuda_graphs(r))
    out.update(RECIPE_MODEL_KNOBS.get(str(r.get("model")), {}))
    # Megatron-Core overlaps the first chunk's gather with the optimizer only when the gather is asynchronous
    # (--overlap-param-gather) and there are chunks (VP > 1); else the knob has no effect (Bridge sets it only then)
    if _bool(r, "overlap_param_gather_with_optimizer_step") and _bool(r, "overlap_param_gather") \
            and _bool(r, "use_distributed_optimizer") and (_int(r, "vp", optional=True) or 1) > 1:
        out["overlap_param_gather_with_optimizer_step"] = True
    if not _bool(r, "gradient_accumulation_fusion"):
        out["gradient_accumulation_fusion"] = False
    out.update(_offload_knobs(r))
    if _bool(r, "defer_embedding_wgrad_compute"):
        out.update(defer_embedding_wgrad_compute=True,
                   wgrad_deferral_limit=_int(r, "wgrad_deferral_limit", minimum=0))
    if _bool(r, "manual_gc"):
        out.update(manual_gc=True, manual_gc_interval=_int(r, "manual_gc_interval", minimum=0))
    if r.get("task") == "peft":
        out["peft"] = True
    # Megatron-Bridge's GPTModelProvider: cross_entropy_loss_fusion = True (models/gpt_provider.py); the perf recipes
    # choose the kernel (_benchmark_common: cross_entropy_fusion_impl, "te" unless a recipe passes "native")
    out.update(cross_entropy_loss_fusion=True,
               cross_entropy_fusion_impl=_choice(r, "cross_entropy_fusion_impl", ("native", "te")),
               **_ub_knob(r))
    return out


def _ub_knob(r: Recipe) -> dict[str, Any]:
    """``tp_comm_overlap_cfg`` of ``r`` under ``tp_comm_overlap`` where the packaged configs name it or it is a
    YAML file here (a user recipe's ``tp_comm_overlap_cfg: /path.yaml``, as ``--knob`` takes it); else the column
    is listed as not modelled (``ASSUMED``)."""
    return {"tp_comm_overlap_cfg": str(r.get("tp_comm_overlap_cfg"))} if _bool(r, "tp_comm_overlap") \
        and _ub_named(r) else {}


def _ub_named(r: Recipe) -> bool:
    """``r`` names a userbuffers config the packaged ones hold (Megatron-Bridge training/comm_overlap.py) or a
    ``--tp-comm-overlap-cfg`` YAML file that exists here."""
    from paraplan.specs.userbuffers import is_file_value, packaged

    name = r.get("tp_comm_overlap_cfg")
    return isinstance(name, str) and (name in packaged() or is_file_value(name))


def recipe_memory_options(r: Recipe, base: MemoryOptions | None = None) -> MemoryOptions:
    """``base`` (default MemoryOptions) with the recipe's allocator: ``expandable_segments`` from its
    ``PYTORCH_CUDA_ALLOC_CONF`` (``estimate.memory.alloc_conf_expandable_segments``; an empty cell is PyTorch's
    default, off)."""
    from paraplan.estimate.memory import MemoryOptions, alloc_conf_expandable_segments

    conf = r.get(ALLOCATOR_COLUMN)
    if conf is not None and not isinstance(conf, str):
        raise bad(r, ALLOCATOR_COLUMN, "PyTorch allocator settings, e.g. expandable_segments:True")
    try:
        on = alloc_conf_expandable_segments(conf or "")
    except SpecError as err:
        raise SpecError(f"{_where(r)}: {err}") from None
    return replace(base if base is not None else MemoryOptions(), expandable_segments=on)


def _offload_knobs(r: Recipe) -> dict[str, Any]:
    """Activation offloading of ``r``: layer-level (``cpu_offloading`` with ``cpu_offloading_num_layers``) or
    fine-grained (``fine_grained_activation_offloading`` with ``offload_modules``)."""
    from paraplan.specs.training import OFFLOAD_MODULES

    out: dict[str, Any] = {}
    if _bool(r, "cpu_offloading"):
        out["cpu_offloading_num_layers"] = _int(r, "cpu_offloading_num_layers")
    if _bool(r, "fine_grained_activation_offloading"):
        mods = r.get("offload_modules")
        if not isinstance(mods, list) or not mods or any(m not in OFFLOAD_MODULES for m in mods):
            raise bad(r, "offload_modules", "a list of " + ", ".join(OFFLOAD_MODULES))
        out.update(fine_grained_activation_offloading=True, offload_modules=tuple(str(m) for m in mods))
    return out


def moe_knobs(r: Recipe) -> dict[str, Any]:
    """The MoE knobs of ``r`` (``MOE_COLUMNS``): ``?`` and empty cells keep the defaults; an unset dispatcher
    keeps Megatron's and only it (the other knobs the recipe sets stay: a release config that leaves the dispatcher
    alone but sets ``delay_wgrad_compute``); the flex backend and its SMs only with the flex dispatcher (Megatron
    ignores them otherwise)."""
    out: dict[str, Any] = {}
    kind = r.get("moe_token_dispatcher_type")
    for column, fname in MOE_COLUMNS.items():
        value = r.get(column)
        if value in ("?", "", None):
            continue
        if column in ("moe_flex_dispatcher_backend", "moe_hybridep_num_sms") and kind != "flex":
            continue
        if column == "moe_token_dispatcher_type":
            value = _choice(r, column, ("alltoall", "allgather", "flex"))
        elif column == "moe_flex_dispatcher_backend":
            value = _choice(r, column, ("deepep", "hybridep"))
        elif column == "moe_hybridep_num_sms":
            value = _int(r, column)
        elif column == "moe_expert_capacity_factor":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise bad(r, column, "None or a number above 0")
            value = float(value)
        else:
            value = _bool(r, column)
        out[fname] = value
    if out.pop("moe_paged_stash", False):
        if kind != "flex" or out.get("moe_flex_dispatcher_backend") != "hybridep":
            raise bad(r, "moe_paged_stash", "False unless moe_flex_dispatcher_backend=hybridep (the paged stash needs "
                      "moe_expert_rank_capacity_factor, a HybridEP budget)")
        out.update(moe_paged_stash=True, moe_expert_rank_capacity_factor=PAGED_STASH_RANK_CAPACITY_FACTOR,
                   use_transformer_engine_op_fuser=True,
                   moe_paged_stash_buffer_size_factor_cuda=PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA,
                   moe_paged_stash_buffer_size_factor_cpu=PAGED_STASH_BUFFER_SIZE_FACTOR_CPU)
    if out.get("moe_shared_expert_overlap") and _bool_or_false(r, "moe_a2a_overlap"):
        out["moe_shared_expert_overlap"] = False  # Bridge's --moe_a2a_overlap turns it off (overrides.py)
    return out


def _bool_or_false(r: Recipe, column: str) -> bool:
    return r.get(column) is True


def _cuda_graphs(r: Recipe) -> dict[str, Any]:
    """``cuda_graph_impl`` and ``cuda_graph_scope`` as TrainingSpec fields, as Megatron-Core reads them
    (``specs.training.cuda_graph_scope``: the deprecated scope ``full_iteration`` is ``cuda_graph_impl=full_iteration``
    and ``full`` the whole layer); impl none clears the scope (Bridge perf_recipes/_common.py)."""
    from paraplan.specs.training import CUDA_GRAPH_IMPLS, CUDA_GRAPH_MODULES, cuda_graph_scope

    impl = _choice(r, "cuda_graph_impl", CUDA_GRAPH_IMPLS)
    scope = r.get("cuda_graph_scope")
    scope = [] if scope in (None, "") else scope
    if not isinstance(scope, list) or not all(isinstance(m, str) for m in scope):
        raise bad(r, "cuda_graph_scope", "a list of " + ", ".join(CUDA_GRAPH_MODULES) + " or [full_iteration]")
    graphs, modules = cuda_graph_scope(impl, scope, f"{_where(r)}: column cuda_graph_scope")
    if impl == "none":
        return {}
    return {"cuda_graph_impl": graphs} if graphs == "full_iteration" else {"cuda_graph_impl": graphs,
                                                                            "cuda_graph_modules": modules}


_BF16_LAYERS: Final = re.compile(r"True\(start=(\d{1,4}),end=(\d{1,4})\)")
"""The table's ``first_last_layers_bf16`` when set: ``True(start=N,end=M)`` (``num_layers_at_start/end_in_bf16``)."""


def _bf16_layers(r: Recipe) -> dict[str, Any]:
    """``first_last_layers_bf16`` with its layer counts (False, True with Megatron's 1 and 1, or True(start,end))."""
    v = r.get("first_last_layers_bf16")
    if v is False:
        return {}
    if v is True:
        return {"first_last_layers_bf16": True}
    m = _BF16_LAYERS.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        raise bad(r, "first_last_layers_bf16", "False, True or True(start=N,end=M)")
    return {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": int(m.group(1)),
            "num_layers_at_end_in_bf16": int(m.group(2))}


def _where(r: Recipe) -> str:
    return f"recipe {r.alias}" if r.origin == "bridge" else f"--recipes {r.origin}: row {r.row} ({r.source})"


def bad(r: Recipe, column: str, expected: str) -> SpecError:
    """The one-line error for a field of ``r``."""
    return SpecError(f"{_where(r)}: column {column}: expected {expected}, got {cell_text(r.get(column))!r}")


def _int(r: Recipe, column: str, *, optional: bool = False, minimum: int = 1) -> int | None:
    v = r.get(column)
    if optional and v in (None, ""):
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise bad(r, column, f"an integer >= {minimum}" + (" or None" if optional else ""))
    return v


def _bool(r: Recipe, column: str) -> bool:
    v = r.get(column)
    if not isinstance(v, bool):
        raise bad(r, column, "True or False")
    return v


def _choice(r: Recipe, column: str, allowed: dict[Cell, str] | tuple[str, ...]) -> str:
    v = r.get(column)
    if v not in allowed:
        raise bad(r, column, "one of " + ", ".join(cell_text(a) for a in allowed))
    return allowed[v] if isinstance(allowed, dict) else str(v)


@dataclass(frozen=True, slots=True)
class RecipeJob:
    """What a recipe runs: model and GPU presets, GPU count, sequence, batch, precision, attention kernels."""

    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    gbs: int
    precision: str
    attention_backend: str
    mtp_num_layers: int | None


def recipe_job(r: Recipe) -> RecipeJob:
    """The job of ``r`` (SpecError when its model or GPU has no preset, or a field is malformed)."""
    if not r.runnable:
        raise SpecError(f"{_where(r)} cannot run in paraplan: {r.reason}")
    assert r.model_preset is not None and r.gpu_preset is not None
    num_gpus = _int(r, "num_gpus")
    seq = _int(r, "seq_length")
    gbs = _int(r, "global_batch_size")
    assert num_gpus is not None and seq is not None and gbs is not None
    _choice(r, "task", TASKS)
    return RecipeJob(model=r.model_preset, gpu=r.gpu_preset, num_gpus=num_gpus, seq_len=seq, gbs=gbs,
                     precision=_choice(r, "precision", PRECISIONS),
                     attention_backend=_choice(r, "attention_backend", ATTENTION),
                     mtp_num_layers=_int(r, "mtp_num_layers", optional=True, minimum=0))


def pipeline_counts(r: Recipe) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage of the recipe's ``pipeline_model_parallel_layout`` (None when unset)."""
    import re

    text = r.get("pipeline_model_parallel_layout")
    if text in (None, ""):
        return None
    if not isinstance(text, str) or len(text) > MAX_LAYOUT_CHARS:
        raise bad(r, "pipeline_model_parallel_layout", "MCore layout notation (E, t, m, L, |, x*n, (...)*n)")
    s = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"([^()|*\d])\*(\d+)"):
        size = len(s) + sum(len(m.group(1)) * (int(m.group(2)) - 1) for m in re.finditer(pattern, s))
        if size > MAX_LAYOUT_CHARS:
            raise bad(r, "pipeline_model_parallel_layout", f"a layout of at most {MAX_LAYOUT_CHARS} layers")
        s = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), s)
    stages = s.split("|")
    if any(set(stage) - set("ELtm") for stage in stages):
        raise bad(r, "pipeline_model_parallel_layout", "MCore layout notation (E, t, m, L, |, x*n, (...)*n)")
    return tuple(stage.count("t") for stage in stages)


def _recompute(r: Recipe, notes: list[str]) -> dict[str, Any]:
    from paraplan.layout import RECOMPUTE_MODULES

    gran = _choice(r, "recompute_granularity", RECOMPUTE)
    out: dict[str, Any] = {"recompute": gran}
    if gran == "selective":
        mods = r.get("recompute_modules")
        if mods in (None, "", []):
            mods = ["core_attn"]  # MCore fills selective recompute without modules with core_attn at finalize
        if not isinstance(mods, list):
            raise bad(r, "recompute_modules", "a list such as [core_attn,mlp]")
        known = tuple(m for m in mods if m in RECOMPUTE_MODULES)
        unknown = [m for m in mods if m not in RECOMPUTE_MODULES]
        if unknown:
            notes.append(f"recompute_modules {','.join(unknown)} (not recomputed in the estimate)")
        out["recompute_modules"] = known or ("core_attn",)
    elif gran == "full":
        method = _choice(r, "recompute_method", {None: "uniform", "uniform": "uniform", "block": "block"})
        out["recompute_method"] = method
        out["recompute_num_layers"] = _int(r, "recompute_num_layers", optional=True) or 1
    return out


def layout_fields(r: Recipe) -> tuple[dict[str, Any], list[str]]:
    """ParallelLayout fields of ``r`` (without ``dp``: layout_for_world derives it) and the not-modelled notes
    its layout columns add (unknown recompute modules, block recompute)."""
    notes: list[str] = []
    fsdp = _bool(r, "use_megatron_fsdp")
    dist = _bool(r, "use_distributed_optimizer") and not fsdp  # FSDP shards the optimizer itself (as the search)
    out: dict[str, Any] = {
        "tp": _int(r, "tp"), "pp": _int(r, "pp"), "cp": _int(r, "cp"), "vp": _int(r, "vp", optional=True) or 1,
        "ep": _int(r, "ep", optional=True) or 1, "etp": _int(r, "etp", optional=True) or 0,
        "mbs": _int(r, "micro_batch_size"), "sequence_parallel": _bool(r, "sequence_parallel"),
        "distributed_optimizer": dist, "fsdp": fsdp, "overlap_grad_reduce": _bool(r, "overlap_grad_reduce"),
        "overlap_param_gather": _bool(r, "overlap_param_gather") and (dist or fsdp),
        "tp_comm_overlap": _bool(r, "tp_comm_overlap"),
        **({"schedule": "combined_1f1b"} if _bool_or_false(r, "moe_a2a_overlap") else {}),
        "account_for_embedding": _bool(r, "account_for_embedding_in_pipeline_split"),
        "account_for_loss": _bool(r, "account_for_loss_in_pipeline_split"),
        **_recompute(r, notes),
    }
    counts = pipeline_counts(r)
    if counts is not None:
        out["pipeline_layout"] = counts
    return out, notes


def _shown(column: str, value: Cell) -> str:
    if column == "other_env" and isinstance(value, str):
        return f"other_env ({value.count(';') + 1} variables)"
    return f"{column}={cell_text(value)}"


def not_modelled(r: Recipe) -> list[str]:
    """The knobs of ``r`` that move memory or time and that paraplan does not model yet, as ``column=value``."""
    out = []
    for column in (*MOE_COLUMNS, "moe_a2a_overlap"):
        if r.get(column) == "?":
            out.append(f"{column}=? (not statically resolvable: estimated with paraplan's default)")
    for column, (assumed, applies) in ASSUMED.items():
        value = r.get(column)
        if applies is not None and not applies(r):
            continue
        if assumed and value in assumed:
            continue
        out.append(_shown(column, value))
    return out


@dataclass(frozen=True, slots=True)
class RecipeRun:
    """A recipe (with any overrides) as paraplan inputs, and what it leaves out."""

    recipe: Recipe
    job: RecipeJob
    layout: ParallelLayout
    model: ModelSpec
    not_modelled: tuple[str, ...]
    notes: tuple[str, ...]


def recipe_run(r: Recipe, *, num_gpus: int | None = None, seq_len: int | None = None, gbs: int | None = None,
               precision: str | None = None, layout_overrides: dict[str, Any] | None = None,
               pipeline_split: str = "auto", model: ModelSpec | None = None,
               attention_backend: str | None = None) -> RecipeRun:
    """``r`` as model, job and layout, with ``layout_overrides`` (ParallelLayout fields) and the job values given
    winning over the recipe's (``model``: the ModelSpec to use instead of the recipe's preset, e.g. a plan's). An
    override of PP, VP or the pipeline-split fields drops the recipe's ``pipeline_model_parallel_layout`` (as Bridge
    recomputes layouts when PP or VP change)."""
    from paraplan.layout import layout_for_world
    from paraplan.specs.load import load_model

    own_job = job = recipe_job(r)
    job = replace(job, num_gpus=num_gpus or job.num_gpus, seq_len=seq_len or job.seq_len, gbs=gbs or job.gbs,
                  precision=precision or job.precision, attention_backend=attention_backend or job.attention_backend)
    fields_, extra = layout_fields(r)
    notes: list[str] = []
    over = dict(layout_overrides or {})
    moved = {"pp", "vp", "first_stage_layers", "last_stage_layers", "account_for_embedding", "account_for_loss"}
    if "pipeline_layout" in fields_ and moved & set(over):
        del fields_["pipeline_layout"]
        notes.append(f"the recipe's pipeline layout '{r.get('pipeline_model_parallel_layout')}' is dropped: "
                     + ", ".join(sorted(moved & set(over))) + " given")
    own_fields = dict(fields_)
    fields_.update(over)
    # the CLI's rules (build_layout): FSDP shards the optimizer itself; the param gather needs a sharded optimizer
    fields_["distributed_optimizer"] = fields_["distributed_optimizer"] and not fields_["fsdp"]
    fields_["overlap_param_gather"] = fields_["overlap_param_gather"] and (
        fields_["distributed_optimizer"] or fields_["fsdp"])
    if model is None:
        from paraplan.recipes.catalogue import RECIPE_MODEL_CHANGES

        model = load_model(job.model)
        changes = RECIPE_MODEL_CHANGES.get(str(r.get("model")), {})
        if changes and r.source.startswith("src/megatron/bridge/perf_recipes/"):
            model = replace(model, **changes)  # type: ignore[arg-type]
            notes.append("the recipe's model: " + ", ".join(f"{k} {v}" for k, v in changes.items())
                         + f" (not the {job.model} preset's)")
    if job.mtp_num_layers is not None and job.mtp_num_layers != model.mtp_num_layers:
        model = replace(model, mtp_num_layers=job.mtp_num_layers)
    dp = r.get("dp")
    if not over and num_gpus is None and isinstance(dp, int) and dp * fields_["tp"] * fields_["pp"] * fields_["cp"] \
            != job.num_gpus:
        raise bad(r, "dp", f"num_gpus / (TP x PP x CP) = {job.num_gpus} / "
                           f"({fields_['tp']} x {fields_['pp']} x {fields_['cp']})")
    layout = layout_for_world(job.num_gpus, **fields_)
    if pipeline_split == "auto" and not layout.pipeline_layout:
        from paraplan.estimate.pipeline import auto_uneven_split

        if not layout.uneven and not layout.account_for_embedding and not layout.account_for_loss \
                and model.num_layers % (layout.pp * layout.vp):
            found = auto_uneven_split(model.num_layers, layout.pp, layout.vp)
            layout = (replace(layout, first_stage_layers=found[0], last_stage_layers=found[1]) if len(found) == 2
                      else replace(layout, pipeline_layout=tuple(found)))
            notes.append("uneven pipeline split (--pipeline-split auto): "
                         + (f"first {found[0]}, last {found[1]} layers" if len(found) == 2 else f"layout {found}"))
    r, ub_note = _ub_for_overrides(r, own_job, own_fields, job, layout)
    notes += [ub_note] if ub_note else []
    return RecipeRun(recipe=r, job=job, layout=layout, model=model, not_modelled=tuple(not_modelled(r) + extra),
                     notes=tuple(notes))


def _ub_for_overrides(r: Recipe, own_job: RecipeJob, own_fields: dict[str, Any], job: RecipeJob,
                      layout: ParallelLayout) -> tuple[Recipe, str]:
    """``r`` without its named userbuffers config (``tp_comm_overlap_cfg`` "": Transformer Engine's defaults) and
    a note saying why, when an override moves the job off the one the config's name is tuned for
    (``userbuffers.name_layout``: a TP, CP, micro-batch, sequence length or precision given beside the recipe that
    is neither the recipe's own value nor the name's), or the layout has TP 1 (Megatron-Bridge's
    ``CommOverlapConfig`` turns TP overlap off below TP 2: "Disabling tensor parallel communication overlap due to
    TP size < 2"); else ``r`` and "". Bridge itself would apply a named config at any other TP >= 2 unchanged; its
    SM counts and methods were chosen for the named job, so the override is costed with TE's defaults instead
    (``--knob tp-comm-overlap-cfg=NAME`` keeps it)."""
    from paraplan.specs.userbuffers import name_layout

    name = r.get("tp_comm_overlap_cfg")
    named = name_layout(name) if isinstance(name, str) and _bool(r, "tp_comm_overlap") and _ub_named(r) else None
    if named is None:
        return r, ""
    now = {"tp": layout.tp, "cp": layout.cp, "mbs": layout.mbs, "seq_len": job.seq_len,
           "precision": "bf16" if job.precision == "bf16" else "fp8"}
    own = {"tp": own_fields.get("tp"), "cp": own_fields.get("cp"), "mbs": own_fields.get("mbs"),
           "seq_len": own_job.seq_len, "precision": "bf16" if own_job.precision == "bf16" else "fp8"}
    label = {"tp": "TP", "cp": "CP", "mbs": "micro-batch", "seq_len": "seq length", "precision": "precision"}
    off = [f"{label[k]} {now[k]}" for k in now if k != "tp" and now[k] != own[k] and now[k] != named[k]]
    if layout.tp == 1 or (now["tp"] != own["tp"] and now["tp"] != named["tp"]):
        off.insert(0, f"TP {layout.tp}")
    if not off:
        return r, ""
    why = " (Megatron-Bridge turns TP overlap off below TP 2)" if layout.tp == 1 else ""
    return replace(r, fields={**r.fields, "tp_comm_overlap_cfg": ""}), (
        f"the recipe's userbuffers config {name} is named for another job than this one ({', '.join(off)}){why}: "
        f"dropped, userbuffers costed with Transformer Engine's defaults (--knob tp-comm-overlap-cfg={name} keeps it)")


def estimate_run(run: RecipeRun, *, gpus_per_node: int | None = None, gpu_spec: Any = None,
                 memory_options: MemoryOptions | None = None, mfu_peak: str = "bf16",
                 knobs: dict[str, Any] | None = None) -> Estimate:
    """The estimate of a RecipeRun (LayoutError on the first broken rule, as ``paraplan estimate``); the
    not-modelled knobs are the first notes (``knobs``: the TrainingSpec knob fields to use instead of the
    recipe's, e.g. the recipe's with ``--knob`` given beside it; ``memory_options``: None = the defaults with the
    recipe's allocator, ``recipe_memory_options``)."""
    from paraplan.estimator import estimate
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu
    from paraplan.specs.training import TrainingSpec

    job = run.job
    cluster = make_cluster(gpu_spec if gpu_spec is not None else load_gpu(job.gpu), job.num_gpus, gpus_per_node)
    knobs = knobs if knobs is not None else training_knobs(run.recipe, job.precision)  # its errors name the row
    try:
        training = TrainingSpec(seq_len=job.seq_len, global_batch_size=job.gbs, precision=job.precision,  # type: ignore[arg-type]
                                attention_backend=job.attention_backend,  # type: ignore[arg-type]
                                **knobs)
    except SpecError as err:
        raise SpecError(f"{_where(run.recipe)}: {err}") from None
    notes = [f"recipe {run.recipe.alias} ({run.recipe.source})", *run.notes]
    if run.recipe.derivation:  # a layout NVIDIA never published a run of: say so beside its numbers
        notes.insert(1, f"recipe {run.recipe.alias} is {run.recipe.derivation}")
    if memory_options is None:
        memory_options = recipe_memory_options(run.recipe)
    if memory_options.expandable_segments:
        notes.append(f"{ALLOCATOR_COLUMN}={run.recipe.get(ALLOCATOR_COLUMN)}: expandable segments, no fragmentation "
                     "allowance")
    if run.not_modelled:
        notes.append("not modelled yet (kept in the recipe, not in these numbers): " + "; ".join(run.not_modelled))
    return estimate(run.model, cluster, training, run.layout, memory_options=memory_options, mfu_peak=mfu_peak,
                    extra_notes=notes)


def run_dict(run: RecipeRun, overrides: list[str] | None = None) -> dict[str, Any]:
    """The ``recipe`` block of ``estimate --recipe``'s JSON: which recipe, what was overridden, what is not
    modelled yet."""
    return {"source": run.recipe.source, "alias": run.recipe.alias, "origin": run.recipe.origin,
            "overridden": list(overrides or []), "not_modelled": list(run.not_modelled), "notes": list(run.notes)}


def estimate_recipe(r: Recipe, **job: Any) -> Estimate:
    """``recipe_run`` then ``estimate_run`` (LayoutError when the recipe breaks one of Megatron's rules)."""
    return estimate_run(recipe_run(r, **job))

