"""Pipeline schedule timeline: which micro-batch each pipeline stage runs when, so the bubble shows.

The order of operations on every rank comes from the layout's schedule (``paraplan.schedules``:
``Schedule.rank_order`` and ``Schedule.virtual_stage``); for Megatron's two it follows Megatron-Core
(``megatron/core/pipeline_parallel/schedules.py``):

    1F1B (``forward_backward_pipelining_without_interleaving``), rank r of p, m micro-batches:
        warm-up  min(p - r - 1, m) forwards
        steady   m - warm-up times: one forward, one backward
        cool-down the remaining backwards
    interleaved (``forward_backward_pipelining_with_interleaving``), v model chunks per rank:
        warm-up  min(2(p - r - 1) + (v - 1) * g, m * v) chunk-forwards (g = micro-batch group
                 size, p by default; ``get_pp_rank_microbatches``)
        steady   one chunk-forward, one chunk-backward; cool-down the remaining chunk-backwards.
        The k-th chunk-forward runs ``get_schedule_table(m, v, g)[k]`` = (micro-batch, chunk);
        the k-th chunk-backward runs the same micro-batch on chunk v - 1 - chunk.

Start times come from a list-scheduling simulation: an operation starts when its rank is free and
its input has arrived (the forward of the previous virtual stage, the backward of the next one).
Times are in whatever unit the caller passes (``paraplan.report.build`` passes units of the
slowest stage's forward + backward time of one micro-batch). With equal stages the length is
(m + (p - 1) / v) * t, i.e. the bubble is (p - 1) / (v * m) of the ideal time, as in
``paraplan.estimate.pipeline.bubble_frac``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from paraplan.schedules import Schedule as PipelineSchedule
from paraplan.schedules import schedule_named
from paraplan.schedules.base import WGRAD_SHARE_OF_BACKWARD, OpKind
from paraplan.schedules.interleaved import interleaved_order, interleaved_warmup
from paraplan.schedules.interleaved import schedule_table as schedule_table

Kind = OpKind


@dataclass(frozen=True, slots=True)
class Block:
    """One chunk-forward, chunk-backward (B whole, I input gradient) or weight-gradient (W) pass of
    one micro-batch on one pipeline rank."""

    stage: int
    kind: Kind
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """A simulated pipeline step: every block, the makespan and the busy time of each stage."""

    pp: int
    vp: int
    num_microbatches: int
    blocks: tuple[Block, ...]
    makespan: float
    busy: tuple[float, ...]
    schedule: str = ""
    """``paraplan.schedules`` name of the simulated schedule ("" = Megatron's choice from VP)."""

    @property
    def bubble_frac(self) -> float:
        """Idle time of the busiest stage relative to its busy time: (makespan - busy) / busy."""
        top = max(self.busy)
        return (self.makespan - top) / top if top > 0 else 0.0

    def count(self, stage: int, kind: Kind) -> int:
        """Number of blocks of one kind on one stage."""
        return sum(1 for b in self.blocks if b.stage == stage and b.kind == kind)


def warmup_count(*, rank: int, pp: int, vp: int, num_microbatches: int, group: int | None = None) -> int:
    """Forwards (chunk-forwards when interleaved) a rank runs before its first backward (Megatron)."""
    if vp == 1:
        return min(pp - rank - 1, num_microbatches)
    return interleaved_warmup(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches, group=group)


def rank_order(*, rank: int, pp: int, vp: int, num_microbatches: int,
               group: int | None = None) -> list[tuple[Kind, int, int]]:
    """The (kind, micro-batch, chunk) operations of one rank in execution order (Megatron's choice
    from VP; ``group``: the interleaved micro-batch group size, p by default)."""
    if vp > 1 and group is not None:
        return interleaved_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches, group=group)
    return schedule_named("").rank_order(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)


def _owners(sched: PipelineSchedule, pp: int, vp: int) -> dict[int, tuple[int, int]]:
    """(rank, chunk) of every virtual stage."""
    return {sched.virtual_stage(rank=r, chunk=c, pp=pp): (r, c) for r in range(pp) for c in range(vp)}


def _dependencies(kind: Kind, mb: int, chunk: int, rank: int, pp: int, vp: int,
                  sched: PipelineSchedule, owner: dict[int, tuple[int, int]]) -> list[tuple[Kind, int, int, int]]:
    """Operations (kind, micro-batch, chunk, rank) whose output this operation needs."""
    vstage = sched.virtual_stage(rank=rank, chunk=chunk, pp=pp)
    last = vp * pp - 1
    if kind == "W":
        return [("I", mb, chunk, rank)]
    if kind == "F":
        if vstage == 0:
            return []
        r, c = owner[vstage - 1]
        return [("F", mb, c, r)]
    deps: list[tuple[Kind, int, int, int]] = [("F", mb, chunk, rank)]
    if vstage < last:
        r, c = owner[vstage + 1]
        deps.append(("I", mb, c, r))  # its input gradient: an I pass, or a whole B (``_input_grad_dep``)
    return deps


def _input_grad_dep(deps: list[tuple[Kind, int, int, int]], done: dict[tuple[Kind, int, int, int], float]) -> None:
    """A whole backward (B) downstream satisfies an input-gradient dependency (I) too."""
    for i, d in enumerate(deps):
        if d[0] == "I" and d not in done and ("B", *d[1:]) in done:
            deps[i] = ("B", d[1], d[2], d[3])


def simulate(*, pp: int, vp: int, num_microbatches: int, forward: Sequence[float], backward: Sequence[float],
             p2p: float = 0.0, group: int | None = None, schedule: str = "") -> Schedule:
    """Simulate one step. ``forward[r]``/``backward[r]``: time of one micro-batch through all of rank
    r's layers (a chunk takes 1/vp of it; an I pass ``1 - WGRAD_SHARE_OF_BACKWARD`` of the backward,
    a W pass the rest); ``p2p``: transfer time between stages; ``schedule``: a ``paraplan.schedules``
    name ("" = Megatron's choice from VP)."""
    if pp < 1 or vp < 1 or num_microbatches < 1:
        raise ValueError(f"pp, vp and num_microbatches must be >= 1 (got {pp}, {vp}, {num_microbatches})")
    if len(forward) != pp or len(backward) != pp:
        raise ValueError(f"need one forward and one backward time per stage ({pp})")
    sched = schedule_named(schedule)
    if group is not None and not schedule:
        orders = [rank_order(rank=r, pp=pp, vp=vp, num_microbatches=num_microbatches, group=group) for r in range(pp)]
    else:
        orders = [sched.rank_order(rank=r, pp=pp, vp=vp, num_microbatches=num_microbatches) for r in range(pp)]
    pairs = [sched.paired_ops(rank=r, pp=pp, vp=vp, num_microbatches=num_microbatches) if group is None or schedule
             else frozenset[int]() for r in range(pp)]
    owner = _owners(sched, pp, vp)
    share = {"F": 1.0, "B": 1.0, "I": 1.0 - WGRAD_SHARE_OF_BACKWARD, "W": WGRAD_SHARE_OF_BACKWARD}
    done: dict[tuple[Kind, int, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    blocks: list[Block] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, mb, chunk = orders[r][pos[r]]
                deps = _dependencies(kind, mb, chunk, r, pp, vp, sched, owner)
                if pos[r] in pairs[r]:  # an overlapped pair starts when the inputs of both have arrived
                    deps += _dependencies(*orders[r][pos[r] + 1], r, pp, vp, sched, owner)
                    deps = [d for d in deps if d != (kind, mb, chunk, r)]
                _input_grad_dep(deps, done)
                if any(d not in done for d in deps):
                    break
                ready = max((done[d] + (p2p if d[3] != r else 0.0) for d in deps), default=0.0)
                start = max(free[r], ready)
                work = forward[r] if kind == "F" else backward[r]
                end = start + work * share[kind] / vp
                done[(kind, mb, chunk, r)] = end
                blocks.append(Block(stage=r, kind=kind, microbatch=mb, chunk=chunk, start=start, end=end))
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule deadlocked (pp {pp}, vp {vp}, m {num_microbatches})")
    blocks.sort(key=lambda b: (b.stage, b.start))
    busy = tuple(num_microbatches * (forward[r] + backward[r]) for r in range(pp))
    return Schedule(pp=pp, vp=vp, num_microbatches=num_microbatches, blocks=tuple(blocks),
                    makespan=max(b.end for b in blocks), busy=busy, schedule=schedule)


def ideal_length(*, pp: int, vp: int, num_microbatches: int, t: float = 1.0) -> float:
    """Length of a step with equal stages: (m + (p - 1) / v) * t."""
    return (num_microbatches + (pp - 1) / vp) * t
