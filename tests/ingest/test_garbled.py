"""Property tests: garbled, truncated, glued and shuffled log lines never make the parser raise,
and its counts stay consistent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.ingest import parse_line, parse_text
from paraplan.ingest.records import IterationRecord, MemoryRecord, RunLog

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
SAMPLE_LINES = [
    line
    for path in sorted(LOGS.glob("*.log"))
    for line in path.read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
ITER_LINES = [ln for ln in SAMPLE_LINES if parse_line(ln)
              and all(isinstance(r, IterationRecord) for r in parse_line(ln))]
MEM_LINES = [ln for ln in SAMPLE_LINES if ln.startswith("[Rank") and len(parse_line(ln)) == 1]
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/workspace/megatron/training/training.py", line 1609, in train',
    "RuntimeError: Rank 3, node n1, device 3, iteration 57: Unexpected result nan "
    "(message='found NaN in local grad norm for bucket #0 in backward pass before "
    "data-parallel communication collective')",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB "
    "total capacity; 75.00 GiB already allocated)",
    "[rank3]: Traceback (most recent call last):",
    "12: NCCL WARN Call to ibv_reg_mr failed",
]
# letters and spaces only: no format anchor can match text without digits, '|', '(' or '-'
GARBAGE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ", min_size=1, max_size=40).filter(
    lambda s: s.strip() != ""
)
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _check_counts(log: RunLog, text: str) -> None:
    """Counters agree with each other; the JSON output is strict JSON."""
    physical = [ln for ln in text.split("\n") if ln.strip()]
    assert 0 <= log.unparsed_lines <= log.lines <= len(physical)
    assert 0 <= log.partial_lines <= log.lines - log.unparsed_lines
    out = log.to_dict()
    json.dumps(out, allow_nan=False)
    s = out["summary"]
    assert s["iterations"] + s["warmup_records_skipped"] == len(log.iterations)
    assert s["unparsed_lines"] == log.unparsed_lines
    assert list(log.segment_starts) == sorted(set(log.segment_starts))
    assert all(0 <= i < len(log.iterations) for i in log.segment_starts)


@SETTINGS
@given(st.text(max_size=2000))
def test_arbitrary_text_never_raises(text: str) -> None:
    log = parse_text(text)
    _check_counts(log, text)


@SETTINGS
@given(st.lists(st.sampled_from(SAMPLE_LINES + TRACEBACK), max_size=40), st.data())
def test_truncated_glued_shuffled_sample_lines(lines: list[str], data: st.DataObject) -> None:
    mangled: list[str] = []
    for line in lines:
        action = data.draw(st.sampled_from(["keep", "truncate", "glue", "crlf", "prefix"]))
        if action == "truncate":
            line = line[: data.draw(st.integers(0, len(line)))]
        elif action == "glue" and mangled:
            line = mangled.pop() + line
        elif action == "crlf":
            line += "\r"
        elif action == "prefix":
            line = data.draw(st.sampled_from(["0: ", "[rank7]: ", "INFO:megatron.x: "])) + line
        mangled.append(line)
    text = "\n".join(data.draw(st.permutations(mangled)))
    _check_counts(parse_text(text), text)


@SETTINGS
@given(st.lists(st.one_of(st.sampled_from(ITER_LINES + MEM_LINES), GARBAGE), max_size=30))
def test_complete_lines_each_give_one_record_garbage_counts_as_unparsed(lines: list[str]) -> None:
    log = parse_text("\n".join(lines))
    known = [ln for ln in lines if ln in ITER_LINES or ln in MEM_LINES]
    assert len(log.iterations) + len(log.memory) == len(known)
    assert log.unparsed_lines == len(lines) - len(known)
    assert log.lines == len(lines)
    assert log.partial_lines == sum(1 for ln in known if parse_line(ln)[0].partial)


@SETTINGS
@given(st.permutations(ITER_LINES + MEM_LINES))
def test_shuffling_lines_keeps_the_same_records(lines: list[str]) -> None:
    def key(log: RunLog) -> Counter[tuple[object, ...]]:
        its = [(r.iteration, r.step_time_s, r.losses) for r in log.iterations]
        mem = [(m.rank, m.max_allocated_bytes) for m in log.memory]
        return Counter([*its, *mem])

    assert key(parse_text("\n".join(lines))) == key(parse_text("\n".join(ITER_LINES + MEM_LINES)))


@SETTINGS
@given(st.lists(st.sampled_from(MEM_LINES + ITER_LINES), min_size=2, max_size=6))
def test_glued_records_are_split(lines: list[str]) -> None:
    glued = parse_line("".join(lines))
    separate = [r for ln in lines for r in parse_line(ln)]
    strip = lambda r: (type(r), getattr(r, "iteration", None), getattr(r, "rank", None))  # noqa: E731
    assert [strip(r) for r in glued] == [strip(r) for r in separate]


@SETTINGS
@given(st.sampled_from(ITER_LINES), st.data())
def test_truncated_iteration_line_keeps_its_number(line: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(line)))
    log = parse_text(line[:cut])
    full = parse_line(line, 1)[0]
    assert isinstance(full, IterationRecord)
    for rec in log.iterations:
        assert str(rec.iteration) in line
        assert cut < len(line) or rec == full
    if log.iterations and cut >= len(line.rstrip()):
        assert log.iterations[0].step_time_s == full.step_time_s


@SETTINGS
@given(st.sampled_from(MEM_LINES), st.integers(0, 200))
def test_truncated_memory_line(line: str, cut: int) -> None:
    records = parse_line(line[:cut])
    assert len(records) <= 1
    for rec in records:
        assert isinstance(rec, MemoryRecord) and str(rec.rank) in line
