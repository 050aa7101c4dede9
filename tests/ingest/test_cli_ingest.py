"""``paraplan ingest`` in-process: JSON and table output, errors, --skip-warmup, TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan.cli.ingest  # noqa: F401  (registers the command until it is in _COMMAND_MODULES)
from paraplan.cli import main

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def _sample(prefix: str) -> str:
    return str(next(LOGS.glob(f"{prefix}_*.log")))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["ingest", "--format", "json", *argv]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_json_schema_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, _sample("01"))
    assert set(out) >= {"iterations", "memory", "timers", "summary"}
    s = out["summary"]
    assert isinstance(s, dict)
    assert s["iterations"] == 2
    assert s["step_time_s"]["median"] == pytest.approx(10.11765)
    assert s["tflops_per_gpu"]["p90"] == pytest.approx(129.9)
    assert s["max_allocated_bytes"] is None  # no memory line: None, never -1
    assert s["skipped_iterations"] == 0 and s["nan_iterations"] == 0
    assert s["unparsed_lines"] == 8
    first = out["iterations"][0]  # type: ignore[index]
    assert first["iteration"] == 10 and first["losses"] == {"lm loss": pytest.approx(0.2092005)}


def test_json_several_files_memory_and_timers(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, _sample("17"), _sample("03"), "--skip-warmup", "0")
    s = out["summary"]
    assert isinstance(s, dict)
    assert s["iterations"] == 3 and s["segments"] == 2
    assert s["max_allocated_bytes"] == pytest.approx(47104.31 * 2**20)
    assert s["theoretical_total_bytes"] == pytest.approx(122249.54 * 2**20)
    assert len(out["memory"]) == 23  # type: ignore[arg-type]
    timers = out["timers"]
    assert isinstance(timers, dict)
    assert timers["forward-compute"][0]["value_s"] == pytest.approx(0.19377)
    assert timers["model-and-optimizer-setup"][0]["min_s"] == pytest.approx(1.0209)


def test_json_is_strict_with_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "nan.log"
    log.write_text(" iteration 1/9 | elapsed time per iteration (ms): 10.0 | lm loss: nan |\n"
                   " iteration 2/9 | elapsed time per iteration (ms): 12.0 | lm loss: nan |\n")
    assert main(["ingest", "-f", "json", str(log)]) == 0
    raw = capsys.readouterr().out
    assert "NaN" not in raw
    out = json.loads(raw)
    assert out["iterations"][1]["losses"] == {"lm loss": None}
    assert out["iterations"][1]["nonfinite"] == ["lm loss"]
    assert out["summary"]["nan_iterations"] == 1


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", _sample("03")]) == 0
    out = capsys.readouterr().out
    assert "run summary" in out
    assert "123.4 ms" in out  # L26 step time, the only record after warm-up
    assert "6.10 GiB" in out  # L25 max allocated 6245.04 MiB
    assert "forward-compute" in out and "58.2 ms" in out  # L24
    assert "memory per rank" in out


def test_table_throughput_and_timers_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", _sample("01"), _sample("13")]) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s/GPU" in out and "1,304.7 ms" in out  # 13: forward-compute median


def test_missing_file_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", "/nonexistent/train.log"]) == 1
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1


def test_usage_errors_exit_nonzero(capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI wrapper decides the code for usage errors (1 or 2); both print one line
    assert main(["ingest", "--format", "xml", _sample("01")]) in (1, 2)
    assert main(["ingest", "--skip-warmup", "-1", _sample("01")]) in (1, 2)
    assert main(["ingest"]) in (1, 2)
    assert capsys.readouterr().out == ""


def test_tensorboard_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer_mod = pytest.importorskip("tensorboard.summary.writer.event_file_writer")
    from tensorboard.compat.proto import event_pb2, summary_pb2

    writer = writer_mod.EventFileWriter(str(tmp_path))
    for step, seconds in enumerate([5.0, 1.0, 1.5, 2.0], start=1):
        value = summary_pb2.Summary.Value(tag="iteration-time", simple_value=seconds)
        writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step,
                                         summary=summary_pb2.Summary(value=[value])))
    writer.close()
    out = _json(capsys, str(tmp_path))
    s = out["summary"]
    assert isinstance(s, dict)
    assert s["iterations"] == 3 and s["step_time_s"]["median"] == pytest.approx(1.5)
    assert main(["ingest", str(tmp_path)]) == 0
    assert "1,500.0 ms" in capsys.readouterr().out


def test_gzipped_log_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(Path(_sample("01")).read_bytes()))
    assert main(["ingest", str(gz), "--format", "json"]) == 0
    assert [r["iteration"] for r in json.loads(capsys.readouterr().out)["iterations"]] == [10, 11, 12]


def test_a_log_without_training_output_is_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("", encoding="utf-8")
    other = tmp_path / "other.log"
    other.write_text("hello\nworld\n", encoding="utf-8")
    for path in (empty, other):
        assert main(["ingest", str(path)]) == 1
        err = capsys.readouterr().err
        assert "no Megatron training output found" in err and len(err.strip().splitlines()) == 1


def test_missing_losses_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", _sample("05")]) == 0
    assert "records without a loss" in capsys.readouterr().out


def test_json_is_streamed_as_json_dumps_would_write_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--format json`` is written a record at a time (bounded memory) with the text of one ``json.dumps``."""
    from paraplan.cli.ingest import _finite
    from paraplan.ingest import read_logs

    nan_log = tmp_path / "nan.log"
    nan_log.write_text(" iteration 2/9 | lm loss: nan | elapsed time per iteration (ms): 5.0 |\n", encoding="utf-8")
    for logs in [[_sample("01")], [_sample("17"), _sample("13")], [str(LOGS / "synthetic" / "argument_dump.log")],
                 [str(nan_log)]]:
        assert main(["ingest", "--format", "json", *logs]) == 0
        expected = json.dumps(_finite(read_logs(logs).to_dict()), indent=1, allow_nan=False) + "\n"
        assert capsys.readouterr().out == expected
