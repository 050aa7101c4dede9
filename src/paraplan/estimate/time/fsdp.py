"""Megatron-FSDP (``--data-parallel-sharding-strategy optim_grads_params``, ZeRO-3) as Megatron-FSDP schedules
its collectives, and where NVIDIA runs it.

Source: megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py (Megatron-LM d98e8a6) and the guide
docs/user-guide/features/megatron_fsdp.md ("FSDP Module Hooks"):

* The FSDP unit is a ``TransformerLayer`` (``mcore_fsdp_adapter.py``: ``fsdp_unit_modules``); each virtual
  pipeline chunk is its own FSDP instance.
* ``_pre_forward_param_unshard``: the unit's parameters are all-gathered before its forward and the next units
  prefetched (``all_gather_params``, FORWARD_PASS_ORDER); ``_post_forward`` releases them.
* ``_pre_backward_param_unshard``: gathered again before its backward (BACKWARD_PASS_ORDER prefetch); with
  activation recomputation the recompute forward reuses that gather (``lazy_release``), no third gather.
* ``_process_post_backward_gradients``: with ``optim_grads``/``optim_grads_params`` the unit's gradients are
  reduce-scattered after every backward (``grad_reduce_every_bprop``): every micro-batch, not once per step;
  ``finish_grad_sync`` waits for the last one before the optimizer step.

* The overlap switches do not turn the overlap off: ``MegatronFSDP.__init__`` sets
  ``ddp_config.overlap_param_gather = True`` for ``optim_grads_params`` and ``overlap_grad_reduce = True`` for
  ``optim_grads``/``optim_grads_params`` ("Default to overlapped ... when fully-sharding", megatron_fsdp.py
  ~328-337; ``synchronize_gradient_reduce`` asserts "Cannot sync-reduce gradients for optim_grads /
  optim_grads_params"), so ``--no-overlap-param-gather`` / ``--no-overlap-grad-reduce`` (Megatron's default: both
  off) change nothing under Megatron-FSDP and are costed as on (``overlap_note``).

So per micro-batch every rank moves two gathers and one reduce-scatter of its stage's parameters, and the
overlap that hides them is per unit: the next unit's gather runs behind this unit's compute (forward behind the
forward, gather and reduce-scatter behind the backward), so at most one unit's compute hides one unit's traffic.
The first unit of each chunk and pass has nothing to hide behind (its hook issues the gather when the chunk
starts)."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.estimate.time.compute import GEMM_FWD_BWD_FACTOR
from paraplan.specs.num import Int, Num

FSDP_GATHERS_PER_MICROBATCH: Final = 2.0
"""Megatron-FSDP gathers every unit twice per micro-batch: before its forward and again before its backward
(``_pre_forward_param_unshard``, ``_pre_backward_param_unshard``)."""
FSDP_REDUCE_SCATTERS_PER_MICROBATCH: Final = 1.0
"""And reduce-scatters its gradients after every backward (``grad_reduce_every_bprop``)."""


def units_per_rank(num_layers: Int, pp: Int) -> Num:
    """FSDP units (transformer layers, MTP layers included) on one pipeline rank: ``num_layers / pp``, at least 1
    (an uneven pipeline split is averaged)."""
    return np.maximum(np.asarray(num_layers, dtype=float) / pp, 1.0)


def link_s(gather_s: Num, grad_s: Num, num_microbatches: Num) -> Num:
    """Link time per step: ``m x (FSDP_GATHERS_PER_MICROBATCH x gather + reduce-scatter)`` of the stage's parameters
    (``gather_s``, ``grad_s``: one collective of all of them)."""
    return num_microbatches * (FSDP_GATHERS_PER_MICROBATCH * gather_s + FSDP_REDUCE_SCATTERS_PER_MICROBATCH * grad_s)


def exposed_per_microbatch_s(gather_s: Num, grad_s: Num, forward_window_s: Num, backward_window_s: Num,
                             units: Num, chunks: Num) -> Num:
    """Exposed FSDP time of one micro-batch on one pipeline rank.

    Per unit: ``g = gather_s / units``, ``r = grad_s / units``, forward window ``wf = forward_window_s / units``,
    backward window ``wb = backward_window_s / units`` (the compute that can run beside a collective)::

        forward  = c x g + (u - c) x max(g - wf, 0)
        backward = c x g + (u - c) x max(g + r - wb, 0) + c x max(r - wb, 0)

    ``c = min(chunks, units)``: the first unit of every chunk waits for its own gather in each pass; each later
    unit's gather (and, backward, the previous unit's reduce-scatter) hides behind one unit's compute only; the
    reduce-scatter of a chunk's last unit hides behind the next unit's compute alone (megatron_fsdp.py pre-forward
    / pre-backward hooks, see the module docstring)."""
    u = np.maximum(units, 1.0)
    c = np.minimum(chunks, u)
    g, r = gather_s / u, grad_s / u
    forward = c * g + (u - c) * np.maximum(g - forward_window_s / u, 0.0)
    backward = (c * g + (u - c) * np.maximum(g + r - backward_window_s / u, 0.0)
                + c * np.maximum(r - backward_window_s / u, 0.0))
    out: Num = forward + backward
    return out


def exposed_s(gather_s: Num, grad_s: Num, stage_s: Num, recompute_s: Num, overlap_frac: Num, units: Num,
              chunks: Num, num_microbatches: Num) -> Num:
    """Exposed FSDP time per step: ``m x exposed_per_microbatch_s + r`` (``r``: the last unit's reduce-scatter,
    which ``finish_grad_sync`` waits for before the optimizer step).

    Windows (``overlap_frac``: the share of compute that runs beside a collective, ``dp_overlap_frac``): forward
    ``f x (stage - recompute) / GEMM_FWD_BWD_FACTOR``; backward ``f x stage`` less that forward share (it holds
    dgrad, wgrad and the recompute, which reuses the backward gather). ``stage_s``: one micro-batch on the rank."""
    forward = (stage_s - recompute_s) / GEMM_FWD_BWD_FACTOR
    backward = stage_s - forward
    per_mb = exposed_per_microbatch_s(gather_s, grad_s, overlap_frac * forward, overlap_frac * backward,
                                      units, chunks)
    return num_microbatches * per_mb + grad_s / np.maximum(units, 1.0)


def overlap_note(fsdp: bool, overlap_grad_reduce: bool, overlap_param_gather: bool) -> str | None:
    """A note for a Megatron-FSDP layout with an overlap switch off (None otherwise): Megatron-FSDP turns both back
    on (megatron_fsdp.py, see the module docstring), so the estimate overlaps them as Megatron will."""
    off = [flag for flag, on in (("--overlap-grad-reduce", overlap_grad_reduce),
                                 ("--overlap-param-gather", overlap_param_gather)) if not on]
    if not fsdp or not off:
        return None
    return (f"{' and '.join(off)} off: no effect under Megatron-FSDP (optim_grads_params), MegatronFSDP sets "
            "overlap_grad_reduce and overlap_param_gather to True itself (megatron_fsdp.py), so the gathers and "
            "reduce-scatters are costed overlapped")


FSDP_BLACKWELL_ARCHS: Final = ("blackwell",)
"""GPU architectures of compute capability 10 or later (``GpuSpec.arch``)."""
FSDP_RECIPE_MAX_TP: Final = 2
"""Largest TP NVIDIA runs Megatron-FSDP with (Llama-3.1-405B on B300/GB300/VR200, bridge_perf_recipes.csv)."""
FSDP_SCOPE: Final = ("PP 1, CP 1, TP 1 (TP up to 2 on Blackwell): where NVIDIA runs Megatron-FSDP "
                     "(Megatron-Bridge perf recipes, Megatron's examples/megatron_fsdp; validate_args warns "
                     "against TP or CP > 1 with Megatron-FSDP before Blackwell)")
"""The default search scope of Megatron-FSDP, in words (``benchmarked``)."""


def benchmarked(tp: Int, pp: Int, cp: Int, arch: str) -> np.bool_ | np.ndarray:
    """Whether Megatron-FSDP on (TP, PP, CP) is a combination NVIDIA runs and benchmarks:
    ``pp == 1 and cp == 1 and (tp == 1 or (arch is Blackwell and tp <= FSDP_RECIPE_MAX_TP))``.

    Sources: every ``use_megatron_fsdp`` recipe of Megatron-Bridge (../shared/reference/bridge_perf_recipes.csv,
    24 rows) has PP 1, CP 1, no VP and TP 1 or 2, all on B200/B300/GB200/GB300/VR200; Megatron-LM's own
    examples/megatron_fsdp run TP 1, CP 1, PP 1 (Llama-3-8B on H100, DeepSeek-V3); megatron/training/arguments.py
    warns "Try not to using them together" for TP or CP > 1 with Megatron-FSDP before compute capability 10 (they
    need CUDA_DEVICE_MAX_CONNECTIONS = 1, Megatron-FSDP needs it unset). EP is free (DeepSeek-V3 EP 8-64)."""
    blackwell = arch in FSDP_BLACKWELL_ARCHS
    tp_ok = (np.asarray(tp) == 1) | (blackwell & (np.asarray(tp) <= FSDP_RECIPE_MAX_TP))
    out: np.bool_ | np.ndarray = (np.asarray(pp) == 1) & (np.asarray(cp) == 1) & tp_ok
    return out


def scope_note(tp: int, pp: int, cp: int, arch: str) -> str | None:
    """A note for a Megatron-FSDP layout outside ``benchmarked`` (None inside): Megatron's own warning for TP or CP
    before Blackwell, and that NVIDIA runs no such combination."""
    if bool(benchmarked(tp, pp, cp, arch)):
        return None
    warn = (" (Megatron warns: 'Using tensor model parallelism or context parallelism with Megatron-FSDP together. "
            "Try not to using them together since they require different CUDA_MAX_CONNECTIONS settings')"
            if (tp > 1 or cp > 1) and arch not in FSDP_BLACKWELL_ARCHS else "")
    return (f"Megatron-FSDP at TP {tp}, PP {pp}, CP {cp} on {arch or 'this GPU'} is outside the combinations NVIDIA "
            f"runs ({FSDP_SCOPE}){warn}")
