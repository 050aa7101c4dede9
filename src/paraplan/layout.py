"""ParallelLayout: one Megatron-Core parallel configuration, and the column view of many.

Megatron-Core grids (``megatron/core/parallel_state.py``):
    dense layers   world = TP x CP x PP x DP
    expert layers  world = ETP x EP x PP x EDP      (EP borrows from DP x CP x TP, "folding")
Rank order ``tp-cp-ep-dp-pp``: TP varies fastest, so a TP group is contiguous ranks (inside one
node when TP <= GPUs per node), then CP, then DP; PP is outermost.

The estimate formulas read the attributes below by name, so they work on one ``ParallelLayout``
(Python scalars) and on a ``LayoutTable`` (numpy columns, one row per candidate) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from paraplan.errors import SpecError
from paraplan.schedules import schedule_named

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CODES: Final[dict[str, int]] = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_METHODS: Final = ("uniform", "block")
"""Megatron ``--recompute-method`` choices (full recompute)."""
RECOMPUTE_MODULES: Final = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
)
"""Megatron ``--recompute-modules`` choices whose memory effect paraplan models."""

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


MAX_PIPELINE_STAGES: Final = 2**17
"""Most virtual pipeline stages (PP x VP) and layers per first/last stage a layout may have: above
any model's layer count (specs.model.MAX_NUM_LAYERS, 100,000) plus embedding and loss, small enough
that the per-stage lists stay cheap (an unbounded --vp was a MemoryError)."""


def _check_stage_sizes(pp: int, vp: int, first: int, last: int, pipeline_layout: tuple[int, ...]) -> None:
    for name, value in (("pp", pp), ("vp", vp), ("decoder-first-pipeline-num-layers", first),
                        ("decoder-last-pipeline-num-layers", last)):
        if value > MAX_PIPELINE_STAGES:
            raise SpecError(f"--{name}: {value:,} is out of range; allowed 1 to {MAX_PIPELINE_STAGES:,}")
    if pp * vp > MAX_PIPELINE_STAGES:
        raise SpecError(f"--pp x --vp: {pp * vp:,} virtual pipeline stages; allowed at most {MAX_PIPELINE_STAGES:,}")
    if len(pipeline_layout) > MAX_PIPELINE_STAGES:
        raise SpecError(f"--pipeline-model-parallel-layout: {len(pipeline_layout):,} stages; "
                        f"allowed at most {MAX_PIPELINE_STAGES:,}")


def check_layout_sizes(num_layers: int, model_name: str, **sizes: int | None) -> None:
    """One-line SpecError for a layout flag that sizes a per-stage list (pp, vp, the first/last stage
    layers) above what the model can use: 1 to num_layers (as ``plan`` bounds --vp), before any list
    is built."""
    for name, value in sizes.items():
        if value is not None and not isinstance(value, bool) and isinstance(value, int) and value > num_layers:
            raise SpecError(f"--{name.replace('_', '-')}: {value:,} is out of range; allowed 1 to {num_layers:,} "
                            f"(num_layers of {model_name})")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelLayout:
    """Parallel sizes, micro-batch and memory/overlap switches of one run."""

    tp: int = 1
    """Tensor parallel size (``--tensor-model-parallel-size``)."""
    pp: int = 1
    """Pipeline parallel size."""
    vp: int = 1
    """Virtual pipeline chunks per rank (1 = no interleaving)."""
    cp: int = 1
    """Context parallel size."""
    ep: int = 1
    """Expert parallel size."""
    etp: int = 0
    """Expert tensor parallel size; 0 = Megatron's default (= TP)."""
    dp: int = 1
    """Data parallel size of the dense layers: world / (TP x PP x CP)."""
    mbs: int = 1
    """Micro-batch size (sequences)."""
    recompute: Recompute = "selective"
    """Activation recomputation granularity."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """Modules recomputed with selective granularity (Megatron default: core_attn)."""
    recompute_num_layers: int = 1
    """Layers per checkpoint with full recompute, uniform method (Megatron's typical 1); with the block method,
    the layers of each model chunk recomputed (the first N; the others keep their activations)."""
    recompute_method: str = "uniform"
    """``--recompute-method`` with full recompute: uniform or block (megatron/core/recompute.py)."""
    sequence_parallel: bool = True
    """Shard norm/dropout activations along the sequence over TP (ignored at TP = 1)."""
    distributed_optimizer: bool = True
    """Shard optimizer states over DP x CP (ZeRO-1)."""
    fsdp: bool = False
    """Megatron-FSDP (optim_grads_params): parameters and gradients sharded too (ZeRO-3)."""
    overlap_grad_reduce: bool = True
    """``--overlap-grad-reduce``."""
    overlap_param_gather: bool = True
    """``--overlap-param-gather`` (needs the distributed optimizer or FSDP)."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (needs sequence parallel)."""
    first_stage_layers: int = 0
    """``--decoder-first-pipeline-num-layers`` (0 = even split)."""
    last_stage_layers: int = 0
    """``--decoder-last-pipeline-num-layers`` (0 = even split)."""
    account_for_embedding: bool = False
    """``--account-for-embedding-in-pipeline-split``: the embedding counts as one layer."""
    account_for_loss: bool = False
    """``--account-for-loss-in-pipeline-split``: the loss counts as one layer."""
    pipeline_layout: tuple[int, ...] = ()
    """Decoder layers per virtual stage, in Megatron's virtual-stage order (chunk-major), as
    ``--pipeline-model-parallel-layout`` expresses it; () = derived from the options above."""
    schedule: str = ""
    """Pipeline schedule (``paraplan.schedules`` name); "" = Megatron's choice from VP."""

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "vp", "cp", "ep", "dp", "mbs", "recompute_num_layers"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{f} must be a positive integer, got {value!r}")
        for f in ("etp", "first_stage_layers", "last_stage_layers"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{f} must be a non-negative integer, got {value!r}")
        _check_stage_sizes(self.pp, self.vp, self.first_stage_layers, self.last_stage_layers, self.pipeline_layout)
        if self.etp == 0:
            object.__setattr__(self, "etp", self.tp)
        if self.recompute not in RECOMPUTE_CODES:
            raise SpecError(f"recompute must be one of none, selective, full; got {self.recompute!r}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise SpecError(f"recompute_method must be one of {', '.join(RECOMPUTE_METHODS)}, got "
                            f"{self.recompute_method!r}")
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise SpecError(
                f"recompute_modules: unknown {', '.join(unknown)}; allowed: {', '.join(RECOMPUTE_MODULES)}"
            )
        if self.schedule:
            schedule_named(self.schedule)  # SpecError naming the allowed schedules

    # Attributes shared with LayoutTable (what the formulas read) -------------------------
    @property
    def recompute_code(self) -> int:
        """0 none, 1 selective, 2 full."""
        return RECOMPUTE_CODES[self.recompute]

    @property
    def sp(self) -> bool:
        """Sequence parallel in effect (Megatron turns it off at TP = 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def uneven(self) -> bool:
        """Layers split by explicit first/last counts or a pipeline layout, not evenly."""
        return bool(self.first_stage_layers or self.last_stage_layers or self.pipeline_layout)

    @property
    def dist_opt(self) -> bool:
        """Optimizer states sharded (distributed optimizer or FSDP)."""
        return self.distributed_optimizer or self.fsdp

    @property
    def world_size(self) -> int:
        """TP x CP x PP x DP."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data parallel size: world / (ETP x EP x PP)."""
        return self.world_size // (self.etp * self.ep * self.pp)

    def num_microbatches(self, global_batch_size: int) -> int:
        """GBS / (mbs x DP) (Megatron's ConstantNumMicroBatchesCalculator)."""
        return global_batch_size // (self.mbs * self.dp)

    def short(self) -> str:
        """Compact label, e.g. ``tp4 pp4 cp2 dp2 mbs1 selective``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vp > 1:
            parts.append(f"vp{self.vp}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        parts += [f"dp{self.dp}", f"mbs{self.mbs}", self.recompute]  # the full word (recompute[:4] was "sele")
        if self.fsdp:
            parts.append("fsdp")
        elif not self.distributed_optimizer:
            parts.append("no-distopt")
        if self.schedule:
            parts.append(self.schedule)
        return " ".join(parts)


def layout_for_world(num_gpus: int, **kwargs: object) -> ParallelLayout:
    """A layout with DP = num_gpus / (TP x PP x CP); raises SpecError if that is not whole."""
    tp = int(kwargs.get("tp", 1))  # type: ignore[call-overload]
    pp = int(kwargs.get("pp", 1))  # type: ignore[call-overload]
    cp = int(kwargs.get("cp", 1))  # type: ignore[call-overload]
    model_size = tp * pp * cp
    if model_size <= 0 or num_gpus % model_size:
        raise SpecError(
            f"world size ({num_gpus}) is not divisible by total_model_size "
            f"(total_model_size={model_size}) = TP {tp} x PP {pp} x CP {cp}"
        )
    return ParallelLayout(dp=num_gpus // model_size, **kwargs)  # type: ignore[arg-type]


TABLE_OPTIONS: Final = ("recompute_modules", "recompute_num_layers", "recompute_method", "first_stage_layers",
                        "last_stage_layers", "account_for_embedding", "account_for_loss", "pipeline_layout", "schedule")
"""``ParallelLayout`` fields a ``LayoutTable`` holds once for all its rows (the search does not vary them)."""
TABLE_COLUMNS: Final = tuple(f.name for f in fields(ParallelLayout) if f.name not in TABLE_OPTIONS)
"""``ParallelLayout`` fields a ``LayoutTable`` holds as a numpy column, one value per row: every other field.
``LayoutTable``'s own field list is these columns (``recompute`` as ``recompute_code``), then ``TABLE_OPTIONS``,
then ``pipeline_layouts``; tests/unit/test_layout_fields.py checks that the two classes agree."""


def column_attribute(name: str) -> str:
    """The ``LayoutTable`` attribute of the ``ParallelLayout`` field ``name`` (``recompute`` is stored as its code)."""
    return "recompute_code" if name == "recompute" else name


@dataclass(slots=True, kw_only=True)
class LayoutTable:
    """Many layouts as numpy columns (struct of arrays) for vectorised evaluation.

    Same attribute names as ``ParallelLayout``'s formula-facing attributes. Per-layout stage
    assignment options (uneven first/last stages) are not searched and are 0/False here.
    """

    tp: IntArray
    pp: IntArray
    vp: IntArray
    cp: IntArray
    ep: IntArray
    etp: IntArray
    dp: IntArray
    mbs: IntArray
    recompute_code: IntArray
    sequence_parallel: BoolArray
    distributed_optimizer: BoolArray
    fsdp: BoolArray
    overlap_grad_reduce: BoolArray
    overlap_param_gather: BoolArray
    tp_comm_overlap: BoolArray
    recompute_modules: tuple[str, ...] = ("core_attn",)
    recompute_num_layers: int = 1
    recompute_method: str = "uniform"
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    account_for_embedding: bool = False
    account_for_loss: bool = False
    pipeline_layout: tuple[int, ...] = ()
    schedule: str = ""
    """Pipeline schedule of every row (``ParallelLayout.schedule``)."""
    pipeline_layouts: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    """Balanced per-virtual-stage layer counts for (pp, vp) pairs whose layers do not divide
    evenly (``--pipeline-model-parallel-layout``); rows with those pairs use them."""

    @property
    def uneven(self) -> BoolArray:
        """Rows whose (pp, vp) uses an entry of ``pipeline_layouts``."""
        if not self.pipeline_layouts:
            return np.zeros(len(self.tp), dtype=bool)
        (pair_pp, pair_vp), pair_of_row = distinct_rows([self.pp, self.vp])
        listed = np.array([(p, v) in self.pipeline_layouts
                           for p, v in zip(pair_pp.tolist(), pair_vp.tolist(), strict=True)], dtype=bool)
        return listed[pair_of_row]

    @property
    def sp(self) -> BoolArray:
        """Sequence parallel in effect."""
        return self.sequence_parallel & (self.tp > 1)

    @property
    def dist_opt(self) -> BoolArray:
        """Optimizer states sharded."""
        return self.distributed_optimizer | self.fsdp

    @property
    def world_size(self) -> IntArray:
        """TP x CP x PP x DP per row."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> IntArray:
        """Expert data parallel size per row."""
        return self.world_size // (self.etp * self.ep * self.pp)

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def row(self, i: int) -> ParallelLayout:
        """Row i as a ParallelLayout (the columns of ``TABLE_COLUMNS``, the shared options of ``TABLE_OPTIONS``;
        the pipeline layout is the one its (pp, vp) pair has in ``pipeline_layouts``)."""
        inv = {v: k for k, v in RECOMPUTE_CODES.items()}
        kw: dict[str, object] = {name: getattr(self, name) for name in TABLE_OPTIONS}
        for name in TABLE_COLUMNS:
            value = getattr(self, column_attribute(name))[i]
            kw[name] = inv[int(value)] if name == "recompute" else (bool(value) if value.dtype == np.bool_
                                                                   else int(value))
        kw["pipeline_layout"] = self.pipeline_layouts.get((int(self.pp[i]), int(self.vp[i])), ())
        return ParallelLayout(**kw)  # type: ignore[arg-type]

    def take(self, index: NDArray[np.int64] | BoolArray) -> LayoutTable:
        """Rows selected by an index array or mask."""
        kw: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            kw[f.name] = value[index] if isinstance(value, np.ndarray) else value
        return LayoutTable(**kw)  # type: ignore[arg-type]

    @classmethod
    def from_layouts(cls, layouts: list[ParallelLayout]) -> LayoutTable:
        """Stack scalar layouts into columns (they must share the options of ``TABLE_OPTIONS``; the first
        layout's are taken)."""
        kw: dict[str, object] = {name: getattr(layouts[0], name) for name in TABLE_OPTIONS}
        for name in TABLE_COLUMNS:
            attr = column_attribute(name)
            kw[attr] = np.array([getattr(lay, attr) for lay in layouts],
                                dtype=np.bool_ if isinstance(getattr(layouts[0], name), bool) else np.int64)
        return cls(**kw)  # type: ignore[arg-type]


LAYER_KEY_COLUMNS: Final = ("tp", "cp", "ep", "etp", "mbs", "recompute_code", "sequence_parallel", "tp_comm_overlap")
"""The layout columns that per-layer formulas (activations and time of one layer, logits) read."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerKeyTable:
    """One row per distinct combination of ``LAYER_KEY_COLUMNS``: what the per-layer formulas
    need, computed once per combination and gathered back to the layouts (many layouts differ
    only in PP, VP, DP or the optimizer sharding). It has no PP, VP, DP or optimizer columns, so a
    formula that read one would fail here instead of silently mixing rows."""

    tp: IntArray
    cp: IntArray
    ep: IntArray
    etp: IntArray
    mbs: IntArray
    recompute_code: IntArray
    sequence_parallel: BoolArray
    tp_comm_overlap: BoolArray
    recompute_modules: tuple[str, ...]
    recompute_num_layers: int
    recompute_method: str = "uniform"

    @property
    def sp(self) -> BoolArray:
        """Sequence parallel in effect (as ``LayoutTable.sp``)."""
        return self.sequence_parallel & (self.tp > 1)

    def __len__(self) -> int:
        return int(self.tp.shape[0])


def distinct_rows(columns: list[NDArray[np.generic]]) -> tuple[list[IntArray], IntArray]:
    """Distinct combinations of equally long integer (or bool) columns: their values column by
    column (ascending combination order) and, for every row, the index of its combination.

    Columns are packed into one mixed-radix integer; small ranges use a presence table (linear
    time), larger ones a sort, and ranges too large to pack a row-wise ``np.unique``."""
    cols = [np.asarray(c).astype(np.int64) for c in columns]
    n = int(cols[0].shape[0])
    if n == 0:
        return [c[:0] for c in cols], np.zeros(0, dtype=np.int64)
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    size = 1
    for s in spans:
        size *= s
    if size >= 2**62:
        rows, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return [rows[:, j] for j in range(len(cols))], inverse.reshape(-1).astype(np.int64)
    key = np.zeros(n, dtype=np.int64)
    for c, lo, s in zip(cols, lows, spans, strict=True):
        key = key * s + (c - lo)
    if size <= max(4 * n, 1 << 20):
        present = np.zeros(size, dtype=bool)
        present[key] = True
        uniq = np.flatnonzero(present)
        inverse = (np.cumsum(present) - 1)[key]
    else:
        uniq, inverse = np.unique(key, return_inverse=True)
    values: list[IntArray] = []
    rest = uniq.astype(np.int64)
    for lo, s in zip(reversed(lows), reversed(spans), strict=True):
        values.append(rest % s + lo)
        rest = rest // s
    values.reverse()
    return values, inverse.reshape(-1).astype(np.int64)


def layer_key_table(table: LayoutTable) -> tuple[LayerKeyTable, IntArray]:
    """The distinct ``LAYER_KEY_COLUMNS`` combinations of ``table`` and each row's index among them."""
    values, inverse = distinct_rows([getattr(table, c) for c in LAYER_KEY_COLUMNS])
    cols = dict(zip(LAYER_KEY_COLUMNS, values, strict=True))
    keys = LayerKeyTable(
        tp=cols["tp"], cp=cols["cp"], ep=cols["ep"], etp=cols["etp"], mbs=cols["mbs"],
        recompute_code=cols["recompute_code"], sequence_parallel=cols["sequence_parallel"].astype(bool),
        tp_comm_overlap=cols["tp_comm_overlap"].astype(bool), recompute_modules=table.recompute_modules,
        recompute_num_layers=table.recompute_num_layers, recompute_method=table.recompute_method,
    )
    return keys, inverse
