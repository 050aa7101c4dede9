"""The typer application object and per-invocation state shared by the command modules."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from paraplan import __version__


@dataclass
class _State:
    debug: bool = False
    exit_code: int = 0


state = _State()

app = typer.Typer(
    name="paraplan",
    help=(
        "Plan hybrid parallelism (TP/PP/VP/CP/EP/DP) for Megatron-LM training: memory per "
        "pipeline stage, step time and MFU, ranked layouts, launch files.\n\n"
        "Example: paraplan estimate --model llama3-70b --gpu h100-80gb --num-gpus 64 "
        "--tp 4 --pp 4 --cp 2 --seq-len 8192 --gbs 512 --mbs 1"
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
