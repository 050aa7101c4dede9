"""calibrate: fit efficiencies to synthetic runs of a known "true" cluster; hold-out runs must improve."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from paraplan.calibrate import (
    DEFAULT_PARAMS,
    Run,
    evaluate,
    fit_profile,
    layout_from_dict,
    nelder_mead,
    read_runs_csv,
    write_profile,
)
from paraplan.errors import SpecError
from paraplan.specs.load import load_gpu
from paraplan.specs.profile import load_profile
from tests.tune.helpers import RUN_SPECS, TRUE_EFFICIENCY, synthetic_runs

GPU = "h100-80gb"


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    return synthetic_runs(GPU)


def test_holdout_error_drops(runs: list[Run]) -> None:
    gpu = load_gpu(GPU)
    train, held = runs[:8], runs[8:]
    res = fit_profile(train, gpu)
    assert res.before.median_abs > 0.15  # the preset is ~25% off on this "cluster"
    assert res.after.median_abs < 0.05 and res.after.rms_log < res.before.rms_log / 5
    before, after = evaluate(held, gpu.efficiency), evaluate(held, res.efficiency)
    assert before.median_abs > 0.15
    assert after.median_abs < before.median_abs / 4 and after.max_abs < before.max_abs / 2
    assert set(res.fitted) == set(DEFAULT_PARAMS) and len(res.per_run) == 8
    # GEMM efficiency found near the truth (the parameter that matters most for step time)
    assert res.fitted["gemm_max_frac"] == pytest.approx(TRUE_EFFICIENCY["gemm_max_frac"], abs=0.06)


def test_three_runs_move_every_next_prediction_toward_reality(runs: list[Run]) -> None:
    gpu = load_gpu(GPU)
    res = fit_profile(runs[:3], gpu)
    held = runs[3:]
    assert evaluate(held, res.efficiency).median_abs < evaluate(held, gpu.efficiency).median_abs / 2
    for run in held:  # every held-out prediction moves toward the measurement
        assert evaluate([run], res.efficiency).rms_log < evaluate([run], gpu.efficiency).rms_log


def test_fit_only_named_params(runs: list[Run]) -> None:
    gpu = load_gpu(GPU)
    res = fit_profile(runs[:4], gpu, params=("gemm_max_frac",))
    assert list(res.fitted) == ["gemm_max_frac"]
    assert res.efficiency.nvlink_bus_frac == gpu.efficiency.nvlink_bus_frac
    assert 0.3 <= res.fitted["gemm_max_frac"] <= 0.95


def test_profile_yaml_is_read_by_every_command(tmp_path: Path, runs: list[Run]) -> None:
    res = fit_profile(runs[:3], load_gpu(GPU), params=("gemm_max_frac", "step_overhead_s"))
    out = tmp_path / "prof.yaml"
    write_profile(out, res, "test cluster")
    doc = yaml.safe_load(out.read_text())
    assert doc["gpu"] == GPU and doc["source"] == "test cluster"
    assert doc["fit"]["n"] == 3 and doc["fit"]["after"]["median_abs"] < doc["fit"]["before"]["median_abs"]
    eff = load_profile(str(out), GPU)
    assert set(eff) == {"gemm_max_frac", "step_overhead_s"}
    with pytest.raises(SpecError, match="fitted for gpu 'h100-80gb'"):
        load_profile(str(out), "a100-80gb")


def test_nelder_mead_bounded() -> None:
    def bowl(u: np.ndarray) -> float:
        return float(np.sum((u - np.array([0.3, 0.7])) ** 2))

    x, fx, evals = nelder_mead(bowl, np.array([0.9, 0.1]))
    assert x == pytest.approx([0.3, 0.7], abs=1e-3) and fx < 1e-6 and evals < 800

    def outside(u: np.ndarray) -> float:  # minimum at (1.5, -0.5): the box corner (1, 0) wins
        return float(np.sum((u - np.array([1.5, -0.5])) ** 2))

    x, _, _ = nelder_mead(outside, np.array([0.5, 0.5]))
    assert x == pytest.approx([1.0, 0.0], abs=1e-3) and np.all((x >= 0) & (x <= 1))


def _csv(tmp_path: Path, runs: list[Run], columns: str = "") -> Path:
    rows = ["model,gpu,num_gpus,tp,pp,vp,mbs,gbs,seq_len,recompute,precision,step_time_s" + columns]
    for (name, n, seq, gbs, kw), r in zip(RUN_SPECS, runs, strict=True):
        rows.append(f"{name},{GPU},{n},{kw['tp']},{kw['pp']},{kw.get('vp', 1)},{kw.get('mbs', 1)},{gbs},{seq},"
                    f"selective,bf16,{r.measured_step_s:.6f}")
    path = tmp_path / "runs.csv"
    path.write_text("# measured on the test cluster\n" + "\n".join(rows) + "\n")
    return path


def test_read_runs_csv_matches_the_runs(tmp_path: Path, runs: list[Run]) -> None:
    read = read_runs_csv(_csv(tmp_path, runs), load_gpu(GPU))
    assert len(read) == len(runs)
    for a, b in zip(read, runs, strict=True):
        assert a.layout == b.layout and a.training == b.training and a.model == b.model
        assert a.measured_step_s == pytest.approx(b.measured_step_s, rel=1e-5)


def test_read_runs_csv_tokens_column(tmp_path: Path) -> None:
    p = tmp_path / "r.csv"
    p.write_text("model,num_gpus,tp,pp,mbs,gbs,seq_len,tokens_per_s_per_gpu,sequence_parallel\n"
                 "llama3-8b,8,1,1,1,64,4096,8000,no\n")
    (run,) = read_runs_csv(p, load_gpu(GPU))
    assert run.measured_step_s == pytest.approx(64 * 4096 / (8000 * 8))
    assert run.layout.sequence_parallel is False and run.cluster.gpu.name == GPU


@pytest.mark.parametrize(("text", "match"), [
    ("model,num_gpus,tp,pp,mbs,gbs,step_time_s\nllama3-8b,8,1,1,1,64,2.0\n", "missing column 'seq_len'"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len\nllama3-8b,8,1,1,1,64,4096\n", "missing column 'step_time_s'"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,8,abc,1,1,64,4096,2\n", "row 2: column 'tp'"),
    ("model,gpu,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,nogpu,8,1,1,1,64,4096,2\n",
     "unknown gpu 'nogpu'"),
    ("model,gpu,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,a100-80gb,8,1,1,1,64,4096,2\n",
     "differs from --gpu h100-80gb"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,8,3,1,1,64,4096,2\n", "not divisible"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\nllama3-8b,8,1,1,1,64,4096,-1\n", "must be > 0"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s,fsdp\nllama3-8b,8,1,1,1,64,4096,2,maybe\n", "'fsdp'"),
    ("model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\n", "no runs"),
])
def test_bad_csv_is_one_line_naming_the_field(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(SpecError, match=match) as err:
        read_runs_csv(p, load_gpu(GPU))
    assert "\n" not in str(err.value)


def test_bad_fit_inputs(runs: list[Run]) -> None:
    gpu = load_gpu(GPU)
    with pytest.raises(SpecError, match="unknown 'gemm_speed'"):
        fit_profile(runs[:2], gpu, params=("gemm_speed",))
    with pytest.raises(SpecError, match="no runs"):
        fit_profile([], gpu)
    other = replace(runs[0], cluster=replace(runs[0].cluster, gpu=load_gpu("a100-80gb")))
    with pytest.raises(SpecError, match="a profile is fitted per GPU"):
        fit_profile([other], gpu)
    with pytest.raises(SpecError, match=r"runs: cannot read .*: file not found"):
        read_runs_csv("/nonexistent/runs.csv")


def test_layout_from_dict_ignores_unknown_keys() -> None:
    lay = layout_from_dict({"tp": 2, "pp": 2, "dp": 2, "recompute_modules": ["core_attn"], "edp": 4, "gbs": 8})
    assert lay.tp == 2 and lay.recompute_modules == ("core_attn",)


HEADER = "model,gpu,num_gpus,tp,pp,mbs,gbs,seq_len,recompute,step_time_s\n"


@pytest.mark.parametrize(("row", "message"), [
    # llama3-70b on 8 GPUs without model parallelism: ~675 GiB per GPU, a run that could not have happened
    ("llama3-70b,h100-80gb,8,1,1,1,64,4096,none,10.0", r"runs\.csv row 2: paraplan predicts \d+ GiB"),
    ("llama3-8b,h100-80gb,8,1,1,1,64,4096,sometimes,1.0", r"runs\.csv row 2: recompute must be one of"),
    ("nosuchmodel,h100-80gb,8,1,1,1,64,4096,none,1.0", r"runs\.csv row 2: unknown model preset 'nosuchmodel'"),
])
def test_bad_rows_name_the_row(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + row + "\n", encoding="utf-8")
    with pytest.raises(SpecError, match=message):
        read_runs_csv(path, load_gpu(GPU))


def test_a_csv_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_bytes(b"\xff\xfe" + HEADER.encode("utf-16-le"))
    with pytest.raises(SpecError, match="is not UTF-8 text"):
        read_runs_csv(path, load_gpu(GPU))


def test_every_fitted_efficiency_of_the_presets_can_be_calibrated() -> None:
    """benchmarks/fit_efficiency.py fits these for the presets; a user's `calibrate --params` must accept them too
    (docs/model.md says calibrate fits the same parameters), each within EfficiencySpec's own range."""
    import sys

    from paraplan.calibrate import PARAM_BOUNDS
    from paraplan.specs.cluster import EfficiencySpec
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    fit_efficiency = pytest.importorskip("fit_efficiency")
    assert set(fit_efficiency.PARAMS) <= set(PARAM_BOUNDS)
    from dataclasses import fields
    names = {f.name for f in fields(EfficiencySpec)}
    for name, (lo, hi) in PARAM_BOUNDS.items():
        assert name in names
        EfficiencySpec(**{name: lo}), EfficiencySpec(**{name: hi})  # type: ignore[arg-type]
