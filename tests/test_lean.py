"""The lean Llama-family forward and its static cache against transformers' own forward."""

import logging

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from conftest import tiny_llama
from ppd_core.backend import StepRows
from ppd_core.backends.torch import cache as kv_cache
from ppd_core.backends.torch.decoder import TorchDecoder, forward_hidden, logits_of
from ppd_core.backends.torch.loading import load_gguf_with_transformers, pick_decoder
from ppd_core.loaded import LoadOptions
from ppd_core.backends.torch.lean.model import LeanDecoder
from ppd_core.loading import DEFAULT_NAME, default_model_file
from ppd_core.tree import TreeSpec, build_tree


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """A 2-layer random Qwen2 with q/k/v biases, weights scaled so logits spread over several units."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).eval().requires_grad_(False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2-biases"])
def test_lean_logits_equal_transformers(make):
    model = make()
    ids = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = reference_logits(model, ids)
    lean = LeanDecoder(model)
    assert lean.layers[0].bqkv is not None if make is tiny_qwen2 else lean.layers[0].bqkv is None
    cache = kv_cache.new_cache(lean)
    embedding = model.get_input_embeddings()
    with torch.inference_mode():  # in two chunks: the second attends to the cached first
        first = forward_hidden(lean, cache, embedding(torch.tensor(ids[:25])), torch.arange(25), None)
        second = forward_hidden(lean, cache, embedding(torch.tensor(ids[25:])), torch.arange(25, 40), None)
        logits = logits_of(lean, torch.cat([first, second]))
    assert expected.abs().max() > 1.0  # logits of a real spread, so the bound below means something
    assert (logits - expected).abs().max() <= 1e-4
    assert torch.equal(reference_logits(model, ids), expected)  # the model itself is unchanged by sharing its weights


def test_static_cache_keeps_random_paths_exactly():
    """After keeping an accepted path, the next step's logits equal a sequential forward over context + path."""
    model = tiny_llama(seed=4)
    decoder = TorchDecoder(LeanDecoder(model))
    rng = np.random.default_rng(2)
    spec = TreeSpec({(): 0, (0,): 0, (1,): 0, (2,): 0, (0, 0): 0, (0, 1): 0, (1, 0): 0, (0, 0, 0): 0, (1, 0, 0): 0})
    tree = build_tree(spec, num_prompt_tokens=3)
    context = rng.integers(0, 128, 12).tolist()
    for trial in range(6):
        cache = decoder.new_cache()
        decoder.prefill(cache, context)
        node_tokens = rng.integers(0, 128, tree.num_nodes)  # [N] int64
        rows = StepRows.of(tree, node_tokens)
        step = decoder.tree_logits(cache, rows)
        assert step.num_rows == tree.num_tokens
        path = tree.node_paths[int(rng.integers(tree.num_nodes))]
        decoder.keep(cache, len(context), path, rows)
        assert decoder.cache_length(cache) == len(context) + len(path)
        kept = context + node_tokens[list(path)].tolist()
        nxt = int(rng.integers(0, 128))
        logits = decoder.prefill(cache, [nxt]).rows(slice(0, 1))[0]  # [vocab] float32 NumPy
        expected = reference_logits(model, kept + [nxt])[-1].numpy()
        np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_static_cache_grows_past_its_first_capacity():
    model = tiny_llama(seed=6, max_positions=2048)
    lean = LeanDecoder(model)
    cache = kv_cache.new_cache(lean)
    ids = torch.randint(0, 128, (1100,), generator=torch.Generator().manual_seed(3)).tolist()
    assert cache.capacity < len(ids)
    TorchDecoder(lean).prefill(cache, ids[:1000])
    with torch.inference_mode():
        hidden = forward_hidden(lean, cache, model.get_input_embeddings()(torch.tensor(ids[1000:])), torch.arange(1000, 1100), None)
    assert cache.capacity >= 1100 and cache.length == 1100
    torch.testing.assert_close(logits_of(lean, hidden)[-1], reference_logits(model, ids)[-1], atol=1e-4, rtol=0)


def test_unsupported_architecture_falls_back_with_one_line(caplog):
    model = tiny_llama(seed=7)
    model.config.hidden_act = "gelu"
    with caplog.at_level(logging.WARNING):
        decoder = pick_decoder(model, "lean")
    assert decoder is model
    notices = [r.getMessage() for r in caplog.records]
    assert notices == ["lean forward unavailable (activation 'gelu'): using the transformers forward"]
    assert isinstance(pick_decoder(tiny_llama(seed=7), "lean"), LeanDecoder)
    plain = tiny_llama(seed=7)
    assert pick_decoder(plain, "transformers") is plain


@pytest.mark.slow
def test_default_model_lean_logits_equal_transformers():
    """The default GGUF through transformers (``--backend torch``: its float32 copy), on the lean forward."""
    loaded = load_gguf_with_transformers(default_model_file(), DEFAULT_NAME, LoadOptions("none", "cpu", backend="torch"))
    assert loaded.forward == "lean" and loaded.quant == "none" and loaded.dtype == torch.float32
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Explain in detail how a bicycle works."}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = reference_logits(loaded.model, ids)
    lean = loaded.backend.model
    cache = kv_cache.new_cache(lean)
    with torch.inference_mode():
        hidden = forward_hidden(lean, cache, loaded.model.get_input_embeddings()(torch.tensor(ids)), torch.arange(len(ids)), None)
        logits = logits_of(lean, hidden)
    assert (logits - expected).abs().max() <= 1e-4
