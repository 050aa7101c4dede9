"""Parameter expansion for ``paraplan.launch.shell``: ``$NAME``, ``${NAME}``, ``${NAME:-default}``,
``${NAME:=default}``, ``${NAME:+alt}``, ``${NAME[@]}``, the positional parameters (``$@``, ``$*``, ``$1``, when
the caller knows them: a ``bash -c`` command's words), with bash word splitting of unquoted expansions. Unknown
variables and other forms (``$(...)``, ``$((...))``) stay as literal text.

Expansion is bounded (a variable that doubles itself 40 times would need 2^40 characters): one word
expands to at most MAX_WORD_CHARS, a whole script to MAX_SCRIPT_CHARS in at most MAX_SCRIPT_FIELDS
fields with MAX_SUBSTITUTIONS substitutions; past a limit, SpecError in one line naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from paraplan.errors import SpecError

Seg = tuple[str, str]
"""(text, quote): quote is '' (unquoted), "'" or '"'."""
Word = tuple[Seg, ...]

MAX_WORD_CHARS: Final = 2**20
"""Longest expansion of one word (1 MiB; a Megatron command line is a few KB)."""
MAX_SCRIPT_CHARS: Final = 16 * 2**20
"""Most characters all expansions of one script may produce (16 MiB)."""
MAX_SCRIPT_FIELDS: Final = 200_000
"""Most fields (words after splitting) all expansions of one script may produce (an array that doubles
itself makes millions of one-character fields)."""
MAX_SUBSTITUTIONS: Final = 200_000
"""Most variable substitutions in one script (a long launch script has a few hundred)."""

_EXPANSION: Final = re.compile(
    r"\$(?:\{(?P<brace>[^{}]*(?:\{[^{}]*\}[^{}]*)*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*)|(?P<special>[@*0-9]))"
)


@dataclass
class Env:
    """Shell variables and arrays known so far (seeded by the caller, e.g. from #SBATCH)."""

    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    expanded_chars: int = 0
    """Characters produced by expansions so far (bounded by MAX_SCRIPT_CHARS)."""
    expanded_fields: int = 0
    """Fields produced by expansions so far (bounded by MAX_SCRIPT_FIELDS)."""
    substitutions: int = 0
    """Variable substitutions so far (bounded by MAX_SUBSTITUTIONS)."""
    positional: list[str] | None = None
    """``$0``, ``$1``, ...: the words after a ``bash -c`` command string (None: not known, ``$@`` / ``$1`` stay
    as written)."""
    zero_read: bool = False
    """The ``bash -c`` string reads ``$0`` itself (``"$0" "$@"``): its first argument word is not lost."""
    notes: list[str] = field(default_factory=list)
    """What the reader noticed while expanding (one line each, for ``check``'s notes): ``dollar_zero_note``."""

    def lookup(self, name: str) -> list[str] | None:
        if name in self.arrays:
            return list(self.arrays[name])
        if name in self.scalars:
            return [self.scalars[name]]
        return None


def dollar_zero_note(word: str) -> str:
    """The note when a ``bash -c`` string's ``$0`` is a flag-like word and the string reads its arguments: bash
    takes the first word after the string as ``$0`` (``bash -c STRING [NAME [ARG...]]``), so that word is not in
    ``"$@"`` (nor ``$*``, ``$1``...), and a launch line written without the name word loses its first flag."""
    from paraplan.fileio import brief

    return (f"bash -c: {brief(word)} is the command string's $0 (bash takes the first word after the string as "
            "$0), so \"$@\" leaves it out and the command line runs without it; write a name word before the "
            "arguments (bash -c '...' bash --flag ...)")


def _positional(name: str, env: Env) -> tuple[list[str] | None, bool]:
    """Fields of ``$@`` (one a parameter), ``$*`` (joined by a space) and ``$N`` (empty when unset), as bash
    expands them; None (left as written) when the parameters are not known."""
    if env.positional is None:
        return None, False
    if name != "0" and env.positional[0].startswith("-") and env.positional[0] not in ("-", "--") \
            and not env.zero_read:  # bash -c '...' -- --flags: "--" is the name word, as intended
        note = dollar_zero_note(env.positional[0])
        if note not in env.notes:
            env.notes.append(note)
    if name == "@":
        return env.positional[1:], True
    if name == "*":
        return [" ".join(env.positional[1:])], False
    k = int(name)
    return [env.positional[k] if k < len(env.positional) else ""], False


def _expand_braced(body: str, env: Env) -> tuple[list[str] | None, bool]:
    """Fields of ${body} (None = unresolved) and whether they are array elements."""
    if re.fullmatch(r"[@*]|[0-9]+", body):
        return _positional(body, env)
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", body)
    if m:
        return (list(env.arrays.get(m.group(1), [])) if m.group(1) in env.arrays else None), True
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])?(.*)", body, re.S)
    if not m:
        return None, False
    value = env.lookup(m.group(1))
    joined = None if value is None else " ".join(value)
    op, word = m.group(2), m.group(3)
    if not op:
        return (None if word or joined is None else [joined]), False
    unset = joined is None or (op.startswith(":") and joined == "")
    uses_word = unset if op.endswith(("-", "=")) else (not unset and op.endswith("+"))
    if uses_word and ("$(" in word or "`" in word):  # the word used runs a command: left unexpanded, one
        return None, False  # field (not split at the spaces inside the $(...))
    if op.endswith(("-", "=")):
        if unset:
            default = " ".join(expand_word(((word, '"'),), env))
            if op.endswith("="):
                env.scalars[m.group(1)] = default
            return [default], False
        return [str(joined)], False
    if op.endswith("+"):
        return ([] if unset else [" ".join(expand_word(((word, '"'),), env))]), False
    return (None if unset else [str(joined)]), False


class _Fields:
    """Fields under construction: bash word splitting of unquoted expansions."""

    def __init__(self, env: Env) -> None:
        self.fields: list[str] = []
        self.open = False
        self.quoted_text = False
        self.env = env
        self.chars = 0

    def add(self, text: str) -> None:
        self.chars += len(text)
        self.env.expanded_chars += len(text)
        if self.chars > MAX_WORD_CHARS:
            raise SpecError(f"script: a word expands to more than {MAX_WORD_CHARS // 2**20} MiB (the limit; "
                            "a variable that grows itself?)")
        if self.env.expanded_chars > MAX_SCRIPT_CHARS:
            raise SpecError(f"script: variable expansion produces more than {MAX_SCRIPT_CHARS // 2**20} MiB "
                            "(the limit)")
        if self.open:
            self.fields[-1] += text
        else:
            self.env.expanded_fields += 1
            if self.env.expanded_fields > MAX_SCRIPT_FIELDS:
                raise SpecError(f"script: variable expansion produces more than {MAX_SCRIPT_FIELDS:,} words "
                                "(the limit)")
            self.fields.append(text)
        self.open = True

    def split_value(self, value: str) -> None:
        """An unquoted expansion: split on whitespace, glue to the neighbours."""
        if not value:
            return
        if value[0].isspace():
            self.open = False
        for k, part in enumerate(value.split()):
            if k:
                self.open = False
            self.add(part)
        if value[-1].isspace():
            self.open = False

    def values(self, values: list[str], *, quoted: bool, is_array: bool) -> None:
        for k, v in enumerate(values):
            if k and is_array:
                self.open = False
            if quoted:
                self.add(v)
            else:
                self.split_value(v)

    def segment(self, text: str, quoted: bool, env: Env) -> None:
        pos = 0
        for m in _EXPANSION.finditer(text):
            if m.start() > pos:
                self.add(text[pos:m.start()])
                self.quoted_text |= quoted
            pos = m.end()
            env.substitutions += 1
            if env.substitutions > MAX_SUBSTITUTIONS:
                raise SpecError(f"script: more than {MAX_SUBSTITUTIONS:,} variable substitutions (the limit)")
            if m.group("plain"):
                found = env.lookup(m.group("plain"))
                values, is_array = (None if found is None else [" ".join(found)]), False
            elif m.group("special"):
                values, is_array = _positional(m.group("special"), env)
            else:
                values, is_array = _expand_braced(m.group("brace"), env)
            if values is None:
                self.add(m.group(0))
            else:
                self.values(values, quoted=quoted, is_array=is_array)
                self.quoted_text |= quoted and not is_array
        if pos < len(text):
            self.add(text[pos:])
        self.quoted_text |= quoted and (pos < len(text) or not text)


def expand_word(word: Word, env: Env) -> list[str]:
    """Fields of one word after parameter expansion and word splitting."""
    out = _Fields(env)
    for text, quote in word:
        if quote == "'":
            out.add(text)
        else:
            out.segment(text, quote == '"', env)
    if not out.fields and out.quoted_text:
        return [""]
    return out.fields
