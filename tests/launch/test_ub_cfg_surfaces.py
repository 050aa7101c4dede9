"""The ``--tp-comm-overlap-cfg`` surfaces (review findings of session 8): the file reaches every rank (a ConfigMap in
the Kubernetes manifests, the launch directory mounted in a Slurm container), ``check`` goes on with a note when the
file is not here, TE's ``initialize_ub`` method moves and refusals (transformer_engine/pytorch/module/base.py), the
config ignored without ``--tp-comm-overlap``, and a file kept by its path in outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paraplan.errors import SpecError
from paraplan.estimate.time.compute import gemm_s, hbm_rate
from paraplan.estimate.time.layer import dense_mlp_time
from paraplan.launch.kubernetes import UB_CFG_MOUNT
from paraplan.launch.megatron import ub_cfg_ignored_note
from paraplan.launch.parse import parse_file
from paraplan.launch.render import LaunchSpec, render_files, write_files
from paraplan.launch.site import site_from_dict
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec
from paraplan.specs.userbuffers import effective, packaged, resolve, yaml_text
from tests.golden.test_ub_configs import FLAGS, _coll, _lay

UB = "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"
LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
CFG = "/etc/paraplan/userbuffers/tp_comm_overlap_cfg.yaml"


def _spec(site: dict[str, object] | None = None, overlap: bool = True, cfg: str = UB) -> LaunchSpec:
    lay = ParallelLayout(tp=4, pp=4, dp=4, mbs=1, recompute="selective", sequence_parallel=True,
                         distributed_optimizer=True, tp_comm_overlap=overlap)
    spec = LaunchSpec(model=LLAMA, cluster=make_cluster(H100, 64, 8), layout=lay,
                      training=TrainingSpec(seq_len=8192, global_batch_size=512, tp_comm_overlap_cfg=cfg))
    return spec if site is None else replace(spec, site=site_from_dict(site))


# 1. Kubernetes: a ConfigMap in the same file, mounted read-only in every pod; check reads it back -------------------
def test_manifests_ship_the_config_as_a_config_map(tmp_path: Path) -> None:
    files = render_files(_spec(), ["k8s", "trainjob"])
    for name in ("pytorchjob.yaml", "trainjob.yaml"):
        docs = list(yaml.safe_load_all(files[name]))
        assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob" if name == "pytorchjob.yaml" else "TrainJob"]
        cm, job = docs
        assert yaml.safe_load(cm["data"]["tp_comm_overlap_cfg.yaml"]) == packaged()[UB]
        if name == "pytorchjob.yaml":
            pods = [rs["template"]["spec"] for rs in job["spec"]["pytorchReplicaSpecs"].values()]
            args = [c["args"] for p in pods for c in p["containers"]]
            assert len(pods) == 2 and all(a[a.index("--tp-comm-overlap-cfg") + 1] == CFG for a in args)
        else:
            pods = [rj["template"]["spec"]["template"]["spec"] for patch in job["spec"]["runtimePatches"]
                    for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
            assert f"--tp-comm-overlap-cfg={CFG}" in job["spec"]["trainer"]["args"]
        for pod in pods:
            vol = next(v for v in pod["volumes"] if "configMap" in v)
            assert vol["configMap"]["name"] == cm["metadata"]["name"]
            mount = next(m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == vol["name"])
            assert mount == {"name": vol["name"], "mountPath": UB_CFG_MOUNT, "readOnly": True}
        assert "LAUNCH_DIR" not in files[name]
        (tmp_path / name).write_text(files[name])
        parsed = parse_file(tmp_path / name)
        assert resolve(parsed.flags.training_fields["tp_comm_overlap_cfg"]) == packaged()[UB]
        assert any("ConfigMap" in n for n in parsed.flags.notes)


def test_a_manifest_without_the_config_map_is_costed_with_te_defaults(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(render_files(_spec(), ["k8s"])["pytorchjob.yaml"]))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(docs[1]))  # the job alone: the file is on the cluster only
    parsed = parse_file(tmp_path / "job.yaml")
    assert "tp_comm_overlap_cfg" not in parsed.flags.training_fields
    assert any(n.startswith("could not read --tp-comm-overlap-cfg") and "default userbuffers" in n
               for n in parsed.flags.notes)


# 2. Slurm with a container: the launch directory mounted (unless a site mount maps it) -----------------------------
def _srun_words(out: Path, tmp_path: Path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "module"):
        (bin_dir / name).write_text('#!/bin/sh\nprintf "%s\\0" "$(basename "$0")" "$@" >> "$STUB_LOG"\n')
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    log = tmp_path / "stub.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_LOG": str(log), "TOKENIZER_MODEL": "t",
           "DATA_PATH": "/d", "SLURM_NNODES": "8", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-a"}
    subprocess.run(["bash", str(out / "job.sbatch")], cwd=out, env=env, check=True, capture_output=True)
    return log.read_text().split("\0")


@pytest.mark.parametrize("covered", [False, True])
def test_slurm_container_mounts_the_launch_directory(tmp_path: Path, covered: bool) -> None:
    out = (tmp_path / "launch dir").resolve()
    site_mounts = ["/data:/mnt/data:ro", *([f"{tmp_path.resolve()}:{tmp_path.resolve()}"] if covered else [])]
    write_files(render_files(_spec({"container_image": "nvcr.io/nvidia/nemo:25.09",
                                    "container_mounts": site_mounts}), ["slurm"]), out)
    if shutil.which("shellcheck") is not None:
        check = subprocess.run(["shellcheck", "-x", "job.sbatch"], cwd=out, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    words = _srun_words(out, tmp_path)
    mounts = next(w for w in words if w.startswith("--container-mounts="))
    want = ",".join(site_mounts) + ("" if covered else f",{out}:{out}:ro")
    assert mounts == f"--container-mounts={want}"
    args = (out / "megatron_args.sh").read_text()
    assert '"${LAUNCH_DIR:-.}/tp_comm_overlap_cfg.yaml"' in args
    plain = render_files(_spec({"container_image": "img", "container_mounts": site_mounts}, cfg=""), ["slurm"])
    assert "CONTAINER_MOUNTS" not in plain["job.sbatch"]  # no config: the site's mounts as written


# 3. check / --megatron-args: a file that is not here is a note, a malformed one an error ---------------------------
@pytest.mark.parametrize("raw", ["ub_missing.yaml", "${UB_DIR}/ub.yaml", "/lustre/cluster/only/ub.yaml"])
def test_an_unreadable_cfg_is_a_note(raw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", raw], base_dir=str(tmp_path))
    assert "tp_comm_overlap_cfg" not in got.training_fields
    assert [n for n in got.notes if n.startswith("could not read --tp-comm-overlap-cfg")
            and "costed with Transformer Engine's default userbuffers settings" in n]


def test_a_relative_cfg_is_found_beside_the_script_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script_dir, cwd = tmp_path / "job", tmp_path / "cwd"
    script_dir.mkdir()
    cwd.mkdir()
    (script_dir / "ub.yaml").write_text(yaml_text(packaged()[UB]))
    (cwd / "ub.yaml").write_text("qkv_fprop: [1, 2\n")  # malformed: would be refused if read
    monkeypatch.chdir(cwd)
    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", "ub.yaml"], base_dir=str(script_dir))
    assert got.training_fields["tp_comm_overlap_cfg"] == str(script_dir / "ub.yaml")
    with pytest.raises(SpecError, match="not a readable YAML file") as err:
        read_flags([*FLAGS, "--tp-comm-overlap-cfg", "ub.yaml"])  # no script dir: the malformed one here
    assert "\n" not in str(err.value)


# 4. initialize_ub moves a dgrad to its new method's list before get_default_config --------------------------------
def test_a_ring_exchange_dgrad_takes_ring_exchange_defaults() -> None:
    got = effective({"fc1_dgrad": {"method": "ring_exchange"}}, 4)
    g = got["fc1_dgrad"]
    assert (g.method, g.num_sm, g.set_sm_margin, g.num_splits, g.reduce_scatter) == ("ring_exchange", 1, False, 4,
                                                                                    True)
    assert not got["fc1_wgrad"].used and got["qkv_dgrad"].num_sm == 16 and got["qkv_dgrad"].set_sm_margin
    p = effective({"qkv_dgrad": {"method": "pipeline"}})["qkv_dgrad"]
    assert (p.num_sm, p.set_sm_margin, p.num_splits) == (16, True, 4)
    assert effective(None, 8)["qkv_fprop"].num_splits == 8  # tp_size, not a fixed 2
    assert effective(None)["qkv_fprop"].num_splits == 0  # TP size unknown (CommOverlapP2P takes no num_splits)


def test_ring_exchange_dgrad_backward_by_hand(tmp_path: Path) -> None:
    """H100 TP2 BF16, fc1 dgrad ring exchange with --tp-comm-overlap-rs-dgrad (TE ``ub_overlap_rs_dgrad``, which a
    non-bulk dgrad needs): the input-gradient reduce-scatter behind fc1's dgrad on the copy
    engine with no SM margin (TE's ring-exchange defaults), then its final reduction; the input all-gather for
    wgrad runs beside it (NCCL); fc2 dgrad's output-gradient all-gather by ring exchange."""
    path = tmp_path / "ub.yaml"
    path.write_text("fc1_dgrad: {method: ring_exchange}\n")
    cluster = make_cluster(H100, 8, 8)
    lay = _lay(2)
    training = TrainingSpec(seq_len=8192, global_batch_size=16, tp_comm_overlap_cfg=str(path),
                            tp_comm_overlap_rs_dgrad=True)
    T, h, f, t = 8192, LLAMA.hidden_size, LLAMA.ffn, 2
    fc1 = float(gemm_s(cluster, "bf16", T, 2 * f / t, h))
    fc2_dgrad = float(gemm_s(cluster, "bf16", T, f / t, h))
    ag, rs = _coll(cluster, lay, 2.0 * T * h), _coll(cluster, lay, 2.0 * T * h, rs=True)
    reduce = (t * 2.0 + 2.0) * T / t * h / hbm_rate(cluster)
    bwd = max(0.0, ag - fc2_dgrad / 2) + max(0.0, ag - fc1) + max(0.0, rs - fc1 / 2) + reduce
    got = dense_mlp_time(LLAMA, cluster, training, lay, ffn=LLAMA.ffn)
    assert float(got.tp_exposed_s - got.tp_fwd_exposed_s) == pytest.approx(bwd, rel=1e-9)


# 5. TE's own refusals; an empty file is TE's defaults ---------------------------------------------------------------
@pytest.mark.parametrize(("cfg", "words"), [
    ({"proj_fprop": {"is_reduce_scatter": False}}, "is_reduce_scatter false with method pipeline"),
    ({"qkv_dgrad": {"method": "pipeline", "is_reduce_scatter": False}}, "is_reduce_scatter false"),
    ({"qkv_fprop": {"atomic_gemm": True}}, "must both or neither use atomic_gemm"),
    ({"fc2_fprop": {"method": "ring_exchange", "atomic_gemm": True}}, "must both or neither use atomic_gemm"),
])
def test_te_refusals(cfg: dict[str, dict[str, object]], words: str) -> None:
    with pytest.raises(SpecError, match=words):
        TrainingSpec(seq_len=2048, global_batch_size=8, precision="fp8", tp_comm_overlap_cfg=json.dumps(cfg))


def test_atomic_gemm_only_with_fp8() -> None:
    pair = json.dumps({"qkv_fprop": {"atomic_gemm": True},
                       "proj_fprop": {"method": "ring_exchange", "atomic_gemm": True}})
    TrainingSpec(seq_len=2048, global_batch_size=8, precision="fp8", tp_comm_overlap_cfg=pair)
    for kw in ({"precision": "bf16"}, {"precision": "fp8", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True}):
        with pytest.raises(SpecError, match="Atomic GEMM overlap supported only for FP8"):
            TrainingSpec(seq_len=2048, global_batch_size=8, tp_comm_overlap_cfg=pair, **kw)  # type: ignore[arg-type]
    bulk = json.dumps({"qkv_wgrad": {"atomic_gemm": True}})  # refused before add_ub drops it for bulk
    with pytest.raises(SpecError, match="only for FP8"):
        TrainingSpec(seq_len=2048, global_batch_size=8, tp_comm_overlap_cfg=bulk)


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}\n"])
def test_an_empty_yaml_is_te_defaults(text: str, tmp_path: Path) -> None:
    path = tmp_path / "ub.yaml"
    path.write_text(text)
    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", str(path)])
    value = got.training_fields["tp_comm_overlap_cfg"]
    assert resolve(value) == {} and effective(resolve(value)) == effective(None)
    files = render_files(_spec(cfg=value), ["torchrun"])
    assert yaml.safe_load(files["tp_comm_overlap_cfg.yaml"]) == {}


# 6. without --tp-comm-overlap: ignored, not written ------------------------------------------------------------------
def test_cfg_without_tp_comm_overlap_is_ignored() -> None:
    spec = _spec(overlap=False)
    files = render_files(spec, ["all"])
    assert "tp_comm_overlap_cfg.yaml" not in files
    assert all("--tp-comm-overlap-cfg" not in text for text in files.values() if not text.startswith("{"))
    assert ub_cfg_ignored_note(spec.training, spec.layout) == ("tp-comm-overlap-cfg is ignored without "
                                                                "--tp-comm-overlap (not written into launch files)")
    assert ub_cfg_ignored_note(spec.training, _spec().layout) is None


def test_cli_knob_help_and_ignored_note(tmp_path: Path) -> None:
    from paraplan.cli.options import KnobOpt

    assert "tp-comm-overlap-cfg=" in str(KnobOpt.help)
    base = ["--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "4",
            "--seq-len", "8192", "--gbs", "512", "--knob", f"tp-comm-overlap-cfg={UB}"]
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run([str(Path(os.sys.executable).parent / "paraplan"), "launch", *base, "--target", "torchrun",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "tp-comm-overlap-cfg is ignored without --tp-comm-overlap" in run.stdout + run.stderr
    assert not (tmp_path / "o" / "tp_comm_overlap_cfg.yaml").exists()


# 7. a config file keeps its path; CSV cells are JSON text; a user recipe's path applies ---------------------------
def test_a_cfg_file_keeps_its_path(tmp_path: Path) -> None:
    from paraplan.cli.render import estimate_csv
    from paraplan.estimator import estimate

    path = tmp_path / "ub.yaml"
    path.write_text(yaml_text(packaged()[UB]))
    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", str(path)])
    assert got.training_fields["tp_comm_overlap_cfg"] == str(path)
    spec = _spec(cfg=str(path))
    files = render_files(spec, ["torchrun"])
    assert json.loads(files["manifest.json"])["inputs"]["training"]["tp_comm_overlap_cfg"] == str(path)
    assert f"from {path}" in files["tp_comm_overlap_cfg.yaml"]
    est = estimate(spec.model, spec.cluster, layout=spec.layout, training=spec.training)
    assert est.to_dict()["config"]["memory_knobs"]["tp_comm_overlap_cfg"] == str(path)
    row = estimate_csv(est).splitlines()
    cell = next(c for c in _csv_row(row) if c.startswith("{") and "tp_comm_overlap_cfg" in c)
    assert json.loads(cell)["tp_comm_overlap_cfg"] == str(path)


def _csv_row(lines: list[str]) -> list[str]:
    import csv

    return next(csv.reader(lines[1:2]))


def test_a_user_recipe_path_is_applied(tmp_path: Path) -> None:
    from paraplan.recipes.catalogue import Recipe
    from paraplan.recipes.knobs import _ub_knob

    path = tmp_path / "ub.yaml"
    path.write_text(yaml_text(packaged()[UB]))
    r = Recipe(fields={"tp_comm_overlap": True, "tp_comm_overlap_cfg": str(path)}, alias="x", model_preset=None,
               gpu_preset=None)
    assert _ub_knob(r) == {"tp_comm_overlap_cfg": str(path)}
    missing = replace(r, fields={"tp_comm_overlap": True, "tp_comm_overlap_cfg": str(tmp_path / "nope.yaml")})
    assert _ub_knob(missing) == {}
