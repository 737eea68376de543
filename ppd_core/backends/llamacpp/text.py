"""Tokens <-> text for a GGUF model, from llama.cpp's own vocabulary: no transformers, no Hugging Face copy.

``GgufTokenizer`` offers what ppd uses of a transformers tokenizer (``encode``, ``decode``, the special
token ids, ``apply_chat_template``) on a model loaded with llama-cpp-python's low-level API. The chat
template is the file's ``tokenizer.chat_template``, rendered as llama-cpp-python's ``Jinja2ChatFormatter``
renders it (sandboxed Jinja, trim_blocks and lstrip_blocks, ``raise_exception``, ``strftime_now``, the
BOS and EOS tokens as text); a model without one gets ChatML, llama-server's fallback. The rendered
text is tokenized with special tokens parsed and nothing added: the template writes its own BOS, as in
transformers and llama-cpp-python; special-token text inside a message stays plain text.

``ByteTextStream`` is the streaming counterpart of ``ppd_core.text.TextStream``: it joins the tokens'
bytes and emits the longest complete UTF-8 prefix, O(new tokens) per step.

Thread safety: llama.cpp's tokenizer and piece functions only read the vocabulary, and ctypes releases
the GIL around them, so several threads may encode and decode at once; the per-token piece caches are
dicts whose single reads and writes are atomic. The tokenizer holds the model's pointer and must not
outlive it (``owner`` keeps a Python object that frees the model alive).
"""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Iterable, Sequence
from functools import cached_property

from ppd_core.errors import PpdError
from ppd_core.text import Specials, plain_content_ids, utf8

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
MODEL_TEMPLATE = "the model's"
CHATML_SOURCE = "ChatML (the model has none)"
PIECE_BUFFER = 64  # bytes; a longer piece is read again into a buffer of its size
C_SPACE = " \t\n\v\f\r"  # what C's isspace() strips around a special token with the lstrip or rstrip attribute


class ChatTemplateError(PpdError):
    """The chat template could not render the messages; one line naming the cause."""


class GgufTokenizer:
    """The tokenizer of a llama.cpp model: ``model`` is a ``llama_model_p`` from ``llama_model_load_from_file``."""

    def __init__(self, model, llama=None, owner=None):
        if llama is None:
            import llama_cpp as llama  # noqa: PLC0415 - a caller may pass the module it already imported
        self.llama = llama
        self.model = model
        self.owner = owner
        self.vocab = llama.llama_model_get_vocab(model)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self.vocab))
        self.bos_token_id = self._token_or_none(llama.llama_vocab_bos(self.vocab))
        self.eos_token_id = self._token_or_none(llama.llama_vocab_eos(self.vocab))
        self.eot_token_id = self._token_or_none(llama.llama_vocab_eot(self.vocab))
        self.pad_token_id = self._token_or_none(llama.llama_vocab_pad(self.vocab))
        self.adds_bos = bool(llama.llama_vocab_get_add_bos(self.vocab))
        # SentencePiece vocabularies with a space prefix: the first piece of a decoded text loses its leading space
        # (as llama_detokenize and transformers do)
        self.add_space_prefix = (self.metadata("tokenizer.ggml.model") == "llama"
                                 and self.metadata("tokenizer.ggml.add_space_prefix") != "false")
        is_eog = llama.llama_vocab_is_eog
        vocab = self.vocab
        self.eog_token_ids: frozenset[int] = frozenset(
            token for token in range(self.vocab_size) if is_eog(vocab, token))  # ~20 ms for 49k tokens
        self._pieces: dict[int, bytes] = {}  # token -> its bytes, special tokens rendered
        self._plain_pieces: dict[int, bytes] = {}  # token -> its bytes with special tokens skipped (b"")
        template = llama.llama_model_chat_template(model, None)
        self.template_source = MODEL_TEMPLATE if template else CHATML_SOURCE
        self.chat_template: str = template.decode("utf-8", errors="replace") if template else CHATML_TEMPLATE
        self._template_name = "the model's chat template" if template else "the ChatML chat template"
        self._formatters: dict[bool, object] = {}  # add_generation_prompt -> compiled Jinja2ChatFormatter

    @property
    def has_own_template(self) -> bool:
        """Whether the GGUF brings its own chat template (else chats use ChatML, as llama-server does)."""
        return self.template_source == MODEL_TEMPLATE

    def text_stream(self) -> ByteTextStream:
        """An incremental decoder of this tokenizer's tokens (``ppd_core.text.text_stream``)."""
        return ByteTextStream(self)

    # --- metadata and special tokens --------------------------------------------------------

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value of the model as text (None where the file has no such key)."""
        size = 256
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = self.llama.llama_model_meta_val_str(self.model, key.encode(), buffer, size)
            if length < 0:
                return None
            if length < size:
                return buffer.value.decode("utf-8", errors="replace")
            size = length + 1

    def token_text(self, token: int | None) -> str:
        """The vocabulary's text of ``token`` (e.g. ``<|im_end|>``); "" for None."""
        if token is None:
            return ""
        return self.llama.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> str:
        return self.token_text(self.bos_token_id)

    @property
    def eos_token(self) -> str:
        return self.token_text(self.eos_token_id)

    def is_special(self, token: int) -> bool:
        """Whether ``decode(..., skip_special_tokens=True)`` leaves ``token`` out (control and end tokens)."""
        return token in self.eog_token_ids or bool(self.llama.llama_vocab_is_control(self.vocab, token))

    def _token_or_none(self, token: int) -> int | None:
        return None if token < 0 else int(token)

    @cached_property
    def specials(self) -> Specials:
        """The tokens llama.cpp parses as special in a text (control and unknown tokens), with their lstrip and
        rstrip attributes (llama.cpp strips C's white space)."""
        llama, vocab, ids, attributes = self.llama, self.vocab, {}, {}
        parsed = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_UNKNOWN  # what parse_special=True parses
        for token in range(self.vocab_size):  # ~20 ms for 49k tokens, once
            attribute = int(llama.llama_vocab_get_attr(vocab, token))
            text = self.token_text(token) if attribute & parsed else ""
            if text and text not in ids:
                ids[text], attributes[token] = token, attribute
        return Specials(ids, frozenset(t for t, a in attributes.items() if a & llama.LLAMA_TOKEN_ATTR_LSTRIP),
                        frozenset(t for t, a in attributes.items() if a & llama.LLAMA_TOKEN_ATTR_RSTRIP), C_SPACE)

    # --- tokens <-> text ------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; special-token text (``<|im_start|>``) becomes its token, as in transformers, unless
        ``parse_special`` is False (then it is plain text); ``add_special_tokens`` adds BOS (and EOS) where the
        vocabulary says to. UnencodableText (a PpdError, one line) for a lone surrogate."""
        data = utf8(text)
        capacity = len(data) + 2  # a token covers at least one byte, plus BOS and EOS
        while True:
            tokens = (ctypes.c_int32 * capacity)()
            count = self.llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity,
                                              add_special_tokens, parse_special)
            if count >= 0:
                return list(tokens[:count])
            capacity = -count

    def token_bytes(self, token: int, skip_special_tokens: bool = False) -> bytes:
        """The bytes ``token`` adds to a decoded text (b"" for a control or end token when skipping them)."""
        token = int(token)  # a NumPy integer too
        cache = self._plain_pieces if skip_special_tokens else self._pieces
        piece = cache.get(token)
        if piece is None:
            if skip_special_tokens and self.is_special(token):
                piece = b""
            else:
                piece = self._piece(token, special=not skip_special_tokens)
            cache[token] = piece
        return piece

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        data = b"".join(self.token_bytes(token, skip_special_tokens) for token in ids)
        if self.add_space_prefix and data.startswith(b" "):
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def _piece(self, token: int, special: bool) -> bytes:
        size = PIECE_BUFFER
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = self.llama.llama_token_to_piece(self.vocab, token, buffer, size, 0, special)
            if length >= 0:
                return buffer.raw[:length]
            size = -length

    # --- chat -----------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, **variables) -> list[int] | str:
        """``messages`` in the chat template: token ids (the template's own BOS, special tokens parsed), or the
        text with ``tokenize=False``; ChatTemplateError (one line) where the template refuses them. ``variables``
        reach the template (``enable_thinking=False``, ``tools=[...]``), as in transformers.

        Special-token text inside a message (``<|im_end|>`` typed or pasted) stays plain text: only the template's
        own markers become control tokens (``ppd_core.text.plain_content_ids``), so a message cannot fake a turn.
        Messages without such text take the direct path (the rendered text tokenized whole): the same ids."""
        text = self.render_chat(messages, add_generation_prompt, **variables)
        if not tokenize:
            return text
        if self.specials.found_in(messages):
            return plain_content_ids(lambda marked: self.render_chat(marked, add_generation_prompt, **variables),
                                     messages, self.specials, self._encode_plain)
        return self.encode(text, add_special_tokens=False)

    def _encode_plain(self, text: str) -> list[int]:
        return self.encode(text, add_special_tokens=False, parse_special=False)

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The chat template's text for ``messages``."""
        import jinja2  # noqa: PLC0415 - loaded by llama_cpp already; kept local as only chat needs it

        try:
            formatter = self._formatter(add_generation_prompt)
            return formatter(messages=[dict(message) for message in messages], **variables).prompt
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"{self._template_name} is not valid Jinja: "
                                    f"{_one_line(error.message)} (line {error.lineno})") from None
        except ValueError as error:  # raise_exception in the template, or a value it rejects
            raise ChatTemplateError(f"{self._template_name} refused the messages: "
                                    f"{_one_line(error)}") from None
        except Exception as error:  # noqa: BLE001 - any failure inside the template is the template's
            raise ChatTemplateError(f"{self._template_name} failed on the messages: "
                                    f"{type(error).__name__}: {_one_line(error)}") from None

    def complete_ids(self, text: str) -> list[int]:
        """Token ids to complete raw ``text`` (no chat template): BOS where the vocabulary adds one, then the text."""
        return self.encode(text, add_special_tokens=True)

    def _formatter(self, add_generation_prompt: bool):
        formatter = self._formatters.get(add_generation_prompt)
        if formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: PLC0415 - imported with llama_cpp

            formatter = Jinja2ChatFormatter(self.chat_template, eos_token=self.eos_token, bos_token=self.bos_token,
                                            add_generation_prompt=add_generation_prompt)
            self._formatters[add_generation_prompt] = formatter
        return formatter


def _one_line(error: object) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class ByteTextStream:
    """The text of a growing list of answer tokens, special tokens skipped (``TextStream``'s interface).

    ``add`` returns the text a token adds: its bytes join the undecoded tail and the longest complete
    UTF-8 prefix comes out, so a token ending inside a multi-byte character adds "" until the
    character is complete. ``text`` equals ``tokenizer.decode(tokens, skip_special_tokens=True)`` after
    ``flush``.
    """

    def __init__(self, tokenizer: GgufTokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer.add_space_prefix  # until the first byte: a SentencePiece text's leading space

    def add(self, token: int) -> str:
        token = int(token)
        self.tokens.append(token)
        data = self.tokenizer.token_bytes(token, skip_special_tokens=True)
        if self._strip_space and data:
            data = data[1:] if data.startswith(b" ") else data
            self._strip_space = False
        piece = self._decoder.decode(data)
        self.text += piece
        return piece

    def extend(self, tokens: Iterable[int]) -> str:
        return "".join(self.add(token) for token in tokens)

    def flush(self) -> str:
        """At the end of the answer: an incomplete last character, as U+FFFD."""
        piece = self._decoder.decode(b"", final=True)
        self.text += piece
        return piece
