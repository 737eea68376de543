"""Tree search math against brute force: expected length, stage 1, stage 2, the Markov chain."""

import itertools
import random

import numpy as np
import pytest
import torch

from ppd_core.calibration.tree_search import (
    allocate_prompt_tokens,
    best_candidates,
    choose_family,
    design_family,
    expected_length,
    interpolate,
    last_node_probabilities,
    long_run,
    markov_chain,
    path_probability,
    spec_size,
    stationary,
)
from ppd_core.tree import TreeSpec, build_tree


def random_probs(rng: random.Random, depth: int, ranks: int) -> list[list[float]]:
    """Per depth, exclusive rank probabilities summing to less than 1 (the rest: a miss)."""
    probs = []
    for _ in range(depth):
        weights = [rng.random() for _ in range(ranks + 1)]
        probs.append([w / sum(weights) for w in weights[:ranks]])
    return probs


def random_tree(rng: random.Random, probs, size: int) -> list[tuple]:
    """A random prefix-closed set of candidate paths."""
    chosen: set[tuple] = set()
    while len(chosen) < size:
        frontier = [(r,) for r in range(len(probs[0]))] + [
            p + (r,) for p in chosen if len(p) < len(probs) for r in range(len(probs[len(p)]))
        ]
        chosen.add(rng.choice([p for p in frontier if p not in chosen]))
    return sorted(chosen, key=lambda p: (len(p), p))


def outcomes(probs):
    """Every joint outcome of the true token's rank per depth (None: not among the guesses) and its probability."""
    per_depth = [[(r, p) for r, p in enumerate(row)] + [(None, 1 - sum(row))] for row in probs]
    for combo in itertools.product(*per_depth):
        yield [r for r, _ in combo], float(torch.tensor([p for _, p in combo], dtype=torch.float64).prod())


def accepted_path(ranks, tree: set) -> tuple:
    path: tuple = ()
    for rank in ranks:
        if rank is None or path + (rank,) not in tree:
            break
        path = path + (rank,)
    return path


@pytest.mark.parametrize("seed", range(8))
def test_expected_length_and_last_node_equal_brute_force(seed):
    rng = random.Random(seed)
    probs = random_probs(rng, depth=3, ranks=3)
    candidates = random_tree(rng, probs, size=rng.randint(1, 10))
    tree = set(candidates)
    mean, last = 0.0, {p: 0.0 for p in [()] + candidates}
    for ranks, probability in outcomes(probs):
        path = accepted_path(ranks, tree)
        mean += probability * (len(path) + 1)
        last[path] += probability
    assert expected_length(candidates, probs) == pytest.approx(mean, abs=1e-12)
    formula = last_node_probabilities(candidates, probs)
    assert formula.keys() == last.keys()
    for path in last:
        assert formula[path] == pytest.approx(last[path], abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_stage_one_is_optimal_against_exhaustive_search(seed):
    rng = random.Random(100 + seed)
    probs = random_probs(rng, depth=3, ranks=2)
    every_path = [p for d in (1, 2, 3) for p in itertools.product(range(2), repeat=d)]
    for count in range(1, 6):
        best = max(
            sum(path_probability(p, probs) for p in subset)
            for subset in itertools.combinations(every_path, count)
            if all(len(p) == 1 or p[:-1] in subset for p in subset)  # a tree: parents included
        )
        chosen = best_candidates(probs, count, max_depth=3)
        assert len(chosen) == count and len(set(chosen)) == count
        assert all(len(p) == 1 or p[:-1] in chosen for p in chosen)
        assert sum(path_probability(p, probs) for p in chosen) == pytest.approx(best, abs=1e-12)


def test_stage_one_respects_max_depth():
    probs = [[0.9, 0.05], [0.9, 0.05], [0.9, 0.05]]
    assert best_candidates(probs, 3, max_depth=1) == [(0,), (1,)]
    assert best_candidates(probs, 3, max_depth=3) == [(0,), (0, 0), (0, 0, 0)]


@pytest.mark.parametrize("seed", range(6))
def test_stage_two_keeps_one_prompt_token_per_node_and_fits_the_budget(seed):
    rng = random.Random(200 + seed)
    probs = random_probs(rng, depth=3, ranks=4)
    candidates = best_candidates(probs, rng.randint(1, 8), 3)
    value = [expected_length(best_candidates(probs, len(candidates), m), probs) for m in range(4)]
    for budget in range(len(candidates) + 1, 3 * (len(candidates) + 1) + 1):
        counts = allocate_prompt_tokens(candidates, probs, budget, 3, value)
        assert set(counts) == {()} | set(candidates)
        assert all(1 <= c <= 3 for c in counts.values())
        assert sum(counts.values()) == budget
    assert allocate_prompt_tokens(candidates, probs, len(candidates), 3, value) is None


def test_stage_two_removes_prompt_tokens_from_the_unlikely_last_node_first():
    probs = [[0.6, 0.1], [0.5, 0.1], [0.4, 0.1]]
    value = [1.0, 1.6, 1.9, 2.05]
    counts = allocate_prompt_tokens([(0,), (1,)], probs, 5, 3, value)
    # P(last): root 0.3, (0) 0.6, (1) 0.1: (1) loses its tokens first, (0) keeps all three
    assert counts == {(): 1, (0,): 3, (1,): 1} or counts == {(): 2, (0,): 2, (1,): 1}
    loss = {p: q for p, q in last_node_probabilities([(0,), (1,)], probs).items()}
    assert loss[(1,)] < loss[()] < loss[(0,)]
    assert counts[(0,)] >= counts[()] >= counts[(1,)] == 1


@pytest.mark.parametrize("budget", [2, 4, 8, 12, 16, 24, 32])
def test_every_designed_tree_is_valid_and_within_budget(budget):
    probs = random_probs(random.Random(budget), depth=3, ranks=10)
    for ensemble in (1, 2):
        family = design_family(probs, budget, 3, ensemble)
        assert len(family) == 4
        for m, spec in enumerate(family):
            assert spec_size(spec, ensemble) <= budget and spec.depth <= m
            if budget >= 2 + 2 * ensemble:  # room for the root and a candidate, each with a prompt token
                assert all(c >= 1 for c in spec.prompt_counts.values())
            else:
                assert spec.prompt_counts == {(): 0}
            tree = build_tree(spec, 3, ensemble)
            assert tree.num_tokens == spec_size(spec, ensemble)
            for row, ancestors in enumerate(tree.node_paths):  # mask rows of nodes = ancestors + self
                assert set(np.flatnonzero(tree.attention_mask[row]).tolist()) == set(ancestors)


def test_stationary_distribution_hand_worked():
    # n = 1, one guess right half the time. State 0: root with 1 prompt token.
    # State 1: root with 0 prompt tokens and candidate (0) with 1.
    probs = [[0.5]]
    specs = [TreeSpec({(): 1}), TreeSpec({(): 0, (0,): 1})]
    matrix = markov_chain(specs, probs)
    assert matrix == [[0.0, 1.0], [0.5, 0.5]]
    # pi0 = 0.5 pi1, pi0 + pi1 = 1  ->  (1/3, 2/3)
    occupancy = stationary(matrix)
    assert occupancy == pytest.approx([1 / 3, 2 / 3], abs=1e-3)
    estimate = long_run(specs, probs, latency=lambda size: 10.0)
    assert estimate.tokens_per_step == pytest.approx(1 / 3 * 1.0 + 2 / 3 * 1.5, abs=1e-3)
    assert estimate.seconds_per_step == pytest.approx(10.0)


def test_markov_rows_sum_to_one():
    probs = random_probs(random.Random(5), depth=3, ranks=10)
    for row in markov_chain(design_family(probs, 16, 3), probs):
        assert sum(row) == pytest.approx(1.0)


def test_flat_latency_picks_a_big_tree_steep_latency_a_small_one():
    probs = [[0.5, 0.15, 0.05, 0.03], [0.4, 0.15, 0.05, 0.03], [0.3, 0.1, 0.05, 0.03]]
    flat = choose_family(probs, {1: 10.0, 64: 10.5}, 3)
    steep = choose_family(probs, {1: 10.0, 64: 10.0 * 64}, 3)
    assert flat.budget >= 32 and flat.expected_speedup > 1.5
    assert steep.budget == 1 and steep.expected_speedup == pytest.approx(1.0)
    # the choice is the best of the budgets it tried
    assert flat.best.tokens_per_second == max(e.tokens_per_second for e in flat.by_budget.values())


def test_interpolation():
    at = interpolate({1: 10.0, 5: 30.0, 9: 30.0})
    assert at(1) == 10.0 and at(3) == 20.0 and at(7) == 30.0 and at(11) == 30.0
    assert interpolate({4: 7.0})(100) == 7.0


def test_no_prompt_tokens_where_no_candidate_can_follow():
    """With two members per prompt token a 4-token budget holds no candidate with its prompt token:
    prompt tokens on the root would cost two tokens and never be verified, so plain decoding it is."""
    probs = [[0.4, 0.1], [0.3, 0.1], [0.2, 0.1]]
    assert design_family(probs, 4, 3, ensemble_size=2)[1].prompt_counts == {(): 0}
    # one member each: root and one candidate, each with a prompt token
    assert design_family(probs, 4, 3, ensemble_size=1)[1].prompt_counts == {(): 1, (0,): 1}
    # with no guesses available (state 0) the root still gets prompt tokens, so guessing can start
    assert design_family(probs, 16, 3, ensemble_size=1)[0].prompt_counts[()] >= 1
