"""The MoE token dispatcher's row copies outside the communication kernels, per dispatcher: the HBM traffic of
the passes that move every routed token copy (T k ETP / TP rows of h per rank) from one order to another.

Per MoE layer and micro-batch, forward + backward (Megatron-LM d98e8a6, megatron/core/transformer/moe/):

- ``permute`` before the dispatch and ``unpermute`` after the combine (moe_utils.py; alltoall and allgather on
  the sending rank, DeepEP on the received tokens, ``_DeepepManager.get_permuted_hidden_states_by_experts``;
  HybridEP's standalone permute kernel inside ``dispatch_with_permute`` / ``combine_with_unpermute``, none with
  ``--moe-permute-fusion-into-hybridep``): ``permute_unpermute_copies`` x ``PERMUTE_BYTES_PER_ELEMENT``.
- alltoall's second permutation, ``sort_chunks_by_idxs`` after the all-to-all and its inverse before the
  combine, when a rank holds more than one expert (``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` /
  ``combine_preprocess``: "Permutation 2: Sort tokens by local expert"; with drop-and-pad the
  ``transpose(0, 1).contiguous()`` copy instead): ``sort_copies`` x ``ROW_COPY_BYTES_PER_ELEMENT``.
- the grouped GEMM's quantization padding, ``Fp8Padding`` of the expert input and ``Fp8Unpadding`` of its output
  (experts.py ``TEGroupedMLP.forward``: under FP8 / FP4 or TE's grouped tensor, unless
  ``skip_routed_expert_padding``: HybridEP pads inside its dispatch, ``pad_multiple``): ``pad_copies`` x
  ``ROW_COPY_BYTES_PER_ELEMENT``.

HybridEP writes the received tokens straight into the expert-major, padded buffer, so it has neither the sort
nor the padding copies; DeepEP's fused permute pads too (``fused_permute_and_pad_with_probs``, TE >= 2.12), so
with ``--moe-permute-fusion`` it has no padding copies. ``--moe-permute-fusion`` otherwise changes the number of
kernels (TE's fused permute against argsort + index_select), not the bytes each pass moves. The router
probabilities ride along (T k values, against T k h elements: neglected). ``--moe-router-padding-for-
quantization`` (pads the routing map, so no padding copies) has no knob here: Megatron's default, off, is taken.
"""

from __future__ import annotations

from typing import Final

from paraplan.estimate.time.compute import MOE_PERMUTE_BYTES_PER_ELEMENT
from paraplan.specs.num import Num
from paraplan.specs.training import TrainingSpec

PERMUTE_BYTES_PER_ELEMENT: Final = MOE_PERMUTE_BYTES_PER_ELEMENT / 2.0
"""HBM bytes per routed token copy and hidden unit of one of ``permute`` / ``unpermute``, forward + backward:
half of ``compute.MOE_PERMUTE_BYTES_PER_ELEMENT`` (the pair's 24 B)."""
ROW_COPY_BYTES_PER_ELEMENT: Final = 8.0
"""HBM bytes per routed token copy and hidden unit of one plain row copy, forward + backward: the forward
reads and writes the bf16 row (2 + 2 B), the backward copies the gradient back the other way (2 + 2 B)
(``sort_chunks_by_idxs``'s backward is the inverse sort; TE ``_Fp8Padding.backward`` unpads, ``_Fp8Unpadding.
backward`` pads)."""
PERMUTE_UNPERMUTE_COPIES: Final = 2
"""``permute`` and ``unpermute``: one each."""
SORT_COPIES: Final = 2
"""``sort_chunks_by_idxs`` by local expert and back (alltoall, more than one local expert)."""
PAD_COPIES: Final = 2
"""``Fp8Padding`` of the expert input and ``Fp8Unpadding`` of its output."""


def permute_unpermute_copies(training: TrainingSpec) -> int:
    """``PERMUTE_UNPERMUTE_COPIES``, none with HybridEP and ``--moe-permute-fusion-into-hybridep`` (token_dispatcher.py
    ``_HybridEPManager.dispatch``: ``hybrid_ep_dispatch(..., fused=config.moe_permute_fusion_into_hybridep)``, the
    permute inside the dispatch kernel; the same in ``combine``)."""
    if hybridep(training) and training.moe_permute_fusion_into_hybridep:
        return 0
    return PERMUTE_UNPERMUTE_COPIES


def sort_copies(training: TrainingSpec, local_experts: Num) -> Num:
    """``SORT_COPIES`` for the alltoall dispatcher when a rank holds more than one expert, else 0 (the allgather
    dispatcher's one ``permute`` sorts by local expert; DeepEP's and HybridEP's permutes write expert-major)."""
    if training.moe_token_dispatcher_type != "alltoall":
        return 0.0
    out: Num = SORT_COPIES * (local_experts > 1)
    return out


def pads_in_experts(training: TrainingSpec) -> bool:
    """Whether the routed experts pad their input to the quantization alignment themselves (experts.py
    ``TEGroupedMLP.forward``): under FP8 / FP4 or ``--moe-use-grouped-tensor`` (256-token segments), unless the
    dispatcher has padded already (moe_utils.py ``skip_routed_expert_padding``: HybridEP; DeepEP's fused permute pads
    to ``get_align_size_for_quantization``, after which ``Fp8Padding`` finds the splits aligned and returns its
    input). Drop-and-pad (``--moe-pad-expert-input-to-capacity``) hands every expert its fixed capacity: taken as
    aligned (the padding copy runs only when it is not a multiple of the alignment)."""
    if not (training.precision in ("fp8", "fp4") or training.moe_use_grouped_tensor):
        return False
    if training.moe_expert_capacity_factor is not None and training.moe_pad_expert_input_to_capacity:
        return False
    if training.moe_token_dispatcher_type == "flex":
        return training.moe_flex_dispatcher_backend == "deepep" and not training.moe_permute_fusion
    return True


def pad_copies(training: TrainingSpec) -> int:
    """``PAD_COPIES`` when ``pads_in_experts``, else 0."""
    return PAD_COPIES if pads_in_experts(training) else 0


def hybridep(training: TrainingSpec) -> bool:
    """The flex dispatcher with the HybridEP backend."""
    return training.moe_token_dispatcher_type == "flex" and training.moe_flex_dispatcher_backend == "hybridep"


def permute_bytes(training: TrainingSpec, routed_elements: Num, local_experts: Num) -> Num:
    """HBM bytes of the dispatcher's row copies per MoE layer and micro-batch, forward + backward, for
    ``routed_elements`` = routed token copies x h per rank and ``local_experts`` experts per rank:
    (``permute_unpermute_copies`` x ``PERMUTE_BYTES_PER_ELEMENT`` + (``sort_copies`` + ``pad_copies``) x
    ``ROW_COPY_BYTES_PER_ELEMENT``) x routed_elements. HBM-bound: the caller divides by ``compute.hbm_rate``."""
    per: Num = (permute_unpermute_copies(training) * PERMUTE_BYTES_PER_ELEMENT
                + (sort_copies(training, local_experts) + pad_copies(training)) * ROW_COPY_BYTES_PER_ELEMENT)
    return per * routed_elements
