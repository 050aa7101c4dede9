"""Hostile and careless input files and flags (issue 17): each is one line naming the field or the
limit, exit 1, in bounded time and memory; never a traceback, a hang or a wrong output."""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import PlannerError, SpecError
from paraplan.fileio import MAX_NESTING, MAX_YAML_BYTES, brief, load_json_text, load_yaml_text, read_input_text
from paraplan.serialize import dumps_json

EST = ["estimate", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64", "--tp", "2"]
MODEL = "hidden_size: 4096\nnum_attention_heads: 32\nvocab_size: 32000\n"
LONG = "/tmp/" + "a" * 300 + ".yaml"

# 1 KB: nine levels of nine aliases expand to 9^9 = 387 million list items
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *, max_s: float = 2.0,
                   max_mib: float | None = None) -> str:
    """Run the CLI in-process; assert exit 1 with exactly one line on stderr, in bounded time
    (and memory); return that line."""
    tracemalloc.start() if max_mib is not None else None
    t0 = time.perf_counter()
    try:
        code = main(argv)
    finally:
        elapsed = time.perf_counter() - t0
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20 if max_mib is not None else 0.0
        tracemalloc.stop() if max_mib is not None else None
    out, err = capsys.readouterr()
    assert code == 1, (code, out[:200], err[:200])
    assert err.count("\n") == 1 and err.startswith("error: "), err[:400]
    assert elapsed < max_s, f"took {elapsed:.2f} s"
    if max_mib is not None:
        assert peak_mib < max_mib, f"peak {peak_mib:.0f} MiB"
    assert len(err) < 1500, err[:300]  # bounded: the allowed-field list of a model is the longest part
    return err.strip()


def write(path: Path, data: str | bytes) -> str:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------- YAML
def test_alias_bomb_in_site_yaml_is_refused_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the value itself holds the nine levels: without a cap, the "expected a string" error repr()s 9^9 items
    levels = ["&a [x, x, x, x, x, x, x, x, x]"] + [f"&{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]"
                                                   for i in range(8)]
    site = write(tmp_path / "site.yaml", f"partition: [{', '.join(levels)}]\n")
    assert (tmp_path / "site.yaml").stat().st_size < 400
    err = one_line_error(["launch", *EST[1:11], "--site", site, "--out", str(tmp_path / "out")], capsys,
                         max_mib=64)
    assert "site" in err and "100,000 values once aliases are expanded" in err
    assert not (tmp_path / "out").exists()


def test_alias_bomb_in_gpu_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = write(tmp_path / "g.yaml", "base: h100-80gb\nnotes: &n [x]\n" + BOMB)
    err = one_line_error([*EST[:3], "-g", gpu, *EST[5:]], capsys, max_mib=64)
    assert err.startswith("error: gpu:") and "aliases" in err


def test_benign_aliases_and_merge_keys_still_load() -> None:
    doc = load_yaml_text("d: &d {x: 1, y: 2}\ne:\n  <<: *d\n  x: 3\nf: *d\n", "site")
    assert doc == {"d": {"x": 1, "y": 2}, "e": {"x": 3, "y": 2}, "f": {"x": 1, "y": 2}}


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: *a}\n"])
def test_self_referencing_alias(text: str) -> None:
    with pytest.raises(SpecError, match=r"alias \*a refers to itself"):
        load_yaml_text(text, "site", "s.yaml")


def test_duplicate_yaml_key_names_key_and_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write(tmp_path / "m.yaml", "num_layers: 2\n" + MODEL + "num_layers: 4\n")
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)
    assert "duplicate key 'num_layers' (first at line 1) at line 5" in err


def test_deep_yaml_and_json_nesting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = write(tmp_path / "deep.yaml", "[" * 100_000 + "]" * 100_000)
    err = one_line_error([*EST[:3], "-g", gpu, *EST[5:]], capsys)
    assert f"nested deeper than {MAX_NESTING} levels" in err
    model = write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)
    assert f"nested deeper than {MAX_NESTING} levels" in err
    with pytest.raises(SpecError, match="nested deeper"):
        load_json_text("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1), "plan")
    assert load_json_text("[" * MAX_NESTING + "]" * MAX_NESTING, "plan") is not None


def test_python_tags_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = write(tmp_path / "tag.yaml", "base: !!python/object/apply:os.system ['echo pwned']\n")
    err = one_line_error([*EST[:3], "-g", gpu, *EST[5:]], capsys)
    assert "could not determine a constructor" in err and "python/object/apply" in err
    err = one_line_error([*EST, "--gpu-set", "hbm_gib=!!python/name:os.system"], capsys)
    assert err.startswith("error: --gpu-set hbm_gib:")


@pytest.mark.parametrize("kind", ["gpu", "model", "site", "profile", "plan", "manifest", "script", "runs", "recipes"])
def test_non_utf8_files_are_one_line(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / f"latin.{'json' if kind in ('plan', 'manifest') else 'sh' if kind == 'script' else 'yaml'}"
    write(p, b"# caf\xe9\nbase: h100-80gb\n")
    argv = {"gpu": [*EST[:3], "-g", str(p), *EST[5:]], "model": ["estimate", "-m", str(p), *EST[3:11]],
            "site": ["launch", *EST[1:11], "--site", str(p), "--out", str(tmp_path / "o")],
            "profile": [*EST, "--profile", str(p)], "plan": ["launch", "--plan", str(p), "--out", str(tmp_path / "o")],
            "manifest": ["tune", "--manifest", str(p), "--log", str(p)], "script": ["check", str(p)],
            "runs": ["calibrate", "--runs", str(p), "-g", "h100-80gb", "--out", str(tmp_path / "p.yaml")],
            "recipes": ["recipes", "--recipes", str(p)]}[kind]
    err = one_line_error(argv, capsys)
    assert "is not UTF-8 text (byte 5)" in err


def test_a_fifo_swapped_in_after_the_check_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_input_text opens non-blocking and checks the open file (fileio.open_regular_file): a FIFO that replaces
    the file between the stat and the open is refused, not waited on."""
    import stat as stat_module
    import threading

    import paraplan.fileio as fileio

    fifo = tmp_path / "swapped.yaml"
    os.mkfifo(fifo)
    real_stat = os.stat

    def regular(path: object, *args: object, **kwargs: object) -> os.stat_result:  # what the check saw, before the swap
        st = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        return os.stat_result((stat_module.S_IFREG | 0o644, *st[1:]))

    monkeypatch.setattr(fileio.os, "stat", regular)
    outcome: list[str] = []

    def read() -> None:
        try:
            read_input_text(fifo, "model")
            outcome.append("read")
        except SpecError as err:
            outcome.append(str(err))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=10)
    assert outcome and "FIFO" in outcome[0], "read_input_text blocked on a FIFO"


def test_utf8_bom_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = write(tmp_path / "bom.yaml", "\ufeffbase: h100-80gb\nnetwork_gbit_per_s: 200\n".encode())
    assert main([*EST[:3], "-g", gpu, *EST[5:], "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["tp"] == 2


def test_size_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = write(tmp_path / "big.yaml", "notes: '" + "x" * MAX_YAML_BYTES + "'\n")
    err = one_line_error([*EST[:3], "-g", big, *EST[5:]], capsys)
    assert "is larger than 1 MiB (the input size limit)" in err
    small = write(tmp_path / "s.json", "[1, 2, 3]")
    with pytest.raises(SpecError, match="larger than"):
        read_input_text(small, "plan", max_bytes=4)


# ----------------------------------------------------------------------------- numbers in model files
@pytest.mark.parametrize(("line", "match"), [
    ("num_layers: 300000000", "num_layers must be at most 100,000, got 300000000"),
    (f"num_layers: {2**63}", "num_layers must be at most 100,000"),
    ("num_layers: " + "1" * 5000, r"an integer of 5000 digits \(limit 4300\)"),
    ("num_layers: 2\nffn_hidden_size: 1.0e+309", "ffn_hidden_size"),
    ("num_layers: 2\nnorm_epsilon: .inf", "norm_epsilon: Input should be a finite number"),
    ("num_layers: 2\nnum_experts: 8\nmoe_layer_freq: [[1]]", "moe_layer_freq: a list must hold only 0 and 1"),
    ("num_layers: 2\nnum_experts: 8\nmoe_layer_freq: '[1]*999999999'", "moe_layer_freq: .* more than 100,000"),
    ("num_layers: 2\nhidden_dropout: .nan", "hidden_dropout"),
])
def test_model_numbers_are_bounded(line: str, match: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = line + "\n" + MODEL
    model = write(tmp_path / "m.yaml", text)
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys, max_mib=64)
    assert re.search(match, err), err


def test_hidden_size_with_5000_digits_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write(tmp_path / "m.json", '{"num_layers": 2, "num_attention_heads": 32, "vocab_size": 32000, '
                  '"hidden_size": ' + "7" * 5000 + "}")
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)
    assert "an integer of more than 4300 digits" in err
    model = write(tmp_path / "m2.json", json.dumps({"num_layers": 2, "num_attention_heads": 32, "vocab_size": 32000,
                                                    "hidden_size": 2**63}))
    assert "hidden_size must be at most 1,048,576" in one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)


# ----------------------------------------------------------------------------- GPU files and --gpu-set
def test_gpu_base_cycles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "self.yaml", "base: self.yaml\n")
    err = one_line_error([*EST[:3], "-g", str(tmp_path / "self.yaml"), *EST[5:]], capsys)
    assert err.endswith("base: cycle self.yaml -> self.yaml")
    write(tmp_path / "a.yaml", f"base: {tmp_path / 'b.yaml'}\n")
    write(tmp_path / "b.yaml", f"base: {tmp_path / 'a.yaml'}\nhbm_gib: 10\n")
    err = one_line_error([*EST[:3], "-g", str(tmp_path / "a.yaml"), *EST[5:]], capsys)
    assert err.endswith("base: cycle a.yaml -> b.yaml -> a.yaml")


@pytest.mark.parametrize(("item", "match"), [
    ("efficiency=3", r"--gpu-set efficiency: unknown key \(allowed: hbm_gib"),
    ("efficiency.gemm=0.5", r"--gpu-set efficiency.gemm: unknown efficiency field \(allowed: gemm_max_frac"),
    ("hbm_gib=[1", "--gpu-set hbm_gib: is not valid YAML"),
    ("hbm_gib=[1]", "--gpu-set hbm_gib: expected a single value"),
    ("hbm=80", r"--gpu-set hbm: unknown key \(allowed: hbm_gib"),
    ("efficiency.gemm_max_frac=inf", "gpu.efficiency.gemm_max_frac"),
    ("efficiency.gemm_max_frac=1.5", r"gpu.efficiency.gemm_max_frac must be in \[0.001, 1\], got 1.5"),
    ("efficiency.dp_overlap_frac=-0.1", r"dp_overlap_frac must be in \[0, 1\]"),
    ("network_gbit_per_s=.nan", "gpu.network_gbit_per_s: expected a finite number > 0, got nan"),
    ("network_gbit_per_s=nan", "gpu.network_gbit_per_s: expected a finite number > 0"),
    ("hbm_gib=1e308", "gpu.hbm_gib: expected a finite number > 0"),
    ("gpus_per_node=" + str(2**63), r"gpu.gpus_per_node must be in \[1, 65536\]"),
])
def test_gpu_set_errors_name_the_key(item: str, match: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error([*EST, "-n", "16", "--gpu-set", item], capsys)
    assert re.search(match, err), err


def test_profile_with_inf_efficiency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = write(tmp_path / "p.yaml", "efficiency:\n  gemm_max_frac: .inf\n")
    assert "gemm_max_frac" in one_line_error([*EST, "--profile", prof], capsys)


# ----------------------------------------------------------------------------- CLI numbers and contradictions
@pytest.mark.parametrize(("extra", "match"), [
    (["--workspace-gib", "1e309"], r"--workspace-gib must be in \[0, 1024\] GiB, got inf"),
    (["--workspace-gib", "nan"], "--workspace-gib"),
    (["--fragmentation", "nan"], "--fragmentation"),
    (["--fsdp", "--no-distributed-optimizer"], "--fsdp and --no-distributed-optimizer contradict"),
    (["--recompute", "full", "--recompute-modules", "mlp"], "--recompute-modules and --recompute full contradict"),
    (["--recompute", "none", "--recompute-num-layers", "2"], "--recompute-num-layers and --recompute none"),
    (["-s", "9" * 5000], "--seq-len"),
    (["-s", str(2**40)], "seq_len must be at most 16,777,216"),
    (["--gpus-per-node", str(2**63)], r"gpus_per_node must be in \[1, 65536\]"),
])
def test_estimate_flags(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error([*EST, *extra], capsys)
    assert re.search(match, err), err


def test_plan_contradictions(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", *EST[1:11]]
    assert "--pp and --max-pp contradict" in one_line_error([*base, "--pp", "4", "--max-pp", "2"], capsys)
    err = one_line_error([*base, "--recompute", "none,full", "--recompute-modules", "mlp"], capsys)
    assert "--recompute-modules and --recompute none,full contradict" in err


def test_tune_seq_len_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write(tmp_path / "t.log", " iteration 1/ 10 | elapsed time per iteration (ms): 1000.0 |\n")
    err = one_line_error(["tune", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "0", "--gbs", "64",
                          "--log", log], capsys)
    assert err == "error: --seq-len must be a positive integer, got 0"


# ----------------------------------------------------------------------------- paths
def test_unreadable_paths_name_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o")
    cases = {
        "model: cannot read": ["estimate", "-m", LONG, *EST[3:11]],
        "gpu: cannot read": [*EST[:3], "-g", LONG, *EST[5:]],
        "plan: cannot read": ["launch", "--plan", LONG, "--out", out],
        "site: cannot read": ["launch", *EST[1:11], "--site", LONG, "--out", out],
        "script: cannot read": ["check", LONG],
    }
    for what, argv in cases.items():
        err = one_line_error(argv, capsys)
        assert what in err and err.endswith("file name too long"), err
        assert "a" * 100 not in err  # the name is shortened
    err = one_line_error(["report", "--plan", str(tmp_path), "-o", str(tmp_path / "r.html")], capsys)
    assert err.endswith("is a directory (give a file)")
    err = one_line_error(["launch", "--plan", str(tmp_path), "--out", out], capsys)
    assert err.endswith("is a directory (give a file)")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_does_not_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    err = one_line_error([*EST[:3], "-g", str(fifo), *EST[5:]], capsys)
    assert err.endswith("not a regular file")


# ----------------------------------------------------------------------------- plan.json / manifest.json
@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", *EST[1:11], "--top", "2", "--save", str(path)]) == 0
    doc: dict[str, object] = json.loads(path.read_text())
    return doc


def _mutated(doc: dict[str, object], path: str, value: object) -> dict[str, object]:
    out = json.loads(json.dumps(doc))
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize(("field", "value", "match"), [
    ("plan.candidates.0.config.tp", "x", r"plan.json: plan.candidates\[0\].config.tp: Input should be a valid integer"),
    ("inputs.num_gpus", "8x", "plan.json: inputs.num_gpus: expected an integer, got '8x'"),
    ("inputs", [1], r"plan.json: inputs: expected an object, got \[1\]"),
    ("plan.candidates", {"a": 1}, "plan.json: plan.candidates: expected a list"),
    ("plan.candidates.0", 3, r"plan.json: plan.candidates\[0\]: expected an object, got 3"),
    ("inputs.gpu.efficiency", [3], "plan.json: inputs.gpu.efficiency: expected an object"),
    ("inputs.training.seq_len", [1], "plan.json: training.seq_len: Input should be a valid integer"),
    ("inputs.model.num_layers", 10**6, "num_layers must be at most 100,000"),
])
def test_plan_json_types(plan_doc: dict[str, object], field: str, value: object, match: str, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "plan.json", json.dumps(_mutated(plan_doc, field, value)))
    err = one_line_error(["launch", "--plan", path, "--out", str(tmp_path / "o")], capsys)
    assert re.search(match, err), err


@pytest.mark.parametrize(("text", "match"), [
    ('{"schema_version": 1, "inputs": NaN}', "NaN is not a JSON number"),
    ('{"schema_version": 1, "inputs": -Infinity}', "-Infinity is not a JSON number"),
    ('{"schema_version": 1, "inputs": 1e309}', "'1e309' is not a JSON number within range"),
    ('{"schema_version": 1, "inputs": {}, "inputs": {}}', "duplicate key 'inputs'"),
])
def test_plan_json_non_finite(text: str, match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "plan.json", text)
    assert match in one_line_error(["report", "--plan", path, "-o", str(tmp_path / "r.html")], capsys)


def test_manifest_wrong_types(plan_doc: dict[str, object], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["launch", *EST[1:11], "--out", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads((out / "manifest.json").read_text())
    log = write(tmp_path / "t.log", " iteration 1/ 10 | elapsed time per iteration (ms): 1000.0 |\n")
    for field, value, match in (("inputs.training", "x", "manifest: manifest.json: inputs.training: expected an "
                                 "object"), ("inputs.model", None, "inputs.model: expected an object")):
        write(out / "manifest.json", json.dumps(_mutated(doc, field, value)))
        err = one_line_error(["tune", "--manifest", str(out / "manifest.json"), "--log", log], capsys)
        assert match in err, err


# ----------------------------------------------------------------------------- JSON output
def test_json_output_refuses_non_finite_values() -> None:
    assert dumps_json({"a": [1, 2.5]}) == '{\n "a": [\n  1,\n  2.5\n ]\n}'
    with pytest.raises(PlannerError, match=r"internal error: time\.step_s\[1\] is not a finite number"):
        dumps_json({"time": {"step_s": [1.0, float("nan")]}})


def test_estimate_json_is_standard_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EST, "-f", "json"]) == 0

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard {name} in JSON output")

    json.loads(capsys.readouterr().out, parse_constant=refuse)


# ----------------------------------------------------------------------------- CSV
def test_runs_csv_with_bom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = write(tmp_path / "runs.csv", "\ufeffmodel,gpu,num_gpus,seq_len,gbs,tp,pp,mbs,step_time_s\n"
                 "llama3-8b,h100-80gb,8,4096,64,1,1,1,5.0\n".encode())
    assert main(["calibrate", "--runs", runs, "-g", "h100-80gb", "--out", str(tmp_path / "p.yaml"),
                 "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(tmp_path / "p.yaml")


def test_runs_csv_oversized_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = write(tmp_path / "runs.csv", "model,num_gpus,tp,pp,mbs,gbs,seq_len,step_time_s\n"
                 "llama3-8b,8,1,1,1,64,4096,\"" + "9" * 200_000 + "\"\n")
    err = one_line_error(["calibrate", "--runs", runs, "-g", "h100-80gb", "--out", str(tmp_path / "p.yaml")], capsys)
    assert "runs.csv line" in err and "not a valid CSV row" in err


# ----------------------------------------------------------------------------- scripts for check
@pytest.mark.parametrize("body", [
    "A=x\n" + 'A="$A $A"\n' * 40,                                  # a scalar that doubles itself
    "A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40,                  # an array that doubles itself
])
def test_self_doubling_script(body: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path / "bomb.sh", body + "torchrun pretrain_gpt.py --num-layers 2 $A\n")
    assert (tmp_path / "bomb.sh").stat().st_size < 1200
    err = one_line_error(["check", script], capsys, max_mib=200)
    assert err.startswith("error: script: ") and "(the limit" in err


def test_brief_is_bounded() -> None:
    huge = [list(range(1000))] * 1000
    assert len(brief(huge)) <= 80 and len(brief("x" * 10**6)) <= 80


def test_long_unknown_key_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write(tmp_path / "m.json", json.dumps({"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
                                                   "vocab_size": 32000, "k" * 100_000: 1}))
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)
    assert "kkkk...kkkk" in err and "k" * 100 not in err and "kkkk: unknown field (allowed: " in err


@pytest.mark.parametrize(("flag", "match"), [
    ("--num-layers " + "9" * 5000, "--num-layers '9999"),
    (f"--hidden-size {2**63}", "hidden_size must be at most 1,048,576"),
])
def test_script_numbers(flag: str, match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path / "run.sh", "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 1024 "
                   f"--num-attention-heads 8 --seq-length 2048 --micro-batch-size 1 --global-batch-size 8 {flag}\n")
    err = one_line_error(["check", script], capsys)
    assert match in err and len(err) < 300, err[:300]


def test_model_size_is_bounded_as_a_product(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # every field within its own bound, the product of them far beyond any model
    fields = {"num_layers": 100_000, "hidden_size": 2**20, "num_attention_heads": 8, "vocab_size": 2**24,
              "ffn_hidden_size": 2**24}
    model = write(tmp_path / "m.json", json.dumps(fields))
    err = one_line_error(["estimate", "-m", model, *EST[3:11]], capsys)
    assert "model too large: layers x hidden_size x widest matrix (100000 x 1048576 x 16777216)" in err
    err = one_line_error([*EST[:7], "-s", str(2**24), "--gbs", str(2**24)], capsys)
    assert "seq_len x global_batch_size = 2.81e+14 tokens per step is over 1.1e+12 (the limit)" in err


# ----------------------------------------------------------------------------- issue 17 review
LAUNCH = ["launch", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"]
BUDGET = ["budget", "-m", "llama3-8b", "--tokens", "1T", "--gpu", "h100-80gb", "-n", "8"]


@pytest.mark.parametrize("slot", ["model", "gpu", "profile", "launch-site", "budget-site", "gpu-base"])
def test_a_control_byte_in_yaml_is_one_line(slot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "ctl.yaml", "name: a\x01\n")
    argv = {"model": [*EST[:1], "-m", bad, *EST[3:]], "gpu": [*EST[:3], "-g", bad, *EST[5:]],
            "profile": [*EST, "--profile", bad], "launch-site": [*LAUNCH, "--site", bad, "-o", str(tmp_path / "o")],
            "budget-site": [*BUDGET, "--site", bad],
            "gpu-base": [*EST[:3], "-g", write(tmp_path / "g.yaml", f"base: {bad}\n"), *EST[5:]]}[slot]
    err = one_line_error(argv, capsys)
    assert "ctl.yaml" in err and "#x0001" in err and "character 8" in err, err


def test_load_yaml_text_control_byte() -> None:
    with pytest.raises(SpecError, match=r"^site: 'x.yaml' is not valid YAML: unacceptable character #x0007"):
        load_yaml_text("a: 1\n\x07", "site", "x.yaml")


@pytest.mark.parametrize(("cmd", "extra", "match"), [
    ("estimate", ["--vp", "400000000"], r"--vp: 400,000,000 is out of range; allowed 1 to 32 \(num_layers of"),
    ("estimate", ["--pp", "2", "--vp", "999999999999"], r"--vp: 999,999,999,999 is out of range; allowed 1 to 32"),
    ("estimate", ["--pp", "400000000"], r"--pp: 400,000,000 is out of range; allowed 1 to 32"),
    ("estimate", ["--pp", "2", "--decoder-first-pipeline-num-layers", "10000000000"],
     r"--decoder-first-pipeline-num-layers: 10,000,000,000 is out of range; allowed 1 to 32"),
    ("launch", ["--vp", "400000000"], r"--vp: 400,000,000 is out of range; allowed 1 to 32"),
])
def test_layout_sizes_are_bounded(cmd: str, extra: list[str], match: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = [*EST, "--tp", "1"] if cmd == "estimate" else [*LAUNCH, "-o", str(tmp_path / "o")]
    err = one_line_error([*base, *extra], capsys, max_mib=200)
    assert re.search(match, err), err
    assert not (tmp_path / "o").exists()


def test_parallel_layout_bounds_stage_counts() -> None:
    from paraplan.layout import MAX_PIPELINE_STAGES, ParallelLayout

    with pytest.raises(SpecError, match=r"^--vp: 1,000,000,000 is out of range; allowed 1 to 131,072"):
        ParallelLayout(vp=10**9)
    with pytest.raises(SpecError, match=r"^--pp x --vp: .* virtual pipeline stages"):
        ParallelLayout(pp=2**10, vp=2**10)
    with pytest.raises(SpecError, match="--pipeline-model-parallel-layout"):
        ParallelLayout(pipeline_layout=(1,) * (MAX_PIPELINE_STAGES + 1))
    assert ParallelLayout(pp=8, vp=4).pp == 8


def test_user_recipes_use_the_hardened_yaml_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dup = write(tmp_path / "dup.yaml", "- alias: a\n  alias: b\n")
    assert "duplicate key 'alias'" in one_line_error(["recipes", "--recipes", dup], capsys)
    bomb = write(tmp_path / "bomb.yaml", BOMB)
    assert "bomb.yaml" in one_line_error(["recipes", "--recipes", bomb], capsys, max_mib=100)
    ctl = write(tmp_path / "ctl.yaml", "- alias: a\x02\n")
    assert "#x0002" in one_line_error(["recipes", "--recipes", ctl], capsys)


@pytest.mark.parametrize(("item", "match"), [
    ("efficiency.gemm_max_frac=1e-320", r"gpu.efficiency.gemm_max_frac must be in \[0.001, 1\]"),
    ("efficiency.attention_frac=0.0001", r"gpu.efficiency.attention_frac must be in \[0.001, 1\]"),
    ("efficiency.collective_latency_s=1e300", r"gpu.efficiency.collective_latency_s must be in \[0, 1\]"),
    ("efficiency.step_overhead_s=1e9", r"gpu.efficiency.step_overhead_s must be in \[0, 3600\]"),
    ("efficiency.fp8_gemm_speedup=1e-300", r"gpu.efficiency.fp8_gemm_speedup must be in \[0.1, 10\]"),
    ("bf16_tflops=1e-12", r"gpu.peak_bf16_flops_per_s must be in \[1000, 1e\+18\] FLOP/s"),
    ("hbm_tbyte_per_s=1e9", r"gpu.hbm_bytes_per_s must be in \[1000, 1e\+18\] bytes/s"),
    ("network_gbit_per_s=1e-300", r"gpu.network_bytes_per_s must be in \[1000, 1e\+18\] bytes/s"),
])
def test_gpu_fields_have_physical_bounds(item: str, match: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error([*EST, "--gpu-set", item], capsys)
    assert re.search(match, err), err


def test_gpu_bounds_hold_for_every_preset() -> None:
    from paraplan.specs.load import gpu_preset_names, load_gpu

    assert all(load_gpu(name).name == name for name in gpu_preset_names())  # presets stay inside the bounds


def test_the_smallest_efficiency_gives_finite_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EST, "--gpu-set", "efficiency.gemm_max_frac=0.001", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 0 < doc["time"]["step_s"] < 1e9


@pytest.mark.parametrize(("extra", "match"), [
    (["--price-per-gpu-hour", "h100-80gb=1e308"], r"--price-per-gpu-hour: 1e\+308 USD per GPU-hour is out of "
                                                  r"range; allowed up to 1e\+06"),
    (["--tokens", "1" + "0" * 53], r"--tokens: 1e\+53 tokens is out of range; allowed up to 1e\+18"),
])
def test_budget_inputs_are_bounded(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error([*BUDGET, *extra], capsys)
    assert re.search(match, err), err


@pytest.mark.parametrize("argv", [["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64",
                                   "--save", ""], [*BUDGET, "--html", ""]])
def test_an_empty_output_name_is_refused(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line_error(argv, capsys)
    assert "an empty file name" in err and ("--save" in err or "--html" in err), err
    assert list(tmp_path.iterdir()) == []


def test_layout_short_label_writes_the_recompute_word() -> None:
    from paraplan.layout import ParallelLayout

    assert ParallelLayout().short().split()[-1] == "selective"  # was "sele" (recompute[:4])
    assert ParallelLayout(recompute="full").short().split()[-1] == "full"
