"""Review findings FIXB: knob rules in the search, --knob beside --recipe, boolean knob values, check's knob
rules, plan's knob-rule advice, the TE cross-entropy refusal and error wording."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraplan.search import SearchSpace, candidate_table, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

LLAMA8 = load_model("llama3-8b")
H100 = load_gpu("h100-80gb")


def test_tp_comm_overlap_is_dropped_where_sp_is_not_in_effect() -> None:
    """Megatron-LM refuses --tp-comm-overlap without sequence parallelism (off at TP 1); the search drops it there
    as Megatron-Bridge does, so no TP 1 layout carries it."""
    cluster = make_cluster(H100, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    table = candidate_table(LLAMA8, cluster, training, SearchSpace(tp_comm_overlap=True))
    assert np.any(table.tp == 1) and np.any(table.tp > 1)
    assert np.array_equal(table.tp_comm_overlap, table.sp)
    assert not np.any(table.tp_comm_overlap[table.tp == 1])


def test_plan_with_tp_comm_overlap_ranks_only_launchable_layouts() -> None:
    from paraplan.launch.megatron import launch_violations

    cluster = make_cluster(H100, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    for tp in (1, 2):
        p = plan(LLAMA8, cluster, training, space=SearchSpace(tp=(tp,), tp_comm_overlap=True), top_k=3)
        assert p.candidates
        for c in p.candidates:
            codes = {code for code, _ in launch_violations(LLAMA8, c.layout, training)}
            assert "TP_COMM_OVERLAP_NEEDS_SP" not in codes, c.layout
            assert c.layout.tp == tp and c.layout.tp_comm_overlap == (tp > 1)


# 2: --knob refinements beside --recipe -------------------------------------------------------------------------
KNOB_SAMPLES: dict[str, tuple[str | None, str, object]] = {
    "grad_reduce_in_bf16": (None, "bf16", True), "use_precision_aware_optimizer": (None, "bf16", True),
    "main_grads_dtype": ("bf16", "bf16", "bf16"), "main_params_dtype": ("fp16", "bf16", "fp16"),
    "exp_avg_dtype": ("bf16", "bf16", "bf16"), "exp_avg_sq_dtype": ("bf16", "bf16", "bf16"),
    "fp8_recipe": ("tensorwise", "fp8", "tensorwise"), "fp8_param_gather": (None, "fp8", True),
    "optimizer_cpu_offload": (None, "bf16", True), "optimizer_offload_fraction": ("0.5", "bf16", 0.5),
    "cpu_offloading_num_layers": ("2", "bf16", 2), "fine_grained_activation_offloading": (None, "bf16", True),
    "offload_modules": ("core_attn", "bf16", ("core_attn",)), "cp_comm_type": ("a2a", "bf16", "a2a"),
    "fsdp_double_buffer": (None, "bf16", True), "moe_token_dispatcher_type": ("flex", "bf16", "flex"),
    "moe_flex_dispatcher_backend": ("hybridep", "bf16", "hybridep"), "moe_hybridep_num_sms": ("40", "bf16", 40),
    "delay_wgrad_compute": (None, "bf16", True), "moe_permute_fusion": (None, "bf16", True),
    "moe_permute_fusion_into_hybridep": (None, "bf16", True), "moe_shared_expert_overlap": (None, "bf16", True),
    "moe_expert_capacity_factor": ("1.5", "bf16", 1.5), "moe_pad_expert_input_to_capacity": (None, "bf16", True),
    "moe_expert_rank_capacity_factor": ("1.5", "bf16", 1.5), "moe_paged_stash": (None, "bf16", True),
    "use_transformer_engine_op_fuser": (None, "bf16", True),
    "moe_use_grouped_tensor": (None, "bf16", True),
    "moe_paged_stash_buffer_size_factor_cuda": ("1.2", "bf16", 1.2),
    "moe_paged_stash_buffer_size_factor_cpu": ("1.0", "bf16", 1.0),
    "cuda_graph_impl": ("local", "bf16", "local"), "cuda_graph_modules": ("attn", "bf16", ("attn",)),
    "overlap_param_gather_with_optimizer_step": (None, "bf16", True),
    "gradient_accumulation_fusion": (None, "bf16", False), "fp4_recipe": ("nvfp4", "fp4", "nvfp4"),
    "fp4_param_gather": (None, "fp4", True), "first_last_layers_bf16": (None, "fp4", True),
    "num_layers_at_start_in_bf16": ("2", "fp4", 2), "num_layers_at_end_in_bf16": ("2", "fp4", 2),
    "manual_gc": (None, "bf16", True), "manual_gc_interval": ("5", "bf16", 5),
    "defer_embedding_wgrad_compute": (None, "bf16", True), "wgrad_deferral_limit": ("3", "bf16", 3),
    "cross_entropy_loss_fusion": (None, "bf16", True), "cross_entropy_fusion_impl": ("te", "bf16", "te"),
    "tp_comm_overlap_ag": (None, "bf16", False), "tp_comm_overlap_rs": (None, "bf16", False),
    "tp_comm_overlap_rs_dgrad": (None, "bf16", True),
    "tp_comm_overlap_cfg": ("userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192", "bf16",
                            "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"),
}
"""Every memory knob: (--knob value, None for a bare flag; the precision it needs; the TrainingSpec value read)."""
KNOB_ON: dict[str, object] = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                              "cuda_graph_impl": "transformer_engine"}
"""A value that turns on a knob that others refine (True for the boolean ones)."""


def _item(flag: str, value: str | None) -> str:
    return flag[2:] if value is None else f"{flag[2:]}={value}"


def test_knob_samples_cover_every_knob() -> None:
    from paraplan.specs.training import KNOB_FLAGS

    assert set(KNOB_SAMPLES) == set(KNOB_FLAGS)


def test_every_knob_dropped_alone_is_a_listed_refinement() -> None:
    """A knob Megatron ignores (or refuses) without another one is in KNOB_REFINEMENTS, so --knob beside a recipe reads
    it with the recipe's value of the other: a new refinement cannot be forgotten there."""
    from paraplan.cli.options import knob_fields
    from paraplan.errors import SpecError
    from paraplan.specs.training import KNOB_FLAGS, KNOB_REFINEMENTS

    children = {child for refined in KNOB_REFINEMENTS.values() for child in refined}
    for key, (value, precision, expected) in KNOB_SAMPLES.items():
        try:
            read = knob_fields([_item(KNOB_FLAGS[key], value)], precision).get(key)
        except SpecError:
            read = None
        if read != expected:
            assert key in children, f"{key} is dropped or refused alone but refines nothing in KNOB_REFINEMENTS"


def _ancestors_on(key: str) -> dict[str, object]:
    from paraplan.specs.training import KNOB_REFINEMENTS

    out: dict[str, object] = {key: KNOB_ON.get(key, True)}
    for parent, refined in KNOB_REFINEMENTS.items():
        if key in refined and parent not in out:
            out |= _ancestors_on(parent)
    return out


def _pairs() -> list[tuple[str, str, str]]:
    from paraplan.specs.training import KNOB_FLAG_ALIASES, KNOB_FLAGS, KNOB_REFINEMENTS

    return [(parent, child, flag) for parent, refined in KNOB_REFINEMENTS.items() for child in refined
            for flag in (KNOB_FLAGS[child], *KNOB_FLAG_ALIASES.get(child, ()))]


def test_every_refinement_given_beside_a_recipe_with_its_knob_wins() -> None:
    from paraplan.cli.estimate import merge_recipe_knobs

    pairs = _pairs()
    assert len(pairs) >= 17
    for parent, child, flag in pairs:
        value, precision, expected = KNOB_SAMPLES[child]
        # the recipe sets every knob the refinement refines (and the ones those refine), not the refinement
        base = {k: v for k, v in _ancestors_on(child).items() if k != child}
        assert parent in base
        merged = merge_recipe_knobs(base, [_item(flag, value)], precision)
        assert merged.get(child) == expected, (parent, flag, merged)
        assert all(merged[k] == v for k, v in base.items()), (parent, flag, merged)


def test_a_refinement_of_a_knob_the_recipe_leaves_off_is_dropped() -> None:
    from paraplan.cli.estimate import merge_recipe_knobs

    assert "manual_gc_interval" not in merge_recipe_knobs({}, ["manual-gc-interval=5"], "bf16")
    assert "wgrad_deferral_limit" not in merge_recipe_knobs({"defer_embedding_wgrad_compute": False},
                                                            ["wgrad-deferral-limit=3"], "bf16")


def test_recipe_knob_overrides_reach_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    def knobs(*args: str) -> dict[str, object]:
        code = main(["estimate", *args, "--format", "json"])
        out, err = capsys.readouterr()
        assert code in (0, 4), err
        result: dict[str, object] = json.loads(out)["config"]["memory_knobs"]
        return result

    base = knobs("--recipe", "llama3-8b-h100-bf16-8")
    assert base["manual_gc_interval"] == 100 and base["cross_entropy_fusion_impl"] == "te"
    assert knobs("--recipe", "llama3-8b-h100-bf16-8", "--knob", "manual-gc-interval=5")["manual_gc_interval"] == 5
    native = knobs("--recipe", "llama3-8b-h100-bf16-8", "--knob", "cross-entropy-fusion-impl=native")
    assert native["cross_entropy_loss_fusion"] is True and "cross_entropy_fusion_impl" not in native  # the default


SCRIPT = ("export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
          "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
          "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
          "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size {pp} "
          "--sequence-parallel --bf16 --vocab-size 32000 --use-distributed-optimizer {extra}\n")


def check_script(tmp_path: Path, extra: str, capsys: pytest.CaptureFixture[str],
                 pp: int = 1) -> tuple[int, dict[str, list[str]]]:
    """``check --format json`` of a Megatron-LM script: (exit code, {violation code: its messages})."""
    import json

    from paraplan.cli import main

    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.format(extra=extra, pp=pp), encoding="utf-8")
    code = main(["check", str(script), "--gpu", "h100-80gb", "--format", "json"])
    out, err = capsys.readouterr()
    assert out, err
    found: dict[str, list[str]] = {}
    for v in json.loads(out)["violations"]:
        found.setdefault(v["code"], []).append(v["message"])
    return code, found


# 6: Transformer Engine's cross-entropy fusion: refused by Megatron-LM's launch files and check only -------------
TE_CE = ["--knob", "cross-entropy-loss-fusion", "--knob", "cross-entropy-fusion-impl=te"]


def test_te_cross_entropy_beside_the_recipe_that_runs_it(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    assert main(["estimate", "--recipe", "llama3-8b-h100-bf16-8", *TE_CE, "--format", "json"]) in (0, 4)
    out, err = capsys.readouterr()
    assert not err and '"cross_entropy_fusion_impl": "te"' in out


def test_te_cross_entropy_plans_and_launches_for_bridge_only(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    job = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096", "--gbs", "64"]
    saved = tmp_path / "p.json"
    assert main(["plan", *job, *TE_CE, "--save", str(saved)]) == 0
    capsys.readouterr()
    assert main(["launch", "--plan", str(saved), "--target", "bridge", "--out", str(tmp_path / "b")]) == 0
    assert "cross_entropy_fusion_impl" in (tmp_path / "b" / "bridge_recipe.py").read_text() + \
        (tmp_path / "b" / "bridge_overrides.txt").read_text()
    capsys.readouterr()
    for target in ("megatron", "torchrun", "slurm", "k8s"):
        out_dir = tmp_path / target
        assert main(["launch", "--plan", str(saved), "--target", target, "--out", str(out_dir)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "disabled due to stability issues" in err, err
        assert not out_dir.exists() or not any(out_dir.iterdir())


def test_check_of_a_megatron_lm_script_with_te_cross_entropy_reports_it(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, found = check_script(tmp_path, "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", capsys)
    assert code == 1 and "TE_CROSS_ENTROPY_FUSION" in found


# 3: switches given a value ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("item", "precision", "fields"), [
    ("manual-gc=false", "bf16", {"manual_gc": False}), ("manual-gc=true", "bf16", {"manual_gc": True}),
    ("grad-reduce-in-bf16=false", "bf16", {"grad_reduce_in_bf16": False}),
    ("fp8-param-gather=False", "fp8", {"fp8_param_gather": False}),
    ("no-gradient-accumulation-fusion=false", "bf16", {"gradient_accumulation_fusion": True}),
    ("no-gradient-accumulation-fusion=true", "bf16", {"gradient_accumulation_fusion": False}),
])
def test_a_switch_knob_takes_true_or_false(item: str, precision: str, fields: dict[str, object]) -> None:
    from paraplan.cli.options import knob_fields

    assert knob_fields([item], precision) == fields


@pytest.mark.parametrize("item", ["manual-gc=yes", "manual-gc=1", "grad-reduce-in-bf16=true,false"])
def test_a_switch_knob_refuses_other_values_in_one_line(item: str) -> None:
    from paraplan.cli.options import knob_fields
    from paraplan.errors import SpecError

    with pytest.raises(SpecError, match=r"is a switch: give it without a value, =true or =false") as err:
        knob_fields([item], "bf16")
    assert "\n" not in str(err.value)


def test_a_switch_knob_false_is_left_out_of_the_launch_files_and_wins_over_a_recipe() -> None:
    from paraplan.cli.estimate import merge_recipe_knobs
    from paraplan.cli.options import knob_fields
    from paraplan.launch.megatron import argv, megatron_args
    from paraplan.layout import ParallelLayout

    training = TrainingSpec(seq_len=4096, global_batch_size=64,
                            **knob_fields(["manual-gc=false", "grad-reduce-in-bf16=false"], "bf16"))
    words = argv(megatron_args(LLAMA8, ParallelLayout(tp=2, dp=4, recompute="none"), training))
    assert "--manual-gc" not in words and "--grad-reduce-in-bf16" not in words
    merged = merge_recipe_knobs({"manual_gc": True, "manual_gc_interval": 100}, ["manual-gc=false"], "bf16")
    assert merged == {"manual_gc": False}  # its interval goes with it


@pytest.mark.parametrize("extra", ["--manual-gc true", "--manual-gc=true", "--grad-reduce-in-bf16 false"])
def test_check_reports_a_switch_given_a_value(extra: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = check_script(tmp_path, extra, capsys)
    assert code == 1 and "SWITCH_WITH_VALUE" in found
    [message] = found["SWITCH_WITH_VALUE"]
    assert extra.split()[0].split("=")[0] in message and "parse_args refuses" in message
    code, found = check_script(tmp_path, extra.split()[0].split("=")[0], capsys)
    assert "SWITCH_WITH_VALUE" not in found


def test_packaged_switches_are_the_tsv() -> None:
    """megatron_switches.txt is every flag (aliases included) of the TSV that takes no value (nargs 0)."""
    from paraplan.specs.megatron_flags import switch_flags

    tsv = Path(__file__).parents[3] / "shared/reference/megatron_lm_flags_main_d98e8a6.tsv"
    if not tsv.exists():
        pytest.skip(f"{tsv} not available")
    want = {flag for line in tsv.read_text(encoding="utf-8").splitlines()[2:]
            for cols in [line.split("\t")] if cols[6] == "0" and cols[2] != "Help" for flag in cols[0].split("|")}
    assert switch_flags() == want


# 4: check lists the knob rules TrainingSpec enforces -------------------------------------------------------------
@pytest.mark.parametrize(("extra", "words"), [
    ("--defer-embedding-wgrad-compute --no-gradient-accumulation-fusion",
     ["Cannot defer embedding wgrad compute when gradient accumulation fusion is not used"]),
    ("--defer-embedding-wgrad-compute --wgrad-deferral-limit -1", ["wgrad_deferral_limit"]),
    ("--defer-embedding-wgrad-compute --no-gradient-accumulation-fusion --manual-gc --manual-gc-interval -2",
     ["Cannot defer embedding wgrad compute", "manual_gc_interval"]),
])
def test_check_lists_the_knob_rules_as_violations(extra: str, words: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, found = check_script(tmp_path, extra, capsys, pp=2)
    assert code == 1 and len(found["KNOB_RULE"]) == len(words), found
    assert all(any(w in m for m in found["KNOB_RULE"]) for w in words), found


def test_check_lists_every_knob_rule_not_only_the_first() -> None:
    from paraplan.launch.check import script_training

    training, found = script_training({"seq_len": 4096, "global_batch_size": 64, "defer_embedding_wgrad_compute": True,
                                       "gradient_accumulation_fusion": False, "manual_gc": True,
                                       "manual_gc_interval": -2})
    assert [c for c, _ in found] == ["KNOB_RULE", "KNOB_RULE"]
    assert "Cannot defer embedding wgrad compute" in found[1][1] and found[0][1].startswith("manual_gc_interval")
    assert training.seq_len == 4096


# 5: plan's knob-rule advice -------------------------------------------------------------------------------------
GPT2_1 = ["plan", "--model", "gpt2", "--gpu", "h100-80gb", "--num-gpus", "1", "--seq-len", "1024", "--gbs", "8"]


def test_plan_json_error_uses_the_cli_wording(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    assert main([*GPT2_1, "--knob", "defer-embedding-wgrad-compute", "--format", "json"]) == 3
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"] == err.strip()
    assert "change --knob defer-embedding-wgrad-compute, or what the rule's words ask for" in doc["error"]
    assert "TrainingSpec" not in doc["error"] and "NoFeasiblePlanError" not in doc["error"]
    assert "from --knob, --precision or --recipe" not in doc["error"]
    assert doc["rejections"] == {"DEFER_EMBEDDING_WGRAD_NEEDS_PP": 24}


def test_plan_names_every_knob_rule_that_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    assert main([*GPT2_1, "--knob", "defer-embedding-wgrad-compute", "--knob", "delay-wgrad-compute"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "knob rules DELAY_WGRAD_NEEDS_EP_OVERLAP, DEFER_EMBEDDING_WGRAD_NEEDS_PP reject every layout" in err
    assert "Cannot defer embedding wgrad compute when pipeline model parallel is not used" in err
    assert "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute" in err
    assert ("change --knob delay-wgrad-compute (DELAY_WGRAD_NEEDS_EP_OVERLAP) and --knob "
            "defer-embedding-wgrad-compute (DEFER_EMBEDDING_WGRAD_NEEDS_PP)") in err


# 7: error wording -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("item", "words"), [
    ("moe-deepep-num-sms=0", "--moe-deepep-num-sms must be an integer from 1 to 1024, got '0'"),
    ("moe-hybridep-num-sms=2000", "--moe-hybridep-num-sms must be an integer from 1 to 1024, got '2000'"),
    ("moe-flex-dispatcher-num-sms=" + "9" * 5000, "--moe-flex-dispatcher-num-sms must be an integer from 1 to 1024"),
    ("tp-comm-overlap", "--knob tp-comm-overlap: not a knob; paraplan's --tp-comm-overlap sets it"),
    ("tensor-model-parallel-size=2", "--knob tensor-model-parallel-size: not a knob; paraplan's --tp sets it"),
])
def test_knob_errors_name_the_flag_given(item: str, words: str) -> None:
    from paraplan.cli.options import knob_fields
    from paraplan.errors import SpecError

    with pytest.raises(SpecError) as err:
        knob_fields([item], "bf16")
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_deprecated_sms_flags_keep_their_value_in_range() -> None:
    from paraplan.cli.options import knob_fields

    assert knob_fields(["moe-token-dispatcher-type=flex", "moe-deepep-num-sms=0040"], "bf16") == \
        {"moe_token_dispatcher_type": "flex", "moe_hybridep_num_sms": 40}


@pytest.mark.parametrize("field", ["manual_gc_interval", "wgrad_deferral_limit", "cpu_offloading_num_layers",
                                   "num_layers_at_start_in_bf16"])
def test_integer_knob_errors_name_the_upper_bound(field: str) -> None:
    from paraplan.errors import SpecError

    with pytest.raises(SpecError, match=rf"^{field} must be an integer >= 0 and at most 16,777,216 \(the limit\)"):
        TrainingSpec(seq_len=4096, global_batch_size=64, **{field: 10**23})
