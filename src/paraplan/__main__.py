"""``python -m paraplan`` and the ``paraplan`` program (``[project.scripts]`` in pyproject.toml).

``run`` is ``paraplan.cli.main`` as a process: a Ctrl-C at any moment from its first line to the interpreter's exit
ends the run with one line ("interrupted") and exit 130, or, once the run is over (the output is written and
flushed), changes nothing. Before ``run`` starts (interpreter start-up, ``import paraplan``: a few milliseconds)
Python's own handling applies. This module imports only the standard library, so the CLI's imports (typer, rich,
the command modules) run inside ``run``.
"""

from __future__ import annotations

import signal
import sys


def run() -> int:
    """Run the CLI in this process; returns the exit code (the caller exits with it)."""
    code: int | None = None
    swallowed: list[bool] = []
    previous_hook = sys.unraisablehook

    def _hook(unraisable: object) -> None:  # a Ctrl-C Python drops in an import's gc/weakref callback
        if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
            swallowed.append(True)  # said as "interrupted" below, not as "Exception ignored in ..." and exit 0
            return
        previous_hook(unraisable)  # type: ignore[arg-type]

    try:
        sys.unraisablehook = _hook
        try:
            from paraplan.cli import main
        finally:
            sys.unraisablehook = previous_hook
        if swallowed:
            raise KeyboardInterrupt
        code = main()
        # The run is over and main() flushed its output: a Ctrl-C from here to the exit (interpreter shutdown,
        # where Python would print a traceback from whatever it lands in) changes nothing. Inside the ``try``: one
        # that lands just before the handler takes effect is caught below.
        signal.signal(signal.SIGINT, _run_is_over)
    except KeyboardInterrupt:  # during the imports, or after main() put Python's default handler back
        signal.signal(signal.SIGINT, _run_is_over)  # stopping: a second Ctrl-C does not break into the line
        if code != 130:  # main() said "interrupted" itself when it returned 130
            _say("interrupted")
        code = 130
    return code


def _run_is_over(signum: int, frame: object) -> None:
    """SIGINT once the exit code is known: nothing to interrupt (a Python handler, not SIG_IGN, so that one
    already on its way is not reported as "ignored due to race condition")."""


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):  # no stderr, or a closed one: the exit code says it
        pass


if __name__ == "__main__":
    sys.exit(run())
