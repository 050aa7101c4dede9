"""The one mapping from (ModelSpec, ParallelLayout, TrainingSpec) to ``pretrain_gpt.py`` arguments.

Flag names and their meaning follow Megatron-LM main at ``MEGATRON_COMMIT`` (the generated flag
dump ../shared/reference/megatron_lm_flags_main_d98e8a6.tsv, copied to ``specs/megatron_flags.txt``;
ecosystem.md section 1). Every flag this module can emit is listed in ``EMITTED_FLAGS``; a test
checks that each one exists in Megatron's parser. Values that only the user can know (data path,
tokenizer, learning rate, checkpoint directory) are ``Placeholder`` objects that read an
environment variable, so the generated files can be run as they are once those are set.

``as_launched`` states what the arguments encode (Megatron's own normalisations: sequence
parallel is off at TP = 1, MoE/MLA fields are not emitted for dense/MHA models, the position
table is at least the sequence length); ``paraplan.launch.parse`` reads the arguments back to
exactly that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from paraplan.errors import LayoutError, SpecError
from paraplan.estimate.pipeline import pipeline_layout_string
from paraplan.layout import ParallelLayout
from paraplan.rules import (  # the knob rules live with Megatron's other rules (plan filters by them)
    BLACKWELL_ARCHS as BLACKWELL_ARCHS,
)
from paraplan.rules import (
    NO_NAN_CHECK_FLAG,
    knob_violations,
)
from paraplan.schedules import NOT_IN_MEGATRON, schedule_named
from paraplan.specs.model import RECIPE_FLAGS, ModelSpec, recipe_defaults
from paraplan.specs.training import KNOB_FLAGS, TE_CROSS_ENTROPY_MESSAGE, TrainingSpec

if TYPE_CHECKING:  # the launch spec is only named here: render imports this module
    from paraplan.launch.render import LaunchSpec

MEGATRON_COMMIT: Final = "d98e8a6"
"""Megatron-LM main commit the flag names were checked against (2026-08-22, core 0.20.0 dev)."""

EMITTED_FLAGS: Final[tuple[str, ...]] = (
    # parallelism
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--no-gradient-accumulation-fusion", "--overlap-grad-reduce",
    "--overlap-param-gather", "--tp-comm-overlap", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
    # recompute
    "--recompute-granularity", "--recompute-modules", "--recompute-method", "--recompute-num-layers",
    # model
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels", "--swiglu",
    "--position-embedding-type", "--rope-type", "--no-rope-fusion", "--normalization",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--hidden-dropout",
    "--attention-dropout", "--vocab-size", "--make-vocab-size-divisible-by",
    "--attention-backend", "--quick-geglu", "--window-size", "--window-attn-skip-freq", "--softmax-type",
    # MoE, MLA, MTP
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--moe-shared-expert-gate", "--moe-layer-freq",
    "--moe-grouped-gemm", "--moe-token-dispatcher-type", "--moe-router-pre-softmax",
    "--multi-latent-attention",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    "--mtp-num-layers",
    # recipe
    *(flag for _, flag, _ in RECIPE_FLAGS),
    # batch, precision
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
    "--bf16", "--fp16", "--fp8-format", "--fp8-recipe",
    # data, tokenizer, optimizer, checkpoints, logging
    "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--train-iters", "--lr",
    "--min-lr", "--lr-decay-style", "--lr-warmup-iters", "--weight-decay", "--adam-beta1",
    "--adam-beta2", "--clip-grad", "--init-method-std", "--save", "--load", "--save-interval",
    "--ckpt-format", "--async-save", "--use-persistent-ckpt-worker",
    "--log-interval", "--log-throughput", "--eval-interval", "--eval-iters",
    "--no-check-for-nan-in-loss-and-grad",
)
"""Every flag ``megatron_args`` can emit (checked against ``MEGATRON_COMMIT``)."""

FSDP_REQUIRED_FLAGS: Final[tuple[tuple[str, str | None, str], ...]] = (
    ("--use-megatron-fsdp", None, "Megatron-FSDP guide (docs/user-guide/features/megatron_fsdp.md)"),
    ("--data-parallel-sharding-strategy", None, "Megatron-FSDP guide: 'use the following arguments'"),
    ("--ckpt-format", "fsdp_dtensor", "Megatron-FSDP guide; validate_args: 'Megatron-FSDP requires the "
     "`fsdp_dtensor` checkpointing format.'"),
)
"""(flag, required value or None, source): the flags the Megatron-FSDP guide lists to enable it in Megatron-LM;
``check`` reports a missing one (code FSDP_REQUIRED_FLAG). Launch files also carry --use-distributed-optimizer
(the guide: "Automatically set when using Megatron-FSDP", so not required). Gradient-accumulation fusion stays on
unless the plan turns it off (``--knob no-gradient-accumulation-fusion``), as for any layout: Megatron-LM only warns
about it with Megatron-FSDP (arguments.py ``validate_args``: "Verify that fused gradient accumulation is supported
by TransformerEngine for Megatron-FSDP"), the guide says fusion is "Used by default", and NVIDIA's DeepSeek-V3 and
Llama-3.1-405B FSDP recipes keep it. ``CUDA_DEVICE_MAX_CONNECTIONS`` unset is the environment side (env.sh)."""

CKPT_FORMATS: Final = ("torch_dist", "fsdp_dtensor")
"""``--ckpt-format`` values paraplan writes (Megatron's distributed checkpoint formats)."""


@dataclass(frozen=True, slots=True)
class CheckpointArgs:
    """The checkpoint flags ``launch`` writes for a layout (``paraplan.checkpoint.advise``): an integer
    ``--save-interval``, an enum ``--ckpt-format``, ``--async-save`` or not, and the reason (a comment)."""

    save_interval_iters: int
    ckpt_format: str
    async_save: bool
    reason: str

    def __post_init__(self) -> None:
        if isinstance(self.save_interval_iters, bool) or not isinstance(self.save_interval_iters, int) \
                or self.save_interval_iters < 1:
            raise LayoutError(f"--save-interval: expected a positive integer, got {self.save_interval_iters!r}",
                              reason="BAD_SAVE_INTERVAL")
        if self.ckpt_format not in CKPT_FORMATS:
            raise LayoutError(f"--ckpt-format: expected one of {', '.join(CKPT_FORMATS)}, got "
                              f"{self.ckpt_format!r}", reason="BAD_CKPT_FORMAT")
        if any(c in self.reason for c in "\n\r"):
            raise LayoutError("checkpoint reason: expected a single line", reason="BAD_CKPT_REASON")


TRAIN_ITERS_DEFAULT: Final = 1000
"""Default of the ``TRAIN_ITERS`` placeholder (``--train-iters``; ``train.train_iters`` for Bridge)."""


def save_interval_default(ckpt: CheckpointArgs | None) -> int:
    """The ``--save-interval`` default: the recommendation, capped at the ``TRAIN_ITERS`` default (a run of
    TRAIN_ITERS_DEFAULT iterations would otherwise never reach it); 1000 without a recommendation."""
    return TRAIN_ITERS_DEFAULT if ckpt is None else min(ckpt.save_interval_iters, TRAIN_ITERS_DEFAULT)


def save_interval_note(ckpt: CheckpointArgs) -> str:
    """What the comment says about the cap (empty when the recommendation is below it)."""
    if ckpt.save_interval_iters <= TRAIN_ITERS_DEFAULT:
        return ""
    return (f"; capped at the TRAIN_ITERS default {TRAIN_ITERS_DEFAULT}: with a longer run set "
            f"SAVE_INTERVAL={ckpt.save_interval_iters}")



@dataclass(frozen=True, slots=True)
class Placeholder:
    """A value the user supplies through an environment variable.

    ``default`` None means required: the shell form is ``${ENV:?set ENV: hint}`` and the script
    stops with that message when the variable is unset.
    """

    env: str
    hint: str
    default: str | None = None
    suffix: str = ""
    """Literal text after the expansion (``${LAUNCH_DIR:-.}/tp_comm_overlap_cfg.yaml``)."""

    def shell(self) -> str:
        """The bash expansion (to be used inside double quotes)."""
        if self.default is None:
            return f"${{{self.env}:?set {self.env}: {self.hint}}}{self.suffix}"
        return f"${{{self.env}:-{self.default}}}{self.suffix}"


Value = str | Placeholder


@dataclass(frozen=True, slots=True)
class Arg:
    """One flag and its values (none for store_true flags, several for nargs='+')."""

    flag: str
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, slots=True)
class ArgGroup:
    """Arguments under one comment heading."""

    title: str
    args: tuple[Arg, ...]


def _a(flag: str, *values: object) -> Arg:
    return Arg(flag, tuple(v if isinstance(v, Placeholder) else str(v) for v in values))


def moe_layer_freq_string(freq: int | tuple[int, ...]) -> str:
    """Megatron's ``--moe-layer-freq`` value: an int, or a run-length list such as "[0]*3+[1]*58"."""
    if isinstance(freq, int):
        return str(freq)
    runs: list[list[int]] = []
    for x in freq:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "+".join(f"[{x}]*{n}" if n > 1 else f"[{x}]" for x, n in runs)


def fp8_args(arch: str, recipe: str = "delayed") -> tuple[Arg, ...]:
    """FP8 through Transformer Engine: hybrid E4M3/E5M2 with the recipe the training spec names (Megatron's
    default, delayed scaling, runs on every FP8 GPU; MXFP8 needs Blackwell: ``launch_violations``). ``arch`` is
    kept for callers."""
    return (_a("--fp8-format", "hybrid"), _a("--fp8-recipe", recipe))


def fp4_args(recipe: str = "nvfp4") -> tuple[Arg, ...]:
    """NVFP4 through Transformer Engine (``--fp4-format e2m1``, the only choice; ``--fp4-recipe``)."""
    return (_a("--fp4-format", "e2m1"), _a("--fp4-recipe", recipe))


def fp8_delayed(training: TrainingSpec | None) -> bool:
    """FP8 with delayed scaling (Megatron-Core's rules on recompute modules and bf16 first/last layers)."""
    return training is not None and training.precision == "fp8" and training.fp8_recipe == "delayed"


_MEGATRON_DEFAULTS: Final = TrainingSpec(seq_len=1, global_batch_size=1)
"""Megatron-LM's default for every knob (the TrainingSpec field defaults; seq_len and GBS are placeholders)."""


def knobs_set(training: TrainingSpec) -> list[tuple[str, str, Any]]:
    """(field, Megatron flag, value) of each ``KNOB_FLAGS`` knob of ``training`` away from Megatron-LM's default,
    in ``KNOB_FLAGS`` order."""
    return [(key, flag, value) for key, flag in KNOB_FLAGS.items()
            if (value := getattr(training, key)) != getattr(_MEGATRON_DEFAULTS, key)]


def moe_knobs_set(training: TrainingSpec) -> list[str]:
    """The MoE knobs (``--moe-*`` flags) away from Megatron-LM's defaults."""
    return [flag for key, flag, _ in knobs_set(training) if key.startswith("moe_")]


def dense_moe_knobs_note(model: ModelSpec, training: TrainingSpec) -> str | None:
    """The note for MoE knobs given for a dense model (no MoE layer reads them; launch does not write them)."""
    if model.is_moe or not (given := moe_knobs_set(training)):
        return None
    return f"{model.name} has no MoE layers: {', '.join(given)} ignored (not written into launch files)"


def memory_knob_args(training: TrainingSpec, model: ModelSpec | None = None) -> list[Arg]:
    """The knobs of the training spec that differ from Megatron-LM's defaults, as Megatron flags
    (``KNOB_FLAGS``; ``--fp8-recipe`` is written by ``fp8_args``, ``--moe-token-dispatcher-type`` by ``_moe_mla``;
    the flex backend and its SMs only with the flex dispatcher; no MoE knob for a dense ``model``, as ``_moe_mla``
    writes no dispatcher for it)."""
    args: list[Arg] = []
    for key, flag, value in knobs_set(training):
        if key in ("fp8_recipe", "fp4_recipe", "moe_token_dispatcher_type", "tp_comm_overlap_cfg") \
                or value is None or (model is not None and not model.is_moe and key.startswith("moe_")):
            continue  # fp8_recipe / fp4_recipe: fp8_args / fp4_args; the dispatcher: _moe_mla; ub_cfg_args
        if key in ("moe_flex_dispatcher_backend", "moe_hybridep_num_sms", "moe_permute_fusion_into_hybridep") \
                and training.moe_token_dispatcher_type != "flex":
            continue
        if key == "moe_permute_fusion_into_hybridep" and training.moe_flex_dispatcher_backend != "hybridep":
            continue
        if key == "optimizer_offload_fraction" and not training.optimizer_cpu_offload:
            continue
        if key.startswith("num_layers_at_") and not training.first_last_layers_bf16:
            continue
        if key == "manual_gc_interval" and not training.manual_gc:
            continue
        if key == "wgrad_deferral_limit" and not training.defer_embedding_wgrad_compute:
            continue
        if key == "cross_entropy_fusion_impl" and not training.cross_entropy_loss_fusion:
            continue
        if key == "cuda_graph_modules":  # validated names (CUDA_GRAPH_MODULES), one word each
            if training.cuda_graph_impl not in ("none", "full_iteration"):
                args.append(_a(flag, *value))
            continue
        if isinstance(value, tuple):
            args.append(_a(flag, *value))
        else:
            args.append(_a(flag) if isinstance(value, bool) else _a(flag, value))
        if key == "cuda_graph_impl" and value == "full_iteration":
            args.append(_a(NO_NAN_CHECK_FLAG))  # arguments.py validate_args: FULL_ITERATION_NAN_CHECK_MESSAGE
    return args


UB_CFG_FILE: Final = "tp_comm_overlap_cfg.yaml"
"""The userbuffers config file (``TrainingSpec.tp_comm_overlap_cfg`` as the YAML TE's ``initialize_ub`` reads,
``userbuffers.yaml_text``) the Megatron-LM targets write beside megatron_args.sh."""
UB_CFG_PATH: Final = Placeholder("LAUNCH_DIR", "the directory of the launch files", ".", "/" + UB_CFG_FILE)
"""``--tp-comm-overlap-cfg``'s value: the file in ``$LAUNCH_DIR`` (torchrun.sh and job.sbatch set it before
sourcing megatron_args.sh; "." otherwise)."""


def ub_cfg_args(training: TrainingSpec, lay: ParallelLayout | None = None) -> list[Arg]:
    """``--tp-comm-overlap-cfg`` pointing at ``UB_CFG_FILE`` where ``training`` names a userbuffers config (and the
    layout ``lay``, when given, has ``--tp-comm-overlap``: Megatron-LM reads the file only then)."""
    if not training.tp_comm_overlap_cfg or (lay is not None and not lay.tp_comm_overlap):
        return []
    return [_a(KNOB_FLAGS["tp_comm_overlap_cfg"], UB_CFG_PATH)]


def ub_cfg_ignored_note(training: TrainingSpec, lay: ParallelLayout) -> str | None:
    """The note for a userbuffers config given without ``--tp-comm-overlap`` (ignored, not written)."""
    if not training.tp_comm_overlap_cfg or lay.tp_comm_overlap:
        return None
    return "tp-comm-overlap-cfg is ignored without --tp-comm-overlap (not written into launch files)"


def ub_cfg_file(training: TrainingSpec, lay: ParallelLayout | None = None) -> str | None:
    """The text of ``UB_CFG_FILE`` for ``training``, None without a ``tp_comm_overlap_cfg`` (or without
    ``--tp-comm-overlap`` in ``lay``)."""
    from paraplan.launch.quoting import one_line
    from paraplan.specs.userbuffers import is_file_value, resolve, yaml_text

    cfg = resolve(training.tp_comm_overlap_cfg)
    if cfg is None or not ub_cfg_args(training, lay):
        return None
    value = training.tp_comm_overlap_cfg
    name = value if not value.startswith("{") else "read from a file"
    if is_file_value(value):
        name = f"from {value}"
    head = "".join(f"# {one_line(line)}\n" for line in (
        f"Userbuffers per-GEMM config for --tp-comm-overlap-cfg, generated by paraplan ({name}).",
        "Read by Megatron-LM's _initialize_tp_communicators (yaml.safe_load) and handed to Transformer Engine's",
        "initialize_ub as ub_cfgs."))
    return head + yaml_text(cfg)


MAX_CONNECTIONS_MESSAGE: Final = ("Using tensor model parallelism or context parallelism require setting "
                                  "the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
FSDP_MAX_CONNECTIONS_MESSAGE: Final = "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."
MAX_CONNECTIONS: Final = "CUDA_DEVICE_MAX_CONNECTIONS"


def fsdp_rejects_max_connections(value: str | None) -> bool:
    """Megatron-FSDP's assert: CUDA_DEVICE_MAX_CONNECTIONS must be unset or an integer > 1."""
    if value is None:
        return False
    try:
        return int(value.strip()) <= 1
    except ValueError:
        return True


def needs_max_connections_1(layout: ParallelLayout, arch: str) -> bool:
    """Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP>1 or CP>1 before Blackwell, not FSDP."""
    return (layout.tp > 1 or layout.cp > 1) and arch not in BLACKWELL_ARCHS and not layout.fsdp


def environment(spec: LaunchSpec) -> list[tuple[str, str, str]]:
    """(name, value, comment) to export: the site's env, then what Megatron requires.

    A site value of CUDA_DEVICE_MAX_CONNECTIONS that Megatron would reject for this layout is an
    error (SpecError), not silently replaced: TP/CP before Blackwell assert it is 1, Megatron-FSDP
    asserts it is > 1 or unset (ecosystem.md 1.4).
    """
    required: list[tuple[str, str, str]] = []
    site_value = dict(spec.site.env).get(MAX_CONNECTIONS)
    if needs_max_connections_1(spec.layout, spec.cluster.gpu.arch):
        if site_value is not None and site_value != "1":
            raise SpecError(f"site.env.{MAX_CONNECTIONS}: {site_value!r} conflicts with this layout "
                            f"({spec.layout.short()}): Megatron asserts {MAX_CONNECTIONS_MESSAGE!r}; "
                            "remove it from the site profile or set it to 1")
        required.append((MAX_CONNECTIONS, "1", f"Megatron: {MAX_CONNECTIONS_MESSAGE!r}"))
    elif spec.layout.fsdp and fsdp_rejects_max_connections(site_value):
        raise SpecError(f"site.env.{MAX_CONNECTIONS}: {site_value!r} conflicts with Megatron-FSDP: Megatron "
                        f"asserts {FSDP_MAX_CONNECTIONS_MESSAGE!r}; remove it from the site profile")
    if spec.training.fine_grained_activation_offloading:
        required.append((CPU_OFFLOAD_V1, "1", f"Megatron: {CPU_OFFLOAD_V1_MESSAGE!r}"))
    names = {name for name, _, _ in required}
    site = [(k, v, "from the site profile") for k, v in spec.site.env if k not in names]
    if spec.site.checkpoint_dir is not None and "CHECKPOINT_DIR" not in dict(spec.site.env):
        site.append(("CHECKPOINT_DIR", spec.site.checkpoint_dir, "from the site profile (checkpoint_dir)"))
    return site + required


CPU_OFFLOAD_V1: Final = "NVTE_CPU_OFFLOAD_V1"
CPU_OFFLOAD_V1_MESSAGE: Final = ("For fine-grained activation offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 should "
                                 "be set to 1 to avoid offloading weights.")
"""arguments.py ``validate_args``' assert for ``--fine-grained-activation-offloading``."""


def forced_env_names(spec: LaunchSpec) -> frozenset[str]:
    """The variables of ``environment`` that paraplan must force (what Megatron requires for the layout); the
    others are site defaults that a value already in the user's environment overrides."""
    site = {name for name, _ in spec.site.env} | ({"CHECKPOINT_DIR"} if spec.site.checkpoint_dir else set())
    return frozenset(name for name, _, _ in environment(spec)
                     if name not in site or name in (MAX_CONNECTIONS, CPU_OFFLOAD_V1))


def launch_violations(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec | None = None,
                      arch: str = "hopper") -> list[tuple[str, str]]:
    """Megatron rules on the flags themselves (beyond ``paraplan.rules``), with Megatron's words."""
    out: list[tuple[str, str]] = []
    sched = schedule_named(layout.schedule)
    if not sched.megatron:
        out.append(("SCHEDULE_NOT_IN_MEGATRON", f"--schedule {layout.schedule}: {sched.title} is a what-if, "
                    f"{NOT_IN_MEGATRON}; launch writes 1f1b, interleaved or combined_1f1b"))
    if model.is_moe and model.add_bias_linear and layout.etp != 1:
        out.append(("MOE_BIAS_NEEDS_ETP1", "Bias in Moe is only supported when ETP==1"))
    if fp8_delayed(training) and layout.recompute == "selective" and \
            {"moe_act", "layernorm"} & set(layout.recompute_modules):
        out.append(("FP8_DELAYED_RECOMPUTE", "Delayed scaling does not support moe_act and layernorm "
                    "recompute for fp8."))
    if model.mtp_num_layers and model.position_embedding_type not in ("rope", "none") \
            and not (model.multi_latent_attention and model.position_embedding_type == "yarn"):
        out.append(("MTP_POSITION_EMBEDDING", "Multi-Token Prediction (MTP) is not supported with "
                    f"{model.position_embedding_type} position embedding type.The supported position embedding "
                    "types are rope and none."))
    if training is not None and training.fp8_param_gather and not layout.dist_opt and not layout.fsdp:
        out.append(("FP8_PARAM_GATHER_NEEDS_DIST_OPT", "--fp8-param-gather only supported with distributed "
                    "optimizer, torch fsdp2, megatron fsdp, or inference mode"))
    if training is not None and training.optimizer_cpu_offload and training.fp8_param_gather \
            and training.fp8_recipe != "delayed":
        out.append(("OPTIMIZER_CPU_OFFLOAD_FP8_RECIPE", "When `--fp8-param-gather` is enabled, the optimizer cpu "
                    "offload must be used in conjunction with `--fp8-recipe delayed`."))
    if training is not None:
        out += knob_violations(model, layout, training, arch)
    if layout.overlap_param_gather and not layout.dist_opt:
        out.append(("OVERLAP_PARAM_GATHER_NEEDS_DIST_OPT", "--overlap-param-gather only supported "
                    "with distributed optimizer, megatron fsdp, or dist_muon"))
    if layout.overlap_param_gather and not layout.overlap_grad_reduce:
        out.append(("OVERLAP_PARAM_GATHER_NEEDS_GRAD_REDUCE",
                    "Must use --overlap-param-gather with --overlap-grad-reduce"))
    if layout.tp_comm_overlap and not layout.sp:
        out.append(("TP_COMM_OVERLAP_NEEDS_SP", "Tensor parallel communication/GEMM overlap can "
                    "happen only when sequence parallelism is enabled"))
    per_rank = model.num_layers // layout.pp
    if layout.recompute == "full" and not 1 <= layout.recompute_num_layers <= per_rank:
        out.append(("RECOMPUTE_NUM_LAYERS", "When using recompute_granularity: full "
                    f"recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: "
                    f"{per_rank}"))
    return out


def te_cross_entropy(training: TrainingSpec) -> bool:
    """Transformer Engine's cross-entropy fusion is on (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl
    te``): Megatron-LM's validate_args refuses it (``TE_CROSS_ENTROPY_MESSAGE``), Megatron-Core and -Bridge run it."""
    return training.cross_entropy_loss_fusion and training.cross_entropy_fusion_impl == "te"


def layout_dict(layout: ParallelLayout) -> dict[str, Any]:
    """A layout as plain data; ``schedule`` only when one was chosen and ``recompute_method`` only when block (ids of
    earlier layouts stay the same)."""
    d = asdict(layout)
    if not d.get("schedule"):
        d.pop("schedule", None)
    if d.get("recompute_method") == "uniform":
        d.pop("recompute_method", None)
    return d


def as_launched(
    model: ModelSpec, layout: ParallelLayout, training: TrainingSpec
) -> tuple[ModelSpec, ParallelLayout]:
    """The model and layout exactly as the emitted arguments describe them to Megatron."""
    mpe = max(model.max_position_embeddings or training.seq_len, training.seq_len)
    m = replace(model, max_position_embeddings=mpe)
    if m.multi_latent_attention:
        m = replace(m, num_query_groups=None)
    else:
        m = replace(m, q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64,
                    v_head_dim=128)
    defaults = recipe_defaults()
    if not m.is_moe:
        m = replace(m, num_experts=None, moe_router_topk=2, moe_ffn_hidden_size=None,
                    moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False,
                    moe_layer_freq=1, **{f: defaults[f] for f, _, moe_only in RECIPE_FLAGS if moe_only})
    elif m.moe_router_topk == 1:  # TC: 'Please use --moe-router-pre-softmax when topk is 1.'
        m = replace(m, moe_router_pre_softmax=True)
    if not m.use_rope_scaling:
        m = replace(m, rope_scaling_factor=defaults["rope_scaling_factor"])
    lay = replace(layout, sequence_parallel=layout.sp, etp=layout.etp if model.is_moe else layout.tp,
                  distributed_optimizer=layout.distributed_optimizer or layout.fsdp)
    if lay.pipeline_layout:
        lay = replace(lay, first_stage_layers=0, last_stage_layers=0, account_for_embedding=False,
                      account_for_loss=False)
    if lay.recompute != "selective":
        lay = replace(lay, recompute_modules=("core_attn",))
    if lay.recompute != "full":
        lay = replace(lay, recompute_num_layers=1, recompute_method="uniform")
    return m, lay


def _pipeline_split(model: ModelSpec, lay: ParallelLayout) -> list[Arg]:
    """Interleaving and uneven stages: a layout string, or VP with first/last and account-for flags."""
    args: list[Arg] = []
    uneven = bool(lay.first_stage_layers or lay.last_stage_layers)
    if lay.pipeline_layout:  # cannot be combined with the VP, first/last or account-for flags
        args.append(_a("--pipeline-model-parallel-layout",
                       pipeline_layout_string(lay.pipeline_layout, lay.pp, mtp_layers=model.mtp_num_layers)))
    elif lay.vp > 1 and uneven:
        args.append(_a("--num-virtual-stages-per-pipeline-rank", lay.vp))
    elif lay.vp > 1:
        total = model.num_layers + int(lay.account_for_embedding) + int(lay.account_for_loss)
        args.append(_a("--num-layers-per-virtual-pipeline-stage", total // lay.pp // lay.vp))
    if lay.first_stage_layers:
        args.append(_a("--decoder-first-pipeline-num-layers", lay.first_stage_layers))
    if lay.last_stage_layers:
        args.append(_a("--decoder-last-pipeline-num-layers", lay.last_stage_layers))
    if lay.account_for_embedding:
        args.append(_a("--account-for-embedding-in-pipeline-split"))
    if lay.account_for_loss:
        args.append(_a("--account-for-loss-in-pipeline-split"))
    return args


def _parallel(model: ModelSpec, lay: ParallelLayout) -> ArgGroup:
    args = [_a("--tensor-model-parallel-size", lay.tp), _a("--pipeline-model-parallel-size", lay.pp),
            _a("--context-parallel-size", lay.cp)]
    if model.is_moe:
        args += [_a("--expert-model-parallel-size", lay.ep),
                 _a("--expert-tensor-parallel-size", lay.etp)]
    args += _pipeline_split(model, lay)
    if lay.sp:
        args.append(_a("--sequence-parallel"))
    if lay.distributed_optimizer:
        args.append(_a("--use-distributed-optimizer"))
    if lay.fsdp:  # FSDP_REQUIRED_FLAGS (--ckpt-format fsdp_dtensor: checkpoint group); fusion stays the knob's
        args += [_a("--use-megatron-fsdp"),
                 _a("--data-parallel-sharding-strategy", "optim_grads_params")]
    if lay.overlap_grad_reduce:
        args.append(_a("--overlap-grad-reduce"))
    if lay.overlap_param_gather:
        args.append(_a("--overlap-param-gather"))
    if lay.tp_comm_overlap:
        args.append(_a("--tp-comm-overlap"))
    args += [_a(flag) for flag in schedule_named(lay.schedule).launch_flags]
    return ArgGroup("parallelism", tuple(args))


def _recompute(lay: ParallelLayout) -> ArgGroup:
    args: tuple[Arg, ...]
    if lay.recompute == "selective":
        args = (_a("--recompute-granularity", "selective"),
                _a("--recompute-modules", *lay.recompute_modules))
    elif lay.recompute == "full":
        args = (_a("--recompute-granularity", "full"), _a("--recompute-method", lay.recompute_method),
                _a("--recompute-num-layers", lay.recompute_num_layers))
    else:
        args = ()
    return ArgGroup("activation recomputation", args)


def _model(m: ModelSpec, training: TrainingSpec) -> ArgGroup:
    args = [_a("--num-layers", m.num_layers), _a("--hidden-size", m.hidden_size)]
    if m.ffn_hidden_size is not None:
        args.append(_a("--ffn-hidden-size", m.ffn_hidden_size))
    args.append(_a("--num-attention-heads", m.num_attention_heads))
    if m.num_query_groups is not None and not m.multi_latent_attention:
        args += [_a("--group-query-attention"), _a("--num-query-groups", m.num_query_groups)]
    if m.kv_channels is not None:
        args.append(_a("--kv-channels", m.kv_channels))
    if m.swiglu:
        args.append(_a("--quick-geglu" if m.quick_geglu else "--swiglu"))
    if m.window_size is not None:
        args.append(_a("--window-size", f"{m.window_size[0]},{m.window_size[1]}"))
        if m.window_attn_skip_freq is not None:
            args.append(_a("--window-attn-skip-freq", moe_layer_freq_string(m.window_attn_skip_freq)))
    if m.softmax_type != "vanilla":
        args.append(_a("--softmax-type", m.softmax_type))
    args += _positions(m)
    args.append(_a("--normalization", m.normalization))
    for flag, on in (("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights),
                     ("--disable-bias-linear", not m.add_bias_linear),
                     ("--add-qkv-bias", m.add_qkv_bias), ("--qk-layernorm", m.qk_layernorm)):
        if on:
            args.append(_a(flag))
    args += [_a("--hidden-dropout", repr(m.hidden_dropout)),
             _a("--attention-dropout", repr(m.attention_dropout)),
             _a("--vocab-size", m.vocab_size),
             _a("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by)]
    if training.attention_backend == "unfused":
        args.append(_a("--attention-backend", "unfused"))
    return ArgGroup("model", tuple(args))


def _positions(m: ModelSpec) -> list[Arg]:
    """``--position-embedding-type``; for MLA, RoPE with MLA's own ``--rope-type`` (yarn or rope).

    Megatron's DeepSeek-V3 scripts write ``--position-embedding-type rope`` and let MLA apply YaRN
    (``--rope-type``, MLA's default yarn, with ``--rotary-scaling-factor``/``--mscale``): validate_args
    rejects MTP with ``--position-embedding-type yarn``. ``--rope-type`` is always written for MLA, since
    MLA without it would apply YaRN to a model that asked for plain RoPE; MLA with plain RoPE turns the fused RoPE
    kernel off (TransformerConfig: 'apply_rope_fusion for MLA only works with YARN RoPE.').
    """
    if m.multi_latent_attention and m.position_embedding_type == "yarn":
        return [_a("--position-embedding-type", "rope"), _a("--rope-type", "yarn")]
    if m.multi_latent_attention and m.position_embedding_type == "rope":  # TC: 'apply_rope_fusion for MLA only
        return [_a("--position-embedding-type", "rope"), _a("--rope-type", "rope"),  # works with YARN RoPE.'
                _a("--no-rope-fusion")]
    return [_a("--position-embedding-type", m.position_embedding_type)]


def _recipe(m: ModelSpec) -> ArgGroup:
    """The recipe fields that differ from Megatron's defaults (``RECIPE_FLAGS``): RoPE base and
    scaling, norm epsilon, router options; bools as bare switches."""
    defaults = recipe_defaults()
    args: list[Arg] = []
    for fname, flag, moe_only in RECIPE_FLAGS:
        value = getattr(m, fname)
        if (moe_only and not m.is_moe) or value == defaults[fname]:
            continue
        if fname == "rope_scaling_factor" and not m.use_rope_scaling:
            continue
        args.append(_a(flag) if isinstance(value, bool) else _a(flag, value if isinstance(value, str | int)
                                                                 else repr(float(value))))
    return ArgGroup("recipe (RoPE, norm, router: what is trained, not its size)", tuple(args))


def _moe_mla(m: ModelSpec, arch: str, training: TrainingSpec | None = None) -> ArgGroup:
    args: list[Arg] = []
    if m.is_moe:
        args += [_a("--num-experts", m.num_experts), _a("--moe-router-topk", m.moe_router_topk)]
        if m.moe_ffn_hidden_size is not None:
            args.append(_a("--moe-ffn-hidden-size", m.moe_ffn_hidden_size))
        if m.moe_shared_expert_intermediate_size is not None:
            args.append(_a("--moe-shared-expert-intermediate-size",
                           m.moe_shared_expert_intermediate_size))
        if m.moe_shared_expert_gate:
            args.append(_a("--moe-shared-expert-gate"))
        args.append(_a("--moe-layer-freq", moe_layer_freq_string(m.moe_layer_freq)))
        if arch != "cdna3":  # grouped GEMM kernels need CUDA compute capability >= 8
            args.append(_a("--moe-grouped-gemm"))
        args.append(_a("--moe-token-dispatcher-type", training.moe_token_dispatcher_type if training else "alltoall"))
    if m.multi_latent_attention:
        args.append(_a("--multi-latent-attention"))
        if m.q_lora_rank is not None:
            args.append(_a("--q-lora-rank", m.q_lora_rank))
        args += [_a("--kv-lora-rank", m.kv_lora_rank), _a("--qk-head-dim", m.qk_head_dim),
                 _a("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim),
                 _a("--v-head-dim", m.v_head_dim)]
    if m.mtp_num_layers:
        args.append(_a("--mtp-num-layers", m.mtp_num_layers))
    return ArgGroup("mixture of experts, multi-latent attention, multi-token prediction", tuple(args))


def _batch_precision(m: ModelSpec, lay: ParallelLayout, training: TrainingSpec,
                     arch: str) -> ArgGroup:
    args = [_a("--micro-batch-size", lay.mbs), _a("--global-batch-size", training.global_batch_size),
            _a("--seq-length", training.seq_len),
            _a("--max-position-embeddings", m.max_position_embeddings),
            _a("--fp16" if training.precision == "fp16" else "--bf16")]
    if training.precision == "fp8":
        args += fp8_args(arch, training.fp8_recipe)
    elif training.precision == "fp4":
        args += fp4_args(training.fp4_recipe)
    args += memory_knob_args(training, m) + ub_cfg_args(training, lay)
    return ArgGroup("batch, sequence and precision", tuple(args))


def _placeholders(lay: ParallelLayout, ckpt: CheckpointArgs | None = None) -> tuple[ArgGroup, ...]:
    data = ArgGroup("data and tokenizer (PLACEHOLDERS: export DATA_PATH and TOKENIZER_MODEL; "
                    "or use --mock-data with --tokenizer-type NullTokenizer)", (
        _a("--data-path", Placeholder("DATA_PATH", "prefix of the preprocessed _text_document data")),
        _a("--split", "99,1,0"),
        _a("--tokenizer-type", Placeholder("TOKENIZER_TYPE", "", "HuggingFaceTokenizer")),
        _a("--tokenizer-model", Placeholder("TOKENIZER_MODEL", "tokenizer path or HF model name")),
    ))
    optim = ArgGroup("optimizer and schedule (PLACEHOLDER defaults, override through the env)", (
        _a("--train-iters", Placeholder("TRAIN_ITERS", "", str(TRAIN_ITERS_DEFAULT))),
        _a("--lr", Placeholder("LR", "", "3.0e-4")),
        _a("--min-lr", Placeholder("MIN_LR", "", "3.0e-5")),
        _a("--lr-decay-style", "cosine"),
        _a("--lr-warmup-iters", Placeholder("LR_WARMUP_ITERS", "", "100")),
        _a("--weight-decay", "0.1"), _a("--adam-beta1", "0.9"), _a("--adam-beta2", "0.95"),
        _a("--clip-grad", "1.0"), _a("--init-method-std", "0.02"),
    ))
    interval = str(save_interval_default(ckpt))
    args = [_a("--save", Placeholder("CHECKPOINT_DIR", "", "checkpoints")),
            _a("--load", Placeholder("CHECKPOINT_DIR", "", "checkpoints")),
            _a("--save-interval", Placeholder("SAVE_INTERVAL", "", interval))]
    if ckpt is not None and lay.fsdp and ckpt.ckpt_format != "fsdp_dtensor":
        raise LayoutError("Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.",
                          reason="FSDP_NEEDS_FSDP_DTENSOR")
    if ckpt is not None:
        args.append(_a("--ckpt-format", ckpt.ckpt_format))
    elif lay.fsdp:  # Megatron-FSDP asserts ckpt_format == "fsdp_dtensor"
        args.append(_a("--ckpt-format", "fsdp_dtensor"))
    if ckpt is not None and ckpt.async_save:  # Megatron disables --async-save without the persistent worker
        args += [_a("--async-save"), _a("--use-persistent-ckpt-worker")]
    args += [_a("--log-interval", "1"), _a("--log-throughput"), _a("--eval-interval", "1000"),
             _a("--eval-iters", "10")]
    title = "checkpoints and logging (PLACEHOLDER defaults)" if ckpt is None else \
        f"checkpoints and logging (--save-interval {ckpt.save_interval_iters}: {ckpt.reason}" \
        f"{save_interval_note(ckpt)})"
    return data, optim, ArgGroup(title, tuple(args))


def megatron_args(
    model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, *, arch: str = "hopper",
    checkpoint: CheckpointArgs | None = None, megatron_lm: bool = True,
) -> tuple[ArgGroup, ...]:
    """The ordered, grouped ``pretrain_gpt.py`` arguments for one run.

    ``megatron_lm`` (a Megatron-LM launch file is written from them) refuses Transformer Engine's cross-entropy
    fusion, as Megatron-LM's validate_args asserts; Megatron-Core only warns (ModelParallelConfig.__post_init__) and
    Megatron-Bridge's recipes run it, so estimate, plan and ``launch --target bridge`` take it. It also leaves
    ``--overlap-param-gather-with-optimizer-step`` out, with ``OPT_STEP_LEFT_OUT`` over the checkpoint flags
    (validate_args refuses it with the distributed checkpoint formats written; Bridge has no such rule).

    ``checkpoint`` (``launch``'s recommendation) sets ``--save-interval``'s default, ``--ckpt-format`` and
    ``--async-save``, with the reason in the group's comment; without it the interval is a 1000 placeholder.

    Raises LayoutError (Megatron's message) when a flag combination would fail Megatron's
    ``validate_args``; the layout rules themselves are ``paraplan.rules`` (run by ``estimate``).
    """
    broken = launch_violations(model, layout, training, arch)
    if broken:
        code, message = broken[0]
        raise LayoutError(message, reason=code)
    if megatron_lm and te_cross_entropy(training):  # A: validate_args
        raise LayoutError(f"{TE_CROSS_ENTROPY_MESSAGE} (Megatron-LM's validate_args; `launch --target bridge` "
                          "writes it for Megatron-Bridge)", reason="TE_CROSS_ENTROPY_FUSION")
    left_out = megatron_lm and training.overlap_param_gather_with_optimizer_step
    if left_out:  # validate_args asserts it off with the distributed checkpoint formats these files write
        training = replace(training, overlap_param_gather_with_optimizer_step=False)
    m, lay = as_launched(model, layout, training)
    groups = (_parallel(m, lay), _recompute(lay), _model(m, training), _moe_mla(m, arch, training), _recipe(m),
              _batch_precision(m, lay, training, arch), *_placeholders(lay, checkpoint))
    if left_out:
        *rest, ckpt_group = groups
        groups = (*rest, ArgGroup(f"{ckpt_group.title}; {OPT_STEP_LEFT_OUT}", ckpt_group.args))
    return tuple(g for g in groups if g.args)


OPT_STEP_LEFT_OUT: Final = (
    "--overlap-param-gather-with-optimizer-step left out: Megatron-LM's validate_args asserts "
    "'--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing yet' and these files "
    "write --ckpt-format torch_dist (or fsdp_dtensor); the first chunk's parameter gather is not hidden behind the "
    "optimizer step (the Megatron-Bridge files keep it)")
"""Why the Megatron-LM launch files of a training with ``overlap_param_gather_with_optimizer_step`` leave the flag
out (arguments.py ``validate_args``: ``assert not args.use_dist_ckpt``, ``use_dist_ckpt = ckpt_format != "torch"``),
as the comment over the checkpoint flags and ``launch``'s note."""


def argv(groups: tuple[ArgGroup, ...], *, resolve: bool = False) -> list[str]:
    """Flat argument list; placeholders as their shell form, or their default if ``resolve``."""
    out: list[str] = []
    for group in groups:
        for arg in group.args:
            out.append(arg.flag)
            for v in arg.values:
                if isinstance(v, Placeholder):
                    out.append(v.default + v.suffix if resolve and v.default is not None else v.shell())
                else:
                    out.append(v)
    return out


def flag_pairs(groups: tuple[ArgGroup, ...]) -> list[tuple[str, str | None]]:
    """(flag, value or None) pairs; several values are joined by a space."""
    pairs: list[tuple[str, str | None]] = []
    for group in groups:
        for arg in group.args:
            vals = [v.shell() if isinstance(v, Placeholder) else v for v in arg.values]
            pairs.append((arg.flag, " ".join(vals) if vals else None))
    return pairs
