"""n-gram lookup guesses: the index against brute force, calibration's chain lengths, exactness."""

import dataclasses
import itertools
import random

import numpy as np
import pytest

from app.system_info import device_panel, guess_sources
from conftest import tiny_llama
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core import Engine, EngineConfig
from ppd_core.drafters.prompt_tokens import PromptTokens
from ppd_core.engine_load import user_prompt_tokens_path
from ppd_core.errors import PpdError
from ppd_core.drafters.lookup import (
    MATCH_CLASSES, MAX_MATCH, LookupDrafter, LookupStats, NgramIndex, best_with_chains, chain_lengths, class_label, match_class,
    replay_steps, with_lookup,
)
from ppd_core.backends.torch.loading import pick_decoder
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.sampling.params import SamplingParams
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeSpec, family_from_spec, plain_family
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.engine_calibration import calibrate_engine, saved_profile


CLASSES = len(MATCH_CLASSES)


def brute_propose(tokens, count, max_n=4):
    """The longest suffix (max_n..1) with an earlier occurrence followed by a token; the last such occurrence, and
    how many tokens before its continuation equal the text's last ones (up to MAX_MATCH)."""
    for n in range(min(max_n, len(tokens)), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # occurrences that end before the last token
            if tokens[start : start + n] == suffix:
                end = start + n
                match = max(m for m in range(1, min(MAX_MATCH, end) + 1) if tokens[end - m : end] == tokens[-m:])
                return tokens[end : end + count], match
    return [], 0


def test_match_classes():
    assert [match_class(m) for m in (1, 2, 3, 4, 7, 8, 15, 16, 40)] == [0, 1, 2, 3, 3, 4, 4, 5, 5]
    assert [class_label(i) for i in range(CLASSES)] == ["1", "2", "3", "4-7", "8-15", "16+"]


def test_index_matches_brute_force_on_random_streams():
    rng = random.Random(0)
    for trial in range(60):
        vocab = rng.choice([2, 3, 5, 12])
        index, tokens = NgramIndex(), []
        while len(tokens) < 120:
            chunk = [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]  # steps emit several tokens
            index.extend(chunk)
            tokens += chunk
            count = rng.randint(1, 6)
            assert index.propose(count) == brute_propose(tokens, count), (trial, tokens)


def test_no_match_and_zero_count():
    index = NgramIndex([1, 2, 3, 4])
    assert index.propose(3) == ([], 0)  # no token repeats
    index.extend([2])
    assert index.propose(3) == ([3, 4, 2], 1)
    assert index.propose(0) == ([], 0)


def test_replayed_acceptance_counts_match_brute_force():
    rng = random.Random(1)
    stats = LookupStats.empty(max_chain=5)
    hits, trials = [[0] * 5 for _ in range(CLASSES)], [0] * CLASSES
    for _ in range(30):
        vocab = rng.choice([2, 6])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        answer = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.5:  # an answer that copies its prompt: long matches (8-15 and 16+)
            answer = prompt + answer
        stats.add_answer(prompt, answer)
        for i in range(len(answer)):
            chain, match = brute_propose(prompt + answer[:i], 5)
            if chain:
                trials[match_class(match)] += 1
                for j, guess in enumerate(chain):
                    if i + j >= len(answer) or answer[i + j] != guess:
                        break
                    hits[match_class(match)][j] += 1
    assert (stats.hits, stats.trials) == (hits, trials)
    assert all(stats.trials)  # every class was seen
    assert all(row == sorted(row, reverse=True) for row in stats.probs)  # P(first j right) falls with j
    assert len(stats.matches) == 30 and sum(map(len, stats.matches)) == stats.positions


def brute_decode(conversations, lengths, size, costs):
    """Decode each answer as the engine would with lookup chains of ``lengths`` (by match class): a fresh suffix
    search at every step, the step's accepted tokens skipped. Returns (tokens, steps, seconds)."""
    tokens = steps = seconds = 0
    for prompt, answer in conversations:
        i = 0
        while i < len(answer):
            chain, match = brute_propose(prompt + answer[:i], 8)
            chain = chain[: lengths[match_class(match)]] if chain else []
            accepted = 0
            while accepted < len(chain) and i + accepted < len(answer) and answer[i + accepted] == chain[accepted]:
                accepted += 1
            tokens, steps, seconds = tokens + 1 + accepted, steps + 1, seconds + costs[size + len(chain)]
            i += 1 + accepted
    return tokens, steps, seconds


def test_expected_tokens_and_chain_choice_replay_decoding_against_brute_force():
    rng = random.Random(2)
    for trial in range(12):
        stats, conversations = LookupStats.empty(max_chain=4), []
        for _ in range(4):  # repetitive streams: a few tokens, so matches and copied runs are common
            prompt = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
            answer = [rng.randrange(4) for _ in range(rng.randint(5, 30))]
            stats.add_answer(prompt, answer)
            conversations.append((prompt, answer))
        size = rng.randint(1, 4)
        costs = {s: 0.01 * (1 + rng.random() * 0.3 * (s - 1)) for s in range(1, 12)}
        arbitrary = [tuple(rng.randrange(5) for _ in range(CLASSES)) for _ in range(40)]
        for lengths in arbitrary:  # any lengths: the replay equals decoding
            tokens, steps, seconds = brute_decode(conversations, lengths, size, costs)
            expected_tokens, expected_seconds = with_lookup(stats, lengths, 1.0, size, costs.__getitem__)
            assert abs(expected_tokens - tokens / steps) < 1e-12 and abs(expected_seconds - seconds / steps) < 1e-12
        rates = {}
        for lengths in itertools.combinations_with_replacement(range(5), CLASSES):  # chosen among lengths that grow with the match
            tokens, steps, seconds = brute_decode(conversations, lengths, size, costs)
            rates[lengths] = tokens / seconds
        chosen = tuple(chain_lengths(stats, 1.0, size, costs.__getitem__))
        assert chosen == tuple(sorted(chosen))
        assert abs(rates[chosen] - max(rates.values())) < 1e-9 * max(rates.values())


def test_tree_and_chains_are_chosen_together_against_brute_force():
    """Over several trees ((tokens per step, size) each) and every chain length combination, the pair chosen has
    the most tokens/s by brute-force decoding; with chains a smaller tree can win over the best tree alone."""
    rng = random.Random(4)
    smaller_won = 0
    for trial in range(10):
        stats, conversations = LookupStats.empty(max_chain=3), []
        for _ in range(4):
            prompt = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
            answer = [rng.randrange(3) for _ in range(rng.randint(5, 30))]
            stats.add_answer(prompt, answer)
            conversations.append((prompt, answer))
        costs = {s: 0.01 * (1 + 0.15 * (s - 1) + (0.5 if s > 4 else 0.0)) for s in range(1, 16)}  # a cliff past 4 tokens
        trees = [(1.0, 1), (1.0 + rng.random() * 0.5, 2), (1.2 + rng.random() * 0.6, 4)]
        rates = {}
        for index, (tokens_per_step, size) in enumerate(trees):
            for lengths in itertools.combinations_with_replacement(range(4), CLASSES):
                tokens, steps, seconds = brute_decode(conversations, lengths, size, costs)
                rates[index, lengths] = (tokens_per_step - 1 + tokens / steps) / (seconds / steps)
        index, lengths = best_with_chains(stats, trees, costs.__getitem__)
        assert abs(rates[index, tuple(lengths)] - max(rates.values())) < 1e-9 * max(rates.values())
        alone = max(range(3), key=lambda i: rates[i, (0,) * CLASSES])
        smaller_won += index < alone
    assert smaller_won  # the joint choice differs from choosing the tree first in some trials


def test_first_turns_and_follow_ups_replay_apart():
    """``select`` keeps the answers of some turns: its counts and replay equal stats built from those answers alone."""
    rng = random.Random(3)
    whole, parts = LookupStats.empty(max_chain=4), {1: LookupStats.empty(max_chain=4), 2: LookupStats.empty(max_chain=4)}
    conversations = {1: [], 2: []}
    for _ in range(10):
        turn = rng.choice([1, 2])
        prompt = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        answer = [rng.randrange(4) for _ in range(rng.randint(5, 30))]
        whole.add_answer(prompt, answer, turn)
        parts[turn].add_answer(prompt, answer, turn)
        conversations[turn].append((prompt, answer))
    costs = {s: 0.01 * (1 + 0.2 * (s - 1)) for s in range(1, 12)}
    for turn, keep in ((1, lambda t: t == 1), (2, lambda t: t > 1)):
        part = whole.select(keep)
        assert (part.hits, part.trials, part.matches, part.turns) == (parts[turn].hits, parts[turn].trials, parts[turn].matches, parts[turn].turns)
        tokens, steps, seconds = brute_decode(conversations[turn], (0, 2, 3, 4, 4, 4), 1, costs)
        expected_tokens, expected_seconds = with_lookup(part, (0, 2, 3, 4, 4, 4), 1.0, 1, costs.__getitem__)
        assert abs(expected_tokens - tokens / steps) < 1e-12 and abs(expected_seconds - seconds / steps) < 1e-12
    assert whole.select(lambda t: True).matches == whole.matches


def test_greedy_ppd_with_lookup_equals_plain_on_a_tiny_model():
    model = tiny_llama(seed=7)
    table = (np.random.default_rng(4).standard_normal((3, 64)) * 5).astype(np.float32)  # [n * V, hidden]
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # repetitive: lookup proposes
    for forward in ("lean", "transformers"):
        decoder = pick_decoder(model, forward)

        def tokens(family, prompt_table, lengths):
            chains = FixedChains(lengths) if lengths else None
            steps = list(generate(Speculator(TorchDecoder(decoder), family, prompt_table), check_answer(prompt, 80, 256),
                                  Answering(drafters=[LookupDrafter(chains, prompt)] if chains else [])))
            return [t for s in steps for t in s.tokens], sum(s.sources.count("lookup") for s in steps)

        plain, _ = tokens(plain_family(), None, ())
        for family, prompt_table in ((plain_family(), None), (family_from_spec("medium", STATIC_TREES["medium"], 3), table)):
            for lengths in ((1,) * CLASSES, (0, 2, 3, 4, 4, 4), (6,) * CLASSES):
                found, from_lookup = tokens(family, prompt_table, lengths)
                assert found == plain, (forward, family.name, lengths)
                assert from_lookup > 0


def test_a_step_that_copies_skips_the_positions_it_covered():
    stats = LookupStats.empty(max_chain=3)
    stats.start_answer()
    for n, right, proposed in [(2, 3, 3), (3, 3, 3), (4, 2, 3), (0, 0, 0), (1, 1, 1), (0, 0, 0)]:
        stats.add_position(n, right, proposed)
    latency = {1: 0.010, 2: 0.013, 3: 0.015}.__getitem__
    lengths = [0, 2, 0, 0, 0, 0]
    assert replay_steps(stats, lengths) == (4, 2, {2: 1, 0: 3})  # positions 1 and 2 were copied, not visited
    tokens, seconds = with_lookup(stats, lengths, 1.0, 1, latency)
    assert abs(tokens - (1.0 + 2 / 4)) < 1e-12
    assert abs(seconds - (0.015 + 3 * 0.010) / 4) < 1e-12
    assert stats.trials == [1, 1, 1, 1, 0, 0] and stats.hits[1] == [1, 1, 1]  # the per-position counts stay as they were


def test_lossless_sampling_with_lookup_reproduces_plain_sampling():
    """One draw per emitted token from the same generator: with a seed, copied guesses change nothing but speed."""
    decoder = pick_decoder(tiny_llama(seed=7), "lean")
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    for seed in range(4):
        params = SamplingParams(temperature=0.7, seed=seed)

        def tokens(lengths):
            request = check_answer(prompt, 80, 256, sampling=params)
            answering = Answering(drafters=[LookupDrafter(FixedChains(lengths), prompt)] if lengths else [])
            steps = list(generate(Speculator(TorchDecoder(decoder), plain_family()), request, answering))
            return [t for s in steps for t in s.tokens], sum(s.sources.count("lookup") for s in steps)

        plain, _ = tokens(())
        copied, from_lookup = tokens((3,) * CLASSES)
        assert copied == plain and from_lookup > 0, seed


def test_a_model_without_prompt_tokens_guesses_by_lookup_alone(lookup_only_dir):
    """No prompt-token file anywhere: no prompt tokens, plain trees, and calibration measures the lookup alone."""
    engine = Engine.load(EngineConfig(model=str(lookup_only_dir), device="cpu", tree="auto", auto_calibrate=False))
    assert engine.prompt_tokens.num_prompt_tokens == 0 and engine.prompt_tokens.training.get("none")
    assert engine.plan.family.name == "plain" and engine.plan.lookup_lengths == ()
    assert "none for this model" in device_panel(engine.snapshot())
    profile = calibrate_engine(engine, prompts=3, max_new_tokens=48, contexts=(64,), repeats=1)
    assert profile.acceptance == [] and profile.trees == [TreeSpec({(): 0})]
    assert sum(profile.lookup_trials) > 0 and len(profile.lookup_lengths) == CLASSES
    by_turn = profile.expected_with_lookup_by_turn  # the first 3 conversations: two ask a follow-up
    assert {name: part["answers"] for name, part in by_turn.items()} == {"first turns": 3, "follow-ups": 2}
    assert engine.plan.profile is profile and engine.plan.lookup_lengths == tuple(profile.lookup_lengths)
    assert saved_profile(engine) == profile  # keyed by the (empty) prompt tokens, found again
    engine.replan(lookup=4)  # whatever calibration chose on this machine: exactness with chains in every step
    assert "n-gram lookup" in guess_sources(engine.snapshot()) and "prompt tokens (" not in guess_sources(engine.snapshot())
    ids = engine.chat_ids([{"role": "user", "content": "Repeat after me: one two three, one two three, one two three."}])
    ppd = engine.generate(ids, "ppd", 96)
    assert ppd.tokens == engine.generate(ids, "plain", 96).tokens
    assert ppd.stats.accepted.get("lookup", 0) > 0 and ppd.stats.from_guesses == ppd.stats.accepted["lookup"]  # all copied


def test_the_expected_speedup_shown_counts_the_chains_while_they_are_on(lookup_only_dir):
    from app.page_text import calibration_summary

    engine = Engine.load(EngineConfig(model=str(lookup_only_dir), device="cpu", tree="auto", auto_calibrate=False))
    profile = calibrate_engine(engine, prompts=1, max_new_tokens=16, contexts=(64,), repeats=1)
    with_chains = dataclasses.replace(profile, lookup_lengths=[0, 3, 3, 3, 5, 8], expected_speedup=1.0, expected_speedup_with_lookup=1.3,
                                      expected_with_lookup_by_turn={"first turns": {"answers": 3, "tokens_per_step": 1.2, "speedup": 1.1},
                                                                    "follow-ups": {"answers": 2, "tokens_per_step": 1.9, "speedup": 1.6}})
    engine.replan(with_chains, tree="auto")
    assert engine.plan.lookup_lengths == (0, 3, 3, 3, 5, 8) and engine.plan.expected_speedup == 1.3
    summary = calibration_summary(with_chains)
    assert "0/3/3/3/5/8 tokens after a match of 1/2/3/4-7/8-15/16+ tokens" in summary and "**1.30x**" in summary and "first turns 1.10x, follow-ups 1.60x" in summary
    engine.replan(lookup=0)  # chains off: the tree's own expectation
    assert engine.plan.expected_speedup == 1.0
    assert "chains" not in calibration_summary(dataclasses.replace(with_chains, lookup_lengths=[0] * CLASSES))


def test_static_trees_need_prompt_tokens(lookup_only_dir):
    with pytest.raises(PpdError, match=r"^--tree small needs prompt tokens, and .* has none: use --tree auto"):
        Engine.load(EngineConfig(model=str(lookup_only_dir), device="cpu", tree="small"))


def test_the_engine_finds_prompt_tokens_where_ppd_train_saves_them_and_none_turns_them_off(tiny_model_dir):
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium"))
    assert engine.prompt_tokens.num_prompt_tokens == 3
    saved = PromptTokens.load(engine.prompt_tokens.source)
    assert engine.prompt_tokens.source.parent == user_prompt_tokens_path("x", []).parent
    assert np.array_equal(engine.prompt_tokens.embeddings, saved.embeddings)
    forced = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="auto", prompt_tokens="none",
                                      auto_calibrate=False))
    assert forced.prompt_tokens.num_prompt_tokens == 0 and forced.plan.family.name == "plain"
