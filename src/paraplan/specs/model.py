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

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict

from paraplan.errors import SpecError

Normalization = Literal["LayerNorm", "RMSNorm"]
PositionEmbedding = Literal["learned_absolute", "rope", "yarn", "mrope", "relative", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder transformer. Field names are Megatron-LM argument names (dest form)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

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
    name: str = "custom"
    """Display name."""
    source: str = ""
    """Where the dimensions come from (model card, config.json, paper)."""

    def __post_init__(self) -> None:
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
        for fname in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, fname)
            if not 0.0 <= value < 1.0:
                raise SpecError(f"{fname} must be in [0, 1), got {value}")

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
        if self.swiglu:
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


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{name} must be a positive integer, got {value!r}")


MODEL_FIELDS: tuple[str, ...] = tuple(
    f for f in ModelSpec.__dataclass_fields__ if not f.startswith("_")
)
