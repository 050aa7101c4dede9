"""``--first-last-layers-bf16`` under VP and uneven splits (session-6 review finding A9): the BF16 layers are the
model's first ``num_layers_at_start_in_bf16`` and last ``num_layers_at_end_in_bf16`` by GLOBAL layer number.

megatron/core/fp8_utils.py ``is_first_last_bf16_layer(config, layer_no)``: ``layer_no < num_layers_at_start_in_bf16``
or ``layer_no >= config.num_layers - num_layers_at_end_in_bf16``, "Since layer_no is a global layer index, additional
checks on whether we are in the first or last pipeline-parallel rank are not needed"; transformer_block.py passes
``global_layer_number - 1`` (``get_transformer_layer_offset``). With VP, virtual stage j = chunk x PP + rank holds the
j-th block of layers, so on Llama-3-8B (32 layers) with PP 4, VP 4 (2 layers a chunk) and 3 + 3 BF16 layers:

    start: layers 0, 1 (chunk 0: rank 0) and 2 (chunk 1: rank 1)          -> per rank 2, 1, 0, 0
    end:   layers 29 (chunk 14: rank 2) and 30, 31 (chunk 15: rank 3)     -> per rank 0, 0, 1, 2

Before the fix all three sat on rank 0 (and rank 3): 3, 0, 0, 3. Each rank holds 8 layers of equal size, so its FP8
weight copies are (8 - its BF16 layers) / 8 of those without the knob, and its compute per micro-batch grows by one
layer's BF16-less-FP8 time per BF16 layer it holds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.estimate.stages import all_stage_layers, bf16_layers_of, pipeline_counts, stage_layers_table
from paraplan.estimate.step_time import stage_terms, stage_time
from paraplan.estimate.time.layer import layer_time
from paraplan.estimator import estimate
from paraplan.layout import LayoutTable, ParallelLayout
from paraplan.search import peak_bytes_table, step_s_table
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

LLAMA8 = load_model("llama3-8b")
H100 = load_gpu("h100-80gb")
LAYOUT = ParallelLayout(tp=1, pp=4, vp=4, dp=2, mbs=1, recompute="none", distributed_optimizer=True)
FP8 = TrainingSpec(seq_len=4096, global_batch_size=64, precision="fp8", fp8_recipe="tensorwise")
ENDS = replace(FP8, first_last_layers_bf16=True, num_layers_at_start_in_bf16=3, num_layers_at_end_in_bf16=3)


def test_bf16_layers_sit_by_global_layer_number() -> None:
    assert bf16_layers_of(ENDS) == (3, 3) and bf16_layers_of(FP8) == (0, 0)
    stages = all_stage_layers(LLAMA8, LAYOUT, bf16_layers_of(ENDS))
    assert [s.num_bf16_start_layers for s in stages] == [2, 1, 0, 0]
    assert [s.num_bf16_end_layers for s in stages] == [0, 0, 1, 2]
    assert all(s.num_bf16_start_layers == s.num_bf16_end_layers == 0 for s in all_stage_layers(LLAMA8, LAYOUT))
    # without VP the first / last stage holds them all (8 layers a stage)
    flat = all_stage_layers(LLAMA8, replace(LAYOUT, vp=1), (3, 3))
    assert [(s.num_bf16_start_layers, s.num_bf16_end_layers) for s in flat] == [(3, 0), (0, 0), (0, 0), (0, 3)]
    # an uneven split: 2 layers on the first stage, 10 on each other; 3 start layers spill onto rank 1
    uneven = all_stage_layers(LLAMA8, ParallelLayout(pp=4, dp=2, first_stage_layers=2), (3, 1))
    assert [s.num_bf16_start_layers for s in uneven] == [2, 1, 0, 0]
    assert [s.num_bf16_end_layers for s in uneven] == [0, 0, 0, 1]


def test_the_search_counts_them_as_the_scalar_path_does() -> None:
    for layout in (LAYOUT, replace(LAYOUT, vp=2), replace(LAYOUT, vp=1)):
        pp = np.array([layout.pp] * layout.pp)
        vp = np.array([layout.vp] * layout.pp)
        table = stage_layers_table(LLAMA8, pp, vp, np.arange(layout.pp),
                                   counts=pipeline_counts(LLAMA8, pp, vp, None, (3, 3)))
        scalar = all_stage_layers(LLAMA8, layout, (3, 3))
        assert np.asarray(table.num_bf16_start_layers).tolist() == [s.num_bf16_start_layers for s in scalar]
        assert np.asarray(table.num_bf16_end_layers).tolist() == [s.num_bf16_end_layers for s in scalar]


def test_fp8_weight_copies_per_stage_leave_out_the_stages_bf16_layers() -> None:
    cluster = make_cluster(H100, 8)
    # the knob with no BF16 layers: every transformer layer quantized, the embedding and output layer never
    none = replace(ENDS, num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=0)
    base = [float(s.other.fp8_weight_cache_bytes) for s in estimate(LLAMA8, cluster, none, LAYOUT).stages]
    ends = [float(s.other.fp8_weight_cache_bytes) for s in estimate(LLAMA8, cluster, ENDS, LAYOUT).stages]
    assert base[0] > 0 and base == pytest.approx([base[0]] * 4)
    assert ends == pytest.approx([base[0] * k / 8 for k in (6, 7, 7, 6)], rel=1e-12)  # not 5, 8, 8, 5


def test_compute_per_stage_adds_one_bf16_layer_time_per_bf16_layer_it_holds() -> None:
    cluster = make_cluster(H100, 8)
    bf16 = replace(FP8, precision="bf16")
    one = float(layer_time(LLAMA8, cluster, bf16, LAYOUT, moe=False).compute_s
                - layer_time(LLAMA8, cluster, FP8, LAYOUT, moe=False).compute_s)  # recompute "none": no recompute
    assert one > 0
    terms, base_terms = stage_terms(LLAMA8, cluster, ENDS, LAYOUT), stage_terms(LLAMA8, cluster, FP8, LAYOUT)
    extra = [float(stage_time(LLAMA8, cluster, ENDS, LAYOUT, s, terms).compute_s
                   - stage_time(LLAMA8, cluster, FP8, LAYOUT, replace(s, num_bf16_start_layers=0,
                                                                       num_bf16_end_layers=0), base_terms).compute_s)
             for s in all_stage_layers(LLAMA8, LAYOUT, (3, 3))]
    assert extra == pytest.approx([2 * one, one, one, 2 * one], rel=1e-9)  # not 3, 0, 0, 3


def test_the_search_and_the_estimate_agree_with_bf16_layers_under_vp() -> None:
    cluster = make_cluster(H100, 8)
    layouts = [LAYOUT, replace(LAYOUT, vp=2), replace(LAYOUT, vp=1, mbs=2)]
    table = LayoutTable.from_layouts(layouts)
    peaks = peak_bytes_table(LLAMA8, ENDS, table)
    steps = step_s_table(LLAMA8, cluster, ENDS, table)
    for layout, peak, step in zip(layouts, peaks, steps, strict=True):
        est = estimate(LLAMA8, cluster, ENDS, layout)
        assert float(peak) == pytest.approx(float(est.peak_bytes), rel=1e-9)
        assert float(step) == pytest.approx(float(est.time.step_s), rel=1e-9)
