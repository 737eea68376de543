"""The adaptive lookup policy (ppd_core/lookup_policy.py): its choice against a brute force of the same expectation,
what it learns from a conversation (copying: longer chains; none: no chains), what a step can show it, and its replay
against the best fixed chain lengths on conversations where copying comes and goes."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from ppd_core.lookup import MATCH_CLASSES, MAX_CHAIN, LookupStats, best_with_chains, replay_steps
from ppd_core.lookup_policy import AdaptiveChains, replay_adaptive

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
