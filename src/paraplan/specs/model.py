"""ModelSpec: a decoder-only transformer described with Megatron-LM's own argument names.

Dense and MoE decoders: GQA/MQA, kv_channels, SwiGLU or GeLU, tied or untied embeddings,
learned-absolute or RoPE positions, LayerNorm or RMSNorm, MoE (routed + shared experts, layer
pattern), multi-latent attention (DeepSeek-V3) and MTP layers.

Defaults are Megatron-LM's (``megatron/training/arguments.py`` and the ``TransformerConfig``
dataclass at Megatron-LM d98e8a6, see ../shared/reference/ecosystem.md section 1.3): tied
embeddings, LayerNorm, GeLU, biases on, learned absolute positions, dropout 0.1. Presets and
Hugging Face configs set the fields explicitly.

This module only describes the model. Parameter counting per rank lives in
``paraplan.estimate.params``; FLOPs in ``paraplan.estimate.flops``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from pydantic import ConfigDict

from paraplan.errors import SpecError
from paraplan.fileio import brief

Normalization = Literal["LayerNorm", "RMSNorm"]
PositionEmbedding = Literal["learned_absolute", "rope", "yarn", "mrope", "relative", "none"]


RECIPE_CHOICES: dict[str, tuple[str, ...]] = {
    "moe_router_load_balancing_type": ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn",
                                       "quantile_balancing", "none"),
    "moe_router_score_function": ("softmax", "sigmoid", "sqrtsoftplus"),
    "moe_router_dtype": ("fp32", "fp64"),
    "softmax_type": ("vanilla", "off-by-one", "learnable"),
}
"""Allowed values of the string recipe fields (Megatron-LM main @ d98e8a6 ``choices``)."""

RECIPE_FLAGS: tuple[tuple[str, str, bool], ...] = (
    ("norm_epsilon", "--norm-epsilon", False), ("rotary_base", "--rotary-base", False),
    ("rotary_percent", "--rotary-percent", False), ("use_rope_scaling", "--use-rope-scaling", False),
    ("rope_scaling_factor", "--rope-scaling-factor", False),
    ("rotary_scaling_factor", "--rotary-scaling-factor", False), ("mscale", "--mscale", False),
    ("mscale_all_dim", "--mscale-all-dim", False), ("apply_layernorm_1p", "--apply-layernorm-1p", False),
    ("squared_relu", "--squared-relu", False),
    ("moe_aux_loss_coeff", "--moe-aux-loss-coeff", True),
    ("moe_router_load_balancing_type", "--moe-router-load-balancing-type", True),
    ("moe_router_score_function", "--moe-router-score-function", True),
    ("moe_router_pre_softmax", "--moe-router-pre-softmax", True),
    ("moe_router_num_groups", "--moe-router-num-groups", True),
    ("moe_router_group_topk", "--moe-router-group-topk", True),
    ("moe_router_topk_scaling_factor", "--moe-router-topk-scaling-factor", True),
    ("moe_router_enable_expert_bias", "--moe-router-enable-expert-bias", True),
    ("moe_router_dtype", "--moe-router-dtype", True),
    ("glu_linear_offset", "--glu-linear-offset", False),
    ("activation_func_clamp_value", "--activation-func-clamp-value", False),
    ("yarn_correction_range_round_to_int", "--no-yarn-correction-range-round-to-int", False),
)
"""(ModelSpec field, Megatron flag, MoE only) of the recipe fields: ``paraplan launch`` emits the
ones that differ from Megatron's default (a bool as a bare switch) and ``check`` reads them back."""

MAX_NUM_LAYERS: Final = 100_000
"""Largest num_layers (and MTP layers, moe_layer_freq pattern length) accepted: far above any real
model (DeepSeek-V3: 61, Llama 3.1 405B: 126), small enough that per-layer tuples stay cheap."""
MAX_WIDTH: Final = 2**20
"""Largest hidden_size / head or low-rank dimension accepted (1,048,576; GPT-3 175B: 12,288)."""
MAX_FFN: Final = 2**24
"""Largest MLP width and vocabulary accepted (16,777,216; Llama 3.1 405B ffn: 53,248)."""
MAX_COUNT: Final = 2**16
"""Largest head, query-group, expert and router-group count accepted (65,536; DeepSeek-V3: 256 experts)."""

INT_BOUNDS: Final[dict[str, int]] = {
    "num_layers": MAX_NUM_LAYERS, "mtp_num_layers": MAX_NUM_LAYERS, "hidden_size": MAX_WIDTH,
    "num_attention_heads": MAX_COUNT, "vocab_size": MAX_FFN, "ffn_hidden_size": MAX_FFN,
    "num_query_groups": MAX_COUNT, "kv_channels": MAX_WIDTH, "max_position_embeddings": 2**31,
    "make_vocab_size_divisible_by": MAX_WIDTH, "num_experts": MAX_COUNT, "moe_router_topk": MAX_COUNT,
    "moe_ffn_hidden_size": MAX_FFN, "moe_shared_expert_intermediate_size": MAX_FFN, "q_lora_rank": MAX_WIDTH,
    "kv_lora_rank": MAX_WIDTH, "qk_head_dim": MAX_WIDTH, "qk_pos_emb_head_dim": MAX_WIDTH, "v_head_dim": MAX_WIDTH,
    "rotary_base": 10**12, "moe_router_num_groups": MAX_COUNT, "moe_router_group_topk": MAX_COUNT,
}
"""Upper bound of every integer ModelSpec field (the lower bound is in ``__post_init__``); the error
names the bound, so that arithmetic on a model stays in bounded time and memory."""
MAX_WEIGHTS: Final = 2**50
"""Largest (layers x hidden x widest layer matrix) and (hidden x vocabulary) accepted: 1.1e15, 500 x
DeepSeek-V3 (61 x 7,168 x 256 experts x 2,048 = 2.3e12). Each field may be large, not all at once:
parameter and FLOP counts then stay far inside 64-bit integers, as the vectorised estimate needs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder transformer. Field names are Megatron-LM argument names (dest form)."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_layers: int
    """Main decoder layers (``--num-layers``)."""
    hidden_size: int
    """Model width h (``--hidden-size``)."""
    num_attention_heads: int
    """Query heads a (``--num-attention-heads``)."""
    vocab_size: int
    """Tokenizer vocabulary before Megatron's padding (``--vocab-size``)."""
    ffn_hidden_size: int | None = None
    """Dense MLP width f; None = Megatron default 4h, or int(8h/3/64)*64 with SwiGLU."""
    num_query_groups: int | None = None
    """KV heads g (``--num-query-groups`` with ``--group-query-attention``); None = MHA (g = a)."""
    kv_channels: int | None = None
    """Head dimension d (``--kv-channels``); None = h // a."""
    max_position_embeddings: int | None = None
    """Positions (``--max-position-embeddings``); must be >= seq_length. None = not checked."""
    make_vocab_size_divisible_by: int = 128
    """Vocab padding multiple before x TP (``--make-vocab-size-divisible-by``)."""
    swiglu: bool = False
    """Gated SiLU MLP (three h x f matrices) instead of GeLU (two)."""
    untie_embeddings_and_output_weights: bool = False
    """Separate output layer; Megatron's default is tied."""
    add_bias_linear: bool = True
    """Biases on all linear layers (``--disable-bias-linear`` turns them off)."""
    add_qkv_bias: bool = False
    """Bias on the QKV projection only (Qwen2)."""
    qk_layernorm: bool = False
    """Norms on Q and K per head (Qwen3, DeepSeek-V3)."""
    position_embedding_type: PositionEmbedding = "learned_absolute"
    """learned_absolute adds a max_position_embeddings x h table on the first stage."""
    normalization: Normalization = "LayerNorm"
    """LayerNorm has weight and bias (2h), RMSNorm weight only (h)."""
    hidden_dropout: float = 0.1
    """Dropout after attention and MLP; > 0 stores a 1-byte mask per element (Korthikanti 2022)."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities (only stored without flash attention)."""
    num_experts: int | None = None
    """Routed experts E (``--num-experts``); None = dense model."""
    moe_router_topk: int = 2
    """Experts per token k (``--moe-router-topk``)."""
    moe_ffn_hidden_size: int | None = None
    """Routed expert width f_e; None = ffn_hidden_size (Megatron's default)."""
    moe_shared_expert_intermediate_size: int | None = None
    """Total shared-expert width f_s (n_shared x per-expert width)."""
    moe_shared_expert_gate: bool = False
    """Sigmoid gate on the shared expert (h parameters per layer)."""
    moe_layer_freq: int | tuple[int, ...] = 1
    """int F: layer i is MoE iff i % F == 0; or an explicit 0/1 pattern of length num_layers."""
    multi_latent_attention: bool = False
    """DeepSeek multi-latent attention (MLA) instead of MHA/GQA."""
    q_lora_rank: int | None = None
    """MLA query low-rank c_q; None = full-rank query projection."""
    kv_lora_rank: int = 32
    """MLA KV low-rank c_kv (Megatron default 32)."""
    qk_head_dim: int = 128
    """MLA per-head QK dimension without RoPE (Megatron default 128)."""
    qk_pos_emb_head_dim: int = 64
    """MLA per-head RoPE dimension (Megatron default 64)."""
    v_head_dim: int = 128
    """MLA per-head value dimension (Megatron default 128)."""
    mtp_num_layers: int = 0
    """Multi-token-prediction layers (DeepSeek-V3: 1); they sit on the last pipeline stage."""
    window_size: tuple[int, int] | None = None
    """``--window-size`` (left, right) of sliding-window attention: query i sees keys i-left .. i (causal; gpt-oss:
    (127, 0) in Megatron-Bridge's provider, 128 keys, HF ``sliding_window`` 128); -1 = unlimited; None = full."""
    window_attn_skip_freq: int | tuple[int, ...] | None = None
    """``--window-attn-skip-freq``: int N = every N-th layer (1-indexed) has full attention, the others the window;
    a 0/1 list per layer, 1 = windowed; None = every layer windowed (``megatron/core/transformer/utils.py``
    ``is_layer_window_attention``). gpt-oss: 2 (alternating, HF ``layer_types``)."""
    softmax_type: str = "vanilla"
    """``--softmax-type``: vanilla, off-by-one, or learnable (attention sinks: one learned logit per head and layer,
    gpt-oss). Non-vanilla rules out flash-attn: TE runs cuDNN fused attention (``get_attention_backend``)."""
    quick_geglu: bool = False
    """``--quick-geglu``: the gated MLP's activation is QuickGELU x*sigmoid(1.702x) instead of SiLU (gpt-oss); needs
    ``swiglu`` (the gated, three-matrix MLP), written as ``--quick-geglu`` instead of ``--swiglu``."""
    # ---- recipe: Megatron flags that change what is trained but no size, memory or time; they
    # ---- are carried so that ``paraplan launch`` trains the model described (RECIPE_FLAGS).
    norm_epsilon: float = 1e-5
    """``--norm-epsilon`` (Megatron dest layernorm_epsilon)."""
    rotary_base: int = 10000
    """``--rotary-base``: RoPE theta (Llama 3: 500000; Qwen, Mixtral: 1000000)."""
    rotary_percent: float = 1.0
    """``--rotary-percent``: fraction of each head that is rotated (GPT-NeoX 0.25)."""
    use_rope_scaling: bool = False
    """``--use-rope-scaling``: Llama 3.1 frequency scaling, with ``rope_scaling_factor``."""
    rope_scaling_factor: float = 8.0
    """``--rope-scaling-factor`` (Megatron default 8)."""
    rotary_scaling_factor: float = 1.0
    """``--rotary-scaling-factor``: YaRN factor for MLA (DeepSeek-V3: 40)."""
    mscale: float = 1.0
    """``--mscale`` (YaRN)."""
    mscale_all_dim: float = 0.0
    """``--mscale-all-dim`` (YaRN)."""
    apply_layernorm_1p: bool = False
    """``--apply-layernorm-1p``: zero-centred LayerNorm gamma (Nemotron)."""
    squared_relu: bool = False
    """``--squared-relu`` MLP activation (Nemotron); same parameters as GeLU."""
    moe_aux_loss_coeff: float = 0.0
    """``--moe-aux-loss-coeff``: load-balancing loss weight (Megatron default 0: no balancing)."""
    moe_router_load_balancing_type: str = "aux_loss"
    """``--moe-router-load-balancing-type`` (aux_loss, seq_aux_loss, ...)."""
    moe_router_score_function: str = "softmax"
    """``--moe-router-score-function`` (softmax, sigmoid, sqrtsoftplus)."""
    moe_router_pre_softmax: bool = False
    """``--moe-router-pre-softmax`` (always emitted for top-1 routing, which Megatron requires)."""
    moe_router_num_groups: int | None = None
    """``--moe-router-num-groups``: node-limited routing groups (DeepSeek-V3: 8)."""
    moe_router_group_topk: int | None = None
    """``--moe-router-group-topk`` (DeepSeek-V3: 4)."""
    moe_router_topk_scaling_factor: float | None = None
    """``--moe-router-topk-scaling-factor`` (DeepSeek-V3: 2.5)."""
    moe_router_enable_expert_bias: bool = False
    """``--moe-router-enable-expert-bias``: aux-loss-free balancing bias (DeepSeek-V3)."""
    moe_router_dtype: str | None = None
    """``--moe-router-dtype`` (fp32, fp64)."""
    glu_linear_offset: float = 0.0
    """``--glu-linear-offset``: act(x_glu) * (x_linear + offset) (gpt-oss: 1.0)."""
    activation_func_clamp_value: float | None = None
    """``--activation-func-clamp-value``: clamp of the gated activation's inputs (gpt-oss: 7.0, HF ``swiglu_limit``);
    with QuickGeGLU applied by two clamps and a cat before the fused bias-activation kernel
    (``fused_bias_geglu.weighted_bias_quick_geglu_impl``; time: ``compute.quick_geglu_clamp_bytes_per_element``)."""
    yarn_correction_range_round_to_int: bool = True
    """YaRN rounds its correction range to whole dimensions (Megatron's default True; ``False`` is written as
    ``--no-yarn-correction-range-round-to-int``; gpt-oss: False, as Megatron-Bridge's GPTOSSBridge.provider_bridge
    sets ``provider.yarn_correction_range_round_to_int = False``). No size or time effect."""
    name: str = "custom"
    """Display name."""
    source: str = ""
    """Where the dimensions come from (model card, config.json, paper)."""

    def __post_init__(self) -> None:
        self._check_bounds()
        for fname in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            _require_positive(fname, getattr(self, fname))
        for fname in ("ffn_hidden_size", "num_query_groups", "kv_channels",
                      "max_position_embeddings", "num_experts", "moe_ffn_hidden_size",
                      "q_lora_rank"):
            value = getattr(self, fname)
            if value is not None:
                _require_positive(fname, value)
        _require_positive("make_vocab_size_divisible_by", self.make_vocab_size_divisible_by)
        if self.mtp_num_layers < 0:
            raise SpecError(f"mtp_num_layers must be >= 0, got {self.mtp_num_layers}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise SpecError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) unless kv_channels is set"
            )
        g = self.query_groups
        if self.num_attention_heads % g:
            raise SpecError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_query_groups ({g})"
            )
        if self.multi_latent_attention and self.num_query_groups not in (None, self.num_attention_heads):
            raise SpecError("Group query attention is mutually exclusive with multi latent attention.")
        self._check_moe()
        self._check_window()
        for fname in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, fname)
            if not 0.0 <= value < 1.0:
                raise SpecError(f"{fname} must be in [0, 1), got {value}")
        self._check_recipe()

    def _check_bounds(self) -> None:
        """Integers within INT_BOUNDS, floats finite (NaN and inf would pass every comparison below)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{f.name} must be a finite number, got {value}")
            limit = INT_BOUNDS.get(f.name)
            if limit is not None and value is not None and not isinstance(value, bool) and isinstance(value, int) \
                    and value > limit:
                got = value if value < 10**30 else f"a {len(str(value))}-digit number"
                raise SpecError(f"{f.name} must be at most {limit:,}, got {got} (the limit on model sizes)")
        freq = self.moe_layer_freq
        if isinstance(freq, int) and not isinstance(freq, bool) and freq > MAX_NUM_LAYERS:
            raise SpecError(f"moe_layer_freq must be at most {MAX_NUM_LAYERS:,}, got {freq}")
        self._check_weights()

    def _check_weights(self) -> None:
        ints = [getattr(self, n) for n in ("num_layers", "mtp_num_layers", "hidden_size", "vocab_size",
                                           "num_attention_heads", "ffn_hidden_size", "kv_channels", "num_experts",
                                           "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")]
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in ints):
            return  # the per-field checks name the field
        layers, h = self.num_layers + self.mtp_num_layers, self.hidden_size
        widest = max(self.ffn, self.moe_ffn * (self.num_experts or 0), self.shared_ffn,
                     (self.kv_channels or 0) * self.num_attention_heads, h)
        for what, size in ((f"layers x hidden_size x widest matrix ({layers} x {h} x {widest})", layers * h * widest),
                           (f"hidden_size x vocab_size ({h} x {self.vocab_size})", h * self.vocab_size)):
            if size > MAX_WEIGHTS:
                raise SpecError(f"model too large: {what} = {size:.3g} is over {MAX_WEIGHTS:.3g} (the limit on "
                                "model sizes)")

    def _check_recipe(self) -> None:
        if not self.norm_epsilon > 0:
            raise SpecError(f"norm_epsilon must be > 0, got {self.norm_epsilon}")
        if self.rotary_base < 1:
            raise SpecError(f"rotary_base must be >= 1, got {self.rotary_base}")
        if not 0.0 < self.rotary_percent <= 1.0:
            raise SpecError(f"rotary_percent must be in (0, 1], got {self.rotary_percent}")
        for fname, allowed in RECIPE_CHOICES.items():
            value = getattr(self, fname)
            if value is not None and value not in allowed:
                raise SpecError(f"{fname} must be one of {', '.join(allowed)}, got {brief(value)}")
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if (groups is None) != (group_topk is None):
            raise SpecError("moe_router_num_groups and moe_router_group_topk must be set together")
        if groups is not None and group_topk is not None and not 1 <= group_topk <= groups:
            raise SpecError(f"moe_router_group_topk must be in [1, moe_router_num_groups={groups}], "
                            f"got {group_topk}")

    def _check_window(self) -> None:
        if self.window_size is not None:
            if len(self.window_size) != 2 or not all(-1 <= w <= 2**31 for w in self.window_size):
                raise SpecError(f"window_size must be two integers (left, right), each -1 (unlimited) to {2**31}, "
                                f"got {brief(self.window_size)}")
        freq = self.window_attn_skip_freq
        if isinstance(freq, int):
            if isinstance(freq, bool) or not 1 <= freq <= MAX_NUM_LAYERS:
                raise SpecError(f"window_attn_skip_freq must be in [1, {MAX_NUM_LAYERS:,}], got {freq}")
        elif freq is not None and (len(freq) != self.num_layers or any(x not in (0, 1) for x in freq)):
            raise SpecError(f"window_attn_skip_freq pattern must be {self.num_layers} values of 0/1, got "
                            f"{len(freq)} values")
        if self.quick_geglu and not self.swiglu:
            raise SpecError("quick_geglu needs swiglu: true (the gated MLP; --quick-geglu sets gated_linear_unit)")
        if self.activation_func_clamp_value is not None and not self.activation_func_clamp_value > 0:
            raise SpecError(f"activation_func_clamp_value must be > 0, got {self.activation_func_clamp_value}")

    def window_layer_pattern(self) -> tuple[bool, ...]:
        """Which main layers attend over the sliding window (Megatron's ``is_layer_window_attention``, 1-indexed:
        an int N leaves layer n full when n % N == 0; a list gives 1 for windowed)."""
        if self.window_size is None:
            return (False,) * self.num_layers
        freq = self.window_attn_skip_freq
        if freq is None:
            return (True,) * self.num_layers
        if isinstance(freq, int):
            return windowed_every(freq, self.num_layers)
        return tuple(bool(x) for x in freq)

    def _check_moe(self) -> None:
        if self.num_experts is None:
            return
        if not 1 <= self.moe_router_topk <= self.num_experts:
            raise SpecError(
                f"moe_router_topk must be in [1, num_experts={self.num_experts}], "
                f"got {self.moe_router_topk}"
            )
        freq = self.moe_layer_freq
        if isinstance(freq, int):
            if freq < 1:
                raise SpecError(f"moe_layer_freq must be >= 1, got {freq}")
        else:
            if len(freq) != self.num_layers or any(x not in (0, 1) for x in freq):
                raise SpecError(
                    f"moe_layer_freq pattern must be {self.num_layers} values of 0/1, got "
                    f"{len(freq)} values"
                )

    # ------------------------------------------------------------------ derived dimensions
    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts."""
        return self.num_experts is not None and self.num_experts > 0

    @property
    def ffn(self) -> int:
        """Dense MLP width: ffn_hidden_size, or Megatron's default (4h; int(8h/3/64)*64 with SwiGLU)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.swiglu and not self.quick_geglu:  # Megatron's 8h/3 rule is --swiglu's only
            return int((4 * self.hidden_size * 2 / 3) / 64) * 64
        return 4 * self.hidden_size

    @property
    def moe_ffn(self) -> int:
        """Routed expert width (defaults to the dense width, as Megatron does)."""
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn

    @property
    def shared_ffn(self) -> int:
        """Total shared-expert width (0 when there is none)."""
        return self.moe_shared_expert_intermediate_size or 0

    @property
    def head_dim(self) -> int:
        """Per-head dimension d = kv_channels (default h // a)."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """Number of KV heads g (a for MHA)."""
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def query_width(self) -> int:
        """Width of the query projection q = d*a."""
        return self.head_dim * self.num_attention_heads

    @property
    def kv_width(self) -> int:
        """Width of the K (and of the V) projection d*g."""
        return self.head_dim * self.query_groups

    @property
    def norm_params(self) -> int:
        """Parameters per normalised element: 2 for LayerNorm (weight+bias), 1 for RMSNorm."""
        return 2 if self.normalization == "LayerNorm" else 1

    @property
    def mlp_matrices(self) -> int:
        """h x f matrices in the MLP: 3 with SwiGLU (gate, up, down), 2 otherwise."""
        return 3 if self.swiglu else 2

    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Which of the main layers are MoE (Megatron's ``moe_layer_freq`` semantics)."""
        if not self.is_moe:
            return (False,) * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, int):
            return tuple(i % freq == 0 for i in range(self.num_layers))
        return tuple(bool(x) for x in freq)

    @property
    def mtp_layer_is_moe(self) -> bool:
        """MTP layers copy the type of the last main layer (Megatron's accounting)."""
        return self.moe_layer_pattern()[-1]

    def padded_vocab_size(self, tp: int) -> int:
        """Vocab padded to a multiple of make_vocab_size_divisible_by * TP.

        Mirrors ``megatron/training/vocab_utils.py``: multiple = divisible_by * tp;
        padded = ceil(vocab / multiple) * multiple.
        """
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


def windowed_every(freq: int, num_layers: int) -> tuple[bool, ...]:
    """Windowed layers of ``--window-attn-skip-freq N`` (Megatron's ``is_layer_window_attention``): layer n,
    1-indexed, has full attention when n % N == 0, the window otherwise."""
    return tuple((n + 1) % freq != 0 for n in range(num_layers))


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{name} must be a positive integer, got {brief(value)}")


MODEL_FIELDS: tuple[str, ...] = tuple(
    f for f in ModelSpec.__dataclass_fields__ if not f.startswith("_")
)


def recipe_defaults() -> dict[str, Any]:
    """Megatron's default of every recipe field (``RECIPE_FLAGS``): the ModelSpec field defaults."""
    by_name = {f.name: f.default for f in fields(ModelSpec)}
    return {name: by_name[name] for name, _, _ in RECIPE_FLAGS}
