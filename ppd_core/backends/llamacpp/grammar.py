"""The llama.cpp wing's grammar engine (``llama_sampler_init_grammar``): grammar-constrained decoding per tree path.

A ``Grammar`` is llama.cpp's grammar sampler in one state: the tokens accepted so far. ``allowed`` masks a logit row
to the tokens the grammar allows next (others -inf, llama.cpp's own rule: end-of-generation only where the grammar
is complete); ``best`` is the constrained argmax, found as llama.cpp's ``common_sampler`` finds it (the row's own
argmax if the grammar allows it, else the argmax of the masked row), so that greedy constrained answers are
llama-server's. In a tree step each row's state is its parent's with the row's token accepted (``child``), made only
for the rows verification reaches; rejected branches leave nothing behind.

JSON schemas become GBNF through llama.cpp's own converter (common/json-schema-to-grammar.cpp, built at set-up:
``ppd_core.native``), the one llama-server applies to ``response_format``, so a schema constrains ppd's answers as it
constrains llama-server's; ``response_format`` {"type": "json_object"} is the schema {"type": "object"}, as there.
"""

from __future__ import annotations

import ctypes
import json
import time
import numpy as np

from ppd_core.grammar_bounds import gbnf_problem
from ppd_core.sampling.constraint import GrammarError

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
CHECK_FIRST = 16  # likeliest tokens tried one by one before the whole row is masked
OPENING_CHUNK = 1024  # tokens a new grammar is first tried on (the lowest ids: single bytes and characters)
MAX_MASK_SECONDS = 10.0  # a grammar whose mask of one row would take longer is refused (5,000 alternatives: 180 s)


def schema_grammar(schema: dict | bool, response_format: bool = False) -> str:
    """GBNF for a JSON schema: llama.cpp's own converter, llama-server's (``ppd_core.native``), where the set-up built
    it; else llama-cpp-python's older port of it (other whitespace rules, among others). ``response_format``: the
    grammar llama-server gives a chat's ``response_format``, the JSON bare or in a ```json fence (``json_content``
    takes the JSON out of the answer); without the built converter, the schema's own."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415 - loads llama.cpp: the converter needs it

    from ppd_core.native.schema import converter, schema_to_gbnf  # noqa: PLC0415

    try:
        if converter() is not None:
            return schema_to_gbnf(schema, response_format)
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as error:  # noqa: BLE001 - the converters' own errors are of every kind
        raise GrammarError(f"this JSON schema cannot be turned into a grammar: {error}") from None


def json_grammar() -> str:
    """GBNF for ``response_format`` json_object without a schema: any JSON object, as llama-server makes it."""
    return schema_grammar({"type": "object"}, response_format=True)


class Grammar:
    """llama.cpp's grammar sampler after some tokens; ``child`` copies it one token further (``sampling.constraint``'s
    ``Grammar``)."""

    def __init__(self, llama, vocab, text: str | None = None, sampler=None, vocab_size: int = 0):
        self.llama, self.vocab, self.vocab_size = llama, vocab, vocab_size or llama.llama_vocab_n_tokens(vocab)
        if sampler is None:
            if problem := gbnf_problem(text, llama.llama_vocab_n_tokens(vocab)):
                raise GrammarError(problem)
            try:
                encoded = text.encode()
            except UnicodeEncodeError as error:  # a lone UTF-16 surrogate, sent as a JSON escape
                raise GrammarError(f"the grammar holds text UTF-8 cannot encode ({error.reason}, at character "
                                   f"{error.start})") from None
            sampler = llama.llama_sampler_init_grammar(vocab, encoded, b"root")
            if not sampler:
                raise GrammarError("llama.cpp could not parse this grammar (GBNF with a `root` rule is expected)")
        self.sampler = sampler
        self.ended: int | None = None  # the end-of-generation token accepted, if any: nothing follows it

    def close(self) -> None:
        if self.sampler:
            self.llama.llama_sampler_free(self.sampler)
            self.sampler = None

    def __del__(self):  # states of rejected rows are dropped without ceremony
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def clone(self) -> Grammar:
        state = Grammar(self.llama, self.vocab, sampler=self.llama.llama_sampler_clone(self.sampler),
                        vocab_size=self.vocab_size)
        state.ended = self.ended
        return state

    def accept(self, token: int) -> None:
        """Advance by ``token`` (one the grammar allows: verification only accepts such). After an
        end-of-generation token the answer is over: a tree row past it is never emitted (the answer is cut there),
        so it is given that token again and the grammar is not asked."""
        if self.ended is not None:
            return
        if self.llama.llama_vocab_is_eog(self.vocab, int(token)):
            self.ended = int(token)
            return
        if not self.allows([token])[0]:  # llama.cpp would throw through its C API: the process would abort
            raise GrammarError(f"token {int(token)} was chosen where the grammar forbids it")
        self.llama.llama_sampler_accept(self.sampler, int(token))

    def take(self, other: Grammar) -> None:
        """Become ``other``'s state (``other`` keeps this one's, freed with it)."""
        if other is not self:
            self.sampler, other.sampler = other.sampler, self.sampler
            self.ended, other.ended = other.ended, self.ended

    def child(self, token: int) -> Grammar:
        state = self.clone()
        state.accept(token)
        return state

    def _apply(self, data: np.ndarray) -> np.ndarray:
        """llama.cpp's mask on ``data`` (TOKEN_DATA records) in place: forbidden logits become -inf."""
        array = self.llama.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(self.llama.llama_token_data)), size=len(data), selected=-1,
            sorted=False)
        self.llama.llama_sampler_apply(self.sampler, ctypes.byref(array))
        return data

    def allows(self, tokens) -> np.ndarray:
        """[k] bool: which of ``tokens`` the grammar allows next."""
        data = np.zeros(len(tokens), dtype=TOKEN_DATA)
        data["id"] = tokens
        return np.isfinite(self._apply(data)["logit"])

    def check_opening(self) -> None:
        """A GrammarError unless the grammar allows some token (or the end) before any, else no answer can begin, and
        unless masking a row costs under ``MAX_MASK_SECONDS`` (estimated on the first ``OPENING_CHUNK`` tokens, where
        a token the grammar allows is most often found)."""
        started = time.perf_counter()
        first = self.allows(np.arange(min(OPENING_CHUNK, self.vocab_size), dtype=np.int32))
        estimate = (time.perf_counter() - started) * self.vocab_size / len(first)
        if estimate > MAX_MASK_SECONDS:
            raise GrammarError(f"the grammar is too costly to follow: each token would take about {estimate:.0f} s")
        if not first.any() and not self.allows(np.arange(len(first), self.vocab_size, dtype=np.int32)).any():
            raise GrammarError("the grammar allows no token of this model's vocabulary to begin the answer")

    def allowed(self, row: np.ndarray) -> np.ndarray:
        """[vocab] float32: ``row`` with the tokens the grammar forbids at -inf (a copy)."""
        if self.ended is not None:
            return np.where(np.arange(len(row)) == self.ended, row, -np.inf).astype(np.float32)
        data = np.zeros(len(row), dtype=TOKEN_DATA)
        data["id"] = np.arange(len(row), dtype=np.int32)
        data["logit"] = row
        return self._apply(data)["logit"].copy()

    def best(self, row: np.ndarray) -> int:
        """The constrained argmax of ``row`` [vocab]: its argmax where allowed, else the masked row's."""
        if self.ended is not None:
            return self.ended
        top = int(np.argmax(row))
        if self.allows([top])[0]:
            return top
        first = np.argpartition(-row[: self.vocab_size], CHECK_FIRST)[:CHECK_FIRST]  # the likeliest few, in O(vocab)
        order = first[np.lexsort((first, -row[first]))]  # best first (ties: the lower id)
        ok = self.allows(order)
        if ok.any():  # the likeliest allowed among the first few: the masked row's argmax (ties: the lower id) ...
            candidates = order[ok]
            value = row[candidates].max()
            if value > row[first].min():  # ... unless it ties with tokens the few may have left out
                return int(candidates[row[candidates] == value].min())
        masked = self.allowed(row)
        if not np.isfinite(masked).any():
            raise GrammarError("the grammar allows no token here")
        return int(np.argmax(masked))
