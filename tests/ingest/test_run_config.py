"""The run's own statement of its configuration: the sizes line and the argument dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.ingest import parse_text, read_log
from paraplan.ingest.run_config import read_run_config
from paraplan.specs.megatron_flags import argv_from_dump, read_flags

DUMP = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "synthetic" / "argument_dump.log"


@pytest.mark.parametrize(("line", "sizes"), [
    ("using world size: 64, data-parallel size: 4, context-parallel size: 2, hierarchical context-parallel sizes: "
     "None, tensor-model-parallel size: 4, pipeline-model-parallel size: 2", {"world": 64, "dp": 4, "cp": 2,
                                                                             "tp": 4, "pp": 2}),
    # older versions (megatron-logs.md section 7), with a launcher prefix
    ("0: using world size: 16, data-parallel-size: 4, tensor-model-parallel size: 4, pipeline-model-parallel size: 1",
     {"world": 16, "dp": 4, "tp": 4, "pp": 1}),
])
def test_sizes_line(line: str, sizes: dict[str, int]) -> None:
    config = read_run_config(line + "\n")
    assert config is not None and config.sizes == sizes


def test_argument_dump_is_read_and_becomes_a_command_line() -> None:
    log = read_log(DUMP)
    assert log.run_config is not None
    sizes = log.run_config.sizes
    assert (sizes["tp"], sizes["pp"], sizes["dp"], sizes["world"], sizes["mbs"], sizes["gbs"]) == (2, 1, 8, 16, 1, 128)
    flags = read_flags(argv_from_dump(log.run_config.arguments))
    assert flags.problems == ()
    m = flags.model
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.vocab_size, m.rotary_base) == (32, 4096, 8, 128256,
                                                                                               500000)
    assert not m.add_bias_linear and m.swiglu and m.untie_embeddings_and_output_weights
    assert flags.layout_fields["tp"] == 2 and flags.layout_fields["sequence_parallel"]
    assert flags.training_fields["precision"] == "bf16"
    assert [r.iteration for r in log.iterations] == [10, 20, 30]


def test_a_log_without_them_has_no_run_config() -> None:
    assert parse_text(" iteration 10/100 | elapsed time per iteration (ms): 100.0 |\n").run_config is None
