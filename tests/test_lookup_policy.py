"""The adaptive lookup policy (ppd_core/lookup_policy.py): its choice against a brute force of the same expectation,
what it learns from a conversation (copying: longer chains; none: no chains), what a step can show it, and its replay
against the best fixed chain lengths on conversations where copying comes and goes."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from ppd_core.drafters.lookup import MATCH_CLASSES, MAX_CHAIN, LookupDrafter, LookupStats, best_with_chains, replay_steps
from ppd_core.drafters.chain_policy import AdaptiveChains, replay_adaptive
from ppd_core.plan import DecodePlan

CLASSES = len(MATCH_CLASSES)
CPU = {1: 10.0, 2: 17.1, 3: 22.0, 4: 26.6, 5: 32.0, 6: 37.0, 7: 41.0, 8: 45.3, 9: 52.0}  # a steep CPU-like curve, ms


def latency(curve: dict):
    return lambda rows: curve[min(rows, max(curve))] / 1000


def prior(value: float) -> list[list[float]]:
    return [[value ** (j + 1) for j in range(MAX_CHAIN)] for _ in range(CLASSES)]  # P(first j right): geometric


def brute_length(policy: AdaptiveChains, match: int, offered: int) -> int:
    """The expectation written out: every L, the product of the learnt conditionals, token by token."""
    weight = policy.prior_weight
    learnt, before = [], 0.0
    for j in range(MAX_CHAIN):  # each position's prior: calibration's, or the position before's learnt one if higher
        base = max(policy.prior[match, j], before)
        before = (weight * base + policy.right[match, j]) / (weight + policy.seen[match, j])
        learnt.append(before)
    best, best_rate = 0, -1.0
    for length in range(min(offered, MAX_CHAIN) + 1):
        expected, survive = policy.tokens_per_step, 1.0
        for j in range(length):
            survive *= learnt[j]
            expected += survive
        rate = expected / policy.latency(policy.tree_size + length)
        if rate > best_rate + 1e-15:
            best, best_rate = length, rate
    return best


@pytest.mark.parametrize("seed", range(5))
def test_the_choice_is_the_brute_force_best_as_it_learns(seed):
    rng = random.Random(seed)
    policy = AdaptiveChains(prior(rng.uniform(0.2, 0.9)), latency(CPU), tokens_per_step=rng.uniform(1.0, 1.5),
                            tree_size=1)
    for _ in range(200):
        match, offered = rng.randrange(CLASSES), rng.randrange(0, MAX_CHAIN + 1)
        length = policy.length(match, offered)
        assert length == brute_length(policy, match, offered) and 0 <= length <= offered
        right = rng.randrange(0, offered + 1) if offered else 0
        policy.observe(match, min(right, length + 1), length, offered)


def test_copying_lengthens_the_chains_and_guessing_wrong_stops_them():
    policy = AdaptiveChains(prior(0.5), latency(CPU))
    start = policy.length(3, MAX_CHAIN)
    for _ in range(30):  # copying: every proposal right, as far as each step shows
        length = policy.length(3, MAX_CHAIN)
        policy.observe(3, min(MAX_CHAIN, length + 1), length, MAX_CHAIN)
    sure = max(range(MAX_CHAIN + 1), key=lambda length: (1 + length) / CPU[1 + length])  # every token right
    assert policy.length(3, MAX_CHAIN) == sure > start
    for _ in range(30):  # then nothing copies: the first token is wrong every time
        length = policy.length(3, MAX_CHAIN)
        policy.observe(3, 0, length, MAX_CHAIN)
    assert policy.length(3, MAX_CHAIN) == 0
    policy.reset()  # a new conversation starts from calibration's figures
    assert policy.length(3, MAX_CHAIN) == start


def test_a_step_shows_one_token_past_its_chain_and_nothing_past_the_proposal():
    policy = AdaptiveChains(prior(0.5), latency(CPU))
    policy.observe(2, 3, 2, 8)  # drafted 2, both right, and the model's own next token was the proposal's third
    assert policy.seen[2, :4].tolist() == [1, 1, 1, 0] and policy.right[2, :4].tolist() == [1, 1, 1, 0]
    policy.observe(2, 1, 4, 8)  # drafted 4: the first right, the second wrong
    assert policy.seen[2, :3].tolist() == [2, 2, 1] and policy.right[2, :3].tolist() == [2, 1, 1]
    policy.observe(1, 2, 2, 2)  # the proposal had only 2 tokens: a third was never proposed
    assert policy.seen[1, :3].tolist() == [1, 1, 0]
    policy.observe(0, 0, 0, 5)  # a plain step still shows whether the first token would have been right
    assert policy.seen[0, 0] == 1 and policy.right[0, 0] == 0


def conversations(rng: random.Random, count: int) -> LookupStats:
    """Two-turn conversations. A third copy their second turn (long matches whose chains are right); in the others
    long matches happen as often (a repeated heading, a list's pattern) but their chains are wrong: the same match
    class pays in one conversation and not in another. Short matches guess a token now and then."""
    stats = LookupStats.empty()
    for number in range(count):
        copier = number % 3 == 0
        for turn in (1, 2):
            stats.start_answer(turn)
            copies = turn == 2 and copier
            for _ in range(120):
                if rng.random() < (0.9 if copies else 0.5):
                    match = rng.randrange(4, CLASSES) if copies or rng.random() < 0.5 else rng.randrange(0, 4)
                    if match >= 4:
                        right = MAX_CHAIN if copies and rng.random() < 0.9 else rng.choice([0, 0, 1])
                    else:
                        right = rng.choice([0, 0, 0, 1])
                    stats.add_position(match + 1, right, MAX_CHAIN)
                else:
                    stats.add_position(0, 0, 0)
    return stats


def rate(replayed, seconds) -> float:
    steps, accepted, chains = replayed
    return (steps + accepted) / sum(count * seconds(1 + length) for length, count in chains.items())


def test_in_a_replay_it_beats_the_best_fixed_lengths_where_copying_comes_and_goes():
    """The best fixed lengths are fitted on the very conversations they are scored on; the policy sees each
    conversation only as it goes, yet wins on second turns (it drafts where a conversation copies, not where another
    did) and loses little on first turns."""
    seconds = latency(CPU)
    stats = conversations(random.Random(0), 40)
    fixed = best_with_chains(stats, [(1.0, 1)], seconds)[1]
    by_turn = {}
    for turn in (1, 2):
        part = stats.select(lambda t, turn=turn: t == turn)
        adaptive = replay_adaptive(stats, AdaptiveChains(stats.probs, seconds), lambda t, turn=turn: t == turn)
        by_turn[turn] = (rate(replay_steps(part, fixed), seconds), rate(adaptive, seconds))
    assert by_turn[2][1] > by_turn[2][0]
    assert by_turn[1][1] >= 0.98 * by_turn[1][0]


# --- in decoding and in the engine ----------------------------------------------------------------


def tiny_answers(chains):
    """Greedy answers of a tiny model to a repetitive prompt, plain and with ``chains``: (plain, steps with chains)."""
    from conftest import tiny_llama
    from ppd_core.backends.torch.decoder import TorchDecoder
    from ppd_core.answer_request import check_answer
    from ppd_core.decoding import Answering, Speculator, generate
    from ppd_core.backends.torch.loading import pick_decoder
    from ppd_core.tree import plain_family

    decoder = TorchDecoder(pick_decoder(tiny_llama(seed=7), "lean"))
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]

    def answer(policy):
        return list(generate(Speculator(decoder, plain_family()), check_answer(prompt, 80, 256),
                             Answering(drafters=[LookupDrafter(policy, prompt)] if policy is not None else [])))

    plain = [t for step in answer(None) for t in step.tokens]
    return plain, answer(chains)


class Spy(AdaptiveChains):
    """Records every proposal decoding shows it and what it told decoding."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked, self.told = [], []

    def length(self, match, offered):
        self.asked.append((match, offered, super().length(match, offered)))
        return self.asked[-1][-1]

    def observe(self, match, right, drafted, offered):
        self.told.append((match, right, drafted, offered))
        super().observe(match, right, drafted, offered)


@pytest.mark.slow
def test_decoding_learns_to_draft_once_copying_shows_and_stays_exact(llama_default):
    """A prior that says chains are never right and a device where a row is nearly free: the first proposals draft
    nothing; each step's emitted tokens show how much of the proposal was right, and the chains grow as the answer
    copies the prompt. Output: plain's, token for token (the default model on llama.cpp)."""
    from ppd_core.answer_request import check_answer
    from ppd_core.decoding import Answering, Speculator, generate
    from ppd_core.tree import plain_family

    text = "The quick brown fox jumps over the lazy dog while the sleepy cat watches from the warm windowsill."
    prompt = llama_default.chat_ids([{"role": "user", "content": f"Repeat this sentence exactly, twice: {text}"}])
    decoder = llama_default.loaded.backend

    def answer(policy):
        request = check_answer(prompt, 64, llama_default.max_context)
        answering = Answering(drafters=[LookupDrafter(policy, prompt)] if policy is not None else [])
        return list(generate(Speculator(decoder, plain_family()), request, answering))

    pessimist = Spy([[0.0] * MAX_CHAIN for _ in MATCH_CLASSES], lambda rows: 0.010 + 0.0001 * rows, prior_weight=4)
    steps = answer(pessimist)
    assert [t for step in steps for t in step.tokens] == [t for step in answer(None) for t in step.tokens]
    drafts = [step.drafted["lookup"] for step in steps if "lookup" in step.notes]  # plain trees: every node the chain's
    assert drafts[0] == 0 and max(drafts) >= 4 and sum(step.sources.count("lookup") for step in steps) >= 8
    assert len(pessimist.asked) == len(pessimist.told) == len(drafts)  # told after every step it was asked about
    for (match, offered, length), (seen, right, drafted, shown) in zip(pessimist.asked, pessimist.told):
        assert (seen, drafted, shown) == (match, length, offered) and 0 <= right <= offered


def test_decoding_never_drafts_where_every_row_costs_a_step():
    """Rows that cost a whole step each: a chain can at best tie plain steps, and a tie drafts nothing."""
    sure = [[1.0] * MAX_CHAIN for _ in MATCH_CLASSES]
    plain, steps = tiny_answers(AdaptiveChains(sure, lambda rows: 0.010 * rows))
    assert [t for step in steps for t in step.tokens] == plain
    assert any("lookup" in step.notes for step in steps) and not any(step.drafted.get("lookup") for step in steps)


@pytest.mark.slow
def test_a_follow_up_goes_on_with_what_its_conversation_taught(llama_default, monkeypatch):
    """The engine keeps one chain policy per conversation: a follow-up turn (its prompt extends the whole kept
    conversation) gets the same one; a new conversation a new one."""
    made = []
    new_chains = DecodePlan.new_chains

    def counted(plan: DecodePlan):
        made.append(new_chains(plan))
        return made[-1]

    monkeypatch.setattr(DecodePlan, "new_chains", counted)
    llama_default.replan(lookup=3)  # chains on, whatever this machine's calibration chose
    try:
        llama_default.forget_conversation()
        history = [{"role": "user", "content": "Say: red green blue."}]
        first = llama_default.generate(llama_default.chat_ids(history), "ppd", 12, reuse_cache=True)
        kept = llama_default._kept.chains
        history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]
        llama_default.generate(llama_default.chat_ids(history), "ppd", 12, reuse_cache=True)
        assert len(made) == 1 and llama_default._kept.chains is kept is made[0]
        llama_default.generate(llama_default.chat_ids([{"role": "user", "content": "Say: one two."}]), "ppd", 8, reuse_cache=True)
        assert len(made) == 2 and llama_default._kept.chains is made[1] is not kept
    finally:
        llama_default.forget_conversation()
        llama_default.replan(lookup=None)
