"""A ``/v1/completions`` (or ``/infill``) prompt made token ids, as llama-server takes it: a string, token ids, a
one-prompt list of either, or llama-server's mixed list of strings and ids; ``suffix`` makes it fill-in-the-middle
with the model's own FIM tokens (llama-server's ``/infill`` layout: ``<PRE>`` prefix ``<SUF>`` suffix ``<MID>``).
Every mistake is an ``ApiError`` naming its field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.api.errors import ApiError
from app.api.messages import encodable
from ppd_core.errors import PpdError

FIM_TEXTS = {  # the FIM tokens' text in the vocabularies llama.cpp knows (llama-vocab.cpp), for non-GGUF tokenizers
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
            "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
            "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
            "<|middle|>"),
}


@dataclass
class Prompt:
    """A completion's prompt: its token ids and, with ``echo``, the text the answer begins with."""

    ids: list[int]
    echo: str = ""


def is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def pieces_of(prompt: Any) -> list:
    """The one prompt a request holds, as a list of strings and token-id lists (llama-server's readings)."""
    if isinstance(prompt, str) or is_ids(prompt) and prompt:
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in prompt):
        if any(isinstance(p, int) for p in prompt):  # llama-server's mixed prompt: one prompt of text and ids
            return [[p] if isinstance(p, int) else p for p in prompt]
        if len(prompt) == 1:
            return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or is_ids(prompt[0]) and prompt[0]):
        return [prompt[0]]
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) or is_ids(p) for p in prompt):
        raise ApiError(f"prompt holds {len(prompt)} prompts; ppd answers one prompt per request: send each in a "
                       "request of its own", "prompt")
    raise ApiError("prompt must be a string, a list of token ids, or a list holding one of either", "prompt")


def token_ids(tokenizer, pieces: list, first: bool = True) -> list[int]:
    """The pieces' token ids: text tokenized as llama-server does (BOS where the vocabulary adds one, before the first
    piece only), ids checked against the vocabulary."""
    vocab = vocab_size(tokenizer)
    ids: list[int] = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, str):
            text = encodable(piece, "prompt")
            try:
                ids += tokenizer.encode(text, add_special_tokens=first and index == 0) if text else []
            except PpdError as error:
                raise ApiError(str(error), "prompt") from None
        else:
            bad = [t for t in piece if not 0 <= t < vocab]
            if bad:
                raise ApiError(f"prompt: token id {bad[0]} is not in this model's vocabulary (0 to {vocab - 1})",
                               "prompt")
            ids += piece
    return ids


def vocab_size(tokenizer) -> int:
    size = getattr(tokenizer, "vocab_size", None)
    return int(size if isinstance(size, int) else len(tokenizer))


def echo_text(tokenizer, pieces: list) -> str:
    """The prompt as text (``echo``): its strings as sent, its ids decoded."""
    return "".join(p if isinstance(p, str) else tokenizer.decode(p) for p in pieces)


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The model's fill-in-the-middle tokens (prefix, suffix, middle), or None where its vocabulary has none: llama.cpp
    finds them for a GGUF (by metadata or by text); other tokenizers are looked up by the texts llama.cpp knows."""
    llama, vocab = getattr(tokenizer, "llama", None), getattr(tokenizer, "vocab", None)
    if llama is not None and vocab is not None:
        found = (llama.llama_vocab_fim_pre(vocab), llama.llama_vocab_fim_suf(vocab), llama.llama_vocab_fim_mid(vocab))
        return tuple(int(t) for t in found) if all(t >= 0 for t in found) else None
    known = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    found = [next((known[text] for text in FIM_TEXTS[part] if text in known), None) for part in ("pre", "suf", "mid")]
    return tuple(found) if None not in found else None


def fill_in_the_middle(tokenizer, prefix: list, suffix: str, param: str = "suffix", middle: list | None = None) -> list[int]:
    """llama-server's infill prompt: BOS (where the vocabulary adds one), ``<PRE>`` prefix ``<SUF>`` suffix ``<MID>``,
    then ``middle`` (what the middle already begins with); a 400 naming ``param`` where the model has no FIM tokens."""
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise ApiError(f"{param}: this model has no fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, "
                       f"<fim_middle>), so it cannot complete between a prefix and a suffix", param)
    pre, suf, mid = fim
    bos = getattr(tokenizer, "bos_token_id", None)
    head = [t for t in tokenizer.encode("", add_special_tokens=True) if t == bos][:1] if bos is not None else []
    tail = token_ids(tokenizer, middle, first=False) if middle else []
    return [*head, pre, *token_ids(tokenizer, prefix, first=False), suf,
            *token_ids(tokenizer, [encodable(suffix, param)], first=False), mid, *tail]


def completion_prompt(tokenizer, prompt: Any, suffix: str | None, echo: bool) -> Prompt:
    """A completion request's prompt; a 400 naming ``prompt`` or ``suffix`` where it cannot be used."""
    if prompt is None:
        raise ApiError("prompt is required: a string or a list of token ids", "prompt")
    pieces = pieces_of(prompt)
    if suffix is not None and not isinstance(suffix, str):
        raise ApiError("suffix must be a string", "suffix")
    ids = fill_in_the_middle(tokenizer, pieces, suffix) if suffix else token_ids(tokenizer, pieces)
    if not ids or all(isinstance(p, str) and not p for p in pieces) and not suffix:
        raise ApiError("prompt is empty", "prompt")
    return Prompt(ids, echo_text(tokenizer, pieces) if echo else "")
