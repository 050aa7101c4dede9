"""gpt-oss as it is: sliding-window attention on alternate layers, attention sinks, biases, the clamped QuickGELU GLU.

Goldens by hand from the cited code: Megatron-Core ``transformer/utils.py`` ``is_layer_window_attention`` (which
layers take ``--window-size``), TE ``DotProductAttention`` ``softmax_offset`` (one learnable sink logit per head),
Megatron-Bridge ``GPTOSSBridge.provider_bridge`` (the flags), and OpenAI's model card (116.8B / 5.1B active).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.errors import SpecError
from paraplan.estimate.flops import attention_score_fraction, windowed_score_pairs, windowed_tile_pairs
from paraplan.estimate.params import model_param_counts
from paraplan.estimate.time.layer import attention_layer_time
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.hf import model_from_hf_config
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_args import model_from_megatron_args
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TRAIN = TrainingSpec(seq_len=4096, global_batch_size=256)


def counts(model: ModelSpec) -> tuple[int, int]:
    """(total, active per token without the embedding) as the model card counts them."""
    assert model.max_position_embeddings is not None
    c = model_param_counts(model, max_positions=model.max_position_embeddings)
    return c.total, c.active_per_token - c.embedding


@pytest.mark.parametrize(("name", "total_b", "active_b"), [("gpt-oss-120b", 116.8, 5.1), ("gpt-oss-20b", 20.9, 3.6)])
def test_params_match_the_model_card(name: str, total_b: float, active_b: float) -> None:
    """OpenAI's model card: 116.83B total / 5.13B active (120b), 20.91B / 3.61B (20b). By hand for the 120b:
    36 x (attention 2880 x (4096 + 2 x 512) + 4096 x 2880 + biases 5120 + 2880 + sinks 64 + norms 2 x 2880
    + router 128 x 2880 + 128 + experts 128 x (2880 x 5760 + 5760 + 2880 x 2880 + 2880)) + 2 x 201088 x 2880
    + 2880 = 116,829,156,672."""
    total, active = counts(load_model(name))
    assert abs(total / (total_b * 1e9) - 1) < 0.001
    assert abs(active / (active_b * 1e9) - 1) < 0.01
    if name == "gpt-oss-120b":
        assert total == 116_829_156_672


def test_sinks_add_one_logit_per_head_and_layer() -> None:
    model = load_model("gpt-oss-120b")
    vanilla = replace(model, softmax_type="vanilla")
    assert counts(model)[0] - counts(vanilla)[0] == 36 * 64


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_hf_config_reads_to_the_preset(name: str) -> None:
    hf = model_from_hf_config(json.loads((FIXTURES / f"{name}.json").read_text()), name=name)
    pre = load_model(name)
    for field in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn", "head_dim", "query_groups",
                  "swiglu", "quick_geglu", "add_bias_linear", "add_qkv_bias", "untie_embeddings_and_output_weights",
                  "position_embedding_type", "normalization", "num_experts", "moe_router_topk", "moe_ffn",
                  "window_size", "window_attn_skip_freq", "softmax_type", "glu_linear_offset",
                  "activation_func_clamp_value", "rotary_base", "rotary_scaling_factor", "max_position_embeddings",
                  "moe_router_load_balancing_type", "moe_aux_loss_coeff", "yarn_correction_range_round_to_int"):
        assert getattr(hf, field) == getattr(pre, field), field
    assert counts(hf) == counts(pre)


def test_window_layers_follow_megatron() -> None:
    """``is_layer_window_attention``: layer_number 1-indexed, windowed iff layer_number % N != 0; a list gives 1 for
    windowed; no window_size: none."""
    model = load_model("gpt-oss-120b")
    assert model.window_layer_pattern()[:4] == (True, False, True, False) and sum(model.window_layer_pattern()) == 18
    assert replace(model, window_attn_skip_freq=3).window_layer_pattern()[:3] == (True, True, False)
    assert all(replace(model, window_attn_skip_freq=None).window_layer_pattern())
    assert not any(replace(model, window_size=None).window_layer_pattern())


def test_windowed_score_pairs_by_hand() -> None:
    # s = 8, left 2 (w = 3 keys): queries see 1, 2, 3, 3, 3, 3, 3, 3 keys = 21 = 3*8 - 3*2/2
    assert windowed_score_pairs(8, 2) == 21
    assert windowed_score_pairs(8, -1) == 36 == windowed_score_pairs(8, 100)  # the causal s(s+1)/2
    # gpt-oss-120b at 4096 in 128 x 128 tiles: query tile 0 touches 1 key tile, tiles 1..31 touch 2 (keys
    # q*128-127 .. q*128+127): 63 tiles of the causal 32*33/2 = 528; half the layers windowed
    frac = attention_score_fraction(load_model("gpt-oss-120b"), 4096)
    assert frac == pytest.approx((63 / 528 + 1) / 2)
    assert frac > (516160 / 8388608 + 1) / 2  # more than the exact pairs: whole tiles are computed
    assert attention_score_fraction(load_model("llama3-8b"), 4096) == 1.0


@pytest.mark.parametrize(("s", "left", "tile", "want"), [
    (8, 2, 2, 2 * 2 * (1 + 2 + 2 + 2)),  # 4 query tiles of 2: 1, 2, 2, 2 key tiles
    (8, 2, 4, 4 * 4 * (1 + 2)),  # keys 2..7 for query tile 1: key tiles 0 and 1
    (9, -1, 4, 16 * (1 + 2) + 1 * (2 * 4 + 1)),  # causal, last query tile of 1 row: 2 full key tiles + its 1 x 1
    (8, 0, 4, 2 * 16),  # self only: the diagonal tiles
    (4096, 127, 128, 63 * 128 * 128),
])
def test_windowed_tile_pairs_by_hand(s: int, left: int, tile: int, want: int) -> None:
    assert windowed_tile_pairs(s, left, tile) == want
    assert windowed_tile_pairs(s, left, tile) >= windowed_score_pairs(s, left)  # whole tiles cover the pairs


def test_flash_attention_time_follows_the_window_and_unfused_does_not() -> None:
    model = load_model("gpt-oss-120b")
    full = replace(model, window_size=None)
    cluster = make_cluster(load_gpu("b200"), 8)
    lay = ParallelLayout(ep=8, etp=1, mbs=1, recompute="none")
    t_win = attention_layer_time(model, cluster, TRAIN, lay).attn_fwd_s
    t_full = attention_layer_time(full, cluster, TRAIN, lay).attn_fwd_s
    assert t_win == pytest.approx(t_full * attention_score_fraction(model, 4096))
    unfused = replace(TRAIN, attention_backend="unfused")
    assert attention_layer_time(model, cluster, unfused, lay).attn_fwd_s == pytest.approx(
        attention_layer_time(full, cluster, unfused, lay).attn_fwd_s)


def test_window_never_slows_a_step_nor_changes_flash_memory() -> None:
    model = load_model("gpt-oss-120b")
    cluster = make_cluster(load_gpu("b200"), 64)
    lay = ParallelLayout(ep=8, etp=1, dp=64, mbs=1, sequence_parallel=False)
    win = estimate(model, cluster, TRAIN, lay)
    full = estimate(replace(model, window_size=None), cluster, TRAIN, lay)
    assert win.time.step_s < full.time.step_s
    assert win.peak_bytes == full.peak_bytes


def test_megatron_args_read_the_gpt_oss_flags() -> None:
    model = model_from_megatron_args({
        "num_layers": 4, "hidden_size": 2880, "num_attention_heads": 64, "vocab_size": 201088, "kv_channels": 64,
        "quick_geglu": True, "window_size": "(127, 0)", "window_attn_skip_freq": "[1,0]*2",
        "softmax_type": "learnable", "glu_linear_offset": 1.0, "activation_func_clamp_value": 7.0})
    assert model.swiglu and model.quick_geglu and model.ffn == 4 * 2880  # --quick-geglu keeps Megatron's 4h
    assert model.window_size == (127, 0) and model.window_attn_skip_freq == (1, 0, 1, 0)
    assert model.softmax_type == "learnable"


def test_launch_writes_the_flags_and_check_reads_them_back() -> None:
    from paraplan.launch.megatron import argv, as_launched, flag_pairs, megatron_args
    from paraplan.specs.megatron_flags import read_flags

    model = load_model("gpt-oss-120b")
    lay = ParallelLayout(tp=1, pp=1, ep=8, etp=1)
    pairs = dict(flag_pairs(megatron_args(model, lay, TRAIN)))
    assert {k: pairs.get(k, "MISSING") for k in ("--quick-geglu", "--window-size", "--window-attn-skip-freq",
                                                   "--softmax-type", "--glu-linear-offset",
                                                   "--activation-func-clamp-value",
                                                   "--no-yarn-correction-range-round-to-int")} == {
        "--quick-geglu": None, "--window-size": "127,0", "--window-attn-skip-freq": "2", "--softmax-type": "learnable",
        "--glu-linear-offset": "1.0", "--activation-func-clamp-value": "7.0",
        "--no-yarn-correction-range-round-to-int": None}  # GPTOSSBridge.provider_bridge: False
    assert "--swiglu" not in pairs and "--disable-bias-linear" not in pairs  # Megatron asserts not both
    got = read_flags(argv(megatron_args(model, lay, TRAIN))).model
    want, _ = as_launched(model, lay, TRAIN)
    for field in ("quick_geglu", "swiglu", "window_size", "window_attn_skip_freq", "softmax_type", "glu_linear_offset",
                  "activation_func_clamp_value", "add_bias_linear", "ffn", "yarn_correction_range_round_to_int"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.yarn_correction_range_round_to_int is False
    llama = load_model("llama3-8b")  # Megatron's default True: no switch written, True read back
    assert "--no-yarn-correction-range-round-to-int" not in dict(flag_pairs(megatron_args(llama, lay, TRAIN)))
    assert read_flags(argv(megatron_args(llama, lay, TRAIN))).model.yarn_correction_range_round_to_int is True


@pytest.mark.parametrize(("fields", "message"), [
    ({"window_size": "127"}, "window_size: expected two integers"),
    ({"window_size": (-2, 0)}, "window_size must be two integers"),
    ({"window_size": (127, 0), "window_attn_skip_freq": 0}, "window_attn_skip_freq must be in [1,"),
    ({"window_size": (127, 0), "window_attn_skip_freq": "[1,0]*3"}, "window_attn_skip_freq pattern must be 4"),
    ({"softmax_type": "sink"}, "softmax_type must be one of vanilla, off-by-one, learnable"),
    ({"quick_geglu": True, "swiglu": False}, "quick_geglu needs swiglu"),
])
def test_bad_values_name_the_field_in_one_line(fields: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}
    with pytest.raises(SpecError) as err:
        model_from_megatron_args({**base, **fields})
    assert message in str(err.value) and "\n" not in str(err.value)
