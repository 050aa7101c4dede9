"""``paraplan tune``: a measured run next to its prediction, the diagnosis, and the next layout to try."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from paraplan.api import (
    Comparison,
    Metric,
    RunInputs,
    RunLog,
    compare,
    diagnose,
    dumps_json,
    estimate,
    gpu_preset_names,
    load_plan,
    make_cluster,
    model_preset_names,
    override_gpu,
    read_logs,
    read_manifest,
)
from paraplan.cli._app import app
from paraplan.cli.options import (
    NO_FLAGS,
    FormatOpt,
    GpuSetOpt,
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
    given_layout_flags,
    resolve_inputs,
    with_layout_flags,
)
from paraplan.cli.render import console, safe
from paraplan.errors import IngestError, SpecError
from paraplan.units import GIB


def _from_plan(path: str, rank: int) -> RunInputs:
    loaded = load_plan(path)
    if not 1 <= rank <= len(loaded.layouts):
        raise SpecError(f"--rank {rank}: the plan has candidates 1 to {len(loaded.layouts)}")
    return RunInputs(model=loaded.model, cluster=loaded.cluster, training=loaded.training,
                     layout=loaded.layouts[rank - 1], prediction=loaded.predictions[rank - 1])


def _with_profile(inp: RunInputs, profile: str | None) -> RunInputs:
    if profile is None:  # an empty name is refused by the reader, not taken as no profile
        return inp
    from paraplan.api import profile_overrides

    gpu = override_gpu(inp.cluster.gpu, profile_overrides(profile, inp.cluster.gpu.name))
    return replace(inp, cluster=make_cluster(gpu, inp.cluster.num_gpus, inp.cluster.gpus_per_node))


def _fmt(m: Metric, unit: str) -> tuple[str, str, str]:
    scale = {"GiB": GIB, "%": 0.01}.get(unit, 1.0)

    def one(v: float | None) -> str:
        return "-" if v is None else f"{v / scale:,.3g} {unit}" if abs(v / scale) < 1000 else f"{v / scale:,.0f} {unit}"

    return one(m.predicted), one(m.measured), "-" if m.ratio is None else f"x{m.ratio:.2f}"


def _render(cmp: Comparison, findings_: list[dict[str, object]], log: RunLog) -> None:
    con, est = console(), cmp.estimate
    con.print(f"[bold]{safe(est.model.name)}[/] on {est.cluster.num_gpus} x {safe(est.cluster.gpu.name)} | layout "
              f"{est.layout.short()} | {cmp.iterations} iteration record(s) from {safe(', '.join(log.sources))}")
    table = Table(title="predicted vs measured")
    for col in ("", "predicted", "measured", "measured/predicted"):
        table.add_column(col, justify="right" if col else "left")
    rows = [("step time", "step_time_s", "s"), ("tokens/s/GPU", "tokens_per_s_per_gpu", ""), ("MFU", "mfu", "%"),
            ("model TFLOP/s/GPU", "model_tflops_per_gpu", ""), ("TFLOP/s/GPU in the log", "log_tflops_per_gpu", ""),
            ("peak memory (max allocated)", "peak_memory_bytes", "GiB"),
            ("bubble + PP wait", "bubble_and_pp_s", "s"), ("optimizer", "optimizer_s", "s")]
    for label, key, unit in rows:
        table.add_row(label, *_fmt(cmp.metrics[key], unit))
    for axis, m in cmp.comm.items():
        if m.predicted or m.measured is not None:
            table.add_row(f"exposed {axis.upper()} comm", *_fmt(m, "s"))
    con.print(table)
    mem = Table(title="peak memory per pipeline stage (rank // (TP x CP x DP))")
    for col in ("stage", "ranks", "predicted", "max allocated", "max reserved", "ratio"):
        mem.add_column(col, justify="right")
    for s in cmp.stages:
        ranks = ",".join(map(str, s.ranks[:6])) + ("..." if len(s.ranks) > 6 else "")
        mem.add_row(str(s.stage), ranks or "-", f"{s.predicted_bytes / GIB:.1f} GiB",
                    "-" if s.measured_bytes is None else f"{s.measured_bytes / GIB:.1f} GiB",
                    "-" if s.reserved_bytes is None else f"{s.reserved_bytes / GIB:.1f} GiB",
                    "-" if s.ratio is None else f"x{s.ratio:.2f}")
    con.print(mem)
    for note in cmp.notes:
        con.print(f"[yellow]note:[/] {safe(note)}")
    for f in findings_:
        text, launch, command = str(f["text"]).partition(" Launch: ")
        con.print(f"[bold]{f['code']}[/] {safe(text)}" + (" Launch:" if launch else ""))
        if launch:  # the command on a line of its own, unwrapped, to copy
            con.print(safe(command), soft_wrap=True)


def _refs(inp: RunInputs, model: str | None, gpu: str | None) -> tuple[str, str]:
    """--model / --gpu for the launch command: as given, else the preset name, else the log the model was
    read from (``--model`` reads a log's argument dump), else a placeholder."""
    name, gname = inp.model.name, inp.cluster.gpu.name
    source = inp.model.source if inp.model.source and Path(inp.model.source).exists() else None
    return (model or (name if name in model_preset_names() else source or "<model config>"),
            gpu or (gname if gname in gpu_preset_names() else "<gpu file>"))


def _from_log_arguments(run_log: RunLog, gpu: str | None, gpus_per_node: int | None, gpu_set: list[str] | None,
                        profile: str | None) -> RunInputs:
    """The run as its own argument dump describes it (model, layout, batch, precision; world size from the
    dump), on the GPU given with --gpu (a log does not name its GPU type)."""
    import shlex

    from paraplan.api import argv_from_dump, check_parsed, parse_script
    from paraplan.cli.options import resolve_gpu

    config = run_log.run_config
    if config is None or not config.arguments:
        raise SpecError("tune: give exactly one of --plan, --manifest or the estimate flags (--model ...): the log "
                        "has no Megatron argument dump to read the run from")
    if gpu is None:
        raise SpecError("tune: the log's argument dump gives the model and layout; also give --gpu (the GPU type)")
    gpu_spec = resolve_gpu(gpu, gpu_set, profile)
    text = "pretrain_gpt.py " + shlex.join(argv_from_dump(config.arguments))
    result = check_parsed(parse_script(text), gpu_spec, num_gpus=config.sizes.get("world"),
                          gpus_per_node=gpus_per_node)
    broken = [(c, m) for c, m in result.violations if c != "CUDA_DEVICE_MAX_CONNECTIONS"]
    if broken:
        raise SpecError(f"the log's argument dump describes a layout Megatron rejects: {broken[0][1]}")
    model = dataclasses.replace(result.model, name=Path(config.source).stem or "custom", source=config.source)
    return RunInputs(model=model, cluster=result.cluster, training=result.training, layout=result.layout)


@app.command("tune")
@with_layout_flags
def tune(
    log: list[str] = typer.Option(..., "--log", "-l", help="Megatron log or TensorBoard dir (repeat for several)."),
    plan_path: str | None = typer.Option(None, "--plan", help="plan.json from `paraplan plan --save`."),
    rank: int = typer.Option(1, "--rank", help="Candidate of --plan that ran (1 = best)."),
    manifest: str | None = typer.Option(None, "--manifest", help="manifest.json of the launch directory that ran."),
    model: str | None = OptModelOpt,
    gpu: str | None = OptGpuOpt,
    num_gpus: int | None = OptNumGpusOpt,
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node"),
    seq_len: int | None = OptSeqLenOpt,
    gbs: int | None = OptGbsOpt,
    precision: PrecisionChoice = PrecisionOpt,
    gpu_set: list[str] | None = GpuSetOpt,
    profile: str | None = ProfileOpt,
    skip_warmup: int = typer.Option(1, "--skip-warmup", help="Iteration records to skip per log segment."),
    no_search: bool = typer.Option(False, "--no-search", help="Skip the search for the next layout."),
    fmt: OutputFormat = FormatOpt,
    flags: LayoutFlags = NO_FLAGS,
) -> None:
    """Compare a measured Megatron run with its prediction, diagnose it, and propose the next layout.

    Example: paraplan tune --log train.log --manifest runs/a/manifest.json

    Example: paraplan tune --log train.log --gpu h100-80gb   (the model and layout from the log's argument dump)
    """
    sources = [s for s in (plan_path, manifest, model) if s]
    if len(sources) > 1:
        raise SpecError("tune: give exactly one of --plan, --manifest or the estimate flags (--model ...)")
    inp: RunInputs | None = None
    if plan_path:
        inp = _with_profile(_from_plan(plan_path, rank), profile)
    elif manifest:
        inp = _with_profile(read_manifest(manifest), profile)
    elif model:
        missing = [f"--{k}" for k, v in (("gpu", gpu), ("num-gpus", num_gpus), ("seq-len", seq_len), ("gbs", gbs))
                   if v is None]
        if missing:
            raise SpecError(f"tune: with --model, also give {', '.join(missing)}")
        assert gpu is not None and num_gpus is not None and seq_len is not None and gbs is not None  # checked above
        specs = resolve_inputs(model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node, seq_len=seq_len,
                               gbs=gbs, precision=precision.value, gpu_set=gpu_set, profile=profile)
        layout, _ = flags.layout(num_gpus, specs.model)
        inp = RunInputs(model=specs.model, cluster=specs.cluster, training=specs.training, layout=layout)
    try:
        run_log = read_logs(log)
    except IngestError as err:
        raise SpecError(str(err)) from None
    if inp is None:
        given = [f"--{n}" for n, v in (("num-gpus", num_gpus), ("seq-len", seq_len), ("gbs", gbs)) if v is not None]
        given += given_layout_flags(flags)
        if given:
            raise SpecError(f"tune: the log's argument dump describes the run; drop {', '.join(given)} (or give "
                            "--model with the layout flags)")
        inp = _from_log_arguments(run_log, gpu, gpus_per_node, gpu_set, profile)
    est = estimate(inp.model, inp.cluster, layout=inp.layout, training=inp.training)
    cmp = compare(est, run_log, skip_warmup=skip_warmup)
    model_ref, gpu_ref = _refs(inp, model, gpu)
    findings = [f.as_dict() for f in diagnose(cmp, None, search=not no_search, model_ref=model_ref,
                                              gpu_ref=gpu_ref, profile=profile)]
    if fmt == OutputFormat.json:
        doc = {"sources": list(run_log.sources), "candidate_id": inp.candidate_id, "comparison": cmp.to_dict(),
               "findings": findings}
        print(dumps_json(doc))
    else:
        _render(cmp, findings, run_log)
