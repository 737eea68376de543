"""Shared fixtures: tiny random Llama models built in the test, and the real default model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, vocab_size: int = 128, hidden_size: int = 64, max_positions: int = 256) -> LlamaForCausalLM:
    """A 2-layer random Llama in fp32: fast, and with peaked enough logits to avoid argmax ties."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)  # sharpen the logits
    return model


@pytest.fixture(scope="session")
def default_engine():
    """The embedded default model with its shipped prompt tokens (loaded once per test session)."""
    from ppd_core.engine import Engine, EngineConfig

    return Engine.load(EngineConfig(model="default", device="cpu"))
