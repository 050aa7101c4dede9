"""Every sample in shared/samples/megatron-logs (copied to tests/fixtures/logs), with values checked
by hand against the file; ``Lnn`` is the 1-based line number in the file. Plus the formats the
reference documents but no sample shows (written from the reference's examples), and TensorBoard.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from paraplan.errors import IngestError
from paraplan.ingest import (
    parse_line,
    parse_text,
    read_log,
    read_logs,
    read_tensorboard,
    runlog_from_scalars,
)
from paraplan.ingest.records import IterationRecord, MemoryRecord, RunLog, TimerRecord

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
MIB = 2**20


def _log(name: str) -> RunLog:
    return read_log(next(LOGS.glob(f"{name}_*.log")))


def test_every_sample_is_covered() -> None:
    names = sorted(p.name[:2] for p in LOGS.glob("*.log"))
    assert names == ["01", "03", "05", "08", "11", "13", "15", "17"]


def test_01_megatron_2024_throughput() -> None:
    log = _log("01")
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (11, 8, 0)  # 8 '#' header lines
    assert [r.iteration for r in log.iterations] == [10, 11, 12]
    r = log.iterations[0]  # L9
    assert r.timestamp == "2024-03-30 20:02:40"
    assert r.train_iters == 500000
    assert r.consumed_samples == 1280
    assert r.step_time_s == pytest.approx(9.4964)
    assert r.tflops_per_gpu == pytest.approx(137.5)
    assert r.learning_rate == pytest.approx(2.0e-6)
    assert r.global_batch_size == 128
    assert r.loss == pytest.approx(0.2092005)
    assert r.loss_scale == 1.0
    assert r.grad_norm == pytest.approx(51.010)
    assert dict(r.extra) == {"num zeros": 0.0}
    assert (r.skipped_iterations, r.nan_iterations) == (0, 0)
    assert r.fmt == "megatron" and r.line == 9 and not r.partial
    s = log.summary()  # L10, L11 after the warm-up record: 10036.9 ms, 10198.4 ms
    assert s["iterations"] == 2
    assert s["step_time_s"]["median"] == pytest.approx((10.0369 + 10.1984) / 2)
    assert s["step_time_s"]["p90"] == pytest.approx(10.0369 + 0.9 * (10.1984 - 10.0369))
    assert s["tflops_per_gpu"]["median"] == pytest.approx(129.1)  # 130.1, 128.1
    assert s["skipped_iterations"] == 0 and s["nan_iterations"] == 0


def test_03_pre_2022_timers_fp16_skips() -> None:
    log = _log("03")
    # 26 lines: 11 '#' lines + 3 dataset + 6 setup/info lines unparsed; 3 timer lines, 2
    # iteration lines and 1 memory line parsed.
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (26, 20, 0)
    first, second = log.iterations
    # L21: all 10 iterations skipped (fp16 loss-scale warm-up), lr 0, no loss, no grad norm
    assert (first.iteration, first.skipped_iterations, first.nan_iterations) == (10, 10, 0)
    assert first.learning_rate == 0.0 and first.losses == () and first.grad_norm is None
    assert first.loss_scale == 8388608.0 and first.step_time_s == pytest.approx(0.3562)
    # L26: BERT losses
    assert dict(second.losses) == {"lm loss": pytest.approx(10.12573),
                                   "sop loss": pytest.approx(0.6911852)}
    assert second.skipped_iterations == 1 and second.loss_scale == 16384.0
    (mem,) = log.memory  # L25, MiB printed with str(float)
    assert (mem.rank, mem.iteration, mem.context) == (0, 20, "after 20 iterations")
    assert mem.allocated_bytes == pytest.approx(6245.033203125 * MIB)
    assert mem.max_allocated_bytes == pytest.approx(6245.0361328125 * MIB)
    assert mem.reserved_bytes == mem.max_reserved_bytes == pytest.approx(6554.0 * MIB)
    # L18 (2 setup timers), L22 (10 timers), L24 (15 timers)
    assert len(log.timers) == 27
    setup = [t for t in log.timers if t.line == 18]
    assert [(t.name, t.iteration) for t in setup] == [
        ("model-and-optimizer-setup", None), ("train/valid/test-data-iterators-setup", None)]
    assert setup[1].value_s == pytest.approx(3.65481) and setup[1].kind == "single"
    l22 = {t.name: t for t in log.timers if t.line == 22}
    assert l22["forward-compute"].value_s == pytest.approx(0.19377)
    assert l22["forward-compute"].iteration == 10 and l22["forward-compute"].min_s is None
    s = log.summary()
    assert s["timers_s"]["forward-compute"]["median"] == pytest.approx(0.05816)  # L24 only
    assert s["setup_timers_s"]["train/valid/test-data-iterators-setup"] == pytest.approx(3.65481)
    assert s["skipped_iterations"] == 1 and s["max_allocated_bytes"] == mem.max_allocated_bytes
    assert log.summary(skip_warmup=0)["skipped_iterations"] == 11


def test_05_nan_loss_vanishes_and_truncated_line() -> None:
    log = _log("05")
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (11, 8, 1)
    a, b, c = log.iterations
    assert (a.iteration, a.loss, a.grad_norm) == (3383, pytest.approx(0.7334521), 0.752)  # L8
    assert b.step_time_s == pytest.approx(7.8455)  # L9
    # L11 is cut after "| gr": the record keeps what was printed and is marked partial
    assert c.iteration == 3385 and c.partial
    assert c.step_time_s == pytest.approx(7.6243) and c.learning_rate == pytest.approx(6.676e-6)
    assert c.loss_scale == 1.0 and c.losses == () and c.grad_norm is None
    assert c.skipped_iterations is None and c.nan_iterations is None
    s = log.summary()
    assert s["loss_missing_iterations"] == 1 and s["nan_iterations"] == 0


def test_08_every_iteration_skipped() -> None:
    log = _log("08")
    assert (log.lines, log.unparsed_lines) == (12, 7)
    assert [r.iteration for r in log.iterations] == [1, 2, 3, 4]
    assert all(r.skipped_iterations == 1 and r.losses == () for r in log.iterations)
    assert all(r.learning_rate == pytest.approx(1e-7) for r in log.iterations)
    assert log.iterations[0].step_time_s == pytest.approx(5.8011)  # L8, warm-up
    (mem,) = log.memory  # L9
    assert (mem.rank, mem.iteration) == (0, 1)
    assert mem.allocated_bytes == pytest.approx(33437.7109375 * MIB)
    assert mem.max_allocated_bytes == pytest.approx(61396.447265625 * MIB)
    assert mem.max_reserved_bytes == pytest.approx(61620.0 * MIB)
    s = log.summary()
    assert s["skipped_iterations"] == 3 and s["loss_missing_iterations"] == 3
    assert s["step_time_s"]["median"] == pytest.approx(1.1198)  # 1152.3, 1118.1, 1119.8 ms


def test_11_bridge_moe_mtp_losses() -> None:
    log = _log("11")
    assert (log.lines, log.unparsed_lines) == (10, 7)
    r = log.iterations[1]  # L9
    assert r.timestamp == "2026-05-28 22:26:50" and r.iteration == 30 and r.train_iters == 6069
    assert r.step_time_s == pytest.approx(29.5119) and r.tflops_per_gpu is None
    assert r.learning_rate == pytest.approx(6.0e-5) and r.grad_norm == pytest.approx(1.366)
    assert dict(r.losses) == {
        "lm loss": pytest.approx(0.8535482), "seq_load_balancing_loss": pytest.approx(1.248744),
        "mtp_1 loss": pytest.approx(1.080622), "mtp_2 loss": pytest.approx(1.143016)}
    assert log.summary()["step_time_s"]["median"] == pytest.approx((29.5119 + 29.7932) / 2)


def test_13_timer_only_v2() -> None:
    log = _log("13")
    assert (log.lines, log.unparsed_lines, log.iterations) == (13, 8, ())
    assert len(log.timers) == 2 + 7 + 9 + 9 + 9  # L9..L13
    fwd = [t.value_s for t in log.timers if t.name == "forward-compute"]
    assert fwd == pytest.approx([0.60456, 0.86401, 1.30465, 1.66407])
    s = log.summary()
    assert s["iterations"] == 0 and s["step_time_s"]["median"] is None
    assert s["skipped_iterations"] is None  # no line carried the counter
    assert s["timers_s"]["forward-compute"]["median"] == pytest.approx(1.30465)
    assert s["setup_timers_s"]["model-and-optimizer-setup"] == pytest.approx(1.73632)


def test_15_nemo2_progress_printer() -> None:
    log = _log("15")
    assert (log.lines, log.unparsed_lines) == (12, 6)
    r = log.iterations[0]  # L7, iteration printed 0-based and kept as printed
    assert (r.iteration, r.train_iters, r.fmt) == (120, 149, "nemo2")
    assert r.step_time_s == pytest.approx(0.03146)  # "train_step_timing in s" is seconds
    assert r.learning_rate == pytest.approx(3e-5) and r.consumed_samples == 121
    assert r.global_batch_size == 1 and dict(r.losses) == {"reduced_train_loss": 1.233}
    assert dict(r.extra) == {"global_step": 120.0, "val_loss": 4.106}
    s = log.summary()  # L8..L12: 31.63, 32.15, 31.57, 31.70, 31.47 ms
    assert s["step_time_s"]["median"] == pytest.approx(0.03163)
    assert s["skipped_iterations"] is None and s["nan_iterations"] is None


def test_17_multi_rank_glued_memory_theoretical_logging_timers() -> None:
    log = _log("17")
    # 58 non-blank lines; unparsed: 19 '#' lines and 6 info lines (L54-57, L61, L62); the 10 verbose
    # theoretical-memory lines are parsed (ingest/theoretical.py)
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (58, 25, 0)
    # 14 single lines + 4 physical lines with two records glued (L45, L47, L49, L52)
    assert len(log.memory) == 22
    assert sorted(m.rank for m in log.memory if m.rank is not None) == [*range(20), 24, 27]
    glued = [(m.rank, m.line) for m in log.memory if m.line in (45, 52)]
    assert glued == [(9, 45), (8, 45), (27, 52), (24, 52)]
    by_rank = {m.rank: m for m in log.memory}
    assert by_rank[0].max_allocated_bytes == pytest.approx(47104.31 * MIB)  # L41
    assert by_rank[24].reserved_bytes == pytest.approx(44752.00 * MIB)  # L52 second half
    theo = log.theoretical  # L29
    assert theo is not None
    assert theo.weight_and_optimizer_bytes == pytest.approx(35695.42 * MIB)
    assert theo.activation_bytes == pytest.approx(86554.12 * MIB)
    assert theo.total_bytes == pytest.approx(122249.54 * MIB)
    (it,) = log.iterations  # L51, microsecond timestamp
    assert it.timestamp == "2026-03-28 14:26:02.528844"
    assert it.step_time_s == pytest.approx(776.9383) and it.loss == pytest.approx(11.99893)
    # L58-L60: "INFO:megatron.core.timers:" prefixed (min, max) block
    setup = {t.name: t for t in log.timers}
    t = setup["train/valid/test-data-iterators-setup"]
    assert (t.min_s, t.max_s, t.kind) == (pytest.approx(0.19027), pytest.approx(0.292), "minmax")
    s = log.summary()
    assert s["iterations"] == 0 and s["step_time_s"]["median"] is None  # only the warm-up line
    assert log.summary(skip_warmup=0)["step_time_s"]["median"] == pytest.approx(776.9383)
    assert s["max_allocated_bytes"] == pytest.approx(47104.31 * MIB)
    assert s["max_allocated_rank"] in {0, 1, 2, 3}
    assert s["max_reserved_bytes"] == pytest.approx(48934.0 * MIB)


def test_merge_files_one_segment_each() -> None:
    log = read_logs([next(LOGS.glob("01_*")), next(LOGS.glob("08_*"))])
    assert log.segment_starts == (0, 3)
    s = log.summary()
    assert s["iterations"] == 2 + 3 and s["warmup_records_skipped"] == 2
    assert s["segments"] == 2


def test_missing_file_is_ingest_error(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="no such file"):
        read_log(tmp_path / "nope.log")
    with pytest.raises(IngestError):
        read_logs([])


# ---- formats documented in shared/reference/megatron-logs.md without a sample file ----


def test_head_memory_line_with_device_memory_and_save_context() -> None:
    line = ("[Rank 7] (before save_checkpoint for iteration 200) memory (MB) | "
            "allocated: 1024.00 | max allocated: 2048.00 | reserved: 3072.00 | "
            "max reserved: 4096.00 | total device memory used: 5120.00")
    (m,) = parse_line(line)
    assert isinstance(m, MemoryRecord)
    assert (m.rank, m.iteration, m.context) == (7, 200, "before save_checkpoint for iteration 200")
    assert m.max_reserved_bytes == 4096 * MIB and m.device_used_bytes == 5120 * MIB


def test_bridge_gb_memory_line_is_decimal_gigabytes() -> None:
    line = ("[Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 12.345 | "
            "mem-reserved-gigabytes: 20.0 | mem-max-allocated-gigabytes: 30.5 | "
            "mem-max-reserved-gigabytes: 31.0 | mem-alloc-retires: 2 | mem-allocated-count: 1234")
    (m,) = parse_line(line)
    assert isinstance(m, MemoryRecord) and m.fmt == "bridge"
    assert m.allocated_bytes == pytest.approx(12.345e9) and m.max_allocated_bytes == 30.5e9
    assert dict(m.extra) == {"alloc retires": 2.0, "allocated count": 1234.0}


def test_v1_memory_line_cached() -> None:
    (m,) = parse_line("memory (MB) | allocated: 100.5 | max allocated: 200.25 | cached: 300.0 | "
                      "max cached: 400.0")
    assert isinstance(m, MemoryRecord) and m.rank is None
    assert m.reserved_bytes == 300 * MIB and m.max_reserved_bytes == 400 * MIB


def test_timer_blocks_max_and_all() -> None:
    text = "\n".join([
        " iteration       20/     100 | elapsed time per iteration (ms): 5.0 |",
        "max time across ranks (ms):",
        "    forward-backward ...............................: 106624.28",
        "times across ranks (ms):",
        "  forward-backward:",
        "     rank  0: 106622.81",
        "     rank  1: 106624.28",
        "  optimizer:",
        "     rank  0: 2221.02",
        "done",
    ])
    log = parse_text(text)
    mx, fb, opt = log.timers
    assert (mx.kind, mx.max_s, mx.min_s, mx.iteration) == ("max", 106.62428, None, 20)
    assert (fb.kind, fb.min_s, fb.max_s) == ("all", 106.62281, 106.62428)
    assert dict(fb.per_rank) == {"0": 106.62281, "1": 106.62428}
    assert opt.value_s == pytest.approx(2.22102)
    assert log.unparsed_lines == 1  # "done"


def test_megatron_deepspeed_alcf_primus_nemo1_bridge_step() -> None:
    ds = (" iteration      100/    1000 | consumed samples:        51200 | consumed tokens: "
          " 104857600 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.500E-04 | "
          "global batch size:   512 | lm loss: 6.543210E+00 | loss scale: 65536.0 | grad norm: "
          "1.234 | actual seqlen:  2048 | number of skipped iterations:   0 | number of nan "
          "iterations:   0 | samples per second: 414.745 | TFLOPs: 150.23 |")
    alcf = ("[2024-06-21 10:50:42][INFO][training:1609] - iteration=  20/ 100 | "
            "consumed_samples= 2560 | elapsed_time_per_iteration_ms= 2345.6 | "
            "learning_rate= 3e-05 | global_batch_size= 128 | lm loss= 7.1 | loss_scale= 1.0 | "
            "[LM]TFLOPs= 120.5 | [DS]TFLOPs= 130.1 |")
    primus = ("[20250101 10:00:00][rank-7/8][INFO ] [----trainer.py:2560] : iteration 126/ 5000 | "
              "elapsed time per iteration (ms): 13372.8/13364.7 | hip mem usage/free/total/"
              "usage_ratio: 153.81GB/38.19GB/192.00GB/80.11% | "
              "throughput per GPU (TFLOP/s/GPU): 567.6/568.0 |")
    nemo1 = ("Epoch 0:   1%|▏         | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, "
             "reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]")
    log = parse_text("\n".join([ds, alcf, primus, nemo1]))
    d, a, p, n = log.iterations
    assert (d.fmt, d.tflops_per_gpu, d.step_time_s) == ("megatron-deepspeed", 150.23, 1.2345)
    assert (a.fmt, a.tflops_per_gpu, a.step_time_s, a.loss) == ("alcf", 120.5, 2.3456, 7.1)
    assert dict(a.extra)["[DS]TFLOPs"] == 130.1
    assert (p.step_time_s, p.tflops_per_gpu) == (13.3728, 567.6)  # current, not average
    assert (n.fmt, n.iteration, n.step_time_s, n.consumed_samples) == ("nemo1", 794, 41.36, 1630000)
    assert dict(n.losses)["reduced_train_loss"] == 3.09
    (mem,) = parse_line("epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=12.3, "
                        "CurrSamplesPerSec=12.5, MemAllocated=1.5GB, MaxMemAllocated=3.25GB")
    assert isinstance(mem, MemoryRecord) and mem.max_allocated_bytes == 3.25 * 2**30
    timers = parse_line("[Rank 0] time (ms) | fwd: 12.5 | bwd: 30.1 | step: 5.0")
    assert [(t.name, t.rank) for t in timers if isinstance(t, TimerRecord)] == [
        ("fwd", 0), ("bwd", 0), ("step", 0)]
    bridge = parse_text("Step Time : 3.90s GPU utilization: 209.5MODEL_TFLOP/s/GPU\n" * 3)
    assert bridge.summary()["step_time_s"]["median"] == pytest.approx(3.9)  # fallback, 2 of 3


def test_validation_weight_only_theoretical_and_nan_loss() -> None:
    text = "\n".join([
        "-" * 100,
        " validation loss at iteration 1000 | lm loss value: 5.741563E+00 | lm loss PPL: "
        "3.115511E+02 |",
        "-" * 100,
        "Theoretical memory footprints: weight and optimizer=776.41 MB",
        " iteration 1/10 | elapsed time per iteration (ms): 1.0 |",
        " iteration 2/10 | lm loss: nan | elapsed time per iteration (ms): 9.0 | number of nan"
        " iterations:   0 |",
    ])
    log = parse_text(text)
    (v,) = log.validation
    assert v.iteration == 1000 and dict(v.values)["lm loss PPL"] == pytest.approx(311.5511)
    assert log.theoretical is not None and log.theoretical.total_bytes is None
    assert log.theoretical.weight_and_optimizer_bytes == pytest.approx(776.41 * MIB)
    assert math.isnan(log.iterations[1].losses[0][1])
    assert log.summary()["nan_iterations"] == 1  # bf16: counter 0 but the printed loss is NaN
    assert log.unparsed_lines == 0
    assert log.to_dict()["iterations"][1]["losses"] == {"lm loss": None}


# ---- TensorBoard ----


def test_runlog_from_scalars_without_tensorboard() -> None:
    log = runlog_from_scalars({
        "learning-rate": {1: 1e-4, 2: 2e-4, 3: 3e-4},
        "iteration-time": {2: 1.5, 3: 1.25},
        "throughput": {2: 400.0, 3: 410.0},
        "lm loss": {1: 9.0, 2: 8.0, 3: 7.0},
        "lm loss vs samples": {512: 9.0},
        "mem-max-allocated-bytes": {2: 7.0e10},
        "forward-backward-time": {2: 1.2, 3: 1.1},
    })
    assert [r.iteration for r in log.iterations] == [2, 3]  # logged intervals only
    assert log.iterations[0] == IterationRecord(
        iteration=2, step_time_s=1.5, tflops_per_gpu=400.0, learning_rate=2e-4,
        losses=(("lm loss", 8.0),), fmt="tensorboard")
    assert log.memory[0].max_allocated_bytes == 7.0e10 and log.memory[0].rank is None
    assert [(t.name, t.value_s) for t in log.timers] == [("forward-backward", 1.2),
                                                         ("forward-backward", 1.1)]


def _write_events(directory: Path) -> None:
    writer_mod = pytest.importorskip("tensorboard.summary.writer.event_file_writer")
    from tensorboard.compat.proto import event_pb2, summary_pb2

    writer = writer_mod.EventFileWriter(str(directory))
    scalars = {"iteration-time": [2.0, 1.0, 1.1, 1.2], "throughput": [100.0, 200.0, 210.0, 220.0],
               "mem-max-allocated-bytes": [5e10] * 4, "forward-backward-time": [1.9, 0.9, 1.0, 1.1],
               "lm loss": [10.0, 9.0, 8.0, 7.0]}
    for step in range(1, 5):
        values = [summary_pb2.Summary.Value(tag=t, simple_value=v[step - 1])
                  for t, v in scalars.items()]
        writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step,
                                         summary=summary_pb2.Summary(value=values)))
    writer.close()


def test_tensorboard_event_file(tmp_path: Path) -> None:
    _write_events(tmp_path)
    log = read_tensorboard(tmp_path)
    assert [r.step_time_s for r in log.iterations] == pytest.approx([2.0, 1.0, 1.1, 1.2])  # f32
    s = log.summary()
    assert s["step_time_s"]["median"] == pytest.approx(1.1)
    assert s["tflops_per_gpu"]["median"] == pytest.approx(210.0)
    assert s["max_allocated_bytes"] == pytest.approx(5e10)
    assert s["timers_s"]["forward-backward"]["median"] == pytest.approx(1.0)
    event_file = next(tmp_path.iterdir())
    assert read_log(event_file).summary()["iterations"] == 3


def test_tensorboard_missing_package_message(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    import importlib

    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> object:
        if name.startswith("tensorboard"):
            raise ImportError(name)
        return real(name, package)

    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(IngestError, match=r"pip install paraplan\[tensorboard\]"):
        read_tensorboard(tmp_path)


def test_tensorboard_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="no TensorBoard event files"):
        read_tensorboard(tmp_path)


def test_warm_up_timers_are_the_blocks_of_the_warm_up_intervals() -> None:
    """A timer block belongs to the iteration line before it: the warm-up interval's block is left
    out, not the first block of every timer name (reference §9.4, §9.6)."""
    text = (" iteration        1/     100 | elapsed time per iteration (ms): 9000.0 |\n"
            " iteration       10/     100 | elapsed time per iteration (ms): 500.0 |\n"
            "(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (400.00, 410.00)\n"
            " iteration       20/     100 | elapsed time per iteration (ms): 510.0 |\n"
            "(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (420.00, 430.00)\n"
            "    optimizer ......................................: (40.00, 50.00)\n")
    timers = parse_text(text).summary(1)["timers_s"]
    # iteration 1 is the warm-up record and printed no timers: both blocks count
    assert timers["forward-backward"]["median"] == pytest.approx(0.42)
    assert timers["optimizer"]["median"] == pytest.approx(0.05)
    # 03: optimizer-inner-step first appears in the second interval's block (its line is cut)
    summary = _log("03").summary(1)["timers_s"]
    assert summary["optimizer-inner-step"]["median"] == pytest.approx(0.046)
    assert summary["forward-compute"]["median"] == pytest.approx(0.05816)
