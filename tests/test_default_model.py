"""The real embedded default model (SmolLM2-135M-Instruct): PPD is exactly plain greedy decoding."""

import pytest

from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeSpec, family_from_spec
from ppd_core.training.greedy import reference_answer

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain in detail how a bicycle works.",
    "Write a Python class for a bank account with deposit and withdraw methods, and explain it.",
    "Give me ten tips for learning a new language, with a sentence on each.",
    "Describe the water cycle for a school report.",
]
NEW_TOKENS = 128  # the oracle's answer (PROMPTS[0])
ANSWER = 64  # every prompt's answer compared three ways: long answers are tests/test_llamacpp.py's (448 and 500 tokens)
# The chain (1, 0, 1) with 3 prompt tokens on each of its nodes, plus some distractors.
CHAIN = TreeSpec({(): 3, (0,): 1, (1,): 3, (1, 0): 3, (1, 1): 1, (1, 0, 1): 3, (1, 0, 0): 1})


@pytest.fixture(scope="module")
def plain_answers(default_engine):
    """Plain decoding's answer to each prompt: NEW_TOKENS tokens for the oracle's, ANSWER for the others."""
    return {p: default_engine.generate(default_engine.chat_ids([{"role": "user", "content": p}]), "plain",
                                       NEW_TOKENS if p == PROMPTS[0] else ANSWER).tokens for p in PROMPTS}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ppd_equals_plain_and_transformers_generate(default_engine, plain_answers, prompt):
    ids = default_engine.chat_ids([{"role": "user", "content": prompt}])
    ppd = default_engine.generate(ids, "ppd", ANSWER)
    assert len(ppd.tokens) == ANSWER
    assert ppd.tokens == plain_answers[prompt][:ANSWER]
    assert ppd.tokens == reference_answer(default_engine.loaded, ids, ANSWER)
    assert ppd.text == default_engine.tokenizer.decode(plain_answers[prompt][:ANSWER], skip_special_tokens=True)


def planted(reference, ranks, vocab):
    """Guess hook: the true token of depth d at rank ranks[d - 1] (or nowhere), wrong tokens elsewhere."""

    def hook(produced, guesses):  # guesses: [m, K] int64
        out = guesses.copy()
        for d in range(out.shape[0]):
            position = len(produced) + d
            truth = reference[position] if position < len(reference) else 0
            out[d] = [(truth + 1 + r) % vocab for r in range(out.shape[1])]
            if ranks is not None and position < len(reference):
                out[d, ranks[d]] = truth
        return out

    return hook


def test_oracle_guesses_are_accepted_and_compacted(default_engine, plain_answers):
    prompt = PROMPTS[0]
    reference = plain_answers[prompt]
    ids = default_engine.chat_ids([{"role": "user", "content": prompt}])
    vocab = default_engine.loaded.model.config.vocab_size
    saved = default_engine.plan.family
    try:
        default_engine.replan(tree=family_from_spec("chain", CHAIN, 3))
        result = default_engine.generate(ids, "ppd", NEW_TOKENS, guess_hook=planted(reference, (1, 0, 1), vocab))
    finally:
        default_engine.replan(tree=saved)
    assert result.tokens == reference
    assert result.stats.mean_accepted > 3.8  # tree depth 3 + the bonus token, less the edges
    assert result.stats.from_guesses > 0.7 * NEW_TOKENS


def test_oracle_nowhere_accepts_exactly_one(default_engine, plain_answers):
    prompt = PROMPTS[1]
    reference = plain_answers[prompt]
    ids = default_engine.chat_ids([{"role": "user", "content": prompt}])
    vocab = default_engine.loaded.model.config.vocab_size
    result = default_engine.generate(ids, "ppd", 64, guess_hook=planted(reference, None, vocab))
    assert result.tokens == reference[:64]
    assert result.stats.mean_accepted == 1.0 and result.stats.from_guesses == 0


def test_every_static_tree_is_exact(default_engine, plain_answers):
    prompt = PROMPTS[2]
    ids = default_engine.chat_ids([{"role": "user", "content": prompt}])
    saved = default_engine.plan.family
    try:
        for name, spec in STATIC_TREES.items():
            default_engine.replan(tree=family_from_spec(name, spec, 3))
            assert default_engine.generate(ids, "ppd", 48).tokens == plain_answers[prompt][:48], name
    finally:
        default_engine.replan(tree=saved)


def test_streamed_text_grows_to_the_answer(default_engine, plain_answers):
    prompt = PROMPTS[3]
    ids = default_engine.chat_ids([{"role": "user", "content": prompt}])
    events = list(default_engine.stream(ids, "ppd", 40))
    assert "".join(e.delta for e in events) == events[-1].text
    assert events[-1].tokens == plain_answers[prompt][:40] and events[-1].stop_reason == "length"
    assert all(not e.finished for e in events[:-1])
