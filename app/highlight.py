"""The answer's accepted guesses marked by where they came from: prompt tokens, lookup, the grammar."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ppd_core import text_stream

PROMPT_MARK = '<mark style="background-color: #ffe066">'  # guesses from the prompt tokens: yellow
LOOKUP_MARK = '<mark style="background-color: #bfe3ff">'  # guesses copied from the conversation: blue
GRAMMAR_MARK = '<mark style="background-color: #c8f0c0">'  # text the grammar forced: green
MARKS = {"prompt tokens": PROMPT_MARK, "lookup": LOOKUP_MARK, "grammar": GRAMMAR_MARK}


def step_sources(from_guesses: int, from_lookup: int = 0, from_grammar: int = 0) -> list[str]:
    """Where each of a step's accepted guesses came from, in path order: prompt tokens, lookup, grammar."""
    prompt = from_guesses - from_lookup - from_grammar
    return ["prompt tokens"] * prompt + ["lookup"] * from_lookup + ["grammar"] * from_grammar


class Highlighter:
    """Builds the answer text with the tokens that came from accepted guesses marked by source, token by token; every
    piece of the model's text escaped (an answer holding ``<img onerror=...>`` is shown as text, never run)."""

    def __init__(self, tokenizer):
        self.text = text_stream(tokenizer)
        self.pieces: list[tuple[str, str | None]] = []  # (text, a ``MARKS`` source or None: the model's own)
        self.html = ""

    def add(self, tokens: Sequence[int], from_guesses: int, from_lookup: int = 0, from_grammar: int = 0) -> None:
        """A step's tokens: its accepted guesses first (``step_sources``' order), then the model's own."""
        sources = step_sources(from_guesses, from_lookup, from_grammar)
        for index, token in enumerate(tokens):
            piece = self.text.add(token)
            source = sources[index] if index < len(sources) else None
            self.pieces.append((piece, source))
            opening, text = MARKS.get(source), html.escape(piece)  # the model's text is text, never markup
            self.html += f"{opening}{text}</mark>" if opening and piece.strip() else text
