"""The rank grid: Megatron-Core's parallel axes, their order, and each group's size, stride and span.

Megatron-Core numbers ranks with TP fastest, then CP, EP, DP and PP outermost (the order string
``tp-cp-ep-dp-pp``, ``megatron/core/parallel_state.py`` ``RankGenerator``). It builds two grids on
the same ranks (``generate_masked_orthogonal_rank_groups``):

    dense layers   tp-cp-dp-pp      sizes TP, CP, DP, PP            (EP = 1)
    expert layers  tp-ep-dp-pp      sizes ETP, EP, EDP, PP          (CP folds into EDP)

A group over axes that are adjacent in the order holds ``size`` = the product of their sizes,
spaced ``stride`` = the product of the sizes of the axes before them; it spans ``size * stride``
consecutive ranks (rank = sum_i rank_i * prod_{j < i} size_j). That span is what every placement
question asks (which network tier a group crosses: ``paraplan.specs.topology``); it is computed
here once, for one layout (ints) or a ``LayoutTable`` (numpy columns) alike -- the whole grid in
one expression, as picotron's ``ProcessGroupManager`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from paraplan.specs.num import Int


class Axis(StrEnum):
    """A parallel axis, named as in Megatron's order string."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"


RANK_ORDER: Final = "tp-cp-ep-dp-pp"
"""Megatron-Core's default ``--rank-order`` / ``RankGenerator(order=...)``: TP varies fastest."""
DENSE_ORDER: Final = tuple(Axis(a) for a in RANK_ORDER.split("-") if a != Axis.EP)
"""The dense-layer grid (EP masked out: ``RankGenerator(ep=1)``)."""
EXPERT_ORDER: Final = tuple(Axis(a) for a in RANK_ORDER.split("-") if a != Axis.CP)
"""The expert-layer grid (``RankGenerator(tp=etp, cp=1, ep=ep, dp=edp)``)."""


@dataclass(frozen=True, slots=True)
class Group:
    """One kind of parallel group: ``size`` ranks spaced ``stride`` apart."""

    size: Int
    stride: Int

    @property
    def span(self) -> Int:
        """Consecutive ranks one group covers (first to last member, inclusive of the gaps)."""
        return self.size * self.stride


class _InnerSizes(Protocol):  # what a LayerKeyTable has: the axes inside DP
    @property
    def tp(self) -> Int: ...
    @property
    def cp(self) -> Int: ...
    @property
    def ep(self) -> Int: ...
    @property
    def etp(self) -> Int: ...


class _Sizes(_InnerSizes, Protocol):  # a ParallelLayout or a LayoutTable
    @property
    def dp(self) -> Int: ...
    @property
    def pp(self) -> Int: ...
    @property
    def edp(self) -> Int: ...


@dataclass(frozen=True, slots=True)
class Grid:
    """Both Megatron grids of one layout (ints) or of many (int64 columns). ``dp``, ``pp`` and
    ``edp`` are None in the grid of a per-layer table (``Grid.inner``): only the groups inside DP
    can be asked of it."""

    tp: Int
    cp: Int
    ep: Int
    etp: Int
    dp: Int | None = None
    pp: Int | None = None
    edp: Int | None = None

    @classmethod
    def of(cls, layout: _Sizes) -> Grid:
        """The grid of a ``ParallelLayout`` or ``LayoutTable`` (``etp``/``edp`` as resolved there)."""
        return cls(tp=layout.tp, cp=layout.cp, ep=layout.ep, etp=layout.etp, dp=layout.dp, pp=layout.pp,
                   edp=layout.edp)

    @classmethod
    def inner(cls, layout: _InnerSizes) -> Grid:
        """The TP, CP, EP and ETP axes of a layout or per-layer table (``LayerKeyTable``)."""
        return cls(tp=layout.tp, cp=layout.cp, ep=layout.ep, etp=layout.etp)

    def _sizes(self, expert: bool) -> dict[Axis, Int | None]:
        if expert:
            return {Axis.TP: self.etp, Axis.EP: self.ep, Axis.DP: self.edp, Axis.PP: self.pp}
        return {Axis.TP: self.tp, Axis.CP: self.cp, Axis.DP: self.dp, Axis.PP: self.pp}

    def group(self, *axes: Axis, expert: bool = False) -> Group:
        """The group over ``axes`` (adjacent in the dense order, or in the expert order when
        ``expert``): size = product of their sizes, stride = product of the sizes before them."""
        order = EXPERT_ORDER if expert else DENSE_ORDER
        missing = [a for a in axes if a not in order]
        if missing:
            raise ValueError(f"axis {missing[0]} is not in the {'-'.join(order)} grid")
        idx = sorted(order.index(a) for a in axes)
        if not idx or idx != list(range(idx[0], idx[0] + len(idx))):
            raise ValueError(f"axes {'-'.join(axes)} are not adjacent in {'-'.join(order)}")
        sizes = self._sizes(expert)

        def size_of(i: int) -> Int:
            v = sizes[order[i]]
            if v is None:
                raise ValueError(f"the {order[i]} size is not known to this grid (Grid.inner)")
            return v

        size: Int = size_of(idx[0])
        for i in idx[1:]:
            size = size * size_of(i)
        stride: Int = size_of(0) * 0 + 1
        for i in range(idx[0]):
            stride = stride * size_of(i)
        return Group(size=size, stride=stride)

    # the groups the cost model and the placement report ask about
    @property
    def tp_group(self) -> Group:
        """Tensor parallel: contiguous ranks."""
        return self.group(Axis.TP)

    @property
    def cp_group(self) -> Group:
        """Context parallel: CP ranks spaced TP apart (span TP x CP)."""
        return self.group(Axis.CP)

    @property
    def dp_cp_group(self) -> Group:
        """The dense gradient reduce / distributed-optimizer group: DP x CP ranks spaced TP apart."""
        return self.group(Axis.CP, Axis.DP)

    @property
    def pp_group(self) -> Group:
        """Pipeline: PP ranks spaced TP x CP x DP apart (span = the world)."""
        return self.group(Axis.PP)

    @property
    def etp_group(self) -> Group:
        """Expert tensor parallel: contiguous ranks."""
        return self.group(Axis.TP, expert=True)

    @property
    def ep_group(self) -> Group:
        """Expert parallel: EP ranks spaced ETP apart."""
        return self.group(Axis.EP, expert=True)

    @property
    def edp_group(self) -> Group:
        """Expert data parallel: EDP ranks spaced ETP x EP apart."""
        return self.group(Axis.DP, expert=True)
