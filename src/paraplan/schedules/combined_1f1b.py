"""Megatron's combined 1F1B with expert-parallel overlap (``--overlap-moe-expert-parallel-comm``,
optionally ``--delay-wgrad-compute``; ``megatron/core/pipeline_parallel/combined_1f1b.py``).

The forward of one micro-batch runs together with the backward of another, layer by layer, so
the expert-parallel all-to-all of one hides behind the attention / MLP compute of the other
(``combined_1f1b_schedule_for_no_pipelining``, ``combined_1f1b_schedule_for_interleaved_pipelining``).
``get_pp_rank_microbatches`` adds one warm-up chunk-forward (``num_warmup_microbatches + 1``) so
every steady 1F1B pair is independent; without a pipeline (PP = 1) the first forward runs alone.

- bubble: the interleaved schedule's (p - 1) / (v m) (0 at PP = 1);
- in flight on rank r: the interleaved peak, min(2(p - r - 1) + (v - 1) p + 1, m v); PP = 1: 1 (the
  extra warm-up forward reaches interleaved's peak before the first pair, and inside a pair the forward
  of one micro-batch allocates layer by layer what the backward of the other frees);
- timeline: Megatron's interleaved order with the extra warm-up forward; a combined pair (``paired_ops``)
  starts when the inputs of both have arrived and is drawn as its forward then its backward (its
  all-to-all overlap shows in the step time, not in the drawing);
- EP all-to-all: the unpaired passes, warm-up forwards and cool-down backwards, leave theirs
  exposed: w / (m v) of it with w rank 0's warm-up (PP = 1: 1 / m) (``ep_exposed_frac``); the paired
  passes hide each dispatch / combine behind the other micro-batch's sub-module it runs beside, with
  and without ``--delay-wgrad-compute`` (``paraplan.estimate.time.ep.paired_exposed_s``, the one formula).

Validity (``TransformerConfig.__post_init__``, ``megatron/core/transformer/transformer_config.py``):
EP > 1; VP set when PP > 1; no full recompute; ``moe`` not in ``--recompute-modules``; at most one MTP
layer; plus the interleaved schedule's rules when VP > 1. ``--delay-wgrad-compute`` needs
``--overlap-moe-expert-parallel-comm`` (same file) and Transformer Engine (``validate_args``: TE >= 2.8.0
together with ``--overlap-grad-reduce``); both flags are in Megatron-LM main
(``../shared/reference/megatron_lm_flags_main_d98e8a6.tsv``).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from paraplan.schedules.base import (
    LAYERS_NOT_DIVISIBLE_BY_VP,
    MICROBATCHES_VS_PP_INTERLEAVED,
    VP_WITHOUT_PP,
    Count,
    Frac,
    MegatronChunks,
    Op,
    RuleView,
    ScheduleRule,
    one_f_one_b_order,
)
from paraplan.schedules.interleaved import interleaved_order

_SRC: Final = "TC: __post_init__ (overlap_moe_expert_parallel_comm)"


def _get(c: RuleView, name: str) -> NDArray[np.int64]:
    return np.asarray(getattr(c.layout, name), dtype=np.int64)


def _recompute_has_moe(c: RuleView) -> bool:
    return "moe" in tuple(c.layout.recompute_modules)


COMBINED_RULES: Final[tuple[ScheduleRule, ...]] = (
    ScheduleRule("COMBINED_1F1B_NEEDS_EP", lambda c: _get(c, "ep") < 2,
                 lambda c: "overlap_moe_expert_parallel_comm is only supported with expert model parallelism", _SRC),
    ScheduleRule("COMBINED_1F1B_NEEDS_VP", lambda c: (_get(c, "pp") > 1) & (_get(c, "vp") < 2),
                 lambda c: ("If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified "
                            "when pipeline_model_parallel_size > 1"), _SRC),
    ScheduleRule("COMBINED_1F1B_RECOMPUTE",
                 lambda c: (_get(c, "recompute_code") == 2)
                 | ((_get(c, "recompute_code") == 1) & _recompute_has_moe(c)),
                 lambda c: ("disable full recomputation (and moe in recompute_modules) when enabling "
                            "overlap_moe_expert_parallel_comm"), _SRC),
    ScheduleRule("COMBINED_1F1B_MTP", lambda c: np.asarray(c.model.mtp_num_layers > 1),
                 lambda c: "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm.", _SRC),
    VP_WITHOUT_PP, LAYERS_NOT_DIVISIBLE_BY_VP, MICROBATCHES_VS_PP_INTERLEAVED,
)


class Combined1F1B(MegatronChunks):
    """Megatron's combined 1F1B (EP all-to-all overlapped with another micro-batch's compute)."""

    name: Final = "combined_1f1b"
    title: Final = "combined 1F1B (EP overlap)"
    megatron: Final = True
    launch_flags: Final[tuple[str, ...]] = ("--overlap-moe-expert-parallel-comm",)
    """``--delay-wgrad-compute`` is the training spec's knob (``TrainingSpec.delay_wgrad_compute``)."""
    rules: Final[tuple[ScheduleRule, ...]] = COMBINED_RULES

    def _warmup0(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """Rank 0's unpaired warm-up chunk-forwards: 2(p - 1) + (v - 1) p + 1 (PP = 1: 1), at most m v."""
        piped = np.minimum(2 * (pp - 1) + (vp - 1) * pp + 1, num_microbatches * vp)
        return np.where(pp > 1, piped, 1)

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (any VP (VP > 1 when PP > 1: a rule))."""
        return True

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """(p - 1) / (v m), as interleaved."""
        return (pp - 1) / (vp * num_microbatches)

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """Interleaved's peak, min(2(p - r - 1) + (v - 1) p + 1, m v); PP = 1: 1. The extra warm-up
        chunk-forward brings the count to interleaved's peak (its warm-up plus the first steady forward)
        before the first pair; inside a pair the forward of layer j of one micro-batch runs beside the
        backward of layer L - 1 - j of the other (``TransformerModelChunkSchedulePlan.run``), so one
        allocates what the other frees and the count stays (up to one layer's activations, not counted)."""
        piped = np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, num_microbatches * vp)
        return np.where(pp > 1, piped, np.minimum(1, num_microbatches))

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """min(2p - 1, m), as interleaved (see ``in_flight_units``)."""
        return np.minimum(2 * pp - 1, num_microbatches)

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """As interleaved (1) when VP > 1; PP = 1 has no sends."""
        return 1.0

    def ep_exposed_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """w / (m v): the unpaired warm-up forwards (and as many cool-down backwards) of rank 0."""
        return self._warmup0(pp=pp, vp=vp, num_microbatches=num_microbatches) / (vp * num_microbatches)

    def paired_ops(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> frozenset[int]:
        """Every steady (F, B) of ``rank_order``: a combined pair (``combined_1f1b_schedule_for_*``)."""
        ops = self.rank_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)
        return frozenset(i for i in range(len(ops) - 1) if ops[i][0] == "F" and ops[i + 1][0] == "B")

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """Interleaved order with one more warm-up chunk-forward; PP = 1: F0, then (F i+1, B i) pairs."""
        if pp == 1:
            fwd = [(mb, c) for mb in range(num_microbatches) for c in range(vp)]
            return one_f_one_b_order(warmup=1, forwards=fwd, backwards=fwd)
        return interleaved_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches, extra=1)
