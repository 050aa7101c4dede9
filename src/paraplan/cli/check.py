"""``paraplan check SCRIPT``: read a Megatron launch script, list the rules it breaks, estimate it."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from paraplan.api import CheckResult, check_parsed, dumps_json, parse_file, parse_headroom, suggest_alternative
from paraplan.cli._app import app, state
from paraplan.cli.options import (
    GPU_HELP,
    FormatOpt,
    GpuSetOpt,
    GpusPerNodeOpt,
    HeadroomOpt,
    OutputFormat,
    OwnKnobOpt,
    ProfileOpt,
    own_knob_fields,
    resolve_gpu,
)
from paraplan.cli.render import console, render_estimate, safe

DEFAULT_GPU = "h100-80gb"

__all__ = ["check", "render_check", "suggest_alternative"]


def render_check(result: CheckResult, script: str) -> None:
    """Rules, unknown flags, defaults, notes, then the estimate (or why there is none)."""
    con = console()
    p = result.parsed
    launcher = " ".join(p.launcher) if p.launcher else "(no launcher: --num-gpus or the default)"
    con.print(f"[bold]{safe(script)}[/]: {safe(result.model.name)} | {result.cluster.num_gpus} x "
              f"{safe(result.cluster.gpu.name)} | {result.layout.short()} | seq {result.training.seq_len}, "
              f"GBS {result.training.global_batch_size}, {result.training.precision}")
    con.print(f"launcher: {escape(launcher)}")
    if result.violations:
        con.print(f"[red]{len(result.violations)} rule(s) broken:[/]")
        for code, message in result.violations:
            con.print(f"  [red]{code}[/] {escape(message)}")
    else:
        con.print("[green]no Megatron rule broken[/]")
    if p.unknown_flags:
        con.print("unknown flags (not in Megatron-LM): " + escape(" ".join(p.unknown_flags)))
    for line in p.defaults_applied:
        con.print(f"[dim]default:[/] {escape(line)}")
    if result.estimate is not None:
        render_estimate(result.estimate)
    else:
        for note in p.flags.notes:
            con.print(f"[yellow]note:[/] {escape(note)}")
        con.print("no estimate: fix the broken rules first")
    if result.alternative is not None:
        alt = result.alternative
        if alt.get("layout") is None:
            con.print(f"plan finds no layout that fits: {escape(str(alt.get('reason', '')))}")
        elif alt.get("same_as_script") or (alt.get("predicted_gain") is not None and alt["predicted_gain"] < 0.01):
            con.print(f"plan's best layout ({escape(alt['layout'])}) is within 1% of this script's")
        else:
            gain = alt.get("predicted_gain")
            gain_text = f" ({100 * gain:+.1f}% tokens/s/GPU)" if gain is not None else ""
            con.print(f"plan would choose instead: [bold]{escape(alt['layout'])}[/] at "
                      f"{alt['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU{gain_text}; estimate flags: "
                      f"{escape(alt['estimate_flags'])}")


@app.command("check")
def check(
    script: str = typer.Argument(..., help="Shell script, Slurm batch file or arguments file with a "
                                 "pretrain_gpt.py command line (torchrun/srun/python), or a Kubeflow "
                                 "TrainJob / PyTorchJob YAML (its trainer container's command and args)."),
    num_gpus: int | None = typer.Option(None, "--num-gpus", "-n",
                                        help="World size (default: from torchrun/srun/#SBATCH)."),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", "-g", help=GPU_HELP),
    gpus_per_node: int | None = GpusPerNodeOpt,
    gpu_set: list[str] | None = GpuSetOpt,
    profile: str | None = ProfileOpt,
    headroom: str | None = HeadroomOpt,
    knob: list[str] | None = OwnKnobOpt,
    fmt: OutputFormat = FormatOpt,
) -> None:
    """Read a Megatron-LM launch script: broken rules (Megatron's wording), unknown flags,
    defaults applied, memory and throughput. Exit code 1 when a rule is broken.

    Exit code 4 when the layout does not fit in usable memory (a warning, exit 0, when it fits only
    inside the --headroom margin).

    Example: paraplan check train_llama3_8b.sh --gpu h100-80gb
    """
    margin = parse_headroom(headroom)
    own = own_knob_fields(knob)
    parsed = parse_file(script)
    result = check_parsed(parsed, resolve_gpu(gpu, gpu_set, profile), num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                          headroom=margin, own_knobs=own)
    if fmt == OutputFormat.json:
        print(dumps_json({"script": script, **result.to_dict()}))
    else:
        render_check(result, script)
    if result.violations:
        n = len(result.violations)
        print(f"error: {n} Megatron rule{'s' * (n != 1)} broken (listed above)", file=sys.stderr)
        state.exit_code = 1
    elif result.estimate is not None and not result.estimate.fits:
        print(f"error: the layout does not fit: {result.estimate.fit_text.split(': ', 1)[1]}", file=sys.stderr)
        state.exit_code = 4
