"""User recipe files (CSV or YAML, the reference columns): good rows run beside the library, bad rows are one line
naming the file, the row and the column."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.recipes.catalogue import REQUIRED
from paraplan.recipes.knobs import not_modelled
from paraplan.recipes.user import catalogue

GOOD_CSV = (
    "source,model,gpu,num_gpus,precision,seq_length,global_batch_size,micro_batch_size,tp,pp,vp,cp,"
    "sequence_parallel,recompute_granularity,grad_reduce_in_fp32\n"
    "mine:llama70b_tuned,llama3_70b,h100,64,bf16,8192,128,1,8,2,5,1,True,None,True\n"
    "mine:llama8b_small,llama3-8b,h100-80gb,8,fp8_cs,4096,64,2,1,1,None,1,False,selective,False\n"
)

GOOD_YAML = """\
recipes:
  - source: mine:qwen3_30b
    model: qwen3-30b-a3b
    gpu: b200
    num_gpus: 16
    precision: bf16
    seq_length: 4096
    global_batch_size: 256
    micro_batch_size: 1
    tp: 1
    pp: 1
    ep: 8
    recompute_granularity: selective
    recompute_modules: [moe_act, layernorm]
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_good_csv_rows_run_with_their_knobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "mine.csv", GOOD_CSV)
    code, out, err = run(["estimate", "--recipes", path, "--recipe", "mine:llama70b_tuned", "--format", "json"], capsys)
    d = json.loads(out)
    assert code == (0 if d["memory"]["fits"] else 4), err  # 4: the layout does not fit
    assert (d["config"]["tp"], d["config"]["pp"], d["config"]["vp"], d["config"]["dp"]) == (8, 2, 5, 4)
    assert d["config"]["recompute"] == "none" and d["config"]["sequence_parallel"] is True
    assert d["recipe"]["origin"] == path and d["recipe"]["not_modelled"] == []  # every knob at paraplan's values
    code, out, err = run(["estimate", "--recipes", path, "--recipe", "llama3-8b-h100-fp8cs-8-user", "--format", "json"],
                         capsys)
    d = json.loads(out)
    assert code == (0 if d["memory"]["fits"] else 4), err
    assert d["config"]["precision"] == "fp8" and d["config"]["mbs"] == 2
    assert not any(x.startswith("grad_reduce_in_fp32") for x in d["recipe"]["not_modelled"])  # modelled now
    assert d["config"]["memory_knobs"]["grad_reduce_in_bf16"] is True


def test_good_yaml_rows_and_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "mine.yaml", GOOD_YAML)
    code, out, err = run(["estimate", "--recipes", path, "--recipe", "mine:qwen3_30b", "--format", "json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["config"]["ep"] == 8 and d["config"]["recompute_modules"] == ["moe_act", "layernorm"]
    code, out, _ = run(["recipes", "--recipes", path, "--model", "qwen3-30b-a3b", "--gpu", "b200", "--format",
                        "json"], capsys)
    assert code == 0
    listed = json.loads(out)
    assert listed[-1]["source"] == "mine:qwen3_30b" and listed[-1]["origin"] == path
    assert len(catalogue(path)) == len(catalogue()) + 1


def test_missing_columns_take_the_bridge_defaults(tmp_path: Path) -> None:
    header = ",".join(REQUIRED)
    path = write(tmp_path, "min.csv", f"{header}\nx:min,llama3_8b,h100,8,bf16,4096,32,1,1,1\n")
    (r,) = [x for x in catalogue(path) if x.source == "x:min"]
    assert r.get("cp") == 1 and r.get("grad_reduce_in_fp32") is True and r.get("use_distributed_optimizer") is True
    assert not_modelled(r) == []


BAD = [
    ("tpp", "1", "unknown column 'tpp' (did you mean tp?)"),
    ("tp", "abc", "row 1 (x:bad): column tp: expected an integer >= 1, got 'abc'"),
    ("tp", "0", "column tp: expected an integer >= 1, got '0'"),
    ("sequence_parallel", "yes", "column sequence_parallel: expected True or False, got 'yes'"),
    ("precision", "fp4", "column precision: expected one of bf16, fp16, fp8, fp8_cs"),
    ("recompute_granularity", "most", "column recompute_granularity: expected one of None, selective, full"),
    ("pipeline_model_parallel_layout", "Et*999999999|tL", "column pipeline_model_parallel_layout: expected a layout"),
    ("pipeline_model_parallel_layout", "Ex|tL", "column pipeline_model_parallel_layout: expected MCore layout"),
    ("attention_backend", "magic", "column attention_backend: expected one of"),
    ("task", "rlhf", "column task: expected one of pretrain, sft, peft"),
]


@pytest.mark.parametrize(("column", "value", "message"), BAD)
def test_bad_csv_cells_are_one_line_naming_row_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          column: str, value: str, message: str) -> None:
    fields = dict(zip(REQUIRED, ["x:bad", "llama3_8b", "h100", "8", "bf16", "4096", "32", "1", "1", "1"],
                      strict=True))
    fields[column] = value
    path = write(tmp_path, "bad.csv", ",".join(fields) + "\n" + ",".join(fields.values()) + "\n")
    start = time.perf_counter()
    code, _, err = run(["estimate", "--recipes", path, "--recipe", "x:bad"], capsys)
    assert time.perf_counter() - start < 5
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: --recipes {path}: ") and message in err


@pytest.mark.parametrize(("text", "message"), [
    ("source,model\nx,llama3_8b\n", "missing column(s) gpu, num_gpus"),
    ("", "empty file"),
    ("- 1\n- 2\n", "row 1: expected a mapping of column names to values"),
    ("just text\n", "expected a list of recipes"),
    ("recipes: [\n", "not valid YAML"),
    ("- {source: a, model: mixtral_9x9b, gpu: h100, num_gpus: 8, precision: bf16, seq_length: 4096, "
     "global_batch_size: 8, micro_batch_size: 1, tp: 1, pp: 1}\n", "row 1: column model: 'mixtral_9x9b' has no"),
    ("- {source: a, model: llama3_8b, gpu: tpu, num_gpus: 8, precision: bf16, seq_length: 4096, "
     "global_batch_size: 8, micro_batch_size: 1, tp: 1, pp: 1}\n", "row 1: column gpu: 'tpu' has no paraplan preset"),
    ("- {source: a, model: llama3_8b, gpu: h100, num_gpus: 8, precision: bf16, seq_length: 4096, "
     "global_batch_size: 8, micro_batch_size: 1, tp: {x: 1}, pp: 1}\n", "row 1: column tp: expected a number"),
])
def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    name = "bad.csv" if text.startswith("source,") or text == "" else "bad.yaml"
    path = write(tmp_path, name, text)
    code, _, err = run(["recipes", "--recipes", path], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert message in err


def test_duplicate_and_library_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    row = "x:dup,llama3_8b,h100,8,bf16,4096,32,1,1,1\n"
    path = write(tmp_path, "dup.csv", ",".join(REQUIRED) + "\n" + row + row)
    code, _, err = run(["recipes", "--recipes", path], capsys)
    assert code == 1 and "row 2: source 'x:dup' names row 1 too" in err
    same_job = ["x:a,llama3_8b,h100,8,bf16,4096,32,1,1,1\n", "x:b,llama3_8b,h100,8,bf16,4096,32,1,1,1\n"]
    path = write(tmp_path, "job.csv", ",".join(REQUIRED) + "\n" + "".join(same_job))
    code, _, err = run(["recipes", "--recipes", path], capsys)
    assert code == 1 and "row 2 (source 'x:b') is the same job as row 1 (source 'x:a')" in err
    source = "src/megatron/bridge/perf_recipes/llama/h100/llama3.py:llama3_70b_pretrain_64gpu_h100_fp8cs_config"
    clash = f"{source},llama3_70b,h100,64,fp8_cs,8192,256,1,4,8\n"
    path = write(tmp_path, "clash.csv", ",".join(REQUIRED) + "\n" + clash)
    code, _, err = run(["recipes", "--recipes", path], capsys)
    assert code == 1 and f"row 1: '{source}' is already a recipe of the library" in err


def test_a_user_recipe_for_nvidias_job_gets_its_own_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    row = "x:mine,llama3_70b,h100,64,fp8_cs,8192,256,1,4,8\n"
    path = write(tmp_path, "mine.csv", ",".join(REQUIRED) + "\n" + row)
    code, out, err = run(["estimate", "--recipes", path, "--recipe", "llama3-70b-h100-fp8cs-64-user", "--format",
                          "json"], capsys)
    d = json.loads(out)
    assert code == (0 if d["memory"]["fits"] else 4), err  # 4: the layout does not fit
    assert d["recipe"]["source"] == "x:mine"


def test_a_fifo_or_directory_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    code, _, err = run(["recipes", "--recipes", str(fifo)], capsys)
    assert code == 1 and "FIFO" in err and err.count("\n") == 1
    code, _, err = run(["recipes", "--recipes", str(tmp_path)], capsys)
    assert code == 1 and "directory" in err


def test_an_oversized_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.recipes.catalogue import MAX_USER_FILE_BYTES

    path = tmp_path / "big.csv"
    path.write_bytes(b"#" * (MAX_USER_FILE_BYTES + 1))
    code, _, err = run(["recipes", "--recipes", str(path)], capsys)
    assert code == 1 and "larger than 16 MiB" in err


def test_plan_and_explain_call_a_user_recipe_yours_not_nvidias(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = ["-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"]
    path = write(tmp_path, "mine.csv", ",".join(REQUIRED) + "\n" + "a:mine,llama3_8b,h100,8,bf16,4096,64,1,2,1\n")
    code, out, _ = run(["explain", *job, "--recipes", path], capsys)
    text = " ".join(out.split())
    assert code == 0 and "llama3-8b-h100-bf16-8-user" in text
    assert "closest recipe, yours, for this model and GPU" in text and "- RECIPE your recipe llama3-8b-h100" in text
    assert "NVIDIA recipe llama3-8b-h100-bf16-8-user" not in text
    code, out, _ = run(["explain", *job], capsys)  # without the file: NVIDIA's
    assert code == 0 and "closest NVIDIA recipe for this model and GPU" in " ".join(out.split())
