"""Greedy tree decoding on a tiny random model: exactness, oracle guesses, limits."""

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.answer_request import PromptTooLongError, check_answer
from ppd_core.decoding import Answering, Speculator, clip_tokens, generate
from ppd_core.backends.torch.loading import pick_decoder
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeSpec, family_from_spec, plain_family

EOS = frozenset({127})
CHAIN = TreeSpec({(): 3, (0,): 1, (1,): 3, (1, 0): 3, (1, 1): 1, (1, 0, 1): 3, (1, 0, 0): 1})


def prompt_table(rows: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """Random prompt-token rows [rows, 64] float32 (untrained: they guess badly, which decoding must survive)."""
    return (np.random.default_rng(seed).standard_normal((rows, 64)) * scale).astype(np.float32)


def run(model, prompt, family, table, max_new_tokens=60, max_context=256, hook=None, eos=frozenset()):
    steps = list(generate(Speculator(TorchDecoder(model), family, table, eos_token_ids=eos),
                          check_answer(prompt, max_new_tokens, max_context), Answering(guess_hook=hook)))
    tokens = [t for s in steps for t in s.tokens]
    return tokens, steps


def plain_generate(model, prompt, max_new_tokens):
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("tree_name", list(STATIC_TREES))
@pytest.mark.parametrize("ensemble", [1, 2])
@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_ppd_equals_plain_decoding(tree_name, ensemble, forward):
    model = tiny_llama(seed=3)
    decoder = pick_decoder(model, forward)
    table = prompt_table(3 * ensemble, seed=1, scale=5)
    family = family_from_spec(tree_name, STATIC_TREES[tree_name], 3, ensemble)
    prompt = list(range(5, 25))
    reference, _ = run(decoder, prompt, plain_family(), None)
    tokens, steps = run(decoder, prompt, family, table)
    assert tokens == reference == plain_generate(model, prompt, 60)
    assert steps[0].prefill and steps[-1].stop == "length"


def oracle(reference, ranks):
    """Put the true future token of depth d at rank ranks[d - 1]; the other ranks get wrong tokens."""

    def hook(produced, guesses):  # guesses: [m, K] int64
        planted = guesses.copy()
        for d in range(planted.shape[0]):
            position = len(produced) + d
            truth = reference[position] if position < len(reference) else -1
            planted[d] = [(truth + 1 + r) % 128 for r in range(planted.shape[1])]
            if ranks is not None and truth >= 0:
                planted[d, ranks[d]] = truth
        return planted

    return hook


def test_oracle_at_chosen_ranks_accepts_full_depth():
    model = tiny_llama(seed=4)
    table = prompt_table(3, seed=2)
    family = family_from_spec("chain", CHAIN, 3)
    prompt = list(range(30, 50))
    reference, _ = run(model, prompt, plain_family(), None, max_new_tokens=120)
    tokens, steps = run(model, prompt, family, table, 120, hook=oracle(reference, ranks=(1, 0, 1)))
    assert tokens == reference
    decode = [s for s in steps if not s.prefill]
    # every full-depth step accepts (1, 0, 1) plus the bonus token: 4 tokens
    assert all(len(s.tokens) == 4 for s in decode[1:-1])
    mean = sum(len(s.tokens) for s in decode) / len(decode)
    assert mean > 3.8


def test_oracle_nowhere_accepts_exactly_one():
    model = tiny_llama(seed=4)
    table = prompt_table(3, seed=2)
    family = family_from_spec("large", STATIC_TREES["large"], 3)
    prompt = list(range(30, 50))
    reference, _ = run(model, prompt, plain_family(), None)
    tokens, steps = run(model, prompt, family, table, hook=oracle(reference, ranks=None))
    assert tokens == reference
    assert all(len(s.tokens) == 1 and s.from_guesses == 0 for s in steps)


def test_stops_at_eos_inside_an_accepted_run():
    model = tiny_llama(seed=4)
    table = prompt_table(3, seed=0)
    prompt = list(range(30, 50))
    reference, _ = run(model, prompt, plain_family(), None, max_new_tokens=40)
    eos = frozenset({reference[17]})
    first = reference.index(reference[17])
    tokens, steps = run(model, prompt, family_from_spec("chain", CHAIN, 3), table, 40, hook=oracle(reference, (1, 0, 1)), eos=eos)
    assert tokens == reference[: first + 1] and steps[-1].stop == "eos"


def test_context_limit_stops_cleanly_and_matches_plain():
    model = tiny_llama(seed=5)
    table = prompt_table(3, seed=0)
    prompt = list(range(10, 40))  # 30 tokens; context 50 leaves room for 20
    reference, _ = run(model, prompt, plain_family(), None, max_new_tokens=100, max_context=50)
    tokens, steps = run(model, prompt, family_from_spec("large", STATIC_TREES["large"], 3), table, 100, 50, hook=oracle(reference, (0, 0, 0)))
    assert len(reference) == 20 and tokens == reference
    assert steps[-1].stop == "context"


def test_prompt_longer_than_context_is_refused():
    model = tiny_llama(seed=5)
    with pytest.raises(PromptTooLongError, match="context holds 16"):
        run(model, list(range(16)), plain_family(), None, max_context=16)
    with pytest.raises(ValueError, match="empty"):
        run(model, [], plain_family(), None)


def test_clip_tokens():
    eos = frozenset({9})
    assert clip_tokens([1, 2, 3], 0, eos, 10, 10) == ([1, 2, 3], None)
    assert clip_tokens([1, 9, 3], 0, eos, 10, 10) == ([1, 9], "eos")
    assert clip_tokens([1, 2, 3], 8, eos, 10, 10) == ([1, 2], "length")
    assert clip_tokens([1, 2, 3], 0, eos, 10, 2) == ([1, 2], "context")
    assert clip_tokens([9, 2], 9, eos, 10, 1) == ([9], "eos")


def test_multi_turn_reuses_the_kv_cache_and_stays_exact(tiny_model_dir):
    from ppd_core import Engine, EngineConfig

    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium"))
    history = [{"role": "user", "content": "Hello there"}]
    first_ids = engine.chat_ids(history)
    first = engine.generate(first_ids, "ppd", 20, reuse_cache=True)
    assert first.stats.reused_tokens == 0
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    ids = engine.chat_ids(history)
    second = engine.generate(ids, "ppd", 20, reuse_cache=True)
    fresh = engine.generate(ids, "plain", 20)  # no reuse: a full prefill
    assert second.tokens == fresh.tokens
    # the cache held the first prompt and answer (but the last token, never fed back): all of
    # their common prefix with the new conversation was reused
    cached = first_ids + first.tokens[:-1]
    common = next((i for i, (a, b) in enumerate(zip(cached, ids)) if a != b), min(len(cached), len(ids)))
    assert second.stats.reused_tokens == min(common, len(ids) - 1) > len(first_ids) // 2
    # a stopped stream keeps a consistent cache: the same request again gives the same answer
    stream = engine.stream(ids, "ppd", 20, reuse_cache=True)
    next(stream), next(stream)
    stream.close()
    again = engine.generate(ids, "ppd", 20, reuse_cache=True)
    assert again.tokens == fresh.tokens and again.stats.reused_tokens == len(ids) - 1


@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_logprobs_and_penalties_under_trees_on_torch(forward):
    """On the torch backend, with a repeat penalty, PPD's tokens equal plain decoding's and its logprobs (the rows of
    its accepted paths, which torch computes in another order than plain steps) are within 1e-4 of plain's."""
    from ppd_core.sampling.params import SamplingParams

    decoder = pick_decoder(tiny_llama(seed=3), forward)
    family = family_from_spec("chain", CHAIN, 3, 1)
    prompt = list(range(5, 25))
    sampling = SamplingParams(repeat_penalty=1.4, repeat_last_n=16, frequency_penalty=0.2)
    results = {}
    for name, (tree, table) in {"plain": (plain_family(), None), "ppd": (family, prompt_table(3, seed=1, scale=5))}.items():
        steps = list(generate(Speculator(TorchDecoder(decoder), tree, table),
                              check_answer(prompt, 60, 256, sampling=sampling, logprobs=4)))
        results[name] = [item for step in steps for item in step.logprobs]
    assert [i.token for i in results["ppd"]] == [i.token for i in results["plain"]]
    assert len(results["plain"]) == 60
    for ours, theirs in zip(results["ppd"], results["plain"]):
        assert abs(ours.logprob - theirs.logprob) < 1e-4
        assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(ours.top, theirs.top))
