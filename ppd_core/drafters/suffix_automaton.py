"""A suffix automaton over a growing token sequence, with occurrence counts: the index of the suffix drafter.

The automaton (Blumer et al. 1985; SAM-Decoding, arXiv 2411.10666, drafts from one) has a state per class of
substrings that end at the same positions (``endpos``); ``count[s]`` is how many positions that is, kept exact as the
text grows. A ``Match`` follows the text's end: the longest suffix of the text that also occurred earlier, i.e. was
followed by at least one token. From its state, the transition by token c leads to the state of "suffix + c", whose
count is how often c followed the suffix; walking transitions further gives the trie of the next tokens over all
occurrences (``continuations``) without storing that trie.

Costs: ``extend`` is amortised O(1) transitions per token plus one count per state on the new end's suffix-link path
(the distinct occurrence sets among the text's suffixes: a handful in natural text); moving a ``Match`` on by one
token is amortised O(1). At most 2n - 1 states for n tokens: each a small dict of transitions and three ints
(479 bytes a token measured: ``suffix.py``'s docstring).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SEPARATOR = -1  # between two texts in one automaton: no query holds it, so no match runs across it


class SuffixAutomaton:
    """The suffix automaton of ``tokens`` (extended in place), with each state's occurrence count."""

    def __init__(self, tokens: Iterable[int] = ()):
        self.next: list[dict[int, int]] = [{}]  # [S] state -> {token: state}
        self.link: list[int] = [-1]  # [S] suffix link: the state of the longest suffix in another class
        self.length: list[int] = [0]  # [S] the longest string of the state
        self.count: list[int] = [0]  # [S] |endpos|: how many positions the state's strings end at
        self.last = 0  # the state of the whole text
        self.tokens = 0  # tokens added
        self.extend(tokens)

    def __len__(self) -> int:
        return self.tokens

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.add(token)

    def add(self, token: int) -> None:
        """Append one token (Blumer et al.'s online construction), then count the new end position on every
        state whose strings are suffixes of the text (the new state's suffix-link path)."""
        nxt, link, length = self.next, self.link, self.length
        current = len(nxt)
        nxt.append({})
        link.append(0)
        length.append(length[self.last] + 1)
        self.count.append(0)
        state = self.last
        while state != -1 and token not in nxt[state]:
            nxt[state][token] = current
            state = link[state]
        if state != -1:
            target = nxt[state][token]
            if length[state] + 1 == length[target]:
                link[current] = target
            else:
                link[current] = self._split(state, target, token)
        self.last = current
        self.tokens += 1
        count, state = self.count, current
        while state > 0:
            count[state] += 1
            state = link[state]

    def _split(self, state: int, target: int, token: int) -> int:
        """Clone ``target`` for the strings no longer than ``length[state] + 1`` (they end at the new position too);
        returns the clone."""
        nxt, link, length = self.next, self.link, self.length
        clone = len(nxt)
        nxt.append(dict(nxt[target]))
        link.append(link[target])
        length.append(length[state] + 1)
        self.count.append(self.count[target])  # the new position is counted by ``add``'s walk
        while state != -1 and nxt[state].get(token) == target:
            nxt[state][token] = clone
            state = link[state]
        link[target] = clone
        return clone

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """The match (state, length) of text + ``token`` from that of the text: the longest suffix of it that is a
        substring of what the automaton holds; (0, 0) when none."""
        nxt, link, length = self.next, self.link, self.length
        while state and token not in nxt[state]:
            state = link[state]
            matched = length[state]
        target = nxt[state].get(token)
        return (0, 0) if target is None else (target, matched + 1)

    def settle(self, state: int, matched: int) -> int:
        """The state of a match of ``matched`` tokens last in ``state``, after an ``add`` may have split it off."""
        return self.link[state] if state and matched <= self.length[self.link[state]] else state

    def continuations(self, state: int) -> list[tuple[int, int, int]]:
        """[(token, its state, how often it followed)] for every token that followed the state's strings."""
        count = self.count
        return [(token, child, count[child]) for token, child in self.next[state].items()]

    def match(self, tokens: Iterable[int]) -> Match:
        """The longest suffix of ``tokens`` that is a substring of the automaton's text (a static lookup)."""
        found = Match()
        for token in tokens:
            found.state, found.length = self.step(found.state, found.length, token)
        return found


@dataclass
class Match:
    """The longest suffix of a text found in an automaton: its state there and its length (0: none)."""

    state: int = 0
    length: int = 0


class GrowingText:
    """A text whose automaton grows with it, and the longest suffix of it that occurred before its last token."""

    def __init__(self, tokens: Iterable[int] = ()):
        self.automaton = SuffixAutomaton()
        self.match = Match()
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        automaton, match = self.automaton, self.match
        for token in tokens:
            match.state, match.length = automaton.step(match.state, match.length, token)  # before the token joins
            automaton.add(token)
            match.state = automaton.settle(match.state, match.length)
