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
from typing import Any

import numpy as np

from paraplan.errors import LayoutError
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
