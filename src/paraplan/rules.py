"""Megatron-LM's validation rules for a parallel layout, as vectorised predicates.

Each rule returns a boolean "violated" mask (a numpy bool, or an array over candidates) and a
message that mirrors Megatron's own wording (../shared/reference/ecosystem.md section 1.4; file
keys: A = megatron/training/arguments.py::validate_args, TC = transformer_config.py, MPC =
model_parallel_config.py, PS = parallel_state.py, NMC = num_microbatches_calculator.py,
SCH = pipeline_parallel/schedules.py). The search uses the masks to count rejections per
reason; ``estimate`` raises ``LayoutError`` with the first violated rule's message.

Uneven pipeline splits are validated in ``paraplan.estimate.pipeline`` (scalar path only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from paraplan.errors import LayoutError
from paraplan.layout import ParallelLayout
from paraplan.schedules import Schedule, schedule_named, schedule_of
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True, slots=True)
class RuleContext:
    """Everything a rule may read: the specs and a layout or layout table."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    layout: Any

    @property
    def num_microbatches(self) -> Any:
        lay = self.layout
        return self.training.global_batch_size // np.maximum(lay.mbs * lay.dp, 1)


@dataclass(frozen=True, slots=True)
class Rule:
    """A named Megatron rule: ``violated(ctx)`` mask and ``message(ctx)`` for one layout."""

    code: str
    violated: Callable[[RuleContext], Any]
    message: Callable[[RuleContext], str]
    source: str


def _world(c: RuleContext) -> Any:
    return c.layout.tp * c.layout.cp * c.layout.pp * c.layout.dp


def _layers_total(c: RuleContext) -> int:
    return c.model.num_layers + int(c.layout.account_for_embedding) + int(c.layout.account_for_loss)


def _kv_heads_per_tp_rank(c: RuleContext) -> Any:
    """K,V heads on one TP rank: query groups / TP, one (replicated) when TP exceeds them; MLA: the query heads."""
    if c.model.multi_latent_attention:
        return c.model.num_attention_heads // c.layout.tp
    return np.maximum(c.model.query_groups // c.layout.tp, 1)


def _even_split(c: RuleContext) -> Any:
    return np.logical_not(c.layout.uneven)


_LAYOUT_RULES: tuple[Rule, ...] = (
    Rule("WORLD_SIZE_MISMATCH",
         lambda c: _world(c) != c.cluster.num_gpus,
         lambda c: (f"world size ({c.cluster.num_gpus}) is not divisible by total_model_size "
                    f"(total_model_size={c.layout.tp * c.layout.pp * c.layout.cp}) = TP {c.layout.tp} x "
                    f"PP {c.layout.pp} x CP {c.layout.cp}"),
         "A: validate_args world_size % (TP*PP*CP)"),
    Rule("HEADS_NOT_DIVISIBLE_BY_TP",
         lambda c: c.model.num_attention_heads % c.layout.tp != 0,
         lambda c: (f"num_attention_heads ({c.model.num_attention_heads}) must be a multiple of "
                    f"tensor_model_parallel_size ({c.layout.tp})."),
         "TC: __post_init__"),
    Rule("QUERY_GROUPS_VS_TP",
         lambda c: (not c.model.multi_latent_attention)
         & (c.model.query_groups % c.layout.tp != 0) & (c.layout.tp % c.model.query_groups != 0),
         lambda c: (f"num_query_groups ({c.model.query_groups}) must be a multiple or divisor of "
                    f"tensor_model_parallel_size ({c.layout.tp})."),
         "TC: __post_init__ (core >= 0.16)"),
    Rule("FFN_NOT_DIVISIBLE_BY_TP",
         lambda c: (c.model.ffn % c.layout.tp != 0)
         | ((c.model.shared_ffn % c.layout.tp) != 0),
         lambda c: f"{c.model.ffn} is not divisible by {c.layout.tp} (ffn_hidden_size over tensor parallel ranks)",
         "megatron/core/utils.py::ensure_divisibility via ColumnParallelLinear"),
    Rule("EP_WITHOUT_EXPERTS",
         lambda c: (not c.model.is_moe) & (c.layout.ep > 1),
         lambda c: "num_experts must be non None to use expert model parallelism",
         "A: validate_args"),
    Rule("EXPERTS_NOT_DIVISIBLE_BY_EP",
         lambda c: c.model.is_moe & ((c.model.num_experts or 1) % c.layout.ep != 0),
         lambda c: (f"Number of experts should be a multiple of expert model parallel_size. "
                    f"(num_experts={c.model.num_experts}, EP={c.layout.ep})"),
         "A: validate_args"),
    Rule("MOE_FFN_NOT_DIVISIBLE_BY_ETP",
         lambda c: c.model.is_moe & (c.model.moe_ffn % c.layout.etp != 0),
         lambda c: f"{c.model.moe_ffn} is not divisible by {c.layout.etp} (moe_ffn_hidden_size over expert TP)",
         "megatron/core/utils.py::ensure_divisibility"),
    Rule("MOE_BIAS_NEEDS_ETP1",
         lambda c: c.model.is_moe & c.model.add_bias_linear & (c.layout.etp != 1),
         lambda c: f"Bias in Moe is only supported when ETP==1 (ETP={c.layout.etp})",
         "TC: __post_init__ (found by the megatron-core oracle, tests/oracle/test_transformer_config.py)"),
    Rule("EXPERT_GRID",
         lambda c: (c.layout.tp * c.layout.cp * c.layout.dp) % (c.layout.ep * c.layout.etp) != 0,
         lambda c: (f"world_size ({_world(c)}) is not divisible by expert_tensor_model_pipeline_parallel "
                    f"size ({c.layout.etp * c.layout.ep * c.layout.pp} = ETP {c.layout.etp} x EP "
                    f"{c.layout.ep} x PP {c.layout.pp})"),
         "PS: initialize_model_parallel (expert grid ETP x EP x PP x EDP)"),
    Rule("GBS_NOT_DIVISIBLE",
         lambda c: c.training.global_batch_size % (c.layout.mbs * c.layout.dp) != 0,
         lambda c: (f"global batch size ({c.training.global_batch_size}) is not divisible by micro batch "
                    f"size ({c.layout.mbs}) times data parallel size ({c.layout.dp})"),
         "NMC: ConstantNumMicroBatchesCalculator"),
    Rule("SEQ_NOT_DIVISIBLE_BY_2CP",
         lambda c: (c.layout.cp > 1) & (c.training.seq_len % (2 * c.layout.cp) != 0),
         lambda c: ("seq-length should be a multiple of 2 * context-parallel-size if "
                    f"context-parallel-size > 1. (seq_length={c.training.seq_len}, CP={c.layout.cp})"),
         "A: validate_args"),
    Rule("A2A_HEADS_NOT_DIVISIBLE_BY_CP",
         lambda c: (c.training.cp_comm_type == "a2a") & (c.layout.cp > 1)
         & (((c.model.num_attention_heads // c.layout.tp) % c.layout.cp != 0)
            | (_kv_heads_per_tp_rank(c) % c.layout.cp != 0)),
         lambda c: ("cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V. Found num_heads_q = "
                    f"{c.model.num_attention_heads // c.layout.tp}, num_heads_kv = {_kv_heads_per_tp_rank(c)}, "
                    f"cp_size = {c.layout.cp}."),
         "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py::AttnFuncWithCPAndQKVOA2A"),
    Rule("CP_SOFTMAX_NEEDS_A2A",
         lambda c: (c.layout.cp > 1) & (c.model.softmax_type != "vanilla") & (c.training.cp_comm_type != "a2a"),
         lambda c: (f"No dot product attention backend for softmax_type={c.model.softmax_type} with context "
                    f"parallelism and cp_comm_type={c.training.cp_comm_type} (CP={c.layout.cp}): Transformer Engine "
                    "disables FlashAttention for a non-vanilla softmax, FusedAttention for context parallelism "
                    "unless cp_comm_type='a2a', UnfusedDotProductAttention for context parallelism; "
                    "use --cp-comm-type a2a"),
         "transformer_engine/pytorch/attention/dot_product_attention/utils.py::get_attention_backend (TE d0067d0: "
         "'Filter: Softmax type' table and 'context_parallel and cp_comm_type != \"a2a\"', 'Disabling "
         "UnfusedDotProductAttention as it does not support context parallelism'); Megatron-Bridge's gpt-oss "
         "recipes set cp_comm_type='a2a' for this reason"),
    Rule("SEQ_NOT_DIVISIBLE_BY_TP_SP",
         lambda c: c.layout.sp & ((c.training.seq_len // c.layout.cp) % c.layout.tp != 0),
         lambda c: ("First dimension of the tensor should be divisible by tensor parallel size "
                    f"(sequence {c.training.seq_len}/CP {c.layout.cp} over TP {c.layout.tp} with "
                    "sequence parallel)"),
         "megatron/core/tensor_parallel/mappings.py"),
    Rule("CPU_OFFLOADING_WITH_PP",
         lambda c: (c.training.cpu_offloading_num_layers > 0) & (c.layout.pp > 1),
         lambda c: "Currently there is no support for Pipeline parallelism with CPU offloading",
         "TC: __post_init__"),
    Rule("CPU_OFFLOADING_WITH_RECOMPUTE",
         lambda c: (c.training.cpu_offloading_num_layers > 0) & (c.layout.recompute_code != 0),
         lambda c: "CPU offloading does not work when activation recomputation is enabled",
         "TC: __post_init__"),
    Rule("CPU_OFFLOADING_LAYERS",
         lambda c: c.training.cpu_offloading_num_layers >= _layers_total(c),
         lambda c: f"CPU offloading can be done only for layers less than {_layers_total(c)}",
         "TC: __post_init__"),
    Rule("LAYERS_NOT_DIVISIBLE_BY_PP",
         lambda c: _even_split(c) & (_layers_total(c) % c.layout.pp != 0),
         lambda c: (f"Number of layers should be divisible by the pipeline-model-parallel size "
                    f"(num_layers={_layers_total(c)}, PP={c.layout.pp})"),
         "A: validate_args"),
)
"""The layout rules checked before the pipeline schedule's."""

_PLACEMENT_RULES: tuple[Rule, ...] = (
    Rule("TP_EXCEEDS_NVLINK_DOMAIN",
         lambda c: c.layout.tp > c.cluster.nvlink_domain_size,
         lambda c: (f"tensor_model_parallel_size ({c.layout.tp}) is larger than the NVLink domain "
                    f"({c.cluster.nvlink_domain_size} GPUs): TP must stay inside one node/NVLink domain"),
         "tuning method: TP inside the node (ecosystem.md 2, tuning-method.md 2)"),
)
"""The rules checked after the schedule's."""


def rules_for(schedule: Schedule) -> tuple[Rule, ...]:
    """The rules of a layout run with ``schedule``: the layout rules, the schedule's own (VP and
    micro-batch rules, ``paraplan.schedules``), then the placement rules."""
    own = tuple(Rule(r.code, r.violated, r.message, r.source) for r in schedule.rules)
    return (*_LAYOUT_RULES, *own, *_PLACEMENT_RULES)


RULES: tuple[Rule, ...] = rules_for(schedule_named(""))
"""All rules of Megatron's own schedule choice, in the order Megatron checks them (roughly)."""

RULE_CODES: tuple[str, ...] = tuple(r.code for r in RULES)


def check_layout(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, layout: Any) -> None:
    """Raise LayoutError with Megatron's message for the first rule a single layout breaks."""
    ctx = RuleContext(model=model, training=training, cluster=cluster, layout=layout)
    for rule in rules_for(schedule_of(layout)):
        if bool(np.any(rule.violated(ctx))):
            raise LayoutError(rule.message(ctx), reason=rule.code)


def violations(ctx: RuleContext) -> dict[str, Any]:
    """Mask of violating rows per rule code (for a LayoutTable)."""
    return {rule.code: np.asarray(rule.violated(ctx), dtype=bool) for rule in rules_for(schedule_of(ctx.layout))}


# The rules of the training knobs that depend on the model or the layout (launch_violations, check and plan's
# filter, search.knob_masks), with Megatron-LM's words.

BLACKWELL_ARCHS: Final = ("blackwell",)
"""Architectures where Megatron no longer needs CUDA_DEVICE_MAX_CONNECTIONS=1 (arch >= 10)."""

BLACKWELL_ONLY_MESSAGES: Final = {
    "mxfp8": "Device compute capability 10.0 or higher required for MXFP8 execution.",
    "fp4": "Device compute capability 10.0 or higher required for NVFP4 execution.",
}
"""Transformer Engine's words (pytorch/quantization.py ``_compute_mxfp8_support`` / ``_compute_nvfp4_support``)."""


LOCAL_GRAPH_OFFLOAD_MODULES: Final = ("expert_fc1", "moe_act", "fused_group_mlp")
"""The ``--offload-modules`` that fine-grained offloading keeps under ``--cuda-graph-impl local``."""
NO_NAN_CHECK_FLAG: Final = "--no-check-for-nan-in-loss-and-grad"
FULL_ITERATION_NAN_CHECK_MESSAGE: Final = ("--no-check-for-nan-in-loss-and-grad should be set with "
                                           "--cuda-graph-impl=full_iteration for training.")
"""arguments.py ``validate_args``: the NaN check syncs the host inside the graphed iteration."""


FULL_ITERATION_MOE_SYNC_MESSAGE: Final = (
    "--cuda-graph-impl full_iteration on an MoE model needs a sync-free token dispatcher: --moe-token-dispatcher-type "
    "alltoall with drop-and-pad (--moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity), or flex with "
    "--moe-flex-dispatcher-backend hybridep and --moe-expert-rank-capacity-factor (or drop-and-pad); allgather and "
    "DeepEP always sync the host, which the captured graph cannot")
"""paraplan's words (Megatron-LM has no such check; the failure is at capture time): the dropless alltoall
dispatcher waits on ``self.d2h_event.synchronize()`` (token_dispatcher.py ``_maybe_dtoh_and_synchronize``), DeepEP's
``buffer.dispatch`` waits on the host for the received counts (fused_a2a.py ``FusedDispatch.forward``: "not
compatible with CUDA graph"), HybridEP without a rank budget syncs to size its buffers (``hybrid_ep_dispatch``
``non_blocking``); stream capture forbids each (``moe_sync.dispatcher_host_syncs`` counts them). The NVIDIA
recipes that run full_iteration on MoE set HybridEP with the rank budget (Megatron-Bridge perf_recipes
gpt_oss/common.py ``_apply_gpt_oss_120b_full_iter_fp8mx_configs``, qwen/common.py
``_enable_hybridep_full_iteration_mxfp8``)."""


def graphed_modules(training: TrainingSpec) -> frozenset[str]:
    """The ``--cuda-graph-modules`` Megatron-Core graphs: ``local`` takes moe_router and moe_preprocess together
    when either is given (TransformerConfig.__post_init__); none without a per-layer implementation."""
    mods = set(training.cuda_graph_modules) if training.cuda_graph_impl in ("local", "transformer_engine") else set()
    if training.cuda_graph_impl == "local" and mods & {"moe_router", "moe_preprocess"}:
        mods |= {"moe_router", "moe_preprocess"}
    return frozenset(mods)


def cuda_graph_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec) -> list[tuple[str, str]]:
    """TransformerConfig.__post_init__'s CUDA graph rules that need the model, the layout or other knobs
    (megatron/core/transformer/transformer_config.py), and arguments.py ``validate_args``' on delay_wgrad_compute
    with graphs, with their words."""
    out: list[tuple[str, str]] = []
    impl, mods = training.cuda_graph_impl, graphed_modules(training)
    if impl == "none":
        return out
    if training.cpu_offloading_num_layers > 0 and impl != "full_iteration":
        out.append(("CUDA_GRAPH_CPU_OFFLOADING", "CUDA graphs not supported with CPU offloading."))
    if impl != "full_iteration":
        if not model.is_moe and ({"moe", "moe_router"} & mods):
            out.append(("CUDA_GRAPH_MOE_NEEDS_MOE", "moe cuda graph is only supported for MoE."))
        if model.is_moe and "mlp" in mods and all(model.moe_layer_pattern()):
            out.append(("CUDA_GRAPH_MLP_NEEDS_DENSE", "mlp cuda graph is only supported for dense layers, but not "
                        "found in the model."))
        drop_pad = training.moe_expert_capacity_factor is not None and training.moe_pad_expert_input_to_capacity
        if model.is_moe and not drop_pad:
            if "moe" in mods:
                out.append(("CUDA_GRAPH_MOE_NEEDS_DROP_PAD", "moe cuda graph is only supported with drop-padding "
                            "MoE."))
            if "moe_preprocess" in mods and training.moe_token_dispatcher_type == "alltoall" \
                    and training.moe_expert_capacity_factor is not None:
                out.append(("CUDA_GRAPH_MOE_PREPROCESS_SYNC", "moe_preprocess cuda graph is not supported when "
                            "there are DtoH copies and synchronizations in the preprocess step."))
    if impl == "full_iteration" and model.is_moe:
        from paraplan.estimate.time.moe_sync import dispatcher_host_syncs

        if dispatcher_host_syncs(training):
            out.append(("CUDA_GRAPH_FULL_ITERATION_MOE_SYNC", FULL_ITERATION_MOE_SYNC_MESSAGE))
    if layout.recompute == "full" and impl != "full_iteration":
        out.append(("CUDA_GRAPH_FULL_RECOMPUTE", "full recompute is only supported with full iteration CUDA graph."))
    if layout.recompute == "selective" and impl == "transformer_engine" and "moe" in layout.recompute_modules \
            and "moe_router" in mods:
        out.append(("CUDA_GRAPH_MOE_RECOMPUTE", "moe recompute is not supported with moe_router CUDA graph with: "
                    "--cuda-graph-impl transformer_engine."))
    out += _graph_offload_violations(training, mods)
    if impl == "transformer_engine" and layout.schedule == "combined_1f1b" and {"moe", "mlp"} & mods:
        out.append(("CUDA_GRAPH_EP_OVERLAP_SCOPE", "CUDA graph scope on moe and mlp is not supported with "
                    "overlap_moe_expert_parallel_comm"))
    return out + _graph_delay_wgrad_violations(model, layout, training, mods)


def _graph_delay_wgrad_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec,
                                  mods: frozenset[str]) -> list[tuple[str, str]]:
    """arguments.py ``validate_args`` on ``--delay-wgrad-compute`` with ``--overlap-grad-reduce`` when a weight
    gradient is inside a graph (attn, or moe_router with unoverlapped shared experts)."""
    shared_in_graph = ("moe_router" in mods and bool(model.moe_shared_expert_intermediate_size)
                       and not training.moe_shared_expert_overlap)
    if not (training.delay_wgrad_compute and layout.overlap_grad_reduce and ("attn" in mods or shared_in_graph)):
        return []
    out: list[tuple[str, str]] = []
    if not training.gradient_accumulation_fusion:
        out.append(("CUDA_GRAPH_DELAY_WGRAD_NEEDS_GRAD_ACC_FUSION", "CUDA graph with delay_wgrad_compute requires "
                    "gradient_accumulation_fusion to be enabled."))
    if "attn" in mods and (model.add_bias_linear or model.add_qkv_bias):
        out.append(("CUDA_GRAPH_DELAY_WGRAD_ATTN_BIAS", "CUDA graph with delay_wgrad_compute doesn't support "
                    "attn bias for now."))
    return out


def _graph_offload_violations(training: TrainingSpec, mods: frozenset[str]) -> list[tuple[str, str]]:
    """TransformerConfig.__post_init__'s rules on fine-grained activation offloading under CUDA graphs."""
    if not training.fine_grained_activation_offloading or training.cuda_graph_impl == "none":
        return []
    out: list[tuple[str, str]] = []
    if training.cuda_graph_impl == "local":
        bad = sorted(set(training.offload_modules) - set(LOCAL_GRAPH_OFFLOAD_MODULES))
        if bad:
            out.append(("CUDA_GRAPH_LOCAL_OFFLOAD_MODULES", "fine-grained activation offloading with "
                        "cuda_graph_impl='local' only supports offload_modules 'expert_fc1', 'moe_act', and "
                        f"'fused_group_mlp'. Unsupported offload_modules: {bad}."))
        if not mods:
            out.append(("CUDA_GRAPH_LOCAL_OFFLOAD_WHOLE_LAYER", "fine-grained activation offloading with "
                        "cuda_graph_impl='local' is not supported with whole-layer CUDA graph capture."))
    if "moe" in mods:
        out.append(("CUDA_GRAPH_OFFLOAD_TOKEN_DROP", "Token-drop MoE is temporarily not supported with activation "
                    "offloading."))
    return out


def gather_with_optimizer_violations(layout: ParallelLayout, training: TrainingSpec) -> list[tuple[str, str]]:
    """``--overlap-param-gather-with-optimizer-step``'s asserts (arguments.py ``validate_args``), with their words."""
    if not training.overlap_param_gather_with_optimizer_step:
        return []
    rules = ((layout.dist_opt, "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_DIST_OPT",
              "--overlap-param-gather-with-optimizer-step only supported with distributed optimizer"),
             (layout.overlap_param_gather, "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_OVERLAP",
              "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather"),
             (layout.vp > 1, "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_VP",
              "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism"))
    return [(code, message) for ok, code, message in rules if not ok]


def moe_overlap_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec) -> list[tuple[str, str]]:
    """TransformerConfig.__post_init__'s rules on the expert-parallel overlap knobs, with Megatron's words."""
    out: list[tuple[str, str]] = []
    if training.delay_wgrad_compute and layout.schedule != "combined_1f1b":  # TC
        out.append(("DELAY_WGRAD_NEEDS_EP_OVERLAP", "overlap_moe_expert_parallel_comm must be enabled "
                    "when enabling delay_wgrad_compute"))
    if model.is_moe and training.moe_shared_expert_overlap and layout.schedule == "combined_1f1b":  # TC
        out.append(("SHARED_EXPERT_OVERLAP_WITH_EP_OVERLAP", "disable moe_shared_expert_overlap when enabling "
                    "overlap_moe_expert_parallel_comm"))
    return out


def precision_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec,
                         arch: str) -> list[tuple[str, str]]:
    """What Transformer Engine / Megatron-Core refuse in the low-precision recipe: MXFP8 and NVFP4 before
    Blackwell (TE ``check_mxfp8_support`` / ``check_nvfp4_support``), more bf16 first/last layers than a
    pipeline stage holds (TransformerConfig ``__post_init__``)."""
    out: list[tuple[str, str]] = []
    if arch not in BLACKWELL_ARCHS:
        for what, on in (("mxfp8", training.precision == "fp8" and training.fp8_recipe == "mxfp8"),
                         ("fp4", training.precision == "fp4")):
            if on:
                flag = "--fp8-recipe mxfp8" if what == "mxfp8" else "--fp4-format e2m1"
                out.append((f"{what.upper()}_NEEDS_BLACKWELL", f"{flag} needs a Blackwell GPU (B200, GB200, B300, "
                            f"GB300; this one is {arch or 'not'}): Transformer Engine: "
                            f"'{BLACKWELL_ONLY_MESSAGES[what]}'"))
    if training.first_last_layers_bf16:
        per_stage = model.num_layers // layout.pp
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if not 0 <= getattr(training, name) <= per_stage:
                out.append(("BF16_LAYERS_PER_STAGE", f"{name} ({getattr(training, name)}) must be between 0 and "
                            f"number of layers per pipeline stage ({per_stage})."))
    return out


def knob_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec,
                    arch: str = "hopper") -> list[tuple[str, str]]:
    """The rules of ``launch_violations`` on the training knobs that depend on the layout (CUDA graphs with
    recompute, the pipeline or offloading, ``--overlap-param-gather-with-optimizer-step``, the expert-parallel
    overlap knobs, the low-precision recipe); ``plan`` filters its layouts by them (``search.knob_masks``)."""
    return (precision_violations(model, layout, training, arch) + moe_overlap_violations(model, layout, training)
            + cuda_graph_violations(model, layout, training) + gather_with_optimizer_violations(layout, training)
            + defer_wgrad_violations(layout, training))


def defer_wgrad_violations(layout: ParallelLayout, training: TrainingSpec) -> list[tuple[str, str]]:
    """``--defer-embedding-wgrad-compute`` without pipeline parallelism (ModelParallelConfig.__post_init__)."""
    if training.defer_embedding_wgrad_compute and layout.pp == 1:
        return [("DEFER_EMBEDDING_WGRAD_NEEDS_PP",
                 "Cannot defer embedding wgrad compute when pipeline model parallel is not used")]
    return []
