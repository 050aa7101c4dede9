"""Shared fixtures: small models and clusters built from presets."""

from __future__ import annotations

import pytest

from paraplan.specs.cluster import ClusterSpec, make_cluster
from paraplan.specs.load import load_gpu, load_model, model_from_megatron_args
from paraplan.specs.model import ModelSpec


def gpt_model(**kw: object) -> ModelSpec:
    """A GPT-3 style model (LayerNorm, GeLU, biases, learned positions, tied, dropout on)."""
    base = {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 50257,
            "max_position_embeddings": 4096}
    base.update(kw)
    return model_from_megatron_args(base)


@pytest.fixture
def llama8b() -> ModelSpec:
    return load_model("llama3-8b")


@pytest.fixture
def h100x16() -> ClusterSpec:
    return make_cluster(load_gpu("h100-80gb"), 16)
