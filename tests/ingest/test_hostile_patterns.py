"""Every log-parsing regex runs in linear time (issue 17): a hostile 100 KB line is matched or rejected in < 0.5 s.

Each pattern gets the inputs that made the old patterns super-linear (a run of the characters that two quantifiers
both accept, a prefix that reaches the expensive part, a prefix repeated for ``search``). A pattern the code only
``match``es or ``fullmatch``es (ANCHORED; checked against the source) is timed that way; every other one with
``findall`` too (``search`` from every position, as ``sub`` and ``split`` do). A quadratic pattern takes minutes on
100 KB, a linear one milliseconds; an alarm stops a runaway match at 2 s. ``test_every_pattern_is_covered`` makes
a new pattern come with its own hostile cases.
"""

from __future__ import annotations

import inspect
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

from paraplan.ingest import megatron, parse_text, primus, run_config, stream, theoretical
from paraplan.ingest.run_config import read_run_config

SIZE = 100_000
LIMIT_S = 0.5
MODULES: tuple[ModuleType, ...] = (megatron, primus, theoretical, run_config, stream)


def h(prefix: str, unit: str, tail: str = "\x00") -> str:
    """``prefix`` + ``unit`` repeated to 100 KB + a character no pattern accepts there."""
    return prefix + unit * ((SIZE - len(prefix)) // len(unit)) + tail


def rep(unit: str) -> str:
    """``unit`` repeated to 100 KB: a search restarts at each copy."""
    return unit * (SIZE // len(unit)) + "\x00"


HIP = "hip mem usage/free/total/usage_ratio"
HOSTILE: dict[str, list[str]] = {
    "megatron._VALUE": [h("", "1"), h("1", " / 1"), h("", " "), h("1", "/1"), h("", "1."), h("1e", "1")],
    "megatron._PREFIX": [h("", "1: "), h("", "[rank0]: "), h("[", "a"), h("", " "), h("INFO:", "a."),
                         h("[a][INFO", " ")],
    "megatron._ANSI": [h("\x1b[", "1;"), rep("\x1b[1")],
    "megatron._GLUE": [h("iteration ", " "), h("[Rank ", "1"), h(" [2024-01-01 ", "1"), rep("x iteration 1 "),
                       h("x iteration 1", " "), rep("Training epoch 1"), h("1", "(min, max) time"), rep("[Rank 1]")],
    "megatron._ITER": [h("iteration", " "), h("iteration 1", " "), rep("iteration "), h("iteration ", "1"),
                       h("iteration:", " "), h("iteration 1/", " ")],
    "megatron._STAMP": [h("[2024-01-01 ", "1"), rep("[2024-01-01 1")],
    "megatron._KV_SEP": [h("", "a")],
    "megatron._NEMO1": [h("Epoch 1: 1%|", "a"), h("Epoch 1: 1%| 1/2 [", "a"), rep("Epoch 1: 1%|"),
                        h("Epoch 1: 1%|", "1"), h("Epoch 1:", " "), h("Epoch ", "1")],
    "megatron._RATE": [h("", "1"), h("", "1."), h("1", " "), rep("1e"), rep("1.")],
    "megatron._MEM": [h("[Rank 1] (", "a"), h("memory (MB) |", " "), h("[Rank ", "1"), h("[Rank 1]", " ")],
    "megatron._MEM_CTX": [h("", "1"), rep("iteration 1"), rep("1 ")],
    "megatron._DS_STEP": [h("global_step=", "1"), rep("global_step=1")],
    "megatron._DS_MEM": [h("MemAllocated=", "1"), rep("MemAllocated=1GB, MaxMemAllocated=1"), rep("MemAllocated="),
                         h("MemAllocated=1GB, MaxMemAllocated=", "1")],
    "megatron._LEGACY_TIMERS": [h("time (ms) |", " "), h("[Rank ", "1"), h("time (ms)", " ")],
    "megatron._MINMAX": [h("    a", " ."), h("    a ", "."), h("    a .: (", "1"), h("    a .: (1, 1)", " "),
                         h("    ", " "), rep("a .: (1, 1) "), h("    a", " "), h("    a .: (1,", " ")],
    "megatron._MAXBODY": [h("    a", " ."), h("    a ", "."), h("    a .: ", "1"), h("    a .: 1", " "),
                          h("    ", " "), rep("a .: 1 "), h("    a", " ")],
    "megatron._VALID": [h("validation loss at the end of training for ", "a"), h("validation loss at iteration 1", " "),
                        h("validation loss at iteration ", "1")],
    "megatron._STEP": [h("Step Time : ", "1"), h("Step Time : 1", " "), h("Step Time : 1 s", " "),
                       rep("Step Time : 1 s GPU utilization: 1"), h("Step Time", " ")],
    "stream._HEADER": [h("(min, max) time across ranks (ms):", " "), h("", " ")],
    "stream._ALL_NAME": [h("a", "b"), h("a", " ")],
    "stream._ALL_RANK": [h("rank", " "), h("rank 1:", " "), h("rank ", "1")],
    "stream._NOISE": [h("", "-"), h("Theoretical memory footprints not yet supported", " ")],
    "primus._RANK": [h("[rank-", "1"), rep("[rank-1/")],
    "primus._HIP": [h(HIP, " "), h(HIP + ":", " "), rep(HIP)],
    "primus._HIP_VALUE": [h("", " "), h("1", " "), h("", "1")],
    "primus._PAIR_VALUE": [h("", " "), h("1", " "), h("1 / ", "1"), h("", "1")],
    "theoretical._BILLIONS": [h("number of ", "a"), h("number of a", " in billion"), h("number of a in billions:", " "),
                              h("number of ", " in")],
    "theoretical._PER_LAYER": [h("Activation memory footprint per transformer layer (", "a"),
                               h("Activation memory footprint per transformer layer:", " ")],
    "theoretical._PENALTY": [h("Memory penalty from interleaved schedule:", " ")],
    "theoretical._IN_FLIGHT": [h("Number of in-flight microbatches:", " "),
                               h("Number of in-flight microbatches:", "1")],
    "theoretical._MARKER": [h("compute_activation_memory", "_")],
    "theoretical._UNSUPPORTED": [h("Theoretical memory footprints not yet supported for ", "."),
                                 h("Theoretical memory footprints not yet supported for ", "a")],
    "theoretical._SUMMARY": [h("Theoretical memory footprints:", " "), rep("Theoretical memory footprints:")],
    "theoretical._NAME": [h("", "a "), h("", "a\t"), h("", "("), h("", "a"), h("", " a\t")],
    "theoretical._MB": [h("=", " "), h("= 1", " "), h("=", "1"), rep("=1 ")],
    "run_config._SIZES_HEAD": [rep("using world size: 1, data-parallel size: 1"), h("using world size: ", "1")],
    "run_config._SIZES_TAIL": [rep("tensor-model-parallel size: 1, "), h("tensor-model-parallel size: ", "1")],
    "run_config._ARGS_START": [h("", "-"), rep("-------- arguments ")],
    "run_config._ARGS_END": [h("", "-"), rep("-------- end of arguments ")],
    "run_config._ARG_LINE": [h("  name", " "), h("  name ", "."), h("  name ", ". "), h("  name .... ", " "),
                             h("", " ")],
    "run_config._PREFIX": [h("", "1"), h("[rank", "1")],
}  # fmt: skip


def _patterns() -> dict[str, re.Pattern[str]]:
    return {f"{m.__name__.rsplit('.', 1)[1]}.{name}": value for m in MODULES for name, value in vars(m).items()
            if isinstance(value, re.Pattern)}


class _Runaway(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Runaway


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise ``_Runaway`` after ``seconds`` (the regex engine checks for signals)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _seconds(fn: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    try:
        with _deadline(2.0):
            fn(text)
    except _Runaway:
        return float("inf")
    return time.perf_counter() - start


ANCHORED = {"megatron._VALUE", "primus._PAIR_VALUE", "primus._HIP_VALUE", "theoretical._MB"}
"""Patterns used only with ``match``/``fullmatch`` (one start position), not starting with ``^``."""


def test_every_pattern_is_covered() -> None:
    assert set(_patterns()) == set(HOSTILE)
    for name in ANCHORED:
        module, attr = name.split(".")
        source = inspect.getsource(next(m for m in MODULES if m.__name__.endswith(f".{module}")))
        assert re.findall(rf"\b{attr}\.(?:match|fullmatch)\(", source), name
        assert not re.findall(rf"\b{attr}\.(?:search|findall|finditer|sub|subn|split)\(", source), name


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_pattern_is_linear_on_hostile_100kb_lines(name: str) -> None:
    pattern = _patterns()[name]
    methods = (pattern.match, pattern.fullmatch) if name in ANCHORED else (pattern.findall, pattern.fullmatch)
    for text in HOSTILE[name]:
        for fn in methods:
            took = _seconds(fn, text)
            assert took < LIMIT_S, f"{name}.{fn.__name__} took {took:.2f} s on {text[:40]!r}... ({len(text)} chars)"


ISSUE_LINES = [  # issue 17's lines, at 100 KB: _KV (>120 s at 3 KB), _PAIR (15 s at 20 KB), _ARG_LINE (11 s at 32 KB)
    h("iteration 1/10 |", " ", "x"),
    h("Theoretical memory footprints: ", "a ", ""),
    h("Theoretical memory footprints: weight and optimizer=1 MB, ", "a", "=1"),
    "------------------------ arguments ------------------------\n" + h("  name", " ", "x"),
    h(" iteration 1/10 | lr: ", "1", "x"),
    h("[rank-1/8] iteration 1/2 | a: ", "1/"),
    h("using world size: 1, data-parallel size: 1", " "),
]


@pytest.mark.parametrize("text", ISSUE_LINES, ids=[t[:24] for t in ISSUE_LINES])
def test_issue_lines_parse_in_linear_time(text: str) -> None:
    took = _seconds(parse_text, text)
    assert took < LIMIT_S, f"parse_text took {took:.2f} s"
    log = parse_text(text)
    assert log.lines == len([ln for ln in text.split("\n") if ln.strip()])


SWEEP_PREFIXES = [
    "", "iteration 1/10 |", "iteration ", " iteration 1/10 | lr: ", "Theoretical memory footprints: ",
    "Theoretical memory footprints: a=1 MB, ", "  name ", "Epoch 0: 1%|", "Epoch 0: 1%| 1/2 [", "[Rank 0] (",
    "[Rank 0] memory (MB) | allocated: ", "global_step=1 MemAllocated=", "Step Time : 1",
    "validation loss at iteration 1 |", "time (ms) |", HIP + ": ", "[rank-1/8] iteration 1/2 | a: ",
    "    forward .... : (", "rank ", "number of ",
    "using world size: 1, data-parallel size: 1", "[2024-01-01 00:00:00] ", "[rank0]: ", "[x][INFO][y] - ",
]  # fmt: skip
SWEEP_UNITS = [" ", "\t", "1", "a", ":", "=", "|", ".", "/", "-", "1.", " 1", "a=", " / 1", "a=1 MB", "iteration 1"]


def test_whole_parser_sweep_stays_linear() -> None:
    """``parse_text`` and ``read_run_config`` on prefix + 30 KB of one repeated unit: each well under the limit."""
    slowest = (0.0, "")
    for prefix in SWEEP_PREFIXES:
        for unit in SWEEP_UNITS:
            text = prefix + unit * (30_000 // len(unit)) + "\x00"
            took = _seconds(parse_text, text) + _seconds(read_run_config, "-------- arguments --------\n" + text)
            slowest = max(slowest, (took, f"{prefix!r} + {unit!r} * n"))
    assert slowest[0] < LIMIT_S, f"slowest: {slowest[1]} took {slowest[0]:.2f} s"
