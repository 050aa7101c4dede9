"""Data-parallel communication: the gradient reduce and the parameter gather over DP x CP (dense
parameters) and expert-DP (expert parameters), per stage, and the share the overlap flags hide.

Megatron-Core DDP reduces gradients in buckets (``ddp_config.bucket_size``); the distributed
optimizer (ZeRO-1) reduce-scatters them and all-gathers the updated bf16 parameters, plain DDP
all-reduces; Megatron-FSDP (``optim_grads_params``, ZeRO-3) gathers the weights for every
micro-batch's forward and backward and reduce-scatters its gradients (Rajbhandari et al. 2020,
arXiv:1910.02054, section 5), layer by layer as ``paraplan.estimate.time.fsdp`` schedules it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from paraplan.estimate import comm
from paraplan.estimate.layouts import StepLayout
from paraplan.estimate.memory import weight_bytes_per_param
from paraplan.estimate.params import ParamTerms, StageLayers, param_terms, stage_params
from paraplan.estimate.time import fsdp
from paraplan.estimate.time.compute import GEMM_FWD_BWD_FACTOR
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.grid import Grid
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num
from paraplan.specs.training import TrainingSpec, main_grad_bytes

DDP_BUCKET_PARAMS: Final = 40_000_000
"""Megatron DDP bucket size (parameters) for gradient reduce-scatter (ddp_config.bucket_size)."""
BACKWARD_GEMMS: Final = 2.0
"""Of the ``GEMM_FWD_BWD_FACTOR`` forward-GEMM times of a micro-batch, the backward's (dgrad, wgrad):
the gradient reduce overlaps the last micro-batch's backward, the parameter gather its first forward."""
PARAM_GATHER_BYTES_PER_PARAM: Final = 2.0
"""The distributed optimizer all-gathers the updated parameters in bf16."""


@dataclass(frozen=True, slots=True)
class DpGroups:
    """Stage-independent inputs of the DP collectives: parameter terms, group sizes, bandwidths."""

    params: ParamTerms
    n_dense: Int
    n_exp: Int
    bw_d: Num
    bw_e: Num
    alpha_d: Num
    """Latency per step on the dense group's tier."""
    alpha_e: Num
    """Latency per step on the expert group's tier."""


def dp_groups(model: ModelSpec, cluster: ClusterSpec, layout: StepLayout, max_positions: int,
              params: ParamTerms | None) -> DpGroups:
    """The dense DP x CP group and the expert-DP group of ``layout`` (``Grid``) and their ring bus
    bandwidths; ``params``: the layout's ``param_terms`` when already computed."""
    grid = Grid.of(layout)
    dense, expert = grid.dp_cp_group, grid.edp_group
    return DpGroups(
        params=params if params is not None else param_terms(model, tp=layout.tp, pp=layout.pp, ep=layout.ep,
                                                             etp=layout.etp, max_positions=max_positions),
        n_dense=dense.size, n_exp=expert.size, bw_d=comm.ring_busbw(cluster, dense.size, dense.stride),
        bw_e=comm.ring_busbw(cluster, expert.size, expert.stride),
        alpha_d=comm.tier_latency_s(cluster, dense.span), alpha_e=comm.tier_latency_s(cluster, expert.span))


def dp_times(model: ModelSpec, cluster: ClusterSpec, layout: StepLayout, stage: StageLayers,
             groups: DpGroups, max_positions: int, training: TrainingSpec) -> tuple[Num, Num, Num]:
    """(gradient reduce, parameter gather, local optimizer params) for one stage, link time.

    Reduce: reduce-scatter (distributed optimizer) or all-reduce (DDP) of the stage's gradients
    (``main_grad_bytes``: bf16 with ``--grad-reduce-in-bf16``); gather: all-gather of its bf16 parameters, FP8
    ones with ``--fp8-param-gather``, NVFP4 ones with ``--fp4-param-gather`` (``memory.weight_bytes_per_param``;
    distributed optimizer only); one latency
    term per ``DDP_BUCKET_PARAMS`` bucket; dense and expert groups in turn. PEFT (``training.peft``): none of the
    three, the frozen weights are in no DDP buffer (param_and_grad_buffer.py) and no optimizer shard."""
    gb = main_grad_bytes(training)
    low = training.fp8_param_gather or training.fp4_param_gather
    pb = weight_bytes_per_param(training) if low else PARAM_GATHER_BYTES_PER_PARAM
    p = stage_params(model, stage, tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                     max_positions=max_positions, terms=groups.params)
    n_dense, n_exp, bw_d, bw_e = groups.n_dense, groups.n_exp, groups.bw_d, groups.bw_e
    buckets_d = np.ceil(p.dense / DDP_BUCKET_PARAMS)
    buckets_e = np.ceil(p.expert / DDP_BUCKET_PARAMS)
    rs = (comm.reduce_scatter_s(gb * p.dense, n_dense, bw_d, groups.alpha_d * buckets_d)
          + comm.reduce_scatter_s(gb * p.expert, n_exp, bw_e, groups.alpha_e * buckets_e))
    ag = (comm.all_gather_s(pb * p.dense, n_dense, bw_d, groups.alpha_d * buckets_d)
          + comm.all_gather_s(pb * p.expert, n_exp, bw_e, groups.alpha_e * buckets_e))
    ar = (comm.all_reduce_s(gb * p.dense, n_dense, bw_d, groups.alpha_d * buckets_d)
          + comm.all_reduce_s(gb * p.expert, n_exp, bw_e, groups.alpha_e * buckets_e))
    grad = np.where(layout.dist_opt, rs, ar)
    gather = np.where(layout.dist_opt, ag, 0.0)
    local = np.where(layout.dist_opt, p.dense / n_dense + p.expert / n_exp, p.total)
    if training.peft:  # frozen base weights: in no grad buffer and no optimizer shard (adapters neglected)
        return 0.0 * grad, 0.0 * gather, 0.0 * local
    return grad, gather, local


def gather_behind_optimizer_s(layout: StepLayout, gather_s: Num, optimizer_s: Num, training: TrainingSpec) -> Num:
    """Parameter all-gather hidden behind the optimizer step by ``--overlap-param-gather-with-optimizer-step``:
    min(gather / v, optimizer x (v - 1) / v).

    Mirrors Megatron-Core: the first model chunk gets its own optimizer (optimizer/__init__.py, ``model_chunks[0]``
    split out), which steps first; ``ChainedOptimizer._step`` (optimizer.py) then dispatches that chunk's parameter
    all-gather (``start_param_sync(force_dispatch=True)``) while the other v - 1 chunks step. With an even split the
    first chunk holds 1/v of the stage's parameters (and of its gather); only with the distributed optimizer,
    --overlap-param-gather and VP > 1 (arguments.py ``validate_args``), else 0."""
    if not training.overlap_param_gather_with_optimizer_step:
        return 0.0
    v = layout.vp
    on = layout.overlap_param_gather & layout.dist_opt & (v > 1)
    return np.where(on, np.minimum(gather_s / v, optimizer_s * (v - 1) / v), 0.0)


def exposed_and_link_s(layout: StepLayout, grad_s: Num, gather_s: Num, hide_s: Num,
                       num_microbatches: Num, *, recompute_hide_s: Num = 0.0, units: Num = 1.0,
                       behind_optimizer_s: Num = 0.0) -> tuple[Num, Num]:
    """(exposed, link) DP time per step. ``hide_s``: ``dp_overlap_frac`` x the stage time (one micro-batch);
    ``recompute_hide_s``: the same share of its recompute; ``units``: FSDP units (layers) on the rank.

    Distributed optimizer / DDP: one gradient reduce and one parameter gather per step, hidden
    (with --overlap-grad-reduce / --overlap-param-gather) behind the last micro-batch's backward
    (``BACKWARD_GEMMS`` / ``GEMM_FWD_BWD_FACTOR`` of it) and the first forward (1 /
    ``GEMM_FWD_BWD_FACTOR``), less ``behind_optimizer_s`` already hidden behind the optimizer step
    (``gather_behind_optimizer_s``). FSDP: every micro-batch two gathers and a reduce-scatter, hidden unit by
    unit (``fsdp.exposed_s``; the overlap flags are not read: Megatron-FSDP forces both on for ``optim_grads_params``,
    megatron_fsdp.py, ``fsdp.overlap_note``)."""
    m = num_microbatches
    grad_exp = np.where(layout.overlap_grad_reduce,
                        np.maximum(grad_s - hide_s * BACKWARD_GEMMS / GEMM_FWD_BWD_FACTOR, 0.0), grad_s)
    gath_exp = np.where(layout.overlap_param_gather & layout.dist_opt,
                        np.maximum(gather_s - behind_optimizer_s - hide_s / GEMM_FWD_BWD_FACTOR, 0.0), gather_s)
    # hide_s and recompute_hide_s carry the same overlap share: pass it as 1 on the pre-multiplied windows
    fsdp_exposed = fsdp.exposed_s(gather_s, grad_s, hide_s, recompute_hide_s, 1.0, units, layout.vp, m)
    exposed = np.where(layout.fsdp, fsdp_exposed, grad_exp + gath_exp)
    link = np.where(layout.fsdp, fsdp.link_s(gather_s, grad_s, m), grad_s + gather_s)
    return exposed, link
