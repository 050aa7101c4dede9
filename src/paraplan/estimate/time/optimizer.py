"""The optimizer step: Adam over the local parameters at HBM bandwidth."""

from __future__ import annotations

from typing import Final

from paraplan.estimate.time.compute import hbm_rate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.num import Num

OPTIMIZER_BYTES_PER_PARAM: Final = 34.0
"""Adam step per local parameter: read grad 4 + master/m/v 12, write master/m/v 12 + bf16 param 2,
grad-norm read 4 (Megatron ``DistributedOptimizer.step``: fp32 main grads, params, exp_avg,
exp_avg_sq; the bf16 copy written back)."""


def optimizer_s(cluster: ClusterSpec, local_params: Num) -> Num:
    """Optimizer step time: ``OPTIMIZER_BYTES_PER_PARAM`` x local parameters at ``hbm_rate``
    (memory-bound element-wise kernels)."""
    return OPTIMIZER_BYTES_PER_PARAM * local_params / hbm_rate(cluster)
