"""Hugging Face ``config.json`` -> ModelSpec.

The mapping follows ../shared/reference/ecosystem.md section 3 (3.1 field mapping, 3.2 family
recipes), which restates NVIDIA's own mapping in Megatron-Bridge
(``src/megatron/bridge/models/conversion/model_bridge.py``, ``CONFIG_MAPPING``, and the per-family
bridges) as Megatron-LM arguments. We build a dict keyed by Megatron-LM argument names and hand
it to :func:`paraplan.specs.megatron_args.model_from_megatron_args`, so presets, Megatron-args files and
HF configs are validated by the same code.

Supported ``model_type``: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe,
deepseek_v3, gpt2, gpt_neox, gpt_oss.

Mapping in short:
  * ``num_hidden_layers``/``hidden_size``/``num_attention_heads``/``intermediate_size``/
    ``vocab_size``/``max_position_embeddings`` (GPT-2: ``n_layer``/``n_embd``/``n_head``/
    ``n_inner``/``n_positions``) -> the dimensions; ``num_key_value_heads`` -> ``num_query_groups``
    (omitted when equal to the heads, never with MLA); ``head_dim`` -> ``kv_channels``.
  * Gated families (Llama, Mistral, Mixtral, Qwen, DeepSeek): ``hidden_act: silu`` -> SwiGLU,
    RMSNorm, no linear biases, RoPE; ``tie_word_embeddings`` (default false) decides untying.
    Qwen2/Qwen2-MoE have an implicit QKV bias, others take ``attention_bias``; Qwen3 and
    DeepSeek-V3 get ``qk_layernorm``. ``rope_scaling``/``rope_parameters`` of type yarn -> "yarn".
  * GPT-2: LayerNorm, GeLU, biases, learned positions, tied (Megatron's defaults); GPT-NeoX:
    LayerNorm, GeLU, biases, RoPE (``rotary_pct`` -> ``rotary_percent``), untied. NeoX's
    ``use_parallel_residual`` has no Megatron-LM flag (parameter counts are unaffected).
  * MoE: ``num_local_experts``/``num_experts``/``n_routed_experts`` -> ``num_experts``,
    ``num_experts_per_tok`` -> ``moe_router_topk``, ``moe_intermediate_size`` ->
    ``moe_ffn_hidden_size`` (Mixtral: ``intermediate_size``), shared experts
    (``shared_expert_intermediate_size`` with its sigmoid gate, or
    ``n_shared_experts * moe_intermediate_size``), and the layer pattern from
    ``first_k_dense_replace`` (DeepSeek) or ``decoder_sparse_step``/``mlp_only_layers`` (Qwen MoE:
    layer i is sparse iff i not in mlp_only_layers and (i+1) % step == 0) -> ``moe_layer_freq``.
  * MLA: ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim`` -> ``qk_head_dim``,
    ``qk_rope_head_dim`` -> ``qk_pos_emb_head_dim``, ``v_head_dim``;
    ``num_nextn_predict_layers`` -> ``mtp_num_layers``.
  * Recipe (no size effect; emitted by ``launch``): ``rms_norm_eps``/``layer_norm_eps`` ->
    ``norm_epsilon``, ``rope_theta`` -> ``rotary_base``, llama3/yarn ``rope_scaling``, router
    auxiliary loss and DeepSeek's router options (``_rope_scaling``, ``_router``).
  * gpt-oss (``_gpt_oss``, as Megatron-Bridge's ``GPTOSSBridge.provider_bridge`` maps it): MoE with
    ``num_local_experts`` experts of width ``intermediate_size``, biases on every linear layer
    (``add_bias_linear``), the clamped QuickGELU GLU (``--quick-geglu``, ``glu_linear_offset`` 1,
    ``activation_func_clamp_value`` = ``swiglu_limit``), learnable softmax (attention sinks), sliding-window
    attention ``--window-size (sliding_window - 1, 0)`` on the ``layer_types`` "sliding_attention" layers
    (``window_attn_skip_freq`` 2 when they alternate), YaRN RoPE, no load-balancing loss.
  * ``make_vocab_size_divisible_by``: the largest power of two <= 128 dividing ``vocab_size``
    (as Megatron-Bridge does), so the checkpoint's embedding is not padded at TP=1.
  * Dropout: ``attention_dropout``/``hidden_dropout`` when present (GPT-2: ``attn_pdrop``/
    ``resid_pdrop``), otherwise 0.0 (HF models train without dropout).

Errors are ``SpecError`` with one line naming the config.json field.
"""

from __future__ import annotations

from typing import Any

from paraplan.errors import SpecError
from paraplan.fileio import brief
from paraplan.specs.megatron_args import model_from_megatron_args
from paraplan.specs.model import ModelSpec, windowed_every

_PREFIX = "config.json: "

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_v3", "gpt2", "gpt_neox", "gpt_oss", "llama", "mistral", "mixtral",
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
)
"""``model_type`` values :func:`model_from_hf_config` understands."""

_GATED = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss"}
)
_GATED_ACTS = frozenset({"silu", "swish"})
_PLAIN_ACTS = frozenset(
    {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu", "relu"}
)
_IMPLICIT_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "deepseek_v3"})
_TIED_BY_DEFAULT = frozenset({"gpt2"})

# Alternative spellings, first match wins (GPT-2 attribute_map, transformers 5.x aliases).
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token"),
    "num_nextn_predict_layers": ("num_nextn_predict_layers", "num_mtp_layers"),
}


def _fail(message: str) -> SpecError:
    return SpecError(_PREFIX + message)


def _lookup(data: dict[str, Any], field: str) -> tuple[str, Any]:
    """(key found, value) for a field or its aliases; value None when absent or null."""
    for key in _ALIASES.get(field, (field,)):
        if data.get(key) is not None:
            return key, data[key]
    return field, None


def _opt(data: dict[str, Any], field: str, *, minimum: int = 1) -> int | None:
    """An integer field >= minimum (1 = positive), or None when absent."""
    key, value = _lookup(data, field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise _fail(f"field '{key}' must be {kind}, got {brief(value)}")
    return value


def _req(data: dict[str, Any], field: str) -> int:
    """A required positive integer field."""
    value = _opt(data, field)
    if value is None:
        raise _fail(f"missing field '{field}'")
    return value


def _int(data: dict[str, Any], field: str, default: int, *, minimum: int = 1) -> int:
    """An integer field >= minimum with a default."""
    value = _opt(data, field, minimum=minimum)
    return default if value is None else value


def _bool(data: dict[str, Any], field: str, default: bool) -> bool:
    value = data.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(f"field '{field}' must be true or false, got {brief(value)}")
    return value


def _float(data: dict[str, Any], field: str, default: float) -> float:
    value = data.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise _fail(f"field '{field}' must be a number in [0, 1), got {brief(value)}")
    return float(value)


def vocab_divisor(vocab_size: int) -> int:
    """Largest power of two <= 128 dividing the vocabulary (Megatron-Bridge's choice)."""
    base = 128
    while vocab_size % base:
        base //= 2
    return base


def _rope_type(data: dict[str, Any]) -> str | None:
    for key in ("rope_parameters", "rope_scaling"):
        block = data.get(key)
        if isinstance(block, dict):
            kind = block.get("rope_type", block.get("type"))
            if kind is not None:
                return str(kind)
    return None


def _rope_theta(data: dict[str, Any]) -> Any:
    params = data.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return params["rope_theta"]
    return data.get("rope_theta")


def _rope_block(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("rope_parameters", "rope_scaling"):
        block = data.get(key)
        if isinstance(block, dict) and block.get("rope_type", block.get("type")) not in (None, "default"):
            return block
    return {}


def _rope_scaling(data: dict[str, Any]) -> dict[str, Any]:
    """``rope_scaling``/``rope_parameters``: llama3 -> ``--use-rope-scaling --rope-scaling-factor f``;
    yarn -> ``--rotary-scaling-factor f --mscale --mscale-all-dim`` (ecosystem.md 3.1)."""
    block = _rope_block(data)
    kind = block.get("rope_type", block.get("type"))
    if kind == "llama3":
        return {"use_rope_scaling": True, "rope_scaling_factor": block.get("factor", 8.0)}
    if kind == "yarn":
        return {"rotary_scaling_factor": block.get("factor", 1.0), "mscale": block.get("mscale", 1.0),
                "mscale_all_dim": block.get("mscale_all_dim", 0.0)}
    return {}


def _router(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Router recipe: ``router_aux_loss_coef``/``aux_loss_alpha`` -> ``moe_aux_loss_coeff``; DeepSeek's
    ``scoring_func``, ``n_group``/``topk_group``, ``routed_scaling_factor``, ``topk_method: noaux_tc``
    (expert bias), ``seq_aux`` and NVIDIA's ``--moe-router-pre-softmax`` (ecosystem.md 3.1-3.2)."""
    out: dict[str, Any] = {"moe_aux_loss_coeff": data.get("router_aux_loss_coef", data.get("aux_loss_alpha"))}
    if model_type != "deepseek_v3":
        return out
    out.update({
        "moe_router_score_function": data.get("scoring_func"),
        "moe_router_num_groups": data.get("n_group"),
        "moe_router_group_topk": data.get("topk_group"),
        "moe_router_topk_scaling_factor": data.get("routed_scaling_factor"),
        "moe_router_enable_expert_bias": data.get("topk_method") == "noaux_tc",
        "moe_router_load_balancing_type": "seq_aux_loss" if data.get("seq_aux") else None,
        "moe_router_pre_softmax": True,
    })
    return out


def _dimensions(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Layers, widths, heads, vocabulary and positions."""
    hidden = _req(data, "hidden_size")
    heads = _req(data, "num_attention_heads")
    vocab = _req(data, "vocab_size")
    out: dict[str, Any] = {
        "num_layers": _req(data, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": vocab,
        "make_vocab_size_divisible_by": vocab_divisor(vocab),
    }
    ffn = _opt(data, "intermediate_size")
    if ffn is None and model_type != "gpt2":
        raise _fail("missing field 'intermediate_size'")
    out["ffn_hidden_size"] = ffn if ffn is not None else 4 * hidden
    max_pos = _opt(data, "max_position_embeddings")
    if max_pos is not None:
        out["max_position_embeddings"] = max_pos
    if model_type == "deepseek_v3":
        return out  # MLA: no GQA, no head_dim
    kv_heads = _opt(data, "num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        if heads % kv_heads:
            raise _fail(
                f"field 'num_key_value_heads' ({kv_heads}) must divide "
                f"num_attention_heads ({heads})"
            )
        out["num_query_groups"] = kv_heads
    head_dim = _opt(data, "head_dim")
    if head_dim is not None:
        out["kv_channels"] = head_dim
    elif hidden % heads:
        raise _fail(
            f"field 'hidden_size' ({hidden}) must be divisible by num_attention_heads ({heads}) "
            "when there is no head_dim"
        )
    return out


def _architecture(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Norm, activation, biases, positions, tying, dropout."""
    gated = model_type in _GATED
    act_key = "activation_function" if model_type == "gpt2" else "hidden_act"
    act = data.get(act_key, "gelu_new" if model_type == "gpt2" else "silu" if gated else "gelu")
    allowed = _GATED_ACTS if gated else _PLAIN_ACTS
    if act not in allowed:
        raise _fail(
            f"field '{act_key}' {brief(act)} is not supported for model_type '{model_type}' "
            f"(supported: {', '.join(sorted(allowed))})"
        )
    tied = _bool(data, "tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    out: dict[str, Any] = {
        "swiglu": gated,
        "normalization": "RMSNorm" if gated else "LayerNorm",
        "untie_embeddings_and_output_weights": not tied,
        "norm_epsilon": data.get("rms_norm_eps", data.get("layer_norm_eps",
                                                        data.get("layer_norm_epsilon"))),
    }
    if model_type == "gpt2":
        out["position_embedding_type"] = "learned_absolute"
        out["hidden_dropout"] = _float(data, "resid_pdrop", 0.1)
        out["attention_dropout"] = _float(data, "attn_pdrop", 0.1)
        out["add_bias_linear"] = True
        return out
    out["position_embedding_type"] = "yarn" if _rope_type(data) == "yarn" else "rope"
    out["rotary_base"] = _rope_theta(data) or data.get("rotary_emb_base")
    out.update(_rope_scaling(data))
    out["hidden_dropout"] = _float(data, "hidden_dropout", 0.0)
    out["attention_dropout"] = _float(data, "attention_dropout", 0.0)
    if model_type == "gpt_neox":
        out["add_bias_linear"] = _bool(data, "attention_bias", True)
        out["rotary_percent"] = data.get("rotary_pct", data.get("partial_rotary_factor"))
        return out
    out.update({"add_bias_linear": True} if model_type == "gpt_oss" else _gated_biases(data, model_type))
    out["qk_layernorm"] = model_type in _QK_NORM or _bool(data, "use_qk_norm", False)
    return out


def _gated_biases(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Llama-like families: no linear biases except the (implicit or explicit) QKV bias."""
    attention_bias = _bool(data, "attention_bias", False)
    mlp_bias = _bool(data, "mlp_bias", False)
    if mlp_bias and not attention_bias:
        raise _fail("field 'mlp_bias' true without attention_bias has no Megatron-LM equivalent")
    if model_type == "deepseek_v3" and attention_bias:
        raise _fail("field 'attention_bias' true is not supported with multi-latent attention")
    if mlp_bias:
        return {"add_bias_linear": True}
    return {
        "add_bias_linear": False,
        "add_qkv_bias": model_type in _IMPLICIT_QKV_BIAS or attention_bias,
    }


def _layer_pattern(data: dict[str, Any], model_type: str, num_layers: int) -> int | list[int]:
    """MoE layer pattern as Megatron's moe_layer_freq (1 = every layer)."""
    if model_type == "deepseek_v3":
        first_dense = _int(data, "first_k_dense_replace", 0, minimum=0)
        freq = _int(data, "moe_layer_freq", 1)
        pattern = [int(i >= first_dense and i % freq == 0) for i in range(num_layers)]
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        step = _int(data, "decoder_sparse_step", 1)
        dense_only = data.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or any(
            isinstance(x, bool) or not isinstance(x, int) for x in dense_only
        ):
            raise _fail(
                f"field 'mlp_only_layers' must be a list of layer indices, got {brief(dense_only)}"
            )
        pattern = [int(i not in dense_only and (i + 1) % step == 0) for i in range(num_layers)]
    else:
        return 1
    if not any(pattern):
        raise _fail("no MoE layers: first_k_dense_replace/decoder_sparse_step/mlp_only_layers "
                    "leave every layer dense")
    return 1 if all(pattern) else pattern


def _moe(data: dict[str, Any], model_type: str, dims: dict[str, Any]) -> dict[str, Any]:
    """Routed/shared experts and the MoE layer pattern."""
    if model_type not in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss"):
        return {}
    experts = _req(data, "num_experts")
    out: dict[str, Any] = {
        "num_experts": experts,
        "moe_router_topk": _int(data, "num_experts_per_tok", 2),
    }
    if out["moe_router_topk"] > experts:
        raise _fail(
            f"field 'num_experts_per_tok' ({out['moe_router_topk']}) must be <= "
            f"the number of experts ({experts})"
        )
    if model_type in ("mixtral", "gpt_oss"):
        out["moe_ffn_hidden_size"] = dims["ffn_hidden_size"]
    else:
        out["moe_ffn_hidden_size"] = _req(data, "moe_intermediate_size")
    if model_type == "qwen2_moe":
        shared = _opt(data, "shared_expert_intermediate_size")
        if shared:
            out["moe_shared_expert_intermediate_size"] = shared
            out["moe_shared_expert_gate"] = True
    elif model_type == "deepseek_v3":
        n_shared = _int(data, "n_shared_experts", 0, minimum=0)
        if n_shared:
            out["moe_shared_expert_intermediate_size"] = n_shared * out["moe_ffn_hidden_size"]
    out["moe_layer_freq"] = _layer_pattern(data, model_type, dims["num_layers"])
    out.update(_router(data, model_type))
    return out


def _mla(data: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3 multi-latent attention and multi-token prediction."""
    qk_head_dim = _req(data, "qk_nope_head_dim")
    return {
        "multi_latent_attention": True,
        "q_lora_rank": _opt(data, "q_lora_rank"),
        "kv_lora_rank": _req(data, "kv_lora_rank"),
        "qk_head_dim": qk_head_dim,
        "qk_pos_emb_head_dim": _req(data, "qk_rope_head_dim"),
        "v_head_dim": _req(data, "v_head_dim"),
        "kv_channels": qk_head_dim,  # NVIDIA's DeepSeek scripts pass --kv-channels 128
        "mtp_num_layers": _int(data, "num_nextn_predict_layers", 0, minimum=0),
    }


def _gpt_oss(data: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """gpt-oss: sliding window on the "sliding_attention" layers, attention sinks, the clamped QuickGELU GLU."""
    out: dict[str, Any] = {"softmax_type": "learnable", "quick_geglu": True, "glu_linear_offset": 1.0,
                           "activation_func_clamp_value": data.get("swiglu_limit", 7.0),
                           "moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": None,
                           "yarn_correction_range_round_to_int": False}
    window = _opt(data, "sliding_window")
    if window is None:
        return out
    kinds = data.get("layer_types")
    if kinds is None:
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers \
            or any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise _fail(f"field 'layer_types' must list {num_layers} of sliding_attention/full_attention, "
                    f"got {brief(kinds)}")
    pattern = [int(k == "sliding_attention") for k in kinds]
    if any(pattern):
        out["window_size"] = (window - 1, 0)  # Bridge: (sliding_window - 1, 0), the query's own key included
        alternate = [int(w) for w in windowed_every(2, num_layers)]
        out["window_attn_skip_freq"] = 2 if pattern == alternate else None if all(pattern) else pattern
    return out


def model_from_hf_config(data: dict[str, Any], *, name: str = "hf-model") -> ModelSpec:
    """ModelSpec from a Hugging Face ``config.json`` mapping (see the module docstring)."""
    if not isinstance(data, dict):
        raise _fail(f"expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type is None:
        raise _fail("missing field 'model_type'")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _fail(
            f"unsupported model_type {brief(model_type)} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    args = _dimensions(data, model_type)
    args.update(_architecture(data, model_type))
    args.update(_moe(data, model_type, args))
    if model_type == "deepseek_v3":
        args.update(_mla(data))
    if model_type == "gpt_oss":
        args.update(_gpt_oss(data, args["num_layers"]))
    origin = data.get("_name_or_path") or name
    source = f"Hugging Face config.json ({origin}, model_type {model_type})"
    args = {k: v for k, v in args.items() if v is not None or k == "q_lora_rank"}
    try:
        return model_from_megatron_args(args, name=name, source=source)
    except SpecError as err:
        raise _fail(str(err)) from None
