"""The ``Schedule`` protocol: what a pipeline schedule owns, and the pieces schedules share.

A schedule owns, for a layout of PP ranks with VP model chunks each and m micro-batches per step:

- ``bubble_frac``: idle time relative to the ideal compute time m * t (t = forward + backward of
  one micro-batch on the slowest rank), vectorised over layouts (numpy);
- ``in_flight_units``: forward passes whose activations rank r holds at its peak, in model-chunk
  units (one unit = 1/VP of the rank's layers), and ``first_chunk_in_flight`` for the embedding;
- ``p2p_transfers`` / ``p2p_exposed_transfers``: activation/gradient sends per step, and how many of
  them sit on the critical path;
- ``ep_exposed_frac``: the share of the expert-parallel all-to-all it leaves exposed;
- ``rules``: validity rules as data (reason codes, Megatron-style messages), like ``paraplan.rules``;
- ``rank_order`` and ``virtual_stage``: the order of operations on every rank, which
  ``paraplan.report.schedule.simulate`` turns into the timeline the report draws;
- ``megatron``: True when Megatron-LM runs it; False marks a what-if ("not in Megatron-LM").

The formulas take numpy arrays or Python ints (``Count``) and return the same shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from paraplan.specs.model import ModelSpec

Count = int | NDArray[np.int64]
"""An integer or an integer column (one entry per layout)."""
Frac = float | NDArray[np.float64]
"""A number or a float column."""
Mask = bool | NDArray[np.bool_]
"""A violated-flag or a mask over layouts."""
OpKind = Literal["F", "B", "I", "W"]
"""Forward, whole backward, input-gradient backward (W split off and deferred) and weight gradient."""
Op = tuple[OpKind, int, int]
"""(kind, micro-batch, chunk) of one operation on one rank."""

NOT_IN_MEGATRON: Final = "not in Megatron-LM"
"""The words every output attaches to a what-if schedule."""

FORWARD_SHARE: Final = 1.0 / 3.0
"""Forward share of a layer's forward + backward time: the backward does twice the forward's GEMM
FLOPs (input and weight gradients; Narayanan et al. 2021, arXiv:2104.04473, section 3.5)."""

WGRAD_SHARE_OF_BACKWARD: Final = 0.5
"""Weight-gradient share of a layer's backward time. Source: the GEMM FLOPs of one token through a
layer with N parameters are 2N forward, 2N input gradient and 2N weight gradient (Narayanan et al.
2021, arXiv:2104.04473, section 3.5), so W = B_input = F; Qi et al. 2024 (arXiv:2401.10241, section
2) assume T_F = T_B = T_W likewise. Attention's score GEMMs have no weights, so this is an upper bound."""

BACKWARD_SHARE: Final = 1.0 - FORWARD_SHARE
"""Whole-backward share of a layer's forward + backward time (2/3)."""
WGRAD_SHARE: Final = BACKWARD_SHARE * WGRAD_SHARE_OF_BACKWARD
"""Weight-gradient share of a layer's forward + backward time (1/3): what zero-bubble schedules defer."""


class RuleView(Protocol):
    """What a schedule rule reads: ``paraplan.rules.RuleContext`` satisfies it."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def layout(self) -> Any:
        """A ParallelLayout or a LayoutTable (``paraplan.rules.RuleContext.layout``)."""
        ...

    @property
    def num_microbatches(self) -> object: ...


@dataclass(frozen=True, slots=True)
class ScheduleRule:
    """A validity rule of a schedule: ``violated(ctx)`` mask, ``message(ctx)`` for one layout, and
    where it comes from (same shape as ``paraplan.rules.Rule``)."""

    code: str
    violated: Callable[..., Mask]
    message: Callable[..., str]
    source: str


class Schedule(Protocol):
    """A pipeline schedule (see the module docstring)."""

    @property
    def name(self) -> str:
        """CLI / plan.json name, e.g. ``1f1b``."""
        ...

    @property
    def title(self) -> str:
        """Human name, e.g. ``interleaved 1F1B``."""
        ...

    @property
    def megatron(self) -> bool:
        """True when Megatron-LM runs this schedule."""
        ...

    @property
    def launch_flags(self) -> tuple[str, ...]:
        """Megatron flags that select it (beyond the layout's VP flags)."""
        ...

    @property
    def rules(self) -> tuple[ScheduleRule, ...]:
        """Validity rules, in the order they are checked (after the layer-count rules)."""
        ...

    def allows_vp(self, vp: int) -> bool:
        """Whether the schedule runs with VP model chunks per rank (the search's VP axis)."""
        ...

    def bubble_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """Bubble relative to the ideal compute time m * t."""
        ...

    def in_flight_units(self, *, rank: Count, pp: Count, vp: Count, num_microbatches: Count) -> Count | Frac:
        """Forward passes whose activations rank r holds at its peak, in model-chunk units."""
        ...

    def first_chunk_in_flight(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """Micro-batches whose embedding activations rank 0 holds at its peak."""
        ...

    def p2p_transfers(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """Point-to-point sends (activations forward plus gradients backward) per rank per step."""
        ...

    def p2p_exposed_transfers(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """Sends on the critical path of a step (before the schedule's overlap)."""
        ...

    def p2p_overlap_scale(self, *, vp: Count) -> Frac:
        """Multiplier of the cluster's ``pp_overlap_frac`` (the share of send/recv hidden)."""
        ...

    def ep_exposed_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """Share of the expert-parallel all-to-all left exposed (1 = none hidden by the schedule)."""
        ...

    def output_rank(self, pp: Count) -> Count:
        """The pipeline rank holding the last virtual stage (output layer, loss, MTP)."""
        ...

    def virtual_stage(self, *, rank: int, chunk: int, pp: int) -> int:
        """Position of (rank, chunk) in the model's layer order."""
        ...

    def rank_order(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> list[Op]:
        """The operations of one rank in execution order (for the timeline)."""
        ...

    def paired_ops(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> frozenset[int]:
        """Positions i where ``rank_order`` ops i and i + 1 run as one overlapped pair (both inputs
        needed before either starts); empty for schedules without such pairs."""
        ...


def _ints(x: object) -> NDArray[np.int64]:
    return np.asarray(x, dtype=np.int64)


def layers_total(ctx: RuleView) -> int:
    """Decoder layers plus the embedding / loss when the account-for flags count them."""
    lay = ctx.layout
    return ctx.model.num_layers + int(lay.account_for_embedding) + int(lay.account_for_loss)


def _lay(ctx: RuleView, name: str) -> NDArray[np.int64]:
    return _ints(getattr(ctx.layout, name))


VP_WITHOUT_PP: Final = ScheduleRule(
    "VP_WITHOUT_PP",
    lambda c: (_lay(c, "vp") > 1) & (_lay(c, "pp") == 1),
    lambda c: "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
    "PS / A: interleaved schedule")
"""Megatron: VP > 1 needs PP > 1."""

LAYERS_NOT_DIVISIBLE_BY_VP: Final = ScheduleRule(
    "LAYERS_NOT_DIVISIBLE_BY_VP",
    lambda c: np.logical_not(np.asarray(c.layout.uneven)) & (_lay(c, "vp") > 1)
    & ((layers_total(c) // _lay(c, "pp")) % _lay(c, "vp") != 0),
    lambda c: ("number of layers per pipeline stage must be divisible number of layers per "
               f"virtual pipeline stage (layers per stage {layers_total(c) // int(_lay(c, 'pp'))}, "
               f"VP={int(_lay(c, 'vp'))})"),
    "A: validate_args")
"""Every chunk of a rank holds the same number of layers (even splits)."""

MICROBATCHES_VS_PP_INTERLEAVED: Final = ScheduleRule(
    "MICROBATCHES_VS_PP_INTERLEAVED",
    lambda c: (_lay(c, "vp") > 1) & ((_ints(c.num_microbatches) < _lay(c, "pp"))
                                     | (_ints(c.num_microbatches) % _lay(c, "pp") != 0)),
    lambda c: ("The number of contiguous micro-batches in a virtual pipeline stageshould range in "
               f"[PP={int(_lay(c, 'pp'))} , M={int(_ints(c.num_microbatches))}] and M % PP must be 0 with the "
               "interleaved schedule"),
    "SCH: get_pp_rank_microbatches / forward_backward_pipelining_with_interleaving")
"""Megatron's interleaved schedule: m >= PP and m % PP == 0 (micro-batch group size = PP)."""


def needs_vp(name: str, allowed: str, bad: Callable[[NDArray[np.int64]], Mask]) -> ScheduleRule:
    """A rule fixing the VP a schedule runs with (``allowed`` in words, ``bad(vp)`` the mask)."""
    code = "SCHEDULE_VP"
    return ScheduleRule(code, lambda c: bad(_lay(c, "vp")),
                        lambda c: f"--schedule {name} needs {allowed} (got VP {int(_lay(c, 'vp'))})",
                        f"paraplan.schedules: {name}")


def megatron_chunk_stage(*, rank: int, chunk: int, pp: int) -> int:
    """Megatron's virtual stage order: chunk c of rank r is virtual stage c * PP + r."""
    return chunk * pp + rank


def one_f_one_b_order(*, warmup: int, forwards: list[tuple[int, int]], backwards: list[tuple[int, int]]) -> list[Op]:
    """Warm-up forwards, then one forward / one backward, then the remaining backwards (Megatron)."""
    total = len(forwards)
    ops: list[Op] = [("F", *forwards[k]) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(("F", *forwards[warmup + k]))
        ops.append(("B", *backwards[k]))
    ops += [("B", *backwards[k]) for k in range(total - warmup, total)]
    return ops


def pp_rules(name: str, *, min_microbatches_per_rank: int) -> tuple[ScheduleRule, ...]:
    """A what-if schedule's pipeline rules: PP > 1 and m >= ``min_microbatches_per_rank`` x PP."""
    k = min_microbatches_per_rank
    return (
        ScheduleRule("SCHEDULE_NEEDS_PP", lambda c: _lay(c, "pp") < 2,
                     lambda c: f"--schedule {name} needs pipeline parallelism (PP > 1)", f"paraplan.schedules: {name}"),
        ScheduleRule("SCHEDULE_MICROBATCHES", lambda c: _ints(c.num_microbatches) < k * _lay(c, "pp"),
                     lambda c: (f"--schedule {name} needs at least {k} x PP micro-batches "
                                f"(PP {int(_lay(c, 'pp'))}, m {int(_ints(c.num_microbatches))})"),
                     f"paraplan.schedules: {name}"),
    )


class MegatronChunks:
    """What most schedules share, as defaults a schedule class inherits (and overrides where it differs): Megatron's
    chunk placement (virtual stage = chunk x PP + rank, the output layer on the last rank), one send forward and
    one back per micro-batch and chunk, 2 (v m + p - 1) of them on the critical path, no expert-parallel overlap
    and no overlapped pairs in the timeline."""

    def p2p_transfers(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """2 v m sends: activations forward and gradients backward, per micro-batch and chunk."""
        return 2 * vp * num_microbatches

    def p2p_exposed_transfers(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Count:
        """2 (v m + p - 1): a send per chunk pass of the first rank plus the (p - 1) fill and drain hops."""
        return 2 * (vp * num_microbatches + pp - 1)

    def ep_exposed_frac(self, *, pp: Count, vp: Count, num_microbatches: Count) -> Frac:
        """No expert-parallel overlap: 1."""
        return 1.0

    def output_rank(self, pp: Count) -> Count:
        """The last rank (its last chunk is the last virtual stage)."""
        return pp - 1

    def virtual_stage(self, *, rank: int, chunk: int, pp: int) -> int:
        """chunk * PP + rank."""
        return megatron_chunk_stage(rank=rank, chunk=chunk, pp=pp)

    def paired_ops(self, *, rank: int, pp: int, vp: int, num_microbatches: int) -> frozenset[int]:
        """No overlapped pairs in the timeline."""
        return frozenset()
