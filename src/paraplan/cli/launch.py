"""``paraplan launch``: launch files for one layout (Megatron args, env, torchrun, Slurm, k8s)."""

from __future__ import annotations

import json
from dataclasses import replace
from enum import StrEnum

import typer

from paraplan.api import (
    CheckpointArgs,
    Estimate,
    LaunchSpec,
    MemoryOptions,
    advise,
    candidate_id,
    load_site,
    render_files,
    ub_cfg_ignored_note,
    write_files,
)
from paraplan.api import estimate as run_estimate
from paraplan.cli._app import app
from paraplan.cli.options import (
    NO_FLAGS,
    GpuSetOpt,
    GpusPerNodeOpt,
    KnobOpt,
    LayoutFlags,
    OptGbsOpt,
    OptGpuOpt,
    OptModelOpt,
    OptNumGpusOpt,
    OptSeqLenOpt,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    knob_notes,
    resolve_inputs,
    site_memory_options,
    with_layout_flags,
)
from paraplan.cli.render import console, safe
from paraplan.errors import SpecError
from paraplan.units import GIB


class Target(StrEnum):
    """What to generate."""

    megatron = "megatron"
    torchrun = "torchrun"
    slurm = "slurm"
    sbatch = "sbatch"
    k8s = "k8s"
    pytorchjob = "pytorchjob"
    trainjob = "trainjob"
    bridge = "bridge"
    all = "all"


def _from_plan(path: str, rank: int, options: MemoryOptions | None = None) -> tuple[LaunchSpec, Estimate]:
    """The rank-th layout (1 = best) of a saved plan.json, re-estimated (``options``: the site's allocator)."""
    from paraplan.api import load_plan

    loaded = load_plan(path)
    if not 1 <= rank <= len(loaded.layouts):
        raise SpecError(f"--rank {rank}: the plan has {len(loaded.layouts)} layouts (1 = best)")
    layout = loaded.layouts[rank - 1]
    result = run_estimate(loaded.model, loaded.cluster, layout=layout, training=loaded.training,
                          memory_options=options)
    spec = LaunchSpec(model=loaded.model, cluster=loaded.cluster, training=loaded.training,
                      layout=layout, prediction=result.to_dict())
    return spec, result


@app.command("launch")
@with_layout_flags
def launch(
    plan: str | None = typer.Option(None, "--plan", help="plan.json from `paraplan plan --save` "
                                    "(instead of the layout flags)."),
    rank: int = typer.Option(1, "--rank", help="Which layout of --plan (1 = best)."),
    model: str | None = OptModelOpt,
    gpu: str | None = OptGpuOpt,
    num_gpus: int | None = OptNumGpusOpt,
    gpus_per_node: int | None = GpusPerNodeOpt,
    seq_len: int | None = OptSeqLenOpt,
    gbs: int | None = OptGbsOpt,
    precision: PrecisionChoice = PrecisionOpt,
    knob: list[str] | None = KnobOpt,
    gpu_set: list[str] | None = GpuSetOpt,
    profile: str | None = ProfileOpt,
    target: list[Target] | None = typer.Option(None, "--target", "-t", help="Files to generate, repeat for "
                                               "several: megatron, torchrun, slurm (= sbatch), k8s (= pytorchjob, "
                                               "Kubeflow v1, legacy), trainjob (Kubeflow Trainer v2), bridge "
                                               "(Megatron-Bridge recipe + overrides), all (the default)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Directory to write into (created)."),
    site: str | None = typer.Option(None, "--site", help="Site profile YAML (partition, account, "
                                    "container_image, container_mounts, modules, env, kubernetes, ...)."),
    print_site_template: bool = typer.Option(False, "--print-site-template", help="Print a commented "
                                             "site.yaml with every key and exit."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files in --out."),
    flags: LayoutFlags = NO_FLAGS,
) -> None:
    """Write launch files for one layout: megatron_args.sh, env.sh, torchrun.sh, job.sbatch,
    pytorchjob.yaml and manifest.json (layout, prediction, candidate id).

    Also trainjob.yaml (Kubeflow Trainer v2; clustertrainingruntime.yaml and computedomain.yaml where
    needed) and, for models Megatron-Bridge has a recipe for, bridge_recipe.py + bridge_overrides.txt;
    --print-site-template prints a commented site.yaml.

    The layout comes from --plan (and --rank) or from the same flags as ``paraplan estimate``;
    it is validated and estimated first, and nothing is written when it breaks a rule.
    Example: paraplan launch --model llama3-70b --gpu h100-80gb --num-gpus 64 --tp 4 --pp 4
    --cp 2 --seq-len 8192 --gbs 512 --target slurm --out runs/llama70b --site site.yaml
    """
    if print_site_template:
        from paraplan.api import SITE_TEMPLATE

        typer.echo(SITE_TEMPLATE, nl=False)
        return
    if out is None or not out.strip():
        raise SpecError("launch needs --out DIR (the directory to write the launch files into; an empty name is "
                        "not one)")
    site_profile = load_site(site)
    options, alloc_note = site_memory_options(site_profile.env, MemoryOptions(), fragmentation_given=False)
    if plan is not None:
        if knob:
            raise SpecError("--plan carries the training spec and its knobs; drop --knob (or drop --plan)")
        spec, result = _from_plan(plan, rank, options if alloc_note else None)
    else:
        missing = [f"--{n}" for n, v in (("model", model), ("gpu", gpu), ("num-gpus", num_gpus),
                                         ("seq-len", seq_len), ("gbs", gbs)) if v is None]
        if missing:
            raise SpecError(f"launch needs --plan plan.json or the layout flags; missing {', '.join(missing)}")
        assert model is not None and gpu is not None and num_gpus is not None
        assert seq_len is not None and gbs is not None
        inputs = resolve_inputs(model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                                seq_len=seq_len, gbs=gbs, precision=precision.value, gpu_set=gpu_set,
                                profile=profile, knobs=knob)
        layout, notes = flags.layout(num_gpus, inputs.model)
        notes = [*notes, *knob_notes(inputs.model, inputs.training, layout)]
        result = run_estimate(inputs.model, inputs.cluster, layout=layout, training=inputs.training, notes=notes,
                              memory_options=options if alloc_note else None)
        spec = LaunchSpec(model=inputs.model, cluster=inputs.cluster, training=inputs.training,
                          layout=layout, prediction=result.to_dict())
    advice = advise(result, site_profile.storage(), site_profile.failures())
    ckpt = CheckpointArgs(save_interval_iters=advice.save_interval_iters, ckpt_format=advice.size.ckpt_format,
                          async_save=advice.timing.async_save, reason=advice.reason())
    spec = replace(spec, site=site_profile, checkpoint=ckpt)
    files = render_files(spec, list(dict.fromkeys(t.value for t in (target or [Target.all]))))
    paths = write_files(files, out, force=force)
    con = console()
    con.print(f"candidate {candidate_id(spec)}: {spec.layout.short()} | peak "
              f"{result.peak_bytes / GIB:.1f} GiB of {result.usable_bytes / GIB:.1f} GiB | "
              f"MFU {100 * float(result.throughput.mfu):.1f}%")
    con.print(f"checkpoint: --save-interval {ckpt.save_interval_iters} ({advice.reason()})", soft_wrap=True)
    if not result.fits:
        con.print("[red]warning:[/] the predicted peak memory does not fit this GPU")
    if alloc_note is not None:
        con.print(f"note: {safe(alloc_note)}", soft_wrap=True)
    if (ub_note := ub_cfg_ignored_note(spec.training, spec.layout)) is not None:
        con.print(f"note: {safe(ub_note)}", soft_wrap=True)
    written = json.loads(files["manifest.json"])
    for line in _manifest_notes(written):
        con.print(f"note: {safe(line)}", soft_wrap=True)
    for warning in written.get("warnings", []):
        con.print(f"[yellow]warning:[/] {safe(warning)}", soft_wrap=True)
    gaps = written.get("bridge_overrides_not_set", [])
    if gaps:
        con.print(f"note: bridge_overrides.txt cannot set {safe(', '.join(gaps))} (bridge_recipe.py does): the base "
                  "recipe's mixed_precision is a preset name, or Bridge's override parser has no name for the "
                  "dtype or does not read an enum", soft_wrap=True)
    for path in paths:
        con.print(f"wrote {safe(path)}")


def _manifest_notes(written: dict[str, object]) -> list[str]:
    """The targets not written (grouped by reason) and the flags left out, from manifest.json."""
    by_reason: dict[str, list[str]] = {}
    skipped = written.get("skipped_targets", {})
    for target_name, reason in (skipped.items() if isinstance(skipped, dict) else ()):
        by_reason.setdefault(str(reason), []).append(str(target_name))
    left_out = written.get("left_out", [])
    return [*(f"{', '.join(names)} not written: {reason}" for reason, names in by_reason.items()),
            *(str(x) for x in (left_out if isinstance(left_out, list) else ()))]
