"""``--headroom``'s range depends on the GPU: a margin over 90% of its usable memory is refused in GiB and in %
alike, by every command that takes the option, with one line that names the option and the range for that GPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.headroom import MAX_HEADROOM_FRAC
from paraplan.specs.load import load_gpu
from paraplan.units import GIB

FIXTURES = Path(__file__).resolve().parents[1] / "launch" / "fixtures"
JOB = ["-m", "llama3-8b", "-g", "h100-80gb", "-n", "8", "-s", "4096", "--gbs", "64"]


def _expected(gpu: str, given: str) -> str:
    usable = load_gpu(gpu).usable_bytes
    return (f"error: --headroom: allowed 0-90% or 0-{math.floor(100 * MAX_HEADROOM_FRAC * usable / GIB) / 100:.2f} GiB "
            f"on {gpu} (90% of its {usable / GIB:.2f} GiB usable memory), got {given!r}")


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "estimate": ["estimate", *JOB, "--tp", "1"],
        "plan": ["plan", *JOB],
        "explain": ["explain", *JOB],
        "check": ["check", str(FIXTURES / "train_llama3_8b_h100_fp8.sh"), "-g", "h100-80gb"],
        "budget": ["budget", "-m", "llama3-8b", "-t", "1T", "-g", "h100-80gb", "-n", "8"],
        "report": ["report", *JOB, "-o", str(tmp_path / "r.html")],
    }


@pytest.mark.parametrize("command", ["estimate", "plan", "explain", "check", "budget", "report"])
@pytest.mark.parametrize("given", ["80GiB", "99%", "71GiB", "200%"])
def test_a_margin_over_90_percent_of_usable_is_refused_alike_in_gib_and_percent(
        command: str, given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*_commands(tmp_path)[command], "--headroom", given])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.strip() == _expected("h100-80gb", given)
    assert not (tmp_path / "r.html").exists()


def test_the_range_is_computed_for_the_gpu_given(capsys: pytest.CaptureFixture[str]) -> None:
    """80 GiB is most of an H100 but a modest margin on a B200: refused on one, accepted on the other."""
    base = ["estimate", "-m", "llama3-8b", "-n", "8", "-s", "4096", "--gbs", "64", "--tp", "1", "--headroom", "80GiB"]
    assert main([*base, "-g", "h100-80gb"]) == 1
    assert capsys.readouterr().err.strip() == _expected("h100-80gb", "80GiB")
    assert main([*base, "-g", "b200", "--format", "json"]) == 0
    assert main([*base, "-g", "a100-40gb"]) == 1
    assert capsys.readouterr().err.strip().endswith("got '80GiB'")


@pytest.mark.parametrize("given", ["90%", "70GiB"])
def test_the_top_of_the_range_is_accepted(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", *JOB, "--tp", "1", "--headroom", given, "--format", "json"])
    assert code == 0 and capsys.readouterr().err == ""


def test_the_help_states_the_range() -> None:
    from paraplan.cli.options import HeadroomOpt

    assert f"at most {100 * MAX_HEADROOM_FRAC:.0f}% of the GPU's usable memory" in str(HeadroomOpt.help)


def test_the_default_band_margin_is_never_refused_as_a_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    """On a GPU with almost no usable memory the memory band's own margin is over 90% of it: that is not a --headroom
    the user gave, so the search runs and says nothing fits (exit 3) instead of blaming --headroom."""
    from paraplan.headroom import band_headroom

    band_headroom("dense").check_range(0.1 * GIB, "tiny")  # no error
    code = main(["plan", *JOB, "--gpu-set", "hbm_gib=1.6"])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("no layout of llama3-8b fits") and "--headroom:" not in err


def test_the_limit_shown_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """The limit in the refusal is rounded down, so the value it shows is accepted; 70.3GiB (over 90% of the H100's
    78.1 GiB usable, 70.29 GiB) is refused naming 70.28."""
    assert main(["estimate", *JOB, "--tp", "1", "--headroom", "70.3GiB"]) == 1
    err = capsys.readouterr().err
    shown = err.split("0-90% or 0-")[1].split(" GiB")[0]
    assert shown == "70.28"
    assert main(["estimate", *JOB, "--tp", "1", "--headroom", f"{shown}GiB", "--format", "json"]) in (0, 4)
    assert "--headroom" not in capsys.readouterr().err


def test_a_tiny_gpu_shows_two_decimals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *JOB, "--tp", "1", "--gpu-set", "hbm_gib=2", "--headroom", "95%"]) == 1
    err = capsys.readouterr().err.strip()
    usable = float(err.split("of its ")[1].split(" GiB")[0])
    limit = float(err.split("0-90% or 0-")[1].split(" GiB")[0])
    assert limit <= 0.9 * usable + 0.005 and limit > 0.9 * usable - 0.02 and usable < 1  # not "0-0.5 (90% of 0.5)"


@pytest.mark.parametrize("given", ["1e9GiB", "1E3%", "2.5e2GiB"])
def test_an_exponent_is_a_number_refused_by_range(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by its range (the value as read, e.g. 1e+09GiB), not as a malformed size."""
    assert main(["estimate", *JOB, "--tp", "1", "--headroom", given]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(_expected("h100-80gb", "").removesuffix("got ''")) and "expected" not in err


def test_headroom_is_echoed_as_the_user_wrote_it() -> None:
    """The error names the value as typed (1e9GiB), not a normalised float (1e+09GiB)."""
    from paraplan.errors import SpecError
    from paraplan.headroom import parse_headroom

    with pytest.raises(SpecError, match=r"got '1e9GiB'$"):
        parse_headroom("1e9GiB").check_range(78.1 * 2**30, "h100-80gb")
