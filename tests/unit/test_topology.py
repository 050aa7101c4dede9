"""Tiered topology: the two-tier default, a leaf/spine fabric (golden bandwidths by hand), the GPU
file / --gpu-set forms and their one-line errors, and the plan a 4:1 spine changes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.estimate import comm
from paraplan.estimator import estimate
from paraplan.search import plan
from paraplan.specs.cluster import ClusterSpec, make_cluster
from paraplan.specs.grid import Grid
from paraplan.specs.load import load_gpu, load_model, override_gpu
from paraplan.specs.training import TrainingSpec

LEAF_SPINE = [{"name": "nvlink"}, {"name": "leaf", "size_gpus": 256}, {"name": "spine", "oversubscription": 4}]
NVLINK_BUSBW = 450e9 * 0.80  # h100-80gb: NVLink 450 GB/s per direction x nvlink_bus_frac
NIC_BUSBW = 400e9 / 8 * 0.90  # ConnectX-7 400 Gb/s x network_bus_frac


def h100(n: int, tiers: list[dict[str, object]] | None = None) -> ClusterSpec:
    gpu = load_gpu("h100-80gb")
    return make_cluster(override_gpu(gpu, {"topology": tiers}) if tiers else gpu, n)


def test_two_tier_default_is_nvlink_and_network() -> None:
    topo = h100(1024).topology
    assert [(t.name, t.block_gpus) for t in topo.tiers] == [("nvlink", 8), ("network", 1024)]
    assert comm.tier_rates(h100(1024)) == pytest.approx((NVLINK_BUSBW, NIC_BUSBW), rel=1e-12)


def test_nvl72_rack_blocks_are_the_first_tier() -> None:
    gb = load_gpu("gb200")
    assert make_cluster(gb, 576).topology.nvlink.block_gpus == 64  # 16-tray segments
    assert make_cluster(gb, 144).topology.nvlink.block_gpus == 72  # racks in order
    assert make_cluster(gb, 48).topology.nvlink.block_gpus == 48  # inside one rack


def test_leaf_spine_golden_bandwidths() -> None:
    c = h100(2048, LEAF_SPINE)
    assert [(t.name, t.block_gpus) for t in c.topology.tiers] == [("nvlink", 8), ("leaf", 256), ("spine", 2048)]
    assert comm.tier_rates(c) == pytest.approx((NVLINK_BUSBW, NIC_BUSBW, NIC_BUSBW / 4), rel=1e-12)
    # a job inside one leaf never meets the spine
    assert h100(128, LEAF_SPINE).topology.tiers[1].block_gpus == 128
    # DP under TP 4: 2 members per 8-GPU node, each with its NIC
    inside_leaf = comm.ring_busbw(c, np.array(64), np.array(4))  # span 256
    across_spine = comm.ring_busbw(c, np.array(512), np.array(4))  # span 2048
    assert float(inside_leaf) == pytest.approx(2 * NIC_BUSBW)  # 81 GB/s
    assert float(across_spine) == pytest.approx(2 * NIC_BUSBW / 4)  # 20.25 GB/s
    assert float(comm.tier_busbw(c, np.array(8))) == pytest.approx(NVLINK_BUSBW)
    # all-to-all over 64 ranks, stride 1: 7 peers on NVLink, 56 in the leaf; over 512 ranks,
    # 7 on NVLink, 248 more in the leaf, 256 across the spine
    a2a_leaf = float(comm.all_to_all_s(c, 1e9, np.array(64), np.array(1), 0.0))
    assert a2a_leaf == pytest.approx(1e9 * (7 / 64 / NVLINK_BUSBW + 56 / 64 / NIC_BUSBW))
    a2a_spine = float(comm.all_to_all_s(c, 1e9, np.array(512), np.array(1), 0.0))
    assert a2a_spine == pytest.approx(1e9 * (7 / 512 / NVLINK_BUSBW + 248 / 512 / NIC_BUSBW
                                             + 256 / 512 / (NIC_BUSBW / 4)))


def test_explicit_two_tiers_equal_the_default() -> None:
    flat = h100(1024)
    explicit = h100(1024, [{"name": "nvlink"}, {"name": "network"}])
    for n, stride in ((8, 1), (128, 8), (64, 4), (1024, 1)):
        a, b = np.array(n), np.array(stride)
        assert comm.ring_busbw(flat, a, b) == comm.ring_busbw(explicit, a, b)
        assert comm.all_to_all_s(flat, 1e9, a, b, 2e-5) == comm.all_to_all_s(explicit, 1e9, a, b, 2e-5)


def test_gpu_set_changes_one_tier() -> None:
    gpu = override_gpu(load_gpu("h100-80gb"), {"topology": LEAF_SPINE, "topology.spine.oversubscription": 2,
                                               "topology.leaf.gbit_per_s": 200})
    rates = comm.tier_rates(make_cluster(gpu, 2048))
    assert rates[1:] == pytest.approx((25e9 * 0.9, 25e9 * 0.9 / 2))  # the spine inherits the leaf's rate


@pytest.mark.parametrize(("overrides", "message"), [
    ({"topology": [{"name": "nvlink"}]}, "topology: needs at least 2 tiers"),
    ({"topology": [{"name": "nvlink", "size_gpus": 4}, {"name": "net"}]}, "topology.nvlink.size_gpus: the first"),
    ({"topology": [{"name": "nvlink"}, {"name": "leaf", "size_gpus": 100}, {"name": "s"}]},
     "topology.leaf.size_gpus must be a multiple"),
    ({"topology": [{"name": "nvlink"}, {"name": "leaf", "size_gpus": 256}]}, "topology.leaf.size_gpus: the last"),
    ({"topology": [{"name": "nvlink"}, {"name": "s", "oversubscription": 0.5}]},
     "gpu.topology.s: oversubscription must be a finite number >= 1"),
    ({"topology": [{"name": "nvlink"}, {"name": "s", "speed": 1}]}, "gpu.topology.s.speed: unknown field"),
    ({"topology": [{"name": "nvlink"}, {"name": "s", "gbit_per_s": 1, "gbyte_per_s": 1}]},
     "gpu.topology.s.gbit_per_s: give one of"),
    ({"topology": [{"name": "nvlink"}, {"name": "n"}], "topology.spine.oversubscription": 4},
     "no tier 'spine' (tiers: nvlink, n)"),
    ({"topology.x": 4}, "expected topology.<tier>.<field>"),
    ({"topology": 5}, "gpu.topology: expected a list of at most 8 tiers"),
    ({"topology": [{"name": f"t{i}"} for i in range(9)]}, "gpu.topology: expected a list of at most 8 tiers"),
    ({"topology": [{"name": "nvlink"}, {"name": "x" * 5000}]}, "tier name must be 1 to 32 letters"),
    ({"topology": [{"name": "nvlink"}, {"name": "n"}], "topology." + "y" * 5000 + ".size_gpus": 4}, "no tier"),
])
def test_bad_topology_is_one_line(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as err:
        override_gpu(load_gpu("h100-80gb"), overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_spine_oversubscription_moves_the_plan_off_the_spine() -> None:
    """4:1 spine over 256-GPU leaves, 2,048 H100s: among the flat network's best layouts is one (CP 2, PP 4)
    that reduces gradients over a DP x CP group spanning the whole job, within 2% of the flat winner (CP 1,
    PP 8, since CP pays for its ring steps' merges); behind the spine that group's ring gets a quarter of each
    NIC, so its DP time grows and nothing else changes, while the tiered best layout keeps its DP x CP group
    inside one leaf."""
    model = load_model("llama3-70b")
    training = TrainingSpec(seq_len=8192, global_batch_size=1024)
    flat, tiered = h100(2048), h100(2048, LEAF_SPINE)
    flat_plan = plan(model, flat, training, top_k=5)
    ev_flat = flat_plan.feasible
    assert ev_flat is not None
    fastest_flat_s = float(ev_flat.step_s.min())  # the flat winner on speed (the pick is tiered)
    spans = np.asarray(Grid.of(ev_flat.table).dp_cp_group.span)
    rows = np.flatnonzero(spans > 256)  # the fastest layout whose DP x CP group spans more than one leaf
    wide = estimate(model, flat, training, ev_flat.table.row(int(rows[np.argmin(ev_flat.step_s[rows])])))
    assert float(wide.time.step_s) <= 1.02 * fastest_flat_s
    tiered_plan = plan(model, tiered, training, top_k=1)
    ev = tiered_plan.feasible
    assert ev is not None
    best_tiered = estimate(model, tiered, training, ev.table.row(int(ev.step_s.argmin())))  # fastest behind the spine
    assert Grid.of(best_tiered.layout).dp_cp_group.span <= 256
    assert best_tiered.layout != wide.layout

    again = estimate(model, tiered, training, wide.layout)
    t0, t1 = wide.time, again.time
    assert t1.step_s > t0.step_s
    assert t1.link_comm_s["dp"] > t0.link_comm_s["dp"]
    for key in ("tp", "cp", "ep"):
        assert t1.link_comm_s[key] == t0.link_comm_s[key]
    assert (t1.compute_s, t1.recompute_s, t1.bubble_s) == (t0.compute_s, t0.recompute_s, t0.bubble_s)
    # the tiered winner beats the wide layout on the tiered fabric and is no faster than the flat winner on flat
    assert best_tiered.time.step_s < t1.step_s
    assert estimate(model, flat, training, best_tiered.layout).time.step_s >= fastest_flat_s * (1 - 1e-12)


def test_gpu_file_and_cli_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fabric.yaml"
    f.write_text("base: h100-80gb\ntopology:\n  - {name: nvlink}\n  - {name: leaf, size_gpus: 256, gbit_per_s: 400}\n"
                 "  - {name: spine, oversubscription: 4}\n")
    rates = comm.tier_rates(make_cluster(load_gpu(str(f)), 2048))
    assert rates == pytest.approx((NVLINK_BUSBW, NIC_BUSBW, NIC_BUSBW / 4), rel=1e-12)
    args = ["estimate", "-m", "llama3-8b", "-g", str(f), "-n", "512", "-s", "4096", "--gbs", "512", "--tp", "2"]
    assert main([*args, "--format", "json"]) == 0
    capsys.readouterr()
    assert main([*args, "--gpu-set", "topology.spine.oversubscription=0"]) == 1
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "oversubscription must be a finite number >= 1" in err


def test_tier_latency_defaults_to_the_collective_latency() -> None:
    tiers = [{"name": "nvlink"}, {"name": "leaf", "size_gpus": 256}, {"name": "spine", "latency_s": 3e-5}]
    c = h100(2048, tiers)
    alpha = c.gpu.efficiency.collective_latency_s
    spans = np.array([8, 256, 2048])
    assert comm.tier_latency_s(c, spans).tolist() == [alpha, alpha, 3e-5]
    # a send across the spine pays the spine's latency
    assert float(comm.p2p_s(0.0, 1.0, comm.tier_latency_s(c, np.array(2048)))) == 3e-5
    with pytest.raises(SpecError, match="latency_s must be a finite number >= 0"):
        override_gpu(c.gpu, {"topology.spine.latency_s": -1})


def test_profile_changes_a_tier(tmp_path: Path) -> None:
    from paraplan.cli.options import resolve_gpu

    prof = tmp_path / "p.yaml"
    prof.write_text("gpu: h100-80gb\nefficiency: {gemm_max_frac: 0.7}\ntopology: {network: {oversubscription: 2}}\n")
    gpu = resolve_gpu("h100-80gb", None, str(prof))
    assert gpu.efficiency.gemm_max_frac == 0.7
    assert comm.tier_rates(make_cluster(gpu, 64)) == pytest.approx((NVLINK_BUSBW, NIC_BUSBW / 2))
    prof.write_text("gpu: h100-80gb\nefficiency: {}\ntopology: [{name: nvlink}, {name: leaf, size_gpus: 256}, "
                    "{name: spine, oversubscription: 4}]\n")
    assert comm.tier_rates(make_cluster(resolve_gpu("h100-80gb", None, str(prof)), 2048))[2] == pytest.approx(
        NIC_BUSBW / 4)
    prof.write_text("gpu: h100-80gb\nefficiency: {}\ntopology: {spine: {oversubscription: 4}}\n")
    with pytest.raises(SpecError, match="no tier 'spine'"):
        resolve_gpu("h100-80gb", None, str(prof))


def test_plan_json_keeps_the_tiers(tmp_path: Path) -> None:
    from paraplan.serialize import inputs_dict, load_plan, save_plan

    model, training = load_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch_size=256)
    assert "topology" not in inputs_dict(model, h100(256), training)["gpu"]  # as before tiers existed
    p = plan(model, h100(512, LEAF_SPINE), training, top_k=1)
    save_plan(p, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").cluster.topology == p.cluster.topology
