"""Measured error bands (issue 18, "Say how sure we are"): paraplan.bands and its packaged file.

The file is written by benchmarks/bands.py from ../shared/calibration; the tests that rebuild it skip without it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.bands import FAMILIES, QUANTITIES, Band, band_for, packaged, value_range
from paraplan.units import GIB

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "calibration"
needs_shared = pytest.mark.skipif(not (SHARED / "megatron_golden.csv").exists()
                                  or not (SHARED / "published_runs.csv").exists(),
                                  reason="needs ../shared/calibration")


def _bands_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return pytest.importorskip("bands")


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_band_is_packaged_and_brackets_one(quantity: str, family: str) -> None:
    b = band_for(quantity, family)  # type: ignore[arg-type]
    assert (b.quantity, b.family) == (quantity, family)
    assert 0 < b.lo_ratio <= b.hi_ratio
    assert b.rows > 0 and 0 < b.coverage <= 1 and b.method
    assert b.lo_offset >= 0 and b.hi_offset >= 0


def test_packaged_file_states_method_rows_and_date() -> None:
    data = packaged()
    assert data["generator"] == "python benchmarks/bands.py"
    assert data["built"][:4].isdigit() and data["target_coverage"] == 0.8
    keys = {"quantity", "family", "lo_ratio", "hi_ratio", "lo_offset", "hi_offset", "coverage", "rows", "method"}
    assert all(keys <= set(b) for b in data["bands"])
    assert {(b["quantity"], b["family"]) for b in data["bands"]} == {(q, f) for q in QUANTITIES for f in FAMILIES}
    text = resources.files("paraplan").joinpath("bands.json").read_text(encoding="utf-8")
    assert json.loads(text) == data


def test_value_range_relative_and_inverse() -> None:
    b = Band("step_s", "dense", 0.9, 1.2, 0.8, 10, "test")
    assert value_range(10.0, b) == pytest.approx((9.0, 12.0))
    lo, hi = value_range(1000.0, b, inverse=True)  # throughput: 1000 / 1.2 .. 1000 / 0.9
    assert (lo, hi) == pytest.approx((1000 / 1.2, 1000 / 0.9))
    assert lo <= 1000.0 <= hi


def test_value_range_with_offsets_never_below_zero() -> None:
    b = Band("peak_bytes", "dense", 0.95, 1.05, 0.8, 10, "test", lo_offset=2.0, hi_offset=1.0)
    assert value_range(100.0, b) == pytest.approx((93.0, 106.0))
    assert value_range(1.0, b)[0] == 0.0
    with pytest.raises(ValueError, match="purely relative"):
        value_range(100.0, b, inverse=True)


def test_band_for_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="quantity must be one of"):
        band_for("tokens", "dense")  # type: ignore[arg-type]


def test_conformal_interval_covers_at_least_the_target() -> None:
    bands = _bands_module()
    xs = [float(i) for i in range(1, 100)]  # n = 99: ranks floor(100 x 0.1) = 10 and ceil(100 x 0.9) = 90
    assert bands.conformal_interval(xs, 0.8) == (10.0, 90.0)
    assert sum(10.0 <= x <= 90.0 for x in xs) / len(xs) >= 0.8


@needs_shared
def test_published_rows_have_distinct_content_fold_keys() -> None:
    """A row's fold key is its content (not its CSV position, which shifts when a release is added at the top)."""
    _bands_module()
    from published_cases import FOLD_KEY_COLUMNS, load_cases, row_fold_key
    cases, _ = load_cases("published", include_excluded=True)
    keys = [c.fold_key for c in cases]
    assert all(keys) and len(set(keys)) == len(keys)
    row = {c: "x" for c in FOLD_KEY_COLUMNS}
    assert row_fold_key({**row, "notes": "edited"}) == row_fold_key(row) != row_fold_key({**row, "tp": "y"})


def test_folds_are_seeded_stable_and_roughly_balanced() -> None:
    bands = _bands_module()
    keys = [f"published:{i:04d}" for i in range(400)]
    f = bands.fold_ids(keys, 5, 18)
    assert f == bands.fold_ids(keys, 5, 18) and f != bands.fold_ids(keys, 5, 19)
    # a row keeps its fold when another row is removed (a positional shuffle redraws them all)
    assert bands.fold_ids(keys[:7] + keys[8:], 5, 18) == f[:7] + f[8:]
    sizes = [f.count(k) for k in range(5)]
    assert sum(sizes) == 400 and min(sizes) >= 60 and max(sizes) <= 100


@needs_shared
def test_packaged_file_is_not_stale() -> None:
    """The inputs fingerprint (calibration files, presets' efficiency, fit settings, the model's predictions at the
    presets' values: all the step-time cross-validation depends on) and the memory bands, recomputed in full."""
    bands = _bands_module()
    assert bands.stale_parts(packaged()) == [], "src/paraplan/bands.json is stale: run python benchmarks/bands.py"


@needs_shared
@pytest.mark.skipif(os.environ.get("PARAPLAN_REBUILD_BANDS") != "1",
                    reason="the full rebuild refits every fold (minutes): PARAPLAN_REBUILD_BANDS=1 runs it")
def test_packaged_file_is_what_the_script_writes() -> None:
    bands = _bands_module()
    fresh = bands.build(jobs=0)
    assert bands.same_but_date(packaged(), fresh), "src/paraplan/bands.json is stale: run python benchmarks/bands.py"


@needs_shared
def test_bands_cover_80_percent_of_held_out_rows() -> None:
    for b in packaged()["bands"]:
        assert b["coverage"] >= 0.8, f"{b['quantity']}/{b['family']}: held-out coverage {b['coverage']:.3f} < 0.8"


# ------------------------------------------------------------------------------------------- estimate outputs
def _estimate(model: str, gpu: str, n: int, **lay: object):  # type: ignore[no-untyped-def]
    from paraplan.estimator import estimate
    from paraplan.layout import ParallelLayout
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu, load_model
    from paraplan.specs.training import TrainingSpec

    m = load_model(model)
    return estimate(m, make_cluster(load_gpu(gpu), n), TrainingSpec(seq_len=4096, global_batch_size=64),
                    ParallelLayout(**lay))  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "family"), [("llama3-8b", "dense"), ("mixtral-8x7b", "moe")])
def test_estimate_json_has_the_three_ranges_around_the_prediction(model: str, family: str) -> None:
    lay = {"tp": 2, "pp": 1, "dp": 4, "mbs": 1} if family == "dense" else {"tp": 2, "pp": 2, "ep": 2, "dp": 2, "mbs": 1}
    est = _estimate(model, "h100-80gb", 8, **lay)
    doc = est.to_dict()
    mem, time, thr = doc["memory"], doc["time"], doc["throughput"]
    mb, sb = band_for("peak_bytes", family), band_for("step_s", family)  # type: ignore[arg-type]
    lo, hi = mem["peak_bytes_range"]
    assert lo <= mem["peak_bytes"] <= hi
    assert (lo, hi) == pytest.approx((mem["peak_bytes"] * mb.lo_ratio - mb.lo_offset,
                                      mem["peak_bytes"] * mb.hi_ratio + mb.hi_offset))
    assert mem["peak_bytes_band"]["family"] == family
    s_lo, s_hi = time["step_s_range"]
    assert s_lo <= time["step_s"] <= s_hi
    assert (s_lo, s_hi) == pytest.approx((time["step_s"] * sb.lo_ratio, time["step_s"] * sb.hi_ratio))
    t_lo, t_hi = thr["tokens_per_s_per_gpu_range"]
    assert t_lo <= thr["tokens_per_s_per_gpu"] <= t_hi
    # the throughput range is the step-time range inverted: tokens per step are fixed
    tokens = thr["tokens_per_s_per_gpu"] * time["step_s"]
    assert (t_lo, t_hi) == pytest.approx((tokens / s_hi, tokens / s_lo))
    # existing keys are kept as they were
    assert {"peak_bytes", "fits", "fits_with_margin", "headroom", "per_stage"} <= set(mem)
    assert {"step_s", "compute_s", "bubble_s"} <= set(time) and "mfu" in thr


def test_estimate_table_and_plan_json_show_the_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    args = ["-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"]
    assert main(["estimate", *args, "--tp", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "peak memory range" in out and "step range" in out and "throughput range" in out
    assert "held-out rows" in out
    assert main(["plan", *args, "--format", "json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for c in doc["candidates"]:
        lo, hi = c["memory"]["peak_bytes_range"]
        assert lo <= c["memory"]["peak_bytes"] <= hi
        assert c["time"]["step_s_range"][0] <= c["time"]["step_s"] <= c["time"]["step_s_range"][1]


# ----------------------------------------------------------------------------------------- default headroom
@pytest.mark.parametrize(("model", "family"), [("llama3-8b", "dense"), ("mixtral-8x7b", "moe")])
def test_default_margin_is_the_family_memory_band(model: str, family: str) -> None:
    from paraplan.headroom import DEFAULT_HEADROOM, band_headroom

    b = band_for("peak_bytes", family)  # type: ignore[arg-type]
    h = DEFAULT_HEADROOM.for_model(family == "moe")
    assert h == band_headroom(family) and not h.is_default
    usable = 78.0 * GIB
    margin = h.margin_bytes(usable)
    # peak + margin <= usable  <=>  peak x hi_ratio + hi_offset <= usable
    assert (usable - margin) * b.hi_ratio + b.hi_offset == pytest.approx(usable)
    assert "memory error band" in h.describe(usable) and f"{b.rows} held-out rows" in h.describe(usable)
    est = _estimate(model, "h100-80gb", 8, tp=2, pp=1 if family == "dense" else 2, ep=1 if family == "dense" else 2,
                    dp=4 if family == "dense" else 2, mbs=1)
    assert est.headroom == h
    assert est.fits_with_margin == (est.peak_bytes * b.hi_ratio + b.hi_offset <= est.usable_bytes * (1 + 1e-12))


def test_margin_by_hand() -> None:
    from paraplan.headroom import Headroom

    # band: measured <= predicted x 1.08 + 0.54 GiB -> margin = 78 x (1 - 1/1.08) + 0.54/1.08 = 5.7778 + 0.5 GiB
    h = Headroom(frac=1 - 1 / 1.08, bytes_=0.54 / 1.08 * GIB, source="test")
    assert h.margin_bytes(78 * GIB) / GIB == pytest.approx(6.2778, abs=1e-4)
    assert h.describe(78 * GIB) == "margin 6.3 GiB = 7.4% of usable + 0.50 GiB (test)"


def test_unresolved_default_margin_is_the_larger_family_margin() -> None:
    from paraplan.headroom import DEFAULT_HEADROOM, band_headroom

    usable = 180.0 * GIB
    both = [band_headroom(f).margin_bytes(usable) for f in FAMILIES]
    assert DEFAULT_HEADROOM.margin_bytes(usable) == max(both)


# ------------------------------------------------------------------------------------ the cross-validation
@needs_shared
def test_fast_predictions_equal_calibration_predict() -> None:
    _bands_module()
    calibration = pytest.importorskip("calibration")
    cv = pytest.importorskip("cross_validate")
    from published_cases import load_cases  # type: ignore[import-not-found]

    cases, _ = load_cases("published")
    for c in cases[::7]:
        assert cv.fast_predict(c) == pytest.approx(calibration.predict(c), rel=1e-12)


@needs_shared
def test_cross_validation_builds_its_inputs_as_calibration_does() -> None:
    """cross_validate.prepare takes calibration.case_inputs's model, cluster, training and layout (flash attention),
    and refuses with the same line where it refuses."""
    _bands_module()
    calibration = pytest.importorskip("calibration")
    cv = pytest.importorskip("cross_validate")
    from paraplan.errors import SpecError
    from paraplan.specs.load import load_gpu
    from published_cases import load_cases  # type: ignore[import-not-found]

    cases, _ = load_cases("published")
    for c in cases[::5]:
        p = cv.prepare(c)
        try:
            inputs = calibration.case_inputs(c, load_gpu(c.gpu), "flash")
        except SpecError as err:
            assert p == str(err)
            continue
        assert (p.model, p.cluster, p.training, p.layout) == inputs
        assert p.num_microbatches == inputs[3].num_microbatches(c.gbs)


@needs_shared
def test_a_held_out_row_is_predicted_without_its_own_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing a row's measured value leaves its held-out prediction unchanged and moves the others' (the fit is
    redone per fold, on the other folds only). Hopper rows, a short fit, to stay fast."""
    _bands_module()
    cv = pytest.importorskip("cross_validate")
    from published_cases import load_cases  # type: ignore[import-not-found]

    monkeypatch.setattr(cv, "MAX_NFEV", 3)
    cases = [c for c in load_cases("published")[0] if cv.ARCH_OF[c.gpu] == "hopper"]
    base = cv.held_out(cases, "kfold")
    i = 0
    changed = list(cases)
    changed[i] = type(cases[i])(**{**cases[i].__dict__, "target_tokens_per_s_per_gpu":
                                   3 * cases[i].target_tokens_per_s_per_gpu})
    moved = cv.held_out(changed, "kfold")
    assert moved[i].predicted == base[i].predicted
    same_fold = [j for j in range(len(cases)) if base[j].fold == base[i].fold]
    other = [j for j in range(len(cases)) if base[j].fold != base[i].fold]
    assert all(moved[j].predicted == base[j].predicted for j in same_fold)
    assert any(moved[j].predicted != base[j].predicted for j in other)


@needs_shared
def test_leave_one_source_out_without_another_source_is_uncalibrated() -> None:
    _bands_module()
    cv = pytest.importorskip("cross_validate")
    from published_cases import load_cases  # type: ignore[import-not-found]

    cases = load_cases("published")[0]
    groups = cv.groups_of(cases, "loso")
    assert sorted(i for idx in groups.values() for i in idx) == list(range(len(cases)))
    assert all(len({cases[i].source for i in idx}) == 1 for idx in groups.values())


class _Row:
    """A stand-in row for fit_efficiency.fit_arch: a GPU and a measured throughput."""

    def __init__(self, gpu: str, target: float) -> None:
        self.gpu, self.target_tokens_per_s_per_gpu = gpu, target


def test_fit_keeps_a_parameter_the_rows_do_not_measure_at_its_start() -> None:
    """fit_efficiency.fit_arch fits a parameter only where a step of the fit's own size moves some row
    (``identified``): here the prediction is 1000 x gemm_max_frac, whatever dp_overlap_frac and layer_overhead_s
    are. gemm_max_frac is fitted; the other two keep the preset's values exactly (least squares alone nudges a
    parameter with a zero Jacobian column off its start)."""
    _bands_module()
    pytest.importorskip("scipy")
    fe = pytest.importorskip("fit_efficiency")
    from paraplan.specs.load import load_gpu

    eff = load_gpu("h100-80gb").efficiency

    def predictor(case: _Row, gpu) -> float:  # type: ignore[no-untyped-def]
        return 1000.0 * gpu.efficiency.gemm_max_frac

    rows = [_Row("h100-80gb", 700.0), _Row("h200-141gb", 700.0)]
    names = ["gemm_max_frac", "dp_overlap_frac", "layer_overhead_s"]
    values, _, after = fe.fit_arch(rows, "hopper", names, predictor=predictor)
    assert values["dp_overlap_frac"] == eff.dp_overlap_frac
    assert values["layer_overhead_s"] == eff.layer_overhead_s
    assert values["gemm_max_frac"] == pytest.approx(0.7, rel=1e-4)
    assert abs(after).max() < 1e-6


def test_cross_validation_gives_an_unmeasured_parameter_the_uncalibrated_default() -> None:
    """In cross-validation a parameter no training row measures must not keep the preset's value, which was fitted
    with the held-out rows in (expert review, session 10: with Megatron-Bridge held out no other Hopper row measures
    moe_overhead_frac or the x86 host_op_issue_s): fit_arch(unmeasured="default") gives it EfficiencySpec's
    default; the measured parameter is fitted as before."""
    _bands_module()
    pytest.importorskip("scipy")
    fe = pytest.importorskip("fit_efficiency")
    from paraplan.specs.cluster import EfficiencySpec
    from paraplan.specs.load import load_gpu

    assert load_gpu("h100-80gb").efficiency.moe_overhead_frac != EfficiencySpec().moe_overhead_frac

    def predictor(case: _Row, gpu) -> float:  # type: ignore[no-untyped-def]
        return 1000.0 * gpu.efficiency.gemm_max_frac

    rows = [_Row("h100-80gb", 700.0), _Row("h200-141gb", 700.0)]
    names = ["gemm_max_frac", "moe_overhead_frac"]
    values, _, _ = fe.fit_arch(rows, "hopper", names, predictor=predictor, unmeasured="default")
    assert values["moe_overhead_frac"] == pytest.approx(EfficiencySpec().moe_overhead_frac)
    assert values["gemm_max_frac"] == pytest.approx(0.7, rel=1e-4)
    with pytest.raises(ValueError, match="unmeasured"):
        fe.fit_arch(rows, "hopper", names, predictor=predictor, unmeasured="preset")


def test_cross_validation_starts_every_fit_from_the_uncalibrated_defaults() -> None:
    """A fold's fit must not start at the presets (fitted with its held-out rows in, session 10): with a predictor
    that is flat in gemm_max_frac the fit stays where it starts, which is EfficiencySpec's value with
    start_from="default" (cross_validate.START_FROM) and the preset's with start_from="preset"."""
    _bands_module()
    pytest.importorskip("scipy")
    fe = pytest.importorskip("fit_efficiency")
    cv = pytest.importorskip("cross_validate")
    from paraplan.specs.cluster import EfficiencySpec
    from paraplan.specs.load import load_gpu

    assert cv.START_FROM == "default"
    preset, default = load_gpu("h100-80gb").efficiency.gemm_max_frac, EfficiencySpec().gemm_max_frac
    assert preset != default

    def predictor(case: _Row, gpu) -> float:  # type: ignore[no-untyped-def]
        return 1000.0 * (1 + 1e-3 * (gpu.efficiency.dp_overlap_frac - 0.5))  # gemm_max_frac has no effect

    rows = [_Row("h100-80gb", 1000.0)]
    for start, want in (("default", default), ("preset", preset)):
        values, _, _ = fe.fit_arch(rows, "hopper", ["gemm_max_frac"], predictor=predictor, unmeasured="start",
                                   start_from=start)
        assert values["gemm_max_frac"] == pytest.approx(want)
    with pytest.raises(ValueError, match="start_from"):
        fe.fit_arch(rows, "hopper", ["gemm_max_frac"], predictor=predictor, start_from="presets")


def test_fit_moves_a_parameter_the_rows_measure() -> None:
    """The same fit with dp_overlap_frac's effect well above MIN_EFFECT: it is fitted to what the rows ask."""
    _bands_module()
    pytest.importorskip("scipy")
    fe = pytest.importorskip("fit_efficiency")

    def predictor(case: _Row, gpu) -> float:  # type: ignore[no-untyped-def]
        e = gpu.efficiency
        return 1000.0 * e.gemm_max_frac * (1.0 + case.gpu.startswith("h200") * e.dp_overlap_frac)

    rows = [_Row("h100-80gb", 700.0), _Row("h200-141gb", 700.0 * 1.5)]
    values, _, _ = fe.fit_arch(rows, "hopper", ["gemm_max_frac", "dp_overlap_frac"], predictor=predictor)
    assert values["gemm_max_frac"] == pytest.approx(0.7, rel=1e-4)
    assert values["dp_overlap_frac"] == pytest.approx(0.5, rel=1e-3)


@needs_shared
def test_without_the_readme_rows_no_hopper_row_measures_the_layer_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The largest cause of the Megatron README H100 leave-one-source-out misses (session 9: p90 35.9%): held out,
    no other Hopper row (Megatron-Bridge, NeMo) has a launch-bound dense layer at the preset's values, so the fit
    does not fit layer_overhead_s (before it drifted to 4.6 ms, which made the README rows launch-bound); with the
    README rows in, the GEMM efficiency and dp_overlap_frac are measured."""
    _bands_module()
    pytest.importorskip("scipy")
    cv = pytest.importorskip("cross_validate")
    fe = pytest.importorskip("fit_efficiency")
    from published_cases import load_cases  # type: ignore[import-not-found]

    masks: list[list[bool]] = []
    real = fe.identified
    monkeypatch.setattr(fe, "identified", lambda *a: masks.append(list(real(*a))) or real(*a))
    cases = [c for c in load_cases("published")[0] if cv.ARCH_OF[c.gpu] == "hopper"]
    names = cv.fitted_names("hopper", cv.FIX)
    for train in ([c for c in cases if c.source != "Megatron README H100"], cases):
        cv.fit_for(train, "hopper", fit=lambda *a, **k: fe.fit_arch(*a, **{**k, "max_nfev": 1}))
    without, with_readme = (dict(zip(names, m, strict=True)) for m in masks)
    assert not without["layer_overhead_s"] and without["gemm_max_frac"] and without["moe_overhead_frac"]
    assert with_readme["gemm_max_frac"] and with_readme["dp_overlap_frac"]


@given(value=st.floats(1e-3, 1e15), lo=st.floats(0.05, 1.0), hi=st.floats(1.0, 5.0),
       lo_off=st.floats(0.0, 1e10), hi_off=st.floats(0.0, 1e10))
def test_ranges_contain_the_prediction_and_inverse_inverts(value: float, lo: float, hi: float, lo_off: float,
                                                           hi_off: float) -> None:
    b = Band("peak_bytes", "dense", lo, hi, 0.8, 10, "test", lo_offset=lo_off, hi_offset=hi_off)
    r_lo, r_hi = value_range(value, b)
    assert 0.0 <= r_lo <= value <= r_hi
    rel = Band("step_s", "dense", lo, hi, 0.8, 10, "test")
    s_lo, s_hi = value_range(value, rel)
    t_lo, t_hi = value_range(1.0 / value, rel, inverse=True)
    assert t_lo <= 1.0 / value <= t_hi
    assert t_lo == pytest.approx(1.0 / s_hi, rel=1e-12) and t_hi == pytest.approx(1.0 / s_lo, rel=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_docs_model_md_states_the_packaged_bands(family: str) -> None:
    """docs/model.md 6.1 gives the figures of src/paraplan/bands.json (issue 18: "docs/model.md states the figures"):
    refreshing the file (benchmarks/bands.py) without the docs fails here."""
    text = " ".join((ROOT / "docs" / "model.md").read_text(encoding="utf-8").split())
    step, mem = band_for("step_s", family), band_for("peak_bytes", family)  # type: ignore[arg-type]
    assert f"{step.lo_ratio:.3f}-{step.hi_ratio:.3f} (coverage " in text or \
        f"{step.lo_ratio:.3f}-{step.hi_ratio:.3f} ({100 * step.coverage:.1f}% of {step.rows})" in text
    assert f"{100 * step.coverage:.1f}% of {step.rows}" in text
    assert f"{mem.lo_ratio:.3f} - {mem.hi_ratio:.3f} with " in text
    assert f"+{mem.hi_offset / GIB:.2f} GiB" in text and f"{100 * mem.coverage:.1f}% of {mem.rows}" in text


def test_describe_puts_each_offset_with_its_end_and_leaves_zero_ones_out() -> None:
    both = Band(quantity="peak_bytes", family="dense", lo_ratio=0.93, hi_ratio=1.08, lo_offset=0.03 * GIB,
                hi_offset=0.26 * GIB, coverage=0.81, rows=507, method="test")
    assert both.describe() == "-7% - 0.03 GiB / +8% + 0.26 GiB (81% of 507 held-out rows)"
    upper = Band(quantity="peak_bytes", family="moe", lo_ratio=0.89, hi_ratio=1.07, lo_offset=0.0,
                 hi_offset=0.23 * GIB, coverage=0.89, rows=130, method="test")
    assert upper.describe() == "-11% / +7% + 0.23 GiB (89% of 130 held-out rows)"  # was "-0/+0.23 GiB"
    step = Band(quantity="step_s", family="dense", lo_ratio=0.91, hi_ratio=1.17, lo_offset=0.0, hi_offset=0.0,
                coverage=0.805, rows=195, method="test")
    assert step.describe() == "-9% / +17% (80% of 195 held-out rows)"


def test_readme_points_at_docs_for_the_default_margin_instead_of_a_figure() -> None:
    """README's default --headroom margin names no GiB figure (it moves with bands.json); docs/model.md 6.1 does,
    kept in step by ``test_docs_model_md_states_the_packaged_bands``."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    start = text.index("default: the upper end of the memory model's cross-validated error band")
    sentence = text[start:text.index("--headroom", start)]
    assert "docs/model.md 6.1" in sentence and not re.search(r"\d GiB", sentence), sentence
