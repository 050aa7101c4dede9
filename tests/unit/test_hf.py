"""Hugging Face config.json -> ModelSpec (paraplan.specs.hf) vs the presets and published sizes.

Fixtures in tests/fixtures/hf are the config.json files as published on the Hub (real keys only).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from paraplan.errors import SpecError
from paraplan.estimate.params import model_param_counts
from paraplan.specs.hf import SUPPORTED_MODEL_TYPES, model_from_hf_config, vocab_divisor
from paraplan.specs.load import load_model, load_model_preset
from paraplan.specs.model import ModelSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def fixture(name: str) -> dict[str, Any]:
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def hf_model(name: str) -> ModelSpec:
    return model_from_hf_config(fixture(name), name=name)


def total(model: ModelSpec) -> int:
    assert model.max_position_embeddings is not None
    return model_param_counts(model, max_positions=model.max_position_embeddings).total


ALL_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_loads(name: str) -> None:
    data = fixture(name)
    assert data["model_type"] in SUPPORTED_MODEL_TYPES
    model = hf_model(name)
    assert model.name == name
    assert "config.json" in model.source
    # the checkpoint's embedding has exactly vocab_size rows: no padding at TP=1
    assert model.padded_vocab_size(1) == model.vocab_size


def test_required_fixtures_present() -> None:
    for name in ("Llama-2-7b-hf", "Meta-Llama-3-8B", "Mixtral-8x7B-v0.1", "Qwen2.5-7B",
                 "Qwen3-30B-A3B", "Qwen1.5-MoE-A2.7B", "DeepSeek-V3", "gpt2", "gpt-neox-20b",
                 "Mistral-7B-v0.1"):
        assert name in ALL_FIXTURES, name


# ------------------------------------------------------------------ same dimensions as the presets
PAIRS = [
    ("Llama-2-7b-hf", "llama2-7b"),
    ("Meta-Llama-3-8B", "llama3-8b"),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("Qwen2.5-7B", "qwen2.5-7b"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("DeepSeek-V3", "deepseek-v3"),
    ("gpt2", "gpt2"),
    ("gpt-neox-20b", "gpt-neox-20b"),
]

SAME_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn", "head_dim",
    "query_groups", "swiglu", "untie_embeddings_and_output_weights", "add_bias_linear",
    "add_qkv_bias", "qk_layernorm", "position_embedding_type", "normalization", "hidden_dropout",
    "attention_dropout", "num_experts", "moe_router_topk", "moe_ffn", "shared_ffn",
    "moe_shared_expert_gate", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers",
)


@pytest.mark.parametrize(("hf_name", "preset"), PAIRS)
def test_fixture_matches_preset(hf_name: str, preset: str) -> None:
    hf, pre = hf_model(hf_name), load_model_preset(preset)
    for field in SAME_FIELDS:
        assert getattr(hf, field) == getattr(pre, field), field
    assert hf.moe_layer_pattern() == pre.moe_layer_pattern()
    if hf_name == "Qwen2.5-7B":
        # base config.json says 131072 (YaRN); the preset keeps the native 32768 of NVIDIA's script
        assert (hf.max_position_embeddings, pre.max_position_embeddings) == (131072, 32768)
    else:
        assert hf.max_position_embeddings == pre.max_position_embeddings
    if preset == "gpt2":
        # Megatron pads GPT-2's BPE vocab (128 -> 50304); the HF checkpoint has 50257 rows
        assert (hf.padded_vocab_size(1), pre.padded_vocab_size(1)) == (50257, 50304)
    else:
        assert hf.padded_vocab_size(1) == pre.padded_vocab_size(1)
        assert total(hf) == total(pre)


# ------------------------------------------------------------------ published sizes
HF_TOTALS = {
    "Llama-2-7b-hf": 6_738_415_616,
    "Meta-Llama-3-8B": 8_030_261_248,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen2.5-7B": 7_615_616_512,
    "Qwen3-8B": 8_190_735_360,
    "Qwen3-30B-A3B": 30_532_122_624,
    "gpt2": 124_439_808,
    "gpt-neox-20b": 20_554_567_680,
    # by hand: 24 x (attn 4 x 2048^2 + qkv bias 6144 + experts 60 x 3 x 2048 x 1408 + shared
    # 3 x 2048 x 5632 + shared gate 2048 + router 60 x 2048 + norms 4096) + 2 x 151936 x 2048
    # + 2048 (model card: "14.3B")
    "Qwen1.5-MoE-A2.7B": 14_315_784_192,
}


@pytest.mark.parametrize(("name", "expected"), sorted(HF_TOTALS.items()))
def test_hf_total_matches_published(name: str, expected: int) -> None:
    assert total(hf_model(name)) == expected


def test_qwen2_moe_mapping() -> None:
    m = hf_model("Qwen1.5-MoE-A2.7B")
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn, m.shared_ffn) == (60, 4, 1408, 5632)
    assert m.moe_shared_expert_gate and m.add_qkv_bias and not m.add_bias_linear
    assert m.query_groups == 16 and m.num_query_groups is None  # MHA: GQA flag omitted
    assert all(m.moe_layer_pattern())
    assert m.max_position_embeddings is not None
    active = model_param_counts(m, max_positions=m.max_position_embeddings).active_per_token
    assert active == pytest.approx(2.7e9, rel=0.02)  # model card: "2.7B activated"


def test_qwen3_dense_mapping() -> None:
    m = hf_model("Qwen3-8B")
    assert m.kv_channels == 128 and m.qk_layernorm and not m.add_qkv_bias
    assert m.query_groups == 8 and m.normalization == "RMSNorm" and m.swiglu


def test_mistral_and_neox_mapping() -> None:
    mistral = hf_model("Mistral-7B-v0.1")
    assert mistral.query_groups == 8 and mistral.untie_embeddings_and_output_weights
    assert mistral.position_embedding_type == "rope" and not mistral.add_qkv_bias
    neox = hf_model("gpt-neox-20b")
    assert neox.normalization == "LayerNorm" and neox.add_bias_linear and not neox.swiglu
    assert neox.position_embedding_type == "rope" and neox.untie_embeddings_and_output_weights
    gpt2 = hf_model("gpt2")
    assert gpt2.position_embedding_type == "learned_absolute"
    assert not gpt2.untie_embeddings_and_output_weights
    assert (gpt2.hidden_dropout, gpt2.attention_dropout) == (0.1, 0.1)
    assert gpt2.make_vocab_size_divisible_by == 1


def test_deepseek_mapping() -> None:
    m = hf_model("DeepSeek-V3")
    assert m.multi_latent_attention and m.num_query_groups is None
    assert m.position_embedding_type == "yarn"
    assert m.moe_layer_pattern() == (False,) * 3 + (True,) * 58
    assert m.mtp_num_layers == 1 and m.qk_layernorm


# ------------------------------------------------------------------ aliases and layer patterns
def test_aliases() -> None:
    gpt2 = fixture("gpt2")
    renamed = {k: v for k, v in gpt2.items() if k not in ("n_embd", "n_layer", "n_head")}
    renamed.update(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
    assert model_from_hf_config(renamed, name="gpt2") == hf_model("gpt2")

    qwen = fixture("Qwen3-30B-A3B")
    qwen["num_local_experts"] = qwen.pop("num_experts")  # transformers 5 spelling
    assert model_from_hf_config(qwen, name="Qwen3-30B-A3B") == hf_model("Qwen3-30B-A3B")

    ds = fixture("DeepSeek-V3")
    ds["num_mtp_layers"] = ds.pop("num_nextn_predict_layers")
    yarn = {k: v for k, v in ds.pop("rope_scaling").items() if k != "type"}
    ds["rope_parameters"] = {"rope_type": "yarn", "rope_theta": ds.pop("rope_theta"), **yarn}
    assert model_from_hf_config(ds, name="DeepSeek-V3") == hf_model("DeepSeek-V3")


def test_defaults_when_keys_absent() -> None:
    llama = fixture("Llama-2-7b-hf")
    del llama["tie_word_embeddings"], llama["num_key_value_heads"]
    m = model_from_hf_config(llama)
    assert m.untie_embeddings_and_output_weights and m.query_groups == 32
    assert m.name == "hf-model"
    gpt2 = fixture("gpt2")
    assert "n_inner" not in gpt2
    assert model_from_hf_config(gpt2).ffn == 4 * 768


def test_qwen_moe_sparse_step_and_mlp_only_layers() -> None:
    data = fixture("Qwen3-30B-A3B")
    data.update(decoder_sparse_step=2, mlp_only_layers=[1, 47])
    pattern = model_from_hf_config(data).moe_layer_pattern()
    # HF: layer i is sparse iff i not in mlp_only_layers and (i + 1) % step == 0
    expected = tuple(i not in (1, 47) and (i + 1) % 2 == 0 for i in range(48))
    assert pattern == expected
    assert pattern[1] is False and pattern[3] is True


def test_deepseek_first_k_dense() -> None:
    data = fixture("DeepSeek-V3")
    data["first_k_dense_replace"] = 5
    assert model_from_hf_config(data).moe_layer_pattern() == (False,) * 5 + (True,) * 56


def test_vocab_divisor() -> None:
    assert vocab_divisor(32000) == 128
    assert vocab_divisor(129280) == 128
    assert vocab_divisor(50257) == 1
    assert vocab_divisor(50432) == 128
    assert vocab_divisor(32002) == 2


def test_load_model_dispatches_hf(tmp_path: Path) -> None:
    path = tmp_path / "my-llama.json"
    path.write_text(json.dumps(fixture("Meta-Llama-3-8B")), encoding="utf-8")
    expected = model_from_hf_config(fixture("Meta-Llama-3-8B"), name="my-llama")
    assert load_model(str(path)) == expected


# ------------------------------------------------------------------ errors name the field
def _llama(**changes: Any) -> dict[str, Any]:
    data = fixture("Meta-Llama-3-8B")
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


BAD = [
    (_llama(model_type="bert"), "unsupported model_type 'bert' (supported: deepseek_v3"),
    (_llama(model_type=...), "missing field 'model_type'"),
    (_llama(hidden_size=...), "missing field 'hidden_size'"),
    (_llama(intermediate_size=...), "missing field 'intermediate_size'"),
    (_llama(num_hidden_layers=-3),
     "field 'num_hidden_layers' must be a positive integer, got -3"),
    (_llama(vocab_size="128256"), "field 'vocab_size' must be a positive integer, got '128256'"),
    (_llama(num_attention_heads=True), "field 'num_attention_heads' must be a positive integer"),
    (_llama(num_key_value_heads=5), "field 'num_key_value_heads' (5) must divide"),
    (_llama(hidden_size=4095), "field 'hidden_size' (4095) must be divisible"),
    (_llama(head_dim=0), "field 'head_dim' must be a positive integer, got 0"),
    (_llama(hidden_act="gelu"), "field 'hidden_act' 'gelu' is not supported"),
    (_llama(tie_word_embeddings="no"), "field 'tie_word_embeddings' must be true or false"),
    (_llama(attention_dropout=1.5), "field 'attention_dropout' must be a number in [0, 1)"),
    (_llama(mlp_bias=True), "field 'mlp_bias'"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_inputs_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match="^config.json: " + re.escape(message)):
        model_from_hf_config(data)


def test_bad_moe_inputs() -> None:
    qwen = fixture("Qwen3-30B-A3B")
    qwen["num_experts_per_tok"] = 200
    with pytest.raises(SpecError, match=re.escape("field 'num_experts_per_tok' (200) must be <=")):
        model_from_hf_config(qwen)
    qwen = fixture("Qwen3-30B-A3B")
    del qwen["num_experts"]
    with pytest.raises(SpecError, match=re.escape("missing field 'num_experts'")):
        model_from_hf_config(qwen)
    qwen = fixture("Qwen3-30B-A3B")
    qwen["mlp_only_layers"] = "0,1"
    with pytest.raises(SpecError, match=re.escape("field 'mlp_only_layers' must be a list")):
        model_from_hf_config(qwen)
    ds = fixture("DeepSeek-V3")
    ds["first_k_dense_replace"] = -1
    with pytest.raises(SpecError, match=re.escape("field 'first_k_dense_replace' must be an "
                                                  "integer >= 0, got -1")):
        model_from_hf_config(ds)
    ds = fixture("DeepSeek-V3")
    del ds["kv_lora_rank"]
    with pytest.raises(SpecError, match=re.escape("missing field 'kv_lora_rank'")):
        model_from_hf_config(ds)


def test_error_is_one_line() -> None:
    with pytest.raises(SpecError) as info:
        model_from_hf_config(_llama(model_type="bert"))
    assert "\n" not in str(info.value)


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match=r"^config\.json: expected a JSON object"):
        model_from_hf_config([1, 2])  # type: ignore[arg-type]


def test_recipe_fields_from_config_json() -> None:
    """The fields that decide what is trained (ecosystem.md 3.1): RoPE base and scaling, norm
    epsilon, router auxiliary loss and DeepSeek's router options."""
    llama = hf_model("Meta-Llama-3-8B")
    assert (llama.rotary_base, llama.norm_epsilon, llama.use_rope_scaling) == (500000, 1e-5, False)
    cfg = fixture("Meta-Llama-3-8B")
    cfg["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    scaled = model_from_hf_config(cfg)
    assert scaled.use_rope_scaling and scaled.rope_scaling_factor == 8.0
    assert hf_model("Mixtral-8x7B-v0.1").moe_aux_loss_coeff == 0.02
    assert hf_model("gpt-neox-20b").rotary_percent == 0.25
    ds = hf_model("DeepSeek-V3")
    assert (ds.rotary_scaling_factor, ds.mscale, ds.mscale_all_dim) == (40.0, 1.0, 1.0)
    assert (ds.moe_router_score_function, ds.moe_router_num_groups, ds.moe_router_group_topk) == ("sigmoid", 8, 4)
    assert ds.moe_router_topk_scaling_factor == 2.5 and ds.moe_router_enable_expert_bias
    assert ds.moe_router_load_balancing_type == "seq_aux_loss" and ds.moe_aux_loss_coeff == 0.001
