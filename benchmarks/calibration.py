#!/usr/bin/env python3
"""Calibration benchmark: predicted vs measured tokens/s/GPU on published Megatron runs.

Runs ``paraplan.estimator.estimate`` on every usable row of ../shared/calibration/
published_runs.csv (conversion rules in benchmarks/published_cases.py, following SOURCES.md),
prints a table per source, the vTrain A100 runs on their own line, and as the last line:

    calibration: median APE X%, p90 APE Y%, within-20% Z% over N rows

Before it, the cross-validated figures (benchmarks/cross_validate.py: every row predicted with the efficiency
parameters refitted per GPU architecture without it; 5-fold and leave-one-source-out), per source next to the
in-sample ones, and one line each:

    cross-validated (5-fold): median APE X%, p90 Y%, within-20% Z% over N rows
    cross-validated (leave-one-source-out): median APE X%, p90 Y%, within-20% Z% over N rows

They are read from src/paraplan/bands.json (benchmarks/bands.py writes both) when its inputs fingerprint matches
the model now; ``--cv`` recomputes them here (minutes: every fold is refitted).

Layer counts that do not divide over PP x VP get the balanced first/last-stage split the
published recipes use (``--pipeline-split auto``). Usage: python benchmarks/calibration.py
[--worst 10] [--no-vtrain] [--source TEXT] [--cv] [--by-container]

Rows whose source states a software regression (published_cases ``DOCUMENTED_REGRESSIONS``) are left out of every
figure and listed after the tables with the citation (``excluded ...``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from paraplan.cli.options import apply_pipeline_split  # noqa: E402
from paraplan.errors import PlannerError, SpecError  # noqa: E402
from paraplan.estimator import estimate  # noqa: E402
from paraplan.layout import ParallelLayout  # noqa: E402
from paraplan.search import SearchSpace, plan  # noqa: E402
from paraplan.specs.cluster import ClusterSpec, GpuSpec, make_cluster  # noqa: E402
from paraplan.specs.load import load_gpu, model_from_megatron_args  # noqa: E402
from paraplan.specs.model import ModelSpec  # noqa: E402
from paraplan.specs.training import TrainingSpec  # noqa: E402
from published_cases import Case, load_cases, pct  # noqa: E402

_GPUS: dict[str, Any] = {}
SOURCE_ATTENTION = False
"""Score each row with the attention backend its source ran (published_cases ``attn``: unfused for
2020-2022 Megatron and Megatron-DeepSpeed). Off by default: score.py cannot pass the backend,
and with the presets' efficiencies the default (flash) scores better (CHANGELOG, session 2)."""


def _backend(case: Case) -> str:
    return case.attention_backend if SOURCE_ATTENTION else "flash"


def case_training(case: Case, backend: str) -> TrainingSpec:
    """The TrainingSpec a calibration row runs with (its precision, FP8 recipe and attention kernel generation,
    ``backend`` attention; the knobs of its recipe, ``Case.knobs``, win)."""
    # the Megatron-Bridge performance runs: GPTModelProvider's cross_entropy_loss_fusion True, and _benchmark_common's
    # cross_entropy_fusion_impl "te" (perf_recipes/_common.py); the other sources run Megatron-LM's unfused default
    bridge = case.source == "Megatron-Bridge"
    base: dict[str, Any] = dict(seq_len=case.seq_len, global_batch_size=case.gbs, precision=case.precision,
                                attention_backend=backend, fp8_recipe=case.fp8_recipe,
                                attention_kernel=case.attention_kernel, cross_entropy_loss_fusion=bridge,
                                nvfp4_quantize_kernel=(case.nvfp4_quantize_kernel if case.precision == "fp4"
                                                       else "fused"),
                                cross_entropy_fusion_impl="te" if bridge else "native")
    return TrainingSpec(**{**base, **case.knobs})


def case_inputs(case: Case, gpu: GpuSpec, backend: str) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, ParallelLayout]:
    """The estimate inputs of a calibration row on ``gpu``: its model, cluster, TrainingSpec (``case_training``) and
    layout with the pipeline split resolved (SpecError when refused); shared with cross_validate.py ``prepare``."""
    model = model_from_megatron_args(case.model, name=case.label)
    layout, _ = apply_pipeline_split(model, ParallelLayout(**case.layout), "auto")
    return model, make_cluster(gpu, case.num_gpus, case.gpus_per_node), case_training(case, backend), layout


def predict(case: Case, gpu_override: Any = None) -> float | str:
    """Predicted tokens/s/GPU, or the reason the estimate was refused."""
    gpu = gpu_override or _GPUS.setdefault(case.gpu, load_gpu(case.gpu))
    try:
        est = estimate(*case_inputs(case, gpu, _backend(case)))
    except SpecError as err:
        return str(err)
    return float(est.throughput.tokens_per_s_per_gpu)


RANKING_SOURCES = {"SC21 Table 1": ("ddp", "full"), "Korthikanti T3/T5": ("ddp", None),
                   "BLOOM-176B": ("distopt", "full"), "MT-NLG 530B": ("distopt", "full")}


def ranking_check(cases: list[Case]) -> tuple[int, int, list[str]]:
    """Is the published layout in the top 5, or within 5% of the top pick's predicted throughput?

    The search space is the source's own (its data-parallel variant and recompute mode; micro-batch
    1, 2, 4, 8; every TP/PP/VP/CP Megatron accepts).
    """
    ok, lines = 0, []
    checked = [c for c in cases if c.source in RANKING_SOURCES]
    for c in checked:
        dpv, rec = RANKING_SOURCES[c.source]
        rec = rec or c.layout["recompute"]
        try:
            model = model_from_megatron_args(c.model, name=c.label)
            gpu = _GPUS.setdefault(c.gpu, load_gpu(c.gpu))
            cluster = make_cluster(gpu, c.num_gpus, c.gpus_per_node)
            training = TrainingSpec(seq_len=c.seq_len, global_batch_size=c.gbs, precision=c.precision,  # type: ignore[arg-type]
                                    attention_backend=_backend(c))  # type: ignore[arg-type]
            # the published layout with the same switches the search uses (overlap flags)
            lay = dict(c.layout, overlap_grad_reduce=True, overlap_param_gather=dpv != "ddp",
                       distributed_optimizer=dpv == "distopt", fsdp=False)
            published = estimate(model, cluster, training, ParallelLayout(**lay))
            space = SearchSpace(recompute=(rec,), dp_variants=(dpv,),
                                sequence_parallel=(c.layout["sequence_parallel"],), allow_cross_node=True)
            p = plan(model, cluster, training, space=space, top_k=5)
        except PlannerError as err:
            lines.append(f"  {c.id} {c.label}: {str(err)[:90]}")
            continue
        top = float(p.candidates[0].throughput.tokens_per_s_per_gpu)
        mine = float(published.throughput.tokens_per_s_per_gpu)
        in_top5 = any(e.layout == published.layout for e in p.candidates)
        close = mine >= 0.95 * top
        ok += int(in_top5 or close)
        lines.append(f"  {c.id} {c.label[:24]:<24} published {published.layout.short():<32} {mine:8.0f} tok/s/GPU; "
                     f"top {p.candidates[0].layout.short():<32} {top:8.0f} -> {'ok' if in_top5 or close else 'MISS'}")
    return ok, len(checked), lines


def score(cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for c in cases:
        p = predict(c)
        row: dict[str, Any] = {"case": c, "pred": p}
        if isinstance(p, float) and p > 0:
            row["ape"] = abs(p - c.target_tokens_per_s_per_gpu) / c.target_tokens_per_s_per_gpu
            row["signed"] = p / c.target_tokens_per_s_per_gpu - 1
        out.append(row)
    return out


def summary(rows: list[dict[str, Any]]) -> tuple[float, float, float, int]:
    apes = [r["ape"] for r in rows if "ape" in r]
    w20 = sum(1 for x in apes if x <= 0.2) / len(apes) if apes else math.nan
    return pct(apes, 0.5), pct(apes, 0.9), w20, len(apes)


def print_table(rows: list[dict[str, Any]], key: str) -> None:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        c = r["case"]
        groups[getattr(c, key) if key != "kind" else ("MoE" if c.moe else "dense")].append(r)
    print(f"{key:<28} {'rows':>5} {'pred':>5} {'medAPE':>7} {'p90APE':>7} {'<=20%':>6} {'bias':>7}")
    for name, rs in sorted(groups.items()):
        med, p90, w20, n = summary(rs)
        bias = statistics.median([r["signed"] for r in rs if "signed" in r]) if n else math.nan
        print(f"{name[:28]:<28} {len(rs):>5} {n:>5} {100 * med:>6.1f}% {100 * p90:>6.1f}% "
              f"{100 * w20:>5.0f}% {100 * bias:>+6.1f}%")


def excluded_lines(source: str = "") -> list[str]:
    """The rows left out of every score for a software regression their source states (``Case.excluded``,
    published_cases ``DOCUMENTED_REGRESSIONS``): each with its prediction and measurement, then the reasons."""
    cases = [c for c in load_cases("published", include_excluded=True)[0]
             if c.excluded and source.lower() in c.source.lower()]
    if not cases:
        return []
    lines = [f"\nexcluded, a software regression the source states (not scored): {len(cases)} rows"]
    for c in cases:
        p, m = predict(c), c.target_tokens_per_s_per_gpu
        err = f"{p:.0f} vs {m:.0f} ({100 * (p / m - 1):+.0f}%)" if isinstance(p, float) else p[:60]
        lines.append(f"  excluded {c.id} {c.label} {c.gpu} n={c.num_gpus}: {err}")
    lines += [f"  reason: {why}" for why in dict.fromkeys(c.excluded for c in cases)]
    return lines


CV_SCHEMES = (("kfold", "5-fold"), ("loso", "leave-one-source-out"))


def _figures(fig: dict[str, Any]) -> str:
    return (f"median APE {100 * fig['median_ape']:.1f}%, p90 {100 * fig['p90_ape']:.1f}%, "
            f"within-20% {100 * fig['within_20']:.0f}% over {fig['rows']} rows")


def print_cross_validated(rows: list[dict[str, Any]], live: bool, source: str) -> None:
    """Cross-validated figures per source beside the in-sample ones, then one line per scheme."""
    import bands  # here, not at the top: bands -> cross_validate -> fit_efficiency imports this module

    if live:
        cv = bands.cross_validated()
    else:
        cv, stale = bands.cached_cross_validation()
        if cv is None:
            print(f"\ncross-validated: src/paraplan/bands.json is stale ({'; '.join(stale)}): run "
                  "python benchmarks/bands.py, or pass --cv")
            return
    print(f"\n{'source (held out)':<28} {'rows':>5} {'in-sample':>15} " + " ".join(
        f"{label[:20]:>22}" for _, label in CV_SCHEMES))
    print(f"{'':<28} {'':>5} {'medAPE  p90':>15} " + " ".join(f"{'medAPE  p90 <=20%':>22}" for _ in CV_SCHEMES))
    in_sample: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        in_sample[r["case"].source].append(r)
    for name in sorted(cv["kfold"]["by_source"]):
        if source.lower() not in name.lower():
            continue
        med, p90, _, n = summary(in_sample.get(name, []))
        cells = []
        for scheme, _ in CV_SCHEMES:
            f = cv[scheme]["by_source"].get(name)
            cells.append(f"{100 * f['median_ape']:>6.1f}% {100 * f['p90_ape']:>6.1f}% {100 * f['within_20']:>5.0f}%"
                         if f else f"{'-':>22}")
        print(f"{name[:28]:<28} {n:>5} {100 * med:>6.1f}% {100 * p90:>6.1f}% " + " ".join(f"{c:>22}" for c in cells))
    un = cv["loso"]["uncalibrated_rows"]
    if un:
        print(f"  leave-one-source-out: {un} rows had no other source on their GPU architecture and were predicted "
              "with the uncalibrated EfficiencySpec defaults")
    for scheme, label in CV_SCHEMES:
        print(f"cross-validated ({label}): {_figures(cv[scheme])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--no-vtrain", action="store_true")
    ap.add_argument("--source", default="")
    ap.add_argument("--source-attention", action="store_true",
                    help="score rows with the attention backend their source ran (unfused before 2022)")
    ap.add_argument("--by-container", action="store_true",
                    help="only the Megatron-Bridge jobs measured in several NeMo containers: measured and predicted "
                         "per container, the knobs that differ (benchmarks/bridge_containers.py)")
    ap.add_argument("--cv", action="store_true",
                    help="recompute the cross-validated figures (refits every fold; minutes) instead of reading them "
                         "from src/paraplan/bands.json")
    args = ap.parse_args()
    global SOURCE_ATTENTION
    SOURCE_ATTENTION = args.source_attention
    if args.by_container:
        from bridge_containers import table_lines

        print("\n".join(table_lines(predict)))
        return 0
    cases, _skipped = load_cases("published")
    cases = [c for c in cases if args.source.lower() in c.source.lower()]
    rows = score(cases)
    print_table(rows, "source")
    print()
    print_table(rows, "gpu")
    print()
    print_table(rows, "kind")
    print("\n".join(excluded_lines(args.source)))
    refused = [r for r in rows if "ape" not in r]
    if refused:
        print(f"\nrefused by the estimator: {len(refused)} (first: {refused[0]['pred'][:100]})")
    if args.worst:
        print(f"\nworst {args.worst}:")
        for r in sorted((r for r in rows if "ape" in r), key=lambda r: -r["ape"])[: args.worst]:
            c = r["case"]
            lay = " ".join(f"{k}{v}" for k, v in c.layout.items()
                           if k in ("tp", "pp", "vp", "cp", "ep", "dp", "mbs"))
            print(f"  {c.id} {c.source[:22]:<22} {c.label[:24]:<24} {c.gpu:<10} n={c.num_gpus:<5} {lay} "
                  f"{c.layout['recompute']} {c.precision}: {r['pred']:.0f} vs "
                  f"{c.target_tokens_per_s_per_gpu:.0f} "
                  f"({100 * r['signed']:+.0f}%)")
    ok, n_rank, lines = ranking_check(cases)
    print(f"\nranking: published layout in the top 5 or within 5% of the top pick for {ok}/{n_rank} runs")
    print("\n".join(lines))
    from published_cases import bridge_fit_line, bridge_recipe_matches, bridge_unmatched_lines  # recipe knobs

    matches = bridge_recipe_matches()
    print("\n" + bridge_fit_line(matches))
    if args.worst:
        print("\n".join(bridge_unmatched_lines(matches)))
    if not args.no_vtrain:
        vcases, _ = load_cases("vtrain")
        med, p90, w20, n = summary(score(vcases))
        print(f"\nvtrain: median APE {100 * med:.1f}%, p90 APE {100 * p90:.1f}%, "
              f"within-20% {100 * w20:.0f}% over {n} rows")
    print_cross_validated(rows, args.cv, args.source)
    med, p90, w20, n = summary(rows)
    print(f"calibration: median APE {100 * med:.1f}%, p90 APE {100 * p90:.1f}%, "
          f"within-20% {100 * w20:.0f}% over {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
