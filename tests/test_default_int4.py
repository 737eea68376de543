"""The embedded default model with int4 weights (the CPU default): tree steps are bitwise plain steps.

The packed int4 / int8 kernels give each row the same result whatever the number of rows, and a
tree step attends row by row (``LeanDecoder._attention_by_row``), so a node's hidden state in a
tree step is bit for bit the one plain decoding computes for that token. Without that, greedy PPD
drifted from plain decoding on the real model's near-ties (the tiny model has none).
"""

import pytest
import torch

from ppd_core.engine import Engine, EngineConfig
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, vanilla_family

PROMPTS = [
    "Give me three tips for staying healthy.",
    "Write a long story about a dragon who learns to bake bread.",
    "Write a Python function that merges two sorted lists, and explain it.",
]
NEW_TOKENS = 128

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def int4_engine():
    return Engine.load(EngineConfig(model="default", quant="int4", device="cpu", tree="medium"))


def prefilled(engine, prompt):
    decoder = engine.loaded.decoder
    ids = torch.tensor(engine.chat_ids([{"role": "user", "content": prompt}]))
    cache = decoder.new_cache()
    decoder(decoder.get_input_embeddings()(ids), torch.arange(len(ids)), None, cache)
    return decoder, cache


def plain_steps(decoder, cache, tokens):
    """Hidden states of ``tokens`` fed one per step after ``cache`` (which is left as it was)."""
    start = cache.length
    embeds = decoder.get_input_embeddings()(tokens)
    hidden = [decoder(embeds[i : i + 1], torch.tensor([start + i]), None, cache) for i in range(len(tokens))]
    cache.truncate(start)
    return torch.cat(hidden)


def test_block_of_ten_equals_ten_plain_steps_bitwise(int4_engine):
    decoder, cache = prefilled(int4_engine, PROMPTS[0])
    start = cache.length
    tokens = torch.randint(0, 5000, (10,), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 1, 10, start + 10, dtype=torch.bool).tril(start)
    block = decoder(decoder.get_input_embeddings()(tokens), torch.arange(start, start + 10), mask, cache)  # all rows exact
    cache.truncate(start)
    assert torch.equal(block, plain_steps(decoder, cache, tokens))


def test_every_node_of_a_tree_step_equals_plain_steps_along_its_path(int4_engine):
    decoder, cache = prefilled(int4_engine, PROMPTS[1])
    start = cache.length
    tree = family_from_spec("large", STATIC_TREES["large"], 3).for_depth(3)
    tokens = torch.randint(0, 5000, (tree.num_nodes,), generator=torch.Generator().manual_seed(1))
    table = int4_engine.prompt_tokens.flat(torch.float32, torch.device("cpu"))  # [n * V, hidden]: prompt-token rows ride along
    embeds = torch.cat([decoder.get_input_embeddings()(tokens), table[tree.prompt_embedding_index]])
    mask = tree.additive_mask(start, embeds.dtype, embeds.device)
    hidden = decoder(embeds, tree.position_offsets + start, mask, cache, exact_rows=tree.num_nodes)
    cache.truncate(start)
    assert all(parent < node for node, parent in enumerate(tree.parents) if node)  # paths ascend: rows sit in path order
    for node, path in enumerate(tree.node_paths):
        assert torch.equal(hidden[node], plain_steps(decoder, cache, tokens[list(path)])[-1]), path


@pytest.mark.parametrize("prompt", PROMPTS)
def test_int4_ppd_equals_int4_plain_on_every_static_tree(int4_engine, prompt):
    ids = int4_engine.chat_ids([{"role": "user", "content": prompt}])
    plain = int4_engine.generate(ids, "vanilla", NEW_TOKENS).tokens
    saved = int4_engine.family
    try:
        for name, spec in STATIC_TREES.items():
            int4_engine.set_tree(family_from_spec(name, spec, 3))
            result = int4_engine.generate(ids, "ppd", NEW_TOKENS)
            assert result.tokens == plain, name
            assert result.stats.mean_accepted > 1.0, name  # the trees did guess right sometimes
    finally:
        int4_engine.set_tree(saved)


@pytest.mark.parametrize("tree", ["vanilla", "medium"])
def test_lookup_chains_keep_greedy_output_exact(int4_engine, tree):
    """Lookup guesses on a prompt that makes the model copy, alone (plain family) and merged with a PPD tree."""
    ids = int4_engine.chat_ids([{"role": "user", "content": (
        "Fix the typo in this code and show the whole corrected code:\n\n"
        "def greet(name):\n    mesage = 'Hello, ' + name\n    print(mesage)\n    return mesage\n")}])
    plain = int4_engine.generate(ids, "vanilla", 96).tokens
    saved = int4_engine.family
    try:
        if tree == "vanilla":
            int4_engine.set_tree(vanilla_family())
        int4_engine.set_lookup(4)
        result = int4_engine.generate(ids, "ppd", 96)
    finally:
        int4_engine.set_tree(saved)
        int4_engine.set_lookup(None)
    assert result.tokens == plain
    # lookup guessed and saved steps (how much depends on the answer, which int4 numerics change per CPU:
    # on an AVX2 EPYC this answer rewrites the code instead of copying it, 6 lookup tokens in 47)
    assert result.stats.from_lookup > 0 and result.stats.steps < result.stats.new_tokens


def test_lookup_copies_from_earlier_turns_with_a_reused_cache(int4_engine):
    """Turn 2 continues the kept cache; its lookup index still holds turn 1 (``Request.history``)."""
    code = "def greet(name):\n    mesage = 'Hello, ' + name\n    print(mesage)\n    return mesage\n"
    first = [{"role": "user", "content": "Explain this code briefly:\n\n" + code}]
    saved = int4_engine.family
    try:
        int4_engine.set_tree(vanilla_family())
        int4_engine.set_lookup(4)
        answer = list(int4_engine.stream(int4_engine.chat_ids(first), "ppd", 64, reuse_cache=True))[-1].text
        second = first + [{"role": "assistant", "content": answer},
                          {"role": "user", "content": "Now fix the typo and show the whole corrected code."}]
        ids = int4_engine.chat_ids(second)
        events = list(int4_engine.stream(ids, "ppd", 64, reuse_cache=True))
    finally:
        int4_engine.set_tree(saved)
        int4_engine.set_lookup(None)
    assert events[-1].stats.reused_tokens > 0  # the second turn continued the first turn's cache
    assert events[-1].tokens == int4_engine.generate(ids, "vanilla", 64).tokens
    assert events[-1].stats.from_lookup > 5
