"""Hostile input for the whole CLI (issue 17): a hypothesis fuzz over every subcommand and the corpus in
tests/fixtures/hostile, all run in-process through ``paraplan.cli.main(argv)``.

Properties checked on every call (``check_call``):
  * no exception escapes ``main()``; it returns an int in {0, 1, 2, 3, 4, 130};
  * on an exit code other than 0, stderr is exactly one line with a message (not a bare "error:"), never a
    traceback;
  * each call ends within ``call_limit_s`` (SIGALRM), under an address-space cap ``MEMORY_LIMIT_BYTES`` above
    what the process had, and the whole fuzz grows peak RSS by less than that;
  * no ESC byte (\\x1b) reaches stdout or stderr (the output is not a terminal, so rich adds none: any ESC comes
    from an input name);
  * ``--format json`` output and every *.json written are strict JSON (no NaN/Infinity);
  * output targets: a failed call leaves no new output behind, an existing regular file is not replaced
    without ``--force``, a FIFO or device node is never replaced by a regular file;
  * every successful ``launch``: each *.sh and job.sbatch is sourced/run with bash in a sandbox (HOME and a PATH
    whose torchrun/srun/python/python3/sbatch/scontrol/module only record their argv) and no canary file
    ``PWNED*`` (what the hostile names try to create) appears; every *.yaml loads as exactly one document.

Examples per command scale with PARAPLAN_FUZZ_EXAMPLES (total, default 2000; CI runs derandomized).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# Known failures: none. A test id listed here is marked xfail(strict=False) with the reason; keep it empty
# (issue 17's bar is 0 tracebacks, 0 hangs), and never loosen a property instead.
KNOWN_FAILURES: dict[str, str] = {}


def known(test_id: str) -> list[pytest.MarkDecorator]:
    """The xfail mark of a test id listed in KNOWN_FAILURES (none otherwise)."""
    reason = KNOWN_FAILURES.get(test_id)
    return [pytest.mark.xfail(strict=False, reason=reason)] if reason else []


if not hasattr(signal, "SIGALRM"):  # pragma: no cover - POSIX only
    pytest.skip("the fuzz harness needs SIGALRM (POSIX)", allow_module_level=True)

from paraplan.cli import app, main  # noqa: E402  (after the POSIX check)
from paraplan.cli._app import COMMANDS, load_command_modules  # noqa: E402

HOSTILE = Path(__file__).resolve().parents[1] / "fixtures" / "hostile"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTS = Path(__file__).resolve().parents[1]
CALL_LIMIT_S = 10.0
FIT_CALL_LIMIT_S = 30.0
"""``calibrate``'s bound: its fit runs about 840 step-time evaluations (two Nelder-Mead passes over six parameters),
10-14 s on a slow 2-core machine (measured 13.2 s for two runs in session 12), where every other command answers
well within CALL_LIMIT_S. The bound still catches a hang."""


def call_limit_s(argv: Sequence[str]) -> float:
    """The time bound of one call: ``FIT_CALL_LIMIT_S`` for ``calibrate``, ``CALL_LIMIT_S`` otherwise."""
    return FIT_CALL_LIMIT_S if argv and argv[0] == "calibrate" else CALL_LIMIT_S
MEMORY_LIMIT_BYTES = 1 << 30
EXIT_CODES = frozenset({0, 1, 2, 3, 4, 130})
TOTAL_EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "2000"))
CANARY = "PWNED"
ESC = b"\x1b"
DEVICE_FILES = ("megatron_args.sh", "env.sh", "torchrun.sh", "job.sbatch")
BASH = shutil.which("bash")


# ----------------------------------------------------------------------------------------- the harness
class CallTimeout(BaseException):
    """Raised by SIGALRM inside a call that ran past CALL_LIMIT_S (a BaseException: nothing swallows it)."""


@dataclass
class Call:
    """One invocation: argv plus how the process around it behaves."""

    argv: list[str]
    stdout_full: bool = False  # stdout is /dev/full (ENOSPC on write)
    interrupt_after_s: float | None = None  # Ctrl-C (KeyboardInterrupt) after this long
    # (kind, digest) of each output target after the same call ran to the end: an interrupted call may leave
    # exactly that (the Ctrl-C came after the output was complete) or nothing, never anything else
    complete_outputs: dict[str, tuple[str, str | None]] | None = None

    def __repr__(self) -> str:
        extra = (" > /dev/full" if self.stdout_full else "") + (
            f" (Ctrl-C after {self.interrupt_after_s:.3f} s)" if self.interrupt_after_s is not None else "")
        return f"Call(paraplan {' '.join(_sh(a) for a in self.argv)}{extra})"


def _sh(word: str) -> str:
    import shlex

    return shlex.quote(word) if len(word) < 200 else shlex.quote(word[:60]) + f"...({len(word)} chars)"


@dataclass
class Outcome:
    call: Call
    rc: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    escaped: str | None  # traceback of an exception that left main()
    interrupted: bool = False


def _vm_size_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def _address_space_cap() -> Iterator[None]:
    """RLIMIT_AS = what the process maps now + MEMORY_LIMIT_BYTES, for one call (Linux; no-op elsewhere)."""
    now = _vm_size_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if now is None:
        yield
        return
    cap = now + MEMORY_LIMIT_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class _Alarm:
    """SIGALRM: a KeyboardInterrupt at ``interrupt_after_s`` (once), CallTimeout at CALL_LIMIT_S. Raises only while
    the called function (``code``: main(), or what a test put in its place) is on the stack where the signal lands
    (the ``frame`` Python hands the handler), from its first bytecode to its last: one that comes before the call
    started is retried 1 ms later, one after it returned (``done``) is dropped, so the harness itself is never
    interrupted and "the run was already over" means exactly that main() had returned."""

    def __init__(self, interrupt_after_s: float | None, code: Any, limit_s: float = CALL_LIMIT_S) -> None:
        self.interrupt_after_s = interrupt_after_s
        self.limit_s = limit_s
        self.code = code
        self.done = False
        self.interrupted = False
        self.start = 0.0

    def __enter__(self) -> _Alarm:
        self.previous = signal.signal(signal.SIGALRM, self._fire)
        self.start = time.monotonic()
        first = self.limit_s if self.interrupt_after_s is None else min(self.interrupt_after_s, self.limit_s)
        signal.setitimer(signal.ITIMER_REAL, max(first, 1e-4))
        return self

    def _in_call(self, frame: Any) -> bool:
        while frame is not None:
            if frame.f_code is self.code:
                return True
            frame = frame.f_back
        return False

    def _fire(self, _signum: int, frame: Any) -> None:
        if self.done:
            return
        if not self._in_call(frame):
            signal.setitimer(signal.ITIMER_REAL, 1e-3)
            return
        if self.interrupt_after_s is not None and not self.interrupted:
            self.interrupted = True
            signal.setitimer(signal.ITIMER_REAL, max(self.limit_s - (time.monotonic() - self.start), 1e-4))
            signal.raise_signal(signal.SIGINT)  # a real Ctrl-C: whatever handler main() installed runs, now
            return
        # again every 0.5 s until the call is over: a raise inside a finalizer or gc callback is swallowed
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        raise CallTimeout(f"still running after {self.limit_s:g} s")

    def __exit__(self, *exc: object) -> None:
        self.done = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


@contextlib.contextmanager
def _no_gc_callbacks() -> Iterator[None]:
    """No gc callbacks (hypothesis times GC) during a call: SIGALRM raising inside one would be swallowed."""
    saved = gc.callbacks[:]
    gc.callbacks.clear()
    try:
        yield
    finally:
        gc.callbacks[:] = saved


_ENV_DROP = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")


def run_cli(call: Call, cwd: Path) -> Outcome:
    """``main(call.argv)`` in ``cwd`` with stdin empty and stdout/stderr captured as bytes (stdout strict UTF-8,
    stderr backslashreplace, as Python sets them up under a UTF-8 locale)."""
    out_buf, err_buf = io.BytesIO(), io.BytesIO()
    out: io.TextIOBase
    if call.stdout_full:
        out = open("/dev/full", "w", encoding="utf-8")
    else:
        out = io.TextIOWrapper(out_buf, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_buf, encoding="utf-8", errors="backslashreplace", write_through=True)
    stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr, Path.cwd()
    saved_env = {k: os.environ.pop(k) for k in _ENV_DROP if k in os.environ}
    rc: int | None = None
    escaped: str | None = None
    target = main
    alarm = _Alarm(call.interrupt_after_s, target.__code__, call_limit_s(call.argv))
    t0 = time.monotonic()
    try:
        os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = stdin, out, err
        with _address_space_cap(), warnings.catch_warnings(record=True) as caught, _no_gc_callbacks():
            warnings.simplefilter("default")  # as the installed CLI does (pytest would make them errors)
            with alarm:
                try:
                    try:
                        result = target(list(call.argv))
                    finally:
                        alarm.done = True
                    sys.stdout.flush()  # what the interpreter does at exit: ENOSPC / EPIPE surface here
                    if not isinstance(result, int) or isinstance(result, bool):
                        escaped = f"main() returned {result!r}, not an int"
                    else:
                        rc = result
                except BaseException:  # the property is that nothing gets here
                    alarm.done = True
                    escaped = traceback.format_exc(limit=-12)
            for w in caught:  # printed on stderr by the real interpreter
                if alarm.interrupted and issubclass(w.category, ResourceWarning):
                    # a KeyboardInterrupt between open() and its ``with`` drops the file object, which closes it
                    # (and warns) as it goes; the interpreter ignores ResourceWarning unless asked (-X dev)
                    continue
                err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    finally:
        seconds = time.monotonic() - t0
        sys.stdin, sys.stdout, sys.stderr = saved[0], saved[1], saved[2]
        os.chdir(saved[3])
        os.environ.update(saved_env)
        stdout = out_buf.getvalue()
        if call.stdout_full:
            with contextlib.suppress(OSError):
                out.close()
    return Outcome(call=call, rc=rc, stdout=stdout, stderr=err_buf.getvalue(), seconds=seconds,
                   escaped=escaped, interrupted=alarm.interrupted)


# ------------------------------------------------------------------------------------ output targets
OUTPUT_PARAMS = frozenset({"out", "output", "save", "html"})


@dataclass(frozen=True)
class _Target:
    option: str
    path: str
    kind: str  # missing | file | dir | fifo | chardev | link | other
    digest: str | None


def _kind(p: Path) -> str:
    try:
        st_ = p.lstat()
    except OSError:
        return "missing"
    mode = st_.st_mode
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "chardev")):
        if test(mode):
            return name
    return "other"


def _digest(p: Path, kind: str) -> str | None:
    if kind == "file":
        return hashlib.sha256(p.read_bytes()).hexdigest()
    if kind == "dir":  # the files that were there (new ones may be added)
        return json.dumps({c.name: _digest(c, "file") for c in sorted(p.iterdir()) if _kind(c) == "file"})
    if kind == "link":
        return os.readlink(p)
    return None


def output_targets(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) of the output options in argv (``--out x``, ``-o x``, ``--save=x``...)."""
    names = {"--out", "-o", "--output", "--save", "--html"}
    found = []
    for i, word in enumerate(argv):
        if word in names and i + 1 < len(argv):
            found.append((word, argv[i + 1]))
        elif "=" in word and word.split("=", 1)[0] in names:
            found.append((word.split("=", 1)[0], word.split("=", 1)[1]))
    return found


def snapshot(cwd: Path, argv: Sequence[str]) -> list[_Target]:
    out = []
    for option, value in output_targets(argv):
        try:
            p = cwd / value
            kind = _kind(p)
            out.append(_Target(option, value, kind, _digest(p, kind)))
        except (OSError, ValueError):
            continue  # too long / not representable: nothing can be there
    return out


# ------------------------------------------------------------------------------------- the properties
def _strict_json(text: str | bytes, what: str) -> None:
    def bad(token: str) -> None:
        raise AssertionError(f"{what}: non-standard JSON constant {token}")

    json.loads(text, parse_constant=bad)


def check_call(o: Outcome, cwd: Path, before: list[_Target], sandbox: Sandbox | None) -> None:
    """All properties of one call; AssertionError naming the first one broken."""
    call = o.call
    assert o.escaped is None, f"{call!r}: exception escaped main():\n{o.escaped}"
    assert o.rc in EXIT_CODES, f"{call!r}: exit code {o.rc} not in {sorted(EXIT_CODES)}"
    err = o.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, f"{call!r}: traceback on stderr:\n{err}"
    if o.interrupted:
        assert o.rc == 130, f"{call!r}: Ctrl-C gave exit code {o.rc}, expected 130"
    if o.rc != 0:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].strip(), (
            f"{call!r}: exit {o.rc} with stderr of {len(lines)} line(s) (want exactly one): {err[:600]!r}")
        assert lines[0].strip().rstrip(":") not in ("error", "aborted"), f"{call!r}: exit {o.rc} with {lines[0]!r}"
    assert o.seconds < call_limit_s(call.argv), f"{call!r}: took {o.seconds:.1f} s"
    for where, data in (("stdout", o.stdout), ("stderr", o.stderr)):
        assert ESC not in data, f"{call!r}: ESC byte on {where}: {_around(data, ESC)!r}"
    argv = call.argv
    if o.rc == 0 and not call.stdout_full and not o.interrupted and _format(argv) == "json":
        _strict_json(o.stdout, f"{call!r}: stdout of --format json")
    _check_targets(o, cwd, before)
    if o.rc == 0 and not o.interrupted and argv and argv[0] == "launch" and sandbox is not None:
        for _option, value in output_targets(argv):
            check_launch_dir(cwd / value, sandbox, call)


def _around(data: bytes, needle: bytes) -> bytes:
    i = data.find(needle)
    return data[max(0, i - 40): i + 40]


def _format(argv: Sequence[str]) -> str | None:
    fmt = None
    for i, word in enumerate(argv):
        if word in ("--format", "-f") and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif word.startswith("--format="):
            fmt = word.split("=", 1)[1]
    return fmt


def _check_targets(o: Outcome, cwd: Path, before: list[_Target]) -> None:
    call = o.call
    force = "--force" in call.argv
    for t in before:
        p = cwd / t.path
        kind = _kind(p)
        if t.kind in ("fifo", "chardev", "link", "other"):
            assert kind == t.kind, f"{call!r}: output target {t.path!r} was a {t.kind}, is now a {kind}"
            assert _digest(p, kind) == t.digest, f"{call!r}: output symlink {t.path!r} now points elsewhere"
        elif t.kind == "file" and not force:
            assert kind == "file" and _digest(p, kind) == t.digest, (
                f"{call!r}: existing file {t.path!r} replaced without --force")
        elif t.kind == "dir" and not force and kind == "dir":
            now = json.loads(_digest(p, "dir") or "{}")
            for name, digest in json.loads(t.digest or "{}").items():
                assert now.get(name) == digest, f"{call!r}: {t.path}/{name} replaced without --force"
        # With stdout on a full device the files are complete before the "wrote ..." line fails to print: the exit
        # is 1 (nothing could be said) but what was written is whole and right, so it may stay.
        if o.rc not in (0, None) and t.kind == "missing" and not call.stdout_full:
            left = kind if kind != "dir" else ("dir" if any(p.iterdir()) else "missing")
            complete = (call.complete_outputs or {}).get(t.path)
            if o.interrupted and left != "missing" and complete is not None:
                assert (kind, _digest(p, kind)) == complete, (
                    f"{call!r}: interrupted, and left output {t.path!r} ({kind}) that is not what the whole run "
                    "writes (a partial output)")
            else:
                assert left == "missing", f"{call!r}: failed (exit {o.rc}) but left output {t.path!r} ({kind})"
        if o.rc == 0 and kind == "file" and t.option == "--save":  # plan.json
            _strict_json(p.read_bytes(), f"{call!r}: written {t.path}")


# ----------------------------------------------------------------------- launch files in a bash sandbox
@dataclass
class Sandbox:
    root: Path
    bin: Path
    home: Path


_STUB = """#!/bin/sh
printf '%s\\n' "$(basename "$0") $*" >> "$STUB_LOG"
exit 0
"""
_SCONTROL = """#!/bin/sh
printf '%s\\n' "scontrol $*" >> "$STUB_LOG"
echo node001
"""


def make_sandbox(root: Path) -> Sandbox:
    sb = Sandbox(root=root, bin=root / "bin", home=root / "home")
    sb.bin.mkdir(parents=True)
    sb.home.mkdir()
    for name in ("torchrun", "srun", "python", "python3", "sbatch", "module", "nvidia-smi"):
        (sb.bin / name).write_text(_STUB)
    (sb.bin / "scontrol").write_text(_SCONTROL)
    for p in sb.bin.iterdir():
        p.chmod(0o755)
    return sb


def _canaries(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            found += [os.path.join(dirpath, n) for n in (*dirnames, *filenames) if CANARY in n]
    return found


def check_launch_dir(out: Path, sb: Sandbox, call: Call) -> None:
    """Run the generated files with stub launchers (no canary may appear), then: YAML is one document each, JSON
    is strict."""
    if not out.is_dir():
        return
    log = sb.root / "stub.log"
    env = {"PATH": f"{sb.bin}:/usr/bin:/bin", "HOME": str(sb.home), "STUB_LOG": str(log), "LAUNCH_DIR": str(out),
           "SLURM_JOB_NODELIST": "node001", "SLURM_NNODES": "1", "SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(out),
           "MASTER_ADDR": "node001", "LANG": "C.UTF-8"}
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in out.glob("*.sh"))
    for name in _placeholders(text):
        env.setdefault(name, "/sandbox/placeholder")
    for name in DEVICE_FILES:
        script = out / name
        if BASH is None or not script.exists():
            continue
        cmd = [BASH, "-c", 'source "$1"', "bash", str(script)] if name in ("megatron_args.sh", "env.sh") else [
            BASH, str(script)]
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(cmd, cwd=out, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=CALL_LIMIT_S, check=False)
        found = _canaries(out, sb.home, out.parent)
        assert not found, f"{call!r}: running {name} with stub launchers created {found}"
    for path in sorted(out.glob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise AssertionError(f"{call!r}: {path.name} is not valid YAML: {err}") from None
        assert len(docs) == 1 and isinstance(docs[0], dict), (
            f"{call!r}: {path.name} holds {len(docs)} YAML document(s), want one mapping")
    for path in sorted(out.glob("*.json")):
        _strict_json(path.read_bytes(), f"{call!r}: {path.name}")


def _placeholders(text: str) -> set[str]:
    import re

    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", text))


# ----------------------------------------------------------------------------------- the environment
@dataclass
class FuzzEnv:
    root: Path
    corpus: Path  # the hostile corpus plus files made at test time
    sandbox: Sandbox
    chardev: bool = False

    @property
    def stage(self) -> Path:
        return self.root / "stage"

    def new_cwd(self) -> Path:
        """The working directory of the next call, reset: every corpus file linked in by name, odd paths to give
        as input or output (fifo, chardev, links, directories, existing files), and nothing else. One directory
        reused (creating ~100 links per call is slow on some file systems)."""
        cwd = self.stage
        cwd.mkdir(exist_ok=True)
        names = {p.name: p for p in self.corpus.iterdir()}
        for p in cwd.iterdir():
            target = names.get(p.name)
            if target is not None and p.is_symlink() and os.readlink(p) == str(target):
                continue
            _remove(p)
        for name, target in names.items():
            if not (cwd / name).is_symlink():
                (cwd / name).symlink_to(target)
        os.mkfifo(cwd / "fifo")
        for d in ("dir", "existing_dir"):
            (cwd / d).mkdir()
        (cwd / "existing_dir" / "keep.txt").write_text("keep\n")
        (cwd / "existing.json").write_text('{"keep": true}\n')
        (cwd / "existing.html").write_text("<p>keep</p>\n")
        (cwd / "existing.yaml").write_text("keep: true\n")
        (cwd / "link_to_fifo").symlink_to(cwd / "fifo")
        (cwd / "loop").symlink_to(cwd / "loop")
        if self.chardev:
            with contextlib.suppress(OSError):
                os.mknod(cwd / "chardev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
        for p in self.sandbox.home.iterdir():
            _remove(p)
        return cwd


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _make_big_files(corpus: Path) -> None:
    """The hostile files over 20 KB (README.md): long lines, a gzip bomb, a big log."""
    (corpus / "log_theoretical_20k.log").write_text(
        "Theoretical memory footprints: " + "weight and optimizer " * 1000 + "x\n")
    (corpus / "log_argdump_32k.log").write_text(
        "------------------------ arguments ------------------------\n  num_layers " + "." * 10
        + " 2" + " " * 32_000 + "x\n-------------------- end of arguments ---------------------\n")
    (corpus / "log_long_line_1m.log").write_text("iteration 1/10 | " + "lr: 1 | " * 130_000 + "\n")
    member = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    with open(corpus / "gzip_bomb.log.gz", "wb") as f:  # 4 GiB of NUL bytes in ~4 MB: 4096 gzip members
        for _ in range(4096):
            f.write(member)
    line = ("[2026-01-01 00:00:00] iteration      {i}/  100000 | consumed samples: {s} | elapsed time per "
            "iteration (ms): 1000.0 | learning rate: 1.0E-04 | global batch size:   256 | lm loss: 2.0E+00 | "
            "loss scale: 1.0 | grad norm: 0.5 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    with open(corpus / "log_big_5mb.log", "w") as f:
        for i in range(1, 20_001):
            f.write(line.format(i=i, s=256 * i))


VALID_MODEL = """name: tiny
num_layers: 4
hidden_size: 256
num_attention_heads: 4
vocab_size: 1024
max_position_embeddings: 4096
"""
VALID_SITE = """partition: batch
account: research
time: "01:00:00"
container_image: nvcr.io/nvidia/nemo:25.04
env:
  NCCL_DEBUG: INFO
"""
VALID_RUNS = """model,gpu,num_gpus,tp,pp,mbs,gbs,seq_len,recompute,step_time_s
llama3-8b,h100-80gb,8,1,1,1,64,4096,selective,1.2
llama3-8b,h100-80gb,8,2,1,1,64,4096,selective,1.4
"""


def _derived(corpus: Path, plan: dict[str, Any], manifest: dict[str, Any]) -> None:
    """plan.json / manifest.json variants made from real ones (too big for the 20 KB corpus limit)."""
    for tag, name in (("newline", "x\ntouch PWNED_plan_newline\n# "), ("subst", "x$(touch PWNED_plan_subst)"),
                      ("document", "x\n---\nkind: Pod\n# "), ("escape", "x\x1b]0;pwned\x07")):
        doc = json.loads(json.dumps(plan))
        doc["inputs"]["model"]["name"] = name
        doc["inputs"]["gpu"]["name"] = name
        (corpus / f"plan_name_{tag}.json").write_text(json.dumps(doc))
    doc = json.loads(json.dumps(plan))
    doc["inputs"]["gpu"]["network_bytes_per_s"] = float("nan")
    doc["inputs"]["gpu"]["efficiency"]["gemm_max_frac"] = float("inf")
    (corpus / "plan_gpu_nan.json").write_text(json.dumps(doc))
    doc = json.loads(json.dumps(plan))
    doc["plan"]["candidates"][0]["config"]["tp"] = "four"
    doc["inputs"]["num_gpus"] = [8]
    (corpus / "plan_config_wrong_types.json").write_text(json.dumps(doc))
    doc = json.loads(json.dumps(manifest))
    doc["layout"]["tp"] = float("nan")
    doc["inputs"]["num_gpus"] = float("inf")
    (corpus / "manifest_nan_fields.json").write_text(json.dumps(doc))
    doc = json.loads(json.dumps(manifest))
    doc["inputs"]["model"]["name"] = "x\ntouch PWNED_manifest\n# "
    (corpus / "manifest_name_newline.json").write_text(json.dumps(doc))


def build_env(root: Path) -> FuzzEnv:
    corpus = root / "corpus"
    shutil.copytree(HOSTILE, corpus)
    (corpus / "README.md").unlink(missing_ok=True)
    _make_big_files(corpus)
    (corpus / "valid_model.yaml").write_text(VALID_MODEL)
    (corpus / "valid_gpu.yaml").write_text("base: h100-80gb\nname: my-h100\nnetwork_gbit_per_s: 200\n")
    (corpus / "valid_site.yaml").write_text(VALID_SITE)
    (corpus / "valid_runs.csv").write_text(VALID_RUNS)
    (corpus / "valid_args.txt").write_text(MEGATRON_ARGS_TEXT)
    env = FuzzEnv(root=root, corpus=corpus, sandbox=make_sandbox(root / "sandbox"))
    setup = root / "setup"
    setup.mkdir()
    for argv in (["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16", "--save",
                  str(corpus / "valid_plan.json")],
                 ["launch", "--plan", str(corpus / "valid_plan.json"), "-o", str(setup / "launch")],
                 ["calibrate", "--runs", str(corpus / "valid_runs.csv"), "-g", "h100-80gb", "-o",
                  str(corpus / "valid_profile.yaml")]):
        o = run_cli(Call(argv), setup)
        assert o.rc == 0, f"setup {argv}: {o.escaped or o.stderr.decode()}"
    shutil.copy(setup / "launch" / "manifest.json", corpus / "valid_manifest.json")
    _derived(corpus, json.loads((corpus / "valid_plan.json").read_text()),
             json.loads((corpus / "valid_manifest.json").read_text()))
    try:
        os.mknod(root / "probe", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        env.chardev = True
    except OSError:
        env.chardev = False
    return env


def _fast_tmp() -> str | None:
    """/dev/shm (tmpfs) when writable: the harness resets its working directory before every call."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@pytest.fixture(scope="module")
def fuzz_env() -> Iterator[FuzzEnv]:
    root = Path(tempfile.mkdtemp(prefix="paraplan-fuzz-", dir=_fast_tmp()))
    try:
        yield build_env(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_and_check(env: FuzzEnv, call: Call) -> Outcome:
    cwd = env.new_cwd()
    before = snapshot(cwd, call.argv)
    o = run_cli(call, cwd)
    check_call(o, cwd, before, env.sandbox)
    found = _canaries(cwd, env.sandbox.home)
    assert not found, f"{call!r}: created {found}"
    return o


# --------------------------------------------------------------------------------------- value pools
MODEL_PRESETS = ["gpt2", "llama3-8b", "llama2-7b", "mixtral-8x7b", "qwen3-30b-a3b", "llama3-70b"]
GPU_PRESETS = ["h100-80gb", "a100-80gb", "h200-141gb", "b200", "gb200", "mi300x"]
MEGATRON_ARGS_TEXT = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 1024 "
                      "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 16 "
                      "--tensor-model-parallel-size 1 --vocab-size 1024")
LOGS = [*sorted(str(p) for p in (FIXTURES / "logs").rglob("*.log")), str(TESTS / "report" / "data" / "train.log")]
SCRIPTS = sorted(str(p) for p in (TESTS / "launch" / "fixtures").iterdir())
HF = sorted(str(p) for p in (FIXTURES / "hf").glob("*.json"))
CORPUS_NAMES = [
    *sorted(p.name for p in HOSTILE.iterdir() if p.name != "README.md"),
    "log_theoretical_20k.log", "log_argdump_32k.log", "log_long_line_1m.log", "gzip_bomb.log.gz", "log_big_5mb.log",
    "plan_name_newline.json", "plan_name_subst.json", "plan_name_document.json", "plan_name_escape.json",
    "plan_gpu_nan.json", "plan_config_wrong_types.json", "manifest_nan_fields.json", "manifest_name_newline.json"]
NAME_MODELS = sorted(n for n in CORPUS_NAMES if n.startswith("model_name_"))
INPUT_ODDITIES = ["fifo", "link_to_fifo", "dir", ".", "/", "missing.yaml", "no/such/dir/x.json", "loop",
                  "/dev/null", "/dev/zero", "x" * 300, "a/" * 2100 + "x", "existing.json", "-", "", "~/x.yaml",
                  "chardev", "empty.yaml"]
OUTPUT_ODDITIES = ["existing.json", "existing.html", "existing.yaml", "existing_dir", "dir", "fifo", "link_to_fifo",
                   "chardev", "loop", "existing.json/child.json", "x" * 300 + ".json", "a/" * 2100 + "x.json",
                   "name\nwith newline.json", "with space.json", "-", "", ".", "nested/new/out.json"]
INTS_BOUNDARY = ["0", "-1", "1", "3", "7", "2147483647", "2147483648", "4294967296", "9223372036854775807",
                 "9223372036854775808", "-9223372036854775809", "18446744073709551616", "999999999999", "1e309",
                 "nan", "inf", "-inf", "1.5", "0x10", "", " 8", "\u0663", "9" * 5000, "1_000", "+4", "08"]
FLOATS_BOUNDARY = ["0", "-0.0", "-1", "1e309", "-1e309", "1e-309", "nan", "inf", "-inf", "1e308", "5e-324", "",
                   "9" * 5000, "0x1p3", "1,5", "\u0663"]
TEXT_HOSTILE = ["x" * 100_000, "\n", "a\nb", "\r", "\t", "\x7f", "\x1b]0;title\x07", "\x1b[31mred\x1b[0m",
                "[link=https://evil.example/]x[/link]", "[bold]b", "[/]", "$(touch PWNED_argv)",
                "`touch PWNED_argv_tick`", "'; touch PWNED_argv_quote; '", "\udcff\udcfe", "caf\u00e9", "\u202e",
                "--", "-", "--help", "=", ",", "%s%n", "{0}", "{{x}}", "\\", "\u2028", "\ufeffx", "\x08\x0c\x0b"]
GPU_SET_HOSTILE = ["efficiency=3", "hbm_gib=[1", "hbm_gib=!!python/object/apply:os.system [\"touch PWNED_gpu_set\"]",
                   "efficiency.gemm_max_frac=inf", "efficiency.gemm_max_frac=.inf", "network_gbit_per_s=.nan",
                   "network_gbit_per_s=nan", "hbm_gib=1e309", "hbm_gib=-1", "hbm_gib=0", "=", "x", "hbm_gib=",
                   "name=x\ntouch PWNED_gpu_set_name", "efficiency.nope=1", "hbm_gib=&a [*a, *a]",
                   "gpus_per_node=2147483648", "gpus_per_node=9223372036854775808", "efficiency.=1",
                   "a: &a [*a]", "efficiency.gemm_max_frac={a: 1}", "hbm_gib=" + "9" * 5000]
JUNK = ["--", "-", "--help", "--version", "-x", "--no-such-option", "=", "-n", "--format", "extra",
        "--tp", "-h"]


def _ints(*values: int) -> st.SearchStrategy[str]:
    return st.sampled_from([str(v) for v in values])


def _names(names: Sequence[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(list(names))


def _text() -> st.SearchStrategy[str]:
    # argv cannot hold NUL; everything else (controls, surrogates from non-UTF-8 bytes) can arrive
    return st.text(st.characters(blacklist_characters="\x00"), max_size=40)


VALID: dict[str, st.SearchStrategy[str]] = {
    "model": st.one_of(_names(MODEL_PRESETS), _names(["valid_model.yaml", *NAME_MODELS, *HF[:3],
                                                      str(FIXTURES / "logs" / "synthetic" / "argument_dump.log")])),
    "model_small": _names(["gpt2", "llama3-8b", "valid_model.yaml", "model_name_newline.yaml"]),  # report/budget
    "gpu": st.one_of(_names(GPU_PRESETS), _names(["valid_gpu.yaml", "gpu_name_newline.yaml"])),
    "gpu_list": _names(["h100-80gb", "h100-80gb,b200", "a100-80gb,h200-141gb", "valid_gpu.yaml"]),
    "count": _ints(1, 2, 4, 8, 16, 32, 64),
    "seq": _ints(512, 1024, 2048, 4096),
    "batch": _ints(8, 16, 32, 64, 128, 512),
    "small": _ints(1, 2, 4),
    "int_list": _names(["1", "2", "1,2", "1,2,4", "4", "2,8"]),
    "recompute_list": _names(["none", "selective", "full", "none,full", "selective,full"]),
    "dp_list": _names(["distopt", "fsdp", "distopt,fsdp", "ddp"]),
    "modules_list": _names(["core_attn", "core_attn,mlp", "mla_up_proj,moe_act"]),
    "modules": _names(["core_attn", "mlp", "moe", "layernorm", "moe_act", "mla_up_proj", "shared_experts"]),
    "gpu_set": _names(["network_gbit_per_s=200", "efficiency.gemm_max_frac=0.7", "hbm_gib=40", "gpus_per_node=4"]),
    "profile": _names(["valid_profile.yaml"]),
    "site": _names(["valid_site.yaml", "site_command_substitution.yaml"]),
    "plan": _names(["valid_plan.json", "plan_name_newline.json", "plan_name_subst.json", "plan_name_document.json",
                    "plan_name_escape.json"]),
    "manifest": _names(["valid_manifest.json", "manifest_name_newline.json"]),
    "log": _names(LOGS),
    "pair": _names([f"valid_manifest.json:{LOGS[-1]}", f"valid_manifest.json:{LOGS[0]},{LOGS[-1]}"]),
    "runs": _names(["valid_runs.csv", "bom_runs.csv"]),
    "params": _names(["gemm_max_frac", "gemm_max_frac,dp_overlap_frac", "attention_frac"]),
    "tokens": _names(["1e9", "300B", "15T", "2.5e12", "1000000"]),
    "price": _names(["2.5", "h100-80gb=2.5", "h100-80gb=2.5,b200=4.5"]),
    "per_node": _names(["8", "4", "h100-80gb=4"]),
    "float": _names(["0.125", "0", "1", "0.5"]),
    "frac": _names(["0.05", "0", "0.2"]),
    "days": _names(["1", "30", "0.5"]),
    "script": _names([*SCRIPTS, "script_self_doubling.sh", "script_array_doubling.sh"]),
    "megatron_args": _names([MEGATRON_ARGS_TEXT, "@valid_args.txt", f"@{SCRIPTS[0]}"]),
    "out_file": _names(["out.json", "out.html", "out.yaml", "sub/out.json"]),
    "out_dir": _names(["outdir", "runs/a"]),
    "text": _names(["cluster X, 2026-11-29", "src"]),
}
_INPUT_KINDS = {"model", "model_small", "gpu", "gpu_list", "profile", "site", "plan", "manifest", "log", "runs",
                "script"}
_INT_KINDS = {"count", "seq", "batch", "small"}
_FLOAT_KINDS = {"float", "frac", "days"}


def hostile(kind: str) -> st.SearchStrategy[str]:
    """Boundary and hostile values for one kind of option value."""
    text = st.one_of(_names(TEXT_HOSTILE), _text())
    if kind in ("out_file", "out_dir"):
        return _names(OUTPUT_ODDITIES)  # never an absolute path: the fuzz must not write outside its tmp dir
    if kind in _INPUT_KINDS:
        return st.one_of(_names(CORPUS_NAMES), _names(INPUT_ODDITIES), text)
    if kind == "pair":
        return st.one_of(st.builds(lambda a, b: f"{a}:{b}", _names(CORPUS_NAMES + INPUT_ODDITIES),
                                   _names(CORPUS_NAMES + LOGS[:2])), _names([":", "a.json:", ":b.log", ".json:"]),
                         text)
    if kind in _INT_KINDS:
        return st.one_of(_names(INTS_BOUNDARY), text)
    if kind in _FLOAT_KINDS:
        return st.one_of(_names(FLOATS_BOUNDARY), text)
    if kind in ("int_list", "recompute_list", "dp_list", "modules_list"):
        return st.one_of(_names(INTS_BOUNDARY), _names(["1,,2", ",", "1," * 5000, "1-4", "0,1", "none,,", "2**31"]),
                         text)
    if kind == "gpu_set":
        return st.one_of(_names(GPU_SET_HOSTILE), text)
    if kind == "megatron_args":
        return st.one_of(st.builds(lambda n: "@" + n, _names(CORPUS_NAMES + INPUT_ODDITIES)),
                         _names(["--num-layers", "--num-layers 1e309", "--tensor-model-parallel-size 2147483648",
                                 "'unterminated", "--seq-length -1 --num-layers 2", "$(touch PWNED_margs)"]), text)
    if kind in ("tokens", "price", "per_node"):
        return st.one_of(_names(FLOATS_BOUNDARY + INTS_BOUNDARY), _names(["15X", "T", "1e309T", "h100-80gb=nan",
                                                                          "=", "b200=1,b200=2", "nope=4"]), text)
    return text


# ------------------------------------------------------------------------------ argv from click params
COMMAND_NAMES = ("estimate", "plan", "explain", "launch", "check", "ingest", "tune", "calibrate", "report",
                 "budget", "models", "gpus", "recipes")
SEARCH_COMMANDS = {"plan", "explain", "report"}


@dataclass(frozen=True)
class Param:
    name: str
    opts: tuple[str, ...]
    secondary: tuple[str, ...]
    is_flag: bool
    multiple: bool
    positional: bool
    nargs: int
    choices: tuple[str, ...]
    kind: str


def _kind_of(cmd: str, name: str, annotation: Any) -> str:
    if cmd in SEARCH_COMMANDS and name in ("tp", "pp", "vp", "cp", "ep", "mbs"):
        return "int_list"
    special = {("budget", "gpu"): "gpu_list", ("budget", "model"): "model_small",
               ("report", "model"): "model_small", ("budget", "gpus_per_node"): "per_node",
               ("launch", "out"): "out_dir", ("calibrate", "out"): "out_file", ("calibrate", "gpu"): "gpu",
               ("plan", "recompute"): "recompute_list", ("explain", "recompute"): "recompute_list",
               ("report", "recompute"): "recompute_list", ("plan", "recompute_modules"): "modules_list",
               ("explain", "recompute_modules"): "modules_list"}
    if (cmd, name) in special:
        return special[(cmd, name)]
    by_name = {
        "model": "model", "gpu": "gpu", "num_gpus": "count", "gpus": "count", "gpus_per_node": "count",
        "max_gpus": "count", "seq_len": "seq", "gbs": "batch", "max_gbs": "batch", "dp_variant": "dp_list",
        "gpu_set": "gpu_set", "profile": "profile", "workspace_gib": "float", "fragmentation": "frac",
        "days": "days", "tokens": "tokens", "price": "price", "html": "out_file", "save": "out_file",
        "output": "out_file", "site": "site", "plan": "plan", "plan_path": "plan", "plan_file": "plan",
        "manifest": "manifest", "log": "log", "logs": "log", "pair": "pair", "runs": "runs", "params": "params",
        "source": "text", "script": "script", "megatron_args": "megatron_args", "recompute_modules": "modules",
    }
    if name in by_name:
        return by_name[name]
    if annotation in (int,):
        return "small"
    if annotation in (float,):
        return "float"
    return "text"


def command_params(cmd: str) -> list[Param]:
    import typer

    load_command_modules()  # commands load lazily; the fuzz reads every command's parameters
    click_cmd = typer.main.get_command(app).commands[cmd]  # type: ignore[attr-defined]
    out = []
    for p in click_cmd.params:
        if p.name == "help":
            continue
        ann = p.type_descriptor.annotation
        choices = tuple(m.value for m in ann) if isinstance(ann, type) and issubclass(ann, Enum) else ()
        positional = type(p).__name__.endswith("Argument")
        out.append(Param(name=p.name, opts=tuple(p.opts), secondary=tuple(p.secondary_opts),
                         is_flag=bool(getattr(p, "is_flag", False)), multiple=bool(getattr(p, "multiple", False)),
                         positional=positional, nargs=p.nargs, choices=choices, kind=_kind_of(cmd, p.name, ann)))
    return out


PARAMS: dict[str, list[Param]] = {c: command_params(c) for c in COMMAND_NAMES}


def test_every_subcommand_is_fuzzed() -> None:
    import typer

    load_command_modules()
    assert set(COMMANDS) == set(COMMAND_NAMES)
    assert set(typer.main.get_command(app).commands) == set(COMMAND_NAMES)  # type: ignore[attr-defined]


def value_for(p: Param, good: bool) -> st.SearchStrategy[Any]:
    """A strategy for one parameter's value: True/False for flags, a list for repeatable ones."""
    if p.is_flag:
        return st.booleans()
    if p.choices:
        one = _names(p.choices) if good else st.one_of(_names(p.choices), _names(["", "BF16", "tabl", "json\n"]),
                                                          _text())
    else:
        one = VALID[p.kind] if good and p.kind in VALID else hostile(p.kind)
    if p.multiple or p.nargs == -1:
        return st.lists(one, min_size=1, max_size=3)
    return one


def _base(cmd: str) -> dict[str, str]:
    """The required options of a run that can succeed (values drawn from VALID)."""
    common = {"model": "model", "gpu": "gpu", "num_gpus": "count", "seq_len": "seq", "gbs": "batch"}
    return {
        "estimate": common, "plan": common, "explain": common, "report": {"output": "out_file", **common},
        "launch": {"out": "out_dir", **common}, "check": {"script": "script"}, "ingest": {"logs": "log"},
        "tune": {"log": "log", "gpu": "gpu"}, "calibrate": {"runs": "runs", "gpu": "gpu", "out": "out_file"},
        "budget": {"model": "model", "tokens": "tokens", "gpu": "gpu_list", "max_gpus": "count"},
        "models": {}, "gpus": {}, "recipes": {},
    }[cmd]


def _rare(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws (and never in the simplest example)."""
    return st.integers(1, n).map(lambda i: i == n)


def _choose(draw: st.DrawFn, cmd: str, params: dict[str, Param]) -> dict[str, Any]:
    """Parameter values: a run that can succeed, the same with 1-3 values made hostile or dropped, or a random
    mix of any parameters with good or hostile values."""
    mode = draw(st.sampled_from(["valid", "valid", "mutate", "mutate", "mutate", "random"]))
    chosen: dict[str, Any] = {}
    if mode == "random":
        for name in draw(st.lists(st.sampled_from(sorted(params)), max_size=8, unique=True)) if params else []:
            chosen[name] = draw(value_for(params[name], good=draw(st.booleans())))
        return chosen
    for name in _base(cmd):
        chosen[name] = draw(value_for(params[name], good=True))
    optional = sorted(set(params) - set(chosen))
    for name in draw(st.lists(st.sampled_from(optional), max_size=3, unique=True)) if optional else []:
        chosen[name] = draw(value_for(params[name], good=True))
    if mode == "mutate" and params:
        for name in draw(st.lists(st.sampled_from(sorted(params)), min_size=1, max_size=3, unique=True)):
            if draw(_rare(6)):
                chosen.pop(name, None)
            else:
                chosen[name] = draw(value_for(params[name], good=False))
    return chosen


def _words(draw: st.DrawFn, p: Param, value: Any) -> list[str]:
    """argv words of one option (a flag, its secondary name, ``--opt value`` or ``--opt=value``; repeated)."""
    if p.is_flag:
        return ([draw(_names([p.opts[0], *p.secondary])) if p.secondary else p.opts[0]]) if value else []
    words: list[str] = []
    for v in value if isinstance(value, list) else [value]:
        opt = draw(_names(p.opts))
        words += [f"{opt}={v}"] if opt.startswith("--") and draw(_rare(8)) else [opt, v]
    return words


@st.composite
def invocations(draw: st.DrawFn, cmd: str) -> Call:
    params = {p.name: p for p in PARAMS[cmd]}
    chosen = _choose(draw, cmd, params)
    argv = [cmd]
    positionals: list[str] = []
    for name in draw(st.permutations(sorted(chosen))):
        p, value = params[name], chosen[name]
        if p.positional:
            positionals += value if isinstance(value, list) else [value]
        else:
            argv += _words(draw, p, value)
    front: bool = draw(st.booleans())
    if positionals and front:
        argv[1:1] = positionals
    elif positionals:
        argv += ["--", *positionals] if any(x.startswith("-") for x in positionals) else positionals
    if draw(_rare(10)):
        argv.insert(draw(st.integers(1, len(argv))), draw(_names(JUNK)))
    return Call(argv)


# --------------------------------------------------------------------------------------- the fuzz
WEIGHTS = {"estimate": 3, "plan": 2, "explain": 1.5, "launch": 3, "check": 1.5, "ingest": 1.5, "tune": 1.5,
           "calibrate": 1, "report": 0.5, "budget": 0.5, "models": 0.5, "gpus": 0.5, "recipes": 0.5}


def _examples(cmd: str) -> int:
    return max(5, round(TOTAL_EXAMPLES * WEIGHTS[cmd] / sum(WEIGHTS.values())))


_RSS_LIMIT_KIB = MEMORY_LIMIT_BYTES // 1024


@pytest.mark.parametrize("cmd", [pytest.param(c, marks=known(f"test_fuzz_command[{c}]")) for c in COMMAND_NAMES])
def test_fuzz_command(cmd: str, fuzz_env: FuzzEnv) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    @settings(max_examples=_examples(cmd), deadline=timedelta(seconds=2 * call_limit_s([cmd])), derandomize=True,
              database=None,
              phases=[Phase.explicit, Phase.generate], print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(call=invocations(cmd))
    def fuzz(call: Call) -> None:
        run_and_check(fuzz_env, call)

    fuzz()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < _RSS_LIMIT_KIB, f"peak RSS grew by {grown_kib / 1024:.0f} MiB while fuzzing {cmd}"


# ------------------------------------------------------------------- a full stdout and Ctrl-C, per command
VALID_ARGV: dict[str, list[str]] = {
    "estimate": ["estimate", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--tp", "2"],
    "plan": ["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"],
    "explain": ["explain", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"],
    "launch": ["launch", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "-o", "out"],
    # the script's layout (TP 1, no recompute, seq 8192) needs 108.5 GiB: out of memory on H100 (exit 4), fits on B200
    "check": ["check", SCRIPTS[-1], "-g", "b200"],
    "ingest": ["ingest", LOGS[-1]],
    "tune": ["tune", "--log", str(FIXTURES / "logs" / "synthetic" / "argument_dump.log"), "-g", "h100-80gb"],
    "calibrate": ["calibrate", "--runs", "valid_runs.csv", "-g", "h100-80gb", "-o", "p.yaml"],
    "report": ["report", "-o", "r.html", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16"],
    "budget": ["budget", "-m", "gpt2", "-t", "1e9", "-s", "1024", "-g", "h100-80gb", "--max-gpus", "64"],
    "models": ["models"],
    "recipes": ["recipes", "--model", "llama3-70b"],
    "gpus": ["gpus"],
}


def test_valid_argv_succeed(fuzz_env: FuzzEnv) -> None:
    """The baseline of the two tests below: each of these runs works."""
    for cmd, argv in VALID_ARGV.items():
        o = run_cli(Call(argv), fuzz_env.new_cwd())
        assert o.escaped is None and o.rc == 0, (cmd, o.rc, o.escaped, o.stderr[-300:])


@pytest.mark.parametrize("cmd", [pytest.param(c, marks=known(f"test_stdout_is_full[{c}]")) for c in COMMAND_NAMES])
def test_stdout_is_full(cmd: str, fuzz_env: FuzzEnv) -> None:
    """``paraplan CMD > /dev/full``: one line on stderr and exit 1, not a traceback (or exit 120 at shutdown)."""
    o = run_and_check(fuzz_env, Call(VALID_ARGV[cmd], stdout_full=True))
    assert o.rc != 0, f"{o.call!r}: exit 0 although nothing could be written"


@pytest.fixture
def terminal_sigint() -> Iterator[None]:
    """Python's default SIGINT handler, as a program started from a terminal has it. A shell without job control
    starts background jobs (``pytest ... &``) with SIGINT ignored; Python then keeps SIG_IGN, and the simulated
    Ctrl-C would be dropped by the OS before any handler could see it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("terminal_sigint")
@pytest.mark.parametrize("cmd", [pytest.param(c, marks=known(f"test_ctrl_c[{c}]")) for c in COMMAND_NAMES])
def test_ctrl_c(cmd: str, fuzz_env: FuzzEnv) -> None:
    """Ctrl-C at several moments of a run: exit 130 with one line (or the run was already over: main() had
    returned). An output it leaves is the whole one, byte for byte what the run without Ctrl-C writes."""
    argv = VALID_ARGV[cmd]
    whole = run_and_check(fuzz_env, Call(argv))
    assert whole.rc == 0, (cmd, whole.rc, whole.stderr[-300:])
    complete = {t.path: (t.kind, t.digest) for t in snapshot(fuzz_env.stage, argv)}  # where that call ran
    for after_s in (0.0, 0.005, 0.02, 0.05, 0.15):
        run_and_check(fuzz_env, Call(argv, interrupt_after_s=after_s, complete_outputs=complete))


# --------------------------------------------------------------------------------------- the corpus
# (test id, argv, expected) -- expected: "refuse" (exit 1 with one line), "ok" (exit 0), "any" (the properties
# only). Names are corpus files (linked into the working directory) or the files of build_env.
L = f"{TESTS / 'report' / 'data' / 'train.log'}"
EST = ["estimate", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16"]
LAUNCH = ["launch", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16", "-o", "out"]
CORPUS_CASES: list[tuple[str, list[str], str]] = [
    ("alias-bomb-site", [*LAUNCH, "-m", "gpt2", "--site", "yaml_alias_bomb.yaml"], "refuse"),
    ("alias-bomb-gpu", ["estimate", "-m", "gpt2", "-g", "yaml_alias_bomb.yaml", "-n", "8", "-s", "1024", "--gbs",
                        "16"], "refuse"),
    ("alias-bomb-model", [*EST, "-m", "yaml_alias_bomb.yaml"], "refuse"),
    ("alias-bomb-profile", [*EST, "-m", "gpt2", "--profile", "yaml_alias_bomb.yaml"], "refuse"),
    ("duplicate-keys-model", [*EST, "-m", "yaml_duplicate_keys.yaml"], "refuse"),
    ("deep-nesting-model", [*EST, "-m", "yaml_deep_nesting.yaml"], "refuse"),
    ("deep-nesting-site", [*LAUNCH, "-m", "gpt2", "--site", "yaml_deep_nesting.yaml"], "refuse"),
    ("python-tag-model", [*EST, "-m", "yaml_python_tag.yaml"], "refuse"),
    ("python-tag-site", [*LAUNCH, "-m", "gpt2", "--site", "yaml_python_tag.yaml"], "refuse"),
    ("python-tag-gpu-set", [*EST, "-m", "gpt2", "--gpu-set",
                            'hbm_gib=!!python/object/apply:os.system ["touch PWNED_gpu_set"]'], "refuse"),
    ("two-documents-model", [*EST, "-m", "yaml_document_separators.yaml"], "refuse"),
    ("not-a-mapping-site", [*LAUNCH, "-m", "gpt2", "--site", "yaml_not_a_mapping.yaml"], "refuse"),
    ("empty-gpu", ["estimate", "-m", "gpt2", "-g", "empty.yaml", "-n", "8", "-s", "1024", "--gbs", "16"], "refuse"),
    ("non-utf8-model", [*EST, "-m", "non_utf8.yaml"], "refuse"),
    ("non-utf8-gpu", ["estimate", "-m", "gpt2", "-g", "non_utf8.yaml", "-n", "8", "-s", "1024", "--gbs", "16"],
     "refuse"),
    ("non-utf8-site", [*LAUNCH, "-m", "gpt2", "--site", "non_utf8.yaml"], "refuse"),
    ("non-utf8-profile", [*EST, "-m", "gpt2", "--profile", "non_utf8.yaml"], "refuse"),
    ("non-utf8-plan", ["launch", "--plan", "non_utf8.json", "-o", "out"], "refuse"),
    ("non-utf8-manifest", ["tune", "--log", L, "--manifest", "non_utf8.json"], "refuse"),
    ("non-utf8-script", ["check", "non_utf8.sh"], "any"),
    ("non-utf8-log", ["ingest", "non_utf8.log"], "any"),
    ("non-utf8-runs", ["calibrate", "--runs", "non_utf8.csv", "-g", "h100-80gb", "-o", "p.yaml"], "refuse"),
    ("bom-runs", ["calibrate", "--runs", "bom_runs.csv", "-g", "h100-80gb", "-o", "p.yaml"], "ok"),
    ("nan-runs", ["calibrate", "--runs", "nan_runs.csv", "-g", "h100-80gb", "-o", "p.yaml"], "refuse"),
    *[(f"name-launch-{n[11:-5]}", [*LAUNCH, "-m", n], "any") for n in NAME_MODELS],
    *[(f"name-estimate-{n[11:-5]}", [*EST, "-m", n], "any") for n in NAME_MODELS],
    *[(f"name-plan-{n[11:-5]}", ["plan", "-m", n, "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16"], "any")
      for n in NAME_MODELS],
    *[(f"name-plan-launch-{t}", ["launch", "--plan", f"plan_name_{t}.json", "-o", "out"], "any")
      for t in ("newline", "subst", "document", "escape")],
    ("name-gpu-launch", ["launch", "-m", "gpt2", "-g", "gpu_name_newline.yaml", "-n", "8", "-s", "1024", "--gbs", "16",
                         "-o", "out"], "any"),
    ("name-manifest-tune", ["tune", "--log", L, "--manifest", "manifest_name_newline.json"], "any"),
    ("gpu-base-self", ["estimate", "-m", "gpt2", "-g", "gpu_base_self.yaml", "-n", "8", "-s", "1024", "--gbs", "16"],
     "refuse"),
    ("gpu-base-loop", ["estimate", "-m", "gpt2", "-g", "gpu_base_loop_a.yaml", "-n", "8", "-s", "1024", "--gbs",
                       "16"], "refuse"),
    *[(f"gpu-{k}", ["estimate", "-m", "gpt2", "-g", f"gpu_{k}.yaml", "-n", "8", "-s", "1024", "--gbs", "16"],
       "refuse") for k in ("nan", "inf", "negative", "wrong_types")],
    *[(f"gpu-set-{i}", [*EST, "-m", "gpt2", "--gpu-set", v], "refuse") for i, v in enumerate(
        ["efficiency.gemm_max_frac=inf", "network_gbit_per_s=.nan", "efficiency=3", "hbm_gib=[1", "hbm_gib=1e309",
         "hbm_gib=&a [*a, *a]"])],
    ("profile-nan", [*EST, "-m", "gpt2", "--profile", "profile_nan.yaml"], "refuse"),
    ("profile-wrong-types", [*EST, "-m", "gpt2", "--profile", "profile_wrong_types.yaml"], "refuse"),
    ("model-huge-layers-estimate", [*EST, "-m", "model_huge_layers.yaml"], "any"),
    ("model-huge-layers-plan", ["plan", "-m", "model_huge_layers.yaml", "-g", "h100-80gb", "-n", "8", "-s", "1024",
                                "--gbs", "16"], "any"),
    ("model-5000-digits", [*EST, "-m", "model_hidden_5000_digits.yaml"], "refuse"),
    ("model-moe-freq-nested", [*EST, "-m", "model_moe_freq_nested.yaml"], "refuse"),
    ("model-nan-fields", [*EST, "-m", "model_nan_fields.yaml"], "refuse"),
    ("model-hf-hostile", [*EST, "-m", "hf_config_hostile.json"], "refuse"),
    ("site-newline", [*LAUNCH, "-m", "gpt2", "--site", "site_newline.yaml"], "refuse"),
    ("site-env-del", [*LAUNCH, "-m", "gpt2", "--site", "site_env_del.yaml"], "refuse"),
    ("site-extra-sbatch-nodes", [*LAUNCH, "-m", "gpt2", "--site", "site_extra_sbatch_nodes.yaml"], "refuse"),
    ("site-command-substitution", [*LAUNCH, "-m", "gpt2", "--site", "site_command_substitution.yaml"], "any"),
    ("site-wrong-types", [*LAUNCH, "-m", "gpt2", "--site", "site_wrong_types.yaml"], "refuse"),
    *[(f"plan-launch-{n[:-5]}", ["launch", "--plan", n, "-o", "out"], "refuse") for n in (
        "plan_wrong_types.json", "plan_candidates_wrong.json", "plan_nan.json", "plan_schema_huge.json",
        "plan_deep_nesting.json", "json_deep_nesting.json", "plan_top_level_list.json", "plan_gpu_nan.json",
        "plan_config_wrong_types.json")],
    *[(f"plan-tune-{n[:-5]}", ["tune", "--log", L, "--plan", n], "refuse") for n in (
        "plan_wrong_types.json", "plan_nan.json", "plan_deep_nesting.json", "plan_gpu_nan.json")],
    *[(f"plan-report-{n[:-5]}", ["report", "-o", "r.html", "--plan", n], "refuse") for n in (
        "plan_wrong_types.json", "plan_deep_nesting.json", "plan_config_wrong_types.json")],
    ("plan-is-a-directory", ["launch", "--plan", "dir", "-o", "out"], "refuse"),
    ("model-deep-json", [*EST, "-m", "json_deep_nesting.json"], "refuse"),
    *[(f"manifest-tune-{n[:-5]}", ["tune", "--log", L, "--manifest", n], "refuse") for n in (
        "manifest_wrong_types.json", "manifest_nan.json", "manifest_deep_nesting.json", "manifest_nan_fields.json",
        "json_deep_nesting.json")],
    *[(f"manifest-calibrate-{n[:-5]}", ["calibrate", "--pair", f"{n}:{L}", "-g", "h100-80gb", "-o", "p.yaml"],
       "refuse") for n in ("manifest_wrong_types.json", "manifest_nan.json", "manifest_deep_nesting.json")],
    *[(f"check-{n[:-3]}", ["check", n], "any") for n in (
        "script_self_doubling.sh", "script_array_doubling.sh", "script_hostile_values.sh", "script_unterminated.sh",
        "script_long_line.sh")],
    *[(f"ingest-{n.split('.')[0]}", ["ingest", n], "any") for n in (
        "log_kv_3000_spaces.log", "log_many_pipes.log", "log_glued_records.log", "log_ansi_and_nul.log",
        "log_binary.log", "log_theoretical_20k.log", "log_argdump_32k.log", "log_long_line_1m.log",
        "log_big_5mb.log")],
    ("ingest-gzip-bomb", ["ingest", "gzip_bomb.log.gz"], "refuse"),
    ("ingest-dev-zero", ["ingest", "/dev/zero"], "refuse"),
    ("ingest-fifo", ["ingest", "fifo"], "refuse"),
    ("model-dev-zero", [*EST, "-m", "/dev/zero"], "refuse"),
    ("model-fifo", [*EST, "-m", "fifo"], "refuse"),
    ("tune-argdump-32k", ["tune", "--log", "log_argdump_32k.log", "-g", "h100-80gb"], "any"),
    ("tune-theoretical-20k", ["tune", "--log", "log_theoretical_20k.log", "--manifest", "valid_manifest.json"], "any"),
    ("model-log-gzip-bomb", [*EST, "-m", "gzip_bomb.log.gz"], "refuse"),
    # command-line boundaries (issue 17)
    ("cli-no-arguments", [], "any"),
    ("cli-num-gpus-2-31", ["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "2147483648", "-s", "1024", "--gbs", "16"],
     "any"),
    ("cli-vp-huge", ["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16", "--vp",
                     "999999999999"], "any"),
    ("cli-mbs-2-64", ["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16", "--mbs",
                      "18446744073709551616"], "refuse"),
    ("cli-report-gbs-0", ["report", "-o", "r.html", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs",
                          "0"], "refuse"),
    ("cli-workspace-inf", [*EST, "-m", "gpt2", "--workspace-gib", "1e309"], "refuse"),
    ("cli-check-num-gpus-2-63", ["check", "-n", "9223372036854775808", SCRIPTS[-1]], "refuse"),
    ("cli-out-name-too-long", [*LAUNCH[:-1], "x" * 300, "-m", "gpt2"], "refuse"),
    ("cli-model-name-too-long", [*EST, "-m", "x" * 300 + ".yaml"], "refuse"),
    ("cli-gpu-set-5000-digits", [*EST, "-m", "gpt2", "--gpu-set", "hbm_gib=" + "9" * 5000], "refuse"),
    ("cli-escape-in-preset-name", [*EST, "-m", "\x1b]0;title\x07"], "refuse"),
    ("cli-megatron-args-fifo", ["estimate", "--megatron-args", "@fifo", "-g", "h100-80gb"], "refuse"),
    ("cli-save-over-existing", ["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16",
                                "--save", "existing.json"], "any"),
    ("cli-save-to-fifo", ["plan", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024", "--gbs", "16", "--save",
                          "fifo"], "any"),
    ("cli-report-to-device", ["report", "-o", "chardev", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024",
                              "--gbs", "16"], "any"),
    ("cli-calibrate-over-existing", ["calibrate", "--runs", "valid_runs.csv", "-g", "h100-80gb", "-o", "existing.yaml"],
     "any"),
    ("cli-budget-html-over-existing", ["budget", "-m", "gpt2", "-t", "1e9", "-s", "1024", "-g", "h100-80gb",
                                       "--max-gpus", "8", "--html", "existing.html"], "any"),
]


@pytest.mark.parametrize(("argv", "expected"), [
    pytest.param(argv, expected, id=case_id, marks=known(f"test_corpus[{case_id}]"))
    for case_id, argv, expected in CORPUS_CASES])
def test_corpus(argv: list[str], expected: str, fuzz_env: FuzzEnv) -> None:
    o = run_and_check(fuzz_env, Call(argv))
    if expected == "refuse":
        assert o.rc == 1, f"{o.call!r}: exit {o.rc}, expected 1 (refused with one line)"
    elif expected == "ok":
        assert o.rc == 0, f"{o.call!r}: exit {o.rc}: {o.stderr.decode(errors='replace')}"


def test_corpus_files_are_small_and_documented() -> None:
    readme = (HOSTILE / "README.md").read_text(encoding="utf-8")
    for p in HOSTILE.iterdir():
        assert p.stat().st_size < 20_000, f"{p.name}: {p.stat().st_size} bytes (make files >= 20 KB at test time)"
        assert p.name == "README.md" or f"`{p.name}`" in readme, f"{p.name} is not described in README.md"


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=known(f"test_rich_markup_in_names_is_printed_literally[{n}]")) for n in NAME_MODELS])
def test_rich_markup_in_names_is_printed_literally(name: str, fuzz_env: FuzzEnv) -> None:
    """A name is text, never markup: the model line of estimate shows it as written (or the file is refused)."""
    o = run_and_check(fuzz_env, Call([*EST, "-m", name]))
    if o.rc == 0 and name == "model_name_rich_markup.yaml":
        assert "[link=https://evil.example/]click[/link]" in o.stdout.decode(), o.stdout.decode()[:400]


# ------------------------------------------------------------------------- the harness catches what it should
def test_harness_sees_an_escaped_exception(fuzz_env: FuzzEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    import paraplan.cli as cli

    def boom(argv: Sequence[str] | None = None) -> int:
        raise RecursionError("deep")

    monkeypatch.setattr(cli, "main", boom)
    monkeypatch.setitem(globals(), "main", boom)
    with pytest.raises(AssertionError, match="exception escaped"):
        run_and_check(fuzz_env, Call(["models"]))


def test_harness_times_out_a_hang(fuzz_env: FuzzEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CALL_LIMIT_S", 0.3)

    def hang(argv: Sequence[str] | None = None) -> int:
        import re

        re.match(r"(a+)+$", "a" * 64 + "b")  # catastrophic backtracking: interrupted by SIGALRM
        return 0

    monkeypatch.setitem(globals(), "main", hang)
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="CallTimeout"):
        run_and_check(fuzz_env, Call(["models"]))
    assert time.monotonic() - t0 < 5


def test_harness_caps_memory(fuzz_env: FuzzEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    if _vm_size_bytes() is None:
        pytest.skip("needs /proc/self/status (Linux)")

    def hog(argv: Sequence[str] | None = None) -> int:
        blocks = [bytearray(1 << 26) for _ in range(2 * MEMORY_LIMIT_BYTES >> 26)]
        return len(blocks) * 0

    monkeypatch.setitem(globals(), "main", hog)
    with pytest.raises(AssertionError, match="MemoryError"):
        run_and_check(fuzz_env, Call(["models"]))


def test_harness_runs_generated_scripts(fuzz_env: FuzzEnv, tmp_path: Path) -> None:
    """The sandbox runs launch files for real: a script that touches a canary is caught."""
    if BASH is None:
        pytest.skip("needs bash")
    out = tmp_path / "launch"
    out.mkdir()
    (out / "env.sh").write_text(f"# x\ntouch {CANARY}_probe\n")
    with pytest.raises(AssertionError, match="created"):
        check_launch_dir(out, fuzz_env.sandbox, Call(["launch"]))
    (out / f"{CANARY}_probe").unlink()
    (out / "env.sh").write_text("# x\n")
    (out / "pytorchjob.yaml").write_text("a: 1\n---\nkind: Pod\n")
    with pytest.raises(AssertionError, match="2 YAML document"):
        check_launch_dir(out, fuzz_env.sandbox, Call(["launch"]))
