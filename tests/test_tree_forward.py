"""One tree forward pass equals plain sequential forwards along each token's path."""

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.backends.torch import cache as kv_cache
from ppd_core.backend import StepRows
from ppd_core.backends.torch.decoder import TorchDecoder, forward_hidden
from ppd_core.backends.torch.masks import additive_mask
from ppd_core.backends.torch.loading import pick_decoder
from ppd_core.tree import TreeSpec, build_tree

SPEC = TreeSpec({(): 3, (0,): 1, (1,): 3, (1, 0): 2, (1, 1): 1, (1, 0, 1): 1})


def sequential_logits(model, embeds: torch.Tensor) -> np.ndarray:
    """Logits [vocab] at the last position of a plain causal forward over ``embeds`` [S, hidden]."""
    with torch.inference_mode():
        return model(inputs_embeds=embeds[None]).logits[0, -1].float().numpy()


@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_tree_logits_match_sequential_paths(forward):
    """``Decoder.tree_logits`` on NumPy node tokens and prompt-token rows: every row's logits are its path's."""
    model = tiny_llama(seed=1)
    decoder = TorchDecoder(pick_decoder(model, forward))
    V = 2
    tree = build_tree(SPEC, num_prompt_tokens=3, ensemble_size=V)
    embedding = model.get_input_embeddings()
    rng = np.random.default_rng(0)
    prompt_table = rng.standard_normal((3 * V, 64)).astype(np.float32)  # [n * V, hidden]
    context = rng.integers(0, 128, 10).tolist()
    node_tokens = rng.integers(0, 128, tree.num_nodes)  # [N] int64

    cache = decoder.new_cache()
    decoder.prefill(cache, context)
    step = decoder.tree_logits(cache, StepRows.of(tree, node_tokens, prompt_table[tree.prompt_embedding_index]))
    assert step.num_rows == tree.num_tokens
    tree_logits = step.rows(slice(None))  # [T, vocab] float32
    assert isinstance(tree_logits, np.ndarray) and tree_logits.dtype == np.float32
    np.testing.assert_array_equal(step.argmax(), tree_logits.argmax(-1))

    with torch.inference_mode():
        context_embeds = embedding(torch.tensor(context))
        node_embeds = embedding(torch.from_numpy(node_tokens))
    table = torch.from_numpy(prompt_table)
    for node, path in enumerate(tree.node_paths):
        path_embeds = torch.cat([context_embeds, node_embeds[list(path)]])
        np.testing.assert_allclose(tree_logits[node], sequential_logits(model, path_embeds), atol=1e-4, rtol=1e-4)
        for k in range(tree.prompt_counts[node]):
            for j in range(V):
                chain = table[[kk * V + j for kk in range(k + 1)]]  # member j of prompt tokens 1..k+1
                expected = sequential_logits(model, torch.cat([path_embeds, chain]))
                np.testing.assert_allclose(tree_logits[tree.prompt_slots[node, k, j]], expected, atol=1e-4, rtol=1e-4)


def test_additive_mask_has_context_columns():
    tree = build_tree(SPEC, num_prompt_tokens=3)
    mask = additive_mask(tree.row_parents, 5, torch.float32, torch.device("cpu"))  # derived from the parents alone
    T = tree.num_tokens
    assert mask.shape == (1, 1, T, 5 + T)
    assert (mask[0, 0, :, :5] == 0).all()
    allowed = (mask[0, 0, :, 5:] == 0).numpy()
    np.testing.assert_array_equal(allowed, tree.attention_mask)
    assert (mask[0, 0, :, 5:][~torch.from_numpy(tree.attention_mask)] == torch.finfo(torch.float32).min).all()


def test_keep_tree_entries_compacts_the_accepted_path():
    model = tiny_llama(seed=2)
    tree = build_tree(SPEC, num_prompt_tokens=3)
    cache = kv_cache.new_cache(model)
    TorchDecoder(model).prefill(cache, list(range(6)))
    with torch.inference_mode():
        embeds = torch.randn(tree.num_tokens, 64)
        positions = torch.from_numpy(tree.position_offsets) + 6
        forward_hidden(model, cache, embeds, positions, additive_mask(tree.row_parents, 6, torch.float32, torch.device("cpu")))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    path = tree.node_paths[tree.paths.index((1, 0, 1))]  # a non-contiguous path: (0, 2, 4, 6)
    assert list(path) != list(range(len(path)))
    cache.keep(6, path)
    assert cache.length == 6 + len(path)
    for (keys, values), layer in zip(before, cache.layers):
        rows = list(range(6)) + [6 + i for i in path]
        assert torch.equal(layer.keys, keys[:, :, rows])
        assert torch.equal(layer.values, values[:, :, rows])
    cache.truncate(4)
    assert cache.length == 4
