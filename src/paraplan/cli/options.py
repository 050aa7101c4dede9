"""Shared typer options and the translation of CLI flags into specs and a layout."""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import typer

from paraplan.api import (
    RECOMPUTE_MODULES,
    ClusterSpec,
    GpuSpec,
    MemoryOptions,
    ModelSpec,
    ParallelLayout,
    TrainingSpec,
    layout_for_world,
    load_gpu,
    load_model,
    make_cluster,
    override_gpu,
)
from paraplan.errors import SpecError
from paraplan.units import GIB


class OutputFormat(StrEnum):
    """Output formats."""

    table = "table"
    json = "json"
    csv = "csv"


class RecomputeChoice(StrEnum):
    """Recompute granularity."""

    none = "none"
    selective = "selective"
    full = "full"


class AttentionChoice(StrEnum):
    """Attention kernels (Megatron ``--attention-backend``)."""

    flash = "flash"
    unfused = "unfused"


class PrecisionChoice(StrEnum):
    """GEMM precision."""

    bf16 = "bf16"
    fp8 = "fp8"
    fp16 = "fp16"
    fp4 = "fp4"


ForceOpt = typer.Option(False, "--force", help="Replace the output file if it exists.")
MODEL_HELP = "Preset name (paraplan models), a Hugging Face config.json, or a Megatron-args JSON/YAML."
GPU_HELP = "GPU preset (paraplan gpus) or a YAML file describing a custom GPU/cluster."


def positive(name: str, value: int | None) -> int | None:
    """Reject zero/negative integers with one line naming the flag."""
    if value is not None and value < 1:
        raise SpecError(f"--{name} must be a positive integer, got {value}")
    return value


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``--gpu-set key=value`` pairs (values parsed as YAML scalars; efficiency.x for nested)."""
    from dataclasses import fields

    from paraplan.api import EfficiencySpec, brief, clip, gpu_override_keys, load_yaml_text

    out: dict[str, Any] = {}
    keys, eff_keys = gpu_override_keys(), [f"efficiency.{f.name}" for f in fields(EfficiencySpec)]
    for item in items or []:
        if "=" not in item:
            raise SpecError(f"--gpu-set expects key=value, got {brief(item)}")
        key, raw = item.split("=", 1)
        if key.startswith("efficiency.") and key not in eff_keys:
            raise SpecError(f"--gpu-set {clip(key)}: unknown efficiency field (allowed: "
                            f"{', '.join(k.split('.', 1)[1] for k in eff_keys)})")
        if key not in keys and key not in eff_keys and not key.startswith("topology."):
            raise SpecError(f"--gpu-set {clip(key)}: unknown key (allowed: {', '.join(keys)}, "
                            "efficiency.<field> for a model efficiency, or topology.<tier>.<field> for a network tier)")
        value = load_yaml_text(raw, f"--gpu-set {key}")
        if isinstance(value, dict | list):
            raise SpecError(f"--gpu-set {key}: expected a single value, got {brief(value)}")
        if key.startswith("efficiency."):
            out.setdefault("efficiency", {})[key.split(".", 1)[1]] = value
        else:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class Inputs:
    """The resolved specs of one command."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec


def resolve_inputs(
    *, model: str, gpu: str, num_gpus: int, gpus_per_node: int | None, seq_len: int, gbs: int,
    precision: str, gpu_set: list[str] | None = None, profile: str | None = None,
    attention_backend: str = "flash", knobs: list[str] | None = None,
) -> Inputs:
    """Load model and GPU, apply overrides and a calibrated profile, build the specs (``knobs``: ``--knob``)."""
    positive("num-gpus", num_gpus)
    positive("gpus-per-node", gpus_per_node)
    positive("seq-len", seq_len)
    positive("gbs", gbs)
    model_spec = load_model(model)
    cluster = make_cluster(resolve_gpu(gpu, gpu_set, profile), num_gpus, gpus_per_node)
    training = TrainingSpec(seq_len=seq_len, global_batch_size=gbs, precision=precision,  # type: ignore[arg-type]
                            attention_backend=attention_backend,  # type: ignore[arg-type]
                            **knob_fields(knobs, precision))
    return Inputs(model=model_spec, cluster=cluster, training=training)


def knob_fields(knobs: list[str] | None, precision: str) -> dict[str, Any]:
    """``--knob NAME[=VALUE]`` items (Megatron flag names without the dashes) -> TrainingSpec knob fields."""
    from paraplan.api import memory_knobs_from_words

    words: list[str] = []
    own: dict[str, Any] = {}
    for item in knobs or ():
        name, eq, value = item.partition("=")
        if name.strip().lstrip("-") in OWN_KNOBS:  # paraplan's own knob, not a Megatron flag
            own.update(own_knob_fields([item]))
            continue
        words += [f"--{name.strip().lstrip('-')}", *([v.strip() for v in value.split(",")] if eq else [])]
    notes: list[str] = []
    fields = memory_knobs_from_words(words, precision, notes) if words else {}
    for note in notes:  # Megatron ignores such a flag; say so rather than silently
        print(f"note: --knob {note.lstrip('-')}", file=sys.stderr)
    return {**fields, **own}


def own_knob_fields(knobs: list[str] | None) -> dict[str, Any]:
    """``--knob`` items of paraplan's own knobs (``OWN_KNOBS``) -> TrainingSpec fields: what ``check`` and
    ``estimate --megatron-args`` take beside a script. A Megatron flag belongs in the script, where Megatron reads it,
    and is refused in one line."""
    own: dict[str, Any] = {}
    for item in knobs or ():
        name, eq, value = item.partition("=")
        key = name.strip().lstrip("-")
        if key not in OWN_KNOBS:
            from paraplan.api import brief

            raise SpecError(f"--knob: beside a script only paraplan's own knobs are taken "
                            f"({', '.join(OWN_KNOBS)}); {brief(key)} is a Megatron-LM setting: put it in the script")
        field, read = OWN_KNOBS[key]
        own[field] = read(value.strip() if eq else None)
    return own


def attention_kernel_knob(value: str | None) -> str:
    """``--knob attention-kernel=current|fa2`` -> ``TrainingSpec.attention_kernel`` (paraplan's knob: no Megatron
    flag, never written into launch files), refused in one line otherwise."""
    from paraplan.api import ATTENTION_KERNELS, brief

    if value not in ATTENTION_KERNELS:
        got = "no value" if value is None else brief(value)
        raise SpecError(f"--knob attention-kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {got}")
    return value


def nvfp4_quantize_kernel_knob(value: str | None) -> str:
    """``--knob nvfp4-quantize-kernel=fused|split`` -> ``TrainingSpec.nvfp4_quantize_kernel`` (paraplan's knob: the
    container's Transformer Engine release, no Megatron flag, never written into launch files), refused in one line
    otherwise."""
    from paraplan.api import NVFP4_QUANTIZE_KERNELS, brief

    if value not in NVFP4_QUANTIZE_KERNELS:
        got = "no value" if value is None else brief(value)
        raise SpecError(f"--knob nvfp4-quantize-kernel must be one of {', '.join(NVFP4_QUANTIZE_KERNELS)}, got {got}")
    return value


OWN_KNOBS: dict[str, tuple[str, Callable[[str | None], str]]] = {
    "attention-kernel": ("attention_kernel", attention_kernel_knob),
    "nvfp4-quantize-kernel": ("nvfp4_quantize_kernel", nvfp4_quantize_kernel_knob),
}
"""paraplan's own knobs (no Megatron-LM flag; never written into launch files): --knob name -> (TrainingSpec field,
the reader of its value)."""


def resolve_gpu(gpu: str, gpu_set: list[str] | None, profile: str | None) -> GpuSpec:
    """The GPU preset or file, with a calibrated profile's efficiencies, then --gpu-set overrides."""
    gpu_spec = load_gpu(gpu)
    if profile is not None:  # an empty name is refused by the reader, not taken as no profile
        from paraplan.api import profile_overrides

        gpu_spec = override_gpu(gpu_spec, profile_overrides(profile, gpu_spec.name))
    return override_gpu(gpu_spec, parse_overrides(gpu_set))


def build_layout(
    *, num_gpus: int, tp: int, pp: int, vp: int, cp: int, ep: int, etp: int | None, mbs: int,
    recompute: str, recompute_modules: list[str] | None, recompute_num_layers: int | None,
    recompute_method: str | None = None,
    sequence_parallel: bool, distributed_optimizer: bool, fsdp: bool, overlap_grad_reduce: bool,
    overlap_param_gather: bool, tp_comm_overlap: bool, first_stage_layers: int | None,
    last_stage_layers: int | None, account_for_embedding: bool, account_for_loss: bool,
) -> ParallelLayout:
    """A ParallelLayout from CLI flags (DP = num_gpus / (TP x PP x CP))."""
    if fsdp and not distributed_optimizer:
        raise SpecError("--fsdp and --no-distributed-optimizer contradict: Megatron-FSDP shards the optimizer "
                        "states itself (drop one of the two)")
    if recompute != "selective" and recompute_modules:
        raise SpecError(f"--recompute-modules and --recompute {recompute} contradict: modules apply to "
                        "--recompute selective only")
    if recompute == "none" and recompute_num_layers is not None:
        raise SpecError("--recompute-num-layers and --recompute none contradict: layers per checkpoint apply to "
                        "--recompute full only")
    for name, value in (("tp", tp), ("pp", pp), ("vp", vp), ("cp", cp), ("ep", ep), ("etp", etp),
                        ("mbs", mbs), ("recompute-num-layers", recompute_num_layers)):
        positive(name, value)
    from paraplan.api import RECOMPUTE_METHODS, brief

    if recompute_method is not None and recompute != "full":  # A: validate_args / TC: __post_init__
        raise SpecError(f"--recompute-method and --recompute {recompute} contradict: the method applies to "
                        "--recompute full only")
    if recompute_method is not None and recompute_method not in RECOMPUTE_METHODS:
        raise SpecError(f"--recompute-method: expected one of {', '.join(RECOMPUTE_METHODS)}, got "
                        f"{brief(recompute_method)}")
    if recompute == "selective" and recompute_num_layers is not None:  # TC: __post_init__
        raise SpecError("--recompute-num-layers: When using recompute_granularity: selective "
                        "recompute_num_layers must be None.")
    for which, value in (("first", first_stage_layers), ("last", last_stage_layers)):
        if value is not None and value < 1:  # TC: __post_init__ (uneven PP)
            raise SpecError(f"--decoder-{which}-pipeline-num-layers: num_layers_in_{which}_pipeline_stage "
                            f"must be larger than 0 (got {value})")
    modules = tuple(recompute_modules) if recompute_modules else ("core_attn",)
    for mod in modules:
        if mod not in RECOMPUTE_MODULES:
            raise SpecError(f"--recompute-modules: unknown '{mod}' (allowed: {', '.join(RECOMPUTE_MODULES)})")
    return layout_for_world(
        num_gpus, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp or 0, mbs=mbs, recompute=recompute,
        recompute_modules=modules, recompute_num_layers=recompute_num_layers or 1,
        recompute_method=recompute_method or "uniform",
        # Megatron-FSDP shards the optimizer itself (and forces the distributed optimizer on): the
        # layout says fsdp, as the search does
        sequence_parallel=sequence_parallel, distributed_optimizer=distributed_optimizer and not fsdp, fsdp=fsdp,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather and (distributed_optimizer or fsdp),
        tp_comm_overlap=tp_comm_overlap, first_stage_layers=first_stage_layers or 0,
        last_stage_layers=last_stage_layers or 0, account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
    )


class PipelineSplit(StrEnum):
    """How layers are split over pipeline stages."""

    even = "even"
    auto = "auto"


def apply_pipeline_split(model: ModelSpec, layout: ParallelLayout, split: str) -> tuple[ParallelLayout, list[str]]:
    """With ``--pipeline-split auto``, give a layer count that does not divide over PP x VP a
    balanced first/last-stage split (``--decoder-first/last-pipeline-num-layers``)."""
    from dataclasses import replace

    from paraplan.api import auto_uneven_split, pipeline_layout_string

    notes: list[str] = []
    if split != "auto" or layout.first_stage_layers or layout.last_stage_layers or layout.pipeline_layout:
        return layout, notes
    if model.num_layers % (layout.pp * layout.vp) == 0:
        return layout, notes
    found = auto_uneven_split(model.num_layers, layout.pp, layout.vp)
    if len(found) != 2:
        counts = tuple(found)
        notes.append(f"uneven pipeline split: --pipeline-model-parallel-layout "
                     f"'{pipeline_layout_string(counts, layout.pp, mtp_layers=model.mtp_num_layers)}'")
        return replace(layout, pipeline_layout=counts), notes
    first, last = found
    notes.append(f"uneven pipeline split: --decoder-first-pipeline-num-layers {first} "
                 f"--decoder-last-pipeline-num-layers {last} ({model.num_layers} layers over PP {layout.pp})")
    return replace(layout, first_stage_layers=first, last_stage_layers=last), notes


# Reusable option declarations -------------------------------------------------------------
ModelOpt = typer.Option(..., "--model", "-m", help=MODEL_HELP)
GpuOpt = typer.Option(..., "--gpu", "-g", help=GPU_HELP)
NumGpusOpt = typer.Option(..., "--num-gpus", "-n", help="World size (GPUs).")
GpusPerNodeOpt = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the GPU preset's).")
SeqLenOpt = typer.Option(..., "--seq-len", "-s", help="Sequence length (tokens).")
GbsOpt = typer.Option(..., "--gbs", help="Global batch size (sequences).")
PrecisionOpt = typer.Option(PrecisionChoice.bf16, "--precision", help="GEMM precision.")
AttentionOpt = typer.Option(
    AttentionChoice.flash, "--attention-backend",
    help="flash (flash/cuDNN fused, the default) or unfused (Megatron's local/unfused attention: "
         "s x s scores in memory and time).")
FormatOpt = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.")
GpuSetOpt = typer.Option(None, "--gpu-set", help="Override a GPU field: key=value (e.g. "
                         "network_gbit_per_s=200, efficiency.gemm_max_frac=0.7).")
PipelineSplitOpt = typer.Option(
    PipelineSplit.auto, "--pipeline-split",
    help="auto (default): when layers do not divide over PP x VP, use the balanced split and "
         "say which --decoder-first/last-pipeline-num-layers (or --pipeline-model-parallel-layout) "
         "Megatron needs; even: require layers divisible by PP x VP (Megatron's rule without those flags).")
ProfileOpt = typer.Option(None, "--profile", help="Cluster profile YAML from `paraplan calibrate`.")
HeadroomOpt = typer.Option(
    None, "--headroom",
    help="Memory a layout must leave free to count as fitting: GIB (5GiB), PCT of usable (10%) or 0 (none), at most "
         "90% of the GPU's usable memory; default: the upper end of the memory model's measured error band for the "
         "model's family (paraplan.bands).")
KnobOpt = typer.Option(
    None, "--knob",
    help="A knob (memory or time) as its Megatron-LM flag, repeat: grad-reduce-in-bf16, use-precision-aware-optimizer, "
         "main-grads-dtype=bf16, main-params-dtype=fp16, exp-avg-dtype=bf16, exp-avg-sq-dtype=bf16, "
         "fp8-recipe=tensorwise, fp8-param-gather, optimizer-cpu-offload, optimizer-offload-fraction=0.5, "
         "cpu-offloading-num-layers=20, fine-grained-activation-offloading, offload-modules=core_attn,attn_proj, "
         "cp-comm-type=a2a (p2p, a2a, all_gather), "
         "fsdp-double-buffer, fp4-param-gather, first-last-layers-bf16, num-layers-at-end-in-bf16=4; "
         "MoE: moe-token-dispatcher-type=alltoall|allgather|flex, moe-flex-dispatcher-backend=deepep|hybridep, "
         "moe-flex-dispatcher-num-sms=32, delay-wgrad-compute, moe-permute-fusion, "
         "moe-permute-fusion-into-hybridep, moe-shared-expert-overlap, "
         "moe-expert-capacity-factor=1.0, moe-pad-expert-input-to-capacity, "
         "moe-expert-rank-capacity-factor=1.5, moe-paged-stash, use-transformer-engine-op-fuser; CUDA graphs: "
         "cuda-graph-impl=transformer_engine, cuda-graph-modules=attn; overlap-param-gather-with-optimizer-step, "
         "no-gradient-accumulation-fusion, cross-entropy-loss-fusion, cross-entropy-fusion-impl=native|te; "
         "userbuffers (with --tp-comm-overlap): no-tp-comm-overlap-ag, no-tp-comm-overlap-rs, "
         "tp-comm-overlap-rs-dgrad, "
         "tp-comm-overlap-cfg=NAME|FILE.yaml (a Megatron-Bridge named config or a Megatron-LM YAML file); "
         "paraplan's own (no Megatron flag): attention-kernel=current|fa2, nvfp4-quantize-kernel=fused|split.")


OwnKnobOpt = typer.Option(
    None, "--knob",
    help="paraplan's own knob, which no Megatron-LM flag carries (the script's flags are read from the script), "
         "repeat: attention-kernel=current|fa2, nvfp4-quantize-kernel=fused|split.")


# Layout flags shared by estimate, launch and tune (one definition each) ------------------
OptModelOpt = typer.Option(None, "--model", "-m", help=MODEL_HELP)
OptGpuOpt = typer.Option(None, "--gpu", "-g", help=GPU_HELP)
OptNumGpusOpt = typer.Option(None, "--num-gpus", "-n", help="World size (GPUs).")
OptSeqLenOpt = typer.Option(None, "--seq-len", "-s", help="Sequence length (tokens).")
OptGbsOpt = typer.Option(None, "--gbs", help="Global batch size (sequences).")
MbsOpt = typer.Option(1, "--mbs", help="Micro-batch size (sequences).")
TpOpt = typer.Option(1, "--tp", help="Tensor parallel size.")
PpOpt = typer.Option(1, "--pp", help="Pipeline parallel size.")
VpOpt = typer.Option(1, "--vp", help="Virtual pipeline chunks per rank (interleaving).")
CpOpt = typer.Option(1, "--cp", help="Context parallel size.")
EpOpt = typer.Option(1, "--ep", help="Expert parallel size.")
EtpOpt = typer.Option(None, "--etp", help="Expert tensor parallel size (default: TP).")
RecomputeOpt = typer.Option(RecomputeChoice.selective, "--recompute", help="Activation recomputation granularity.")
RecomputeModulesOpt = typer.Option(None, "--recompute-modules",
                                   help="Selective recompute modules (repeat): core_attn, mlp, moe, ...")
RecomputeNumLayersOpt = typer.Option(None, "--recompute-num-layers",
                                     help="Layers per checkpoint with --recompute full (default 1).")
RecomputeMethodOpt = typer.Option(None, "--recompute-method",
                                  help="With --recompute full: uniform (default; every layer, in groups of "
                                       "--recompute-num-layers) or block (only the first --recompute-num-layers "
                                       "layers of each model chunk).")
NoSpOpt = typer.Option(False, "--no-sequence-parallel", help="Turn sequence parallel off.")
NoDistOptOpt = typer.Option(False, "--no-distributed-optimizer", help="Replicate optimizer states (no ZeRO-1).")
FsdpOpt = typer.Option(False, "--fsdp", help="Megatron-FSDP (parameters, grads and optimizer sharded).")
NoOverlapGradOpt = typer.Option(False, "--no-overlap-grad-reduce", help="Turn --overlap-grad-reduce off.")
NoOverlapParamOpt = typer.Option(False, "--no-overlap-param-gather", help="Turn --overlap-param-gather off.")
TpCommOverlapOpt = typer.Option(False, "--tp-comm-overlap", help="TE userbuffer TP overlap.")
FirstStageOpt = typer.Option(None, "--decoder-first-pipeline-num-layers", help="Layers on the first stage.")
LastStageOpt = typer.Option(None, "--decoder-last-pipeline-num-layers", help="Layers on the last stage.")
AccountEmbOpt = typer.Option(False, "--account-for-embedding-in-pipeline-split",
                             help="Count the embedding as a layer in the split.")
AccountLossOpt = typer.Option(False, "--account-for-loss-in-pipeline-split",
                              help="Count the loss as a layer in the split.")


@dataclass(frozen=True, slots=True)
class LayoutFlags:
    """The layout flags estimate, launch and tune share (declared once, in LAYOUT_OPTIONS)."""

    mbs: int = 1
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    recompute: str = "selective"
    recompute_modules: list[str] | None = None
    recompute_num_layers: int | None = None
    recompute_method: str | None = None
    no_sequence_parallel: bool = False
    no_distributed_optimizer: bool = False
    fsdp: bool = False
    no_overlap_grad_reduce: bool = False
    no_overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    pipeline_split: str = "auto"

    def layout(self, num_gpus: int, model: ModelSpec) -> tuple[ParallelLayout, list[str]]:
        """The ParallelLayout the flags describe for ``num_gpus`` (with --pipeline-split applied)."""
        from paraplan.api import check_layout_sizes

        check_layout_sizes(model.num_layers, model.name, pp=self.pp, vp=self.vp,
                           decoder_first_pipeline_num_layers=self.first_stage_layers,
                           decoder_last_pipeline_num_layers=self.last_stage_layers)
        layout = build_layout(
            num_gpus=num_gpus, tp=self.tp, pp=self.pp, vp=self.vp, cp=self.cp, ep=self.ep, etp=self.etp,
            mbs=self.mbs, recompute=str(getattr(self.recompute, "value", self.recompute)),
            recompute_modules=self.recompute_modules, recompute_num_layers=self.recompute_num_layers,
            recompute_method=self.recompute_method,
            sequence_parallel=not self.no_sequence_parallel,
            distributed_optimizer=not self.no_distributed_optimizer, fsdp=self.fsdp,
            overlap_grad_reduce=not self.no_overlap_grad_reduce,
            overlap_param_gather=not self.no_overlap_param_gather, tp_comm_overlap=self.tp_comm_overlap,
            first_stage_layers=self.first_stage_layers, last_stage_layers=self.last_stage_layers,
            account_for_embedding=self.account_for_embedding, account_for_loss=self.account_for_loss,
        )
        return apply_pipeline_split(model, layout, str(getattr(self.pipeline_split, "value", self.pipeline_split)))


def knob_notes(model: ModelSpec, training: TrainingSpec, layout: ParallelLayout) -> list[str]:
    """The notes for knobs that take no effect here (estimate and launch add them to the layout's notes): MoE knobs
    on a dense model, a userbuffers config without --tp-comm-overlap."""
    from paraplan.api import dense_moe_knobs_note, ub_cfg_ignored_note

    return [n for n in (dense_moe_knobs_note(model, training), ub_cfg_ignored_note(training, layout)) if n]


def given_layout_flags(flags: LayoutFlags) -> list[str]:
    """The layout flags set away from their defaults, as ``--name`` (for 'drop these' errors where
    another input already describes the layout)."""
    import dataclasses

    return [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(flags)
            if getattr(flags, f.name) != getattr(LayoutFlags(), f.name)]


LAYOUT_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("mbs", int, MbsOpt), ("tp", int, TpOpt), ("pp", int, PpOpt), ("vp", int, VpOpt), ("cp", int, CpOpt),
    ("ep", int, EpOpt), ("etp", int | None, EtpOpt), ("recompute", RecomputeChoice, RecomputeOpt),
    ("recompute_modules", list[str] | None, RecomputeModulesOpt),
    ("recompute_num_layers", int | None, RecomputeNumLayersOpt),
    ("recompute_method", str | None, RecomputeMethodOpt), ("no_sequence_parallel", bool, NoSpOpt),
    ("no_distributed_optimizer", bool, NoDistOptOpt), ("fsdp", bool, FsdpOpt),
    ("no_overlap_grad_reduce", bool, NoOverlapGradOpt), ("no_overlap_param_gather", bool, NoOverlapParamOpt),
    ("tp_comm_overlap", bool, TpCommOverlapOpt), ("first_stage_layers", int | None, FirstStageOpt),
    ("last_stage_layers", int | None, LastStageOpt), ("account_for_embedding", bool, AccountEmbOpt),
    ("account_for_loss", bool, AccountLossOpt), ("pipeline_split", PipelineSplit, PipelineSplitOpt),
)
"""(parameter, type, typer option) of every layout flag, in --help order."""


def with_layout_flags(func: Callable[..., None]) -> Callable[..., None]:
    """Give a command the layout flags of LAYOUT_OPTIONS; it receives them as ``flags: LayoutFlags``.

    Typer reads the wrapper's signature: the command's own parameters (minus ``flags``) followed by
    the layout options, with the command's annotations resolved in its own module.
    """
    hints = typing.get_type_hints(func)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
           for p in inspect.signature(func).parameters.values() if p.name != "flags"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ)
             for name, typ, opt in LAYOUT_OPTIONS]
    names = [name for name, _, _ in LAYOUT_OPTIONS]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        flags = LayoutFlags(**{n: kwargs.pop(n) for n in names if n in kwargs})
        func(flags=flags, **kwargs)

    params = own + extra
    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return wrapper


NO_FLAGS = LayoutFlags()
"""Placeholder default of the ``flags`` parameter (with_layout_flags always passes real flags)."""


WorkspaceOpt = typer.Option(None, "--workspace-gib", help="Workspace allowance per GPU in GiB (default 0.125, "
                            "fitted to Megatron-LM CI; see docs/model.md).")
FragmentationOpt = typer.Option(None, "--fragmentation", help="Fragmentation allowance as a fraction of "
                                "activation-like memory (default 0.05).")


MAX_WORKSPACE_GIB = 1024
"""Largest --workspace-gib accepted (more than any GPU's memory; 1e309 reads as inf)."""


def memory_options(workspace_gib: float | None, fragmentation: float | None) -> MemoryOptions:
    """MemoryOptions from the CLI allowances (None keeps the documented default)."""
    base = MemoryOptions()
    if workspace_gib is not None and not 0 <= workspace_gib <= MAX_WORKSPACE_GIB:
        raise SpecError(f"--workspace-gib must be in [0, {MAX_WORKSPACE_GIB}] GiB, got {workspace_gib}")
    if fragmentation is not None and not 0 <= fragmentation < 1:
        raise SpecError(f"--fragmentation must be in [0, 1), got {fragmentation}")
    return MemoryOptions(
        workspace_bytes=base.workspace_bytes if workspace_gib is None else workspace_gib * GIB,
        fragmentation_frac=base.fragmentation_frac if fragmentation is None else fragmentation,
        backward_working_frac=base.backward_working_frac,
    )


def site_memory_options(env: tuple[tuple[str, str], ...], options: MemoryOptions, *,
                        fragmentation_given: bool) -> tuple[MemoryOptions, str | None]:
    """``options`` with the allocator a site profile's ``env`` sets for the job (env.sh / the pod env export it):
    ``PYTORCH_CUDA_ALLOC_CONF`` read as PyTorch does (``alloc_conf_expandable_segments``; a later pair wins, a bad
    value is one SpecError line), so expandable segments drop the fragmentation allowance, as ``check`` does for a
    script's env (``launch.check.script_memory_options``); a note saying so. An explicit ``--fragmentation`` wins."""
    from dataclasses import replace

    from paraplan.api import alloc_conf_expandable_segments

    conf = dict(env).get("PYTORCH_CUDA_ALLOC_CONF")
    if not conf or not alloc_conf_expandable_segments(conf) or fragmentation_given:
        return options, None
    return replace(options, expandable_segments=True), (
        f"PYTORCH_CUDA_ALLOC_CONF={conf} (site env): expandable segments, so no fragmentation allowance in the "
        "memory estimate")
