"""Megatron-FSDP: its communication per layer, pass and chunk (estimate/time/fsdp.py), its prefetch memory, and
the default search scope (where NVIDIA runs it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.cli import main
from paraplan.estimate.memory import FSDP_AG_PREFETCH_PARAMS, fsdp_weight_units_in_flight
from paraplan.estimate.time import fsdp
from paraplan.estimator import estimate
from paraplan.layout import layout_for_world
from paraplan.search import SearchSpace, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


def test_exposed_per_microbatch_by_hand() -> None:
    # 4 units, 1 chunk: g = 8/4 = 2, r = 16/4 = 4; windows per unit wf = 12/4 = 3, wb = 20/4 = 5
    # forward: the first gather 2 + 3 x max(2 - 3, 0) = 2; backward: 2 + 3 x max(2 + 4 - 5, 0) = 5
    assert fsdp.exposed_per_microbatch_s(8.0, 16.0, 12.0, 20.0, 4.0, 1.0) == pytest.approx(7.0)
    # 2 chunks: two first gathers per pass, 2 units left: forward 4 + 0, backward 4 + 2 x 1 + 2 x max(4 - 5, 0)
    assert fsdp.exposed_per_microbatch_s(8.0, 16.0, 12.0, 20.0, 4.0, 2.0) == pytest.approx(10.0)
    # a backward window of 12 (3 per unit): the chunk's last reduce-scatter is exposed by 4 - 3 = 1 per chunk
    assert fsdp.exposed_per_microbatch_s(8.0, 16.0, 12.0, 12.0, 4.0, 2.0) == pytest.approx(4 + 4 + 2 * 3 + 2 * 1)


def test_exposed_per_step_adds_the_last_reduce_scatter_and_splits_the_windows() -> None:
    # stage 9 s, recompute 3 s, overlap 1: forward window (9 - 3) / 3 = 2, backward 7; 2 units, 1 chunk, m = 3
    # per micro-batch: forward 1 + max(1 - 1, 0) = 1; backward 1 + max(1 + 2 - 3.5, 0) = 1; + r = 2 once
    assert fsdp.exposed_s(2.0, 4.0, 9.0, 3.0, 1.0, 2.0, 1.0, 3.0) == pytest.approx(3 * 2.0 + 2.0)
    assert fsdp.link_s(2.0, 4.0, 3.0) == pytest.approx(3 * (2 * 2.0 + 4.0))


finite = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@given(gather=finite, grad=finite, fwd=finite, bwd=finite, units=st.integers(1, 200), chunks=st.integers(1, 8),
       more=st.floats(min_value=0.0, max_value=1e3))
def test_exposed_is_bounded_by_the_link_and_falls_with_compute(gather: float, grad: float, fwd: float, bwd: float,
                                                                units: int, chunks: int, more: float) -> None:
    e = fsdp.exposed_per_microbatch_s(gather, grad, fwd, bwd, units, chunks)
    assert 0.0 <= e <= 2 * gather + grad + 1e-9
    # never below the first gathers of each chunk and pass, never more with more compute beside it
    assert e >= 2 * min(chunks, units) * gather / units - 1e-9
    assert fsdp.exposed_per_microbatch_s(gather, grad, fwd + more, bwd + more, units, chunks) <= e + 1e-9
    # more chunks (VP) never hide more
    assert fsdp.exposed_per_microbatch_s(gather, grad, fwd, bwd, units, chunks + 1) >= e - 1e-9


def _llama70b(tp: int, pp: int, vp: int, cp: int) -> tuple[float, float]:
    model = load_model("llama3-70b")
    cluster = make_cluster(load_gpu("h100-80gb"), 64)
    tr = TrainingSpec(seq_len=8192, global_batch_size=512)
    est = estimate(model, cluster, tr, layout_for_world(64, tp=tp, pp=pp, vp=vp, cp=cp, fsdp=True,
                                                        distributed_optimizer=False))
    return float(est.time.exposed_comm_s["dp"]), float(est.time.link_comm_s["dp"])


def test_vp_chunks_expose_their_first_gathers() -> None:
    """Near the issue's pick (tp2 pp2 vp6 cp2 dp8 FSDP on 64 H100), VP 5: the same traffic as without VP, but five FSDP
    instances per rank, each waiting for its first layer's gather in forward and backward of every micro-batch."""
    vp5, link5 = _llama70b(2, 2, 5, 2)
    vp1, link1 = _llama70b(2, 2, 1, 2)
    assert link5 == pytest.approx(link1)
    # at least the first-layer gathers: 64 micro-batches x 2 passes x 5 chunks (of the 40 layers on the rank)
    m, units = 512 // 8, 40
    gather_per_layer = link1 / (m * 4) / units  # link = m (2 gather + fp32 reduce-scatter = 2 gathers' bytes)
    assert vp5 > vp1 >= m * 2 * 1 * gather_per_layer
    assert vp5 >= m * 2 * 5 * gather_per_layer
    assert vp5 > 0.1 * link5  # no longer "97% hidden"


def test_prefetch_holds_the_layers_up_to_500m_elements_by_hand() -> None:
    assert FSDP_AG_PREFETCH_PARAMS == 500_000_000
    # Llama-3-8B layer at TP 1: 4096 x (4096 + 2 x 1024 + 4096) + 3 x 4096 x 14336 + 2 x 4096 = 218,112,000:
    # ceil(5e8 / 2.18e8) = 3 prefetched + the one computing
    unit = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    assert unit == 218_112_000
    assert float(fsdp_weight_units_in_flight(unit, 32)) == 4.0
    assert float(fsdp_weight_units_in_flight(unit, 3)) == 3.0  # not beyond the chunk
    assert float(fsdp_weight_units_in_flight(unit, 1)) == 1.0
    assert float(fsdp_weight_units_in_flight(856_000_000, 80)) == 2.0  # a Llama-3-70B layer: one prefetched
    model = load_model("llama3-8b")
    est = estimate(model, make_cluster(load_gpu("h100-80gb"), 8), TrainingSpec(seq_len=4096, global_batch_size=64),
                   layout_for_world(8, fsdp=True, distributed_optimizer=False))
    st0 = est.stages[0]
    per_layer = float(st0.params.layers_dense) / model.num_layers
    assert per_layer == pytest.approx(unit)
    # 4 gathered bf16 layers + 2 layers of fp32 gradients + the non-unit modules kept gathered in bf16
    assert float(st0.other.fsdp_buffers_bytes) == pytest.approx((4 * 2 + 2 * 4) * unit + NON_UNIT_8B)


@pytest.mark.parametrize(("tp", "pp", "cp", "arch", "ok"), [
    (1, 1, 1, "hopper", True), (2, 1, 1, "hopper", False), (1, 2, 1, "hopper", False), (1, 1, 2, "hopper", False),
    (2, 1, 1, "blackwell", True), (4, 1, 1, "blackwell", False), (1, 2, 1, "blackwell", False),
    (1, 1, 2, "blackwell", False)])
def test_benchmarked_scope(tp: int, pp: int, cp: int, arch: str, ok: bool) -> None:
    assert bool(fsdp.benchmarked(tp, pp, cp, arch)) is ok


def _fsdp_rows(p: object) -> list[object]:
    table = p.feasible.table  # type: ignore[attr-defined]
    return [table.row(i) for i in np.flatnonzero(table.fsdp)]


def test_plan_searches_fsdp_by_default_only_where_nvidia_runs_it() -> None:
    model, tr = load_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch_size=256)
    for gpu, tp_max in (("h100-80gb", 1), ("b200", 2)):
        cluster = make_cluster(load_gpu(gpu), 16)
        p = plan(model, cluster, tr, top_k=3)
        rows = _fsdp_rows(p)
        assert rows and all(r.pp == 1 and r.cp == 1 and r.tp <= tp_max for r in rows)  # type: ignore[attr-defined]
        left = p.rejections["FSDP_NOT_BENCHMARKED"]
        assert left > 0 and any(f"Megatron-FSDP left out of {left:,} layouts" in n for n in p.notes)
        wide = plan(model, cluster, tr, top_k=3, space=SearchSpace(fsdp_everywhere=True))
        assert "FSDP_NOT_BENCHMARKED" not in wide.rejections
        assert any(r.pp > 1 or r.tp > tp_max for r in _fsdp_rows(wide))  # type: ignore[attr-defined]
        assert wide.num_evaluated == p.num_evaluated


def test_dp_variant_fsdp_on_the_cli_searches_it_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    job = ["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "256", "--format", "json"]
    assert main(job) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["rejections"]["FSDP_NOT_BENCHMARKED"] > 0
    assert any("--dp-variant fsdp" in n for n in default["notes"])
    for variants in ("fsdp", "distopt,fsdp"):
        assert main([*job, "--dp-variant", variants]) == 0
        assert "FSDP_NOT_BENCHMARKED" not in json.loads(capsys.readouterr().out)["rejections"]
    assert main([*job, "--dp-variant", "distopt"]) == 0
    assert "FSDP_NOT_BENCHMARKED" not in json.loads(capsys.readouterr().out)["rejections"]
    assert main([*job, "--dp-variant", "zero3"]) == 1  # one line naming the allowed values
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "distopt" in err and "fsdp" in err and "ddp" in err


def test_explain_says_what_fsdp_costs_and_what_was_left_out() -> None:
    from paraplan.explain import explain

    model, tr = load_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch_size=64)
    # Megatron-FSDP only (in the default search the distributed optimizer's tp2 dp4 wins the (about 12%) tier by rule 2)
    p = plan(model, make_cluster(load_gpu("h100-80gb"), 8), tr, top_k=2, space=SearchSpace(dp_variants=("fsdp",)))
    found = [f for f in explain(p) if f.code == "MEGATRON_FSDP"]
    assert len(found) == 1
    f = found[0]
    assert f.numbers["left_out"] == p.rejections["FSDP_NOT_BENCHMARKED"] > 0
    assert f"left out of {f.numbers['left_out']:,} layouts" in f.text and "--dp-variant fsdp" in f.text
    best = p.candidates[0]
    assert best.layout.fsdp and best.layout.pp == 1  # TP 1 DP 8 FSDP: within the scope; its traffic as estimated
    assert f.numbers["link_s"] == pytest.approx(float(best.time.link_comm_s["dp"]))
    assert f.numbers["exposed_s"] == pytest.approx(float(best.time.exposed_comm_s["dp"]))
    assert f.numbers["num_microbatches"] == 64 // (best.layout.mbs * best.layout.dp)
    wide = plan(model, make_cluster(load_gpu("h100-80gb"), 8), tr, top_k=2,
                space=SearchSpace(dp_variants=("distopt",)))
    assert [f for f in explain(wide) if f.code == "MEGATRON_FSDP"] == []  # no FSDP searched, none picked


# --fsdp-double-buffer (TrainingSpec.fsdp_double_buffer) ------------------------------------------------------------

def _8b_fsdp(**knobs: object) -> float:
    model = load_model("llama3-8b")
    est = estimate(model, make_cluster(load_gpu("h100-80gb"), 8),
                   TrainingSpec(seq_len=4096, global_batch_size=64, **knobs),  # type: ignore[arg-type]
                   layout_for_world(8, fsdp=True, distributed_optimizer=False))
    return float(est.stages[0].other.fsdp_buffers_bytes)


def test_double_buffer_holds_two_layers_by_hand() -> None:
    unit = 218_112_000  # a Llama-3-8B layer at TP 1 (test_prefetch_holds_the_layers_up_to_500m_elements_by_hand)
    # 2 bf16 + 2 fp32 grad layers, and the non-unit modules (not double-buffered)
    assert _8b_fsdp(fsdp_double_buffer=True) == pytest.approx((2 * 2 + 2 * 4) * unit + NON_UNIT_8B)
    assert _8b_fsdp() == pytest.approx((4 * 2 + 2 * 4) * unit + NON_UNIT_8B)


NON_UNIT_8B = 2 * (128256 * 4096 + 4096 * 128256 + 4096)
"""Llama-3-8B's modules outside Megatron-FSDP's units at TP 1, gathered in bf16 and kept
(``fsdp_non_unit_weight_bytes``): the word embedding V x h, the untied output layer h x V and the final RMSNorm h
(V = 128256, already a multiple of 128)."""


def test_fsdp_keeps_the_non_unit_modules_gathered_by_hand() -> None:
    """Megatron-FSDP releases only its units (transformer layers) after their forward; the embedding, output layer and
    final norm stay gathered across the step (``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``): 2 B x their
    parameters on the GPU beside the shard, under FP8 parameter gather too (they are not FP8), and 0 without FSDP."""
    from paraplan.estimate.memory import fsdp_non_unit_weight_bytes

    model = load_model("llama3-8b")
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    for knobs in ({}, {"precision": "fp8", "fp8_param_gather": True, "fp8_recipe": "tensorwise"}):
        tr = TrainingSpec(seq_len=4096, global_batch_size=64, **knobs)  # type: ignore[arg-type]
        st0 = estimate(model, cluster, tr, layout_for_world(8, fsdp=True, distributed_optimizer=False)).stages[0]
        assert float(fsdp_non_unit_weight_bytes(st0.params)) == pytest.approx(NON_UNIT_8B)
        ddp = estimate(model, cluster, tr, layout_for_world(8)).stages[0]
        assert float(ddp.other.fsdp_buffers_bytes) == 0.0


@pytest.mark.parametrize("num_gpus", [8, 16, 64])
@pytest.mark.parametrize("model_name", ["llama3-8b", "llama3-70b", "qwen3-30b-a3b"])
def test_double_buffer_never_raises_memory(model_name: str, num_gpus: int) -> None:
    model, cluster = load_model(model_name), make_cluster(load_gpu("b200"), num_gpus)
    lay = layout_for_world(num_gpus, fsdp=True, distributed_optimizer=False, recompute="full")
    off = estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=256), lay)
    on = estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=256, fsdp_double_buffer=True), lay)
    assert on.peak_bytes <= off.peak_bytes
    assert float(on.time.step_s) == pytest.approx(float(off.time.step_s))  # prefetch is one layer ahead either way


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
         "--micro-batch-size 1 --global-batch-size 8 --bf16 --use-megatron-fsdp "
         "--data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor").split()


def test_double_buffer_read_from_megatron_args_and_written_back() -> None:
    from paraplan.launch.megatron import argv, megatron_args
    from paraplan.specs.megatron_flags import read_flags

    assert "fsdp_double_buffer" not in read_flags(FLAGS).training_fields
    for extra in (["--fsdp-double-buffer"], ["--use-nccl-ub"], ["--megatron-fsdp-max-pool-double-buffer"]):
        assert read_flags([*FLAGS, *extra]).training_fields["fsdp_double_buffer"] is True, extra
    no_fsdp = [f for f in FLAGS if f != "--use-megatron-fsdp"][:-4]
    assert "fsdp_double_buffer" not in read_flags([*no_fsdp, "--use-nccl-ub"]).training_fields
    model = load_model("llama3-8b")
    lay = layout_for_world(8, fsdp=True, distributed_optimizer=False)
    on = TrainingSpec(seq_len=4096, global_batch_size=64, fsdp_double_buffer=True)
    words = argv(megatron_args(model, lay, on), resolve=True)
    assert "--fsdp-double-buffer" in words
    assert read_flags(words).training_fields["fsdp_double_buffer"] is True
    off = argv(megatron_args(model, lay, TrainingSpec(seq_len=4096, global_batch_size=64)), resolve=True)
    assert "--fsdp-double-buffer" not in off


def test_double_buffer_from_the_cli_knob_and_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.knobs import training_knobs

    job = ["estimate", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--fsdp",
           "--format", "json"]
    assert main(job) == 0
    base = json.loads(capsys.readouterr().out)["memory"]["per_stage"][0]
    assert main([*job, "--knob", "fsdp-double-buffer"]) == 0
    knob = json.loads(capsys.readouterr().out)["memory"]["per_stage"][0]
    assert base["other_bytes"] - knob["other_bytes"] == pytest.approx(2 * 2 * 218_112_000)  # two bf16 layers fewer
    recipe = find_recipe("llama3-70b-gb200-bf16-64", bridge_recipes())
    assert recipe.get("use_megatron_fsdp") is True and recipe.get("fsdp_double_buffer") is True
    assert training_knobs(recipe, "bf16")["fsdp_double_buffer"] is True
    dsv3 = find_recipe("deepseek-v3-gb300-bf16-64-fsdp", bridge_recipes())
    assert "fsdp_double_buffer" not in training_knobs(dsv3, "bf16")
