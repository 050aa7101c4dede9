"""One placement rule: the --nvlink-only mask of the search and the cost model agree."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.estimate import comm
from paraplan.search import SearchSpace, candidate_table
from paraplan.search import _placement_masks as placement_masks
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


@pytest.mark.parametrize(("span", "block", "inside"), [
    (8, 8, True), (16, 8, False), (64, 64, True), (64, 72, False), (36, 72, True), (48, 72, False), (24, 72, True),
    (96, 72, False), (1, 8, True), (16, 64, True), (32, 48, False),
])
def test_span_in_domain(span: int, block: int, inside: bool) -> None:
    assert bool(comm.span_in_domain(np.array(span), block)) is inside


@pytest.mark.parametrize(("gpu", "n", "block"), [
    ("h100-80gb", 1024, 8),  # HGX: the node
    ("gb200", 72, 72), ("gb200", 48, 48),  # one NVL72 rack: the whole job
    ("gb200", 128, 64), ("gb200", 576, 64),  # several racks in 16-tray segments (launch asks --segment=16)
    ("gb200", 144, 72),  # 36 trays do not tile into 16-tray segments: racks in order, 72 ranks each
])
def test_nvlink_block(gpu: str, n: int, block: int) -> None:
    assert make_cluster(load_gpu(gpu), n).nvlink_block_gpus == block


def test_nvlink_only_mask_matches_the_cost_models_tier() -> None:
    cluster = make_cluster(load_gpu("gb200"), 144)
    model = load_model("qwen3-30b-a3b")  # 128 experts: EP 1..128
    training = TrainingSpec(seq_len=4096, global_batch_size=1152)
    table = candidate_table(model, cluster, training, SearchSpace())
    masks = placement_masks(cluster, table, SearchSpace(allow_cross_node=False))
    ep_span = table.ep * table.etp
    nvlink_a2a = comm.all_to_all_s(cluster, 1e9, table.ep, table.etp, 0.0)
    all_nvlink = np.isclose(nvlink_a2a, 1e9 * (table.ep - 1) / table.ep
                            / (cluster.gpu.nvlink_bytes_per_s * cluster.gpu.efficiency.nvlink_bus_frac))
    ep_rows = table.ep > 1
    assert ep_rows.any() and (~comm.span_in_domain(ep_span, cluster.nvlink_block_gpus) & ep_rows).any()
    # rejected by --nvlink-only exactly where the all-to-all is costed partly on the network
    assert np.array_equal(masks["EP_CROSSES_NVLINK"][ep_rows], ~all_nvlink[ep_rows])


def test_straddling_all_to_all_pays_the_network() -> None:
    cluster = make_cluster(load_gpu("gb200"), 144)
    inside = comm.all_to_all_s(cluster, 1e9, np.array(36), np.array(1), 0.0)
    straddling = comm.all_to_all_s(cluster, 1e9, np.array(48), np.array(1), 0.0)  # 48 does not tile 72
    assert float(straddling) > 2 * float(inside)


def _busbw(cluster, n: int, stride: int) -> float:  # type: ignore[no-untyped-def]
    return float(comm.ring_busbw(cluster, np.array(n), np.array(stride)))


def test_ring_busbw_inside_a_node_is_nvlink() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 64, 8)
    g = cluster.gpu
    assert _busbw(cluster, 8, 1) == pytest.approx(g.nvlink_bytes_per_s * g.efficiency.nvlink_bus_frac)


def test_ring_busbw_across_nodes_uses_every_members_nic() -> None:
    cluster = make_cluster(load_gpu("h100-80gb"), 64, 8)
    g = cluster.gpu
    nic = g.network_bytes_per_s * g.efficiency.network_bus_frac
    nvl = g.nvlink_bytes_per_s * g.efficiency.nvlink_bus_frac
    assert _busbw(cluster, 8, 8) == pytest.approx(nic)            # DP under TP 8: one member per node
    assert _busbw(cluster, 16, 4) == pytest.approx(2 * nic)       # TP 4: two members per node
    assert _busbw(cluster, 64, 1) == pytest.approx(min(nvl, 8 * nic))  # TP 1: eight NICs per node


def test_ring_busbw_matches_nccl_tests_119() -> None:
    # nccl-tests#119: 8 A100 per node with 4 HDR NICs -> 100 GB/s theoretical busbw, 85-96 measured
    from dataclasses import replace

    gpu = load_gpu("a100-80gb")
    gpu = replace(gpu, network_bytes_per_s=4 * 25e9 / 8)  # 4 x 200 Gb/s shared by 8 GPUs
    cluster = make_cluster(gpu, 16, 8)
    assert 85e9 <= _busbw(cluster, 16, 1) <= 100e9
