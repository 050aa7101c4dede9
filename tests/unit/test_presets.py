"""Built-in model presets: they load, carry their provenance, and reproduce published sizes.

Expected parameter counts are the published Hugging Face safetensors totals where one exists; the
others were recomputed by hand from the dimensions (formulas of megatron-formulas.md section 1
plus biases / position tables) and the comment says so. Counts use the unpadded vocabulary at
TP=1 and ``max_positions`` = the model's ``max_position_embeddings``; MTP blocks are excluded
(``ModelParamCounts.mtp``).
"""

from __future__ import annotations

from importlib import resources

import pytest

from paraplan.estimate.params import ModelParamCounts, model_param_counts
from paraplan.specs.load import load_model_preset, model_preset_names
from paraplan.specs.model import ModelSpec

REQUIRED = (
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "deepseek-v3", "gpt3-175b", "nemotron4-340b",
)


def counts(name: str) -> ModelParamCounts:
    model = load_model_preset(name)
    assert model.max_position_embeddings is not None
    return model_param_counts(model, max_positions=model.max_position_embeddings)


def test_required_presets_are_listed() -> None:
    names = model_preset_names()
    missing = [n for n in REQUIRED if n not in names]
    assert not missing, missing


@pytest.mark.parametrize("name", model_preset_names())
def test_preset_loads_with_provenance(name: str) -> None:
    text = (resources.files("paraplan.specs.presets") / "models" / f"{name}.yaml").read_text(
        encoding="utf-8"
    )
    assert text.startswith("#"), f"{name}.yaml must start with a comment block"
    model = load_model_preset(name)
    assert isinstance(model, ModelSpec)
    assert model.name == name
    assert model.source.strip()
    assert model.max_position_embeddings is not None


# Published HF safetensors totals (exact), unless marked "by hand".
EXACT_TOTALS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    "gpt-neox-20b": 20_554_567_680,
    # by hand: 56 x (attn 88,080,384 + experts 8 x 3 x 6144 x 16384 + router 49,152 + norms
    # 12,288) + 2 x 32000 x 6144 + 6144 (published "141B")
    "mixtral-8x22b": 140_620_634_112,
    # by hand: 80 x (attn 150,994,944 + qkv bias 10,240 + mlp 3 x 8192 x 29568 + norms 16,384)
    # + 2 x 152064 x 8192 + 8192 (published "72.7B")
    "qwen2.5-72b": 72_706_203_648,
    # by hand: 96 x (attn 736,100,352 + mlp 2 x 18432 x 73728 + 2 LayerNorms 73,728)
    # + 2 x 256000 x 18432 + final LayerNorm 36,864 (published "340B")
    "nemotron4-340b": 341_029_195_776,
}


@pytest.mark.parametrize(("name", "expected"), sorted(EXACT_TOTALS.items()))
def test_total_parameters_match_published(name: str, expected: int) -> None:
    assert counts(name).total == expected


def test_dense_models_are_fully_active() -> None:
    for name in ("llama2-7b", "llama3-8b", "qwen2.5-7b", "nemotron4-340b"):
        c = counts(name)
        assert c.active_per_token == c.total
        assert c.mtp == 0


def test_moe_active_parameters() -> None:
    # by hand: 32 x (attn 41,943,040 + 2 experts x 3 x 4096 x 14336 + router 32,768 + norms 8,192)
    # + 2 x 32000 x 4096 + 4096 (Mistral AI: "12.9B active")
    assert counts("mixtral-8x7b").active_per_token == 12_879_925_248
    # Qwen model cards: "3.3B activated", "22B activated"
    assert counts("qwen3-30b-a3b").active_per_token == pytest.approx(3.3e9, rel=0.02)
    assert counts("qwen3-235b-a22b").active_per_token == pytest.approx(22e9, rel=0.02)


def test_deepseek_v3_sizes() -> None:
    c = counts("deepseek-v3")
    # DeepSeek-V3 report: 671B total, 37B activated; the 685B on the Hub adds the 14B MTP module.
    assert c.total == pytest.approx(671e9, rel=0.005)
    assert c.active_per_token == pytest.approx(37e9, rel=0.02)
    # Our MTP block shares the embedding/output head with the main model at PP=1 (~11.6B); the
    # Hub's 14B also stores its own copies of both (2 x 129280 x 7168 = 1.85B).
    assert 11e9 < c.mtp < 14.5e9
    assert c.mtp + 2 * 129280 * 7168 == pytest.approx(14e9, rel=0.05)


def test_deepseek_v3_structure() -> None:
    m = load_model_preset("deepseek-v3")
    assert m.multi_latent_attention
    assert m.num_query_groups is None
    pattern = m.moe_layer_pattern()
    assert pattern[:3] == (False, False, False)
    assert all(pattern[3:]) and len(pattern) == 61
    assert m.mtp_num_layers == 1
    assert m.padded_vocab_size(1) == 129280
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim) == (
        1536, 512, 128, 64, 128,
    )
    assert m.shared_ffn == 2048 and m.moe_ffn == 2048


def test_gpt3_175b_matches_brown_et_al() -> None:
    m = load_model_preset("gpt3-175b")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.head_dim) == (96, 12288, 96, 128)
    assert (m.vocab_size, m.max_position_embeddings, m.ffn) == (50257, 2048, 4 * 12288)
    assert m.position_embedding_type == "learned_absolute"
    assert not m.untie_embeddings_and_output_weights and not m.swiglu and m.add_bias_linear
    assert m.normalization == "LayerNorm"
    assert m.padded_vocab_size(8) == 51200
    assert counts("gpt3-175b").total == pytest.approx(175e9, rel=0.005)


def test_family_flags() -> None:
    qwen3 = load_model_preset("qwen3-30b-a3b")
    assert qwen3.head_dim == 128 != qwen3.hidden_size // qwen3.num_attention_heads
    assert qwen3.qk_layernorm and not qwen3.add_qkv_bias
    qwen25 = load_model_preset("qwen2.5-7b")
    assert qwen25.add_qkv_bias and not qwen25.add_bias_linear and not qwen25.qk_layernorm
    nemo = load_model_preset("nemotron4-340b")
    assert not nemo.swiglu and nemo.normalization == "LayerNorm" and nemo.query_groups == 8
    for name in REQUIRED:
        m = load_model_preset(name)
        if name != "gpt3-175b":
            assert m.untie_embeddings_and_output_weights, name
            assert m.hidden_dropout == 0.0 and m.attention_dropout == 0.0, name
            assert m.position_embedding_type in ("rope", "yarn"), name
            # NVIDIA's scripts choose the divisor so the tokenizer vocabulary is not padded
            assert m.padded_vocab_size(1) == m.vocab_size, name


def test_uncalibrated_gpu_says_so_in_the_estimate() -> None:
    from paraplan.estimator import estimate
    from paraplan.layout import ParallelLayout
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu, load_model, override_gpu
    from paraplan.specs.training import TrainingSpec

    mi300x, h100 = load_gpu("mi300x"), load_gpu("h100-80gb")
    assert not mi300x.efficiency_calibrated and h100.efficiency_calibrated
    assert override_gpu(mi300x, {"efficiency": {"gemm_max_frac": 0.7}}).efficiency_calibrated
    run = [load_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch_size=64), ParallelLayout(dp=8)]
    notes = estimate(run[0], make_cluster(mi300x, 8), run[1], run[2]).notes
    assert any("not calibrated on this GPU" in n for n in notes)
    assert not any("not calibrated" in n for n in estimate(run[0], make_cluster(h100, 8), run[1], run[2]).notes)
