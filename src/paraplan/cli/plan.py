"""``paraplan plan`` and ``paraplan explain``: search, rank and explain layouts."""

from __future__ import annotations

import csv
import functools
import inspect
import io
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from paraplan.api import (
    CKPT_BLOCKING_FLAG,
    RECOMPUTE_MODULES,
    SCHEDULE_NAMES,
    CheckpointAdvice,
    Estimate,
    Plan,
    SearchSpace,
    SiteProfile,
    advise,
    brief,
    dumps_json,
    format_decimal_bytes,
    load_site,
    parse_headroom,
)
from paraplan.api import explain as explain_plan
from paraplan.cli._app import app, plain, state
from paraplan.cli.options import (
    AttentionChoice,
    AttentionOpt,
    ForceOpt,
    FragmentationOpt,
    GbsOpt,
    GpuOpt,
    GpuSetOpt,
    GpusPerNodeOpt,
    HeadroomOpt,
    KnobOpt,
    ModelOpt,
    NumGpusOpt,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    SeqLenOpt,
    WorkspaceOpt,
    memory_options,
    resolve_inputs,
    site_memory_options,
)
from paraplan.cli.recipes import RecipesFileOpt
from paraplan.cli.render import console, fit_table, no_fit_line, safe
from paraplan.errors import NoFeasiblePlanError, SpecError
from paraplan.units import GIB

if TYPE_CHECKING:
    from paraplan.estimate.memory import MemoryOptions
    from paraplan.recipes.compare import RecipeComparison


class PlanFormat(StrEnum):
    """Output formats of plan."""

    table = "table"
    json = "json"
    csv = "csv"


ScheduleChoice = StrEnum("ScheduleChoice", {n: n for n in SCHEDULE_NAMES})  # type: ignore[misc]
"""``--schedule`` values (``paraplan.schedules``)."""

ScheduleOpt = typer.Option(None, "--schedule", help="Pipeline schedule: 1f1b, interleaved or combined_1f1b "
                           "(Megatron-LM), zb-h1 or dualpipe-v (what-ifs, not in Megatron-LM); default: Megatron's "
                           "choice from --vp.")


class ObjectiveChoice(StrEnum):
    """Ranking objective."""

    throughput = "throughput"
    memory_headroom = "memory-headroom"


def _ints(name: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    if not text.strip():  # an empty shell variable (--tp "$TP") must not silently search every value
        raise SpecError(f"--{name}: empty (give comma-separated positive integers, e.g. 1,2,4; leave the flag out to "
                        "search every value)")
    try:  # every item given: "1,,2" is a slip, not "1,2"
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(f"--{name}: expected comma-separated positive integers, got {brief(text)}") from None
    if min(values) < 1:
        raise SpecError(f"--{name}: expected comma-separated positive integers, got {brief(text)}")
    return values


MAX_TOP = 100
"""Most layouts ``--top`` lists: each is a full estimate (memory per stage, step time), so a huge count would run for
minutes on a large search."""


def check_top(top: int) -> None:
    """``--top`` within 1 to ``MAX_TOP`` (plan, explain, report)."""
    if not 1 <= top <= MAX_TOP:
        raise SpecError(f"--top must be in [1, {MAX_TOP}], got {top:,}")


def _strs(name: str, text: str | None, allowed: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
    if text is None:
        return default
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:  # an empty shell variable (--dp-variant "$V") must not silently change the search
        raise SpecError(f"--{name}: empty (allowed: {', '.join(allowed)})")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise SpecError(f"--{name}: unknown '{bad[0]}' (allowed: {', '.join(allowed)})")
    return values


RECOMPUTE_CHOICES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """What ``paraplan plan`` searches, as its flags give it (plan, explain and report build one; PLAN_OPTIONS
    declares the flags once). Enum flags are kept as their values."""

    model: str
    gpu: str
    num_gpus: int
    gpus_per_node: int | None = None
    seq_len: int
    gbs: int
    precision: str = "bf16"
    top: int = 5
    objective: str = "throughput"
    tp: str | None = None
    pp: str | None = None
    vp: str | None = None
    cp: str | None = None
    ep: str | None = None
    mbs: str | None = None
    max_pp: int | None = None
    recompute: str | None = None
    dp_variant: str | None = None
    allow_cross_node: bool = True
    tp_comm_overlap: bool = False
    gpu_set: list[str] | None = None
    profile: str | None = None
    workspace_gib: float | None = None
    fragmentation: float | None = None
    recompute_modules: str | None = None
    attention_backend: str = "flash"
    headroom: str | None = None
    """``--headroom``: GIB, PCT or 0 (``paraplan.headroom.parse_headroom``); None = the memory model's band."""
    knob: list[str] | None = None
    """``--knob``: memory and time knobs as Megatron flags (options.knob_fields)."""
    schedule: str = ""
    """A ``paraplan.schedules`` name ("" = Megatron's choice from VP). Not in PLAN_OPTIONS: plan and explain
    each place ``--schedule`` among their own options (their --help order)."""

    def space(self) -> SearchSpace:
        """The search space the flags allow."""
        return search_space(tp=self.tp, pp=self.pp, vp=self.vp, cp=self.cp, ep=self.ep, mbs=self.mbs,
                            max_pp=self.max_pp, recompute=self.recompute, dp_variant=self.dp_variant,
                            allow_cross_node=self.allow_cross_node, tp_comm_overlap=self.tp_comm_overlap,
                            recompute_modules=self.recompute_modules, schedule=self.schedule)


def search_space(*, tp: str | None = None, pp: str | None = None, vp: str | None = None, cp: str | None = None,
                 ep: str | None = None, mbs: str | None = None, max_pp: int | None = None,
                 recompute: str | None = None, dp_variant: str | None = None, allow_cross_node: bool = True,
                 tp_comm_overlap: bool = False, recompute_modules: str | None = None,
                 schedule: str = "") -> SearchSpace:
    """The SearchSpace of the search flags (comma-separated lists; None keeps the default)."""
    dp_variants = _strs("dp-variant", dp_variant, ("distopt", "fsdp", "ddp"), ("distopt", "fsdp"))
    return SearchSpace(
        tp=_ints("tp", tp), pp=_ints("pp", pp), vp=_ints("vp", vp), cp=_ints("cp", cp), ep=_ints("ep", ep),
        mbs=_ints("mbs", mbs) or (1, 2, 4, 8), max_pp=max_pp,
        recompute=_strs("recompute", recompute, RECOMPUTE_CHOICES, RECOMPUTE_CHOICES),
        dp_variants=dp_variants, fsdp_everywhere=dp_variant is not None and "fsdp" in dp_variants,
        allow_cross_node=allow_cross_node, tp_comm_overlap=tp_comm_overlap,
        recompute_modules=_strs("recompute-modules", recompute_modules, RECOMPUTE_MODULES, ("core_attn",)),
        schedule=schedule,
    )


def run_plan(req: PlanRequest, options: MemoryOptions | None = None) -> Plan:
    """Resolve the inputs and search, through the public API (``paraplan.api.plan``; ``options``: the memory
    allowances, default those of the request's flags)."""
    from paraplan.api import plan

    margin = parse_headroom(req.headroom)
    inputs = resolve_inputs(model=req.model, gpu=req.gpu, num_gpus=req.num_gpus, gpus_per_node=req.gpus_per_node,
                            seq_len=req.seq_len, gbs=req.gbs, precision=req.precision, gpu_set=req.gpu_set,
                            profile=req.profile, attention_backend=req.attention_backend, knobs=req.knob)
    check_top(req.top)
    if req.pp and req.max_pp is not None:
        raise SpecError("--pp and --max-pp contradict: --pp lists the PP sizes to search, --max-pp caps the "
                        "default list (give one)")
    if (req.recompute_modules and req.recompute
            and "selective" not in _strs("recompute", req.recompute, RECOMPUTE_CHOICES, ())):
        raise SpecError(f"--recompute-modules and --recompute {req.recompute} contradict: modules apply to "
                        "selective recompute only")
    return plan(inputs.model, inputs.cluster, training=inputs.training, space=req.space(),
                objective=req.objective, top_k=req.top,  # type: ignore[arg-type]
                memory_options=options or memory_options(req.workspace_gib, req.fragmentation), headroom=margin)


def render_plan(p: Plan, site: SiteProfile | None = None, recipe: RecipeComparison | None = None) -> None:
    con = console()
    site = site or SiteProfile()
    con.print(f"[bold]{safe(p.model.name)}[/] on {p.cluster.num_gpus} x {safe(p.cluster.gpu.name)} | "
              f"seq {p.training.seq_len}, GBS {p.training.global_batch_size}, {p.training.precision}")
    con.print(f"{p.num_evaluated:,} layouts searched, {p.num_feasible:,} fit | ranked by {p.objective}")
    rows = []
    limits: list[str] = []
    ckpts: list[str] = []
    for i, c in enumerate(p.candidates):
        adv = advise(c, site.storage(), site.failures())
        limits += [f"#{i + 1}: {x}" for x in _checkpoint_limits(adv)]
        ckpts.append(f"#{i + 1} {format_decimal_bytes(adv.size.total_bytes)} {adv.size.ckpt_format}, save "
                     f"{adv.timing.save_s:,.1f} s, --save-interval {adv.save_interval_iters}")
        terms = {"compute": float(c.time.compute_s), "bubble": float(c.time.bubble_s),
                 "recompute": float(c.time.recompute_s)}
        terms.update({f"{k} comm": float(v) for k, v in c.time.exposed_comm_s.items()})
        dom = max(terms, key=lambda k: terms[k])
        mfu = 100 * float(c.throughput.mfu)
        colour = "green" if mfu >= 40 else ("yellow" if mfu >= 25 else "red")
        rows.append([f"[bold]{i + 1}[/]" if i == 0 else str(i + 1), c.layout.short(),
                     f"{c.peak_bytes / GIB:.1f}/{c.usable_bytes / GIB:.1f}",
                     f"{(c.usable_bytes - c.peak_bytes) / GIB:.1f}", f"{float(c.time.step_s):.2f}",
                     f"{float(c.throughput.tokens_per_s_per_gpu):,.0f}", f"[{colour}]{mfu:.1f}%[/]",
                     str(p.tiers[i]) if i < len(p.tiers) else "",
                     RULE_LABELS.get(p.decided_by[i], p.decided_by[i]) if i < len(p.decided_by) else "",
                     f"{dom} {100 * terms[dom] / float(c.time.step_s):.0f}%"])
    # a layout stays on one line: narrow terminals lose the dominant term, then tokens/s/GPU (MFU says it), then
    # the rule that ranked each layout before the next (the ranking note names the rules)
    table = fit_table("best layouts", [("#", "right"), ("layout", "left"), ("GiB\npeak/use", "right"),
                                       ("GiB\nfree", "right"), ("step\ns", "right"), ("tok/s\n/GPU", "right"),
                                       ("MFU", "right"), ("tier", "right"), ("ahead\nby", "left"),
                                       ("dominant", "left")], rows, con.width,
                      drop_order=("dominant", "tok/s\n/GPU", "ahead\nby"))
    con.print(table)
    con.print(ranges_line(p.candidates[0]))
    if recipe is not None:
        con.print(recipe_line(recipe, p.candidates[0]))
    con.print("checkpoints: " + "; ".join(ckpts))
    for line in limits:
        con.print(f"[yellow]checkpoint limit[/] {line}")
    rej = ", ".join(f"{k} {v}" for k, v in sorted(p.rejections.items(), key=lambda kv: -kv[1]))
    con.print(f"rejected: {rej or 'none'}")
    for note in p.notes:
        con.print(f"note: {safe(note)}")


def ranges_line(pick: Estimate) -> str:
    """The pick's measured error bands (``Estimate.*_range``, as the JSON's memory.peak_bytes_range,
    time.step_s_range and throughput.tokens_per_s_per_gpu_range), on one line."""
    (m_lo, m_hi), (s_lo, s_hi) = pick.peak_bytes_range, pick.step_s_range
    k_lo, k_hi = pick.tokens_per_s_per_gpu_range
    return (f"#1 ranges (measured error bands): peak {m_lo / GIB:.1f} - {m_hi / GIB:.1f} GiB "
            f"({safe(pick.memory_band.describe())}); step {s_lo:.2f} - {s_hi:.2f} s, {k_lo:,.0f} - {k_hi:,.0f} "
            f"tokens/s/GPU ({safe(pick.step_band.describe())})")


RULE_LABELS = {"tier": "faster tier", "free_memory": "free mem", "distributed_optimizer": "dist-opt",
               "megatron_fsdp": "FSDP", "nvlink_domain": "NVLink", "even_pipeline_split": "even PP",
               "fewer_parallel_dims": "fewer dims", "nvidia_recipe": "recipe", "step_time": "step",
               "simpler": "simpler", "exact_tie": "tie", "memory_headroom": "headroom"}
"""Short words of ``Plan.decided_by`` codes (``paraplan.ranking.RULES``) for the table's "ahead by" column."""


def _checkpoint_limits(adv: CheckpointAdvice) -> list[str]:
    """Host-RAM and storage limits of one layout's checkpoints (empty when none binds)."""
    out = []
    t, g = adv.timing, adv.goodput
    if t.host_ram_fits is False:
        out.append(f"--async-save staging {format_decimal_bytes(t.host_ram_bytes_per_node)}/node exceeds host RAM "
                   "(synchronous save)")
    blocked = g.save_blocking_s / (g.interval_s + g.save_blocking_s)
    if blocked > CKPT_BLOCKING_FLAG:
        out.append(f"saves block {blocked:.0%} of training ({t.storage_bound} storage bandwidth)")
    return out


def recipe_line(cmp: RecipeComparison, pick: Estimate) -> str:
    """The recipe next to the pick, on one line (rich markup)."""
    from paraplan.cli.recipes import knobs_summary, layout_text

    r = cmp.recipe
    whose = "closest NVIDIA recipe" if r.origin == "bridge" else "closest recipe, yours,"
    head = (f"[cyan]recipe[/] {safe(r.alias)} ({r.get('num_gpus')} GPUs, seq {r.get('seq_length')}, GBS "
            f"{r.get('global_batch_size')}; {whose} for this model and GPU): {safe(layout_text(r))}, "
            f"{safe(knobs_summary(r))}" + (" [yellow](derived by NVIDIA, no published run)[/]" if r.derivation else ""))
    e = cmp.estimate
    if e is None:
        return f"{head}; does not run here: {safe(cmp.error)}"
    gain = float(e.throughput.tokens_per_s_per_gpu) / float(pick.throughput.tokens_per_s_per_gpu) - 1.0
    fits = "" if e.fits else " [red]does not fit[/]"
    return (f"{head} | on {cmp.at}: {e.peak_bytes / GIB:.1f}/{e.usable_bytes / GIB:.1f} GiB{fits}, "
            f"{float(e.throughput.tokens_per_s_per_gpu):,.0f} tok/s/GPU ({100 * gain:+.1f}% vs #1)"
            + (f"; {len(cmp.run.not_modelled)} knobs not modelled yet" if cmp.run and cmp.run.not_modelled else ""))


def render_findings(p: Plan, site: SiteProfile | None = None, recipe: RecipeComparison | None = None) -> None:
    con = console()
    site = site or SiteProfile()
    con.print(f"[bold]why {p.candidates[0].layout.short()}[/]")
    for f in explain_plan(p, site.storage(), site.failures(), recipe=recipe):
        con.print(f"- [cyan]{f.code}[/] {safe(f.text)}")


def emit(p: Plan, fmt: PlanFormat, with_explain: bool, site: SiteProfile | None = None,
         recipe: RecipeComparison | None = None) -> None:
    site = site or SiteProfile()
    if fmt == PlanFormat.json:
        d = p.to_dict()
        d["checkpoints"] = [advise(c, site.storage(), site.failures()).as_dict() for c in p.candidates]
        if recipe is not None:
            d["recipe"] = recipe.as_dict(p.candidates[0])
        if with_explain:
            d["explanation"] = [f.as_dict() for f in explain_plan(p, site.storage(), site.failures(),
                                                                   recipe=recipe)]
        print(dumps_json(d))
    elif fmt == PlanFormat.csv:
        buf = io.StringIO()
        w = csv.writer(buf)
        # the margin, free memory and error bands after the columns of before (as the JSON's memory/time keys)
        w.writerow(["rank", "tp", "pp", "vp", "cp", "ep", "etp", "dp", "mbs", "recompute", "sequence_parallel",
                    "distributed_optimizer", "fsdp", "peak_bytes", "step_s", "tokens_per_s_per_gpu", "mfu",
                    "free_bytes", "margin_bytes", "fits_with_margin", "peak_bytes_lo", "peak_bytes_hi", "step_s_lo",
                    "step_s_hi", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "tier", "decided_by"])
        for i, c in enumerate(p.candidates):
            lay = c.layout
            bands = [*c.peak_bytes_range, *c.step_s_range, *c.tokens_per_s_per_gpu_range]
            w.writerow([i + 1, lay.tp, lay.pp, lay.vp, lay.cp, lay.ep, lay.etp, lay.dp, lay.mbs, lay.recompute,
                        lay.sp, lay.distributed_optimizer, lay.fsdp, f"{c.peak_bytes:.0f}",
                        f"{float(c.time.step_s):.6g}", f"{float(c.throughput.tokens_per_s_per_gpu):.6g}",
                        f"{float(c.throughput.mfu):.4f}", f"{c.free_bytes:.0f}",
                        f"{c.headroom.margin_bytes(c.usable_bytes):.0f}", c.fits_with_margin,
                        *(f"{v:.0f}" for v in bands[:2]), *(f"{v:.6g}" for v in bands[2:]),
                        p.tiers[i] if i < len(p.tiers) else "", p.decided_by[i] if i < len(p.decided_by) else ""])
        sys.stdout.write(buf.getvalue())
    else:
        render_plan(p, site, recipe)
        if with_explain:
            render_findings(p, site, recipe)


TopOpt = typer.Option(5, "--top", "-k", help="How many layouts to show.")
ObjOpt = typer.Option(ObjectiveChoice.throughput, "--objective", help="Rank by throughput or memory headroom.")
TpOpt = typer.Option(None, "--tp", help="Allowed TP sizes, e.g. 4,8.")
PpOpt = typer.Option(None, "--pp", help="Allowed PP sizes.")
VpOpt = typer.Option(None, "--vp", help="Allowed virtual pipeline sizes.")
CpOpt = typer.Option(None, "--cp", help="Allowed CP sizes.")
EpOpt = typer.Option(None, "--ep", help="Allowed EP sizes.")
MbsOpt = typer.Option(None, "--mbs", help="Allowed micro-batch sizes (default 1,2,4,8).")
MaxPpOpt = typer.Option(None, "--max-pp", help="Largest PP to consider.")
RecOpt = typer.Option(None, "--recompute", help="Allowed recompute modes: none,selective,full.")
DpOpt = typer.Option(None, "--dp-variant", help="Data-parallel variants: distopt,fsdp,ddp (default distopt,fsdp; "
                     "by default FSDP only at PP 1, CP 1, TP 1 or Blackwell TP <= 2, as NVIDIA runs it; naming "
                     "fsdp searches it on every layout).")
CrossOpt = typer.Option(True, "--allow-cross-node/--nvlink-only",
                        help="CP and EP groups may span NVLink domains (costed on the network), or must not.")
TpOvOpt = typer.Option(False, "--tp-comm-overlap", help="Assume --tp-comm-overlap (TE userbuffers).")
RecModOpt = typer.Option(None, "--recompute-modules",
                         help="Modules selective recompute layouts recompute, comma-separated (default core_attn; "
                              "e.g. core_attn,mla_up_proj,moe_act,layernorm for MoE/MLA models).")


PLAN_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("model", str, ModelOpt), ("gpu", str, GpuOpt), ("num_gpus", int, NumGpusOpt),
    ("gpus_per_node", int | None, GpusPerNodeOpt), ("seq_len", int, SeqLenOpt), ("gbs", int, GbsOpt),
    ("precision", PrecisionChoice, PrecisionOpt), ("top", int, TopOpt), ("objective", ObjectiveChoice, ObjOpt),
    ("tp", str | None, TpOpt), ("pp", str | None, PpOpt), ("vp", str | None, VpOpt), ("cp", str | None, CpOpt),
    ("ep", str | None, EpOpt), ("mbs", str | None, MbsOpt), ("max_pp", int | None, MaxPpOpt),
    ("recompute", str | None, RecOpt), ("dp_variant", str | None, DpOpt), ("allow_cross_node", bool, CrossOpt),
    ("tp_comm_overlap", bool, TpOvOpt), ("gpu_set", list[str] | None, GpuSetOpt),
    ("profile", str | None, ProfileOpt), ("workspace_gib", float | None, WorkspaceOpt),
    ("fragmentation", float | None, FragmentationOpt), ("recompute_modules", str | None, RecModOpt),
    ("attention_backend", AttentionChoice, AttentionOpt), ("headroom", str | None, HeadroomOpt),
    ("knob", list[str] | None, KnobOpt),
)
"""(parameter, type, typer option) of every flag plan and explain share, in --help order: each is a field of
PlanRequest, in the same order, then ``schedule``, which each command places among its own flags
(tests/cli/test_plan_request.py; a new search flag is one entry here and one field there)."""


def with_plan_options(func: Callable[..., None]) -> Callable[..., None]:
    """Give a command the flags of PLAN_OPTIONS, before its own; it receives them as ``req: PlanRequest``."""
    hints = typing.get_type_hints(func)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
           for p in inspect.signature(func).parameters.values() if p.name != "req"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ)
              for name, typ, opt in PLAN_OPTIONS]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name, _, _ in PLAN_OPTIONS}
        plain_values: dict[str, Any] = {k: v.value if isinstance(v, StrEnum) else v for k, v in values.items()}
        func(req=PlanRequest(**plain_values), **kwargs)

    params = shared + own
    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return wrapper


@app.command("plan")
@with_plan_options
def plan_cmd(
    req: PlanRequest,
    explain: bool = typer.Option(False, "--explain", help="Add the reasons in numbers."),
    schedule: ScheduleChoice | None = ScheduleOpt,
    site: str | None = typer.Option(None, "--site", help="Site profile YAML (checkpoint storage, host RAM, "
                                    "failure rate) for the checkpoint columns."),
    save: str | None = typer.Option(None, "--save", help="Write the plan as JSON (for launch/report)."),
    force: bool = ForceOpt,
    fmt: PlanFormat = typer.Option(PlanFormat.table, "--format", "-f", help="Output format."),
    recipes_file: str | None = RecipesFileOpt,
) -> None:
    """Search every valid Megatron-Core layout and rank the ones that fit.

    Example: paraplan plan --model llama3-70b --gpu h100-80gb --num-gpus 64 --seq-len 8192 --gbs 512
    """
    plan_and_emit(replace(req, schedule=schedule.value if schedule is not None else ""), explain=explain, site=site,
                  save=save, force=force, fmt=fmt, recipes_file=recipes_file)


def plan_and_emit(req: PlanRequest, *, explain: bool, site: str | None, save: str | None, force: bool,
                  fmt: PlanFormat, recipes_file: str | None = None) -> None:
    """What plan and explain do with their request: search, save plan.json, print."""
    site_profile = load_site(site)
    if save is not None:
        from paraplan.api import check_output_file

        check_output_file(save, "--save", force=force)
    options, note = site_memory_options(site_profile.env, memory_options(req.workspace_gib, req.fragmentation),
                                        fragmentation_given=req.fragmentation is not None)
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    try:
        p = run_plan(req, options)
    except NoFeasiblePlanError as err:
        if fmt != PlanFormat.json:
            raise
        line = plain(no_fit_line(err).splitlines()[0])  # the advice in the CLI's flags, as for the table
        print(dumps_json(err.to_dict() | {"error": line}))  # the rejection summary as JSON; exit 3 and the line
        print(line, file=sys.stderr)
        state.exit_code = 3
        return
    if save:
        from paraplan.api import save_plan

        save_plan(p, save, option="--save", force=force)
    from paraplan.api import catalogue, compare_with_plan

    recipe = compare_with_plan(p, options, catalogue(recipes_file))
    emit(p, fmt, explain, site_profile, recipe=recipe)


@app.command("explain")
@with_plan_options
def explain_cmd(
    req: PlanRequest,
    save: str | None = typer.Option(None, "--save", help="Write the plan as JSON (for launch/report)."),
    force: bool = ForceOpt,
    fmt: PlanFormat = typer.Option(PlanFormat.table, "--format", "-f", help="Output format."),
    site: str | None = typer.Option(None, "--site", help="Site profile YAML (checkpoint storage, host RAM, "
                                    "failure rate) for the CHECKPOINT finding."),
    schedule: ScheduleChoice | None = ScheduleOpt,
    recipes_file: str | None = RecipesFileOpt,
) -> None:
    """Plan, then explain the best layout in numbers (same options as plan).

    Example: paraplan explain --model llama3-8b --gpu h100-80gb --num-gpus 16 --seq-len 8192 --gbs 256
    """
    if fmt is PlanFormat.csv:  # the findings are text; a CSV would silently drop them
        raise SpecError("--format: explain prints table or json (allowed: table, json); for the layouts as CSV use "
                        "paraplan plan --format csv")
    plan_and_emit(replace(req, schedule=schedule.value if schedule is not None else ""), explain=True, site=site,
                  save=save, force=force, fmt=fmt, recipes_file=recipes_file)
