"""The site profile: safe defaults, validation, unknown keys rejected in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.launch.render import render_files
from paraplan.launch.site import DEFAULT_MEGATRON_PATH, SiteProfile, load_site, site_from_dict

from .cases import SITE, llama70b_spec


def test_defaults_emit_nothing_site_specific() -> None:
    site = load_site(None)
    assert site == SiteProfile() and site.megatron_path == DEFAULT_MEGATRON_PATH
    files = render_files(llama70b_spec(SiteProfile()), ["all"])
    sbatch = files["job.sbatch"]
    assert "--partition" not in sbatch and "--account" not in sbatch and "--container-image" not in sbatch
    assert "module load" not in sbatch


def test_yaml_file_round_trips(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(SITE), encoding="utf-8")
    site = load_site(path)
    assert site.partition == "batch" and site.container_mounts == ("/lustre:/lustre",)
    assert dict(site.env)["NCCL_IB_SL"] == "1"
    assert site.as_dict()["env"] == SITE["env"]


def test_unknown_key_is_named_in_one_line() -> None:
    with pytest.raises(SpecError, match="site: unknown key 'partion'") as err:
        site_from_dict({"partion": "batch"})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("data", "match"), [
    ({"time": 14400}, "quote the time limit"),
    ({"partition": "batch; rm -rf /"}, "site.partition"),
    ({"env": {"BAD-NAME": "1"}}, "not a valid environment variable name"),
    ({"env": {"NCCL_DEBUG": True}}, "quote values"),
    ({"env": ["NCCL_DEBUG=INFO"]}, "expected a mapping"),
    ({"modules": 3}, "expected a list of strings"),
    ({"extra_sbatch": ["qos high"]}, "not an sbatch option"),
    ({"extra_sbatch": ["--nodes=2"]}, "sets the job geometry"),
    ({"extra_sbatch": ["--ntasks-per-node=8"]}, "sets the job geometry"),
    ({"extra_sbatch": ["--gpus-per-node=4"]}, "sets the job geometry"),
    ({"extra_sbatch": ["-N2"]}, "sets the job geometry"),
    ({"extra_sbatch": ["--gres=gpu:8"]}, "sets the job geometry"),
    ({"megatron_path": "/opt/megatron lm"}, "site.megatron_path"),
])
def test_bad_values_are_rejected(data: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        site_from_dict(data)


def test_container_mounts_accept_the_pyxis_string() -> None:
    assert site_from_dict({"container_mounts": "/a:/a,/b:/b"}).container_mounts == ("/a:/a", "/b:/b")


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("partition: [\n", encoding="utf-8")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_site(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_site(tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n", encoding="utf-8")
    with pytest.raises(SpecError, match="must hold a mapping"):
        load_site(listing)


def test_other_sbatch_options_and_non_gpu_gres_pass() -> None:
    site = site_from_dict({"extra_sbatch": ["--qos=high", "--gres=nvme:1", "--mem=0", "--exclusive"]})
    assert site.extra_sbatch == ("--qos=high", "--gres=nvme:1", "--mem=0", "--exclusive")


@pytest.mark.parametrize("value", ["8", "0"])
def test_site_max_connections_that_megatron_rejects_for_tp_is_an_error(value: str) -> None:
    # TP 4 on H100: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1; the site may not override it.
    spec = llama70b_spec(site_from_dict({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": value}}))
    with pytest.raises(SpecError, match=r"site\.env\.CUDA_DEVICE_MAX_CONNECTIONS.*to 1") as err:
        render_files(spec, ["all"])
    assert "\n" not in str(err.value)
    ok = render_files(llama70b_spec(site_from_dict({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}})), ["all"])
    assert ok["env.sh"].count("export CUDA_DEVICE_MAX_CONNECTIONS=1") == 1


def test_site_max_connections_1_with_fsdp_is_an_error() -> None:
    # Megatron-FSDP asserts 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.'; the pod env
    # has no unset, so a site value of 1 would crash the Kubernetes launch.
    from dataclasses import replace

    from .cases import moe_single_node_spec

    bad = replace(moe_single_node_spec(), site=site_from_dict({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}))
    with pytest.raises(SpecError, match="conflicts with Megatron-FSDP"):
        render_files(bad, ["k8s"])
    good = replace(moe_single_node_spec(), site=site_from_dict({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}}))
    import yaml

    doc = yaml.safe_load(render_files(good, ["k8s"])["pytorchjob.yaml"])
    env = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "32"} in env  # a string, as Kubernetes requires


def test_every_error_of_a_site_file_is_reported_in_one_line(tmp_path: Path) -> None:
    from paraplan.cli import main

    path = tmp_path / "site.yaml"
    path.write_text("partition: 'a b'\ncolour: blue\nstorage_gbps: -1\nkubernetes:\n  queue: Team_A\n"
                    "  shm_size: lots\nenv:\n  NCCL_IB_SL: true\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_site(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith("site.yaml: 6 errors: ")
    for part in ("site.partition:", "site: unknown key 'colour'", "site.storage_gbps:", "site.kubernetes.queue:",
                 "site.kubernetes.shm_size:", "site.env.NCCL_IB_SL:"):
        assert text.count(part) == 1, part
    assert len(text.split("; site")) == 6  # joined with "; ", one entry each
    args = ["launch", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--site", str(path), "--out", str(tmp_path / "out")]
    assert main(args) == 1
    assert not (tmp_path / "out").exists()


def test_a_single_site_error_reads_as_itself() -> None:
    with pytest.raises(SpecError, match=r"^site\.storage_gbps: expected a number"):
        site_from_dict({"storage_gbps": -1})
