"""StageLayers for every pipeline rank of a layout (scalar path) and for the ranks the search
needs (first, second, last) as arrays over candidates (vectorised path)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from paraplan.estimate.params import StageLayers
from paraplan.estimate.pipeline import chunk_layer_counts, stage_assignment
from paraplan.layout import ParallelLayout, distinct_rows
from paraplan.schedules import schedule_named, schedule_of
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec


def bf16_layers_of(training: TrainingSpec) -> tuple[int, int]:
    """(``num_layers_at_start_in_bf16``, ``num_layers_at_end_in_bf16``) with ``--first-last-layers-bf16``, else
    (0, 0): the first and last layers of the MODEL, by global layer number, that TE runs outside the FP8/FP4
    autocast (megatron/core/fp8_utils.py ``is_first_last_bf16_layer``, fp4_utils.py ``get_fp4_context``;
    transformer_block.py passes ``global_layer_number - 1``, so no pipeline rank is singled out)."""
    if not training.first_last_layers_bf16:
        return 0, 0
    return training.num_layers_at_start_in_bf16, training.num_layers_at_end_in_bf16


def stage_layers_for_rank(model: ModelSpec, layers: Iterable[int], *, rank: int, pp: int,
                          output_rank: int | None = None, bf16_layers: tuple[int, int] = (0, 0)) -> StageLayers:
    """Counts of dense and MoE layers among ``layers`` (global layer indices); embedding on rank 0, output and MTP on
    the last (``output_rank``: the schedule's rank for them, e.g. rank 0 in DualPipe-V's V shape); how many of
    ``layers`` are among the model's first ``bf16_layers[0]`` and last ``bf16_layers[1]`` (``bf16_layers_of``)."""
    out = pp - 1 if output_rank is None else output_rank
    pattern = model.moe_layer_pattern()
    idx = list(layers)
    n_moe = sum(1 for i in idx if pattern[i])
    start, end = bf16_layers
    return StageLayers(
        num_dense_layers=len(idx) - n_moe,
        num_moe_layers=n_moe,
        has_embedding=rank == 0,
        has_output=rank == out,
        num_mtp_layers=model.mtp_num_layers if rank == out else 0,
        num_bf16_start_layers=sum(1 for i in idx if i < start),
        num_bf16_end_layers=sum(1 for i in idx if i >= model.num_layers - end) if end else 0,
    )


def all_stage_layers(model: ModelSpec, layout: ParallelLayout,
                     bf16_layers: tuple[int, int] = (0, 0)) -> list[StageLayers]:
    """StageLayers of every pipeline rank (raises LayoutError for impossible splits); ``bf16_layers``:
    ``bf16_layers_of(training)`` where the FP8/FP4 first/last layers matter (memory, time)."""
    out = int(schedule_of(layout).output_rank(layout.pp))
    return [
        stage_layers_for_rank(model, a.layers, rank=a.rank, pp=layout.pp, output_rank=out, bf16_layers=bf16_layers)
        for a in stage_assignment(model.num_layers, layout)
    ]


def _moe_prefix(model: ModelSpec) -> NDArray[np.int64]:
    """MoE layers among the first i main layers, i = 0..num_layers."""
    pattern = np.asarray(model.moe_layer_pattern(), dtype=np.int64)
    return np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(pattern)))


def _rank_counts(model: ModelSpec, p: int, v: int, layouts: dict[tuple[int, int], tuple[int, ...]],
                 moe_prefix: NDArray[np.int64],
                 bf16_layers: tuple[int, int] = (0, 0)) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """(dense, MoE, BF16-start, BF16-end) layers of every rank for one (pp, vp): even, or the balanced layout given
    for it; None where the layers do not divide (rejected by the rules). The same counts as ``all_stage_layers``,
    from the chunk sizes and a prefix sum instead of layer indices."""
    if (p, v) in layouts:
        layout = ParallelLayout(pp=p, vp=v, pipeline_layout=layouts[(p, v)])
    elif model.num_layers % (p * v):
        return None
    else:
        layout = ParallelLayout(pp=p, vp=v)
    per_chunk = np.asarray(chunk_layer_counts(model.num_layers, layout), dtype=np.int64).reshape(p, v)
    sizes = per_chunk.T.reshape(-1)  # virtual stage chunk * p + rank holds the next block of layers
    ends = np.cumsum(sizes)
    assert int(ends[-1]) == model.num_layers, (int(ends[-1]), model.num_layers)
    moe = (moe_prefix[ends] - moe_prefix[ends - sizes]).reshape(v, p).sum(axis=0)
    start, end = bf16_layers  # layers [ends - sizes, ends) of each chunk among [0, start) and [L - end, L)
    first = np.clip(start - (ends - sizes), 0, sizes).reshape(v, p).sum(axis=0)
    last = (np.clip(ends - (model.num_layers - end), 0, sizes) if end else 0 * sizes).reshape(v, p).sum(axis=0)
    return (per_chunk.sum(axis=1) - moe).tolist(), moe.tolist(), first.tolist(), last.tolist()


@dataclass(frozen=True, slots=True)
class PipelineCounts:
    """(dense, MoE) layers per rank of every distinct (pp, vp) of a set of rows, and which one each
    row has: computed once (``pipeline_counts``) and shared by every stage the search looks at."""

    pair_of_row: NDArray[np.int64]
    dense: NDArray[np.int64]
    """(pairs, largest PP) layers per rank, 0 past the pair's PP."""
    moe: NDArray[np.int64]
    known: NDArray[np.bool_]
    """False for pairs whose layers do not divide (rejected by the rules; counts left 0)."""
    pair_pp: list[int]
    bf16_start: NDArray[np.int64] | None = None
    """(pairs, largest PP) layers per rank among the model's first BF16 layers (``bf16_layers_of``); None: none."""
    bf16_end: NDArray[np.int64] | None = None
    """The same among the model's last BF16 layers."""

    def take(self, rows: NDArray[np.int64]) -> PipelineCounts:
        """The same counts for the rows ``rows`` of the original set."""
        return PipelineCounts(pair_of_row=self.pair_of_row[rows], dense=self.dense, moe=self.moe,
                              known=self.known, pair_pp=self.pair_pp, bf16_start=self.bf16_start,
                              bf16_end=self.bf16_end)


def pipeline_counts(model: ModelSpec, pp: NDArray[np.int64], vp: NDArray[np.int64],
                    layouts: dict[tuple[int, int], tuple[int, ...]] | None = None,
                    bf16_layers: tuple[int, int] = (0, 0)) -> PipelineCounts:
    """Per-rank layer counts of every distinct (pp, vp) among the rows: even splits, or the
    balanced ``layouts`` given for pairs that do not divide; with ``bf16_layers`` (``bf16_layers_of``) also how
    many of the model's first and last BF16 layers each rank holds."""
    (pair_pp, pair_vp), pair_of_row = distinct_rows([pp, vp])
    prefix = _moe_prefix(model)
    pps, vps = pair_pp.tolist(), pair_vp.tolist()
    counts = [_rank_counts(model, p, v, layouts or {}, prefix, bf16_layers) for p, v in zip(pps, vps, strict=True)]
    width = max([len(c[0]) for c in counts if c is not None], default=1)
    cols = [np.zeros((len(counts), width), dtype=np.int64) for _ in range(4)]
    known = np.zeros(len(counts), dtype=bool)
    for j, c in enumerate(counts):
        if c is not None:
            for col, values in zip(cols, c, strict=True):
                col[j, :len(values)] = values
            known[j] = True
    bf16 = any(bf16_layers)
    return PipelineCounts(pair_of_row=pair_of_row, dense=cols[0], moe=cols[1], known=known, pair_pp=pps,
                          bf16_start=cols[2] if bf16 else None, bf16_end=cols[3] if bf16 else None)


def representative_ranks(
    model: ModelSpec, pp: NDArray[np.int64], vp: NDArray[np.int64],
    layouts: dict[tuple[int, int], tuple[int, ...]] | None = None, *, counts: PipelineCounts | None = None,
) -> list[NDArray[np.int64]]:
    """Ranks whose memory and time bound every stage: 0 (most in flight, embedding), 1 (most in
    flight among middle stages), the ranks holding the most layers (most MoE layers first, and
    most dense layers first: uneven layouts and mixed dense/MoE patterns) and p - 1 (output
    layer, logits). ``counts``: ``pipeline_counts`` of these rows when already computed."""
    c = counts if counts is not None else pipeline_counts(model, pp, vp, layouts)
    n_pairs = len(c.known)
    most_moe = np.zeros(n_pairs, dtype=np.int64)
    most_dense = np.zeros(n_pairs, dtype=np.int64)
    moe_heavy = np.zeros(n_pairs, dtype=np.int64)
    for j in np.flatnonzero(c.known).tolist():
        p = c.pair_pp[j]
        dense, moe = c.dense[j, :p].tolist(), c.moe[j, :p].tolist()
        totals = [d + m for d, m in zip(dense, moe, strict=True)]
        most_moe[j] = max(range(p), key=lambda r: (totals[r], moe[r], -r))
        most_dense[j] = max(range(p), key=lambda r: (totals[r], dense[r], -r))
        moe_heavy[j] = max(range(p), key=lambda r: (moe[r], totals[r], -r))
    row = c.pair_of_row
    ranks = [np.zeros_like(pp), np.minimum(1, pp - 1), most_moe[row], most_dense[row], pp - 1]
    return [*ranks, moe_heavy[row]] if model.is_moe else ranks


def stage_layers_table(
    model: ModelSpec, pp: NDArray[np.int64], vp: NDArray[np.int64], rank: NDArray[np.int64],
    layouts: dict[tuple[int, int], tuple[int, ...]] | None = None, *, counts: PipelineCounts | None = None,
    schedule: str = "",
) -> StageLayers:
    """StageLayers arrays for (pp, vp, rank) rows (the search space): even splits, or the
    balanced ``layouts`` given for (pp, vp) pairs that do not divide.

    Assignments are computed once per distinct (pp, vp) and gathered, so the cost does not grow
    with the number of candidates. ``counts``: ``pipeline_counts`` of these rows when already computed.
    """
    c = counts if counts is not None else pipeline_counts(model, pp, vp, layouts)
    out = schedule_named(schedule).output_rank(pp)
    ok = c.known[c.pair_of_row]
    r = np.where(ok, rank, 0)
    def at(col: NDArray[np.int64] | None) -> NDArray[np.int64] | int:
        return 0 if col is None else np.where(ok, col[c.pair_of_row, r], 0)

    return StageLayers(
        num_dense_layers=np.where(ok, c.dense[c.pair_of_row, r], 0),
        num_moe_layers=np.where(ok, c.moe[c.pair_of_row, r], 0),
        has_embedding=rank == 0,
        has_output=rank == out,
        num_mtp_layers=np.where(rank == out, model.mtp_num_layers, 0),
        num_bf16_start_layers=at(c.bf16_start),
        num_bf16_end_layers=at(c.bf16_end),
    )
