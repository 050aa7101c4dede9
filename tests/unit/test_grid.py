"""Grid against Megatron-Core's own rank enumeration.

``megatron_groups`` transcribes ``generate_masked_orthogonal_rank_groups`` of
megatron/core/parallel_state.py (the function ``RankGenerator.get_ranks`` calls): every group it
returns must be ``size`` ranks in steps of ``stride``, as ``Grid.group`` says.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paraplan.layout import LayoutTable, ParallelLayout
from paraplan.specs.grid import DENSE_ORDER, EXPERT_ORDER, RANK_ORDER, Axis, Grid


def megatron_groups(world: int, sizes: list[int], mask: list[bool]) -> list[list[int]]:
    def prefix_product(a: list[int]) -> list[int]:
        out = [1]
        for v in a:
            out.append(out[-1] * v)
        return out

    def decompose(index: int, shape: list[int]) -> list[int]:
        stride = prefix_product(shape)
        return [(index // d) % s for s, d in zip(shape, stride, strict=False)]

    masked_shape = [s for s, m in zip(sizes, mask, strict=True) if m]
    unmasked_shape = [s for s, m in zip(sizes, mask, strict=True) if not m]
    global_stride = prefix_product(sizes)
    masked_stride = [d for d, m in zip(global_stride, mask, strict=False) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask, strict=False) if not m]
    group_size = prefix_product(masked_shape)[-1]
    groups = []
    for gi in range(world // group_size):
        g_idx = decompose(gi, unmasked_shape)
        groups.append([sum(x * y for x, y in zip(decompose(r, masked_shape), masked_stride, strict=True))
                       + sum(x * y for x, y in zip(g_idx, unmasked_stride, strict=True))
                       for r in range(group_size)])
    return groups


def test_orders_are_megatrons() -> None:
    assert RANK_ORDER == "tp-cp-ep-dp-pp"
    assert DENSE_ORDER == (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
    assert EXPERT_ORDER == (Axis.TP, Axis.EP, Axis.DP, Axis.PP)


LAYOUTS = [(tp, cp, dp, pp, ep, etp) for tp, cp, dp, pp in itertools.product((1, 2, 4), (1, 2), (1, 2, 4), (1, 3))
           for ep, etp in ((1, tp), (2, 1), (4, 1), (2, 2)) if (tp * cp * dp) % (ep * etp) == 0]
GROUPS = [((Axis.TP,), False), ((Axis.CP,), False), ((Axis.CP, Axis.DP), False), ((Axis.DP,), False),
          ((Axis.PP,), False), ((Axis.TP, Axis.CP), False), ((Axis.TP,), True), ((Axis.EP,), True),
          ((Axis.DP,), True), ((Axis.TP, Axis.EP), True)]


@pytest.mark.parametrize(("tp", "cp", "dp", "pp", "ep", "etp"), LAYOUTS)
def test_group_size_and_stride_match_megatron(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int) -> None:
    world = tp * cp * dp * pp
    edp = world // (etp * ep * pp)
    grid = Grid(tp=tp, cp=cp, ep=ep, etp=etp, dp=dp, pp=pp, edp=edp)
    for axes, expert in GROUPS:
        order, sizes = (EXPERT_ORDER, [etp, ep, edp, pp]) if expert else (DENSE_ORDER, [tp, cp, dp, pp])
        groups = megatron_groups(world, sizes, [a in axes for a in order])
        g = grid.group(*axes, expert=expert)
        for ranks in groups:
            assert ranks == list(range(ranks[0], ranks[0] + g.size * g.stride, g.stride)), (axes, expert)
        # the groups tile the world: the span divides it
        assert world % g.span == 0


def test_vectorised_matches_scalar() -> None:
    layouts = [ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp)
               for tp, cp, dp, pp, ep, etp in LAYOUTS]
    table = LayoutTable.from_layouts(layouts)
    vec = Grid.of(table)
    for i, lay in enumerate(layouts):
        one = Grid.of(lay)
        for name in ("tp_group", "cp_group", "dp_cp_group", "pp_group", "etp_group", "ep_group", "edp_group"):
            a, b = getattr(one, name), getattr(vec, name)
            assert (a.size, a.stride) == (int(np.asarray(b.size)[i]), int(np.asarray(b.stride)[i])), name


def test_non_adjacent_axes_and_inner_grid_refuse() -> None:
    grid = Grid(tp=2, cp=2, ep=1, etp=2, dp=2, pp=2, edp=4)
    with pytest.raises(ValueError, match="not adjacent"):
        grid.group(Axis.TP, Axis.DP)
    with pytest.raises(ValueError, match="not in the tp-ep-dp-pp grid"):
        grid.group(Axis.CP, expert=True)  # CP folds into expert DP
    inner = Grid(tp=2, cp=2, ep=1, etp=2)
    assert inner.cp_group.stride == 2
    with pytest.raises(ValueError, match="dp size"):
        _ = inner.dp_cp_group
