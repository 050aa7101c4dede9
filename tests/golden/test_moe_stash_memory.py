"""Review FIXB (session 8): the rank budget's and the paged stash's memory, check's rank-budget rules, ncclep, and a
stray word on the Megatron command line.

Golden routed-activation bytes by hand, from Megatron-LM d98e8a6 (megatron/core/transformer/moe/): one qwen3-30b-a3b
MoE layer (h 2048, f_e 768, SwiGLU, top-8), seq 4096, mbs 1, TP = ETP = CP = 1, bf16. Per routed token copy the
expert MLP saves the fc1 input 2h, the activation input 2 x 2 f_e, the fc2 input 2 f_e and the fp32 probability 4:
4096 + 3072 + 1536 + 4 = 8708 B; T k = 4096 x 8 = 32768 copies: 285,343,744 B dropless.
- ``--moe-expert-rank-capacity-factor 1.5`` without the stash: HybridEP's output and the grouped MLP are
  padded_num_tokens x topk x 1.5 rows (token_dispatcher.py ``budget``, experts.py ``max_num_tokens``): x 1.5.
- with ``--moe-paged-stash``: the stash is the expected max_num_tokens // 1.5 = T k tokens x
  ``--moe-paged-stash-buffer-size-factor-cuda`` (paged_stash.py ``allocate_stash_buffers``, default 1.10): x 1.1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate import activations as act
from paraplan.estimate.memory import activation_context
from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.check import script_training
from paraplan.launch.megatron import argv, megatron_args
from paraplan.launch.parse import parse_script
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import (
    PAGED_STASH_BUFFER_SIZE_FACTOR_CPU,
    PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA,
    training_knobs,
)
from paraplan.specs.load import load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import NCCLEP_MESSAGE, TrainingSpec

QWEN = load_model("qwen3-30b-a3b")
LAYOUT = ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1)
HYBRID = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
BUDGET = {**HYBRID, "moe_expert_rank_capacity_factor": 1.5, "use_transformer_engine_op_fuser": True}
ROUTED_BYTES = 285_343_744
"""The layer's routed-expert activations, dropless (module docstring)."""


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=64, **kw)  # type: ignore[arg-type]


def _moe_bytes(training: TrainingSpec) -> float:
    return float(act.moe_mlp_bytes(QWEN, activation_context(QWEN, training, LAYOUT)))


@pytest.mark.parametrize(("kw", "factor"), [
    (HYBRID, 1.0),
    (BUDGET, 1.5),
    ({**BUDGET, "moe_paged_stash": True}, 1.1),  # Megatron's default CUDA stash factor
    ({**BUDGET, "moe_paged_stash": True, "moe_paged_stash_buffer_size_factor_cuda": 1.2}, 1.2),  # Bridge's
    ({**BUDGET, "moe_paged_stash": True, "moe_paged_stash_buffer_size_factor_cuda": -1.3}, 1.3),  # actual-max sizing
    ({**BUDGET, "moe_paged_stash": True, "moe_paged_stash_buffer_size_factor_cpu": 1.0}, 1.1),  # host memory only
])
def test_routed_activations_by_hand(kw: dict[str, object], factor: float) -> None:
    dropless = _moe_bytes(_t())
    assert _moe_bytes(_t(**kw)) - dropless == pytest.approx((factor - 1.0) * ROUTED_BYTES, rel=1e-12)


def test_saved_routed_load_cases() -> None:
    assert act.saved_routed_load(0.8, None, False, 1.1) == 0.8  # token drop: the capacity's load
    assert act.saved_routed_load(0.8, 1.5, False, 1.1) == 1.5  # the budget's rows whatever is dropped
    assert act.saved_routed_load(0.8, 1.5, True, -1.2) == 1.2


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.1, 8.0), b=st.floats(0.1, 8.0))
def test_stash_memory_grows_with_its_factor_and_ignores_its_sign(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    stash = {**BUDGET, "moe_paged_stash": True}
    low = _moe_bytes(_t(**stash, moe_paged_stash_buffer_size_factor_cuda=lo))
    assert low <= _moe_bytes(_t(**stash, moe_paged_stash_buffer_size_factor_cuda=hi))
    assert low == _moe_bytes(_t(**stash, moe_paged_stash_buffer_size_factor_cuda=-lo))


MOE_FLAGS = ("--num-layers 4 --hidden-size 2048 --num-attention-heads 32 --seq-length 4096 "
             "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
             "--use-distributed-optimizer --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 "
             "--moe-grouped-gemm --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
             "--moe-expert-rank-capacity-factor 1.5 --moe-paged-stash").split()


def test_stash_factors_and_grouped_tensor_read_and_written_back() -> None:
    flags = read_flags([*MOE_FLAGS, "--moe-use-grouped-tensor", "--moe-paged-stash-buffer-size-factor-cuda", "1.2",
                        "--moe-paged-stash-buffer-size-factor-cpu", "1.0"])
    t = flags.training_fields
    assert (t["moe_use_grouped_tensor"], t["moe_paged_stash_buffer_size_factor_cuda"],
            t["moe_paged_stash_buffer_size_factor_cpu"]) == (True, 1.2, 1.0)
    assert not flags.unknown_flags and not flags.problems
    words = argv(megatron_args(QWEN, LAYOUT, _t(**{**BUDGET, "use_transformer_engine_op_fuser": False},
                                                 moe_use_grouped_tensor=True, moe_paged_stash=True,
                                                 moe_paged_stash_buffer_size_factor_cuda=1.2,
                                                 moe_paged_stash_buffer_size_factor_cpu=1.0)), resolve=True)
    assert words[words.index("--moe-paged-stash-buffer-size-factor-cuda") + 1] == "1.2"
    assert words[words.index("--moe-paged-stash-buffer-size-factor-cpu") + 1] == "1.0"
    assert "--moe-use-grouped-tensor" in words and "--use-transformer-engine-op-fuser" not in words
    default = argv(megatron_args(QWEN, LAYOUT, _t(**BUDGET, moe_paged_stash=True)), resolve=True)
    assert not any(w.startswith("--moe-paged-stash-buffer") for w in default)  # Megatron's defaults: not written


def test_stash_factors_are_ignored_without_the_stash() -> None:
    args = [w for w in MOE_FLAGS if w != "--moe-paged-stash"]
    flags = read_flags([*args, "--use-transformer-engine-op-fuser", "--moe-paged-stash-buffer-size-factor-cuda", "2"])
    assert "moe_paged_stash_buffer_size_factor_cuda" not in flags.training_fields
    assert "--moe-paged-stash-buffer-size-factor-cuda is ignored without --moe-paged-stash" in flags.notes


def test_stash_factor_values_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"^moe_paged_stash_buffer_size_factor_cuda must be a nonzero number"):
        _t(**BUDGET, moe_paged_stash=True, moe_paged_stash_buffer_size_factor_cuda=0.0)
    with pytest.raises(SpecError, match=r"^moe_paged_stash_buffer_size_factor_cpu must be a number"):
        _t(**BUDGET, moe_paged_stash=True, moe_paged_stash_buffer_size_factor_cpu="1")


def test_recipes_with_the_stash_take_bridges_buffer_factors() -> None:
    stash = [r for r in bridge_recipes() if r.get("moe_paged_stash") is True]
    assert stash
    for r in stash:
        knobs = training_knobs(r, "fp8")
        assert (knobs["moe_paged_stash_buffer_size_factor_cuda"], knobs["moe_paged_stash_buffer_size_factor_cpu"]) \
            == (PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA, PAGED_STASH_BUFFER_SIZE_FACTOR_CPU) == (1.2, 1.0)


def test_bridge_target_writes_the_stash_factors() -> None:
    from tests.launch.test_bridge import _knob_spec

    spec = _knob_spec(**BUDGET, moe_paged_stash=True, moe_paged_stash_buffer_size_factor_cuda=1.2)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert (items["model.moe_paged_stash_buffer_size_factor_cuda"],
            items["model.moe_paged_stash_buffer_size_factor_cpu"], items["model.moe_use_grouped_tensor"]) \
        == (1.2, 0.0, False)


# check's rank-budget rules (TransformerConfig.__post_init__ ~1868-1882) -----------------------------------------
def test_grouped_tensor_is_megatrons_alternative_to_the_op_fuser() -> None:
    _t(**HYBRID, moe_expert_rank_capacity_factor=1.5, moe_use_grouped_tensor=True, moe_paged_stash=True)
    with pytest.raises(SpecError, match="requires use_transformer_engine_op_fuser=True or moe_use_grouped_tensor=True"):
        _t(**HYBRID, moe_expert_rank_capacity_factor=1.5)


def test_check_lists_only_rules_true_of_the_script() -> None:
    """Without the op fuser and the grouped tensor one rule is broken; leaving the backend or the budget out to list
    further rules must not add "requires backend 'hybridep'" or "paged stash requires the factor" (both false)."""
    fields = {"seq_len": 4096, "global_batch_size": 64, **HYBRID, "moe_expert_rank_capacity_factor": 1.5,
              "moe_paged_stash": True}
    _, found = script_training(fields)
    assert [m for _, m in found] == [
        "moe_expert_rank_capacity_factor with the 'hybridep' backend requires use_transformer_engine_op_fuser=True "
        "or moe_use_grouped_tensor=True (--use-transformer-engine-op-fuser or --moe-use-grouped-tensor)"]
    training, found = script_training({**fields, "moe_use_grouped_tensor": True})
    assert not found and training.moe_use_grouped_tensor
    _, found = script_training({**fields, "moe_paged_stash": True, "cpu_offloading_num_layers": 2,
                                "use_transformer_engine_op_fuser": True})
    assert [m for _, m in found] == ["moe_paged_stash cannot be enabled with cpu_offloading"]  # unrelated: still listed


def test_ncclep_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as err:
        read_flags([*MOE_FLAGS[:-5], "--moe-flex-dispatcher-backend", "ncclep"])
    assert str(err.value) == NCCLEP_MESSAGE and "\n" not in NCCLEP_MESSAGE
    with pytest.raises(SpecError, match=r"ncclep .* is not modelled by paraplan"):
        _t(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="ncclep")


# a stray word on the Megatron command line ------------------------------------------------------------------------
LINE = "torchrun --nproc-per-node 8 pretrain_gpt.py " + " ".join(MOE_FLAGS[:-5])


def _problems(text: str) -> list[tuple[str, str]]:
    return list(parse_script(text).flags.problems)


def _notes(text: str) -> list[str]:
    return [n for n in parse_script(text).flags.notes if n.startswith("bash -c:")]


def test_bash_c_without_a_name_word_leaves_a_stray_value() -> None:
    """bash makes --tensor-model-parallel-size $0, so "$@" starts with a stray 2: parse_args exits."""
    text = f"bash -c '{LINE} \"$@\"' --tensor-model-parallel-size 2 --overlap-grad-reduce\n"
    assert ("UNRECOGNIZED_ARGUMENTS", "unrecognized arguments: '2' (Megatron-LM's parse_args: a word that is no "
            "flag's value; a bash -c string's $0?)") in _problems(text)
    assert len(_notes(text)) == 1


@pytest.mark.parametrize("text", [
    f"bash -c '{LINE} \"$@\"' -- --tensor-model-parallel-size 2\n",  # "--" is the name word
    f"bash -c '{LINE} \"$0\" \"$@\"' --tensor-model-parallel-size 2\n",  # the string passes $0 itself
    f"bash -c '{LINE} \"$@\"' bash --tensor-model-parallel-size 2\n",
])
def test_no_stray_word_and_no_dollar_0_note_where_nothing_is_lost(text: str) -> None:
    assert not [p for p in _problems(text) if p[0] == "UNRECOGNIZED_ARGUMENTS"]
    assert not _notes(text)
    assert parse_script(text).flags.layout_fields["tp"] == 2


@pytest.mark.parametrize(("line", "stray"), [
    (f"{LINE} --tensor-model-parallel-size 2 4", "'4'"),  # a second word after a one-word flag
    ("torchrun pretrain_gpt.py extra " + " ".join(MOE_FLAGS[:-5]), "'extra'"),  # before the first flag
])
def test_a_stray_word_in_a_plain_script_is_a_broken_rule(line: str, stray: str) -> None:
    assert any(code == "UNRECOGNIZED_ARGUMENTS" and f"unrecognized arguments: {stray}" in m
               for code, m in _problems(line + "\n"))


def test_several_words_where_megatron_takes_several() -> None:
    assert not _problems(f"{LINE} --recompute-granularity selective --recompute-modules core_attn moe_act\n")


def test_check_cli_reports_the_stray_word(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    f = tmp_path / "train.sh"
    f.write_text(f"bash -c '{LINE} \"$@\"' --tensor-model-parallel-size 2\n")
    assert main(["check", str(f), "--gpu", "gb200"]) == 1
    assert "UNRECOGNIZED_ARGUMENTS" in capsys.readouterr().out


# the script's allocator (review FIXB 4) ------------------------------------------------------------------------
def test_check_applies_the_scripts_expandable_segments() -> None:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the script: no fragmentation allowance, said in a note."""
    from paraplan.estimate.memory import MemoryOptions, fragmentation_frac_of
    from paraplan.launch.check import check_parsed
    from paraplan.specs.load import load_gpu

    line = f"{LINE}\n"
    base = check_parsed(parse_script("export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + line), load_gpu("gb200"))
    conf = check_parsed(parse_script("export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                                     "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" + line),
                        load_gpu("gb200"))
    assert base.estimate is not None and conf.estimate is not None, (base.violations, conf.violations)
    frag = fragmentation_frac_of(MemoryOptions())
    assert frag > 0 and conf.estimate.peak_bytes < base.estimate.peak_bytes
    assert any(n.startswith("PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' (the script): expandable segments")
               for n in conf.estimate.notes)
    assert not any(n.startswith("PYTORCH_CUDA_ALLOC_CONF") for n in base.estimate.notes)
    off = check_parsed(parse_script("export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                                    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False\n" + line),
                       load_gpu("gb200"))
    assert off.estimate is not None and off.estimate.peak_bytes == base.estimate.peak_bytes
