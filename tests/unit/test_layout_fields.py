"""ParallelLayout and LayoutTable keep one field list: LayoutTable's fields are ParallelLayout's (``recompute`` as
``recompute_code``) plus ``pipeline_layouts``, and a layout survives the round trip through a one-row table."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.layout import (
    RECOMPUTE_MODULES,
    TABLE_COLUMNS,
    TABLE_OPTIONS,
    LayoutTable,
    ParallelLayout,
    column_attribute,
)
from paraplan.schedules import SCHEDULE_NAMES


def test_table_fields_are_the_layout_fields() -> None:
    layout_names = [f.name for f in fields(ParallelLayout)]
    table_names = [f.name for f in fields(LayoutTable)]
    assert sorted([*TABLE_COLUMNS, *TABLE_OPTIONS]) == sorted(layout_names)
    assert table_names == [column_attribute(n) for n in TABLE_COLUMNS] + list(TABLE_OPTIONS) + ["pipeline_layouts"]


def test_every_table_column_is_an_array_field() -> None:
    """The column fields are typed as arrays, the options not (a field moved between the lists without its
    annotation changing fails here)."""
    table = {f.name: str(f.type) for f in fields(LayoutTable)}
    for name in TABLE_COLUMNS:
        assert table[column_attribute(name)] in ("IntArray", "BoolArray"), name
    for name in TABLE_OPTIONS:
        assert "Array" not in table[name], name


layouts = st.builds(
    ParallelLayout, tp=st.integers(1, 8), pp=st.integers(1, 8), vp=st.integers(1, 4), cp=st.integers(1, 4),
    ep=st.integers(1, 8), etp=st.integers(0, 8), dp=st.integers(1, 16), mbs=st.integers(1, 8),
    recompute=st.sampled_from(["none", "selective", "full"]),
    recompute_modules=st.lists(st.sampled_from(RECOMPUTE_MODULES), min_size=1, max_size=3, unique=True).map(tuple),
    recompute_num_layers=st.integers(1, 4), sequence_parallel=st.booleans(), distributed_optimizer=st.booleans(),
    fsdp=st.booleans(), overlap_grad_reduce=st.booleans(), overlap_param_gather=st.booleans(),
    tp_comm_overlap=st.booleans(), first_stage_layers=st.integers(0, 3), last_stage_layers=st.integers(0, 3),
    account_for_embedding=st.booleans(), account_for_loss=st.booleans(),
    schedule=st.sampled_from(["", *SCHEDULE_NAMES]),
)


@settings(max_examples=60, deadline=None)
@given(layout=layouts)
def test_layout_round_trips_through_a_table(layout: ParallelLayout) -> None:
    table = LayoutTable.from_layouts([layout])
    assert table.row(0) == layout
    for name in TABLE_COLUMNS:
        assert isinstance(getattr(table, column_attribute(name)), np.ndarray), name


@settings(max_examples=30, deadline=None)
@given(first=layouts, second=layouts)
def test_rows_keep_their_columns_and_share_the_options(first: ParallelLayout, second: ParallelLayout) -> None:
    second = replace(second, **{n: getattr(first, n) for n in TABLE_OPTIONS})
    table = LayoutTable.from_layouts([first, second])
    assert [table.row(0), table.row(1)] == [first, second]
    assert table.take(np.array([1])).row(0) == second
