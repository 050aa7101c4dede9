"""Search axes are bounded: divisors by factorisation, one-line errors for values no layout can use,
uneven pipeline splits in time linear in the layer count (checked against their brute-force definition)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from paraplan.errors import LayoutError, NoFeasiblePlanError, SpecError
from paraplan.estimate.pipeline import balanced_pipeline_layout, balanced_uneven_split
from paraplan.search import MAX_LAYOUTS, SearchSpace, _divisors, plan
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

GPU = load_gpu("h100-80gb")


@pytest.mark.parametrize("n", [*range(1, 400), 5040, 65536, 720720, 2**31 - 1, 2**31, 2**40, 3 * 2**39])
def test_divisors_are_exactly_the_numbers_that_divide(n: int) -> None:
    divs = _divisors(n)
    assert divs == sorted(set(divs)) and divs[0] == 1 and divs[-1] == n
    assert all(n % d == 0 for d in divs)
    if n < 10**6:
        assert divs == [d for d in range(1, n + 1) if n % d == 0]
    else:  # every divisor pairs with its cofactor; none is missing below sqrt(n) for these n
        assert {n // d for d in divs} == set(divs)


def test_a_world_of_two_billion_gpus_is_answered_quickly() -> None:
    t0 = time.perf_counter()
    with pytest.raises(NoFeasiblePlanError, match="2147483648"):
        plan(load_model("llama3-8b"), make_cluster(GPU, 2**31), TrainingSpec(seq_len=4096, global_batch_size=512))
    assert time.perf_counter() - t0 < 10  # it enumerated 2^31 integers before (minutes)


@pytest.mark.parametrize(("space", "field", "flag"), [
    (SearchSpace(vp=(1, 999_999_999_999)), "vp: 999999999999 is out of range; allowed 1 to 32",
     "--vp: 999999999999 is out of range; allowed 1 to 32"),
    (SearchSpace(pp=(10**30,)), "no layout to search: pp 1000000000000000000000000000000 leaves no TP x PP x CP",
     "no layout to search: --pp 1000000000000000000000000000000 leaves no TP x PP x CP"),
    (SearchSpace(tp=(4, 2**70), cp=(2**63,)),
     "no layout to search: tp 4,1180591620717411303424 cp 9223372036854775808 leaves",
     "no layout to search: --tp 4,1180591620717411303424 --cp 9223372036854775808 leaves"),
    (SearchSpace(tp=(0,)), "tp: 0 is out of range; allowed 1 or more", "--tp: 0 is out of range; allowed 1 or more"),
    (SearchSpace(mbs=(1, 513)), "mbs: 513 is out of range; allowed 1 to 512",
     "--mbs: 513 is out of range; allowed 1 to 512"),
    (SearchSpace(ep=(2**63,)), "ep: 9223372036854775808 is out of range; allowed 1 to 64",
     "--ep: 9223372036854775808 is out of range; allowed 1 to 64"),
    (SearchSpace(max_pp=0), "max_pp: expected a positive integer", "--max-pp: expected a positive integer"),
])
def test_values_no_layout_can_use_are_one_line_errors_naming_the_field(space: SearchSpace, field: str,
                                                                       flag: str) -> None:
    """The library names the SearchSpace field; the CLI words the same error with its flag."""
    from paraplan.cli.render import error_line

    with pytest.raises(SpecError) as exc:
        plan(load_model("llama3-8b"), make_cluster(GPU, 64), TrainingSpec(seq_len=4096, global_batch_size=512),
             space=space)
    assert str(exc.value).startswith(field) and "\n" not in str(exc.value)
    assert error_line(exc.value).startswith(flag) and "\n" not in error_line(exc.value)


def test_a_world_too_large_to_factorise_quickly_is_refused() -> None:
    # the cluster spec refuses it first, with the same bound (MAX_NUM_GPUS = search.MAX_WORLD = 2^40)
    with pytest.raises(SpecError, match=r"^num_gpus must be at most 1,099,511,627,776"):
        plan(load_model("llama3-8b"), make_cluster(GPU, 2**41), TrainingSpec(seq_len=4096, global_batch_size=512))


def test_a_search_space_too_large_is_refused_before_it_is_built() -> None:
    space = SearchSpace(mbs=tuple(range(1, 65)), vp=tuple(range(1, 31)))
    with pytest.raises(SpecError, match=rf"^search space too large: .* at most {MAX_LAYOUTS:,}; narrow"):
        plan(load_model("deepseek-v3"), make_cluster(GPU, 16384), TrainingSpec(seq_len=4096, global_batch_size=8192),
             space=space)


def test_repeated_axis_values_do_not_enumerate_layouts_twice() -> None:
    model, cluster = load_model("llama3-8b"), make_cluster(GPU, 64)
    training = TrainingSpec(seq_len=4096, global_batch_size=512)
    once = plan(model, cluster, training, space=SearchSpace(mbs=(1, 2), vp=(1, 2), recompute=("full",)))
    twice = plan(model, cluster, training, space=SearchSpace(mbs=(1, 2, 1), vp=(2, 1, 2), recompute=("full", "full")))
    assert twice.num_evaluated == once.num_evaluated and twice.rejections == once.rejections


def _brute_uneven_split(num_layers: int, pp: int, vp: int) -> tuple[int, int] | None:
    """The definition: every (F, La), multiples of VP, minimising (load, |F - La|, F + La, F)."""
    if pp < 2:
        return None
    best: tuple[int, int, int, int] | None = None
    for first in range(vp, num_layers + 1, vp):
        for last in range(vp, num_layers - first + 1, vp):
            middle, mid_ranks = num_layers - first - last, pp - 2
            if mid_ranks == 0:
                if middle:
                    continue
                per_mid = 0
            else:
                if middle <= 0 or middle % mid_ranks or (middle // mid_ranks) % vp:
                    continue
                per_mid = middle // mid_ranks
            key = (max(first + 1, last + 1, per_mid), abs(first - last), first + last, first)
            best = key if best is None or key < best else best
    return None if best is None else (best[3], best[2] - best[3])


def test_balanced_uneven_split_finds_the_brute_force_minimum() -> None:
    for num_layers in range(1, 100):
        for pp in range(1, 20):
            for vp in (1, 2, 3, 4, 6):
                assert balanced_uneven_split(num_layers, pp, vp) == _brute_uneven_split(num_layers, pp, vp), \
                    (num_layers, pp, vp)


def _brute_pipeline_layout(num_layers: int, pp: int, vp: int) -> tuple[int, ...] | None:
    n = pp * vp
    base, extra = divmod(num_layers + 2, n)
    counts = [base] * n
    for j in sorted(range(n), key=lambda j: (j in (0, n - 1), abs(j - (n - 1) / 2)))[:extra]:
        counts[j] += 1
    counts[0] -= 1
    counts[-1] -= 1
    return None if min(counts) < 0 else tuple(counts)


def test_balanced_pipeline_layout_gives_extra_layers_to_the_middle_stages_first() -> None:
    for num_layers in range(1, 80):
        for pp in range(1, 24):
            for vp in (1, 2, 3, 5):
                try:
                    got: tuple[int, ...] | None = balanced_pipeline_layout(num_layers, pp, vp)
                except LayoutError:
                    got = None
                assert got == _brute_pipeline_layout(num_layers, pp, vp), (num_layers, pp, vp)


def test_many_layers_are_searched_in_bounded_time() -> None:
    """100,000 layers: the uneven splits of every (PP, VP) come from linear-time formulas."""
    model = replace(load_model("llama3-8b"), num_layers=100_000)
    t0 = time.perf_counter()
    with pytest.raises(NoFeasiblePlanError):
        plan(model, make_cluster(GPU, 5040), TrainingSpec(seq_len=4096, global_batch_size=5040))
    assert time.perf_counter() - t0 < 20


@pytest.mark.parametrize("extra", [["--vp", "999999999999"], ["--ep", "1,99999999999999999999999"],
                                   ["--mbs", "4096"]])
def test_plan_cli_answers_huge_axis_values_with_one_line(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    code = main(["plan", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "4096",
                 "--gbs", "512", *extra])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"{extra[0]}:" in err and "out of range" in err


def test_values_past_the_world_are_dropped_and_small_batches_keep_the_default_micro_batches() -> None:
    """tune steps TP/PP one power past the world; GBS 4 meets the default micro-batches 1, 2, 4, 8."""
    model, cluster = load_model("gpt2"), make_cluster(load_gpu("a100-40gb"), 4)
    training = TrainingSpec(seq_len=1024, global_batch_size=4)
    stepped = plan(model, cluster, training, space=SearchSpace(tp=(2, 4, 8), pp=(1, 2, 4, 8)))
    inside = plan(model, cluster, training, space=SearchSpace(tp=(2, 4), pp=(1, 2, 4)))
    assert stepped.num_evaluated == inside.num_evaluated and stepped.rejections == inside.rejections
    assert stepped.rejections.get("GBS_NOT_DIVISIBLE", 0) > 0  # the mbs 8 rows are still counted


def test_a_model_with_hundreds_of_millions_of_layers_is_a_one_line_error() -> None:
    # the model spec refuses it first (its bound, 100,000, is below the search's own 1,000,000)
    with pytest.raises(SpecError, match=r"^num_layers must be at most 100,000, got 300000000"):
        model = replace(load_model("llama3-8b"), num_layers=300_000_000)
        plan(model, make_cluster(GPU, 64), TrainingSpec(seq_len=4096, global_batch_size=512))


def test_batch_times_world_beyond_int64_is_a_one_line_error() -> None:
    # the largest GBS the training spec takes (2^24) on the largest world the search takes (2^40)
    from paraplan.cli.render import error_line

    with pytest.raises(SpecError, match=r"^global_batch_size: 16,777,216 on 1,099,511,627,776 GPUs is too") as exc:
        plan(load_model("llama3-8b"), make_cluster(GPU, 2**40), TrainingSpec(seq_len=4096, global_batch_size=2**24))
    assert error_line(exc.value).startswith("--gbs: 16,777,216 on 1,099,511,627,776 GPUs is too large")
