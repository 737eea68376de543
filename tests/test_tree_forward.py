"""One tree forward pass equals plain sequential forwards along each token's path."""

import pytest
import torch

from conftest import tiny_llama
from ppd_core import kv_cache
from ppd_core.loading import pick_decoder
from ppd_core.backends.torch_backend import forward_hidden, logits_of
from ppd_core.tree import TreeSpec, build_tree
from ppd_core.backends.torch_backend import TorchDecoder

SPEC = TreeSpec({(): 3, (0,): 1, (1,): 3, (1, 0): 2, (1, 1): 1, (1, 0, 1): 1})


def sequential_logits(model, embeds: torch.Tensor) -> torch.Tensor:
    """Logits at the last position of a plain causal forward over ``embeds`` [S, hidden]."""
    with torch.inference_mode():
        return model(inputs_embeds=embeds[None]).logits[0, -1].float()


@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_tree_logits_match_sequential_paths(forward):
    model = tiny_llama(seed=1)
    decoder = pick_decoder(model, forward)
    V = 2
    tree = build_tree(SPEC, num_prompt_tokens=3, ensemble_size=V)
    embedding = model.get_input_embeddings()
    generator = torch.Generator().manual_seed(0)
    prompt_table = torch.randn(3 * V, 64, generator=generator)  # [n * V, hidden]
    context = torch.randint(0, 128, (10,), generator=generator).tolist()
    node_tokens = torch.randint(0, 128, (tree.num_nodes,), generator=generator)

    cache = kv_cache.new_cache(decoder)
    TorchDecoder(decoder).prefill(cache, context)
    with torch.inference_mode():
        embeds = torch.cat([embedding(node_tokens), prompt_table[tree.prompt_embedding_index]])
        positions = tree.position_offsets + len(context)
        mask = tree.additive_mask(len(context), torch.float32, torch.device("cpu"))
        tree_logits = logits_of(decoder, forward_hidden(decoder, cache, embeds, positions, mask))

    context_embeds = embedding(torch.tensor(context))
    for node, path in enumerate(tree.node_paths):
        path_embeds = torch.cat([context_embeds, embedding(node_tokens[list(path)])])
        torch.testing.assert_close(tree_logits[node], sequential_logits(model, path_embeds), atol=1e-4, rtol=1e-4)
        for k in range(tree.prompt_counts[node]):
            for j in range(V):
                chain = prompt_table[[kk * V + j for kk in range(k + 1)]]  # member j of prompt tokens 1..k+1
                expected = sequential_logits(model, torch.cat([path_embeds, chain]))
                torch.testing.assert_close(tree_logits[tree.prompt_slots[node, k, j]], expected, atol=1e-4, rtol=1e-4)


def test_keep_tree_entries_compacts_the_accepted_path():
    model = tiny_llama(seed=2)
    tree = build_tree(SPEC, num_prompt_tokens=3)
    cache = kv_cache.new_cache(model)
    TorchDecoder(model).prefill(cache, list(range(6)))
    with torch.inference_mode():
        embeds = torch.randn(tree.num_tokens, 64)
        forward_hidden(model, cache, embeds, tree.position_offsets + 6, tree.additive_mask(6, torch.float32, torch.device("cpu")))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    path = tree.node_paths[tree.paths.index((1, 0, 1))]  # a non-contiguous path: (0, 2, 4, 6)
    assert list(path) != list(range(len(path)))
    kv_cache.keep_tree_entries(cache, 6, path)
    assert kv_cache.cache_length(cache) == 6 + len(path)
    for (keys, values), layer in zip(before, cache.layers):
        rows = list(range(6)) + [6 + i for i in path]
        assert torch.equal(layer.keys, keys[:, :, rows])
        assert torch.equal(layer.values, values[:, :, rows])
    kv_cache.truncate(cache, 4)
    assert kv_cache.cache_length(cache) == 4
