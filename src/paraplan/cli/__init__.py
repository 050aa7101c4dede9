"""Command-line interface: ``paraplan <command>`` (typer + rich).

The CLI parses options, calls one library function and renders the result; only this package
prints. Exit codes: 0 ok, 1 bad input (one line naming the field and the allowed values),
2 usage error (typer/click), 3 no feasible plan. ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

from paraplan import __version__
from paraplan.cli._app import app, state
from paraplan.errors import NoFeasiblePlanError, PlannerError

_COMMAND_MODULES = (
    "paraplan.cli.info",
    "paraplan.cli.estimate",
    "paraplan.cli.plan",
    "paraplan.cli.ingest",
    "paraplan.cli.budget",
    "paraplan.cli.report",
    "paraplan.cli.launch",
    "paraplan.cli.check",
    "paraplan.cli.tune",
    "paraplan.cli.calibrate",
)
for _name in _COMMAND_MODULES:
    importlib.import_module(_name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (also usable in-process: ``main(["estimate", ...])``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    state.debug = "--debug" in args
    if state.debug:
        args.remove("--debug")
    try:
        app(args=args, prog_name="paraplan", standalone_mode=False)
    except NoFeasiblePlanError as err:
        if state.debug:
            raise
        _err(str(err))
        return 3
    except PlannerError as err:
        if state.debug:
            raise
        _err(f"error: {err}")
        return 1
    except typer.Exit as err:
        return int(getattr(err, "exit_code", 0))
    except typer.Abort:
        _err("aborted")
        return 1
    except typer.TyperException as err:
        # usage errors (unknown option, non-integer value): one line, exit 1
        fmt = getattr(err, "format_message", None)
        _err(f"error: {fmt() if callable(fmt) else err}")
        return 1
    except SystemExit as err:
        return int(err.code) if isinstance(err.code, int) else 1
    return state.exit_code


def _err(message: str) -> None:
    print(message.splitlines()[0] if "\n" in message and not state.debug else message, file=sys.stderr)


__all__ = ["__version__", "app", "main", "typer"]
