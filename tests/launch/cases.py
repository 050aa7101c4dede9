"""Fixed launch cases shared by the launch tests (snapshots, shell checks, YAML checks)."""

from __future__ import annotations

from pathlib import Path

from paraplan.launch.render import LaunchSpec
from paraplan.launch.site import SiteProfile, site_from_dict
from paraplan.layout import ParallelLayout, layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

HERE = Path(__file__).parent
SNAPSHOTS = HERE / "snapshots"
FIXTURES = HERE / "fixtures"
TSV = Path(__file__).parents[2].parent / "shared/reference/megatron_lm_flags_main_d98e8a6.tsv"

SITE = {
    "partition": "batch", "account": "llm-team", "time": "04:00:00",
    "container_image": "nvcr.io/nvidia/nemo:25.07", "container_mounts": ["/lustre:/lustre"],
    "modules": ["cuda/12.8"], "env": {"NCCL_IB_SL": "1", "DATA_PATH": "/lustre/data/pile_text_document"},
    "namespace": "training", "image_pull_secret": "ngc", "extra_sbatch": ["--qos=high"],
}


def site() -> SiteProfile:
    return site_from_dict(SITE)


def llama70b_spec(site_profile: SiteProfile | None = None) -> LaunchSpec:
    """llama3-70b on 64 x H100: TP4 PP4 VP5 CP2 DP2, seq 8192, GBS 512 (8 nodes)."""
    model = load_model("llama3-70b")
    cluster = make_cluster(load_gpu("h100-80gb"), 64)
    layout = layout_for_world(64, tp=4, pp=4, vp=5, cp=2)
    training = TrainingSpec(seq_len=8192, global_batch_size=512)
    return LaunchSpec(model=model, cluster=cluster, training=training, layout=layout,
                      site=site_profile or site())


def moe_single_node_spec() -> LaunchSpec:
    """mixtral-8x7b on one 8 x H100 node: TP2 EP4 ETP1, full recompute, FP8, FSDP (no site)."""
    model = load_model("mixtral-8x7b")
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    layout = ParallelLayout(tp=2, ep=4, etp=1, dp=4, recompute="full", recompute_num_layers=2,
                            fsdp=True, distributed_optimizer=False)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision="fp8")
    return LaunchSpec(model=model, cluster=cluster, training=training, layout=layout,
                      site=SiteProfile())


def deepseek_uneven_spec() -> LaunchSpec:
    """deepseek-v3 (MLA, MoE, MTP) on 1024 x H100: PP16 uneven 3/2, VP1, EP64, Blackwell-free."""
    model = load_model("deepseek-v3")
    cluster = make_cluster(load_gpu("h100-80gb"), 1024)
    layout = layout_for_world(1024, tp=2, pp=16, ep=64, etp=1, first_stage_layers=3,
                              last_stage_layers=2, recompute="full", recompute_num_layers=1)
    training = TrainingSpec(seq_len=4096, global_batch_size=4096)
    return LaunchSpec(model=model, cluster=cluster, training=training, layout=layout)


def deepseek_gb200_spec() -> LaunchSpec:
    """deepseek-v3 (MLA, MoE, MTP) on 256 GB200 (64 NVL72 nodes), FP8 (MXFP8), PP4 uneven 16/15, EP64, with a
    Kubernetes site: ComputeDomain, Bridge performance recipe."""
    model = load_model("deepseek-v3")
    cluster = make_cluster(load_gpu("gb200"), 256)
    layout = layout_for_world(256, pp=4, ep=64, etp=1, first_stage_layers=16, last_stage_layers=15,
                              recompute_modules=("mla_up_proj", "mlp"))
    training = TrainingSpec(seq_len=4096, global_batch_size=512, precision="fp8", fp8_recipe="mxfp8")
    k8s = site_from_dict({**SITE, "checkpoint_dir": "/lustre/checkpoints", "kubernetes": {
        "queue": "team-a", "rdma_resources": {"nvidia.com/hostdev": 4},
        "volumes": [{"name": "lustre", "mount_path": "/lustre", "pvc": "lustre-pvc"}],
        "topology_key": "nvidia.com/gpu.clique"}})
    return LaunchSpec(model=model, cluster=cluster, training=training, layout=layout, site=k8s)


CASES = {"llama70b": llama70b_spec, "moe_single_node": moe_single_node_spec, "deepseek_gb200": deepseek_gb200_spec}
