"""Repetition penalties under trees, against brute force: every row of a tree penalised with its own path's window
equals llama.cpp's formula applied to that row's whole sequence token by token (float32, as llama.cpp computes);
greedy and lossless acceptance read the penalised rows and leave the step's logits as the model gave them."""

from __future__ import annotations

import numpy as np
import pytest

from ppd_core.errors import PpdError
from ppd_core.sampling.logits import HostLogits
from ppd_core.sampling.penalties import penalize, window
from ppd_core.sampling.verify import adjusted_probs
from ppd_core.sampling.params import SamplingParams
from ppd_core.sampling.verify import accept

VOCAB = 12


def random_tree(rng: np.random.Generator, nodes: int) -> tuple[list[int], list[int]]:
    """Parents (breadth-first: a parent before its children) and tokens of a random tree over a small vocabulary."""
    parents, depth = [-1], [0]
    for node in range(1, nodes):
        parent = int(rng.integers(0, node))
        parents.append(parent)
        depth.append(depth[parent] + 1)
    order = sorted(range(nodes), key=lambda n: (depth[n], n))  # breadth first
    where = {old: new for new, old in enumerate(order)}
    parents = [-1] + [where[parents[old]] for old in order[1:]]
    return parents, rng.integers(0, VOCAB, size=nodes).tolist()


def brute_force_row(logits: np.ndarray, sequence: list[int], params: SamplingParams) -> np.ndarray:
    """llama.cpp's ``llama_sampler_penalties_apply`` on one row, its window counted token by token."""
    last = len(sequence) if params.repeat_last_n < 0 else params.repeat_last_n
    seen = sequence[len(sequence) - min(last, len(sequence)):] if last else []
    row = logits.copy()
    for token in set(seen):
        count = seen.count(token)
        value = row[token]
        value = value * np.float32(params.repeat_penalty) if value <= 0 else value / np.float32(params.repeat_penalty)
        value -= np.float32(count) * np.float32(params.frequency_penalty) + np.float32(params.presence_penalty)
        row[token] = value
    return row


def path_tokens(parents: list[int], tokens: list[int], node: int) -> list[int]:
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("last_n", [-1, 0, 1, 3, 8, 64])
@pytest.mark.parametrize("seed", range(6))
def test_every_row_is_penalised_with_its_own_path(seed, last_n):
    rng = np.random.default_rng(seed)
    params = SamplingParams(repeat_penalty=1.3, repeat_last_n=last_n, presence_penalty=0.4, frequency_penalty=0.35)
    parents, tokens = random_tree(rng, int(rng.integers(1, 24)))
    sequence = rng.integers(0, VOCAB, size=int(rng.integers(1, 20))).tolist()
    tokens[0] = sequence[-1]  # the root is the last token so far
    logits = rng.normal(0, 3, size=(len(parents), VOCAB)).astype(np.float32)  # [N, vocab], either sign
    rows = logits.copy()
    changed_rows, changed_tokens, earlier = penalize(rows, window(sequence, params), parents, tokens, params)
    for node in range(len(parents)):
        expected = brute_force_row(logits[node], sequence + path_tokens(parents, tokens, node), params)
        np.testing.assert_array_equal(rows[node], expected)  # bit for bit
    rows[changed_rows, changed_tokens] = earlier
    np.testing.assert_array_equal(rows, logits)  # what it overwrote puts every row back


def test_greedy_acceptance_follows_the_penalised_rows_and_leaves_the_logits_alone():
    """A chain whose guesses repeat the root: without penalties the model agrees with all of them; a strong repeat
    penalty makes each row pick its second choice, so nothing is accepted and the bonus token changes."""
    parents, tokens = [-1, 0, 1], [5, 5, 5]
    logits = np.full((3, VOCAB), -1.0, dtype=np.float32)
    logits[:, 5], logits[:, 7] = 4.0, 3.0  # token 5 first, 7 second in every row
    step = HostLogits(logits.copy())
    assert accept(parents, tokens, step, SamplingParams(), None) == (2, 5)
    params = SamplingParams(repeat_penalty=2.0)
    assert accept(parents, tokens, step, params, None, window([1, 2, 5], params)) == (0, 7)
    np.testing.assert_array_equal(step.values, logits)


def test_lossless_sampling_keeps_the_penalised_distribution():
    """The root's emitted token is drawn from the penalised distribution (brute force over many seeds)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1, size=(1, VOCAB)).astype(np.float32)
    sequence = [3, 3, 4, 9]
    params = SamplingParams(temperature=0.8, repeat_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.2, seed=1)
    expected = adjusted_probs(brute_force_row(logits[0], sequence, params), params)
    generator = params.generator()
    draws = 20000
    counts = np.bincount([accept([-1], [4], HostLogits(logits), params, generator, window(sequence, params))[1]
                          for _ in range(draws)], minlength=VOCAB)
    assert np.abs(counts / draws - expected).max() < 0.015  # 4 standard errors at p = 0.25


@pytest.mark.parametrize("field, value", [("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("repeat_last_n", -2),
                                          ("presence_penalty", 2.5), ("frequency_penalty", -2.01)])
def test_bad_penalties_are_one_line(field, value):
    with pytest.raises(PpdError) as error:
        SamplingParams(**{field: value})
    assert "\n" not in str(error.value) and field.replace("_", "-") in str(error.value)


def test_penalties_are_off_unless_they_change_a_logit():
    assert not SamplingParams().penalized
    assert not SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalized
    assert SamplingParams(frequency_penalty=0.1).penalized
