"""Writing output files without ever leaving a partial one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

import yaml

from paraplan.errors import PlannerError, SpecError


def yaml_error_text(err: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own text spans several lines)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml(path: str | Path, what: str) -> object:
    """The YAML document in ``path``; SpecError in one line (``what``: the field it is for) when the
    file cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{what}: cannot read '{path}': {err.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(f"{what}: '{path}' is not valid YAML: {yaml_error_text(err)}") from None


def check_output_file(path: str | Path, option: str) -> None:
    """Fail early (before any work is done) when ``path`` cannot be an output file: a directory,
    or under a parent that is a file."""
    target = Path(path)
    if target.is_dir():
        raise SpecError(f"{option} {target}: is a directory (give a file name)")
    parent = next((p for p in target.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise SpecError(f"{option} {target}: {parent} is not a directory")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write through a temporary file in the target folder, then rename it into place.

    A crash or error mid-write leaves the previous file (or none), never a truncated one.
    """
    target = Path(path)
    if target.is_dir():
        raise SpecError(f"{target}: is a directory (give a file name)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise SpecError(f"{target}: cannot write here ({err.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise SpecError(f"{target}: cannot write ({err.strerror or err})") from None
        raise


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str:
    return next((kind for test, kind in _FILE_KINDS if test(mode)), "not a regular file")


def check_regular_file(path: str | Path, what: str, *, error: type[PlannerError] = SpecError) -> os.stat_result:
    """``os.stat`` of ``path`` when it is a regular file (symlinks followed); ``error`` in one line otherwise, before
    anything opens it: a FIFO would block, ``/dev/zero`` never ends, a directory or socket cannot be read."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise error(f"{what}: cannot read '{path}': {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what}: '{path}' is {_not_regular(info.st_mode)}, and only regular files are read")
    return info


def open_regular_file(path: str | Path, what: str, *, error: type[PlannerError] = SpecError) -> BinaryIO:
    """``path`` opened for reading bytes, refusing anything but a regular file (``check_regular_file``). It is opened
    non-blocking and checked again with ``fstat``, so a FIFO swapped in after the check cannot block either."""
    check_regular_file(path, what, error=error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise error(f"{what}: cannot read '{path}': {err.strerror or err}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{what}: '{path}' is {_not_regular(mode)}, and only regular files are read")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
