"""``paraplan report``: one self-contained HTML file with the plan's plots (``paraplan.report``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from paraplan.api import Headroom, Plan, SearchSpace, parse_headroom
from paraplan.cli._app import app
from paraplan.cli.options import GPU_HELP, MODEL_HELP, ForceOpt, GpuSetOpt, HeadroomOpt, PrecisionChoice, ProfileOpt
from paraplan.cli.plan import (
    CpOpt,
    CrossOpt,
    DpOpt,
    EpOpt,
    MaxPpOpt,
    MbsOpt,
    ObjectiveChoice,
    PlanRequest,
    PpOpt,
    RecModOpt,
    RecOpt,
    TpOpt,
    TpOvOpt,
    VpOpt,
    check_top,
    run_plan,
    search_space,
)
from paraplan.cli.render import console, safe
from paraplan.errors import SpecError

PROGRESS_DELAY_S = 0.4
"""The progress bar appears only when the work takes longer than this."""


@contextmanager
def progress(total: int, delay_s: float = PROGRESS_DELAY_S) -> Iterator[Callable[[str], None]]:
    """A transient progress bar on stderr, shown once the work takes more than ``delay_s``.

    Yields ``step(description)``: finishes the previous step and names the next one. Nothing is drawn
    when stderr is not a terminal (pipes, CI logs).
    """
    con = Console(stderr=True)
    if not con.is_terminal:
        yield lambda _description: None
        return
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                   console=con, transient=True)
    task = bar.add_task("starting", total=total)
    lock = threading.Lock()
    state = {"done": False, "steps": 0}

    def show() -> None:
        with lock:
            if not state["done"]:
                bar.start()

    def step(description: str) -> None:
        bar.update(task, description=description, completed=state["steps"])
        state["steps"] += 1

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield step
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
        bar.stop()


def plan_from_file(path: str | Path, top: int, objective: str | None, space: SearchSpace,
                   headroom: Headroom | None = None) -> Plan:
    """Re-run the search from plan.json's resolved inputs and its search space (unless search flags are
    given here; plan.json keeps only the top layouts) and put plan.json's own layouts, re-estimated,
    first."""
    from paraplan.api import estimate, load_plan, plan, search_space_from

    loaded = load_plan(path)
    saved = search_space_from(loaded.document)
    if saved is not None and space == SearchSpace():  # no search flags here: the plan's own search
        space = saved
    obj = objective or str(loaded.document.get("plan", {}).get("objective", "throughput"))
    p = plan(loaded.model, loaded.cluster, training=loaded.training, space=space, objective=obj,  # type: ignore[arg-type]
             top_k=top, headroom=headroom)
    if not loaded.layouts:
        return p
    ests = tuple(replace(estimate(loaded.model, loaded.cluster, layout=lay, training=loaded.training),
                         headroom=p.headroom)
                 for lay in loaded.layouts[:top])
    return replace(p, candidates=ests)


_PLAN = typer.Option(None, "--plan", help="plan.json from `paraplan plan --save`: its model, cluster, training, "
                     "top layouts and search space (instead of the plan flags; search flags given here replace "
                     "the saved search space).")
_OUT = typer.Option(..., "--output", "-o", help="HTML file to write (written atomically).")
_LOG = typer.Option(None, "--log", help="Training log or TensorBoard event file of a run (repeatable): adds "
                                        "predicted vs measured and the diagnosis of `paraplan tune`.")
_COMPARE = typer.Option(1, "--compare", "--rank", min=1, help="Which top layout the logged run used (1 = the best).")
_SKIP = typer.Option(1, "--skip-warmup", min=0, help="Iteration records to drop at the start of each log.")


@app.command("report")
def report_cmd(
    output: str = _OUT, plan_file: str | None = _PLAN,
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help=GPU_HELP),
    num_gpus: int | None = typer.Option(None, "--num-gpus", "-n", help="World size (GPUs)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the preset's)."),
    seq_len: int | None = typer.Option(None, "--seq-len", "-s", help="Sequence length (tokens)."),
    gbs: int | None = typer.Option(None, "--gbs", help="Global batch size (sequences)."),
    precision: PrecisionChoice = typer.Option(PrecisionChoice.bf16, "--precision", help="GEMM precision."),
    top: int = typer.Option(5, "--top", "-k", help="How many top layouts to show and highlight."),
    objective: ObjectiveChoice | None = typer.Option(None, "--objective",
                                                     help="Rank by throughput (default) or memory headroom."),
    tp: str | None = TpOpt, pp: str | None = PpOpt, vp: str | None = VpOpt, cp: str | None = CpOpt,
    ep: str | None = EpOpt, mbs: str | None = MbsOpt, max_pp: int | None = MaxPpOpt, recompute: str | None = RecOpt,
    dp_variant: str | None = DpOpt, allow_cross_node: bool = CrossOpt, tp_comm_overlap: bool = TpOvOpt,
    recompute_modules: str | None = RecModOpt, gpu_set: list[str] | None = GpuSetOpt, profile: str | None = ProfileOpt,
    log: list[str] | None = _LOG, compare: int = _COMPARE, skip_warmup: int = _SKIP, force: bool = ForceOpt,
    headroom: str | None = HeadroomOpt,
) -> None:
    """Write an HTML report: candidate landscape, memory per stage, step time, pipeline schedule.

    One self-contained file (plotly.js embedded): it opens offline and can be archived with the run.
    With --log, the page adds the run's predicted vs measured numbers and the `paraplan tune` diagnosis.

    Example: paraplan report --model llama3-70b --gpu h100-80gb --num-gpus 64 --seq-len 8192 --gbs 512 -o report.html

    Example: paraplan report --plan plan.json --log train.log -o report.html
    """
    from paraplan.api import (
        RunInputs,
        build_context,
        charts,
        check_output_file,
        explain,
        render_html,
        write_text_atomic,
    )
    from paraplan.cli.tune import _refs

    check_output_file(output, "--output", force=force)
    check_top(top)
    flags = {"--model": model, "--gpu": gpu, "--num-gpus": num_gpus, "--seq-len": seq_len, "--gbs": gbs}
    if plan_file is None and any(v is None for v in flags.values()):
        missing = ", ".join(k for k, v in flags.items() if v is None)
        raise SpecError(f"report: give --plan plan.json, or the plan flags (missing {missing})")
    if plan_file is not None and any(v for v in (model, gpu, num_gpus, seq_len, gbs, gpus_per_node, gpu_set, profile)):
        raise SpecError("report: --plan already holds the resolved inputs; drop --model/--gpu/--num-gpus/"
                        "--gpus-per-node/--seq-len/--gbs/--gpu-set/--profile")
    with progress(6) as step:
        step("reading logs")
        runlog = None
        if log:
            from paraplan.api import read_logs

            runlog = read_logs(list(log))
        step("searching layouts")
        if plan_file is not None:
            space = search_space(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, mbs=mbs, max_pp=max_pp, recompute=recompute,
                                 dp_variant=dp_variant, allow_cross_node=allow_cross_node,
                                 tp_comm_overlap=tp_comm_overlap, recompute_modules=recompute_modules)
            p = plan_from_file(plan_file, top, objective.value if objective else None, space, parse_headroom(headroom))
        else:
            assert model is not None and gpu is not None and num_gpus is not None  # checked above (None only)
            assert seq_len is not None and gbs is not None
            p = run_plan(PlanRequest(
                model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node, seq_len=seq_len, gbs=gbs,
                precision=precision.value, gpu_set=gpu_set, profile=profile, top=top,
                objective=(objective or ObjectiveChoice.throughput).value, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, mbs=mbs,
                max_pp=max_pp, recompute=recompute, dp_variant=dp_variant, allow_cross_node=allow_cross_node,
                tp_comm_overlap=tp_comm_overlap, recompute_modules=recompute_modules, headroom=headroom))
        step("explaining")
        findings = explain(p)
        step("simulating pipeline schedules" + (" and diagnosing the run" if runlog is not None else ""))
        refs = _refs(RunInputs(model=p.model, cluster=p.cluster, training=p.training,
                               layout=p.candidates[0].layout), model, gpu) if runlog is not None else (None, None)
        ctx = build_context(p, findings=findings, log=runlog, compare_rank=compare, skip_warmup=skip_warmup,
                            model_ref=refs[0], gpu_ref=refs[1], profile=profile)
        step("drawing charts")
        html = render_html(ctx, charts(ctx))
        step(f"writing {output}")
        write_text_atomic(output, html, option="--output", force=force)
    size = len(html.encode("utf-8"))
    console().print(f"wrote {safe(output)} ({size / 1e6:.1f} MB): {len(ctx.top)} top layouts of {ctx.num_feasible:,} "
                    f"that fit ({ctx.num_evaluated:,} evaluated), {len(ctx.schedules)} pipeline schedule(s)"
                    + (f", predicted vs measured with {len(ctx.measured.diagnosis)} diagnosis finding(s)"
                       if ctx.measured else ""))
