"""The typer application object and per-invocation state shared by the command modules.

Commands load lazily: ``COMMANDS`` names each command's module and one-line help, so ``paraplan
--version`` and ``--help`` import none of numpy, pydantic, plotly and jinja2, and a command imports only
the modules it uses (``benchmarks/startup.py`` measures the start-up). A command module registers its
command on ``app`` with ``@app.command`` as usual; ``LazyGroup`` imports the module when the command
is resolved (run, its ``--help``, shell completion) and builds it with typer.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from paraplan._version import __version__


@dataclass
class _State:
    debug: bool = False
    exit_code: int = 0


state = _State()

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def plain(text: object) -> str:
    """``text`` with control and bidi characters written as escapes (``\\x1b``, ``\\n``, ``\\u202e``): a name
    from a YAML file, a log or plan.json never reaches the terminal as an escape sequence or a line break."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("paraplan.cli.info", "List the built-in model presets with their sizes and sources."),
    "gpus": ("paraplan.cli.info", "List the built-in GPU presets (dense peaks, memory, NVLink and network per GPU)."),
    "estimate": ("paraplan.cli.estimate",
                 "Memory per pipeline stage, step time and throughput of one Megatron layout."),
    "plan": ("paraplan.cli.plan", "Search every valid Megatron-Core layout and rank the ones that fit."),
    "explain": ("paraplan.cli.plan", "Plan, then explain the best layout in numbers (same options as plan)."),
    "ingest": ("paraplan.cli.ingest",
               "Read Megatron-LM training output: step time, TFLOP/s/GPU, memory per rank, timers."),
    "budget": ("paraplan.cli.budget", "Sweep GPU counts per GPU type (best layout each): time to train, "
               "GPU-hours, cost, MFU; recommend."),
    "report": ("paraplan.cli.report", "Write an HTML report: candidate landscape, memory per stage, step time, "
               "pipeline schedule."),
    "launch": ("paraplan.cli.launch", "Write launch files for one layout: megatron_args.sh, env.sh, torchrun.sh, "
               "job.sbatch, pytorchjob.yaml and manifest.json (layout, prediction, candidate id)."),
    "check": ("paraplan.cli.check", "Read a Megatron-LM launch script: broken rules (Megatron's wording), unknown "
              "flags, defaults applied, memory and throughput. Exit code 1 when a rule is broken."),
    "tune": ("paraplan.cli.tune", "Compare a measured Megatron run with its prediction, diagnose it, and propose "
             "the next layout."),
    "recipes": ("paraplan.cli.recipes", "List NVIDIA's Megatron-Bridge performance recipes (and yours): layout, "
                "batch and knobs of each."),
    "calibrate": ("paraplan.cli.calibrate", "Fit GEMM, collective and overlap efficiencies to measured runs; "
                  "write a profile for --profile."),
}
"""command -> (module that registers it, the first paragraph of its docstring on one line)."""


def load_command_modules() -> None:
    """Import every command module (each registers its commands on ``app``)."""
    for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
        importlib.import_module(module)


def _paragraphs(text: str | None) -> list[str]:
    """Help text as paragraphs, each on one line (rich wraps them at the terminal's width)."""
    import inspect

    return [" ".join(p.split()) for p in inspect.cleandoc(text or "").split("\n\n") if p.strip()]


def _print_help(cmd: Any, ctx: Any, commands: list[tuple[str, str]] | None = None) -> None:
    """Usage, help paragraphs, then the arguments and options (and a group's commands) in panels.

    Option names and their types are never cut: when they leave less than ``_MIN_HELP_WIDTH`` columns for
    the help text, each option's help goes on the lines below its names instead of beside them.
    """
    from rich.console import Console, Group, RenderableType
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    con = Console(highlight=False)
    con.print(Padding(Text(cmd.get_usage(ctx), style="bold"), 1))
    for para in _paragraphs(cmd.help):  # the project's own docstrings, in rich markup (as typer reads them)
        con.print(Padding(Text.from_markup(para), (0, 1, 1, 1)))

    def panel(title: str, rows: list[tuple[str, RenderableType]]) -> None:
        if not rows:
            return
        names_width = max(len(name) for name, _ in rows)
        body: RenderableType
        if con.width - 4 - names_width - 2 >= _MIN_HELP_WIDTH:
            table = Table(show_header=False, box=None, expand=True, padding=(0, 1), pad_edge=False)
            table.add_column(style="bold cyan", no_wrap=True, width=names_width)
            table.add_column(ratio=10)
            for name, text in rows:
                table.add_row(name, text)
            body = table
        else:
            body = Group(*(Group(Text(name, style="bold cyan"), Padding(text, (0, 0, 0, 6))) for name, text in rows))
        con.print(Panel(body, title=title, title_align="left", border_style="dim"))

    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    mark = any(p.required for p in params)  # a '*' column only when something is required
    rows = [(("* " if p.required else "  ") * mark + name, text) for p in params
            for name, text in [_param_row(p, ctx, details=commands is None)]]
    panel("Arguments", [row for p, row in zip(params, rows, strict=True) if isinstance(p, TyperArgument)])
    panel("Options", [row for p, row in zip(params, rows, strict=True) if not isinstance(p, TyperArgument)])
    if commands is not None:
        panel("Commands", [(name, Text.from_markup(text)) for name, text in commands])


_MIN_HELP_WIDTH = 36
"""Fewest columns for option help beside the option names; below, the help goes under the names."""


def _param_row(param: Any, ctx: Any, details: bool = True) -> tuple[str, Any]:
    """(names with their type, the help with default and [required]) of one parameter; without ``details``
    (the root help: flags only) just the help text, which spares importing typer's rich help module."""
    from rich.text import Text

    if isinstance(param, TyperArgument):
        names = param.name.upper() + ("..." if param.nargs != 1 else "")
    else:
        names = ", ".join([*(o for o in param.opts if o.startswith("--")), *(o for o in param.opts
                                                                          if not o.startswith("--"))])
        if param.secondary_opts:
            names += " / " + ", ".join(param.secondary_opts)
    kind = None if getattr(param, "is_flag", False) else getattr(param, "display_type_rich", lambda ctx: None)(ctx)
    if kind:
        names += f" {kind}"
    if not details or not hasattr(param, "_extract_default_help_str"):  # click's own --help option
        return names, Text(getattr(param, "help", None) or "")
    from typer import rich_utils

    text = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode="rich")
    for part in text.renderables:  # a word longer than the column folds onto the next line (never cut)
        if isinstance(part, Text):
            part.overflow = "fold"
    return names, text


class HelpCommand(TyperCommand):
    """A typer command whose help keeps option names whole on narrow terminals."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _print_help(self, ctx)


_F = TypeVar("_F", bound=Callable[..., Any])


class _App(typer.Typer):
    """typer.Typer whose commands use HelpCommand."""

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[_F], _F]:
        kwargs.setdefault("cls", HelpCommand)
        return super().command(name, **kwargs)


class LazyGroup(TyperGroup):
    """A typer group whose commands are imported on first use; the root help lists them from COMMANDS."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self._load(cmd_name)
        return self.commands.get(cmd_name)

    def _load(self, cmd_name: str) -> None:
        from typer.main import get_command_from_info, get_command_name

        importlib.import_module(COMMANDS[cmd_name][0])
        for info in app.registered_commands:
            assert info.callback is not None
            name = info.name or get_command_name(info.callback.__name__)
            if name not in self.commands:
                self.commands[name] = get_command_from_info(
                    info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        import difflib

        from typer._click.exceptions import UsageError

        try:
            return self._click_resolve_command(ctx, args)
        except UsageError as err:  # suggest among every command, loaded or not
            matches = difflib.get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                err.message = f"{err.message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The root help lists the commands from COMMANDS (importing none of them)."""
        _print_help(self, ctx, [(name, text) for name, (_, text) in COMMANDS.items()])


app = _App(
    name="paraplan",
    cls=LazyGroup,
    help=(
        "Plan hybrid parallelism (TP/PP/VP/CP/EP/DP) for Megatron-LM training: memory per "
        "pipeline stage, step time and MFU, ranked layouts, launch files.\n\n"
        "Example: paraplan plan --model llama3-70b --gpu h100-80gb --num-gpus 64 --seq-len 8192 --gbs 512"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"paraplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """paraplan: a parallelism planner for Megatron-LM."""
    state.exit_code = 0
