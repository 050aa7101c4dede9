"""Why NVIDIA recipes are predicted (not) to fit, by hand from the code that runs them.

- Layer-level CPU offloading, Transformer Engine ``cpu_offload.py`` (TE >= 2.10, the default code path; Megatron's
  ``get_cpu_offload_context`` passes ``num_layers`` = ``cpu_offloading_num_layers`` and ``model_layers`` =
  ``config.num_layers``): ``DefaultOffloadSynchronizer._init_offload_synchronization_dicts`` offloads layers
  0..N-1; layer i's offload starts before layer i+1's forward, its GPU copy is released before the forward of layer
  L-N+i, and its reload starts before the backward of layer L-1-N+i (``fwd_step``/``bwd_step``). Replayed below,
  the most layers resident at once, forward or backward, is L-N.
- The v1 path (``NVTE_CPU_OFFLOAD_V1=1``, ``cpu_offload_v1.py`` ``AsyncDoubleBufferGroupOffloadHandler``) releases
  group i at the commit of layer ``layer_window_map[i] = (L // N)(i + 1) - 1`` (+ the remainder): its last group
  only after the last layer's forward, L-N+1 layers. No recipe with layer-level offloading sets the variable
  (bridge_perf_recipes.csv: only fine-grained offloading recipes do), so paraplan models the default path.
- Interleaved 1F1B (megatron/core/pipeline_parallel/schedules.py ``get_pp_rank_microbatches``): rank r keeps
  ``2(p - r - 1) + (v - 1) g`` warm-up chunk micro-batches, g = ``microbatch_group_size_per_vp_stage`` (default p,
  model_parallel_config.py ``__post_init__``), capped by ``num_microbatches x v``; the first 1F1B step adds one.
- The allocator: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (c10 ``ConfigTokenizer``) drops the
  fragmentation allowance (estimate.memory ``EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.estimate.memory import (
    EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC,
    MemoryOptions,
    alloc_conf_expandable_segments,
)
from paraplan.recipes.catalogue import bridge_recipes, find_recipe
from paraplan.recipes.knobs import estimate_recipe, recipe_memory_options, recipe_run
from paraplan.units import GIB


def te_v2_resident_layers(num_layers: int, num_offloaded: int) -> int:
    """The most layers whose saved activations are on the GPU at once (forward and backward of one micro-batch),
    replaying TE's DefaultOffloadSynchronizer: offload of layer i starts at fwd_step(i + 1), finishes (GPU copy
    released) at fwd_step(L - N + i); reload starts at bwd_step(L - 1 - N + i); a layer's activations are freed when
    its backward is done."""
    L, N = num_layers, num_offloaded
    release_at: defaultdict[int, list[int]] = defaultdict(list)
    reload_at: defaultdict[int, list[int]] = defaultdict(list)
    for i in range(N):
        release_at[L - N + i].append(i)
        reload_at[L - 1 - N + i].append(i)
    on_gpu: set[int] = set()
    peak = 0
    for j in range(L):  # forward: fwd_step(j) releases, then layer j saves its activations
        on_gpu -= set(release_at[j])
        on_gpu.add(j)
        peak = max(peak, len(on_gpu))
    for k in range(L - 1, -1, -1):  # backward: bwd_step(k) starts reloads, layer k runs, then frees
        on_gpu |= set(reload_at[k])
        assert k in on_gpu, "the layer's activations are back before its backward"
        peak = max(peak, len(on_gpu))
        on_gpu.discard(k)
    return peak


def te_v1_resident_layers(num_layers: int, num_offloaded: int) -> int:
    """The same for TE's v1 path: group i's memory is freed at the commit of layer ``layer_window_map[i]``
    (``AsyncDoubleBufferGroupOffloadHandler.__init__`` / ``synchronize_on_group_commit_forward``), i.e. after
    that layer's forward."""
    L, N = num_layers, num_offloaded
    window, constant = {}, 0
    for i in range(N):
        window[i] = (L // N) * (i + 1) - 1
        if i < L % N:
            window[i] += i + 1
            constant = i + 1
        else:
            window[i] += constant
    on_gpu: set[int] = set()
    peak = 0
    for j in range(L):
        on_gpu.add(j)
        peak = max(peak, len(on_gpu))
        on_gpu -= {i for i in range(N) if window[i] == j}
    return peak


@pytest.mark.parametrize(("layers", "offloaded"), [(80, 40), (80, 30), (80, 20), (80, 5), (32, 8), (7, 3)])
def test_te_v2_offload_keeps_l_minus_n_layers_forward_and_backward(layers: int, offloaded: int) -> None:
    assert te_v2_resident_layers(layers, offloaded) == layers - offloaded
    assert te_v1_resident_layers(layers, offloaded) == layers - offloaded + 1


def _by_alias(alias: str):  # type: ignore[no-untyped-def]
    return next(r for r in bridge_recipes() if r.alias == alias)


@pytest.mark.parametrize(("alias", "offloaded"), [("llama3-70b-gb200-fp8cs-32", 40), ("llama3-70b-gb300-bf16-32", 30),
                                                  ("llama3-70b-gb300-fp8cs-32", 20)])
def test_recipe_offload_keeps_the_te_v2_count(alias: str, offloaded: int) -> None:
    """The 32-GPU Llama-3-70B recipes (the 64-GPU recipe with GBS 128, "legacy-scaled"): their activations are the
    (L - N) layers TE keeps, so without offloading they are L / (L - N) times larger, less the same non-layer terms."""
    r = _by_alias(alias)
    assert r.get("cpu_offloading") is True and r.get("cpu_offloading_num_layers") == offloaded
    assert "NVTE_CPU_OFFLOAD_V1" not in str(r.get("other_env"))  # the default (v2) path runs
    run = recipe_run(r)
    on = estimate_recipe(r)
    from paraplan.recipes.knobs import estimate_run, training_knobs

    def kept(n: int) -> float:
        knobs = {**training_knobs(r, run.job.precision), "cpu_offloading_num_layers": n}
        return float(estimate_run(run, knobs=knobs).stages[0].memory.activations_bytes)

    L = on.model.num_layers
    kept_on, kept_off, kept_half = float(on.stages[0].memory.activations_bytes), kept(0), kept(offloaded // 2)
    assert kept(offloaded) == kept_on
    # L - N layers stay (v2): what offloading N layers saves is N layers' worth, linear in N; v1's L - N + 1 would
    # save N - 1 layers' worth, and the ratio would be (N - 1) / (N/2 - 1)
    assert (kept_off - kept_on) / (kept_off - kept_half) == pytest.approx(offloaded / (offloaded // 2))
    per_layer = (kept_off - kept_on) / offloaded
    if r.get("precision") == "bf16":  # by hand, as test_offload_memory (bf16, no TP, flash, SwiGLU, GQA 8 groups)
        T, h, f, q, kv, heads = 8192 * 2, 8192, 28672, 8192, 8 * 128, 64
        attn = 2 * T * h + 2 * T * h + 2 * T * (q + 2 * kv) + 2 * T * q + 4 * heads * T
        mlp = 2 * T * h + 2 * T * h + 2 * T * 2 * f + 2 * T * f
        assert run.layout.mbs == 2 and per_layer == pytest.approx(attn + mlp)
    assert per_layer > 1 * GIB
    assert te_v2_resident_layers(L, offloaded) == L - offloaded
    # the allocator: no PYTORCH_CUDA_ALLOC_CONF in these recipes, so the 5% allowance stays
    assert r.get("PYTORCH_CUDA_ALLOC_CONF") in ("", None)
    frag = float(on.stages[0].other.fragmentation_bytes)
    dynamic = kept_on + float(on.stages[0].other.logits_bytes)
    assert frag == pytest.approx(MemoryOptions().fragmentation_frac * dynamic)


def test_405b_interleaved_in_flight_by_hand() -> None:
    """tp4 pp16 vp8, GBS 768, mbs 1, dp 2: 384 micro-batches, 126 layers + embedding + loss = 128 = 16 x 8 one-layer
    chunks. Rank 1 (the peak: rank 0's first chunk is the embedding alone) keeps 2(16 - 1 - 1) + 7 x 16 + 1 = 141
    chunk micro-batches; 384 x 8 is no cap. Each holds one decoder layer's activations."""
    r = _by_alias("llama3.1-405b-gb200-bf16-128")
    est = estimate_recipe(r)
    lay = est.layout
    assert (lay.tp, lay.pp, lay.vp, lay.cp, lay.dp, lay.mbs) == (4, 16, 8, 1, 2, 1)
    p, v, g, m = 16, 8, 16, 768 // (2 * 1)
    warmup = min(2 * (p - 1 - 1) + (v - 1) * g, m * v)
    assert est.peak_stage == 1
    assert float(est.stages[1].in_flight) == warmup + 1 == 141
    # rank 0: 2(p - 1) + (v - 1) g + 1 = 143 chunk micro-batches, but its first chunk has no decoder layer
    assert float(est.stages[0].in_flight) == 2 * (p - 1) + (v - 1) * g + 1
    assert float(est.stages[0].memory.activations_bytes) < float(est.stages[1].memory.activations_bytes)


def test_405b_gb200_256_fits_once_expandable_segments_are_read() -> None:
    """The 256-GPU bf16 recipe ran (published tp4 pp16 vp8 rows on 256 GB200): with the allocator it sets, the
    fragmentation allowance (5% of 140 GiB) is gone and it fits; the 128-GPU recipe (dp 2: twice the optimizer
    shard) does not, by the activations of 141 chunks in flight."""
    r = _by_alias("llama3.1-405b-gb200-bf16-256")
    assert alloc_conf_expandable_segments(str(r.get("PYTORCH_CUDA_ALLOC_CONF")))
    est = estimate_recipe(r)
    run = recipe_run(r)
    from paraplan.recipes.knobs import estimate_run

    old = estimate_run(run, memory_options=MemoryOptions())
    st, st_old = est.stages[est.peak_stage], old.stages[old.peak_stage]
    assert float(st.other.fragmentation_bytes) == EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC == 0.0
    dynamic = float(st_old.memory.activations_bytes + st_old.other.logits_bytes)
    assert old.peak_bytes - est.peak_bytes == pytest.approx(MemoryOptions().fragmentation_frac * dynamic)
    assert est.fits and not old.fits
    assert any("expandable segments" in n for n in est.notes)
    small = estimate_recipe(_by_alias("llama3.1-405b-gb200-bf16-128"))
    assert not small.fits
    act = float(small.stages[1].memory.activations_bytes)
    assert act > 0.7 * small.usable_bytes  # 141 x 0.99 GiB = 140 GiB of 183 GiB usable
    assert small.peak_bytes - small.usable_bytes > 10 * GIB


@pytest.mark.parametrize(("conf", "on"), [
    ("", False), ("expandable_segments:True", True), ("expandable_segments:False", False),
    ("expandable_segments:True,graph_capture_record_stream_reuse:True", True), (" expandable_segments : True ", True),
    ("max_split_size_mb:128", False), ("roundup_power2_divisions:[64:8,>:1],expandable_segments:True", True),
    ("expandable_segments:True,expandable_segments:False", False),
])
def test_alloc_conf_parsed_as_pytorch_tokenizes_it(conf: str, on: bool) -> None:
    assert alloc_conf_expandable_segments(conf) is on


@pytest.mark.parametrize("conf", ["expandable_segments:true", "expandable_segments", "expandable_segments:1"])
def test_alloc_conf_value_pytorch_refuses_is_one_clear_error(conf: str) -> None:
    with pytest.raises(SpecError, match="expandable_segments must be True or False"):
        alloc_conf_expandable_segments(conf)


def test_recipe_allocator_column_is_read_and_a_bad_one_names_the_column() -> None:
    r = _by_alias("llama3.1-405b-gb200-bf16-256")
    assert recipe_memory_options(r).expandable_segments
    assert not recipe_memory_options(_by_alias("llama3-70b-gb200-fp8cs-32")).expandable_segments
    bad = replace(r, fields={**r.fields, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:yes"})
    with pytest.raises(SpecError, match="expandable_segments must be True or False"):
        recipe_memory_options(bad)
    base = MemoryOptions(workspace_bytes=1.0 * GIB)
    assert recipe_memory_options(r, base).workspace_bytes == 1.0 * GIB


def test_cli_estimate_recipe_reads_the_allocator_and_fragmentation_flag_wins(capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    name = "llama3.1-405b-gb200-bf16-256"
    assert find_recipe(name, bridge_recipes()).alias == name
    outs = []
    for extra in ([], ["--fragmentation", "0.05"]):
        code = main(["estimate", "--recipe", name, "--format", "json", *extra])
        out, _ = capsys.readouterr()
        assert code in (0, 4)
        outs.append(json.loads(out))
    frag = [o["memory"]["per_stage"][1]["other_parts"]["fragmentation_bytes"] for o in outs]
    assert frag[0] == 0.0 and frag[1] > 5 * GIB
    assert any("expandable segments" in n for n in outs[0]["notes"])
    assert not any("expandable segments" in n for n in outs[1]["notes"])


def test_explain_names_the_in_flight_activations_in_numbers() -> None:
    """plan/explain's memory mechanism (recipes.compare) gives each side's peak-stage activations as the schedule's
    in-flight count x bytes per chunk."""
    from paraplan.recipes.compare import _memory_mechanism

    rec = estimate_recipe(_by_alias("llama3.1-405b-gb200-bf16-128"))
    pick = estimate_recipe(_by_alias("llama3.1-405b-gb200-bf16-256"))
    text = _memory_mechanism("activations", rec, pick)
    per = float(rec.stages[1].memory.activations_bytes) / 141 / GIB
    assert f"recipe 141 chunk micro-batches x {per:.2f} GiB = " in text and "on stage 1" in text


def test_expandable_segments_never_raise_memory_and_change_only_fragmentation() -> None:
    """Over the library's runnable recipes that set expandable segments (every 7th, for time): the allocator setting
    lowers the peak by exactly the fragmentation allowance and moves no other term."""
    from paraplan.errors import PlannerError
    from paraplan.recipes.knobs import estimate_run

    seen = 0
    for r in [x for x in bridge_recipes() if x.runnable and "expandable_segments:True" in str(
            x.get("PYTORCH_CUDA_ALLOC_CONF"))][::7]:
        try:
            run = recipe_run(r)
            on, off = estimate_run(run), estimate_run(run, memory_options=MemoryOptions())
        except PlannerError:
            continue
        seen += 1
        for a, b in zip(on.stages, off.stages, strict=True):
            assert float(a.other.fragmentation_bytes) == 0.0
            assert float(b.memory.total_bytes - a.memory.total_bytes) == pytest.approx(
                float(b.other.fragmentation_bytes), rel=1e-9, abs=1.0)
            assert float(a.memory.activations_bytes) == float(b.memory.activations_bytes)
        assert on.peak_bytes <= off.peak_bytes
    assert seen >= 10


def test_a_user_recipe_with_an_allocator_value_pytorch_refuses_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.yaml"
    row = ("recipes:\n  - {source: 'mine.py:llama8', model: llama3_8b, gpu: h100, num_gpus: 8, precision: bf16, "
           "seq_length: 8192, global_batch_size: 128, micro_batch_size: 1, tp: 1, pp: 1, cp: 1, dp: 8, "
           "PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:%s'}\n")
    path.write_text(row % "yes")
    assert main(["estimate", "--recipes", str(path), "--recipe", "mine.py:llama8"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "row 1" in err and "expandable_segments must be True or False" in err
    path.write_text(row % "True")
    assert main(["estimate", "--recipes", str(path), "--recipe", "mine.py:llama8", "--format", "json"]) in (0, 4)
    assert any("expandable segments" in n for n in json.loads(capsys.readouterr().out)["notes"])
