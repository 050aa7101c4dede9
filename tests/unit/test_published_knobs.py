"""benchmarks/published_cases.py: which Megatron-Bridge rows run with their recipe's MoE knobs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
published_cases = pytest.importorskip("published_cases")

NEEDS_SHARED = pytest.mark.skipif(not (published_cases.SHARED / "published_runs.csv").is_file(),
                                  reason="../shared/calibration is absent")


def test_row_container_reads_the_notes() -> None:
    assert published_cases.row_container("container NeMo 26.06.01; task=Pre-Training Performance") == "26.06.01"
    assert published_cases.row_container("container NeMo 26.08; GB300 NVL72") == "26.08"
    assert published_cases.row_container("Megatron-LM README table") is None


@NEEDS_SHARED
def test_knobs_only_for_bridge_rows_matched_to_their_release_config() -> None:
    from paraplan.specs.training import TrainingSpec

    matches = {m.row: m for m in published_cases.release_config_matches()}
    cases, _ = published_cases.load_cases("published")
    with_knobs = [c for c in cases if c.knobs]
    assert len(with_knobs) >= 80, "most Bridge rows with a preset should match a config of their release"
    tags = {r["container"]: r["tag"] for r in published_cases.release_configs()["releases"]}
    for c in cases:
        m = matches.get(int(c.id.split(":")[1]))
        if c.knobs and c.knobs == published_cases.TOKENDROP_KNOBS:  # a "(tokendrop)" row without a release config
            assert c.source == "Megatron-Bridge"
            continue
        if c.knobs:
            assert c.source == "Megatron-Bridge" and m is not None and m.config is not None
            assert m.config["container"] == m.container and m.config["tag"] == tags[m.container]
            TrainingSpec(seq_len=c.seq_len, global_batch_size=c.gbs, precision=c.precision, **c.knobs)  # valid
        else:
            assert m is None or m.config is None
            assert "schedule" not in c.layout


@NEEDS_SHARED
def test_every_container_of_the_bridge_rows_has_a_release() -> None:
    containers = {m.container for m in published_cases.release_config_matches()}
    tags = {r["container"] for r in published_cases.release_configs()["releases"]}
    assert containers <= tags


@NEEDS_SHARED
def test_deepseek_gb300_mxfp8_runs_hybridep_with_the_overlap_schedule() -> None:
    # bridge_perf_recipes.csv deepseek_v3 gb300 256 fp8_mx (tp1 pp2 vp8 ep32): flex, hybridep, moe_a2a_overlap True,
    # delay_wgrad_compute True; the 26.08 summary's first row is that job
    cases, _ = published_cases.load_cases("published")
    c = next(c for c in cases if c.id == "published:0000")
    assert (c.label, c.gpu, c.layout["pp"], c.layout["vp"], c.layout["ep"]) == ("DeepSeek-V3", "gb300", 2, 8, 32)
    assert c.knobs["moe_token_dispatcher_type"] == "flex"
    assert c.knobs["moe_flex_dispatcher_backend"] == "hybridep"
    assert c.knobs["delay_wgrad_compute"] is True
    assert c.knobs["cuda_graph_impl"] == "full_iteration"  # cuda_graph_impl full_iteration in the recipe
    assert c.layout["schedule"] == "combined_1f1b"


@NEEDS_SHARED
def test_same_job_runs_each_release_s_own_knobs() -> None:
    # row 77: Qwen3-30B-A3B GB200 x8 ep8 mbs4 fp8-mx in NeMo 26.04 (Bridge v0.4.0): qwen3_workload_base_configs.py
    # QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1 sets moe_flex_dispatcher_backend="hybridep",
    # cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router", "moe_preprocess"] and no moe_a2a_overlap;
    # row 15: the same job in 26.06.01 (v0.5.1) adds moe_a2a_overlap=True, cuda_graph_impl="full_iteration" and
    # fp8_dot_product_attention=True
    cases, _ = published_cases.load_cases("published")
    old = next(c for c in cases if c.id == "published:0077")
    new = next(c for c in cases if c.id == "published:0015")
    assert (old.label, old.gpu, old.layout["ep"], old.layout["mbs"]) == (new.label, new.gpu, 8, 4)
    assert old.knobs["moe_token_dispatcher_type"] == "flex" and old.knobs["moe_flex_dispatcher_backend"] == "hybridep"
    assert old.knobs["cuda_graph_impl"] == "transformer_engine"
    assert old.knobs["cuda_graph_modules"] == ("moe_router", "moe_preprocess")
    assert old.knobs["fp8_dot_product_attention"] is False and "schedule" not in old.layout
    assert "delay_wgrad_compute" not in old.knobs
    assert new.knobs["cuda_graph_impl"] == "full_iteration" and new.knobs["fp8_dot_product_attention"] is True
    assert new.knobs["delay_wgrad_compute"] is True and new.layout["schedule"] == "combined_1f1b"
    # both: set_qwen3_common_configs' grad_reduce_in_fp32 = False; the MXFP8 preset's fp8_param_gather = True
    for c in (old, new):
        assert c.knobs["grad_reduce_in_bf16"] is True and c.knobs["fp8_param_gather"] is True
        assert c.knobs["fp8_recipe"] == "mxfp8"


@NEEDS_SHARED
def test_rows_whose_release_has_no_matching_config_keep_megatron_defaults() -> None:
    unmatched = [m for m in published_cases.release_config_matches() if m.config is None]
    assert unmatched
    cases, _ = published_cases.load_cases("published")
    by_row = {int(c.id.split(":")[1]): c for c in cases}
    for m in unmatched:
        if m.row in by_row:  # Megatron's defaults, with --use_tokendrop's capacity on the "(tokendrop)" rows
            assert by_row[m.row].knobs in ({}, published_cases.TOKENDROP_KNOBS)


@NEEDS_SHARED
def test_tokendrop_rows_run_drop_and_pad() -> None:
    # Bridge scripts/performance/utils/overrides.py: --use_tokendrop -> apply_moe_token_drop(recipe.model), whose
    # defaults are moe_expert_capacity_factor=1.0 and moe_pad_expert_input_to_capacity=True
    cases, _ = published_cases.load_cases("published")
    dropped = [c for c in cases if c.knobs.get("moe_pad_expert_input_to_capacity")]
    assert len(dropped) == 7  # the seven "(tokendrop)" rows of the tables (GB200 x4, B200 x3)
    for c in dropped:
        assert c.knobs["moe_expert_capacity_factor"] == 1.0 and c.source == "Megatron-Bridge"


def test_25_09_rows_without_a_precision_column_take_the_page_note_s_fp8_recipe() -> None:
    primary = {"precision": "", "notes": "container NeMo 25.09; precision column absent for 25.09"}
    paren = {"precision": "", "notes": "container NeMo 25.09; row built from the parenthesized values of this table "
                                       "row; precision column absent for 25.09"}
    assert published_cases._row_precisions(primary, "gb200") == ("fp8_ds", "fp8_cs")
    assert published_cases._row_precisions(paren, "gb200") == ("fp8_mx",)
    assert published_cases._row_precisions(paren, "h100") == ("fp8_sc",)
    assert published_cases._row_precisions({"precision": "mxfp8", "notes": ""}, "gb200") == ("fp8_mx",)
    assert published_cases._row_precisions({"precision": "", "notes": ""}, "gb200") is None  # any


@NEEDS_SHARED
def test_release_match_lines_count_every_bridge_row() -> None:
    lines = published_cases.release_match_lines()
    matches = published_cases.release_config_matches()
    head = lines[0]
    ok = sum(m.config is not None for m in matches)
    assert head.startswith(f"bridge rows with release knobs: {ok} matched")
    assert len(lines) == 1 + len({m.container for m in matches})


def test_documented_regression_names_its_container_and_model_only() -> None:
    src = published_cases.BRIDGE_SOURCE
    row = {"source": src, "model": "gpt-oss-120B", "notes": "container NeMo 26.06.01; task=Pre-Training Performance"}
    why = published_cases.documented_regression(row)
    assert "performance-summary-archive.md" in why and "cudnn-frontend#256" in why
    assert published_cases.documented_regression({**row, "notes": "container NeMo 26.06; task=Pre-Training"}) == ""
    assert published_cases.documented_regression({**row, "model": "DeepSeek-V3"}) == ""
    assert published_cases.documented_regression({**row, "source": "NVIDIA/NeMo performance summary"}) == ""


@NEEDS_SHARED
def test_rows_of_a_documented_regression_are_kept_apart_not_dropped() -> None:
    # archive 26.06.01 GPT OSS 120B: GB300 x64 ep16 20288 and GB200 x64 ep64 18304 tokens/s/GPU, both with the
    # [^gpt-oss-note] footnote (cudnn-frontend#256)
    scored, skipped = published_cases.load_cases("published")
    every, _ = published_cases.load_cases("published", include_excluded=True)
    out = [c for c in every if c.excluded]
    assert sorted(c.id for c in out) == ["published:0012", "published:0013"]
    assert all(c.label == "gpt-oss-120B" and c.knobs for c in out)  # still joined to their release config
    assert {c.id for c in every} - {c.id for c in scored} == {c.id for c in out}
    assert skipped["documented software regression"] == 2
    sys.path.insert(0, str(ROOT / "src"))
    import calibration

    lines = calibration.excluded_lines()
    assert "2 rows" in lines[0] and any("published:0012" in x for x in lines)
    assert any("cudnn-frontend#256" in x for x in lines)


@NEEDS_SHARED
def test_qwen3_235b_h100_runs_alltoall_in_26_02_01() -> None:
    # row 104: Qwen3-235B-A22B H100 x256 tp2 pp8 vp4 ep32 fp8 in NeMo 26.02.01 (v0.3.1): the harness function sets
    # moe_token_dispatcher_type "alltoall" and its workload leaves it (bridge_release_knobs.harness_dispatcher)
    cases, _ = published_cases.load_cases("published")
    c = next(c for c in cases if c.id == "published:0104")
    assert (c.label, c.gpu, c.layout["ep"]) == ("Qwen3-235B-A22B", "h100-80gb", 32)
    assert c.knobs["moe_token_dispatcher_type"] == "alltoall"


@NEEDS_SHARED
def test_a_config_that_leaves_the_dispatcher_keeps_its_other_moe_knobs() -> None:
    # row 0123: Qwen3-30B-A3B H100 x16 pp2 vp12 ep8; its release config sets moe_a2a_overlap with delay_wgrad_compute
    # but not the dispatcher: the dispatcher stays Megatron's, delay-wgrad and the provider's permute fusion stay on
    cases, _ = published_cases.load_cases("published")
    c = next(c for c in cases if c.id == "published:0123")
    assert (c.label, c.gpu, c.layout["ep"], c.layout["pp"]) == ("Qwen3-30B-A3B", "h100-80gb", 8, 2)
    assert "moe_token_dispatcher_type" not in c.knobs
    assert c.knobs["delay_wgrad_compute"] is True and c.knobs["moe_permute_fusion"] is True


@NEEDS_SHARED
def test_moe_rows_of_every_release_run_their_provider_s_permute_fusion() -> None:
    # Bridge's Qwen3 / gpt-oss providers and the DeepSeek / Kimi recipes turn it on (bridge_release_knobs
    # .model_permute_fusion); no matched MoE row of these models runs Megatron's default (off)
    cases, _ = published_cases.load_cases("published")
    matched = {m.row for m in published_cases.release_config_matches() if m.config is not None}
    moe = [c for c in cases if c.knobs and int(c.id.split(":")[1]) in matched
           and c.label.startswith(("Qwen3-30B", "Qwen3-235B", "GPT-OSS", "gpt-oss", "DeepSeek-V3", "Kimi"))]
    assert len(moe) >= 20
    assert all(c.knobs.get("moe_permute_fusion") is True for c in moe), [c.id for c in moe
                                                                          if not c.knobs.get("moe_permute_fusion")]


def test_deepseek_v3_bridge_layout_is_bridge_s_layout_map() -> None:
    # Megatron-Bridge recipes/deepseek/deepseek_v3.py layout_map (v0.2.0 .. 067f987), decoder layers per virtual stage
    layout = published_cases.deepseek_v3_bridge_layout
    sixteen = (4,) * 15 + (1,)  # [E + 4 t] + [4 t] * 14 + [t + mtp + loss]
    eight = (8,) * 7 + (5,)  # [E + 8 t] + [8 t] * 6 + [5 t + mtp + loss]
    assert layout(16, 1) == layout(8, 2) == layout(4, 4) == sixteen
    assert layout(8, 1) == layout(4, 2) == eight
    assert layout(4, 1) == (16, 16, 16, 13)
    assert layout(2, 4) is None and layout(1, 1) is None and layout(2, 8) is None  # not in Bridge's map
    for pp, vp in ((16, 1), (8, 2), (4, 4), (8, 1), (4, 2), (4, 1)):
        counts = layout(pp, vp)
        assert counts is not None and sum(counts) == 61 and len(counts) == pp * vp


def test_deepseek_v3_bridge_layout_agrees_with_the_packaged_recipes() -> None:
    # the recipe library's DeepSeek-V3 recipes carry the layout string the 067f987 perf_recipes produce
    from paraplan.recipes.catalogue import bridge_recipes
    from paraplan.recipes.knobs import pipeline_counts

    checked = 0
    for r in bridge_recipes():
        if r.get("model") != "deepseek_v3" or r.get("pipeline_model_parallel_layout") in (None, ""):
            continue
        pp, vp = int(r.get("pp")), int(r.get("vp") or 1)
        expected = published_cases.deepseek_v3_bridge_layout(pp, vp)
        counts = pipeline_counts(r)
        if expected is None or counts is None or len(counts) != pp * vp:  # partial_cg_dev: 16 stages at PP*VP 8
            continue
        assert counts == expected, r.get("source")
        checked += 1
    assert checked >= 10


@NEEDS_SHARED
def test_deepseek_v3_rows_run_bridge_s_pipeline_layout() -> None:
    # row 73: DeepSeek-V3 B200 x256 pp16 vp1 (NeMo 26.04): the release JSON leaves the layout to Bridge's model recipe,
    # E t*4 | (t*4 |)*14 t m L, not paraplan's balanced split (2 first, 3 last); row 0: GB300 pp2 vp8 names its own
    cases = {c.id: c for c in published_cases.load_cases("published")[0]}
    b200 = cases["published:0073"]
    assert (b200.label, b200.gpu, b200.layout["pp"], b200.layout["vp"]) == ("DeepSeek-V3", "b200", 16, 1)
    assert b200.layout["pipeline_layout"] == (4,) * 15 + (1,)
    assert cases["published:0000"].layout["pipeline_layout"] == (4,) * 15 + (1,)
    b300 = cases["published:0026"]  # B300 pp8 vp1 mbs2
    assert (b300.layout["pp"], b300.layout["vp"], b300.layout["pipeline_layout"]) == (8, 1, (8,) * 7 + (5,))
    assert all("pipeline_layout" not in c.layout for c in cases.values() if c.label != "DeepSeek-V3" and c.knobs
               and c.label != "Kimi-K2")
