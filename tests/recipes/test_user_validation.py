"""Every cell of a user recipe row is checked when the file is read (``paraplan recipes --recipes FILE`` lists nothing
wrong): one line naming the file, the row, the column and the allowed values, with one ``--recipes`` prefix."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.recipes.catalogue import REQUIRED, bridge_recipes, cell_text, columns, make_recipe
from paraplan.recipes.knobs import estimate_run, recipe_run
from paraplan.recipes.user import MEGATRON_RECOMPUTE_MODULES, column_rules, read_user_recipes

BASE = dict(zip(REQUIRED, ["x:bad", "llama3_8b", "h100", "8", "bf16", "4096", "32", "1", "1", "1"], strict=True))


def _csv(path: Path, rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")
    return str(path)


# (column, value, the allowed values the line must give)
BAD = [
    ("moe_token_dispatcher_type", "bogus", "expected one of empty, ?, alltoall, allgather, flex, got 'bogus'"),
    ("moe_flex_dispatcher_backend", "nccl", "expected one of empty, ?, None, deepep, hybridep"),
    ("precision", "fp9", "expected one of bf16, fp16, fp8, fp8_cs, fp8_mx, fp8_sc, fp8_ds, nvfp4, got 'fp9'"),
    ("tp", "2.5", "expected an integer >= 1, got '2.5'"),
    ("vp", "?", "expected an integer >= 1 or None or empty, got '?'"),
    ("etp", "-1", "expected an integer >= 1 or None or empty, got '-1'"),
    ("cp", "-2", "expected an integer >= 1, got '-2'"),
    ("dp", "3", "expected num_gpus / (TP x PP x CP) = 8 / (1 x 1 x 1), or empty, got '3'"),
    ("manual_gc_interval", "-5", "expected an integer >= 0, got '-5'"),
    ("optimizer_offload_fraction", "-0.5", "expected a number from 0 to 1, got '-0.5'"),
    ("optimizer_offload_fraction", "7", "expected a number from 0 to 1, got '7'"),
    ("moe_expert_capacity_factor", "0", "expected a number above 0 or None or empty or ?"),
    ("fp8_param_gather", "maybe", "expected True or False, got 'maybe'"),
    ("moe_permute_fusion", "1", "expected True or False or empty or ?, got '1'"),
    ("recompute_modules", "[core_atn]", "expected None or a list of core_attn, moe_act, layernorm"),
    ("offload_modules", "[everything]", "expected None or a list of attn_norm, qkv_linear"),
    ("cuda_graph_scope", "[bogus]", "expected None or a list of attn, mlp, moe, moe_router"),
    ("optimizer_state_dtypes", "main_grads=fp7;main_params=fp32;exp_avg=bf16;exp_avg_sq=bf16",
     "expected main_grads=X;main_params=X;exp_avg=X;exp_avg_sq=X with main_grads one of fp32, bf16"),
    ("optimizer_state_dtypes", "main_grads=fp32", "expected main_grads=X;main_params=X;exp_avg=X;exp_avg_sq=X"),
    ("other_env", "FOO", "expected empty or NAME=VALUE pairs separated by ;, got 'FOO'"),
    ("optimizer", "adamw", "expected one of adam, sgd, muon, dist_muon, lion, soap, adaptive_muon"),
    ("data_parallel_sharding_strategy", "all", "expected one of no_shard, optim, optim_grads, optim_grads_params"),
    ("first_last_layers_bf16", "True(start=1)", "expected False, True or True(start=N,end=M)"),
    ("cross_entropy_fusion_impl", "fast", "expected one of native, te"),
    ("wgrad_deferral_limit", "-2", "expected an integer >= -1"),
]


@pytest.mark.parametrize(("column", "value", "allowed"), BAD)
def test_a_bad_cell_is_refused_when_the_file_is_read(column: str, value: str, allowed: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path / "mine.csv", [{**BASE, column: value}])
    code = main(["recipes", "--recipes", path])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err == f"error: --recipes {path}: row 1 (x:bad): column {column}: {allowed}" + err.split(allowed, 1)[1]
    assert err.count("--recipes") == 1


def test_tp_pp_cp_must_divide_the_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path / "mine.csv", [{**BASE, "tp": "3"}])
    assert main(["recipes", "--recipes", path]) == 1
    assert (f"--recipes {path}: row 1 (x:bad): column tp: expected TP x PP x CP (3 x 1 x 1) to divide num_gpus 8, "
            "got 3") in capsys.readouterr().err


@pytest.mark.parametrize(("cell", "message"), [
    ("tp: -1", "column tp: expected an integer >= 1, got '-1'"),
    ("sequence_parallel: 'yes'", "column sequence_parallel: expected True or False, got 'yes'"),
    ("recompute_modules: [bogus]", "column recompute_modules: expected None or a list of"),
    ("optimizer_offload_fraction: .nan", "column optimizer_offload_fraction: expected a number from 0 to 1"),
    ("num_gpus: 99999999999999999999999", "column num_gpus: expected at most 1,099,511,627,776"),
])
def test_yaml_rows_are_checked_alike(cell: str, message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = {k: v for k, v in BASE.items() if k != cell.split(":")[0]}
    text = "- {" + ", ".join(f"{k}: '{v}'" if k in ("source", "model", "gpu", "precision") else f"{k}: {v}"
                             for k, v in base.items()) + ", " + cell + "}\n"
    path = tmp_path / "mine.yaml"
    path.write_text(text, encoding="utf-8")
    assert main(["recipes", "--recipes", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --recipes {path}: row 1 (x:bad): ") and message in err and err.count("\n") == 1


def test_every_nvidia_row_passes_the_same_checks_as_a_user_file(tmp_path: Path) -> None:
    """The rules are no stricter than NVIDIA's own table: its runnable rows, written as a user CSV, all read."""
    rows = [{c: cell_text(r.get(c)) if r.get(c) != "" else "" for c in columns()} | {"source": f"mine:{i}"}
            for i, r in enumerate(r for r in bridge_recipes() if r.runnable)]
    path = _csv(tmp_path / "all.csv", rows)
    read = read_user_recipes(path)
    assert len(read) == len(rows) > 200
    assert set(column_rules()) == set(columns()) - {"source", "model", "gpu"}  # every other column has a rule


def test_a_knob_error_at_estimate_time_has_one_prefix() -> None:
    """estimate_run words a knob error of a row once (it was '--recipes F: row 1 (x): --recipes F: row 1 (x): ...')."""
    fields = {**{k: (int(v) if v.isdigit() else v) for k, v in BASE.items()}, "cuda_graph_impl": "local",
              "cuda_graph_scope": ["bogus"]}
    r = make_recipe(fields, origin="mine.csv", row=1)  # not read through the file checks
    with pytest.raises(SpecError) as info:
        estimate_run(recipe_run(r))
    assert str(info.value).count("--recipes mine.csv: row 1") == 1 and "cuda_graph_scope" in str(info.value)


def test_the_recompute_modules_are_megatrons() -> None:
    """The allowed list is Megatron-Core's (transformer_config.py); paraplan's modelled ones are among them."""
    from paraplan.layout import RECOMPUTE_MODULES

    assert set(RECOMPUTE_MODULES) <= set(MEGATRON_RECOMPUTE_MODULES)


_VALUES = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
    st.integers(min_value=-10**30, max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["True", "False", "None", "", "?", "[a,b]", "[]", "[core_attn]", "t*3|tL", "1e400", "-0"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from([c for c in columns() if c != "source"]), _VALUES, min_size=1,
                               max_size=3))
def test_fuzzed_rows_read_or_fail_in_one_line_naming_the_row(changes: dict[str, str], tmp_path: Path) -> None:
    path = _csv(tmp_path / "fuzz.csv", [{**BASE, **changes}])
    try:
        (r,) = read_user_recipes(path)
    except SpecError as err:
        msg = str(err)
        assert msg.startswith(f"--recipes {path}: ") and "\n" not in msg and msg.count("--recipes") == 1
        return
    # a row that reads runs, or fails on one of Megatron's layout rules, as one line too
    try:
        est = estimate_run(recipe_run(r))
    except SpecError as err:
        assert "\n" not in str(err)
        return
    assert json.dumps(est.to_dict())
