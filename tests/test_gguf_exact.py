"""Greedy PPD equals plain decoding token for token on GGUF files of many kinds, through the real llama.cpp:
the default model re-quantized by llama.cpp's own quantizer to the types users download, and tiny random models
of other architectures (sliding windows, scaled embeddings, biases, q/k norms, fused layers, no chat template),
with trees of prompt-token rows and lookup chains in the same steps."""

from __future__ import annotations

import numpy as np
import pytest

from ppd_core.backends.llamacpp import LlamaCppDecoder
from ppd_core.decoding import Request, Speculator, generate
from ppd_core.diagnostics import compare_answer, verdict
from ppd_core.engine import Engine, EngineConfig
from ppd_core.gguf_text import GgufTokenizer
from ppd_core.loading import default_model_file
from ppd_core.lookup import MATCH_CLASSES
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, vanilla_family
from tiny_gguf import requantize, tiny_models  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

PROMPTS = ["Write a short poem about rivers and the sea.", "List five fruits, then list them again in reverse."]
CHAINS = (4,) * len(MATCH_CLASSES)


def answer(decoder, speculator, prompt: list[int], max_new_tokens: int) -> tuple[list[int], int]:
    """The answer's tokens and how many of them came from guesses."""
    request = Request(prompt, max_new_tokens, frozenset(), decoder.max_context)  # no EOS: every token compared
    steps = list(generate(speculator, request))
    return [t for step in steps for t in step.tokens], sum(step.from_guesses for step in steps)


def next_logits(decoder, ids: list[int]) -> np.ndarray:
    """Plain decoding's logits [vocab] after ``ids``, from a fresh cache."""
    cache = decoder.new_cache()
    return decoder.prefill(cache, ids).rows(slice(0, 1))[0]


@pytest.fixture(scope="module")
def default_requantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("requantized")
    return lambda type_name: requantize(default_model_file(), folder / f"default-{type_name}.gguf", type_name)


# whether a batch of rows gets the logits single steps give them, on this project's CPUs (AVX-512 Xeon, AVX2 EPYC):
# the K-quant mixes fall back to Q5_0/Q5_1/Q8_0 for the default's 576-wide rows, and those files, IQ4_NL's and F16's
# give tree rows logits 0.3-0.9 away from single steps' (``rows_match_single_steps``)
ROW_INVARIANT = {"Q4_0": True, "Q8_0": True, "Q4_K_M": False, "Q5_K_M": False, "Q6_K": False, "IQ4_NL": False,
                 "F16": False}


@pytest.mark.parametrize("type_name", list(ROW_INVARIANT))
def test_default_model_requantized_greedy_ppd_equals_plain(default_requantized, type_name):
    """Bitwise files: greedy PPD equals plain decoding token for token. The others say so in the device panel, and
    every difference is a near-tie of plain decoding's own logits (``ppd doctor``'s rule)."""
    path = default_requantized(type_name)
    shipped = Engine.load(EngineConfig(model="default", tree="medium", threads=1, auto_calibrate=False))
    table_file = shipped.prompt_tokens.source
    shipped.close()
    engine = Engine.load(EngineConfig(model=str(path), prompt_tokens=str(table_file), tree="medium", threads=1,
                                      auto_calibrate=False))
    try:
        bitwise = engine.loaded.backend.bitwise
        assert engine.prompt_tokens.num_prompt_tokens == 3 and bitwise == ROW_INVARIANT[type_name]
        assert engine.exactness().startswith("bitwise" if bitwise else "equal up to floating-point near-ties")
        engine.set_lookup(4)
        guessed, comparisons = 0, []
        for index, prompt in enumerate(PROMPTS):
            ids = engine.chat_ids([{"role": "user", "content": prompt}])
            plain = engine.generate(ids, "vanilla", 48)
            ppd = engine.generate(ids, "ppd", 48)
            if bitwise:
                assert ppd.tokens == plain.tokens, (type_name, prompt)
            comparisons.append(compare_answer(index, ids, plain.tokens, ppd.tokens, engine.next_token_logits))
            guessed += ppd.stats.from_guesses
        assert verdict(comparisons, bitwise).passed, (type_name, comparisons)
        assert guessed, type_name  # guesses were verified and kept, not only plain steps
    finally:
        engine.close()


@pytest.mark.parametrize("architecture,type_name", [
    ("llama", "Q4_K_M"), ("gemma3", "Q4_0"), ("gemma3", "Q6_K"), ("gemma2", "Q8_0"), ("qwen2", "Q5_K_M"),
    ("qwen3", "IQ4_NL"), ("phi3", "Q4_K_M"),
])
def test_tiny_architectures_greedy_ppd_equals_plain(tiny_models, architecture, type_name):
    """Random prompt-token rows (3 depths) on every static tree's shape, with lookup chains: whatever they guess,
    the answer is plain decoding's (also past a sliding window of 8 positions): token for token where the file's
    kernels are row-invariant, else up to near-ties of plain decoding's own logits."""
    path = tiny_models.get(architecture, type_name)
    decoder = LlamaCppDecoder(path, threads=1, max_context=1024)
    try:
        assert decoder.accepts_embeddings and decoder.tree_note is None
        tokenizer = GgufTokenizer(decoder.model, decoder.llama, owner=decoder)
        rng = np.random.default_rng(0)
        table = decoder.embedding_rows(rng.integers(100, decoder.vocab_size, size=3))  # [3, hidden]
        guessed, comparisons = 0, []
        for prompt in PROMPTS:
            ids = (tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if tokenizer.has_own_template
                   else tokenizer.complete_ids(prompt))
            plain, _ = answer(decoder, Speculator(decoder, vanilla_family()), ids, 40)
            for name, spec in STATIC_TREES.items():
                family = family_from_spec(name, spec, 3)
                tokens, from_guesses = answer(decoder, Speculator(decoder, family, table, CHAINS), ids, 40)
                if decoder.bitwise:
                    assert tokens == plain, (architecture, type_name, name, prompt)
                comparisons.append(compare_answer(len(comparisons), ids, plain, tokens, lambda ids: next_logits(decoder, ids)))
                guessed += from_guesses
        assert verdict(comparisons, decoder.bitwise).passed, (architecture, type_name, decoder.bitwise, comparisons)
        assert guessed, (architecture, type_name)
    finally:
        decoder.close()
