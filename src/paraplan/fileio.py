"""Reading input files safely, and writing output files without ever leaving a partial one.

Every file the tool reads goes through ``read_input_text`` (regular file, size cap, strict UTF-8)
and then ``load_yaml_text`` / ``load_json_text``, which keep parsing linear in the input: bounded
nesting, bounded alias expansion, no duplicate keys, no NaN/Infinity, no Python tags. Each limit
is a one-line SpecError naming the file and the limit.
"""

from __future__ import annotations

import errno
import json
import math
import os
import reprlib
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Final

import yaml

from paraplan.errors import PlannerError, SpecError

MAX_INPUT_BYTES: Final = 16 * 2**20
"""Largest input file read (plan.json, manifest.json, scripts, CSV): 16 MiB."""
MAX_YAML_BYTES: Final = 2**20
"""Largest YAML file read (model, GPU, site, profile): 1 MiB, a hundred times the largest real one; PyYAML
parses about 1 MiB/s, so a file at the limit loads in about a second."""
MAX_NESTING: Final = 64
"""Deepest nesting of lists/mappings in a YAML or JSON input."""
MAX_YAML_NODES: Final = 100_000
"""Most YAML nodes in a document after alias expansion (a 1 KB alias bomb expands to 10^9)."""

_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 60
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 6
_BRIEF.maxlevel = 3


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, in time bounded whatever the value's size
    (error messages quote user values with this, never with a plain ``repr``)."""
    text = _BRIEF.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def clip(text: object, limit: int = 80) -> str:
    """``str(text)`` shortened to ``limit`` characters (its middle cut out): a user-given name or
    path in an error message."""
    out = str(text)
    half = (limit - 3) // 2
    return out if len(out) <= limit else out[:half] + "..." + out[-half:]


def _shown(path: str | Path) -> str:
    return clip(path)


_FILE_KINDS: Final = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                     (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                     (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str:
    return next((kind for test, kind in _FILE_KINDS if test(mode)), "not a regular file")


_OS_REASONS: Final = {errno.ENOENT: "file not found", errno.EISDIR: "is a directory (give a file)",
                      errno.ENAMETOOLONG: "file name too long", errno.EACCES: "permission denied",
                      errno.ENOTDIR: "a component of the path is not a directory"}


def read_input_text(path: str | Path, what: str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of an input file; SpecError in one line (``what``: the option or field it is for)
    when it is missing, a directory or other non-regular file, unreadable, too long a name, larger
    than ``max_bytes`` or not UTF-8 (a UTF-8 byte-order mark is dropped)."""
    _refuse_empty(path, what)
    shown = _shown(path)
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # checked before open(): opening a FIFO would block
            kind = ("is a directory (give a file)" if stat.S_ISDIR(mode)
                    else f"is {_not_regular(mode)}, not a regular file")
            raise SpecError(f"{what}: cannot read '{shown}': {kind}")
        with open_regular_file(path, what) as f:  # non-blocking open and fstat: a FIFO swapped in cannot block
            data = f.read(max_bytes + 1)
    except OSError as err:
        reason = _OS_REASONS.get(err.errno or 0, err.strerror or str(err))
        raise SpecError(f"{what}: cannot read '{shown}': {reason}") from None
    if len(data) > max_bytes:
        raise SpecError(f"{what}: '{shown}' is larger than {max_bytes // 2**20} MiB (the input size limit)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SpecError(f"{what}: '{shown}' is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def _refuse_empty(path: str | Path, what: str, error: type[PlannerError] = SpecError) -> None:
    """An empty name (an unset shell variable) is refused as one, not read as the current folder ``Path("")``."""
    if isinstance(path, str) and not path:
        raise error(f"{what}: an empty file name (give a file)")


def path_exists(path: str | Path) -> bool:
    """True when ``path`` exists; False when it does not or a stat cannot tell (a name too long, a
    component that is a file), where ``Path.exists`` raises: callers then try presets, and
    ``read_input_text`` names the reason."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


# ----------------------------------------------------------------------------- YAML
class _SafeLoader(yaml.SafeLoader):
    """SafeLoader (no Python tags) that keeps a document's size linear in its text: nesting at most
    MAX_NESTING, at most MAX_YAML_NODES nodes once aliases are expanded, no self-referencing
    aliases, no duplicate keys, integers within Python's digit limit."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._open: set[str] = set()

    def _count(self, n: int, mark: Any) -> None:  # mark: a yaml Mark
        self._expanded += n
        if self._expanded > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_YAML_NODES:,} values once aliases are expanded (the limit)", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} refers to itself", mark)
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), mark)
            return node
        if self._depth >= MAX_NESTING:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_NESTING} levels (the limit)", mark)
        anchor = getattr(event, "anchor", None)
        start = self._expanded
        self._count(1, mark)
        self._depth += 1
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor)
        if anchor is not None:
            self._sizes[id(node)] = self._expanded - start
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {brief(key_node.value)} (first at line {seen[key]})",
                        key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(str(node.value))} digits (limit {sys.get_int_max_str_digits()})",
                node.start_mark) from None


_SafeLoader.add_constructor("tag:yaml.org,2002:int", _SafeLoader.construct_yaml_int)


def load_yaml_text(text: str, what: str, source: str = "") -> Any:
    """The YAML document in ``text`` through the safe loader; SpecError in one line naming ``what``
    (and ``source``, the file) on a syntax error or a limit."""
    return _load_yaml(text, what, source, many=False)


MAX_YAML_DOCUMENTS: Final = 64
"""Documents ``load_yaml_documents`` reads from one stream (a ``kubectl apply -f`` file holds a few)."""


def load_yaml_documents(text: str, what: str, source: str = "") -> list[Any]:
    """Every document of a ``---``-separated YAML stream (at most MAX_YAML_DOCUMENTS; the alias and nesting limits
    hold over the whole stream), as ``load_yaml_text`` reads one."""
    docs: list[Any] = _load_yaml(text, what, source, many=True)
    return docs


def _load_yaml(text: str, what: str, source: str, *, many: bool) -> Any:
    where = f"'{_shown(source)}' " if source else ""
    loader: _SafeLoader | None = None
    try:
        loader = _SafeLoader(text)  # PyYAML's reader checks the characters here (a control byte: ReaderError)
        if not many:
            return loader.get_single_data()
        docs: list[Any] = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            if len(docs) == MAX_YAML_DOCUMENTS:
                raise SpecError(f"{what}: {where}holds more than {MAX_YAML_DOCUMENTS} YAML documents (the limit)")
            docs.append(loader.get_data())
        return docs
    except yaml.YAMLError as err:
        raise SpecError(f"{what}: {where}is not valid YAML: {yaml_error_text(err)}") from None
    except RecursionError:  # not reached under MAX_NESTING; kept so that no input is a traceback
        raise SpecError(f"{what}: {where}is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def yaml_error_text(err: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own text spans several lines)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow (a control byte)
        return f"{problem} at character {err.position + 1}"
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml(path: str | Path, what: str) -> object:
    """The YAML document in ``path``; SpecError in one line (``what``: the field it is for) when the
    file cannot be read or parsed (see ``read_input_text`` and ``load_yaml_text``)."""
    return load_yaml_text(read_input_text(path, what, max_bytes=MAX_YAML_BYTES), what, str(path))


# ----------------------------------------------------------------------------- JSON
class _Refused(ValueError):
    """A JSON value the reader refuses (its message is the reason)."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number (write a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{brief(text, 30)} is not a JSON number within range (write a finite number)")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {brief(key)}")
        out[key] = value
    return out


def _check_depth(doc: Any, limit: int) -> bool:
    """True when ``doc`` nests lists/dicts at most ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= limit:
                return False
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return True


def load_json_text(text: str, what: str, source: str = "") -> Any:
    """The JSON document in ``text``; SpecError in one line naming ``what`` on a syntax error,
    NaN/Infinity, a duplicate key, an integer beyond Python's digit limit, or nesting beyond MAX_NESTING."""
    where = f"'{_shown(source)}' " if source else ""
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                         object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise SpecError(f"{what}: {where}is not valid JSON: {err}") from None
    except _Refused as err:  # NaN/Infinity, 1e999, a duplicate key
        raise SpecError(f"{what}: {where}is not valid JSON: {err}") from None
    except ValueError:  # int() past Python's digit limit
        raise SpecError(f"{what}: {where}is not valid JSON: an integer of more than "
                        f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise SpecError(f"{what}: {where}is nested deeper than {MAX_NESTING} levels (the limit)") from None
    if not _check_depth(doc, MAX_NESTING):
        raise SpecError(f"{what}: {where}is nested deeper than {MAX_NESTING} levels (the limit)")
    return doc


def read_json(path: str | Path, what: str) -> Any:
    """The JSON document in ``path`` (``read_input_text`` then ``load_json_text``)."""
    return load_json_text(read_input_text(path, what), what, str(path))


def non_finite_path(doc: Any) -> str | None:
    """Where the first NaN/inf float in a JSON-ready document is (``a.b[2]``), or None."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "(root)"
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
    return None


_TEMP_STEM_CHARS: Final = 64
"""Of the target's name in its temp file's name (so a 255-byte target name still leaves room)."""


def _kind(st: os.stat_result) -> str | None:
    """What a non-regular file is ("a FIFO (named pipe)" ...), None for a regular file."""
    return None if stat.S_ISREG(st.st_mode) else _not_regular(st.st_mode)


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
    if not str(path):  # Path("") is "." (the current folder): an empty name is a slip, refused
        raise SpecError(f"{option}: an empty file name (give a file name)")
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


def check_regular_file(path: str | Path, what: str, *, error: type[PlannerError] = SpecError) -> os.stat_result:
    """``os.stat`` of ``path`` when it is a regular file (symlinks followed); ``error`` in one line otherwise, before
    anything opens it: a FIFO would block, ``/dev/zero`` never ends, a directory or socket cannot be read."""
    _refuse_empty(path, what, error)
    try:
        info = os.stat(path)
    except OSError as err:
        reason = _OS_REASONS.get(err.errno or 0, err.strerror or str(err))
        raise error(f"{what}: cannot read '{_shown(path)}': {reason}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what}: '{_shown(path)}' is {_not_regular(info.st_mode)}, and only regular files are read")
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
