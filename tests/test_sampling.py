"""Sampling: lossless PPD keeps the model's distribution; edge cases and bad settings."""

import math

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core.drafters.registry import DraftContext, answer_drafters
from ppd_core.sampling.logits import HostLogits
from ppd_core.sampling.verify import adjusted_probs, sample, typical_threshold
from ppd_core.sampling.params import SamplingParams
from ppd_core.tree import TreeSpec, family_from_spec, plain_family
from ppd_core.sampling.verify import accept
from test_penalties import brute_force_row

VOCAB = 12
PROMPT = [3, 7, 1, 4, 9, 2]
# wide and deep: three depths of guesses, four ranks at depth 1
TREE = TreeSpec({(): 3, (0,): 3, (1,): 3, (2,): 1, (3,): 1, (0, 0): 3, (0, 1): 1, (1, 0): 1, (0, 0, 0): 3})


def small_model():
    model = tiny_llama(seed=11, vocab_size=VOCAB, hidden_size=32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.12)  # soften the logits: several likely tokens per step
    return model


def last_logits(model, sequences: list[list[int]]) -> np.ndarray:
    """The model's own logits [B, vocab] after each sequence (transformers' forward, no cache)."""
    with torch.inference_mode():
        return model(torch.tensor(sequences)).logits[:, -1].float().numpy()


def exact_distribution(model, params: SamplingParams, length: int) -> dict[tuple, float]:
    """P(first ``length`` tokens) under the model, by enumeration over the small vocabulary."""
    result = {(): 1.0}
    for _ in range(length):
        sequences = list(result)
        logits = last_logits(model, [PROMPT + list(s) for s in sequences])  # [B, vocab]
        if params.penalized:  # llama.cpp's penalties, each sequence's own window, token by token
            logits = np.stack([brute_force_row(row, PROMPT + list(s), params) for row, s in zip(logits, sequences)])
        probs = adjusted_probs(logits, params)  # [B, vocab]
        result = {s + (t,): result[s] * float(probs[i, t]) for i, s in enumerate(sequences) for t in range(VOCAB)}
    return result


def likely_guesses(model):
    """Guess hook: at every depth, the tokens most likely overall after the prompt (often right, often not; the same
    for every sampling setting, so a test makes it once for all its samples)."""
    order = np.argsort(-last_logits(model, [PROMPT])[0], kind="stable")  # [vocab]: by logit, as by any T, top-k, top-p

    def hook(produced, guesses):  # guesses: [m, K] int64
        return np.tile(order[: guesses.shape[1]], (guesses.shape[0], 1))

    return hook


def prompt_table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 32)).astype(np.float32)  # [n * V, hidden]


def chi_square_p_value(counts: dict, expected: dict, total: int) -> float:
    """Pearson's test over cells with an expected count >= 5; the rest pooled into one cell."""
    cells = [s for s, p in expected.items() if p * total >= 5]
    observed = [counts.get(s, 0) for s in cells]
    wanted = [expected[s] * total for s in cells]
    observed.append(total - sum(observed))
    wanted.append(total - sum(wanted))
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, wanted) if e > 0)
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=8),
                                      dict(temperature=0.9, repeat_penalty=1.4, repeat_last_n=4, presence_penalty=0.2,
                                           frequency_penalty=0.2), dict(temperature=1.2, min_p=0.2)])
def test_lossless_ppd_sampling_matches_the_models_distribution(settings):
    """3,000 seeded samples of the first 3 tokens against the exact distribution (with repetition penalties: the
    penalised one, each tree row penalised with its own path).

    Chi-square at p < 0.001: a correct sampler fails this test once in 1,000 runs (per
    setting); the seeds are fixed, so the outcome is reproducible.
    """
    model = small_model()
    family = family_from_spec("wide", TREE, 3)
    table = prompt_table()
    expected = exact_distribution(model, SamplingParams(**settings), 3)
    counts: dict[tuple, int] = {}
    accepted = 0
    runs, guesses = 3000, likely_guesses(model)
    for seed in range(runs):
        params = SamplingParams(**settings, seed=seed)
        steps = list(generate(Speculator(TorchDecoder(model), family, table), check_answer(PROMPT, 3, 256, sampling=params),
                                   Answering(guess_hook=guesses)))
        tokens = tuple(t for s in steps for t in s.tokens)
        counts[tokens] = counts.get(tokens, 0) + 1
        accepted += sum(s.from_guesses for s in steps)
    assert accepted > runs // 4  # the test exercises accepted guesses, not just the bonus token (1 in 3.4 runs, penalised)
    assert chi_square_p_value(counts, expected, runs) > 1e-3


def test_lossless_sampling_keeps_the_distribution_with_the_tree_sources_on():
    """The same test with recycling and suffix trees merged beside the prompt tokens (their tables kept across the
    samples, as across a model's answers): still the model's distribution, and both sources' guesses are accepted."""
    model = small_model()
    family = family_from_spec("wide", TREE, 3)
    table = prompt_table()
    expected = exact_distribution(model, SamplingParams(temperature=1.0), 3)
    counts: dict[tuple, int] = {}
    accepted: dict[str, int] = {}
    memory: dict = {}  # what the sources keep for the model across answers
    runs, guesses = 3000, likely_guesses(model)
    for seed in range(runs):
        params = SamplingParams(temperature=1.0, seed=seed)
        drafters = answer_drafters(DraftContext(PROMPT, vocab_size=VOCAB, memory=memory), ("recycling", "suffix"))
        answering = Answering(drafters=drafters, guess_hook=guesses)
        steps = list(generate(Speculator(TorchDecoder(model), family, table), check_answer(PROMPT, 3, 256, sampling=params),
                              answering))
        tokens = tuple(t for s in steps for t in s.tokens)
        counts[tokens] = counts.get(tokens, 0) + 1
        for step in steps:
            for name in step.sources:
                accepted[name] = accepted.get(name, 0) + 1
    assert accepted.get("recycling", 0) > runs // 10 and accepted.get("suffix", 0) > 0, accepted
    assert chi_square_p_value(counts, expected, runs) > 1e-3


def test_plain_sampling_matches_the_distribution_too():
    model = small_model()
    params = SamplingParams(temperature=1.0)
    expected = exact_distribution(model, params, 2)
    counts: dict[tuple, int] = {}
    for seed in range(2000):
        steps = generate(Speculator(TorchDecoder(model), plain_family()), check_answer(PROMPT, 2, 256, sampling=SamplingParams(temperature=1.0, seed=seed)))
        tokens = tuple(t for s in steps for t in s.tokens)
        counts[tokens] = counts.get(tokens, 0) + 1
    assert chi_square_p_value(counts, expected, 2000) > 1e-3


def run(model, params, family=None, table=None, new=20):
    family = family or family_from_spec("wide", TREE, 3)
    table = prompt_table() if table is None else table
    steps = generate(Speculator(TorchDecoder(model), family, table), check_answer(PROMPT, new, 256, sampling=params),
                     Answering(guess_hook=likely_guesses(model)))
    return [t for s in steps for t in s.tokens]


def test_temperature_zero_and_top_k_one_are_the_greedy_path():
    model = small_model()
    greedy = run(model, SamplingParams())
    assert greedy == run(model, SamplingParams(), family=plain_family())
    assert run(model, SamplingParams(temperature=0.0, seed=5)) == greedy
    assert run(model, SamplingParams(temperature=1.3, top_k=1, seed=5)) == greedy
    assert run(model, SamplingParams(temperature=0.8, top_p=1e-6, seed=6)) == greedy  # only the top token survives


def test_seeded_sampling_is_reproducible():
    model = small_model()
    params = SamplingParams(temperature=1.0, seed=42)
    assert run(model, params) == run(model, params)
    assert len({tuple(run(model, SamplingParams(temperature=1.0, seed=s))) for s in range(6)}) > 1


def softmax(values: np.ndarray) -> np.ndarray:
    exp = np.exp(values - values.max())
    return exp / exp.sum()


def test_adjusted_probs_edge_cases():
    logits = np.array([2.0, 1.0, 0.5, -1.0], dtype=np.float32)
    full = adjusted_probs(logits, SamplingParams(temperature=1.0, top_p=1.0))
    np.testing.assert_allclose(full, softmax(logits.astype(np.float64)), rtol=1e-12)
    np.testing.assert_allclose(adjusted_probs(logits, SamplingParams(temperature=0.5)), softmax(logits / 0.5), rtol=1e-6)
    top2 = adjusted_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(top2, np.concatenate([softmax(logits[:2].astype(np.float64)), np.zeros(2)]), rtol=1e-12)
    # top-p keeps the smallest prefix reaching the mass: 0.61 + 0.22 >= 0.8, so two tokens
    nucleus = adjusted_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (nucleus > 0).tolist() == [True, True, False, False]
    assert float(nucleus.sum()) == pytest.approx(1.0)
    # a batch [2, vocab] is cut row by row
    rows = adjusted_probs(np.stack([logits, logits[::-1]]), SamplingParams(temperature=1.0, top_k=1))
    assert rows.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]


def test_sample_draws_by_the_distribution_and_a_seed_reproduces_it():
    probs = np.array([0.5, 0.0, 0.3, 0.2])
    draws = [sample(probs, SamplingParams(temperature=1.0, seed=seed).generator()) for seed in range(4000)]
    counts = np.bincount(draws, minlength=4) / len(draws)
    assert counts[1] == 0.0  # a token of probability 0 is never drawn
    np.testing.assert_allclose(counts, probs, atol=0.03)
    generator, again = SamplingParams(seed=7).generator(), SamplingParams(seed=7).generator()
    assert [sample(probs, generator) for _ in range(20)] == [sample(probs, again) for _ in range(20)]


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=-0.1), "temperature must be 0 \\(greedy\\) or between 0.001 and 2"),
        (dict(temperature=1e-320), "temperature must be 0 \\(greedy\\) or between 0.001 and 2, got 1e-320"),
        (dict(temperature=float("nan")), "temperature must be"),
        (dict(temperature=2.5), "temperature must be"),
        (dict(repeat_penalty=1e-320), "repeat-penalty must be between 0.001 and 100 \\(1: off\\), got 1e-320"),
        (dict(repeat_penalty=float("inf")), "repeat-penalty must be"),
        (dict(presence_penalty=float("nan")), "presence-penalty must be"),
        (dict(temperature=1.0, top_p=0.0), "top-p must be greater than 0"),
        (dict(temperature=1.0, top_p=1.5), "top-p must be greater than 0"),
        (dict(temperature=1.0, top_k=-2), "top-k must be 0"),
        (dict(temperature=1.0, acceptance="maybe"), "unknown acceptance 'maybe'"),
    ],
)
def test_invalid_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**settings)


def test_typical_acceptance_accepts_more_and_is_labelled_lossy():
    model = small_model()
    lossless = SamplingParams(temperature=0.7, seed=1)
    typical = SamplingParams(temperature=0.7, seed=1, acceptance="typical")
    assert lossless.lossless and not typical.lossless
    family = family_from_spec("wide", TREE, 3)
    table, guesses = prompt_table(), likely_guesses(model)

    def mean_accepted(params):
        totals = []
        for seed in range(40):
            p = SamplingParams(temperature=params.temperature, seed=seed, acceptance=params.acceptance)
            request, answering = check_answer(PROMPT, 24, 256, sampling=p), Answering(guess_hook=guesses)
            steps = [s for s in generate(Speculator(TorchDecoder(model), family, table), request, answering)
                     if not s.prefill]
            totals += [len(s.tokens) for s in steps]
        return sum(totals) / len(totals)

    assert mean_accepted(typical) > mean_accepted(lossless)


# Typical acceptance, checked by hand: a candidate is accepted when its probability under its
# parent's untruncated softmax(logits / T) exceeds min(0.09, 0.3 * exp(-entropy)).

def entropy_of(probs: list[float]) -> float:
    return -sum(p * math.log(p) for p in probs if p > 0)


def bar_of(probs: list[float]) -> float:
    return min(0.09, 0.3 * math.exp(-entropy_of(probs)))


def logits_for(rows: list[list[float]], temperature: float) -> HostLogits:
    """A step's logits [N, vocab] whose softmax(logits / T) is exactly ``rows``."""
    with np.errstate(divide="ignore"):
        return HostLogits(temperature * np.log(np.array(rows, dtype=np.float64)))


def candidate_at(ratio: float, rest: list[float]) -> list[float]:
    """[q] + (1 - q) * rest with q = ratio * bar (bisection: the bar moves with q)."""
    low, high = 1e-6, 0.5
    for _ in range(100):
        q = (low + high) / 2
        probs = [q] + [(1 - q) * r for r in rest]
        low, high = (q, high) if q < ratio * bar_of(probs) else (low, q)
    return probs


PEAKED = [0.97] + [0.01] * 3  # low entropy: the bar is epsilon = 0.09
FLAT = [1 / 20] * 20  # high entropy: the bar is 0.3 * exp(-H), about 0.014


@pytest.mark.parametrize("rest, binding", [(PEAKED, "epsilon"), (FLAT, "alpha")])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_typical_accepts_just_above_the_bar_and_rejects_just_below(rest, binding, temperature):
    """One candidate (token 0) under the root, 2% above and 2% below the hand-computed bar."""
    params = SamplingParams(temperature=temperature, acceptance="typical", seed=0)
    for ratio, expected in [(1.02, 1), (0.98, 0)]:
        probs = candidate_at(ratio, rest)
        entropy = entropy_of(probs)
        assert (0.3 * math.exp(-entropy) > 0.09) == (binding == "epsilon")  # the intended regime
        assert probs[0] == pytest.approx(ratio * bar_of(probs), rel=1e-9)
        last, _ = accept([-1, 0], [0, 0], logits_for([probs, probs], temperature), params, params.generator())
        assert last == expected, (binding, ratio, probs[0], bar_of(probs))


def test_typical_threshold_matches_the_hand_computed_bar():
    params = SamplingParams(temperature=1.0)
    for probs in [candidate_at(1.0, PEAKED), candidate_at(1.0, FLAT), [0.5, 0.5, 0.0, 0.0]]:
        bar = typical_threshold(np.array(probs, dtype=np.float64), params)
        assert float(bar) == pytest.approx(bar_of(probs), rel=1e-12)
    rows = np.array([[0.25] * 4, [1.0, 0.0, 0.0, 0.0]])  # [2, 4]: a bar per row
    np.testing.assert_allclose(typical_threshold(rows, params), [0.3 / 4, 0.09], rtol=1e-12)  # exp(-ln 4) = 1/4


def test_typical_bar_uses_the_untruncated_distribution():
    """top-k / top-p shape the bonus token only; the bar and p(candidate) ignore them."""
    # token 1 is at 0.085 < 0.09; cut to the top two tokens it would be 0.085 / 0.885 = 0.096
    rejected = [0.8, 0.085] + [0.001] * 115
    assert bar_of(rejected) == 0.09 and bar_of([0.8 / 0.885, 0.085 / 0.885]) == 0.09
    # token 0 clears the bar at 1.02x, but top-k = 1 would drop it (the top token is another)
    passing = candidate_at(1.02, FLAT)
    for probs, token, expected in [(rejected, 1, 0), (passing, 0, 1)]:
        for cut in [dict(top_k=2), dict(top_p=0.88), dict(top_k=1)]:
            params = SamplingParams(temperature=1.0, acceptance="typical", seed=0, **cut)
            last, _ = accept([-1, 0], [0, token], logits_for([probs, probs], 1.0), params, params.generator())
            assert last == expected, (probs[:2], cut)


def brute_force_typical(parents, tokens, rows) -> int:
    """Medusa's rule by enumeration: every root-to-leaf path is accepted up to its first
    rejected node; the longest accepted prefix wins, ties by its likelihood."""
    leaves = [n for n in range(len(parents)) if n not in parents]
    best, best_key = 0, (0, 0.0)
    for leaf in leaves:
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])  # root first
        length, likelihood = 0, 1.0
        for node in path[1:]:
            p = rows[parents[node]][tokens[node]]
            if not p > bar_of(rows[parents[node]]):
                break
            length, likelihood = length + 1, likelihood * p
        if (length, likelihood) > best_key:
            best, best_key = path[length], (length, likelihood)
    return best


# root -> 1, 2, 3 (tokens 1, 2, 3); 1 -> 4; 2 -> 5, 6; 3 -> 7; 4 -> 8; 5 -> 9
HAND_PARENTS = [-1, 0, 0, 0, 1, 2, 2, 3, 4, 5]
HAND_TOKENS = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]


def hand_rows(p_node9: float) -> list[list[float]]:
    """Per-node distributions over 8 tokens, each node's row spread over its own children."""
    def row(**mass):
        chosen = {int(k[1:]): v for k, v in mass.items()}
        free = [t for t in range(8) if t not in chosen]
        return [chosen.get(t, (1 - sum(chosen.values())) / len(free)) for t in range(8)]

    return [
        row(t1=0.5, t2=0.3, t3=0.15),  # root: bar 0.0885, all three children pass
        row(t4=0.02, t0=0.9),  # node 1: node 4 rejected, so the likeliest first step dead-ends
        row(t5=0.4, t6=0.3, t0=0.2),  # node 2: nodes 5 and 6 pass
        row(t7=0.9),  # node 3: node 7 passes
        row(t1=0.9), row(t2=p_node9), row(t0=1.0), row(t0=1.0), row(t0=1.0), row(t0=1.0),
    ]


@pytest.mark.parametrize("p_node9, expected", [(0.6, 9), (0.01, 7)])
def test_typical_takes_the_longest_path_then_the_likeliest(p_node9, expected):
    """Node 9 passing: the deepest path 2-5-9, not the greedy walk 1 (0.5) -> dead end.
    Node 9 rejected: depth-2 tie between 5 (0.3 * 0.4), 6 (0.3 * 0.3) and 7 (0.15 * 0.9 = 0.135): 7."""
    rows = hand_rows(p_node9)
    assert brute_force_typical(HAND_PARENTS, HAND_TOKENS, rows) == expected
    params = SamplingParams(temperature=0.8, acceptance="typical", seed=0)
    last, _ = accept(HAND_PARENTS, HAND_TOKENS, logits_for(rows, 0.8), params, params.generator())
    assert last == expected


def test_typical_matches_brute_force_on_random_trees():
    rng = np.random.default_rng(3)
    vocab = 16
    lengths = []
    for trial in range(300):
        n = int(rng.integers(2, 14))
        parents = [-1] + [int(rng.integers(0, node)) for node in range(1, n)]
        choices = [rng.permutation(vocab).tolist() for _ in range(n)]  # siblings' tokens differ
        tokens = [0] + [choices[parents[node]][parents[:node].count(parents[node])] for node in range(1, n)]
        sharpness = float(rng.random()) * 4
        scores = rng.standard_normal((n, vocab)) * sharpness
        rows = (np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)).tolist()
        temperature = [1.0, 0.5, 1.7][trial % 3]
        params = SamplingParams(temperature=temperature, acceptance="typical", seed=trial)
        last, bonus = accept(parents, tokens, logits_for(rows, temperature), params, params.generator())
        assert last == brute_force_typical(parents, tokens, rows), (parents, tokens)
        assert 0 <= bonus < vocab
        depth, node = 0, last
        while parents[node] >= 0:
            depth, node = depth + 1, parents[node]
        lengths.append(depth)
    assert 0 in lengths and max(lengths) >= 3  # both rejections and deep acceptances occur


def test_typical_bonus_comes_from_the_adjusted_distribution_at_the_last_accepted_node():
    rows = hand_rows(0.6)
    rows[9] = [0.05, 0.05, 0.05, 0.6, 0.05, 0.1, 0.05, 0.05]  # node 9's argmax: token 3
    params = SamplingParams(temperature=1.0, top_k=1, acceptance="typical", seed=0)
    assert accept(HAND_PARENTS, HAND_TOKENS, logits_for(rows, 1.0), params, params.generator()) == (9, 3)
