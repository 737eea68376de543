"""Tokens <-> text: the chat template, and incremental decoding of a growing answer.

One place for both, so the engine, calibration and training encode chats the same way, and
streaming costs O(new tokens) per step instead of re-decoding the whole answer.

Threads: API workers encode while the model's worker decodes, with one tokenizer and no lock here.
llama.cpp's tokenizer only reads its vocabulary (``ppd_core.gguf_text``); a Hugging Face fast tokenizer
of tokenizers 0.23 (what transformers 5.23 requires) makes a settings change wait for an encode in
flight, where older ones (0.20.3, checked) raised "Already borrowed". tests/test_threads.py holds both to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def chat_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of ``messages`` in the model's chat template, ready for the assistant's answer."""
    encoded = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def text_stream(tokenizer):
    """An incremental decoder for ``tokenizer``'s tokens: its own where it has one (llama.cpp's byte pieces), else
    ``TextStream``."""
    own = getattr(tokenizer, "text_stream", None)
    return own() if own is not None else TextStream(tokenizer)


class TextStream:
    """The text of a growing list of answer tokens, special tokens skipped.

    ``add`` returns the text a token adds; a token that ends inside a multi-byte character
    adds "" until the character is complete. Fast tokenizers use the tokenizers library's
    ``DecodeStream``; others decode a short window of recent tokens (as text-generation-
    inference does). Either way ``text`` equals ``tokenizer.decode(tokens)`` once complete.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._backend = backend if backend is not None and plain else None
        self._stream = None
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream  # noqa: PLC0415 - Hugging Face tokenizers only

            self._stream = DecodeStream(skip_special_tokens=True)
        self._prefix_offset = 0  # window decoding: tokens before this are already text
        self._read_offset = 0

    def add(self, token: int) -> str:
        self.tokens.append(token)
        if self._stream is not None:
            piece = self._stream.step(self._backend, token) or ""
        else:
            piece = self._window_piece()
        self.text += piece
        return piece

    def extend(self, tokens: Iterable[int]) -> str:
        return "".join(self.add(token) for token in tokens)

    def flush(self) -> str:
        """At the end of the answer: whatever an incomplete last character left out (as U+FFFD)."""
        full = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        piece = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += piece
        return piece

    def _window_piece(self) -> str:
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        before = decode(self.tokens[self._prefix_offset : self._read_offset])
        after = decode(self.tokens[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.tokens)
        return after[len(before) :]
