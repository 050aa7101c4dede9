"""The CLI in-process: stable JSON keys, one-line errors with exit 1, exit 3 when nothing fits."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.cli import main

BASE = ["estimate", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--tp", "4", "--pp", "4",
        "--cp", "2", "--seq-len", "8192", "--gbs", "512", "--mbs", "1"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_has_the_stable_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert set(d["config"]) >= {"tp", "pp", "vp", "cp", "ep", "etp", "dp", "mbs", "gbs", "num_microbatches",
                                "seq_len", "recompute", "sequence_parallel", "distributed_optimizer", "precision"}
    assert set(d["memory"]) >= {"peak_bytes", "capacity_bytes", "fits", "per_stage"}
    assert len(d["memory"]["per_stage"]) == 4
    assert set(d["memory"]["per_stage"][0]) >= {"stage", "weights_bytes", "grads_bytes", "optimizer_bytes",
                                                "activations_bytes", "other_bytes", "total_bytes"}
    assert set(d["params"]) >= {"total", "active_per_token", "per_stage_per_rank"}
    assert set(d["time"]) >= {"step_s", "compute_s", "bubble_s", "optimizer_s", "exposed_comm_s"}
    assert set(d["time"]["exposed_comm_s"]) == {"tp", "cp", "ep", "pp", "dp"}
    assert set(d["throughput"]) >= {"tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "mfu_peak"}
    assert d["config"]["dp"] == 2 and d["config"]["num_microbatches"] == 256
    groups = d["placement"]["groups"]
    # TP 4 and TP x CP = 8 stay in the 8-GPU NVLink domain; DP x CP (span 16) and PP cross nodes
    assert groups["tp"]["in_nvlink_domain"] and groups["cp"]["in_nvlink_domain"]
    assert not groups["dp_cp"]["in_nvlink_domain"] and not groups["pp"]["in_nvlink_domain"]
    assert groups["dp_cp"]["size"] == d["config"]["dp"] * d["config"]["cp"]
    assert d["params"]["total"] == 70_553_706_496


def test_estimate_table_renders(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(BASE, capsys)
    assert code == 0 and "memory per GPU by pipeline stage" in out and "tokens/s/GPU" in out


@pytest.mark.parametrize(("change", "pattern"), [
    (["--num-gpus", "72"], r"world size \(72\) is not divisible"),
    (["--num-gpus", "60"], r"num_gpus \(60\) must be a multiple of gpus_per_node \(8\)"),
    (["--tp", "3", "--num-gpus", "48"],
     r"num_attention_heads \(64\) must be a multiple of tensor_model_parallel_size \(3\)"),
    (["--tp", "16", "--num-gpus", "128"], r"NVLink domain"),
    (["--gbs", "511"], r"global batch size \(511\) is not divisible by micro batch size"),
    (["--seq-len", "8190"], r"seq-length should be a multiple of 2 \* context-parallel-size"),
    (["--ep", "2"], r"num_experts must be non None"),
    (["--tp", "-4"], r"--tp must be a positive integer"),
    (["--tp", "four"], r"tp"),
    (["--model", "llama9-1t"], r"unknown model preset 'llama9-1t' \(known: .*llama3-70b"),
    (["--gpu", "v100"], r"unknown gpu 'v100' \(known: a100-40gb"),
    (["--precision", "fp8", "--gpu", "a100-80gb"], r"fp8 is not supported on a100-80gb"),
    (["--pp", "3", "--num-gpus", "48", "--pipeline-split", "even"],
     r"Number of layers should be divisible by the pipeline-model-parallel size"),
    (["--vp", "3", "--pipeline-split", "even"], r"number of layers per pipeline stage must be divisible"),
])
def test_bad_input_is_one_line_and_exit_1(change: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = list(BASE)
    for i in range(0, len(change), 2):
        if change[i] in args:
            args[args.index(change[i]) + 1] = change[i + 1]
        else:
            args += change[i:i + 2]
    code, out, err = run(args, capsys)
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(pattern, err), err
    assert "Traceback" not in err


def test_malformed_config_json_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                               "num_hidden_layers": -3, "vocab_size": 32000, "intermediate_size": 11008}))
    code, _, err = run(["estimate", "--model", str(bad), "--gpu", "h100-80gb", "--num-gpus", "8",
                        "--seq-len", "2048", "--gbs", "8"], capsys)
    assert code == 1 and "num_hidden_layers" in err


def test_megatron_args_yaml_takes_megatron_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "gpt.yaml"
    f.write_text("num_layers: 24\nhidden_size: 2048\nnum_attention_heads: 16\nvocab_size: 50257\n"
                 "max_position_embeddings: 2048\n")
    code, out, _ = run(["estimate", "--model", str(f), "--gpu", "a100-80gb", "--num-gpus", "8", "--tp", "2",
                        "--seq-len", "2048", "--gbs", "32", "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    # tied embeddings, LayerNorm, biases, learned positions (Megatron defaults): 24 * 12h^2-ish + embeddings
    assert 1.2e9 < d["params"]["total"] < 1.4e9


def test_plan_json_lists_candidates_and_rejections(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096",
                        "--gbs", "128", "--top", "3", "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert len(d["candidates"]) == 3
    # ranked by step-time tier, then the in-tier rules (paraplan.ranking): faster tiers first, and where step time
    # decided, the faster first
    cands = d["candidates"]
    assert [c["tier"] for c in cands] == sorted(c["tier"] for c in cands)
    for a, b in itertools.pairwise(cands):
        if a["decided_by"] in ("tier", "step_time"):
            assert a["time"]["step_s"] <= b["time"]["step_s"]
    assert d["rejections"] and all(isinstance(v, int) for v in d["rejections"].values())
    assert all(c["memory"]["fits"] for c in d["candidates"])


def test_plan_exit_3_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "--model", "llama3.1-405b", "--gpu", "a100-40gb", "--num-gpus", "8",
                        "--seq-len", "8192", "--gbs", "64"], capsys)
    assert code == 3
    assert "OOM" in err and "what would make it fit" in err


def test_plan_csv_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
                        "--gbs", "64", "--format", "csv", "--top", "2"], capsys)
    assert code == 0 and out.splitlines()[0].startswith("rank,tp,pp")
    assert len(out.strip().splitlines()) == 3
    code, out, _ = run(["explain", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
                        "--seq-len", "4096", "--gbs", "64", "--format", "json"], capsys)
    doc = json.loads(out)
    codes = {f["code"] for f in doc["explanation"]}
    tp_code = "TP_INSIDE_NODE" if doc["candidates"][0]["config"]["tp"] > 1 else "TP_NOT_NEEDED"
    assert {"BINDING_MEMORY", "DOMINANT_TIME", tp_code, "DP_TAKES_REST", "RUNNER_UP_GAP"} <= codes


def test_estimate_csv_cells_are_flat(capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    code, out, _ = run([*BASE, "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4 and "other_parts" not in rows[0]  # was a Python dict repr in one cell
    parts = {k: float(v) for k, v in rows[0].items() if k.startswith("other_parts.")}
    assert "other_parts.logits_bytes" in parts and "other_parts.workspace_bytes" in parts
    assert all("{" not in v for row in rows for v in row.values())
    code, out, _ = run([*BASE, "--format", "json"], capsys)
    stage = json.loads(out)["memory"]["per_stage"][0]
    assert parts == pytest.approx({f"other_parts.{k}": v for k, v in stage["other_parts"].items()})


def test_plan_save_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.serialize import load_plan

    path = tmp_path / "plan.json"
    code, _, _ = run(["plan", "--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--num-gpus", "16",
                      "--seq-len", "4096", "--gbs", "64", "--save", str(path), "--format", "json"], capsys)
    assert code == 0
    loaded = load_plan(path)
    assert loaded.model.num_experts == 128 and loaded.cluster.num_gpus == 16 and len(loaded.layouts) == 5


def test_models_gpus_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["gpus", "--format", "json"], capsys)
    names = {g["name"] for g in json.loads(out)}
    assert names == {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200", "b300", "gb200", "gb300",
                     "mi300x"}
    code, out, _ = run(["models", "--format", "json"], capsys)
    assert {"llama2-7b", "deepseek-v3", "nemotron4-340b"} <= {m["name"] for m in json.loads(out)}
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("paraplan ")


def test_readme_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every `.venv/bin/paraplan ...` line of the README, in order, in a scratch folder."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    commands = re.findall(r"\.venv/bin/paraplan ([^\n`&]+)", readme)
    assert len(commands) >= 9, "README lost its example commands"
    monkeypatch.chdir(tmp_path)
    for cmd in commands:
        args = [str(root / a) if a.startswith("tests/") else a for a in shlex.split(cmd)]
        code, _out, err = run(args, capsys)
        assert code == 0, (cmd, err)
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert (tmp_path / "launch" / "llama3-70b" / "manifest.json").exists()


LLAMA3_8B_ARGS = (
    "torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu "
    "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
    "--disable-bias-linear --vocab-size 128256 --seq-length 8192 --max-position-embeddings 8192 "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
    "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 128 --bf16")


def test_estimate_reads_megatron_args(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["estimate", "--gpu", "h100-80gb", "--megatron-args", LLAMA3_8B_ARGS, "--format", "json"],
                       capsys)
    assert code == 0
    d = json.loads(out)
    assert d["params"]["total"] == 8_030_261_248  # Llama-3-8B, parsed back from Megatron flags
    assert (d["config"]["tp"], d["config"]["pp"], d["config"]["dp"], d["config"]["gbs"]) == (2, 2, 4, 128)


def test_uneven_layers_get_megatrons_uneven_split_flags_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    args = list(BASE)
    args[args.index("--pp") + 1] = "3"
    args[args.index("--num-gpus") + 1] = "48"
    code, out, _ = run([*args, "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    note = next(n for n in d["notes"] if n.startswith("uneven pipeline split"))
    first, last = (int(x) for x in re.findall(r"pipeline-num-layers (\d+)", note))
    assert (d["config"]["first_stage_layers"], d["config"]["last_stage_layers"]) == (first, last)
    middle = 80 - first - last  # Llama-3-70B: 80 layers; Megatron's rule: the middle stage gets the rest
    assert middle > 0 and max(first, last, middle) - min(first, last, middle) <= 2


def test_estimate_megatron_args_rule_is_megatrons_message(capsys: pytest.CaptureFixture[str]) -> None:
    bad = LLAMA3_8B_ARGS.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 4") \
        .replace("--num-layers 32", "--num-layers 30")
    code, _, err = run(["estimate", "--gpu", "h100-80gb", "--megatron-args", bad], capsys)
    assert code == 1 and "Number of layers should be divisible by the pipeline-model-parallel size" in err


def test_estimate_without_model_names_the_missing_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["estimate", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "8"],
                       capsys)
    assert code == 1 and "--model is required" in err


def test_workspace_and_fragmentation_allowances_are_configurable(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--format", "json"]
    peaks = []
    for extra in ([], ["--workspace-gib", "1.125"], ["--fragmentation", "0"]):
        code, out, _ = run([*base, *extra], capsys)
        doc = json.loads(out)
        assert code == (0 if doc["memory"]["fits"] else 4)  # 1.125 GiB of workspace takes it past usable memory
        peaks.append(doc["memory"]["per_stage"][0]["other_bytes"])
    assert peaks[1] == pytest.approx(peaks[0] + 2**30)  # default workspace 0.125 GiB -> 1.125 GiB
    assert peaks[2] < peaks[0]


def test_explain_says_when_the_runner_up_ties(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                        "--seq-len", "4096", "--gbs", "128", "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    gap = next(f for f in d["explanation"] if f["code"] == "RUNNER_UP_GAP")
    steps = [c["time"]["step_s"] for c in d["candidates"][:2]]
    if steps[0] == pytest.approx(steps[1], rel=1e-9):
        assert "ties on step time" in gap["text"] and "simpler layout" in gap["text"]
    else:
        assert "s/step" in gap["text"]


def test_attention_backend_unfused_costs_time_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--mbs", "1", "--tp", "2", "--recompute", "none", "--format", "json"]
    out = {}
    for backend in ("flash", "unfused"):
        code, text, _ = run([*base, "--attention-backend", backend], capsys)
        assert code == 0
        out[backend] = json.loads(text)
    assert out["unfused"]["time"]["step_s"] > out["flash"]["time"]["step_s"]
    assert out["unfused"]["memory"]["peak_bytes"] > out["flash"]["memory"]["peak_bytes"]
    code, _, err = run([*base, "--attention-backend", "sdpa"], capsys)
    assert code != 0 and "attention-backend" in err


def test_explain_names_launch_bound_layers(capsys: pytest.CaptureFixture[str]) -> None:
    # GPT-2 small on 64 A100s with GBS 64: one sample per GPU, mbs 1, a layer is ~0.4 ms of GPU
    # work, below the A100 preset's host issue time per layer; Llama-3-70B layers are not.
    code, out, _ = run(["explain", "--model", "gpt2", "--gpu", "a100-80gb", "--num-gpus", "64",
                        "--seq-len", "1024", "--gbs", "64", "--format", "json"], capsys)
    assert code == 0
    found = [f for f in json.loads(out)["explanation"] if f["code"] == "LAUNCH_BOUND"]
    assert len(found) == 1 and found[0]["numbers"]["gpu_s"] < found[0]["numbers"]["issue_s"]
    code, out, _ = run(["explain", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64",
                        "--seq-len", "8192", "--gbs", "512", "--format", "json"], capsys)
    assert code == 0
    assert "LAUNCH_BOUND" not in {f["code"] for f in json.loads(out)["explanation"]}


def test_explain_gives_cp_its_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    # Llama-3.1-405B at 4096 tokens on 1024 H100s with TP 4 and the distributed optimizer: the winner uses CP 2
    # below the 8K rule of thumb, so the finding must say the numbers overrule it and name the best CP = 1 layout
    # (without a memory margin: the default margin rules out the CP 2 layouts, and the finding with them; over the
    # whole space an FSDP layout in the same step-time tier has more free memory and ranks first).
    code, out, _ = run(["explain", "--model", "llama3.1-405b", "--gpu", "h100-80gb", "--num-gpus", "1024",
                        "--seq-len", "4096", "--gbs", "512", "--format", "json", "--headroom", "0", "--tp", "4",
                        "--dp-variant", "distopt"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["candidates"][0]["config"]["cp"] > 1
    found = {f["code"]: f for f in doc["explanation"]}
    f = found["CP_SHORT_SEQUENCE"]
    assert "overrule" in f["text"] and f["numbers"]["cp1_layout"].startswith("tp")
    assert f["numbers"]["gain_frac"] >= 0.0  # the winner is at least as fast as any CP = 1 layout
    # Llama-3-70B at 32K tokens on 64 H100s: CP for a long sequence, with the CP = 1 comparison.
    code, out, _ = run(["explain", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64",
                        "--seq-len", "32768", "--gbs", "64", "--format", "json"], capsys)
    found = {f["code"]: f for f in json.loads(out)["explanation"]}
    assert "CP_SHORT_SEQUENCE" not in found
    assert found["CP_LONG_SEQUENCE"]["numbers"]["gain_frac"] >= 0.0


def test_output_paths_that_cannot_be_files_fail_in_one_line_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_args = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "64"]
    a_file = tmp_path / "a_file"
    a_file.write_text("x", encoding="utf-8")
    for args, option in ((["plan", *plan_args, "--save", str(tmp_path)], "--save"),
                         (["report", *plan_args, "-o", str(tmp_path)], "--output"),
                         (["plan", *plan_args, "--save", str(a_file / "p.json")], "--save")):
        code, out, err = run(args, capsys)
        assert code == 1 and out == "", args  # no ranking table printed before the error
        assert err.strip().count("\n") == 0 and option in err and "Traceback" not in err
    code, _, err = run(["launch", *plan_args, "--tp", "8", "--out", str(a_file / "dir")], capsys)
    assert code == 1 and "a_file is not a directory" in err and err.strip().count("\n") == 0


def test_non_numeric_gpu_field_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--tp", "8",
                        "--seq-len", "4096", "--gbs", "64", "--gpu-set", "hbm_gib=abc"], capsys)
    assert code == 1 and err.strip() == "error: gpu.hbm_gib: expected a number, got 'abc'"


@pytest.mark.parametrize(("extra", "message"), [
    (["--recompute", "full", "--recompute-num-layers", "50"],
     "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: 20"),
    (["--no-sequence-parallel", "--tp-comm-overlap"],
     "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"),
    (["--recompute", "selective", "--recompute-num-layers", "2"], "recompute_num_layers must be None"),
    (["--decoder-first-pipeline-num-layers", "0"], "num_layers_in_first_pipeline_stage must be larger than 0"),
])
def test_estimate_refuses_what_megatron_and_launch_refuse(extra: list[str], message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192",
            "--gbs", "512", "--tp", "4", "--pp", "4", *extra]
    code, out, err = run(args, capsys)
    assert code == 1 and out == "" and message in err and err.strip().count("\n") == 0


def test_megatron_args_with_model_or_layout_flags_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
            "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
            "--tensor-model-parallel-size 2 --foo-bar 3")
    code, _, err = run(["estimate", "--gpu", "h100-80gb", "--num-gpus", "8", "--model", "llama3-70b", "--tp", "4",
                        "--megatron-args", args], capsys)
    assert code == 1 and "drop --model, --tp" in err
    code, out, _ = run(["estimate", "--gpu", "h100-80gb", "--num-gpus", "8", "--megatron-args", args,
                        "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["config"]["tp"] == 2 and any("--foo-bar" in n for n in doc["notes"])


def test_explain_texts_match_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen3-235B on 256 H100s with Megatron-FSDP: the winner has TP 1, PP 1 and FSDP; explain must not credit TP
    # (by default the distributed optimizer's tp1 pp8 vp8 wins its (about 12%) tier over it: rule 2)
    code, out, _ = run(["explain", "--model", "qwen3-235b-a22b", "--gpu", "h100-80gb", "--num-gpus", "256",
                        "--seq-len", "4096", "--gbs", "1024", "--dp-variant", "fsdp", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    lay = doc["candidates"][0]["config"]
    found = {f["code"]: f["text"] for f in doc["explanation"]}
    assert lay["tp"] == 1 and lay["pp"] == 1 and lay["fsdp"]
    assert "TP_INSIDE_NODE" not in found and "no per-layer TP traffic" in found["TP_NOT_NEEDED"]
    assert "TP alone" not in found["PP_NOT_NEEDED"] and "Megatron-FSDP" in found["PP_NOT_NEEDED"]


def test_plan_and_estimate_describe_an_fsdp_layout_alike(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "8192", "--gbs", "128"]
    code, out, _ = run(["plan", *base, "--format", "json", "--top", "20"], capsys)
    assert code == 0
    fsdp = next(c for c in json.loads(out)["candidates"] if c["config"]["fsdp"])
    cfg = fsdp["config"]
    code, out, _ = run(["estimate", *base, "--tp", str(cfg["tp"]), "--pp", str(cfg["pp"]), "--mbs", str(cfg["mbs"]),
                        "--recompute", cfg["recompute"], "--fsdp", "--format", "json"], capsys)
    assert code == 0
    est = json.loads(out)
    assert est["config"]["distributed_optimizer"] == cfg["distributed_optimizer"]
    assert est["memory"]["peak_bytes"] == pytest.approx(fsdp["memory"]["peak_bytes"])


def test_plan_with_search_flags_that_divide_nothing_is_a_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "8192",
                        "--gbs", "128", "--tp", "3"], capsys)
    assert code == 1 and "--tp 3 leaves no TP x PP x CP that divides the 8 GPUs" in err


def test_malformed_yaml_files_are_one_line_with_the_location(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad_model = tmp_path / "bad.yaml"
    bad_model.write_text("num_layers: [1, 2\nhidden_size: 3\n", encoding="utf-8")
    bad_gpu = tmp_path / "gpu.yaml"
    bad_gpu.write_text("base: h100-80gb\nhbm_gib: [1\n", encoding="utf-8")
    for model, gpu, what in ((str(bad_model), "h100-80gb", "model"), ("llama3-8b", str(bad_gpu), "gpu")):
        code, _, err = run(["estimate", "--model", model, "--gpu", gpu, "--num-gpus", "8", "--seq-len", "4096",
                            "--gbs", "64"], capsys)
        assert code == 1 and err.startswith(f"error: {what}: ") and "at line " in err
        assert err.strip().count("\n") == 0


def test_other_memory_has_its_parts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--format", "json"], capsys)
    assert code == 0
    for stage in json.loads(out)["memory"]["per_stage"]:
        parts = stage["other_parts"]
        assert set(parts) == {"logits_bytes", "fp8_weight_cache_bytes", "fsdp_buffers_bytes", "workspace_bytes",
                              "fragmentation_bytes", "cuda_graph_bytes", "deferred_wgrad_bytes"}
        assert parts["cuda_graph_bytes"] == 0.0  # no --cuda-graph-impl
        assert parts["deferred_wgrad_bytes"] == 0.0  # no --defer-embedding-wgrad-compute
        assert sum(parts.values()) == pytest.approx(stage["other_bytes"])
        assert (parts["logits_bytes"] > 0) == (stage["stage"] == 3)  # logits live on the last of PP 4


def test_explain_names_the_gain_of_tp_comm_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192",
            "--gbs", "512", "--precision", "fp8", "--format", "json"]
    code, out, _ = run(args, capsys)
    assert code == 0
    found = {f["code"]: f for f in json.loads(out)["explanation"]}
    assert found["TP_COMM_OVERLAP"]["numbers"]["gain_frac"] >= 0.03
    code, out, _ = run([*args, "--tp-comm-overlap"], capsys)
    doc = json.loads(out)
    assert "TP_COMM_OVERLAP" not in {f["code"] for f in doc["explanation"]}
    assert doc["candidates"][0]["config"]["tp_comm_overlap"]


def test_recompute_modules_for_moe_are_searched_on_request_and_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "mixtral-8x22b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "4096", "--gbs", "256",
            "--format", "json"]
    code, out, _ = run(["explain", *base], capsys)
    assert code == 0
    found = {f["code"]: f for f in json.loads(out)["explanation"]}
    rec = found["RECOMPUTE_MODULES"]
    assert rec["numbers"]["modules"] == ["core_attn", "moe_act", "layernorm"] and rec["numbers"]["gain_frac"] >= 0.03
    code, out, _ = run(["plan", *base, "--recompute-modules", ",".join(rec["numbers"]["modules"])], capsys)
    best = json.loads(out)["candidates"][0]
    assert best["config"]["recompute"] == "selective"
    assert best["config"]["recompute_modules"] == ["core_attn", "moe_act", "layernorm"]
    # FP8 delayed scaling (Hopper) cannot recompute moe_act/layernorm: Megatron's own message
    code, _, err = run(["plan", *base, "--precision", "fp8", "--recompute-modules", "core_attn,moe_act"], capsys)
    assert code == 1 and "Delayed scaling does not support moe_act and layernorm recompute" in err


def test_smallest_model_parallel_counts_cp_and_names_the_fastest(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "1024", "--seq-len",
                        "2048", "--gbs", "1536", "--format", "json"], capsys)
    assert code == 0
    f = next(x for x in json.loads(out)["explanation"] if x["code"] == "SMALLEST_MODEL_PARALLEL")
    # FSDP at TP 2 (which fits at 2) is outside Megatron-FSDP's default scope on A100 (TP 1, PP 1, CP 1); with the
    # memory band's margin (6.3 GiB of 78.1 usable) tp2 pp8 fits at 67.9 GiB: 16; with session 5's 19.4%, 32
    assert f["numbers"]["tp_x_pp_x_cp"] == 16 and "cp" not in f["text"].split("fastest of them ")[1].split(",")[0]
    code, out, _ = run(["explain", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "1024", "--seq-len",
                        "2048", "--gbs", "1536", "--headroom", "19.4%", "--format", "json"], capsys)
    f = next(x for x in json.loads(out)["explanation"] if x["code"] == "SMALLEST_MODEL_PARALLEL")
    assert f["numbers"]["tp_x_pp_x_cp"] == 32
    code, out, _ = run(["explain", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "1024", "--seq-len",
                        "2048", "--gbs", "1536", "--dp-variant", "distopt,fsdp", "--format", "json"], capsys)
    f = next(x for x in json.loads(out)["explanation"] if x["code"] == "SMALLEST_MODEL_PARALLEL")
    assert f["numbers"]["tp_x_pp_x_cp"] == 2 and "fsdp" in f["text"].split("fastest of them ")[1].split(",")[0]


# A Ctrl-C at a chosen moment of a real ``paraplan`` process: the N-th profile event (a Python or C call or return,
# counted from the call of paraplan.__main__.run, the console script's entry, to the interpreter's exit; event 1
# is that call itself, before run's first line)
# raises SIGINT there, so every moment tested is the same on every run, however loaded the machine.
_CTRL_C_CHILD = """
import atexit, os, signal, sys
import paraplan.__main__ as entry
n, events = int(sys.argv[1]), [0]
def at_event(frame, event, arg):
    events[0] += 1
    if events[0] == n:
        sys.setprofile(None)
        signal.raise_signal(signal.SIGINT)
if n == 0:  # count the events of a whole run
    atexit.register(lambda: open(os.environ["EVENTS_FILE"], "w").write(str(events[0])))
sys.argv = ["paraplan", *sys.argv[2:]]
sys.setprofile(at_event)
sys.exit(entry.run())
"""


def _ctrl_c_child(n: int, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", _CTRL_C_CHILD, str(n), *argv], capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv", [["gpus"], ["estimate", "-m", "gpt2", "-g", "h100-80gb", "-n", "8", "-s", "1024",
                                             "--gbs", "16"]], ids=["gpus", "estimate"])
def test_ctrl_c_at_any_moment_of_the_process(argv: list[str], tmp_path: Path) -> None:
    """Exit 130 with exactly "interrupted" on stderr, or (the run was over) exit 0 with the whole output: never a
    traceback, never exit 0 with output cut short. From imports to interpreter shutdown."""
    import os

    events_file = tmp_path / "events"
    whole = subprocess.run([sys.executable, "-c", _CTRL_C_CHILD, "0", *argv], capture_output=True, timeout=120,
                           stdin=subprocess.DEVNULL, env={**os.environ, "EVENTS_FILE": str(events_file)})
    total = int(events_file.read_text())
    assert whole.returncode == 0 and whole.stderr == b"", whole.stderr[-400:]
    assert total > 1000, total  # the imports alone are thousands of events
    moments = sorted({2, 5, *(int(total * f) for f in (0.01, 0.2, 0.5, 0.9, 0.99)),
                      *range(max(total - 30, 2), total + 1, 10), total})
    interrupted = 0
    for n in moments:
        proc = _ctrl_c_child(n, argv)
        where = f"Ctrl-C at event {n} of {total}: exit {proc.returncode}, stderr {proc.stderr[-600:]!r}"
        assert b"Traceback" not in proc.stderr, where
        if proc.returncode == 130:
            interrupted += 1
            assert proc.stderr == b"interrupted\n", where
        else:
            assert proc.returncode == 0 and proc.stderr == b"" and proc.stdout == whole.stdout, where
    assert interrupted >= len(moments) // 2, f"only {interrupted} of {len(moments)} moments interrupted the run"


def test_a_bad_dp_variant_names_the_flag_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64",
                          "--dp-variant", "zero3"], capsys)
    assert code == 1 and out == ""
    assert err.strip() == "error: --dp-variant: unknown 'zero3' (allowed: distopt, fsdp, ddp)"  # was "--dp:"


def test_estimate_table_shows_the_host_bound_share_of_compute(capsys: pytest.CaptureFixture[str]) -> None:
    """An ungraphed syncing MoE recipe on H100 waits for the host after each dispatcher sync: the step-time table
    names that share of compute; a dense model has no such row. (Qwen3-30B's 16-GPU recipe was the example until
    session 10: with the post-sync wait charged once its GPU time now covers the host's issue time.)"""
    code, out, _ = run(["estimate", "--recipe", "qwen3-235b-a22b-h100-bf16-256", "--format", "json"], capsys)
    assert code in (0, 4)
    host_s = json.loads(out)["time"]["host_bound_s"]
    assert host_s > 0
    code, out, _ = run(["estimate", "--recipe", "qwen3-235b-a22b-h100-bf16-256"], capsys)
    row = next(line for line in out.splitlines() if "of which host-bound (MoE)" in line)
    assert f"{host_s:.2f} s" in row
    code, out, _ = run(["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len",
                        "4096", "--gbs", "64"], capsys)
    assert code == 0 and "host-bound" not in out
