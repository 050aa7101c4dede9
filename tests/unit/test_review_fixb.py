"""Review findings FIXB: knob rules in the search, --knob beside --recipe, boolean knob values, check's knob
rules, plan's knob-rule advice, the TE cross-entropy refusal and error wording."""

from __future__ import annotations

import numpy as np

from paraplan.search import SearchSpace, candidate_table, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

LLAMA8 = load_model("llama3-8b")
H100 = load_gpu("h100-80gb")


def test_tp_comm_overlap_is_dropped_where_sp_is_not_in_effect() -> None:
    """Megatron-LM refuses --tp-comm-overlap without sequence parallelism (off at TP 1); the search drops it there
    as Megatron-Bridge does, so no TP 1 layout carries it."""
    cluster = make_cluster(H100, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    table = candidate_table(LLAMA8, cluster, training, SearchSpace(tp_comm_overlap=True))
    assert np.any(table.tp == 1) and np.any(table.tp > 1)
    assert np.array_equal(table.tp_comm_overlap, table.sp)
    assert not np.any(table.tp_comm_overlap[table.tp == 1])


def test_plan_with_tp_comm_overlap_ranks_only_launchable_layouts() -> None:
    from paraplan.launch.megatron import launch_violations

    cluster = make_cluster(H100, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    p = plan(LLAMA8, cluster, training, space=SearchSpace(tp_comm_overlap=True), top_k=8)
    assert any(c.layout.tp == 1 for c in p.candidates)
    for c in p.candidates:
        codes = {code for code, _ in launch_violations(LLAMA8, c.layout, training)}
        assert "TP_COMM_OVERLAP_NEEDS_SP" not in codes, c.layout
        assert c.layout.tp_comm_overlap == (c.layout.tp > 1)
