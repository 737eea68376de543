"""Where an answer's turn ends in its text, for a model that writes its chat's turn markers as text.

A GGUF without a chat template gets ChatML (llama-server's fallback), and a base model knows neither its markers nor
when to stop: it goes on writing "<|im_end|>", "<|im_start|>user" or "User:" as text, to the token limit. The markers
ppd chose end the answer, as llama-server's chat parsers end one at its template's markers: ``turn_stops`` names them,
``TurnEnd`` finds the first in a growing answer, token by token, so the answer ends at the token that completes one and
greedy PPD still equals plain decoding. The marker's own text is never shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")  # anywhere in the answer
ROLE_TAGS = ("<assistant>", "<user>", "<system>")  # anywhere: tags no prose writes
# a line that starts a new turn (the answer's own start counts as a line start)
TURN_LINES = tuple(f"\n{role}:" for role in ("User", "Assistant", "System", "user", "assistant", "system", "USER",
                                             "ASSISTANT", "Human", "### User", "### Assistant"))


def turn_stops(tokenizer) -> tuple[str, ...]:
    """The texts that end an answer to a chat in ``tokenizer``'s template: ChatML's markers, role tags and a line
    starting a new turn where the model has no template of its own (ChatML then stands in); () where it has one (its
    end-of-turn token ends the answer)."""
    if getattr(tokenizer, "has_own_template", True):
        return ()
    return CHATML_MARKERS + ROLE_TAGS + TURN_LINES


@dataclass
class TurnEnd:
    """The first stop text in a growing answer: ``add`` feeds a step's tokens one by one to the answer's text stream
    until one completes a stop text; ``shown`` is how much of the text may be shown (not a stop text, nor an end that
    may begin one until the answer ends). Texts starting with a newline also match at the answer's start."""

    stops: Sequence[str]
    shown: int = 0  # characters of the text that may be shown
    hit: bool = False

    def add(self, text, tokens: Sequence[int], final: bool) -> int:
        """Feed ``tokens`` to ``text`` (a ``text_stream``) up to the one that completes a stop text; how many were fed.
        ``final``: they are the answer's last (nothing is held back then)."""
        for count, token in enumerate(tokens, 1):
            before = len(text.text)
            text.add(token)
            if self._found(text.text, before):
                return count
        if final:
            text.flush()
        self._hold(text.text, final)
        return len(tokens)

    def _found(self, text: str, before: int) -> bool:
        """Whether a stop text ends in what came after ``before`` characters; ``shown`` then ends where it begins."""
        padded = "\n" + text  # padded[i] is text[i - 1]: the answer's start is a line start
        start = max(0, before + 1 - max(map(len, self.stops)))
        found = [at for at in (padded.find(stop, start) for stop in self.stops) if at >= 0]
        if not found:
            return False
        self.shown, self.hit = max(min(found) - 1, 0), True  # held back so far: never before ``shown``
        return True

    def _hold(self, text: str, final: bool) -> None:
        """Everything shown but an end that may begin a stop text (at the answer's end: everything)."""
        padded, held = "\n" + text, 0
        if not final:
            room = len(text) - self.shown
            held = max((k for stop in self.stops for k in range(min(len(stop) - 1, room), 0, -1)
                        if padded.endswith(stop[:k])), default=0)
        self.shown = max(self.shown, len(text) - held)
