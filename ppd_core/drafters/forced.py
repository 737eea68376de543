"""Text the grammar forces next, drafted as a chain: the "grammar" guess source.

Inside a JSON schema much of an answer is fixed: keys, quotes, colons, commas, brackets. ``ForcedText.propose`` walks
llama.cpp's grammar from the answer's current state one character at a time (each printable character the
vocabulary has as a token of its own, asked of the grammar together): where the grammar allows exactly one
character other than whitespace, that character is forced. Where it also allows whitespace first (JSON grammars
allow it between any two tokens), the answer's own habit decides: the whitespace it wrote last between the same two
characters (``{``, ``[`` and ``,`` taken as one), else JSON's usual (", " and ": "; none elsewhere); the forced text
ends with the whitespace the answer writes after its last character. The forced text is tokenized as the tokenizer
tokenizes it and kept as far as the grammar allows it token by token, so a guess the grammar forbids is never
drafted. Verification decides what is kept: the drafter changes the speed, never the answer.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.drafters.base import ChainPolicy, Draft, Guesses, Verified, right_guesses
from ppd_core.sampling.constraint import allowed_prefix

if TYPE_CHECKING:
    from ppd_core.sampling.constraint import Grammar

WHITESPACE = " \n\t"
USUAL_SPACE = {",": " ", ":": " "}  # after these, JSON as usually written has a space; elsewhere none
OPENING = "{[,"  # an item follows: one habit for all three (an answer indents after each alike)
MAX_CHARS = 48  # the longest forced text looked for in one step
PRIOR = 0.99  # a forced token's estimate where the policy keeps no chances: the grammar leaves little else


class ForcedText:
    """One answer's forced-text drafter (``observe`` the emitted text, ``propose`` a chain)."""

    def __init__(self, char_tokens: dict[str, int], encode: Callable[[str], list[int]], piece: Callable[[int], str]):
        """``char_tokens``: character -> the token that is that character alone (``char_tokens``); ``encode``:
        text -> token ids, no special tokens; ``piece``: a token's text."""
        self.chars = [c for c in char_tokens if c not in WHITESPACE]  # [C]
        self.char_ids = np.array([char_tokens[c] for c in self.chars], dtype=np.int32)  # [C]
        self.space_ids = {c: char_tokens[c] for c in WHITESPACE if c in char_tokens}
        self.encode, self.piece = encode, piece
        self.habit: dict[tuple[str, str], str] = {}  # (character, next non-space character) -> whitespace between
        self.after: dict[str, str] = {}  # character -> the whitespace written after it last
        self.last = ""  # the answer's last non-space character
        self.gap = ""  # the whitespace written after it so far

    def observe(self, tokens: Sequence[int]) -> None:
        """The answer went on with ``tokens``: learn its whitespace habit."""
        for c in "".join(self.piece(token) for token in tokens):
            if c in WHITESPACE:
                self.gap += c
                continue
            if self.last:
                self.habit[(kind(self.last), c)] = self.after[kind(self.last)] = self.gap
            self.last, self.gap = c, ""

    def propose(self, grammar: Grammar, limit: int) -> list[int]:
        """Up to ``limit`` tokens of the text the grammar forces after the answer so far ([] if none)."""
        if limit < 1 or grammar.ended is not None:
            return []
        state, text, last, gap = grammar.clone(), "", self.last, self.gap
        try:
            while len(text) < MAX_CHARS:
                allowed = self.char_ids[state.allows(self.char_ids)]
                if len(allowed) != 1:
                    break
                c = self.chars[int(np.flatnonzero(self.char_ids == allowed[0])[0])]
                if not gap:  # whitespace before it, where the grammar lets it and the habit has it
                    text += self.space(state, self.habit.get((kind(last), c), self.usual(last)))
                state.accept(int(allowed[0]))
                text, last, gap = text + c, c, ""
            if text:
                text += self.space(state, self.usual(last))
        finally:
            state.close()
        return allowed_prefix(grammar, self.encode(text)[:limit]) if text else []

    def usual(self, last: str) -> str:
        """The whitespace the answer writes after ``last``, as far as it has shown."""
        return self.after.get(kind(last), USUAL_SPACE.get(last, ""))

    def space(self, state: Grammar, whitespace: str) -> str:
        """As much of ``whitespace`` as the grammar allows next, accepted by ``state``."""
        for i, w in enumerate(whitespace):
            if w not in self.space_ids or not state.allows([self.space_ids[w]])[0]:
                return whitespace[:i]
            state.accept(self.space_ids[w])
        return whitespace


class GrammarDrafter:
    """The grammar's forced text as a drafter: a chain as long as its ``ChainPolicy`` (one match class, 0) says, each
    token's estimate the policy's learnt chance (near 1: ``calibration.prior.FORCED_PRIOR``), else ``PRIOR``."""

    name = "grammar"

    def __init__(self, text: ForcedText, policy: ChainPolicy, grammar: Grammar):
        """``grammar``: the answer's state, advanced in place as tokens are emitted."""
        self.text, self.policy, self.grammar = text, policy, grammar
        self.forced: list[int] = []  # this step's forced text, drafted or not

    def propose(self, draft: Draft) -> None:
        self.forced, chain = [], []
        if self.policy.length(0, self.policy.longest):  # a chain could pay on this device
            self.forced = self.text.propose(self.grammar, self.policy.longest)
            chain = self.forced[: self.policy.length(0, len(self.forced))] if self.forced else []
        chances = self.policy.chances(0, len(chain)) if chain else None
        probs = [PRIOR] * len(chain) if chances is None else [min(1.0, max(1e-6, float(c))) for c in chances]
        draft.add(self.name, Guesses.chain(chain, probs))

    def observe(self, verified: Verified) -> None:
        """The emitted tokens show how much of the forced text was right, and the answer's whitespace habit."""
        stats = verified.stats
        if self.forced:
            forcing = sum(1 for node in verified.kept.get(self.name, ()) if node >= 0)
            self.policy.observe(0, right_guesses(self.forced, stats.tokens, 0), forcing, len(self.forced))
        self.text.observe(stats.tokens)
        self.forced = []


def kind(c: str) -> str:
    return "," if c in OPENING else c


def char_tokens(encode: Callable[[str], list[int]]) -> dict[str, int]:
    """Each printable ASCII character the vocabulary has as a token of its own, with that token."""
    found = {}
    for c in string.printable:
        if c in "\r\x0b\x0c":
            continue
        ids = encode(c)
        if len(ids) == 1:
            found[c] = ids[0]
    return found
