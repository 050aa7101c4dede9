"""job.sbatch asks Slurm for rack-local segments when a job spans several NVL72 racks (ecosystem.md 2.2)."""

from __future__ import annotations

import pytest

from paraplan.launch.render import LaunchSpec, render_files, slurm_segment
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec


@pytest.mark.parametrize(("gpu", "num_gpus", "segment"), [
    ("gb200", 128, 16),   # 32 trays: two 16-tray (64-GPU) segments, the groups the cost model keeps on NVLink
    ("gb200", 72, None),  # one rack
    ("gb200", 144, None),  # 36 trays do not tile into 16-tray segments
    ("h100-80gb", 1024, None),  # NVLink domain = one node
])
def test_segment(gpu: str, num_gpus: int, segment: int | None) -> None:
    assert slurm_segment(make_cluster(load_gpu(gpu), num_gpus)) == segment


def test_job_sbatch_carries_the_segment_or_a_warning() -> None:
    def sbatch(n: int) -> str:
        spec = LaunchSpec(model=load_model("qwen3-30b-a3b"), cluster=make_cluster(load_gpu("gb200"), n),
                          training=TrainingSpec(seq_len=4096, global_batch_size=4 * n),
                          layout=layout_for_world(n, tp=1, pp=1, ep=16, etp=1))
        return render_files(spec, ["slurm"])["job.sbatch"]

    assert "#SBATCH --segment=16\n" in sbatch(128) and "WARNING" not in sbatch(128)
    assert "#SBATCH --segment" not in sbatch(144) and "do not tile into 16-node rack segments" in sbatch(144)
