"""The optimizer step: Adam over the local parameters at HBM bandwidth."""

from __future__ import annotations

from typing import Final

from paraplan.estimate.time.compute import hbm_rate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.num import Num
from paraplan.specs.training import TrainingSpec, main_grad_bytes

OPTIMIZER_BYTES_PER_PARAM: Final = 34.0
"""Adam step per local parameter: read grad 4 + master/m/v 12, write master/m/v 12 + bf16 param 2,
grad-norm read 4 (Megatron ``DistributedOptimizer.step``: fp32 main grads, params, exp_avg,
exp_avg_sq; the bf16 copy written back)."""


UNFUSED_GRAD_ACCUMULATION_BYTES_PER_PARAM: Final = 4.0
"""Without gradient-accumulation fusion, per parameter and micro-batch: the bf16 ``.grad`` written by the wgrad GEMM
(2) and read back by the add (2); the main gradient read and written comes on top (``main_grad_bytes`` each)."""
MAIN_GRAD_PASSES_PER_ADD: Final = 2.0
"""``main_grad.add_`` reads the main gradient and writes it back: two passes of ``main_grad_bytes``."""


def grad_accumulation_s(cluster: ClusterSpec, training: TrainingSpec, params: Num) -> Num:
    """Per micro-batch, the weight gradients added into the main gradients: 0 with gradient-accumulation fusion
    (TE's wgrad GEMM accumulates into ``main_grad`` itself); without it, ``main_grad.add_(param.grad)`` over the
    stage's ``params`` (megatron/core/distributed/distributed_data_parallel.py ``_make_backward_post_hook``):
    (``UNFUSED_GRAD_ACCUMULATION_BYTES_PER_PARAM`` + ``MAIN_GRAD_PASSES_PER_ADD`` x ``main_grad_bytes``)
    x params at ``hbm_rate``."""
    if training.gradient_accumulation_fusion:
        return 0.0
    per_param = UNFUSED_GRAD_ACCUMULATION_BYTES_PER_PARAM + MAIN_GRAD_PASSES_PER_ADD * main_grad_bytes(training)
    return per_param * params / hbm_rate(cluster)


def optimizer_s(cluster: ClusterSpec, local_params: Num) -> Num:
    """Optimizer step time: ``OPTIMIZER_BYTES_PER_PARAM`` x local parameters at ``hbm_rate``
    (memory-bound element-wise kernels)."""
    return OPTIMIZER_BYTES_PER_PARAM * local_params / hbm_rate(cluster)
