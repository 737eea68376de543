"""Tokens <-> text: incremental decoding equals decoding the whole answer, multi-byte characters included."""

import pytest
from transformers import AutoTokenizer

from ppd_core.text import TextStream, chat_ids

TEXT = "Héllo wörld! 你好，世界 🙂🙂 code:\n    return x**2  # done. Ünïcödé ½ ≠ ∞. "


class WindowOnly:
    """The same tokenizer seen as a slow one (no ``backend_tokenizer``): the window-decoding path."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)  # the default model's tokenizer


@pytest.mark.parametrize("slow", [False, True])
def test_stream_equals_full_decode_token_by_token(tokenizer, slow):
    ids = tokenizer.encode(TEXT * 3, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids += tokenizer.encode(" after the end", add_special_tokens=False)
    stream = TextStream(WindowOnly(tokenizer) if slow else tokenizer)
    assert (stream._stream is None) == slow
    for count, token in enumerate(ids, 1):
        piece = stream.add(token)
        full = tokenizer.decode(ids[:count], skip_special_tokens=True)
        assert "\ufffd" not in piece
        assert full.startswith(stream.text)  # never ahead of the truth, never a broken character
        assert len(full) - len(stream.text) <= 2  # and never behind by more than one unfinished character
    assert stream.flush() == "" and stream.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_flush_shows_an_unfinished_character_at_the_end(tokenizer):
    emoji = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(emoji) > 1  # a byte-level BPE splits it
    stream = TextStream(tokenizer)
    assert stream.extend(emoji[:-1]) == ""  # incomplete: nothing yet
    assert stream.flush() == tokenizer.decode(emoji[:-1])  # the answer ended there: show what the tokenizer shows


def test_chat_ids_match_the_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = chat_ids(tokenizer, messages)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and "Be brief." in text and "Hi" in text
