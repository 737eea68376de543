"""A third backend in one file and one registry line: a NumPy "model" implementing only the compute protocol
(``ppd_core.backends.Decoder``), loaded through the loader registry, decoding through the real loop with real drafters
(n-gram lookup chains, recycled trees). Greedy PPD must give its own plain decoding token for token, with trees of
several rows run."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from ppd_core import backend_registry as registry
from ppd_core.backend import BackendInfo, StepRows
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core.device_memory import read_memory
from ppd_core.device_policy import cpu_properties
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.drafters.lookup import LookupDrafter
from ppd_core.drafters.match_classes import MATCH_CLASSES
from ppd_core.drafters.recycling import RecyclingDrafter, RecyclingTable
from ppd_core.loaded import LoadedModel
from ppd_core.loading import load_model
from ppd_core.sampling.logits import HostLogits
from ppd_core.tree import plain_family

VOCAB, PERIOD = 40, 3


class StubCache:
    def __init__(self):
        self.tokens: list[int] = []  # accepted tokens only: a tree step leaves nothing here until ``keep``


class StubDecoder:
    """Logits of a row: fixed random rows of its token, its parent's token and its position (mod ``PERIOD``), so every
    row must see exactly its ancestors at the right position. Tree rows never change the cache: ``keep`` is told
    what to keep."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.last, self.before = rng.standard_normal((2, VOCAB, VOCAB)).astype(np.float32)
        self.at = rng.standard_normal((PERIOD, VOCAB)).astype(np.float32)
        self.rows_run: list[int] = []  # rows of every tree step
        properties = cpu_properties(1)
        self.info = BackendInfo(
            name="stub", forward="numpy", vocab_size=VOCAB, max_context=4096, bitwise=True, threads=1,
            max_tree_rows=64, accepts_embeddings=False, tree_note=None, pads_steps=False, kernels={"backend": "stub"},
            dtype="float32", device="cpu", device_kind="cpu", properties=properties,
            read_memory=functools.partial(read_memory, properties, None))

    def _row(self, sequence: list[int]) -> np.ndarray:
        """[vocab] the logits after ``sequence`` (the last token at position len - 1)."""
        before = self.before[sequence[-2]] if len(sequence) > 1 else 0.0
        return self.last[sequence[-1]] + 0.5 * before + 0.25 * self.at[(len(sequence) - 1) % PERIOD]

    def new_cache(self) -> StubCache:
        return StubCache()

    def cache_length(self, cache: StubCache) -> int:
        return len(cache.tokens)

    def prefill(self, cache: StubCache, token_ids) -> HostLogits:
        cache.tokens.extend(int(t) for t in token_ids)
        return HostLogits(self._row(cache.tokens)[None])

    def tree_logits(self, cache: StubCache, rows: StepRows) -> HostLogits:
        assert rows.embeddings is None and len(rows.tokens) == rows.num_rows  # no prompt-token rows (info says so)
        self.rows_run.append(rows.num_rows)
        out = []
        for row in range(rows.num_rows):
            path, up = [], row
            while up >= 0:
                path.append(int(rows.tokens[up]))
                up = rows.parents[up]
            sequence = cache.tokens + path[::-1]
            assert len(sequence) - 1 == len(cache.tokens) + rows.positions[row]  # the position decoding gave the row
            out.append(self._row(sequence))
        return HostLogits(np.stack(out))

    def keep(self, cache: StubCache, start: int, path, rows: StepRows) -> None:
        assert len(cache.tokens) == start
        cache.tokens.extend(int(rows.tokens[i]) for i in path)

    def truncate(self, cache: StubCache, length: int) -> None:
        del cache.tokens[length:]

    def close(self) -> None:
        pass


def load_stub(path, name: str, options) -> LoadedModel:
    """The stub's loader, as the registry names it."""
    return LoadedModel(tokenizer=None, name=name, source=str(path), device="cpu", dtype="float32", quant="none",
                       config=SimpleNamespace(vocab_size=VOCAB), generation_config={}, backend=StubDecoder(),
                       num_bytes=0, eos_token_ids=frozenset(), token_bytes=lambda token: b"")


@pytest.fixture
def stub(monkeypatch, tmp_path):
    monkeypatch.setitem(registry.LOADERS, ("stub", "hf"), "test_stub_backend:load_stub")  # the one registry line
    (tmp_path / "config.json").write_text("{}")
    return load_model(str(tmp_path), backend="stub")


def answer(decoder, prompt: list[int], ppd: bool, new: int = 80) -> tuple[list[int], list]:
    drafters = [LookupDrafter(FixedChains((4,) * len(MATCH_CLASSES)), prompt),
                RecyclingDrafter(RecyclingTable.empty(VOCAB))] if ppd else []
    steps = list(generate(Speculator(decoder, plain_family()), check_answer(prompt, new, 4096), Answering(drafters=drafters)))
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_stub_decodes_ppd_exactly_as_plainly(stub, seed):
    decoder = stub.backend
    assert isinstance(decoder, StubDecoder) and stub.info.name == "stub" and stub.max_context == 4096
    prompt = np.random.default_rng(seed).integers(VOCAB, size=12).tolist()
    plain, plain_steps = answer(decoder, prompt, ppd=False)
    assert set(decoder.rows_run) == {1} and len(plain_steps) == 80  # plain decoding: one row a step
    decoder.rows_run.clear()
    tokens, steps = answer(decoder, prompt, ppd=True)
    assert tokens == plain
    assert max(decoder.rows_run) >= 3 and sum(r > 1 for r in decoder.rows_run) >= 5  # trees of several rows ran
    assert len(steps) < len(plain_steps) and sum(s.from_guesses for s in steps) > 0  # and guesses were accepted


def test_a_backend_the_registry_does_not_name_is_refused(tmp_path):
    from ppd_core.loaded import ModelLoadError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="unknown backend 'stub'"):
        load_model(str(tmp_path), backend="stub")
    with pytest.raises(ModelLoadError, match="the llamacpp backend runs a GGUF file; this is a Hugging Face model dir"):
        load_model(str(tmp_path), backend="llamacpp")
