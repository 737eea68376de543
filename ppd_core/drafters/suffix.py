"""Guesses from suffix matches (SuffixDecoding, Oliaro et al., NeurIPS 2025, arXiv 2411.04975; vLLM's ``method:
suffix``): a tree of the likeliest continuations of the longest suffix of the text that occurred before.

Two indexes, each a ``SuffixAutomaton``: this conversation (prompt and answer so far, growing each step) and the
model's earlier answers (``SuffixMemory``: kept per loaded model, bounded by a token budget, oldest answers dropped).
The longer of the two matches proposes (the conversation's on a tie). Its continuations form a trie over all its
occurrences: a node's frequency r = how often its token followed its parent's text / how often that text was
followed at all. The drafter turns r into its estimate of P(accepted | parent accepted) with what it has measured:
per source (conversation, history), match-length class and depth, the ratio of accepted nodes to the sum of their
r (a prior worth ``PRIOR_WEIGHT`` expected acceptances, then every node a step could judge). It grows the tree best
first by path product, as the PPD paper's expected-length formula ranks nodes, until ``limit`` nodes or until the
best path product left falls below ``floor``: deep after a long match that keeps proving right, shallow and wide
after a short one.

Cost and memory (``python benchmarks/scripts/suffix_replay.py --start 20 --limit 40``, its ``cost``, and its
``timing`` alone; nice'd on a 2-core AMD EPYC beside a test run, whose load makes the spread): one step's propose (8
nodes at most) and observe on a 4,000-token context took 37-83 us over six runs (``NgramIndex``: 5.5-16.5 us),
building the automaton of a 4,000-token prompt 11-25 ms; the automaton holds 479 bytes a token (tracemalloc), so the
memory is at most 479 B x (the context's tokens + ``HISTORY_TOKENS``): 7.8 MB with an 8,192-token context.

Replayed on 20 MT-Bench conversations (questions 21-40, both turns, 128 greedy tokens of the default GGUF; same
command, ``benchmarks/measurements/suffix-replay-21-40.json``), at the same row budget a suffix tree accepts more
than an n-gram chain (the conversation alone; with the earlier answers too, the gap grows on first turns): with the
budget filled (floor 0), 1.59 / 1.69 / 1.73 tokens a step against 1.55 / 1.62 / 1.63 on first turns at 4 / 8 / 12
rows, 2.25 / 2.60 / 2.78 against 2.16 / 2.42 / 2.52 on follow-ups; with the default floor it still accepts more than
the chain of the same budget with 1-43% fewer rows (the more, the larger the budget). On a steep CPU step curve
(llama.cpp, EPYC, 2 threads) neither pays on first turns (0.995x at best against 1.000x) and a floor of 0.6 gives
1.034x on follow-ups against 1.041x for the calibrated lookup chains (fitted on the same answers).
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ppd_core.drafters.base import Guesses
from ppd_core.drafters.match_classes import MATCH_CLASSES, match_class
from ppd_core.drafters.suffix_automaton import SEPARATOR, GrowingText, Match, SuffixAutomaton

if TYPE_CHECKING:
    from ppd_core.drafters.base import Draft, Verified

MAX_DEPTH = 16  # deepest node proposed
LIMIT = 8  # most nodes a proposal offers
FLOOR = 0.05  # no node whose path product is below this
HISTORY_TOKENS = 8192  # earlier answers kept per model (then the oldest are dropped)
MATCH_WINDOW = 64  # a new answer's history match starts from this many tokens of its context
PRIOR_WEIGHT = 4.0  # the prior's worth, in expected acceptances
CONVERSATION, HISTORY = 0, 1  # the two sources
# the prior ratio of accepted to expected (r summed) by source and match class, every depth: rounded from the depth-1
# ratios learnt over MT-Bench questions 1-20 (both turns, 128 tokens, the earlier answers on; suffix_replay.py
# --limit 20, `learnt_ratio_depth1_to_4_with_history`; the history's 8+ classes, unseen there,
# set below the conversation's), scored on questions 21-40
PRIOR_RATIO = ((0.33, 0.55, 0.6, 0.8, 0.85, 0.95), (0.2, 0.35, 0.3, 0.3, 0.5, 0.7))


class Acceptance:
    """Measured acceptance per (source, match class, depth): accepted nodes over their summed frequency r, with a
    prior; the estimate for a node of frequency r is r times that ratio, at most 1."""

    def __init__(self, prior: Sequence[Sequence[float]] = PRIOR_RATIO, weight: float = PRIOR_WEIGHT,
                 depth: int = MAX_DEPTH):
        self.prior, self.weight, self.depth = [list(row) for row in prior], weight, depth
        shape = (2, len(self.prior[0]), depth)
        self.accepted = [[[0.0] * shape[2] for _ in range(shape[1])] for _ in range(shape[0])]  # [2, C, D]
        self.expected = [[[0.0] * shape[2] for _ in range(shape[1])] for _ in range(shape[0])]  # [2, C, D]: sum of r

    def ratio(self, source: int, match: int, depth: int) -> float:
        """The factor on r at this source, match class and depth (1: under the root)."""
        d = min(depth, self.depth) - 1
        prior = self.weight * self.prior[source][match]
        return (prior + self.accepted[source][match][d]) / (self.weight + self.expected[source][match][d])

    def estimate(self, ratio: float, frequency: float) -> float:
        return min(1.0, max(1e-4, ratio * frequency))

    def record(self, source: int, match: int, depth: int, frequency: float, right: bool) -> None:
        d = min(depth, self.depth) - 1
        self.expected[source][match][d] += frequency
        self.accepted[source][match][d] += right


class SuffixMemory:
    """What the suffix drafter keeps per loaded model across answers: the model's earlier answers (at most ``budget``
    tokens, the oldest dropped) in one automaton, and the measured acceptance. It starts empty and is filled only by
    answers as they are written, so nothing is built before a model's first answer. ``forget_answers`` (the user
    deleted saved answers) may come from another thread than the answers': a lock keeps the answers and their
    automaton consistent."""

    def __init__(self, budget: int = HISTORY_TOKENS):
        self.budget = budget
        self._lock = threading.RLock()
        self.answers: deque[list[int]] = deque()
        self.automaton = SuffixAutomaton()
        self.acceptance = Acceptance()
        self.pending: list[int] | None = None  # the answer being written (it joins when the next one starts)

    @property
    def tokens(self) -> int:
        """Tokens the automaton holds (each answer and a separator)."""
        return len(self.automaton)

    def remember(self, answer: Sequence[int]) -> None:
        """Add a finished answer (between answers: a drafter's history match reads the automaton). Past the budget
        the oldest answers go, down to three quarters of it, and the automaton is rebuilt."""
        if self.budget <= 1 or not answer:
            return
        answer = list(answer)[-(self.budget - 1):]
        with self._lock:
            self.answers.append(answer)
            if self.tokens + len(answer) + 1 <= self.budget:
                self.automaton.extend([SEPARATOR, *answer])
                return
            total = sum(len(kept) + 1 for kept in self.answers)
            while len(self.answers) > 1 and total > self.budget * 3 // 4:
                total -= len(self.answers.popleft()) + 1
            self.automaton = SuffixAutomaton(token for kept in self.answers for token in (SEPARATOR, *kept))

    def begin(self, answer: list[int]) -> None:
        """A new answer starts, to be written into ``answer``: the one before it, now finished, joins the history
        (so no hook is needed at an answer's end: a model answers one request at a time)."""
        with self._lock:
            if self.pending is not None:
                self.remember(self.pending)
            self.pending = answer

    def end(self, answer: list[int]) -> None:
        """``answer`` is finished: it joins the history now, if it is the one being written (not forgotten since)."""
        with self._lock:
            if self.pending is answer:
                self.pending = None
                self.remember(answer)

    def forget_answers(self) -> None:
        """Forget the answers, the one being written included (``Engine.forget_answers``: the user deleted saved
        ones); the learnt acceptance holds no text and stays. A drafter answering meanwhile keeps the automaton it
        read until its answer ends."""
        with self._lock:
            self.answers.clear()
            self.pending = None
            self.automaton = SuffixAutomaton()


class SuffixDrafter:
    """Suffix-match trees as a drafter: one per answer, over its conversation and its model's ``SuffixMemory``."""

    name = "suffix"

    def __init__(self, context: Iterable[int], memory: SuffixMemory | None = None, limit: int = LIMIT,
                 floor: float = FLOOR, max_depth: int = MAX_DEPTH):
        """``context``: the tokens before the answer (the conversation and the prompt)."""
        context = list(context)
        self.memory = SuffixMemory(0) if memory is None else memory
        self.answer: list[int] = []
        self.memory.begin(self.answer)
        self.limit, self.floor, self.max_depth = limit, floor, max_depth
        self.text = GrowingText(context)
        self.history = self.memory.automaton  # read-only during the answer
        self.history_match = self.history.match(context[-MATCH_WINDOW:])
        self.proposal = Guesses()
        self.source, self.match_class = CONVERSATION, 0
        self.depths: list[int] = []
        self.frequencies: list[float] = []  # [M] each proposed node's r
        self.shadow: tuple[int, int, int, float] | None = None  # the best node left out: token, parent, depth, r

    def best_match(self) -> tuple[int, SuffixAutomaton, Match]:
        """The source, automaton and match that propose: the longer match, the conversation's on a tie."""
        own, other = self.text.match, self.history_match
        if other.length > own.length:
            return HISTORY, self.history, other
        return CONVERSATION, self.text.automaton, own

    def guesses(self) -> Guesses:
        """This step's proposal (and what ``observe`` needs to learn from it)."""
        self.source, automaton, match = self.best_match()
        self.proposal, self.depths, self.frequencies = Guesses(limit=self.limit), [], []
        self.shadow = None
        if match.length:
            self.match_class = match_class(match.length)
            self._grow(automaton, match.state)
        return self.proposal

    def _grow(self, automaton: SuffixAutomaton, state: int) -> None:
        """Best first by path product: pop the likeliest open node, keep it, open its continuations. The best node
        left out (below the floor or past the limit) is kept aside as ``shadow``: the emitted tokens judge it too, so
        a class whose estimates fell below the floor can climb back."""
        acceptance, source, match = self.memory.acceptance, self.source, self.match_class
        guesses, heap, order = self.proposal, [], 0

        def open_children(state: int, parent: int, depth: int, path: float) -> None:
            nonlocal order
            options = automaton.continuations(state)
            total = sum(option[2] for option in options)
            if len(options) > self.limit:
                options = heapq.nlargest(self.limit, options, key=lambda option: option[2])
            ratio = acceptance.ratio(source, match, depth)
            for token, child, count in options:
                if token >= 0:
                    frequency = count / total
                    prob = acceptance.estimate(ratio, frequency)
                    order += 1
                    heapq.heappush(heap, (-path * prob, order, token, parent, child, depth, prob, frequency))

        open_children(state, -1, 1, 1.0)
        while heap and len(guesses) < self.limit:
            key, _, token, parent, child, depth, prob, frequency = heapq.heappop(heap)
            if -key < self.floor:
                self.shadow = (token, parent, depth, frequency)
                return
            index = guesses.add(token, parent, prob)
            self.depths.append(depth)
            self.frequencies.append(frequency)
            if depth < self.max_depth:
                open_children(child, index, depth + 1, -key)
        if heap:
            self.shadow = tuple(heap[0][i] for i in (2, 3, 5, 7))

    def propose(self, draft: Draft) -> None:
        guesses = self.guesses()
        if len(guesses):
            draft.add(self.name, guesses)

    def observe(self, verified: Verified) -> None:
        """Learn from the proposal's nodes the step could judge; the emitted tokens join the conversation's index."""
        tokens = list(verified.stats.tokens)
        if len(self.proposal) or self.shadow:
            self._learn(verified.kept.get(self.name), set(verified.path), tokens)
        self.proposal, self.shadow = Guesses(), None
        self.text.extend(tokens)
        match, history = self.history_match, self.history
        for token in tokens:
            match.state, match.length = history.step(match.state, match.length, token)
        self.answer.extend(tokens)

    def _learn(self, kept: Sequence[int] | None, path: set[int], tokens: Sequence[int]) -> None:
        """A node is judged where its parent was accepted (or it is under the root): in the tree, by whether the
        accepted path holds it; left out (over the budget), by whether the emitted tokens hold it, as the model's
        own next token shows one past the path."""
        guesses, acceptance = self.proposal, self.memory.acceptance
        right = [False] * len(guesses)
        for i, (token, parent) in enumerate(zip(guesses.tokens, guesses.parents)):
            if parent >= 0 and not right[parent]:
                continue
            depth = self.depths[i]
            if kept is not None and kept[i] >= 0:
                right[i] = kept[i] in path
            elif depth <= len(tokens):
                right[i] = tokens[depth - 1] == token
            else:
                continue
            acceptance.record(self.source, self.match_class, depth, self.frequencies[i], right[i])
        if self.shadow is not None:
            token, parent, depth, frequency = self.shadow
            if (parent < 0 or right[parent]) and depth <= len(tokens):
                acceptance.record(self.source, self.match_class, depth, frequency, tokens[depth - 1] == token)

    def finish(self) -> None:
        """The answer is done: it joins the model's earlier answers now (else when the next drafter starts)."""
        self.memory.end(self.answer)


def make(context) -> SuffixDrafter:
    """The registry's factory (``drafters.registry``: ``FACTORIES["suffix"] = suffix.make``): a drafter over the
    answer's prompt (``context.input_ids``) and its model's ``SuffixMemory`` (``context.memory["suffix"]``)."""
    memory = context.memory.setdefault(SuffixDrafter.name, SuffixMemory())
    return SuffixDrafter(context.input_ids, memory)
