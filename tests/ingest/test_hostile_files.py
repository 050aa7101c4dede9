"""Hostile log files (issue 17): each gives one clear line (exit 1) or a bounded result, in bounded time and memory.

FIFOs, devices, sockets and directories are refused before they are opened; a gzip bomb stops at
``MAX_GZIP_RATIO``; an over-long line is skipped and counted; a log is streamed, so a 200 MB file that is one line
of zeros stays within a 400 MiB address-space limit (``RLIMIT_AS`` in a subprocess).
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paraplan.ingest
from paraplan.calibrate import read_manifest, read_runs_csv
from paraplan.cli import main
from paraplan.errors import IngestError, SpecError
from paraplan.ingest import parse_text, read_log, read_logs, run_config
from paraplan.ingest.records import MAX_THEORETICAL_LINES
from paraplan.ingest.source import MAX_LINE_BYTES, LineStats, log_lines
from paraplan.specs.load import load_model

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
ITERATION = " iteration {i:8d}/     100 | elapsed time per iteration (ms): {ms:.1f} | lm loss: 2.5E+00 |\n"
MIB = 2**20


def _iterations(n: int, start: int = 1) -> str:
    return "".join(ITERATION.format(i=i, ms=800 + i) for i in range(start, start + n))


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""

    def _alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with _deadline(10):
        assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def _bounded(argv: list[str], limit_mib: int = 400) -> tuple[subprocess.CompletedProcess[str], float]:
    """``paraplan ARGV`` in a subprocess whose address space is capped at ``limit_mib``; (result, seconds)."""
    code = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit_mib} << 20, {limit_mib} << 20))\n"
            "from paraplan.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, check=False)
    return done, time.perf_counter() - start


def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    err = _one_line_error(capsys, ["ingest", str(fifo)])
    assert "is a FIFO (named pipe)" in err and str(fifo) in err
    with _deadline(10), pytest.raises(IngestError, match="FIFO"):
        read_logs([fifo])  # what tune --log, report --log and calibrate's manifest:log pairs read through
    with _deadline(10), pytest.raises(SpecError, match=r"^model: .* is a FIFO"):
        load_model(str(fifo))  # --model train.log
    with _deadline(10), pytest.raises(SpecError, match=r"^manifest: .* is a FIFO"):
        read_manifest(fifo)  # calibrate --pair manifest.json:train.log
    with _deadline(10), pytest.raises(SpecError, match=r"^runs: .* is a FIFO"):
        read_runs_csv(fifo)
    event_fifo = tmp_path / "events.out.tfevents.1"
    os.mkfifo(event_fifo)
    with _deadline(10), pytest.raises(IngestError, match="FIFO"):
        read_log(event_fifo)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(capsys, ["ingest", "/dev/zero"])
    assert "'/dev/zero' is a character device" in err
    with pytest.raises(SpecError, match="character device"):
        load_model("/dev/zero")


def test_a_socket_and_a_directory_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.log"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert "is a socket" in _one_line_error(capsys, ["ingest", str(path)])
    folder = tmp_path / "train.log"
    folder.mkdir()
    with pytest.raises(SpecError, match="is a directory"):
        load_model(str(folder))


def _zeros_gzip(path: Path, size_bytes: int) -> None:
    """A gzip bomb: one 16 MiB member of zeros (about 16 KB) written again and again (a multi-member gzip file)."""
    member = gzip.compress(bytes(16 * MIB))
    with path.open("wb") as f:
        for _ in range(size_bytes // (16 * MIB)):
            f.write(member)


def test_a_gzip_bomb_stops_at_the_ratio_limit_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "train.log.gz"
    _zeros_gzip(bomb, 512 * MIB)  # 512 MiB of zeros in about 0.5 MB; the old reader held it all (and its text)
    assert bomb.stat().st_size < 2 * MIB
    done, seconds = _bounded(["ingest", str(bomb)])
    assert done.returncode == 1, done.stderr[-500:]
    err = done.stderr.strip()
    assert "\n" not in err and "expands more than 100x (MAX_GZIP_RATIO" in err and "gunzip it" in err
    assert seconds < 20


def test_one_200mb_line_of_zeros_is_skipped_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "zeros.log"
    with log.open("wb") as f:
        f.truncate(200 * MIB)  # sparse: no disk used; read as 200 MiB of NUL bytes without a newline
    done, seconds = _bounded(["ingest", str(log)])
    assert done.returncode == 1, done.stderr[-500:]
    assert done.stderr.strip() == (f"error: {log}: no Megatron training output found (0 lines read, 1 over-long "
                                   "line(s) skipped: no iteration line, memory report or timer block)")
    assert seconds < 20


def test_long_lines_are_skipped_and_counted_tqdm_lines_are_cut_at_carriage_returns(tmp_path: Path) -> None:
    bar = "Epoch 0:   1%|          | {i}/100 [00:0{i}<00:10, 2.50s/it, loss=3.1, global_step={i}.0]\r"
    tqdm = "".join(bar.format(i=i) for i in range(1, 10)) * (MAX_LINE_BYTES // 700)  # > 1 MiB, one line
    assert len(tqdm) > MAX_LINE_BYTES
    log = tmp_path / "train.log"
    log.write_text("x" * (MAX_LINE_BYTES + 10) + "\n" + _iterations(1) + tqdm + "\n" + _iterations(1, start=5),
                   encoding="utf-8")
    run = read_log(log)
    assert run.long_lines == 1 and run.lines == 3 and run.unparsed_lines == 0
    megatron = [r for r in run.iterations if r.fmt == "megatron"]
    assert [(r.iteration, r.line) for r in megatron] == [(1, 2), (5, 4)]
    nemo = [r for r in run.iterations if r.fmt == "nemo1"]
    assert nemo and all(r.line == 3 and r.step_time_s == 2.5 for r in nemo)
    assert run.summary()["long_lines_skipped"] == 1


def test_non_utf8_bytes_are_replaced(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"\xff\xfe garbage \xc3\n" + _iterations(2).encode().replace(b"lm loss", b"lm loss\xe9 x"))
    run = read_log(log)
    assert [r.iteration for r in run.iterations] == [1, 2] and run.iterations[1].step_time_s == 0.802
    assert run.unparsed_lines == 1


def test_a_damaged_gzip_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = gzip.compress(_iterations(2000).encode())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert "a damaged gzip file" in _one_line_error(capsys, ["ingest", str(cut)])
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(data[:40] + bytes(64) + data[104:])
    assert "a damaged gzip file" in _one_line_error(capsys, ["ingest", str(bad)])


def test_gzip_text_and_in_memory_text_give_the_same_records(tmp_path: Path) -> None:
    for path in sorted(LOGS.glob("*.log")):
        text = path.read_text(encoding="utf-8")
        gz = tmp_path / f"{path.name}.gz"
        gz.write_bytes(gzip.compress(text.encode()))
        streamed, from_gzip, whole = read_log(path), read_log(gz), parse_text(text, source=str(path))
        assert streamed == whole, path.name
        assert from_gzip.to_dict()["iterations"] == whole.to_dict()["iterations"], path.name
        assert (from_gzip.lines, from_gzip.timers, from_gzip.memory) == (whole.lines, whole.timers, whole.memory)


def test_records_are_capped_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "train.log"
    log.write_text(_iterations(20), encoding="utf-8")
    assert len(read_log(log, max_records=20).iterations) == 20
    with pytest.raises(IngestError, match=r"more than 19 records by line 20 \(MAX_RECORDS"):
        read_log(log, max_records=19)
    monkeypatch.setattr(paraplan.ingest, "MAX_RECORDS", 30)  # the limit holds for all the logs of a read_logs call
    with pytest.raises(IngestError, match="more than 10 records"):
        read_logs([log, log])


def test_an_argument_dump_without_its_end_line_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_config, "MAX_ARGUMENTS", 5)
    dump = "-------- arguments --------\n" + "".join(f"  arg_{i} ........ {i}\n" for i in range(10))
    config = parse_text(dump).run_config
    assert config is not None and [v for _, v in config.arguments] == ["0", "1", "2", "3", "4"]


def test_theoretical_block_lines_are_capped() -> None:
    start = time.perf_counter()
    log = parse_text("Number of in-flight microbatches: 8\n" * 20_000)  # no summary line ever closes the block
    assert time.perf_counter() - start < 5  # merged line by line, this was quadratic
    assert log.theoretical is not None and log.theoretical.in_flight_microbatches == 8
    assert len(log.theoretical.raw.splitlines()) == MAX_THEORETICAL_LINES
    assert log.lines == 20_000 and log.unparsed_lines == 0


def _expected_lines(data: bytes, max_line: int) -> tuple[list[tuple[int, str]], int]:
    """What ``log_lines`` yields, per line joined, and how many pieces it skips: a line of at most ``max_line``
    bytes whole; a longer one without its ``\\r``-pieces (``\\r`` included) of more than ``max_line`` bytes."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out, skipped = [], 0
    for number, line in enumerate(lines, start=1):
        if len(line) > max_line:
            segments = line.split(b"\r")
            kept = [seg + b"\r" * (i < len(segments) - 1) for i, seg in enumerate(segments) if len(seg) <= max_line]
            skipped += len(segments) - len(kept)
            line = b"".join(kept)
        out.append((number, line.decode("utf-8", errors="replace")))
    return out, skipped


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"\xc3\xa9", b"\xc3", b"\xff"]), max_size=80).map(b"".join),
       st.integers(min_value=1, max_value=12))
def test_line_reader_cuts_long_lines_at_carriage_returns_and_skips_long_pieces(data: bytes, max_line: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.log"
        path.write_bytes(data)
        stats = LineStats()
        got = list(log_lines(path, stats, max_line_bytes=max_line))
    joined: dict[int, str] = {}
    for number, text in got:
        joined[number] = joined.get(number, "") + text
    expected, skipped = _expected_lines(data, max_line)
    assert sorted(joined.items()) == expected and stats.long_lines == skipped
    assert [n for n, _ in got] == sorted(n for n, _ in got)
    assert all(len(text) <= max_line + 1 for _, text in got)  # a character per byte at most


def test_a_fifo_among_the_event_files_of_a_folder_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard")
    os.mkfifo(tmp_path / "events.out.tfevents.1.h")
    err = _one_line_error(capsys, ["ingest", str(tmp_path)])
    assert "events.out.tfevents.1.h" in err and "FIFO" in err


def test_a_tensor_with_a_huge_shape_is_not_expanded(tmp_path: Path) -> None:
    writer_mod = pytest.importorskip("tensorboard.summary.writer.event_file_writer")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    writer = writer_mod.EventFileWriter(str(tmp_path))
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2 * 10**9)])
    huge = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=[1.0])
    scalar = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.5])
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    for step, tensor in ((1, huge), (2, scalar)):
        value = summary_pb2.Summary.Value(tag="iteration-time", tensor=tensor, metadata=meta)
        writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary_pb2.Summary(value=[value])))
    writer.close()
    done, _ = _bounded(["ingest", str(tmp_path), "--format", "json"], limit_mib=1500)
    assert done.returncode == 0, done.stderr[-500:]
    assert '"step_time_s"' in done.stdout and "1.5" in done.stdout  # the scalar is read, the [2e9] tensor skipped


@pytest.mark.parametrize("line", [
    "[Rank {n}] (after 1 iterations) memory (MB) | allocated: 1 | max allocated: 2 | reserved: 3 | max reserved: 4",
    "[Rank 1] (after {n} iterations) memory (MB) | allocated: 1 | max allocated: 2 | reserved: 3 | max reserved: 4",
    " iteration {n}/ 10 | elapsed time per iteration (ms): 100.0 | global batch size: 8 |",
    " iteration 1/ {n} | elapsed time per iteration (ms): 100.0 | global batch size: 8 |",
    "validation loss at iteration {n} | lm loss value: 1.0 |",
    "[rank-{n}/8] iteration 1/ 10 | hip mem usage/free/total/usage_ratio: 1.0GB/2.0GB/3.0GB/33.3% |",
    "Number of in-flight microbatches: {n}",
    "using world size: {n}, data-parallel size: 1, context-parallel size: 1, tensor-model-parallel size: 1, "
    "pipeline-model-parallel size: 1",
])
def test_a_5000_digit_number_in_a_log_line_is_not_a_record(line: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text(line.format(n="1" * 5000) + "\n" + _iterations(3), encoding="utf-8")
    assert main(["ingest", str(log), "--format", "json"]) == 0  # was ValueError: Exceeds the limit (4300 digits)
    parsed = read_log(log)
    numbers = [r.iteration for r in parsed.iterations] + [n for m in parsed.memory for n in (m.rank, m.iteration)]
    assert all(n is None or n < 10**12 for n in numbers)  # the long number made no record's field
    assert len(parsed.iterations) >= 3
