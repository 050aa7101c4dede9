#!/usr/bin/env python3
"""The Megatron-Bridge jobs measured in more than one NeMo container: measured and predicted tokens/s/GPU per
container, and the knobs each row runs (its release's config, ``published_cases.attach_recipe_knobs``) that differ.

A job is one model, GPU, GPU count, sequence length, global and micro batch, layout (TP, PP, VP, CP, EP), precision,
FSDP column and task of the performance summary (../shared/calibration/published_runs.csv, SOURCES.md section 5).
Each line of a job: container, release tag, measured, predicted (``calibration.predict``) and signed error, the
config the row was joined to, and the knobs that differ from the job's earliest container. Rows of a documented
software regression (``published_cases.DOCUMENTED_REGRESSIONS``) are predicted and shown, marked ``excluded``.
Then every pair of containers of a job more than 10% apart in measured throughput with identical knobs, and what
explains it (the exclusion's citation) or ``unexplained``.

    python benchmarks/bridge_containers.py          (or: python benchmarks/calibration.py --by-container)
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bridge_release_knobs import RELEASES  # noqa: E402
from published_cases import BRIDGE_SOURCE, SHARED, Case, load_cases, release_config_matches, row_container  # noqa: E402

GAP = 0.10
"""Measured throughput ratio (the larger over the smaller, minus one) above which two containers of one job are
listed as a gap."""
LAYOUT_KNOBS = ("recompute", "recompute_modules", "recompute_method", "recompute_num_layers", "schedule", "fsdp",
                "tp_comm_overlap")
"""The layout fields the release config sets (``attach_recipe_knobs``), compared beside ``Case.knobs``."""
_ORDER = {container: i for i, (container, _, _) in enumerate(RELEASES)}


@dataclass
class Entry:
    """One published row of a job."""

    row: int
    container: str
    tag: str
    measured: float
    case: Case | None = None
    predicted: float | str | None = None
    config: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)


def job_key(r: dict[str, str]) -> tuple[str, ...]:
    """What makes two rows the same job. The 25.09 table has no precision column (SOURCES.md): its primary and
    parenthesized rows are two FP8 granularities, kept apart."""
    prec = r["precision"].strip() or ("fp8 (parenthesized)" if "row built from the parenthesized values" in r["notes"]
                                      else "fp8 (primary)")
    task = next((t for t in ("LoRA", "SFT") if f"task={t}" in r["notes"]), "pretrain")
    return (r["model"], r["gpu"], r["num_gpus"], r["seq_length"], r["gbs"], r["mbs"] or "1", r["tp"], r["pp"],
            r["vp"] or "1", r["cp"] or "1", r["ep"] or "1", prec, r["distributed_optimizer"], task)


def effective_knobs(case: Case) -> dict[str, Any]:
    """The knobs a row runs: its TrainingSpec knobs and the layout fields its release config sets."""
    return {**case.knobs, **{k: case.layout[k] for k in LAYOUT_KNOBS if k in case.layout}}


def knob_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{knob: (a's, b's)} where they differ (a knob one side lacks is Megatron's default there: ``-``)."""
    return {k: (a.get(k, "-"), b.get(k, "-")) for k in sorted(set(a) | set(b)) if a.get(k, "-") != b.get(k, "-")}


def jobs(predict: Any = None) -> list[tuple[tuple[str, ...], list[Entry]]]:
    """Every job of the Bridge rows measured in more than one container, its rows in release order; ``predict``
    (Case -> tokens/s/GPU or a reason) fills ``Entry.predicted``."""
    with open(SHARED / "published_runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cases = {int(c.id.split(":")[1]): c for c in load_cases("published", include_excluded=True)[0]}
    matches = {m.row: m for m in release_config_matches()}
    tags = {c: t for c, t, _ in RELEASES}
    groups: dict[tuple[str, ...], list[Entry]] = {}
    for i, r in enumerate(rows):
        if not r["source"].startswith(BRIDGE_SOURCE) or not r["tokens_per_sec_per_gpu"].strip():
            continue
        container = row_container(r["notes"]) or "?"
        e = Entry(i, container, tags.get(container, "?"), float(r["tokens_per_sec_per_gpu"]), cases.get(i))
        m = matches.get(i)
        e.config = m.config["name"] if m is not None and m.config is not None else \
            (m.reason if m is not None else "no case")
        if e.case is not None:
            e.knobs = effective_knobs(e.case)
            e.predicted = predict(e.case) if predict is not None else None
        elif m is None or m.config is None:
            e.config = "no paraplan case"
        groups.setdefault(job_key(r), []).append(e)
    out = []
    for key, es in groups.items():
        if len({e.container for e in es}) > 1:
            out.append((key, sorted(es, key=lambda e: (_ORDER.get(e.container, 99), e.row))))
    return out


def _cell(x: Any) -> str:
    return ",".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)


def gaps(groups: list[tuple[tuple[str, ...], list[Entry]]]) -> list[tuple[tuple[str, ...], Entry, Entry, str]]:
    """Pairs of containers of one job (both with a case) more than ``GAP`` apart in measured throughput with
    identical knobs, and what explains it: the exclusion reason of either row, or ``unexplained``."""
    out = []
    for key, es in groups:
        with_case = [e for e in es if e.case is not None]
        for i, a in enumerate(with_case):
            for b in with_case[i + 1:]:
                if a.container == b.container or knob_diff(a.knobs, b.knobs):
                    continue
                if max(a.measured, b.measured) / min(a.measured, b.measured) - 1 > GAP:
                    why = (a.case.excluded if a.case else "") or (b.case.excluded if b.case else "") or "unexplained"
                    out.append((key, a, b, why))
    return out


def table_lines(predict: Any) -> list[str]:
    """The per-container table and the same-knob gaps, as calibration.py ``--by-container`` prints them."""
    groups = jobs(predict)
    lines = [f"Megatron-Bridge jobs measured in more than one container: {len(groups)}"]
    for key, es in groups:
        model, gpu, n, seq, gbs, mbs, tp, pp, vp, cp, ep, prec, fsdp, task = key
        lines.append(f"{model} {gpu} x{n} seq{seq} gbs{gbs} mbs{mbs} tp{tp} pp{pp} vp{vp} cp{cp} ep{ep} {prec}"
                     + (f" {fsdp}" if fsdp else "") + ("" if task == "pretrain" else f" {task}"))
        first = next((e for e in es if e.case is not None), None)
        for e in es:
            pred = e.predicted
            p = f"{pred:8.0f} ({100 * (pred / e.measured - 1):+4.0f}%)" if isinstance(pred, float) else \
                f"{'-':>8} {'':7}"
            diff = knob_diff(first.knobs, e.knobs) if first is not None and e.case is not None and e is not first \
                else {}
            knobs = "; ".join(f"{k} {_cell(a)}->{_cell(b)}" for k, (a, b) in diff.items())
            mark = " [excluded]" if e.case is not None and e.case.excluded else ""
            lines.append(f"  {e.container:<9} {e.tag:<10} row {e.row:4d} measured {e.measured:8.0f} predicted {p} "
                         f"{e.config}{mark}" + (f" | knobs vs {first.container}: {knobs}" if knobs else ""))
    found = gaps(groups)
    lines.append(f"same knobs, measured more than {100 * GAP:.0f}% apart: {len(found)} pairs")
    for key, a, b, why in found:
        lines.append(f"  {_job(key)}: {a.container} {a.measured:.0f} vs {b.container} {b.measured:.0f} "
                     f"({100 * (b.measured / a.measured - 1):+.0f}%): {why}")
    loose = [(key, a, b) for key, es in groups for i, a in enumerate(es) for b in es[i + 1:]
             if a.case is None and b.case is None and max(a.measured, b.measured) / min(a.measured, b.measured) - 1
             > GAP]
    if loose:
        lines.append(f"no paraplan case (knobs not extracted), measured more than {100 * GAP:.0f}% apart: "
                     f"{len(loose)} pairs")
        lines += [f"  {_job(key)}: {a.container} {a.measured:.0f} vs {b.container} {b.measured:.0f} "
                  f"({100 * (b.measured / a.measured - 1):+.0f}%)" for key, a, b in loose]
    return lines


def _job(key: tuple[str, ...]) -> str:
    return f"{key[0]} {key[1]} x{key[2]} tp{key[6]} ep{key[10]} {key[11]}"


def main() -> int:
    from calibration import predict

    print("\n".join(table_lines(predict)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
