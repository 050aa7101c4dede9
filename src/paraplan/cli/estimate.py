"""``paraplan estimate``: memory per pipeline stage, step time and throughput of one layout."""

from __future__ import annotations

import sys
from typing import Any

import typer

from paraplan.api import (
    KNOB_FLAG_ALIASES,
    KNOB_FLAGS,
    KNOB_REFINEMENTS,
    RECOMPUTE_MODULES,
    Estimate,
    Headroom,
    MemoryOptions,
    dumps_json,
    parse_headroom,
)
from paraplan.api import estimate as run_estimate
from paraplan.cli._app import app, state
from paraplan.cli.options import (
    NO_FLAGS,
    AttentionChoice,
    AttentionOpt,
    FormatOpt,
    FragmentationOpt,
    GpuSetOpt,
    GpusPerNodeOpt,
    HeadroomOpt,
    KnobOpt,
    LayoutFlags,
    OptGbsOpt,
    OptGpuOpt,
    OptModelOpt,
    OptNumGpusOpt,
    OptSeqLenOpt,
    OutputFormat,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    WorkspaceOpt,
    given_layout_flags,
    knob_notes,
    memory_options,
    own_knob_fields,
    positive,
    resolve_gpu,
    resolve_inputs,
    with_layout_flags,
)
from paraplan.cli.recipes import RecipesFileOpt
from paraplan.cli.render import estimate_csv, render_estimate
from paraplan.errors import LayoutError, SpecError


@app.command("estimate")
@with_layout_flags
def estimate(
    ctx: typer.Context,
    model: str | None = OptModelOpt,
    gpu: str | None = OptGpuOpt,
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
    headroom: str | None = HeadroomOpt,
    fmt: OutputFormat = FormatOpt,
    recipe: str | None = typer.Option(
        None, "--recipe", help="Run a recipe (`paraplan recipes`: its source, function name or alias) with all its "
        "knobs; --gpu, --num-gpus, --seq-len, --gbs, --precision and layout flags given beside it override it."),
    recipes_file: str | None = RecipesFileOpt,
    flags: LayoutFlags = NO_FLAGS,
) -> None:
    """Memory per pipeline stage, step time and throughput of one Megatron layout.

    Example: paraplan estimate --model llama3-70b --gpu h100-80gb --num-gpus 64 --tp 4 --pp 4
    --cp 2 --seq-len 8192 --gbs 512 --mbs 1

    Example: paraplan estimate --recipe llama3-70b-h100-fp8cs-64

    Exit code 4 when the layout does not fit in usable memory; a warning (exit 0) when it fits only
    inside the --headroom margin.
    """
    margin = parse_headroom(headroom)
    if recipe is not None:
        for opt_name, opt_value in (("model", model), ("megatron-args", megatron_args)):
            if opt_value is not None:
                raise SpecError(f"--recipe names the model, layout and batch; drop --{opt_name} (or drop --recipe)")
        result, block = _from_recipe(ctx, recipe, recipes_file, gpu=gpu, num_gpus=num_gpus,
                                     gpus_per_node=gpus_per_node, seq_len=seq_len, gbs=gbs, precision=precision,
                                     attention_backend=attention_backend, knob=knob,
                                     flags=flags, gpu_set=gpu_set, profile=profile, mfu_peak=mfu_peak.value,
                                     options=memory_options(workspace_gib, fragmentation))
        from dataclasses import replace

        # the default margin is the model family's, as plain estimate and check (A7)
        _emit(replace(result, headroom=margin.for_model(result.model.is_moe)), fmt, recipe=block)
        return
    if recipes_file is not None:
        raise SpecError("--recipes gives recipes for --recipe NAME; add --recipe (or drop --recipes)")
    if gpu is None:
        raise SpecError("--gpu is required (or give --recipe)")
    if megatron_args is not None:
        given = [f"--{name}" for name, value in (("model", model), ("seq-len", seq_len), ("gbs", gbs))
                 if value is not None]
        given += given_layout_flags(flags)
        if precision != PrecisionChoice.bf16 or attention_backend != AttentionChoice.flash:
            given.append("--precision/--attention-backend")
        if given:
            raise SpecError(f"--megatron-args describes the model, layout, batch and precision; drop "
                            f"{', '.join(given)} (or drop --megatron-args)")
        result = _from_megatron_args(megatron_args, gpu, num_gpus, gpus_per_node, gpu_set, profile, margin,
                                     own_knob_fields(knob))
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
    notes = [*notes, *knob_notes(inputs.model, inputs.training, layout)]
    from paraplan.api import launch_violations

    broken = launch_violations(inputs.model, layout, inputs.training, inputs.cluster.gpu.arch)
    if broken:  # the flag-level rules launch and Megatron apply (layout rules run in estimate)
        raise LayoutError(broken[0][1], reason=broken[0][0])
    result = run_estimate(inputs.model, inputs.cluster, layout=layout, training=inputs.training,
                          mfu_peak=mfu_peak.value, notes=notes,
                          memory_options=memory_options(workspace_gib, fragmentation), headroom=margin)
    _emit(result, fmt)


_FLAG_FIELDS: dict[str, tuple[str, Any]] = {
    "mbs": ("mbs", int), "tp": ("tp", int), "pp": ("pp", int), "vp": ("vp", int), "cp": ("cp", int),
    "ep": ("ep", int), "etp": ("etp", lambda v: v or 0),
    "recompute": ("recompute", lambda v: str(getattr(v, "value", v))),
    "recompute_modules": ("recompute_modules", lambda v: tuple(v) if v else ("core_attn",)),
    "recompute_num_layers": ("recompute_num_layers", lambda v: v or 1),
    "recompute_method": ("recompute_method", lambda v: v or "uniform"),
    "no_sequence_parallel": ("sequence_parallel", lambda v: not v),
    "no_distributed_optimizer": ("distributed_optimizer", lambda v: not v), "fsdp": ("fsdp", bool),
    "no_overlap_grad_reduce": ("overlap_grad_reduce", lambda v: not v),
    "no_overlap_param_gather": ("overlap_param_gather", lambda v: not v), "tp_comm_overlap": ("tp_comm_overlap", bool),
    "first_stage_layers": ("first_stage_layers", lambda v: v or 0),
    "last_stage_layers": ("last_stage_layers", lambda v: v or 0),
    "account_for_embedding": ("account_for_embedding", bool), "account_for_loss": ("account_for_loss", bool),
}
"""Layout flag -> (the ParallelLayout field it overrides in a recipe, its value from the flag)."""


def _given(ctx: typer.Context, name: str) -> bool:
    from typer._click.core import ParameterSource

    source = ctx.get_parameter_source(name)
    return source is not None and source != ParameterSource.DEFAULT


def _from_recipe(ctx: typer.Context, name: str, recipes_file: str | None, *, gpu: str | None, num_gpus: int | None,
                 gpus_per_node: int | None, seq_len: int | None, gbs: int | None, precision: PrecisionChoice,
                 attention_backend: AttentionChoice, knob: list[str] | None, flags: LayoutFlags,
                 gpu_set: list[str] | None,
                 profile: str | None, mfu_peak: str, options: MemoryOptions) -> tuple[Estimate, dict[str, Any]]:
    """Estimate a recipe with the flags given beside it winning over its own values; the JSON ``recipe`` block."""
    from paraplan.api import catalogue, estimate_run, find_recipe, recipe_run, run_dict

    for flag, value in (("num-gpus", num_gpus), ("gpus-per-node", gpus_per_node), ("seq-len", seq_len),
                        ("gbs", gbs)):
        positive(flag, value)
    for flag_name, flag_value in (("vp", flags.vp), ("ep", flags.ep), ("etp", flags.etp), ("mbs", flags.mbs),
                                  ("tp", flags.tp), ("pp", flags.pp), ("cp", flags.cp),
                                  ("recompute-num-layers", flags.recompute_num_layers)):
        positive(flag_name, flag_value)
    r = find_recipe(name, catalogue(recipes_file))
    overrides = {field: conv(getattr(flags, flag)) for flag, (field, conv) in _FLAG_FIELDS.items() if _given(ctx, flag)}
    for mod in overrides.get("recompute_modules", ()):
        if mod not in RECOMPUTE_MODULES:
            raise SpecError(f"--recompute-modules: unknown '{mod}' (allowed: {', '.join(RECOMPUTE_MODULES)})")
    run = recipe_run(r, num_gpus=num_gpus, seq_len=seq_len, gbs=gbs,
                     precision=precision.value if _given(ctx, "precision") else None, layout_overrides=overrides,
                     attention_backend=attention_backend.value if _given(ctx, "attention_backend") else None,
                     pipeline_split=str(getattr(flags.pipeline_split, "value", flags.pipeline_split)))
    # Megatron-LM's argument checks (launch_violations) are not applied: Bridge builds the MCore configs itself;
    # MCore's layout rules are (estimate's check_layout)
    gpu_spec = resolve_gpu(gpu or run.job.gpu, gpu_set, profile)
    given = [f"--{f.replace('_', '-')}" for f in ("gpu", "num_gpus", "seq_len", "gbs", "precision",
                                                  "attention_backend", *_FLAG_FIELDS, "pipeline_split")
             if _given(ctx, f)]
    knobs = _recipe_knobs(run, knob)
    if knobs is not None:
        _refuse_new_violations(run, knobs, gpu_spec.arch)
    given += [f"--knob {item.strip()}" for item in knob or ()]
    if knobs is not None and knobs.get("tp_comm_overlap_cfg"):  # --knob tp-comm-overlap-cfg: recipe_run's note is moot
        from dataclasses import replace as _replace

        run = _replace(run, notes=tuple(n for n in run.notes if not n.startswith("the recipe's userbuffers config")))
    if given:
        from dataclasses import replace

        run = replace(run, notes=(*run.notes, f"given beside the recipe, winning over its values: {', '.join(given)}"))
    if not _given(ctx, "fragmentation"):  # the recipe's allocator (expandable segments), unless --fragmentation
        from paraplan.api import recipe_memory_options

        options = recipe_memory_options(r, options)
    return (estimate_run(run, gpus_per_node=gpus_per_node, gpu_spec=gpu_spec, memory_options=options,
                         mfu_peak=mfu_peak, knobs=knobs), run_dict(run, given))


def _refuse_new_violations(run: Any, knobs: dict[str, Any], arch: str) -> None:
    """The first of Megatron's flag rules (``launch_violations``) the recipe breaks with ``knobs`` and not with its
    own knobs, as a LayoutError: a --knob beside a recipe is refused where plain ``estimate --knob`` refuses it (the
    recipe's own settings are Bridge's business, as without --knob)."""
    from paraplan.api import TrainingSpec, launch_violations, training_knobs

    job = run.job

    def broken(fields: dict[str, Any]) -> list[tuple[str, str]]:
        training = TrainingSpec(seq_len=job.seq_len, global_batch_size=job.gbs, precision=job.precision,
                                attention_backend=job.attention_backend, **fields)
        return launch_violations(run.model, run.layout, training, arch)

    own = {code for code, _ in broken(training_knobs(run.recipe, job.precision))}
    new = [(code, message) for code, message in broken(knobs) if code not in own]
    if new:
        raise LayoutError(new[0][1], reason=new[0][0])


_KNOB_CONTEXT: dict[str, tuple[str, ...]] = {
    key: tuple(flag[2:] for child in refined for flag in (KNOB_FLAGS[child], *KNOB_FLAG_ALIASES.get(child, ())))
    for key, refined in KNOB_REFINEMENTS.items()
}
"""A recipe knob -> the --knob names that refine it (``KNOB_REFINEMENTS``, with the deprecated flags): given beside
a recipe without the knob they refine, they are read with the recipe's value of it (as a Megatron command line
carrying both)."""


def _recipe_knobs(run: Any, knob: list[str] | None) -> dict[str, Any] | None:
    """The recipe's memory knobs with ``--knob`` items winning, read by the same rules as without --recipe
    (``knob_fields``, at the run's precision), so what plain ``estimate --knob`` refuses is refused here."""
    if not knob:
        return None
    from paraplan.api import training_knobs

    return merge_recipe_knobs(training_knobs(run.recipe, run.job.precision), knob, run.job.precision)


def merge_recipe_knobs(base: dict[str, Any], knob: list[str], precision: str) -> dict[str, Any]:
    """A recipe's knobs ``base`` with the ``--knob`` items winning. A refinement given without the knob it refines
    is read with the recipe's value of that knob (and of the knob that one refines, ``_KNOB_CONTEXT``)."""
    from paraplan.cli.options import knob_fields

    names = {item.partition("=")[0].strip().lstrip("-") for item in knob}
    context: list[str] = []
    needed, done = set(names), set(names)
    while True:
        add = [key for key, refined in _KNOB_CONTEXT.items()
               if KNOB_FLAGS[key][2:] not in done and needed & set(refined)
               and base.get(key) not in (None, False, "none", "alltoall")]
        if not add:
            break
        for key in add:
            flag, value = KNOB_FLAGS[key][2:], base[key]
            context.append(flag if value is True else f"{flag}={value}")
            done.add(flag)
            needed.add(flag)
    merged = {**base, **knob_fields([*context, *knob], precision)}
    # the recipe's refinements of a knob that --knob turned off go with it (Megatron ignores them then)
    for key, children in KNOB_REFINEMENTS.items():
        if key != "use_precision_aware_optimizer" and merged.get(key) in (None, False, "none", "alltoall"):
            for child in children:
                merged.pop(child, None)
    return merged


def _from_megatron_args(text: str, gpu: str, num_gpus: int | None, gpus_per_node: int | None,
                        gpu_set: list[str] | None, profile: str | None, headroom: Headroom,
                        own_knobs: dict[str, Any]) -> Estimate:
    """Estimate the layout a Megatron command line describes (``own_knobs``: paraplan's own knobs, ``--knob``); its
    first broken rule is the error."""
    from paraplan.api import MEGATRON_COMMIT, check_parsed, parse_script, read_input_text

    if text.startswith("@"):
        text = read_input_text(text[1:], "--megatron-args")
    elif not text.strip():  # an empty shell variable
        raise SpecError("--megatron-args: empty (give a pretrain_gpt.py command line, or @FILE)")
    gpu_spec = resolve_gpu(gpu, gpu_set, profile)
    result = check_parsed(parse_script(text), gpu_spec, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                          headroom=headroom, own_knobs=own_knobs)
    # the environment a launcher sets is `paraplan check`'s business; the estimate needs the layout only
    blocking = [(c, m) for c, m in result.violations if c != "CUDA_DEVICE_MAX_CONNECTIONS"]
    if blocking:
        code, message = blocking[0]
        raise LayoutError(message, reason=code)
    unknown = list(result.parsed.unknown_flags)
    notes = list(result.parsed.flags.notes) + (
        [f"not Megatron-LM flags (main @ {MEGATRON_COMMIT}), ignored: {', '.join(unknown)}"] if unknown else [])
    return run_estimate(result.model, result.cluster, layout=result.layout, training=result.training, notes=notes,
                        headroom=headroom)


NVFP4_CASTS_NOTE: dict[str, str] = {
    "fused": "NVFP4 casts: one kernel (TE >= 2.14); --knob nvfp4-quantize-kernel=split for TE <= 2.13",
    "split": "NVFP4 casts: two kernels (TE <= 2.13, --knob nvfp4-quantize-kernel=split); fused (the default) for "
             "TE >= 2.14"}
"""The note an FP4 estimate carries on how Transformer Engine casts its NVFP4 operands
(``TrainingSpec.nvfp4_quantize_kernel``; the release is not in the spec, so say which one is assumed)."""


def _emit(result: Estimate, fmt: OutputFormat, recipe: dict[str, Any] | None = None) -> None:
    if result.training.precision == "fp4":
        from dataclasses import replace

        result = replace(result, notes=(*result.notes, NVFP4_CASTS_NOTE[result.training.nvfp4_quantize_kernel]))
    if fmt == OutputFormat.json:
        print(dumps_json(result.to_dict() | ({"recipe": recipe} if recipe is not None else {})))
    elif fmt == OutputFormat.csv:
        print(estimate_csv(result), end="")
    else:
        render_estimate(result)
    if not result.fits:  # exit 4 (documented in paraplan.cli), one line on stderr
        print(f"error: the layout does not fit: {result.fit_text.split(': ', 1)[1]}", file=sys.stderr)
        state.exit_code = 4
