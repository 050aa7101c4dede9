"""Command-line interface: ``paraplan <command>`` (typer + rich).

The CLI parses options, calls one library function and renders the result; only this package
prints. Exit codes: 0 ok, 1 bad input (one line naming the field and the allowed values),
2 usage error (typer/click: an unknown command or option, a missing option or value, extra arguments;
a non-numeric or unknown value is bad input, 1), 3 no feasible plan
(``plan``/``explain``; with ``--format json`` the rejection summary as JSON on stdout), 4 the layout
does not fit in usable memory (``estimate``/``check``; one that fits only inside the ``--headroom``
margin is a warning, exit 0), 130 interrupted (Ctrl-C); an output that cannot be written (a full disk,
/dev/full) is one line and exit 1. ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import typer

from paraplan._version import __version__
from paraplan.cli._app import COMMANDS, app, load_command_modules, plain, state
from paraplan.errors import NoFeasiblePlanError, PlannerError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (also usable in-process: ``main(["estimate", ...])``). A Ctrl-C at any
    moment of the call is exit 130 with one line, also one that lands before the handler of ``_ctrl_c_seen`` is
    installed or while it is put back."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    state.debug = "--debug" in args
    if state.debug:
        args.remove("--debug")
    if not args:  # bare `paraplan`: the help, exit 0
        args = ["--help"]
    with _ctrl_c_seen() as seen:
        try:
            code = _run(args)
            sys.stdout.flush()
        except KeyboardInterrupt:
            _err("interrupted")
            return 130
        except OSError as err:
            if state.debug:
                raise
            _stdout_gone(err)
            return 1
    if seen and code != 130:  # a Ctrl-C whose KeyboardInterrupt a finalizer swallowed ("Exception ignored in ...")
        _err("interrupted")
        return 130
    return code


@contextlib.contextmanager
def _ctrl_c_seen() -> Iterator[list[bool]]:
    """While the block runs, SIGINT records itself (the yielded list becomes ``[True]``) and raises
    KeyboardInterrupt as Python's default handler does, once: a second Ctrl-C while the first is on its way out is
    only recorded, so it cannot break into the one "interrupted" line. Python drops an exception raised inside a
    finalizer or a gc callback ("Exception ignored in ..." and a traceback on stderr): such a KeyboardInterrupt is
    recorded without that report (the command exits 130 with its one line) and the next Ctrl-C raises again;
    without the record the command would finish and exit 0. Only where Python's default handler is installed, in
    the main thread (in-process callers keep theirs)."""
    seen: list[bool] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield seen
        return
    raised = [False]  # a KeyboardInterrupt of ours is on its way out, or the handler is being put back
    previous_hook = sys.unraisablehook

    def _handler(signum: int, frame: object) -> None:
        seen.append(True)
        if not raised[0]:
            raised[0] = True
            raise KeyboardInterrupt

    def _hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            raised[0] = False  # swallowed: recorded in ``seen``, said as "interrupted"
            return
        previous_hook(unraisable)

    try:  # a Ctrl-C while the handler goes in or out raises out of here (main() says "interrupted") or is recorded
        sys.unraisablehook = _hook
        signal.signal(signal.SIGINT, _handler)
        yield seen
    finally:
        raised[0] = True  # from here on only recorded: the default handler is surely put back
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook


_FAST_FORMATS = ("table", "json", "csv")


def fast_command(args: Sequence[str]) -> tuple[str, str] | None:
    """(command, format) when ``args`` are exactly ``models`` or ``gpus`` with at most one ``--format``/``-f``
    of table, json or csv (``--format json``, ``--format=json``, ``-f json``, ``-fjson``): ``main`` runs those
    without building typer's command, whose option parsing imports pydantic. Anything else (``--help``, another
    value, a second option, shell completion) is None and goes through typer, so help and errors are typer's."""
    if not args or args[0] not in ("models", "gpus") or "_PARAPLAN_COMPLETE" in os.environ:
        return None
    rest = list(args[1:])
    if not rest:
        return args[0], "table"
    if len(rest) == 2 and rest[0] in ("--format", "-f"):
        fmt = rest[1]
    elif len(rest) == 1 and rest[0].startswith("--format="):
        fmt = rest[0][len("--format="):]
    elif len(rest) == 1 and rest[0].startswith("-f"):
        fmt = rest[0][len("-f"):]
    else:
        return None
    return (args[0], fmt) if fmt in _FAST_FORMATS else None


def _run(args: list[str]) -> int:
    fast = fast_command(args)
    try:
        if fast is None:
            rv = app(args=args, prog_name="paraplan", standalone_mode=False)
        else:
            from paraplan.cli.info import FAST_COMMANDS, ListFormat

            state.exit_code = 0
            FAST_COMMANDS[fast[0]](ListFormat(fast[1]))
            rv = None
    except NoFeasiblePlanError as err:
        if state.debug:
            raise
        from paraplan.cli.render import no_fit_line

        _err(no_fit_line(err))
        return 3
    except PlannerError as err:
        if state.debug:
            raise
        from paraplan.cli.render import error_line

        _err(f"error: {error_line(err)}")
        return 1
    except typer.Exit as err:
        return int(getattr(err, "exit_code", 0))
    except typer.Abort:
        _err("aborted")
        return 1
    except typer.TyperException as err:
        # one line; a bad value (non-integer, not a choice) is bad input, exit 1; a command line of the
        # wrong shape (unknown command or option, a missing option or value, extra arguments) is usage, exit 2
        fmt = getattr(err, "format_message", None)
        _err(f"error: {fmt() if callable(fmt) else err}")
        return 2 if _is_usage_error(err) else 1
    except SystemExit as err:
        return int(err.code) if isinstance(err.code, int) else 1
    if isinstance(rv, int) and not isinstance(rv, bool) and rv:  # typer.Exit(n) inside click, e.g. 130 on Ctrl-C
        if rv == 130:
            _err("interrupted")
        return rv
    return state.exit_code


def _is_usage_error(err: Exception) -> bool:
    """Click's UsageError other than a bad value (BadParameter; a missing one is usage). By class name: typer
    vendors click's exception classes (typer._click), older typers re-export click's own."""
    names = {cls.__name__ for cls in type(err).__mro__}
    return "UsageError" in names and ("BadParameter" not in names or "MissingParameter" in names)


def _stdout_gone(err: OSError) -> None:
    """One line for an OSError that escaped the command: a file it named, or the output stream (a full disk,
    /dev/full, a closed pipe); the rest of the buffered output is dropped so that the interpreter's exit flush
    does not print a traceback."""
    if err.filename is not None:
        _err(f"error: {err.filename}: {err.strerror or err}")
        return
    if err.errno != errno.EPIPE:
        _err(f"error: cannot write the output: {err.strerror or err}")
    for stream in (sys.stdout, sys.__stdout__):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())  # type: ignore[union-attr]
            os.close(devnull)
        except (AttributeError, OSError, ValueError):
            pass


def _err(message: str) -> None:
    """One line on stderr (the whole message with --debug), control characters from names as escapes."""
    lines = message.splitlines() or [""]
    print("\n".join(plain(line) for line in (lines if state.debug else lines[:1])), file=sys.stderr)


__all__ = ["COMMANDS", "__version__", "app", "fast_command", "load_command_modules", "main", "typer"]
