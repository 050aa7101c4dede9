"""Per-GPU memory of one pipeline stage: weights, gradients, optimizer, activations, other.

Bytes per parameter (Megatron mixed-precision Adam, ``docs/user-guide/features/
dist_optimizer.md``): bf16 weights 2, fp32 main grads 4, fp32 master + Adam m, v 12. With the
distributed optimizer the 12 B are sharded over the DP x CP group for dense parameters
(``intra_dp_cp_group`` in ``megatron/core/optimizer/__init__.py``) and over expert-DP for expert
parameters; Megatron's own estimator divides by DP only (docs/model.md). Megatron-FSDP
(optim_grads_params) shards all 18 B and all-gathers two layers' weights at a time.

Activations: ``paraplan.estimate.activations``, multiplied by the micro-batches each rank holds in
flight (the layout's schedule, ``paraplan.schedules``: ``Schedule.in_flight_units``). Other: logits on
the last stage, FP8 weight copies, FSDP gather buffers, and a configurable workspace and fragmentation allowance.
Vectorised over candidates like the rest of ``estimate``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

import numpy as np
from numpy.typing import NDArray

from paraplan.errors import SpecError
from paraplan.estimate import activations as act
from paraplan.estimate.flops import attention_heads_tensor_core_aligned
from paraplan.estimate.layouts import LayerLayout, StepLayout
from paraplan.estimate.params import ParamTerms, StageLayers, StageParams, padded_vocab, stage_params
from paraplan.layout import RECOMPUTE_CODES
from paraplan.schedules import schedule_of
from paraplan.specs.model import ModelSpec
from paraplan.specs.num import Int, Num
from paraplan.specs.training import (
    PARAM_BYTES,
    TrainingSpec,
    main_grad_bytes,
    optimizer_bytes_per_param,
)
from paraplan.units import GIB

FP8_WEIGHT_CACHE_BYTES = 2.0
"""Transformer Engine keeps an FP8 copy of each GEMM weight and its transpose (1 B each) under FP8."""
FP8_SCALE_BYTES_PER_ELEMENT = {"delayed": 0.0, "tensorwise": 0.0, "mxfp8": 1.0 / 32, "blockwise": 4.0 / (128 * 128)}
"""Scaling state per element of one FP8 weight copy: delayed and tensorwise keep one fp32 scale (and an amax
history) per tensor, negligible; MXFP8 one E8M0 byte per 32 elements; blockwise one fp32 scale per 128 x 128
weight block (Transformer Engine ``MXFP8Tensor`` / ``Float8BlockwiseQTensor``)."""
NVFP4_COPY_BYTES = 0.5 + 1.0 / 16
"""One NVFP4 copy of a weight per element (TE ``NVFP4Tensor``, ``NVFP4BlockScaling``): packed 4-bit E2M1 data
(``fp4_utils.get_nvfp4_rowwise_packed_shape``: last dim // 2) and one E4M3 scale per 16 elements (the 16 x 16
weight blocks' scales are stored per 1 x 16 row block); the fp32 per-tensor scale is negligible."""
SINGLE_FP8_COPY_ARCHS = ("blackwell",)
"""GPU architectures whose FP8 GEMMs take any operand layout, so Transformer Engine keeps one FP8 tensor for the
rowwise and the columnwise use of a per-tensor-scaled weight (delayed and tensorwise scaling): no transpose copy
(TE ``common/transformer_engine.cpp`` ``nvte_is_non_tn_fp8_gemm_supported``: sm 10.x and 11.x, B200/GB200/B300/
GB300; ``pytorch/csrc/quantizer.cpp`` ``Float8Quantizer`` / ``Float8CurrentScalingQuantizer::create_tensor``:
``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``). MXFP8 and blockwise scales run along one
direction, so their columnwise copy stays (``MXFP8Quantizer``, ``Float8BlockQuantizer``)."""
FSDP_LAYERS_IN_FLIGHT = 2
"""Megatron-FSDP holds the unsharded gradients of about two layers at a time: the one computing and the one
being reduce-scattered (the guide: "at least two FSDP units worth of un-sharded gradient memory")."""
FSDP_AG_PREFETCH_PARAMS = 500_000_000
"""Megatron-FSDP prefetches the next units' weights until this many elements are gathered beyond the current
unit: ``suggested_AG_prefetch_size = max(1e9, 2 x mean unit) // 2`` (megatron_fsdp.py ``__init__``: the "cap to
1B elements" is a floor), consumed by ``all_gather_params`` in param_and_grad_buffer.py; with
--fsdp-double-buffer (``TrainingSpec.fsdp_double_buffer``) ``need_skip_prefetch`` stops at two units."""


FSDP_NON_UNIT_BYTES_PER_PARAM = PARAM_BYTES
"""Bytes per parameter of Megatron-FSDP's gathered copy of the modules outside its FSDP units: the word embedding,
the output layer and the final norm are neither Transformer Engine linears nor FP8 parameters, so bf16 (2 B) under
every precision."""


def fsdp_non_unit_weight_bytes(params: StageParams) -> Num:
    """Bytes of the unsharded weights Megatron-FSDP keeps of the modules that are not FSDP units (with
    optim_grads_params), per GPU of a stage:

        FSDP_NON_UNIT_BYTES_PER_PARAM x (P_embedding + P_output layer and final norm)

    The units are ``TransformerLayer``, ``MoETransformerLayer`` and ``MambaLayer``
    (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py ``fsdp_unit_modules``); any other module gathers its own
    parameters in a pre-forward hook, and only units get the post-forward release hook
    (megatron_fsdp.py ``_register_fsdp_hooks``: "_post_forward hook should only be registered on FSDP unit
    modules"); the all-gather pipeline keeps the non-unit buckets across steps
    (param_and_grad_buffer.py ``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``: "Non-FSDP-unit buckets are
    preserved by default because their params may be read across module boundaries"). The gathered bucket is a
    buffer beside the rank's shard (counted in the weights). Their unsharded gradients are transient, one module
    at a time as the units' (``FSDP_LAYERS_IN_FLIGHT``). The MTP blocks' norms and projection are neglected."""
    out: Num = FSDP_NON_UNIT_BYTES_PER_PARAM * (params.embedding + params.output_layer)
    return out


def fsdp_weight_units_in_flight(unit_params: Num, units_per_chunk: Num) -> Num:
    """Units whose gathered weights Megatron-FSDP holds at once: the one computing plus the prefetched ones,
    ``1 + min(ceil(max(FSDP_AG_PREFETCH_PARAMS, u) / u), units_per_chunk - 1)`` (``u``: one unit's parameters
    on the rank; prefetch stops at the end of the chunk, which is its own FSDP instance). Their FP8 copies,
    under FP8, are the only ones that exist."""
    u = np.maximum(unit_params, 1.0)
    prefetched = np.ceil(np.maximum(FSDP_AG_PREFETCH_PARAMS, u) / u)
    return 1.0 + np.clip(np.minimum(prefetched, np.asarray(units_per_chunk, dtype=float) - 1.0), 0.0, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions:
    """Allowances not derived from the model; documented in docs/model.md ("Other memory")."""

    workspace_bytes: float = 0.125 * GIB
    """cuBLAS/TE workspaces and small buffers counted in torch's allocated memory (fit to
    megatron_golden.csv: 0.125 GiB gives the lowest median error, see CHANGELOG.md)."""
    fragmentation_frac: float = 0.05
    """Extra share of activation-sized (dynamic) allocations lost to fragmentation (assumed; no held-out row
    measures reserved over allocated memory). Not applied with ``expandable_segments``."""
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``alloc_conf_expandable_segments``): no fragmentation
    allowance (``fragmentation_frac_of``)."""
    backward_working_frac: float = 0.0
    """Activation gradients alive during one layer's backward beyond the activations it frees,
    in layers' worth (0: gradients reuse what backward frees; fit to megatron_golden.csv)."""


def alloc_conf_expandable_segments(alloc_conf: str) -> bool:
    """Whether a ``PYTORCH_CUDA_ALLOC_CONF`` value turns on PyTorch's expandable segments, read as c10 reads it
    (c10/core/AllocatorConfig.h ``ConfigTokenizer``: tokens split at ``,`` ``:`` ``[`` ``]``, whitespace dropped;
    ``toBool`` takes exactly ``True`` or ``False``; a later ``expandable_segments`` pair wins, as parseArgs
    overwrites the setting). Other keys are skipped (their ``[...]`` list values too). SpecError on a value
    PyTorch would refuse."""
    tokens = [t for t in re.split(r"([,:\[\]])", re.sub(r"\s+", "", alloc_conf)) if t]
    on = False
    for i, tok in enumerate(tokens):
        if tok != "expandable_segments" or (i > 0 and tokens[i - 1] != ","):
            continue
        value = tokens[i + 2] if i + 2 < len(tokens) and tokens[i + 1] == ":" else ""
        if value not in ("True", "False"):
            raise SpecError(f"PYTORCH_CUDA_ALLOC_CONF: expandable_segments must be True or False (as PyTorch's "
                            f"ConfigTokenizer::toBool reads it), got {value[:40]!r} in {alloc_conf[:80]!r}")
        on = value == "True"
    return on


EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC = 0.0
"""Fragmentation allowance with expandable segments. The allowance models what PyTorch's CUDA-semantics notes
describe for the default allocator: one cudaMalloc segment per large allocation, whose unusable free slivers cannot
be merged, so a new segment can fail although enough memory is free. With ``expandable_segments:True`` "the
allocator [starts] with one segment that grows as needed, rather than creating a new segment for each allocation"
(c10/core/AllocatorConfig.h ``use_expandable_segments``): one segment per stream, mapped in pages, whose free pages
are unmapped and mapped again where the next allocation needs them (PyTorch's CUDA-semantics notes,
``expandable_segments``), so free memory anywhere is usable. What is left
is page rounding (``kRoundLarge`` 2 MiB, c10/core/AllocatorConfig.h), inside the allocated bytes the memory band
measures (``torch.cuda.max_memory_allocated``), and partial pages at the ends of free blocks (at most two 2 MiB
pages per free block), neglected."""


def fragmentation_frac_of(options: MemoryOptions) -> float:
    """The fragmentation share of dynamic bytes applied: ``EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC`` with
    expandable segments, else ``options.fragmentation_frac``."""
    return EXPANDABLE_SEGMENTS_FRAGMENTATION_FRAC if options.expandable_segments else options.fragmentation_frac


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU for one pipeline stage. Terms sum to ``total_bytes``; fields may be arrays."""

    weights_bytes: Num
    grads_bytes: Num
    optimizer_bytes: Num
    activations_bytes: Num
    other_bytes: Num

    @property
    def total_bytes(self) -> Num:
        """Sum of the five terms."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_bytes)

    def as_dict(self) -> dict[str, float]:
        """Scalar breakdown with the total."""
        out = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        out["total_bytes"] = float(self.total_bytes)
        return out


@dataclass(frozen=True, slots=True)
class OtherBytes:
    """What ``other_bytes`` holds (fields may be arrays); they sum to ``total``."""

    logits_bytes: Num
    fp8_weight_cache_bytes: Num
    fsdp_buffers_bytes: Num
    workspace_bytes: Num
    fragmentation_bytes: Num
    cuda_graph_bytes: Num = 0.0
    """Static input/output buffers of the CUDA graphs (``cuda_graph_pool_bytes``)."""
    deferred_wgrad_bytes: Num = 0.0
    """Output-layer inputs and logit gradients kept for the deferred wgrad (``deferred_wgrad_buffer_bytes``)."""

    @property
    def total(self) -> Num:
        """other_bytes of the stage."""
        return (self.logits_bytes + self.fp8_weight_cache_bytes + self.fsdp_buffers_bytes
                + self.workspace_bytes + self.fragmentation_bytes + self.cuda_graph_bytes
                + self.deferred_wgrad_bytes)

    def as_dict(self) -> dict[str, float]:
        """Scalar parts."""
        return {f.name: float(np.asarray(getattr(self, f.name))) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Memory and parameters of one stage (scalar path keeps both for reporting)."""

    memory: MemoryBreakdown
    params: StageParams
    in_flight: Num
    """Micro-batch chunks whose activations the stage holds at its peak."""
    other: OtherBytes
    """The parts of ``memory.other_bytes``."""


def weight_bytes_per_param(training: TrainingSpec) -> float:
    """Bytes per parameter of the model weights the rank keeps (the FP8 copies are ``fp8_cache_bytes_per_param``).

    bf16/fp16 weights: 2 B. ``--fp8-param-gather`` (``fp8_model_init``, ``megatron/core/fp8_utils.py``
    ``get_fp8_context``/``is_float8tensor``): the parameter *is* the FP8 tensor, stored as uint8 in the DDP
    param buffer (``distributed/param_and_grad_buffer.py`` ``group_params_for_buffers``: ``param_dtype =
    torch.uint8``): 1 B plus its scales, no bf16 copy. Under MXFP8 the param all-gather goes through the grad
    buffer (``shared_buffer`` in ``_ParamAndGradBuffer.__init__``), so nothing more is held for it.
    """
    if training.fp8_param_gather:
        return 1.0 + FP8_SCALE_BYTES_PER_ELEMENT[training.fp8_recipe]
    if training.fp4_param_gather:  # NVFP4 params in the packed uint8 DDP buffer (param_and_grad_buffer.py)
        return NVFP4_COPY_BYTES
    return PARAM_BYTES


def fp8_cache_bytes_per_param(training: TrainingSpec, arch: str = "hopper") -> float:
    """FP8 weight copies TE keeps beside the weights (0 without FP8): rowwise and columnwise (transpose) copies,
    1 B each plus the recipe's scales; with ``--fp8-param-gather`` the rowwise copy is the weight itself
    (``weight_bytes_per_param``), only the columnwise one is extra. On ``SINGLE_FP8_COPY_ARCHS`` (``arch``: the
    GPU's) delayed and tensorwise scaling keep one copy for both uses: 1 B, 0 with the param gather."""
    if training.precision == "fp4":  # rowwise (fprop) and columnwise (dgrad) NVFP4 copies, as FP8
        return NVFP4_COPY_BYTES * (1.0 if training.fp4_param_gather else FP8_WEIGHT_CACHE_BYTES)
    if training.precision != "fp8":
        return 0.0
    copies = 1.0 if training.fp8_param_gather else FP8_WEIGHT_CACHE_BYTES
    if arch in SINGLE_FP8_COPY_ARCHS and training.fp8_recipe in ("delayed", "tensorwise"):
        copies -= 1.0  # no transpose: the rowwise data serves the columnwise use
    return copies * (1.0 + FP8_SCALE_BYTES_PER_ELEMENT[training.fp8_recipe])


def quantized_layers(training: TrainingSpec, stage: StageLayers) -> Num:
    """Transformer layers of a stage whose weights TE quantizes under FP4 (and FP8 with first/last layers in bf16):
    all but those among the model's first ``num_layers_at_start_in_bf16`` and last ``num_layers_at_end_in_bf16``
    layers by GLOBAL layer number with ``--first-last-layers-bf16`` (``fp8_utils.is_first_last_bf16_layer``,
    ``fp4_utils.get_fp4_context``: no FP8/FP4 autocast for them, so no quantized copies; with VP or an uneven split
    they may sit on other stages than the first and last: ``StageLayers.num_bf16_start_layers``); the embedding and
    the output layer are not TE linears and are never quantized."""
    layers = np.asarray(stage.num_dense_layers + stage.num_moe_layers)
    if training.first_last_layers_bf16:
        layers = layers - np.asarray(stage.num_bf16_start_layers) - np.asarray(stage.num_bf16_end_layers)
    out: Num = np.maximum(layers, 0)
    return out


def model_state_bytes(params: StageParams, layout: StepLayout,
                      training: TrainingSpec | str = "bf16") -> tuple[Num, Num, Num]:
    """(weights, grads, optimizer) bytes per GPU.

    no sharding:           2P, 4P, 12P
    distributed optimizer: 2P, 4P, 12*P_dense/(dp*cp) + 12*P_expert/edp
    Megatron-FSDP:         all three divided by the same groups.
    fp16: grads 2P and the fp32 main gradient (4 B) joins the optimizer state (Megatron's 20 B, 4 + 16/d).
    The knobs change the per-parameter bytes: weights ``weight_bytes_per_param`` (FP8 param gather 1 B),
    grads ``main_grad_bytes`` (bf16 buffer 2 B), optimizer ``optimizer_bytes_per_param`` (precision-aware
    dtypes, CPU offload). A precision string stands for a TrainingSpec with Megatron's defaults.
    PEFT (``training.peft``): the frozen base weights have no grads and no optimizer state (0 B each).
    """
    if isinstance(training, str):
        training = TrainingSpec(seq_len=1, global_batch_size=1, precision=training)  # type: ignore[arg-type]
    dense_shards = np.where(layout.dist_opt, layout.dp * layout.cp, 1)
    expert_shards = np.where(layout.dist_opt, layout.edp, 1)
    state_shards_dense = np.where(layout.fsdp, dense_shards, 1)
    state_shards_expert = np.where(layout.fsdp, expert_shards, 1)
    weights = weight_bytes_per_param(training) * (params.dense / state_shards_dense
                                                  + params.expert / state_shards_expert)
    if training.fp4_param_gather:  # the embedding, output layer and MTP block are not TE linears: bf16 params
        outside = params.embedding + params.output_layer + params.mtp
        weights = weights + (PARAM_BYTES - weight_bytes_per_param(training)) * outside / state_shards_dense
    grad_bytes = 0.0 if training.peft else main_grad_bytes(training)
    opt_bytes = 0.0 if training.peft else optimizer_bytes_per_param(training)
    grads = grad_bytes * (params.dense / state_shards_dense + params.expert / state_shards_expert)
    optimizer = opt_bytes * (params.dense / dense_shards + params.expert / expert_shards)
    return weights, grads, optimizer


def activation_context(
    model: ModelSpec, training: TrainingSpec, layout: LayerLayout
) -> act.ActivationContext:
    """The activation-formula inputs for a layout (or a table of layouts). Head dims that are not
    multiples of 8 run unfused attention whatever the backend (flops.attention_heads_tensor_core_aligned)."""
    from paraplan.estimate.time.ep import routed_load_factor  # local: time imports memory's neighbours

    flash = training.attention_backend == "flash" and attention_heads_tensor_core_aligned(model)
    return act.ActivationContext(
        seq_len=training.seq_len, mbs=layout.mbs, tp=layout.tp, cp=layout.cp, sp=layout.sp,
        ep=layout.ep, etp=layout.etp, recompute_code=layout.recompute_code,
        recompute_modules=tuple(layout.recompute_modules),
        # the block method checkpoints its layers one by one (megatron/core/recompute.py): one input each
        recompute_num_layers=1 if layout.recompute_method == "block" else int(layout.recompute_num_layers),
        fp8=training.precision == "fp8", flash=flash,
        # the rank budget is HybridEP's, the flex dispatcher's (token_dispatcher.py _HybridEPManager): unused otherwise
        routed_load=act.saved_routed_load(routed_load_factor(training), training.moe_expert_rank_capacity_factor
                                          if training.moe_token_dispatcher_type == "flex" else None,
                                          training.moe_paged_stash, training.moe_paged_stash_buffer_size_factor_cuda),
        offload_modules=training.offloaded_modules,
        fp4=training.precision == "fp4",
        te_cross_entropy=training.cross_entropy_loss_fusion and training.cross_entropy_fusion_impl == "te",
    )


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """The activation terms that do not depend on the pipeline stage (per layer or per micro-batch,
    fields may be arrays): computed once per layout, or once per distinct per-layer combination in
    the search (``paraplan.layout.layer_key_table``) and gathered with ``take``."""

    dense: Num
    """Saved activations of one dense layer, one micro-batch (``act.layer_bytes``)."""
    moe: Num
    """Same for one MoE layer (0 for dense models)."""
    mtp: Num
    """Same for one MTP layer (the type of the last main layer)."""
    embedding: Num
    """Embedding-stage inputs of one micro-batch (``act.embedding_bytes``)."""
    rebuilt: Num
    """Full-recompute working group (``act.recompute_working_bytes``)."""
    one_layer: Num
    """One layer without full recompute, the model's main layer type (backward working set)."""
    output: Num
    """Final norms and logits of one micro-batch, one head (``act.output_bytes``)."""
    offloaded_dense: Num = 0.0
    """Bytes of one dense layer, one micro-batch, that fine-grained activation offloading keeps on the host."""
    offloaded_moe: Num = 0.0
    """Same for one MoE layer."""
    dense_kept: Num = 0.0
    """One dense layer that full recompute skips (block method beyond its first N layers per chunk)."""
    moe_kept: Num = 0.0
    """Same for one MoE layer."""

    def take(self, index: NDArray[np.int64]) -> LayerActivations:
        """Rows ``index`` of every array field."""
        return LayerActivations(**{f.name: _take(getattr(self, f.name), index) for f in fields(self)})


def _take(value: Num, index: NDArray[np.int64]) -> Num:
    return value if np.ndim(value) == 0 else np.asarray(value)[index]


def layer_activations(model: ModelSpec, training: TrainingSpec, layout: LayerLayout) -> LayerActivations:
    """The stage-independent activation terms of a layout (or a table of layouts)."""
    ctx = activation_context(model, training, layout)
    dense = act.layer_bytes(model, ctx, moe=False)
    moe = act.layer_bytes(model, ctx, moe=True) if model.is_moe else 0.0
    off_dense: Num = 0.0
    off_moe: Num = 0.0
    if ctx.offload_modules:
        kept = replace(ctx, offload_modules=())
        off_dense = act.layer_bytes(model, kept, moe=False) - dense
        off_moe = act.layer_bytes(model, kept, moe=True) - moe if model.is_moe else 0.0
    return LayerActivations(
        dense=dense, moe=moe, offloaded_dense=off_dense, offloaded_moe=off_moe,
        mtp=act.layer_bytes(model, ctx, moe=model.mtp_layer_is_moe),
        embedding=act.embedding_bytes(model, ctx),
        rebuilt=act.recompute_working_bytes(model, ctx, has_moe=model.is_moe),
        one_layer=act.layer_bytes_no_full_recompute(model, ctx, moe=model.is_moe),
        output=act.output_bytes(model, ctx, padded_vocab=padded_vocab(model, layout.tp)),
        dense_kept=act.layer_bytes_no_full_recompute(model, ctx, moe=False) if layout.recompute_method == "block"
        else 0.0,
        moe_kept=act.layer_bytes_no_full_recompute(model, ctx, moe=True) if layout.recompute_method == "block"
        and model.is_moe else 0.0,
    )


def stage_activation_bytes(
    model: ModelSpec, training: TrainingSpec, layout: StepLayout, stage: StageLayers, *,
    rank: Int, num_microbatches: Int, options: MemoryOptions, per_layer: LayerActivations | None = None,
) -> tuple[Num, Num]:
    """(activation bytes, in-flight chunk count) for one pipeline rank at its peak.

    layers:     units * (n_dense*a_dense + n_moe*a_moe) / vp   (units: Schedule.in_flight_units)
    embedding:  first-chunk micro-batches in flight * embedding_bytes (rank 0)
    transient:  full-recompute working group + backward working set (one layer, one micro-batch)
    layer-level CPU offloading (``--cpu-offloading-num-layers N``, PP 1): TE's ``get_cpu_offload_context``
                keeps "at most (model_layers - num_layers) sets of activations on GPU" (TE docs, CPU
                offloading, default scheduling; TE >= 2.10 ``cpu_offload.py`` ``DefaultOffloadSynchronizer``:
                layer i's GPU copy released before layer L-N+i's forward, reloaded before layer L-1-N+i's
                backward, L - N at most in forward and backward): layers * max(L - N, 1) / L. The v1 path
                (``NVTE_CPU_OFFLOAD_V1=1``, ``cpu_offload_v1.py``) frees its last group only after the last
                layer's forward (L - N + 1); not modelled, no recipe with layer-level offloading sets it.
    fine-grained offloading: the offloaded module inputs are out of a_dense / a_moe; one layer's worth
                stays on the GPU (the last group, which Megatron does not offload to avoid a reload stall)
    ``per_layer``: the layout's ``layer_activations`` when already computed.
    """
    la = per_layer if per_layer is not None else layer_activations(model, training, layout)
    per_mb = stage.num_dense_layers * la.dense
    if model.is_moe:
        per_mb = per_mb + stage.num_moe_layers * la.moe
    if layout.recompute_method == "block":
        kept = stage.num_dense_layers * la.dense_kept + (stage.num_moe_layers * la.moe_kept if model.is_moe else 0.0)
        frac = block_recompute_frac(layout, stage)
        per_mb = frac * per_mb + (1.0 - frac) * kept
    sched = schedule_of(layout)
    units = sched.in_flight_units(rank=rank, pp=layout.pp, vp=layout.vp, num_microbatches=num_microbatches)
    layers = units * per_mb / layout.vp
    if training.cpu_offloading_num_layers > 0:
        n_layers = np.maximum(stage.num_dense_layers + stage.num_moe_layers, 1)
        layers = layers * np.maximum(n_layers - training.cpu_offloading_num_layers, 1) / n_layers
    emb_mbs = sched.first_chunk_in_flight(pp=layout.pp, vp=layout.vp, num_microbatches=num_microbatches)
    emb = np.where(stage.has_embedding, emb_mbs * la.embedding, 0.0)
    working = options.backward_working_frac * la.one_layer
    mtp_layers = np.where(stage.num_mtp_layers > 0, stage.num_mtp_layers * la.mtp, 0.0)
    margin = np.maximum(la.offloaded_dense, la.offloaded_moe)
    return layers + emb + la.rebuilt + working + mtp_layers + margin, units


def stage_offloaded_bytes(model: ModelSpec, training: TrainingSpec, stage: StageLayers,
                          per_layer: LayerActivations) -> Num:
    """Activation bytes of one micro-batch that offloading moves to the host and back on a stage:

    layer-level (``--cpu-offloading-num-layers N``, PP 1): min(N, L - 1) layers' saved activations,
                (n_dense*a_dense + n_moe*a_moe) * min(N, L - 1) / L
    fine-grained (``--offload-modules``): n_dense*off_dense + n_moe*off_moe (``LayerActivations.offloaded_*``).
    """
    la = per_layer
    if training.cpu_offloading_num_layers > 0:
        n_layers = np.maximum(stage.num_dense_layers + stage.num_moe_layers, 1)
        per_mb = stage.num_dense_layers * la.dense + (stage.num_moe_layers * la.moe if model.is_moe else 0.0)
        moved: Num = per_mb * np.minimum(training.cpu_offloading_num_layers, n_layers - 1) / n_layers
        return moved
    return stage.num_dense_layers * la.offloaded_dense + stage.num_moe_layers * la.offloaded_moe


def block_recompute_frac(layout: StepLayout, stage: StageLayers) -> Num:
    """Share of a stage's decoder layers that full recompute re-runs: 1 with the uniform method; with the block
    method min(N, L_chunk) / L_chunk, the first N = ``recompute_num_layers`` layers of each of its model chunks of
    L_chunk = layers / v (megatron/core/recompute.py ``checkpointed_forward``: ``layer_idx <
    recompute_num_layers``). The first-N layers' kind (dense or MoE) is taken in the stage's proportion."""
    if layout.recompute_method != "block":
        return 1.0
    per_chunk = (stage.num_dense_layers + stage.num_moe_layers) / layout.vp
    on = np.where(layout.recompute_code == RECOMPUTE_CODES["full"], 1.0, 0.0)
    frac = np.minimum(layout.recompute_num_layers, per_chunk) / np.maximum(per_chunk, 1e-300)
    return on * np.where(per_chunk > 0, frac, 1.0) + (1.0 - on)


def stage_other_bytes(
    model: ModelSpec, training: TrainingSpec, layout: StepLayout, stage: StageLayers, params: StageParams,
    activations_bytes: Num, *, options: MemoryOptions, per_layer: LayerActivations | None = None,
    arch: str = "hopper",
) -> OtherBytes:
    """Logits (last stage, one micro-batch, plus one per MTP layer), FP8 weight copies (``arch``: the GPU's,
    ``fp8_cache_bytes_per_param``), FSDP gather buffers, workspace and fragmentation."""
    la = per_layer if per_layer is not None else layer_activations(model, training, layout)
    heads = 1 + np.asarray(stage.num_mtp_layers)
    logits = np.where(stage.has_output, heads * la.output, 0.0)
    layers_on_stage = np.maximum(stage.num_dense_layers + stage.num_moe_layers, 1)
    per_layer_params = (params.layers_dense + params.layers_experts) / layers_on_stage
    grad_b = 0.0 if training.peft else main_grad_bytes(training)
    weight_units = (FSDP_LAYERS_IN_FLIGHT if training.fsdp_double_buffer else
                    fsdp_weight_units_in_flight(per_layer_params, layers_on_stage / np.maximum(layout.vp, 1)))
    fsdp_buffers = np.where(layout.fsdp, (weight_units * weight_bytes_per_param(training)
                                          + FSDP_LAYERS_IN_FLIGHT * grad_b) * per_layer_params
                            + fsdp_non_unit_weight_bytes(params), 0.0)
    # FP8 copies exist for the weights a rank holds whole; under Megatron-FSDP a layer's weights are
    # gathered for its GEMMs and released, so only the layers in flight carry FP8 copies
    fp8_held = np.where(layout.fsdp, weight_units * per_layer_params, params.total)
    if training.precision == "fp4" or training.first_last_layers_bf16:
        fp8_held = np.where(layout.fsdp, fp8_held, quantized_layers(training, stage) * per_layer_params)
    fp8_cache = fp8_cache_bytes_per_param(training, arch) * fp8_held
    dynamic = activations_bytes + logits
    return OtherBytes(logits_bytes=logits, fp8_weight_cache_bytes=fp8_cache, fsdp_buffers_bytes=fsdp_buffers,
                      workspace_bytes=options.workspace_bytes,
                      fragmentation_bytes=fragmentation_frac_of(options) * dynamic)


CUDA_GRAPH_INPUT_BYTES_PER_ELEMENT = 2.0
"""The static hidden-state input of a captured layer is bf16 (megatron/core/transformer/module.py
``GraphableMegatronModule.get_layer_static_inputs``: ``dtype=torch.bfloat16``)."""
CUDA_GRAPH_MASK_BYTES_PER_ELEMENT = 1.0
"""The static causal mask of a layer whose attention is captured by TE is a bool tensor (1 B per element)."""


def cuda_graph_pool_bytes(model: ModelSpec, training: TrainingSpec, layout: StepLayout, stage: StageLayers,
                          units: Num) -> Num:
    """Static buffers the CUDA graphs of one pipeline rank keep beyond the eager activations (which the graph pool
    holds instead of the caching allocator, already counted), for ``units`` chunk micro-batches in flight
    (``Schedule.in_flight_units``: one with PP 1, more with PP > 1, each in-flight micro-batch replaying its own
    graph with its own static inputs).

    transformer_engine (megatron/core/transformer/cuda_graphs.py ``TECudaGraphHelper``): one graph per captured
    layer and micro-batch (one micro-batch without PP); ``_get_sample_arguments`` reuses a static input set only
    once that micro-batch's backward is done, so each captured layer holds ``units / vp`` sets, each
    a bf16 hidden state s/(c t_sp) x b x h (module.py ``get_layer_static_inputs``) and, when its attention is
    captured, a bool causal mask b x s/c x s (transformer_layer.py ``get_layer_static_inputs``). The static input
    stands in for the layer input eager mode saves, but the graph's static output stays allocated in the pool
    until that micro-batch's backward is captured (graph.py ``make_graphed_callables``: weak-referenced only then,
    ``_reuse_graph_input_output_buffers``), so one hidden state per set is extra; TE keeps one static output
    gradient per shape.
    local (``CudaGraphManager``): a graph's input is cloned into the pool unless it is the output of the graph before
    it (``create_fwd_graph`` buffer reuse), so the whole-layer scope keeps one hidden state per chunk micro-batch in
    flight and a partial scope one per captured layer and micro-batch. full_iteration: the batch only (nothing
    counted). Captured layers: all with the whole-layer scope or ``attn``; dense ones with ``mlp``; MoE ones with
    ``moe`` / ``moe_router`` / ``moe_preprocess`` (``_get_submodules_under_cudagraphs``)."""
    impl, mods = training.cuda_graph_impl, training.cuda_graph_modules
    if impl in ("none", "full_iteration"):
        return 0.0
    tokens = training.seq_len / layout.cp * layout.mbs
    hidden = CUDA_GRAPH_INPUT_BYTES_PER_ELEMENT * tokens / np.where(layout.sp, layout.tp, 1) * model.hidden_size
    whole = not mods
    attn = whole or "attn" in mods
    moe = whole or attn or bool({"moe", "moe_router", "moe_preprocess"} & set(mods))
    captured = (stage.num_dense_layers * (attn or "mlp" in mods) + stage.num_moe_layers * moe
                + np.asarray(stage.num_mtp_layers) * attn)
    if impl == "local":
        return np.where(captured > 0, units * hidden, 0.0) if whole else units / layout.vp * captured * hidden
    mask = CUDA_GRAPH_MASK_BYTES_PER_ELEMENT * tokens * training.seq_len if attn else 0.0
    return np.where(captured > 0, units / layout.vp * captured * (hidden + mask) + hidden, 0.0)


def deferred_wgrad_entries(training: TrainingSpec, num_microbatches: Int, heads: Num) -> Num:
    """Entries of the deferred output-layer wgrad buffers at the pipeline flush (``--defer-embedding-wgrad-compute``):
    every call of the output layer appends while ``wgrad_deferral_limit == 0 or len(buffer) < limit``
    (megatron/core/tensor_parallel/layers.py ``ColumnParallelLinear.forward``: ``embedding_activation_buffer.append``;
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``: ``grad_output_buffer.append``), one call per head
    (the main head and each MTP head, multi_token_prediction.py, share ``output_layer``) and micro-batch, drained only
    at the flush (schedules.py ``finish_embedding_wgrad_compute``):

        D = heads m                       (limit 0)
        D = min(limit, heads m)           (limit > 0)

    0 without the knob."""
    if not training.defer_embedding_wgrad_compute:
        return 0.0
    calls = heads * num_microbatches
    limit = training.wgrad_deferral_limit
    return calls if limit == 0 else np.minimum(limit, calls)


def deferred_wgrad_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: StepLayout, stage: StageLayers,
                                num_microbatches: Int) -> Num:
    """Bytes the last stage's deferred output-layer wgrad keeps (``--defer-embedding-wgrad-compute``), per GPU:

        D (2 T V / t + 2 T h / sh)        (D = ``deferred_wgrad_entries``, T = s b / c, sh = t with SP else 1)

    per entry the output layer's input ``input_parallel`` (the sequence shard under SP: the gather goes to Megatron's
    global ``mpu`` buffer, layers.py ``ColumnParallelLinear.forward``) and its bf16 logit gradient over the whole
    T rows and V / t columns (``backward``: ``grad_output.to(ctx.input_dtype)``). Both outlive the micro-batch's
    backward until the flush; counted in full at the stage's peak (the last micro-batch's entry is at most one
    entry of double counting with its logits). 0 on other stages."""
    heads = 1 + np.asarray(stage.num_mtp_layers)
    entries = deferred_wgrad_entries(training, num_microbatches, heads)
    tokens = training.seq_len * layout.mbs / layout.cp
    sh = np.where(layout.sp, layout.tp, 1)
    entry = act.BF16_BYTES * tokens * (padded_vocab(model, layout.tp) / layout.tp + model.hidden_size / sh)
    return np.where(stage.has_output, entries * entry, 0.0)


def stage_memory(
    model: ModelSpec, training: TrainingSpec, layout: StepLayout, stage: StageLayers, *,
    rank: Int, num_microbatches: Int, max_positions: int, options: MemoryOptions | None = None,
    per_layer: LayerActivations | None = None, param_terms: ParamTerms | None = None, arch: str = "hopper",
) -> StageMemory:
    """Memory breakdown of one pipeline rank (vectorised over candidates). ``per_layer`` and
    ``param_terms``: the layout's ``layer_activations`` and ``params.param_terms`` when already
    computed (the search gathers them); ``arch``: the GPU's architecture (``GPUSpec.arch``)."""
    options = options or MemoryOptions()
    per_layer = per_layer if per_layer is not None else layer_activations(model, training, layout)
    params = stage_params(model, stage, tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                          max_positions=max_positions, terms=param_terms)
    weights, grads, optimizer = model_state_bytes(params, layout, training)
    activations, units = stage_activation_bytes(
        model, training, layout, stage, rank=rank, num_microbatches=num_microbatches, options=options,
        per_layer=per_layer,
    )
    other = stage_other_bytes(model, training, layout, stage, params, activations, options=options,
                              per_layer=per_layer, arch=arch)
    if training.cuda_graph_impl != "none":
        other = replace(other, cuda_graph_bytes=cuda_graph_pool_bytes(model, training, layout, stage, units))
    if training.defer_embedding_wgrad_compute:  # activation-sized buffers: the fragmentation share applies
        deferred = deferred_wgrad_buffer_bytes(model, training, layout, stage, num_microbatches)
        other = replace(other, deferred_wgrad_bytes=deferred,
                        fragmentation_bytes=other.fragmentation_bytes + fragmentation_frac_of(options) * deferred)
    return StageMemory(
        memory=MemoryBreakdown(weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optimizer,
                               activations_bytes=activations, other_bytes=other.total),
        params=params,
        in_flight=units,
        other=other,
    )
