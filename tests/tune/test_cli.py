"""``paraplan tune`` and ``paraplan calibrate`` in-process: inputs from flags, plan.json and manifests."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

import paraplan.cli.calibrate
import paraplan.cli.tune  # noqa: F401  (registers the commands until they are in _COMMAND_MODULES)
from paraplan.calibrate import Run
from paraplan.cli import main
from paraplan.cli.calibrate import split_pair
from paraplan.errors import SpecError
from paraplan.estimator import Estimate
from paraplan.search import SearchSpace, plan
from paraplan.serialize import inputs_dict, save_plan
from tests.tune.helpers import RUN_SPECS, make_estimate, megatron_log, synthetic_runs

FLAGS = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096", "--gbs", "16",
         "--tp", "2", "--pp", "4"]


def _log(tmp_path: Path, est: Estimate, name: str = "train.log", **kw: Any) -> str:
    path = tmp_path / name
    path.write_text(megatron_log(est, **kw))
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0, capsys.readouterr().err
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_tune_table_from_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = make_estimate("llama3-8b", 16, 4096, 16, tp=2, pp=4)
    step = 1.3 * float(est.time.step_s)
    assert main(["tune", "--log", _log(tmp_path, est, step_s=step, bubble_s=0.35 * step), *FLAGS]) == 0
    out = capsys.readouterr().out
    assert "predicted vs measured" in out and "peak memory per pipeline stage" in out
    assert "BUBBLE" in out and "NEXT_LAYOUT" in out and "paraplan launch --model llama3-8b" in out


def test_tune_json_from_plan_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=2)
    found = plan(est.model, est.cluster, est.training, space=SearchSpace(tp=(2, 4), pp=(1, 2), mbs=(1,)), top_k=3)
    save_plan(found, tmp_path / "plan.json")
    second = found.candidates[1]
    log = _log(tmp_path, second, mem_factor=1.2)
    doc = _json(capsys, ["tune", "-f", "json", "--log", log, "--plan", str(tmp_path / "plan.json"), "--rank", "2"])
    cfg = doc["comparison"]["config"]
    assert (cfg["tp"], cfg["pp"], cfg["mbs"]) == (second.layout.tp, second.layout.pp, second.layout.mbs)
    assert doc["comparison"]["metrics"]["peak_memory_bytes"]["ratio"] == pytest.approx(1.2, rel=1e-3)
    codes = [f["code"] for f in doc["findings"]]
    assert codes[0] == "STEP_TIME" and codes[-1] == "NEXT_LAYOUT" and "MEMORY_ABOVE_PREDICTION" in codes
    assert "--model llama3-8b" in doc["findings"][-1]["numbers"]["command"]


def _manifest(tmp_path: Path, est: Estimate, style: str) -> Path:
    if style == "launch":  # what paraplan.launch.render writes: inputs.cluster names the GPU
        inputs = {"model": asdict(est.model), "training": asdict(est.training), "layout": asdict(est.layout),
                  "cluster": {"gpu": est.cluster.gpu.name, "num_gpus": est.cluster.num_gpus,
                              "gpus_per_node": est.cluster.gpus_per_node}}
        doc = {"schema_version": 1, "candidate_id": "abc123", "layout": asdict(est.layout), "inputs": inputs,
               "prediction": est.to_dict()}
    else:  # plan.json-style inputs, layout only in the prediction's config
        doc = {"schema_version": 1, "candidate_id": "def456", "inputs": inputs_dict(est.model, est.cluster,
               est.training), "prediction": est.to_dict()}
    path = tmp_path / f"manifest-{style}.json"
    path.write_text(json.dumps(doc, default=list))
    return path


@pytest.mark.parametrize("style", ["launch", "plan"])
def test_tune_from_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str], style: str) -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=8)
    man = _manifest(tmp_path, est, style)
    doc = _json(capsys, ["tune", "--format", "json", "--log", _log(tmp_path, est), "--manifest", str(man),
                         "--no-search"])
    assert doc["candidate_id"] in ("abc123", "def456")
    assert doc["comparison"]["config"]["tp"] == 8
    assert doc["comparison"]["metrics"]["step_time_s"]["ratio"] == pytest.approx(1.0, rel=5e-3)
    assert "TP_COMM" in [f["code"] for f in doc["findings"]]


def test_tune_from_a_rendered_launch_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    render = pytest.importorskip("paraplan.launch.render")
    est = make_estimate("llama3-8b", 16, 4096, 16, tp=2, pp=4)
    spec = render.LaunchSpec(model=est.model, cluster=est.cluster, training=est.training, layout=est.layout,
                             prediction=est.to_dict())
    files = render.render_files(spec, ["megatron"])
    (tmp_path / "manifest.json").write_text(files["manifest.json"])
    doc = _json(capsys, ["tune", "-f", "json", "--log", _log(tmp_path, est), "--manifest", str(tmp_path),
                         "--no-search"])
    assert doc["comparison"]["config"]["pp"] == 4


@pytest.mark.parametrize(("argv", "match"), [
    (["--log", "x.log"], "x.log: no such file"),  # without --plan/--manifest/--model the log must describe the run
    (["--log", "x.log", "--plan", "p.json", "--model", "llama3-8b"], "exactly one of"),
    (["--log", "x.log", "--model", "llama3-8b", "--gpu", "h100-80gb"], "also give --num-gpus, --seq-len, --gbs"),
    (["--log", "/nonexistent.log", *FLAGS], "no such file"),
    (["--log", "x.log", "--manifest", "/nonexistent/manifest.json"], "manifest: cannot read"),
])
def test_tune_bad_inputs_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert main(["tune", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert match in err and "\n" not in err


def test_tune_bad_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=2)
    save_plan(plan(est.model, est.cluster, est.training, space=SearchSpace(tp=(2,), pp=(1,), mbs=(1,)), top_k=1),
              tmp_path / "plan.json")
    assert main(["tune", "--log", _log(tmp_path, est), "--plan", str(tmp_path / "plan.json"), "--rank", "5"]) == 1
    assert "--rank 5" in capsys.readouterr().err


def _runs_csv(tmp_path: Path) -> tuple[Path, list[Run]]:
    runs = synthetic_runs()
    rows = ["model,num_gpus,tp,pp,vp,mbs,gbs,seq_len,step_time_s"]
    for (name, n, seq, gbs, kw), r in list(zip(RUN_SPECS, runs, strict=True))[:4]:
        rows.append(f"{name},{n},{kw['tp']},{kw['pp']},{kw.get('vp', 1)},{kw.get('mbs', 1)},{gbs},{seq},"
                    f"{r.measured_step_s:.6f}")
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(rows) + "\n")
    return path, runs


def test_calibrate_csv_then_profile_moves_a_heldout_estimate(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    csv_path, runs = _runs_csv(tmp_path)
    prof = tmp_path / "cluster-profile.yaml"
    assert main(["calibrate", "--runs", str(csv_path), "--gpu", "h100-80gb", "--out", str(prof)]) == 0
    out = capsys.readouterr().out
    assert "before (preset)" in out and "after (fitted)" in out and f"--profile {prof}" in out
    doc = yaml.safe_load(prof.read_text())
    assert doc["fit"]["n"] == 4 and doc["fit"]["after"]["median_abs"] < doc["fit"]["before"]["median_abs"]
    name, n, seq, gbs, kw = RUN_SPECS[6]  # llama3-70b on 64 GPUs, TP 8 PP 2: not in the CSV
    argv = ["estimate", "-f", "json", "--model", name, "--gpu", "h100-80gb", "--num-gpus", str(n), "--seq-len",
            str(seq), "--gbs", str(gbs), "--tp", str(kw["tp"]), "--pp", str(kw["pp"])]
    base = _json(capsys, argv)["time"]["step_s"]
    tuned = _json(capsys, [*argv, "--profile", str(prof)])["time"]["step_s"]
    measured = runs[6].measured_step_s
    assert abs(tuned / measured - 1) < abs(base / measured - 1) / 2


def test_calibrate_pairs_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = []
    for i, (tp, pp) in enumerate([(1, 1), (2, 2), (4, 1)]):
        est = make_estimate("llama3-8b", 16, 4096, 64, tp=tp, pp=pp)
        man = _manifest(tmp_path, est, "launch").rename(tmp_path / f"m{i}.json")
        pairs += ["--pair", f"{man}:{_log(tmp_path, est, f'{i}.log', step_s=1.25 * float(est.time.step_s))}"]
    prof = tmp_path / "p.yaml"
    doc = _json(capsys, ["calibrate", *pairs, "--gpu", "h100-80gb", "--out", str(prof), "--params",
                         "gemm_max_frac,step_overhead_s", "--format", "json"])
    assert doc["fit"]["before"]["median_abs"] == pytest.approx(0.2, abs=0.01)  # predicted 1/1.25 of measured
    assert doc["fit"]["after"]["median_abs"] < 0.05 and len(doc["runs"]) == 3 and prof.exists()
    assert set(doc["efficiency"]) == {"gemm_max_frac", "step_overhead_s"}


@pytest.mark.parametrize(("argv", "match"), [
    (["--gpu", "h100-80gb", "--out", "x.yaml"], "give --runs"),
    (["--runs", "r.csv", "--gpu", "nogpu", "--out", "x.yaml"], "unknown gpu 'nogpu'"),
    (["--runs", "r.csv", "--gpu", "h100-80gb", "--out", "x.yaml", "--params", "gemm,x"], "--params: unknown 'gemm'"),
    (["--pair", "nocolon", "--gpu", "h100-80gb", "--out", "x.yaml"], "--pair expects"),
])
def test_calibrate_bad_inputs_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert main(["calibrate", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert match in err and "\n" not in err


def test_split_pair() -> None:
    assert split_pair("runs/a/manifest.json:logs/a.log") == ("runs/a/manifest.json", ["logs/a.log"])
    assert split_pair("m.json:a.log,b.log") == ("m.json", ["a.log", "b.log"])
    assert split_pair("dir/manifest:x.log") == ("dir/manifest", ["x.log"])
    with pytest.raises(SpecError):
        split_pair("m.json:")


def test_calibrate_cross_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path, _ = _runs_csv(tmp_path)
    doc = _json(capsys, ["calibrate", "--runs", str(csv_path), "--gpu", "h100-80gb", "--out", str(tmp_path / "p.yaml"),
                         "--params", "gemm_max_frac,nvlink_bus_frac", "--cross-validate", "-f", "json"])
    loo = doc["leave_one_out"]
    assert loo["before"]["n"] == 4 and loo["after"]["median_abs"] < loo["before"]["median_abs"]


def test_next_layout_command_runs_through_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("paraplan.cli.launch")
    est = make_estimate("llama3-8b", 16, 4096, 16, tp=2, pp=4)
    doc = _json(capsys, ["tune", "-f", "json", "--log", _log(tmp_path, est), *FLAGS])
    cmd = shlex.split(doc["findings"][-1]["numbers"]["command"])
    cmd[cmd.index("--out") + 1] = str(tmp_path / "next")
    assert main(cmd[1:]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "next" / "manifest.json").read_text())
    assert manifest["layout"]["tp"] == doc["findings"][-1]["numbers"]["layout"]["tp"]
