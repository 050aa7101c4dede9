"""A small bash reader: enough of bash to find a command line in a launch script users keep.

It follows line continuations, comments, single/double quotes, ``NAME=value`` and
``NAME=( ... )`` / ``NAME+=( ... )`` assignments (optionally after ``export``/``declare``),
``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME[@]}`` expansions (with word splitting of
unquoted expansions, as bash does) and ``bash -c '...'`` strings. Anything else (command
substitution, arithmetic, control flow) is kept as literal text: both branches of an ``if`` are
read in order, and an unresolved ``$VAR`` stays in the text so the caller can report it.
It never runs anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from paraplan.launch.expand import Env, Seg, Word, expand_word

__all__ = ["SHELLS", "Command", "Env", "Token", "expand_word", "lex", "read_commands", "shell_c", "word_text"]

Token = Word | str
"""A word, or an operator string: ; & | && || ( ) < >."""

_ASSIGN: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_DECLARE: Final = ("export", "declare", "local", "readonly", "typeset")
_KEYWORDS: Final = ("then", "else", "do", "{", "!", "elif", "if", "while", "until", "exec", "time")
MAX_NESTING: Final = 3


def _read_balanced(text: str, i: int, open_: str, close: str, quotes: bool = True) -> int:
    """Index just after the ``close`` matching the ``open_`` at text[i] (quotes respected)."""
    depth, j, n = 0, i, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if quotes and c in "'\"":
            end = text.find(c, j + 1)
            j = n if end < 0 else end + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.statements: list[list[Token]] = []
        self.current: list[Token] = []
        self.segs: list[Seg] = []
        self.buf = ""
        self.in_word = False
        self.depth = 0

    def flush_word(self) -> None:
        if self.buf:
            self.segs.append((self.buf, ""))
            self.buf = ""
        if self.in_word:
            self.current.append(tuple(self.segs))
        self.segs, self.in_word = [], False

    def flush_statement(self) -> None:
        self.flush_word()
        if self.current:
            self.statements.append(self.current)
        self.current = []

    def op(self, value: str) -> None:
        self.flush_word()
        self.current.append(value)

    def run(self) -> list[list[Token]]:
        text, i, n = self.text, 0, len(self.text)
        while i < n:
            c = text[i]
            if c == "\\":
                if text[i + 1:i + 2] == "\n":
                    i += 2
                    continue
                self.buf += text[i + 1:i + 2]
                self.in_word = True
                i += 2
            elif c == "#" and not self.in_word:
                end = text.find("\n", i)
                i = n if end < 0 else end
            elif c in " \t\r":
                self.flush_word()
                i += 1
            elif c == "\n":
                self.flush_word() if self.depth else self.flush_statement()
                i += 1
            elif c == "'":
                end = text.find("'", i + 1)
                end = n if end < 0 else end
                self._seg(text[i + 1:end], "'")
                i = end + 1
            elif c == '"':
                i = self._double_quoted(i)
            elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
                j = _read_balanced(text, i + 1, text[i + 1], ")" if text[i + 1] == "(" else "}")
                self.buf += text[i:j]
                self.in_word = True
                i = j
            elif c == "`":
                end = text.find("`", i + 1)
                j = n if end < 0 else end + 1
                self.buf += text[i:j]
                self.in_word = True
                i = j
            elif c in ";&|<>()":
                i = self._operator(i)
            else:
                self.buf += c
                self.in_word = True
                i += 1
        self.flush_statement()
        return self.statements

    def _seg(self, text: str, quote: str) -> None:
        if self.buf:
            self.segs.append((self.buf, ""))
            self.buf = ""
        self.segs.append((text, quote))
        self.in_word = True

    def _double_quoted(self, i: int) -> int:
        text, j, n, out = self.text, i + 1, len(self.text), []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                if text[j + 1] != "\n":
                    out.append(text[j + 1])
                j += 2
            elif text[j] == "$" and text[j + 1:j + 2] in ("(", "{"):
                close = ")" if text[j + 1] == "(" else "}"
                k = _read_balanced(text, j + 1, text[j + 1], close, quotes=close == ")")
                out.append(text[j:k])
                j = k
            else:
                out.append(text[j])
                j += 1
        self._seg("".join(out), '"')
        return j + 1

    def _operator(self, i: int) -> int:
        text, c = self.text, self.text[i]
        if c in "<>":
            if self.buf.isascii() and self.buf.isdigit() and not self.segs:  # 2>&1: drop the fd number
                self.buf, self.in_word = "", False
            self.op(c)
            j = i + 1
            if text[j:j + 1] == "&":
                j += 1
            return j
        two = text[i:i + 2]
        if two in ("&&", "||", ";;"):
            self.op(two)
            return i + 2
        if c == "(":
            self.depth += 1
        elif c == ")" and self.depth:
            self.depth -= 1
        self.op(c)
        return i + 1


def lex(text: str) -> list[list[Token]]:
    """Statements (newline-separated outside parentheses) of words and operators."""
    return _Lexer(text).run()


def word_text(word: Word) -> str:
    """The word's text without quotes and without expansion."""
    return "".join(text for text, _ in word)


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command: its fields after expansion, and assignments made just for it."""

    fields: tuple[str, ...]


def _assignment(word: Word) -> tuple[str, bool, Word] | None:
    if not word or word[0][1] != "":
        return None
    m = _ASSIGN.fullmatch(word[0][0])
    if not m:
        return None
    rest: Word = (((m.group(3), ""),) if m.group(3) else ()) + word[1:]
    return m.group(1), m.group(2) == "+", rest


def _split_commands(statement: list[Token]) -> list[list[Token]]:
    out: list[list[Token]] = [[]]
    depth, skip = 0, False
    for tok in statement:
        if skip and not isinstance(tok, str):  # the target of a redirection
            skip = False
            continue
        if tok in ("<", ">"):
            skip = True
            continue
        if isinstance(tok, str):
            if tok == "(" and out[-1] and not isinstance(out[-1][-1], str):
                depth += 1
            elif tok == ")" and depth:
                depth -= 1
            elif depth == 0 and tok not in ("(", ")"):
                out.append([])
                continue
            elif depth == 0:
                continue
        out[-1].append(tok)
    return [c for c in out if c]


def _assignments(tokens: list[Token], i: int, env: Env) -> int:
    """Apply ``NAME=value`` / ``NAME=( ... )`` words from ``i``; index of the first other word."""
    while i < len(tokens) and not isinstance(tokens[i], str):
        assign = _assignment(tokens[i])  # type: ignore[arg-type]
        if assign is None:
            break
        name, append, rest = assign
        if not rest and i + 1 < len(tokens) and tokens[i + 1] == "(":
            items: list[str] = []
            i += 2
            while i < len(tokens) and tokens[i] != ")":
                if not isinstance(tokens[i], str):
                    items.extend(expand_word(tokens[i], env))  # type: ignore[arg-type]
                i += 1
            env.arrays[name] = (env.arrays.get(name, []) if append else []) + items
            env.scalars.pop(name, None)
        else:
            value = " ".join(expand_word(rest, env)) if rest else ""
            env.scalars[name] = (env.scalars.get(name, "") if append else "") + value
            env.arrays.pop(name, None)
        i += 1
    return i


Include = Callable[[str], str | None]
"""Returns the text of a ``source``d file (by the word after ``source``), or None to skip it."""


def _run_command(tokens: list[Token], env: Env, out: list[Command], nesting: int,
                 include: Include | None) -> None:
    i = 0
    while i < len(tokens) and not isinstance(tokens[i], str) and \
            word_text(tokens[i]) in _DECLARE + _KEYWORDS:  # type: ignore[arg-type]
        i += 1
        while i < len(tokens) and not isinstance(tokens[i], str) and \
                word_text(tokens[i]).startswith("-"):  # type: ignore[arg-type]
            i += 1
    i = _assignments(tokens, i, env)
    fields = [f for tok in tokens[i:] if not isinstance(tok, str) for f in expand_word(tok, env)]
    while fields and fields[0] in _KEYWORDS:
        fields.pop(0)
    if not fields:
        return
    out.append(Command(tuple(fields)))
    if nesting >= MAX_NESTING:
        return
    if fields[0] in ("source", ".") and len(fields) > 1 and include is not None:
        text = include(fields[1])
        if text is not None:
            out.extend(read_commands(text, env, nesting=nesting + 1, include=include))
        return
    for k, f in enumerate(fields[:-1]):
        found = shell_c(fields[k:]) if f.rsplit("/", 1)[-1] in SHELLS else None
        if found is not None:
            saved, env.positional = (env.positional, env.zero_read), found[1]
            env.zero_read = re.search(r"\$(?:0|\{0\})(?![0-9])", found[0]) is not None
            try:
                for inner in read_commands(found[0], env, nesting=nesting + 1, include=include):
                    out.append(Command(tuple(fields[:k]) + inner.fields))
            finally:
                env.positional, env.zero_read = saved
            break


SHELLS: Final = ("bash", "sh", "dash", "zsh")
_OPTION_ARG: Final = ("--rcfile", "--init-file")


def shell_c(words: list[str] | tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(command string, [$0, $1, ...]) of ``bash [options] -c STRING [NAME [ARG...]]`` (``words[0]`` a shell), None
    when it does not run a ``-c`` string. As bash reads its options: ``-c`` also inside combined short options
    (``-lc``, ``-ec``, ``-xec``), ``-o``/``-O`` take the next word, long options only before the short ones, ``--``
    ends them; the string is the first word after them, ``$0`` the next one (default: the shell's name) and the
    positional parameters the rest."""
    if not words or words[0].rsplit("/", 1)[-1] not in SHELLS:
        return None
    c, short, i = False, False, 1
    while i < len(words):
        w = words[i]
        if w in ("--", "-"):
            i += 1
            break
        if w.startswith("--"):
            if short:  # bash reads long options only before the short ones ("invalid option")
                return None
            i += 2 if w in _OPTION_ARG else 1
        elif len(w) > 1 and w[0] in "-+":
            c, short = c or (w[0] == "-" and "c" in w[1:]), True
            i += 1 + w[1:].count("o") + w[1:].count("O")
        else:
            break
    if not c or i >= len(words):
        return None
    return words[i], [words[i + 1] if i + 1 < len(words) else words[0], *words[i + 2:]]


def read_commands(text: str, env: Env | None = None, *, nesting: int = 0,
                  include: Include | None = None) -> list[Command]:
    """Every simple command of ``text`` with its expanded fields; ``env`` collects variables.

    ``source FILE`` / ``. FILE`` are followed when ``include`` returns the file's text.
    """
    env = env if env is not None else Env()
    commands: list[Command] = []
    for statement in lex(text):
        for tokens in _split_commands(statement):
            _run_command(tokens, env, commands, nesting, include)
    return commands
