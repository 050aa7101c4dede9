"""``estimate --recipe``: every recipe with presets runs (or breaks an MCore rule its notes name), its knobs go into
the estimate, the ones paraplan does not model are listed, and flags given beside it win."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from paraplan.cli import main
from paraplan.recipes.catalogue import bridge_recipes, find_recipe
from paraplan.recipes.knobs import (
    estimate_recipe,
    layout_fields,
    not_modelled,
    pipeline_counts,
    recipe_run,
    training_knobs,
)
from paraplan.specs.load import load_model

MCORE_REJECTS = re.compile(r"does not divide num_gpus|MCore asserts")
"""bridge_perf_recipes.md's notes on rows whose grid or layout Megatron-Core rejects."""


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object] | str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code in (0, 4) else err)


def fit_code(out: dict[str, object] | str) -> int:
    """The exit code an estimate has: 0 when its layout fits, 4 when it does not (paraplan.cli)."""
    assert isinstance(out, dict)
    return 0 if out["memory"]["fits"] else 4  # type: ignore[index]


def test_every_runnable_recipe_estimates_or_breaks_the_rule_its_notes_name(capsys: pytest.CaptureFixture[str]) -> None:
    ran = refused = 0
    for r in bridge_recipes():
        if not r.runnable:
            continue
        code, out = run_json(["estimate", "--recipe", r.alias, "--format", "json"], capsys)
        if MCORE_REJECTS.search(str(r.get("notes"))):
            assert code == 1 and isinstance(out, str) and out.count("\n") == 1, r.alias
            refused += 1
            continue
        assert isinstance(out, dict) and code == fit_code(out), (r.alias, out)
        cfg = out["config"]
        assert isinstance(cfg, dict)
        assert (cfg["tp"], cfg["pp"], cfg["cp"], cfg["mbs"], cfg["gbs"], cfg["seq_len"]) == (
            r.get("tp"), r.get("pp"), r.get("cp"), r.get("micro_batch_size"), r.get("global_batch_size"),
            r.get("seq_length"))
        assert cfg["dp"] == r.get("dp")
        assert cfg["vp"] == (r.get("vp") or 1) and cfg["ep"] == (r.get("ep") or 1)
        assert cfg["tp_comm_overlap"] == r.get("tp_comm_overlap")
        assert cfg["fsdp"] == r.get("use_megatron_fsdp")
        assert cfg["recompute"] == {None: "none"}.get(r.get("recompute_granularity"), r.get("recompute_granularity"))
        assert cfg["precision"] == {"bf16": "bf16", "nvfp4": "fp4"}.get(str(r.get("precision")), "fp8")
        block = out["recipe"]
        assert isinstance(block, dict) and block["source"] == r.source and block["overridden"] == []
        assert block["not_modelled"] == not_modelled(r) + layout_fields(r)[1]
        ran += 1
    assert ran > 150 and refused > 0


def test_pipeline_layout_strings_are_read_as_mcore_does() -> None:
    r = find_recipe("llama3-70b-h100-fp8cs-64", bridge_recipes())
    assert r.get("pipeline_model_parallel_layout") == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
    counts = pipeline_counts(r)
    assert counts == (2,) + (2,) * 34 + (3,) + (2,) * 3 + (1,)
    assert counts is not None and sum(counts) == load_model("llama3-70b").num_layers
    run = recipe_run(r)
    assert run.layout.pipeline_layout == counts and run.layout.pp * run.layout.vp == len(counts)


def test_knobs_paraplan_does_not_model_are_listed_not_dropped() -> None:
    r = find_recipe("llama3-70b-h100-fp8cs-64", bridge_recipes())
    nm = not_modelled(r)
    # the memory knobs are modelled now: applied to the TrainingSpec, not listed
    assert not any(x.startswith(("grad_reduce_in_fp32", "fp8_param_gather")) for x in nm)
    assert not any(x.startswith("precision=") for x in nm)  # the FP8 recipe is modelled (memory and time)
    est = estimate_recipe(r)
    t = est.training
    assert (t.grad_reduce_in_bf16, t.fp8_param_gather, t.fp8_recipe) == (True, True, "tensorwise")
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1"
    assert env in nm and any(env in n for n in est.notes)
    assert t.cross_entropy_loss_fusion and t.cross_entropy_fusion_impl == "te"  # modelled: applied, not listed
    assert not any(s.startswith("cross_entropy") for s in nm)
    assert not any(s.startswith("manual_gc") for s in nm) and t.manual_gc  # modelled (as no time): applied
    # the knobs move the estimate: flip them to Megatron's defaults and stage memory rises
    plain = replace(r, fields={**r.fields, "grad_reduce_in_fp32": True, "fp8_param_gather": False})
    assert estimate_recipe(plain).peak_bytes > est.peak_bytes
    # a gated column (the outer DP sharding strategy) is listed only when its gate is on
    on = replace(r, fields={**r.fields, "num_distributed_optimizer_instances": 2,
                            "outer_dp_sharding_strategy": "optim"})
    assert any(s.startswith("outer_dp_sharding_strategy=") for s in not_modelled(on))
    assert not any(s.startswith("outer_dp_sharding_strategy") for s in nm)
    # CUDA graphs are modelled: applied to the TrainingSpec, not listed
    graphs = [x for x in bridge_recipes() if x.runnable
              and x.get("cuda_graph_impl") == "transformer_engine" and x.get("cuda_graph_scope")]
    assert not any(s.startswith("cuda_graph") for s in not_modelled(graphs[0]))
    t = estimate_recipe(graphs[0]).training
    assert (t.cuda_graph_impl, list(t.cuda_graph_modules)) == ("transformer_engine", graphs[0].get("cuda_graph_scope"))


def test_nvfp4_recipes_run_as_fp4_with_their_knobs() -> None:
    nvfp4 = [r for r in bridge_recipes() if r.runnable and r.get("precision") == "nvfp4"]
    assert nvfp4 and all(recipe_run(r).job.precision == "fp4" for r in nvfp4)
    assert not any(x.startswith(("precision=", "fp4_param_gather", "first_last_layers_bf16"))
                   for r in nvfp4 for x in not_modelled(r))
    bf16_ends = next(r for r in bridge_recipes() if str(r.get("first_last_layers_bf16")).startswith("True("))
    knobs = training_knobs(bf16_ends, "fp4")
    start, end = (int(x.split("=")[1]) for x in str(bf16_ends.get("first_last_layers_bf16"))[5:-1].split(","))
    assert (knobs["first_last_layers_bf16"], knobs["num_layers_at_start_in_bf16"],
            knobs["num_layers_at_end_in_bf16"]) == (True, start, end)
    assert knobs["fp4_param_gather"] == bf16_ends.get("fp4_param_gather")


def test_peft_is_modelled() -> None:
    peft = next(r for r in bridge_recipes() if r.runnable and r.get("task") == "peft")
    assert not any(x.startswith(("task=peft", "peft=")) for x in not_modelled(peft))  # modelled: frozen base
    est = estimate_recipe(peft)
    assert est.training.peft and all(float(s.memory.grads_bytes) == 0.0 for s in est.stages)


def test_flags_beside_the_recipe_win(capsys: pytest.CaptureFixture[str]) -> None:
    name = "llama3-70b-h100-fp8cs-64"
    code, base = run_json(["estimate", "--recipe", name, "--format", "json"], capsys)
    assert code == 0 and isinstance(base, dict)
    code, out = run_json(["estimate", "--recipe", name, "--pp", "4", "--vp", "5", "--mbs", "2", "--gbs", "512",
                          "--num-gpus", "128", "--recompute", "full", "--precision", "bf16", "--format", "json"],
                         capsys)
    assert isinstance(out, dict) and code == fit_code(out)
    cfg, bcfg = out["config"], base["config"]
    assert isinstance(cfg, dict) and isinstance(bcfg, dict)
    assert (cfg["pp"], cfg["vp"], cfg["mbs"], cfg["gbs"], cfg["recompute"], cfg["precision"]) == (
        4, 5, 2, 512, "full", "bf16")
    assert cfg["tp"] == bcfg["tp"] == 4 and cfg["dp"] == 128 // (4 * 4)
    assert cfg["pipeline_layout"] == [] and bcfg["pipeline_layout"] != []
    rec = out["recipe"]
    assert isinstance(rec, dict)
    assert set(rec["overridden"]) == {"--pp", "--vp", "--mbs", "--gbs", "--num-gpus", "--recompute", "--precision"}
    assert any("pipeline layout" in n and "dropped" in n for n in rec["notes"])
    assert any(n.startswith("given beside the recipe") and "--pp" in n for n in out["notes"])  # type: ignore[union-attr]
    assert out["cluster"]["num_gpus"] == 128  # type: ignore[index]
    code, other_gpu = run_json(["estimate", "--recipe", name, "--gpu", "h200-141gb", "--format", "json"], capsys)
    assert code == 0 and isinstance(other_gpu, dict)
    assert other_gpu["cluster"]["gpu"] == "h200-141gb"  # type: ignore[index]
    assert other_gpu["memory"]["usable_bytes"] > base["memory"]["usable_bytes"]  # type: ignore[index]


def test_optimizer_overrides_follow_the_cli_rules(capsys: pytest.CaptureFixture[str]) -> None:
    name = "llama3-70b-h100-fp8cs-64"  # distributed optimizer with overlapped param gather
    code, out = run_json(["estimate", "--recipe", name, "--no-distributed-optimizer", "--format", "json"], capsys)
    assert isinstance(out, dict) and code == fit_code(out)
    cfg = out["config"]
    assert isinstance(cfg, dict)
    assert (cfg["distributed_optimizer"], cfg["overlap_param_gather"], cfg["fsdp"]) == (False, False, False)
    code, out = run_json(["estimate", "--recipe", name, "--fsdp", "--format", "json"], capsys)
    assert isinstance(out, dict) and code == fit_code(out)
    cfg = out["config"]
    assert isinstance(cfg, dict)
    assert (cfg["distributed_optimizer"], cfg["overlap_param_gather"], cfg["fsdp"]) == (False, True, True)


def test_attention_backend_beside_the_recipe_wins(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "--recipe", "llama3-8b-h100-bf16-8", "--format", "json"]
    code, base = run_json(args, capsys)
    code2, unfused = run_json([*args, "--attention-backend", "unfused"], capsys)
    assert isinstance(base, dict) and isinstance(unfused, dict)
    assert (code, code2) == (fit_code(base), fit_code(unfused))
    assert unfused["recipe"]["overridden"] == ["--attention-backend"]  # type: ignore[index]
    assert unfused["memory"]["peak_bytes"] > base["memory"]["peak_bytes"]  # type: ignore[index]  # s x s scores


def test_a_flag_given_at_its_default_value_still_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    name = "llama3-70b-h100-fp8cs-64"  # TP 4 in the recipe; --tp 1 is the flag's default value
    code, out = run_json(["estimate", "--recipe", name, "--tp", "1", "--pp", "8", "--vp", "1", "--format", "json"],
                         capsys)
    assert isinstance(out, dict) and code == fit_code(out)
    assert out["config"]["tp"] == 1  # type: ignore[index]


@pytest.mark.parametrize(("args", "text"), [
    (["--model", "llama3-70b"], "drop --model"),
    (["--megatron-args", "--tp 2"], "drop --megatron-args"),
    (["--tp", "0"], "--tp must be a positive integer"),
    (["--recompute-modules", "bogus"], "--recompute-modules: unknown 'bogus'"),
])
def test_recipe_errors_are_one_line(args: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_json(["estimate", "--recipe", "llama3-70b-h100-fp8cs-64", *args], capsys)
    assert code == 1 and isinstance(err, str) and err.count("\n") == 1 and text in err


def test_unknown_recipe_suggests_near_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_json(["estimate", "--recipe", "llama3-70b-h100-fp8-64"], capsys)
    assert code == 1 and isinstance(err, str) and err.count("\n") == 1
    assert "unknown recipe 'llama3-70b-h100-fp8-64'" in err and "llama3-70b-h100-fp8cs-64" in err


def test_a_recipe_without_presets_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    r = next(x for x in bridge_recipes() if not x.runnable)
    code, err = run_json(["estimate", "--recipe", r.alias], capsys)
    assert code == 1 and isinstance(err, str) and err.count("\n") == 1 and "no paraplan" in err


def test_estimate_without_recipe_still_needs_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_json(["estimate", "--model", "llama3-8b", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "8"],
                         capsys)
    assert code == 1 and err == "error: --gpu is required (or give --recipe)\n"
    code, err = run_json(["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len",
                          "4096", "--gbs", "8", "--recipes", "x.yaml"], capsys)
    assert code == 1 and isinstance(err, str) and "add --recipe" in err


def test_knobs_beside_the_recipe_win_over_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    name = "qwen3-235b-a22b-gb200-nvfp4-256"  # flex / HybridEP, TE CUDA graphs of attn, moe_router, moe_preprocess
    code, base = run_json(["estimate", "--recipe", name, "--format", "json"], capsys)
    assert isinstance(base, dict) and code == fit_code(base)
    code, out = run_json(["estimate", "--recipe", name, "--knob", "moe-token-dispatcher-type=alltoall",
                          "--knob", "cuda-graph-modules=attn", "--format", "json"], capsys)
    assert isinstance(out, dict) and code == fit_code(out)
    knobs, bknobs = out["config"]["memory_knobs"], base["config"]["memory_knobs"]  # type: ignore[index]
    assert bknobs["moe_token_dispatcher_type"] == "flex" and "moe_token_dispatcher_type" not in knobs
    assert "moe_flex_dispatcher_backend" not in knobs  # refines the flex dispatcher only
    assert knobs["cuda_graph_modules"] == ["attn"] and knobs["cuda_graph_impl"] == "transformer_engine"  # the recipe's
    assert knobs["fp4_param_gather"] is True  # the recipe's knobs not named stay
    assert out["time"]["step_s"] != base["time"]["step_s"]  # type: ignore[index]
    assert out["recipe"]["overridden"] == ["--knob moe-token-dispatcher-type=alltoall",  # type: ignore[index]
                                           "--knob cuda-graph-modules=attn"]
    assert any(n.startswith("given beside the recipe") and "--knob cuda-graph-modules=attn" in n
               for n in out["notes"])  # type: ignore[union-attr]
    # a knob refining one of the recipe's is read with it: the flex dispatcher's SMs
    code, sms = run_json(["estimate", "--recipe", name, "--knob", "moe-hybridep-num-sms=16", "--format", "json"],
                         capsys)
    assert isinstance(sms, dict) and code == fit_code(sms)
    assert sms["config"]["memory_knobs"]["moe_hybridep_num_sms"] == 16  # type: ignore[index]
    assert bknobs["moe_hybridep_num_sms"] != 16


@pytest.mark.parametrize(("recipe", "knob", "text"), [
    ("llama3-8b-b200-nvfp4-8", "fp8-recipe=mxfp8", "--knob fp8-recipe needs --precision fp8"),
    ("llama3-8b-b200-bf16-8", "fp8-param-gather", "--knob fp8-param-gather needs --precision fp8"),
    ("llama3-8b-b200-bf16-8", "cuda-graph-impl", "--cuda-graph-impl must be one of"),
    ("llama3-8b-b200-bf16-8", "bogus-knob", "not a knob"),
    ("llama3-8b-h100-bf16-8", "cuda-graph-modules=moe", "moe cuda graph is only supported for MoE."),  # a flag rule
])
def test_knobs_beside_the_recipe_are_refused_as_without_it(recipe: str, knob: str, text: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    graphs = ["--knob", "cuda-graph-impl=transformer_engine"] if knob.startswith("cuda-graph-modules") else []
    code, err = run_json(["estimate", "--recipe", recipe, *graphs, "--knob", knob], capsys)
    assert code == 1 and isinstance(err, str) and err.count("\n") == 1 and text in err, err


def test_recipe_estimate_uses_the_model_family_margin(capsys: pytest.CaptureFixture[str]) -> None:
    code, moe = run_json(["estimate", "--recipe", "deepseek-v3-gb200-fp8mx-256", "--format", "json"], capsys)
    assert isinstance(moe, dict) and code == fit_code(moe)
    assert moe["memory"]["headroom"]["source"].startswith("moe memory error band")  # type: ignore[index]
    code, dense = run_json(["estimate", "--recipe", "llama3-8b-h100-bf16-8", "--format", "json"], capsys)
    assert isinstance(dense, dict) and code == fit_code(dense)
    assert dense["memory"]["headroom"]["source"].startswith("dense memory error band")  # type: ignore[index]


UB_RECIPE = "llama3-70b-h100-fp8cs-64"
UB_NAME = "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"


@pytest.mark.parametrize(("overrides", "precision", "named"), [
    ({"tp": 2}, None, "TP 2"), ({"tp": 8}, None, "TP 8"), ({"tp": 1}, None, "TP 1"),
    ({"mbs": 2}, None, "micro-batch 2"),
    ({}, "bf16", "precision bf16"),
])
def test_an_override_off_the_named_userbuffers_config_drops_it(overrides: dict[str, int], precision: str | None,
                                                               named: str) -> None:
    r = find_recipe(UB_RECIPE, bridge_recipes())
    assert r.get("tp_comm_overlap_cfg") == UB_NAME and training_knobs(r, "fp8")["tp_comm_overlap_cfg"] == UB_NAME
    run = recipe_run(r, layout_overrides=overrides, precision=precision,
                     num_gpus=64 if overrides.get("tp") != 8 else 128)
    assert "tp_comm_overlap_cfg" not in training_knobs(run.recipe, run.job.precision)
    [note] = [n for n in run.notes if UB_NAME in n]
    assert f"({named}" in note and "Transformer Engine's defaults" in note


@pytest.mark.parametrize("overrides", [{"tp": 4}, {"pp": 4, "vp": 1}, {"cp": 1}])
def test_an_override_that_keeps_the_named_job_keeps_its_userbuffers_config(overrides: dict[str, int]) -> None:
    run = recipe_run(find_recipe(UB_RECIPE, bridge_recipes()), layout_overrides=overrides)
    assert training_knobs(run.recipe, run.job.precision)["tp_comm_overlap_cfg"] == UB_NAME
    assert not [n for n in run.notes if "userbuffers" in n]


def test_the_recipes_own_mismatch_with_its_config_name_is_kept() -> None:
    """Bridge's own recipes run configs named for another TP (b300 llama3.1-405b bf16: tp2 with a tp4_cp2 config):
    only an override that moves off both the recipe's value and the name's drops it."""
    rows = [r for r in bridge_recipes() if r.runnable and r.get("tp_comm_overlap") is True
            and str(r.get("tp_comm_overlap_cfg")).startswith("userbuffers_")
            and f"_tp{r.get('tp')}_" not in str(r.get("tp_comm_overlap_cfg"))]
    assert rows
    for r in rows:
        run = recipe_run(r)
        assert training_knobs(run.recipe, run.job.precision)["tp_comm_overlap_cfg"] == r.get("tp_comm_overlap_cfg")


def test_the_cli_notes_the_dropped_userbuffers_config_unless_the_knob_keeps_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(["estimate", "--recipe", UB_RECIPE, "--precision", "bf16", "--format", "json"], capsys)
    assert code in (0, 4) and isinstance(out, dict)
    assert any(UB_NAME in n and "dropped" in n for n in out["recipe"]["notes"])  # type: ignore[index]
    code, out = run_json(["estimate", "--recipe", UB_RECIPE, "--precision", "bf16", "--knob",
                          f"tp-comm-overlap-cfg={UB_NAME}", "--format", "json"], capsys)
    assert code in (0, 4) and isinstance(out, dict)
    assert not any("dropped" in n for n in out["recipe"]["notes"])  # type: ignore[index]


def test_every_packaged_userbuffers_name_spells_its_job() -> None:
    from paraplan.specs.userbuffers import name_layout, packaged

    for name in packaged():
        job = name_layout(name)
        assert job is not None and f"_tp{job['tp']}_" in name and f"_seqlen{job['seq_len']}" in name, name
    assert name_layout("/tmp/ub.yaml") is None and name_layout("") is None


def test_plans_recipe_line_drops_the_named_config_for_another_seq_length() -> None:
    """plan / explain estimate the closest recipe at the plan's job (``compare_with_plan``): the same rule."""
    from paraplan.recipes.compare import compare_with_plan
    from paraplan.search import plan
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu
    from paraplan.specs.training import TrainingSpec

    cluster = make_cluster(load_gpu("h100-80gb"), 64)
    for seq, dropped in ((4096, True), (8192, False)):
        p = plan(load_model("llama3-70b"), cluster, TrainingSpec(seq_len=seq, global_batch_size=128, precision="fp8"),
                 top_k=1)
        cmp = compare_with_plan(p)
        assert cmp is not None and cmp.recipe.alias == UB_RECIPE and cmp.at == "this job" and cmp.estimate
        assert (cmp.estimate.training.tp_comm_overlap_cfg == "") is dropped
        assert any("seq length 4096" in n for n in cmp.estimate.notes) is dropped


def test_the_compute_mechanism_names_the_host_bound_share_of_moe_layers() -> None:
    """Qwen3-235B on 256 B200 (alltoall with its host-device syncs, no CUDA graphs): the same layout at mbs 1 and
    mbs 2. Halving the micro-batch doubles the MoE layer-micro-batches whose ops the host issues after each sync, so
    RECIPE's compute mechanism gives each side's host-bound seconds (inside compute), not only GEMM efficiency."""
    from paraplan.recipes.catalogue import bridge_recipes, find_recipe
    from paraplan.recipes.compare import _mechanism
    from paraplan.recipes.knobs import estimate_recipe

    r = find_recipe("qwen3-235b-a22b-b200-nvfp4-256", bridge_recipes())
    rec = estimate_recipe(r)
    pick = estimate_recipe(r, layout_overrides={"mbs": 2})
    assert float(rec.time.host_bound_s) > float(pick.time.host_bound_s) > 0
    text = _mechanism("compute", rec, pick)
    assert text.startswith("compute of the slowest stage")
    assert (f"host-bound MoE layers (the GPU waits while the host issues a layer's ops after its dispatcher syncs, "
            f"per layer and micro-batch): recipe {float(rec.time.host_bound_s):.3f} s over {rec.num_microbatches} "
            f"micro-batches, pick {float(pick.time.host_bound_s):.3f} s over {pick.num_microbatches}") in text
    dense = find_recipe("llama3-8b-h100-bf16-8", bridge_recipes())
    assert "host-bound" not in _mechanism("compute", estimate_recipe(dense), estimate_recipe(dense))
