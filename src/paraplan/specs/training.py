"""TrainingSpec: sequence length, global batch, precision and optimizer.

Bytes per parameter follow Megatron's mixed-precision Adam (``docs/user-guide/features/
dist_optimizer.md``; Rajbhandari et al. 2020, arXiv:1910.02054 section 3): bf16 parameters
(2 B), fp32 main gradients (4 B), fp32 master weights + Adam m + v (12 B) = 18 B/param.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pydantic import ConfigDict

from paraplan.errors import SpecError
from paraplan.fileio import brief

Precision = Literal["bf16", "fp8", "fp16"]
PRECISIONS: Final = ("bf16", "fp8", "fp16")

PARAM_BYTES: Final = 2.0
"""bf16 model weights (also under FP8 training: TE keeps bf16 weights, casts per GEMM)."""
GRAD_BYTES: Final = 4.0
"""fp32 main gradients (Megatron accumulates and reduces grads in fp32 by default)."""
OPTIMIZER_BYTES: Final = 12.0
"""fp32 master weights + Adam first and second moments."""
FP16_GRAD_BYTES: Final = 2.0
"""fp16 training keeps fp16 model gradients; the fp32 main gradient (4 B) lives with the optimizer
state, so Megatron's table gives 20 B/param, or 4 + 16/d with the distributed optimizer
(``docs/user-guide/features/dist_optimizer.md``)."""
FP16_MAIN_GRAD_BYTES: Final = 4.0
MAX_TOKENS_PER_STEP: Final = 2**40
"""Largest seq_len x global_batch_size accepted (1.1e12 tokens; Llama 3 405B trained with 16M a step)."""
MAX_TOKENS: Final = 2**24
"""Largest seq_len and global_batch_size accepted (16,777,216; 1M-token contexts and 16K-sequence batches are
the largest published)."""


def grad_bytes_per_param(precision: str) -> float:
    """Bytes of one model gradient, as held and as reduced over data parallel.

    Megatron keeps and reduces gradients in their accumulation dtype: bf16 (and fp8, whose
    parameters are bf16) forces ``--accumulate-allreduce-grads-in-fp32`` (4 B; arguments.py:
    "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"), while fp16
    leaves it off, so fp16 gradients are held and reduced as fp16 (2 B), as in Megatron-DeepSpeed.
    """
    return FP16_GRAD_BYTES if precision == "fp16" else GRAD_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """What one training step processes."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    seq_len: int
    """Tokens per sequence (``--seq-length``)."""
    global_batch_size: int
    """Sequences per step (``--global-batch-size``)."""
    precision: Precision = "bf16"
    """GEMM precision; FP8 keeps bf16 weights and fp32 optimizer states."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer (Adam: 12 B/param of fp32 state)."""
    attention_backend: Literal["flash", "unfused"] = "flash"
    """flash/fused attention keeps no s^2 tensors; unfused (Megatron ``--attention-backend
    unfused``/local) keeps softmax output and dropout tensors of a*s^2*b elements."""

    def __post_init__(self) -> None:
        for fname in ("seq_len", "global_batch_size"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"{fname} must be a positive integer, got {brief(value)}")
            if value > MAX_TOKENS:
                raise SpecError(f"{fname} must be at most {MAX_TOKENS:,} (the limit), got {value}")
        if self.seq_len * self.global_batch_size > MAX_TOKENS_PER_STEP:
            raise SpecError(f"seq_len x global_batch_size = {self.seq_len * self.global_batch_size:.3g} tokens per "
                            f"step is over {MAX_TOKENS_PER_STEP:.3g} (the limit)")
        if self.attention_backend not in ("flash", "unfused"):
            raise SpecError(f"attention_backend must be flash or unfused, got {brief(self.attention_backend)}")
        if self.precision not in PRECISIONS:
            raise SpecError(f"precision must be one of {', '.join(PRECISIONS)}, got {brief(self.precision)}")

    @property
    def tokens_per_step(self) -> int:
        """Tokens per global batch."""
        return self.seq_len * self.global_batch_size
