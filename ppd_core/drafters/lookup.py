"""Guesses copied from the conversation itself: n-gram lookup (prompt-lookup decoding).

At each step the longest suffix of the text so far (``MAX_NGRAM`` tokens down to one) that
occurred earlier, prompt or answer, proposes the tokens that followed its last occurrence.
They need no prompt tokens and no training, and they guess what prompt tokens cannot: text
being copied, as when a user asks to rewrite, fix or extend what is already there.

How long a chain a step carries depends on how long the match really is: the suffix is
followed back past ``MAX_NGRAM`` tokens (up to ``MAX_MATCH``), and matches are grouped into
``MATCH_CLASSES``. A match of 8 or 16 tokens means text is being copied, and its chain is
right far more often than one after a 4-token match; on a CPU, where every extra row costs
a good part of a step, only such chains pay.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ppd_core.drafters.base import ChainPolicy, Draft, Guesses, Verified, right_guesses
from ppd_core.drafters.match_classes import MATCH_CLASSES, class_label, match_class  # noqa: F401 - MATCH_CLASSES: lookup's
from ppd_core.sampling.constraint import allowed_prefix

if TYPE_CHECKING:
    from ppd_core.sampling.constraint import Grammar

MAX_NGRAM = 4  # longest suffix looked up
MAX_MATCH = 16  # a match is followed back this far at most
MAX_CHAIN = 8  # longest chain calibration considers
PRIOR = 0.5  # a chain token's estimate where the policy keeps no chances (fixed lengths): after the prompt tokens'
MIN_CHANCE = 1e-6


def chains_text(lengths: Sequence[int]) -> str:
    """"chains of 0/0/0/0/2/7 tokens after a match of 1/2/3/4-7/8-15/16+ tokens": chain length by match class."""
    classes = "/".join(class_label(i) for i in range(len(lengths)))
    return f"chains of {'/'.join(map(str, lengths))} tokens after a match of {classes} tokens"


class NgramIndex:
    """Where each n-gram (n = 1..``max_n``) of a growing token sequence last occurred with a continuation.

    ``extend`` costs O(new tokens x max_n); ``propose`` O(max_n) lookups: no rescan.
    """

    def __init__(self, tokens: Iterable[int] = (), max_n: int = MAX_NGRAM):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.continuation: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its last occurrence
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the new token continues the n-grams ending just before it
            self.tokens.append(token)
            for n in range(1, min(self.max_n, end) + 1):
                self.continuation[tuple(self.tokens[end - n : end])] = end

    def propose(self, count: int) -> tuple[list[int], int]:
        """Up to ``count`` tokens that followed the last earlier occurrence of the longest suffix (``max_n`` tokens
        at most) that occurred before, and how many tokens before them match the text's end (``MAX_MATCH`` at
        most: the suffix and, past ``max_n``, the tokens before it); ([], 0) if none."""
        if count < 1:
            return [], 0
        tokens = self.tokens
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            start = self.continuation.get(tuple(tokens[-n:]))
            if start is not None:
                match = n
                if n == self.max_n:  # a shorter suffix's occurrence cannot match further back
                    while match < MAX_MATCH and match < start and tokens[start - 1 - match] == tokens[-1 - match]:
                        match += 1
                return tokens[start : start + count], match
        return [], 0


@dataclass
class LookupStats:
    """Greedy answers replayed: ``hits[c][j - 1]`` positions whose match fell in class c (``MATCH_CLASSES``) and
    whose chain's first j tokens were all right, out of ``trials[c]`` positions with such a match; ``matches``
    keeps, per answer and position, (class + 1, or 0 for no match; how many of a ``MAX_CHAIN`` chain were right;
    how long it was: a continuation can be shorter) for ``replay_steps``."""

    hits: list[list[int]]
    trials: list[int]
    positions: int = 0  # answer positions replayed
    matches: list[list[tuple[int, int, int]]] = field(default_factory=list)  # n = 0: no match there
    turns: list[int] = field(default_factory=list)  # per answer: which turn of its conversation (1: the first)

    @staticmethod
    def empty(max_chain: int = MAX_CHAIN, classes: int = len(MATCH_CLASSES)) -> LookupStats:
        return LookupStats([[0] * max_chain for _ in range(classes)], [0] * classes)

    def add_answer(self, prompt: Sequence[int], answer: Sequence[int], turn: int = 1) -> None:
        """Propose at every answer position from the prompt and the answer so far, as decoding would."""
        index = NgramIndex(prompt)
        self.start_answer(turn)
        for i, token in enumerate(answer):
            self.add_proposal(*index.propose(len(self.hits[0])), answer, i)
            index.extend([token])

    def start_answer(self, turn: int = 1) -> None:
        """A new answer (turn ``turn`` of its conversation): ``add_position`` fills it."""
        self.matches.append([])
        self.turns.append(turn)

    def add_proposal(self, chain: Sequence[int], match: int, answer: Sequence[int], i: int) -> None:
        """``NgramIndex.propose``'s (chain, match length) at position i of the latest answer."""
        self.add_position(match_class(match) + 1 if chain else 0, right_guesses(chain, answer, i), len(chain))

    def add_position(self, n: int, right: int, proposed: int) -> None:
        """One position of the latest answer: a match of class n - 1 (n = 0: none) proposing ``proposed`` tokens,
        the first ``right`` of them right."""
        self.positions += 1
        self.matches[-1].append((n, right, proposed))
        if n:
            self.trials[n - 1] += 1
            for j in range(right):
                self.hits[n - 1][j] += 1

    def select(self, keep: Callable[[int], bool]) -> LookupStats:
        """The answers whose turn passes ``keep`` (e.g. first turns only), counts rebuilt from ``matches``."""
        out = LookupStats.empty(len(self.hits[0]), len(self.trials))
        for turn, answer in zip(self.turns, self.matches):
            if keep(turn):
                out.start_answer(turn)
                for n, right, proposed in answer:
                    out.add_position(n, right, proposed)
        return out

    @property
    def probs(self) -> list[list[float]]:
        """P(the chain's first j tokens are right | a match of class c): [c][j]."""
        return [[h / max(t, 1) for h in row] for row, t in zip(self.hits, self.trials)]


def replay_steps(stats: LookupStats, lengths: Sequence[int]) -> tuple[int, int, dict[int, int]]:
    """Decode the replayed answers as the engine would with chains of ``lengths`` (by match class):
    (steps, accepted chain tokens, steps by chain length). A step at position i that accepts a tokens
    moves on to i + 1 + a, so the positions inside a copied run, which match best, are skipped, as
    in decoding. (Averaging over every position instead overestimated: 1.78 tokens per step against
    1.35 measured on 80 MT-Bench answers.)"""
    asked = (0, *lengths)  # by match class + 1, 0: no match
    steps = accepted = 0
    chains: dict[int, int] = {}
    for answer in stats.matches:
        i, end = 0, len(answer)
        while i < end:
            n, right, proposed = answer[i]
            length = min(asked[n], proposed)  # as long as asked, or as the continuation
            gained = right if right < length else length
            steps += 1
            accepted += gained
            chains[length] = chains.get(length, 0) + 1
            i += 1 + gained
    return steps, accepted, chains


def with_lookup(
    stats: LookupStats, lengths: Sequence[int], tokens_per_step: float, tree_size: int, latency: Callable[[int], float]
) -> tuple[float, float]:
    """Expected (tokens, seconds) per step once chains of ``lengths`` (by match class) join a tree of ``tree_size``
    tokens that yields ``tokens_per_step``, from ``replay_steps`` (the tree's own guesses are taken as independent)."""
    return _rate_parts(replay_steps(stats, lengths), tokens_per_step, tree_size, latency)


def _rate_parts(replayed: tuple[int, int, dict[int, int]], tokens_per_step: float, tree_size: int,
                latency: Callable[[int], float]) -> tuple[float, float]:
    steps, accepted, chains = replayed
    if not steps:
        return tokens_per_step, latency(tree_size)
    seconds = sum(count * latency(tree_size + length) for length, count in chains.items())
    return tokens_per_step + accepted / steps, seconds / steps


def best_with_chains(
    stats: LookupStats, trees: Sequence[tuple[float, int]], latency: Callable[[int], float],
    tick: Callable[[int, int], object] | None = None,
) -> tuple[int, list[int]]:
    """The tree (index into ``trees``: (tokens per step, size) each) and the chain length for each match class
    (0: none) with the most expected tokens per second together (``with_lookup``), over every tree and every
    combination of lengths up to the replayed chains' length that does not shrink as matches grow (a longer
    match is the surer sign of copying; the step cost need not grow with size, so no length is ruled out by
    its acceptance alone). Each combination is replayed once for all trees. ``tick(done, total)`` before each
    combination: a calibration's progress and its pause point (an answer may run meanwhile)."""
    longest = len(stats.hits[0]) if stats.hits else 0
    best, best_rate = (0, [0] * len(stats.trials)), -1.0
    total = math.comb(longest + len(stats.trials), len(stats.trials))
    for done, lengths in enumerate(itertools.combinations_with_replacement(range(longest + 1), len(stats.trials))):
        if tick is not None:  # combinations ascend
            tick(done, total)
        replayed = replay_steps(stats, lengths)
        for index, (tokens_per_step, size) in enumerate(trees):
            tokens, seconds = _rate_parts(replayed, tokens_per_step, size, latency)
            if tokens / seconds > best_rate * (1 + 1e-12):
                best, best_rate = (index, list(lengths)), tokens / seconds
    return best


def chain_lengths(stats: LookupStats, tokens_per_step: float, tree_size: int, latency: Callable[[int], float]) -> list[int]:
    """``best_with_chains`` for one tree: the chain length for each match class."""
    return best_with_chains(stats, [(tokens_per_step, tree_size)], latency)[1]


class LookupDrafter:
    """The n-gram lookup as a drafter: a chain copied from the conversation, as long as its ``ChainPolicy`` says, each
    token's estimate the policy's learnt chance where it keeps one (``ChainPolicy.chances``), else ``PRIOR``."""

    name = "lookup"

    def __init__(self, policy: ChainPolicy, context: Iterable[int], grammar: Grammar | None = None):
        """``context``: the tokens before the answer (the conversation and the prompt); ``grammar``: the answer's, if
        any (a chain it forbids is cut where the grammar stops allowing it)."""
        self.policy, self.grammar = policy, grammar
        self.index = NgramIndex(context)
        self.offered: list[int] = []  # this step's proposal, drafted or not
        self.match = 0  # its match class
        self.note = ""  # what the policy did at this step's proposal, and why ("": no proposal)

    def propose(self, draft: Draft) -> None:
        offered, match = self.index.propose(self.policy.longest)
        if offered and self.grammar is not None:
            offered = allowed_prefix(self.grammar, offered)  # never draft what the grammar forbids
        self.offered, self.match = offered, match_class(match) if offered else 0
        chain = offered[: self.policy.length(self.match, len(offered))] if offered else []
        chances = self.policy.chances(self.match, len(chain)) if chain else None
        draft.add(self.name, Guesses.chain(chain, [PRIOR] * len(chain) if chances is None else clipped(chances)))

    def observe(self, verified: Verified) -> None:
        """The emitted tokens show how much of the proposal was right, drafted or not; they join the index."""
        stats, self.note = verified.stats, ""
        if self.offered:
            drafted = sum(1 for node in verified.kept.get(self.name, ()) if node >= 0)
            self.policy.observe(self.match, right_guesses(self.offered, stats.tokens, 0), drafted, len(self.offered))
            done = f"drafted {drafted} copied tokens" if drafted else "drafted none"
            self.note = f"{done} ({self.policy.why(self.match, drafted)})"
        self.index.extend(stats.tokens)
        self.offered = []


def clipped(chances: Sequence[float]) -> list[float]:
    """Estimates in (0, 1], as ``Guesses`` takes them."""
    return [min(1.0, max(MIN_CHANCE, float(c))) for c in chances]
