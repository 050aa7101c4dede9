"""``paraplan calibrate``: fit the efficiency parameters to measured runs and write a cluster profile."""

from __future__ import annotations

import typer
from rich.table import Table

from paraplan.api import (
    DEFAULT_PARAMS,
    PARAM_BOUNDS,
    ErrorStats,
    FitResult,
    GpuSpec,
    Run,
    dumps_json,
    error_stats,
    fit_profile,
    load_gpu,
    predict_step_s,
    profile_document,
    read_pair,
    read_runs_csv,
    write_profile,
)
from paraplan.cli._app import app
from paraplan.cli.options import ForceOpt, FormatOpt, OutputFormat
from paraplan.cli.render import console, safe
from paraplan.errors import SpecError


def split_pair(text: str) -> tuple[str, list[str]]:
    """``manifest.json:log1[,log2]`` -> (manifest, logs); split after ``.json:`` when present."""
    cut = text.find(".json:")
    head, tail = (text[: cut + 5], text[cut + 6 :]) if cut >= 0 else text.rpartition(":")[::2]
    logs = [x for x in tail.split(",") if x]
    if not head or not logs:
        raise SpecError(f"--pair expects manifest.json:log.txt, got '{text}'")
    return head, logs


def _params(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_PARAMS
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    for n in names:
        if n not in PARAM_BOUNDS:
            raise SpecError(f"--params: unknown '{n}' (allowed: {', '.join(PARAM_BOUNDS)})")
    return names


def leave_one_out(runs: list[Run], gpu: GpuSpec, params: tuple[str, ...]) -> tuple[ErrorStats, ErrorStats]:
    """Hold-out error: every run predicted by a fit on the other runs (before: the preset)."""
    if len(runs) < 2:
        raise SpecError("--cross-validate needs at least 2 runs")
    after = [predict_step_s(r, fit_profile(runs[:i] + runs[i + 1 :], gpu, params).efficiency)
             for i, r in enumerate(runs)]
    measured = [r.measured_step_s for r in runs]
    return error_stats([predict_step_s(r, gpu.efficiency) for r in runs], measured), error_stats(after, measured)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _render(res: FitResult, out: str) -> None:
    con = console()
    err = Table(title=f"step-time error on {res.before.n} run(s), {res.gpu}")
    for col in ("", "median", "mean", "max", "RMS log"):
        err.add_column(col, justify="right")
    for label, s in (("before (preset)", res.before), ("after (fitted)", res.after)):
        err.add_row(label, _pct(s.median_abs), _pct(s.mean_abs), _pct(s.max_abs), f"{s.rms_log:.3f}")
    con.print(err)
    par = Table(title="efficiency parameters")
    for col in ("parameter", "preset", "fitted", "bounds"):
        par.add_column(col, justify="right")
    for name, value in res.fitted.items():
        lo, hi = PARAM_BOUNDS[name]
        par.add_row(name, f"{res.start[name]:.4g}", f"{value:.4g}", f"[{lo:g}, {hi:g}]")
    con.print(par)
    runs = Table(title="runs")
    for col in ("run", "measured", "before", "after"):
        runs.add_column(col, justify="right")
    for label, meas, before, after in res.per_run:
        runs.add_row(label, f"{meas:.4g} s", f"{before:.4g} s ({100 * (before / meas - 1):+.0f}%)",
                     f"{after:.4g} s ({100 * (after / meas - 1):+.0f}%)")
    con.print(runs)
    if res.before.n < len(res.fitted):
        con.print(f"[yellow]note:[/] {res.before.n} run(s) for {len(res.fitted)} parameters: the fit leans on the "
                  "preset values; add runs with other layouts (TP, PP, DP sizes) to pin them down", soft_wrap=True)
    con.print(f"wrote {safe(out)}: use it with --profile {safe(out)} on any command", soft_wrap=True)  # path whole


@app.command("calibrate")
def calibrate(
    runs: str | None = typer.Option(
        None, "--runs", help="CSV of measured runs: model, num_gpus, tp, pp, mbs, gbs, seq_len and step_time_s or "
        "tokens_per_s_per_gpu; optional gpu, gpus_per_node, vp, cp, ep, etp, recompute, precision, sequence_parallel, "
        "distributed_optimizer, overlap_grad_reduce, overlap_param_gather, fsdp, tp_comm_overlap, label."),
    pair: list[str] | None = typer.Option(None, "--pair", help="manifest.json:log.txt of a run (repeat; several "
                                          "logs of one run: manifest.json:a.log,b.log)."),
    gpu: str = typer.Option(..., "--gpu", "-g", help="GPU preset (or file) the runs used."),
    out: str = typer.Option(..., "--out", "-o", help="Cluster profile YAML to write."),
    params: str | None = typer.Option(None, "--params", help="Parameters to fit, comma-separated (default: "
                                      f"{', '.join(DEFAULT_PARAMS)})."),
    source: str | None = typer.Option(None, "--source", help="Free text stored as the profile's source."),
    skip_warmup: int = typer.Option(1, "--skip-warmup", help="Iteration records to skip per log segment."),
    cross_validate: bool = typer.Option(False, "--cross-validate",
                                        help="Also report leave-one-out error (each run predicted without it)."),
    fmt: OutputFormat = FormatOpt, force: bool = ForceOpt,
) -> None:
    """Fit GEMM, collective and overlap efficiencies to measured runs; write a profile for --profile.

    Example: paraplan calibrate --runs runs.csv --gpu h100-80gb --out cluster-profile.yaml
    """
    if runs is None and not pair:  # an empty --runs "" is read (and refused) as a file name
        raise SpecError("calibrate: give --runs runs.csv or at least one --pair manifest.json:log.txt")
    from paraplan.api import check_output_file

    check_output_file(out, "--out", force=force)
    names = _params(params)
    spec = load_gpu(gpu)
    measured: list[Run] = read_runs_csv(runs, spec) if runs is not None else []
    for text in pair or []:
        man, logs = split_pair(text)
        measured.append(read_pair(man, logs, skip_warmup=skip_warmup, gpu=spec))
    res = fit_profile(measured, spec, names)
    loo = leave_one_out(measured, spec, names) if cross_validate else None  # its errors before the profile is written
    write_profile(out, res, source or "", option="--out", force=force)
    if fmt == OutputFormat.json:
        doc = profile_document(res, source or "")
        doc["runs"] = [{"label": lb, "measured_s": m, "before_s": b, "after_s": a} for lb, m, b, a in res.per_run]
        doc["out"] = out
        if loo is not None:
            doc["leave_one_out"] = {"before": loo[0].as_dict(), "after": loo[1].as_dict()}
        print(dumps_json(doc))
    else:
        _render(res, out)
        if loo is not None:
            console().print(f"leave-one-out (each run predicted by a fit on the others): median error "
                            f"{_pct(loo[0].median_abs)} with the preset -> {_pct(loo[1].median_abs)} fitted, max "
                            f"{_pct(loo[0].max_abs)} -> {_pct(loo[1].max_abs)}", soft_wrap=True)
