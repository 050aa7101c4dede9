"""The search's fit advice is data (``FitTip``): the library words it with its own field names, the CLI with its
flags, from the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

import paraplan
from paraplan.cli import main
from paraplan.cli.render import fit_tip_flags, no_fit_line
from paraplan.errors import NoFeasiblePlanError, SpecError
from paraplan.headroom import parse_headroom
from paraplan.search import ADVICE_MAX_GPUS, FitTip, SearchSpace, candidate_table, knob_rule_tip
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model, model_from_megatron_args
from paraplan.specs.training import TrainingSpec
from paraplan.units import GIB

TRAINING = {"seq_len": 4096, "global_batch_size": 64}


def _no_fit(**kwargs: object) -> NoFeasiblePlanError:
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan("llama3.1-405b", "h100-80gb", 16, training=TRAINING, **kwargs)  # type: ignore[arg-type]
    return info.value


def test_advice_is_data_and_the_library_names_no_flag() -> None:
    err = _no_fit(space={"recompute": ("none", "selective"), "max_pp": 2, "mbs": (2, 4)})
    tips = err.advice
    # PP 2 at most: more GPUs add only DP and CP, and no count fits; the other tips lift the search's limits
    assert [t.knob for t in tips] == ["no_gpu_count", "recompute", "pipeline", "mbs", "gpu_memory"]  # type: ignore[attr-defined]
    none = tips[0]
    assert isinstance(none, FitTip) and none.value == ADVICE_MAX_GPUS and none.ratio is not None and none.ratio > 1
    assert tips[3] == FitTip("mbs", 1)
    assert "--" not in str(err)
    assert str(err).startswith(err.summary + f"; what would make it fit: no GPU count up to {ADVICE_MAX_GPUS:,} fits")
    assert "SearchSpace.max_pp/pp" in str(err)


def test_the_cli_words_the_same_tips_with_flags(capsys: pytest.CaptureFixture[str]) -> None:
    err = _no_fit(space={"recompute": ("none", "selective"), "max_pp": 2, "mbs": (2, 4)})
    line = no_fit_line(err)
    assert line.startswith(err.summary + "; what would make it fit: ")
    assert f"no --num-gpus up to {ADVICE_MAX_GPUS:,} fits: the smallest footprint found, " in line
    assert "(--recompute none,selective,full)" in line and "(--max-pp/--pp)" in line and "(--mbs 1)" in line
    code = main(["plan", "-m", "llama3.1-405b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "64",
                 "--recompute", "none,selective", "--max-pp", "2", "--mbs", "2,4"])
    assert code == 3
    assert capsys.readouterr().err.strip() == line
    code = main(["plan", "-m", "llama3.1-405b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "64"])
    (tip, *_) = _no_fit().advice
    assert code == 3 and isinstance(tip, FitTip) and tip.knob == "num_gpus"
    assert (f"what would make it fit: --num-gpus {tip.value:.0f} (the first count that fits, doubling from this one; "
            f"its pick {tip.layout} peaks at {tip.peak_bytes / GIB:.1f} GiB)") in capsys.readouterr().err


# --- the advised GPU count is the model's own: the first doubling that fits, not a linear shortfall ---------------

@pytest.mark.parametrize(("model", "gpu", "n", "seq", "gbs"), [
    ("llama3-70b", "h100-80gb", 8, 4096, 64),  # about 2x short
    ("llama3.1-405b", "h100-80gb", 16, 4096, 64),  # about 6x short
    ("llama3.1-405b", "a100-40gb", 1, 8192, 64),  # about 180x short, one GPU
    ("deepseek-v3", "h100-80gb", 8, 4096, 64),  # MoE, MLA
])
def test_the_advised_count_fits_and_half_of_it_does_not(model: str, gpu: str, n: int, seq: int, gbs: int) -> None:
    training = {"seq_len": seq, "global_batch_size": gbs}
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan(model, gpu, n, training=training)
    tip = info.value.advice[0]
    assert isinstance(tip, FitTip) and tip.knob == "num_gpus" and tip.value is not None and tip.ratio is not None
    count = int(tip.value)
    p = paraplan.plan(model, gpu, count, training=training, top_k=1)
    assert p.candidates[0].layout.short() == tip.layout and p.candidates[0].peak_bytes == pytest.approx(tip.peak_bytes)
    if count // 2 > n:
        with pytest.raises(NoFeasiblePlanError):
            paraplan.plan(model, gpu, count // 2, training=training, top_k=1)
    smallest = info.value.smallest
    assert smallest is not None and smallest[1] > load_gpu(gpu).usable_bytes


def test_when_model_state_cannot_shrink_enough_no_count_is_advised() -> None:
    """Four layers of a 131072-wide model: PP stops at 4 and TP at the NVLink domain, so memory per GPU stops
    shrinking far above an A100's 40 GB (a linear estimate would have said a few hundred GPUs)."""
    model = {"num_layers": 4, "hidden_size": 131072, "num_attention_heads": 128, "ffn_hidden_size": 524288,
             "vocab_size": 128256, "max_position_embeddings": 8192, "swiglu": True, "normalization": "RMSNorm",
             "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True}
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan(model_from_megatron_args(model), "a100-40gb", 1, training=TRAINING)  # type: ignore[arg-type]
    tip = info.value.advice[0]
    assert isinstance(tip, FitTip) and tip.knob == "no_gpu_count" and tip.value == ADVICE_MAX_GPUS
    usable = load_gpu("a100-40gb").usable_bytes
    assert tip.peak_bytes > usable and tip.layout.startswith("tp8 pp4")
    with pytest.raises(NoFeasiblePlanError) as at:  # the footprint named is the one the search finds at that count
        paraplan.plan(model_from_megatron_args(model), "a100-40gb", tip.at_gpus, training=TRAINING)  # type: ignore[arg-type]
    assert at.value.smallest is not None and at.value.smallest[1] == pytest.approx(tip.peak_bytes)
    assert "no --num-gpus up to 65,536 fits" in no_fit_line(info.value)
    assert "no GPU count up to 65,536 fits" in str(info.value)


@pytest.mark.parametrize("tip", [FitTip("search_space"), FitTip("num_gpus", 64, 3.5), FitTip("recompute"),
                                 FitTip("no_gpu_count", 65536, 2.0, layout="tp8 pp4", peak_bytes=90 * GIB, at_gpus=64),
                                 FitTip("pipeline"), FitTip("mbs", 1), FitTip("gpu_memory", 200 * GIB),
                                 FitTip("knob_rule", 12, rules=("CUDA_GRAPH_FULL_RECOMPUTE",),
                                        knobs=("cuda_graph_impl",), reason="full recompute is only supported ...")])
def test_every_knob_has_both_wordings(tip: FitTip) -> None:
    lib, cli = tip.describe(), fit_tip_flags(tip)
    assert lib and cli and "--" not in lib
    assert ("--" in cli) == (tip.knob != "gpu_memory")


# --- a knob rule rejects every layout: the advice names the rule and the knob, not the search flags -------------

GATHER = "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_VP"
SMALL = ["plan", "-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"]


def _knob_no_fit(training: dict[str, object], space: dict[str, object] | None = None) -> NoFeasiblePlanError:
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan("llama3-8b", "h100-80gb", 8, training={**TRAINING, **training}, space=space)  # type: ignore[arg-type]
    return info.value


def test_a_knob_rule_that_rejects_every_layout_is_named_with_its_knob() -> None:
    err = _knob_no_fit({"overlap_param_gather_with_optimizer_step": True}, {"pp": (1,)})
    assert err.advice == (FitTip("knob_rule", float(err.rejections[GATHER]), rules=(GATHER,),
                                 knobs=("overlap_param_gather_with_optimizer_step",), reason=err.examples[GATHER]),)
    assert "interleaved pipeline parallelism" in err.examples[GATHER]  # Megatron's words (arguments.py)
    assert f"{GATHER} rejects every layout" in str(err) and "overlap_param_gather_with_optimizer_step (TrainingSpec)" \
        in str(err) and "relax the search space" not in str(err) and "--" not in str(err).split("; what would")[1]


@pytest.mark.parametrize(("training", "space", "knobs"), [
    ({"cuda_graph_impl": "local"}, {"recompute": ("full",)}, ("cuda_graph_impl",)),  # CUDA_GRAPH_FULL_RECOMPUTE
    ({"precision": "fp8", "fp8_recipe": "mxfp8"}, None, ("fp8_recipe", "precision")),  # MXFP8_NEEDS_BLACKWELL
])
def test_the_knob_named_is_the_one_whose_default_lifts_the_rule(training: dict[str, object],
                                                                 space: dict[str, object] | None,
                                                                 knobs: tuple[str, ...]) -> None:
    (tip,) = _knob_no_fit(training, space).advice
    assert isinstance(tip, FitTip) and tip.knob == "knob_rule" and tip.knobs == knobs


def test_the_cli_names_the_rule_its_words_and_the_knob_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*SMALL, "--pp", "1", "--knob", "overlap-param-gather-with-optimizer-step"])
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1
    assert (f"{GATHER} rejects every layout the other rules accept (240: --overlap-param-gather-with-optimizer-step "
            "only supported with interleaved pipeline parallelism): change --knob "
            "overlap-param-gather-with-optimizer-step") in err
    assert "relax the search flags" not in err


def test_when_the_other_rules_leave_nothing_either_the_search_space_is_the_advice() -> None:
    model, training = load_model("llama3-8b"), TrainingSpec(**TRAINING, cuda_graph_impl="local")  # type: ignore[arg-type]
    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    table = candidate_table(model, cluster, training, SearchSpace(recompute=("full",)))
    everything = np.ones(len(table), dtype=bool)
    knob = ("CUDA_GRAPH_FULL_RECOMPUTE", everything, None)
    rejections, examples = {"CUDA_GRAPH_FULL_RECOMPUTE": len(table)}, {"CUDA_GRAPH_FULL_RECOMPUTE": "words"}
    codes = {"CUDA_GRAPH_FULL_RECOMPUTE"}
    assert knob_rule_tip(model, training, "hopper", table, [knob], codes, rejections, examples)
    other = ("FSDP_NOT_BENCHMARKED", everything, None)  # another rule leaves no layout either
    assert knob_rule_tip(model, training, "hopper", table, [knob, other], codes, rejections, examples) == ()
    assert knob_rule_tip(model, training, "hopper", table, [knob], codes, rejections, examples, valid=3) == ()


def test_a_knob_rule_that_leaves_layouts_keeps_the_memory_advice() -> None:
    """The rule rejects the layouts without VP; those with VP are costed and do not fit: more GPUs, as before."""
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan("llama3.1-405b", "h100-80gb", 16, training={**TRAINING,  # type: ignore[arg-type]
                                                                 "overlap_param_gather_with_optimizer_step": True})
    err = info.value
    assert err.rejections[GATHER] > 0 and err.rejections["OOM"] > 0
    assert err.advice[0].knob == "num_gpus"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("model", "margin"), [("llama3-8b", "79GiB"), ("llama3.1-405b", "100GiB")])
def test_a_margin_of_all_usable_memory_is_refused_before_the_search(model: str, margin: str) -> None:
    """More GPUs cannot help when the margin alone is most of usable memory: --headroom's range refuses it."""
    with pytest.raises(SpecError, match=r"^--headroom: allowed 0-90% or 0-70.28 GiB on h100-80gb"):
        paraplan.plan(model, "h100-80gb", 8, training=TRAINING, headroom=parse_headroom(margin),
                      space={"recompute": ("none", "selective")})  # type: ignore[arg-type]
