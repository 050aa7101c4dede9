"""StageLayers for every pipeline rank of a layout (scalar path) and for the ranks the search
needs (first, second, last) as arrays over candidates (vectorised path)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from paraplan.estimate.params import StageLayers
from paraplan.estimate.pipeline import stage_assignment
from paraplan.layout import ParallelLayout
from paraplan.specs.model import ModelSpec


def stage_layers_for_rank(model: ModelSpec, layers: Iterable[int], *, rank: int, pp: int) -> StageLayers:
    """Counts of dense and MoE layers among ``layers``; embedding on rank 0, output and MTP on the last."""
    pattern = model.moe_layer_pattern()
    idx = list(layers)
    n_moe = sum(1 for i in idx if pattern[i])
    return StageLayers(
        num_dense_layers=len(idx) - n_moe,
        num_moe_layers=n_moe,
        has_embedding=rank == 0,
        has_output=rank == pp - 1,
        num_mtp_layers=model.mtp_num_layers if rank == pp - 1 else 0,
    )


def all_stage_layers(model: ModelSpec, layout: ParallelLayout) -> list[StageLayers]:
    """StageLayers of every pipeline rank (raises LayoutError for impossible splits)."""
    return [
        stage_layers_for_rank(model, a.layers, rank=a.rank, pp=layout.pp)
        for a in stage_assignment(model.num_layers, layout)
    ]


def _per_key_layout(model: ModelSpec, p: int, v: int,
                    layouts: dict[tuple[int, int], tuple[int, ...]]) -> list[StageLayers] | None:
    """Stage assignment for one (pp, vp): even, or the balanced layout given for it."""
    if (p, v) in layouts:
        return all_stage_layers(model, ParallelLayout(pp=p, vp=v, pipeline_layout=layouts[(p, v)]))
    if model.num_layers % (p * v):
        return None  # rejected by the rules
    return all_stage_layers(model, ParallelLayout(pp=p, vp=v))


def representative_ranks(
    model: ModelSpec, pp: NDArray[np.int64], vp: NDArray[np.int64],
    layouts: dict[tuple[int, int], tuple[int, ...]] | None = None,
) -> list[NDArray[np.int64]]:
    """Ranks whose memory and time bound every stage: 0 (most in flight, embedding), 1 (most in
    flight among middle stages), the ranks holding the most layers (most MoE layers first, and
    most dense layers first: uneven layouts and mixed dense/MoE patterns) and p - 1 (output
    layer, logits)."""
    layouts = layouts or {}
    most_moe = np.zeros_like(pp)
    most_dense = np.zeros_like(pp)
    moe_heavy = np.zeros_like(pp)
    keys = pp * 1000 + vp
    for key in np.unique(keys):
        p, v = int(key // 1000), int(key % 1000)
        per_rank = _per_key_layout(model, p, v, layouts)
        if per_rank is None:
            continue
        totals = [s.num_dense_layers + s.num_moe_layers for s in per_rank]
        most_moe[keys == key] = max(range(p), key=lambda r: (totals[r], per_rank[r].num_moe_layers, -r))
        most_dense[keys == key] = max(range(p), key=lambda r: (totals[r], per_rank[r].num_dense_layers, -r))
        moe_heavy[keys == key] = max(range(p), key=lambda r: (per_rank[r].num_moe_layers, totals[r], -r))
    ranks = [np.zeros_like(pp), np.minimum(1, pp - 1), most_moe, most_dense, pp - 1]
    return [*ranks, moe_heavy] if model.is_moe else ranks


def stage_layers_table(
    model: ModelSpec, pp: NDArray[np.int64], vp: NDArray[np.int64], rank: NDArray[np.int64],
    layouts: dict[tuple[int, int], tuple[int, ...]] | None = None,
) -> StageLayers:
    """StageLayers arrays for (pp, vp, rank) rows (the search space): even splits, or the
    balanced ``layouts`` given for (pp, vp) pairs that do not divide.

    Assignments are computed once per distinct (pp, vp) and gathered, so the cost does not grow
    with the number of candidates.
    """
    n = pp.shape[0]
    dense = np.zeros(n, dtype=np.int64)
    moe = np.zeros(n, dtype=np.int64)
    keys = pp * 1000 + vp
    for key in np.unique(keys):
        p, v = int(key // 1000), int(key % 1000)
        rows = keys == key
        per_rank = _per_key_layout(model, p, v, layouts or {})
        if per_rank is None:
            continue  # rejected by the rules; leave zeros
        d = np.array([s.num_dense_layers for s in per_rank], dtype=np.int64)
        m = np.array([s.num_moe_layers for s in per_rank], dtype=np.int64)
        dense[rows] = d[rank[rows]]
        moe[rows] = m[rank[rows]]
    return StageLayers(
        num_dense_layers=dense,
        num_moe_layers=moe,
        has_embedding=rank == 0,
        has_output=rank == pp - 1,
        num_mtp_layers=np.where(rank == pp - 1, model.mtp_num_layers, 0),
    )
