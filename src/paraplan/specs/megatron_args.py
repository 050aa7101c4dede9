"""A dictionary keyed by Megatron-LM argument names -> ``ModelSpec``: what presets, Megatron-args files, Hugging
Face configs (``specs.hf``) and command lines (``specs.megatron_flags``) all end in."""

from __future__ import annotations

import re
from typing import Any

from paraplan.errors import SpecError
from paraplan.fileio import brief
from paraplan.specs.model import MAX_NUM_LAYERS, ModelSpec
from paraplan.specs.validate import validate_fields


def parse_moe_layer_freq(value: Any, num_layers: int | None = None) -> int | tuple[int, ...]:
    """Megatron's ``--moe-layer-freq``: an int, a list, or a string like "[0]*3+[1]*58"."""
    if isinstance(value, bool):
        raise SpecError(f"moe_layer_freq: expected an int or a 0/1 list, got {brief(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, list | tuple):
        if not all(x in (0, 1) and not isinstance(x, float) for x in value):
            raise SpecError(f"moe_layer_freq: a list must hold only 0 and 1, got {brief(value)}")
        return tuple(int(x) for x in value)
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            return int(text)
        parts = re.findall(r"\[\s*([01](?:\s*,\s*[01])*)\s*\]\s*(?:\*\s*([0-9]+))?", text)
        cleaned = re.sub(r"[\s()]", "", text)
        if parts and re.fullmatch(r"(\[[01](,[01])*\](\*[0-9]+)?\+?)+", cleaned):
            out: list[int] = []
            for items, times in parts:
                seq = [int(x) for x in items.split(",")]
                if len(times) > 6 or len(out) + len(seq) * int(times or 1) > MAX_NUM_LAYERS:  # times: digits
                    raise SpecError(f"moe_layer_freq: {brief(text)} has more than {MAX_NUM_LAYERS:,} values "
                                    "(num_layers is at most that)")
                out.extend(seq * (int(times) if times else 1))
            return tuple(out)
    raise SpecError(
        f"moe_layer_freq: cannot read {brief(value)} (an int, a 0/1 list, or '[0]*k+[1]*n')"
        + (f" for {num_layers} layers" if num_layers else "")
    )


def parse_window_size(value: Any) -> tuple[int, int]:
    """Megatron's ``--window-size`` (``tuple_type``): "127,0", "(127, 0)" or a two-item list -> (left, right)."""
    items: Any = value
    if isinstance(value, str):
        items = value.strip().strip("()[]").split(",")
    if isinstance(items, list | tuple) and len(items) == 2:
        try:
            out = tuple(int(str(x).strip()) for x in items if not isinstance(x, bool | float))
        except ValueError:
            out = ()
        if len(out) == 2:
            return out[0], out[1]
    raise SpecError(f"window_size: expected two integers 'left,right' (e.g. 127,0), got {brief(value)}")


def parse_window_skip_freq(value: Any, num_layers: int | None = None) -> int | tuple[int, ...]:
    """Megatron's ``--window-attn-skip-freq`` (``moe_freq_type``, as ``--moe-layer-freq``): an int or a 0/1 list."""
    try:
        return parse_moe_layer_freq(value, num_layers)
    except SpecError as err:
        raise SpecError(str(err).replace("moe_layer_freq", "window_attn_skip_freq")) from None


def _window_fields(out: dict[str, Any]) -> None:
    """``--window-size`` / ``--window-attn-skip-freq`` as Megatron types them; ``--quick-geglu`` is a gated MLP."""
    if out.get("window_size") is not None:
        out["window_size"] = parse_window_size(out["window_size"])
    if out.get("window_attn_skip_freq") is not None:
        out["window_attn_skip_freq"] = parse_window_skip_freq(out["window_attn_skip_freq"], out.get("num_layers"))
    if out.get("quick_geglu") is True:
        out.setdefault("swiglu", True)  # --quick-geglu sets gated_linear_unit (training/argument_utils.py)


_MEGATRON_ALIASES = {
    "num_experts": "num_experts",
    "num_moe_experts": "num_experts",
    "layernorm_epsilon": "norm_epsilon",
    "layernorm_zero_centered_gamma": "apply_layernorm_1p",
    "group_query_attention": None,
    "seq_length": None,
    "disable_bias_linear": None,
    "padded_vocab_size": None,
}


def model_from_megatron_args(data: dict[str, Any], *, name: str = "custom", source: str = "") -> ModelSpec:
    """ModelSpec from a dict keyed by Megatron-LM argument names (dashes or underscores).

    Megatron's dest names are accepted for the recipe fields (``layernorm_epsilon``,
    ``layernorm_zero_centered_gamma``); ``group_query_attention: false`` drops ``num_query_groups`` as Megatron does;
    ``disable_bias_linear: true`` means ``add_bias_linear: false``; ``padded_vocab_size`` with
    ``make_vocab_size_divisible_by`` 1 fixes the vocabulary.
    """
    raw = {str(k).replace("-", "_"): v for k, v in data.items()}
    out: dict[str, Any] = {}
    gqa = raw.get("group_query_attention")
    for key, value in raw.items():
        if key in _MEGATRON_ALIASES:
            target = _MEGATRON_ALIASES[key]
            if target:
                out[target] = value
            continue
        out[key] = value
    if raw.get("disable_bias_linear"):
        out["add_bias_linear"] = False
    if gqa is False:
        out.pop("num_query_groups", None)
    if raw.get("padded_vocab_size"):
        if isinstance(raw["padded_vocab_size"], bool) or not isinstance(raw["padded_vocab_size"], int):
            raise SpecError(f"model.padded_vocab_size: expected an integer, got {brief(raw['padded_vocab_size'])}")
        out["vocab_size"] = raw["padded_vocab_size"]
        out.setdefault("make_vocab_size_divisible_by", 1)
    if out.get("num_experts") in (0, None):
        out.pop("num_experts", None)
    if "moe_layer_freq" in out:
        out["moe_layer_freq"] = parse_moe_layer_freq(out["moe_layer_freq"], out.get("num_layers"))
    _window_fields(out)
    if out.get("mtp_num_layers") is None:
        out.pop("mtp_num_layers", None)
    for key in ("q_lora_rank",):
        if key in out and out[key] in (0,):
            out[key] = None
    out.setdefault("name", name)
    out.setdefault("source", source)
    return validate_fields(ModelSpec, out, "model.")  # type: ignore[no-any-return]
