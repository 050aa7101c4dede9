"""--pipeline-split auto (estimate/launch/tune) and the search pick the same uneven split."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cli.options import apply_pipeline_split
from paraplan.estimate.pipeline import auto_uneven_split
from paraplan.layout import ParallelLayout
from paraplan.search import uneven_layouts
from tests.conftest import gpt_model


@pytest.mark.parametrize(("layers", "pp", "vp"), [(40, 4, 8), (61, 8, 1), (61, 2, 8), (94, 8, 4), (80, 3, 1),
                                                  (126, 8, 1), (94, 4, 12)])
def test_auto_split_matches_the_search(layers: int, pp: int, vp: int) -> None:
    model = gpt_model(num_layers=layers, hidden_size=1024, num_attention_heads=16)
    cli, notes = apply_pipeline_split(model, ParallelLayout(tp=1, pp=pp, vp=vp, dp=1, mbs=1), "auto")
    assert notes and notes[0].startswith("uneven pipeline split")
    search = uneven_layouts(model, np.array([pp]), np.array([vp]))[(pp, vp)]
    found = auto_uneven_split(layers, pp, vp)
    if cli.pipeline_layout:
        assert tuple(cli.pipeline_layout) == tuple(search) == tuple(found)
    else:
        first, last = cli.first_stage_layers, cli.last_stage_layers
        assert (first, last) == tuple(found)
        per_rank = [sum(search[r::pp]) for r in range(pp)]
        assert (per_rank[0], per_rank[-1]) == (first, last)
        assert sum(per_rank) == layers


def test_auto_split_never_loads_a_rank_more_than_the_layout_string() -> None:
    # 40 layers on PP 4 x VP 8: first/last flags would put 16 layers on the last rank (8 on the
    # others); the layout string gives every rank 10
    found = auto_uneven_split(40, 4, 8)
    assert len(found) == 32
    assert [sum(found[r::4]) for r in range(4)] == [10, 10, 10, 10]
