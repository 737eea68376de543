"""Shared fixtures: tiny random Llama models built in the test, and the real default model."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


# Calibration profiles go to the user's data directory: keep the tests' own apart.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="ppd-test-data-")


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
    """The embedded default model on torch in fp32 with its shipped prompt tokens (loaded once per test session).

    ``backend="torch"``: transformers' de-quantized copy of the GGUF, so these tests compare against transformers' own
    forward and ``generate()`` (the default GGUF on llama.cpp is tests/test_llamacpp.py's).
    """
    from ppd_core.engine import Engine, EngineConfig

    return Engine.load(EngineConfig(model="default", quant="none", device="cpu", tree="medium", backend="torch"))


def save_tiny_model(folder, default_engine, seed: int = 0):
    vocab = default_engine.loaded.model.config.vocab_size
    model = tiny_llama(seed=seed, vocab_size=vocab, max_positions=512)
    model.generation_config.eos_token_id = default_engine.tokenizer.eos_token_id
    model.save_pretrained(folder)
    default_engine.tokenizer.save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_engine):
    """A tiny random Llama saved as a Hugging Face directory, with the default model's tokenizer, and
    untrained prompt tokens where ``ppd train`` would have saved trained ones (the engine finds them there)."""
    from ppd_core.engine import PromptTokens, user_prompt_tokens_path
    from ppd_core.prompt_tokens import INIT_TEXT

    folder = tmp_path_factory.mktemp("tiny")
    model = save_tiny_model(folder, default_engine)
    ids = default_engine.tokenizer.encode(INIT_TEXT, add_special_tokens=False)
    tokens = PromptTokens.initialize(model.get_input_embeddings().weight, ids, folder.name)
    path = user_prompt_tokens_path(folder.name, tokens.signature)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens.save(path)
    return folder


@pytest.fixture(scope="session")
def lookup_only_dir(tmp_path_factory, default_engine):
    """Another tiny Llama (another seed: prompt tokens are found by the embedding table's fingerprint) with no prompt
    tokens anywhere: the engine guesses by n-gram lookup alone."""
    folder = tmp_path_factory.mktemp("tiny-lookup-only")
    save_tiny_model(folder, default_engine, seed=5)
    return folder


REAL_MODEL_FIXTURES = {"default_engine", "running_app"}  # tiny_model_dir needs default_engine (its tokenizer)


def pytest_collection_modifyitems(items):
    """Mark ``slow`` every test that loads the real default model through a fixture (others mark themselves)."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
