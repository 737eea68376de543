"""Tokens <-> text: the chat template, and incremental decoding of a growing answer.

One place for both, so the engine, calibration and training encode chats the same way, and
streaming costs O(new tokens) per step instead of re-decoding the whole answer.

Threads: API workers encode while the model's worker decodes, with one tokenizer and no lock here.
llama.cpp's tokenizer only reads its vocabulary (``ppd_core.backends.llamacpp.text``); a Hugging Face fast tokenizer
of tokenizers 0.23 (what transformers 5.23 requires) makes a settings change wait for an encode in
flight, where older ones (0.20.3, checked) raised "Already borrowed". tests/test_threads.py holds both to it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ppd_core.errors import PpdError


class UnencodableText(PpdError):
    """Text UTF-8 cannot encode: a lone UTF-16 surrogate (what JSON's ``"\\ud800"`` escape decodes to)."""


def utf8(text: str, name: str = "the text") -> bytes:
    """``text`` in UTF-8; UnencodableText (one line naming ``name``) where it holds a lone surrogate, which no
    tokenizer can take."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UnencodableText(f"{name} has a character UTF-8 cannot encode: U+{ord(text[error.start]):04X} "
                              f"(a lone UTF-16 surrogate) at position {error.start}") from None


def chat_ids(tokenizer, messages: Sequence[dict], **variables) -> list[int]:
    """Token ids of ``messages`` in the model's chat template, ready for the assistant's answer (``variables``, such as
    ``tools=[...]``, reach the template); UnencodableText for
    a message with a lone surrogate. Special-token text inside a message stays plain text: a GGUF's tokenizer sees
    to it (``plain_content_ids``), transformers' with ``sanitize_control_tokens``, only for messages that hold such
    text (the others get exactly the ids of the rendered template)."""
    for index, message in enumerate(messages):
        for key, value in message.items():
            if isinstance(value, str):
                utf8(value, f"message {index + 1}'s {key}")
    sanitize = {"sanitize_control_tokens": True} if hf_control_text(tokenizer, messages) else {}
    try:
        encoded = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **sanitize,
                                                 **variables)
    except ValueError as error:  # transformers: a control token it cannot write as text (a PpdError passes as is)
        if not sanitize or isinstance(error, PpdError):
            raise
        raise PpdError(f"a message holds special-token text this tokenizer cannot keep as text: {error}") from None
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def hf_control_text(tokenizer, messages: Sequence[dict]) -> bool:
    """Whether a message's content holds the text of one of a transformers tokenizer's added tokens (those
    ``sanitize_control_tokens`` may keep as text; white-space tokens are ordinary text); False for a GGUF's."""
    if hasattr(tokenizer, "render_chat"):  # a GgufTokenizer: its own template keeps contents plain
        return False
    texts = [text for text in getattr(tokenizer, "added_tokens_encoder", {}) if text and not text.isspace()]
    return any(isinstance(m.get("content"), str) and any(text in m["content"] for text in texts) for m in messages)


@dataclass
class Specials:
    """The tokens a tokenizer makes of their text when it parses special tokens (``<|im_end|>``): text -> id, those
    that strip the spaces before (``lstrip``) or after (``rstrip``) them, and the characters they strip."""

    ids: dict[str, int]
    lstrip: frozenset[int] = frozenset()
    rstrip: frozenset[int] = frozenset()
    spaces: str | None = None  # None: Unicode white space
    pattern: re.Pattern = field(init=False)

    def __post_init__(self):
        texts = sorted((text for text in self.ids if text), key=len, reverse=True)  # the longest first
        self.pattern = re.compile("|".join(map(re.escape, texts)) if texts else "(?!)")

    def found_in(self, messages: Sequence[dict]) -> bool:
        """Whether a message's content holds special-token text."""
        return any(isinstance(m.get("content"), str) and self.pattern.search(m["content"]) for m in messages)

    def split(self, text: str) -> list[str | int]:
        """``text`` as plain pieces and the special tokens between them."""
        parts: list[str | int] = []
        end = 0
        for match in self.pattern.finditer(text):
            parts += [text[end : match.start()], self.ids[match.group()]]
            end = match.end()
        return [*parts, text[end:]]

    def strip_around(self, parts: list[str | int]) -> list[str | int]:
        """``parts`` without the spaces a neighbouring special token strips, and without empty pieces."""
        for index, part in enumerate(parts):
            if isinstance(part, str):
                continue
            if part in self.lstrip and index and isinstance(parts[index - 1], str):
                parts[index - 1] = parts[index - 1].rstrip(self.spaces)
            if part in self.rstrip and index + 1 < len(parts) and isinstance(parts[index + 1], str):
                parts[index + 1] = parts[index + 1].lstrip(self.spaces)
        return [part for part in parts if part != ""]


def plain_content_ids(render: Callable[[list[dict]], str], messages: Sequence[dict], specials: Specials,
                      encode_plain: Callable[[str], list[int]]) -> list[int]:
    """Token ids of ``messages`` in the chat template ``render`` renders, each message's content as plain text: the
    template's own special-token text becomes its tokens, the rest (template text and contents together) is
    ``encode_plain``'s (special-token text left as text), split at the template's special tokens as the tokenizer
    splits a text, so ordinary text gets the ids it gets in the rendered text. PpdError where the template changes a
    content (the placeholders could not stand for it)."""
    pieces, contents = marked_pieces(render, messages)
    if "".join(contents.get(piece, piece) for piece in pieces) != render([dict(m) for m in messages]):
        raise PpdError("the chat template changes a message's text, and the message holds special-token text "
                       "(such as an end-of-turn marker): remove it")
    parts = specials.strip_around(template_parts(pieces, contents, specials))
    return [token for part in parts for token in (encode_plain(part) if isinstance(part, str) else [part])]


def marked_pieces(render: Callable[[list[dict]], str], messages: Sequence[dict]) -> tuple[list[str], dict[str, str]]:
    """The template rendered with a unique placeholder for each string content, split at the placeholders (the odd
    pieces), and each placeholder's content."""
    nonce = secrets.token_hex(8)
    marks = {index: f"\ue000{nonce}:{index}\ue000" for index, m in enumerate(messages)
             if isinstance(m.get("content"), str)}
    rendered = render([{**m, "content": marks[i]} if i in marks else dict(m) for i, m in enumerate(messages)])
    pieces = re.split("(" + "|".join(map(re.escape, marks.values())) + ")", rendered) if marks else [rendered]
    return pieces, {mark: messages[index]["content"] for index, mark in marks.items()}


def template_parts(pieces: list[str], contents: dict[str, str], specials: Specials) -> list[str | int]:
    """The template's pieces split at their special tokens, the contents (odd pieces) whole as text; neighbouring
    text joined."""
    parts: list[str | int] = [""]
    for index, piece in enumerate(pieces):
        for part in ([contents[piece]] if index % 2 else specials.split(piece)):
            if isinstance(part, str) and isinstance(parts[-1], str):
                parts[-1] += part
            else:
                parts.append(part)
    return parts


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
