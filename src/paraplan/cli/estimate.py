"""``paraplan estimate``: memory per pipeline stage, step time and throughput of one layout."""

from __future__ import annotations

import typer

from paraplan.cli._app import app
from paraplan.cli.options import (
    NO_FLAGS,
    AttentionChoice,
    AttentionOpt,
    FormatOpt,
    FragmentationOpt,
    GpuOpt,
    GpuSetOpt,
    GpusPerNodeOpt,
    KnobOpt,
    LayoutFlags,
    OptGbsOpt,
    OptModelOpt,
    OptNumGpusOpt,
    OptSeqLenOpt,
    OutputFormat,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    WorkspaceOpt,
    given_layout_flags,
    memory_options,
    resolve_gpu,
    resolve_inputs,
    with_layout_flags,
)
from paraplan.cli.render import estimate_csv, render_estimate
from paraplan.errors import LayoutError, SpecError
from paraplan.estimator import Estimate
from paraplan.estimator import estimate as run_estimate
from paraplan.serialize import dumps_json


@app.command("estimate")
@with_layout_flags
def estimate(
    model: str | None = OptModelOpt,
    gpu: str = GpuOpt,
    num_gpus: int | None = OptNumGpusOpt,
    gpus_per_node: int | None = GpusPerNodeOpt,
    seq_len: int | None = OptSeqLenOpt,
    gbs: int | None = OptGbsOpt,
    megatron_args: str | None = typer.Option(
        None, "--megatron-args",
        help="A pretrain_gpt.py / torchrun command line (or @FILE): model, layout and batch are read from it."),
    precision: PrecisionChoice = PrecisionOpt,
    attention_backend: AttentionChoice = AttentionOpt,
    knob: list[str] | None = KnobOpt,
    mfu_peak: PrecisionChoice = typer.Option(PrecisionChoice.bf16, "--mfu-peak",
                                             help="Dense peak MFU/HFU divide by."),
    gpu_set: list[str] | None = GpuSetOpt,
    profile: str | None = ProfileOpt,
    workspace_gib: float | None = WorkspaceOpt,
    fragmentation: float | None = FragmentationOpt,
    fmt: OutputFormat = FormatOpt,
    flags: LayoutFlags = NO_FLAGS,
) -> None:
    """Memory per pipeline stage, step time and throughput of one Megatron layout.

    Example: paraplan estimate --model llama3-70b --gpu h100-80gb --num-gpus 64 --tp 4 --pp 4
    --cp 2 --seq-len 8192 --gbs 512 --mbs 1
    """
    if megatron_args is not None:
        given = [f"--{name}" for name, value in (("model", model), ("seq-len", seq_len), ("gbs", gbs))
                 if value is not None]
        given += given_layout_flags(flags)
        if precision != PrecisionChoice.bf16 or attention_backend != AttentionChoice.flash:
            given.append("--precision/--attention-backend")
        given += ["--knob"] if knob else []
        if given:
            raise SpecError(f"--megatron-args describes the model, layout, batch and precision; drop "
                            f"{', '.join(given)} (or drop --megatron-args)")
        result = _from_megatron_args(megatron_args, gpu, num_gpus, gpus_per_node, gpu_set, profile)
        _emit(result, fmt)
        return
    for flag, value in (("model", model), ("num-gpus", num_gpus), ("seq-len", seq_len), ("gbs", gbs)):
        if value is None:
            raise SpecError(f"--{flag} is required (or give --megatron-args)")
    assert model is not None and num_gpus is not None and seq_len is not None and gbs is not None
    inputs = resolve_inputs(model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                            seq_len=seq_len, gbs=gbs, precision=precision.value, gpu_set=gpu_set,
                            profile=profile, attention_backend=attention_backend.value, knobs=knob)
    layout, notes = flags.layout(num_gpus, inputs.model)
    from paraplan.launch.megatron import launch_violations

    broken = launch_violations(inputs.model, layout, inputs.training, inputs.cluster.gpu.arch)
    if broken:  # the flag-level rules launch and Megatron apply (layout rules run in estimate)
        raise LayoutError(broken[0][1], reason=broken[0][0])
    result = run_estimate(inputs.model, inputs.cluster, inputs.training, layout, mfu_peak=mfu_peak.value,
                          extra_notes=notes, memory_options=memory_options(workspace_gib, fragmentation))
    _emit(result, fmt)


def _from_megatron_args(text: str, gpu: str, num_gpus: int | None, gpus_per_node: int | None,
                        gpu_set: list[str] | None, profile: str | None) -> Estimate:
    """Estimate the layout a Megatron command line describes; its first broken rule is the error."""
    from paraplan.fileio import read_input_text
    from paraplan.launch.check import check_parsed
    from paraplan.launch.megatron import MEGATRON_COMMIT
    from paraplan.launch.parse import parse_script

    if text.startswith("@"):
        text = read_input_text(text[1:], "--megatron-args")
    gpu_spec = resolve_gpu(gpu, gpu_set, profile)
    result = check_parsed(parse_script(text), gpu_spec, num_gpus=num_gpus, gpus_per_node=gpus_per_node)
    # the environment a launcher sets is `paraplan check`'s business; the estimate needs the layout only
    blocking = [(c, m) for c, m in result.violations if c != "CUDA_DEVICE_MAX_CONNECTIONS"]
    if blocking:
        code, message = blocking[0]
        raise LayoutError(message, reason=code)
    unknown = list(result.parsed.unknown_flags)
    notes = list(result.parsed.flags.notes) + (
        [f"not Megatron-LM flags (main @ {MEGATRON_COMMIT}), ignored: {', '.join(unknown)}"] if unknown else [])
    return run_estimate(result.model, result.cluster, result.training, result.layout, extra_notes=notes)


def _emit(result: Estimate, fmt: OutputFormat) -> None:
    if fmt == OutputFormat.json:
        print(dumps_json(result.to_dict()))
    elif fmt == OutputFormat.csv:
        print(estimate_csv(result), end="")
    else:
        render_estimate(result)
