"""The search's fit advice is data (``FitTip``): the library words it with its own field names, the CLI with its
flags, from the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

import paraplan
from paraplan.cli import main
from paraplan.cli.render import fit_tip_flags, no_fit_line
from paraplan.errors import NoFeasiblePlanError
from paraplan.headroom import parse_headroom
from paraplan.search import FitTip, SearchSpace, candidate_table, knob_rule_tip
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
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
    assert [t.knob for t in tips] == ["num_gpus", "recompute", "pipeline", "mbs", "gpu_memory"]  # type: ignore[attr-defined]
    more = tips[0]
    assert isinstance(more, FitTip) and more.value is not None and more.ratio is not None
    assert more.value >= 32 and more.value % 8 == 0 and more.value >= 16 * more.ratio  # whole nodes, enough memory
    assert tips[3] == FitTip("mbs", 1)
    assert "--" not in str(err)
    assert str(err).startswith(err.summary + "; what would make it fit: about ")
    assert "SearchSpace.max_pp/pp" in str(err)


def test_the_cli_words_the_same_tips_with_flags(capsys: pytest.CaptureFixture[str]) -> None:
    err = _no_fit(space={"recompute": ("none", "selective"), "max_pp": 2, "mbs": (2, 4)})
    line = no_fit_line(err)
    assert line.startswith(err.summary + "; what would make it fit: ")
    assert f"about {err.advice[0].value:.0f}+ GPUs (--num-gpus;" in line  # type: ignore[attr-defined]
    assert "(--recompute none,selective,full)" in line and "(--max-pp/--pp)" in line and "(--mbs 1)" in line
    code = main(["plan", "-m", "llama3.1-405b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs", "64",
                 "--recompute", "none,selective", "--max-pp", "2", "--mbs", "2,4"])
    assert code == 3
    assert capsys.readouterr().err.strip() == line


@pytest.mark.parametrize("tip", [FitTip("search_space"), FitTip("num_gpus", 64, 3.5), FitTip("recompute"),
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


@pytest.mark.parametrize(("model", "margin", "knobs"), [
    ("llama3-8b", "79GiB", ["headroom"]),  # fits in usable memory, only inside a margin of more than all of it
    ("llama3.1-405b", "100GiB", ["recompute", "gpu_memory"]),  # over usable memory too
])
def test_a_margin_of_all_usable_memory_advises_no_gpu_count(model: str, margin: str, knobs: list[str]) -> None:
    """More GPUs cannot help when the margin alone is more than usable memory (no "-20x the usable memory")."""
    with pytest.raises(NoFeasiblePlanError) as info:
        paraplan.plan(model, "h100-80gb", 8, training=TRAINING, headroom=parse_headroom(margin),
                      space={"recompute": ("none", "selective")})  # type: ignore[arg-type]
    assert [t.knob for t in info.value.advice] == knobs  # type: ignore[attr-defined]
    assert "x the usable memory" not in no_fit_line(info.value)
