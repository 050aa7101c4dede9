"""Quoting every value for the language of the file it lands in (the launch templates' filters).

    sh           a shell word: ``shlex.quote`` (one word, nothing expands)
    sh_comment   text for the rest of a ``#`` comment line (shell or YAML): it stays one line and
                 prints nothing to a terminal: what ``str.isprintable`` rejects (newline, ESC, DEL,
                 U+2028, bidi overrides, odd spaces ...) becomes ``\\xNN`` / ``\\uNNNN``
    yaml         a YAML scalar: PyYAML's double-quoted style, ASCII only, one line, so any text
                 (``---``, ``: ``, ``#``, DEL, NEL) loads back as exactly that one string

Values that are not quoted in a template are integers or names validated where they are made
(environment variable names, the job name, Megatron flags): ``plain_name``, ``integer`` and
``in_dquotes`` check them at render time, so a bad value is an error, never a file.
"""

from __future__ import annotations

import re
import shlex
from typing import Final

import yaml

_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")
_DQUOTE_UNSAFE: Final = frozenset('"$`\\}\'')
"""Characters that would end or expand a ``"${VAR:-word}"`` word early (bash reads a single quote inside
``"${VAR:-word}"`` as a quote too)."""


def _escape_char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(value: object) -> str:
    """``value`` as printable text on one line (unsafe characters escaped, see the module docstring)."""
    return "".join(c if c.isprintable() else _escape_char(c) for c in str(value))


def sh(value: object) -> str:
    """One shell word that expands to exactly ``str(value)``."""
    return shlex.quote(str(value))


def yaml_scalar(value: object) -> str:
    """A one-line YAML double-quoted scalar that loads back as ``str(value)``."""
    text = yaml.safe_dump(str(value), default_style='"', width=float("inf"), allow_unicode=False)
    text = text.rstrip("\n")
    if "\n" in text:  # PyYAML never folds at infinite width; a guard, not a code path
        raise ValueError(f"YAML scalar spans lines: {value!r}")
    return text


def in_dquotes(value: object) -> str:
    """``value`` when it can stand inside a double-quoted shell word unchanged (no ``" $ ` \\ } '``,
    printable, one line); ValueError otherwise."""
    text = str(value)
    if _DQUOTE_UNSAFE & set(text) or one_line(text) != text:
        raise ValueError(f"cannot go inside a double-quoted shell word: {text!r}")
    return text


def integer(value: object) -> str:
    """``value`` when it is an int (not a bool); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not an integer: {value!r}")
    return str(value)


def plain_name(value: object) -> str:
    """``value`` when it is a plain name (``[A-Za-z0-9._-]+``) that needs no quoting; ValueError otherwise."""
    text = str(value)
    if not _PLAIN_NAME.fullmatch(text):
        raise ValueError(f"not a plain name: {text!r}")
    return text


__all__ = ["in_dquotes", "integer", "one_line", "plain_name", "sh", "yaml_scalar"]
