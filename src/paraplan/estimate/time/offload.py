"""Host <-> device transfers of activation offloading and the optimizer's CPU offload.

Activation offloading (``--cpu-offloading-num-layers``, ``--fine-grained-activation-offloading``) copies the
offloaded activations of every micro-batch to the host during its forward pass and back during its backward
pass, on a side stream (TE ``cpu_offload.py``; Megatron ``fine_grained_activation_offload.py``): each direction
moves ``offloaded bytes`` over the host link (``GpuSpec.host_bytes_per_s``: PCIe Gen5 on HGX, NVLink-C2C on
GB200/GB300) and hides behind the compute of the same pass (the layers after the one offloading, the layers
before the one reloading). Only what the pass's compute cannot cover is exposed:

    exposed = max(0, B / bw - t_fwd) + max(0, B / bw - t_bwd)   per micro-batch,  t_fwd = t / 3, t_bwd = 2t / 3

(``t``: the stage's forward + backward compute, split 1 : 2 as the GEMM FLOPs are). The optimizer's CPU
offload (``--optimizer-cpu-offload``, ``optimizer/cpu_offloading/hybrid_optimizer.py``
``HybridDeviceOptimizer``) moves the host share's gradients down and its updated bf16 parameters up every
step and runs Adam on the host (``host_adam_s``).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.specs.num import Num
from paraplan.specs.training import PARAM_BYTES, TrainingSpec, main_grad_bytes

FORWARD_SHARE: Final = 1.0 / 3.0
"""Forward share of a layer's forward + backward compute (GEMMs: 2 of 6 FLOPs per parameter and token)."""
HOST_ADAM_BYTES_PER_PARAM: Final = 36.0
"""Host memory traffic of one CPU Adam step per parameter (torch.optim.Adam on fp32 tensors: read grad, param,
m, v 16 B; write param, m, v 12 B; the bf16 copy 2 B and the fp32 grad landing from the GPU 4 B + 2 B slack for
the ``foreach`` temporaries)."""
HOST_ADAM_MEMORY_BYTES_PER_S: Final = 100e9
"""Host memory bandwidth one GPU's CPU Adam gets, bytes/s (assumed, not fitted: a two-socket DDR5 host streams
about 600-800 GB/s shared by 8 GPUs, a Grace CPU about 500 GB/s shared by 2; docs/model.md)."""


TRANSFERS_PER_MICROBATCH: Final = 2
"""Copies of each offloaded activation per micro-batch: to the host in forward, back in backward."""


def activation_offload_link_s(offloaded_bytes: Num, host_bytes_per_s: float) -> Num:
    """Host-link time of one micro-batch's offloaded activations, both directions: 2 B / bw."""
    return TRANSFERS_PER_MICROBATCH * offloaded_bytes / host_bytes_per_s


def activation_offload_exposed_s(offloaded_bytes: Num, host_bytes_per_s: float, compute_s: Num) -> Num:
    """Exposed transfer time of one micro-batch's offloaded activations (module docstring formula)."""
    one_way = offloaded_bytes / host_bytes_per_s
    fwd = FORWARD_SHARE * compute_s
    return np.maximum(one_way - fwd, 0.0) + np.maximum(one_way - (compute_s - fwd), 0.0)


def optimizer_offload_s(training: TrainingSpec, local_params: Num, host_bytes_per_s: float) -> Num:
    """Extra optimizer time of ``--optimizer-cpu-offload`` per step: the host share ``f`` of the local parameters
    moves its gradients to the host (main-grad bytes) and its bf16 parameters back (2 B), then CPU Adam
    streams ``HOST_ADAM_BYTES_PER_PARAM`` per parameter at ``HOST_ADAM_MEMORY_BYTES_PER_S``:

        f * P * (g + 2) / bw_host + f * P * 36 / bw_host_memory

    (the GPU share's step is ``time.optimizer.optimizer_s`` on (1 - f) * P). 0 without CPU offload."""
    if not training.optimizer_cpu_offload:
        return 0.0 * local_params
    host = float(training.optimizer_offload_fraction) * local_params
    transfers = host * (main_grad_bytes(training) + PARAM_BYTES) / host_bytes_per_s
    return transfers + host * HOST_ADAM_BYTES_PER_PARAM / HOST_ADAM_MEMORY_BYTES_PER_S
