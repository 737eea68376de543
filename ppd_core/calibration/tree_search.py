"""The hardware-aware dynamic sparse tree: pure math over acceptance probabilities, no model.

``probs[d][r]`` is the probability that the rank-``r`` guess of prompt token ``d + 1`` is the
model's token at that depth, given that depths ``1..d`` matched (docs/design.md, "How a step works"). The
guesses at one depth are mutually exclusive (one token is right), and depths are treated as
independent, so a candidate path ``(r1, ..., rd)`` is accepted with probability
``probs[0][r1] * ... * probs[d-1][rd]``.

* ``expected_length``: f(T) = 1 + sum of the path probabilities of T's candidates.
* ``best_candidates`` (stage 1): the N candidate paths of largest probability.
* ``allocate_prompt_tokens`` (stage 2): prompt tokens per node within a budget.
* ``design_family``: one tree per available guess depth m = 0..n for a token budget.
* ``markov_chain`` / ``long_run``: the chain over "guess depth available" and the long-run
  tokens per step and seconds per step of a family.
* ``choose_family``: the budget that maximises expected tokens per second for a latency curve.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ppd_core.tree import Path, TreeSpec

Probs = Sequence[Sequence[float]]  # [n][k]


def path_probability(path: Path, probs: Probs) -> float:
    """Probability that every guess along ``path`` is accepted."""
    return math.prod(probs[depth][rank] for depth, rank in enumerate(path))


def expected_length(candidates: Sequence[Path], probs: Probs) -> float:
    """Expected tokens from one step over a tree with these candidates: 1 (bonus) + sum of path probabilities."""
    return 1.0 + sum(path_probability(p, probs) for p in candidates)


def last_node_probabilities(candidates: Sequence[Path], probs: Probs) -> dict[Path, float]:
    """P(node is the last accepted one) for the root ``()`` and every candidate.

    A node is last when it is accepted and none of its children is: the children's guesses
    are exclusive, so that is P(node) * (1 - sum of the children's acceptance probabilities).
    """
    nodes = [()] + [p for p in candidates if p]
    children: dict[Path, float] = {p: 0.0 for p in nodes}
    for path in nodes[1:]:
        children[path[:-1]] += probs[len(path) - 1][path[-1]]
    return {p: path_probability(p, probs) * max(0.0, 1.0 - children[p]) for p in nodes}


def best_candidates(probs: Probs, count: int, max_depth: int) -> list[Path]:
    """Stage 1: the ``count`` candidate paths (depth <= ``max_depth``) of largest path probability.

    Best-first growth from the root is optimal: a child is never more likely than its
    parent, so the best set is closed under taking parents.
    """
    max_depth = min(max_depth, len(probs))
    if count <= 0 or max_depth <= 0:
        return []
    chosen: list[Path] = []
    frontier = [(-probs[0][r], (r,)) for r in range(len(probs[0]))]
    heapq.heapify(frontier)
    while frontier and len(chosen) < count:
        negative, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < max_depth:
            for r in range(len(probs[len(path)])):
                heapq.heappush(frontier, (negative * probs[len(path)][r], path + (r,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def allocate_prompt_tokens(
    candidates: Sequence[Path],
    probs: Probs,
    prompt_budget: int,
    num_prompt_tokens: int,
    next_step_value: Sequence[float],
) -> dict[Path, int] | None:
    """Stage 2: prompt tokens per node, at least 1 each, at most ``prompt_budget`` in all.

    Start with n on every node; while over budget, remove the prompt token whose loss of
    expected next-step tokens, weighted by the chance that its node is the last accepted
    one, is smallest. ``next_step_value[m]`` is the expected tokens of the next step when
    m depths of guesses are available. None when the budget cannot give every node one.
    """
    nodes = [()] + [p for p in candidates if p]
    if prompt_budget < len(nodes) or num_prompt_tokens < 1:
        return None
    last = last_node_probabilities(candidates, probs)
    counts = {p: num_prompt_tokens for p in nodes}
    excess = len(nodes) * num_prompt_tokens - prompt_budget
    for _ in range(max(0, excess)):
        loss = {
            p: last[p] * (next_step_value[counts[p]] - next_step_value[counts[p] - 1])
            for p in nodes
            if counts[p] > 1
        }
        # ties: take from the deepest, least likely node first (deterministic order)
        victim = min(loss, key=lambda p: (loss[p], -len(p), [-r for r in p]))
        counts[victim] -= 1
    return counts


def spec_size(spec: TreeSpec, ensemble_size: int) -> int:
    """Tokens in one forward pass over ``spec`` when each prompt token has V members."""
    return len(spec.prompt_counts) + ensemble_size * sum(spec.prompt_counts.values())


def design_tree(probs: Probs, budget: int, max_depth: int, num_prompt_tokens: int, ensemble_size: int = 1) -> TreeSpec:
    """The tree for one state (``max_depth`` depths of guesses available) within ``budget`` tokens.

    Tries every split of the budget between candidates and prompt tokens and keeps the one
    with the most expected tokens this step plus next step (one step of lookahead).
    """
    n, V = num_prompt_tokens, ensemble_size
    # Expected tokens of the next step when m depths of guesses are available: the most
    # candidates this budget can hold, each with a prompt token (what stage 2 must keep).
    capacity = max(0, (budget - 1 - V) // (1 + V))
    value = [expected_length(best_candidates(probs, capacity, m), probs) for m in range(n + 1)]
    best: tuple[float, TreeSpec] = (1.0 + value[0], TreeSpec({(): 0}))  # plain decoding, then the same
    for count in range(budget):
        prompt_budget = min((budget - 1 - count) // V, n * (count + 1))
        candidates = best_candidates(probs, count, max_depth)
        if prompt_budget < count + 1 or len(candidates) < count:
            break  # more candidates only leave fewer prompt tokens for more nodes
        counts = allocate_prompt_tokens(candidates, probs, prompt_budget, n, value)
        last = last_node_probabilities(candidates, probs)
        score = expected_length(candidates, probs) + sum(last[p] * value[c] for p, c in counts.items())
        if score > best[0] + 1e-12:
            best = (score, TreeSpec(counts))
    return best[1]


def design_family(probs: Probs, budget: int, num_prompt_tokens: int, ensemble_size: int = 1) -> list[TreeSpec]:
    """One tree per available guess depth m = 0..n, each within ``budget`` tokens."""
    if budget <= 1 or num_prompt_tokens == 0:
        return [TreeSpec({(): 0})]
    return [design_tree(probs, budget, m, num_prompt_tokens, ensemble_size) for m in range(num_prompt_tokens + 1)]


def markov_chain(specs: Sequence[TreeSpec], probs: Probs) -> list[list[float]]:
    """Transition matrix over states m (guess depths available): from m, the tree ``specs[m]``.

    The next state is the number of prompt tokens on the last accepted node.
    """
    states = len(specs)
    matrix = [[0.0] * states for _ in range(states)]
    for m, spec in enumerate(specs):
        last = last_node_probabilities(spec.candidates, probs)
        for path, probability in last.items():
            matrix[m][min(spec.prompt_counts[path], states - 1)] += probability
    return matrix


def stationary(matrix: Sequence[Sequence[float]], start: int = 0, steps: int = 2000) -> list[float]:
    """Long-run fraction of steps spent in each state, starting from ``start``.

    The Cesaro average of the state distribution over ``steps`` steps: well defined for
    reducible or periodic chains too (the engine always starts in state 0).
    """
    states = len(matrix)
    current = [0.0] * states
    current[start] = 1.0
    total = [0.0] * states
    for _ in range(steps):
        total = [t + c for t, c in zip(total, current)]
        current = [sum(current[i] * matrix[i][j] for i in range(states)) for j in range(states)]
    return [t / steps for t in total]


@dataclass(frozen=True)
class FamilyEstimate:
    """What a tree family is expected to do in the long run."""

    specs: tuple[TreeSpec, ...]
    sizes: tuple[int, ...]  # tokens per forward pass in each state
    occupancy: tuple[float, ...]  # long-run fraction of steps in each state
    tokens_per_step: float
    seconds_per_step: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds_per_step


def long_run(specs: Sequence[TreeSpec], probs: Probs, latency: Callable[[int], float], ensemble_size: int = 1) -> FamilyEstimate:
    """Renewal-reward rate of a family: long-run tokens per step over long-run seconds per step."""
    occupancy = stationary(markov_chain(specs, probs))
    sizes = [spec_size(s, ensemble_size) for s in specs]
    tokens = sum(o * expected_length(s.candidates, probs) for o, s in zip(occupancy, specs))
    seconds = sum(o * latency(size) for o, size in zip(occupancy, sizes))
    return FamilyEstimate(tuple(specs), tuple(sizes), tuple(occupancy), tokens, seconds)


def interpolate(curve: Mapping[int, float]) -> Callable[[int], float]:
    """Piecewise-linear latency between measured sizes; linear extrapolation past the ends."""
    points = sorted(curve.items())
    if not points:
        raise ValueError("empty latency curve")

    def at(size: int) -> float:
        if len(points) == 1:
            return points[0][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if size <= x1 or (x1, y1) == points[-1]:
                return y0 + (y1 - y0) * (size - x0) / (x1 - x0)
        raise AssertionError("unreachable")

    return at


def mean_curve(latency_ms: dict[int, dict[int, float]]) -> dict[int, float]:
    """Latency per tree size averaged over the measured context lengths."""
    sizes = sorted(set.intersection(*(set(c) for c in latency_ms.values())))
    return {s: statistics.fmean(c[s] for c in latency_ms.values()) for s in sizes}


def step_seconds(latency_ms: dict[int, dict[int, float]]) -> Callable[[int], float]:
    """Seconds per step against tree size: ``mean_curve`` interpolated between the measured sizes."""
    return interpolate({size: ms / 1000 for size, ms in mean_curve(latency_ms).items()})


def within(seconds: Callable[[int], float], largest: int) -> Callable[[int], float]:
    """``seconds`` up to the largest measured size; beyond it infinitely slow (never chosen: it could not win)."""
    return lambda size: seconds(size) if size <= largest else float("inf")


@dataclass(frozen=True)
class Choice:
    best: FamilyEstimate
    budget: int
    by_budget: dict[int, FamilyEstimate]  # every budget tried
    plain_tokens_per_second: float

    @property
    def expected_speedup(self) -> float:
        return self.best.tokens_per_second / self.plain_tokens_per_second


def choose_family(
    probs: Probs, latency_ms: Mapping[int, float], num_prompt_tokens: int, ensemble_size: int = 1,
    budgets: Sequence[int] | None = None, tick: Callable[[int, int], object] | None = None,
) -> Choice:
    """The budget whose family maximises expected tokens per second on this latency curve (ms per step);
    ``tick(done, total)`` before each budget (a calibration's progress and pause point)."""
    latency = interpolate({size: ms / 1000 for size, ms in latency_ms.items()})
    budgets = sorted(set(budgets or range(1, max(latency_ms) + 1)))
    by_budget = {}
    for done, b in enumerate(budgets):
        if tick is not None:
            tick(done, len(budgets))
        by_budget[b] = long_run(design_family(probs, b, num_prompt_tokens, ensemble_size), probs, latency, ensemble_size)
    budget = max(by_budget, key=lambda b: (by_budget[b].tokens_per_second, -b))
    return Choice(by_budget[budget], budget, by_budget, 1.0 / latency(1))
