"""Host-device synchronisations of one MoE layer per micro-batch: how many the token dispatcher makes (the host
waits for the GPU's token counts before it can size and issue the next kernels), and which a CUDA graph removes.

Every count mirrors Megatron-LM d98e8a6, megatron/core/transformer/moe/ (token_dispatcher.py, fused_a2a.py) and
megatron/core/transformer/transformer_config.py. What a sync costs is the GPU's wait for the host after it
(``layer.moe_host_sync_s``: ``post_sync_ops`` x ``EfficiencySpec.host_op_issue_s``; ``layer.moe_host_bound_s``: the
rest of the layer's issue beyond its GPU time), one mechanism with one fitted per-op host cost."""

from __future__ import annotations

from typing import Final

import numpy as np

from paraplan.specs.num import Int
from paraplan.specs.training import TrainingSpec

FORWARD_SYNCS_PER_DISPATCH: Final = 1
"""Host syncs one dropless dispatch makes in the forward: the host needs the per-expert token counts on the CPU
to size the received-token buffer and the grouped GEMMs' ``m_splits``, and waits once for them (see
``dispatcher_host_syncs`` for the line in each dispatcher)."""
BACKWARD_SYNCS: Final = 0
"""Host syncs of the backward: none. Every backward all-to-all reuses the host-side counts its forward saved:
``_AllToAll.backward`` (tensor_parallel/mappings.py) the forward's ``input_split_sizes`` / ``output_split_sizes``;
DeepEP's ``FusedDispatch.backward`` / ``FusedCombine.backward`` (fused_a2a.py) the cached ``handle``; HybridEP's
``combine_with_unpermute(handle=ctx.handle)``."""


def sync_free_capture(training: TrainingSpec) -> bool:
    """Whether a CUDA graph captures an MoE layer's dispatch, which makes the layer sync-free (stream capture
    forbids a host sync): ``--cuda-graph-impl full_iteration`` (the whole forward-backward,
    megatron/core/full_cuda_graph.py; the NVIDIA recipes that run it use HybridEP with
    ``moe_expert_rank_capacity_factor`` and the paged stash, Megatron-Bridge perf_recipes qwen/common.py
    ``_enable_hybridep_full_iteration_mxfp8``) when the dispatcher is sync-free (``dispatcher_host_syncs`` 0;
    otherwise the capture fails, a broken rule: rules.py ``FULL_ITERATION_MOE_SYNC_MESSAGE``), or a per-layer graph
    with the ``moe`` module (transformer_layer.py
    ``_get_submodules_under_cudagraphs``: ``self.pre_mlp_layernorm, self.mlp``), which Megatron allows only with
    drop-and-pad (transformer_config.py ``__post_init__``: "moe cuda graph is only supported with drop-padding
    MoE"). ``moe_router`` / ``moe_preprocess`` capture only the router and its metadata: the dispatch and its sync
    run outside the graph. A per-layer graph of the whole layer (``cuda_graph_modules`` empty) is not counted as
    sync-free: Megatron has no rule that makes a dropless MoE layer sync-free there (it moves the alltoall
    dispatcher's copy to ``before_ep_alltoall`` and keeps the wait, ``MoEAlltoAllTokenDispatcher.__init__``), so
    the dispatcher's syncs are counted."""
    impl, mods = training.cuda_graph_impl, training.cuda_graph_modules
    if impl == "full_iteration":  # only with a sync-free dispatcher (rules.CUDA_GRAPH_FULL_ITERATION_MOE_SYNC)
        return dispatcher_host_syncs(training) == 0
    return impl != "none" and "moe" in mods


def drop_and_pad(training: TrainingSpec) -> bool:
    """``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``: every expert receives exactly
    its capacity, so every token count is known on the host before the step (``get_capacity`` on the CPU)."""
    return training.moe_expert_capacity_factor is not None and training.moe_pad_expert_input_to_capacity


def dispatcher_host_syncs(training: TrainingSpec) -> int:
    """Host syncs of one MoE layer's token dispatcher per micro-batch, forward + backward, outside any CUDA graph
    (the backward has none: ``BACKWARD_SYNCS``):

    * ``allgather``: 1. ``MoEAllGatherTokenDispatcher.dispatch_postprocess``: ``tokens_per_expert =
      self.local_map.sum(dim=0).long().cpu()`` (a blocking device-to-host copy; the ``.item()`` after it reads the
      CPU tensor).
    * ``alltoall``: 1 dropless, 0 with drop-and-pad. ``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``
      copies the counts and splits to the host on a side stream at ``cuda_dtoh_point`` and waits once,
      ``self.d2h_event.synchronize()``, at ``cuda_sync_point`` (the earliest point that needs them: before the
      first permutation with a capacity factor, before the EP all-to-all with EP > 1, before returning the counts
      otherwise; ``preprocess``). The whole method is skipped ``if not self.drop_and_pad``: with drop-and-pad
      ``preprocess`` builds the counts with ``torch.full`` on the host from ``get_capacity``.
    * ``flex`` / ``deepep``: 1. ``FusedDispatch.forward`` (fused_a2a.py): ``buffer.dispatch`` returns
      ``num_recv_tokens_per_expert_list``, a Python list ("NOTES: the CPU will wait for GPU's signal to arrive, so
      this is not compatible with CUDA graph"); ``_DeepepManager.get_permuted_hidden_states_by_experts``'s
      ``.sum().item()`` then reads that CPU tensor.
    * ``flex`` / ``hybridep``: 1, or 0 when the received-token count is fixed in advance. ``hybrid_ep_dispatch``
      (fused_a2a.py): ``non_blocking = num_permuted_tokens is not None`` ("If we provide the num_permuted_tokens, we
      do not need to use sync to wait for the data in pinned memory ready"); ``_HybridEPManager.setup_metadata``
      sets it from ``--moe-expert-rank-capacity-factor`` (the static per-rank budget; ``--moe-paged-stash``
      requires it) or from the capacity under drop-and-pad, and leaves it None otherwise ("HybridEP sizes buffers
      dynamically (CPU sync in dispatch)"). ``--moe-hybridep-pad-uneven-dispatch-inputs`` (one more ``.item()``)
      is not a paraplan knob.

    ``--moe-router-force-load-balancing`` changes the logits, not where the host waits: no effect."""
    dispatcher = training.moe_token_dispatcher_type
    syncing = FORWARD_SYNCS_PER_DISPATCH + BACKWARD_SYNCS  # the forward's wait for the counts, none in the backward
    if dispatcher == "allgather":
        return syncing
    if dispatcher == "alltoall":
        return BACKWARD_SYNCS if drop_and_pad(training) else syncing
    if training.moe_flex_dispatcher_backend == "hybridep" and (
            drop_and_pad(training) or training.moe_expert_rank_capacity_factor is not None):
        return BACKWARD_SYNCS
    return syncing


POST_SYNC_OPS: Final = {"allgather": 2, "alltoall": 2, "deepep": 1, "hybridep": 1}
"""Host ops each dispatcher issues from the moment its sync returns to the first kernel that gives the drained GPU
work again (the token exchange): the GPU is idle for exactly these ops' issue time, whatever the layer's GPU time.
Megatron-LM d98e8a6 (token_dispatcher.py, fused_a2a.py) and DeepEP's hybrid-ep branch (csrc/hybrid_ep):

* ``alltoall`` (EP > 1: ``cuda_sync_point`` "before_ep_alltoall"): after ``self.d2h_event.synchronize()`` in
  ``token_dispatch`` the next call is the tokens' ``all_to_all`` (mappings.py ``_AllToAll.forward``: the output
  allocation and ``all_to_all_single``, 2 ops as ``ALLTOALL_OPS`` counts it); the permutation before it was queued
  before the wait.
* ``allgather``: after ``.cpu()`` in ``dispatch_postprocess`` the ``.item()`` on the host tensor and the permute
  call: 2.
* ``deepep``: ``buffer.dispatch`` waits on the host for the notify kernel's counts and launches the dispatch kernel
  in the same C++ call: 1.
* ``hybridep``: ``Executor::metadata_preprocessing`` ends in ``cudaStreamSynchronize(stream)`` (the whole stream
  drains, then the host sums the pinned ``padded_tokens_per_expert``); ``dispatch_with_permute``'s next call is
  ``runtime.dispatch_with_permute``, which launches the dispatch kernel: 1."""


def post_sync_ops(training: TrainingSpec) -> int:
    """``POST_SYNC_OPS`` of the training's dispatcher (flex: by ``moe_flex_dispatcher_backend``)."""
    dispatcher = training.moe_token_dispatcher_type
    if dispatcher == "flex":
        return POST_SYNC_OPS["hybridep" if training.moe_flex_dispatcher_backend == "hybridep" else "deepep"]
    return POST_SYNC_OPS[dispatcher]


def host_syncs_per_moe_layer(training: TrainingSpec) -> int:
    """Host syncs one MoE layer pays per micro-batch, forward + backward: 0 when a CUDA graph captures the
    dispatch (``sync_free_capture``), else ``dispatcher_host_syncs``. All of them are in the forward: full
    recompute and selective ``moe`` recompute, which re-run the MoE forward, pay them again."""
    return 0 if sync_free_capture(training) else dispatcher_host_syncs(training)


# --- host issue work the GPU waits for after a sync (issue 18) ---------------------------------------------------
#
# An "op" is one host-issued call of the layer's Python code path: a PyTorch operator, a Transformer Engine or
# extension call (counted by the kernels its Python wrapper issues), a collective, or a stream / event call. Counted by
# reading Megatron-LM d98e8a6 for one MoE layer and micro-batch, forward and backward (the backward: the autograd
# nodes those ops record). Views and reshapes are counted: they cost host dispatch time though they launch nothing.
# Each count is (forward, backward).

ATTENTION_OPS: Final = (16, 20)
"""Self-attention block (transformer_layer.py ``TransformerLayer._forward_attention``; attention.py
``SelfAttention.get_query_key_value_tensors`` / ``Attention.forward``): forward = input norm fused with the QKV GEMM
(TE ``LayerNormColumnParallelLinear``: norm, quantize, GEMM) 3, QKV view and split 3, q/k layernorm 2, rotary on q and
k 2, TE ``DotProductAttention`` (layout + fused kernel) 3, ``linear_proj`` (quantize, GEMM) 2, bias-dropout-add 1,
``pre_mlp_layernorm`` 1 = 17, less one view the fused QKV layout skips = 16. Backward = the proj's and QKV's
gradient quantize, dgrad and wgrad (2 x 3), attention 1, rotary 2, q/k norms 2, split's cat 1, the two norms 2,
bias-dropout-add 1, residual gradient adds 2, grad-accumulation hooks 3 = 20."""
TP_SP_COLLECTIVE_OPS: Final = (2, 2)
"""With TP > 1 and sequence parallelism: the attention block's all-gather before the QKV GEMM and reduce-scatter
after ``linear_proj`` (TE's ``_LayerNormLinear`` / ``_Linear`` with ``sequence_parallel``), and their backward
counterparts."""
ROUTER_OPS: Final = (21, 10)
"""Router (router.py ``TopKRouter.forward`` / ``routing``; moe_utils.py ``topk_routing_with_score_function`` without
``--moe-router-fusion``, which paraplan does not model): forward = gating (``router_gating_linear``: cast, GEMM) 2,
view 1, top-k 1, softmax 1, dense probs and routing map (zeros, scatter, x2) 4, aux loss 12
(``compute_routing_scores_for_aux_loss`` softmax/top-k/scatter 3, ``get_tokens_per_expert_and_token_count`` sum +
all-reduce 2, ``switch_load_balancing_loss_func`` 4, ``attach_and_log_load_balancing_loss`` tracker 2 +
``MoEAuxLossAutoScaler`` 1) = 21. Backward = gating dgrad + wgrad 2, softmax and scatter 3, aux loss 5 = 10."""
ALLTOALL_OPS: Final = {True: (34, 10), False: (51, 16)}
"""``MoEAlltoAllTokenDispatcher`` by ``moe_permute_fusion``: forward = ``preprocess`` (counts: sum, long,
input_splits reshape/sum, the counts' all-gather over TPxEP, reshape/transpose/slice/contiguous, three sums, view)
14, ``_maybe_dtoh_and_synchronize`` (wait_stream, six ``maybe_move_tensor_to_cpu``, record_event, synchronize) 9, the
two ``all_to_all`` of tokens and probs 4, the combine ``all_to_all`` 2, ``view`` 1; plus with fusion TE's
``fused_permute_with_probs`` 1, ``sort_chunks_by_idxs`` 1, its inverse 1, ``unpermute`` 1 (= 34), without it the
argsort permute (moe_utils.py ``permute``: bool, T, contiguous, reshape, argsort, slice, mod, probs T / contiguous /
reshape / index, index_select) 11, split + cat of tokens and probs 4, their inverse 2, ``unpermute`` (zeros, probs
multiply, scatter-add, view) 4 (= 51). Backward = the three all-to-alls' gradients 6, permute / sort / unpermute
gradients 4 fused or 10 unfused."""
DEEPEP_OPS: Final = (26, 8)
"""``MoEFlexTokenDispatcher`` with DeepEP (``_DeepepManager``; fused_a2a.py ``FusedDispatch`` / ``FusedCombine``):
forward = ``_initialize_metadata`` (reshape/expand/reshape/contiguous of map and probs) 8, ``setup_metadata``
(routing map to indices and probs) 5, dispatch (``get_dispatch_layout``, ``dispatch``, event handling, the counts'
list to a tensor) 6, ``get_permuted_hidden_states_by_experts`` (pad routing map, permute) 3, restore 1, combine 3 =
26. Backward = dispatch's and combine's gradients (a combine and a dispatch) 4, permute and metadata gradients 4."""
HYBRIDEP_OPS: Final = (19, 4)
"""``MoEFlexTokenDispatcher`` with HybridEP (``_HybridEPManager``): forward = ``_initialize_metadata`` 8,
``setup_metadata`` (reshape x2, budget) 3, ``dispatch`` (probs cast, ``hybrid_ep_dispatch``'s preprocess, dispatch
and permute, counts cast and sum) 6, ``combine`` (``hybrid_ep_combine``, slice) 2 = 19. Backward = the fused combine
and dispatch gradients 4 (``combine_with_unpermute(handle=ctx.handle)`` and its dual)."""
EXPERTS_OPS: Final = (10, 10)
"""Routed experts (experts.py ``TEGroupedMLP.forward``): fc1 and fc2 TE ``GroupedLinear`` (split-quantize, grouped
GEMM, two bookkeeping calls) 2 x 4, the activation weighted by the probs (cast, kernel) 2 = 10; backward = each
GroupedLinear's gradient quantize, dgrad, wgrad and bookkeeping 2 x 4, the activation's gradient 2 = 10."""
SHARED_EXPERT_OPS: Final = (6, 8)
"""Shared expert (shared_experts.py ``SharedExpertMLP``, an ``MLP``): fc1 (quantize, GEMM) 2, activation 1, fc2 2,
the add into the routed output 1; backward = 2 x (gradient quantize, dgrad, wgrad) + activation 1 + add 1 = 8."""
AUX_LOSS_OPS: Final = (12, 5)
"""The part of ``ROUTER_OPS`` that computes and attaches the load-balancing loss (router.py ``TopKRouter.routing``:
``if self.training and torch.is_grad_enabled() and self.is_aux_loss_enabled()``), which
``--moe-router-load-balancing-type none`` skips (gpt-oss)."""
PRE_MLP_NORM_OPS: Final = (1, 1)
"""``pre_mlp_layernorm`` (one TE norm call forward, its gradient backward), counted in ``ATTENTION_OPS``; the
``moe_router`` graph scope replays it (transformer_layer.py ``_get_submodules_under_cudagraphs``:
``self.pre_mlp_layernorm, self.mlp.router``)."""
DISPATCHER_PREPROCESS_OPS: Final = {("alltoall", True): (15, 1), ("alltoall", False): (25, 2),
                                    "deepep": (13, 2), "hybridep": (11, 0)}
"""The part of ``dispatcher_ops`` in ``MoELayer.preprocess`` (``token_dispatcher.dispatch_preprocess``), which the
``moe_preprocess`` graph scope replays (moe_layer.py: ``preprocess`` is wrapped by
``maybe_skip_or_early_return_by_cudagraph("preprocess")``), (forward, backward): alltoall ``preprocess`` 14 and the
first permutation (fused 1, its gradient 1; unfused 11, ``index_select`` and probs-index gradients 2) (the D2H
copies move to "before_ep_alltoall", outside the graph: ``MoEAlltoAllTokenDispatcher.__init__``); DeepEP
``_initialize_metadata`` 8 + ``setup_metadata`` 5, the probs views' gradients 2; HybridEP ``_initialize_metadata`` 8
+ ``setup_metadata`` 3 (no gradient ops: the dispatch's own backward covers the probs)."""
COMBINED_NODE_OPS: Final = (9, 7)
"""Host calls of one combined-1F1B schedule node (pipeline_parallel/utils.py ``ScheduleNode._forward`` /
``_backward`` and ``stream_acquire_context``): forward = event wait, stream enter and exit 2, detach and
``requires_grad`` of its input 2, ``make_viewless`` 1, ``record_stream`` and storage ``resize_`` of the freed input 2,
event record 1 = 9; backward = event wait, stream 2, the node's ``torch.autograd.backward`` 1, ``record_stream`` 1,
``get_grad`` 1, event record 1 = 7."""
COMBINED_NODES_PER_MOE_LAYER: Final = 4
"""Schedule nodes of an MoE layer under combined 1F1B (models/common/model_chunk_schedule_plan.py
``TransformerLayerSchedulePlan``: ``pre_dispatch_computation`` (attention, router, preprocess), ``moe_dispatch``,
``mlp``, ``moe_combine``)."""
PAIRED_SCHEDULES: Final = ("combined_1f1b", "dualpipe-v")
"""Schedules that run one micro-batch's forward layer beside another's backward layer on the same host thread
(combined_1f1b.py ``combined_1f1b_schedule_for_no_pipelining`` / ``..._interleaving``): the host cannot issue the
backward ahead while it waits at the forward's sync, so both halves' ops are issued in the GPU's wait."""


def _captured(training: TrainingSpec) -> frozenset[str]:
    """Which of an MoE layer's parts a CUDA graph replays ("attn", "pre_mlp_norm", "router", "shared",
    "preprocess", "moe"), from Megatron-LM d98e8a6 transformer_layer.py ``_get_submodules_under_cudagraphs`` and
    moe_layer.py ``MoELayer.forward``: ``full_iteration`` or a per-layer graph of the whole layer: all; ``attn``: the
    attention block; ``moe_router``: ``pre_mlp_layernorm``, the router and the shared expert unless
    ``--moe-shared-expert-overlap`` runs it beside the dispatch (``shared_experts_compute`` is skipped then);
    ``moe_preprocess`` (only with ``moe_router``; ``local`` takes both together, rules.py): also the dispatcher's
    preprocess; ``moe``: the norm and the whole MoE block."""
    impl, mods = training.cuda_graph_impl, training.cuda_graph_modules
    every = frozenset({"attn", "pre_mlp_norm", "router", "shared", "preprocess", "moe"})
    if impl == "none":
        return frozenset()
    if impl == "full_iteration" or not mods:
        return every
    out = {"attn"} if "attn" in mods else set()
    if "moe" in mods:
        return frozenset(out | (every - {"attn"}))
    if "moe_router" in mods or "moe_preprocess" in mods:
        out |= {"pre_mlp_norm", "router"}
        out |= set() if training.moe_shared_expert_overlap else {"shared"}
    if "moe_preprocess" in mods:
        out.add("preprocess")
    return frozenset(out)


def dispatcher_preprocess_ops(training: TrainingSpec) -> tuple[int, int]:
    """``DISPATCHER_PREPROCESS_OPS`` of the training's dispatcher (alltoall by ``moe_permute_fusion``; allgather,
    which the recipes do not run, as alltoall)."""
    if training.moe_token_dispatcher_type == "flex":
        return DISPATCHER_PREPROCESS_OPS["hybridep" if training.moe_flex_dispatcher_backend == "hybridep"
                                         else "deepep"]
    return DISPATCHER_PREPROCESS_OPS[("alltoall", bool(training.moe_permute_fusion))]


def router_ops(aux_loss: bool) -> tuple[int, int]:
    """``ROUTER_OPS``, less ``AUX_LOSS_OPS`` without a load-balancing loss."""
    return ROUTER_OPS if aux_loss else (ROUTER_OPS[0] - AUX_LOSS_OPS[0], ROUTER_OPS[1] - AUX_LOSS_OPS[1])


def dispatcher_ops(training: TrainingSpec) -> tuple[int, int]:
    """(forward, backward) host ops of the token dispatcher: ``ALLTOALL_OPS`` (by ``moe_permute_fusion``; also the
    allgather dispatcher, which the recipes do not run, as the nearest count), ``DEEPEP_OPS`` or ``HYBRIDEP_OPS``."""
    if training.moe_token_dispatcher_type == "flex":
        return HYBRIDEP_OPS if training.moe_flex_dispatcher_backend == "hybridep" else DEEPEP_OPS
    return ALLTOALL_OPS[bool(training.moe_permute_fusion)]


def host_issue_ops(training: TrainingSpec, *, tp: Int, shared_expert: bool,
                   aux_loss: bool = True) -> tuple[Int, Int]:
    """(forward, backward) host ops of one MoE layer (attention + MoE block) per micro-batch that run outside a CUDA
    graph: the sum of ``ATTENTION_OPS`` (+ ``TP_SP_COLLECTIVE_OPS`` with TP > 1), ``router_ops`` (``aux_loss``:
    whether the model's load balancing computes a loss), ``dispatcher_ops``, ``EXPERTS_OPS`` and
    ``SHARED_EXPERT_OPS`` (with a shared expert), less the parts a graph replays (``_captured``: "attn" the attention
    block less its ``PRE_MLP_NORM_OPS``, "pre_mlp_norm" those, "router", "shared", "preprocess"
    ``dispatcher_preprocess_ops``, "moe" the whole MoE block). ``tp`` may be an array (a layout table)."""
    cap = _captured(training)
    parts: list[tuple[int, int]] = []
    if "attn" not in cap:
        parts.append((ATTENTION_OPS[0] - PRE_MLP_NORM_OPS[0], ATTENTION_OPS[1] - PRE_MLP_NORM_OPS[1]))
    if "pre_mlp_norm" not in cap:
        parts.append(PRE_MLP_NORM_OPS)
    if "router" not in cap:
        parts.append(router_ops(aux_loss))
    if shared_expert and "shared" not in cap:
        parts.append(SHARED_EXPERT_OPS)
    if "moe" not in cap:
        disp, pre = dispatcher_ops(training), dispatcher_preprocess_ops(training)
        if "preprocess" in cap:
            disp = (disp[0] - pre[0], disp[1] - pre[1])
        parts += [disp, EXPERTS_OPS]
    tp_on = (np.asarray(tp) > 1) * ("attn" not in cap)
    fwd: Int = sum(p[0] for p in parts) + TP_SP_COLLECTIVE_OPS[0] * tp_on
    bwd: Int = sum(p[1] for p in parts) + TP_SP_COLLECTIVE_OPS[1] * tp_on
    return fwd, bwd


def host_bound_ops(training: TrainingSpec, *, tp: Int, shared_expert: bool, schedule: str,
                   aux_loss: bool = True) -> tuple[Int, Int]:
    """(forward, backward) host ops of one MoE layer per micro-batch that the host issues while the GPU waits:
    none without a host sync (``host_syncs_per_moe_layer`` 0: the host runs ahead of the GPU); else the forward's
    ``host_issue_ops`` (the host waits for the counts once per layer, so from one sync to the next it issues one
    layer's forward, then the GPU has work again), and under a paired schedule (``PAIRED_SCHEDULES``) also the
    backward's and the schedule nodes' (``COMBINED_NODE_OPS``), since the paired backward layer is issued between
    the same two syncs. A plain schedule's backward has no sync: its host runs ahead, as for a dense layer."""
    if host_syncs_per_moe_layer(training) == 0:
        return 0, 0
    fwd, bwd = host_issue_ops(training, tp=tp, shared_expert=shared_expert, aux_loss=aux_loss)
    if schedule not in PAIRED_SCHEDULES:
        return fwd, 0
    n = COMBINED_NODES_PER_MOE_LAYER
    return fwd + n * COMBINED_NODE_OPS[0], bwd + n * COMBINED_NODE_OPS[1]
