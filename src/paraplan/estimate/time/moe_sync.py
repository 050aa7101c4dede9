"""Host-device synchronisations of one MoE layer per micro-batch: how many the token dispatcher makes (the host
waits for the GPU's token counts before it can size and issue the next kernels), and which a CUDA graph removes.

Every count mirrors Megatron-LM d98e8a6, megatron/core/transformer/moe/ (token_dispatcher.py, fused_a2a.py) and
megatron/core/transformer/transformer_config.py; ``layer.moe_mlp_time`` multiplies it by the per-sync cost
``EfficiencySpec.moe_layer_overhead_s``."""

from __future__ import annotations

from typing import Final

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


def host_syncs_per_moe_layer(training: TrainingSpec) -> int:
    """Host syncs one MoE layer pays per micro-batch, forward + backward: 0 when a CUDA graph captures the
    dispatch (``sync_free_capture``), else ``dispatcher_host_syncs``. All of them are in the forward: full
    recompute and selective ``moe`` recompute, which re-run the MoE forward, pay them again."""
    return 0 if sync_free_capture(training) else dispatcher_host_syncs(training)
