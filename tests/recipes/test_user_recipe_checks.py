"""User recipe files: what Megatron would refuse later is refused at read, naming the row and the column or
source the user wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.recipes.user import read_user_recipes

HEAD = "source,model,gpu,num_gpus,precision,seq_length,global_batch_size,tp,pp,cp,micro_batch_size\n"


def _read(tmp_path: Path, *rows: str) -> str:
    path = tmp_path / "r.csv"
    path.write_text(HEAD + "".join(row + "\n" for row in rows))
    with pytest.raises(SpecError) as info:
        read_user_recipes(str(path))
    return str(info.value).split(": ", 1)[1]


def test_a_gbs_not_divisible_by_dp_times_mbs_is_refused_at_read(tmp_path: Path) -> None:
    msg = _read(tmp_path, "mine:a,llama3_8b,h100,8,bf16,4096,12,1,1,1,1")
    assert msg.startswith("row 1 (mine:a): column global_batch_size: expected a multiple of micro_batch_size x DP = "
                          "1 x 8") and msg.endswith("got '12'")
    assert "column global_batch_size" in _read(tmp_path, "mine:a,llama3_8b,h100,8,bf16,4096,16,2,1,1,3")
    path = tmp_path / "ok.csv"
    path.write_text(HEAD + "mine:a,llama3_8b,h100,8,bf16,4096,24,2,1,1,3\n")  # DP 4 x mbs 3 = 12 divides 24
    assert len(read_user_recipes(str(path))) == 1


def test_two_rows_of_one_job_are_named_by_their_sources(tmp_path: Path) -> None:
    msg = _read(tmp_path, "mine:a,llama3_8b,h100,8,bf16,4096,16,1,1,1,1",
                "mine:b,llama3_8b,h100,8,bf16,4096,32,1,1,1,1")
    assert msg.startswith("row 2 (source 'mine:b') is the same job as row 1 (source 'mine:a')")
    assert "-user" not in msg  # not the alias paraplan made
    again = _read(tmp_path, "mine:a,llama3_8b,h100,8,bf16,4096,16,1,1,1,1",
                  "mine:a,llama3_8b,h100,16,bf16,4096,32,1,1,1,1")
    assert again == "row 2: source 'mine:a' names row 1 too (sources are unique)"


@pytest.mark.parametrize(("layout", "column"), [("3,1,1", "tp"), ("2,3,1", "pp"), ("1,2,3", "cp")])
def test_a_layout_that_does_not_divide_the_gpus_names_its_column(tmp_path: Path, layout: str, column: str) -> None:
    msg = _read(tmp_path, f"mine:a,llama3_8b,h100,8,bf16,4096,16,{layout},1")
    assert msg.startswith(f"row 1 (mine:a): column {column}: expected TP x PP x CP") and "num_gpus 8" in msg
    assert "1,099,511,627,776" not in msg
