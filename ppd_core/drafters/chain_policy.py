"""How long a chain to draft (``base.ChainPolicy``), decided step by step from what this conversation has shown so far.

Calibration's chain lengths (``lookup.best_with_chains``) are one forecast over every conversation; copying comes and
goes within one. ``AdaptiveChains`` keeps, per match class c (``lookup.MATCH_CLASSES``) and chain position j, the
chance that the j-th proposed token is right given the ones before it were: calibration's figure as a prior worth
``prior_weight`` observations, updated with every step of this conversation. A step's emitted tokens (its accepted
guesses and the model's own next token) show how many of the proposal's leading tokens were right, up to one past
what was drafted, so even a step that drafts nothing teaches it whether the first token would have been right. Each
step then carries the chain length L (0 to what the proposal offers) with the most expected tokens per second on
this device's step curve::

    expected(L) = tokens_per_step + sum_{i <= L} prod_{j <= i} q[c][j]        rate(L) = expected(L) / latency(size + L)

It reads only tokens already decoded, and verification is exact either way: the policy changes the speed, never the
output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppd_core.drafters.lookup import MAX_CHAIN, LookupStats
from ppd_core.drafters.match_classes import class_label

# calibration's acceptance counts as this many observations of each (class, position): in a two-fold replay of the 80
# MT-Bench conversations on the AVX-512 EPYC's curve, 4 / 8 / 16 gave 1.079x / 1.086x / 1.092x on second turns
# (the best fixed lengths 1.090x) and 1.015x / 1.017x / 1.015x on first turns (1.023x)
PRIOR_WEIGHT = 16.0


@dataclass
class FixedChains:
    """Chains of set lengths by match class (``--lookup N``, or ``--chains fixed``: calibration's): nothing learnt."""

    lengths: tuple[int, ...]  # by match class

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    def length(self, match: int, offered: int) -> int:
        return min(self.lengths[match], offered)

    def chances(self, match: int, count: int) -> list[float] | None:
        return None  # nothing learnt: the drafter's prior

    def observe(self, match: int, right: int, drafted: int, offered: int) -> None:
        pass

    def why(self, match: int, drafted: int) -> str:
        return f"fixed lengths: {self.lengths[match]} after a {class_label(match)}-token match"


class AdaptiveChains:
    """Chain lengths by match class, learnt per conversation (``reset`` between conversations)."""

    def __init__(self, prior: Sequence[Sequence[float]], latency: Callable[[int], float], tokens_per_step: float = 1.0,
                 tree_size: int = 1, prior_weight: float = PRIOR_WEIGHT, max_chain: int = MAX_CHAIN):
        """``prior``: P(the first j + 1 chain tokens are right | class c), [c][j] (``LookupStats.probs``, a
        profile's ``lookup_acceptance``); ``latency(rows)``: seconds of a step of that many rows; the tree the chains
        join yields ``tokens_per_step`` with ``tree_size`` rows."""
        chained = np.ones((len(prior), max_chain + 1))  # [C, J + 1]: P(first j right), j = 0..J
        for c, row in enumerate(prior):
            values = list(row)[:max_chain]
            chained[c, 1 : len(values) + 1] = values
            chained[c, len(values) + 1 :] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            self.prior = np.nan_to_num(chained[:, 1:] / chained[:, :-1])  # [C, J]: P(token j right | those before)
        self.latency, self.tokens_per_step, self.tree_size = latency, tokens_per_step, tree_size
        self.prior_weight, self.max_chain = prior_weight, max_chain
        self.reset()

    @property
    def longest(self) -> int:
        return self.max_chain

    def reset(self) -> None:
        """A new conversation: back to calibration's figures."""
        self.seen = np.zeros_like(self.prior)  # [C, J]: times token j's rightness was seen (those before it right)
        self.right = np.zeros_like(self.prior)  # [C, J]: of those, times it was right

    def conditional(self, match: int) -> np.ndarray:
        """[J]: P(chain token j right | the ones before it right), for class ``match``, as learnt so far. A position's
        prior is calibration's, or the learnt figure of the position before it where that is higher: text being copied
        goes on being copied, so a chain grows a token at a time as long as each one past it keeps proving right (a
        step shows one token past what it drafted) instead of waiting for calibration's lower figure to be outvoted."""
        weight, learnt = self.prior_weight, np.empty(self.prior.shape[1])
        before = 0.0
        for j in range(len(learnt)):
            base = max(self.prior[match, j], before)
            learnt[j] = before = (weight * base + self.right[match, j]) / (weight + self.seen[match, j])
        return learnt

    def length(self, match: int, offered: int) -> int:
        """The chain length to carry after a match of class ``match`` when the proposal has ``offered`` tokens: the
        one with the most expected tokens per second (the shortest on a tie; 0: none)."""
        offered = min(offered, self.max_chain)
        survival = np.cumprod(self.conditional(match)[:offered])  # [offered]: P(first i right)
        expected = self.tokens_per_step + np.concatenate([[0.0], np.cumsum(survival)])  # [offered + 1]
        rates = [expected[length] / self.latency(self.tree_size + length) for length in range(offered + 1)]
        return int(np.argmax(rates))

    def chances(self, match: int, count: int) -> list[float]:
        """[count] ``conditional``'s chances of a chain's first ``count`` tokens (the merge's acceptance estimates)."""
        return self.conditional(match)[:count].tolist()

    def observe(self, match: int, right: int, drafted: int, offered: int) -> None:
        """A step after a match of class ``match`` drafted ``drafted`` of the ``offered`` chain tokens proposed, and
        the emitted tokens showed the proposal's first ``right`` tokens right (``lookup.right_guesses`` against
        them: at most ``drafted`` + 1)."""
        shown = min(right + 1, drafted + 1, offered, self.max_chain)  # positions whose rightness the tokens show
        self.seen[match, :shown] += 1
        self.right[match, : min(right, shown)] += 1

    def why(self, match: int, drafted: int) -> str:
        """"first token right 91% after 8-15-token matches here": the learnt chance behind the choice."""
        chance = self.conditional(match)[0]
        verdict = "" if drafted else ": a chain's rows would not pay"
        return f"first copied token right {chance:.0%} after {class_label(match)}-token matches{verdict}"


def replay_adaptive(stats: LookupStats, policy: AdaptiveChains,
                    counted: Callable[[int], bool] = lambda turn: True) -> tuple[int, int, dict[int, int]]:
    """``lookup.replay_steps`` with ``policy`` choosing each step's chain from what its conversation showed before it
    (reset at every first turn; every answer is replayed in order, those whose turn passes ``counted`` counted):
    (steps, accepted chain tokens, steps by chain length)."""
    steps = accepted = 0
    chains: dict[int, int] = {}
    for turn, answer in zip(stats.turns or [1] * len(stats.matches), stats.matches):
        if turn == 1:
            policy.reset()
        i, end = 0, len(answer)
        while i < end:
            n, right, proposed = answer[i]
            length = policy.length(n - 1, proposed) if n else 0
            gained = min(right, length)
            if n:
                policy.observe(n - 1, min(right, gained + 1), length, proposed)
            if counted(turn):
                steps += 1
                accepted += gained
                chains[length] = chains.get(length, 0) + 1
            i += 1 + gained
    return steps, accepted, chains
