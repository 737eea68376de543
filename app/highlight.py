"""The answer's accepted guesses marked by where they came from: each source (a drafter's name) its own colour where
the page knows it (prompt tokens, lookup, the grammar), a neutral one named by its title elsewhere."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ppd_core.text import text_stream

PROMPT_MARK = '<mark style="background-color: #ffe066">'  # guesses from the prompt tokens: yellow
LOOKUP_MARK = '<mark style="background-color: #bfe3ff">'  # guesses copied from the conversation: blue
GRAMMAR_MARK = '<mark style="background-color: #c8f0c0">'  # text the grammar forced: green
MARKS = {"prompt tokens": PROMPT_MARK, "lookup": LOOKUP_MARK, "grammar": GRAMMAR_MARK}
NEUTRAL_STYLE = 'style="background-color: #e4e4e4"'  # any other source's guesses: grey


def mark(source: str) -> str:
    """The opening tag that marks ``source``'s guesses (an unknown source's: neutral, its name as the title)."""
    return MARKS.get(source) or f'<mark {NEUTRAL_STYLE} title="{html.escape(source, quote=True)}">'


class Highlighter:
    """Builds the answer text with the tokens that came from accepted guesses marked by source, token by token; every
    piece of the model's text escaped (an answer holding ``<img onerror=...>`` is shown as text, never run)."""

    def __init__(self, tokenizer):
        self.text = text_stream(tokenizer)
        self.pieces: list[tuple[str, str | None]] = []  # (text, its source's name or None: the model's own)
        self.html = ""

    def add(self, tokens: Sequence[int], sources: Sequence[str] = ()) -> None:
        """A step's tokens: its accepted guesses first (``sources``: each one's source, ``StepStats.sources``), then
        the model's own."""
        for index, token in enumerate(tokens):
            piece = self.text.add(token)
            source = sources[index] if index < len(sources) else None
            self.pieces.append((piece, source))
            text = html.escape(piece)  # the model's text is text, never markup
            self.html += f"{mark(source)}{text}</mark>" if source is not None and piece.strip() else text
