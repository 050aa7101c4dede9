"""Pipeline schedule timeline: which micro-batch each pipeline stage runs when, so the bubble shows.

The order of operations on every rank follows Megatron-Core
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
from typing import Literal

Kind = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
class Block:
    """One chunk-forward or chunk-backward of one micro-batch on one pipeline rank."""

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
    g = pp if group is None else group
    return min(2 * (pp - rank - 1) + (vp - 1) * g, num_microbatches * vp)


def schedule_table(num_microbatches: int, vp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's ``get_schedule_table``: (micro-batch, chunk) of the k-th chunk-forward."""
    table: list[tuple[int, int]] = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table.extend((mb, chunk) for chunk in range(vp) for mb in range(lo, hi))
    return table


def rank_order(*, rank: int, pp: int, vp: int, num_microbatches: int,
               group: int | None = None) -> list[tuple[Kind, int, int]]:
    """The (kind, micro-batch, chunk) operations of one rank in execution order."""
    m = num_microbatches
    g = pp if group is None else group
    if vp == 1:
        fwd = [(mb, 0) for mb in range(m)]
        bwd = fwd
    else:
        fwd = schedule_table(m, vp, g)
        bwd = [(mb, vp - 1 - chunk) for mb, chunk in fwd]
    total = len(fwd)
    warm = warmup_count(rank=rank, pp=pp, vp=vp, num_microbatches=m, group=g)
    ops: list[tuple[Kind, int, int]] = [("F", *fwd[k]) for k in range(warm)]
    for k in range(total - warm):
        ops.append(("F", *fwd[warm + k]))
        ops.append(("B", *bwd[k]))
    ops += [("B", *bwd[k]) for k in range(total - warm, total)]
    return ops


def _dependencies(kind: Kind, mb: int, chunk: int, rank: int, pp: int, vp: int) -> list[tuple[Kind, int, int, int]]:
    """Operations (kind, micro-batch, chunk, rank) whose output this operation needs."""
    vstage = chunk * pp + rank
    last = vp * pp - 1
    if kind == "F":
        if vstage == 0:
            return []
        prev = vstage - 1
        return [("F", mb, prev // pp, prev % pp)]
    deps: list[tuple[Kind, int, int, int]] = [("F", mb, chunk, rank)]
    if vstage < last:
        nxt = vstage + 1
        deps.append(("B", mb, nxt // pp, nxt % pp))
    return deps


def simulate(*, pp: int, vp: int, num_microbatches: int, forward: Sequence[float], backward: Sequence[float],
             p2p: float = 0.0, group: int | None = None) -> Schedule:
    """Simulate one step. ``forward[r]``/``backward[r]``: time of one micro-batch through all of rank
    r's layers (a chunk takes 1/vp of it); ``p2p``: transfer time between stages."""
    if pp < 1 or vp < 1 or num_microbatches < 1:
        raise ValueError(f"pp, vp and num_microbatches must be >= 1 (got {pp}, {vp}, {num_microbatches})")
    if len(forward) != pp or len(backward) != pp:
        raise ValueError(f"need one forward and one backward time per stage ({pp})")
    orders = [rank_order(rank=r, pp=pp, vp=vp, num_microbatches=num_microbatches, group=group) for r in range(pp)]
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
                deps = _dependencies(kind, mb, chunk, r, pp, vp)
                if any(d not in done for d in deps):
                    break
                ready = max((done[d] + (p2p if d[3] != r else 0.0) for d in deps), default=0.0)
                start = max(free[r], ready)
                end = start + (forward[r] if kind == "F" else backward[r]) / vp
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
                    makespan=max(b.end for b in blocks), busy=busy)


def ideal_length(*, pp: int, vp: int, num_microbatches: int, t: float = 1.0) -> float:
    """Length of a step with equal stages: (m + (p - 1) / v) * t."""
    return (num_microbatches + (pp - 1) / vp) * t
