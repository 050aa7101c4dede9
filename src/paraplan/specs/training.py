"""TrainingSpec: sequence length, global batch, precision and optimizer.

Bytes per parameter follow Megatron's mixed-precision Adam (``docs/user-guide/features/
dist_optimizer.md``; Rajbhandari et al. 2020, arXiv:1910.02054 section 3): bf16 parameters
(2 B), fp32 main gradients (4 B), fp32 master weights + Adam m + v (12 B) = 18 B/param.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Literal

from pydantic import ConfigDict

from paraplan.errors import SpecError
from paraplan.fileio import brief
from paraplan.specs.cluster import MAX_SM_COUNT

Precision = Literal["bf16", "fp8", "fp16", "fp4"]
PRECISIONS: Final = ("bf16", "fp8", "fp16", "fp4")
"""GEMM precisions: fp4 is NVFP4 through Transformer Engine (Megatron ``--fp4-format e2m1``, Blackwell only)."""
LOW_PRECISIONS: Final = ("fp8", "fp4")
"""Precisions whose GEMMs run through Transformer Engine's quantized autocast (bf16 weights, quantized copies)."""
Fp4Recipe = Literal["nvfp4"]
FP4_RECIPES: Final = ("nvfp4",)
"""``--fp4-recipe`` values paraplan models (Megatron also takes ``custom``, a user quantizer factory)."""
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
FP8_RECIPES: Final = ("delayed", "tensorwise", "mxfp8", "blockwise")
CudaGraphImpl = Literal["none", "local", "transformer_engine", "full_iteration"]
CUDA_GRAPH_IMPLS: Final = ("none", "local", "transformer_engine", "full_iteration")
"""``--cuda-graph-impl`` choices (megatron/training/arguments.py; TransformerConfig.cuda_graph_impl)."""
CUDA_GRAPH_MODULES: Final = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
"""``--cuda-graph-modules`` values (megatron/core/transformer/enums.py ``CudaGraphModule``); none = the whole layer."""
MainGradsDtype = Literal["fp32", "bf16"]
MainParamsDtype = Literal["fp32", "fp16"]
MomentDtype = Literal["fp32", "fp16", "bf16", "fp8"]
MoeDispatcher = Literal["alltoall", "allgather", "flex"]
MoeFlexBackend = Literal["deepep", "hybridep"]
CpCommType = Literal["p2p", "a2a", "all_gather"]
AttentionKernel = Literal["current", "fa2"]
ATTENTION_KERNELS: Final = ("current", "fa2")
"""``TrainingSpec.attention_kernel`` choices (paraplan's, not a Megatron-LM flag)."""
Nvfp4QuantizeKernel = Literal["fused", "split"]
NVFP4_QUANTIZE_KERNELS: Final = ("fused", "split")
"""``TrainingSpec.nvfp4_quantize_kernel`` choices (paraplan's, not a Megatron-LM flag)."""
DTYPE_CHOICES: Final = {"main_grads_dtype": ("fp32", "bf16"), "main_params_dtype": ("fp32", "fp16"),
                        "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
                        "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8"), "fp8_recipe": FP8_RECIPES,
                        "moe_token_dispatcher_type": ("alltoall", "allgather", "flex"),
                        "moe_flex_dispatcher_backend": ("deepep", "hybridep"),
                        "cuda_graph_impl": CUDA_GRAPH_IMPLS,
                        "fp4_recipe": FP4_RECIPES,
                        "cp_comm_type": ("p2p", "a2a", "all_gather"),
                        "cross_entropy_fusion_impl": ("native", "te")}
"""Allowed values of the string knobs (Megatron-LM's ``choices``; fp8 moments are uint8 + a scale)."""
OFFLOAD_MODULES: Final = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                          "fused_group_mlp")
"""``--offload-modules`` choices paraplan models (``TransformerConfig.offload_modules``; ``gdp_qkv``, the
GatedDeltaProduct mixer's, has no layer here)."""
DTYPE_BYTES: Final = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
KNOB_FLAGS: Final = {
    "grad_reduce_in_bf16": "--grad-reduce-in-bf16",
    "use_precision_aware_optimizer": "--use-precision-aware-optimizer",
    "main_grads_dtype": "--main-grads-dtype", "main_params_dtype": "--main-params-dtype",
    "exp_avg_dtype": "--exp-avg-dtype", "exp_avg_sq_dtype": "--exp-avg-sq-dtype",
    "fp8_recipe": "--fp8-recipe", "fp8_param_gather": "--fp8-param-gather",
    "optimizer_cpu_offload": "--optimizer-cpu-offload", "optimizer_offload_fraction": "--optimizer-offload-fraction",
    "cpu_offloading_num_layers": "--cpu-offloading-num-layers",
    "fine_grained_activation_offloading": "--fine-grained-activation-offloading",
    "offload_modules": "--offload-modules",
    "cp_comm_type": "--cp-comm-type",
    "fsdp_double_buffer": "--fsdp-double-buffer",
    "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
    "moe_hybridep_num_sms": "--moe-flex-dispatcher-num-sms",
    "delay_wgrad_compute": "--delay-wgrad-compute", "moe_permute_fusion": "--moe-permute-fusion",
    "moe_permute_fusion_into_hybridep": "--moe-permute-fusion-into-hybridep",
    "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
    "moe_expert_capacity_factor": "--moe-expert-capacity-factor",
    "moe_pad_expert_input_to_capacity": "--moe-pad-expert-input-to-capacity",
    "moe_expert_rank_capacity_factor": "--moe-expert-rank-capacity-factor", "moe_paged_stash": "--moe-paged-stash",
    "use_transformer_engine_op_fuser": "--use-transformer-engine-op-fuser",
    "moe_use_grouped_tensor": "--moe-use-grouped-tensor",
    "moe_paged_stash_buffer_size_factor_cuda": "--moe-paged-stash-buffer-size-factor-cuda",
    "moe_paged_stash_buffer_size_factor_cpu": "--moe-paged-stash-buffer-size-factor-cpu",
    "cuda_graph_impl": "--cuda-graph-impl", "cuda_graph_modules": "--cuda-graph-modules",
    "overlap_param_gather_with_optimizer_step": "--overlap-param-gather-with-optimizer-step",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
    "fp4_recipe": "--fp4-recipe", "fp4_param_gather": "--fp4-param-gather",
    "first_last_layers_bf16": "--first-last-layers-bf16",
    "num_layers_at_start_in_bf16": "--num-layers-at-start-in-bf16",
    "num_layers_at_end_in_bf16": "--num-layers-at-end-in-bf16",
    "manual_gc": "--manual-gc", "manual_gc_interval": "--manual-gc-interval",
    "defer_embedding_wgrad_compute": "--defer-embedding-wgrad-compute",
    "wgrad_deferral_limit": "--wgrad-deferral-limit",
    "cross_entropy_loss_fusion": "--cross-entropy-loss-fusion",
    "cross_entropy_fusion_impl": "--cross-entropy-fusion-impl",
    "tp_comm_overlap_ag": "--no-tp-comm-overlap-ag", "tp_comm_overlap_rs": "--no-tp-comm-overlap-rs",
    "tp_comm_overlap_cfg": "--tp-comm-overlap-cfg",
    "tp_comm_overlap_rs_dgrad": "--tp-comm-overlap-rs-dgrad",
}
"""TrainingSpec knob (memory or time: ``TIME_ONLY_KNOBS``) -> the Megatron-LM flag that sets it
(megatron_lm_flags_main_d98e8a6.tsv). Megatron-Bridge's ``grad_reduce_in_fp32=False`` is
``grad_reduce_in_bf16=True``; ``store_param_remainders`` has no flag at d98e8a6 (an ``OptimizerConfig`` field, on by
default). ``moe_hybridep_num_sms`` is written as ``--moe-flex-dispatcher-num-sms``: ``--moe-hybridep-num-sms`` is
deprecated (``DEPRECATED_SMS_FLAG``)."""
TE_CROSS_ENTROPY_MESSAGE: Final = ("Transformer Engine cross entropy loss fusion is disabled due to stability issues. "
                                   "Use --cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion.")
"""Megatron-LM ``arguments.py`` ``validate_args``' assert on ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl
te``: refused where a Megatron-LM launch file is written (``launch.megatron.megatron_args``) and in ``check`` of a
Megatron-LM script; estimate, plan and the Bridge target take it (Megatron-Bridge builds TransformerConfig itself,
where it is only a warning, and its perf recipes run it)."""
NCCLEP_MESSAGE: Final = ("moe_flex_dispatcher_backend ncclep (--moe-flex-dispatcher-backend ncclep, Megatron-LM's "
                         "NCCL-EP backend) is not modelled by paraplan: choose deepep or hybridep")
"""Megatron-LM accepts ``ncclep`` (TransformerConfig.moe_flex_dispatcher_backend); paraplan has no cost for its
NCCL-EP kernels, so it refuses it in one line rather than pricing it as another backend."""
DEPRECATED_SMS_FLAG: Final = "--moe-hybridep-num-sms"
"""Megatron-LM's deprecated spelling of ``--moe-flex-dispatcher-num-sms`` (TransformerConfig.__post_init__ routes
``moe_hybridep_num_sms`` to ``moe_flex_dispatcher_num_sms`` and warns; an explicit ``moe_flex_dispatcher_num_sms``
wins): read, never written."""
DEPRECATED_DEEPEP_SMS_FLAG: Final = "--moe-deepep-num-sms"
"""The other deprecated spelling of ``--moe-flex-dispatcher-num-sms`` (DeepEP's SMs, TransformerConfig
``moe_deepep_num_sms``), routed like ``DEPRECATED_SMS_FLAG``; both at different values without the current flag is
refused, as Megatron does ("Conflicting deprecated SM-count knobs"): read, never written."""
KNOB_REFINEMENTS: Final = {
    "manual_gc": ("manual_gc_interval",),
    "defer_embedding_wgrad_compute": ("wgrad_deferral_limit",),
    "cross_entropy_loss_fusion": ("cross_entropy_fusion_impl",),
    "fine_grained_activation_offloading": ("offload_modules",),
    "optimizer_cpu_offload": ("optimizer_offload_fraction",),
    "moe_token_dispatcher_type": ("moe_flex_dispatcher_backend", "moe_hybridep_num_sms",
                                  "moe_permute_fusion_into_hybridep"),
    "moe_flex_dispatcher_backend": ("moe_permute_fusion_into_hybridep",),
    "cuda_graph_impl": ("cuda_graph_modules",),
    "moe_paged_stash": ("moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu"),
    "use_precision_aware_optimizer": ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                                      "optimizer_cpu_offload"),
}
"""A knob -> the knobs that refine it: Megatron reads them only with it on (``megatron_flags._drop_ignored`` drops
them without it; the optimizer dtypes need the precision-aware optimizer). Beside a recipe, a ``--knob`` refinement is
read with the recipe's value of the knob it refines (``cli.estimate._recipe_knobs``)."""
KNOB_FLAG_ALIASES: Final = {"moe_hybridep_num_sms": (DEPRECATED_SMS_FLAG, DEPRECATED_DEEPEP_SMS_FLAG),
                            "cuda_graph_modules": ("--cuda-graph-scope",)}
"""A knob -> the deprecated Megatron-LM flags that also set it (read, never written)."""
TIME_ONLY_KNOBS: Final = frozenset({
    "cp_comm_type", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_hybridep_num_sms",
    "delay_wgrad_compute", "moe_permute_fusion", "moe_permute_fusion_into_hybridep", "moe_shared_expert_overlap",
    "overlap_param_gather_with_optimizer_step",
    "gradient_accumulation_fusion", "manual_gc", "manual_gc_interval", "tp_comm_overlap_ag", "tp_comm_overlap_rs",
    "attention_kernel", "fp8_dot_product_attention", "fp4_recipe", "nvfp4_quantize_kernel",
    "use_transformer_engine_op_fuser", "tp_comm_overlap_cfg",
    "moe_use_grouped_tensor", "moe_paged_stash_buffer_size_factor_cpu",
    "tp_comm_overlap_rs_dgrad",
})
"""TrainingSpec knobs that move step time only: no memory formula reads them (``tests/unit/test_knob_effects.py``
turns each on and compares every stage's memory). The other knobs move memory (and may move time too). estimate and
check print the two groups as ``memory knobs:`` and ``time-only knobs:``; the JSON's ``config.memory_knobs`` keeps
every knob away from Megatron's defaults (its name predates the time knobs) and ``config.time_only_knobs`` names
those of them in this set."""

PARAM_BYTES: Final = 2.0
"""bf16 model weights (also under FP8 training: TE keeps bf16 weights, casts per GEMM)."""
GRAD_BYTES: Final = 4.0
"""fp32 main gradients (Megatron accumulates and reduces grads in fp32 by default)."""
OPTIMIZER_BYTES: Final = 12.0
"""fp32 master weights + Adam first and second moments."""
FP16_GRAD_BYTES: Final = 2.0
"""fp16 training keeps fp16 model gradients; the fp32 main gradient (4 B) lives with the optimizer
state, so Megatron's table gives 20 B/param, or 4 + 16/d with the distributed optimizer
(``docs/user-guide/features/dist_optimizer.md``)."""
FP16_MAIN_GRAD_BYTES: Final = 4.0
MAX_TOKENS_PER_STEP: Final = 2**40
"""Largest seq_len x global_batch_size accepted (1.1e12 tokens; Llama 3 405B trained with 16M a step)."""
MAX_SMS: Final = MAX_SM_COUNT
"""Largest ``moe_hybridep_num_sms`` accepted: no more SMs than the largest GPU ``sm_count`` accepted."""
MAX_CAPACITY_FACTOR: Final = 1024.0
"""Largest ``moe_expert_capacity_factor`` accepted (above E / k every expert may take every token)."""
MAX_TOKENS: Final = 2**24
"""Largest seq_len and global_batch_size accepted (16,777,216; 1M-token contexts and 16K-sequence batches are
the largest published)."""


def grad_bytes_per_param(precision: str) -> float:
    """Bytes of one model gradient, as held and as reduced over data parallel.

    Megatron keeps and reduces gradients in their accumulation dtype: bf16 (and fp8, whose
    parameters are bf16) forces ``--accumulate-allreduce-grads-in-fp32`` (4 B; arguments.py:
    "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"), while fp16
    leaves it off, so fp16 gradients are held and reduced as fp16 (2 B), as in Megatron-DeepSpeed.
    """
    return FP16_GRAD_BYTES if precision == "fp16" else GRAD_BYTES


def main_grad_bytes(training: TrainingSpec) -> float:
    """Bytes per parameter of the DDP main-grad buffer (held and reduced in this dtype).

    Mirrors ``megatron/training/arguments.py`` ``validate_args`` (bf16 branch): ``--grad-reduce-in-bf16``
    sets ``accumulate_allreduce_grads_in_fp32 = False``, and so does ``--main-grads-dtype bf16`` (only
    fp32 main grads switch fp32 accumulation on); ``training.py`` passes it as DDP's ``grad_reduce_in_fp32``
    and ``distributed/param_and_grad_buffer.py`` ``group_params_for_buffers`` builds the buffer in
    ``grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype``. fp16 keeps fp16 grads.
    """
    if training.precision == "fp16":
        return FP16_GRAD_BYTES
    bf16 = training.grad_reduce_in_bf16 or training.main_grads_dtype == "bf16"
    return FP16_GRAD_BYTES if bf16 else GRAD_BYTES


def optimizer_bytes_per_param(training: TrainingSpec) -> float:
    """Adam state on the GPU per parameter of the optimizer shard (master weights + m + v [+ fp16 main grad]).

    Mirrors Megatron-LM ``megatron/core/optimizer/__init__.py`` (``_get_megatron_optimizer_based_on_param_groups``)
    and ``optimizer/distrib_optimizer.py`` (``_build_model_and_main_param_groups``):
    - default: fp32 main params (``shard_model_param.clone().float()``) + fp32 exp_avg, exp_avg_sq = 12 B;
      fp16 adds the fp32 main gradient (4 B, ``shard_model_grad.float()``).
    - ``--use-precision-aware-optimizer``: TE FusedAdam holds exp_avg/exp_avg_sq in their dtypes; when
      ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` (``optimizer_config.py``: main params not fp32, or
      no FP8 / delayed scaling, or CPU offload) it also holds the master weights in ``main_params_dtype``,
      fp32 ones as 16-bit remainders of bf16 params (``store_param_remainders``); otherwise MCore keeps fp32
      main params. Main grads are ``decoupled_grad`` views of the grad buffer (no copy).
    - ``--optimizer-cpu-offload``: ``HybridDeviceOptimizer`` (``optimizer/cpu_offloading/hybrid_optimizer.py``,
      ``_get_sub_optimizer_param_groups``) moves ``offload_fraction`` of the parameters to the host; the rest
      get fp32 copies (``param_update_in_fp32=True``) and a plain Adam (fp32 m, v): 12 x (1 - fraction) B.
    """
    if training.optimizer_cpu_offload:
        return OPTIMIZER_BYTES * (1.0 - float(training.optimizer_offload_fraction))
    if not training.use_precision_aware_optimizer:
        return OPTIMIZER_BYTES + (FP16_MAIN_GRAD_BYTES if training.precision == "fp16" else 0.0)
    moments = DTYPE_BYTES[training.exp_avg_dtype] + DTYPE_BYTES[training.exp_avg_sq_dtype]
    te_master = (training.main_params_dtype != "fp32" or training.precision != "fp8"
                 or training.fp8_recipe == "delayed")
    if not te_master:
        return DTYPE_BYTES["fp32"] + moments
    remainders = (training.store_param_remainders and training.main_params_dtype == "fp32"
                  and training.precision in ("bf16", "fp8", "fp4") and not training.fp8_param_gather)
    remainders = remainders and not training.fp4_param_gather  # bf16 params only (as with FP8 param gather)
    master = FP16_GRAD_BYTES if remainders else DTYPE_BYTES[training.main_params_dtype]
    return master + moments


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """What one training step processes."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    seq_len: int
    """Tokens per sequence (``--seq-length``)."""
    global_batch_size: int
    """Sequences per step (``--global-batch-size``)."""
    precision: Precision = "bf16"
    """GEMM precision; FP8 and FP4 (NVFP4) keep bf16 weights and fp32 optimizer states."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer (Adam: 12 B/param of fp32 state)."""
    attention_backend: Literal["flash", "unfused"] = "flash"
    """flash/fused attention keeps no s^2 tensors; unfused (Megatron ``--attention-backend
    unfused``/local) keeps softmax output and dropout tensors of a*s^2*b elements."""
    grad_reduce_in_bf16: bool = False
    """``--grad-reduce-in-bf16``: the main-grad buffer (and its reduce) is bf16, 2 B/param instead of 4."""
    use_precision_aware_optimizer: bool = False
    """``--use-precision-aware-optimizer``: TE FusedAdam holds master weights and moments in the dtypes below."""
    main_grads_dtype: MainGradsDtype = "fp32"
    """``--main-grads-dtype``; bf16 also leaves the grad buffer in bf16 (arguments.py, validate_args)."""
    main_params_dtype: MainParamsDtype = "fp32"
    """``--main-params-dtype`` (master weights, precision-aware optimizer only)."""
    exp_avg_dtype: MomentDtype = "fp32"
    """``--exp-avg-dtype`` (Adam m, precision-aware optimizer only)."""
    exp_avg_sq_dtype: MomentDtype = "fp32"
    """``--exp-avg-sq-dtype`` (Adam v, precision-aware optimizer only)."""
    store_param_remainders: bool = True
    """fp32 master weights of bf16 parameters kept as their low 16 bits (``OptimizerConfig.store_param_remainders``,
    default True; no Megatron-LM flag)."""
    fp8_recipe: Fp8Recipe = "delayed"
    """``--fp8-recipe`` (FP8 only): the scaling state kept with each FP8 weight copy."""
    fp8_param_gather: bool = False
    """``--fp8-param-gather`` (FP8 only): weights are kept in FP8 only, no bf16 copy."""
    optimizer_cpu_offload: bool = False
    """``--optimizer-cpu-offload`` (needs the precision-aware optimizer, as in Megatron)."""
    optimizer_offload_fraction: float = 1.0
    """``--optimizer-offload-fraction``: share of the optimizer's parameters whose state lives on the host."""
    cpu_offloading_num_layers: int = 0
    """``--cpu-offloading-num-layers`` (> 0 turns ``cpu_offloading`` on, ``arguments.py``): TE's layer-level
    activation offloading (``get_cpu_offload_context``) moves the saved activations of that many of the rank's
    layers to the host; needs PP 1 and no recompute (``TransformerConfig.__post_init__``)."""
    fine_grained_activation_offloading: bool = False
    """``--fine-grained-activation-offloading``: offload the inputs of the ``offload_modules`` to the host."""
    offload_modules: tuple[str, ...] = ()
    """``--offload-modules`` (``OFFLOAD_MODULES``): the submodules whose inputs go to the host."""
    peft: bool = False
    """Parameter-efficient fine-tuning (Megatron-Bridge ``task=peft``, LoRA): the base weights are frozen
    (``requires_grad=False``), so they are in no DDP grad buffer (``param_and_grad_buffer.py`` takes only
    parameters that require grad) and in no optimizer shard. The adapters (rank 16 on ``linear_qkv`` in
    NVIDIA's recipes: under 0.1% of the parameters) are neglected. Time: no weight-gradient GEMMs for the frozen
    weights (``time.layer.frozen_wgrad_s``), no gradient reduce, parameter gather or optimizer step on them
    (``time.dp.dp_times``). No Megatron-LM flag."""
    cp_comm_type: CpCommType = "p2p"
    """``--cp-comm-type`` (one value for every layer): how attention exchanges K,V under context parallelism
    (``estimate/time/cp.py``); ``a2a+p2p`` is not modelled."""
    fsdp_double_buffer: bool = False
    """``--fsdp-double-buffer`` (Megatron-FSDP only; --use-nccl-ub and --megatron-fsdp-max-pool-double-buffer set
    it too): two persistent unit buffers, so no more than two layers' weights are gathered at once."""
    moe_token_dispatcher_type: MoeDispatcher = "alltoall"
    """``--moe-token-dispatcher-type`` (MoE models): how routed tokens reach their experts
    (``paraplan.estimate.time.ep``). Megatron-LM's CLI default is allgather; paraplan's default is alltoall, the
    dispatcher every launch file it writes names and every NVIDIA MoE recipe uses (or flex)."""
    moe_flex_dispatcher_backend: MoeFlexBackend = "deepep"
    """``--moe-flex-dispatcher-backend`` (flex dispatcher only): DeepEP or HybridEP fused kernels."""
    moe_hybridep_num_sms: int | None = None
    """``--moe-flex-dispatcher-num-sms`` (or the deprecated ``--moe-hybridep-num-sms``): SMs the flex dispatch /
    combine kernels hold; None = the backend's default (``FLEX_DEFAULT_SMS``)."""
    delay_wgrad_compute: bool = False
    """``--delay-wgrad-compute`` (with ``--overlap-moe-expert-parallel-comm``, the combined_1f1b schedule): weight
    gradients run after the dispatch backward is issued, so they hide it too."""
    moe_permute_fusion: bool = False
    """``--moe-permute-fusion``: TE's fused permute kernels (the separate permute / unpermute copies stay, with the
    same bytes; with DeepEP the fused permute also pads to the quantization alignment, so the experts' padding
    copies go: ``estimate.time.permute``)."""
    moe_permute_fusion_into_hybridep: bool = False
    """``--moe-permute-fusion-into-hybridep`` (flex dispatcher, HybridEP backend): the expert permutation runs inside
    HybridEP's dispatch / combine kernels (``_HybridEPManager``: ``fused=config.moe_permute_fusion_into_hybridep``,
    token_dispatcher.py), no separate copies. Megatron's default is off."""
    moe_shared_expert_overlap: bool = False
    """``--moe-shared-expert-overlap``: the shared expert runs on a side stream during the dispatch/combine."""
    moe_expert_capacity_factor: float | None = None
    """``--moe-expert-capacity-factor``: tokens beyond c x T k / E per expert are dropped (None: dropless)."""
    moe_pad_expert_input_to_capacity: bool = False
    """``--moe-pad-expert-input-to-capacity``: every expert computes exactly its capacity (needs the factor)."""
    moe_expert_rank_capacity_factor: float | None = None
    """``--moe-expert-rank-capacity-factor`` (flex dispatcher, HybridEP backend): a static per-rank budget of
    factor x T k received tokens (``_HybridEPManager.setup_metadata``), so HybridEP's dispatch needs no host sync
    (``estimate.time.moe_sync``); tokens over the budget are dropped. None: dropless, the budget read back from the
    GPU each dispatch. Without the paged stash the grouped expert MLP runs on, and saves for the backward, the whole
    budget (``experts.py``: ``max_num_tokens``), so the routed activations are factor x T k
    (``activations.saved_routed_load``)."""
    moe_paged_stash: bool = False
    """``--moe-paged-stash``: routed-expert activations saved for the backward go into a paged buffer
    (moe/paged_stash.py); needs ``moe_expert_rank_capacity_factor`` (TransformerConfig.__post_init__). The GPU stash
    holds pages of the tokens actually received, sized ``moe_paged_stash_buffer_size_factor_cuda`` x the expected
    T k (``activations.saved_routed_load``), instead of the budget-sized buffers."""
    moe_paged_stash_buffer_size_factor_cuda: float = 1.10
    """``--moe-paged-stash-buffer-size-factor-cuda`` (with ``moe_paged_stash``): the GPU stash buffer holds
    |factor| x the in-flight routed tokens (``PagedStashManager.allocate_stash_buffers``: positive sizes from the
    expected tokens max_num_tokens // rank capacity factor, negative from the largest actual count, which balanced
    routing puts at the same T k). Megatron-LM's default 1.10; the Bridge perf recipes set 1.2."""
    moe_paged_stash_buffer_size_factor_cpu: float = 0.0
    """``--moe-paged-stash-buffer-size-factor-cpu`` (with ``moe_paged_stash``): a pinned host buffer of |factor| x
    the routed tokens that takes what overflows the GPU stash (0: none). Host memory only: no GPU memory, and its
    spill traffic is not modelled. Megatron-LM's default 0.0; the Bridge perf recipes set 1.0."""
    moe_use_grouped_tensor: bool = False
    """``--moe-use-grouped-tensor``: TE's GroupedTensor path for the grouped expert GEMMs (the op fuser turns it
    on, TransformerConfig.__post_init__); Megatron accepts it instead of the op fuser for
    ``moe_expert_rank_capacity_factor`` with HybridEP. Its kernels' speed is not modelled (no memory); the experts pad
    their input to 256-token segments with it (the padding copies of ``estimate.time.permute``, not with HybridEP)."""
    use_transformer_engine_op_fuser: bool = False
    """``--use-transformer-engine-op-fuser``: TE's operation fuser for the grouped expert MLP; Megatron requires it
    (or ``--moe-use-grouped-tensor``) for ``moe_expert_rank_capacity_factor`` with HybridEP. Its kernels' speed is
    not modelled (no time, no memory)."""
    cuda_graph_impl: CudaGraphImpl = "none"
    """``--cuda-graph-impl``: per-layer CUDA graphs (``local``: MCore's CudaGraphManager; ``transformer_engine``:
    TE ``make_graphed_callables``) or one graph of the whole forward-backward (``full_iteration``)."""
    cuda_graph_modules: tuple[str, ...] = ()
    """``--cuda-graph-modules`` (``--cuda-graph-scope`` before): the parts of each layer captured
    (``CUDA_GRAPH_MODULES``); empty = the whole layer (TransformerConfig.cuda_graph_modules "full"). No effect
    with ``cuda_graph_impl`` none."""
    overlap_param_gather_with_optimizer_step: bool = False
    """``--overlap-param-gather-with-optimizer-step``: the first model chunk's parameter all-gather starts right after
    its optimizer step, behind the other chunks' steps (needs the distributed optimizer, --overlap-param-gather and
    VP > 1; ``time.dp.exposed_and_link_s``)."""
    gradient_accumulation_fusion: bool = True
    """Megatron's default; ``--no-gradient-accumulation-fusion`` turns it off: the weight-gradient GEMMs then write
    a bf16 ``.grad`` that DDP's hook adds into the main gradient (``time.optimizer.grad_accumulation_s``)."""
    fp4_recipe: Fp4Recipe = "nvfp4"
    """``--fp4-recipe`` (FP4 only): TE ``NVFP4BlockScaling``, E2M1 values in 16-element blocks with an E4M3 scale
    each and one fp32 scale per tensor."""
    fp4_param_gather: bool = False
    """``--fp4-param-gather`` (FP4 only): weights are kept in NVFP4 only (no bf16 copy) and all-gathered in NVFP4."""
    first_last_layers_bf16: bool = False
    """``--first-last-layers-bf16`` (FP8 other than delayed scaling, or FP4): the first and last transformer layers
    run in BF16 (``fp8_utils.get_fp8_context`` / ``fp4_utils.get_fp4_context``: no quantized autocast)."""
    num_layers_at_start_in_bf16: int = 1
    """``--num-layers-at-start-in-bf16`` (with ``first_last_layers_bf16``)."""
    num_layers_at_end_in_bf16: int = 1
    """``--num-layers-at-end-in-bf16`` (with ``first_last_layers_bf16``)."""
    fp8_dot_product_attention: bool = False
    """``TransformerConfig.fp8_dot_product_attention`` (FP8 or FP4; no Megatron-LM flag at d98e8a6, a Bridge
    mixed-precision field): attention's score GEMMs run in FP8 (TE ``DelayedScaling``/``NVFP4BlockScaling``
    ``fp8_dpa``)."""
    manual_gc: bool = False
    """``--manual-gc``: Python's automatic garbage collector is off and ``gc.collect()`` runs every
    ``manual_gc_interval`` steps (training.py ``train``: aligns GC pauses across ranks). Modelled as no time either way:
    no primary source gives the length of a collection pause (docs/model.md section 4)."""
    manual_gc_interval: int = 0
    """``--manual-gc-interval`` (with ``manual_gc``; Megatron-LM's default 0: never collects; >= 0, training.py's
    assert)."""
    defer_embedding_wgrad_compute: bool = False
    """``--defer-embedding-wgrad-compute``: the last stage's output-layer weight-gradient GEMM of the first
    ``wgrad_deferral_limit`` micro-batches (all with 0) is kept back and run at the pipeline flush
    (tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``, schedules.py
    ``finish_embedding_wgrad_compute``; ``step_time.deferred_wgrad_terms``). Needs PP > 1 and gradient accumulation
    fusion (ModelParallelConfig.__post_init__)."""
    wgrad_deferral_limit: int = 0
    """``--wgrad-deferral-limit`` (with ``defer_embedding_wgrad_compute``): micro-batches deferred, 0 = all; >= 0."""
    tp_comm_overlap_ag: bool = True
    """Megatron's default; ``--no-tp-comm-overlap-ag`` (or ``--disable-tp-comm-overlap-ag``) turns off, under
    ``--tp-comm-overlap``, the userbuffers all-gather pairs (TE ``ub_overlap_ag``: the QKV/fc1 input forward, the
    proj/fc2 output gradient backward), which then show in full (``time.tp.ub_block_exposure``)."""
    tp_comm_overlap_rs: bool = True
    """Megatron's default; ``--no-tp-comm-overlap-rs`` (or ``--disable-tp-comm-overlap-rs``) turns off the
    proj/fc2 output reduce-scatter pair (TE ``ub_overlap_rs``), which then shows in full."""
    tp_comm_overlap_rs_dgrad: bool = False
    """Megatron's default (ModelParallelConfig ``tp_comm_overlap_rs_dgrad``); ``--tp-comm-overlap-rs-dgrad`` lets a
    qkv/fc1 dgrad that the userbuffers config gives a non-bulk method (the LoRA configs) reduce-scatter the input
    gradient behind the dgrad GEMM (TE ``ub_overlap_rs_dgrad``; extensions/transformer_engine.py passes
    ``ub_overlap_rs_dgrad=config.tp_comm_overlap_rs_dgrad``). Off, TE runs that dgrad's bulk all-gather and the
    wgrad's bulk reduce-scatter instead (``ub_bulk_dgrad = ub_bulk_dgrad and not ub_overlap_rs_dgrad``;
    ``time.tp.ub_block_exposure``)."""
    tp_comm_overlap_cfg: str = ""
    """The userbuffers per-GEMM config under ``--tp-comm-overlap`` (``specs.userbuffers``): "" (Megatron-LM's
    default: no ``--tp-comm-overlap-cfg``, TE's default methods and SMs), the name of one of Megatron-Bridge's named
    configs (``tp_comm_overlap_cfg = userbuffers_...``, packaged ``recipes/ub_configs.json``), the path of a
    ``--tp-comm-overlap-cfg`` YAML file (read when costed), or a config as compact JSON (a manifest's ConfigMap as
    read); each GEMM costed with its method, SMs and splits
    (``time.tp.ub_block_exposure``)."""
    cross_entropy_loss_fusion: bool = False
    """``--cross-entropy-loss-fusion`` (Megatron-LM's default off; Megatron-Bridge's ``GPTModelProvider`` default on):
    the loss runs as one fused kernel, ``cross_entropy_fusion_impl`` says whose (``language_module.py``
    ``compute_language_model_loss``)."""
    cross_entropy_fusion_impl: Literal["native", "te"] = "native"
    """``--cross-entropy-fusion-impl`` (with ``cross_entropy_loss_fusion``): ``native`` (MCore's fused kernel, an fp32
    softmax copy as the unfused loss keeps) or ``te`` (Transformer Engine's ``parallel_cross_entropy``, whose
    gradient overwrites the bf16 logits: ``activations.output_bytes``). Megatron-LM's ``validate_args`` rejects the
    te fusion ("disabled due to stability issues"); Megatron-Bridge's perf recipes run it (``_benchmark_common``)."""
    attention_kernel: AttentionKernel = "current"
    """The flash-attention kernel generation (paraplan's own knob, ``--knob attention-kernel=fa2``; NOT a Megatron-LM
    flag: the kernel is what the container's Transformer Engine / cuDNN / flash-attn pick, so launch files and
    ``megatron_args`` never write it and ``KNOB_FLAGS`` does not list it). ``current`` (default): today's fused
    kernels at the preset's fitted ``attention_frac``; ``fa2``: the 2023-24 generation (flash-attn 2, and the cuDNN
    FusedAttention that Transformer Engine 1.x picks on sm90) at the measured FlashAttention-2 rate of the GPU's
    architecture (``estimate.time.compute.fa2_peak_fraction``). Only the flash backend is affected."""
    nvfp4_quantize_kernel: Nvfp4QuantizeKernel = "fused"
    """How Transformer Engine quantizes a linear layer's NVFP4 operands that need both copies with the random
    Hadamard transform (forward inputs, backward output gradients; paraplan's own knob, ``--knob
    nvfp4-quantize-kernel=split``; NOT a Megatron-LM flag: it is the container's Transformer Engine release, so launch
    files never write it). ``fused`` (default; TE >= 2.14, csrc/quantizer.cpp ``NVFP4Quantizer::quantize_impl``:
    ``nvte_quantize_with_hadamard_transform`` writes the rowwise copy and the RHT columnwise copy from one read of
    the bf16 tensor); ``split`` (TE <= 2.13, e.g. 2.12 in NeMo 26.02: ``nvte_quantize_v2`` for the rowwise copy, then
    ``nvte_hadamard_transform_cast_fusion_columnwise`` reading the tensor again): one more bf16 read per element
    (``estimate.time.compute.nvfp4_quant_bytes_per_element``). FP4 only; grouped (MoE expert) linears are fused in
    both (TE 2.12 extensions/cast.cpp ``nvte_group_hadamard_transform_cast_fusion``)."""

    def __post_init__(self) -> None:
        for fname in ("seq_len", "global_batch_size"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"{fname} must be a positive integer, got {brief(value)}")
            if value > MAX_TOKENS:
                raise SpecError(f"{fname} must be at most {MAX_TOKENS:,} (the limit), got {value}")
        if self.seq_len * self.global_batch_size > MAX_TOKENS_PER_STEP:
            raise SpecError(f"seq_len x global_batch_size = {self.seq_len * self.global_batch_size:.3g} tokens per "
                            f"step is over {MAX_TOKENS_PER_STEP:.3g} (the limit)")
        if self.attention_backend not in ("flash", "unfused"):
            raise SpecError(f"attention_backend must be flash or unfused, got {brief(self.attention_backend)}")
        if self.precision not in PRECISIONS:
            raise SpecError(f"precision must be one of {', '.join(PRECISIONS)}, got {brief(self.precision)}")
        self._check_knobs()
        self._check_attention_kernel()
        if self.nvfp4_quantize_kernel not in NVFP4_QUANTIZE_KERNELS:
            raise SpecError(f"nvfp4_quantize_kernel must be one of {', '.join(NVFP4_QUANTIZE_KERNELS)}, "
                            f"got {brief(self.nvfp4_quantize_kernel)}")
        if self.nvfp4_quantize_kernel != "fused" and self.precision != "fp4":
            raise SpecError(f"nvfp4_quantize_kernel (--knob nvfp4-quantize-kernel) {self.nvfp4_quantize_kernel} needs "
                            f"precision fp4 (it is how Transformer Engine casts NVFP4 operands), got precision "
                            f"{self.precision}")

    def _check_attention_kernel(self) -> None:
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise SpecError(f"attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                            f"got {brief(self.attention_kernel)}")
        if self.attention_kernel == "fa2" and self.fp8_dot_product_attention:  # TE v1.4 attention.py
            raise SpecError("attention_kernel fa2 has no FP8 attention (flash-attn 2 runs bf16/fp16; Transformer "
                            "Engine 1.x's DotProductAttention: 'DPA does not support FP8'): drop "
                            "fp8_dot_product_attention or use attention_kernel current")

    def _check_knobs(self) -> None:
        for fname, choices in DTYPE_CHOICES.items():
            if (value := getattr(self, fname)) not in choices:
                raise SpecError(NCCLEP_MESSAGE if (fname, value) == ("moe_flex_dispatcher_backend", "ncclep")
                                else f"{fname} must be one of {', '.join(choices)}, got {brief(value)}")
        for fname in ("grad_reduce_in_bf16", "use_precision_aware_optimizer", "store_param_remainders",
                      "fp8_param_gather", "optimizer_cpu_offload", "fsdp_double_buffer", "delay_wgrad_compute",
                      "moe_permute_fusion", "moe_permute_fusion_into_hybridep", "moe_shared_expert_overlap",
                      "moe_pad_expert_input_to_capacity", "moe_paged_stash", "use_transformer_engine_op_fuser",
                      "moe_use_grouped_tensor",
                      "overlap_param_gather_with_optimizer_step", "gradient_accumulation_fusion",
                      "fp4_param_gather", "first_last_layers_bf16", "fp8_dot_product_attention", "manual_gc",
                      "defer_embedding_wgrad_compute", "cross_entropy_loss_fusion", "tp_comm_overlap_ag",
                      "tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad"):
            if not isinstance(getattr(self, fname), bool):
                raise SpecError(f"{fname} must be true or false, got {brief(getattr(self, fname))}")
        frac = self.optimizer_offload_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
            raise SpecError(f"optimizer_offload_fraction must be a number from 0 to 1, got {brief(frac)}")
        self._check_moe_knobs()
        if self.fp8_param_gather and self.precision != "fp8":
            raise SpecError("fp8_param_gather (--fp8-param-gather) needs precision fp8")
        self._check_offload()
        self._check_rank_capacity()
        self._check_cuda_graphs()
        if self.fp4_param_gather and self.precision != "fp4":  # arguments.py validate_args
            raise SpecError("fp4_param_gather (--fp4-param-gather) needs precision fp4: Megatron-LM's "
                            "'--fp4-param-gather must be used together with --fp4-format.'")
        for fname in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "manual_gc_interval",
                      "wgrad_deferral_limit"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
                raise SpecError(f"{fname} must be an integer >= 0 and at most {MAX_TOKENS:,} (the limit), got "
                                f"{brief(value)}")
        if self.defer_embedding_wgrad_compute and not self.gradient_accumulation_fusion:  # ModelParallelConfig
            raise SpecError("defer_embedding_wgrad_compute needs gradient_accumulation_fusion: Megatron-Core's "
                            "'Cannot defer embedding wgrad compute when gradient accumulation fusion is not used'")
        if self.fp8_dot_product_attention and self.precision not in LOW_PRECISIONS:
            raise SpecError("fp8_dot_product_attention needs precision fp8 or fp4")
        if self.first_last_layers_bf16 and self.precision == "fp8" and self.fp8_recipe == "delayed":
            raise SpecError("first_last_layers_bf16 (--first-last-layers-bf16) is not supported with fp8_recipe "
                            "delayed: Megatron-Core's 'Delayed scaling does not support first / last layer in BF16.'")
        if self.optimizer_cpu_offload and not self.use_precision_aware_optimizer:
            raise SpecError("optimizer_cpu_offload (--optimizer-cpu-offload) needs use_precision_aware_optimizer "
                            "(--use-precision-aware-optimizer), as in Megatron-LM")
        self._check_optimizer_dtypes()
        from paraplan.specs.userbuffers import check_atomic_precision, resolve

        bf16_layers = self.first_last_layers_bf16 and (self.num_layers_at_start_in_bf16 > 0
                                                       or self.num_layers_at_end_in_bf16 > 0)
        check_atomic_precision(resolve(self.tp_comm_overlap_cfg), self.precision == "fp8" and not bf16_layers,
                               "tp_comm_overlap_cfg")

    def _check_optimizer_dtypes(self) -> None:
        """megatron/core/optimizer/optimizer_config.py ``__post_init__``: lower-precision optimizer tensors need the
        precision-aware optimizer."""
        if self.use_precision_aware_optimizer:
            return
        for fname in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(self, fname) != "fp32":
                raise SpecError(f"{fname} {getattr(self, fname)} (--{fname.replace('_', '-')}) needs "
                                "use_precision_aware_optimizer (--use-precision-aware-optimizer): Megatron-LM's "
                                f"'{fname} can only be fp32 when not using precision-aware optimizer'")

    def _check_offload(self) -> None:
        """Megatron-LM's asserts on activation offloading (``TransformerConfig.__post_init__``)."""
        n = self.cpu_offloading_num_layers
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOKENS:
            raise SpecError(f"cpu_offloading_num_layers must be an integer >= 0 and at most {MAX_TOKENS:,} (the "
                            f"limit), got {brief(n)}")
        for fname in ("fine_grained_activation_offloading", "peft"):
            if not isinstance(getattr(self, fname), bool):
                raise SpecError(f"{fname} must be true or false, got {brief(getattr(self, fname))}")
        mods = self.offload_modules
        if not isinstance(mods, tuple) or any(m not in OFFLOAD_MODULES for m in mods):
            raise SpecError(f"offload_modules must be a list of {', '.join(OFFLOAD_MODULES)}, got {brief(mods)}")
        if not self.fine_grained_activation_offloading:
            return
        if n > 0:
            raise SpecError("fine_grained_activation_offloading cannot be enabled with cpu_offloading "
                            "(--cpu-offloading-num-layers > 0)")
        if not mods:
            raise SpecError("fine_grained_activation_offloading needs offload_modules (--offload-modules), one or "
                            f"more of {', '.join(OFFLOAD_MODULES)}")
        if "attn_proj" in mods and "core_attn" not in mods:
            raise SpecError("offload_modules: attn_proj cannot be set alone without core_attn (the input of "
                            "attn_proj is the output of core_attn, needed in core_attn.backward())")
        if "fused_group_mlp" in mods and {"expert_fc1", "moe_act"} & set(mods):
            raise SpecError("offload_modules: fused_group_mlp cannot be combined with expert_fc1 or moe_act")

    @property
    def offloaded_modules(self) -> tuple[str, ...]:
        """The modules whose inputs are offloaded: ``offload_modules`` under fine-grained offloading, else none."""
        return self.offload_modules if self.fine_grained_activation_offloading else ()

    @property
    def activation_offloading(self) -> bool:
        """Layer-level or fine-grained activation offloading is on."""
        return self.cpu_offloading_num_layers > 0 or bool(self.offloaded_modules)
    def _check_moe_knobs(self) -> None:
        sms = self.moe_hybridep_num_sms
        if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int) or not 1 <= sms <= MAX_SMS):
            raise SpecError(f"moe_hybridep_num_sms must be an integer from 1 to {MAX_SMS} or unset, got {brief(sms)}")
        cf = self.moe_expert_capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                               or not 0.0 < cf <= MAX_CAPACITY_FACTOR):
            raise SpecError(f"moe_expert_capacity_factor must be a number above 0 and at most {MAX_CAPACITY_FACTOR:g}"
                            f" or unset, got {brief(cf)}")
        if self.moe_pad_expert_input_to_capacity and cf is None:  # TC: __post_init__
            raise SpecError("moe_pad_expert_input_to_capacity (--moe-pad-expert-input-to-capacity) needs "
                            "moe_expert_capacity_factor (--moe-expert-capacity-factor), as in Megatron-LM")
        if self.moe_pad_expert_input_to_capacity and self.moe_token_dispatcher_type == "flex" \
                and self.moe_flex_dispatcher_backend == "deepep":  # TC: __post_init__
            raise SpecError("Flex token dispatcher with deepep backend does not support "
                            "moe_pad_expert_input_to_capacity")
        if self.moe_shared_expert_overlap and self.moe_token_dispatcher_type == "allgather":  # TC: __post_init__
            raise SpecError("moe_shared_expert_overlap only works with alltoall or flex token dispatcher.")

    def _check_rank_capacity(self) -> None:
        """TransformerConfig.__post_init__'s rules on ``moe_expert_rank_capacity_factor`` and ``moe_paged_stash``
        (megatron/core/transformer/transformer_config.py), with their words (ncclep is not a paraplan backend)."""
        rcf = self.moe_expert_rank_capacity_factor
        if rcf is not None and (isinstance(rcf, bool) or not isinstance(rcf, (int, float))
                                or not 0.0 < rcf <= MAX_CAPACITY_FACTOR):
            raise SpecError("moe_expert_rank_capacity_factor must be a number above 0 and at most "
                            f"{MAX_CAPACITY_FACTOR:g} or unset, got {brief(rcf)}")
        # Megatron checks the backend only (hybridep or ncclep; ncclep is refused apart, NCCLEP_MESSAGE): under
        # another dispatcher type the budget is unused (HybridEP's manager is the flex dispatcher's; memory.py)
        if rcf is not None and self.moe_flex_dispatcher_backend not in ("hybridep", "ncclep"):
            raise SpecError("moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend to be 'hybridep' "
                            "or 'ncclep'. (--moe-flex-dispatcher-backend hybridep, with --moe-token-dispatcher-type "
                            "flex for it to act)")
        if rcf is not None and not (self.use_transformer_engine_op_fuser or self.moe_use_grouped_tensor):
            raise SpecError("moe_expert_rank_capacity_factor with the 'hybridep' backend requires "
                            "use_transformer_engine_op_fuser=True or moe_use_grouped_tensor=True "
                            "(--use-transformer-engine-op-fuser or --moe-use-grouped-tensor)")
        for name in ("moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu"):
            f = getattr(self, name)
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not abs(f) <= MAX_CAPACITY_FACTOR \
                    or (f == 0 and name.endswith("cuda")):
                allowed = "a nonzero number" if name.endswith("cuda") else "a number"
                raise SpecError(f"{name} must be {allowed} from -{MAX_CAPACITY_FACTOR:g} to {MAX_CAPACITY_FACTOR:g} "
                                f"(sign: sizing from the expected or the largest token count), got {brief(f)}")
        if self.moe_paged_stash and rcf is None:
            raise SpecError("moe_paged_stash requires moe_expert_rank_capacity_factor to be set "
                            "(--moe-expert-rank-capacity-factor); there is no need to use paged stashing without it")
        if self.moe_paged_stash and self.cpu_offloading_num_layers > 0:
            raise SpecError("moe_paged_stash cannot be enabled with cpu_offloading")
        if self.moe_paged_stash and {"expert_fc1", "moe_act", "fused_group_mlp"} & set(self.offloaded_modules):
            raise SpecError("When moe_paged_stash is enabled, offload_modules must not include expert_fc1, moe_act, "
                            "or fused_group_mlp (paged stash covers those activations)")

    def _check_cuda_graphs(self) -> None:
        """TransformerConfig.__post_init__'s rules on the CUDA graph knobs (megatron/core/transformer/
        transformer_config.py); the model-dependent ones (moe needs MoE layers, full recompute needs
        full_iteration) are ``cuda_graph_problems``'."""
        mods = self.cuda_graph_modules
        if not isinstance(mods, tuple) or any(m not in CUDA_GRAPH_MODULES for m in mods):
            raise SpecError(f"cuda_graph_modules must be a list of {', '.join(CUDA_GRAPH_MODULES)} (none: the whole "
                            f"layer), got {brief(mods)}")
        if self.cuda_graph_impl == "full_iteration" and mods:
            raise SpecError('cuda_graph_modules must be empty when cuda_graph_impl="full_iteration"')
        if "moe" in mods and "moe_router" in mods:
            raise SpecError("cuda_graph_modules must not contain both moe and moe_router")
        if self.cuda_graph_impl == "transformer_engine" and "moe_preprocess" in mods and "moe_router" not in mods:
            raise SpecError("moe_preprocess cuda graph is only supported with moe_router cuda graph")

    @property
    def tokens_per_step(self) -> int:
        """Tokens per global batch."""
        return self.seq_len * self.global_batch_size


def training_dict(training: TrainingSpec) -> dict[str, Any]:
    """A training spec as plain data, the memory knobs only where they differ from Megatron's defaults (so that
    ids made from it, e.g. ``launch.render.candidate_id``, stay the same for specs without knobs)."""
    out = asdict(training)
    for f in fields(TrainingSpec):
        if f.name in _KNOB_FIELDS and out[f.name] == f.default:
            del out[f.name]
    return out


_KNOB_FIELDS: Final = frozenset(KNOB_FLAGS) | {"store_param_remainders", "fp8_dot_product_attention", "peft",
                                               "attention_kernel", "nvfp4_quantize_kernel"}


def cuda_graph_scope(impl: str, scope: list[str] | tuple[str, ...], where: str) -> tuple[str, tuple[str, ...]]:
    """(``cuda_graph_impl``, ``cuda_graph_modules``) for an impl and a scope list that may hold the deprecated
    scopes, as Megatron-Core migrates them (transformer/cuda_graph_config.py ``normalize_cuda_graph_modules``,
    ``validate_deprecated_cuda_graph_modules_migration_inputs``; arguments.py ``_normalize_cuda_graph_modules_args``):
    ``full`` only alone, the whole layer (no modules); ``full_iteration`` only alone and with impl none, local or
    full_iteration, which it turns into ``full_iteration``; other names are ``CUDA_GRAPH_MODULES`` (kept once, in
    order); impl none captures nothing (no modules). Read by the ``--cuda-graph-modules`` reader
    (specs/megatron_flags.py) and the recipe library's ``cuda_graph_scope`` column (recipes/knobs.py); ``where``
    names the flag or column in the one-line SpecError."""
    words = list(scope)
    for w in words:
        if w not in (*CUDA_GRAPH_MODULES, "full", "full_iteration"):
            raise SpecError(f"{where} must be among {', '.join(CUDA_GRAPH_MODULES)}, full or full_iteration, "
                            f"got {brief(w)}")
    if "full" in words and words != ["full"]:
        raise SpecError(f"{where}: full scope cannot be used with other scopes.")
    if "full_iteration" in words:
        if len(set(words)) > 1 or impl not in ("none", "local", "full_iteration"):
            raise SpecError(f"{where} full_iteration cannot be combined with other modules or with "
                            f"--cuda-graph-impl {impl}")
        return "full_iteration", ()
    if impl == "none":
        return impl, ()
    return impl, tuple(dict.fromkeys(w for w in words if w != "full"))
