"""What decoding needs of a grammar: one state of a constraint on the answer's tokens (``Grammar``), and its error.

A backend with a grammar engine makes the states (llama.cpp's: ``backends/llamacpp/grammar``); verification masks
and advances them per tree path, drafters offer only what they allow. Nothing here knows which engine it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ppd_core.errors import PpdError


class GrammarError(PpdError):
    """A grammar or schema the backend cannot use, or a token it forbids."""


class Grammar(Protocol):
    """A grammar's state after some tokens; ``child`` copies it one token further."""

    ended: int | None  # the end-of-generation token accepted, if any: nothing follows it

    def close(self) -> None:
        """Free the state (idempotent)."""
        ...

    def clone(self) -> Grammar:
        """A copy in the same state."""
        ...

    def accept(self, token: int) -> None:
        """Advance by ``token`` (one the grammar allows)."""
        ...

    def take(self, other: Grammar) -> None:
        """Become ``other``'s state (``other`` keeps this one's)."""
        ...

    def child(self, token: int) -> Grammar:
        """A copy advanced by ``token``."""
        ...

    def allows(self, tokens) -> np.ndarray:
        """[k] bool: which of ``tokens`` the grammar allows next."""
        ...

    def check_opening(self) -> None:
        """A GrammarError unless some token can begin an answer, at a bearable cost per row."""
        ...

    def allowed(self, row: np.ndarray) -> np.ndarray:
        """[vocab] float32: ``row`` with the tokens the grammar forbids at -inf (a copy)."""
        ...

    def best(self, row: np.ndarray) -> int:
        """The constrained argmax of ``row`` [vocab]."""
        ...


def allowed_prefix(grammar: Grammar, tokens: Sequence[int]) -> list[int]:
    """The longest prefix of ``tokens`` the grammar allows from its state, token by token."""
    state, kept = grammar.clone(), []
    try:
        for token in tokens:
            if not state.allows([token])[0]:
                break
            state.accept(token)
            kept.append(int(token))
    finally:
        state.close()
    return kept
