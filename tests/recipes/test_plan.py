"""plan and explain show the closest recipe beside the pick (JSON block, table line, RECIPE finding), and nothing
when the model and GPU have none."""

from __future__ import annotations

import json
import math

import pytest

from paraplan.cli import main
from paraplan.explain import explain
from paraplan.recipes.catalogue import bridge_recipes, closest_recipe
from paraplan.recipes.compare import RecipeComparison, compare_with_plan, recipe_finding
from paraplan.search import plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

JOB = ["--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192", "--gbs", "256",
       "--precision", "fp8"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().out


def test_plan_json_carries_the_recipe_block(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["plan", *JOB, "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    rec = d["recipe"]
    assert set(rec) >= {"source", "alias", "at", "recipe_job", "config", "memory", "throughput", "vs_pick",
                        "not_modelled"}
    assert rec["alias"] == "llama3-70b-h100-fp8cs-64" and rec["at"] == "this job"
    assert rec["source"] in {r.source for r in bridge_recipes()}
    pick = d["candidates"][0]
    assert rec["vs_pick"]["peak_bytes"] == pytest.approx(rec["memory"]["peak_bytes"] - pick["memory"]["peak_bytes"])
    gain = rec["throughput"]["tokens_per_s_per_gpu"] / pick["throughput"]["tokens_per_s_per_gpu"] - 1
    assert rec["vs_pick"]["tokens_per_s_per_gpu_frac"] == pytest.approx(gain)
    assert (rec["config"]["tp"], rec["config"]["pp"], rec["config"]["vp"]) == (4, 8, 5)
    assert not any(x.startswith("grad_reduce_in_fp32") for x in rec["not_modelled"])  # modelled: applied


def test_explain_has_one_recipe_finding_in_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["explain", *JOB, "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    found = [f for f in d["explanation"] if f["code"] == "RECIPE"]
    assert len(found) == 1
    nums = found[0]["numbers"]
    assert nums["alias"] == d["recipe"]["alias"]
    assert nums["peak_bytes"] == pytest.approx(d["recipe"]["memory"]["peak_bytes"])
    assert nums["pick_peak_bytes"] == pytest.approx(d["candidates"][0]["memory"]["peak_bytes"])
    assert nums["time_term"] in {"compute", "recompute", "bubble", "optimizer", "overhead", "tp comm", "cp comm",
                                 "ep comm", "pp comm", "dp comm"}
    assert nums["memory_term"] in {"weights", "grads", "optimizer", "activations", "other"}
    assert f"{nums['time_term']} " in found[0]["text"] and "most from" in found[0]["text"]


def test_table_output_has_the_recipe_line_and_finding(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["explain", *JOB], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "recipe llama3-70b-h100-fp8cs-64" in text and "vs #1" in text
    assert "- RECIPE NVIDIA recipe llama3-70b-h100-fp8cs-64" in text


def test_no_recipe_no_block(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "4096", "--gbs", "64"]
    code, out = run(["explain", *args, "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert "recipe" not in d and not [f for f in d["explanation"] if f["code"] == "RECIPE"]


def test_closest_recipe_is_nearest_in_count_then_seq_then_gbs() -> None:
    recipes = bridge_recipes()
    mine = [r for r in recipes if r.model_preset == "llama3-8b" and r.gpu_preset == "gb200"]
    for n, seq, gbs in ((8, 8192, 128), (100, 4096, 1000), (3, 16384, 7)):
        got = closest_recipe(recipes, model="llama3-8b", gpu="gb200", num_gpus=n, seq_len=seq, gbs=gbs,
                             precision="bf16")
        assert got is not None

        def dist(r: object, col: str, v: int) -> float:
            return abs(math.log2(r.get(col) / v))  # type: ignore[attr-defined]

        best = min(dist(r, "num_gpus", n) for r in mine)
        assert dist(got, "num_gpus", n) == best
        same_count = [r for r in mine if dist(r, "num_gpus", n) == best]
        assert dist(got, "seq_length", seq) == min(dist(r, "seq_length", seq) for r in same_count)
    fp8 = closest_recipe(recipes, model="llama3-70b", gpu="h100-80gb", num_gpus=64, seq_len=8192, gbs=256,
                         precision="fp8")
    bf16 = closest_recipe(recipes, model="llama3-70b", gpu="h100-80gb", num_gpus=64, seq_len=8192, gbs=256,
                          precision="bf16")
    assert fp8 is not None and bf16 is not None
    assert fp8.get("precision") != "bf16" and bf16.get("precision") == "bf16"
    assert closest_recipe(recipes, model="mixtral-8x7b", gpu="h100-80gb", num_gpus=8, seq_len=4096, gbs=8,
                          precision="bf16") is None


def test_the_finding_says_agrees_when_the_recipe_is_the_pick() -> None:
    model, gpu = load_model("llama3-8b"), load_gpu("h100-80gb")
    p = plan(model, make_cluster(gpu, 8), TrainingSpec(seq_len=8192, global_batch_size=128), top_k=2)
    cmp = compare_with_plan(p)
    assert cmp is not None and cmp.estimate is not None
    same = RecipeComparison(recipe=cmp.recipe, at="this job", run=cmp.run, estimate=p.candidates[0])
    code, text, numbers = recipe_finding(same, p)
    assert code == "RECIPE" and numbers["same_layout"] is True and numbers["gain_frac"] == 0.0
    assert "the pick uses the same layout and agrees on speed" in text
    assert [x.code for x in explain(p, recipe=same)].count("RECIPE") == 1


def test_plan_compares_with_a_user_recipe_when_it_is_closest(tmp_path: object,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "mine.yaml"
    path.write_text("- {source: 'mine:70b_48', model: llama3-70b, gpu: h100, num_gpus: 48, precision: fp8_cs, "
                    "seq_length: 8192, global_batch_size: 192, micro_batch_size: 1, tp: 4, pp: 4, vp: 5}\n",
                    encoding="utf-8")
    args = ["--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "48", "--seq-len", "8192", "--gbs", "192",
            "--precision", "fp8", "--format", "json"]
    code, out = run(["plan", *args, "--recipes", str(path)], capsys)
    assert code == 0
    assert json.loads(out)["recipe"]["source"] == "mine:70b_48"
    code, out = run(["plan", *args], capsys)
    assert code == 0
    assert json.loads(out)["recipe"]["source"] != "mine:70b_48"


def test_a_recipe_predicted_not_to_fit_names_its_unmodelled_memory_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["explain", "--model", "deepseek-v3", "--gpu", "gb200", "--num-gpus", "256", "--seq-len", "4096",
                     "--gbs", "4096", "--precision", "fp8", "--format", "json"], capsys)
    assert code == 0
    d = json.loads(out)
    (f,) = [x for x in d["explanation"] if x["code"] == "RECIPE"]
    if f["numbers"]["fits"]:
        pytest.skip("the recipe is predicted to fit now: nothing to name")
    named = f["numbers"]["memory_knobs_not_modelled"]
    assert not any(n.startswith("cross_entropy_fusion_impl") for n in named)  # modelled (activations.output_bytes)
    assert "predicted NOT to fit" in f["text"] and all(n in f["text"] for n in named)
    assert d["recipe"]["memory"]["fits"] is False


def test_the_recipe_finding_gives_the_difference_term_by_term(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14 item 5: every time term and every memory term of the recipe against the pick, summing to the step
    and peak differences, and the mechanism of the largest of each."""
    code, out = run(["explain", *JOB, "--format", "json"], capsys)
    assert code == 0
    (f,) = [x for x in json.loads(out)["explanation"] if x["code"] == "RECIPE"]
    nums = f["numbers"]
    times, mems = nums["time_terms_diff_s"], nums["memory_terms_diff_bytes"]
    assert set(times) >= {"compute", "recompute", "bubble", "optimizer", "overhead", "tp comm", "cp comm", "ep comm",
                          "pp comm", "dp comm"}
    assert sum(times.values()) == pytest.approx(nums["step_gap_s"], rel=1e-9, abs=1e-9)
    assert set(mems) == {"weights", "grads", "optimizer", "activations", "other"}
    assert sum(mems.values()) == pytest.approx(nums["peak_bytes"] - nums["pick_peak_bytes"], rel=1e-9)
    assert all(f"{k} " in f["text"] for k in times) and "memory most from" in f["text"]
    if nums.get("faster_than_search"):  # its knobs (TP overlap) are outside the search: faster than all of it
        assert "faster than every layout of this search" in f["text"] and nums["outside_search"]
    else:
        assert f"tier {nums['recipe_tier']}" in f["text"]


def test_the_recipe_gap_splits_into_its_knobs_and_its_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """Review finding (session 8): the gap is split at the recipe's layout run with the plan's knobs; the two parts
    add up to the step gap, and the part from the knobs is that layout's own estimate with and without them."""
    from paraplan.estimator import estimate

    code, out = run(["explain", *JOB, "--format", "json"], capsys)
    assert code == 0
    (f,) = [x for x in json.loads(out)["explanation"] if x["code"] == "RECIPE"]
    nums = f["numbers"]
    assert nums["step_gap_knobs_s"] + nums["step_gap_layout_s"] == pytest.approx(nums["step_gap_s"], abs=1e-9)
    assert "from its knobs" in f["text"] and "from its layout" in f["text"]
    p = plan(load_model("llama3-70b"), make_cluster(load_gpu("h100-80gb"), 64),
             TrainingSpec(seq_len=8192, global_batch_size=256, precision="fp8"), top_k=2)
    cmp = compare_with_plan(p)
    assert cmp is not None and cmp.run is not None and cmp.estimate is not None
    mid = estimate(cmp.run.model, p.cluster, p.training, cmp.run.layout)
    assert float(cmp.estimate.time.step_s) - float(mid.time.step_s) == pytest.approx(nums["step_gap_knobs_s"],
                                                                                      rel=1e-9, abs=1e-9)
