"""Fit the performance model's efficiency parameters to a cluster's measured runs (``paraplan calibrate``).

Runs come from a CSV file (``read_runs_csv``) or from launch manifests joined with their logs
(``read_pair``). The fit minimises a soft-L1 loss on log(predicted / measured step time), plus a weak
pull toward the GPU preset's values (so that three runs and six parameters stay well posed),
with a bounded Nelder-Mead search in numpy (no scipy at run time) over parameters scaled to [0, 1]
within physical bounds (the same bounds as ``benchmarks/fit_efficiency.py``). The result is
written as a cluster profile that every command reads with ``--profile`` (``paraplan.specs.profile``).

runs.csv columns (header names; one run per row, ``#`` lines ignored):
    required  model (preset or config file, relative to the CSV), num_gpus, tp, pp, mbs, gbs, seq_len,
              and step_time_s or tokens_per_s_per_gpu (the measured step or throughput)
    optional  gpu (default: --gpu; must match it), gpus_per_node, vp, cp, ep (default 1), etp (default TP),
              recompute (none|selective|full, default selective), precision (bf16|fp8, default bf16),
              sequence_parallel, distributed_optimizer, overlap_grad_reduce, overlap_param_gather
              (default true), fsdp, tp_comm_overlap (default false), label
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray

from paraplan.errors import LayoutError, PlannerError, SpecError
from paraplan.estimate.step_time import step_time
from paraplan.fileio import brief, path_exists, read_input_text, read_json, write_text_atomic
from paraplan.layout import ParallelLayout
from paraplan.rules import check_layout
from paraplan.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, make_cluster
from paraplan.specs.load import load_gpu, load_model, model_from_megatron_args, validate_fields
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec
from paraplan.units import GIB

PARAM_BOUNDS: dict[str, tuple[float, float]] = {  # physical bounds of every fittable EfficiencySpec field
    "gemm_max_frac": (0.3, 0.95), "gemm_half_dim": (32.0, 600.0), "attention_frac": (0.2, 0.75),
    "fp8_gemm_speedup": (1.0, 2.0), "hbm_frac": (0.4, 0.95), "elementwise_bytes_per_token_hidden": (10.0, 200.0),
    "nvlink_bus_frac": (0.3, 0.95), "network_bus_frac": (0.2, 0.98), "collective_latency_s": (1e-6, 2e-4),
    "layer_overhead_s": (0.0, 1e-3), "step_overhead_s": (0.0, 5.0), "tp_overlap_frac": (0.0, 0.9),
    "dp_overlap_frac": (0.0, 0.95), "cp_overlap_frac": (0.0, 0.95),
    "pp_overlap_frac": (0.0, 0.95), "ep_overlap_frac": (0.0, 0.9), "moe_overhead_frac": (0.0, 3.0),
    "host_op_issue_s": (0.0, 2e-4),  # as benchmarks/fit_efficiency.py PARAMS
}
DEFAULT_PARAMS = ("gemm_max_frac", "attention_frac", "nvlink_bus_frac", "network_bus_frac", "dp_overlap_frac",
                  "step_overhead_s")
"""GEMM, collectives, overlap and the fixed per-step cost: what a few runs of one cluster pin down."""
SOFT_L1_SCALE = 0.1
"""Log errors beyond ~10% count linearly, not squared (one odd run does not dominate)."""
REQUIRED_COLUMNS = ("model", "num_gpus", "tp", "pp", "mbs", "gbs", "seq_len")


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run: what ran, and its measured step time."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: ParallelLayout
    measured_step_s: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Errors of predicted vs measured step time over runs (fractions: 0.1 = 10%)."""

    n: int
    median_abs: float
    mean_abs: float
    max_abs: float
    rms_log: float

    def as_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class FitResult:
    """Fitted efficiency parameters, and the error before and after on the runs fitted."""

    gpu: str
    efficiency: EfficiencySpec
    fitted: dict[str, float]
    start: dict[str, float]
    before: ErrorStats
    after: ErrorStats
    per_run: tuple[tuple[str, float, float, float], ...]  # (label, measured, predicted before, after) per run
    evaluations: int


IMPOSSIBLE_PEAK_FRAC = 1.3
"""A run predicted above 1.3 x the usable memory is refused: beyond the memory model's p90 error
against Megatron-LM's CI (23.4% dense, benchmarks/memory.py), so the row, not the model, is wrong."""


def make_run(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: ParallelLayout,
             measured_step_s: float, label: str = "") -> Run:
    """A validated run: LayoutError if Megatron would reject the layout (layout and flag rules),
    SpecError if paraplan's memory model puts it more than ``IMPOSSIBLE_PEAK_FRAC`` over the GPU
    (a row that cannot describe a run that happened)."""
    from paraplan.estimator import estimate
    from paraplan.launch.megatron import launch_violations

    if not measured_step_s > 0 or not math.isfinite(measured_step_s):
        raise SpecError(f"{label or 'run'}: measured step time must be > 0, got {measured_step_s}")
    check_layout(model, training, cluster, layout)
    broken = launch_violations(model, layout, training, cluster.gpu.arch)
    if broken:
        raise LayoutError(f"{label or 'run'}: {broken[0][1]}", reason=broken[0][0])
    est = estimate(model, cluster, training, layout)
    if est.peak_bytes > IMPOSSIBLE_PEAK_FRAC * est.usable_bytes:
        raise SpecError(f"{label or 'run'}: paraplan predicts {est.peak_bytes / GIB:.0f} GiB per GPU, more than "
                        f"{IMPOSSIBLE_PEAK_FRAC:.1f} x the {est.usable_bytes / GIB:.0f} GiB usable: this layout "
                        "could not have run (check the row's model, GPU count and layout)")
    return Run(model, cluster, training, layout, float(measured_step_s), label)


def predict_step_s(run: Run, efficiency: EfficiencySpec) -> float:
    """Predicted step time of a run with other efficiency parameters."""
    cluster = replace(run.cluster, gpu=replace(run.cluster.gpu, efficiency=efficiency))
    m = run.layout.num_microbatches(run.training.global_batch_size)
    return float(step_time(run.model, cluster, run.training, run.layout, num_microbatches=m).step_s)


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> ErrorStats:
    """Absolute relative errors and RMS log error."""
    rel = np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)
    logs = np.log(np.asarray(predicted) / np.asarray(measured))
    return ErrorStats(n=len(rel), median_abs=float(np.median(rel)), mean_abs=float(np.mean(rel)),
                      max_abs=float(np.max(rel)), rms_log=float(np.sqrt(np.mean(logs**2))))


def evaluate(runs: Sequence[Run], efficiency: EfficiencySpec) -> ErrorStats:
    """Prediction error of ``efficiency`` on ``runs`` (e.g. held-out runs)."""
    return error_stats([predict_step_s(r, efficiency) for r in runs], [r.measured_step_s for r in runs])


def nelder_mead(f: Callable[[NDArray[np.float64]], float], x0: NDArray[np.float64], *, step: float = 0.15,
                max_evals: int = 800, tol: float = 1e-9) -> tuple[NDArray[np.float64], float, int]:
    """Minimise ``f`` over the unit box [0, 1]^n with Nelder-Mead, points projected into the box.

    Standard coefficients (reflection 1, expansion 2, contraction 0.5, shrink 0.5); stops when the
    simplex values spread less than ``tol`` or after ``max_evals`` evaluations. Returns (x, f(x), evals).
    """
    n = len(x0)
    pts = [np.clip(x0, 0.0, 1.0)]
    for i in range(n):
        p = pts[0].copy()
        p[i] = p[i] + step if p[i] + step <= 1.0 else p[i] - step
        pts.append(p)
    simplex, evals = np.array(pts), n + 1
    vals = np.array([f(p) for p in simplex])

    def at(p: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
        nonlocal evals
        evals += 1
        q = np.clip(p, 0.0, 1.0)
        return q, f(q)

    while evals < max_evals:
        order = np.argsort(vals)
        simplex, vals = simplex[order], vals[order]
        if vals[-1] - vals[0] < tol and np.max(np.abs(simplex - simplex[0])) < 1e-4:
            break
        c = simplex[:-1].mean(axis=0)
        xr, fr = at(c + (c - simplex[-1]))
        if fr < vals[0]:
            xe, fe = at(c + 2.0 * (xr - c))
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc, fc = at(c + 0.5 * (xr - c)) if fr < vals[-1] else at(c + 0.5 * (simplex[-1] - c))
            if fc < min(fr, vals[-1]):
                simplex[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    simplex[i], vals[i] = at(simplex[0] + 0.5 * (simplex[i] - simplex[0]))
    best = int(np.argmin(vals))
    return simplex[best], float(vals[best]), evals


def fit_profile(runs: Sequence[Run], gpu: GpuSpec, params: Sequence[str] = DEFAULT_PARAMS, *,
                prior_weight: float = 0.03, max_evals: int = 800) -> FitResult:
    """Fit ``params`` of ``gpu.efficiency`` to the runs' measured step times, starting from the preset."""
    if not runs:
        raise SpecError("calibrate: no runs to fit")
    bad = [p for p in params if p not in PARAM_BOUNDS]
    if bad or not params:
        raise SpecError(f"--params: unknown '{bad[0] if bad else ''}' (allowed: {', '.join(PARAM_BOUNDS)})")
    for r in runs:
        if r.cluster.gpu.name != gpu.name:
            raise SpecError(f"{r.label or 'run'}: gpu '{r.cluster.gpu.name}' differs from '{gpu.name}' "
                            "(a profile is fitted per GPU)")
    runs = [replace(r, cluster=replace(r.cluster, gpu=gpu)) for r in runs]
    lo = np.array([PARAM_BOUNDS[p][0] for p in params])
    span = np.array([PARAM_BOUNDS[p][1] for p in params]) - lo
    start = {p: float(getattr(gpu.efficiency, p)) for p in params}
    u0 = np.clip((np.array([start[p] for p in params]) - lo) / span, 0.0, 1.0)
    measured = np.array([r.measured_step_s for r in runs])

    def eff_at(u: NDArray[np.float64]) -> EfficiencySpec:
        return replace(gpu.efficiency, **{p: float(v) for p, v in zip(params, lo + u * span, strict=True)})

    def loss(u: NDArray[np.float64]) -> float:
        pred = np.array([predict_step_s(r, eff_at(u)) for r in runs])
        z = np.log(pred / measured) / SOFT_L1_SCALE
        return float(np.mean(2.0 * (np.sqrt(1.0 + z**2) - 1.0)) * SOFT_L1_SCALE**2
                     + prior_weight * np.mean((u - u0) ** 2))

    u, _, evals = nelder_mead(loss, u0, max_evals=max_evals)
    u, _, more = nelder_mead(loss, u, step=0.05, max_evals=max(max_evals // 4, 2 * len(params) + 2))
    eff = eff_at(u)
    before = [predict_step_s(r, gpu.efficiency) for r in runs]
    after = [predict_step_s(r, eff) for r in runs]
    return FitResult(
        gpu=gpu.name, efficiency=eff, fitted={p: float(getattr(eff, p)) for p in params}, start=start,
        before=error_stats(before, measured.tolist()), after=error_stats(after, measured.tolist()),
        per_run=tuple((r.label, r.measured_step_s, b, a) for r, b, a in zip(runs, before, after, strict=True)),
        evaluations=evals + more)


def profile_document(result: FitResult, source: str = "") -> dict[str, Any]:
    """The cluster-profile mapping (``paraplan.specs.profile`` format plus a ``fit`` record)."""
    return {"gpu": result.gpu, "source": source or f"paraplan calibrate on {result.before.n} runs",
            "efficiency": {k: float(f"{v:.6g}") for k, v in result.fitted.items()},
            "fit": {"n": result.before.n, "params": list(result.fitted), "start": result.start,
                    "before": result.before.as_dict(), "after": result.after.as_dict(),
                    "metric": "step time: |predicted/measured - 1| (median, mean, max) and RMS of log ratio"}}


def write_profile(path: str | Path, result: FitResult, source: str = "", *, option: str = "output",
                  force: bool = False) -> None:
    """Write the profile YAML atomically (temporary file in the same folder, then rename; an existing
    file only with ``force``)."""
    write_text_atomic(path, yaml.safe_dump(profile_document(result, source), sort_keys=False), option=option,
                      force=force)


# Reading runs ------------------------------------------------------------------------------
_TRUE, _FALSE = ("true", "yes", "1", "on", "y"), ("false", "no", "0", "off", "n")
_DEFAULT_FLAGS = {"sequence_parallel": True, "distributed_optimizer": True, "overlap_grad_reduce": True,
                  "overlap_param_gather": True, "fsdp": False, "tp_comm_overlap": False}


def _cell(row: dict[str, str | None], key: str) -> str:
    return (row.get(key) or "").strip()


def _int(where: str, row: dict[str, str | None], key: str, default: int | None = None) -> int:
    raw = _cell(row, key)
    if not raw and default is not None:
        return default
    try:
        value = int(raw) if len(raw) < 20 else 0
    except ValueError:
        value = 0
    if value < 1:
        raise SpecError(f"{where}: column '{key}' must be a positive integer, got {brief(raw)}")
    return value


def _flag(where: str, row: dict[str, str | None], key: str) -> bool:
    raw = _cell(row, key).lower()
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    if raw:
        raise SpecError(f"{where}: column '{key}' must be true or false, got {brief(raw)}")
    return _DEFAULT_FLAGS[key]


def _row_run(where: str, row: dict[str, str | None], base: Path, gpu: GpuSpec | None) -> Run:
    gpu_ref = _cell(row, "gpu")
    if not gpu_ref and gpu is None:
        raise SpecError(f"{where}: column 'gpu' is empty and no --gpu was given")
    spec = load_gpu(gpu_ref) if gpu_ref else gpu
    assert spec is not None
    if gpu is not None and spec.name != gpu.name:
        raise SpecError(f"{where}: gpu '{spec.name}' differs from --gpu {gpu.name} (a profile is fitted per GPU)")
    ref = _cell(row, "model")
    model = load_model(str(base / ref) if path_exists(base / ref) else ref)
    n = _int(where, row, "num_gpus")
    per_node = _int(where, row, "gpus_per_node", 0) if _cell(row, "gpus_per_node") else None
    cluster = make_cluster(gpu or spec, n, per_node)
    precision = _cell(row, "precision") or "bf16"
    training = TrainingSpec(seq_len=_int(where, row, "seq_len"), global_batch_size=_int(where, row, "gbs"),
                            precision=precision)  # type: ignore[arg-type]
    tp, pp, cp = _int(where, row, "tp"), _int(where, row, "pp"), _int(where, row, "cp", 1)
    if n % (tp * pp * cp):
        raise SpecError(f"{where}: num_gpus {n} is not divisible by TP {tp} x PP {pp} x CP {cp}")
    flags = {k: _flag(where, row, k) for k in _DEFAULT_FLAGS}
    flags["overlap_param_gather"] = flags["overlap_param_gather"] and (flags["distributed_optimizer"] or flags["fsdp"])
    layout = ParallelLayout(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), vp=_int(where, row, "vp", 1),
                            ep=_int(where, row, "ep", 1), etp=_int(where, row, "etp", tp), mbs=_int(where, row, "mbs"),
                            recompute=_cell(row, "recompute") or "selective", **flags)  # type: ignore[arg-type]
    step_raw, tok_raw = _cell(row, "step_time_s"), _cell(row, "tokens_per_s_per_gpu")
    try:
        step = float(step_raw) if step_raw else training.tokens_per_step / (float(tok_raw) * n) if tok_raw else None
    except (ValueError, ZeroDivisionError, OverflowError):
        raise SpecError(f"{where}: step_time_s / tokens_per_s_per_gpu must be positive numbers") from None
    if step is None:  # the header has one of the two columns, this row left it empty
        raise SpecError(f"{where}: needs column 'step_time_s' or 'tokens_per_s_per_gpu'")
    return make_run(model, cluster, training, layout, step, _cell(row, "label") or where)


def read_runs_csv(path: str | Path, gpu: GpuSpec | None = None) -> list[Run]:
    """Runs from a CSV file (columns in the module docstring); SpecError naming the line and column."""
    p = Path(path)
    text = read_input_text(path, "runs")  # strict UTF-8 (a byte-order mark dropped); "" refused, not read as '.'
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    reader = csv.DictReader(lines)
    try:
        return _read_rows(p, reader, gpu)
    except csv.Error as err:
        raise SpecError(f"{p.name} line {reader.line_num}: not a valid CSV row ({err})") from None


def _read_rows(p: Path, reader: csv.DictReader[str], gpu: GpuSpec | None) -> list[Run]:
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing or not ({"step_time_s", "tokens_per_s_per_gpu"} & set(header)):
        need = missing[0] if missing else "step_time_s' or 'tokens_per_s_per_gpu"
        raise SpecError(f"{p.name}: missing column '{need}' (required: {', '.join(REQUIRED_COLUMNS)}, "
                        "step_time_s or tokens_per_s_per_gpu)")
    runs = []
    for i, row in enumerate(reader, start=2):
        clean = {(k or "").strip(): v for k, v in row.items()}
        where = f"{p.name} row {i}"
        try:
            runs.append(_row_run(where, clean, p.parent, gpu))
        except LayoutError as err:
            if str(err).startswith(where):
                raise
            raise LayoutError(f"{where}: {err}", reason=err.reason) from None
        except SpecError as err:
            if str(err).startswith(where):
                raise
            raise SpecError(f"{where}: {err}") from None
    if not runs:
        raise SpecError(f"{p.name}: no runs")
    return runs


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a launch manifest (or plan.json) says ran: specs, layout and paraplan's prediction then."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: ParallelLayout
    prediction: dict[str, Any] | None = None
    candidate_id: str | None = None


def layout_from_dict(data: dict[str, Any]) -> ParallelLayout:
    """ParallelLayout from a ``layout`` / ``config`` mapping, ignoring keys it does not know."""
    known = {f.name for f in fields(ParallelLayout)}
    kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known}
    return validate_fields(ParallelLayout, kw, "layout.")  # type: ignore[no-any-return]


def read_manifest(path: str | Path) -> RunInputs:
    """Read a launch directory's manifest.json (read defensively: SpecError naming the missing field)."""
    from paraplan.serialize import field_at

    p = Path(path)
    if path_exists(p) and p.is_dir():
        p = p / "manifest.json"
    doc = read_json(p, "manifest")
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != 1:
        raise SpecError(f"manifest: '{p}' has schema_version {brief(version)}; expected 1")
    try:
        model_raw = field_at(doc, "inputs.model", dict)
        model = model_from_megatron_args(model_raw, name=str(model_raw.get("name", "model")))
        inputs = doc["inputs"]
        cl = field_at(doc, "inputs.cluster", dict) if inputs.get("cluster") else {}
        if isinstance(inputs.get("gpu"), dict):
            raw = dict(inputs["gpu"])
            raw["efficiency"] = validate_fields(EfficiencySpec, field_at(doc, "inputs.gpu.efficiency", dict)
                                                if raw.get("efficiency") else {}, "gpu.efficiency.")
            gpu = validate_fields(GpuSpec, raw, "gpu.")
        else:
            gpu = load_gpu(field_at({"gpu": cl.get("gpu") or inputs.get("gpu")}, "gpu", str))
        num_gpus = field_at(doc, "inputs.num_gpus", int) if inputs.get("num_gpus") else field_at(cl, "num_gpus", int)
        per_node = inputs.get("gpus_per_node") or cl.get("gpus_per_node")
        cluster = make_cluster(gpu, num_gpus, None if per_node is None else field_at({"gpus_per_node": per_node},
                                                                                      "gpus_per_node", int))
        training = validate_fields(TrainingSpec, field_at(doc, "inputs.training", dict), "training.")
        lay = doc.get("layout") or inputs.get("layout") or field_at(doc, "prediction.config", dict)
        if not isinstance(lay, dict):
            raise SpecError(f"layout: expected an object, got {brief(lay)}")
        layout = layout_from_dict(lay)
    except SpecError as err:
        raise SpecError(f"manifest: {p.name}: {err}") from None
    prediction, cid = doc.get("prediction"), doc.get("candidate_id")
    return RunInputs(model=model, cluster=cluster, training=training, layout=layout,
                     prediction=prediction if isinstance(prediction, dict) else None,
                     candidate_id=cid if isinstance(cid, str) else None)


def read_pair(manifest: str | Path, logs: Sequence[str | Path], *, skip_warmup: int = 1,
              gpu: GpuSpec | None = None) -> Run:
    """A run from a manifest and its log(s): the median step time after warm-up."""
    from paraplan.ingest import read_logs

    inp = read_manifest(manifest)
    cluster = inp.cluster if gpu is None else make_cluster(gpu, inp.cluster.num_gpus, inp.cluster.gpus_per_node)
    if gpu is not None and inp.cluster.gpu.name != gpu.name:
        raise SpecError(f"manifest '{manifest}': gpu '{inp.cluster.gpu.name}' differs from --gpu {gpu.name}")
    try:
        log = read_logs([str(x) for x in logs])
    except PlannerError as err:
        raise SpecError(str(err)) from None
    step = log.summary(skip_warmup)["step_time_s"]["median"]
    if step is None:
        raise SpecError(f"log {', '.join(map(str, logs))}: no step time after {skip_warmup} warm-up record(s) "
                        "(--skip-warmup 0 accepts warm-up iterations)")
    return make_run(inp.model, cluster, inp.training, inp.layout, float(step), label=str(manifest))
