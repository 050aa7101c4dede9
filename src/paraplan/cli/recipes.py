"""``paraplan recipes``: NVIDIA's Megatron-Bridge performance recipes (and the user's own), filtered by model and
GPU; ``estimate --recipe NAME`` runs one."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from paraplan.cli._app import app
from paraplan.cli.render import console, fit_table, safe
from paraplan.errors import SpecError

if TYPE_CHECKING:
    from paraplan.recipes.catalogue import Recipe


class RecipeFormat(StrEnum):
    """Output formats of recipes."""

    table = "table"
    json = "json"
    csv = "csv"


RecipesFileOpt = typer.Option(None, "--recipes", help="Your own recipes, beside NVIDIA's: a CSV with "
                              "bridge_perf_recipes.csv's columns (a subset holding source, model, gpu, num_gpus, "
                              "precision, seq_length, global_batch_size, micro_batch_size, tp, pp), or a YAML list "
                              "of the same fields.")


def _matches(value: str, wanted: str | None, preset: str | None) -> bool:
    return wanted is None or wanted.lower() in (value.lower(), (preset or "").lower())


def select(recipes: tuple[Recipe, ...], model: str | None, gpu: str | None, everything: bool) -> list[Recipe]:
    """The recipes for ``model`` and ``gpu`` (recipe or preset names; None: any); runnable ones only unless
    ``everything``."""
    return [r for r in recipes if (everything or r.runnable) and _matches(str(r.get("model")), model, r.model_preset)
            and _matches(str(r.get("gpu")), gpu, r.gpu_preset)]


def knobs_summary(r: Recipe) -> str:
    """The recipe's recompute and memory/overlap knobs in a few words (``paraplan recipes``' knobs column)."""
    from paraplan.api import cell_text

    gran = r.get("recompute_granularity")
    parts = [f"recompute {gran}" + (f" {cell_text(r.get('recompute_modules'))}" if gran == "selective" else "")
             if gran else "no recompute"]
    parts += [name for col, name in (("use_megatron_fsdp", "fsdp"), ("tp_comm_overlap", "tp-overlap"),
                                     ("cpu_offloading", "offload"), ("fine_grained_activation_offloading",
                                                                     "fine-offload")) if r.get(col) is True]
    if r.get("cuda_graph_impl") not in ("none", "", None):
        parts.append(f"graphs {r.get('cuda_graph_impl')}")
    if r.get("grad_reduce_in_fp32") is False:
        parts.append("bf16 grads")
    return ", ".join(parts)


def layout_text(r: Recipe) -> str:
    """``tp4 pp8 vp5 cp1 ep1 mbs1`` of a recipe (as written in it)."""
    vp, ep = r.get("vp"), r.get("ep")
    return (f"tp{r.get('tp')} pp{r.get('pp')}" + (f" vp{vp}" if vp not in (None, "", 1) else "")
            + f" cp{r.get('cp')}" + (f" ep{ep}" if ep not in (None, "", 1) else "")
            + f" mbs{r.get('micro_batch_size')}")


_CSV_COLUMNS = ("alias", "source", "model", "gpu", "num_gpus", "precision", "task", "seq_length", "global_batch_size",
                "layout", "knobs", "paraplan_model", "paraplan_gpu", "reason", "derivation")


def _csv(rows: list[dict[str, Any]]) -> str:
    """The CSV listing (its header even when no recipe matches)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=_CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _row(r: Recipe) -> dict[str, Any]:
    return {"alias": r.alias, "source": r.source, "model": r.get("model"), "gpu": r.get("gpu"),
            "num_gpus": r.get("num_gpus"), "precision": r.get("precision"), "task": r.get("task"),
            "seq_length": r.get("seq_length"), "global_batch_size": r.get("global_batch_size"),
            "layout": layout_text(r), "knobs": knobs_summary(r), "paraplan_model": r.model_preset or "",
            "paraplan_gpu": r.gpu_preset or "", "reason": r.reason, "derivation": r.derivation}


@app.command("recipes")
def recipes_cmd(
    model: str | None = typer.Option(None, "--model", "-m", help="Only this model (recipe name, e.g. llama3_70b, or "
                                     "paraplan preset, e.g. llama3-70b)."),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="Only this GPU (h100 or h100-80gb, b200, gb200, ...)."),
    everything: bool = typer.Option(False, "--all", help="Also the recipes whose model or GPU has no paraplan preset, "
                                    "with the reason."),
    recipes_file: str | None = RecipesFileOpt,
    fmt: RecipeFormat = typer.Option(RecipeFormat.table, "--format", "-f", help="Output format."),
) -> None:
    """List NVIDIA's Megatron-Bridge performance recipes (and yours): layout, batch and knobs of each.

    Each recipe keeps bridge_perf_recipes.csv's source (path:function) as its identifier and has a short alias;
    `paraplan estimate --recipe ALIAS` runs one. --format json gives every field under the CSV's column names.

    Example: paraplan recipes --model llama3-70b --gpu h100
    """
    from paraplan.api import catalogue

    everyone = catalogue(recipes_file)
    for flag, value, column, preset in (("--model", model, "model", "model_preset"),
                                        ("--gpu", gpu, "gpu", "gpu_preset")):
        names = {str(r.get(column)).lower() for r in everyone} | {str(getattr(r, preset)).lower() for r in everyone
                                                                  if getattr(r, preset)}
        if value is not None and not value.strip():
            raise SpecError(f"{flag}: empty (give one of {', '.join(sorted(names))})")
        if value is not None and value.lower() not in names:
            raise SpecError(f"{flag}: no recipe for '{value}' (recipes exist for: {', '.join(sorted(names))})")
    chosen = select(everyone, model, gpu, everything)
    if fmt == RecipeFormat.json:
        from paraplan.api import dumps_json

        print(dumps_json([r.as_dict() for r in chosen]))
        return
    if fmt == RecipeFormat.csv:
        print(_csv([_row(r) for r in chosen]), end="")
        return
    con = console()
    hidden = len(select(everyone, model, gpu, True)) - len(chosen)
    if not chosen:
        con.print("no recipe with a paraplan model and GPU preset matches"
                  + (f"; {hidden} without one: add --all" if hidden else ""))
        return
    cols = [("alias", "left"), ("GPUs", "right"), ("seq", "right"), ("GBS", "right"), ("layout", "left"),
            ("knobs", "left")] + ([("reason", "left")] if everything else [])
    rows = [[safe(r.alias), str(r.get("num_gpus")), str(r.get("seq_length")), str(r.get("global_batch_size")),
             safe(layout_text(r)), safe(knobs_summary(r))] + ([safe(r.reason or "-")] if everything else [])
            for r in chosen]
    con.print(fit_table(f"{len(chosen)} recipes", cols, rows, con.width, drop_order=("knobs", "reason")))
    if everything and any(not r.runnable for r in chosen):
        from collections import Counter

        for reason, n in Counter(r.reason for r in chosen if not r.runnable).most_common():
            con.print(f"{n} cannot run: {safe(reason)}")
    derived = [r for r in chosen if r.derivation]
    if derived:
        from collections import Counter

        for reason, n in Counter(r.derivation for r in derived).most_common():
            aliases = ", ".join(r.alias for r in derived if r.derivation == reason)
            con.print(f"{n} ({safe(aliases)}) {safe(reason)}")  # the aliases first: a long reason wraps
    if hidden:
        con.print(f"{hidden} more have no paraplan model or GPU preset: `paraplan recipes --all` lists them with "
                  "the reason")
    con.print("sources (path:function) and every field: --format json; run one: paraplan estimate --recipe ALIAS")
