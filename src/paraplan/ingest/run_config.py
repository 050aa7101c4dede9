"""What a Megatron log says about the run itself: the parallel sizes and the argument dump.

Megatron-LM prints, on rank 0 at start-up (megatron-logs.md section 7):

* ``using world size: W, data-parallel size: D, context-parallel size: C, hierarchical
  context-parallel sizes: None, tensor-model-parallel size: T, pipeline-model-parallel size: P``
  (older versions: ``using world size: W, data-parallel-size: D, tensor-model-parallel size: T,
  pipeline-model-parallel size: P``);
* the argument dump after ``validate_args`` (``megatron/training/arguments.py`` ``_print_args``):
  ``------------------------ arguments ------------------------``, one ``  name .... value`` line
  per argument (dest names, dots padding the name to 48 characters), then
  ``-------------------- end of arguments ---------------------``.

``RunConfig.sizes`` maps the names paraplan compares (tp, pp, cp, dp, ep, vp, world, mbs, gbs,
seq_len) to the values the log states; the dump wins over the one-line summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# Linear-time patterns (issue 17): the sizes line is found in two searches (no lazy ``.*?`` between them), runs
# of dashes are matched from their first dash only, and an argument's value is stripped, not matched by ``\s*$``.
_SIZES_HEAD: Final = re.compile(
    r"using world size: (?P<world>\d{1,12}+), data-parallel[- ]size: (?P<dp>\d{1,12}+)"  # int() of <= 12 digits
    r"(?:, context-parallel size: (?P<cp>\d{1,12}+))?")
_SIZES_TAIL: Final = re.compile(r"tensor-model-parallel size: (?P<tp>\d{1,12}+), "
                                r"pipeline-model-parallel size: (?P<pp>\d{1,12}+)")
_ARGS_START: Final = re.compile(r"(?<!-)-{8,}+ arguments -{8}")
_ARGS_END: Final = re.compile(r"(?<!-)-{8,}+ end of arguments -{8}")
_ARG_LINE: Final = re.compile(r"^\s++(?P<name>[A-Za-z_][A-Za-z0-9_]*+) \.*+ ?+(?P<value>.*+)")
_PREFIX: Final = re.compile(r"^(?:\[?rank\d+\]?:\s*|\d+:\s*)")

ARGUMENT_SIZES: Final = {
    "tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "cp": "context_parallel_size",
    "dp": "data_parallel_size", "ep": "expert_model_parallel_size", "vp": "virtual_pipeline_model_parallel_size",
    "world": "world_size", "mbs": "micro_batch_size", "gbs": "global_batch_size", "seq_len": "seq_length",
}
"""paraplan's size names -> the argument-dump names that state them."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The run's own statement of its configuration (either part may be empty)."""

    arguments: tuple[tuple[str, str], ...] = ()
    """The argument dump, (dest name, printed value), in log order."""
    sizes_line: tuple[tuple[str, int], ...] = ()
    """The ``using world size`` line's sizes."""
    source: str = ""

    @property
    def sizes(self) -> dict[str, int]:
        """tp, pp, cp, dp, ep, vp, world, mbs, gbs, seq_len as the log states them (the dump wins
        over the sizes line; VP 1 where the dump says None)."""
        sizes = dict(self.sizes_line)
        args = dict(self.arguments)
        for key, name in ARGUMENT_SIZES.items():
            raw = args.get(name)
            if raw is not None and raw.isascii() and raw.isdigit() and len(raw) <= 12:  # int() stays cheap
                sizes[key] = int(raw)
        if args.get("virtual_pipeline_model_parallel_size") == "None" and "pp" in sizes:
            sizes["vp"] = 1
        return sizes


MAX_ARGUMENTS: Final = 10_000
"""Argument lines kept from one dump: Megatron prints about 700; a dump without its end line would otherwise take
every indented line of the log (timer bodies look like arguments), so the dump is closed there."""


class RunConfigReader:
    """Reads a log line by line (``feed``) for its sizes line and its first argument dump (``result``)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.args: list[tuple[str, str]] = []
        self.inside = self.done = False

    def feed(self, raw: str) -> None:
        """One physical line (without its newline)."""
        if self.done and self.sizes:
            return
        if not self.inside and "using world size: " not in raw and " arguments " not in raw:
            return  # (nor has the line once its prefix is removed)
        line = _PREFIX.sub("", raw.rstrip("\r"))
        if not self.sizes and "using world size: " in line and (head := _SIZES_HEAD.search(line)):
            if tail := _SIZES_TAIL.search(line, head.end()):
                groups = {**head.groupdict(), **tail.groupdict()}
                self.sizes = {k: int(groups[k]) for k in ("world", "dp", "cp", "tp", "pp") if groups[k] is not None}
        if self.done or (" arguments " not in line and not self.inside):
            return
        if _ARGS_START.search(line):
            self.inside = True
        elif self.inside and _ARGS_END.search(line):
            self.inside, self.done = False, True
        elif self.inside and (a := _ARG_LINE.match(line)):
            self.args.append((a["name"], a["value"].rstrip()))
            self.done = len(self.args) >= MAX_ARGUMENTS

    def result(self, source: str = "") -> RunConfig | None:
        """The sizes line and the first argument dump read; None when the log had neither."""
        if not self.sizes and not self.args:
            return None
        return RunConfig(arguments=tuple(self.args), sizes_line=tuple(self.sizes.items()), source=source)


def read_run_config(text: str, source: str = "") -> RunConfig | None:
    """The sizes line and the first argument dump of a log text; None when it has neither."""
    reader = RunConfigReader()
    for raw in text.split("\n"):
        reader.feed(raw)
    return reader.result(source)
