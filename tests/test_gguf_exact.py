"""Greedy PPD equals plain decoding token for token on GGUF files of many kinds, through the real llama.cpp:
the default model re-quantized by llama.cpp's own quantizer to the types users download, and tiny random models
of other architectures (sliding windows, scaled embeddings, biases, q/k norms, fused layers, no chat template),
with trees of prompt-token rows and lookup chains in the same steps."""

from __future__ import annotations

import numpy as np
import pytest

from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core import Engine, EngineConfig
from ppd_core.backends.llamacpp.text import GgufTokenizer
from ppd_core.loading import default_model_file
from ppd_core.drafters.lookup import MATCH_CLASSES, LookupDrafter
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, plain_family
from tiny_gguf import requantize, tiny_models  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

PROMPTS = ["Write a short poem about rivers and the sea.", "List five fruits, then list them again in reverse."]
CHAINS = (4,) * len(MATCH_CLASSES)


def answer(decoder, speculator, prompt: list[int], max_new_tokens: int, hook=None, chains=None) -> tuple[list[int], int]:
    """The answer's tokens and how many of them came from guesses."""
    request = check_answer(prompt, max_new_tokens, decoder.max_context)  # the speculator knows no EOS: all compared
    answering = Answering(drafters=[LookupDrafter(chains, prompt)] if chains is not None else [], guess_hook=hook)
    steps = list(generate(speculator, request, answering))
    return [t for step in steps for t in step.tokens], sum(step.from_guesses for step in steps)


@pytest.fixture(scope="module")
def default_requantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("requantized")
    return lambda type_name: requantize(default_model_file(), folder / f"default-{type_name}.gguf", type_name)


# the types users download; ppd's build (no llamafile GEMM) with ggml's tiled K-quant multiply off gives every one of
# them row-invariant kernels on this project's CPU (``rows_match_single_steps``); with either on, K-quant, IQ4_NL
# and F16 files' tree rows were 0.3-0.9 logits away from single steps'
TYPES = ["Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "F16"]


@pytest.mark.parametrize("type_name", TYPES)
def test_default_model_requantized_greedy_ppd_equals_plain(default_requantized, llama_default, type_name):
    """Every tree row gets a plain step's logits bit for bit, so greedy PPD equals plain decoding token for token,
    with the shipped prompt tokens' trees and lookup chains."""
    path = default_requantized(type_name)
    table_file = llama_default.prompt_tokens.source  # the default model's shipped prompt tokens
    engine = Engine.load(EngineConfig(model=str(path), prompt_tokens=str(table_file), tree="medium", threads=2,
                                      auto_calibrate=False))
    try:
        assert engine.prompt_tokens.num_prompt_tokens == 3 and engine.loaded.backend.bitwise
        assert engine.snapshot().exactness.startswith("bitwise")
        engine.replan(lookup=4)
        guessed = 0
        for prompt in PROMPTS:
            ids = engine.chat_ids([{"role": "user", "content": prompt}])
            plain = engine.generate(ids, "plain", 48)
            ppd = engine.generate(ids, "ppd", 48)
            assert ppd.tokens == plain.tokens, (type_name, prompt)
            guessed += ppd.stats.from_guesses
        assert guessed, type_name  # guesses were verified and kept, not only plain steps
    finally:
        engine.close()


def planting(plain: list[int]):
    """A guess hook that, every other step, puts plain decoding's next tokens at rank 1 of the guesses (random prompt
    rows rarely guess right): trees then accept guesses of both ranks' branches, and must still answer as plain."""
    def hook(produced: list[int], guesses: np.ndarray) -> np.ndarray:
        if len(produced) % 2:
            return guesses
        planted = guesses.copy()
        ahead = plain[len(produced) : len(produced) + planted.shape[0]]
        planted[: len(ahead), min(1, planted.shape[1] - 1)] = ahead
        return planted
    return hook


@pytest.mark.parametrize("architecture,type_name", [
    ("llama", "Q4_K_M"), ("gemma3", "Q4_0"), ("gemma3", "Q6_K"), ("gemma2", "Q8_0"), ("qwen2", "Q5_K_M"),
    ("qwen3", "IQ4_NL"), ("phi3", "Q4_K_M"),
])
def test_tiny_architectures_greedy_ppd_equals_plain(tiny_models, architecture, type_name):
    """Random prompt-token rows (3 depths) on every static tree's shape, with lookup chains: whatever they guess,
    the answer is plain decoding's token for token (also past a sliding window of 8 positions)."""
    path = tiny_models.get(architecture, type_name)
    decoder = LlamaCppDecoder(path, threads=1, max_context=1024)
    try:
        assert decoder.accepts_embeddings and decoder.tree_note is None and decoder.bitwise
        tokenizer = GgufTokenizer(decoder.model, decoder.llama, owner=decoder)
        rng = np.random.default_rng(0)
        table = decoder.embedding_rows(rng.integers(100, decoder.vocab_size, size=3))  # [3, hidden]
        guessed = 0
        for prompt in PROMPTS:
            ids = (tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if tokenizer.has_own_template
                   else tokenizer.complete_ids(prompt))
            plain, _ = answer(decoder, Speculator(decoder, plain_family()), ids, 40)
            for name, spec in STATIC_TREES.items():
                family = family_from_spec(name, spec, 3)
                tokens, from_guesses = answer(decoder, Speculator(decoder, family, table), ids, 40,
                                              planting(plain), FixedChains(CHAINS))
                assert tokens == plain, (architecture, type_name, name, prompt)
                guessed += from_guesses
        assert guessed, (architecture, type_name)
    finally:
        decoder.close()
