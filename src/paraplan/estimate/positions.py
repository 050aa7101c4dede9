"""The position-table size a run needs (Megatron's ``max_position_embeddings`` against ``seq_length``).

Its own module so that the step-time formulas (``estimate.step_time``) and the one-layout estimate
(``paraplan.estimator``) both import it from below, not from each other.
"""

from __future__ import annotations

from paraplan.errors import LayoutError
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec


def max_positions_for(model: ModelSpec, training: TrainingSpec) -> tuple[int, list[str]]:
    """Position-table size and notes; Megatron requires max_position_embeddings >= seq_length."""
    notes: list[str] = []
    mpe = model.max_position_embeddings
    if mpe is None:
        return training.seq_len, notes
    if mpe < training.seq_len:
        if model.position_embedding_type == "learned_absolute":
            raise LayoutError(
                f"max_position_embeddings ({mpe}) must be greater than or equal to seq_length "
                f"({training.seq_len}).",
                reason="MAX_POSITIONS_LT_SEQ",
            )
        notes.append(
            f"max_position_embeddings {mpe} < seq_length {training.seq_len}: Megatron requires >=; "
            f"with {model.position_embedding_type} positions it only matters for the flag, launch files "
            f"use {training.seq_len}"
        )
        return training.seq_len, notes
    return mpe, notes
