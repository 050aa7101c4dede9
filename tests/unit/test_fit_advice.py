"""The search's fit advice is data (``FitTip``): the library words it with its own field names, the CLI with its
flags, from the same numbers."""

from __future__ import annotations

import pytest

import paraplan
from paraplan.cli import main
from paraplan.cli.render import fit_tip_flags, no_fit_line
from paraplan.errors import NoFeasiblePlanError
from paraplan.search import FitTip
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
                                 FitTip("pipeline"), FitTip("mbs", 1), FitTip("gpu_memory", 200 * GIB)])
def test_every_knob_has_both_wordings(tip: FitTip) -> None:
    lib, cli = tip.describe(), fit_tip_flags(tip)
    assert lib and cli and "--" not in lib
    assert ("--" in cli) == (tip.knob != "gpu_memory")
