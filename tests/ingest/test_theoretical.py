"""The theoretical-memory block (reference §3) and AMD Primus iteration lines (reference §8).

``Lnn`` is the 1-based line number in the fixture file; values checked by hand against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paraplan.cli.ingest  # noqa: F401  (registers the command)
from paraplan.cli import main
from paraplan.ingest import parse_line, parse_text, read_log
from paraplan.ingest.records import IterationRecord, MemoryRecord, TheoreticalMemoryRecord
from paraplan.ingest.theoretical import billions_to_count, parse_theoretical

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
REFERENCE_BLOCK = FIXTURES / "reference_theoretical_memory_block.txt"
SAMPLE_17 = next(FIXTURES.glob("17_*.log"))
MIB = 2**20
GIB = 2**30


def _theo(text: str) -> TheoreticalMemoryRecord:
    log = parse_text(text)
    assert log.theoretical is not None
    return log.theoretical


def test_reference_block_every_line_parsed() -> None:
    log = read_log(REFERENCE_BLOCK)
    # 22 '#' header lines (unparsed), then 10 block lines (L23..L32), all recognised
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (32, 22, 0)
    t = log.theoretical
    assert t is not None and t.complete and t.line == 23
    assert t.activation_formula == "without_sp"  # L23 marker and L31 "(precise, without SP)"
    assert t.transformer_params == 64_430_000_000  # L24 "64.43" billions, exact
    assert t.active_transformer_params == 64_430_000_000  # L25
    assert t.embedding_params == 260_000_000  # L26
    assert t.total_params == t.total_active_params == 64_690_000_000  # L27, L28
    assert t.most_loaded_shard_params == 2_079_400_000  # L29
    assert t.other_shards_params == 2_013_300_000  # L30
    assert t.activation_per_layer_bytes == 1024 * MIB  # L31
    assert t.mtp_params is None and t.interleaved_penalty is None and t.in_flight_microbatches is None
    assert t.weight_and_optimizer_bytes == pytest.approx(35695.42 * MIB)  # L32
    assert t.activation_bytes == pytest.approx(86554.12 * MIB)
    assert t.total_bytes == pytest.approx(122249.54 * MIB)
    assert [k for k, _ in t.components] == ["weight and optimizer", "activation", "total"]
    assert t.unsupported is None and t.extra == ()
    assert t.raw.splitlines()[0] == "compute_activation_memory_without_sp"
    assert t.raw.splitlines()[-1].startswith("Theoretical memory footprints: weight and optimizer=35695.42 MB")
    assert len(t.raw.splitlines()) == 10


def test_reference_block_in_json_and_summary() -> None:
    out = json.loads(json.dumps(read_log(REFERENCE_BLOCK).to_dict(), allow_nan=False))
    theo = out["theoretical"]
    assert theo["total_params"] == 64_690_000_000
    assert theo["most_loaded_shard_params"] == 2_079_400_000
    assert theo["total_bytes"] == pytest.approx(122249.54 * MIB)
    assert theo["components"]["activation"] == pytest.approx(86554.12 * MIB)
    s = out["summary"]
    assert s["theoretical_total_bytes"] == pytest.approx(122249.54 * MIB)
    assert s["theoretical_weight_and_optimizer_bytes"] == pytest.approx(35695.42 * MIB)
    assert s["theoretical_activation_bytes"] == pytest.approx(86554.12 * MIB)
    assert s["theoretical_total_params"] == 64_690_000_000
    assert s["theoretical_most_loaded_shard_params"] == 2_079_400_000
    assert s["unparsed_lines"] == 22


def test_sample_17_block() -> None:
    log = read_log(SAMPLE_17)
    # L19..L29: 7 parameter lines, the marker after them (L26), per-layer (L27), in-flight (L28), summary (L29)
    t = log.theoretical
    assert t is not None and t.line == 19 and len(t.raw.splitlines()) == 11
    assert (t.transformer_params, t.active_transformer_params) == (64_430_000_000, 64_430_000_000)
    assert (t.embedding_params, t.total_params, t.total_active_params) == (260_000_000, 64_690_000_000,
                                                                           64_690_000_000)
    assert (t.most_loaded_shard_params, t.other_shards_params) == (2_079_400_000, 2_013_300_000)
    assert t.activation_formula == "without_sp" and t.activation_per_layer_bytes == 1024 * MIB
    assert t.in_flight_microbatches == 8 and t.interleaved_penalty is None and t.mtp_params is None
    assert t.total_bytes == pytest.approx(122249.54 * MIB)
    # 58 non-blank lines; unparsed now only the 19 '#' lines and 6 info lines (L54-L57, L61, L62)
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (58, 25, 0)


def test_optional_and_older_lines() -> None:
    t = _theo("\n".join([
        "compute_activation_memory with SP",
        "Number of parameters in transformer layers in billions:  6.48",  # wording before 2025-04
        "Number of parameters in mtp block in billions:  0.91",
        "Number of parameters in embedding layers in billions: 0.53",
        "Number of parameters in vision tower in billions: 0.30",  # not documented: kept in extra
        "Total number of parameters in billions: 7.01",
        "Number of parameters in most loaded shard in billions: 0.8101",
        "Activation memory footprint per transformer layer: 40.0 MB",  # SP + selective path
        "Memory penalty from interleaved schedule: 1.25",
        "Number of in-flight microbatches: 4",
        "Theoretical memory footprints: weight and optimizer=776.41 MB",  # weight-only form
    ]))
    assert t.activation_formula == "with_sp"
    assert (t.transformer_params, t.mtp_params, t.embedding_params) == (6_480_000_000, 910_000_000,
                                                                        530_000_000)
    assert t.extra == (("Number of parameters in vision tower", 300_000_000.0),)
    assert (t.total_params, t.most_loaded_shard_params) == (7_010_000_000, 810_100_000)
    assert t.activation_per_layer_bytes == 40 * MIB
    assert (t.interleaved_penalty, t.in_flight_microbatches) == (1.25, 4)
    assert t.weight_and_optimizer_bytes == pytest.approx(776.41 * MIB)
    assert t.activation_bytes is None and t.total_bytes is None


def test_bridge_components_hybrid_and_prefixes() -> None:
    bridge = ("Theoretical memory footprints: weights=100.00 MB, gradients=50.00 MB, optimizer states=200.00 MB, "
              "activations=300.50 MB, total=650.50 MB")
    t = _theo(bridge)
    assert t.total_bytes == pytest.approx(650.5 * MIB) and t.weight_and_optimizer_bytes is None
    assert dict(t.components)["optimizer states"] == pytest.approx(200 * MIB) and len(t.components) == 5
    hybrid = _theo("Theoretical memory footprints not yet supported for hybrid Mamba-Transformer models.")
    assert hybrid.unsupported == "hybrid Mamba-Transformer models" and hybrid.complete
    assert hybrid.total_bytes is None
    # launcher prefixes are stripped before matching (reference §9.1)
    (r,) = parse_line("0: [rank0]: Number of in-flight microbatches: 16", 3)
    assert isinstance(r, TheoreticalMemoryRecord) and (r.in_flight_microbatches, r.line) == (16, 3)
    assert parse_theoretical("Number of parameters in transformer block in billions: lots") is None
    assert billions_to_count("2.0794") == 2_079_400_000 and billions_to_count("x") is None


def test_first_block_wins_and_orphan_lines() -> None:
    log = parse_text("\n".join([
        "Total number of parameters in billions: 1.00",
        "Theoretical memory footprints: weight and optimizer=10.00 MB, activation=5.00 MB, total=15.00 MB",
        "Total number of parameters in billions: 2.00",  # a second block (e.g. a restart): ignored
        "Theoretical memory footprints: weight and optimizer=20.00 MB, activation=5.00 MB, total=25.00 MB",
    ]))
    t = log.theoretical
    assert t is not None and t.total_params == 1_000_000_000 and t.total_bytes == pytest.approx(15 * MIB)
    assert log.unparsed_lines == 0
    orphan = _theo("Number of parameters in most loaded shard in billions: 0.5000")  # cut before the summary
    assert orphan.most_loaded_shard_params == 500_000_000 and not orphan.complete
    assert parse_text("Number of parameters in most loaded shard in billions: 0.5").summary()[
        "theoretical_total_bytes"] is None


def test_cli_table_shows_the_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(REFERENCE_BLOCK)]) == 0
    out = capsys.readouterr().out
    assert "Megatron theoretical memory" in out
    assert "2.0794 B" in out and "64.69 B" in out  # most loaded shard, total parameters
    assert "1,024.0 MiB" in out and "119.38 GiB" in out  # per-layer activation, total 122249.54 MiB


# ---- AMD Primus (reference §8) ----

PRIMUS = ("[20250101 10:00:00][rank-7/8][INFO ] [----trainer.py:2560] : iteration 126/ 5000 | "
          "consumed samples: 64512 | elapsed time per iteration (ms): 13372.8/13364.7 | "
          "hip mem usage/free/total/usage_ratio: 153.81GB/38.19GB/192.00GB/80.11% | "
          "throughput per GPU (TFLOP/s/GPU): 567.6/568.0 | tokens per GPU (tokens/s/GPU): 9801.4/9807.3 | "
          "learning rate: 1.000000E-04 | global batch size:   512 | lm loss: 2.345678E+00 |")


def test_primus_iteration_and_hip_memory() -> None:
    log = parse_text(PRIMUS)
    (it,) = log.iterations
    (mem,) = log.memory
    assert (it.fmt, it.iteration, it.train_iters, it.timestamp) == ("primus", 126, 5000, "20250101 10:00:00")
    assert (it.step_time_s, it.tflops_per_gpu) == (13.3728, 567.6)  # current values
    extra = dict(it.extra)
    assert extra["tokens per GPU (tokens/s/GPU)"] == 9801.4
    assert extra["average elapsed time per iteration (ms)"] == 13364.7
    assert extra["average throughput per GPU (TFLOP/s/GPU)"] == 568.0
    assert extra["average tokens per GPU (tokens/s/GPU)"] == 9807.3
    assert it.loss == pytest.approx(2.345678) and it.consumed_samples == 64512 and not it.partial
    assert (mem.fmt, mem.rank, mem.iteration, mem.context) == ("primus", 7, 126, "iteration 126")
    assert mem.device_used_bytes == pytest.approx(153.81 * GIB)
    assert mem.max_allocated_bytes is None and mem.allocated_bytes is None  # HIP view, not the allocator's
    assert dict(mem.extra) == {"free": pytest.approx(38.19 * GIB), "total": pytest.approx(192.0 * GIB),
                               "usage ratio": pytest.approx(0.8011)}
    assert (log.lines, log.unparsed_lines, log.partial_lines) == (1, 0, 0)
    s = log.summary(skip_warmup=0)
    assert s["max_device_used_bytes"] == pytest.approx(153.81 * GIB)
    assert s["step_time_s"]["median"] == pytest.approx(13.3728)


def test_primus_truncated_and_plain_megatron_unchanged() -> None:
    cut = PRIMUS[: PRIMUS.index("38.19GB") + 3]  # "... usage_ratio: 153.81GB/38."
    records = parse_line(cut)
    assert [type(r) for r in records] == [IterationRecord, MemoryRecord]
    it, mem = records
    assert isinstance(mem, MemoryRecord) and mem.partial and mem.device_used_bytes == pytest.approx(153.81 * GIB)
    assert isinstance(it, IterationRecord) and it.fmt == "primus"
    broken = parse_line(PRIMUS[: PRIMUS.index("153.81GB") + 2])  # no readable usage value
    assert [type(r) for r in broken] == [IterationRecord] and broken[0].partial
    plain = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 812.5 |")
    assert plain.iterations[0].fmt == "megatron" and plain.memory == ()
    assert plain.summary()["max_device_used_bytes"] is None
