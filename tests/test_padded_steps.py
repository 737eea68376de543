"""One shape per step (``StepRows.pad_to``): every generation step decoded as exactly R rows, the tree's then
padding rows no real row sees. On the CPU the padded step gives the real rows, bit for bit, the logits the unpadded
step gives (token rows and prompt-token embedding rows, the default model and the tiny architectures), the padding
leaves no cell behind, and greedy decoding is token for token the same over two turns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ppd_core.backend import StepRows
from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder

from ppd_core.backends.llamacpp.library import LlamaCppError
from ppd_core.calibration.latency import probe_tree
from ppd_core.decoding import Speculator
from ppd_core.tree import TreeFamily, TreeSpec, build_tree
from tiny_gguf import ARCHITECTURES, tiny_models  # noqa: F401 - fixture

TURNS = ["Give me three tips for staying healthy.", "Now repeat the second tip in other words."]


def step_logits(decoder: LlamaCppDecoder, context: list[int], tree, nodes, prompt_rows, rows: int | None) -> tuple:
    """A tree step after ``context`` then a 1-token step after its root, padded to ``rows`` (None: not padded):
    both steps' logits, and the cells the context holds after them."""
    cache = decoder.new_cache()
    decoder.prefill(cache, context)
    step = StepRows.of(tree, nodes, prompt_rows, pad_to=rows)
    first = decoder.tree_logits(cache, step).values.copy()  # [T, vocab]
    decoder.keep(cache, len(context), [0], step)
    plain = build_tree(TreeSpec({(): 0}), 1, 1)
    step = StepRows.of(plain, np.array([nodes[1] if len(nodes) > 1 else 7]), pad_to=rows)
    second = decoder.tree_logits(cache, step).values.copy()
    decoder.keep(cache, len(context) + 1, [0], step)
    cells = decoder.llama.llama_memory_seq_pos_max(decoder.memory, decoder.pad_seq)
    decoder.truncate(cache, 0)
    return first, second, cells


def assert_padding_is_invisible(decoder: LlamaCppDecoder, prompt_table=None, n: int = 0, V: int = 1) -> None:
    rng = np.random.default_rng(0)
    context = rng.integers(decoder.vocab_size, size=64).tolist()
    for size in (1, 5, 13):
        tree = probe_tree(size, n, V) if prompt_table is not None else probe_tree(size, 0, 1)
        nodes = np.array([context[-1], *rng.integers(decoder.vocab_size, size=tree.num_nodes - 1)], dtype=np.int64)
        prompt_rows = prompt_table[tree.prompt_embedding_index] if tree.num_tokens > tree.num_nodes else None
        alone = step_logits(decoder, context, tree, nodes, prompt_rows, None)
        for rows in sorted({tree.num_tokens, 16}):
            padded = step_logits(decoder, context, tree, nodes, prompt_rows, rows)
            assert np.array_equal(alone[0], padded[0]) and np.array_equal(alone[1], padded[1]), (size, rows)
            assert padded[2] == -1  # no padding cell is left


def test_padded_rows_are_bitwise_the_unpadded_ones_on_the_default_model(llama_default):
    engine = llama_default
    decoder = engine.loaded.backend
    assert decoder.bitwise  # else the comparison below would say nothing about padding
    prompt_tokens = engine.prompt_tokens
    assert_padding_is_invisible(decoder)  # token rows
    assert_padding_is_invisible(decoder, prompt_tokens.table(), prompt_tokens.num_prompt_tokens,
                                prompt_tokens.ensemble_size)  # prompt-token rows: an embedding batch


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_padded_rows_are_bitwise_the_unpadded_ones_on_every_tiny_architecture(tiny_models, architecture):  # noqa: F811
    decoder = LlamaCppDecoder(tiny_models.get(architecture), threads=2)
    try:
        assert_padding_is_invisible(decoder)
    finally:
        decoder.close()


def test_greedy_answers_are_the_same_padded_over_two_turns(llama_default, monkeypatch):
    """The engine pads every PPD step as a profile's ``fixed`` step policy makes it (``DecodePlan.padded_rows``)."""
    engine = llama_default
    decoder = engine.loaded.backend
    shapes = []
    tree_logits = decoder.tree_logits
    monkeypatch.setattr(decoder, "tree_logits", lambda cache, rows: shapes.append(
        (rows.num_rows, rows.pad_to)) or tree_logits(cache, rows))
    answers = {}
    for rows in (None, 16):  # the medium tree's 16 rows: every step padded to them
        monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, padded_rows=rows))
        messages, tokens = [], []
        for turn in TURNS:
            messages.append({"role": "user", "content": turn})
            result = engine.generate(engine.chat_ids(messages), "ppd", 24)
            messages.append({"role": "assistant", "content": result.text})
            tokens.append(result.tokens)
        answers[rows] = tokens
    padded = [rows for size, rows in shapes[len(shapes) // 2:]]
    assert set(padded) == {16} and {rows for _, rows in shapes[: len(shapes) // 2]} == {None}
    assert min(size for size, _ in shapes) < 16  # smaller trees were padded up
    assert answers[None] == answers[16]
    plain = engine.generate(engine.chat_ids([{"role": "user", "content": TURNS[0]}]), "plain", 24)
    assert plain.tokens == answers[16][0] and shapes[-1][1] is None  # plain decoding: 1-token steps, unpadded


def test_a_padded_shape_bounds_the_trees_and_is_checked(llama_default):
    decoder = llama_default.loaded.backend
    cache = decoder.new_cache()
    decoder.prefill(cache, [1, 2, 3])
    with pytest.raises(LlamaCppError, match="computes 1 to 32"):
        decoder.tree_logits(cache, StepRows.of(probe_tree(5, 0, 1), np.arange(5, dtype=np.int64), pad_to=33))
    with pytest.raises(LlamaCppError, match="a step of 5 rows padded to 4"):
        decoder.tree_logits(cache, StepRows.of(probe_tree(5, 0, 1), np.arange(5, dtype=np.int64), pad_to=4))
    decoder.truncate(cache, 0)
    family = TreeFamily("plain", (probe_tree(1, 0, 1),))
    assert Speculator(decoder, family, pad_to=4).new_draft().max_rows == 4  # decoding drafts no chain past it
    assert Speculator(decoder, family).new_draft().max_rows == decoder.info.max_tree_rows == 32
