"""Pipeline schedule arithmetic: layers per stage, micro-batches in flight, bubble.

Layer-to-stage assignment mirrors megatron-core (``TransformerConfig`` and
``megatron/core/transformer/transformer_block.py::get_num_layers_to_build``): virtual stage
j = chunk * PP + rank holds a contiguous block of layers; ``--decoder-first/last-pipeline-
num-layers`` give the first/last rank their own counts (split evenly over its VP chunks);
``--account-for-embedding/loss-in-pipeline-split`` count the embedding / loss as one layer of
the first / last virtual stage.

In-flight micro-batches and the bubble belong to the pipeline schedule (``paraplan.schedules``);
the functions here keep their Megatron-default forms for callers that have no layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.errors import LayoutError
from paraplan.layout import ParallelLayout
from paraplan.schedules import schedule_named
from paraplan.specs.num import Int, Num


@dataclass(frozen=True, slots=True)
class StageAssignment:
    """Global layer indices held by one pipeline rank, per virtual chunk."""

    rank: int
    chunks: tuple[tuple[int, ...], ...]

    @property
    def layers(self) -> tuple[int, ...]:
        """All layer indices of this rank, chunk by chunk."""
        return tuple(i for chunk in self.chunks for i in chunk)


def _rank_layer_counts(num_layers: int, layout: ParallelLayout) -> list[int]:
    """Layers per pipeline rank (all chunks together); raises LayoutError like Megatron."""
    pp, vp = layout.pp, layout.vp
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if first or last:
        if layout.account_for_embedding or layout.account_for_loss:
            raise LayoutError(
                "num_layers_in_first/last_pipeline_stage cannot be combined with "
                "account_for_embedding/loss_in_pipeline_split",
                reason="UNEVEN_PP_CONFLICT",
            )
        if pp == 1:
            raise LayoutError("uneven pipeline stages need pipeline_model_parallel_size > 1",
                              reason="UNEVEN_PP_CONFLICT")
        middle_ranks = pp - (1 if first else 0) - (1 if last else 0)
        remaining = num_layers - first - last
        if remaining < 0 or (middle_ranks == 0 and remaining != 0):
            raise LayoutError(
                f"Mismatch: {remaining} middle layers remaining but {middle_ranks} middle PP stages available.",
                reason="UNEVEN_PP_MISMATCH",
            )
        if middle_ranks and remaining % middle_ranks:
            raise LayoutError(
                f"number of layers at middle stage: {remaining} must be divisible by"
                f"the middle pipeline model parallel size {middle_ranks}",
                reason="UNEVEN_PP_MISMATCH",
            )
        per_middle = remaining // middle_ranks if middle_ranks else 0
        counts = [per_middle] * pp
        if first:
            counts[0] = first
        if last:
            counts[-1] = last
        for idx, n in enumerate(counts):
            if n % vp:
                where = "first" if idx == 0 and first else "last" if idx == pp - 1 and last else "middle"
                raise LayoutError(
                    f"number of layers at {where} stage: {n}must be divisible by virtual pipeline"
                    f"parallel degree {vp}",
                    reason="UNEVEN_PP_VP",
                )
        return counts
    extra = int(layout.account_for_embedding) + int(layout.account_for_loss)
    total = num_layers + extra
    if total % pp:
        raise LayoutError("Number of layers should be divisible by the pipeline-model-parallel size",
                          reason="LAYERS_NOT_DIVISIBLE_BY_PP")
    per_rank = total // pp
    if per_rank % vp:
        raise LayoutError(
            "number of layers per pipeline stage must be divisible number of layers per virtual "
            "pipeline stage",
            reason="LAYERS_NOT_DIVISIBLE_BY_VP",
        )
    return [per_rank] * pp


def _layout_counts(num_layers: int, layout: ParallelLayout) -> list[list[int]]:
    """Per-rank, per-chunk layer counts from an explicit ``pipeline_layout``."""
    pp, vp = layout.pp, layout.vp
    counts = layout.pipeline_layout
    if len(counts) != pp * vp:
        raise LayoutError(
            f"The length of pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size "
            f"(num_stages={len(counts)}, args.pipeline_model_parallel_size={pp}) and equal PP x VP = {pp * vp}",
            reason="PIPELINE_LAYOUT_LENGTH",
        )
    if sum(counts) != num_layers or min(counts) < 0:
        raise LayoutError(f"pipeline layout places {sum(counts)} decoder layers, the model has {num_layers}",
                          reason="PIPELINE_LAYOUT_LAYERS")
    return [[counts[chunk * pp + rank] for chunk in range(vp)] for rank in range(pp)]


def chunk_layer_counts(num_layers: int, layout: ParallelLayout) -> list[list[int]]:
    """Decoder layers per pipeline rank, per virtual chunk (raises LayoutError like Megatron)."""
    if layout.pipeline_layout:
        per_chunk = _layout_counts(num_layers, layout)
    else:
        counts = _rank_layer_counts(num_layers, layout)
        per_chunk = [[c // layout.vp] * layout.vp for c in counts]
        if layout.account_for_embedding:
            per_chunk[0][0] -= 1
        if layout.account_for_loss:
            per_chunk[-1][-1] -= 1
    if min(min(c) for c in per_chunk) < 0:
        raise LayoutError("a pipeline stage would hold a negative number of layers",
                          reason="LAYERS_NOT_DIVISIBLE_BY_PP")
    return per_chunk


def stage_assignment(num_layers: int, layout: ParallelLayout) -> list[StageAssignment]:
    """Which global layers each pipeline rank builds (chunk by chunk)."""
    pp, vp = layout.pp, layout.vp
    per_chunk = chunk_layer_counts(num_layers, layout)
    chunks: list[list[tuple[int, ...]]] = [[] for _ in range(pp)]
    start = 0
    for chunk in range(vp):
        for rank in range(pp):
            n = per_chunk[rank][chunk]
            chunks[rank].append(tuple(range(start, start + n)))
            start += n
    assert start == num_layers, (start, num_layers)
    return [StageAssignment(rank=r, chunks=tuple(chunks[r])) for r in range(pp)]


def in_flight_units(*, rank: Int, pp: Int, vp: Int, num_microbatches: Int) -> Num:
    """Forward passes a rank holds at its peak, in model-chunk units, under Megatron's choice of
    schedule from VP (``paraplan.schedules.MegatronChoice``: 1F1B min(p - r, m), interleaved
    min(2(p - r - 1) + (v - 1)p + 1, m*v)); other schedules: ``Schedule.in_flight_units``."""
    return schedule_named("").in_flight_units(rank=rank, pp=pp, vp=vp, num_microbatches=num_microbatches)


def first_chunk_in_flight(*, pp: Int, vp: Int, num_microbatches: Int) -> Num:
    """Micro-batches whose embedding activations rank 0 holds at its peak (Megatron's choice from VP:
    1F1B min(p, m), interleaved min(2p - 1, m)); other schedules: ``Schedule.first_chunk_in_flight``."""
    return schedule_named("").first_chunk_in_flight(pp=pp, vp=vp, num_microbatches=num_microbatches)


def bubble_frac(*, pp: Int, vp: Int, num_microbatches: Int) -> Num:
    """Pipeline bubble relative to the ideal compute time under Megatron's choice from VP: (p - 1) / (v * m)
    (Narayanan et al. 2021, arXiv:2104.04473, section 2.2); other schedules: ``Schedule.bubble_frac``."""
    return schedule_named("").bubble_frac(pp=pp, vp=vp, num_microbatches=num_microbatches)


def balanced_uneven_split(num_layers: int, pp: int, vp: int = 1) -> tuple[int, int] | None:
    """First/last-stage layer counts that make an uneven split Megatron accepts, or None.

    For PP >= 2 searches (F, La) with (L - F - La) divisible over the PP - 2 middle ranks and
    every rank's count divisible by VP, minimising the largest stage load, where the first
    stage also carries the embedding and the last the output layer and loss (one layer's worth
    each, as ``--account-for-embedding/loss-in-pipeline-split`` count them). Ties prefer the
    smaller F + La. Mirrors how NeMo/Megatron-Bridge recipes split DeepSeek-V3's 61 layers over
    PP 16 (first 3, last 2, 14 middle stages of 4).

    The key (load, |F - La|, F + La, F) is minimised over the sums S = F + La: for a given S the
    most even F <= La (F = VP * floor(S / 2VP)) is best on load and on |F - La|, so one candidate
    per S is enough. Every count is a multiple of VP (L = l VP, S = k VP), and the middle
    (l - k) VP must split over the PP - 2 middle ranks in multiples of VP: k = l - j (PP - 2),
    j >= 1, k >= 2 (vectorised; about L / (VP (PP - 2)) candidates).
    """
    if pp < 2 or num_layers % vp:
        return None
    whole = num_layers // vp
    mid_ranks = pp - 2
    if mid_ranks == 0:
        k = np.arange(whole, whole + 1 if whole >= 2 else whole, dtype=np.int64)
    else:
        k = np.arange(whole - mid_ranks, 1, -mid_ranks, dtype=np.int64)
    if not len(k):
        return None
    total = k * vp
    per_mid = (num_layers - total) // max(mid_ranks, 1)
    first = (k // 2) * vp
    last = total - first
    load = np.maximum(np.maximum(first + 1, last + 1), per_mid)
    best = np.lexsort((first, total, np.abs(first - last), load))[0]
    return int(first[best]), int(last[best])


def balanced_pipeline_layout(num_layers: int, pp: int, vp: int = 1) -> tuple[int, ...]:
    """Decoder layers per virtual stage (chunk-major) for ``--pipeline-model-parallel-layout``.

    The embedding and the loss count as one layer each (as the account-for flags do); the
    L + 2 units are spread as evenly as possible over PP x VP virtual stages, extra units going to
    the middle stages first, then the embedding and loss are taken off the first and last.
    """
    n = pp * vp
    total = num_layers + 2
    base, extra = divmod(total, n)
    counts = [base] * n
    j = np.arange(n)
    order = np.lexsort((np.abs(j - (n - 1) / 2), (j == 0) | (j == n - 1)))  # stable: middle stages first
    for i in order[:extra].tolist():
        counts[i] += 1
    counts[0] -= 1
    counts[-1] -= 1
    if min(counts) < 0:
        raise LayoutError(f"{num_layers} layers are too few for PP {pp} x VP {vp} virtual stages",
                          reason="PIPELINE_LAYOUT_LAYERS")
    return tuple(counts)


def _rank_loads(counts: tuple[int, ...], pp: int) -> list[int]:
    """Layers per pipeline rank of a chunk-major layout, embedding and loss as one layer each."""
    loads = [sum(counts[r::pp]) for r in range(pp)]
    loads[0] += 1
    loads[(len(counts) - 1) % pp] += 1
    return loads


def auto_uneven_split(num_layers: int, pp: int, vp: int = 1) -> tuple[int, int] | tuple[int, ...]:
    """The split ``--pipeline-split auto`` and the search use when layers do not divide over PP x VP.

    Returns (first, last) for ``--decoder-first/last-pipeline-num-layers`` when that split loads
    the busiest rank no more than the balanced ``--pipeline-model-parallel-layout``; else the
    layout's per-virtual-stage counts (longer than 2 entries whenever PP x VP > 2). Raises
    LayoutError when there are too few layers for PP x VP stages.
    """
    counts = balanced_pipeline_layout(num_layers, pp, vp)
    split = balanced_uneven_split(num_layers, pp, vp)
    if split is not None:
        as_chunks = first_last_chunk_counts(num_layers, pp, vp, *split)
        if max(_rank_loads(as_chunks, pp)) <= max(_rank_loads(counts, pp)):
            return split
    return counts


def first_last_chunk_counts(num_layers: int, pp: int, vp: int, first: int, last: int) -> tuple[int, ...]:
    """``--decoder-first/last-pipeline-num-layers`` as chunk-major per-virtual-stage counts: each
    rank's layers (first, the rest evenly over the middle ranks, last) split evenly over its VP
    chunks."""
    middle = (num_layers - first - last) // max(pp - 2, 1)
    per_rank = (first, *([middle] * (pp - 2)), last)
    return tuple(per_rank[r] // vp for _ in range(vp) for r in range(pp))


def pipeline_layout_string(counts: tuple[int, ...], pp: int, *, mtp_layers: int = 0) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for per-virtual-stage counts: stages split by
    '|', E = embedding, t = decoder layer, m = MTP layer, L = loss (ecosystem.md section 1.2)."""
    parts = ["t" * c for c in counts]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * mtp_layers + "L"
    return "|".join(parts)
