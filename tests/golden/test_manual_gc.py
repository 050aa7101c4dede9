"""``--manual-gc`` / ``--manual-gc-interval`` (Megatron-LM d98e8a6 training.py ``train``: ``gc.disable()`` then
``gc.collect()`` every interval steps; the interval must be >= 0). Modelled as no time: no primary source gives a
collection's pause, so the step time is the same with and without it; the knob is read, written and taken from the
recipes so that nothing is silently dropped."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.errors import SpecError
from paraplan.estimator import estimate
from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import not_modelled, training_knobs
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec
from tests.launch.test_bridge import _knob_spec

LLAMA = load_model("llama3-8b")
LAYOUT = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none", distributed_optimizer=True)
BASE = TrainingSpec(seq_len=4096, global_batch_size=64)
GC = replace(BASE, manual_gc=True, manual_gc_interval=100)
FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16").split()


def test_step_time_and_memory_unchanged() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 8, 8)
    a, b = estimate(LLAMA, cluster, BASE, LAYOUT), estimate(LLAMA, cluster, GC, LAYOUT)
    assert float(a.time.step_s) == float(b.time.step_s) and a.peak_bytes == b.peak_bytes


def test_read_from_megatron_args_and_knob_words() -> None:
    got = read_flags([*FLAGS, "--manual-gc", "--manual-gc-interval", "100"]).training_fields
    assert (got["manual_gc"], got["manual_gc_interval"]) == (True, 100)
    plain = read_flags([*FLAGS, "--manual-gc-interval", "100"])
    assert "manual_gc_interval" not in plain.training_fields
    assert any("--manual-gc-interval is ignored without --manual-gc" in n for n in plain.notes)
    assert memory_knobs_from_words(["--manual-gc", "--manual-gc-interval", "5"], "bf16") == {
        "manual_gc": True, "manual_gc_interval": 5}
    with pytest.raises(SpecError, match="manual_gc_interval must be an integer >= 0"):
        TrainingSpec(**{"seq_len": 8, "global_batch_size": 8,
                        **memory_knobs_from_words(["--manual-gc", "--manual-gc-interval", "-1"], "bf16")})
    with pytest.raises(SpecError, match="manual-gc-interval"):
        memory_knobs_from_words(["--manual-gc", "--manual-gc-interval", "often"], "bf16")


def test_written_into_launch_files() -> None:
    words = argv(megatron_args(LLAMA, LAYOUT, GC), resolve=True)
    i = words.index("--manual-gc-interval")
    assert "--manual-gc" in words and words[i + 1] == "100"
    assert "--manual-gc" not in argv(megatron_args(LLAMA, LAYOUT, BASE), resolve=True)
    spec = _knob_spec(manual_gc=True, manual_gc_interval=10)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert (items["train.manual_gc"], items["train.manual_gc_interval"]) == (True, 10)
    plain = _knob_spec()
    # off is written too: the perf recipes turn it on (_benchmark_common: manual_gc True), Megatron-LM's default is off
    off = dict(overrides(plain, choose_recipe(plain)))
    assert off["train.manual_gc"] is False and "train.manual_gc_interval" not in off


def test_taken_from_the_recipes() -> None:
    recipes = [r for r in bridge_recipes() if r.get("manual_gc") is True and r.runnable]
    assert recipes
    r = recipes[0]
    knobs = training_knobs(r, "bf16")
    assert (knobs["manual_gc"], knobs["manual_gc_interval"]) == (True, r.get("manual_gc_interval"))
    assert not any("manual_gc" in str(x) for x in not_modelled(r))
