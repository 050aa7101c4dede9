"""Writing output files without ever leaving a partial one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Final

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


_REFUSED_KINDS: Final = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                         (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
_TEMP_STEM_CHARS: Final = 64
"""Of the target's name in its temp file's name (so a 255-byte target name still leaves room)."""


def _kind(st: os.stat_result) -> str | None:
    """What a non-regular file is ("a FIFO" ...), None for a regular file."""
    return next((what for test, what in _REFUSED_KINDS if test(st.st_mode)), None if stat.S_ISREG(st.st_mode)
                else "not a regular file")


def _missing_target(target: Path, option: str) -> Path:
    """A target that does not exist yet: its nearest existing parent must be a directory."""
    for parent in target.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise SpecError(f"{option} {target}: {err.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SpecError(f"{option} {target}: {parent} is not a directory")
        break
    return target


def check_output_file(path: str | Path, option: str = "output", *, force: bool = False) -> Path:
    """The path to write ``option``'s output file to, checked before any work is done.

    Refused always (one line naming ``option``): a directory, a device, FIFO or socket (the
    temp-file-and-rename write would replace it with a regular file), a symlink to one of those
    or to nothing, a name the system cannot hold (ENAMETOOLONG), a parent that is a file.
    Refused unless ``force``: an existing file. A symlink to a regular file is written through
    (its target is returned), as a shell redirection would.
    """
    target = Path(path)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return _missing_target(target, option)
    except NotADirectoryError:
        return _missing_target(target, option)
    except OSError as err:
        raise SpecError(f"{option} {target}: {err.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(target)
        except OSError:
            raise SpecError(f"{option} {target}: is a symlink to nothing (remove it or give another name)") from None
        target = Path(os.path.realpath(target))
    kind = _kind(st)
    if kind == "a directory":
        raise SpecError(f"{option} {path}: is a directory (give a file name)")
    if kind is not None:
        raise SpecError(f"{option} {path}: is {kind}, not a regular file; refusing to replace it")
    if not force:
        raise SpecError(f"{option} {path}: exists (use --force to replace it)")
    return target


def write_text_atomic(path: str | Path, text: str, *, option: str = "output", force: bool = False) -> None:
    """Write through a temporary file in the target folder, then rename it into place.

    A crash or error mid-write leaves the previous file (or none), never a truncated one. The
    target is checked by ``check_output_file`` (again: the CLI checks early, this checks at the
    moment of writing); without ``force`` the rename is a hard link, which fails when another
    process created the file meanwhile, so nothing is ever replaced without ``force``.
    """
    target = check_output_file(path, option, force=force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:_TEMP_STEM_CHARS]}.", suffix=".tmp")
    except OSError as err:
        raise SpecError(f"{option} {path}: cannot write here ({err.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        _move_into_place(tmp, target, path, option, force)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise SpecError(f"{option} {path}: cannot write ({err.strerror or err})") from None
        raise


def _move_into_place(tmp: str, target: Path, path: str | Path, option: str, force: bool) -> None:
    if force:
        check_output_file(target, option, force=True)  # still a regular file (or none)
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise SpecError(f"{option} {path}: exists (use --force to replace it)") from None
    except OSError:  # a file system without hard links: check, then rename
        check_output_file(target, option, force=False)
        os.replace(tmp, target)
        return
    os.unlink(tmp)


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
